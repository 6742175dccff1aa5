// SILK tail-latency control (PAIO Algorithm 1); see silk.h.
#include "silk.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <utility>

#include "sluice/config_reader.h"
#include "sluice/rule_builder.h"
#include "stage_memory.h"
#include "stage_view.h"

namespace sluice {
namespace {

using nlohmann::json;
using namespace config;  // NOLINT(google-build-using-namespace)

// ---------------------------------------------------------------------------
// Configuration parsing: every error names the field's path.

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

// An array of {channel, object[, direction]}.
Status parse_targets(const json& a, const std::string& f, std::vector<SilkTarget>* out) {
  if (!a.is_array()) {
    return Status::invalid(f + ": must be an array of {channel, object}, got " + a.dump());
  }
  std::vector<SilkTarget> targets;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string fi = f + "[" + std::to_string(i) + "]";
    SLUICE_RETURN_IF_ERROR(check_keys(a[i], fi, {"channel", "object", "direction"}));
    SilkTarget t;
    if (!a[i].contains("channel")) return Status::invalid(fi + ".channel: required");
    if (!a[i].contains("object")) return Status::invalid(fi + ".object: required");
    SLUICE_RETURN_IF_ERROR(get_name(a[i]["channel"], fi + ".channel", &t.channel));
    SLUICE_RETURN_IF_ERROR(get_name(a[i]["object"], fi + ".object", &t.object));
    if (auto d = a[i].find("direction"); d != a[i].end()) {
      if (*d != "read" && *d != "write") {
        return Status::invalid(fi + ".direction: must be read or write, got " + d->dump());
      }
      t.direction = d->get<std::string>();
    }
    targets.push_back(std::move(t));
  }
  *out = std::move(targets);
  return Status::ok();
}

json target_to_json(const SilkTarget& t) {
  json j = {{"channel", t.channel}, {"object", t.object}};
  if (!t.direction.empty()) j["direction"] = t.direction;
  return j;
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
    SLUICE_RETURN_IF_ERROR(parse_targets(*o, f, &flow->objects));
  }
  return get_choice<SilkSplit>(
      *it, path, "split",
      {{"each", SilkSplit::kEach}, {"even", SilkSplit::kEven}, {"active", SilkSplit::kActive}},
      &flow->split);
}

json flow_to_json(const SilkFlow& f) {
  json objects = json::array();
  for (const auto& t : f.objects) objects.push_back(target_to_json(t));
  return {{"origins", f.origins}, {"objects", objects}, {"split", split_name(f.split)}};
}

// ---------------------------------------------------------------------------
// Reading collected statistics.

const ObjectStats* find_object(const StageStats& s, const SilkTarget& t) {
  return stage_view::find_object(s, t.channel, t.object);
}

bool info_has_object(const StageInfo& info, const SilkTarget& t) {
  return stage_view::has_object(info, t.channel, t.object);
}

bool info_has_channel(const StageInfo& info, std::string_view channel) {
  return stage_view::find_channel(info, channel) != nullptr;
}

std::uint64_t waiters_of(const ObjectStats* o) {
  const double w = stage_view::state_number(o, "waiters");
  return w > 0 ? static_cast<std::uint64_t>(w) : 0;
}

