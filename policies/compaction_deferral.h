// compaction-deferral: FlexEngine's two-stage compaction deferral (§4.3)
// as a control policy over `deferral-gate` objects
// (sluice/objects/deferral_gate.h). It decides; each stage's gate holds the
// decisions and a binding (the RocksDB DeferralActuator) applies them.
//
// Each step:
//   1. Node bandwidth use: the bytes per second the matching stages moved
//      (in the channels `measure_channels` names, else in all), summed, over
//      the configured node `bandwidth`.
//   2. Watermarks with hysteresis: the node becomes short of bandwidth when
//      the use is at or above `high_watermark` for `high_steps` steps in a
//      row, and stops being short when it is below `low_watermark` for
//      `low_steps` steps in a row (low < high: a use between the two changes
//      nothing).
//   3. While it is short, it chooses the partitions to defer: those the
//      gates report, by background demand (their pending compaction bytes,
//      largest first, ties by stage and partition), up to `max_partitions`
//      (0: all) for the episode: a partition chosen stays chosen, and one
//      reported later is chosen while there is room. Each chosen partition gets "first-stage", or
//      "second-stage" once its L0 file count reached `l0_fraction` of its
//      configured slowdown trigger (the write-stall threshold); a partition
//      in the second stage stays there until the node recovers. The
//      decisions are sent every step, which renews them in the gate (a gate
//      drops a decision not renewed within its hold_ms: keep interval_ms
//      well below it; the report warns when it is not).
//   4. When the node stops being short, it sends "resume" to every partition
//      a gate reports deferred, and keeps doing so while one is (a policy
//      restarted mid-deferral, too).
//   5. Reports the use, the watermark state and its last change with its
//      cause, and per partition the gate's state, the decision sent, L0
//      against the trigger, the demand and the time held.
//
// Configuration (errors name the field):
//   "bandwidth": the node's bandwidth in bytes per second, > 0 (required)
//   "object": the gate's name (default "deferral"), in any channel
//   "measure_channels": ["..."]: the channels whose bytes are the node's
//     use (default: every channel)
//   "labels": {...}: only stages with these labels
//   "high_watermark": (0, 4], default 0.8; "low_watermark": [0, high),
//     default 0.6
//   "high_steps": steps at or above high before deferring, >= 1 (default 1)
//   "low_steps": steps below low before resuming, >= 1 (default 3)
//   "l0_fraction": (0, 1], default 0.6
//   "max_partitions": integer >= 0, default 0 (all)
//   "hold_ms": the gates' hold, configured with the decisions when given
//   "second_stage": false keeps every partition in the first stage (the
//     ablation without intra-L0 compactions; default true)
//
// To compose it into another policy (the flex policy's node admission), hold
// a CompactionDeferral, call its step() with the input (or step_with_use()
// with a use measured another way) and append the rules it returns per stage
// to that policy's own batches; its report goes under a member of that
// policy's report.
//
// Thread safety: as Policy (one thread at a time).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/policy.h"
#include "sluice/status.h"

namespace sluice {

struct CompactionDeferralConfig {
  double bandwidth = 0;  // bytes/s
  std::string object = "deferral";
  std::vector<std::string> measure_channels;  // empty: all
  std::map<std::string, std::string> labels;
  double high_watermark = 0.8;
  double low_watermark = 0.6;
  int high_steps = 1;
  int low_steps = 3;
  double l0_fraction = 0.6;
  std::uint64_t max_partitions = 0;
  std::int64_t hold_ms = 0;  // 0: not configured by the policy
  bool second_stage = true;  // false: first stage only (an ablation)
};

// Errors name the field under `path` ("deferral.high_watermark: ...").
StatusOr<CompactionDeferralConfig> parse_compaction_deferral_config(const nlohmann::json& j,
                                                                    const std::string& path = "");
nlohmann::json compaction_deferral_config_to_json(const CompactionDeferralConfig& c);

// The decision logic, for this policy and for policies that compose it.
class CompactionDeferral {
 public:
  explicit CompactionDeferral(CompactionDeferralConfig c) : config_(std::move(c)) {}

  // The rules for each stage with a gate (a JSON array of configure rules,
  // empty when nothing is to be sent) and the step's report.
  struct Step {
    std::map<std::string, nlohmann::json> rules;
    nlohmann::json report;
  };
  Step step(const PolicyInput& input);
  // The same with the node's use in bytes per second measured by the caller.
  Step step_with_use(const PolicyInput& input, double bytes_per_s);
  // The node's use in bytes per second, as step() measures it.
  double measure(const PolicyInput& input) const;

  bool short_of_bandwidth() const noexcept { return short_; }
  const CompactionDeferralConfig& config() const noexcept { return config_; }

 private:
  using Key = std::pair<std::string, std::string>;  // stage, partition
  CompactionDeferralConfig config_;
  bool short_ = false;
  int above_ = 0;  // steps in a row at or above high
  int below_ = 0;  // steps in a row below low
  std::set<Key> chosen_;
  std::set<Key> second_;
  std::uint64_t episodes_ = 0;
  nlohmann::json last_change_ = nullptr;
};

class CompactionDeferralPolicy final : public Policy {
 public:
  std::string_view name() const noexcept override { return "compaction-deferral"; }
  Status configure(const nlohmann::json& config) override;
  PolicyOutput step(const PolicyInput& input) override;
  nlohmann::json describe() const override;

 private:
  std::unique_ptr<CompactionDeferral> core_;
};

std::unique_ptr<Policy> make_compaction_deferral_policy();

}  // namespace sluice
