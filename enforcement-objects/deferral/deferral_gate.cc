// The deferral-gate object (sluice/objects/deferral_gate.h): partitions,
// decisions and their expiry, the transitions' log and collect.
#include "sluice/objects/deferral_gate.h"

#include <cmath>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "sluice/dcheck.h"

namespace sluice {
namespace {

constexpr std::string_view kGateTunables[] = {"hold_ms", "growth_cap_bytes"};
static_assert(std::size(kGateTunables) <= kMaxTunables);

constexpr std::int64_t kNoDeadline = std::numeric_limits<std::int64_t>::max();

bool deferred(DeferralState s) noexcept {
  return s == DeferralState::kFirstStage || s == DeferralState::kSecondStage;
}

double to_ms(std::int64_t ns) noexcept {
  return static_cast<double>(ns) / 1e6;
}

}  // namespace

std::string_view deferral_state_name(DeferralState s) noexcept {
  switch (s) {
    case DeferralState::kNormal:
      return "normal";
    case DeferralState::kFirstStage:
      return "first-stage";
    case DeferralState::kSecondStage:
      return "second-stage";
    case DeferralState::kRecovering:
      return "recovering";
  }
  return "normal";
}

std::optional<DeferralState> deferral_state_from_name(std::string_view name) noexcept {
  for (auto s : {DeferralState::kNormal, DeferralState::kFirstStage, DeferralState::kSecondStage,
                 DeferralState::kRecovering}) {
    if (deferral_state_name(s) == name) return s;
  }
  return std::nullopt;
}

// A partition: the two words state() reads, the rest under the gate's mutex.
class DeferralGate::Partition {
 public:
  explicit Partition(std::string k, std::int64_t now) : key(std::move(k)), entered_ns(now) {}

  std::atomic<std::uint8_t> state{static_cast<std::uint8_t>(DeferralState::kNormal)};
  std::atomic<std::int64_t> deadline_ns{kNoDeadline};  // of the decision to defer
  const std::string key;

  DeferralState current() const noexcept {
    return static_cast<DeferralState>(state.load(std::memory_order_relaxed));
  }

