// The buffer-pool object's configuration: parsing and checking
// (sluice/objects/buffer_pool.h).
#include <charconv>
#include <cmath>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "sluice/objects/buffer_pool.h"
#include "sluice/wire.h"

namespace sluice {
namespace {

constexpr std::string_view kFlowByNames[] = {"tenant", "workflow", "origin"};
constexpr std::string_view kWeightPrefix = "weight_";

// A whole number within [lo, hi], or nothing.
std::optional<std::uint64_t> integer_in(const nlohmann::json& v, std::uint64_t lo,
                                        std::uint64_t hi) {
  if (!v.is_number_integer()) return std::nullopt;
  if (!v.is_number_unsigned() && v.get<std::int64_t>() < 0) return std::nullopt;
  const auto n = v.get<std::uint64_t>();
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

Status weight_of(const nlohmann::json& v, std::string_view field, double& out) {
  const double d = v.is_number() ? v.get<double>() : 0;
  if (!v.is_number() || !std::isfinite(d) || d < kBufferPoolMinWeight || d > kBufferPoolMaxWeight) {
    return Status::invalid(std::string(field) +
                           ": must be a number between 0.001 and 1000000, got " + wire::echo(v));
  }
  out = d;
  return {};
}

Status parse_into(const nlohmann::json& config, BufferPoolConfig& c, const BufferPoolConfig* base) {
  if (!config.is_object()) return Status::invalid("config: must be an object");
  for (const auto& [key, value] : config.items()) {
    if (key == "capacity") {
      const auto n = integer_in(value, 1, kBufferPoolMaxCapacity);
      if (!n) {
        return Status::invalid("capacity: must be an integer number of bytes from 1 to " +
                               std::to_string(kBufferPoolMaxCapacity) + ", got " +
                               wire::echo(value));
      }
      c.capacity = *n;
    } else if (key == "reserved") {
      const auto n = integer_in(value, 0, kBufferPoolMaxCapacity);
      if (!n) {
        return Status::invalid(
            "reserved: must be an integer number of bytes from 0 to capacity, got " +
            wire::echo(value));
      }
      c.reserved = *n;
    } else if (key == "flow_by") {
      std::size_t i = 0;
      while (i < std::size(kFlowByNames) && !(value.is_string() && value == kFlowByNames[i])) ++i;
      if (i == std::size(kFlowByNames)) {
        return Status::invalid("flow_by: must be \"tenant\", \"workflow\" or \"origin\", got " +
                               wire::echo(value));
      }
      const auto by = static_cast<BufferPoolConfig::FlowBy>(i);
      if (base != nullptr && by != base->flow_by) {
        return Status::invalid("flow_by: cannot change once configured (it is \"" +
                               std::string(buffer_pool_flow_by_name(base->flow_by)) +
                               "\"); create a new object instead");
      }
      c.flow_by = by;
    } else if (key == "default_weight") {
      SLUICE_RETURN_IF_ERROR(weight_of(value, "default_weight", c.default_weight));
    } else if (key == "max_flows") {
      const auto n = integer_in(value, 1, kBufferPoolMaxFlows);
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
      return Status::invalid(
          "unknown field '" + key +
          "' (expected capacity, reserved, flow_by, weights, weight_<id>, default_weight, "
          "max_flows)");
    }
  }
  return {};
}

}  // namespace

std::string_view buffer_pool_flow_by_name(BufferPoolConfig::FlowBy by) noexcept {
  return by < std::size(kFlowByNames) ? kFlowByNames[by] : "?";
}

StatusOr<BufferPoolConfig> parse_buffer_pool_config(const nlohmann::json& config,
                                                    const BufferPoolConfig* base) {
  BufferPoolConfig c = base ? *base : BufferPoolConfig{};
  try {
    SLUICE_RETURN_IF_ERROR(parse_into(config, c, base));
  } catch (const std::exception& e) {  // nlohmann's type errors, should any slip through
    return Status::invalid(std::string("config: ") + e.what());
  }
  if (!base && !config.contains("capacity")) {
    return Status::invalid("capacity: required (the pool's size in bytes)");
  }
  if (c.reserved > c.capacity) {
    // The field this change gave: a smaller capacity, or a larger reservation.
    if (config.contains("reserved")) {
      return Status::invalid("reserved: must be at most capacity (" + std::to_string(c.capacity) +
                             "), got " + std::to_string(c.reserved));
    }
    return Status::invalid("capacity: must be at least reserved (" + std::to_string(c.reserved) +
                           "), got " + std::to_string(c.capacity));
  }
  if (c.weights.size() > kBufferPoolMaxFlows) {
    return Status::invalid("weights: at most 65536 flows may have a weight of their own");
  }
  return c;
}

}  // namespace sluice
