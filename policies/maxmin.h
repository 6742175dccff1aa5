// Max-min fair bandwidth across stages (PAIO FAST'22 §8.2, Algorithm 2), done
// as true weighted water-filling with minimum guarantees and calibration.
//
// Every step the policy estimates each stage's demand from what it achieved,
// divides max_bandwidth among the stages with water_fill() (goals are floors,
// weights share what is above them, nobody gets more than its demand), and
// sets each stage's limiter (a DRL object, default channel "app", object
// "limit") to its allocation times a calibration factor that makes the
// bandwidth the process actually achieves (/proc/PID/io) match the allocation.
// docs/policies.md documents every field and the equations.
//
// Demand: a stage whose limiter held it back in the last interval (requests
// waited, or its rate reached `saturation` of the limit) wants more than it
// got: its demand is unbounded (or, with `probe` > 1, max(allocation,
// measured) * probe). Any other stage wants what it achieved plus `headroom`.
// A stage seen for the first time has unbounded demand.
//
// A stage that says hello gets its rules at once (admit): what the others
// leave of max_bandwidth (min_rate when they share all of it), until the next
// step gives it its fair share.
//
// Start-up (startup_grace_ms after the daemon started): stages of an earlier
// daemon reconnect one by one, each still enforcing the rate it had. A stage
// whose limiter already has a rate keeps it (the policy sends it nothing) and
// that rate is counted as taken; with expected_stages, the stages not seen
// yet hold shares of their own. So the first stage back does not get the
// whole capacity while the others, not back yet, still use theirs.
//
// Stages come and go: a stage listed in `departed` is forgotten and its share
// is redistributed in the same step. A stage merely missing from a step's
// input (a missed collect) still enforces its last rate, so its last
// allocation is held out of max_bandwidth until it is back (or forgotten
// after kForgetAfterAbsentSteps steps). A stage seen with a new
// connected_at_ns starts afresh (unbounded demand, factor 1, rate resent).
//
// Thread safety: as Policy (one thread at a time).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/policy.h"
#include "sluice/status.h"
#include "water_fill.h"

namespace sluice {

// Which /proc/PID/io counters measure a stage's achieved bandwidth.
enum class IoCounters : std::uint8_t { kRead, kWrite, kBoth };

// Settings for the stages one entry matches (first matching entry wins).
struct MaxminStageConfig {
  std::string name;                           // exact stage name; empty: any
  std::map<std::string, std::string> labels;  // all must match; empty: any
  std::optional<double> goal;                 // bytes/s guaranteed (floor)
  std::optional<double> weight;               // share of what is above the floors
  std::optional<std::string> channel;         // the limiter
  std::optional<std::string> object;
};

struct MaxminCalibration {
  bool enabled = true;
  IoCounters io = IoCounters::kBoth;
  double gain = 0.6;         // how far one observation moves the factor (0..1]
  double min_factor = 0.25;  // DRL rate / allocation is kept in [min_factor, max_factor]
  double max_factor = 4.0;
  double min_bytes = 1048576;  // stage bytes an interval needs to update the factor
};

struct MaxminConfig {
  double max_bandwidth = 1024.0 * 1024 * 1024;  // MaxB, bytes/s
  std::string channel = "app";                  // default limiter
  std::string object = "limit";
  double default_goal = 0;
  double default_weight = 1;
  std::vector<MaxminStageConfig> stages;
  std::map<std::string, std::string> match_labels;  // participate only with these labels
  double headroom = 0.1;     // unthrottled demand = measured * (1 + headroom)
  double probe = 0;          // 0: throttled demand unbounded; > 1: max(alloc, measured) * probe
  double saturation = 0.95;  // stage rate >= saturation * DRL rate counts as throttled
  double throttle_wait_fraction = 0.02;  // waiting >= this fraction of the interval: throttled
  double min_rate = 1048576;             // smallest DRL rate sent, bytes/s
  double hysteresis = 0.01;
  bool distribute_surplus = true;  // capacity nobody demands is shared by weight
  bool install_layout = false;     // create a missing limiter on a new stage
  // For this long after the daemon started, stages that come with their
  // limiter's rate set keep it (see above); 0: no start-up period.
  double startup_grace_ms = 5000;
  // During start-up, capacity is shared as if at least this many stages took
  // part; those not seen yet hold their shares (0: only the stages seen).
  int expected_stages = 0;
  MaxminCalibration calibration;
};

StatusOr<MaxminConfig> parse_maxmin_config(const nlohmann::json& j);
nlohmann::json maxmin_config_to_json(const MaxminConfig& c);

class MaxminPolicy final : public Policy {
 public:
  static constexpr int kForgetAfterAbsentSteps = 16;

  MaxminPolicy() = default;
  std::string_view name() const noexcept override { return "maxmin"; }
  Status configure(const nlohmann::json& config) override;
  PolicyOutput step(const PolicyInput& input) override;
  RulesBatch admit(const PolicyInput& input) override;
  nlohmann::json describe() const override;

  // Calibration factor (DRL rate / allocation) currently used for a stage; 1
  // for an unknown stage. For tests and reports.
  double factor(const std::string& stage) const;

 private:
  struct StageMemory {
    std::int64_t connected_at_ns = 0;
    int absent_steps = 0;  // consecutive steps without this stage in the input
    bool stepped = false;  // in a step's input since it connected
    bool allocated = false;
    // bytes/s of real bandwidth, last step (admitted: what admit gave it;
    // kept at start-up: the rate it enforces).
    double allocation = 0;
    double factor = 1;  // DRL rate / allocation
    bool sent = false;
    std::int64_t sent_rate = 0;  // DRL rate last sent
  };
  // One step's measurements and decisions (maxmin.cc).
  struct Step;
  // Whether the daemon's start-up period is on at `input`'s time.
  bool starting(const PolicyInput& input) const;
  // The memory of `st`, made fresh when it is new or connected anew.
  StageMemory& memory_of(const StageView& st);
  // A step in four parts: what each stage achieved and wants (and, at
  // start-up, what is held for stages not known yet); the allocations; the
  // rules that carry them; the report.
  void measure(const PolicyInput& input, Step& step);
  void decide(Step& step) const;
  void emit(Step& step, PolicyOutput& out);
  void report(const PolicyInput& input, const Step& step, PolicyOutput& out) const;

  MaxminConfig config_;
  std::map<std::string, StageMemory> stages_;
};

// The factory for the registry: registry.cc lists {"maxmin", make_maxmin_policy}.
std::unique_ptr<Policy> make_maxmin_policy();

// Adds "maxmin" to the policy registry at run time; see register_silk_policy.
inline void register_maxmin_policy() {
  (void)register_policy("maxmin", make_maxmin_policy);
}

}  // namespace sluice
