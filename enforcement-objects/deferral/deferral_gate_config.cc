// The deferral-gate object's configuration: parsing and checking
// (sluice/objects/deferral_gate.h).
#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "sluice/objects/deferral_gate.h"
#include "sluice/wire.h"

namespace sluice {
namespace {

constexpr std::string_view kFields[] = {"hold_ms", "partitions", "growth_cap_bytes", "log_size",
                                        "decide"};

bool integer_in(const nlohmann::json& v, std::uint64_t lo, std::uint64_t hi, std::uint64_t* out) {
  if (!v.is_number_integer()) return false;
  if (!v.is_number_unsigned() && v.get<std::int64_t>() < 0) return false;
  const auto n = v.get<std::uint64_t>();
  if (n < lo || n > hi) return false;
  *out = n;
  return true;
}

Status bad_integer(std::string_view field, std::uint64_t lo, std::uint64_t hi,
                   const nlohmann::json& v) {
  return Status::invalid(std::string(field) + ": must be an integer from " + std::to_string(lo) +
                         " to " + std::to_string(hi) + ", got " + wire::echo(v));
}

constexpr std::size_t kMaxKey = 256;

bool good_key(std::string_view k) {
  return !k.empty() && k.size() <= kMaxKey;
}

}  // namespace

bool DeferralGateConfig::may_defer(std::string_view partition) const {
  return any_partition || partitions.find(partition) != partitions.end();
}

StatusOr<DeferralGateConfig> parse_deferral_gate_config(const nlohmann::json& config,
                                                        const DeferralGateConfig& base,
                                                        std::vector<DeferralDecision>* decisions) {
  if (!config.is_object()) return Status::invalid("config: must be an object");
  for (const auto& [key, v] : config.items()) {
    if (std::find(std::begin(kFields), std::end(kFields), key) == std::end(kFields)) {
      return Status::invalid(key +
                             ": unknown field (known: hold_ms, partitions, growth_cap_bytes, "
                             "log_size, decide)");
    }
  }
  DeferralGateConfig c = base;
  std::uint64_t n = 0;
  if (auto it = config.find("hold_ms"); it != config.end()) {
    if (!integer_in(*it, 1, kDeferralMaxHoldMs, &n))
      return bad_integer("hold_ms", 1, kDeferralMaxHoldMs, *it);
    c.hold_ms = static_cast<std::int64_t>(n);
  }
  if (auto it = config.find("growth_cap_bytes"); it != config.end()) {
    if (!integer_in(*it, 0, kDeferralMaxGrowthCap, &n))
      return bad_integer("growth_cap_bytes", 0, kDeferralMaxGrowthCap, *it);
    c.growth_cap_bytes = n;
  }
  if (auto it = config.find("log_size"); it != config.end()) {
    if (!integer_in(*it, 1, kDeferralMaxLogSize, &n))
      return bad_integer("log_size", 1, kDeferralMaxLogSize, *it);
    c.log_size = static_cast<std::uint32_t>(n);
  }
  if (auto it = config.find("partitions"); it != config.end()) {
    if (it->is_null()) {
      c.any_partition = true;
      c.partitions.clear();
    } else if (!it->is_array()) {
      return Status::invalid("partitions: must be an array of partition names, or null, got " +
                             wire::echo(*it));
    } else {
      std::set<std::string, std::less<>> list;
      for (std::size_t i = 0; i < it->size(); ++i) {
        const auto& e = (*it)[i];
        if (!e.is_string() || !good_key(e.get_ref<const std::string&>())) {
          return Status::invalid("partitions[" + std::to_string(i) +
                                 "]: must be a non-empty string of at most 256 bytes, got " +
                                 wire::echo(e));
        }
        list.insert(e.get<std::string>());
      }
      c.any_partition = false;
      c.partitions = std::move(list);
    }
  }
  if (auto it = config.find("decide"); it != config.end()) {
    if (!it->is_object()) {
      return Status::invalid(
          "decide: must be an object of partition -> \"first-stage\" | \"second-stage\" | "
          "\"resume\", got " +
          wire::echo(*it));
    }
    for (const auto& [key, v] : it->items()) {
      const std::string f = "decide." + key;
      if (!good_key(key)) return Status::invalid(f + ": a partition name is 1 to 256 bytes");
      std::optional<DeferralState> want;
      if (v.is_string()) {
        const auto& s = v.get_ref<const std::string&>();
        if (s == "resume") want = DeferralState::kNormal;
        if (s == "first-stage") want = DeferralState::kFirstStage;
        if (s == "second-stage") want = DeferralState::kSecondStage;
      }
      if (!want) {
        return Status::invalid(
            f + ": must be \"first-stage\", \"second-stage\" or \"resume\", got " + wire::echo(v));
      }
      if (*want != DeferralState::kNormal && !c.may_defer(key))
        return Status::invalid(f + ": this partition may not be deferred (not in partitions)");
      if (decisions != nullptr) decisions->push_back({key, *want});
    }
  }
  return c;
}

}  // namespace sluice
