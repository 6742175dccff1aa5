// deferral-gate: compaction deferral per partition (FlexEngine), a state
// machine a policy drives with `configure` rules and a binding acts on; it
// decides nothing on its own but expiry. A partition is a string key (a
// tenant id in decimal, or a name). States: normal -> first-stage (all but
// L0->L1 suspended) -> second-stage (L0->L1 too) -> recovering -> normal.
// Fail-static: a decision to defer holds for `hold_ms` and expires to
// recovering unless renewed; end() or growth past `growth_cap_bytes` end a
// deferral too. A removed or shut-down gate reads recovering everywhere.
// Per request it lets everything through. docs/rules.md, "deferral-gate",
// has the configuration.
//
// Thread safety: every member is safe from any thread; state() reads three
// atomics and the clock, takes no lock and never allocates. A Partition
// pointer stays valid for the object's life.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sluice/clock.h"
#include "sluice/enforcement_object.h"
#include "sluice/objects/types.h"
#include "sluice/thread_annotations.h"

namespace sluice {

inline constexpr std::int64_t kDeferralDefaultHoldMs = 5000;
inline constexpr std::int64_t kDeferralMaxHoldMs = 3'600'000;
inline constexpr std::uint64_t kDeferralDefaultGrowthCap = std::uint64_t{1} << 30;
inline constexpr std::uint64_t kDeferralMaxGrowthCap = std::uint64_t{1} << 62;
inline constexpr std::uint32_t kDeferralDefaultLogSize = 32;
inline constexpr std::uint32_t kDeferralMaxLogSize = 4096;

struct DeferralGateConfig {
  std::int64_t hold_ms = kDeferralDefaultHoldMs;
  bool any_partition = true;                      // "partitions" absent or null
  std::set<std::string, std::less<>> partitions;  // the partitions it may defer
  std::uint64_t growth_cap_bytes = kDeferralDefaultGrowthCap;
  std::uint32_t log_size = kDeferralDefaultLogSize;

  bool may_defer(std::string_view partition) const;
};

// A decision of a "decide" member: the state a policy wants for a partition
// (kNormal stands for "resume").
struct DeferralDecision {
  std::string partition;
  DeferralState want = DeferralState::kNormal;
};

// Parses a configuration; `base`: the current one (absent fields keep their
// value). Decisions go to *decisions (may be null to only check). Errors name
// the field: "hold_ms: must be an integer from 1 to 3600000, got 0".
StatusOr<DeferralGateConfig> parse_deferral_gate_config(const nlohmann::json& config,
                                                        const DeferralGateConfig& base,
                                                        std::vector<DeferralDecision>* decisions);

// What a binding measured of a partition, reported with observe() and shown
// in collect() (for the policy: the L0 file count against the stall trigger).
struct DeferralObservation {
  std::uint64_t l0_files = 0;
  std::uint64_t l0_slowdown_trigger = 0;  // the configured ones, not raised
  std::uint64_t l0_stop_trigger = 0;
  std::uint64_t growth_bytes = 0;              // kept in the upper levels by this deferral
  std::uint64_t pending_compaction_bytes = 0;  // background demand
  std::uint64_t intra_l0_compactions = 0;      // cumulative
  std::uint64_t stalls = 0;                    // cumulative, as the engine counts them
};

class DeferralGate final : public EnforcementObject {
 public:
  class Partition;

  explicit DeferralGate(Clock* clock = &system_clock());
  ~DeferralGate() override;
  DeferralGate(const DeferralGate&) = delete;
  DeferralGate& operator=(const DeferralGate&) = delete;

  std::string_view type() const noexcept override { return "deferral-gate"; }
  Status validate(const nlohmann::json& config) const override SLUICE_EXCLUDES(mu_);
  Status configure(const nlohmann::json& config) override SLUICE_EXCLUDES(mu_);
  std::span<const std::string_view> tunables() const noexcept override;
  Status set_tunables(std::uint64_t mask,
                      std::span<const double, kMaxTunables> values) noexcept override
      SLUICE_EXCLUDES(mu_);

  Verdict enforce_context(const Context&) noexcept override { return {}; }
  Verdict try_enforce_context(const Context&) noexcept override { return {}; }
  Verdict settle(const Context&, std::uint64_t) noexcept override { return {}; }
  bool passes_through() const noexcept override { return true; }

