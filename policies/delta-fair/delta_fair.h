// delta-fair: Delta Fair Sharing (FairDB §4-§5.2) for a shared write buffer,
// a shared read cache, or both. Each step it estimates what is configured as
// "measured" (R_write, R_read, AMP; smoothed), sizes every stage's
// `buffer-pool` reservation by Equation 1 and every `cache-reserve`'s
// per-tenant thresholds by Equation 2 (delta_fair_math.h), configures a
// stage only with what differs from what it was last sent, and reports per
// tenant. docs/policies.md, "delta-fair", has the fields and the report.
//
// Memory: per stage (name and connected_at_ns) and channel, what it was last
// sent and the cache's counters; the smoothed estimates. Departed stages, and
// those absent for more than kForgetAfterAbsentSteps steps, are forgotten.
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

struct DeltaFairCache {
  std::uint64_t capacity = 0;  // C, bytes
  // R_read in bytes per second: the configured one, or with `measured` the
  // starting value ("refill_bandwidth_initial"; 0: none, ρ_i = f_i until
  // measured).
  double refill_bandwidth = 0;
  bool refill_measured = false;
  // AMP, >= 1: the configured one, or with `measured` the starting value
  // ("read_amplification_initial"; 0: none, ρ_i = f_i until measured).
  double read_amplification = 1;
  bool amplification_measured = false;
  double smoothing = 0.25;  // the weight of a new measurement, (0, 1]
  std::string read_origin = "foreground";
  double delta_ms = 0;  // +infinity for "inf"
  std::string object = "read_cache";
};

struct DeltaFairConfig {
  int k = 1;
  std::vector<DeltaFairTenant> tenants;
  std::optional<DeltaFairBuffer> write_buffer;  // at least one of the two
  std::optional<DeltaFairCache> cache;
};

// Validates a configuration: unknown fields are errors, errors name the field
// ("write_buffer.segment: must be <= capacity ...", "cache.delta_ms: ...").
StatusOr<DeltaFairConfig> parse_delta_fair_config(const nlohmann::json& j);
nlohmann::json delta_fair_config_to_json(const DeltaFairConfig& c);

class DeltaFairPolicy final : public Policy {
 public:
  static constexpr int kForgetAfterAbsentSteps = 16;
  static constexpr double kMinWeight = 0.001;
  static constexpr double kMaxWeight = 1e6;
  static constexpr std::uint64_t kMaxTenantId = 0xffffffffULL;
  static constexpr std::string_view kPoolType = "buffer-pool";
  static constexpr std::string_view kCacheType = "cache-reserve";

  DeltaFairPolicy() = default;
  std::string_view name() const noexcept override { return "delta-fair"; }
  Status configure(const nlohmann::json& config) override;
  PolicyOutput step(const PolicyInput& input) override;
  RulesBatch admit(const PolicyInput& input) override;
  nlohmann::json describe() const override;
  // The configuration and what follows from it now: fair shares and the
  // reservations ({"reservations": {"write_buffer": {...}, "cache": {...}}},
  // each when configured).
  nlohmann::json explain() const override;

  // The write buffer's reservation in force (with the R_write in use); empty
  // without a write buffer.
  delta_fair::Reservation reservation() const;
  // The R_write in use; 0 when measured and nothing measured yet.
  double flush_bandwidth() const noexcept { return bandwidth_; }

  // The cache's thresholds in force (with the R_read and AMP in use); empty
  // without a cache.
  delta_fair::CacheReservation cache_reservation() const;
  // The R_read and AMP in use; 0 when measured and nothing known yet.
  double refill_bandwidth() const noexcept { return refill_.value; }
  double read_amplification() const noexcept { return amplification_.value; }

 private:
  // A cache flow's counters at the last step, to take differences.
  struct FlowCounters {
    double misses = 0;
    double inserted_bytes = -1;  // -1: not reported
  };
  struct PoolMemory {
    nlohmann::json sent;  // the configuration last sent (null: never)
    bool present = false;
    std::map<std::uint64_t, FlowCounters> last;  // a cache's, by flow id
  };
  struct StageMemory {
    std::int64_t connected_at_ns = 0;
    int absent_steps = 0;
    std::map<std::string, PoolMemory> pools;   // by channel
    std::map<std::string, PoolMemory> caches;  // by channel
  };
  // An estimate that is configured or measured (R_read, AMP).
  struct Estimate {
    double value = 0;
    bool measured = false;       // "measured" in the configuration
    bool known = false;          // configured, given a starting value, or measured
    bool measured_once = false;  // a measurement replaced the starting value
    const char* source() const noexcept;
    void update(double sample, double smoothing) noexcept;
  };

  delta_fair::BufferModel model() const;
  nlohmann::json pool_config(const delta_fair::Reservation& r) const;
  void measure_bandwidth(const PolicyInput& input, nlohmann::json& estimate);
  nlohmann::json explain_buffer() const;

  // The read cache (delta_fair_cache.cc).
  delta_fair::CacheModel cache_model() const;
  nlohmann::json cache_config(const delta_fair::CacheReservation& r) const;
  nlohmann::json explain_cache() const;
  // R_read and AMP from this step's statistics, before the stage memory
  // moves on; the estimates' details into `refill` and `amplification`.
  void measure_cache(const PolicyInput& input, nlohmann::json& refill,
                     nlohmann::json& amplification);
  // Configures a stage's cache objects (rules appended to *rules), updates
  // its memory, reports its objects into *report and adds their flows'
  // counters to *flows (by flow id); an error into *error.
  void step_cache_stage(const StageView& st, StageMemory& mem, const nlohmann::json& desired,
                        nlohmann::json* rules, nlohmann::json* report, nlohmann::json* flows,
                        std::string* error);
  // The report's "cache" member.
  nlohmann::json cache_report(const delta_fair::CacheReservation& r, nlohmann::json flows,
                              nlohmann::json stages, nlohmann::json refill,
                              nlohmann::json amplification) const;

  DeltaFairConfig config_;
  double bandwidth_ = 0;          // R_write in use
  bool bandwidth_known_ = false;  // configured, given a starting value, or measured
  bool measured_once_ = false;    // a measurement replaced the starting value
  Estimate refill_;               // R_read
  Estimate amplification_;        // AMP
  std::map<std::string, StageMemory> stages_;
};

std::unique_ptr<Policy> make_delta_fair_policy();

inline void register_delta_fair_policy() {
  (void)register_policy("delta-fair", make_delta_fair_policy);
}

}  // namespace sluice
