#include "sluice/objects/fq.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "sluice/dcheck.h"

namespace sluice {
namespace {

// A work unit is 2^-10 ns of the server's time.
constexpr int kWorkShift = 10;
constexpr std::int64_t kWorkPerNs = std::int64_t{1} << kWorkShift;
constexpr double kWorkPerSecond = 1e9 * static_cast<double>(kWorkPerNs);
// The largest cost (about 13 days of work), and the deepest credit.
constexpr std::int64_t kMaxCost = std::int64_t{1} << 60;
constexpr double kMaxCostD = 1152921504606846976.0;  // 2^60
// Tags are moved back by V when it reaches this (ns per unit of weight), so
// that a double keeps sub-nanosecond resolution.
constexpr double kRebaseAt = 1099511627776.0;  // 2^40
constexpr double kNoTag = -std::numeric_limits<double>::infinity();

// Request classes, indexing Fq::coef_ and a flow's byte counters.
constexpr unsigned kRead = 0;
constexpr unsigned kWrite = 1;
constexpr unsigned kOtherOp = 2;

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

constexpr std::string_view kTunables[] = {"weight_1", "weight_2",  "weight_3",  "weight_4",
                                          "weight_5", "weight_6",  "weight_7",  "weight_8",
                                          "weight_9", "weight_10", "weight_11", "weight_12"};
static_assert(std::size(kTunables) <= kMaxTunables);

inline unsigned op_class(Op op) noexcept {
  return op == Op::kRead ? kRead : op == Op::kWrite ? kWrite : kOtherOp;
}

inline std::uint64_t key_of(std::uint32_t by, const Context& ctx) noexcept {
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

std::string shown(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

}  // namespace

// A flow's lease and counters for the threads whose stripe it is, on a line
// of their own.
struct alignas(64) Fq::Stripe {
  // The lock-free path's: the lease word, and the bytes served (read, write).
  std::atomic<std::uint64_t> lease{0};
  std::array<std::atomic<std::uint64_t>, 2> bytes{};
  // Under mu_.
  Flow* flow = nullptr;
  std::uint64_t seen = 0;  // the lease's balance as last seen
  bool leased = false;     // in leased_
};

struct Fq::Flow {
  Flow(std::uint64_t i, std::uint32_t n, bool o, double w) : id(i), index(n), other(o), weight(w) {
    for (Stripe& s : stripes) s.flow = this;
  }

  std::array<Stripe, kStripes> stripes;

  // The rest under mu_, on its own line.
  alignas(64) const std::uint64_t id;
  const std::uint32_t index;  // in flows_: ties between equal tags go to the older flow
  const bool other;           // the flow of every id beyond max_flows
  std::ptrdiff_t heap_pos = -1;
  double weight;
  double finish = kNoTag;  // F
  Waiter* head = nullptr;  // its waiters, in order of arrival
  Waiter* tail = nullptr;
  std::uint64_t queued = 0;
  std::uint64_t served_ops = 0;
  std::int64_t served_work = 0;
  std::int64_t arrived_work = 0;
  std::int64_t waited_ns = 0;      // of the waits that ended
  std::int64_t arrivals_ns = 0;    // the sum of its waiters' arrival times
  std::int64_t backlogged_ns = 0;  // of the backlogs that ended
  std::int64_t backlog_since = 0;
};

struct Fq::Waiter {
  Waiter(Flow& f, std::int64_t c, double s, unsigned k, std::uint64_t b, bool counts,
         std::int64_t now)
      : flow(f), cost(c), start(s), op_class(k), bytes(b), counts_op(counts), arrived_ns(now) {}
  Flow& flow;
  std::int64_t cost;  // work units
  double start;       // S
  const unsigned op_class;
  const std::uint64_t bytes;
  const bool counts_op;  // a request (not a settlement's extra work)
  const std::int64_t arrived_ns;
  std::condition_variable cv;
  Waiter* next = nullptr;
  bool granted = false;
  bool cancelled = false;
};

// Flow id -> Flow, open-addressed. Entries are only added (under mu_), each
// published by a release store of its flow after its key, so the lock-free
// path reads it without a lock.
struct Fq::Table {
  struct Entry {
    std::atomic<std::uint64_t> key{0};
    std::atomic<Flow*> flow{nullptr};
  };

  // `capacity`: a power of two >= 16.
  explicit Table(std::uint32_t capacity)
      : mask(capacity - 1),
        shift(64 - static_cast<unsigned>(std::countr_zero(capacity))),
        entries(std::make_unique<Entry[]>(capacity)) {}

  std::size_t slot(std::uint64_t id) const noexcept {
    return static_cast<std::size_t>((id * 0x9E3779B97F4A7C15ULL) >> shift);
  }
  // Never full (at most 3/4 used), so a probe ends at an empty entry.
  Flow* find(std::uint64_t id) const noexcept {
    for (std::size_t i = slot(id);; i = (i + 1) & mask) {
      Flow* f = entries[i].flow.load(std::memory_order_acquire);
      if (f == nullptr) return nullptr;
      if (entries[i].key.load(std::memory_order_relaxed) == id) return f;
    }
  }
  void insert(std::uint64_t id, Flow* f) noexcept {
    std::size_t i = slot(id);
    while (entries[i].flow.load(std::memory_order_relaxed) != nullptr) i = (i + 1) & mask;
    entries[i].key.store(id, std::memory_order_relaxed);
    entries[i].flow.store(f, std::memory_order_release);
  }
  std::uint32_t capacity() const noexcept { return mask + 1; }

  const std::uint32_t mask;
  const unsigned shift;
  const std::unique_ptr<Entry[]> entries;
  // Under mu_. Flows' own entries take at most half the table, ids mapped to
  // "other" at most a quarter.
  std::uint32_t aliases = 0;
};

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
  return kTunables;
}

Status Fq::set_tunables(std::uint64_t mask, std::span<const double, kMaxTunables> values) noexcept {
  if (mask >> std::size(kTunables)) {
    return Status::invalid("fq has tunables weight_1 .. weight_12 only");
  }
  MutexLock lock(mu_);
  if (!configured_) return Status::precondition("fq: not configured yet");
  FqConfig c = config_;
  for (unsigned i = 0; i < std::size(kTunables); ++i) {
    if ((mask >> i & 1) == 0) continue;
    SLUICE_RETURN_IF_ERROR(check_fq_weight(values[i], kTunables[i], shown(values[i])));
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
  const std::uint32_t flows = std::max(config_.max_flows, own_flows_);
  const std::uint32_t want = std::max<std::uint32_t>(16, std::bit_ceil(2 * flows));
  if (!tables_.empty() && tables_.back()->capacity() >= want) return;
  auto table = std::make_unique<Table>(want);
  if (!tables_.empty()) {
    const Table& old = *tables_.back();
    for (std::uint32_t i = 0; i < old.capacity(); ++i) {
      if (Flow* f = old.entries[i].flow.load(std::memory_order_relaxed)) {
        table->insert(old.entries[i].key.load(std::memory_order_relaxed), f);
      }
    }
    table->aliases = old.aliases;
  }
  table_.store(table.get(), std::memory_order_release);
  tables_.push_back(std::move(table));
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

Result Fq::enforce(const Context& ctx, const Request& /*request*/) noexcept {
  const Verdict v = enforce_context(ctx);
  return {v.outcome, v.wait_ns, nullptr};
}

inline bool Fq::grant_from_lease(const Context& ctx) noexcept {
  const Table* table = table_.load(std::memory_order_acquire);
  if (table == nullptr) [[unlikely]]
    return false;
  Flow* f = table->find(key_of(flow_by_.load(std::memory_order_relaxed), ctx));
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
  Flow& f = flow_locked(key_of(config_.flow_by, ctx));
  const unsigned k = op_class(ctx.op);
  return admit_locked(lock, f, cost_locked(k, ctx.size), k, ctx.size, true);
}

Verdict Fq::try_enforce_context(const Context& ctx) noexcept {
  if (grant_from_lease(ctx)) return {};
  MutexLock lock(mu_);
  if (!configured_ || shut_down_) return {};
  Flow& f = flow_locked(key_of(config_.flow_by, ctx));
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
  Flow& f = flow_locked(key_of(config_.flow_by, ctx));
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
  nlohmann::json flows = nlohmann::json::array();
  for (const auto& p : flows_) {
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
          {"flows", std::move(flows)}};
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

// ---------------------------------------------------------------------------
// The bucket of work and its waiters.

Fq::Waiter* Fq::head_locked() const {
  return heap_.empty() ? nullptr : heap_.front()->head;
}

std::int64_t Fq::cap_locked() const {
  const Waiter* h = head_locked();
  return (h != nullptr ? std::max(burst_, h->cost) : burst_) - leased_work_;
}

std::int64_t Fq::head_deadline_locked() const {
  const std::int64_t need = head_locked()->cost - bucket_;
  return need <= 0 ? last_ns_ : last_ns_ + (need + kWorkPerNs - 1) / kWorkPerNs;
}

void Fq::accrue_locked(std::int64_t to_ns, std::int64_t cap) {
  if (to_ns <= last_ns_) return;  // a clock set back in time accrues nothing
  const std::int64_t elapsed = to_ns - last_ns_;
  last_ns_ = to_ns;
  if (bucket_ >= cap) return;
  const std::int64_t room = cap - bucket_;
  bucket_ = elapsed > room / kWorkPerNs ? cap : bucket_ + elapsed * kWorkPerNs;
}

void Fq::settle_locked(std::int64_t now) {
  Waiter* const old_head = head_locked();
  if (old_head != nullptr) {
    // Virtual time lags real time by at most one bucket: what is granted now
    // plus what is left stays within the head's cost plus the burst, however
    // late we got here. Past that, the work is forfeited, as a full bucket
    // forfeits it.
    const std::int64_t max_lag = burst_ / kWorkPerNs;
    const std::int64_t lag = now - head_deadline_locked();
    if (lag > max_lag) last_ns_ += lag - max_lag;
  }
  while (Waiter* h = head_locked()) {
    const std::int64_t due = head_deadline_locked();
    if (due > now) break;
    accrue_locked(due, cap_locked());  // granted as of `due`, however late we got here
    SLUICE_DCHECK(bucket_ >= h->cost, "the head is due when the bucket holds its cost");
    Waiter* w = pop_head_locked(now);
    vtime_ = w->start;
    take_locked(w->flow, w->cost, w->op_class, w->bytes, w->counts_op);
    w->granted = true;
    w->cv.notify_one();
  }
  if (vtime_ >= kRebaseAt) rebase_locked();
  if (head_locked() == nullptr) {
    accrue_locked(now, cap_locked());  // the leases as last seen count as spent now
    look_at_leases_locked();
  } else {
    head_changed_locked(old_head);  // the new head now sleeps until its own deadline
  }
  check_invariants_locked();
}

void Fq::wait_as_head_locked(MutexLock& lock, Waiter& self) {
  const std::int64_t deadline = head_deadline_locked();
  if (clock_->now_ns() >= deadline) return;  // the caller's settle grants it
  clock_->wait_until(lock.native(), self.cv, deadline);
}

void Fq::head_changed_locked(Waiter* old_head) {
  Waiter* h = head_locked();
  if (h == old_head) return;
  if (old_head != nullptr && !old_head->granted && !old_head->cancelled) {
    old_head->cv.notify_one();
  }
  if (h != nullptr) h->cv.notify_one();
}

void Fq::push_locked(Waiter& w, std::int64_t now) {
  Flow& f = w.flow;
  if (f.queued == 0) f.backlog_since = now;
  (f.tail != nullptr ? f.tail->next : f.head) = &w;
  f.tail = &w;
  ++f.queued;
  ++queued_;
  f.arrivals_ns += w.arrived_ns;
  if (f.heap_pos < 0) {
    heap_.push_back(&f);
    f.heap_pos = static_cast<std::ptrdiff_t>(heap_.size() - 1);
    sift_up_locked(heap_.size() - 1);
  }
}

Fq::Waiter* Fq::pop_head_locked(std::int64_t now) {
  Flow* f = heap_.front();
  Waiter* w = f->head;
  f->head = w->next;
  if (f->head == nullptr) f->tail = nullptr;
  w->next = nullptr;
  --f->queued;
  --queued_;
  f->waited_ns += now - w->arrived_ns;
  f->arrivals_ns -= w->arrived_ns;
  if (f->queued != 0) {
    sift_down_locked(0);  // its start tag grew
    return w;
  }
  f->backlogged_ns += now - f->backlog_since;
  f->heap_pos = -1;
  Flow* last = heap_.back();
  heap_.pop_back();
  if (last != f) {
    heap_set_locked(0, last);
    sift_down_locked(0);
  }
  return w;
}

bool Fq::before_locked(const Flow* a, const Flow* b) const {
  const double sa = a->head->start;
  const double sb = b->head->start;
  return sa < sb || (sa == sb && a->index < b->index);
}

void Fq::heap_set_locked(std::size_t i, Flow* f) {
  heap_[i] = f;
  f->heap_pos = static_cast<std::ptrdiff_t>(i);
}

void Fq::sift_up_locked(std::size_t i) {
  Flow* f = heap_[i];
  while (i > 0) {
    const std::size_t parent = (i - 1) / 2;
    if (!before_locked(f, heap_[parent])) break;
    heap_set_locked(i, heap_[parent]);
    i = parent;
  }
  heap_set_locked(i, f);
}

void Fq::sift_down_locked(std::size_t i) {
  Flow* f = heap_[i];
  const std::size_t n = heap_.size();
  for (;;) {
    std::size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && before_locked(heap_[child + 1], heap_[child])) ++child;
    if (!before_locked(heap_[child], f)) break;
    heap_set_locked(i, heap_[child]);
    i = child;
  }
  heap_set_locked(i, f);
}

void Fq::rebase_locked() {
  const double shift = vtime_;
  vtime_base_ += shift;
  vtime_ = 0;
  for (const auto& f : flows_) {
    f->finish -= shift;
    for (Waiter* w = f->head; w != nullptr; w = w->next) w->start -= shift;
  }
  // Rounding may tie tags that were apart: the heap is rebuilt.
  for (std::size_t i = heap_.size() / 2; i-- > 0;) sift_down_locked(i);
}

void Fq::recost_waiters_locked() {
  for (Flow* f : heap_) {
    for (Waiter* w = f->head; w != nullptr; w = w->next) {
      if (!w->counts_op) continue;  // a settlement's extra work keeps its cost
      const std::int64_t cost = cost_locked(w->op_class, w->bytes);
      f->arrived_work += cost - w->cost;
      w->cost = cost;
    }
  }
}

// ---------------------------------------------------------------------------
// Leases.

void Fq::lease_locked(Stripe& s, std::int64_t cost) {
  if (queued_ != 0 || shut_down_) return;  // none while anyone waits
  const std::uint64_t want = std::max(static_cast<std::uint64_t>(lease_size_),
                                      std::min(static_cast<std::uint64_t>(cost), kMaxBalance));
  if (bucket_ < static_cast<std::int64_t>(want)) return;  // scarce: grants go through the lock
  if (!s.leased) {
    if (leases_ == kMaxLeases) reclaim_lease_locked(*leased_[next_victim_++ % kMaxLeases]);
    leased_[leases_++] = &s;
    s.leased = true;
  }
  // The balance only falls meanwhile, so this keeps it within kMaxBalance.
  const std::uint64_t before = s.lease.load(std::memory_order_relaxed) >> kOpsBits;
  const std::uint64_t amount = std::min(want, kMaxBalance - before);
  if (amount == 0) return;
  const std::uint64_t balance =
      s.lease.fetch_add(amount << kOpsBits, std::memory_order_relaxed) >> kOpsBits;
  fold_paid_locked(s, balance);
  leased_work_ += static_cast<std::int64_t>(amount);
  s.seen += amount;
  bucket_ -= static_cast<std::int64_t>(amount);
}

void Fq::fold_paid_locked(Stripe& s, std::uint64_t balance) {
  // Balances only fall outside the lock.
  const auto paid = static_cast<std::int64_t>(s.seen - balance);
  s.flow->served_work += paid;
  s.flow->arrived_work += paid;
  leased_work_ -= paid;
  s.seen = balance;
}

void Fq::look_at_leases_locked() {
  for (unsigned i = 0; i < leases_;) {
    Stripe& s = *leased_[i];
    fold_paid_locked(s, s.lease.load(std::memory_order_relaxed) >> kOpsBits);
    if (s.seen != 0) {
      ++i;
      continue;
    }
    s.leased = false;
    leased_[i] = leased_[--leases_];
  }
}

void Fq::reclaim_lease_locked(Stripe& s) {
  // Takes the balance, leaves the grant count.
  const std::uint64_t balance = s.lease.fetch_and(kOpsMask, std::memory_order_relaxed) >> kOpsBits;
  fold_paid_locked(s, balance);
  bucket_ += static_cast<std::int64_t>(balance);
  leased_work_ -= static_cast<std::int64_t>(balance);
  s.seen = 0;
  s.leased = false;
  for (unsigned i = 0; i < leases_; ++i) {
    if (leased_[i] == &s) {
      leased_[i] = leased_[--leases_];
      break;
    }
  }
}

void Fq::reclaim_leases_locked() {
  while (leases_ != 0) reclaim_lease_locked(*leased_[leases_ - 1]);
}

void Fq::fold_ops_locked(Stripe& s) {
  std::uint64_t w = s.lease.load(std::memory_order_relaxed);
  while (!s.lease.compare_exchange_weak(w, w & ~kOpsMask, std::memory_order_relaxed)) {
  }
  s.flow->served_ops += w & kOpsMask;
}

void Fq::check_invariants_locked() const {
#ifndef NDEBUG
  std::uint64_t queued = 0;
  for (const auto& p : flows_) {
    const Flow& f = *p;
    std::uint64_t n = 0;
    const Waiter* last = nullptr;
    for (const Waiter* w = f.head; w != nullptr; w = w->next) {
      SLUICE_DCHECK(&w->flow == &f, "a waiter is queued in its own flow");
      SLUICE_DCHECK(last == nullptr || last->start <= w->start,
                    "a flow's start tags grow in order of arrival");
      last = w;
      ++n;
    }
    SLUICE_DCHECK(n == f.queued && last == f.tail, "a flow's queue, tail and count agree");
    SLUICE_DCHECK((f.heap_pos >= 0) == (f.queued != 0), "a flow is in the heap iff it has waiters");
    for (const Stripe& s : f.stripes) {
      SLUICE_DCHECK(s.leased || s.seen == 0, "a stripe outside leased_ holds no lease");
    }
    queued += n;
  }
  SLUICE_DCHECK(queued == queued_, "queued_ counts every flow's waiters");
  for (std::size_t i = 0; i < heap_.size(); ++i) {
    SLUICE_DCHECK(heap_[i]->heap_pos == static_cast<std::ptrdiff_t>(i),
                  "a flow knows its place in the heap");
    SLUICE_DCHECK(i == 0 || !before_locked(heap_[i], heap_[(i - 1) / 2]),
                  "no flow in the heap comes before its parent");
  }
  std::int64_t seen = 0;
  for (unsigned i = 0; i < leases_; ++i) {
    SLUICE_DCHECK(leased_[i]->leased, "leased_ holds the stripes with a lease");
    seen += static_cast<std::int64_t>(leased_[i]->seen);
  }
  SLUICE_DCHECK(seen == leased_work_,
                "leased_work_ is the sum of what the leases were last seen to hold");
  SLUICE_DCHECK(queued_ == 0 || leases_ == 0, "no lease is out while a request waits");
  if (configured_) {
    SLUICE_DCHECK(bucket_ <= cap_locked(), "the bucket holds no more than its cap");
  }
#endif
}

std::unique_ptr<EnforcementObject> make_fq(const ObjectEnv& env) {
  return std::make_unique<Fq>(env.clock);
}

}  // namespace sluice
