// The drft object's configuration: parsing and checking
// (sluice/objects/drft.h).
#include <bit>
#include <charconv>
#include <cmath>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "sluice/objects/drft.h"
#include "sluice/wire.h"

namespace sluice {
namespace {

constexpr std::string_view kWeightPrefix = "weight_";

std::optional<std::uint64_t> integer_in(const nlohmann::json& v, std::uint64_t lo,
                                        std::uint64_t hi) {
  if (!v.is_number_integer()) return std::nullopt;
  if (!v.is_number_unsigned() && v.get<std::int64_t>() < 0) return std::nullopt;
  const auto n = v.get<std::uint64_t>();
  if (n < lo || n > hi) return std::nullopt;
  return n;
}

// A tenant id as a configuration writes it: a decimal integer without sign
// or leading zeros, up to 2^32 - 1.
std::optional<std::uint32_t> tenant_id(std::string_view s) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::uint32_t id = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), id);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return id;
}

Status bad_tenant(std::string_view field, std::string_view id) {
  return Status::invalid(std::string(field) +
                         ": a tenant is a decimal integer from 0 to 4294967295 without leading "
                         "zeros, got '" +
                         std::string(id) + "'");
}

Status drft_weight_of(const nlohmann::json& v, std::string_view field, double& out) {
  const double d = v.is_number() ? v.get<double>() : 0;
  if (!v.is_number() || !std::isfinite(d) || d < kDrftMinWeight || d > kDrftMaxWeight) {
    return Status::invalid(std::string(field) +
                           ": must be a number between 0.001 and 1000000, got " + wire::echo(v));
  }
  out = d;
  return {};
}

Status parse_into(const nlohmann::json& config, drft::Settings& s) {
  if (!config.is_object()) return Status::invalid("config: must be an object");
  for (const auto& [key, value] : config.items()) {
    if (key == "slots") {
      const auto n = integer_in(value, 1, kDrftMaxSlots);
      if (!n) {
        return Status::invalid("slots: must be an integer from 1 to 65536, got " +
                               wire::echo(value));
      }
      s.slots = static_cast<std::uint32_t>(*n);
    } else if (key == "delta_us") {
      const double d = value.is_number() ? value.get<double>() : -1;
      if (!value.is_number() || !std::isfinite(d) || d < 0 || d > kDrftMaxDeltaUs) {
        return Status::invalid("delta_us: must be a number of microseconds from 0 to 1e9, got " +
                               wire::echo(value));
      }
      s.delta_ns = d * 1e3;
    } else if (key == "policy") {
      if (!value.is_string() || (value != "drft" && value != "fifo")) {
        return Status::invalid("policy: must be \"drft\" or \"fifo\", got " + wire::echo(value));
      }
      s.fifo = value == "fifo";
    } else if (key == "default_weight") {
      SLUICE_RETURN_IF_ERROR(drft_weight_of(value, "default_weight", s.default_weight));
    } else if (key == "max_tenants") {
      const auto n = integer_in(value, 1, kDrftMaxTenants);
      if (!n) {
        return Status::invalid("max_tenants: must be an integer from 1 to 65536, got " +
                               wire::echo(value));
      }
      s.max_tenants = static_cast<std::uint32_t>(*n);
    } else if (key == "sketch_width") {
      const auto n = integer_in(value, 64, std::uint64_t{1} << 20);
      if (!n || !std::has_single_bit(*n)) {
        return Status::invalid("sketch_width: must be a power of two from 64 to 1048576, got " +
                               wire::echo(value));
      }
      s.sketch_width = static_cast<std::uint32_t>(*n);
    } else if (key == "sketch_depth") {
      const auto n = integer_in(value, 1, 8);
      if (!n) {
        return Status::invalid("sketch_depth: must be an integer from 1 to 8, got " +
                               wire::echo(value));
      }
      s.sketch_depth = static_cast<std::uint32_t>(*n);
    } else if (key == "hot_share") {
      const double d = value.is_number() ? value.get<double>() : -1;
      if (!value.is_number() || !std::isfinite(d) || d <= 0 || d > 1) {
        return Status::invalid("hot_share: must be a number in (0, 1], got " + wire::echo(value));
      }
      s.hot_share = d;
    } else if (key == "weights") {
      if (!value.is_object()) {
        return Status::invalid("weights: must be an object of tenant to weight, got " +
                               wire::echo(value));
      }
      for (const auto& [id_text, w] : value.items()) {
        const auto id = tenant_id(id_text);
        if (!id) return bad_tenant("weights", id_text);
        SLUICE_RETURN_IF_ERROR(drft_weight_of(w, "weights." + id_text, s.weights[*id]));
      }
    } else if (key.size() > kWeightPrefix.size() && key.starts_with(kWeightPrefix)) {
      const std::string_view id_text = std::string_view(key).substr(kWeightPrefix.size());
      const auto id = tenant_id(id_text);
      if (!id) return bad_tenant(key, id_text);
      SLUICE_RETURN_IF_ERROR(drft_weight_of(value, key, s.weights[*id]));
    } else {
      return Status::invalid("unknown field '" + key +
                             "' (expected slots, delta_us, policy, weights, weight_<tenant>, "
                             "default_weight, max_tenants, sketch_width, sketch_depth, "
                             "hot_share)");
    }
  }
  return {};
}

}  // namespace

StatusOr<drft::Settings> parse_drft_config(const nlohmann::json& config,
                                           const drft::Settings& base) {
  drft::Settings s = base;
  try {
    SLUICE_RETURN_IF_ERROR(parse_into(config, s));
  } catch (const std::exception& e) {  // nlohmann's type errors, should any slip through
    return Status::invalid(std::string("config: ") + e.what());
  }
  if (s.weights.size() > kDrftMaxTenants) {
    return Status::invalid("weights: at most 65536 tenants may have a weight of their own");
  }
  return s;
}

}  // namespace sluice
