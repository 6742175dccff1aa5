// silk: SILK tail-latency control (PAIO §8.1, Algorithm 1). Each step, per
// stage, it measures the foreground bandwidth Fg and which background flows
// (flushes, L0 and higher-level compactions) have work, splits
// left_B = max(KVS_B - Fg, min_B) among them by Algorithm 1 (with `share:
// reclaim`, a flow's unused half goes to the other), optionally per
// direction, and configures the drl objects of each flow. A flow has work
// when its bytes exceed demand_threshold or its objects have waiters.
// docs/policies.md, "silk", has the layout, the fields and the report.
//
// Stages are remembered by name and connected_at_ns (a new one gets every
// rate again); departed ones are forgotten, absent ones after
// kForgetAfterAbsentSteps steps.
//
// Thread safety: as Policy (one thread at a time).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/policy.h"
#include "sluice/status.h"

namespace sluice {

// One DRL object the policy tunes.
struct SilkTarget {
  std::string channel;
  std::string object;
  std::string direction;  // "read" or "write" with `directions`, empty otherwise
  bool operator==(const SilkTarget&) const = default;
};

// How a flow's rate is given to its DRL objects.
enum class SilkSplit : std::uint8_t {
  kEach,    // every object gets the whole rate (jobs of the flow run one at a time)
  kEven,    // rate / number of objects
  kActive,  // rate / number of objects with work; idle objects keep rate / number of objects
};

// How line 5 (flushes and L0 compactions both active) splits left_B.
enum class SilkShare : std::uint8_t {
  kEqual,    // left_B / 2 each (PAIO's Algorithm 1)
  kReclaim,  // each: left_B - min(what the other used, left_B / 2)
};

// A background flow: flush, L0 compaction or LN compaction.
struct SilkFlow {
  std::vector<std::string> origins;  // origins whose bytes count as this flow's work
  std::vector<SilkTarget> objects;   // the DRL objects that carry it
  SilkSplit split = SilkSplit::kEach;
};

// One direction of the device, when SILK runs per direction.
struct SilkDirection {
  double kvs_bandwidth = 0;            // this direction's KVS_B, bytes/s
  double min_bandwidth = 0;            // this direction's min_B, bytes/s
  std::vector<SilkTarget> foreground;  // objects whose bytes are this direction's Fg
};

struct SilkConfig {
  double kvs_bandwidth = 200.0 * 1024 * 1024;  // KVS_B, bytes/s
  double min_bandwidth = 10.0 * 1024 * 1024;   // min_B, bytes/s
  double hysteresis = 0.01;             // resend a rate only if it moved by more than this fraction
  double demand_threshold = 0.0;        // bytes/s a flow must exceed to count as having work
  SilkShare share = SilkShare::kEqual;  // line 5's split
  bool install_layout = false;          // create missing channels/objects on new stages
  std::map<std::string, std::string> match_labels;  // drive only stages with these labels
  // Foreground: bytes of these channels, plus bytes of these origins in any
  // other channel, plus (if count_unclassified) requests no channel took.
  std::vector<std::string> foreground_channels = {"foreground"};
  std::vector<std::string> foreground_origins;
  bool count_unclassified = true;
  SilkFlow flush{{"flush"}, {{"flush", "limit", ""}}, SilkSplit::kEach};
  SilkFlow l0{
      {"compaction_L0_L1", "compaction_L0_L0"}, {{"compaction_l0", "limit", ""}}, SilkSplit::kEach};
  SilkFlow ln{{"compaction_LN"}, {{"compaction_ln", "limit", ""}}, SilkSplit::kEven};
  // Per direction: off (the paper's single KVS_B) unless `directions` is given.
  bool per_direction = false;
  SilkDirection read;
  SilkDirection write;
};

// Validates a configuration; absent fields keep their defaults, unknown fields
// are errors, and errors name the field ("flush.objects[1].channel: ...").
StatusOr<SilkConfig> parse_silk_config(const nlohmann::json& j);
nlohmann::json silk_config_to_json(const SilkConfig& c);

// Algorithm 1, lines 2-11, for one stage. `line` is the line of Algorithm 1
// that chose the split (5, 7, 9 or 11). flush_used and l0_used (bytes/s in the
// last interval) matter only to line 5 with SilkShare::kReclaim.
struct SilkRates {
  double left = 0;
  double flush = 0;
  double l0 = 0;
  double ln = 0;
  int line = 0;
};
SilkRates silk_rates(double kvs_bandwidth, double min_bandwidth, double foreground,
                     bool flush_active, bool l0_active, SilkShare share = SilkShare::kEqual,
                     double flush_used = 0, double l0_used = 0) noexcept;

class SilkPolicy final : public Policy {
 public:
  static constexpr int kForgetAfterAbsentSteps = 16;

  SilkPolicy() = default;
  std::string_view name() const noexcept override { return "silk"; }
  Status configure(const nlohmann::json& config) override;
  PolicyOutput step(const PolicyInput& input) override;
  nlohmann::json describe() const override;

 private:
  struct StageMemory {
    std::int64_t connected_at_ns = 0;
    int absent_steps = 0;  // consecutive steps without this stage in the input
    std::map<std::pair<std::string, std::string>, std::int64_t> sent;  // (channel, object) -> rate
  };
  SilkConfig config_;
  std::map<std::string, StageMemory> stages_;
};

// The factory for the registry: registry.cc lists {"silk", make_silk_policy}
// in builtin_policies().
std::unique_ptr<Policy> make_silk_policy();

// Adds "silk" to the policy registry at run time (for a host that does not
// use the built-in list). Inline so that code using SilkPolicy directly (the
// tests) does not need the registry linked in. A second call is a no-op.
inline void register_silk_policy() {
  (void)register_policy("silk", make_silk_policy);
}

}  // namespace sluice
