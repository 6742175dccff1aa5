// The cache-reserve object's configuration: parsing and checking
// (sluice/objects/cache_reserve.h).
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "config_fields.h"
#include "sluice/objects/cache_reserve.h"
#include "sluice/wire.h"

namespace sluice {
namespace {

using detail::bad_flow_id;
using detail::flow_by_of;
using detail::flow_id;
using detail::flow_weights;
using detail::suffix_of;
using detail::weight_of;

constexpr std::string_view kFlowBy[] = {"tenant", "workflow", "origin"};
static_assert(kCacheReserveMinWeight == detail::kMinFlowWeight &&
              kCacheReserveMaxWeight == detail::kMaxFlowWeight);

// Bytes: a whole number within [lo, kCacheReserveMaxCapacity].
std::optional<std::uint64_t> bytes_of(const nlohmann::json& v, std::uint64_t lo) {
  return detail::unsigned_in(v, lo, kCacheReserveMaxCapacity);
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
    } else if (key == "reserved") {
      if (!value.is_object()) {
        return Status::invalid("reserved: must be an object of flow id to bytes, got " +
                               wire::echo(value));
      }
      for (const auto& [text, v] : value.items()) {
        const auto id = flow_id(text);
        if (!id) return bad_flow_id(key, text);
        SLUICE_RETURN_IF_ERROR(reserved_of(v, key + "." + text, c.reserved[*id]));
      }
    } else if (auto r = suffix_of(key, "reserved_")) {
      const auto id = flow_id(*r);
      if (!id) return bad_flow_id(key, *r);
      SLUICE_RETURN_IF_ERROR(reserved_of(value, key, c.reserved[*id]));
    } else if (auto w = flow_weights(key, value, c.weights)) {
      SLUICE_RETURN_IF_ERROR(*w);
    } else if (key == "default_weight") {
      SLUICE_RETURN_IF_ERROR(weight_of(value, key, c.default_weight));
    } else if (key == "flow_by") {
      std::size_t by = 0;
      SLUICE_RETURN_IF_ERROR(flow_by_of(
          value, kFlowBy, base ? std::optional<std::size_t>(base->flow_by) : std::nullopt, by));
      c.flow_by = static_cast<CacheReserveConfig::FlowBy>(by);
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
