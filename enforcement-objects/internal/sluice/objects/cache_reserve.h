// cache-reserve: a read cache's capacity and per-flow reserved thresholds
// (Delta Fair Sharing's cache reservations), shared by every cache that
// consults it, and the per-flow counters those caches report (docs/rules.md,
// "cache-reserve"). A cache embedding TenantLru reads the capacity and
// thresholds from its atomic words on every eviction choice and notices a
// change through the epoch word; collect() asks each attached CacheReporter
// for its counters. Other caches account with acquire()/release(), which
// never wait. Per request it lets everything through.
//
// Thread safety: every member is safe from any thread; acquire() of a known
// flow and release() take no lock. A reporter is called under the object's
// mutex: it may take its own locks but must not call into the object. The
// object outlives every cache reading its words (they hold a shared_ptr).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sluice/enforcement_object.h"
#include "sluice/objects/tenant_lru.h"
#include "sluice/thread_annotations.h"

namespace sluice {

namespace detail {
template <typename T>
class FlowIndex;
}  // namespace detail

struct CacheReserveConfig {
  enum FlowBy : std::uint8_t { kTenant, kWorkflow, kOrigin };

  std::uint64_t capacity = 0;                       // bytes
  std::map<std::uint64_t, std::uint64_t> reserved;  // flow id -> ρ, bytes
  FlowBy flow_by = kTenant;
  double default_weight = 1;
  std::uint32_t max_flows = 1024;
  std::map<std::uint64_t, double> weights;  // flow id -> weight

  std::uint64_t reserved_sum() const noexcept;
};

// The limits the configuration is checked against.
inline constexpr std::uint64_t kCacheReserveMaxCapacity = std::uint64_t{1} << 62;
inline constexpr double kCacheReserveMinWeight = 0.001;
inline constexpr double kCacheReserveMaxWeight = 1e6;
inline constexpr std::uint32_t kCacheReserveMaxFlows = 65536;

// Parses a cache-reserve configuration. `base`: the current one for a
// partial update (absent fields keep their value; `reserved` and `weights`
// merge key by key), or null at creation, when `capacity` is required.
// Errors name the field: "reserved.7: must be an integer number of bytes
// from 0 to capacity, got -1", "reserved: the reservations sum to 5000
// bytes, more than capacity (4096)".
StatusOr<CacheReserveConfig> parse_cache_reserve_config(const nlohmann::json& config,
                                                        const CacheReserveConfig* base);

// What a cache reports of itself to the object it consults (collect).
class CacheReporter {
 public:
  // Calls `each` once per flow the cache holds state for, with its usage
  // and counters summed over the cache. Called under the object's mutex.
  virtual void report(
      const std::function<void(std::uint64_t flow, const TenantLruStats&)>& each) const = 0;

 protected:
  ~CacheReporter() = default;
};

class CacheReserve final : public EnforcementObject {
 public:
  CacheReserve();
  ~CacheReserve() override;
  CacheReserve(const CacheReserve&) = delete;
  CacheReserve& operator=(const CacheReserve&) = delete;

  std::string_view type() const noexcept override { return "cache-reserve"; }
  Status validate(const nlohmann::json& config) const override SLUICE_EXCLUDES(mu_);
  Status configure(const nlohmann::json& config) override SLUICE_EXCLUDES(mu_);
  // "capacity" (a whole number of bytes, at least the reservations' sum).
  std::span<const std::string_view> tunables() const noexcept override;
  Status set_tunables(std::uint64_t mask,
                      std::span<const double, kMaxTunables> values) noexcept override
      SLUICE_EXCLUDES(mu_);

  bool holds_capacity() const noexcept override { return true; }
  // Counts `amount` bytes in ctx's flow (one insert); never waits.
  Verdict acquire(const Context& ctx, std::uint64_t amount) noexcept override SLUICE_EXCLUDES(mu_);
  // Gives `amount` bytes of ctx's flow back (clamped at what it holds).
  void release(const Context& ctx, std::uint64_t amount) noexcept override SLUICE_EXCLUDES(mu_);
  bool same_flow(const Context& a, const Context& b) const noexcept override;

  // Every request proceeds at once (see the top).
  Verdict enforce_context(const Context&) noexcept override { return {}; }
  Verdict try_enforce_context(const Context&) noexcept override { return {}; }
  Verdict settle(const Context&, std::uint64_t) noexcept override { return {}; }

  // {"capacity", "used", "reserved" (the sum), "caches" (attached),
  //  "flows": [{"flow": id or "other", "weight", "fair_share", "reserved",
  //  "usage", "pinned", "hits", "misses", "inserts", "inserted_bytes",
  //  "evictions", "evictions_below_reserved"}]}: usage and counters summed over the
  // attached caches and acquire/release; flows in the order first known.
  nlohmann::json collect() const override SLUICE_EXCLUDES(mu_);

  // For caches. The capacity in bytes (0 until configured), read without a
  // lock.
  const std::atomic<std::uint64_t>& capacity_word() const noexcept { return capacity_; }
  // Bumped after every change of the capacity or a reservation.
  const std::atomic<std::uint64_t>& epoch_word() const noexcept { return epoch_; }
  // The word holding flow `id`'s reservation (bytes), valid for the object's
  // life; the flow becomes known (its own, whatever max_flows).
  const std::atomic<std::uint64_t>* reserved_word(std::uint64_t id) SLUICE_EXCLUDES(mu_);
  std::uint64_t capacity() const noexcept { return capacity_.load(std::memory_order_relaxed); }
  // As configure({"capacity": bytes}).
  Status set_capacity(std::uint64_t bytes) SLUICE_EXCLUDES(mu_);
  // Reporters are read by collect() until detached; detach before the
  // reporter goes.
  void attach(const CacheReporter* r) SLUICE_EXCLUDES(mu_);
  void detach(const CacheReporter* r) SLUICE_EXCLUDES(mu_);

 private:
  struct Flow;

  Flow* find_flow(const Context& ctx) const noexcept;
  // The flow of `id`, made if need be; `named` (by the configuration or a
  // cache): its own even beyond max_flows.
  Flow& flow_locked(std::uint64_t id, bool named) SLUICE_REQUIRES(mu_);
  Flow& new_flow_locked(std::uint64_t id, bool other) SLUICE_REQUIRES(mu_);
  void apply_locked(const CacheReserveConfig& c) SLUICE_REQUIRES(mu_);
  double fair_share(const Flow& f) const noexcept;

  // Read without a lock; written under mu_.
  alignas(64) std::atomic<std::uint64_t> capacity_{0};
  std::atomic<std::uint64_t> epoch_{0};
  std::atomic<std::uint32_t> flow_by_{CacheReserveConfig::kTenant};
  std::atomic<double> total_weight_{0};
  std::atomic<bool> configured_{false};
  std::unique_ptr<detail::FlowIndex<Flow>> index_;  // its adds under mu_

  alignas(64) mutable Mutex mu_;
  CacheReserveConfig config_ SLUICE_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Flow>> flows_ SLUICE_GUARDED_BY(mu_);  // in the order first known
  std::uint32_t seen_flows_ SLUICE_GUARDED_BY(mu_) = 0;              // known without being named
  Flow* other_ SLUICE_GUARDED_BY(mu_) = nullptr;
  std::vector<const CacheReporter*> reporters_ SLUICE_GUARDED_BY(mu_);
};

std::unique_ptr<EnforcementObject> make_cache_reserve(const ObjectEnv& env);

}  // namespace sluice
