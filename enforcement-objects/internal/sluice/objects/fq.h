// fq: a weighted fair queue shared by the flows routed to it (by `flow_by`,
// the tenant by default), with dominant resource fairness, serving at most a
// configured capacity and work-conserving up to it. A request costs the
// server's time on its dominant resource (work, counted in 1/1024 ns and
// reported in ns); waiters are served by start-time fair queuing, no request
// overtakes a waiter, and a flow back from idle gets neither credit nor
// debt. docs/design.md, "The fair queue", and docs/rules.md, "fq", have the
// discipline, the no-wait leases and the configuration. No fast_grant: the
// queue needs the flow and the operation, which only the Context carries.
//
// Thread safety: every member is safe from any thread. State lives under one
// mutex held for bounded bookkeeping (table, leases and byte counters are
// atomics); a waiter blocks on its own condition variable with it released.
// The object outlives every enforce_context() on it.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sluice/enforcement_object.h"
#include "sluice/thread_annotations.h"

namespace sluice {

struct FqConfig {
  enum FlowBy : std::uint8_t { kTenant, kOrigin, kWorkflow, kOp, kLevel };

  // Capacities per second; 0: the resource is not counted. At least one > 0.
  double read_bytes = 0;
  double write_bytes = 0;
  double ops = 0;
  std::int64_t burst_us = 2000;  // the work the server banks while idle
  FlowBy flow_by = kTenant;
  double default_weight = 1;  // for flows without a weight of their own
  std::uint32_t max_flows = 1024;
  // Flow id -> weight.
  std::map<std::uint64_t, double> weights;
};

// The most flows a collect reports (about 250 bytes each on the wire).
inline constexpr std::size_t kFqMaxReportedFlows = 4096;

// The limits the configuration is checked against.
inline constexpr double kFqMinWeight = 0.001;
inline constexpr double kFqMaxWeight = 1e6;
inline constexpr std::int64_t kFqMaxBurstUs = 1'000'000'000;  // 1000 s
inline constexpr std::uint32_t kFqMaxFlows = 65536;
// Flows that may have a weight of their own (configured or not seen yet).
inline constexpr std::size_t kFqMaxWeights = 65536;

// Parses an fq configuration. `base` is the current configuration for a
// partial update (absent fields keep their value, `capacity` and `weights`
// merge key by key), or null at creation, when `capacity` is required.
// `flow_by` cannot change once set. Errors name the field:
// "capacity.ops: must be a number >= 1, or 0 (not counted), got 0.5",
// "weights.7: must be a number between 0.001 and 1000000, got 0",
// "unknown field 'foo'".
StatusOr<FqConfig> parse_fq_config(const nlohmann::json& config, const FqConfig* base);
// "tenant", "origin", "workflow", "op", "level".
std::string_view flow_by_name(FqConfig::FlowBy by) noexcept;
// Checks one weight (a rule's or a board's); the error names `field` and
// shows the value as `got`.
Status check_fq_weight(double v, std::string_view field, const std::string& got);

class Fq final : public EnforcementObject {
 public:
  // `clock` null: system_clock(). The bucket starts full at the first configure().
  explicit Fq(Clock* clock);
  ~Fq() override;
  Fq(const Fq&) = delete;
  Fq& operator=(const Fq&) = delete;

  std::string_view type() const noexcept override { return "fq"; }
  Status validate(const nlohmann::json& config) const override SLUICE_EXCLUDES(mu_);
  Status configure(const nlohmann::json& config) override SLUICE_EXCLUDES(mu_);
  // "weight_1" .. "weight_12": the weights of flows 1..12.
  std::span<const std::string_view> tunables() const noexcept override;
  Status set_tunables(std::uint64_t mask,
                      std::span<const double, kMaxTunables> values) noexcept override
      SLUICE_EXCLUDES(mu_);
  // Waits, if it must, until the request is served. Returns kOk with the time
  // waited, or kCancelled (after shutdown()). Before the first successful
  // configure() and after shutdown(), returns kOk at once.
  Verdict enforce_context(const Context& ctx) noexcept override SLUICE_EXCLUDES(mu_);
  // Grants the request at once when nobody waits and the bucket (with the
  // leases taken back) holds its cost; otherwise kWouldWait, having taken and
  // counted nothing.
  Verdict try_enforce_context(const Context& ctx) noexcept override SLUICE_EXCLUDES(mu_);
  // A read or write that moved less than it was charged for gets the
  // difference in work back (up to a full bucket) and its counters corrected;
  // one that moved more pays the extra work as a waiting request of its flow
  // would (without counting another operation), or under
  // context_flag::kNoWait on credit (the bucket goes below zero). Other
  // operations cost the same whatever they moved: nothing to settle.
  Verdict settle(const Context& ctx, std::uint64_t actual) noexcept override SLUICE_EXCLUDES(mu_);
  // {"capacity": {...}, "burst_us", "flow_by", "default_weight", "max_flows",
  //  "virtual_time", "queued", "flows": [{"flow": id or "other", "weight",
  //  "served_ops", "served_read_bytes", "served_write_bytes",
  //  "served_work_ns", "arrived_work_ns", "queued", "waited_ns",
  //  "backlogged_ns"}], "flows_total", "flows_omitted"}. Counters are totals
  // since creation; flows are those seen or given a weight, in the order they
  // were first, at most kFqMaxReportedFlows of them (a collect answer must
  // fit a frame): the queued ones first, then the ones that did the most
  // work; the rest are counted in flows_omitted.
  nlohmann::json collect() const override SLUICE_EXCLUDES(mu_);
  void shutdown() noexcept override SLUICE_EXCLUDES(mu_);