  // Under the gate's mutex.
  std::optional<DeferralState> decision;  // none: never decided, or expired
  std::int64_t entered_ns;                // into the current state
  std::int64_t held_ns[2] = {0, 0};       // first, second stage, closed spells
  std::uint64_t deferrals = 0;            // entries into a stage from outside one
  std::uint64_t refused = 0;              // decisions to defer refused
  std::uint64_t ended = 0;                // deferrals ended by the cap or the binding
  bool blocked = false;                   // ended: refuses deferral until normal
  DeferralObservation observed;
};

DeferralGate::DeferralGate(Clock* clock) : clock_(clock) {}

DeferralGate::~DeferralGate() = default;

Status DeferralGate::validate(const nlohmann::json& config) const {
  MutexLock lock(mu_);
  return parse_deferral_gate_config(config, config_, nullptr).status();
}

Status DeferralGate::configure(const nlohmann::json& config) {
  MutexLock lock(mu_);
  return apply_locked(config);
}

Status DeferralGate::apply_locked(const nlohmann::json& config) {
  std::vector<DeferralDecision> decisions;
  auto parsed = parse_deferral_gate_config(config, config_, &decisions);
  if (!parsed) return parsed.status();
  config_ = std::move(*parsed);
  while (log_.size() > config_.log_size) log_.pop_front();
  const std::int64_t now = clock_->now_ns();
  tick_locked(now);
  for (const auto& d : decisions) apply_decision_locked(partition_locked(d.partition), d.want, now);
  return {};
}

Status DeferralGate::decide(std::string_view key, DeferralState want) {
  if (want == DeferralState::kRecovering)
    return Status::invalid("decide: a policy decides first-stage, second-stage or resume");
  nlohmann::json d = nlohmann::json::object();
  d[std::string(key)] = want == DeferralState::kNormal ? "resume" : deferral_state_name(want);
  MutexLock lock(mu_);
  return apply_locked({{"decide", std::move(d)}});
}

std::span<const std::string_view> DeferralGate::tunables() const noexcept {
  return kGateTunables;
}

Status DeferralGate::set_tunables(std::uint64_t mask,
                                  std::span<const double, kMaxTunables> values) noexcept {
  if (mask >> std::size(kGateTunables))
    return Status::invalid("deferral-gate has tunables hold_ms and growth_cap_bytes only");
  auto whole_in = [](double v, double lo, double hi) {
    return std::isfinite(v) && v == std::floor(v) && v >= lo && v <= hi;
  };
  if ((mask & 1) && !whole_in(values[0], 1, static_cast<double>(kDeferralMaxHoldMs))) {
    return Status::invalid("hold_ms: must be an integer from 1 to 3600000, got " +
                           std::to_string(values[0]));
  }
  if ((mask & 2) && !whole_in(values[1], 0, static_cast<double>(kDeferralMaxGrowthCap))) {
    return Status::invalid("growth_cap_bytes: must be an integer from 0 to 2^62, got " +
                           std::to_string(values[1]));
  }
  MutexLock lock(mu_);
  if (mask & 1) config_.hold_ms = static_cast<std::int64_t>(values[0]);
  if (mask & 2) config_.growth_cap_bytes = static_cast<std::uint64_t>(values[1]);
  return {};
}

StatusOr<DeferralGate::Partition*> DeferralGate::partition(std::string_view key) {
  if (key.empty() || key.size() > 256)
    return Status::invalid("partition: a partition name is 1 to 256 bytes");
  MutexLock lock(mu_);
  return &partition_locked(key);
}

DeferralGate::Partition& DeferralGate::partition_locked(std::string_view key) {
  if (auto it = by_key_.find(key); it != by_key_.end()) return *it->second;
  partitions_.push_back(std::make_unique<Partition>(std::string(key), clock_->now_ns()));
  Partition& p = *partitions_.back();
  by_key_.emplace(p.key, &p);
  return p;
}

DeferralState DeferralGate::state(const Partition& p) const noexcept {
  if (shut_down_.load(std::memory_order_acquire)) return DeferralState::kRecovering;
  const auto s = static_cast<DeferralState>(p.state.load(std::memory_order_acquire));
  if (deferred(s) && clock_->now_ns() >= p.deadline_ns.load(std::memory_order_acquire))
    return DeferralState::kRecovering;
  return s;
}

void DeferralGate::move_locked(Partition& p, DeferralState to, std::string_view cause,
                               std::int64_t now) const {
  const DeferralState from = p.current();
  if (from == to) return;
  if (deferred(from)) p.held_ns[from == DeferralState::kFirstStage ? 0 : 1] += now - p.entered_ns;
  if (deferred(to) && !deferred(from)) ++p.deferrals;
  if (to == DeferralState::kNormal) {
    p.blocked = false;
    growth_ -= p.observed.growth_bytes;
    p.observed.growth_bytes = 0;
  }
  if (!deferred(to)) p.deadline_ns.store(kNoDeadline, std::memory_order_relaxed);
  p.entered_ns = now;
  p.state.store(static_cast<std::uint8_t>(to), std::memory_order_release);
  log_.push_back({++seq_, p.key, from, to, std::string(cause), now});
  while (log_.size() > config_.log_size) log_.pop_front();
}

void DeferralGate::apply_decision_locked(Partition& p, DeferralState want, std::int64_t now) {
  if (shut_down_.load(std::memory_order_relaxed)) return;
  const DeferralState s = p.current();
  if (want == DeferralState::kNormal) {
    p.decision = DeferralState::kNormal;
    if (deferred(s)) move_locked(p, DeferralState::kRecovering, "resume", now);
    return;
  }
  // Entering deferral must leave room under the cap; renewing one need not
  // (observe() ends it once the growth passes the cap).
  if (p.blocked || (!deferred(s) && (config_.growth_cap_bytes == 0 ||
                                     growth_locked() >= config_.growth_cap_bytes))) {
    ++p.refused;
    return;
  }
  p.decision = want;
  p.deadline_ns.store(now + config_.hold_ms * 1'000'000, std::memory_order_release);
  move_locked(p, want, "decision", now);
}

void DeferralGate::tick() {
  MutexLock lock(mu_);
  tick_locked(clock_->now_ns());
}

void DeferralGate::tick_locked(std::int64_t now) const {
  for (const auto& p : partitions_) {
    if (deferred(p->current()) && now >= p->deadline_ns.load(std::memory_order_relaxed)) {
      p->decision.reset();
      move_locked(*p, DeferralState::kRecovering, "expired", now);
    }
  }
}

std::uint64_t DeferralGate::growth_locked() const {
  return growth_;
}

DeferralState DeferralGate::observe(Partition& p, const DeferralObservation& o) {
  {
    MutexLock lock(mu_);
    const std::int64_t now = clock_->now_ns();
    tick_locked(now);
    growth_ -= p.observed.growth_bytes;
    p.observed = o;
    if (p.current() == DeferralState::kNormal) p.observed.growth_bytes = 0;
    growth_ += p.observed.growth_bytes;
    if (deferred(p.current()) && growth_locked() > config_.growth_cap_bytes) {
      ++p.ended;
      p.blocked = true;
      move_locked(p, DeferralState::kRecovering, "growth cap", now);
    }
  }
  return state(p);
}

void DeferralGate::end(Partition& p, std::string_view cause) {
  MutexLock lock(mu_);
  const std::int64_t now = clock_->now_ns();
  tick_locked(now);
  if (!deferred(p.current())) return;
  ++p.ended;
  p.blocked = true;
  move_locked(p, DeferralState::kRecovering, cause, now);
}

void DeferralGate::recovered(Partition& p) {
  MutexLock lock(mu_);
  if (shut_down_.load(std::memory_order_relaxed)) return;
  // An expiry the binding saw (state()) but nobody recorded yet comes first.
  const std::int64_t now = clock_->now_ns();
  tick_locked(now);
  if (p.current() != DeferralState::kRecovering) return;
  move_locked(p, DeferralState::kNormal, "recovered", now);
}

void DeferralGate::shutdown() noexcept {
  MutexLock lock(mu_);
  const std::int64_t now = clock_->now_ns();
  for (const auto& p : partitions_)
    if (deferred(p->current())) move_locked(*p, DeferralState::kRecovering, "shutdown", now);
  shut_down_.store(true, std::memory_order_release);
}

nlohmann::json DeferralGate::collect() const {
  MutexLock lock(mu_);
  const std::int64_t now = clock_->now_ns();
  tick_locked(now);
  nlohmann::json parts = nlohmann::json::array();
  std::uint64_t in_stage = 0;
  for (const auto& p : partitions_) {
    const DeferralState s = p->current();
    std::int64_t held[2] = {p->held_ns[0], p->held_ns[1]};
    if (deferred(s)) {
      ++in_stage;
      held[s == DeferralState::kFirstStage ? 0 : 1] += now - p->entered_ns;
    }
    const std::int64_t deadline = p->deadline_ns.load(std::memory_order_relaxed);
    const DeferralObservation& o = p->observed;
    parts.push_back(
        {{"partition", p->key},
         {"state", deferral_state_name(s)},
         {"decision", !p->decision                             ? "none"
                      : *p->decision == DeferralState::kNormal ? "resume"
                                                               : deferral_state_name(*p->decision)},
         {"decision_left_ms", deferred(s) && deadline != kNoDeadline ? to_ms(deadline - now) : 0.0},
         {"in_state_ms", to_ms(now - p->entered_ns)},
         {"held_ms", {{"first_stage", to_ms(held[0])}, {"second_stage", to_ms(held[1])}}},
         {"deferrals", p->deferrals},
         {"refused", p->refused},
         {"ended", p->ended},
         {"l0_files", o.l0_files},
         {"l0_slowdown_trigger", o.l0_slowdown_trigger},
         {"l0_stop_trigger", o.l0_stop_trigger},
         {"growth_bytes", o.growth_bytes},
         {"pending_compaction_bytes", o.pending_compaction_bytes},
         {"intra_l0_compactions", o.intra_l0_compactions},
         {"stalls", o.stalls}});
  }
  nlohmann::json log = nlohmann::json::array();
  for (const auto& t : log_) {
    log.push_back({{"seq", t.seq},
                   {"partition", t.partition},
                   {"from", deferral_state_name(t.from)},
                   {"to", deferral_state_name(t.to)},
                   {"cause", t.cause},
                   {"ago_ms", to_ms(now - t.at_ns)}});
  }
  return {{"hold_ms", config_.hold_ms},
          {"growth_cap_bytes", config_.growth_cap_bytes},
          {"growth_bytes", growth_locked()},
          {"deferred", in_stage},
          {"shut_down", shut_down_.load(std::memory_order_relaxed)},
          {"transitions_total", seq_},
          {"partitions", std::move(parts)},
          {"transitions", std::move(log)}};
}

std::unique_ptr<EnforcementObject> make_deferral_gate(const ObjectEnv& env) {
  return std::make_unique<DeferralGate>(env.clock);
}

}  // namespace sluice
