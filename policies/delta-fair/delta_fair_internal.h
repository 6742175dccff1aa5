// Pieces the delta-fair policy's files share (delta_fair.cc, the write
// buffer; delta_fair_cache.cc, the read cache; delta_fair_config.cc, the
// configuration): reading the objects a stage holds and their collected
// state, and building configure rules. Internal to sluice::policies.
//
// Thread safety: pure functions of the values passed in.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/policy.h"
#include "sluice/status.h"

namespace sluice::delta_fair_detail {

// A time in ms for a report: null when unbounded.
inline nlohmann::json ms_json(double ms) {
  return std::isfinite(ms) ? nlohmann::json(ms) : nlohmann::json(nullptr);
}

// δ for a report or a description: the number, or "inf".
inline nlohmann::json delta_json(double ms) {
  return std::isinf(ms) ? nlohmann::json("inf") : nlohmann::json(ms);
}

// j[key] as a whole number of bytes >= min into *out; `required` when absent
// is an error naming the field (path.key).
Status get_bytes(const nlohmann::json& j, const std::string& path, std::string_view key,
                 std::uint64_t* out, std::uint64_t min, bool required);

// j[key] as δ: a number of ms >= 0, or "inf" (+infinity); required.
Status get_delta(const nlohmann::json& j, const std::string& path, double* out);

// A flow entry's id: a non-negative integer, or decimal digits.
bool flow_id(const nlohmann::json& flow, std::uint64_t* out);

// j[field] when it is a number, else 0.
double number_of(const nlohmann::json& j, const char* field);

// The objects named `object` a stage holds: by channel, with their
// statistics when the stage reported them (its description alone names the
// others).
struct Pool {
  std::string channel;
  std::string type;
  const ObjectStats* stats = nullptr;
};
std::vector<Pool> pools_of(const StageView& st, const std::string& object);

// {"rule": "configure", "channel", "object", "config"} for each channel.
void append_configure(nlohmann::json* rules, const std::string& object,
                      const std::vector<std::string>& channels, const nlohmann::json& config);

// A rules batch of these rules.
inline nlohmann::json rules_batch(nlohmann::json rules) {
  return {{"version", 1}, {"rules", std::move(rules)}};
}

// The error a stage gets for an object of another type than the policy
// configures.
std::string wrong_type(const std::string& object, const Pool& p, std::string_view want);

}  // namespace sluice::delta_fair_detail
