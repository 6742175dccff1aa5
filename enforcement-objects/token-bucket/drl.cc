#include "sluice/objects/drl.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "lease_slot.h"
#include "sluice/config_reader.h"
#include "sluice/dcheck.h"
#include "sluice/wire.h"

namespace sluice {
namespace {

// The longest stretch a head waits without a timer before its deadline.
constexpr std::int64_t kMaxSpinNs = 200'000;

static_assert(Drl::kSlots == detail::kLeaseSlots, "a bucket has a slot per lease slot");
using detail::kNever;
using detail::kNsPerSecond;
using detail::lease_slot;

bool positive(double v) {
  return std::isfinite(v) && v > 0;
}

using config::positive_number;

// The floors (docs/rules.md): a rate below one token per second, or a
// bucket smaller than one token, makes waits that never end in practice
// (5e-324 bytes/s puts a 4 KiB request's deadline past the end of time) and
// has no use: both are refused, with the same words from configure() and
// from a board's set_tunables().
constexpr double kMinRate = 1;
constexpr double kMinBurst = 1;

Status check_rate(double v, const std::string& got) {
  if (!positive(v)) return Status::invalid("rate: must be a positive number, got " + got);
  if (v < kMinRate) {
    return Status::invalid("rate: must be at least 1 token (byte or request) per second, got " +
                           got);
  }
  return {};
}

Status check_burst(double v, const std::string& got) {
  if (!positive(v)) return Status::invalid("burst: must be a positive number, got " + got);
  if (v < kMinBurst) {
    return Status::invalid("burst: must be at least 1 token (byte or request), got " + got);
  }
  return {};
}

// The burst a configuration without one gets: one refill period's worth of
// the rate, and at least one token.
double default_burst(const DrlConfig& c) {
  return std::max(kMinBurst, c.rate * static_cast<double>(c.refill_period_us) / 1e6);
}

constexpr std::string_view kDrlTunables[] = {"rate", "burst"};

Status parse_into(const nlohmann::json& config, DrlConfig& c) {
  if (!config.is_object()) return Status::invalid("config: must be an object");
  for (const auto& [key, value] : config.items()) {
    if (key != "rate" && key != "unit" && key != "burst" && key != "refill_period_us") {
      return Status::invalid("unknown field '" + key + "'");
    }
  }
  if (auto it = config.find("rate"); it != config.end()) {
    if (!positive_number(*it)) {
      return Status::invalid("rate: must be a positive number, got " + wire::echo(*it));
    }
    SLUICE_RETURN_IF_ERROR(check_rate(it->get<double>(), wire::echo(*it)));
    c.rate = it->get<double>();
  }
  if (auto it = config.find("unit"); it != config.end()) {
    if (*it == "bytes") {
      c.unit = DrlConfig::kBytes;
    } else if (*it == "ops") {
      c.unit = DrlConfig::kOps;
    } else {
      return Status::invalid("unit: must be \"bytes\" or \"ops\", got " + wire::echo(*it));
    }
  }
  if (auto it = config.find("burst"); it != config.end()) {
    if (!positive_number(*it)) {
      return Status::invalid("burst: must be a positive number, got " + wire::echo(*it));
    }
    SLUICE_RETURN_IF_ERROR(check_burst(it->get<double>(), wire::echo(*it)));
    c.burst = it->get<double>();
    c.burst_set = true;
  }
  if (auto it = config.find("refill_period_us"); it != config.end()) {
    const bool fits =
        it->is_number_integer() &&
        (!it->is_number_unsigned() ||
         it->get<std::uint64_t>() <= std::uint64_t{std::numeric_limits<std::int64_t>::max()});
    if (!fits || it->get<std::int64_t>() < 1) {
      return Status::invalid("refill_period_us: must be an integer >= 1, got " + wire::echo(*it));
    }
    c.refill_period_us = it->get<std::int64_t>();
  }
  return {};
}

}  // namespace

StatusOr<DrlConfig> parse_drl_config(const nlohmann::json& config, const DrlConfig* base) {
  DrlConfig c = base ? *base : DrlConfig{};
  try {
    SLUICE_RETURN_IF_ERROR(parse_into(config, c));
  } catch (const std::exception& e) {  // nlohmann's type errors, should any slip through
    return Status::invalid(std::string("config: ") + e.what());
  }
  if (!base && !config.contains("rate")) return Status::invalid("rate: required");
  if (!c.burst_set) c.burst = default_burst(c);
  return c;
}

Drl::Drl(Clock* clock) : clock_(clock ? clock : &system_clock()) {}

Status Drl::validate(const nlohmann::json& config) const {
  MutexLock lock(mu_);
  return parse_drl_config(config, configured_ ? &config_ : nullptr).status();
}

Status Drl::configure(const nlohmann::json& config) {
  MutexLock lock(mu_);
  StatusOr<DrlConfig> parsed = parse_drl_config(config, configured_ ? &config_ : nullptr);
  if (!parsed) return parsed.status();
  apply_locked(*parsed);
  return {};
}

std::span<const std::string_view> Drl::tunables() const noexcept {
  return kDrlTunables;
}

Status Drl::set_tunables(std::uint64_t mask,
                         std::span<const double, kMaxTunables> values) noexcept {
  if (mask >> std::size(kDrlTunables))
    return Status::invalid("drl has tunables rate and burst only");
  MutexLock lock(mu_);
  if (!configured_) return Status::precondition("drl: not configured yet");
  DrlConfig c = config_;
  if (mask & 1) {
    SLUICE_RETURN_IF_ERROR(check_rate(values[0], config::exact_number(values[0])));
    c.rate = values[0];
  }
  if (mask & 2) {
    SLUICE_RETURN_IF_ERROR(check_burst(values[1], config::exact_number(values[1])));
    c.burst = values[1];
    c.burst_set = true;
  }
  if (!c.burst_set) c.burst = default_burst(c);
  apply_locked(c);
  return {};
}

void Drl::set_grant_observer(GrantObserver observer) {
  MutexLock lock(mu_);
  observer_ = std::move(observer);
  reclaim_leases_locked();
  update_mode_locked();
}

void Drl::apply_locked(const DrlConfig& c) {
  const std::int64_t now = clock_->now_ns();
  if (!configured_) {
    config_ = c;
    tokens_ = config_.burst;
    last_ns_ = static_cast<long double>(now);
    configured_ = true;
    update_mode_locked();
    return;
  }
  settle_locked(now);  // grants already due, at the old rate
  reclaim_leases_locked();
  accrue_locked(now, cap_locked());  // what the head has accrued so far, at the old rate
  config_ = c;
  tokens_ = std::min(tokens_, cap_locked());
  update_mode_locked();
  if (head_) {  // re-time its deadline under the new rate
    head_->brief_from = kNever;
    head_->cv.notify_one();
  }
  check_invariants_locked();
}

void Drl::update_mode_locked() {
  const Mode mode = !configured_ || shut_down_ || observer_ ? kLocked
                    : config_.unit == DrlConfig::kOps       ? kOps
                                                            : kBytes;
  mode_ = mode;
  for (Slot& slot : slots_) slot.mode.store(mode, std::memory_order_relaxed);
  const long double share = std::floor(static_cast<long double>(config_.burst) / (2 * kSlots));
  lease_size_ = share >= static_cast<long double>(kMaxBalance)
                    ? kMaxBalance
                    : std::max<std::uint64_t>(1, static_cast<std::uint64_t>(share));
}

[[gnu::always_inline]] inline bool Drl::pay_from_lease(Slot& slot, std::uint64_t cost) noexcept {
  // A balance of at least the cost, and of at least 1 (every lease is taken
  // back while a request waits, so even a request that costs nothing then
  // queues behind it), and room in the grant count. A balance below 2^44
  // fails the test for any cost that would overflow the shift.
  const std::uint64_t need = std::max<std::uint64_t>(cost, 1);
  std::atomic<std::uint64_t>& word = slot.word;
  std::uint64_t w = word.load(std::memory_order_relaxed);
  while ((w >> kOpsBits) >= need && (w & kOpsMask) != kOpsMask) {
    if (word.compare_exchange_weak(w, w - (cost << kOpsBits) + 1, std::memory_order_relaxed)) {
      return true;
    }
  }
  return false;
}

[[gnu::always_inline]] inline bool Drl::grant_from_lease(Slot& slot, std::uint64_t size) noexcept {
  const std::uint32_t mode = slot.mode.load(std::memory_order_relaxed);
  return mode != kLocked && pay_from_lease(slot, mode == kOps ? 1 : size);
}

Verdict Drl::enforce_context(const Context& ctx) noexcept {
  if (grant_from_lease(slots_[lease_slot()], ctx.size)) [[likely]]
    return {};
  return enforce_slow(ctx);
}

bool Drl::fast_grant_of(void* slot, std::uint64_t size) noexcept {
  return grant_from_lease(*static_cast<Slot*>(slot), size);
}

FastGrant Drl::fast_grant() noexcept {
  return {&Drl::fast_grant_of, &slots_[lease_slot()]};
}

Verdict Drl::enforce_slow(const Context& ctx) noexcept {
  MutexLock lock(mu_);
  if (!configured_ || shut_down_) return {};
  return admit_locked(lock, cost_of_locked(ctx));
}

Verdict Drl::try_enforce_context(const Context& ctx) noexcept {
  if (grant_from_lease(slots_[lease_slot()], ctx.size)) return {};
  MutexLock lock(mu_);
  if (!configured_ || shut_down_) return {};
  const std::uint64_t cost = cost_of_locked(ctx);
  const std::int64_t now = clock_->now_ns();
  settle_locked(now);
  if (head_ != nullptr) return {Outcome::kWouldWait, 0};
  if (tokens_ < static_cast<long double>(cost)) reclaim_leases_locked();  // all there is, then
  if (tokens_ < static_cast<long double>(cost)) return {Outcome::kWouldWait, 0};
  take_locked(static_cast<long double>(cost), now);
  return {};
}

Verdict Drl::settle(const Context& ctx, std::uint64_t actual) noexcept {
  MutexLock lock(mu_);
  // In ops a request costs 1 whatever it moved.
  if (!configured_ || shut_down_ || config_.unit == DrlConfig::kOps || actual == ctx.size)
    return {};
  const std::int64_t now = clock_->now_ns();
  if (actual < ctx.size) {
    // Give back what the request did not move, up to a full bucket (a
    // waiting head's cost included, the leases out excluded): a refund is
    // never a burst larger than the bucket allows. It may pay the head now.
    settle_locked(now);
    const long double before = tokens_;
    tokens_ = std::min(cap_locked(), tokens_ + static_cast<long double>(ctx.size - actual));
    refunded_tokens_ += std::max(0.0L, tokens_ - before);
    settle_locked(now);
    if (head_) {  // re-time its deadline: it came closer
      head_->brief_from = kNever;
      head_->cv.notify_one();
    }
    return {};
  }
  const std::uint64_t excess = actual - ctx.size;
  if ((ctx.flags & context_flag::kNoWait) == 0) return admit_locked(lock, excess);
  // Must not wait: taken now, on credit. The bucket goes below zero and
  // later requests wait until it is paid back (no lease is drawn meanwhile).
  settle_locked(now);
  tokens_ -= static_cast<long double>(excess);
  granted_tokens_ += static_cast<long double>(excess);
  return {};
}

std::uint64_t Drl::cost_of_locked(const Context& ctx) const {
  return config_.unit == DrlConfig::kOps ? 1 : ctx.size;
}

Verdict Drl::admit_locked(MutexLock& lock, std::uint64_t whole_cost) {
  const auto cost = static_cast<long double>(whole_cost);
  const std::int64_t start = clock_->now_ns();
  settle_locked(start);
  if (head_ == nullptr) {
    if (tokens_ < cost) reclaim_leases_locked();  // strand no token before waiting
    if (tokens_ >= cost) {
      take_locked(cost, start);
      if (mode_ != kLocked) {
        Slot& mine = slots_[lease_slot()];
        if ((mine.word.load(std::memory_order_relaxed) & kOpsMask) == kOpsMask)
          fold_ops_locked(mine);
        lease_locked(mine, whole_cost);
      }
      check_invariants_locked();
      return {};
    }
  }
  // Waits: there are no leases now (taken back above, or when the head queued).
  Waiter self{cost};
  push_locked(&self);
  while (!self.granted && !self.cancelled) {
    if (head_ == &self) {
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

nlohmann::json Drl::collect() const {
  MutexLock lock(mu_);
  long double tokens = tokens_;
  const auto now = static_cast<long double>(clock_->now_ns());
  if (configured_ && now > last_ns_) {
    tokens = std::min(cap_locked(), tokens + (now - last_ns_) * config_.rate / kNsPerSecond);
  }
  // Plus the leases, and what was paid from them.
  std::uint64_t granted_ops = granted_ops_;
  long double granted_tokens = granted_tokens_;
  for (unsigned i = 0; i < kSlots; ++i) {
    const Slot& s = slots_[i];
    const std::uint64_t w = s.word.load(std::memory_order_relaxed);
    granted_ops += w & kOpsMask;
    if (leased_slots_ & (1u << i)) {
      const std::uint64_t balance = w >> kOpsBits;
      granted_tokens += static_cast<long double>(s.seen - balance);
      tokens += static_cast<long double>(balance);
    }
  }
  return {{"rate", config_.rate},
          {"unit", config_.unit == DrlConfig::kOps ? "ops" : "bytes"},
          {"burst", config_.burst},
          {"refill_period_us", config_.refill_period_us},
          {"tokens", static_cast<double>(tokens)},
          {"waiters", waiting_},
          {"granted_ops", granted_ops},
          {"granted_tokens", static_cast<double>(granted_tokens)},
          {"refunded_tokens", static_cast<double>(refunded_tokens_)},
          {"overflow_tokens", static_cast<double>(overflow_tokens_)},
          {"late_forfeited_tokens", static_cast<double>(late_forfeited_tokens_)},
          {"wake_late_ns", late_ns_}};
}

void Drl::shutdown() noexcept {
  MutexLock lock(mu_);
  reclaim_leases_locked();
  shut_down_ = true;
  update_mode_locked();
  while (Waiter* w = pop_locked()) {
    w->cancelled = true;
    w->cv.notify_one();
  }
}

void Drl::wait_as_head_locked(MutexLock& lock, Waiter& self) {
  const long double due = std::ceil(head_deadline_locked());
  const std::int64_t deadline =
      due < static_cast<long double>(kNever) ? static_cast<std::int64_t>(due) : kNever;
  const std::int64_t now = clock_->now_ns();
  if (now >= deadline) return;   // the caller's settle() grants it
  if (now >= self.brief_from) {  // its timer fired: the rest of the way without one
    clock_->wait_briefly(lock.native(), self.cv, deadline);
    return;
  }
  // A timed wait wakes up late, by about late_ns_. The lag cap absorbs
  // lateness up to one bucket (settle() grants as of the deadline); only the
  // rest costs rate. So sleep on a timer until that rest before the deadline
  // and wait the last stretch briefly, without a timer.
  const long double bucket_ns = config_.burst * kNsPerSecond / config_.rate;
  const auto spin_ns =
      static_cast<std::int64_t>(std::max(0.0L, static_cast<long double>(late_ns_) - bucket_ns));
  const std::int64_t target = deadline - spin_ns;
  self.brief_from = target;
  if (now >= target) {
    clock_->wait_briefly(lock.native(), self.cv, deadline);
    return;
  }
  clock_->wait_until(lock.native(), self.cv, target);
  if (self.granted || self.cancelled) return;
  const std::int64_t woke = clock_->now_ns();
  if (woke >= target) {
    // Woken by the timer (or about then): track a high quantile of how late,
    // up fast and down slowly. A sample is clipped at kMaxSpinNs: a thread
    // that lost its CPU for milliseconds says nothing about timers, and
    // waiting without one would not have helped it.
    const std::int64_t late = std::min<std::int64_t>(woke - target, kMaxSpinNs);
    late_ns_ += late > late_ns_ ? (late - late_ns_ + 3) / 4 : -((late_ns_ - late) / 64);
  }
}

long double Drl::cap_locked() const {
  const long double burst = config_.burst;
  return (head_ ? std::max(burst, head_->cost) : burst) - static_cast<long double>(leased_);
}

void Drl::look_at_leases_locked() {
  for (std::uint32_t m = leased_slots_; m != 0; m &= m - 1) {
    const auto i = static_cast<unsigned>(std::countr_zero(m));
    Slot& s = slots_[i];
    const std::uint64_t balance = s.word.load(std::memory_order_relaxed) >> kOpsBits;
    const std::uint64_t paid = s.seen - balance;  // balances only fall outside the lock
    granted_tokens_ += static_cast<long double>(paid);
    leased_ -= paid;
    s.seen = balance;
    if (balance == 0) leased_slots_ &= ~(1u << i);
  }
}

void Drl::reclaim_leases_locked() {
  for (std::uint32_t m = leased_slots_; m != 0; m &= m - 1) {
    Slot& s = slots_[std::countr_zero(m)];
    // Takes the balance, leaves the grant count.
    const std::uint64_t balance = s.word.fetch_and(kOpsMask, std::memory_order_relaxed) >> kOpsBits;
    granted_tokens_ += static_cast<long double>(s.seen - balance);
    tokens_ += static_cast<long double>(balance);
    leased_ -= s.seen;
    s.seen = 0;
  }
  leased_slots_ = 0;
}

void Drl::lease_locked(Slot& s, std::uint64_t cost) {
  const std::uint64_t want = std::max(lease_size_, std::min(cost, kMaxBalance));
  if (tokens_ < static_cast<long double>(want)) return;  // scarce: grants go through the lock
  // The balance only falls meanwhile, so this keeps it within kMaxBalance.
  const std::uint64_t before = s.word.load(std::memory_order_relaxed) >> kOpsBits;
  const std::uint64_t amount = std::min(want, kMaxBalance - before);
  if (amount == 0) return;
  const std::uint64_t balance =
      s.word.fetch_add(amount << kOpsBits, std::memory_order_relaxed) >> kOpsBits;
  const std::uint64_t paid = s.seen - balance;
  granted_tokens_ += static_cast<long double>(paid);
  leased_ = leased_ - paid + amount;
  s.seen = balance + amount;
  tokens_ -= static_cast<long double>(amount);
  leased_slots_ |= 1u << static_cast<unsigned>(&s - slots_.data());
}

void Drl::fold_ops_locked(Slot& s) {
  std::uint64_t w = s.word.load(std::memory_order_relaxed);
  while (!s.word.compare_exchange_weak(w, w & ~kOpsMask, std::memory_order_relaxed)) {
  }
  granted_ops_ += w & kOpsMask;
}

long double Drl::head_deadline_locked() const {
  const long double need = head_->cost - tokens_;
  return need <= 0 ? last_ns_ : last_ns_ + need * kNsPerSecond / config_.rate;
}

void Drl::accrue_locked(long double to_ns, long double cap) {
  if (to_ns <= last_ns_) return;  // a clock set back in time accrues nothing
  const long double full = tokens_ + (to_ns - last_ns_) * config_.rate / kNsPerSecond;
  if (full > cap) overflow_tokens_ += full - cap;
  tokens_ = std::min(cap, full);
  last_ns_ = to_ns;
}

void Drl::settle_locked(std::int64_t now_ns) {
  const auto now = static_cast<long double>(now_ns);
  Waiter* const old_head = head_;
  if (head_) {
    // Virtual time lags real time by at most one bucket: everything granted
    // now plus what is left in the bucket stays within the head's cost plus
    // `burst`, however late we got here. Past that, the accrual is forfeited,
    // as a full bucket forfeits it.
    const long double max_lag = config_.burst * kNsPerSecond / config_.rate;
    const long double lag = now - head_deadline_locked();
    if (lag > max_lag) {
      late_forfeited_tokens_ += (lag - max_lag) * config_.rate / kNsPerSecond;
      last_ns_ += lag - max_lag;
    }
  }
  while (head_) {
    const long double due = head_deadline_locked();
    if (due > now) break;
    accrue_locked(due, cap_locked());  // granted as of `due`, however late we got here
    Waiter* w = pop_locked();
    take_locked(w->cost, now_ns);
    w->granted = true;
    w->cv.notify_one();
  }
  if (head_ == nullptr) {
    accrue_locked(now, cap_locked());  // the leases as last seen count as spent now
    look_at_leases_locked();
  } else if (head_ != old_head) {
    head_->cv.notify_one();  // the new head now sleeps until its own deadline
  }
  check_invariants_locked();
}

void Drl::check_invariants_locked() const {
#ifndef NDEBUG
  std::uint64_t seen = 0;
  for (unsigned i = 0; i < kSlots; ++i) {
    if (leased_slots_ & (1u << i)) {
      seen += slots_[i].seen;
    } else {
      SLUICE_DCHECK(slots_[i].seen == 0, "a slot outside leased_slots_ holds no lease");
    }
  }
  SLUICE_DCHECK(leased_ == seen, "leased_ is the sum of what the slots were last seen to hold");
  SLUICE_DCHECK(head_ == nullptr || leased_ == 0, "no lease is out while a request waits");
  std::uint64_t queued = 0;
  const Waiter* last = nullptr;
  for (const Waiter* w = head_; w != nullptr; w = w->next) {
    ++queued;
    last = w;
  }
  SLUICE_DCHECK(queued == waiting_ && last == tail_, "the queue's links, tail and count agree");
  if (configured_) {
    const long double cap = cap_locked();
    SLUICE_DCHECK(tokens_ <= cap + 1e-9L * std::max(1.0L, cap),
                  "the bucket holds no more than its cap (burst minus the leases)");
  }
#endif
}

void Drl::take_locked(long double cost, std::int64_t now_ns) {
  tokens_ = std::max(0.0L, tokens_ - cost);  // > -cost * epsilon after a grant
  granted_tokens_ += cost;
  ++granted_ops_;
  if (observer_) observer_(now_ns, static_cast<double>(cost));
}

void Drl::push_locked(Waiter* w) {
  (tail_ ? tail_->next : head_) = w;
  tail_ = w;
  ++waiting_;
}

Drl::Waiter* Drl::pop_locked() {
  Waiter* w = head_;
  if (w == nullptr) return nullptr;
  head_ = w->next;
  if (head_ == nullptr) tail_ = nullptr;
  w->next = nullptr;
  --waiting_;
  return w;
}

std::unique_ptr<EnforcementObject> make_drl(const ObjectEnv& env) {
  return std::make_unique<Drl>(env.clock);
}

}  // namespace sluice
