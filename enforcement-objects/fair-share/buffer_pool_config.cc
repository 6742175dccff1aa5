// The buffer-pool object's configuration: parsing and checking
// (sluice/objects/buffer_pool.h).
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "config_fields.h"
#include "sluice/objects/buffer_pool.h"
#include "sluice/wire.h"

namespace sluice {
namespace {

using detail::flow_by_of;
using detail::flow_weights;
using detail::unsigned_in;
using detail::weight_of;

constexpr std::string_view kPoolFlowBy[] = {"tenant", "workflow", "origin"};
static_assert(kBufferPoolMinWeight == detail::kMinFlowWeight &&
              kBufferPoolMaxWeight == detail::kMaxFlowWeight);

Status parse_into(const nlohmann::json& config, BufferPoolConfig& c, const BufferPoolConfig* base) {
  if (!config.is_object()) return Status::invalid("config: must be an object");
  for (const auto& [key, value] : config.items()) {
    if (key == "capacity") {
      const auto n = unsigned_in(value, 1, kBufferPoolMaxCapacity);
      if (!n) {
        return Status::invalid("capacity: must be an integer number of bytes from 1 to " +
                               std::to_string(kBufferPoolMaxCapacity) + ", got " +
                               wire::echo(value));
      }
      c.capacity = *n;
    } else if (key == "reserved") {
      const auto n = unsigned_in(value, 0, kBufferPoolMaxCapacity);
      if (!n) {
        return Status::invalid(
            "reserved: must be an integer number of bytes from 0 to capacity, got " +
            wire::echo(value));
      }
      c.reserved = *n;
    } else if (key == "flow_by") {
      std::size_t by = 0;
      SLUICE_RETURN_IF_ERROR(flow_by_of(
          value, kPoolFlowBy, base ? std::optional<std::size_t>(base->flow_by) : std::nullopt, by));
      c.flow_by = static_cast<BufferPoolConfig::FlowBy>(by);
    } else if (key == "default_weight") {
      SLUICE_RETURN_IF_ERROR(weight_of(value, "default_weight", c.default_weight));
    } else if (key == "max_flows") {
      const auto n = unsigned_in(value, 1, kBufferPoolMaxFlows);
      if (!n) {
        return Status::invalid("max_flows: must be an integer from 1 to 65536, got " +
                               wire::echo(value));
      }
      c.max_flows = static_cast<std::uint32_t>(*n);
    } else if (auto w = flow_weights(key, value, c.weights)) {
      SLUICE_RETURN_IF_ERROR(*w);
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
  return by < std::size(kPoolFlowBy) ? kPoolFlowBy[by] : "?";
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
