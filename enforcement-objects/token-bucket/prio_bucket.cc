#include "sluice/objects/prio_bucket.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "lease_slot.h"
#include "sluice/config_reader.h"
#include "sluice/dcheck.h"

namespace sluice {
namespace {

using detail::kNever;
using detail::kNsPerSecond;

static_assert(PrioBucket::kSlots == detail::kLeaseSlots, "a bucket has a slot per lease slot");
using detail::lease_slot;

// The bucket and class of the last request this thread enforced on a
// prio-bucket: what fast_grant() hands the stage's shortcut.
struct LastClass {
  const void* object = nullptr;
  std::uint8_t cls = 0;
};
constinit thread_local LastClass t_last __attribute__((tls_model("initial-exec")));

Status check_number(double v, double lo, double hi, const std::string& field, const char* what) {
  if (!std::isfinite(v) || v < lo || v > hi) {
    return Status::invalid(field + ": must be " + what + ", got " + config::exact_number(v));
  }
  return {};
}

}  // namespace

struct PrioBucket::Waiter {
  Waiter(unsigned c, long double k, std::uint64_t b, bool counts, std::int64_t now)
      : cls(c), cost(k), bytes(b), counts_request(counts), arrived_ns(now) {}
  const unsigned cls;
  const long double cost;
  const std::uint64_t bytes;
  const bool counts_request;  // a request (not a settlement's excess)
  const std::int64_t arrived_ns;
  double start = 0;  // S
  std::condition_variable cv;
  Waiter* next = nullptr;
  bool granted = false;
  bool cancelled = false;
};

struct PrioBucket::ClassState {
  Waiter* head = nullptr;  // its waiters, in order of arrival
  Waiter* tail = nullptr;
  std::uint64_t queued = 0;
  double finish = -std::numeric_limits<double>::infinity();  // F
  // Granted under the lock, and folded from the leases.
  std::uint64_t requests = 0;
  std::int64_t bytes = 0;
  std::uint64_t waits = 0;
  std::int64_t wait_ns_total = 0;  // of the waits that ended
  std::int64_t wait_ns_max = 0;
};

PrioBucket::PrioBucket(Clock* clock)
    : clock_(clock ? clock : &system_clock()), classes_(new ClassState[kPrioMaxClasses]) {
  for (unsigned i = 0; i < kSlots; ++i) {
    for (unsigned c = 0; c < kPrioMaxClasses; ++c) {
      slots_[i].leases[c].slot = static_cast<std::uint8_t>(i);
      slots_[i].leases[c].cls = static_cast<std::uint8_t>(c);
    }
  }
  for (auto& c : class_of_) c.store(kUnresolved, std::memory_order_relaxed);
  tunables_[0] = "rate";
  tunables_[1] = "burst";
}

PrioBucket::~PrioBucket() = default;

Status PrioBucket::validate(const nlohmann::json& config) const {
  MutexLock lock(mu_);
  return parse_prio_bucket_config(config, configured_ ? &config_ : nullptr).status();
}

Status PrioBucket::configure(const nlohmann::json& config) {
  MutexLock lock(mu_);
  StatusOr<PrioBucketConfig> parsed =
      parse_prio_bucket_config(config, configured_ ? &config_ : nullptr);
  if (!parsed) return parsed.status();
  apply_locked(*parsed);
  return {};
}

std::span<const std::string_view> PrioBucket::tunables() const noexcept {
  return {tunables_.data(), tunable_count_.load(std::memory_order_acquire)};
}

Status PrioBucket::set_tunables(std::uint64_t mask,
                                std::span<const double, kMaxTunables> values) noexcept {
  const std::size_t n = tunable_count_.load(std::memory_order_acquire);
  if (mask >> n) {
    return Status::invalid("prio-bucket has tunables rate, burst and weight_<class> only");
  }
  MutexLock lock(mu_);
  if (!configured_) return Status::precondition("prio-bucket: not configured yet");
  PrioBucketConfig c = config_;
  if (mask & 1) {
    SLUICE_RETURN_IF_ERROR(
        check_number(values[0], 1, 1e300, "rate", "a number of at least 1 token per second"));
    c.rate = values[0];
  }
  if (mask & 2) {
    SLUICE_RETURN_IF_ERROR(
        check_number(values[1], 1, 1e300, "burst", "a number of at least 1 token"));
    c.burst = values[1];
    c.burst_set = true;
  }
  for (std::size_t i = 2; i < n; ++i) {
    if ((mask >> i & 1) == 0) continue;
    SLUICE_RETURN_IF_ERROR(check_number(values[i], kPrioMinWeight, kPrioMaxWeight,
                                        std::string(tunables_[i]),
                                        "a number between 0.001 and 1000000"));
    c.classes[i - 2].weight = values[i];
  }
  if (!c.burst_set) c.burst = std::max(1.0, c.rate / 10);
  apply_locked(c);
  return {};
}

void PrioBucket::apply_locked(const PrioBucketConfig& c) {
  const std::int64_t now = clock_->now_ns();
  if (!configured_) {
    config_ = c;
    tokens_ = config_.burst;
    last_ns_ = static_cast<long double>(now);
    configured_ = true;
    // The class names are fixed from now on, and so are the tunables' names.
    tunable_names_.reserve(c.classes.size());
    for (const auto& k : c.classes) tunable_names_.push_back("weight_" + k.name);
    for (std::size_t i = 0; i < tunable_names_.size(); ++i) tunables_[2 + i] = tunable_names_[i];
    tunable_count_.store(2 + tunable_names_.size(), std::memory_order_release);
    update_mode_locked();
    return;
  }
  settle_locked(now);  // grants already due, under the old configuration
  reclaim_leases_locked();
  accrue_locked(static_cast<long double>(now), cap_locked());
  config_ = c;
  tokens_ = std::min(tokens_, cap_locked());
  update_mode_locked();
  rechoose_locked();                  // a new priority may change who is served next
  if (head_) head_->cv.notify_one();  // re-time its deadline under the new rate
  settle_locked(now);                 // a new head may be due at once
}

void PrioBucket::update_mode_locked() {
  const Mode mode = !configured_ || shut_down_               ? kLocked
                    : config_.unit == PrioBucketConfig::kOps ? kOps
                                                             : kBytes;
  mode_ = mode;
  for (Slot& s : slots_) {
    for (Lease& l : s.leases) l.mode.store(mode, std::memory_order_relaxed);
  }
  const long double share = std::floor(static_cast<long double>(config_.burst) / (2 * kSlots));
  lease_size_ = share >= static_cast<long double>(kMaxBalance)
                    ? kMaxBalance
                    : std::max<std::uint64_t>(1, static_cast<std::uint64_t>(share));
}

// ---------------------------------------------------------------------------
// Requests.

inline std::uint8_t PrioBucket::class_of(OriginId origin) const noexcept {
  return origin < origin::kMaxOrigins ? class_of_[origin].load(std::memory_order_relaxed)
                                      : kUnresolved;
}

[[gnu::always_inline]] inline bool PrioBucket::pay_from_lease(Lease& lease,
                                                              std::uint64_t size) noexcept {
  const std::uint32_t mode = lease.mode.load(std::memory_order_relaxed);
  if (mode == kLocked) return false;
  const std::uint64_t cost = mode == kOps ? 1 : size;
  // A balance of at least the cost and of at least 1 (every lease is taken
  // back while a request waits, so one that costs nothing queues behind it
  // too), and room in the grant count. A balance below 2^44 fails the test
  // for any cost that would overflow the shift.
  const std::uint64_t need = std::max<std::uint64_t>(cost, 1);
  std::uint64_t w = lease.word.load(std::memory_order_relaxed);
  for (;;) {
    if ((w >> kOpsBits) < need || (w & kOpsMask) == kOpsMask) return false;
    if (lease.word.compare_exchange_weak(w, w - (cost << kOpsBits) + 1,
                                         std::memory_order_relaxed)) {
      break;
    }
  }
  if (mode == kOps) lease.bytes.fetch_add(size, std::memory_order_relaxed);
  return true;
}

Verdict PrioBucket::enforce_context(const Context& ctx) noexcept {
  const std::uint8_t c = class_of(ctx.origin);
  if (c != kUnresolved) [[likely]] {
    t_last = {this, c};
    if (pay_from_lease(slots_[lease_slot()].leases[c], ctx.size)) [[likely]]
      return {};
  }
  return enforce_slow(ctx);
}

bool PrioBucket::fast_grant_of(void* lease, std::uint64_t size) noexcept {
  return pay_from_lease(*static_cast<Lease*>(lease), size);
}

FastGrant PrioBucket::fast_grant() noexcept {
  const LastClass last = t_last;
  if (last.object != this) return {};
  return {&PrioBucket::fast_grant_of, &slots_[lease_slot()].leases[last.cls]};
}

Verdict PrioBucket::enforce_slow(const Context& ctx) noexcept {
  MutexLock lock(mu_);
  if (!configured_ || shut_down_) return {};
  const unsigned c = resolve_locked(ctx.origin);
  t_last = {this, static_cast<std::uint8_t>(c)};
  return admit_locked(lock, c, cost_of_locked(ctx.size), ctx.size, true);
}

Verdict PrioBucket::try_enforce_context(const Context& ctx) noexcept {
  const std::uint8_t k = class_of(ctx.origin);
  if (k != kUnresolved) {
    t_last = {this, k};
    if (pay_from_lease(slots_[lease_slot()].leases[k], ctx.size)) return {};
  }
  MutexLock lock(mu_);
  if (!configured_ || shut_down_) return {};
  const unsigned c = resolve_locked(ctx.origin);
  t_last = {this, static_cast<std::uint8_t>(c)};
  const auto cost = static_cast<long double>(cost_of_locked(ctx.size));
  settle_locked(clock_->now_ns());
  if (queued_ != 0) return {Outcome::kWouldWait, 0};
  if (tokens_ < cost) reclaim_leases_locked();  // all there is, then
  if (tokens_ < cost) return {Outcome::kWouldWait, 0};
  take_locked(c, cost, ctx.size, true);
  check_invariants_locked();
  return {};
}

Verdict PrioBucket::settle(const Context& ctx, std::uint64_t actual) noexcept {
  MutexLock lock(mu_);
  if (!configured_ || shut_down_ || config_.unit == PrioBucketConfig::kOps || actual == ctx.size)
    return {};
  const unsigned c = resolve_locked(ctx.origin);
  const std::int64_t now = clock_->now_ns();
  if (actual < ctx.size) {
    // Give back what the request did not move, up to a full bucket: a refund
    // is never a burst larger than the bucket allows. It may pay the head now.
    const std::uint64_t back = ctx.size - actual;
    classes_[c].bytes -= static_cast<std::int64_t>(back);
    settle_locked(now);
    tokens_ = std::min(cap_locked(), tokens_ + static_cast<long double>(back));
    settle_locked(now);
    if (head_) head_->cv.notify_one();  // re-time: it came closer
    return {};
  }
  const std::uint64_t excess = actual - ctx.size;
  if ((ctx.flags & context_flag::kNoWait) == 0) return admit_locked(lock, c, excess, excess, false);
  // Must not wait: taken now, on credit. The bucket goes below zero and later
  // requests wait until it is paid back (no lease is drawn meanwhile).
  settle_locked(now);
  tokens_ -= static_cast<long double>(excess);
  classes_[c].bytes += static_cast<std::int64_t>(excess);
  return {};
}

unsigned PrioBucket::resolve_locked(OriginId origin) {
  if (origin >= origin::kMaxOrigins) return config_.default_class;
  const std::uint8_t known = class_of_[origin].load(std::memory_order_relaxed);
  if (known != kUnresolved) return known;
  const std::string_view name = origin_name(origin);
  // An id not interned yet has no name: its class is not kept.
  if (name == "unknown" && origin != origin::kUnknown) return config_.default_class;
  unsigned c = config_.default_class;
  for (unsigned i = 0; i < config_.classes.size() && c == config_.default_class; ++i) {
    for (const std::string& pattern : config_.classes[i].origins) {
      if (prio_origin_matches(pattern, name)) {
        c = i;
        break;
      }
    }
    if (c == i) break;
  }
  class_of_[origin].store(static_cast<std::uint8_t>(c), std::memory_order_relaxed);
  return c;
}

std::uint64_t PrioBucket::cost_of_locked(std::uint64_t size) const {
  return config_.unit == PrioBucketConfig::kOps ? 1 : size;
}

Verdict PrioBucket::admit_locked(MutexLock& lock, unsigned c, std::uint64_t whole_cost,
                                 std::uint64_t bytes, bool counts_request) {
  const auto cost = static_cast<long double>(whole_cost);
  const std::int64_t start = clock_->now_ns();
  settle_locked(start);
  if (queued_ == 0) {
    if (tokens_ < cost) reclaim_leases_locked();  // strand no token before waiting
    if (tokens_ >= cost) {
      take_locked(c, cost, bytes, counts_request);
      Lease& mine = slots_[lease_slot()].leases[c];
      if ((mine.word.load(std::memory_order_relaxed) & kOpsMask) == kOpsMask) fold_ops_locked(mine);
      lease_locked(mine, whole_cost);
      check_invariants_locked();
      return {};
    }
  }
  // Waits: there are no leases now (taken back above, or when the first
  // waiter queued).
  Waiter self(c, cost, bytes, counts_request, start);
  push_locked(self);
  // Served next by priority, it may be due at once: the tokens an earlier
  // head of a lower priority was saving up are its.
  settle_locked(start);
  while (!self.granted && !self.cancelled) {
    if (head_ == &self) {
      const long double due = std::ceil(head_deadline_locked());
      const std::int64_t deadline =
          due < static_cast<long double>(kNever) ? static_cast<std::int64_t>(due) : kNever;
      if (clock_->now_ns() < deadline) clock_->wait_until(lock.native(), self.cv, deadline);
    } else {
      clock_->wait(lock.native(), self.cv);
    }
    if (self.granted || self.cancelled) break;
    settle_locked(clock_->now_ns());
  }
  return {self.granted ? Outcome::kOk : Outcome::kCancelled,
          static_cast<std::uint64_t>(std::max<std::int64_t>(0, clock_->now_ns() - start))};
}

void PrioBucket::take_locked(unsigned c, long double cost, std::uint64_t bytes,
                             bool counts_request) {
  tokens_ = std::max(0.0L, tokens_ - cost);  // > -cost * epsilon after a grant
  ClassState& k = classes_[c];
  if (counts_request) ++k.requests;
  k.bytes += static_cast<std::int64_t>(bytes);
}

// ---------------------------------------------------------------------------
// The queue.

PrioBucket::Waiter* PrioBucket::choose_locked() const {
  Waiter* best = nullptr;
  int best_priority = 0;
  for (unsigned i = 0; i < config_.classes.size(); ++i) {
    Waiter* w = classes_[i].head;
    if (w == nullptr) continue;
    const int p = config_.classes[i].priority;
    if (best == nullptr || p < best_priority || (p == best_priority && w->start < best->start)) {
      best = w;
      best_priority = p;
    }
  }
  return best;
}

void PrioBucket::rechoose_locked() {
  Waiter* const old = head_;
  head_ = choose_locked();
  if (head_ == old) return;
  if (old != nullptr && !old->granted && !old->cancelled) old->cv.notify_one();
  if (head_ != nullptr) head_->cv.notify_one();
}

void PrioBucket::push_locked(Waiter& w) {
  ClassState& k = classes_[w.cls];
  const auto& cfg = config_.classes[w.cls];
  // No credit for a class back from idle: its old finish tag lies behind V.
  w.start = std::max(vtime_[static_cast<std::size_t>(cfg.priority)], k.finish);
  k.finish = w.start + static_cast<double>(w.cost) / cfg.weight;
  (k.tail != nullptr ? k.tail->next : k.head) = &w;
  k.tail = &w;
  ++k.queued;
  ++k.waits;
  ++queued_;
  rechoose_locked();
}

void PrioBucket::pop_locked(Waiter& w, std::int64_t now_ns) {
  ClassState& k = classes_[w.cls];
  SLUICE_DCHECK(k.head == &w, "a class's waiters leave in order of arrival");
  k.head = w.next;
  if (k.head == nullptr) k.tail = nullptr;
  w.next = nullptr;
  --k.queued;
  --queued_;
  const std::int64_t waited = std::max<std::int64_t>(0, now_ns - w.arrived_ns);
  k.wait_ns_total += waited;
  k.wait_ns_max = std::max(k.wait_ns_max, waited);
}

// The bucket holds up to the burst, or up to the largest cost at the head of
// a class while it waits: a request larger than the burst saves up for itself
// while another class is served next by priority, so that requests of a
// higher priority arriving more often than its cost takes to save cannot
// starve it (they spend from its savings instead, which delays it only by
// what they take).
long double PrioBucket::cap_locked() const {
  long double top = config_.burst;
  if (queued_ != 0) {
    for (unsigned i = 0; i < config_.classes.size(); ++i) {
      if (const Waiter* w = classes_[i].head) top = std::max(top, w->cost);
    }
  }
  return top - static_cast<long double>(leased_);
}

long double PrioBucket::head_deadline_locked() const {
  const long double need = head_->cost - tokens_;
  return need <= 0 ? last_ns_ : last_ns_ + need * kNsPerSecond / config_.rate;
}

void PrioBucket::accrue_locked(long double to_ns, long double cap) {
  if (to_ns <= last_ns_) return;  // a clock set back in time accrues nothing
  tokens_ = std::min(cap, tokens_ + (to_ns - last_ns_) * config_.rate / kNsPerSecond);
  last_ns_ = to_ns;
}

void PrioBucket::settle_locked(std::int64_t now_ns) {
  const auto now = static_cast<long double>(now_ns);
  Waiter* const old_head = head_;
  if (head_) {
    // Virtual time lags real time by at most one bucket: what is granted now
    // plus what is left stays within the head's cost plus the bucket's cap
    // (the burst, or a waiting larger request's cost: see cap_locked), however
    // late we got here. Past that, the accrual is forfeited, as a full bucket
    // forfeits it. No lease is out while anyone waits.
    const long double max_lag = cap_locked() * kNsPerSecond / config_.rate;
    const long double lag = now - head_deadline_locked();
    if (lag > max_lag) last_ns_ += lag - max_lag;
  }
  while (head_) {
    const long double due = head_deadline_locked();
    if (due > now) break;
    accrue_locked(due, cap_locked());  // granted as of `due`, however late we got here
    Waiter* w = head_;
    vtime_[static_cast<std::size_t>(config_.classes[w->cls].priority)] = w->start;
    pop_locked(*w, now_ns);
    take_locked(w->cls, w->cost, w->bytes, w->counts_request);
    w->granted = true;
    w->cv.notify_one();
    head_ = choose_locked();
  }
  if (head_ == nullptr) {
    accrue_locked(now, cap_locked());  // the leases as last seen count as spent now
    look_at_leases_locked();
  } else if (head_ != old_head) {
    head_->cv.notify_one();  // the new head now sleeps until its own deadline
  }
  check_invariants_locked();
}

// ---------------------------------------------------------------------------
// Leases.

void PrioBucket::lease_locked(Lease& l, std::uint64_t cost) {
  if (queued_ != 0 || mode_ == kLocked) return;  // none while anyone waits
  const std::uint64_t want = std::max(lease_size_, std::min(cost, kMaxBalance));
  if (tokens_ < static_cast<long double>(want)) return;  // scarce: grants go through the lock
  // The balance only falls meanwhile, so this keeps it within kMaxBalance.
  const std::uint64_t before = l.word.load(std::memory_order_relaxed) >> kOpsBits;
  const std::uint64_t amount = std::min(want, kMaxBalance - before);
  if (amount == 0) return;
  const std::uint64_t balance =
      l.word.fetch_add(amount << kOpsBits, std::memory_order_relaxed) >> kOpsBits;
  fold_paid_locked(l, balance);
  l.seen += amount;
  leased_ += amount;
  tokens_ -= static_cast<long double>(amount);
  const std::size_t bit = std::size_t{l.slot} * kPrioMaxClasses + l.cls;
  leased_mask_[bit / 64] |= std::uint64_t{1} << (bit % 64);
}

void PrioBucket::fold_paid_locked(Lease& l, std::uint64_t balance) {
  const std::uint64_t paid = l.seen - balance;  // balances only fall outside the lock
  if (config_.unit == PrioBucketConfig::kBytes) {
    classes_[l.cls].bytes += static_cast<std::int64_t>(paid);
  }
  leased_ -= paid;
  l.seen = balance;
}

void PrioBucket::look_at_leases_locked() {
  for (std::size_t half = 0; half < leased_mask_.size(); ++half) {
    for (std::uint64_t m = leased_mask_[half]; m != 0; m &= m - 1) {
      const std::size_t bit = half * 64 + static_cast<std::size_t>(std::countr_zero(m));
      Lease& l = slots_[bit / kPrioMaxClasses].leases[bit % kPrioMaxClasses];
      fold_paid_locked(l, l.word.load(std::memory_order_relaxed) >> kOpsBits);
      if (l.seen == 0) leased_mask_[half] &= ~(std::uint64_t{1} << (bit % 64));
    }
  }
}

void PrioBucket::reclaim_leases_locked() {
  for (std::size_t half = 0; half < leased_mask_.size(); ++half) {
    for (std::uint64_t m = leased_mask_[half]; m != 0; m &= m - 1) {
      const std::size_t bit = half * 64 + static_cast<std::size_t>(std::countr_zero(m));
      Lease& l = slots_[bit / kPrioMaxClasses].leases[bit % kPrioMaxClasses];
      // Takes the balance, leaves the grant count.
      const std::uint64_t balance =
          l.word.fetch_and(kOpsMask, std::memory_order_relaxed) >> kOpsBits;
      fold_paid_locked(l, balance);
      tokens_ += static_cast<long double>(balance);
      leased_ -= balance;
      l.seen = 0;
    }
    leased_mask_[half] = 0;
  }
}

void PrioBucket::fold_ops_locked(Lease& l) {
  std::uint64_t w = l.word.load(std::memory_order_relaxed);
  while (!l.word.compare_exchange_weak(w, w & ~kOpsMask, std::memory_order_relaxed)) {
  }
  classes_[l.cls].requests += w & kOpsMask;
}

void PrioBucket::check_invariants_locked() const {
#ifndef NDEBUG
  std::uint64_t seen = 0;
  for (std::size_t bit = 0; bit < kSlots * kPrioMaxClasses; ++bit) {
    const Lease& l = slots_[bit / kPrioMaxClasses].leases[bit % kPrioMaxClasses];
    if (leased_mask_[bit / 64] >> (bit % 64) & 1) {
      seen += l.seen;
    } else {
      SLUICE_DCHECK(l.seen == 0, "a lease outside leased_mask_ holds nothing");
    }
  }
  SLUICE_DCHECK(leased_ == seen, "leased_ is the sum of what the leases were last seen to hold");
  SLUICE_DCHECK(queued_ == 0 || leased_ == 0, "no lease is out while a request waits");
  std::uint64_t queued = 0;
  for (unsigned i = 0; i < kPrioMaxClasses; ++i) {
    std::uint64_t n = 0;
    const Waiter* last = nullptr;
    for (const Waiter* w = classes_[i].head; w != nullptr; w = w->next) {
      SLUICE_DCHECK(w->cls == i, "a waiter is queued in its own class");
      SLUICE_DCHECK(last == nullptr || last->start <= w->start,
                    "a class's start tags grow in order of arrival");
      last = w;
      ++n;
    }
    SLUICE_DCHECK(n == classes_[i].queued && last == classes_[i].tail,
                  "a class's queue, tail and count agree");
    queued += n;
  }
  SLUICE_DCHECK(queued == queued_, "queued_ counts every class's waiters");
  SLUICE_DCHECK(head_ == choose_locked(), "the head is the waiter served next");
  if (configured_) {
    const long double cap = cap_locked();
    SLUICE_DCHECK(tokens_ <= cap + 1e-9L * std::max(1.0L, cap),
                  "the bucket holds no more than its cap (burst minus the leases)");
  }
#endif
}

// ---------------------------------------------------------------------------
// Reports and shutdown.

nlohmann::json PrioBucket::collect() const {
  MutexLock lock(mu_);
  long double tokens = tokens_;
  const auto now = static_cast<long double>(clock_->now_ns());
  if (configured_ && now > last_ns_) {
    tokens = std::min(cap_locked(), tokens + (now - last_ns_) * config_.rate / kNsPerSecond);
  }
  std::array<std::uint64_t, kPrioMaxClasses> requests{};
  std::array<std::int64_t, kPrioMaxClasses> bytes{};
  for (unsigned c = 0; c < kPrioMaxClasses; ++c) {
    requests[c] = classes_[c].requests;
    bytes[c] = classes_[c].bytes;
  }
  // Plus what was paid from the leases since the lock last looked.
  for (std::size_t bit = 0; bit < kSlots * kPrioMaxClasses; ++bit) {
    const Lease& l = slots_[bit / kPrioMaxClasses].leases[bit % kPrioMaxClasses];
    const std::uint64_t w = l.word.load(std::memory_order_relaxed);
    requests[l.cls] += w & kOpsMask;
    bytes[l.cls] += static_cast<std::int64_t>(l.bytes.load(std::memory_order_relaxed));
    if (leased_mask_[bit / 64] >> (bit % 64) & 1) {
      const std::uint64_t balance = w >> kOpsBits;
      if (config_.unit == PrioBucketConfig::kBytes) {
        bytes[l.cls] += static_cast<std::int64_t>(l.seen - balance);
      }
      tokens += static_cast<long double>(balance);
    }
  }
  nlohmann::json classes = nlohmann::json::array();
  for (unsigned c = 0; c < config_.classes.size(); ++c) {
    const ClassState& k = classes_[c];
    classes.push_back({{"name", config_.classes[c].name},
                       {"priority", config_.classes[c].priority},
                       {"weight", config_.classes[c].weight},
                       {"requests", requests[c]},
                       {"bytes", std::max<std::int64_t>(0, bytes[c])},
                       {"waits", k.waits},
                       {"wait_us_total", k.wait_ns_total / 1000},
                       {"wait_us_max", k.wait_ns_max / 1000},
                       {"queued", k.queued}});
  }
  return {
      {"rate", config_.rate},   {"unit", config_.unit == PrioBucketConfig::kOps ? "ops" : "bytes"},
      {"burst", config_.burst}, {"tokens", static_cast<double>(tokens)},
      {"queued", queued_},      {"classes", std::move(classes)}};
}

void PrioBucket::shutdown() noexcept {
  MutexLock lock(mu_);
  reclaim_leases_locked();
  shut_down_ = true;
  update_mode_locked();
  const std::int64_t now = clock_->now_ns();
  for (unsigned c = 0; c < kPrioMaxClasses; ++c) {
    while (Waiter* w = classes_[c].head) {
      pop_locked(*w, now);
      w->cancelled = true;
      w->cv.notify_one();
    }
  }
  head_ = nullptr;
}

std::unique_ptr<EnforcementObject> make_prio_bucket(const ObjectEnv& env) {
  return std::make_unique<PrioBucket>(env.clock);
}

}  // namespace sluice
