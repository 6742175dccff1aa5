// buffer-pool: a reservation pool of capacity held between two events, with a
// reserved part for the flows below their fair share (Delta Fair Sharing's
// write buffer; docs/rules.md, "buffer-pool", has the configuration and the
// grant order). Units are taken with acquire() and given back through a Hold
// (per request: taken and given back at once). Never grants beyond the
// capacity but for a request larger than it, when its flow holds nothing and
// nobody waits; waiters go by increasing usage over fair share, none is
// overtaken. After shutdown() acquires are cancelled; releases still give back.
//
// Thread safety: every member is safe from any thread. A no-wait acquire of a
// known flow and every release take no lock (atomics); the rest is under one
// mutex held for bounded bookkeeping, and a waiter sleeps on its own condition
// variable with it released. The object outlives every call (a Hold keeps it).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sluice/enforcement_object.h"
#include "sluice/thread_annotations.h"

namespace sluice {

struct BufferPoolConfig {
  enum FlowBy : std::uint8_t { kTenant, kWorkflow, kOrigin };

  std::uint64_t capacity = 0;  // bytes
  std::uint64_t reserved = 0;  // bytes, at most capacity
  FlowBy flow_by = kTenant;
  double default_weight = 1;
  std::uint32_t max_flows = 1024;
  std::map<std::uint64_t, double> weights;  // flow id -> weight
};

// The limits the configuration is checked against.
inline constexpr std::uint64_t kBufferPoolMaxCapacity = std::uint64_t{1} << 62;
inline constexpr double kBufferPoolMinWeight = 0.001;
inline constexpr double kBufferPoolMaxWeight = 1e6;
inline constexpr std::uint32_t kBufferPoolMaxFlows = 65536;

// Parses a buffer-pool configuration. `base` is the current configuration
// for a partial update (absent fields keep their value, `weights` merge key
// by key), or null at creation, when `capacity` is required. Errors name the
// field: "reserved: must be at most capacity (1000), got 2000",
// "weights.7: must be a number between 0.001 and 1000000, got 0".
StatusOr<BufferPoolConfig> parse_buffer_pool_config(const nlohmann::json& config,
                                                    const BufferPoolConfig* base);
// "tenant", "workflow", "origin".
std::string_view buffer_pool_flow_by_name(BufferPoolConfig::FlowBy by) noexcept;

class BufferPool final : public EnforcementObject {
 public:
  // `clock` null: system_clock(). It times the stalls.
  explicit BufferPool(Clock* clock);
  ~BufferPool() override;
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  std::string_view type() const noexcept override { return "buffer-pool"; }
  Status validate(const nlohmann::json& config) const override SLUICE_EXCLUDES(mu_);
  Status configure(const nlohmann::json& config) override SLUICE_EXCLUDES(mu_);
  // "reserved", "capacity" (whole numbers of bytes).
  std::span<const std::string_view> tunables() const noexcept override;
  Status set_tunables(std::uint64_t mask,
                      std::span<const double, kMaxTunables> values) noexcept override
      SLUICE_EXCLUDES(mu_);

  bool holds_capacity() const noexcept override { return true; }
  Verdict acquire(const Context& ctx, std::uint64_t amount) noexcept override SLUICE_EXCLUDES(mu_);
  void release(const Context& ctx, std::uint64_t amount) noexcept override SLUICE_EXCLUDES(mu_);
  // The same flow: the same value of the classifier flows are keyed by.
  bool same_flow(const Context& a, const Context& b) const noexcept override;

  // A request as an acquire of ctx.size given back at once (see the top).
  Verdict enforce_context(const Context& ctx) noexcept override SLUICE_EXCLUDES(mu_);
  Verdict try_enforce_context(const Context& ctx) noexcept override SLUICE_EXCLUDES(mu_);
  // What the request holds does not depend on what it moved.
  Verdict settle(const Context&, std::uint64_t) noexcept override { return {}; }

  // {"capacity", "reserved", "reserved_free", "global_free", "used",
  //  "queued", "flows": [{"flow": id or "other", "weight", "fair_share",
  //  "usage", "granted_bytes", "grants", "from_reserved_bytes",
  //  "released_bytes", "stalls", "stall_ns", "queued", "max_stall_ns"}],
  //  "oversize", "over_released"}. Counters are totals since creation
  // (stall_ns of the stalls that ended); flows are those known, in the order
  // they were first.
  nlohmann::json collect() const override SLUICE_EXCLUDES(mu_);
  void shutdown() noexcept override SLUICE_EXCLUDES(mu_);