  // Stripes (leases and counters) per flow, and how many may hold a lease at once.
  static constexpr unsigned kStripes = 4;
  static constexpr unsigned kMaxLeases = 16;

 private:
  struct Stripe;
  struct Flow;
  struct Waiter;
  struct Table;

  // A lease word: the balance in work units (high bits) and the grants paid
  // from it since the last fold (low kOpsBits bits).
  static constexpr unsigned kOpsBits = 20;
  static constexpr std::uint64_t kOpsMask = (std::uint64_t{1} << kOpsBits) - 1;
  static constexpr std::uint64_t kMaxBalance = (std::uint64_t{1} << (64 - kOpsBits)) - 1;

  // The lock-free grant: true when the request's flow is in the table and its
  // lease held the cost (paid and counted).
  bool grant_from_lease(const Context& ctx) noexcept;
  [[gnu::noinline]] Verdict enforce_slow(const Context& ctx) noexcept SLUICE_EXCLUDES(mu_);

  // The `_locked` members require mu_ held.
  void apply_locked(const FqConfig& c) SLUICE_REQUIRES(mu_);
  // The request's flow, created if new (or "other" beyond max_flows).
  Flow& flow_locked(std::uint64_t id) SLUICE_REQUIRES(mu_);
  Flow& new_flow_locked(std::uint64_t id, bool other) SLUICE_REQUIRES(mu_);
  // A table that has room for max_flows, published for the lock-free path.
  void size_table_locked() SLUICE_REQUIRES(mu_);
  // The cost and counted bytes of a request under the current configuration.
  std::int64_t cost_locked(unsigned op_class, std::uint64_t size) const SLUICE_REQUIRES(mu_);
  // Serves `cost` of `flow` now if it may (drawing a lease for the calling
  // thread's stripe), else queues and waits (lock released meanwhile).
  // `op_class`/`bytes`: what to count when served; `counts_op`: whether it
  // counts as a request.
  Verdict admit_locked(MutexLock& lock, Flow& flow, std::int64_t cost, unsigned op_class,
                       std::uint64_t bytes, bool counts_op) SLUICE_REQUIRES(mu_);
  // Counts a grant of flow's `cost` taken from the bucket now.
  void take_locked(Flow& flow, std::int64_t cost, unsigned op_class, std::uint64_t bytes,
                   bool counts_op) SLUICE_REQUIRES(mu_);
  // The waiter served next, or null.
  Waiter* head_locked() const SLUICE_REQUIRES(mu_);
  std::int64_t head_deadline_locked() const SLUICE_REQUIRES(mu_);
  // burst (or the head's cost if larger) minus the leases as last seen.
  std::int64_t cap_locked() const SLUICE_REQUIRES(mu_);
  void accrue_locked(std::int64_t to_ns, std::int64_t cap) SLUICE_REQUIRES(mu_);
  // Grants the waiters that are due, then accrues to now.
  void settle_locked(std::int64_t now_ns) SLUICE_REQUIRES(mu_);
  void wait_as_head_locked(MutexLock& lock, Waiter& self) SLUICE_REQUIRES(mu_);
  // Wakes the old head (it sleeps without a timer from now on) and the new
  // one (it sleeps until its own deadline) when the head changed.
  void head_changed_locked(Waiter* old_head) SLUICE_REQUIRES(mu_);
  void push_locked(Waiter& w, std::int64_t now_ns) SLUICE_REQUIRES(mu_);
  Waiter* pop_head_locked(std::int64_t now_ns) SLUICE_REQUIRES(mu_);
  // The heap of flows with waiters, by their first waiter's start tag.
  bool before_locked(const Flow* a, const Flow* b) const SLUICE_REQUIRES(mu_);
  void sift_up_locked(std::size_t i) SLUICE_REQUIRES(mu_);
  void sift_down_locked(std::size_t i) SLUICE_REQUIRES(mu_);
  void heap_set_locked(std::size_t i, Flow* f) SLUICE_REQUIRES(mu_);
  // Moves every tag back by V, keeping their order, when V grows large.
  void rebase_locked() SLUICE_REQUIRES(mu_);
  // New costs for the waiting requests (a new capacity).
  void recost_waiters_locked() SLUICE_REQUIRES(mu_);
  // Leases (see the top of this file).
  void lease_locked(Stripe& stripe, std::int64_t cost) SLUICE_REQUIRES(mu_);
  void look_at_leases_locked() SLUICE_REQUIRES(mu_);
  void reclaim_leases_locked() SLUICE_REQUIRES(mu_);
  void reclaim_lease_locked(Stripe& stripe) SLUICE_REQUIRES(mu_);
  // What was paid from the stripe's lease since the lock last looked, into
  // its flow's work counters.
  void fold_paid_locked(Stripe& stripe, std::uint64_t balance) SLUICE_REQUIRES(mu_);
  void fold_ops_locked(Stripe& stripe) SLUICE_REQUIRES(mu_);
  // Debug builds: heap order and positions, the waiters' counts, the leases'
  // sum, the bucket within its cap.
  void check_invariants_locked() const SLUICE_REQUIRES(mu_);

