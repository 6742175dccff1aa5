// compaction-deferral: FlexEngine's two-stage compaction deferral (§4.3) as a
// control policy over `deferral-gate` objects: each step it compares the
// node's bandwidth use with watermarks (with hysteresis), chooses partitions
// by pending compaction bytes while the node is short, sends them
// first-stage or second-stage (renewing the gates' holds every step), and
// resume when it no longer is. docs/policies.md, "compaction-deferral", has
// the step, the configuration and the report.
//
// To compose it into another policy (flex's node admission), hold a
// CompactionDeferral, call step() (or step_with_use()) and append the rules
// it returns per stage to that policy's batches.
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
