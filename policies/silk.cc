// SILK tail-latency control (PAIO Algorithm 1); see silk.h.
#include "silk.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <utility>

#include "config_reader.h"
#include "stage_memory.h"

namespace sluice {
namespace {

using nlohmann::json;
using namespace policy_config;  // NOLINT(google-build-using-namespace)

// ---------------------------------------------------------------------------
// Configuration parsing: every error names the field's path.

Status get_name(const json& v, const std::string& f, std::string* out) {
  if (!v.is_string() || v.get<std::string>().empty()) {
    return Status::invalid(f + ": must be a non-empty string, got " + v.dump());
  }
  *out = v.get<std::string>();
  return Status::ok();
}

Status get_names(const json& j, const std::string& path, std::string_view key,
                 std::vector<std::string>* out) {
  auto it = j.find(key);
  if (it == j.end()) return Status::ok();
  const std::string f = join_path(path, key);
  if (!it->is_array())
    return Status::invalid(f + ": must be an array of strings, got " + it->dump());
  std::vector<std::string> names;
  for (std::size_t i = 0; i < it->size(); ++i) {
    std::string s;
    SLUICE_RETURN_IF_ERROR(get_name((*it)[i], f + "[" + std::to_string(i) + "]", &s));
    names.push_back(std::move(s));
  }
  *out = std::move(names);
  return Status::ok();
}

std::string_view split_name(SilkSplit s) {
  switch (s) {
    case SilkSplit::kEach:
      return "each";
    case SilkSplit::kEven:
      return "even";
    case SilkSplit::kActive:
      return "active";
  }
  return "each";
}

Status parse_flow(const json& root, std::string_view key, SilkFlow* flow) {
  auto it = root.find(key);
  if (it == root.end()) return Status::ok();
  const std::string path(key);
  SLUICE_RETURN_IF_ERROR(check_keys(*it, path, {"origins", "objects", "split"}));
  SLUICE_RETURN_IF_ERROR(get_names(*it, path, "origins", &flow->origins));
  if (auto o = it->find("objects"); o != it->end()) {
    const std::string f = path + ".objects";
    if (!o->is_array() || o->empty()) {
      return Status::invalid(f + ": must be a non-empty array of {channel, object}, got " +
                             o->dump());
    }
    std::vector<SilkTarget> targets;
    for (std::size_t i = 0; i < o->size(); ++i) {
      const std::string fi = f + "[" + std::to_string(i) + "]";
      SLUICE_RETURN_IF_ERROR(check_keys((*o)[i], fi, {"channel", "object"}));
      SilkTarget t;
      if (!(*o)[i].contains("channel")) return Status::invalid(fi + ".channel: required");
      if (!(*o)[i].contains("object")) return Status::invalid(fi + ".object: required");
      SLUICE_RETURN_IF_ERROR(get_name((*o)[i]["channel"], fi + ".channel", &t.channel));
      SLUICE_RETURN_IF_ERROR(get_name((*o)[i]["object"], fi + ".object", &t.object));
      targets.push_back(std::move(t));
    }
    flow->objects = std::move(targets);
  }
  if (auto s = it->find("split"); s != it->end()) {
    const std::string v = s->is_string() ? s->get<std::string>() : "";
    if (v == "each") {
      flow->split = SilkSplit::kEach;
    } else if (v == "even") {
      flow->split = SilkSplit::kEven;
    } else if (v == "active") {
      flow->split = SilkSplit::kActive;
    } else {
      return Status::invalid(path + ".split: must be one of each, even, active, got " + s->dump());
    }
  }
  return Status::ok();
}

json flow_to_json(const SilkFlow& f) {
  json objects = json::array();
  for (const auto& t : f.objects) objects.push_back({{"channel", t.channel}, {"object", t.object}});
  return {{"origins", f.origins}, {"objects", objects}, {"split", split_name(f.split)}};
}

// ---------------------------------------------------------------------------
// Reading collected statistics.

std::int64_t to_rate(double bytes_per_s) {
  return std::max<std::int64_t>(1, std::llround(bytes_per_s));
}

const ChannelStats* find_channel(const StageStats& s, std::string_view name) {
  for (const auto& c : s.channels) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

const ObjectStats* find_object(const StageStats& s, const SilkTarget& t) {
  const ChannelStats* c = find_channel(s, t.channel);
  if (c == nullptr) return nullptr;
  for (const auto& o : c->objects) {
    if (o.name == t.object) return &o;
  }
  return nullptr;
}

bool info_has_channel(const StageInfo& info, std::string_view channel) {
  for (const auto& c : info.channels) {
    if (c.name == channel) return true;
  }
  return false;
}

bool info_has_object(const StageInfo& info, const SilkTarget& t) {
  for (const auto& c : info.channels) {
    if (c.name != t.channel) continue;
    for (const auto& o : c.objects) {
      if (o.name == t.object) return true;
    }
  }
  return false;
}

std::uint64_t waiters_of(const ObjectStats* o) {
  if (o == nullptr || !o->state.is_object()) return 0;
  auto it = o->state.find("waiters");
  if (it == o->state.end() || !it->is_number()) return 0;
  const double w = it->get<double>();
  return w > 0 ? static_cast<std::uint64_t>(w) : 0;
}

bool labels_match(const std::map<std::string, std::string>& want,
                  const std::map<std::string, std::string>& have) {
  for (const auto& [k, v] : want) {
    auto it = have.find(k);
    if (it == have.end() || it->second != v) return false;
  }
  return true;
}

// What one flow did in the last interval.
struct FlowDemand {
  double origin_rate = 0;                     // bytes/s of the flow's origins, all channels
  std::vector<double> object_rate;            // per target, bytes/s
  std::vector<std::uint64_t> object_waiters;  // per target
  bool active = false;
};

FlowDemand measure_flow(const SilkFlow& flow, const StageStats& s, double seconds,
                        double threshold) {
  FlowDemand d;
  std::uint64_t origin_bytes = 0;
  for (const auto& c : s.channels) {
    for (const auto& o : flow.origins) {
      if (auto it = c.by_origin.find(o); it != c.by_origin.end()) origin_bytes += it->second.bytes;
    }
  }
  d.origin_rate = seconds > 0 ? static_cast<double>(origin_bytes) / seconds : 0;
  d.active = d.origin_rate > threshold;
  for (const auto& t : flow.objects) {
    const ObjectStats* o = find_object(s, t);
    const double rate =
        (o != nullptr && seconds > 0) ? static_cast<double>(o->total.bytes) / seconds : 0;
    const std::uint64_t w = waiters_of(o);
    d.object_rate.push_back(rate);
    d.object_waiters.push_back(w);
    if (rate > threshold || w > 0) d.active = true;
  }
  return d;
}

double foreground_rate(const SilkConfig& c, const StageStats& s, double seconds) {
  if (seconds <= 0) return 0;
  std::uint64_t bytes = 0;
  for (const auto& ch : s.channels) {
    const bool listed = std::find(c.foreground_channels.begin(), c.foreground_channels.end(),
                                  ch.name) != c.foreground_channels.end();
    if (listed) {
      bytes += ch.total.bytes;
      continue;
    }
    for (const auto& o : c.foreground_origins) {
      if (auto it = ch.by_origin.find(o); it != ch.by_origin.end()) bytes += it->second.bytes;
    }
  }
  if (c.count_unclassified) bytes += s.unclassified.bytes;
  return static_cast<double>(bytes) / seconds;
}

// The rate each of the flow's objects gets out of `rate`.
std::vector<double> split_rate(const SilkFlow& flow, const FlowDemand& d, double rate) {
  const std::size_t n = flow.objects.size();
  std::vector<double> out(n, rate);
  if (n == 0 || flow.split == SilkSplit::kEach) return out;
  const double even = rate / static_cast<double>(n);
  std::fill(out.begin(), out.end(), even);
  if (flow.split == SilkSplit::kEven) return out;
  std::size_t busy = 0;
  for (std::size_t i = 0; i < n; ++i) busy += (d.object_rate[i] > 0 || d.object_waiters[i] > 0);
  if (busy == 0) return out;
  for (std::size_t i = 0; i < n; ++i) {
    if (d.object_rate[i] > 0 || d.object_waiters[i] > 0) out[i] = rate / static_cast<double>(busy);
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------

StatusOr<SilkConfig> parse_silk_config(const json& j) {
  SilkConfig c;
  if (j.is_null()) return c;
  SLUICE_RETURN_IF_ERROR(
      check_keys(j, "",
                 {"kvs_bandwidth", "min_bandwidth", "hysteresis", "demand_threshold",
                  "install_layout", "match_labels", "foreground", "flush", "l0", "ln"}));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "kvs_bandwidth", &c.kvs_bandwidth, 0, false));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "min_bandwidth", &c.min_bandwidth, 0, false));
  if (c.min_bandwidth > c.kvs_bandwidth) {
    return Status::invalid("min_bandwidth: must be <= kvs_bandwidth (" +
                           format_number(c.kvs_bandwidth) + "), got " +
                           format_number(c.min_bandwidth));
  }
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "hysteresis", &c.hysteresis, 0, true, 1));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "demand_threshold", &c.demand_threshold, 0, true));
  SLUICE_RETURN_IF_ERROR(get_bool(j, "", "install_layout", &c.install_layout));
  SLUICE_RETURN_IF_ERROR(get_labels(j, "", "match_labels", &c.match_labels));
  if (auto f = j.find("foreground"); f != j.end()) {
    SLUICE_RETURN_IF_ERROR(
        check_keys(*f, "foreground", {"channels", "origins", "count_unclassified"}));
    SLUICE_RETURN_IF_ERROR(get_names(*f, "foreground", "channels", &c.foreground_channels));
    SLUICE_RETURN_IF_ERROR(get_names(*f, "foreground", "origins", &c.foreground_origins));
    SLUICE_RETURN_IF_ERROR(get_bool(*f, "foreground", "count_unclassified", &c.count_unclassified));
  }
  SLUICE_RETURN_IF_ERROR(parse_flow(j, "flush", &c.flush));
  SLUICE_RETURN_IF_ERROR(parse_flow(j, "l0", &c.l0));
  SLUICE_RETURN_IF_ERROR(parse_flow(j, "ln", &c.ln));
  // One DRL object serves one flow: a rate written twice per step would flap.
  std::set<std::pair<std::string, std::string>> seen;
  for (auto [flow, key] : {std::pair{&c.flush, "flush"}, {&c.l0, "l0"}, {&c.ln, "ln"}}) {
    for (std::size_t i = 0; i < flow->objects.size(); ++i) {
      const auto& t = flow->objects[i];
      if (!seen.insert({t.channel, t.object}).second) {
        return Status::invalid(std::string(key) + ".objects[" + std::to_string(i) + "]: object " +
                               t.channel + "/" + t.object + " already serves another flow");
      }
      if (std::find(c.foreground_channels.begin(), c.foreground_channels.end(), t.channel) !=
          c.foreground_channels.end()) {
        return Status::invalid(std::string(key) + ".objects[" + std::to_string(i) + "].channel: '" +
                               t.channel + "' is a foreground channel");
      }
    }
  }
  return c;
}

