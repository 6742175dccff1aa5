#include "sluice/objects/fq.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fq_internal.h"
#include "sluice/config_reader.h"

namespace sluice {

using namespace fq_detail;

namespace {

// This thread's stripe plus one (0: none yet), the same in every queue.
// Initial-exec: the stage runs inside preloaded shared objects, where the
// default model costs a call per access.
constinit thread_local unsigned t_stripe __attribute__((tls_model("initial-exec"))) = 0;
std::atomic<unsigned> g_next_stripe{0};

[[gnu::noinline]] unsigned assign_stripe() noexcept {
  t_stripe = g_next_stripe.fetch_add(1, std::memory_order_relaxed) % Fq::kStripes + 1;
  return t_stripe;
}

inline unsigned my_stripe() noexcept {
  unsigned s = t_stripe;
  if (s == 0) [[unlikely]]
    s = assign_stripe();
  return s - 1;
}

constexpr std::string_view kFqTunables[] = {"weight_1", "weight_2",  "weight_3",  "weight_4",
                                            "weight_5", "weight_6",  "weight_7",  "weight_8",
                                            "weight_9", "weight_10", "weight_11", "weight_12"};
static_assert(std::size(kFqTunables) <= kMaxTunables);

inline unsigned op_class(Op op) noexcept {
  return op == Op::kRead ? kRead : op == Op::kWrite ? kWrite : kOtherOp;
}

inline std::uint64_t fq_key_of(std::uint32_t by, const Context& ctx) noexcept {
  switch (by) {
    case FqConfig::kTenant:
      return ctx.tenant;
    case FqConfig::kOrigin:
      return ctx.origin;
    case FqConfig::kWorkflow:
      return ctx.workflow;
    case FqConfig::kOp:
      return static_cast<std::uint8_t>(ctx.op);
    default:
      return ctx.level;
  }
}

// DRF: the larger of the bytes' term (0 when not counted) and the ops term.
inline std::int64_t cost_of(double per_byte, std::int64_t per_op, std::uint64_t size) noexcept {
  const double bytes = static_cast<double>(size) * per_byte;
  const std::int64_t w = bytes < kMaxCostD ? static_cast<std::int64_t>(bytes) : kMaxCost;
  return std::max(w, per_op);
}

inline std::int64_t ns_of(std::int64_t work) noexcept {
  return work >> kWorkShift;
}

}  // namespace

Fq::Fq(Clock* clock) : clock_(clock ? clock : &system_clock()) {}

Fq::~Fq() = default;

Status Fq::validate(const nlohmann::json& config) const {
  MutexLock lock(mu_);
  return parse_fq_config(config, configured_ ? &config_ : nullptr).status();
}

Status Fq::configure(const nlohmann::json& config) {
  MutexLock lock(mu_);
  StatusOr<FqConfig> parsed = parse_fq_config(config, configured_ ? &config_ : nullptr);
  if (!parsed) return parsed.status();
  apply_locked(*parsed);
  return {};
}

std::span<const std::string_view> Fq::tunables() const noexcept {
  return kFqTunables;
}

Status Fq::set_tunables(std::uint64_t mask, std::span<const double, kMaxTunables> values) noexcept {
  if (mask >> std::size(kFqTunables)) {
    return Status::invalid("fq has tunables weight_1 .. weight_12 only");
  }
  MutexLock lock(mu_);
  if (!configured_) return Status::precondition("fq: not configured yet");
  FqConfig c = config_;
  for (unsigned i = 0; i < std::size(kFqTunables); ++i) {
    if ((mask >> i & 1) == 0) continue;
    SLUICE_RETURN_IF_ERROR(
        check_fq_weight(values[i], kFqTunables[i], config::exact_number(values[i])));
    c.weights[i + 1] = values[i];
  }
  if (c.weights.size() > kFqMaxWeights) {
    return Status::invalid("weights: at most 65536 flows may have a weight of their own");
  }
  apply_locked(c);
  return {};
}

void Fq::apply_locked(const FqConfig& c) {
  const std::int64_t now = clock_->now_ns();
  if (configured_) {
    settle_locked(now);  // grants already due, under the old configuration
    reclaim_leases_locked();
    accrue_locked(now, cap_locked());
  }
  const bool recost = configured_ && (c.read_bytes != config_.read_bytes ||
                                      c.write_bytes != config_.write_bytes || c.ops != config_.ops);
  config_ = c;
  burst_ = c.burst_us * 1000 * kWorkPerNs;
  lease_size_ = std::max<std::int64_t>(1, burst_ / (2 * kMaxLeases));
  coef_[kRead].store(c.read_bytes > 0 ? kWorkPerSecond / c.read_bytes : 0,
                     std::memory_order_relaxed);
  coef_[kWrite].store(c.write_bytes > 0 ? kWorkPerSecond / c.write_bytes : 0,
                      std::memory_order_relaxed);
  coef_[kOtherOp].store(0, std::memory_order_relaxed);
  op_cost_.store(c.ops > 0 ? std::llround(kWorkPerSecond / c.ops) : 0, std::memory_order_relaxed);
  flow_by_.store(c.flow_by, std::memory_order_relaxed);
  if (!configured_) {
    bucket_ = burst_;  // starts full
    last_ns_ = now;
    configured_ = true;
  }
  size_table_locked();
  for (const auto& f : flows_) {
    const auto it = f->other ? c.weights.end() : c.weights.find(f->id);
    f->weight = it != c.weights.end() ? it->second : c.default_weight;
  }
  // Flows given a weight are reported from now on, while there is room.
  const Table& table = *tables_.back();
  for (const auto& [id, w] : c.weights) {
    if (own_flows_ >= config_.max_flows) break;
    if (table.find(id) == nullptr) new_flow_locked(id, false);
  }
  if (recost) recost_waiters_locked();
  bucket_ = std::min(bucket_, cap_locked());
  if (Waiter* h = head_locked()) h->cv.notify_one();  // re-time its deadline
  check_invariants_locked();
}

void Fq::size_table_locked() {
  detail::ensure_room(tables_, table_, std::max(config_.max_flows, own_flows_));
}

Fq::Flow& Fq::new_flow_locked(std::uint64_t id, bool other) {
  const auto index = static_cast<std::uint32_t>(flows_.size());
  const auto it = other ? config_.weights.end() : config_.weights.find(id);
  const double weight = it != config_.weights.end() ? it->second : config_.default_weight;
  flows_.push_back(std::make_unique<Flow>(id, index, other, weight));
  Flow& f = *flows_.back();
  if (heap_.capacity() < flows_.size()) heap_.reserve(2 * flows_.size());
  if (other) {
    other_ = &f;
  } else {
    ++own_flows_;
    size_table_locked();  // room for it when max_flows went down below the flows seen
    tables_.back()->insert(id, &f);
  }
  return f;
}

Fq::Flow& Fq::flow_locked(std::uint64_t id) {
  Table& table = *tables_.back();
  if (Flow* f = table.find(id)) return *f;
  if (own_flows_ < config_.max_flows) return new_flow_locked(id, false);
  Flow& other = other_ != nullptr ? *other_ : new_flow_locked(0, true);
  if (table.aliases < table.capacity() / 4) {  // else this id always takes the lock
    table.insert(id, &other);
    ++table.aliases;
  }
  return other;
}

std::int64_t Fq::cost_locked(unsigned op_class, std::uint64_t size) const {
  return cost_of(coef_[op_class].load(std::memory_order_relaxed),
                 op_cost_.load(std::memory_order_relaxed), size);
}

inline bool Fq::grant_from_lease(const Context& ctx) noexcept {
  const Table* table = table_.load(std::memory_order_acquire);
  if (table == nullptr) [[unlikely]]
    return false;
  Flow* f = table->find(fq_key_of(flow_by_.load(std::memory_order_relaxed), ctx));
  if (f == nullptr) [[unlikely]]
    return false;
  const unsigned k = op_class(ctx.op);
  const std::int64_t cost = cost_of(coef_[k].load(std::memory_order_relaxed),
                                    op_cost_.load(std::memory_order_relaxed), ctx.size);
  Stripe& s = f->stripes[my_stripe()];
  // A balance of at least the cost and of at least 1 (every lease is taken
  // back while a request waits, so one that costs nothing queues behind it
  // too), and room in the grant count. A balance below 2^44 fails the test
  // for any cost that would overflow the shift.
  const auto need = static_cast<std::uint64_t>(std::max<std::int64_t>(cost, 1));
  std::uint64_t w = s.lease.load(std::memory_order_relaxed);
  for (;;) {
    if ((w >> kOpsBits) < need || (w & kOpsMask) == kOpsMask) return false;
    if (s.lease.compare_exchange_weak(w, w - (static_cast<std::uint64_t>(cost) << kOpsBits) + 1,
                                      std::memory_order_relaxed)) {
      break;
    }
  }
  if (k != kOtherOp && ctx.size != 0) s.bytes[k].fetch_add(ctx.size, std::memory_order_relaxed);
  return true;
}

Verdict Fq::enforce_context(const Context& ctx) noexcept {
  if (grant_from_lease(ctx)) [[likely]]
    return {};
  return enforce_slow(ctx);
}

Verdict Fq::enforce_slow(const Context& ctx) noexcept {
  MutexLock lock(mu_);
  if (!configured_ || shut_down_) return {};
  Flow& f = flow_locked(fq_key_of(config_.flow_by, ctx));
  const unsigned k = op_class(ctx.op);
  return admit_locked(lock, f, cost_locked(k, ctx.size), k, ctx.size, true);
}

Verdict Fq::try_enforce_context(const Context& ctx) noexcept {
  if (grant_from_lease(ctx)) return {};
  MutexLock lock(mu_);
  if (!configured_ || shut_down_) return {};
  Flow& f = flow_locked(fq_key_of(config_.flow_by, ctx));
  const unsigned k = op_class(ctx.op);
  const std::int64_t cost = cost_locked(k, ctx.size);
  settle_locked(clock_->now_ns());
  if (queued_ != 0) return {Outcome::kWouldWait, 0};
  if (bucket_ < cost) reclaim_leases_locked();  // all there is, then
  if (bucket_ < cost) return {Outcome::kWouldWait, 0};
  f.arrived_work += cost;
  take_locked(f, cost, k, ctx.size, true);
  check_invariants_locked();
  return {};
}

Verdict Fq::settle(const Context& ctx, std::uint64_t actual) noexcept {
  const unsigned k = op_class(ctx.op);
  if (actual == ctx.size || k == kOtherOp) return {};
  MutexLock lock(mu_);
  if (!configured_ || shut_down_) return {};
  Flow& f = flow_locked(fq_key_of(config_.flow_by, ctx));
  const std::int64_t charged = cost_locked(k, ctx.size);
  const std::int64_t owed = cost_locked(k, actual);
  const std::int64_t now = clock_->now_ns();
  if (actual < ctx.size) {
    // Give back what the request did not use, up to a full bucket: a refund
    // is never a burst larger than the bucket allows. It may serve the head now.
    // Counters are summed over the stripes: one may wrap, the sum does not.
    f.stripes[my_stripe()].bytes[k].fetch_sub(ctx.size - actual, std::memory_order_relaxed);
    const std::int64_t refund = charged - owed;
    f.served_work -= refund;
    f.arrived_work -= refund;
    settle_locked(now);
    bucket_ = std::min(cap_locked(), bucket_ + refund);
    settle_locked(now);
    if (Waiter* h = head_locked()) h->cv.notify_one();  // re-time: it came closer
    return {};
  }
  const std::uint64_t extra_bytes = actual - ctx.size;
  const std::int64_t extra = owed - charged;
  if (extra <= 0) {  // the bytes were not its dominant resource
    f.stripes[my_stripe()].bytes[k].fetch_add(extra_bytes, std::memory_order_relaxed);
    return {};
  }
  if ((ctx.flags & context_flag::kNoWait) == 0)
    return admit_locked(lock, f, extra, k, extra_bytes, false);
  // Must not wait: taken now, on credit. The bucket goes below zero and later
  // requests wait until it is paid back.
  settle_locked(now);
  f.arrived_work += extra;
  take_locked(f, extra, k, extra_bytes, false);
  bucket_ = std::max(bucket_, -kMaxCost);
  return {};
}

Verdict Fq::admit_locked(MutexLock& lock, Flow& f, std::int64_t cost, unsigned k,
                         std::uint64_t bytes, bool counts_op) {
  Stripe& mine = f.stripes[my_stripe()];
  if ((mine.lease.load(std::memory_order_relaxed) & kOpsMask) == kOpsMask) fold_ops_locked(mine);
  const std::int64_t start = clock_->now_ns();
  settle_locked(start);
  f.arrived_work += cost;
  if (queued_ == 0) {
    if (bucket_ < cost) reclaim_leases_locked();  // strand no work before waiting
    if (bucket_ >= cost) {
      take_locked(f, cost, k, bytes, counts_op);
      lease_locked(mine, cost);
      check_invariants_locked();
      return {};
    }
  }
  // Waits: there are no leases now (taken back above, or when the first
  // waiter queued). Its tags: no credit for an idle flow, whose old finish
  // tag lies behind V.
  const double s = std::max(vtime_, f.finish);
  f.finish = s + static_cast<double>(cost) / static_cast<double>(kWorkPerNs) / f.weight;
  Waiter self(f, cost, s, k, bytes, counts_op, start);
  Waiter* const old_head = head_locked();
  push_locked(self, start);
  head_changed_locked(old_head);
  check_invariants_locked();
  while (!self.granted && !self.cancelled) {
    if (head_locked() == &self) {
      wait_as_head_locked(lock, self);
    } else {
      clock_->wait(lock.native(), self.cv);
    }
    if (self.granted || self.cancelled) break;
    settle_locked(clock_->now_ns());
  }
  return {self.granted ? Outcome::kOk : Outcome::kCancelled,
          static_cast<std::uint64_t>(std::max<std::int64_t>(0, clock_->now_ns() - start))};
}

void Fq::take_locked(Flow& f, std::int64_t cost, unsigned k, std::uint64_t bytes, bool counts_op) {
  bucket_ -= cost;
  if (counts_op) ++f.served_ops;
  if (k != kOtherOp && bytes != 0) {
    f.stripes[my_stripe()].bytes[k].fetch_add(bytes, std::memory_order_relaxed);
  }
  f.served_work += cost;
}

nlohmann::json Fq::collect() const {
  MutexLock lock(mu_);
  const std::int64_t now = clock_->now_ns();
  nlohmann::json capacity = nlohmann::json::object();
  if (config_.read_bytes > 0) capacity["read_bytes"] = config_.read_bytes;
  if (config_.write_bytes > 0) capacity["write_bytes"] = config_.write_bytes;
  if (config_.ops > 0) capacity["ops"] = config_.ops;
  // Which flows to report, in the order they came: all, or the queued ones
  // and then those that did the most work.
  std::vector<const Flow*> shown;
  shown.reserve(flows_.size());
  for (const auto& p : flows_) shown.push_back(p.get());
  if (shown.size() > kFqMaxReportedFlows) {
    const auto busier = [](const Flow* a, const Flow* b) {
      if ((a->queued != 0) != (b->queued != 0)) return a->queued != 0;
      return a->arrived_work > b->arrived_work;
    };
    std::nth_element(shown.begin(), shown.begin() + kFqMaxReportedFlows, shown.end(), busier);
    shown.resize(kFqMaxReportedFlows);
    std::sort(shown.begin(), shown.end(),
              [](const Flow* a, const Flow* b) { return a->index < b->index; });
  }
  nlohmann::json flows = nlohmann::json::array();
  for (const Flow* p : shown) {
    const Flow& f = *p;
    // Plus what was paid from its leases since the lock last looked.
    std::uint64_t ops = f.served_ops;
    std::int64_t paid = 0;
    std::array<std::uint64_t, 2> bytes{};
    for (const Stripe& s : f.stripes) {
      const std::uint64_t w = s.lease.load(std::memory_order_relaxed);
      ops += w & kOpsMask;
      if (s.leased) paid += static_cast<std::int64_t>(s.seen - (w >> kOpsBits));
      for (unsigned k = kRead; k <= kWrite; ++k)
        bytes[k] += s.bytes[k].load(std::memory_order_relaxed);
    }
    const auto queued = static_cast<std::int64_t>(f.queued);
    flows.push_back(
        {{"flow", f.other ? nlohmann::json("other") : nlohmann::json(f.id)},
         {"weight", f.weight},
         {"served_ops", ops},
         {"served_read_bytes", bytes[kRead]},
         {"served_write_bytes", bytes[kWrite]},
         {"served_work_ns", ns_of(f.served_work + paid)},
         {"arrived_work_ns", ns_of(f.arrived_work + paid)},
         {"queued", f.queued},
         {"waited_ns", f.waited_ns + queued * now - f.arrivals_ns},
         {"backlogged_ns", f.backlogged_ns + (queued != 0 ? now - f.backlog_since : 0)}});
  }
  return {{"capacity", std::move(capacity)},
          {"burst_us", config_.burst_us},
          {"flow_by", flow_by_name(config_.flow_by)},
          {"default_weight", config_.default_weight},
          {"max_flows", config_.max_flows},
          {"virtual_time", static_cast<double>(vtime_base_ + static_cast<long double>(vtime_))},
          {"queued", queued_},
          {"flows", std::move(flows)},
          {"flows_total", flows_.size()},
          {"flows_omitted", flows_.size() - shown.size()}};
}

void Fq::shutdown() noexcept {
  MutexLock lock(mu_);
  reclaim_leases_locked();
  shut_down_ = true;
  const std::int64_t now = clock_->now_ns();
  while (!heap_.empty()) {
    Waiter* w = pop_head_locked(now);
    w->cancelled = true;
    w->cv.notify_one();
  }
  check_invariants_locked();
}

std::unique_ptr<EnforcementObject> make_fq(const ObjectEnv& env) {
  return std::make_unique<Fq>(env.clock);
}

}  // namespace sluice