 private:
  struct Flow;
  struct Waiter;
  struct Table;
  // The pool's use: reserved and global, changed together.
  struct Use {
    std::uint64_t reserved = 0;
    std::uint64_t global = 0;
  };
  class UseWord;

  // What taking n units for a flow comes to, or nothing (does not fit).
  struct Take {
    bool ok = false;
    std::uint64_t from_reserved = 0;
    bool oversize = false;
  };

  Flow* find_flow(const Context& ctx) const noexcept;
  // Takes `n` for `f` from the pool when the rules let it now (`exact`: read
  // the pool with a locked instruction, so that "does not fit" is certain),
  // and counts the grant in the flow.
  Take take(Flow& f, std::uint64_t n, bool exact) noexcept;
  // The flow's fair share now, in bytes.
  double fair_share(const Flow& f) const noexcept;
  // Gives `n` units back to the pool: reserved first, then global.
  void give_back(std::uint64_t n) noexcept;
  [[gnu::noinline]] Verdict acquire_slow(const Context& ctx, std::uint64_t n) noexcept
      SLUICE_EXCLUDES(mu_);

  // The `_locked` members require mu_ held.
  void apply_locked(const BufferPoolConfig& c) SLUICE_REQUIRES(mu_);
  Flow& flow_locked(std::uint64_t id) SLUICE_REQUIRES(mu_);
  Flow& new_flow_locked(std::uint64_t id, bool other) SLUICE_REQUIRES(mu_);
  void size_table_locked() SLUICE_REQUIRES(mu_);
  // The waiter served next (the first of the flow with the least U/f), or null.
  Waiter* head_locked() const SLUICE_REQUIRES(mu_);
  // Serves waiters from the head while they fit.
  void dispatch_locked() SLUICE_REQUIRES(mu_);
  void enqueue_locked(Waiter& w) SLUICE_REQUIRES(mu_);
  void dequeue_locked(Waiter& w) SLUICE_REQUIRES(mu_);
  // Debug builds: the waiters' counts and lists, the flows' weights.
  void check_invariants_locked() const SLUICE_REQUIRES(mu_);

  Clock* const clock_;
  // Read by the lock-free paths; written under mu_.
  alignas(64) std::atomic<const Table*> table_{nullptr};
  std::atomic<std::uint32_t> flow_by_{BufferPoolConfig::kTenant};
  std::atomic<std::uint64_t> capacity_{0};
  std::atomic<std::uint64_t> reserved_{0};
  std::atomic<double> total_weight_{0};
  std::atomic<std::uint32_t> waiting_{0};  // waiters queued, all flows
  std::atomic<bool> configured_{false};
  std::atomic<bool> shut_down_{false};
  std::atomic<std::uint64_t> oversize_{0};
  std::atomic<std::uint64_t> over_released_{0};
  std::unique_ptr<UseWord> use_;

  alignas(64) mutable Mutex mu_;
  BufferPoolConfig config_ SLUICE_GUARDED_BY(mu_);
  // Every flow, in the order first known; a Flow's fields but its atomics
  // are under mu_ too.
  std::vector<std::unique_ptr<Flow>> flows_ SLUICE_GUARDED_BY(mu_);
  std::uint32_t own_flows_ SLUICE_GUARDED_BY(mu_) = 0;  // flows_ but "other"
  Flow* other_ SLUICE_GUARDED_BY(mu_) = nullptr;
  std::vector<Flow*> waiting_flows_ SLUICE_GUARDED_BY(mu_);  // flows with waiters
  std::uint64_t next_seq_ SLUICE_GUARDED_BY(mu_) = 0;        // waiters' order of arrival
  // Every table made; the last is table_. Older ones stay until the object
  // goes: a lock-free reader may still hold one.
  std::vector<std::unique_ptr<Table>> tables_ SLUICE_GUARDED_BY(mu_);
};

std::unique_ptr<EnforcementObject> make_buffer_pool(const ObjectEnv& env);

}  // namespace sluice
