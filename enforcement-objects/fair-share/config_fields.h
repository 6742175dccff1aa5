// Fields the fair-sharing objects' configurations share, parsed and checked one way, on
// top of the field reader (sluice/config_reader.h): flow ids as keys ("weights": {"7": 2},
// "weight_7": 2), weights, and the choice of the classifier that names a flow
// ("flow_by"). Every error names the field as the user wrote it.
//
// Thread safety: pure functions.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "sluice/config_reader.h"
#include "sluice/status.h"
#include "sluice/wire.h"

namespace sluice::detail {

using config::unsigned_in;

// The weights every object accepts (the same range in fq, buffer-pool, cache-reserve).
inline constexpr double kMinFlowWeight = 0.001;
inline constexpr double kMaxFlowWeight = 1e6;

// A flow id as a configuration writes it: a decimal integer without sign or leading zeros
// (so that one flow has one spelling), up to 2^64 - 1.
inline std::optional<std::uint64_t> flow_id(std::string_view s) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::uint64_t id = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), id);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return id;
}

inline Status bad_flow_id(std::string_view field, std::string_view id) {
  return Status::invalid(std::string(field) +
                         ": a flow id is a decimal integer from 0 to 18446744073709551615 "
                         "without leading zeros, got '" +
                         std::string(id) + "'");
}

// `key` = `prefix` + something ("weight_7"): the something, or nothing.
inline std::optional<std::string_view> suffix_of(std::string_view key, std::string_view prefix) {
  if (key.size() <= prefix.size() || !key.starts_with(prefix)) return std::nullopt;
  return key.substr(prefix.size());
}

inline Status check_weight(double v, std::string_view field, const std::string& got) {
  if (!std::isfinite(v) || v < kMinFlowWeight || v > kMaxFlowWeight) {
    return Status::invalid(std::string(field) +
                           ": must be a number between 0.001 and 1000000, got " + got);
  }
  return {};
}

inline Status weight_of(const nlohmann::json& v, std::string_view field, double& out) {
  const double d = v.is_number() ? v.get<double>() : 0;
  SLUICE_RETURN_IF_ERROR(check_weight(d, field, wire::echo(v)));
  out = d;
  return {};
}

// "weights" (an object of flow id to weight) or "weight_<id>": parsed into `weights` (a
// map of flow id to weight). Returns nothing when `key` is neither, so the caller goes on
// matching it.
template <typename Map>
std::optional<Status> flow_weights(const std::string& key, const nlohmann::json& value,
                                   Map& weights) {
  if (key == "weights") {
    if (!value.is_object()) {
      return Status::invalid("weights: must be an object of flow id to weight, got " +
                             wire::echo(value));
    }
    for (const auto& [text, w] : value.items()) {
      const auto id = flow_id(text);
      if (!id) return bad_flow_id("weights", text);
      if (Status s = weight_of(w, "weights." + text, weights[*id]); !s.is_ok()) return s;
    }
    return Status{};
  }
  if (const auto text = suffix_of(key, "weight_")) {
    const auto id = flow_id(*text);
    if (!id) return bad_flow_id(key, *text);
    return weight_of(value, key, weights[*id]);
  }
  return std::nullopt;
}

// "flow_by": one of `names` (its index into them, the object's FlowBy value). Once an
// object is configured (`current` set), its flow_by cannot change.
inline Status flow_by_of(const nlohmann::json& value, std::span<const std::string_view> names,
                         std::optional<std::size_t> current, std::size_t& out) {
  std::size_t i = 0;
  while (i < names.size() && !(value.is_string() && value.get<std::string>() == names[i])) ++i;
  if (i == names.size()) {
    std::string list;
    for (std::size_t k = 0; k < names.size(); ++k) {
      list += (k == 0 ? "" : k + 1 == names.size() ? " or " : ", ");
      list += "\"" + std::string(names[k]) + "\"";
    }
    return Status::invalid("flow_by: must be " + list + ", got " + wire::echo(value));
  }
  if (current && *current != i) {
    return Status::invalid("flow_by: cannot change once configured (it is \"" +
                           std::string(names[*current]) + "\"); create a new object instead");
  }
  out = i;
  return {};
}

}  // namespace sluice::detail
