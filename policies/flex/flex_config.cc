// The flex policy's configuration: parsing and checking (flex.h).
#include <cmath>
#include <set>
#include <string>

#include "flex.h"
#include "sluice/config_reader.h"

namespace sluice {
namespace {

using nlohmann::json;
using namespace config;  // NOLINT(google-build-using-namespace)

Status parse_ref(const json& j, const std::string& path, FlexObjectRef* ref) {
  SLUICE_RETURN_IF_ERROR(check_keys(j, path, {"channel", "object"}));
  SLUICE_RETURN_IF_ERROR(get_string(j, path, "channel", &ref->channel));
  return get_string(j, path, "object", &ref->object);
}

Status parse_partition(const json& j, const std::string& path, FlexPartition* p) {
  SLUICE_RETURN_IF_ERROR(
      check_keys(j, path,
                 {"name", "stage", "rcu_max_per_s", "rcu_max_size", "read_amplification",
                  "wcu_max_per_s", "wcu_max_size", "background_amplification", "levels",
                  "ingest_window_s", "min_background", "max_rate"}));
  for (const char* required : {"name", "stage"}) {
    if (!j.contains(required)) return Status::invalid(join_path(path, required) + ": required");
  }
  SLUICE_RETURN_IF_ERROR(get_string(j, path, "name", &p->name));
  SLUICE_RETURN_IF_ERROR(get_string(j, path, "stage", &p->stage));
  SLUICE_RETURN_IF_ERROR(get_number(j, path, "rcu_max_per_s", &p->rcu_max_per_s, 0, true));
  SLUICE_RETURN_IF_ERROR(get_number(j, path, "rcu_max_size", &p->rcu_max_size, 0, false));
  SLUICE_RETURN_IF_ERROR(
      get_number(j, path, "read_amplification", &p->read_amplification, 1, true));
  SLUICE_RETURN_IF_ERROR(get_number(j, path, "wcu_max_per_s", &p->wcu_max_per_s, 0, true));
  SLUICE_RETURN_IF_ERROR(get_number(j, path, "wcu_max_size", &p->wcu_max_size, 0, false));
  if (auto it = j.find("background_amplification"); it != j.end()) {
    if (it->is_string() && *it == "levels") {
      p->amplification_from_levels = true;
    } else {
      SLUICE_RETURN_IF_ERROR(
          get_number(j, path, "background_amplification", &p->background_amplification, 0, false));
      p->amplification_from_levels = false;
    }
  }
  if (auto it = j.find("levels"); it != j.end()) {
    if (!it->is_number_integer() || it->get<std::int64_t>() < flex::kMinLevels ||
        it->get<std::int64_t>() > flex::kMaxLevels) {
      return Status::invalid(join_path(path, "levels") + ": must be an integer from 2 to 16, got " +
                             it->dump());
    }
    p->levels = it->get<int>();
  }
  SLUICE_RETURN_IF_ERROR(
      get_number(j, path, "ingest_window_s", &p->ingest_window_s, 0, false, 86400));
  SLUICE_RETURN_IF_ERROR(get_number(j, path, "min_background", &p->min_background, 1, true));
  SLUICE_RETURN_IF_ERROR(get_number(j, path, "max_rate", &p->max_rate, 0, true));
  if (p->rcu_max_per_s == 0 && p->wcu_max_per_s == 0 && p->max_rate == 0) {
    return Status::invalid(path +
                           ": rcu_max_per_s and wcu_max_per_s are both 0: Equation 2 would give "
                           "the partition no foreground bandwidth");
  }
  return Status::ok();
}

Status parse_into(const json& j, FlexConfig* c) {
  SLUICE_RETURN_IF_ERROR(check_keys(
      j, "", {"method", "node", "partitions", "foreground", "background", "auto_tuned"}));
  SLUICE_RETURN_IF_ERROR(get_choice<FlexConfig::Method>(
      j, "", "method", {{"flex", FlexConfig::kFlex}, {"auto-tuned", FlexConfig::kAutoTuned}},
      &c->method));
  if (auto it = j.find("node"); it != j.end()) {
    SLUICE_RETURN_IF_ERROR(check_keys(*it, "node", {"bandwidth", "channel", "object"}));
    if (!it->contains("bandwidth")) return Status::invalid("node.bandwidth: required");
    SLUICE_RETURN_IF_ERROR(get_number(*it, "node", "bandwidth", &c->node_bandwidth, 1, true));
    SLUICE_RETURN_IF_ERROR(get_string(*it, "node", "channel", &c->node.channel));
    SLUICE_RETURN_IF_ERROR(get_string(*it, "node", "object", &c->node.object));
  }
  if (auto it = j.find("foreground"); it != j.end()) {
    SLUICE_RETURN_IF_ERROR(parse_ref(*it, "foreground", &c->foreground));
  }
  if (auto it = j.find("background"); it != j.end()) {
    SLUICE_RETURN_IF_ERROR(parse_ref(*it, "background", &c->background));
  }
  if (auto it = j.find("auto_tuned"); it != j.end()) {
    SLUICE_RETURN_IF_ERROR(
        check_keys(*it, "auto_tuned", {"channel", "object", "refill_period_ms"}));
    SLUICE_RETURN_IF_ERROR(get_string(*it, "auto_tuned", "channel", &c->auto_tuned.channel));
    SLUICE_RETURN_IF_ERROR(get_string(*it, "auto_tuned", "object", &c->auto_tuned.object));
    SLUICE_RETURN_IF_ERROR(
        get_number(*it, "auto_tuned", "refill_period_ms", &c->refill_period_ms, 0, false));
  }
  auto parts = j.find("partitions");
  if (parts == j.end() || !parts->is_array() || parts->empty()) {
    return Status::invalid("partitions: must be a non-empty array of partitions, got " +
                           (parts == j.end() ? std::string("nothing") : parts->dump()));
  }
  std::set<std::string> names, stages;
  for (std::size_t i = 0; i < parts->size(); ++i) {
    const std::string path = "partitions[" + std::to_string(i) + "]";
    FlexPartition p;
    SLUICE_RETURN_IF_ERROR(parse_partition((*parts)[i], path, &p));
    if (!names.insert(p.name).second) {
      return Status::invalid(path + ".name: '" + p.name + "' names another partition too");
    }
    if (!stages.insert(p.stage).second) {
      return Status::invalid(path + ".stage: '" + p.stage +
                             "' is another partition's stage (one partition per stage: its fg "
                             "and bg objects are the partition's)");
    }
    c->partitions.push_back(std::move(p));
  }
  return Status::ok();
}

json ref_json(const FlexObjectRef& r) {
  return {{"channel", r.channel}, {"object", r.object}};
}

}  // namespace

StatusOr<FlexConfig> parse_flex_config(const json& j) {
  FlexConfig c;
  try {
    SLUICE_RETURN_IF_ERROR(parse_into(j, &c));
  } catch (const std::exception& e) {  // nlohmann's type errors, should any slip through
    return Status::invalid(std::string("config: ") + e.what());
  }
  return c;
}

json flex_config_to_json(const FlexConfig& c) {
  json parts = json::array();
  for (const FlexPartition& p : c.partitions) {
    parts.push_back(
        {{"name", p.name},
         {"stage", p.stage},
         {"rcu_max_per_s", p.rcu_max_per_s},
         {"rcu_max_size", p.rcu_max_size},
         {"read_amplification", p.read_amplification},
         {"wcu_max_per_s", p.wcu_max_per_s},
         {"wcu_max_size", p.wcu_max_size},
         {"background_amplification",
          p.amplification_from_levels ? json("levels") : json(p.background_amplification)},
         {"levels", p.levels},
         {"ingest_window_s", p.ingest_window_s},
         {"min_background", p.min_background},
         {"max_rate", p.max_rate}});
  }
  json out = {{"method", c.method == FlexConfig::kFlex ? "flex" : "auto-tuned"},
              {"partitions", std::move(parts)},
              {"foreground", ref_json(c.foreground)},
              {"background", ref_json(c.background)},
              {"auto_tuned",
               {{"channel", c.auto_tuned.channel},
                {"object", c.auto_tuned.object},
                {"refill_period_ms", c.refill_period_ms}}}};
  if (c.node_bandwidth > 0) {
    out["node"] = {
        {"bandwidth", c.node_bandwidth}, {"channel", c.node.channel}, {"object", c.node.object}};
  }
  return out;
}

}  // namespace sluice
