// pisces: weight allocation across stages (Pisces, OSDI '12, §3.2 and §4.1).
// Every tenant has a global weight; every stage runs an `fq` with a local
// weight per tenant. Each step the policy measures each tenant's service and
// queueing per stage and moves local weight toward its demand, keeping every
// tenant's sum of local weights. Methods: "maxmin" (default; the whole
// allocation solved each step, pisces_solve.h), "mbf" and "reciprocal"
// (Pisces's own swaps, pisces_swap.h). docs/policies.md, "pisces", has the
// step, the fields and the report.
//
// Memory: per stage (name and connected_at_ns) its local weights and the
// fq's counters at the last step. A departed stage takes its weights with it
// and the others' sums are repaired; a restarted stage gives no measurement
// that step and is sent its weights again.
// Thread safety: as Policy (one thread at a time).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/policy.h"
#include "sluice/status.h"

namespace sluice {

// How the weights are moved: by the max-min fair allocation, or by swaps
// along a cycle found one way or the other.
enum class PiscesMethod : std::uint8_t {
  kMbf,         // widest cycle through any number of tenants (§4.1)
  kReciprocal,  // two tenants, two stages (§3.2)
  kMaxmin,      // the weighted max-min fair allocation over all stages (pisces_solve.h)
};

struct PiscesConfig {
  std::string object = "fq";  // the fq object's name in each stage
  std::string channel;        // its channel; empty (null): the first channel that has it
  std::map<std::uint64_t, double> global_weights;  // by tenant (flow id)
  double default_weight = 1;                       // tenants not in global_weights
  PiscesMethod method = PiscesMethod::kMaxmin;
  // Smallest swap worth making: the share of a stage's capacity it gains the
  // tenant it is for (of the lighter tenant's fair share when that is less).
  double min_swap = 0.005;
  int max_swaps = 8;  // swaps per step (0: measure and report only); swap methods
  // Queued for at least this fraction of the interval: the tenant wants more
  // there than it got.
  double backlog_fraction = 0.5;
  // A tenant keeps R̂ >= (what it used) * (1 + headroom) where it is not
  // backlogged; only weight above that is spare. "maxmin": a cell that did
  // not queue wants what it used times (1 + headroom).
  double headroom = 0;
  // Tenant u is ahead of t when u's normalised throughput (global service /
  // global weight) exceeds t's by more than this fraction.
  double tolerance = 0.01;
  // The fraction of the throughput gap between two tenants one swap closes;
  // "maxmin": the fraction of the way to the target weights one step goes.
  double damping = 0.5;
  // A local weight never goes below floor * the tenant's global weight.
  double floor = 0.01;
  std::map<std::string, std::string> match_labels;  // only stages with these labels

  double global_weight(std::uint64_t tenant) const;
};

// Validates a configuration; absent fields keep their defaults, unknown
// fields are errors, and errors name the field ("global_weights.x: ...").
StatusOr<PiscesConfig> parse_pisces_config(const nlohmann::json& j);
nlohmann::json pisces_config_to_json(const PiscesConfig& c);

class PiscesPolicy final : public Policy {
 public:
  static constexpr int kForgetAfterAbsentSteps = 16;
  // The fq's bounds on a weight; local weights stay within them.
  static constexpr double kMinWeight = 0.001;
  static constexpr double kMaxWeight = 1e6;

  PiscesPolicy() = default;
  std::string_view name() const noexcept override { return "pisces"; }
  Status configure(const nlohmann::json& config) override;
  PolicyOutput step(const PolicyInput& input) override;
  nlohmann::json describe() const override;

  // The local weights the policy holds, by stage and tenant (what it sent or
  // is about to send). For tests and reports.
  std::map<std::string, std::map<std::uint64_t, double>> local_weights() const;

 private:
  struct FlowMemory {
    double weight = 0;     // the local weight held
    double sent = -1;      // the weight last sent (-1: never)
    bool counted = false;  // the counters below were read at an earlier step
    double served_ns = 0;  // cumulative counters at that step
    double arrived_ns = 0;
    double backlogged_ns = 0;
  };
  struct StageMemory {
    std::int64_t connected_at_ns = 0;
    int absent_steps = 0;
    std::int64_t collected_at_ns = 0;
    std::string channel;  // where its fq object is
    std::map<std::uint64_t, FlowMemory> flows;
  };
  // One step's measurements and decisions (pisces.cc).
  struct Step;

  // A step in five parts: forget departed stages (repairing the sums); read
  // each stage's fq; decide (the allocation and its weights, or the swaps);
  // the rules; the report.
  void forget(const PolicyInput& input, Step& step);
  void measure(const PolicyInput& input, Step& step);
  void decide(Step& step) const;
  void emit(Step& step, PolicyOutput& out);
  void report(const Step& step, PolicyOutput& out) const;

  PiscesConfig config_;
  std::map<std::string, StageMemory> stages_;
};

// The factory for the registry: registry.cc lists {"pisces", make_pisces_policy}.
std::unique_ptr<Policy> make_pisces_policy();

// Adds "pisces" to the policy registry at run time; see register_silk_policy.
inline void register_pisces_policy() {
  (void)register_policy("pisces", make_pisces_policy);
}

}  // namespace sluice
