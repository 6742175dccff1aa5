// maxmin: max-min fair bandwidth across stages (PAIO §8.2, Algorithm 2) as
// weighted water-filling with minimum guarantees: each step it estimates each
// stage's demand (unbounded while its limiter held it back, else what it
// achieved plus headroom), divides max_bandwidth with water_fill(), and sets
// each stage's drl to its allocation times a calibration factor from
// /proc/PID/io. A new stage is admitted at once with what the others leave;
// after a daemon restart, stages that come back keep their rates. A stage
// merely absent keeps its allocation held out until it returns or is
// forgotten. docs/policies.md, "maxmin", has the fields and the equations.
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
