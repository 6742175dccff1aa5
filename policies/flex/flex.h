// flex: FlexEngine's two-level I/O admission control. Per partition (a stage
// named in the configuration), a foreground bucket reserved by Equation 2 and
// a background bucket following its ingest by Equation 3 (flex_math.h); per
// node, every stage's "node" bucket at the device's bandwidth. Method
// "auto-tuned" models RocksDB's auto-tuned limiter instead, the baseline.
// A stage is sent only what differs from what it was last sent.
// docs/policies.md, "flex", has the document, the arithmetic and the step.
//
// Memory: per partition its ingest window (and tuner); per stage (name and
// connected_at_ns) the configuration last sent to each object.
//
// Thread safety: as Policy (one thread at a time).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "flex_math.h"
#include "sluice/policy.h"
#include "sluice/status.h"

namespace sluice {

struct FlexObjectRef {
  std::string channel;
  std::string object;
};

struct FlexPartition {
  std::string name;
  std::string stage;  // the partition stage's name
  double rcu_max_per_s = 0;
  double rcu_max_size = 4096;
  double read_amplification = 1;
  double wcu_max_per_s = 0;
  double wcu_max_size = 1024;
  bool amplification_from_levels = true;  // "background_amplification": "levels"
  double background_amplification = 0;    // when given as a number
  int levels = 4;
  double ingest_window_s = 60;
  double min_background = 1 << 20;  // bytes/s
  double max_rate = 0;              // auto-tuned: BW_max (0: derived)
};

struct FlexConfig {
  enum Method { kFlex, kAutoTuned };
  Method method = kFlex;
  double node_bandwidth = 0;  // 0: no node bucket configured
  FlexObjectRef node{"node", "node"};
  FlexObjectRef foreground{"fg", "fg"};
  FlexObjectRef background{"bg", "bg"};
  FlexObjectRef auto_tuned{"io", "io"};
  double refill_period_ms = 100;
  std::vector<FlexPartition> partitions;
};

// Validates a configuration: unknown fields are errors, errors name the field
// ("partitions[0].rcu_max_size: must be > 0, got 0").
StatusOr<FlexConfig> parse_flex_config(const nlohmann::json& j);
nlohmann::json flex_config_to_json(const FlexConfig& c);

class FlexPolicy final : public Policy {
 public:
  FlexPolicy() = default;
  std::string_view name() const noexcept override { return "flex"; }
  Status configure(const nlohmann::json& config) override;
  PolicyOutput step(const PolicyInput& input) override;
  RulesBatch admit(const PolicyInput& input) override;
  nlohmann::json describe() const override;
  // {"config", "node_rate", "partitions": {name: {"foreground_rate",
  //  "background_rate", "ingest_bytes_per_s", "lsm_ba", ...}}}.
  nlohmann::json explain() const override;

  // What the policy sets now, bytes/s (tests and reports).
  double foreground_rate(std::size_t partition) const;
  double background_rate(std::size_t partition) const;
  double auto_tuned_rate(std::size_t partition) const;
  double lsm_ba(std::size_t partition) const;
  double ingest(std::size_t partition) const { return state_[partition].window.average(); }

 private:
  struct PartitionState {
    flex::IngestWindow window;
    flex::AutoTuner tuner{0};
    bool wal_seen = false;  // its ingest is its WAL's from then on
  };
  struct StageMemory {
    std::int64_t connected_at_ns = 0;
    std::map<std::string, nlohmann::json> sent;  // "channel/object" -> config
  };

  // The configure rules for one stage: what each of its objects the policy
  // sets should have now, less what it was last sent.
  nlohmann::json rules_for(const StageView& st, StageMemory& mem, nlohmann::json* report) const;
  void measure(const PolicyInput& input, nlohmann::json* report);

  FlexConfig config_;
  std::vector<PartitionState> state_;
  std::map<std::string, StageMemory> stages_;
};

std::unique_ptr<Policy> make_flex_policy();

}  // namespace sluice
