// The delta-fair policy's configuration: parsing, validation and its
// description (delta_fair.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "delta_fair.h"
#include "delta_fair_internal.h"
#include "sluice/config_reader.h"

namespace sluice {

namespace delta_fair_detail {

using config::join_path;
using config::shown;
using nlohmann::json;

// The largest capacity the policy hands out: what the buffer-pool and
// cache-reserve objects take (2^62 bytes), so that a document the policy
// accepts is one every stage accepts.
constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 62;

Status get_bytes(const json& j, const std::string& path, std::string_view key, std::uint64_t* out,
                 std::uint64_t min, bool required) {
  auto it = j.find(key);
  const std::string f = join_path(path, key);
  if (it == j.end()) return required ? Status::invalid(f + ": required") : Status::ok();
  const bool whole =
      it->is_number_unsigned() || (it->is_number_integer() && it->get<std::int64_t>() >= 0);
  if (!whole || it->get<std::uint64_t>() < min || it->get<std::uint64_t>() > kMaxBytes) {
    return Status::invalid(f + ": must be an integer number of bytes from " + std::to_string(min) +
                           " to 2^62, got " + shown(*it));
  }
  *out = it->get<std::uint64_t>();
  return Status::ok();
}

Status get_delta(const json& j, const std::string& path, double* out) {
  auto delta = j.find("delta_ms");
  const std::string f = join_path(path, "delta_ms");
  if (delta == j.end()) return Status::invalid(f + ": required (ms, or \"inf\")");
  if (delta->is_string() && delta->get_ref<const std::string&>() == "inf") {
    *out = std::numeric_limits<double>::infinity();
    return Status::ok();
  }
  if (!delta->is_number()) {
    return Status::invalid(f + ": must be a number of ms >= 0 or \"inf\", got " + delta->dump());
  }
  return config::get_number(j, path, "delta_ms", out, 0, true);
}

}  // namespace delta_fair_detail

namespace {

using nlohmann::json;
using namespace config;             // NOLINT(google-build-using-namespace)
using namespace delta_fair_detail;  // NOLINT(google-build-using-namespace)

constexpr std::size_t kMaxTenants = 65536;
constexpr int kMaxK = 65536;

Status parse_tenants(const json& j, std::vector<DeltaFairTenant>* out) {
  auto it = j.find("tenants");
  if (it == j.end()) return Status::invalid("tenants: required (a list of {name, weight, id})");
  if (!it->is_array() || it->empty() || it->size() > kMaxTenants) {
    return Status::invalid("tenants: must be a list of 1.." + std::to_string(kMaxTenants) +
                           " tenants {\"name\", \"weight\", \"id\"}, got " + it->dump());
  }
  std::set<std::string> names;
  std::set<std::uint64_t> ids;
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const std::string path = "tenants[" + std::to_string(i) + "]";
    SLUICE_RETURN_IF_ERROR(check_keys(t, path, {"name", "weight", "id"}));
    DeltaFairTenant tenant;
    tenant.id = i + 1;
    auto name = t.find("name");
    if (name == t.end()) return Status::invalid(path + ".name: required");
    SLUICE_RETURN_IF_ERROR(get_name(*name, path + ".name", &tenant.name));
    SLUICE_RETURN_IF_ERROR(get_number(t, path, "weight", &tenant.weight,
                                      DeltaFairPolicy::kMinWeight, true,
                                      DeltaFairPolicy::kMaxWeight));
    if (auto id = t.find("id"); id != t.end()) {
      const bool whole =
          id->is_number_unsigned() || (id->is_number_integer() && id->get<std::int64_t>() >= 0);
      if (!whole || id->get<std::uint64_t>() > DeltaFairPolicy::kMaxTenantId) {
        return Status::invalid(
            path + ".id: must be a tenant id, an integer in 0..4294967295, got " + id->dump());
      }
      tenant.id = id->get<std::uint64_t>();
    }
    if (!names.insert(tenant.name).second) {
      return Status::invalid(path + ".name: '" + tenant.name + "' names another tenant too");
    }
    if (!ids.insert(tenant.id).second) {
      return Status::invalid(path + ".id: " + std::to_string(tenant.id) +
                             " is another tenant's id too (an absent id is the position + 1)");
    }
    out->push_back(std::move(tenant));
  }
  return Status::ok();
}

Status parse_buffer(const json& w, DeltaFairBuffer* b) {
  const std::string p = "write_buffer";
  SLUICE_RETURN_IF_ERROR(
      check_keys(w, p,
                 {"capacity", "segment", "flush_bandwidth", "flush_bandwidth_initial",
                  "flush_smoothing", "flush_origin", "delta_ms", "object", "rounding"}));
  SLUICE_RETURN_IF_ERROR(get_bytes(w, p, "capacity", &b->capacity, 1, true));
  SLUICE_RETURN_IF_ERROR(get_bytes(w, p, "segment", &b->segment, 1, true));
  if (b->segment > b->capacity) {
    return Status::invalid("write_buffer.segment: must be <= capacity (" +
                           std::to_string(b->capacity) + "), got " + std::to_string(b->segment));
  }
  auto bw = w.find("flush_bandwidth");
  if (bw == w.end()) {
    return Status::invalid(
        "write_buffer.flush_bandwidth: required (bytes per second, or \"measured\")");
  }
  if (bw->is_string() && bw->get_ref<const std::string&>() == "measured") {
    b->measured = true;
    SLUICE_RETURN_IF_ERROR(
        get_number(w, p, "flush_bandwidth_initial", &b->flush_bandwidth, 0, false));
  } else {
    if (!bw->is_number()) {
      return Status::invalid(
          "write_buffer.flush_bandwidth: must be bytes per second (> 0) or \"measured\", got " +
          bw->dump());
    }
    SLUICE_RETURN_IF_ERROR(get_number(w, p, "flush_bandwidth", &b->flush_bandwidth, 0, false));
    if (w.contains("flush_bandwidth_initial")) {
      return Status::invalid(
          "write_buffer.flush_bandwidth_initial: only with \"flush_bandwidth\": \"measured\"");
    }
  }
  SLUICE_RETURN_IF_ERROR(get_number(w, p, "flush_smoothing", &b->smoothing, 0, false, 1));
  SLUICE_RETURN_IF_ERROR(get_string(w, p, "flush_origin", &b->flush_origin));
  SLUICE_RETURN_IF_ERROR(get_delta(w, p, &b->delta_ms));
  SLUICE_RETURN_IF_ERROR(get_string(w, p, "object", &b->object));
  SLUICE_RETURN_IF_ERROR(get_choice<delta_fair::Rounding>(
      w, p, "rounding",
      {{"strict", delta_fair::Rounding::kStrict}, {"nearest", delta_fair::Rounding::kNearest}},
      &b->rounding));
  return Status::ok();
}

// A value that is a number or "measured": *measured set for the latter; a
// number is read into *out (> min, or >= min with allow_equal); "<key>_initial"
// only with "measured", read into *out.
Status get_measured(const json& j, const std::string& path, const std::string& key,
                    const std::string& what, double min, bool allow_equal, double* out,
                    bool* measured) {
  auto it = j.find(key);
  const std::string f = join_path(path, key);
  const std::string initial = key + "_initial";
  if (it->is_string() && it->get_ref<const std::string&>() == "measured") {
    *measured = true;
    *out = 0;
    return get_number(j, path, initial, out, min, allow_equal);
  }
  if (!it->is_number()) {
    return Status::invalid(f + ": must be " + what + " or \"measured\", got " + it->dump());
  }
  SLUICE_RETURN_IF_ERROR(get_number(j, path, key, out, min, allow_equal));
  if (j.contains(initial)) {
    return Status::invalid(join_path(path, initial) + ": only with \"" + key + "\": \"measured\"");
  }
  return Status::ok();
}

Status parse_cache(const json& c, DeltaFairCache* out) {
  const std::string p = "cache";
  SLUICE_RETURN_IF_ERROR(check_keys(
      c, p,
      {"capacity", "refill_bandwidth", "refill_bandwidth_initial", "read_amplification",
       "read_amplification_initial", "refill_smoothing", "read_origin", "delta_ms", "object"}));
  SLUICE_RETURN_IF_ERROR(get_bytes(c, p, "capacity", &out->capacity, 1, true));
  if (!c.contains("refill_bandwidth")) {
    return Status::invalid(
        "cache.refill_bandwidth: required (bytes per second read from disk for misses, or "
        "\"measured\")");
  }
  SLUICE_RETURN_IF_ERROR(get_measured(c, p, "refill_bandwidth", "bytes per second (> 0)", 0, false,
                                      &out->refill_bandwidth, &out->refill_measured));
  out->read_amplification = 1;
  if (c.contains("read_amplification")) {
    SLUICE_RETURN_IF_ERROR(get_measured(c, p, "read_amplification", "a number >= 1", 1, true,
                                        &out->read_amplification, &out->amplification_measured));
  } else if (c.contains("read_amplification_initial")) {
    return Status::invalid(
        "cache.read_amplification_initial: only with \"read_amplification\": \"measured\"");
  }
  SLUICE_RETURN_IF_ERROR(get_number(c, p, "refill_smoothing", &out->smoothing, 0, false, 1));
  SLUICE_RETURN_IF_ERROR(get_string(c, p, "read_origin", &out->read_origin));
  SLUICE_RETURN_IF_ERROR(get_delta(c, p, &out->delta_ms));
  SLUICE_RETURN_IF_ERROR(get_string(c, p, "object", &out->object));
  return Status::ok();
}

json buffer_to_json(const DeltaFairBuffer& b) {
  json wb = {{"capacity", b.capacity},
             {"segment", b.segment},
             {"delta_ms", delta_json(b.delta_ms)},
             {"object", b.object},
             {"rounding", delta_fair::rounding_name(b.rounding)}};
  if (b.measured) {
    wb["flush_bandwidth"] = "measured";
    if (b.flush_bandwidth > 0) wb["flush_bandwidth_initial"] = b.flush_bandwidth;
    wb["flush_smoothing"] = b.smoothing;
    wb["flush_origin"] = b.flush_origin;
  } else {
    wb["flush_bandwidth"] = b.flush_bandwidth;
  }
  return wb;
}

json cache_to_json(const DeltaFairCache& c) {
  json j = {{"capacity", c.capacity}, {"delta_ms", delta_json(c.delta_ms)}, {"object", c.object}};
  if (c.refill_measured) {
    j["refill_bandwidth"] = "measured";
    if (c.refill_bandwidth > 0) j["refill_bandwidth_initial"] = c.refill_bandwidth;
  } else {
    j["refill_bandwidth"] = c.refill_bandwidth;
  }
  if (c.amplification_measured) {
    j["read_amplification"] = "measured";
    if (c.read_amplification > 0) j["read_amplification_initial"] = c.read_amplification;
  } else {
    j["read_amplification"] = c.read_amplification;
  }
  if (c.refill_measured || c.amplification_measured) {
    j["refill_smoothing"] = c.smoothing;
    j["read_origin"] = c.read_origin;
  }
  return j;
}

}  // namespace

