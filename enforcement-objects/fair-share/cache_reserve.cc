// The cache-reserve object (sluice/objects/cache_reserve.h): its flows, the
// words caches read, acquire/release and collect.
#include "sluice/objects/cache_reserve.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "flow_table.h"
#include "sluice/dcheck.h"

namespace sluice {
namespace {

constexpr std::string_view kReserveTunables[] = {"capacity"};
static_assert(std::size(kReserveTunables) <= kMaxTunables);

std::uint64_t flow_key(std::uint32_t by, const Context& ctx) noexcept {
  return by == CacheReserveConfig::kTenant     ? ctx.tenant
         : by == CacheReserveConfig::kWorkflow ? ctx.workflow
                                               : ctx.origin;
}

}  // namespace

// A flow: the words caches read and what acquire/release account.
struct CacheReserve::Flow {
  Flow(std::uint64_t i, bool o, double w) : weight(w), id(i), other(o) {}

  std::atomic<std::uint64_t> reserved{0};  // ρ, bytes (always 0 for "other")
  std::atomic<double> weight;
  std::atomic<std::uint64_t> usage{0};           // acquired, not released
  std::atomic<std::uint64_t> acquires{0};        // counted as inserts
  std::atomic<std::uint64_t> acquired_bytes{0};  // counted as inserted bytes
  const std::uint64_t id;
  const bool other;
};

CacheReserve::CacheReserve() : index_(std::make_unique<detail::FlowIndex<Flow>>()) {}

CacheReserve::~CacheReserve() {
  MutexLock lock(mu_);
  SLUICE_DCHECK(reporters_.empty(), "every cache detached before its object went");
}

Status CacheReserve::validate(const nlohmann::json& config) const {
  MutexLock lock(mu_);
  return parse_cache_reserve_config(config, configured_.load() ? &config_ : nullptr).status();
}

Status CacheReserve::configure(const nlohmann::json& config) {
  MutexLock lock(mu_);
  auto parsed = parse_cache_reserve_config(config, configured_.load() ? &config_ : nullptr);
  if (!parsed) return parsed.status();
  apply_locked(*parsed);
  return {};
}

std::span<const std::string_view> CacheReserve::tunables() const noexcept {
  return kReserveTunables;
}

Status CacheReserve::set_tunables(std::uint64_t mask,
                                  std::span<const double, kMaxTunables> values) noexcept {
  if (mask >> std::size(kReserveTunables))
    return Status::invalid("cache-reserve has tunable capacity only");
  if ((mask & 1) == 0) return {};
  const double v = values[0];
  if (!std::isfinite(v) || v != std::floor(v) || v < 1 ||
      v > static_cast<double>(kCacheReserveMaxCapacity)) {
    return Status::invalid("capacity: must be an integer number of bytes from 1 to 2^62, got " +
                           std::to_string(v));
  }
  return set_capacity(static_cast<std::uint64_t>(v));
}

Status CacheReserve::set_capacity(std::uint64_t bytes) {
  MutexLock lock(mu_);
  if (!configured_.load()) return Status::precondition("cache-reserve: not configured yet");
  if (bytes < 1 || bytes > kCacheReserveMaxCapacity) {
    return Status::invalid("capacity: must be an integer number of bytes from 1 to " +
                           std::to_string(kCacheReserveMaxCapacity) + ", got " +
                           std::to_string(bytes));
  }
  if (config_.reserved_sum() > bytes) {
    return Status::invalid("capacity: must be at least the reservations' sum (" +
                           std::to_string(config_.reserved_sum()) + "), got " +
                           std::to_string(bytes));
  }
  CacheReserveConfig c = config_;
  c.capacity = bytes;
  apply_locked(c);
  return {};
}

void CacheReserve::apply_locked(const CacheReserveConfig& c) {
  config_ = c;
  flow_by_.store(c.flow_by, std::memory_order_relaxed);
  // Flows the configuration names are known from now on, whatever max_flows.
  for (const auto& [id, w] : c.weights) flow_locked(id, true);
  for (const auto& [id, r] : c.reserved) flow_locked(id, true);
  double total = 0;
  for (const auto& f : flows_) {
    const auto w = f->other ? c.weights.end() : c.weights.find(f->id);
    f->weight.store(w != c.weights.end() ? w->second : c.default_weight, std::memory_order_relaxed);
    const auto r = f->other ? c.reserved.end() : c.reserved.find(f->id);
    f->reserved.store(r != c.reserved.end() ? r->second : 0, std::memory_order_relaxed);
    total += f->weight.load(std::memory_order_relaxed);
  }
  total_weight_.store(total, std::memory_order_relaxed);
  capacity_.store(c.capacity, std::memory_order_relaxed);
  configured_.store(true, std::memory_order_release);
  // After the words: a cache that sees the new epoch reads the new values.
  epoch_.fetch_add(1, std::memory_order_release);
}

CacheReserve::Flow& CacheReserve::new_flow_locked(std::uint64_t id, bool other) {
  const auto w = other ? config_.weights.end() : config_.weights.find(id);
  const double weight = w != config_.weights.end() ? w->second : config_.default_weight;
  flows_.push_back(std::make_unique<Flow>(id, other, weight));
  Flow& f = *flows_.back();
  if (other) {
    other_ = &f;
  } else {
    const auto r = config_.reserved.find(id);
    f.reserved.store(r != config_.reserved.end() ? r->second : 0, std::memory_order_relaxed);
    index_->add(id, &f);
  }
  total_weight_.store(total_weight_.load(std::memory_order_relaxed) + weight,
                      std::memory_order_relaxed);
  return f;
}

CacheReserve::Flow& CacheReserve::flow_locked(std::uint64_t id, bool named) {
  if (Flow* f = index_->find(id)) return *f;
  named = named || config_.reserved.contains(id) || config_.weights.contains(id);
  if (named || seen_flows_ < config_.max_flows) {
    if (!named) ++seen_flows_;
    return new_flow_locked(id, false);
  }
  // Not in the index: this id's acquires take the lock, and it gets a flow
  // of its own once a configuration or a cache names it.
  return other_ != nullptr ? *other_ : new_flow_locked(0, true);
}

inline CacheReserve::Flow* CacheReserve::find_flow(const Context& ctx) const noexcept {
  return index_->find(flow_key(flow_by_.load(std::memory_order_relaxed), ctx));
}

const std::atomic<std::uint64_t>* CacheReserve::reserved_word(std::uint64_t id) {
  MutexLock lock(mu_);
  return &flow_locked(id, true).reserved;
}

void CacheReserve::attach(const CacheReporter* r) {
  MutexLock lock(mu_);
  reporters_.push_back(r);
}

void CacheReserve::detach(const CacheReporter* r) {
  MutexLock lock(mu_);
  std::erase(reporters_, r);
}

Verdict CacheReserve::acquire(const Context& ctx, std::uint64_t amount) noexcept {
  Flow* f = find_flow(ctx);
  if (f == nullptr) [[unlikely]] {
    MutexLock lock(mu_);
    f = &flow_locked(flow_key(config_.flow_by, ctx), false);
  }
  f->usage.fetch_add(amount, std::memory_order_relaxed);
  f->acquires.fetch_add(1, std::memory_order_relaxed);
  f->acquired_bytes.fetch_add(amount, std::memory_order_relaxed);
  return {};
}

void CacheReserve::release(const Context& ctx, std::uint64_t amount) noexcept {
  Flow* f = find_flow(ctx);
  if (f == nullptr) [[unlikely]] {
    MutexLock lock(mu_);
    f = &flow_locked(flow_key(config_.flow_by, ctx), false);
  }
  std::uint64_t u = f->usage.load(std::memory_order_relaxed);
  while (!f->usage.compare_exchange_weak(u, u - std::min(u, amount), std::memory_order_relaxed)) {
  }
}

bool CacheReserve::same_flow(const Context& a, const Context& b) const noexcept {
  const std::uint32_t by = flow_by_.load(std::memory_order_relaxed);
  return flow_key(by, a) == flow_key(by, b);
}

double CacheReserve::fair_share(const Flow& f) const noexcept {
  const double total = total_weight_.load(std::memory_order_relaxed);
  return total > 0 ? static_cast<double>(capacity_.load(std::memory_order_relaxed)) *
                         f.weight.load(std::memory_order_relaxed) / total
                   : 0;
}

nlohmann::json CacheReserve::collect() const {
  MutexLock lock(mu_);
  // Each flow's counters: acquire/release's, plus every cache's report.
  std::vector<TenantLruStats> sums(flows_.size());
  std::unordered_map<const Flow*, std::size_t> at;
  for (std::size_t i = 0; i < flows_.size(); ++i) {
    at.emplace(flows_[i].get(), i);
    sums[i].usage = flows_[i]->usage.load(std::memory_order_relaxed);
    sums[i].inserts = flows_[i]->acquires.load(std::memory_order_relaxed);
    sums[i].inserted_bytes = flows_[i]->acquired_bytes.load(std::memory_order_relaxed);
  }
  Flow* const other = other_;
  for (const CacheReporter* r : reporters_) {
    r->report([&](std::uint64_t id, const TenantLruStats& s) {
      Flow* f = index_->find(id);
      if (f == nullptr) f = other;
      if (f == nullptr) return;  // not known here: the cache never asked for its word
      sums[at.at(f)] += s;
    });
  }
  std::uint64_t used = 0;
  nlohmann::json flows = nlohmann::json::array();
  for (std::size_t i = 0; i < flows_.size(); ++i) {
    const Flow& f = *flows_[i];
    const TenantLruStats& s = sums[i];
    used += s.usage;
    flows.push_back({{"flow", f.other ? nlohmann::json("other") : nlohmann::json(f.id)},
                     {"weight", f.weight.load(std::memory_order_relaxed)},
                     {"fair_share", static_cast<std::uint64_t>(std::llround(fair_share(f)))},
                     {"reserved", f.reserved.load(std::memory_order_relaxed)},
                     {"usage", s.usage},
                     {"pinned", s.pinned},
                     {"hits", s.hits},
                     {"misses", s.misses},
                     {"inserts", s.inserts},
                     {"inserted_bytes", s.inserted_bytes},
                     {"evictions", s.evictions},
                     {"evictions_below_reserved", s.evictions_below_reserved}});
  }
  return {{"capacity", config_.capacity},
          {"used", used},
          {"reserved", config_.reserved_sum()},
          {"caches", reporters_.size()},
          {"flows", std::move(flows)}};
}

std::unique_ptr<EnforcementObject> make_cache_reserve(const ObjectEnv& /*env*/) {
  return std::make_unique<CacheReserve>();
}

}  // namespace sluice