// What one flow did in the last interval.
struct FlowDemand {
  double origin_rate = 0;                     // bytes/s of the flow's origins, all channels
  std::vector<double> object_rate;            // per target, bytes/s
  std::vector<std::uint64_t> object_waiters;  // per target
  bool active = false;
  // Bytes/s the flow moved: through its objects, or by its origins if more
  // (bytes of the flow's origins that other channels carried).
  double used() const {
    double objects = 0;
    for (double r : object_rate) objects += r;
    return std::max(objects, origin_rate);
  }
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

// Bytes/s of these objects in the last interval.
double targets_rate(const std::vector<SilkTarget>& targets, const StageStats& s, double seconds) {
  if (seconds <= 0) return 0;
  std::uint64_t bytes = 0;
  for (const auto& t : targets) {
    if (const ObjectStats* o = find_object(s, t)) bytes += o->total.bytes;
  }
  return static_cast<double>(bytes) / seconds;
}

// The flow's objects of one direction. Without origins: per-origin counts have
// no direction, so a direction's demand is what its own objects saw.
SilkFlow flow_in_direction(const SilkFlow& f, std::string_view direction) {
  SilkFlow out;
  out.split = f.split;
  for (const auto& t : f.objects) {
    if (t.direction == direction) out.objects.push_back(t);
  }
  return out;
}

// One run of lines 2-11: over the single KVS_B (direction ""), or one direction.
struct Pass {
  std::string direction;
  double kvs = 0;
  double min = 0;
  double fg = 0;
  SilkFlow fl, l0, ln;
  FlowDemand dfl, dl0, dln;
  SilkRates r;
};

// Lines 1-2 for one stage: the foreground's and each flow's use over the
// last interval, once over the single KVS_B (the paper) or once per direction.
std::vector<Pass> measure(const SilkConfig& config, const StageView& st, double seconds) {
  std::vector<Pass> passes;
  auto add_pass = [&](std::string direction, double kvs, double min, double fg, SilkFlow fl,
                      SilkFlow l0, SilkFlow ln) {
    Pass p;
    p.direction = std::move(direction);
    p.kvs = kvs;
    p.min = min;
    p.fg = fg;
    p.fl = std::move(fl);
    p.l0 = std::move(l0);
    p.ln = std::move(ln);
    p.dfl = measure_flow(p.fl, st.stats, seconds, config.demand_threshold);
    p.dl0 = measure_flow(p.l0, st.stats, seconds, config.demand_threshold);
    p.dln = measure_flow(p.ln, st.stats, seconds, config.demand_threshold);
    passes.push_back(std::move(p));
  };
  if (!config.per_direction) {
    add_pass("", config.kvs_bandwidth, config.min_bandwidth,
             foreground_rate(config, st.stats, seconds), config.flush, config.l0, config.ln);
  } else {
    for (auto [dir, name] : {std::pair{&config.read, "read"}, {&config.write, "write"}}) {
      add_pass(name, dir->kvs_bandwidth, dir->min_bandwidth,
               targets_rate(dir->foreground, st.stats, seconds),
               flow_in_direction(config.flush, name), flow_in_direction(config.l0, name),
               flow_in_direction(config.ln, name));
    }
  }
  return passes;
}

// Lines 3-11: each pass's split of its bandwidth among the flows.
void decide(const SilkConfig& config, std::vector<Pass>& passes) {
  for (Pass& p : passes) {
    p.r = silk_rates(p.kvs, p.min, p.fg, p.dfl.active, p.dl0.active, config.share, p.dfl.used(),
                     p.dl0.used());
  }
}

// What emit() has for one stage.
struct Emitted {
  RulesBuilder rules;
  json missing = json::array();  // objects the stage lacks and is not given
  bool layout_conflict = false;
};

// Line 12: rules for the objects whose rate moved by more than the
// hysteresis (or that are new to this policy), and, with install_layout on a
// stage seen for the first time, the channels and objects it lacks. `sent`
// holds the rate last sent per (channel, object) and is updated.
Emitted emit(const SilkConfig& config, const StageView& st, bool is_new,
             const std::vector<Pass>& passes,
             std::map<std::pair<std::string, std::string>, std::int64_t>& sent) {
  Emitted e;
  const bool origin_routed =
      st.info.classifiers.empty() || st.info.classifiers == std::vector<std::string>{"origin"};
  const bool install = config.install_layout && is_new;
  if (install && !origin_routed) e.layout_conflict = true;
  const bool may_create = install && origin_routed;
  std::set<std::string> created_channels;
  if (may_create && st.info.classifiers.empty()) {
    bool anything = false;
    for (const SilkFlow* f : {&config.flush, &config.l0, &config.ln}) {
      for (const auto& t : f->objects) anything |= !info_has_object(st.info, t);
    }
    for (const auto& ch : config.foreground_channels) anything |= !info_has_channel(st.info, ch);
    if (anything) e.rules.differentiate({Classifier::kOrigin});
  }

  auto emit_flow = [&](const SilkFlow& flow, const FlowDemand& d, double rate) {
    const std::vector<double> rates = split_rate(flow, d, rate);
    bool first_channel_of_flow = true;
    for (std::size_t i = 0; i < flow.objects.size(); ++i) {
      const SilkTarget& t = flow.objects[i];
      const std::int64_t v = stage_view::to_rate(rates[i]);
      const auto key = std::make_pair(t.channel, t.object);
      const bool exists = info_has_object(st.info, t) || find_object(st.stats, t) != nullptr;
      if (!exists) {
        if (!may_create) {
          e.missing.push_back(t.channel + "/" + t.object);
          continue;
        }
        if (!info_has_channel(st.info, t.channel) && !created_channels.count(t.channel)) {
          ChannelOptions ch;
          if (first_channel_of_flow && !flow.origins.empty()) {
            ch.match.origins(flow.origins);
            first_channel_of_flow = false;
          }
          e.rules.create_channel(t.channel, ch);
          created_channels.insert(t.channel);
        }
        e.rules.create_object(t.channel, t.object, "drl", ObjectConfig().set("rate", v));
        sent[key] = v;
        continue;
      }
      auto prev = sent.find(key);
      const bool changed =
          prev == sent.end() || std::abs(static_cast<double>(v - prev->second)) >
                                    config.hysteresis * static_cast<double>(prev->second);
      if (!changed) continue;
      e.rules.configure(t.channel, t.object, ObjectConfig().set("rate", v));
      sent[key] = v;
    }
  };
  for (const Pass& p : passes) {
    emit_flow(p.fl, p.dfl, p.r.flush);
    emit_flow(p.l0, p.dl0, p.r.l0);
    emit_flow(p.ln, p.dln, p.r.ln);
  }
  if (may_create) {
    bool first = true;
    for (const auto& ch : config.foreground_channels) {
      if (info_has_channel(st.info, ch) || created_channels.count(ch)) continue;
      e.rules.create_channel(ch, ChannelOptions().as_default(first));
      first = false;
      e.rules.create_object(ch, "monitor", "noop", ObjectConfig());
      created_channels.insert(ch);
    }
  }
  return e;
}

json pass_report(const Pass& p) {
  return json{{"fg", p.fg},
              {"left", p.r.left},
              {"line", p.r.line},
              {"active", {{"flush", p.dfl.active}, {"l0", p.dl0.active}, {"ln", p.dln.active}}},
              {"rates", {{"flush", p.r.flush}, {"l0", p.r.l0}, {"ln", p.r.ln}}},
              {"used", {{"flush", p.dfl.used()}, {"l0", p.dl0.used()}, {"ln", p.dln.used()}}}};
}

// The step's account of one stage: its pass (with directions, the totals
// over both, then each), and what was emitted or could not be.
json report(const std::vector<Pass>& passes, bool is_new, const Emitted& e) {
  json rep;
  if (passes.size() == 1) {
    rep = pass_report(passes[0]);
  } else {
    Pass sum;
    json dirs = json::object();
    for (const Pass& p : passes) {
      sum.fg += p.fg;
      sum.r.left += p.r.left;
      sum.r.flush += p.r.flush;
      sum.r.l0 += p.r.l0;
      sum.r.ln += p.r.ln;
      sum.dfl.active |= p.dfl.active;
      sum.dl0.active |= p.dl0.active;
      sum.dln.active |= p.dln.active;
      sum.dfl.object_rate.push_back(p.dfl.used());
      sum.dl0.object_rate.push_back(p.dl0.used());
      sum.dln.object_rate.push_back(p.dln.used());
      dirs[p.direction] = pass_report(p);
    }
    rep = pass_report(sum);
    rep.erase("line");
    rep["directions"] = std::move(dirs);
  }
  rep["new"] = is_new;
  rep["rules"] = e.rules.size();
  if (!e.missing.empty()) rep["missing"] = e.missing;
  if (e.layout_conflict) {
    rep["layout_conflict"] = "stage differentiates channels by other classifiers than origin";
  }
  return rep;
}

}  // namespace

