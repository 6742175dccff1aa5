#include "sluice/objects/drl.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

namespace sluice {
namespace {

constexpr long double kNsPerSecond = 1e9L;
// The longest stretch a head waits without a timer before its deadline.
constexpr std::int64_t kMaxSpinNs = 200'000;
constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

std::string shown(const nlohmann::json& v) {
  return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string shown(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

bool positive(double v) {
  return std::isfinite(v) && v > 0;
}

bool positive_number(const nlohmann::json& v) {
  return v.is_number() && positive(v.get<double>());
}

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

constexpr std::string_view kTunables[] = {"rate", "burst"};

Status parse_into(const nlohmann::json& config, DrlConfig& c) {
  if (!config.is_object()) return Status::invalid("config: must be an object");
  for (const auto& [key, value] : config.items()) {
    if (key != "rate" && key != "unit" && key != "burst" && key != "refill_period_us") {
      return Status::invalid("unknown field '" + key + "'");
    }
  }
  if (auto it = config.find("rate"); it != config.end()) {
    if (!positive_number(*it)) {
      return Status::invalid("rate: must be a positive number, got " + shown(*it));
    }
    SLUICE_RETURN_IF_ERROR(check_rate(it->get<double>(), shown(*it)));
    c.rate = it->get<double>();
  }
  if (auto it = config.find("unit"); it != config.end()) {
    if (*it == "bytes") {
      c.unit = DrlConfig::kBytes;
    } else if (*it == "ops") {
      c.unit = DrlConfig::kOps;
    } else {
      return Status::invalid("unit: must be \"bytes\" or \"ops\", got " + shown(*it));
    }
  }
  if (auto it = config.find("burst"); it != config.end()) {
    if (!positive_number(*it)) {
      return Status::invalid("burst: must be a positive number, got " + shown(*it));
    }
    SLUICE_RETURN_IF_ERROR(check_burst(it->get<double>(), shown(*it)));
    c.burst = it->get<double>();
    c.burst_set = true;
  }
  if (auto it = config.find("refill_period_us"); it != config.end()) {
    const bool fits =
        it->is_number_integer() &&
        (!it->is_number_unsigned() ||
         it->get<std::uint64_t>() <= std::uint64_t{std::numeric_limits<std::int64_t>::max()});
    if (!fits || it->get<std::int64_t>() < 1) {
      return Status::invalid("refill_period_us: must be an integer >= 1, got " + shown(*it));
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
  std::lock_guard<std::mutex> lock(mu_);
  return parse_drl_config(config, configured_ ? &config_ : nullptr).status();
}

Status Drl::configure(const nlohmann::json& config) {
  std::lock_guard<std::mutex> lock(mu_);
  StatusOr<DrlConfig> parsed = parse_drl_config(config, configured_ ? &config_ : nullptr);
  if (!parsed) return parsed.status();
  apply(*parsed);
  return {};
}

std::span<const std::string_view> Drl::tunables() const noexcept {
  return kTunables;
}

Status Drl::set_tunables(std::uint64_t mask,
                         std::span<const double, kMaxTunables> values) noexcept {
  if (mask >> std::size(kTunables)) return Status::invalid("drl has tunables rate and burst only");
  std::lock_guard<std::mutex> lock(mu_);
  if (!configured_) return Status::precondition("drl: not configured yet");
  DrlConfig c = config_;
  if (mask & 1) {
    SLUICE_RETURN_IF_ERROR(check_rate(values[0], shown(values[0])));
    c.rate = values[0];
  }
  if (mask & 2) {
    SLUICE_RETURN_IF_ERROR(check_burst(values[1], shown(values[1])));
    c.burst = values[1];
    c.burst_set = true;
  }
  if (!c.burst_set) c.burst = default_burst(c);
  apply(c);
  return {};
}

void Drl::apply(const DrlConfig& c) {
  const std::int64_t now = clock_->now_ns();
  if (!configured_) {
    config_ = c;
    tokens_ = config_.burst;
    last_ns_ = static_cast<long double>(now);
    configured_ = true;
    return;
  }
  settle(now);         // grants already due, at the old rate
  accrue(now, cap());  // what the head has accrued so far, at the old rate
  config_ = c;
  tokens_ = std::min(tokens_, cap());
  if (head_) {  // re-time its deadline under the new rate
    head_->brief_from = kNever;
    head_->cv.notify_one();
  }
}

Result Drl::enforce(const Context& ctx, const Request& /*request*/) noexcept {
  const Verdict v = enforce_context(ctx);
  return {v.outcome, v.wait_ns, nullptr};
}

Verdict Drl::enforce_context(const Context& ctx) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  if (!configured_ || shut_down_) return {};
  const long double cost =
      config_.unit == DrlConfig::kOps ? 1.0L : static_cast<long double>(ctx.size);
  const std::int64_t start = clock_->now_ns();
  settle(start);
  if (head_ == nullptr && tokens_ >= cost) {
    take(cost, start);
    return {};
  }
  Waiter self{cost};
  push(&self);
  while (!self.granted && !self.cancelled) {
    if (head_ == &self) {
      wait_as_head(lock, self);
    } else {
      clock_->wait(lock, self.cv);
    }
    if (self.granted || self.cancelled) break;
    settle(clock_->now_ns());
  }
  return {self.granted ? Outcome::kOk : Outcome::kCancelled,
          static_cast<std::uint64_t>(std::max<std::int64_t>(0, clock_->now_ns() - start))};
}

nlohmann::json Drl::collect() const {
  std::lock_guard<std::mutex> lock(mu_);
  long double tokens = tokens_;
  const auto now = static_cast<long double>(clock_->now_ns());
  if (configured_ && now > last_ns_) {
    tokens = std::min(cap(), tokens + (now - last_ns_) * config_.rate / kNsPerSecond);
  }
  return {{"rate", config_.rate},
          {"unit", config_.unit == DrlConfig::kOps ? "ops" : "bytes"},
          {"burst", config_.burst},
          {"refill_period_us", config_.refill_period_us},
          {"tokens", static_cast<double>(tokens)},
          {"waiters", waiting_},
          {"granted_ops", granted_ops_},
          {"granted_tokens", static_cast<double>(granted_tokens_)},
          {"overflow_tokens", static_cast<double>(overflow_tokens_)},
          {"late_forfeited_tokens", static_cast<double>(late_forfeited_tokens_)},
          {"wake_late_ns", late_ns_}};
}

void Drl::shutdown() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  shut_down_ = true;
  while (Waiter* w = pop()) {
    w->cancelled = true;
    w->cv.notify_one();
  }
}

void Drl::wait_as_head(std::unique_lock<std::mutex>& lock, Waiter& self) {
  const long double due = std::ceil(head_deadline());
  const std::int64_t deadline =
      due < static_cast<long double>(kNever) ? static_cast<std::int64_t>(due) : kNever;
  const std::int64_t now = clock_->now_ns();
  if (now >= deadline) return;   // the caller's settle() grants it
  if (now >= self.brief_from) {  // its timer fired: the rest of the way without one
    clock_->wait_briefly(lock, self.cv, deadline);
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
    clock_->wait_briefly(lock, self.cv, deadline);
    return;
  }
  clock_->wait_until(lock, self.cv, target);
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

long double Drl::cap() const {
  const long double burst = config_.burst;
  return head_ ? std::max(burst, head_->cost) : burst;
}

long double Drl::head_deadline() const {
  const long double need = head_->cost - tokens_;
  return need <= 0 ? last_ns_ : last_ns_ + need * kNsPerSecond / config_.rate;
}

void Drl::accrue(long double to_ns, long double cap) {
  if (to_ns <= last_ns_) return;  // a clock set back in time accrues nothing
  const long double full = tokens_ + (to_ns - last_ns_) * config_.rate / kNsPerSecond;
  if (full > cap) overflow_tokens_ += full - cap;
  tokens_ = std::min(cap, full);
  last_ns_ = to_ns;
}

void Drl::settle(std::int64_t now_ns) {
  const auto now = static_cast<long double>(now_ns);
  Waiter* const old_head = head_;
  if (head_) {
    // Virtual time lags real time by at most one bucket: everything granted
    // now plus what is left in the bucket stays within the head's cost plus
    // `burst`, however late we got here. Past that, the accrual is forfeited,
    // as a full bucket forfeits it.
    const long double max_lag = config_.burst * kNsPerSecond / config_.rate;
    const long double lag = now - head_deadline();
    if (lag > max_lag) {
      late_forfeited_tokens_ += (lag - max_lag) * config_.rate / kNsPerSecond;
      last_ns_ += lag - max_lag;
    }
  }
  while (head_) {
    const long double due = head_deadline();
    if (due > now) break;
    accrue(due, cap());  // granted as of `due`, however late we got here
    Waiter* w = pop();
    take(w->cost, now_ns);
    w->granted = true;
    w->cv.notify_one();
  }
  if (head_ == nullptr) {
    accrue(now, config_.burst);
  } else if (head_ != old_head) {
    head_->cv.notify_one();  // the new head now sleeps until its own deadline
  }
}

void Drl::take(long double cost, std::int64_t now_ns) {
  tokens_ = std::max(0.0L, tokens_ - cost);  // > -cost * epsilon after a grant
  granted_tokens_ += cost;
  ++granted_ops_;
  if (observer_) observer_(now_ns, static_cast<double>(cost));
}

void Drl::push(Waiter* w) {
  (tail_ ? tail_->next : head_) = w;
  tail_ = w;
  ++waiting_;
}

Drl::Waiter* Drl::pop() {
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
