// drl: the dynamic rate limiter, a token bucket in bytes/s or ops/s.
//
// Tokens accrue continuously at `rate` per second up to `burst`. A request
// costs its size (unit "bytes") or 1 (unit "ops") and pays before it proceeds:
// with enough tokens and nobody waiting it takes them and goes on at once;
// otherwise it queues. Waiters are served in FIFO order. The queue's head
// waits until its whole cost has accrued (a request larger than the bucket
// included: while such a head waits the bucket may hold up to its cost).
//
// Grants are accounted in virtual time: the head is granted as of the instant
// its cost accrued, not the instant its thread happened to wake up, so late
// wakeups cost no rate and the long-run rate is exact. Virtual time lags real
// time by at most one bucket (burst / rate): what a late wakeup admits at once
// (the grants that fell due plus the tokens left) never exceeds burst plus the
// first grant's cost; a wakeup later than that forfeits the excess, as a full
// bucket does.
//
// The head waits for its deadline on a timed wait of its clock, which on a
// real system wakes up late (Linux: ~50-100 us of timer slack and wakeup
// latency, milliseconds when the CPUs are oversubscribed). Lateness up to one
// bucket costs nothing (see above); only the rest is forfeited. So the head
// tracks how late its timed waits wake (a high quantile, each sample clipped
// at 200 us) and, when that exceeds one bucket, sleeps on the timer only until
// the excess before its deadline and waits the last stretch with
// Clock::wait_briefly (the system clock yields the CPU, no timer). That
// stretch is at most 200 us a grant and is zero whenever the bucket is longer
// than the timer's lateness (e.g. refill periods >= 1 ms at the default
// burst), so only buckets shorter than a timer's resolution spend CPU on it.
// Lateness from losing the CPU (an oversubscribed machine) is not helped by
// spinning and stays forfeited beyond one bucket: catching it up later would
// be a burst larger than configured.
//
// Tunables (EnforcementObject::tunables): "rate" and "burst", which a control
// plane with the stage's board sets without a message (set_tunables), with the
// same checks and the same effect as configure().
//
// configure() re-times waiters under the new rate from the moment it applies:
// what accrued so far at the old rate is kept, none is dropped or reordered.
// A new `unit` applies to requests that arrive after it; queued requests keep
// the cost they arrived with.
//
// Thread safety: every member is safe from any thread. State lives under one
// mutex held only for bounded bookkeeping; a waiting request blocks on its own
// condition variable with that mutex released, so configure(), collect() and
// shutdown() never wait for a sleeper. The object must outlive every
// enforce() call on it (after shutdown() those calls return promptly).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>

#include <nlohmann/json_fwd.hpp>

#include "sluice/enforcement_object.h"

namespace sluice {

struct DrlConfig {
  enum Unit { kBytes, kOps };

  double rate = 0;                          // tokens per second, >= 1
  Unit unit = kBytes;                       // what a token is: a byte or a request
  double burst = 0;                         // bucket capacity in tokens, >= 1
  std::int64_t refill_period_us = 100'000;  // sets the default burst
  // Whether `burst` was given (now or by an earlier configuration). If not, it
  // follows max(1, rate * refill_period_us / 1e6) when either changes.
  bool burst_set = false;
};

// Parses a drl configuration object. `base` is the current configuration for a
// partial update (absent fields keep their value), or null at creation, when
// `rate` is required. Rates below 1 token per second and bursts below 1 token
// are refused (docs/rules.md: such a bucket's waits would not end). Errors
// name the field: "rate: must be a positive number, got -5", "rate: must be
// at least 1 token (byte or request) per second, got 0.5", "unknown field
// 'foo'".
StatusOr<DrlConfig> parse_drl_config(const nlohmann::json& config, const DrlConfig* base);

class Drl final : public EnforcementObject {
 public:
  // `clock` null: system_clock(). The bucket starts full at the first configure().
  explicit Drl(Clock* clock);

  std::string_view type() const noexcept override { return "drl"; }
  Status validate(const nlohmann::json& config) const override;
  Status configure(const nlohmann::json& config) override;
  // {"rate", "burst"}.
  std::span<const std::string_view> tunables() const noexcept override;
  Status set_tunables(std::uint64_t mask,
                      std::span<const double, kMaxTunables> values) noexcept override;
  // Waits, if it must, until the request's cost is paid. Returns kOk with the
  // time waited, or kCancelled (after shutdown()). Before the first successful
  // configure() and after shutdown(), returns kOk at once.
  Result enforce(const Context& ctx, const Request& request) noexcept override;
  Verdict enforce_context(const Context& ctx) noexcept override;
  // {"rate", "unit", "burst", "refill_period_us", "tokens", "waiters",
  //  "granted_ops", "granted_tokens", "overflow_tokens",
  //  "late_forfeited_tokens", "wake_late_ns"}. Counters are totals since
  // creation: granted_*; overflow_tokens accrued into a full bucket with
  // nobody waiting (idle: nobody asked for them); late_forfeited_tokens lost
  // to the lag cap while a request waited (its thread woke up more than one
  // bucket late). wake_late_ns is the current estimate of timed-wait lateness.
  nlohmann::json collect() const override;
  void shutdown() noexcept override;

  // For benchmarks and tests: called for every grant, under the bucket's lock,
  // with the time at which the bucket decided it (a queued request's thread
  // resumes later, by however long the scheduler takes to run it) and its
  // cost. Must not call back into this object. Set it before the first
  // enforce(); it is not synchronised with enforce().
  using GrantObserver = std::function<void(std::int64_t decided_ns, double cost)>;
  void set_grant_observer(GrantObserver observer) { observer_ = std::move(observer); }

 private:
  struct Waiter {
    explicit Waiter(long double c) : cost(c) {}
    const long double cost;
    std::condition_variable cv;
    Waiter* next = nullptr;
    bool granted = false;
    bool cancelled = false;
    // As the head: when its timer fired, after which it waits without one.
    std::int64_t brief_from = std::numeric_limits<std::int64_t>::max();
  };

  // All private members below require mu_ held.
  void apply(const DrlConfig& c);                   // a checked configuration, in force now
  long double cap() const;                          // burst, or the head's cost if larger
  long double head_deadline() const;                // virtual ns at which the head is paid
  void accrue(long double to_ns, long double cap);  // tokens and last_ up to `to_ns`
  void settle(std::int64_t now_ns);                 // grants due heads, then accrues to now
  // One wait of the queue's head for its deadline (the caller settles and loops).
  void wait_as_head(std::unique_lock<std::mutex>& lock, Waiter& self);
  void take(long double cost, std::int64_t now_ns);
  void push(Waiter* w);
  Waiter* pop();

  Clock* const clock_;
  mutable std::mutex mu_;
  DrlConfig config_;
  bool configured_ = false;
  bool shut_down_ = false;
  long double tokens_ = 0;
  long double last_ns_ = 0;  // virtual time up to which tokens_ is accounted
  Waiter* head_ = nullptr;   // FIFO of waiters, each on its own thread's stack
  Waiter* tail_ = nullptr;
  std::uint64_t waiting_ = 0;
  std::uint64_t granted_ops_ = 0;
  long double granted_tokens_ = 0;
  long double overflow_tokens_ = 0;        // accrued into a full bucket, lost
  long double late_forfeited_tokens_ = 0;  // lag beyond one bucket, lost
  std::int64_t late_ns_ = 100'000;         // how late timed waits wake (high quantile)
  GrantObserver observer_;
};

std::unique_ptr<EnforcementObject> make_drl(const ObjectEnv& env);

}  // namespace sluice
