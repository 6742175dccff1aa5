// drl: the dynamic rate limiter, a token bucket in bytes/s or ops/s
// (docs/rules.md, "drl"; docs/design.md, "The token bucket", has how it
// grants). Tokens accrue at `rate` up to `burst`; a request costs its size or
// 1 and waits in FIFO order until its whole cost accrued. Grants are in
// virtual time, so late wakeups cost no rate up to one bucket. A request that
// finds its cost in its thread's lease takes no lock and reads no clock;
// leases never let a request overtake a waiter. configure() and
// set_tunables() ("rate", "burst") re-time waiters without dropping any.
//
// Thread safety: every member is safe from any thread. State lives under one
// mutex held for bounded bookkeeping (the leases are atomics); a waiter
// blocks on its own condition variable with it released, so configure(),
// collect() and shutdown() never wait for a sleeper. The object outlives
// every enforce_context() on it (after shutdown() those return promptly).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>

#include <nlohmann/json_fwd.hpp>

#include "sluice/enforcement_object.h"
#include "sluice/thread_annotations.h"

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
  Status validate(const nlohmann::json& config) const override SLUICE_EXCLUDES(mu_);
  Status configure(const nlohmann::json& config) override SLUICE_EXCLUDES(mu_);
  // {"rate", "burst"}.
  std::span<const std::string_view> tunables() const noexcept override;
  Status set_tunables(std::uint64_t mask,
                      std::span<const double, kMaxTunables> values) noexcept override
      SLUICE_EXCLUDES(mu_);
  // Waits, if it must, until the request's cost is paid. Returns kOk with the
  // time waited, or kCancelled (after shutdown()). Before the first successful
  // configure() and after shutdown(), returns kOk at once.
  Verdict enforce_context(const Context& ctx) noexcept override SLUICE_EXCLUDES(mu_);
  // Grants the request at once when the bucket holds its cost and nobody
  // waits; otherwise returns kWouldWait having taken nothing.
  Verdict try_enforce_context(const Context& ctx) noexcept override SLUICE_EXCLUDES(mu_);
  // The grant from the calling thread's lease (its slot), for that thread:
  // what enforce_context() does when the lease holds the cost (one
  // compare-and-swap on the slot's line, no lock, no clock); false otherwise
  // (the lease is short, or taken back because a request waits, the object
  // is being reconfigured, observed, or is shut down or not configured yet).
  FastGrant fast_grant() noexcept override;
  // In bytes: a request that moved less than it was charged gets the
  // difference back (up to a full bucket); one that moved more pays the
  // excess as a request of that size would, queueing behind the waiters, or
  // under context_flag::kNoWait takes it on credit (the tokens go below
  // zero, and later requests wait until they are paid back). In ops:
  // nothing (a request costs 1 whatever it moved).
  Verdict settle(const Context& ctx, std::uint64_t actual) noexcept override SLUICE_EXCLUDES(mu_);
  // {"rate", "unit", "burst", "refill_period_us", "tokens", "waiters",
  //  "granted_ops", "granted_tokens", "refunded_tokens", "overflow_tokens",
  //  "late_forfeited_tokens", "wake_late_ns"}. Counters are totals since
  // creation: granted_*; refunded_tokens given back by settle(), which
  // granted_tokens still counts; overflow_tokens accrued into a full bucket with
  // nobody waiting (idle: nobody asked for them); late_forfeited_tokens lost
  // to the lag cap while a request waited (its thread woke up more than one
  // bucket late). wake_late_ns is the current estimate of timed-wait lateness.
  nlohmann::json collect() const override SLUICE_EXCLUDES(mu_);
  void shutdown() noexcept override SLUICE_EXCLUDES(mu_);

  // For benchmarks and tests: called for every grant, under the bucket's lock,
  // with the time at which the bucket decided it (a queued request's thread
  // resumes later, by however long the scheduler takes to run it) and its
  // cost. Must not call back into this object. While one is set, no grant
  // takes the lock-free path. Set it before the first enforce_context(); it is not
  // synchronised with enforce_context().
  using GrantObserver = std::function<void(std::int64_t decided_ns, double cost)>;
  void set_grant_observer(GrantObserver observer) SLUICE_EXCLUDES(mu_);

  // Lease slots per bucket.
  static constexpr unsigned kSlots = 16;

 private:
  // A slot's word: the lease's balance in whole tokens (high bits) and the
  // number of grants paid from it since the bucket last folded that count
  // (low kOpsBits bits), so that one compare-and-swap pays and counts.
  static constexpr unsigned kOpsBits = 20;
  static constexpr std::uint64_t kOpsMask = (std::uint64_t{1} << kOpsBits) - 1;
  static constexpr std::uint64_t kMaxBalance = (std::uint64_t{1} << (64 - kOpsBits)) - 1;
  // What the lock-free path does: nothing (kLocked: not configured, shut
  // down, observed), or pay from a lease in bytes or in requests.
  enum Mode : std::uint32_t { kLocked, kBytes, kOps };
  struct alignas(128) Slot {  // two lines: adjacent-line prefetchers pair them
    std::atomic<std::uint64_t> word{0};
    // mode_, copied into every slot so that a grant from a lease reads one
    // line (written under mu_, read without it).
    std::atomic<std::uint32_t> mode{kLocked};
    // Under mu_: the balance as the bucket last saw it (it only falls between
    // two looks).
    std::uint64_t seen = 0;
  };

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

  // Pays `cost` from the lease in `slot` (this thread's), without a lock or
  // a clock; false when the lease does not hold it (or was taken back).
  static bool pay_from_lease(Slot& slot, std::uint64_t cost) noexcept;
  // The lock-free part of enforce_context(): pays a request of `size` from
  // the lease in `slot` when the slot's mode allows.
  static bool grant_from_lease(Slot& slot, std::uint64_t size) noexcept;
  static bool fast_grant_of(void* slot, std::uint64_t size) noexcept;
  // Everything but a grant from a lease: under the lock.
  [[gnu::noinline]] Verdict enforce_slow(const Context& ctx) noexcept SLUICE_EXCLUDES(mu_);

  // The `_locked` members require mu_ held.
  // A checked configuration, in force now.
  void apply_locked(const DrlConfig& c) SLUICE_REQUIRES(mu_);
  // In whole tokens.
  std::uint64_t cost_of_locked(const Context& ctx) const SLUICE_REQUIRES(mu_);
  // Takes `cost`, from the bucket (drawing a lease) or waiting in the queue
  // if it must (lock released meanwhile; the leases taken back first).
  Verdict admit_locked(MutexLock& lock, std::uint64_t cost) SLUICE_REQUIRES(mu_);
  // mode_ (and the slots' copies) and lease_size_ from the state.
  void update_mode_locked() SLUICE_REQUIRES(mu_);
  // Folds what was paid from the leases since the last look and refreshes
  // leased_ (the bound accrual uses from then on).
  void look_at_leases_locked() SLUICE_REQUIRES(mu_);
  // Every lease back into the bucket.
  void reclaim_leases_locked() SLUICE_REQUIRES(mu_);
  // Tops up `slot` by a lease (at least `cost`) when the bucket holds that much.
  void lease_locked(Slot& slot, std::uint64_t cost) SLUICE_REQUIRES(mu_);
  // Empties the slot's grant count into granted_ops_.
  void fold_ops_locked(Slot& slot) SLUICE_REQUIRES(mu_);
  // burst (or the head's cost if larger) minus the leases as last seen.
  long double cap_locked() const SLUICE_REQUIRES(mu_);
  // The virtual time (ns) at which the head is paid.
  long double head_deadline_locked() const SLUICE_REQUIRES(mu_);
  // tokens_ and last_ns_ up to `to_ns`.
  void accrue_locked(long double to_ns, long double cap) SLUICE_REQUIRES(mu_);
  // Grants the heads that are due, then accrues to now.
  void settle_locked(std::int64_t now_ns) SLUICE_REQUIRES(mu_);
  // One wait of the queue's head for its deadline (the caller settles and loops).
  void wait_as_head_locked(MutexLock& lock, Waiter& self) SLUICE_REQUIRES(mu_);
  void take_locked(long double cost, std::int64_t now_ns) SLUICE_REQUIRES(mu_);
  void push_locked(Waiter* w) SLUICE_REQUIRES(mu_);
  Waiter* pop_locked() SLUICE_REQUIRES(mu_);
  // Debug builds: the invariants of the bucket and its queue (tokens within
  // the cap, leased_ the sum of what the slots were last seen to hold, the
  // queue's links and count).
  void check_invariants_locked() const SLUICE_REQUIRES(mu_);

  // Read by the lock-free path: changes rarely.
  Clock* const clock_;
  std::array<Slot, kSlots> slots_;

  alignas(128) mutable Mutex mu_;
  // The slots carry copies for the lock-free path.
  Mode mode_ SLUICE_GUARDED_BY(mu_) = kLocked;
  DrlConfig config_ SLUICE_GUARDED_BY(mu_);
  bool configured_ SLUICE_GUARDED_BY(mu_) = false;
  bool shut_down_ SLUICE_GUARDED_BY(mu_) = false;
  long double tokens_ SLUICE_GUARDED_BY(mu_) = 0;
  // The virtual time up to which tokens_ is accounted.
  long double last_ns_ SLUICE_GUARDED_BY(mu_) = 0;
  // FIFO of waiters, each on its own thread's stack; a Waiter's fields but
  // `cv` are under mu_ too.
  Waiter* head_ SLUICE_GUARDED_BY(mu_) = nullptr;
  Waiter* tail_ SLUICE_GUARDED_BY(mu_) = nullptr;
  std::uint64_t waiting_ SLUICE_GUARDED_BY(mu_) = 0;
  std::uint64_t granted_ops_ SLUICE_GUARDED_BY(mu_) = 0;
  long double granted_tokens_ SLUICE_GUARDED_BY(mu_) = 0;
  long double refunded_tokens_ SLUICE_GUARDED_BY(mu_) = 0;        // given back by settle()
  long double overflow_tokens_ SLUICE_GUARDED_BY(mu_) = 0;        // accrued into a full bucket
  long double late_forfeited_tokens_ SLUICE_GUARDED_BY(mu_) = 0;  // lag beyond one bucket
  // How late timed waits wake (a high quantile).
  std::int64_t late_ns_ SLUICE_GUARDED_BY(mu_) = 100'000;
  // The sum of the slots' `seen`: at least what they hold.
  std::uint64_t leased_ SLUICE_GUARDED_BY(mu_) = 0;
  // Bit i: slot i may hold a lease.
  std::uint32_t leased_slots_ SLUICE_GUARDED_BY(mu_) = 0;
  // Tokens a lease draws (before the cost floor).
  std::uint64_t lease_size_ SLUICE_GUARDED_BY(mu_) = 0;
  GrantObserver observer_ SLUICE_GUARDED_BY(mu_);
};

std::unique_ptr<EnforcementObject> make_drl(const ObjectEnv& env);

}  // namespace sluice
