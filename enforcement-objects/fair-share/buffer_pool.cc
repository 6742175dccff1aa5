// The buffer-pool object (sluice/objects/buffer_pool.h): the pool's word,
// the flows' table, the lock-free grant and release, and the waiters.
#include "sluice/objects/buffer_pool.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "flow_table.h"
#include "sluice/dcheck.h"

namespace sluice {
namespace {

constexpr std::string_view kPoolTunables[] = {"reserved", "capacity"};
static_assert(std::size(kPoolTunables) <= kMaxTunables);

inline std::uint64_t pool_key_of(std::uint32_t by, const Context& ctx) noexcept {
  switch (by) {
    case BufferPoolConfig::kTenant:
      return ctx.tenant;
    case BufferPoolConfig::kWorkflow:
      return ctx.workflow;
    default:
      return ctx.origin;
  }
}

}  // namespace

// The pool's use, reserved and global, as one word that a grant and a
// release change together.
class BufferPool::UseWord {
 public:
#if defined(__x86_64__) && defined(__GCC_HAVE_SYNC_COMPARE_AND_SWAP_16)
  __extension__ using Word = unsigned __int128;  // a GNU type: no pedantic warning

  // Two plain loads: a torn pair only makes the compare-and-swap fail.
  Use load() const noexcept {
    return {halves_.reserved.load(std::memory_order_relaxed),
            halves_.global.load(std::memory_order_relaxed)};
  }
  // A locked read (a compare-and-swap that changes nothing): the current pair.
  Use load_exact() noexcept {
    return unpack(__sync_val_compare_and_swap(word(), 0, 0));
  }
  // Like std::atomic's: on failure `expected` becomes the current pair. A
  // full barrier either way.
  bool compare_exchange(Use& expected, Use desired) noexcept {
    const Word e = pack(expected);
    const Word prev = __sync_val_compare_and_swap(word(), e, pack(desired));
    if (prev == e) return true;
    expected = unpack(prev);
    return false;
  }

 private:
  static Word pack(Use u) noexcept {
    return static_cast<Word>(u.global) << 64 | u.reserved;
  }
  static Use unpack(Word v) noexcept {
    return {static_cast<std::uint64_t>(v), static_cast<std::uint64_t>(v >> 64)};
  }
  Word* word() noexcept {
    return reinterpret_cast<Word*>(&halves_);
  }
  struct alignas(16) Halves {
    std::atomic<std::uint64_t> reserved{0};  // the low half
    std::atomic<std::uint64_t> global{0};
  };
  static_assert(sizeof(Halves) == 16 && sizeof(std::atomic<std::uint64_t>) == 8);
  Halves halves_;
#else
  // Without a double-width compare-and-swap: the pair under a mutex held for
  // the compare alone.
  Use load() const noexcept {
    MutexLock lock(mu_);
    return use_;
  }
  Use load_exact() noexcept {
    return load();
  }
  bool compare_exchange(Use& expected, Use desired) noexcept {
    MutexLock lock(mu_);
    if (use_.reserved == expected.reserved && use_.global == expected.global) {
      use_ = desired;
      return true;
    }
    expected = use_;
    return false;
  }

 private:
  mutable Mutex mu_;
  Use use_ SLUICE_GUARDED_BY(mu_);
#endif
};

// A flow: what it holds and its counters (atomics, for the lock-free paths),
// then its waiters (under mu_).
struct BufferPool::Flow {
  Flow(std::uint64_t i, std::uint32_t n, bool o, double w) : weight(w), id(i), index(n), other(o) {}

  std::atomic<std::uint64_t> usage{0};  // U
  std::atomic<std::uint64_t> grants{0};
  std::atomic<std::uint64_t> from_reserved_bytes{0};
  std::atomic<std::uint64_t> released_bytes{0};  // what releases gave back (clamped)
  std::atomic<double> weight;

