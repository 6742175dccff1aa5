// The cache-reserve object's configuration: parsing and checking
// (sluice/objects/cache_reserve.h).
#include <charconv>
#include <cmath>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "sluice/objects/cache_reserve.h"
#include "sluice/wire.h"

namespace sluice {
namespace {

constexpr std::string_view kFlowBy[] = {"tenant", "workflow", "origin"};

// Bytes: a non-negative integer within [lo, kCacheReserveMaxCapacity].
std::optional<std::uint64_t> bytes_of(const nlohmann::json& v, std::uint64_t lo) {
  if (v.is_number_unsigned()) {
    const auto n = v.get<std::uint64_t>();
    if (n >= lo && n <= kCacheReserveMaxCapacity) return n;
  } else if (v.is_number_integer() && v.get<std::int64_t>() >= 0) {
    const auto n = static_cast<std::uint64_t>(v.get<std::int64_t>());
    if (n >= lo && n <= kCacheReserveMaxCapacity) return n;
  }
  return std::nullopt;
}

// A flow id as written in a configuration's keys: decimal, no sign, no
// leading zero (one spelling per flow).
std::optional<std::uint64_t> parse_flow_id(std::string_view s) {
  if (s.empty() || (s[0] == '0' && s.size() != 1)) return std::nullopt;
  std::uint64_t id = 0;
  const char* end = s.data() + s.size();
  const auto r = std::from_chars(s.data(), end, id);
  if (r.ec != std::errc() || r.ptr != end) return std::nullopt;
  return id;
}

Status flow_id_error(std::string_view field, std::string_view text) {
  return Status::invalid(std::string(field) + ": '" + std::string(text) +
                         "' is not a flow id (a decimal integer from 0 to "
                         "18446744073709551615, no sign or leading zeros)");
}

Status reserved_of(const nlohmann::json& v, const std::string& field, std::uint64_t& out) {
  const auto n = bytes_of(v, 0);
  if (!n) {
    return Status::invalid(field + ": must be an integer number of bytes from 0 to capacity, got " +
                           wire::echo(v));
  }
  out = *n;
  return {};
}

Status weight_of(const nlohmann::json& v, const std::string& field, double& out) {
  if (v.is_number()) {
    const double w = v.get<double>();
    if (std::isfinite(w) && w >= kCacheReserveMinWeight && w <= kCacheReserveMaxWeight) {
      out = w;
      return {};
    }
  }
  return Status::invalid(field + ": must be a number between 0.001 and 1000000, got " +
                         wire::echo(v));
}

// `prefix` + id keys ("reserved_7", "weight_7"): the id, or nothing if
// `key` is not of that form.
std::optional<std::string_view> suffix_id(const std::string& key, std::string_view prefix) {
  if (key.size() <= prefix.size() || !key.starts_with(prefix)) return std::nullopt;
  return std::string_view(key).substr(prefix.size());
}

Status parse_fields(const nlohmann::json& config, CacheReserveConfig& c,
                    const CacheReserveConfig* base) {
  if (!config.is_object()) return Status::invalid("config: must be an object");
  for (const auto& [key, value] : config.items()) {
    if (key == "capacity") {
      const auto n = bytes_of(value, 1);
      if (!n) {
        return Status::invalid("capacity: must be an integer number of bytes from 1 to " +
                               std::to_string(kCacheReserveMaxCapacity) + ", got " +
                               wire::echo(value));
      }
      c.capacity = *n;
    } else if (key == "reserved" || key == "weights") {
      if (!value.is_object()) {
        return Status::invalid(key + ": must be an object of flow id to " +
                               (key == "reserved" ? "bytes" : "weight") + ", got " +
                               wire::echo(value));
      }
      for (const auto& [text, v] : value.items()) {
        const auto id = parse_flow_id(text);
        if (!id) return flow_id_error(key, text);
        const std::string field = key + "." + text;
        SLUICE_RETURN_IF_ERROR(key == "reserved" ? reserved_of(v, field, c.reserved[*id])
                                                 : weight_of(v, field, c.weights[*id]));
      }
    } else if (auto r = suffix_id(key, "reserved_")) {
      const auto id = parse_flow_id(*r);
      if (!id) return flow_id_error(key, *r);
      SLUICE_RETURN_IF_ERROR(reserved_of(value, key, c.reserved[*id]));
    } else if (auto w = suffix_id(key, "weight_")) {
      const auto id = parse_flow_id(*w);
      if (!id) return flow_id_error(key, *w);
      SLUICE_RETURN_IF_ERROR(weight_of(value, key, c.weights[*id]));
    } else if (key == "default_weight") {
      SLUICE_RETURN_IF_ERROR(weight_of(value, key, c.default_weight));
    } else if (key == "flow_by") {
      std::size_t i = 0;
      for (; i < std::size(kFlowBy); ++i) {
        if (value.is_string() && value.get<std::string>() == kFlowBy[i]) break;
      }
      if (i == std::size(kFlowBy)) {
        return Status::invalid("flow_by: must be \"tenant\", \"workflow\" or \"origin\", got " +
                               wire::echo(value));
      }
      const auto by = static_cast<CacheReserveConfig::FlowBy>(i);
      if (base != nullptr && base->flow_by != by) {
        return Status::invalid("flow_by: is \"" + std::string(kFlowBy[base->flow_by]) +
                               "\" and cannot change; create a new object instead");
      }
      c.flow_by = by;
    } else if (key == "max_flows") {
      const auto n = bytes_of(value, 1);
      if (!n || *n > kCacheReserveMaxFlows) {
        return Status::invalid("max_flows: must be an integer from 1 to 65536, got " +
                               wire::echo(value));
      }
      c.max_flows = static_cast<std::uint32_t>(*n);
    } else {
      return Status::invalid("unknown field '" + key +
                             "' (expected capacity, reserved, reserved_<id>, weights, "
                             "weight_<id>, default_weight, flow_by, max_flows)");
    }
  }
  return {};
}

}  // namespace

std::uint64_t CacheReserveConfig::reserved_sum() const noexcept {
  std::uint64_t sum = 0;
  for (const auto& [id, bytes] : reserved) sum += bytes;  // checked: at most the capacity
  return sum;
}

StatusOr<CacheReserveConfig> parse_cache_reserve_config(const nlohmann::json& config,
                                                        const CacheReserveConfig* base) {
  CacheReserveConfig c = base != nullptr ? *base : CacheReserveConfig{};
  try {
    SLUICE_RETURN_IF_ERROR(parse_fields(config, c, base));
  } catch (const std::exception& e) {  // a type error nlohmann found before we did
    return Status::invalid(std::string("config: ") + e.what());
  }
  if (base == nullptr && !config.contains("capacity")) {
    return Status::invalid("capacity: required (the cache's size in bytes)");
  }
  if (c.reserved.size() > kCacheReserveMaxFlows || c.weights.size() > kCacheReserveMaxFlows) {
    return Status::invalid(
        std::string(c.reserved.size() > kCacheReserveMaxFlows ? "reserved" : "weights") +
        ": at most 65536 flows may be named");
  }
  // Summed up to the capacity only: no overflow.
  std::uint64_t sum = 0;
  bool over = false;
  for (const auto& [id, bytes] : c.reserved) {
    if (bytes > c.capacity - sum) {
      over = true;
      break;
    }
    sum += bytes;
  }
  if (over) {
    // The field this change gave: a smaller capacity, or more reserved.
    bool names_reserved = false;
    for (const auto& [key, value] : config.items()) {
      names_reserved = names_reserved || key.starts_with("reserved");
    }
    if (!names_reserved) {
      return Status::invalid("capacity: must be at least the reservations' sum, got " +
                             std::to_string(c.capacity));
    }
    return Status::invalid("reserved: the reservations sum to more than capacity (" +
                           std::to_string(c.capacity) + " bytes)");
  }
  return c;
}

}  // namespace sluice