json silk_config_to_json(const SilkConfig& c) {
  return {{"kvs_bandwidth", c.kvs_bandwidth},
          {"min_bandwidth", c.min_bandwidth},
          {"hysteresis", c.hysteresis},
          {"demand_threshold", c.demand_threshold},
          {"install_layout", c.install_layout},
          {"match_labels", c.match_labels},
          {"foreground",
           {{"channels", c.foreground_channels},
            {"origins", c.foreground_origins},
            {"count_unclassified", c.count_unclassified}}},
          {"flush", flow_to_json(c.flush)},
          {"l0", flow_to_json(c.l0)},
          {"ln", flow_to_json(c.ln)}};
}

SilkRates silk_rates(double kvs_bandwidth, double min_bandwidth, double foreground,
                     bool flush_active, bool l0_active) noexcept {
  SilkRates r;
  r.left = std::max(kvs_bandwidth - foreground, min_bandwidth);  // lines 2-3
  if (flush_active && l0_active) {
    r = {r.left, r.left / 2, r.left / 2, min_bandwidth, 5};
  } else if (flush_active) {
    r = {r.left, r.left, min_bandwidth, min_bandwidth, 7};
  } else if (l0_active) {
    r = {r.left, min_bandwidth, r.left, min_bandwidth, 9};
  } else {
    r = {r.left, min_bandwidth, min_bandwidth, r.left, 11};
  }
  return r;
}