// ---------------------------------------------------------------------------

StatusOr<SilkConfig> parse_silk_config(const json& j) {
  SilkConfig c;
  if (j.is_null()) return c;
  SLUICE_RETURN_IF_ERROR(check_keys(
      j, "",
      {"kvs_bandwidth", "min_bandwidth", "hysteresis", "demand_threshold", "share",
       "install_layout", "match_labels", "foreground", "flush", "l0", "ln", "directions"}));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "kvs_bandwidth", &c.kvs_bandwidth, 0, false));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "min_bandwidth", &c.min_bandwidth, 0, false));
  if (c.min_bandwidth > c.kvs_bandwidth) {
    return Status::invalid("min_bandwidth: must be <= kvs_bandwidth (" +
                           format_number(c.kvs_bandwidth) + "), got " +
                           format_number(c.min_bandwidth));
  }
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "hysteresis", &c.hysteresis, 0, true, 1));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "demand_threshold", &c.demand_threshold, 0, true));
  SLUICE_RETURN_IF_ERROR(get_choice<SilkShare>(
      j, "", "share", {{"equal", SilkShare::kEqual}, {"reclaim", SilkShare::kReclaim}}, &c.share));
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
  if (auto d = j.find("directions"); d != j.end()) {
    SLUICE_RETURN_IF_ERROR(check_keys(*d, "directions", {"read", "write"}));
    for (auto [dir, key] : {std::pair{&c.read, "read"}, {&c.write, "write"}}) {
      const std::string path = std::string("directions.") + key;
      if (!d->contains(key)) return Status::invalid(path + ": required");
      const json& dj = (*d)[key];
      SLUICE_RETURN_IF_ERROR(
          check_keys(dj, path, {"kvs_bandwidth", "min_bandwidth", "foreground"}));
      dir->kvs_bandwidth = c.kvs_bandwidth;
      dir->min_bandwidth = c.min_bandwidth;
      SLUICE_RETURN_IF_ERROR(get_number(dj, path, "kvs_bandwidth", &dir->kvs_bandwidth, 0, false));
      SLUICE_RETURN_IF_ERROR(get_number(dj, path, "min_bandwidth", &dir->min_bandwidth, 0, false));
      if (dir->min_bandwidth > dir->kvs_bandwidth) {
        return Status::invalid(path + ".min_bandwidth: must be <= kvs_bandwidth (" +
                               format_number(dir->kvs_bandwidth) + "), got " +
                               format_number(dir->min_bandwidth));
      }
      if (auto f = dj.find("foreground"); f != dj.end()) {
        SLUICE_RETURN_IF_ERROR(parse_targets(*f, path + ".foreground", &dir->foreground));
        for (std::size_t i = 0; i < dir->foreground.size(); ++i) {
          if (!dir->foreground[i].direction.empty()) {
            return Status::invalid(path + ".foreground[" + std::to_string(i) +
                                   "].direction: implied by the list it is in");
          }
          dir->foreground[i].direction = key;
        }
      }
    }
    c.per_direction = true;
    if (c.install_layout) {
      return Status::invalid(
          "install_layout: not supported with directions (give the stage its layout)");
    }
  }
  // With directions every flow object says which one it serves; without, none does.
  for (auto [flow, key] : {std::pair{&c.flush, "flush"}, {&c.l0, "l0"}, {&c.ln, "ln"}}) {
    for (std::size_t i = 0; i < flow->objects.size(); ++i) {
      const std::string f = std::string(key) + ".objects[" + std::to_string(i) + "].direction";
      if (c.per_direction && flow->objects[i].direction.empty()) {
        return Status::invalid(f + ": required with directions (read or write)");
      }
      if (!c.per_direction && !flow->objects[i].direction.empty()) {
        return Status::invalid(f + ": only with directions");
      }
    }
  }
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
  for (const SilkDirection* dir : {&c.read, &c.write}) {
    for (std::size_t i = 0; i < dir->foreground.size(); ++i) {
      const auto& t = dir->foreground[i];
      if (seen.count({t.channel, t.object})) {
        return Status::invalid("directions." + t.direction + ".foreground[" + std::to_string(i) +
                               "]: object " + t.channel + "/" + t.object +
                               " serves a background flow");
      }
    }
  }
  return c;
}

