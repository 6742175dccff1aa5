// The fq object's configuration: parsing and checking (sluice/objects/fq.h).
#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "sluice/objects/fq.h"
#include "sluice/wire.h"

namespace sluice {
namespace {

constexpr std::string_view kFlowByNames[] = {"tenant", "origin", "workflow", "op", "level"};
constexpr std::string_view kWeightPrefix = "weight_";

// A whole number within [lo, hi], or nothing.
std::optional<std::int64_t> integer_in(const nlohmann::json& v, std::int64_t lo, std::int64_t hi) {
  if (!v.is_number_integer()) return std::nullopt;
  if (v.is_number_unsigned() &&
      v.get<std::uint64_t>() > std::uint64_t{std::numeric_limits<std::int64_t>::max()}) {
    return std::nullopt;
  }
  const auto n = v.get<std::int64_t>();
  if (n < lo || n > hi) return std::nullopt;
  return n;
}

// A flow id as a configuration writes it: a decimal integer without sign or
// leading zeros (so that one flow has one spelling), up to 2^64 - 1.
std::optional<std::uint64_t> flow_id(std::string_view s) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::uint64_t id = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), id);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return id;
}

Status bad_flow_id(std::string_view field, std::string_view id) {
  return Status::invalid(std::string(field) +
                         ": a flow id is a decimal integer from 0 to 18446744073709551615 "
                         "without leading zeros, got '" +
                         std::string(id) + "'");
}

}  // namespace

Status check_fq_weight(double v, std::string_view field, const std::string& got) {
  if (!std::isfinite(v) || v < kFqMinWeight || v > kFqMaxWeight) {
    return Status::invalid(std::string(field) +
                           ": must be a number between 0.001 and 1000000, got " + got);
  }
  return {};
}

namespace {

Status weight_of(const nlohmann::json& v, std::string_view field, double& out) {
  if (!v.is_number()) {
    return Status::invalid(std::string(field) +
                           ": must be a number between 0.001 and 1000000, got " + wire::echo(v));
  }
  SLUICE_RETURN_IF_ERROR(check_fq_weight(v.get<double>(), field, wire::echo(v)));
  out = v.get<double>();
  return {};
}

Status parse_capacity(const nlohmann::json& v, FqConfig& c) {
  if (!v.is_object()) return Status::invalid("capacity: must be an object, got " + wire::echo(v));
  for (const auto& [key, value] : v.items()) {
    double* field = key == "read_bytes"    ? &c.read_bytes
                    : key == "write_bytes" ? &c.write_bytes
                    : key == "ops"         ? &c.ops
                                           : nullptr;
    if (field == nullptr) {
      return Status::invalid("capacity: unknown field '" + key +
                             "' (expected read_bytes, write_bytes, ops)");
    }
    const double d = value.is_number() ? value.get<double>() : -1;
    if (!std::isfinite(d) || (d != 0 && d < 1)) {
      return Status::invalid("capacity." + key +
                             ": must be a number >= 1, or 0 (not counted), got " +
                             wire::echo(value));
    }
    *field = d;
  }
  return {};
}

Status parse_into(const nlohmann::json& config, FqConfig& c, const FqConfig* base) {
  if (!config.is_object()) return Status::invalid("config: must be an object");
  for (const auto& [key, value] : config.items()) {
    if (key == "capacity") {
      SLUICE_RETURN_IF_ERROR(parse_capacity(value, c));
    } else if (key == "burst_us") {
      const auto n = integer_in(value, 1, kFqMaxBurstUs);
      if (!n) {
        return Status::invalid("burst_us: must be an integer from 1 to 1000000000, got " +
                               wire::echo(value));
      }
      c.burst_us = *n;
    } else if (key == "flow_by") {
      std::size_t i = 0;
      while (i < std::size(kFlowByNames) && !(value.is_string() && value == kFlowByNames[i])) ++i;
      if (i == std::size(kFlowByNames)) {
        return Status::invalid(
            "flow_by: must be \"tenant\", \"origin\", \"workflow\", \"op\" or \"level\", got " +
            wire::echo(value));
      }
      const auto by = static_cast<FqConfig::FlowBy>(i);
      if (base != nullptr && by != base->flow_by) {
        return Status::invalid("flow_by: cannot change once configured (it is \"" +
                               std::string(flow_by_name(base->flow_by)) +
                               "\"); create a new object instead");
      }
      c.flow_by = by;
    } else if (key == "default_weight") {
      SLUICE_RETURN_IF_ERROR(weight_of(value, "default_weight", c.default_weight));
    } else if (key == "max_flows") {
      const auto n = integer_in(value, 1, kFqMaxFlows);
      if (!n) {
        return Status::invalid("max_flows: must be an integer from 1 to 65536, got " +
                               wire::echo(value));
      }
      c.max_flows = static_cast<std::uint32_t>(*n);
    } else if (key == "weights") {
      if (!value.is_object()) {
        return Status::invalid("weights: must be an object of flow id to weight, got " +
                               wire::echo(value));
      }
      for (const auto& [id_text, w] : value.items()) {
        const auto id = flow_id(id_text);
        if (!id) return bad_flow_id("weights", id_text);
        SLUICE_RETURN_IF_ERROR(weight_of(w, "weights." + id_text, c.weights[*id]));
      }
    } else if (key.size() > kWeightPrefix.size() && key.starts_with(kWeightPrefix)) {
      const std::string_view id_text = std::string_view(key).substr(kWeightPrefix.size());
      const auto id = flow_id(id_text);
      if (!id) return bad_flow_id(key, id_text);
      SLUICE_RETURN_IF_ERROR(weight_of(value, key, c.weights[*id]));
    } else {
      return Status::invalid("unknown field '" + key + "'");
    }
  }
  return {};
}

}  // namespace

std::string_view flow_by_name(FqConfig::FlowBy by) noexcept {
  return by < std::size(kFlowByNames) ? kFlowByNames[by] : "?";
}

StatusOr<FqConfig> parse_fq_config(const nlohmann::json& config, const FqConfig* base) {
  FqConfig c = base ? *base : FqConfig{};
  try {
    SLUICE_RETURN_IF_ERROR(parse_into(config, c, base));
  } catch (const std::exception& e) {  // nlohmann's type errors, should any slip through
    return Status::invalid(std::string("config: ") + e.what());
  }
  if (!base && !config.contains("capacity")) {
    return Status::invalid("capacity: required (read_bytes, write_bytes and/or ops per second)");
  }
  if (c.read_bytes <= 0 && c.write_bytes <= 0 && c.ops <= 0) {
    return Status::invalid("capacity: at least one of read_bytes, write_bytes and ops must be > 0");
  }
  if (c.weights.size() > kFqMaxWeights) {
    return Status::invalid("weights: at most 65536 flows may have a weight of their own");
  }
  return c;
}

}  // namespace sluice