Status SilkPolicy::configure(const json& config) {
  auto parsed = parse_silk_config(config);
  if (!parsed.is_ok()) return parsed.status();
  config_ = std::move(parsed).value();
  stages_.clear();  // resend everything under the new configuration
  return Status::ok();
}

json SilkPolicy::describe() const {
  return silk_config_to_json(config_);
}

std::unique_ptr<Policy> make_silk_policy() {
  return std::make_unique<SilkPolicy>();
}

PolicyOutput SilkPolicy::step(const PolicyInput& input) {
  PolicyOutput out;
  json report_stages = json::object();

  // Forget stages that left. A stage merely absent from this step (it missed
  // a collect) keeps its memory: it still enforces the rates it was sent.
  policy_memory::age(stages_, input, kForgetAfterAbsentSteps,
                     [](const std::string&, const StageMemory&) {});

  for (const StageView& st : input.stages) {
    if (!labels_match(config_.match_labels, st.labels)) continue;
    auto mem_it = stages_.find(st.name);
    const bool is_new =
        mem_it == stages_.end() || mem_it->second.connected_at_ns != st.connected_at_ns;
    if (is_new) {
      StageMemory fresh;
      fresh.connected_at_ns = st.connected_at_ns;
      mem_it = stages_.insert_or_assign(st.name, std::move(fresh)).first;
    }
    StageMemory& mem = mem_it->second;

    // Line 1: collect.
    const std::int64_t interval_ns =
        st.stats.interval_ns > 0 ? st.stats.interval_ns : input.interval_ns;
    const double seconds = static_cast<double>(interval_ns) / 1e9;
    const double fg = foreground_rate(config_, st.stats, seconds);
    const FlowDemand fl = measure_flow(config_.flush, st.stats, seconds, config_.demand_threshold);
    const FlowDemand l0 = measure_flow(config_.l0, st.stats, seconds, config_.demand_threshold);
    const FlowDemand ln = measure_flow(config_.ln, st.stats, seconds, config_.demand_threshold);

    // Lines 2-11.
    const SilkRates r =
        silk_rates(config_.kvs_bandwidth, config_.min_bandwidth, fg, fl.active, l0.active);

    // Line 12: rules for the objects whose rate moved (or that are new).
    json rules = json::array();
    json missing = json::array();
    bool layout_conflict = false;
    const bool origin_routed =
        st.info.classifiers.empty() || st.info.classifiers == std::vector<std::string>{"origin"};
    const bool install = config_.install_layout && is_new;
    if (install && !origin_routed) layout_conflict = true;
    const bool may_create = install && origin_routed;
    std::set<std::string> created_channels;
    if (may_create && st.info.classifiers.empty()) {
      bool anything = false;
      for (const SilkFlow* f : {&config_.flush, &config_.l0, &config_.ln}) {
        for (const auto& t : f->objects) anything |= !info_has_object(st.info, t);
      }
      for (const auto& ch : config_.foreground_channels) anything |= !info_has_channel(st.info, ch);
      if (anything) rules.push_back({{"rule", "differentiate"}, {"classifiers", {"origin"}}});
    }

    auto has_stats_object = [&](const SilkTarget& t) {
      return find_object(st.stats, t) != nullptr;
    };
    auto emit_flow = [&](const SilkFlow& flow, const FlowDemand& d, double rate) {
      const std::vector<double> rates = split_rate(flow, d, rate);
      bool first_channel_of_flow = true;
      for (std::size_t i = 0; i < flow.objects.size(); ++i) {
        const SilkTarget& t = flow.objects[i];
        const std::int64_t v = to_rate(rates[i]);
        const auto key = std::make_pair(t.channel, t.object);
        const bool exists = info_has_object(st.info, t) || has_stats_object(t);
        if (!exists) {
          if (!may_create) {
            missing.push_back(t.channel + "/" + t.object);
            continue;
          }
          if (!info_has_channel(st.info, t.channel) && !created_channels.count(t.channel)) {
            json ch = {{"rule", "create_channel"}, {"channel", t.channel}};
            if (first_channel_of_flow && !flow.origins.empty()) {
              ch["match"] = {{"origin", flow.origins}};
              first_channel_of_flow = false;
            }
            rules.push_back(std::move(ch));
            created_channels.insert(t.channel);
          }
          rules.push_back({{"rule", "create_object"},
                           {"channel", t.channel},
                           {"object", t.object},
                           {"type", "drl"},
                           {"config", {{"rate", v}}}});
          mem.sent[key] = v;
          continue;
        }
        auto prev = mem.sent.find(key);
        const bool changed =
            prev == mem.sent.end() || std::abs(static_cast<double>(v - prev->second)) >
                                          config_.hysteresis * static_cast<double>(prev->second);
        if (!changed) continue;
        rules.push_back({{"rule", "configure"},
                         {"channel", t.channel},
                         {"object", t.object},
                         {"config", {{"rate", v}}}});
        mem.sent[key] = v;
      }
    };
    emit_flow(config_.flush, fl, r.flush);
    emit_flow(config_.l0, l0, r.l0);
    emit_flow(config_.ln, ln, r.ln);
    if (may_create) {
      bool first = true;
      for (const auto& ch : config_.foreground_channels) {
        if (info_has_channel(st.info, ch) || created_channels.count(ch)) continue;
        json c = {{"rule", "create_channel"}, {"channel", ch}};
        if (first) c["default"] = true;
        first = false;
        rules.push_back(std::move(c));
        rules.push_back({{"rule", "create_object"},
                         {"channel", ch},
                         {"object", "monitor"},
                         {"type", "noop"},
                         {"config", json::object()}});
        created_channels.insert(ch);
      }
    }

    json rep = {{"new", is_new},
                {"fg", fg},
                {"left", r.left},
                {"line", r.line},
                {"active", {{"flush", fl.active}, {"l0", l0.active}, {"ln", ln.active}}},
                {"rates", {{"flush", r.flush}, {"l0", r.l0}, {"ln", r.ln}}},
                {"rules", rules.size()}};
    if (!missing.empty()) rep["missing"] = missing;
    if (layout_conflict) {
      rep["layout_conflict"] = "stage differentiates channels by other classifiers than origin";
    }
    report_stages[st.name] = std::move(rep);
    if (!rules.empty()) out.rules[st.name] = {{"version", 1}, {"rules", std::move(rules)}};
  }
  out.report = {{"policy", "silk"}, {"stages", std::move(report_stages)}};
  return out;
}

}  // namespace sluice