json silk_config_to_json(const SilkConfig& c) {
  json j = {{"kvs_bandwidth", c.kvs_bandwidth},
            {"min_bandwidth", c.min_bandwidth},
            {"hysteresis", c.hysteresis},
            {"demand_threshold", c.demand_threshold},
            {"share", c.share == SilkShare::kReclaim ? "reclaim" : "equal"},
            {"install_layout", c.install_layout},
            {"match_labels", c.match_labels},
            {"foreground",
             {{"channels", c.foreground_channels},
              {"origins", c.foreground_origins},
              {"count_unclassified", c.count_unclassified}}},
            {"flush", flow_to_json(c.flush)},
            {"l0", flow_to_json(c.l0)},
            {"ln", flow_to_json(c.ln)}};
  if (c.per_direction) {
    json dirs = json::object();
    for (auto [dir, key] : {std::pair{&c.read, "read"}, {&c.write, "write"}}) {
      json fg = json::array();
      for (const auto& t : dir->foreground)
        fg.push_back({{"channel", t.channel}, {"object", t.object}});
      dirs[key] = {{"kvs_bandwidth", dir->kvs_bandwidth},
                   {"min_bandwidth", dir->min_bandwidth},
                   {"foreground", fg}};
    }
    j["directions"] = std::move(dirs);
  }
  return j;
}

