// prio-bucket: one token bucket shared by classes of requests (by origin
// pattern), served by strict priority between classes and by start-time fair
// queuing by cost among classes of equal priority, FIFO within a class
// (FlexEngine's foreground/flush/compaction buckets; docs/rules.md,
// "prio-bucket"). Grants and leases work as drl's, one lease per class per
// slot; fast_grant() offers the lease of the class of the thread's last
// request here (an origin's class never changes once configured). Classes'
// names, order and origins are fixed by the first configuration.
//
// Thread safety: every member is safe from any thread. State lives under one
// mutex held for bounded bookkeeping (leases and the origin table are
// atomics); a waiter blocks on its own condition variable with it released.
// The object outlives every enforce_context() on it.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sluice/enforcement_object.h"
#include "sluice/thread_annotations.h"

namespace sluice {

struct PrioBucketConfig {
  enum Unit { kBytes, kOps };
  struct Class {
    std::string name;
    std::vector<std::string> origins;  // names; a trailing '*' matches a prefix
    int priority = 0;                  // 0..7, lower first
    double weight = 1;                 // among classes of equal priority
  };

  double rate = 0;  // tokens per second, >= 1
  Unit unit = kBytes;
  double burst = 0;            // tokens, >= 1
  bool burst_set = false;      // else burst follows rate / 10 (100 ms)
  std::vector<Class> classes;  // 1..kPrioMaxClasses
  unsigned default_class = 0;  // index into classes
};

inline constexpr unsigned kPrioMaxClasses = 8;
inline constexpr int kPrioMaxPriority = 7;
inline constexpr double kPrioMinWeight = 0.001;
inline constexpr double kPrioMaxWeight = 1e6;

// Parses a prio-bucket configuration. `base` is the current configuration
// for a partial update (absent fields keep their value), or null at
// creation, when `rate` and `classes` are required. Errors name the field:
// "classes[1].weight: must be a number between 0.001 and 1000000, got 0",
// "default_class: no class named 'x'", "unknown field 'foo'".
StatusOr<PrioBucketConfig> parse_prio_bucket_config(const nlohmann::json& config,
                                                    const PrioBucketConfig* base);
// Whether the origin name `name` matches `pattern` (exact, or a prefix when
// the pattern ends in '*').
bool prio_origin_matches(std::string_view pattern, std::string_view name) noexcept;

class PrioBucket final : public EnforcementObject {
 public:
  // `clock` null: system_clock(). The bucket starts full at the first configure().
  explicit PrioBucket(Clock* clock);
  ~PrioBucket() override;
  PrioBucket(const PrioBucket&) = delete;
  PrioBucket& operator=(const PrioBucket&) = delete;

  std::string_view type() const noexcept override { return "prio-bucket"; }
  Status validate(const nlohmann::json& config) const override SLUICE_EXCLUDES(mu_);
  Status configure(const nlohmann::json& config) override SLUICE_EXCLUDES(mu_);
  // {"rate", "burst", "weight_<class>"...}: the class names are known from the
  // first configuration on (before it: rate and burst).
  std::span<const std::string_view> tunables() const noexcept override;
  Status set_tunables(std::uint64_t mask,
                      std::span<const double, kMaxTunables> values) noexcept override
      SLUICE_EXCLUDES(mu_);
  // Waits, if it must, until the request is served. kOk with the time waited,
  // or kCancelled after shutdown(). Before the first configure() and after
  // shutdown(), kOk at once.
  Verdict enforce_context(const Context& ctx) noexcept override SLUICE_EXCLUDES(mu_);
  // Grants at once when nobody waits and the bucket (leases taken back)
  // holds the cost; otherwise kWouldWait, having taken and counted nothing.
  Verdict try_enforce_context(const Context& ctx) noexcept override SLUICE_EXCLUDES(mu_);
  // See the top of this file. No lock, no clock: one compare-and-swap.
  FastGrant fast_grant() noexcept override;
  // In bytes: a request that moved less gets the difference back (up to a
  // full bucket), one that moved more pays the excess in its class's queue
  // (under kNoWait: on credit, the bucket goes below zero). In ops: nothing.
  Verdict settle(const Context& ctx, std::uint64_t actual) noexcept override SLUICE_EXCLUDES(mu_);
  // {"rate", "unit", "burst", "tokens", "queued", "classes": [{"name",
  //  "priority", "weight", "requests", "bytes", "waits", "wait_us_total",
  //  "wait_us_max", "queued"}]}. Counters are totals since creation:
  // requests and bytes granted (bytes: what the requests asked for, settled),
  // waits the requests that queued, wait_us_* their time in the queue (of
  // the waits that ended), queued the waiters now.
  nlohmann::json collect() const override SLUICE_EXCLUDES(mu_);
  void shutdown() noexcept override SLUICE_EXCLUDES(mu_);

  static constexpr unsigned kSlots = 16;

 private:
  // A lease word: the balance in whole tokens (high bits) and the grants
  // paid from it since the last fold (low kOpsBits bits).
  static constexpr unsigned kOpsBits = 20;
  static constexpr std::uint64_t kOpsMask = (std::uint64_t{1} << kOpsBits) - 1;
  static constexpr std::uint64_t kMaxBalance = (std::uint64_t{1} << (64 - kOpsBits)) - 1;
  static constexpr std::uint8_t kUnresolved = 0xff;
  enum Mode : std::uint32_t { kLocked, kBytes, kOps };