  // {"hold_ms", "growth_cap_bytes", "growth_bytes" (the sum), "deferred"
  //  (partitions in a stage), "transitions_total", "partitions": [{
  //  "partition", "state", "decision" ("first-stage", "second-stage",
  //  "resume" or "none"), "decision_left_ms", "in_state_ms", "held_ms":
  //  {"first_stage", "second_stage"}, "deferrals", "refused", "ended",
  //  and the binding's observation: "l0_files", "l0_slowdown_trigger",
  //  "l0_stop_trigger", "growth_bytes", "pending_compaction_bytes",
  //  "intra_l0_compactions", "stalls"}], "transitions": [{"seq",
  //  "partition", "from", "to", "cause", "ago_ms"}] (the last log_size,
  //  oldest first)}. Applies expiries first.
  nlohmann::json collect() const override SLUICE_EXCLUDES(mu_);
  // Every partition reads as recovering from now on; decisions are ignored.
  void shutdown() noexcept override SLUICE_EXCLUDES(mu_);

  // For bindings. The partition `key` (made if need be; "" is refused).
  StatusOr<Partition*> partition(std::string_view key) SLUICE_EXCLUDES(mu_);
  // The state to apply now, without a lock: a deferral whose decision
  // expired, and every partition of a shut-down gate, read as recovering.
  DeferralState state(const Partition& p) const noexcept;
  // Records what the binding measured; ends the partition's deferral
  // (cause "growth cap") when the gate's partitions together grew past the
  // cap. Returns state(p) after that.
  DeferralState observe(Partition& p, const DeferralObservation& o) SLUICE_EXCLUDES(mu_);
  // The binding ends a deferral on its own (an engine limit, named by
  // `cause`): the partition goes to recovering and refuses decisions to
  // defer until it is normal again. Nothing when it is not deferred.
  void end(Partition& p, std::string_view cause) SLUICE_EXCLUDES(mu_);
  // The binding restored everything and the partition's tree recovered:
  // recovering -> normal. Nothing in another state.
  void recovered(Partition& p) SLUICE_EXCLUDES(mu_);
  // Applies expired decisions now (state() already reads them as
  // recovering; this records the transitions). collect(), configure() and
  // observe() call it too.
  void tick() SLUICE_EXCLUDES(mu_);
  // As configure({"decide": {key: state}}) (kNormal: "resume").
  Status decide(std::string_view key, DeferralState want) SLUICE_EXCLUDES(mu_);
  bool is_shut_down() const noexcept { return shut_down_.load(std::memory_order_acquire); }
  Clock& clock() const noexcept { return *clock_; }

 private:
  struct Transition {
    std::uint64_t seq = 0;
    std::string partition;
    DeferralState from{}, to{};
    std::string cause;
    std::int64_t at_ns = 0;
  };

  Partition& partition_locked(std::string_view key) SLUICE_REQUIRES(mu_);
  void apply_decision_locked(Partition& p, DeferralState want, std::int64_t now)
      SLUICE_REQUIRES(mu_);
  // Partitions are reached through unique_ptrs, so const members (collect)
  // may move them too.
  void move_locked(Partition& p, DeferralState to, std::string_view cause, std::int64_t now) const
      SLUICE_REQUIRES(mu_);
  void tick_locked(std::int64_t now) const SLUICE_REQUIRES(mu_);
  std::uint64_t growth_locked() const SLUICE_REQUIRES(mu_);
  Status apply_locked(const nlohmann::json& config) SLUICE_REQUIRES(mu_);

  Clock* const clock_;
  std::atomic<bool> shut_down_{false};

  mutable Mutex mu_;
  DeferralGateConfig config_ SLUICE_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Partition>> partitions_ SLUICE_GUARDED_BY(mu_);  // by creation
  std::map<std::string, Partition*, std::less<>> by_key_ SLUICE_GUARDED_BY(mu_);
  // The partitions' observed growth_bytes, summed: kept as they change, so
  // that a batch of N decisions costs O(N log N), not O(N^2).
  mutable std::uint64_t growth_ SLUICE_GUARDED_BY(mu_) = 0;
  // Mutable: collect() (const) records the expiries it applies.
  mutable std::deque<Transition> log_ SLUICE_GUARDED_BY(mu_);  // the last log_size
  mutable std::uint64_t seq_ SLUICE_GUARDED_BY(mu_) = 0;       // transitions ever made
};

std::unique_ptr<EnforcementObject> make_deferral_gate(const ObjectEnv& env);

}  // namespace sluice
