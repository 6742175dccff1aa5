// Delta Fair Sharing for write buffers (FairDB §4-§5.1): every stage's
// `buffer-pool` object (by default the one named "write_buffer", in any
// channel) holds a shared write buffer of capacity C for weighted tenants;
// the policy sizes its reserved pool ρ by Equation 1 (delta_fair_math.h) so
// that any k tenants ramping up to their fair shares at once wait at most δ
// for the rest of the buffer to flush, while the global pool C - ρ lends out
// whatever the reservations do not hold.
//
// Each step the policy
//   1. estimates R_write, the bandwidth flushing gets while writers wait,
//      when "flush_bandwidth" is "measured" (else uses the configured one):
//      the write bytes per second of the flush origin, summed over the stages
//      that hold the pool, in the steps where some pool had waiters or
//      stalls, smoothed (an exponential moving average);
//   2. recomputes ρ;
//   3. configures {"capacity", "reserved", "weights"} of the pool in every
//      stage that has it, when that differs from what the stage was last sent
//      (or the pool reports another capacity or reservation, or the stage
//      reconnected);
//   4. reports the reservation, the R_write in use and, per tenant, its fair
//      share, reservation, usage, stalls and stall time from the pools'
//      collect. docs/policies.md documents the fields and the report.
//
// Memory: per stage (by name and connected_at_ns) and channel, what it was
// last sent; the smoothed R_write. A departed stage is forgotten; one absent
// for more than kForgetAfterAbsentSteps steps too.
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

#include "delta_fair_math.h"
#include "sluice/policy.h"
#include "sluice/status.h"

namespace sluice {

struct DeltaFairTenant {
  std::string name;
  std::uint64_t id = 0;  // the pool's flow id (the request context's tenant)
  double weight = 1;
};

struct DeltaFairBuffer {
  std::uint64_t capacity = 0;  // C, bytes
  std::uint64_t segment = 0;   // B, bytes
  // R_write in bytes per second: the configured one, or with `measured` the
  // starting value ("flush_bandwidth_initial"; 0: none, ρ = D until measured).
  double flush_bandwidth = 0;
  bool measured = false;
  double smoothing = 0.25;  // the weight of a new measurement, (0, 1]
  std::string flush_origin = "flush";
  double delta_ms = 0;  // +infinity for "inf"
  std::string object = "write_buffer";
  delta_fair::Rounding rounding = delta_fair::Rounding::kStrict;
};

struct DeltaFairConfig {
  int k = 1;
  std::vector<DeltaFairTenant> tenants;
  DeltaFairBuffer write_buffer;
};

// Validates a configuration: unknown fields are errors, errors name the field
// ("write_buffer.segment: must be <= capacity ..."); "cache" is refused (not
// supported yet).
StatusOr<DeltaFairConfig> parse_delta_fair_config(const nlohmann::json& j);
nlohmann::json delta_fair_config_to_json(const DeltaFairConfig& c);

class DeltaFairPolicy final : public Policy {
 public:
  static constexpr int kForgetAfterAbsentSteps = 16;
  static constexpr double kMinWeight = 0.001;
  static constexpr double kMaxWeight = 1e6;
  static constexpr std::uint64_t kMaxTenantId = 0xffffffffULL;
  static constexpr std::string_view kPoolType = "buffer-pool";

  DeltaFairPolicy() = default;
  std::string_view name() const noexcept override { return "delta-fair"; }
  Status configure(const nlohmann::json& config) override;
  PolicyOutput step(const PolicyInput& input) override;
  RulesBatch admit(const PolicyInput& input) override;
  nlohmann::json describe() const override;
  // The configuration and what follows from it now: fair shares and the
  // reservation ({"reservations": {"write_buffer": {...}}}).
  nlohmann::json explain() const override;

  // The reservation in force (with the R_write in use).
  delta_fair::Reservation reservation() const;
  // The R_write in use; 0 when measured and nothing measured yet.
  double flush_bandwidth() const noexcept { return bandwidth_; }

 private:
  struct PoolMemory {
    nlohmann::json sent;  // the configuration last sent (null: never)
    bool present = false;
  };
  struct StageMemory {
    std::int64_t connected_at_ns = 0;
    int absent_steps = 0;
    std::map<std::string, PoolMemory> pools;  // by channel
  };

  delta_fair::BufferModel model() const;
  nlohmann::json pool_config(const delta_fair::Reservation& r) const;
  void measure_bandwidth(const PolicyInput& input, nlohmann::json& estimate);

  DeltaFairConfig config_;
  double bandwidth_ = 0;          // R_write in use
  bool bandwidth_known_ = false;  // configured, given a starting value, or measured
  bool measured_once_ = false;    // a measurement replaced the starting value
  std::map<std::string, StageMemory> stages_;
};

std::unique_ptr<Policy> make_delta_fair_policy();

inline void register_delta_fair_policy() {
  (void)register_policy("delta-fair", make_delta_fair_policy);
}

}  // namespace sluice
