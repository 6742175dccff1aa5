// The compaction-deferral policy (compaction_deferral.h): configuration,
// watermarks with hysteresis, the choice of partitions and their stages.
#include "compaction_deferral.h"

#include <algorithm>
#include <cmath>

#include "sluice/config_reader.h"
#include "stage_view.h"

namespace sluice {

using nlohmann::json;
namespace pc = config;

namespace {

constexpr std::string_view kGateType = "deferral-gate";

Status get_int(const json& j, const std::string& path, std::string_view key, double min, double max,
               double* out) {
  double v = *out;
  SLUICE_RETURN_IF_ERROR(pc::get_number(j, path, key, &v, min, true, max));
  if (v != std::floor(v)) {
    return Status::invalid(pc::join_path(path, key) + ": must be an integer, got " +
                           j.at(key).dump());
  }
  *out = v;
  return {};
}

double number(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0;
}

std::string text(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

StatusOr<CompactionDeferralConfig> parse_compaction_deferral_config(const json& j,
                                                                    const std::string& path) {
  SLUICE_RETURN_IF_ERROR(pc::check_keys(
      j, path,
      {"bandwidth", "object", "measure_channels", "labels", "high_watermark", "low_watermark",
       "high_steps", "low_steps", "l0_fraction", "max_partitions", "hold_ms", "second_stage"}));
  CompactionDeferralConfig c;
  if (!j.contains("bandwidth"))
    return Status::invalid(pc::join_path(path, "bandwidth") + ": required");
  SLUICE_RETURN_IF_ERROR(pc::get_number(j, path, "bandwidth", &c.bandwidth, 0, false));
  SLUICE_RETURN_IF_ERROR(pc::get_string(j, path, "object", &c.object));
  if (auto it = j.find("measure_channels"); it != j.end()) {
    const std::string f = pc::join_path(path, "measure_channels");
    if (!it->is_array()) return Status::invalid(f + ": must be an array of channel names");
    for (std::size_t i = 0; i < it->size(); ++i) {
      std::string name;
      SLUICE_RETURN_IF_ERROR(pc::get_name((*it)[i], f + "[" + std::to_string(i) + "]", &name));
      c.measure_channels.push_back(std::move(name));
    }
  }
  SLUICE_RETURN_IF_ERROR(pc::get_labels(j, path, "labels", &c.labels));
  SLUICE_RETURN_IF_ERROR(pc::get_number(j, path, "high_watermark", &c.high_watermark, 0, false, 4));
  SLUICE_RETURN_IF_ERROR(pc::get_number(j, path, "low_watermark", &c.low_watermark, 0, true, 4));
  if (c.low_watermark >= c.high_watermark) {
    return Status::invalid(
        pc::join_path(path, "low_watermark") + ": must be below high_watermark (" +
        pc::format_number(c.high_watermark) + "), got " + pc::format_number(c.low_watermark));
  }
  double n = c.high_steps;
  SLUICE_RETURN_IF_ERROR(get_int(j, path, "high_steps", 1, 1e6, &n));
  c.high_steps = static_cast<int>(n);
  n = c.low_steps;
  SLUICE_RETURN_IF_ERROR(get_int(j, path, "low_steps", 1, 1e6, &n));
  c.low_steps = static_cast<int>(n);
  SLUICE_RETURN_IF_ERROR(pc::get_number(j, path, "l0_fraction", &c.l0_fraction, 0, false, 1));
  n = static_cast<double>(c.max_partitions);
  SLUICE_RETURN_IF_ERROR(get_int(j, path, "max_partitions", 0, 1e9, &n));
  c.max_partitions = static_cast<std::uint64_t>(n);
  n = static_cast<double>(c.hold_ms);
  SLUICE_RETURN_IF_ERROR(get_int(j, path, "hold_ms", 1, 3'600'000, &n));
  c.hold_ms = static_cast<std::int64_t>(n);
  SLUICE_RETURN_IF_ERROR(pc::get_bool(j, path, "second_stage", &c.second_stage));
  return c;
}

json compaction_deferral_config_to_json(const CompactionDeferralConfig& c) {
  json j = {{"bandwidth", c.bandwidth},           {"object", c.object},
            {"high_watermark", c.high_watermark}, {"low_watermark", c.low_watermark},
            {"high_steps", c.high_steps},         {"low_steps", c.low_steps},
            {"l0_fraction", c.l0_fraction},       {"max_partitions", c.max_partitions}};
  if (!c.measure_channels.empty()) j["measure_channels"] = c.measure_channels;
  if (!c.labels.empty()) j["labels"] = c.labels;
  if (c.hold_ms > 0) j["hold_ms"] = c.hold_ms;
  j["second_stage"] = c.second_stage;
  return j;
}

double CompactionDeferral::measure(const PolicyInput& input) const {
  double sum = 0;
  for (const StageView& st : input.stages) {
    if (!stage_view::labels_match(config_.labels, st.labels)) continue;
    const std::int64_t ns = stage_view::interval_ns(st, input);
    if (ns <= 0) continue;
    std::uint64_t bytes = 0;
    if (config_.measure_channels.empty()) {
      bytes = st.stats.total.bytes;
    } else {
      for (const std::string& name : config_.measure_channels)
        if (const ChannelStats* ch = stage_view::find_channel(st.stats, name))
          bytes += ch->total.bytes;
    }
    sum += static_cast<double>(bytes) * 1e9 / static_cast<double>(ns);
  }
  return sum;
}

CompactionDeferral::Step CompactionDeferral::step(const PolicyInput& input) {
  return step_with_use(input, measure(input));
}

CompactionDeferral::Step CompactionDeferral::step_with_use(const PolicyInput& input,
                                                           double bytes_per_s) {
  const double use = bytes_per_s / config_.bandwidth;
  above_ = use >= config_.high_watermark ? above_ + 1 : 0;
  below_ = use < config_.low_watermark ? below_ + 1 : 0;
  if (!short_ && above_ >= config_.high_steps) {
    short_ = true;
    ++episodes_;
    last_change_ = {{"to", "short"},
                    {"at_ns", input.now_ns},
                    {"cause", "use " + pc::format_number(use) + " at or above high watermark " +
                                  pc::format_number(config_.high_watermark) + " for " +
                                  std::to_string(above_) + " step(s)"}};
  } else if (short_ && below_ >= config_.low_steps) {
    short_ = false;
    chosen_.clear();
    second_.clear();
    last_change_ = {{"to", "sufficient"},
                    {"at_ns", input.now_ns},
                    {"cause", "use " + pc::format_number(use) + " below low watermark " +
                                  pc::format_number(config_.low_watermark) + " for " +
                                  std::to_string(below_) + " step(s)"}};
  }

  // The partitions the gates report.
  struct Part {
    Key key;
    std::string channel;
    const json* state;
    double demand;
  };
  std::vector<Part> parts;
  json warnings = json::array();
  for (const StageView& st : input.stages) {
    if (!stage_view::labels_match(config_.labels, st.labels)) continue;
    for (const ChannelStats& ch : st.stats.channels) {
      for (const ObjectStats& o : ch.objects) {
        if (o.name != config_.object || o.type != kGateType || !o.state.is_object()) continue;
        const double hold = number(o.state, "hold_ms");
        if (hold > 0 && input.interval_ns > 0 && 2 * input.interval_ns > hold * 1e6) {
          warnings.push_back("stage " + st.name + ": interval_ms " +
                             pc::format_number(input.interval_ns / 1e6) +
                             " is not well below the gate's hold_ms " + pc::format_number(hold) +
                             ": decisions may expire between steps");
        }
        auto ps = o.state.find("partitions");
        if (ps == o.state.end() || !ps->is_array()) continue;
        for (const json& p : *ps) {
          const std::string key = text(p, "partition");
          if (!p.is_object() || key.empty()) continue;
          parts.push_back({{st.name, key}, ch.name, &p, number(p, "pending_compaction_bytes")});
        }
      }
    }
  }
  if (short_) {
    // Top the choice up to max_partitions (0: every partition) from those not
    // chosen yet, by demand: partitions a gate reports later in the episode
    // (a stage that connected, an actuator that started) are chosen too.
    std::vector<const Part*> order;
    std::size_t present = 0;
    for (const Part& p : parts) {
      if (chosen_.count(p.key)) {
        ++present;
      } else {
        order.push_back(&p);
      }
    }
    std::stable_sort(order.begin(), order.end(), [](const Part* a, const Part* b) {
      return a->demand != b->demand ? a->demand > b->demand : a->key < b->key;
    });
    for (const Part* p : order) {
      if (config_.max_partitions != 0 && present >= config_.max_partitions) break;
      chosen_.insert(p->key);
      ++present;
    }
  }

  Step out;
  std::map<std::pair<std::string, std::string>, json> decide;  // (stage, channel) -> decisions
  json report_parts = json::array();
  for (const Part& p : parts) {
    const std::string state = text(*p.state, "state");
    const double l0 = number(*p.state, "l0_files");
    const double trigger = number(*p.state, "l0_slowdown_trigger");
    std::string decision;
    if (short_ && chosen_.count(p.key)) {
      if (config_.second_stage && !second_.count(p.key) && trigger > 0 &&
          l0 >= config_.l0_fraction * trigger)
        second_.insert(p.key);
      decision = second_.count(p.key) ? "second-stage" : "first-stage";
    } else if (state == "first-stage" || state == "second-stage") {
      decision = "resume";
    }
    if (!decision.empty()) decide[{p.key.first, p.channel}][p.key.second] = decision;
    const json held = p.state->value("held_ms", json::object());
    report_parts.push_back({{"stage", p.key.first},
                            {"partition", p.key.second},
                            {"state", state},
                            {"sent", decision.empty() ? "-" : decision},
                            {"l0_files", l0},
                            {"l0_slowdown_trigger", trigger},
                            {"demand", p.demand},
                            {"held_ms", held}});
  }
  for (auto& [where, d] : decide) {
    json config = {{"decide", std::move(d)}};
    if (config_.hold_ms > 0) config["hold_ms"] = config_.hold_ms;
    out.rules[where.first].push_back({{"rule", "configure"},
                                      {"channel", where.second},
                                      {"object", config_.object},
                                      {"config", std::move(config)}});
  }
  out.report = {{"use", use},
                {"bytes_per_s", bytes_per_s},
                {"bandwidth", config_.bandwidth},
                {"short", short_},
                {"above_steps", above_},
                {"below_steps", below_},
                {"episodes", episodes_},
                {"last_change", last_change_},
                {"chosen", chosen_.size()},
                {"partitions", std::move(report_parts)}};
  if (!warnings.empty()) out.report["warnings"] = std::move(warnings);
  return out;
}

Status CompactionDeferralPolicy::configure(const json& config) {
  auto c = parse_compaction_deferral_config(config);
  if (!c) return c.status();
  core_ = std::make_unique<CompactionDeferral>(std::move(*c));
  return {};
}

PolicyOutput CompactionDeferralPolicy::step(const PolicyInput& input) {
  PolicyOutput out;
  if (!core_) return out;
  CompactionDeferral::Step s = core_->step(input);
  for (auto& [stage, rules] : s.rules)
    out.rules[stage] = json{{"version", 1}, {"rules", std::move(rules)}};
  out.report = std::move(s.report);
  return out;
}

json CompactionDeferralPolicy::describe() const {
  return core_ ? compaction_deferral_config_to_json(core_->config()) : json::object();
}

std::unique_ptr<Policy> make_compaction_deferral_policy() {
  return std::make_unique<CompactionDeferralPolicy>();
}

}  // namespace sluice