  Clock* const clock_;
  // Read by the lock-free path; written under mu_. A request that races a
  // reconfiguration may be costed under either configuration.
  alignas(64) std::atomic<const Table*> table_{nullptr};
  std::atomic<std::uint32_t> flow_by_{FqConfig::kTenant};
  std::array<std::atomic<double>, 3> coef_{};  // work units per byte: read, write, other (0)
  std::atomic<std::int64_t> op_cost_{0};       // work units per request

  alignas(64) mutable Mutex mu_;
  FqConfig config_ SLUICE_GUARDED_BY(mu_);
  bool configured_ SLUICE_GUARDED_BY(mu_) = false;
  bool shut_down_ SLUICE_GUARDED_BY(mu_) = false;
  std::int64_t burst_ SLUICE_GUARDED_BY(mu_) = 0;    // work units
  std::int64_t bucket_ SLUICE_GUARDED_BY(mu_) = 0;   // work units; below 0 after credit
  std::int64_t last_ns_ SLUICE_GUARDED_BY(mu_) = 0;  // the time up to which bucket_ is accounted
  double vtime_ SLUICE_GUARDED_BY(mu_) = 0;          // V, less vtime_base_
  long double vtime_base_ SLUICE_GUARDED_BY(mu_) = 0;
  // Every flow, in the order first seen; a Flow's fields but its atomics
  // are under mu_ too.
  std::vector<std::unique_ptr<Flow>> flows_ SLUICE_GUARDED_BY(mu_);
  std::uint32_t own_flows_ SLUICE_GUARDED_BY(mu_) = 0;  // flows_ but "other"
  Flow* other_ SLUICE_GUARDED_BY(mu_) = nullptr;
  std::vector<Flow*> heap_ SLUICE_GUARDED_BY(mu_);
  std::uint64_t queued_ SLUICE_GUARDED_BY(mu_) = 0;
  // Every table made; the last is table_. Older ones stay until the object
  // goes: a lock-free reader may still hold one.
  std::vector<std::unique_ptr<Table>> tables_ SLUICE_GUARDED_BY(mu_);
  std::array<Stripe*, kMaxLeases> leased_ SLUICE_GUARDED_BY(mu_){};
  unsigned leases_ SLUICE_GUARDED_BY(mu_) = 0;  // leased_[0..leases_) hold a lease
  unsigned next_victim_ SLUICE_GUARDED_BY(mu_) = 0;
  std::int64_t leased_work_ SLUICE_GUARDED_BY(mu_) = 0;  // the sum of their `seen`
  std::int64_t lease_size_ SLUICE_GUARDED_BY(mu_) = 0;
};

std::unique_ptr<EnforcementObject> make_fq(const ObjectEnv& env);

}  // namespace sluice