SilkRates silk_rates(double kvs_bandwidth, double min_bandwidth, double foreground,
                     bool flush_active, bool l0_active, SilkShare share, double flush_used,
                     double l0_used) noexcept {
  SilkRates r;
  r.left = std::max(kvs_bandwidth - foreground, min_bandwidth);  // lines 2-3
  if (flush_active && l0_active) {
    const double half = r.left / 2;
    if (share == SilkShare::kReclaim) {
      r = {r.left, r.left - std::clamp(l0_used, 0.0, half),
           r.left - std::clamp(flush_used, 0.0, half), min_bandwidth, 5};
    } else {
      r = {r.left, half, half, min_bandwidth, 5};
    }
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
    if (!stage_view::labels_match(config_.match_labels, st.labels)) continue;
    auto mem_it = stages_.find(st.name);
    const bool is_new =
        mem_it == stages_.end() || mem_it->second.connected_at_ns != st.connected_at_ns;
    if (is_new) {
      StageMemory fresh;
      fresh.connected_at_ns = st.connected_at_ns;
      mem_it = stages_.insert_or_assign(st.name, std::move(fresh)).first;
    }
    StageMemory& mem = mem_it->second;

    const double seconds = static_cast<double>(stage_view::interval_ns(st, input)) / 1e9;
    std::vector<Pass> passes = measure(config_, st, seconds);
    decide(config_, passes);
    const Emitted e = emit(config_, st, is_new, passes, mem.sent);
    json rep = report(passes, is_new, e);
    if (!e.rules.empty()) {
      auto batch = e.rules.build();
      if (batch.is_ok()) {
        out.rules[st.name] = std::move(batch).value();
      } else {
        rep["error"] = batch.status().message();  // a name in the config a stage refuses
      }
    }
    report_stages[st.name] = std::move(rep);
  }
  out.report = {{"policy", "silk"}, {"stages", std::move(report_stages)}};
  return out;
}

}  // namespace sluice