  // One class's lease in one slot, on a line of its own.
  struct alignas(64) Lease {
    std::atomic<std::uint64_t> word{0};
    std::atomic<std::uint32_t> mode{kLocked};  // a copy of mode_
    // In ops, the bytes granted from the lease (in bytes they are the tokens).
    std::atomic<std::uint64_t> bytes{0};
    // Under mu_: the balance as last seen.
    std::uint64_t seen = 0;
    std::uint8_t slot = 0;
    std::uint8_t cls = 0;
  };
  struct alignas(128) Slot {
    std::array<Lease, kPrioMaxClasses> leases;
  };
  struct Waiter;
  struct ClassState;

  static bool pay_from_lease(Lease& lease, std::uint64_t size) noexcept;
  static bool fast_grant_of(void* lease, std::uint64_t size) noexcept;
  // The request's class from the table, or kUnresolved.
  std::uint8_t class_of(OriginId origin) const noexcept;
  [[gnu::noinline]] Verdict enforce_slow(const Context& ctx) noexcept SLUICE_EXCLUDES(mu_);

  // The `_locked` members require mu_ held.
  void apply_locked(const PrioBucketConfig& c) SLUICE_REQUIRES(mu_);
  unsigned resolve_locked(OriginId origin) SLUICE_REQUIRES(mu_);
  std::uint64_t cost_of_locked(std::uint64_t size) const SLUICE_REQUIRES(mu_);
  Verdict admit_locked(MutexLock& lock, unsigned cls, std::uint64_t cost, std::uint64_t bytes,
                       bool counts_request) SLUICE_REQUIRES(mu_);
  void take_locked(unsigned cls, long double cost, std::uint64_t bytes, bool counts_request)
      SLUICE_REQUIRES(mu_);
  void update_mode_locked() SLUICE_REQUIRES(mu_);
  // The waiter served next (strict priority, then start tags), or null.
  Waiter* choose_locked() const SLUICE_REQUIRES(mu_);
  // head_ from choose_locked(); wakes the old head (it now waits without a
  // timer) and the new one (it sleeps until its own deadline) if it changed.
  void rechoose_locked() SLUICE_REQUIRES(mu_);
  long double cap_locked() const SLUICE_REQUIRES(mu_);
  long double head_deadline_locked() const SLUICE_REQUIRES(mu_);
  void accrue_locked(long double to_ns, long double cap) SLUICE_REQUIRES(mu_);
  void settle_locked(std::int64_t now_ns) SLUICE_REQUIRES(mu_);
  void push_locked(Waiter& w) SLUICE_REQUIRES(mu_);
  void pop_locked(Waiter& w, std::int64_t now_ns) SLUICE_REQUIRES(mu_);
  void lease_locked(Lease& lease, std::uint64_t cost) SLUICE_REQUIRES(mu_);
  void look_at_leases_locked() SLUICE_REQUIRES(mu_);
  void reclaim_leases_locked() SLUICE_REQUIRES(mu_);
  // What was paid from `lease` since the lock last looked, into its class.
  void fold_paid_locked(Lease& lease, std::uint64_t balance) SLUICE_REQUIRES(mu_);
  void fold_ops_locked(Lease& lease) SLUICE_REQUIRES(mu_);
  void check_invariants_locked() const SLUICE_REQUIRES(mu_);

  Clock* const clock_;
  std::array<Slot, kSlots> slots_;
  // Origin id -> class index, kUnresolved until first seen (or for ever, for
  // an id not interned yet).
  std::array<std::atomic<std::uint8_t>, origin::kMaxOrigins> class_of_;

  alignas(128) mutable Mutex mu_;
  PrioBucketConfig config_ SLUICE_GUARDED_BY(mu_);
  bool configured_ SLUICE_GUARDED_BY(mu_) = false;
  bool shut_down_ SLUICE_GUARDED_BY(mu_) = false;
  Mode mode_ SLUICE_GUARDED_BY(mu_) = kLocked;
  long double tokens_ SLUICE_GUARDED_BY(mu_) = 0;
  long double last_ns_ SLUICE_GUARDED_BY(mu_) = 0;                // tokens_ is accounted up to here
  std::unique_ptr<ClassState[]> classes_ SLUICE_GUARDED_BY(mu_);  // kPrioMaxClasses
  std::array<double, kPrioMaxPriority + 1> vtime_ SLUICE_GUARDED_BY(mu_){};
  Waiter* head_ SLUICE_GUARDED_BY(mu_) = nullptr;  // served next
  std::uint64_t queued_ SLUICE_GUARDED_BY(mu_) = 0;
  std::array<std::uint64_t, 2> leased_mask_ SLUICE_GUARDED_BY(mu_){};  // slot * 8 + class
  std::uint64_t leased_ SLUICE_GUARDED_BY(mu_) = 0;  // the sum of the leases' `seen`
  std::uint64_t lease_size_ SLUICE_GUARDED_BY(mu_) = 1;
  // Tunable names: "rate", "burst", "weight_<class>"... (fixed once configured).
  std::vector<std::string> tunable_names_ SLUICE_GUARDED_BY(mu_);
  std::array<std::string_view, kMaxTunables> tunables_{};
  std::atomic<std::size_t> tunable_count_{2};
};

std::unique_ptr<EnforcementObject> make_prio_bucket(const ObjectEnv& env);

}  // namespace sluice
