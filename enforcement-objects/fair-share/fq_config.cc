// The fq object's configuration: parsing and checking (sluice/objects/fq.h).
#include <cmath>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "config_fields.h"
#include "sluice/objects/fq.h"
#include "sluice/wire.h"

namespace sluice {
namespace {

using detail::flow_by_of;
using detail::flow_weights;
using detail::weight_of;

constexpr std::string_view kFqFlowBy[] = {"tenant", "origin", "workflow", "op", "level"};
static_assert(kFqMinWeight == detail::kMinFlowWeight && kFqMaxWeight == detail::kMaxFlowWeight);

}  // namespace

Status check_fq_weight(double v, std::string_view field, const std::string& got) {
  return detail::check_weight(v, field, got);
}

namespace {

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
      const auto n = detail::unsigned_in(value, 1, kFqMaxBurstUs);
      if (!n) {
        return Status::invalid("burst_us: must be an integer from 1 to 1000000000, got " +
                               wire::echo(value));
      }
      c.burst_us = static_cast<decltype(c.burst_us)>(*n);
    } else if (key == "flow_by") {
      std::size_t by = 0;
      SLUICE_RETURN_IF_ERROR(flow_by_of(
          value, kFqFlowBy, base ? std::optional<std::size_t>(base->flow_by) : std::nullopt, by));
      c.flow_by = static_cast<FqConfig::FlowBy>(by);
    } else if (key == "default_weight") {
      SLUICE_RETURN_IF_ERROR(weight_of(value, "default_weight", c.default_weight));
    } else if (key == "max_flows") {
      const auto n = detail::unsigned_in(value, 1, kFqMaxFlows);
      if (!n) {
        return Status::invalid("max_flows: must be an integer from 1 to 65536, got " +
                               wire::echo(value));
      }
      c.max_flows = static_cast<std::uint32_t>(*n);
    } else if (auto w = flow_weights(key, value, c.weights)) {
      SLUICE_RETURN_IF_ERROR(*w);
    } else {
      return Status::invalid("unknown field '" + key + "'");
    }
  }
  return {};
}

}  // namespace

std::string_view flow_by_name(FqConfig::FlowBy by) noexcept {
  return by < std::size(kFqFlowBy) ? kFqFlowBy[by] : "?";
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