StatusOr<DeltaFairConfig> parse_delta_fair_config(const json& j) {
  DeltaFairConfig c;
  SLUICE_RETURN_IF_ERROR(check_keys(j, "", {"k", "tenants", "write_buffer", "cache"}));
  if (auto it = j.find("k"); it != j.end()) {
    if (!it->is_number_integer() || it->get<std::int64_t>() < 1 ||
        it->get<std::int64_t>() > kMaxK) {
      return Status::invalid("k: must be an integer in 1.." + std::to_string(kMaxK) + ", got " +
                             it->dump());
    }
    c.k = it->get<int>();
  }
  SLUICE_RETURN_IF_ERROR(parse_tenants(j, &c.tenants));
  auto wb = j.find("write_buffer");
  auto cache = j.find("cache");
  if (wb == j.end() && cache == j.end()) {
    return Status::invalid(
        "write_buffer: required when there is no cache (write_buffer {\"capacity\", "
        "\"segment\", \"flush_bandwidth\", \"delta_ms\"}, cache {\"capacity\", "
        "\"refill_bandwidth\", \"delta_ms\"}, or both)");
  }
  if (wb != j.end()) {
    c.write_buffer.emplace();
    SLUICE_RETURN_IF_ERROR(parse_buffer(*wb, &*c.write_buffer));
  }
  if (cache != j.end()) {
    c.cache.emplace();
    SLUICE_RETURN_IF_ERROR(parse_cache(*cache, &*c.cache));
  }
  return c;
}

json delta_fair_config_to_json(const DeltaFairConfig& c) {
  json tenants = json::array();
  for (const auto& t : c.tenants) {
    tenants.push_back({{"name", t.name}, {"id", t.id}, {"weight", t.weight}});
  }
  json j = {{"k", c.k}, {"tenants", std::move(tenants)}};
  if (c.write_buffer) j["write_buffer"] = buffer_to_json(*c.write_buffer);
  if (c.cache) j["cache"] = cache_to_json(*c.cache);
  return j;
}

}  // namespace sluice