  // The rest under mu_, on its own line.
  alignas(64) const std::uint64_t id;
  const std::uint32_t index;  // in flows_
  const bool other;           // the flow of every id beyond max_flows
  Waiter* head = nullptr;     // its waiters, in order of arrival
  Waiter* tail = nullptr;
  std::uint64_t queued = 0;
  std::uint64_t stalls = 0;
  std::int64_t stall_ns = 0;
  std::int64_t max_stall_ns = 0;
};

struct BufferPool::Waiter {
  Waiter(Flow& f, std::uint64_t n, std::uint64_t s) : flow(f), amount(n), seq(s) {}
  Flow& flow;
  const std::uint64_t amount;
  const std::uint64_t seq;  // order of arrival, all flows
  std::condition_variable cv;
  Waiter* next = nullptr;
  bool granted = false;
  bool cancelled = false;
};

// Flow id -> Flow (flow_table.h).
struct BufferPool::Table : detail::FlowTable<BufferPool::Flow> {
  using FlowTable::FlowTable;
};

BufferPool::BufferPool(Clock* clock)
    : clock_(clock ? clock : &system_clock()), use_(std::make_unique<UseWord>()) {}

BufferPool::~BufferPool() {
  // Nobody else calls now: what the flows hold is what the pool lent.
  MutexLock lock(mu_);
  std::uint64_t usage = 0;
  for (const auto& f : flows_) usage += f->usage.load(std::memory_order_relaxed);
  const Use u = use_->load_exact();
  SLUICE_DCHECK(usage == u.reserved + u.global,
                "the flows' usage sums to the pool's reserved plus global use");
  (void)usage;
}

Status BufferPool::validate(const nlohmann::json& config) const {
  MutexLock lock(mu_);
  return parse_buffer_pool_config(config, configured_.load() ? &config_ : nullptr).status();
}

Status BufferPool::configure(const nlohmann::json& config) {
  MutexLock lock(mu_);
  StatusOr<BufferPoolConfig> parsed =
      parse_buffer_pool_config(config, configured_.load() ? &config_ : nullptr);
  if (!parsed) return parsed.status();
  apply_locked(*parsed);
  return {};
}

std::span<const std::string_view> BufferPool::tunables() const noexcept {
  return kPoolTunables;
}

Status BufferPool::set_tunables(std::uint64_t mask,
                                std::span<const double, kMaxTunables> values) noexcept {
  if (mask >> std::size(kPoolTunables)) {
    return Status::invalid("buffer-pool has tunables reserved and capacity only");
  }
  MutexLock lock(mu_);
  if (!configured_.load()) return Status::precondition("buffer-pool: not configured yet");
  BufferPoolConfig c = config_;
  for (unsigned i = 0; i < std::size(kPoolTunables); ++i) {
    if ((mask >> i & 1) == 0) continue;
    const double v = values[i];
    const double lo = i == 0 ? 0 : 1;
    if (!std::isfinite(v) || v != std::floor(v) || v < lo ||
        v > static_cast<double>(kBufferPoolMaxCapacity)) {
      return Status::invalid(
          std::string(kPoolTunables[i]) + ": must be an integer number of bytes " +
          (i == 0 ? "from 0 to capacity" : "from 1 to 2^62") + ", got " + std::to_string(v));
    }
    (i == 0 ? c.reserved : c.capacity) = static_cast<std::uint64_t>(v);
  }
  if (c.reserved > c.capacity) {
    return (mask & 1) != 0 ? Status::invalid("reserved: must be at most capacity (" +
                                             std::to_string(c.capacity) + "), got " +
                                             std::to_string(c.reserved))
                           : Status::invalid("capacity: must be at least reserved (" +
                                             std::to_string(c.reserved) + "), got " +
                                             std::to_string(c.capacity));
  }
  apply_locked(c);
  return {};
}

void BufferPool::apply_locked(const BufferPoolConfig& c) {
  config_ = c;
  flow_by_.store(c.flow_by, std::memory_order_relaxed);
  capacity_.store(c.capacity, std::memory_order_relaxed);
  reserved_.store(c.reserved, std::memory_order_relaxed);
  configured_.store(true, std::memory_order_release);
  size_table_locked();
  for (const auto& f : flows_) {
    const auto it = f->other ? c.weights.end() : c.weights.find(f->id);
    f->weight.store(it != c.weights.end() ? it->second : c.default_weight,
                    std::memory_order_relaxed);
  }
  // Flows given a weight are known from now on (their weights count in the
  // fair shares), while there is room.
  const Table& table = *tables_.back();
  for (const auto& [id, w] : c.weights) {
    if (own_flows_ >= config_.max_flows) break;
    if (table.find(id) == nullptr) new_flow_locked(id, false);
  }
  double total = 0;
  for (const auto& f : flows_) total += f->weight.load(std::memory_order_relaxed);
  total_weight_.store(total, std::memory_order_relaxed);
  // A smaller reserved pool takes nothing back: what it lent beyond its new
  // size is counted as the global pool's from now on.
  Use cur = use_->load_exact();
  while (cur.reserved > c.reserved &&
         !use_->compare_exchange(cur, {c.reserved, cur.global + (cur.reserved - c.reserved)})) {
  }
  dispatch_locked();  // more room, or new fair shares
  check_invariants_locked();
}

void BufferPool::size_table_locked() {
  detail::ensure_room(tables_, table_, std::max(config_.max_flows, own_flows_));
}

BufferPool::Flow& BufferPool::new_flow_locked(std::uint64_t id, bool other) {
  const auto index = static_cast<std::uint32_t>(flows_.size());
  const auto it = other ? config_.weights.end() : config_.weights.find(id);
  const double weight = it != config_.weights.end() ? it->second : config_.default_weight;
  flows_.push_back(std::make_unique<Flow>(id, index, other, weight));
  Flow& f = *flows_.back();
  if (other) {
    other_ = &f;
  } else {
    ++own_flows_;
    size_table_locked();  // room for it when max_flows went down below the flows seen
    tables_.back()->insert(id, &f);
  }
  total_weight_.store(total_weight_.load(std::memory_order_relaxed) + weight,
                      std::memory_order_relaxed);
  return f;
}

BufferPool::Flow& BufferPool::flow_locked(std::uint64_t id) {
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

inline BufferPool::Flow* BufferPool::find_flow(const Context& ctx) const noexcept {
  const Table* table = table_.load(std::memory_order_acquire);
  if (table == nullptr) [[unlikely]]
    return nullptr;
  return table->find(pool_key_of(flow_by_.load(std::memory_order_relaxed), ctx));
}

inline double BufferPool::fair_share(const Flow& f) const noexcept {
  const double total = total_weight_.load(std::memory_order_relaxed);
  return total > 0 ? static_cast<double>(capacity_.load(std::memory_order_relaxed)) *
                         f.weight.load(std::memory_order_relaxed) / total
                   : 0;
}

BufferPool::Take BufferPool::take(Flow& f, std::uint64_t n, bool exact) noexcept {
  const std::uint64_t cap = capacity_.load(std::memory_order_relaxed);
  const std::uint64_t rho = std::min(reserved_.load(std::memory_order_relaxed), cap);
  const std::uint64_t global_cap = cap - rho;
  const std::uint64_t usage = f.usage.load(std::memory_order_relaxed);
  const bool below = static_cast<double>(usage) < fair_share(f);
  const bool oversize = n > cap;
  if (oversize && usage != 0) return {};
  Use cur = exact ? use_->load_exact() : use_->load();
  std::uint64_t r;
  for (;;) {
    const std::uint64_t used = cur.reserved + cur.global;
    const std::uint64_t total_free = cap > used ? cap - used : 0;
    const std::uint64_t r_free = std::min(rho > cur.reserved ? rho - cur.reserved : 0, total_free);
    const std::uint64_t g_free =
        std::min(global_cap > cur.global ? global_cap - cur.global : 0, total_free);
    r = below ? std::min(n, r_free) : 0;
    if (!oversize && (n > total_free || n - r > g_free)) return {};
    if (use_->compare_exchange(cur, {cur.reserved + r, cur.global + (n - r)})) break;
  }
  // After the pool's word: what the flows hold never exceeds what the pool lent.
  f.usage.fetch_add(n, std::memory_order_relaxed);
  f.grants.fetch_add(1, std::memory_order_relaxed);
  if (r != 0) f.from_reserved_bytes.fetch_add(r, std::memory_order_relaxed);
  if (oversize) oversize_.fetch_add(1, std::memory_order_relaxed);
  return {true, r, oversize};
}

void BufferPool::give_back(std::uint64_t n) noexcept {
  Use cur = use_->load();
  for (;;) {
    // The reserved pool refills first.
    const std::uint64_t r = std::min(n, cur.reserved);
    SLUICE_DCHECK(n - r <= cur.global, "a release gives back no more than the pool lent");
    const Use next{cur.reserved - r, cur.global - std::min(n - r, cur.global)};
    if (use_->compare_exchange(cur, next)) return;
  }
}

Verdict BufferPool::acquire(const Context& ctx, std::uint64_t amount) noexcept {
  if (amount == 0) [[unlikely]]
    return {};
  if (Flow* f = find_flow(ctx); f != nullptr && waiting_.load(std::memory_order_seq_cst) == 0 &&
                                !shut_down_.load(std::memory_order_relaxed) &&
                                take(*f, amount, false).ok) [[likely]] {
    return {};
  }
  return acquire_slow(ctx, amount);
}

Verdict BufferPool::acquire_slow(const Context& ctx, std::uint64_t n) noexcept {
  MutexLock lock(mu_);
  if (shut_down_.load(std::memory_order_relaxed)) return {Outcome::kCancelled, 0};
  if (!configured_.load(std::memory_order_relaxed)) return {};
  Flow& f = flow_locked(pool_key_of(config_.flow_by, ctx));
  if ((ctx.flags & context_flag::kNoWait) != 0) {
    if (waiting_.load(std::memory_order_seq_cst) != 0 || !take(f, n, true).ok)
      return {Outcome::kWouldWait, 0};
    return {};
  }
  const std::int64_t start = clock_->now_ns();
  Waiter self(f, n, next_seq_++);
  enqueue_locked(self);
  dispatch_locked();  // it may be the head, and fit now
  bool waited = false;
  while (!self.granted && !self.cancelled) {
    waited = true;
    clock_->wait(lock.native(), self.cv);
  }
  if (!waited) return {self.granted ? Outcome::kOk : Outcome::kCancelled, 0};
  const std::int64_t stalled = std::max<std::int64_t>(0, clock_->now_ns() - start);
  ++f.stalls;
  f.stall_ns += stalled;
  f.max_stall_ns = std::max(f.max_stall_ns, stalled);
  return {self.granted ? Outcome::kOk : Outcome::kCancelled, static_cast<std::uint64_t>(stalled)};
}

void BufferPool::release(const Context& ctx, std::uint64_t amount) noexcept {
  if (amount == 0 || !configured_.load(std::memory_order_acquire)) return;
  Flow* f = find_flow(ctx);
  if (f == nullptr) [[unlikely]] {
    // An id beyond max_flows that the table has no room to alias.
    MutexLock lock(mu_);
    f = &flow_locked(pool_key_of(config_.flow_by, ctx));
  }
  std::uint64_t u = f->usage.load(std::memory_order_relaxed);
  std::uint64_t m;
  do {
    m = std::min(amount, u);
  } while (!f->usage.compare_exchange_weak(u, u - m, std::memory_order_relaxed));
  if (m < amount) over_released_.fetch_add(amount - m, std::memory_order_relaxed);
  if (m == 0) return;
  f->released_bytes.fetch_add(m, std::memory_order_relaxed);
  give_back(m);  // a full barrier: a waiter that registered before it is seen below
  if (waiting_.load(std::memory_order_seq_cst) != 0) {
    MutexLock lock(mu_);
    dispatch_locked();
  }
}

bool BufferPool::same_flow(const Context& a, const Context& b) const noexcept {
  const std::uint32_t by = flow_by_.load(std::memory_order_relaxed);
  return pool_key_of(by, a) == pool_key_of(by, b);
}

Verdict BufferPool::enforce_context(const Context& ctx) noexcept {
  const Verdict v = acquire(ctx, ctx.size);
  if (v.ok()) release(ctx, ctx.size);
  return v;
}

Verdict BufferPool::try_enforce_context(const Context& ctx) noexcept {
  Context c = ctx;
  c.flags |= context_flag::kNoWait;
  return enforce_context(c);
}

void BufferPool::enqueue_locked(Waiter& w) {
  Flow& f = w.flow;
  if (f.tail != nullptr) {
    f.tail->next = &w;
  } else {
    f.head = &w;
    waiting_flows_.push_back(&f);
  }
  f.tail = &w;
  ++f.queued;
  // Before the waiter reads the pool (dispatch_locked): a release that gave
  // back after that read sees it.
  waiting_.fetch_add(1, std::memory_order_seq_cst);
}

void BufferPool::dequeue_locked(Waiter& w) {
  Flow& f = w.flow;
  SLUICE_DCHECK(f.head == &w, "a flow's waiters leave in order of arrival");
  f.head = w.next;
  if (f.head == nullptr) {
    f.tail = nullptr;
    const auto it = std::find(waiting_flows_.begin(), waiting_flows_.end(), &f);
    SLUICE_DCHECK(it != waiting_flows_.end(), "a flow with waiters is listed");
    *it = waiting_flows_.back();
    waiting_flows_.pop_back();
  }
  w.next = nullptr;
  --f.queued;
  waiting_.fetch_sub(1, std::memory_order_seq_cst);
}

BufferPool::Waiter* BufferPool::head_locked() const {
  Waiter* best = nullptr;
  double best_key = 0;
  for (Flow* f : waiting_flows_) {
    const double share = fair_share(*f);
    const double usage = static_cast<double>(f->usage.load(std::memory_order_relaxed));
    const double key = share > 0 ? usage / share : HUGE_VAL;
    if (best == nullptr || key < best_key || (key == best_key && f->head->seq < best->seq)) {
      best = f->head;
      best_key = key;
    }
  }
  return best;
}

void BufferPool::dispatch_locked() {
  while (Waiter* h = head_locked()) {
    if (!take(h->flow, h->amount, true).ok) return;  // nobody overtakes the head
    dequeue_locked(*h);
    h->granted = true;
    h->cv.notify_one();
  }
}

nlohmann::json BufferPool::collect() const {
  MutexLock lock(mu_);
  const Use u = use_->load_exact();
  const std::uint64_t cap = config_.capacity;
  const std::uint64_t rho = config_.reserved;
  const std::uint64_t used = u.reserved + u.global;
  const std::uint64_t total_free = cap > used ? cap - used : 0;
  const std::uint64_t reserved_free = std::min(rho > u.reserved ? rho - u.reserved : 0, total_free);
  const std::uint64_t global_free =
      std::min(cap - rho > u.global ? cap - rho - u.global : 0, total_free - reserved_free);
  SLUICE_DCHECK(
      reserved_free <= rho && global_free <= cap - rho && reserved_free + global_free <= total_free,
      "the free counts lie within the pools' sizes and what is not used");
  nlohmann::json flows = nlohmann::json::array();
  for (const auto& p : flows_) {
    const Flow& f = *p;
    const std::uint64_t usage = f.usage.load(std::memory_order_relaxed);
    const std::uint64_t released = f.released_bytes.load(std::memory_order_relaxed);
    flows.push_back({{"flow", f.other ? nlohmann::json("other") : nlohmann::json(f.id)},
                     {"weight", f.weight.load(std::memory_order_relaxed)},
                     {"fair_share", static_cast<std::uint64_t>(std::llround(fair_share(f)))},
                     {"usage", usage},
                     {"granted_bytes", usage + released},
                     {"grants", f.grants.load(std::memory_order_relaxed)},
                     {"from_reserved_bytes", f.from_reserved_bytes.load(std::memory_order_relaxed)},
                     {"released_bytes", released},
                     {"stalls", f.stalls},
                     {"stall_ns", f.stall_ns},
                     {"queued", f.queued},
                     {"max_stall_ns", f.max_stall_ns}});
  }
  return {{"capacity", cap},
          {"reserved", rho},
          {"reserved_free", reserved_free},
          {"global_free", global_free},
          {"used", used},
          {"queued", waiting_.load(std::memory_order_relaxed)},
          {"flows", std::move(flows)},
          {"oversize", oversize_.load(std::memory_order_relaxed)},
          {"over_released", over_released_.load(std::memory_order_relaxed)}};
}

void BufferPool::shutdown() noexcept {
  MutexLock lock(mu_);
  shut_down_.store(true, std::memory_order_relaxed);
  while (!waiting_flows_.empty()) {
    Waiter* w = waiting_flows_.back()->head;
    dequeue_locked(*w);
    w->cancelled = true;
    w->cv.notify_one();
  }
  check_invariants_locked();
}

void BufferPool::check_invariants_locked() const {
#ifndef NDEBUG
  std::uint64_t queued = 0;
  double total = 0;
  for (const auto& p : flows_) {
    const Flow& f = *p;
    std::uint64_t n = 0;
    const Waiter* last = nullptr;
    for (const Waiter* w = f.head; w != nullptr; w = w->next) {
      SLUICE_DCHECK(&w->flow == &f, "a waiter is queued in its own flow");
      SLUICE_DCHECK(last == nullptr || last->seq < w->seq, "a flow's waiters are in arrival order");
      last = w;
      ++n;
    }
    SLUICE_DCHECK(n == f.queued && last == f.tail, "a flow's queue, tail and count agree");
    SLUICE_DCHECK((std::find(waiting_flows_.begin(), waiting_flows_.end(), &f) !=
                   waiting_flows_.end()) == (n != 0),
                  "a flow is listed as waiting iff it has waiters");
    queued += n;
    total += f.weight.load(std::memory_order_relaxed);
  }
  SLUICE_DCHECK(queued == waiting_.load(std::memory_order_relaxed),
                "waiting_ counts every flow's waiters");
  SLUICE_DCHECK(std::abs(total - total_weight_.load(std::memory_order_relaxed)) <= 1e-6 * total,
                "the total weight is the known flows' weights' sum");
  SLUICE_DCHECK(config_.reserved <= config_.capacity, "the reserved pool lies within capacity");
#endif
}

std::unique_ptr<EnforcementObject> make_buffer_pool(const ObjectEnv& env) {
  return std::make_unique<BufferPool>(env.clock);
}

}  // namespace sluice
