// Max-min fair bandwidth with goals, weights and calibration; see maxmin.h.
#include "maxmin.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "sluice/config_reader.h"
#include "sluice/rule_builder.h"
#include "stage_memory.h"
#include "stage_view.h"

namespace sluice {
namespace {

using nlohmann::json;
using namespace config;  // NOLINT(google-build-using-namespace)

constexpr double kUnbounded = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------
// Configuration parsing: every error names the field's path.

Status get_optional_number(const json& j, const std::string& path, std::string_view key,
                           std::optional<double>* out, double min, bool allow_equal) {
  if (!j.contains(key)) return Status::ok();
  double v = 0;
  SLUICE_RETURN_IF_ERROR(get_number(j, path, key, &v, min, allow_equal));
  *out = v;
  return Status::ok();
}

std::string_view io_name(IoCounters io) {
  switch (io) {
    case IoCounters::kRead:
      return "read";
    case IoCounters::kWrite:
      return "write";
    case IoCounters::kBoth:
      return "both";
  }
  return "both";
}

json finite_or(double v, const char* otherwise) {
  return std::isfinite(v) ? json(v) : json(otherwise);
}

// What the configuration says for one stage.
struct Settings {
  double goal = 0;
  double weight = 1;
  std::string channel;
  std::string object;
};

Settings settings_for(const MaxminConfig& cfg, const StageView& st) {
  Settings s{cfg.default_goal, cfg.default_weight, cfg.channel, cfg.object};
  for (const auto& e : cfg.stages) {
    if (!e.name.empty() && e.name != st.name) continue;
    if (!stage_view::labels_match(e.labels, st.labels)) continue;
    if (e.goal) s.goal = *e.goal;
    if (e.weight) s.weight = *e.weight;
    if (e.channel) s.channel = *e.channel;
    if (e.object) s.object = *e.object;
    break;
  }
  return s;
}

// The rules that set a stage's limiter to `rate`: a configure when it has
// one, else (with install_layout) the rules that create it; none otherwise.
RulesBuilder limiter_rules(const MaxminConfig& cfg, const Settings& set, const StageView& st,
                           bool exists, std::int64_t rate) {
  RulesBuilder rules;
  if (exists) {
    rules.configure(set.channel, set.object, ObjectConfig().set("rate", rate));
  } else if (cfg.install_layout) {
    if (stage_view::find_channel(st.info, set.channel) == nullptr &&
        stage_view::find_channel(st.stats, set.channel) == nullptr) {
      rules.create_channel(set.channel, ChannelOptions().as_default());
    }
    rules.create_object(set.channel, set.object, "drl", ObjectConfig().set("rate", rate));
  }
  return rules;
}

}  // namespace

// ---------------------------------------------------------------------------

StatusOr<MaxminConfig> parse_maxmin_config(const json& j) {
  MaxminConfig c;
  if (j.is_null()) return c;
  SLUICE_RETURN_IF_ERROR(
      check_keys(j, "",
                 {"max_bandwidth", "channel", "object", "default_goal", "default_weight", "stages",
                  "match_labels", "headroom", "probe", "saturation", "throttle_wait_fraction",
                  "min_rate", "hysteresis", "distribute_surplus", "install_layout",
                  "startup_grace_ms", "expected_stages", "calibration"}));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "max_bandwidth", &c.max_bandwidth, 0, false));
  SLUICE_RETURN_IF_ERROR(get_string(j, "", "channel", &c.channel));
  SLUICE_RETURN_IF_ERROR(get_string(j, "", "object", &c.object));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "default_goal", &c.default_goal, 0, true));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "default_weight", &c.default_weight, 0, false));
  SLUICE_RETURN_IF_ERROR(get_labels(j, "", "match_labels", &c.match_labels));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "headroom", &c.headroom, 0, false, 10));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "probe", &c.probe, 0, true));
  if (c.probe > 0 && c.probe <= 1) {
    return Status::invalid("probe: must be 0 (unbounded) or > 1, got " + format_number(c.probe));
  }
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "saturation", &c.saturation, 0, false, 1));
  if ((1 + c.headroom) * c.saturation <= 1) {
    // Otherwise a stage given exactly its demand plus headroom would look
    // throttled, and its allocation would swing between demand and fair share.
    return Status::invalid("headroom: (1 + headroom) * saturation must exceed 1, got (1 + " +
                           format_number(c.headroom) + ") * " + format_number(c.saturation));
  }
  SLUICE_RETURN_IF_ERROR(
      get_number(j, "", "throttle_wait_fraction", &c.throttle_wait_fraction, 0, false, 1));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "min_rate", &c.min_rate, 0, false));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "hysteresis", &c.hysteresis, 0, true, 1));
  SLUICE_RETURN_IF_ERROR(get_bool(j, "", "distribute_surplus", &c.distribute_surplus));
  SLUICE_RETURN_IF_ERROR(get_bool(j, "", "install_layout", &c.install_layout));
  SLUICE_RETURN_IF_ERROR(
      get_number(j, "", "startup_grace_ms", &c.startup_grace_ms, 0, true, 3600 * 1000));
  if (auto it = j.find("expected_stages"); it != j.end()) {
    if (!it->is_number_integer() || it->get<std::int64_t>() < 0 ||
        it->get<std::int64_t>() > 1'000'000) {
      return Status::invalid("expected_stages: must be an integer in 0..1000000, got " +
                             it->dump());
    }
    c.expected_stages = it->get<int>();
  }
  if (auto it = j.find("calibration"); it != j.end()) {
    const std::string p = "calibration";
    MaxminCalibration& cal = c.calibration;
    SLUICE_RETURN_IF_ERROR(
        check_keys(*it, p, {"enabled", "io", "gain", "min_factor", "max_factor", "min_bytes"}));
    SLUICE_RETURN_IF_ERROR(get_bool(*it, p, "enabled", &cal.enabled));
    SLUICE_RETURN_IF_ERROR(get_choice<IoCounters>(
        *it, p, "io",
        {{"read", IoCounters::kRead}, {"write", IoCounters::kWrite}, {"both", IoCounters::kBoth}},
        &cal.io));
    SLUICE_RETURN_IF_ERROR(get_number(*it, p, "gain", &cal.gain, 0, false, 1));
    SLUICE_RETURN_IF_ERROR(get_number(*it, p, "min_factor", &cal.min_factor, 0, false, 1));
    SLUICE_RETURN_IF_ERROR(get_number(*it, p, "max_factor", &cal.max_factor, 1, true));
    SLUICE_RETURN_IF_ERROR(get_number(*it, p, "min_bytes", &cal.min_bytes, 0, true));
  }
  if (auto it = j.find("stages"); it != j.end()) {
    if (!it->is_array()) return Status::invalid("stages: must be an array, got " + it->dump());
    for (std::size_t i = 0; i < it->size(); ++i) {
      const std::string p = "stages[" + std::to_string(i) + "]";
      const json& e = (*it)[i];
      SLUICE_RETURN_IF_ERROR(
          check_keys(e, p, {"name", "labels", "goal", "weight", "channel", "object"}));
      MaxminStageConfig s;
      SLUICE_RETURN_IF_ERROR(get_string(e, p, "name", &s.name));
      SLUICE_RETURN_IF_ERROR(get_labels(e, p, "labels", &s.labels));
      SLUICE_RETURN_IF_ERROR(get_optional_number(e, p, "goal", &s.goal, 0, true));
      SLUICE_RETURN_IF_ERROR(get_optional_number(e, p, "weight", &s.weight, 0, false));
      std::string v;
      if (e.contains("channel")) {
        SLUICE_RETURN_IF_ERROR(get_string(e, p, "channel", &v));
        s.channel = v;
      }
      if (e.contains("object")) {
        SLUICE_RETURN_IF_ERROR(get_string(e, p, "object", &v));
        s.object = v;
      }
      c.stages.push_back(std::move(s));
    }
  }
  return c;
}

json maxmin_config_to_json(const MaxminConfig& c) {
  json stages = json::array();
  for (const auto& s : c.stages) {
    json e = json::object();
    if (!s.name.empty()) e["name"] = s.name;
    if (!s.labels.empty()) e["labels"] = s.labels;
    if (s.goal) e["goal"] = *s.goal;
    if (s.weight) e["weight"] = *s.weight;
    if (s.channel) e["channel"] = *s.channel;
    if (s.object) e["object"] = *s.object;
    stages.push_back(std::move(e));
  }
  const MaxminCalibration& cal = c.calibration;
  return {{"max_bandwidth", c.max_bandwidth},
          {"channel", c.channel},
          {"object", c.object},
          {"default_goal", c.default_goal},
          {"default_weight", c.default_weight},
          {"stages", stages},
          {"match_labels", c.match_labels},
          {"headroom", c.headroom},
          {"probe", c.probe},
          {"saturation", c.saturation},
          {"throttle_wait_fraction", c.throttle_wait_fraction},
          {"min_rate", c.min_rate},
          {"hysteresis", c.hysteresis},
          {"distribute_surplus", c.distribute_surplus},
          {"install_layout", c.install_layout},
          {"startup_grace_ms", c.startup_grace_ms},
          {"expected_stages", c.expected_stages},
          {"calibration",
           {{"enabled", cal.enabled},
            {"io", io_name(cal.io)},
            {"gain", cal.gain},
            {"min_factor", cal.min_factor},
            {"max_factor", cal.max_factor},
            {"min_bytes", cal.min_bytes}}}};
}

Status MaxminPolicy::configure(const json& config) {
  auto parsed = parse_maxmin_config(config);
  if (!parsed.is_ok()) return parsed.status();
  config_ = std::move(parsed).value();
  stages_.clear();  // resend everything under the new configuration
  return Status::ok();
}

json MaxminPolicy::describe() const {
  return maxmin_config_to_json(config_);
}

double MaxminPolicy::factor(const std::string& stage) const {
  auto it = stages_.find(stage);
  return it == stages_.end() ? 1.0 : it->second.factor;
}

std::unique_ptr<Policy> make_maxmin_policy() {
  return std::make_unique<MaxminPolicy>();
}

bool MaxminPolicy::starting(const PolicyInput& input) const {
  return config_.startup_grace_ms > 0 &&
         static_cast<double>(input.now_ns - input.started_ns) < config_.startup_grace_ms * 1e6;
}

MaxminPolicy::StageMemory& MaxminPolicy::memory_of(const StageView& st) {
  auto it = stages_.find(st.name);
  if (it == stages_.end() || it->second.connected_at_ns != st.connected_at_ns) {
    StageMemory fresh;
    fresh.connected_at_ns = st.connected_at_ns;
    it = stages_.insert_or_assign(st.name, fresh).first;
  }
  return it->second;
}

RulesBatch MaxminPolicy::admit(const PolicyInput& input) {
  const MaxminConfig& cfg = config_;
  if (input.stages.size() != 1) return {};
  const StageView& st = input.stages.front();
  if (!stage_view::labels_match(cfg.match_labels, st.labels)) return {};
  const Settings set = settings_for(cfg, st);
  StageMemory& mem = memory_of(st);
  const bool exists = stage_view::has_object(st.info, set.channel, set.object);
  // At start-up a stage that comes with its limiter keeps what it enforces
  // (the step counts it as taken): it may hold an earlier daemon's rate.
  if (exists && starting(input)) return {};
  // Whatever the others are not allocated: all of it for a stage alone, none
  // (min_rate) while the others share everything, until the next step makes
  // room. Never more than the capacity, however the stage then uses it.
  double others = 0;
  int count = 1;
  for (const auto& [name, m] : stages_) {
    if (name == st.name) continue;
    others += m.allocation;
    ++count;
  }
  double free = std::max(0.0, cfg.max_bandwidth - others);
  if (starting(input)) {
    free = std::min(free, cfg.max_bandwidth / std::max(count, cfg.expected_stages));
  }
  const std::int64_t rate = stage_view::to_rate(std::max(cfg.min_rate, free));
  const RulesBuilder rules = limiter_rules(cfg, set, st, exists, rate);
  if (rules.empty()) return {};
  auto batch = rules.build();
  if (!batch.is_ok()) return {};  // a name in the config a stage refuses: the step reports it
  mem.sent = true;
  mem.sent_rate = rate;
  mem.allocation = free;
  return std::move(batch).value();
}

struct MaxminPolicy::Step {
  // One stage taking part in the step.
  struct Row {
    const StageView* st = nullptr;
    StageMemory* mem = nullptr;
    bool is_new = false;
    Settings set;
    bool limiter_exists = false;
    double stage_rate = 0;  // bytes/s through the limiter
    double real_rate = 0;   // bytes/s the process achieved (allocation units)
    bool throttled = false;
    double demand = kUnbounded;
    double allocation = 0;  // decide()'s
    bool missing = false;   // emit()'s: a limiter it has not and is not given
    std::string error;      // emit()'s: why its rules could not be built
  };
  std::vector<Row> rows;
  // Stages absent from this step without leaving: they enforce their last
  // allocation, held out of the capacity.
  double held = 0;
  json held_report = json::object();
  int absent = 0;
  // Start-up: stages whose limiter came with a rate keep it (`kept`); those
  // whose rate is not known yet (no collect since their hello) hold a share
  // (`unknown`), and so does each expected stage not seen yet (`phantoms`).
  bool start_up = false;
  double kept_sum = 0;
  int kept = 0;
  json kept_report = json::object();
  std::vector<StageMemory*> unknown;
  double unknown_share = 0;
  double unknown_held = 0;
  int phantoms = 0;
  // decide()'s.
  double capacity = 0;
  double goal_sum = 0;
  double goal_scale = 1;
  double surplus = 0;
};

void MaxminPolicy::measure(const PolicyInput& input, Step& step) {
  const MaxminConfig& cfg = config_;
  const MaxminCalibration& cal = cfg.calibration;
  // Forget stages that left: their share goes to the others in this step. A
  // stage absent without leaving keeps enforcing its last rate: hold its
  // allocation out of the capacity.
  policy_memory::age(stages_, input, kForgetAfterAbsentSteps,
                     [&](const std::string& name, const StageMemory& mem) {
                       step.held += mem.allocation;
                       step.held_report[name] = mem.allocation;
                       ++step.absent;
                     });
  step.start_up = starting(input);
  for (const StageView& st : input.stages) {
    if (!stage_view::labels_match(cfg.match_labels, st.labels)) continue;
    Step::Row r;
    r.st = &st;
    r.set = settings_for(cfg, st);
    StageMemory& mem = memory_of(st);
    r.is_new = !mem.stepped;  // new, or admitted since the last step
    mem.stepped = true;
    r.mem = &mem;

    const std::int64_t interval_ns = stage_view::interval_ns(st, input);
    const double seconds = static_cast<double>(interval_ns) / 1e9;
    const ChannelStats* ch = stage_view::find_channel(st.stats, r.set.channel);
    const ObjectStats* obj = stage_view::find_object(ch, r.set.object);
    // mem.sent: admit set it (or created it) since the stage's description.
    r.limiter_exists =
        obj != nullptr || stage_view::has_object(st.info, r.set.channel, r.set.object) || mem.sent;
    if (step.start_up && r.limiter_exists && !mem.sent) {
      // Its rate is not this policy's: it may be an earlier daemon's.
      const double rate = stage_view::state_number(obj, "rate");
      if (obj == nullptr) {
        step.unknown.push_back(&mem);  // its allocation is set below, to a share
        step.kept_report[st.name] = {{"kept", true}, {"rate", nullptr}};
        continue;
      }
      if (rate > 0) {
        mem.allocation = std::min(rate, cfg.max_bandwidth);
        mem.allocated = false;
        step.kept_sum += mem.allocation;
        ++step.kept;
        step.kept_report[st.name] = {{"kept", true}, {"rate", rate}};
        continue;
      }
    }
    const std::uint64_t stage_bytes =
        obj != nullptr ? obj->total.bytes
                       : (ch != nullptr ? ch->total.bytes : st.stats.total.bytes);
    std::uint64_t proc_bytes = 0;
    if (cal.io != IoCounters::kWrite) proc_bytes += st.io.delta_read_bytes;
    if (cal.io != IoCounters::kRead) proc_bytes += st.io.delta_write_bytes;
    r.stage_rate = seconds > 0 ? static_cast<double>(stage_bytes) / seconds : 0;

    // Calibration: the factor converges to (stage bytes / real bytes), so that
    // a DRL rate of allocation * factor yields `allocation` real bytes/s. Not on
    // a stage's first step: the daemon has no earlier /proc reading of it, so
    // its io deltas are 0 and would read as "nothing reached the disk" (factor
    // pushed to max_factor, the stage let through at several times its share).
    if (cal.enabled && !r.is_new && st.io.valid &&
        static_cast<double>(stage_bytes) >= cal.min_bytes && stage_bytes > 0) {
      const double observed =
          proc_bytes > 0 ? static_cast<double>(stage_bytes) / static_cast<double>(proc_bytes)
                         : cal.max_factor;
      const double target = std::clamp(observed, cal.min_factor, cal.max_factor);
      mem.factor =
          std::clamp(mem.factor + cal.gain * (target - mem.factor), cal.min_factor, cal.max_factor);
    }
    if (!cal.enabled) {
      r.real_rate = r.stage_rate;
    } else if (st.io.valid) {
      r.real_rate = seconds > 0 ? static_cast<double>(proc_bytes) / seconds : 0;
    } else {
      r.real_rate = r.stage_rate / mem.factor;
    }

    // Demand.
    const double waiters = stage_view::state_number(obj, "waiters");
    const double waited_ns = obj != nullptr ? static_cast<double>(obj->wait.total_ns) : 0;
    r.throttled = waiters > 0 ||
                  (interval_ns > 0 &&
                   waited_ns >= cfg.throttle_wait_fraction * static_cast<double>(interval_ns)) ||
                  (mem.sent && r.stage_rate >= cfg.saturation * static_cast<double>(mem.sent_rate));
    if (!mem.allocated) {
      r.demand = kUnbounded;  // nothing known yet: let it compete
    } else if (r.throttled) {
      r.demand = cfg.probe > 0 ? std::max(mem.allocation, r.real_rate) * cfg.probe : kUnbounded;
    } else {
      r.demand = r.real_rate * (1 + cfg.headroom);
    }
    step.rows.push_back(std::move(r));
  }
  // Start-up: a stage whose rate is not known yet holds an equal share, and
  // so does each expected stage not seen yet (a claim that nobody is given).
  if (step.start_up) {
    const int seen =
        static_cast<int>(step.rows.size() + step.unknown.size()) + step.kept + step.absent;
    step.phantoms = std::max(0, cfg.expected_stages - seen);
    step.unknown_share = cfg.max_bandwidth / std::max({1, seen, cfg.expected_stages});
    for (std::size_t i = 0; i < step.unknown.size(); ++i) step.unknown_held += step.unknown_share;
  }
}

void MaxminPolicy::decide(Step& step) const {
  const MaxminConfig& cfg = config_;
  step.capacity = std::max(0.0, cfg.max_bandwidth - step.held - step.kept_sum - step.unknown_held);

  // Goals are floors; when they cannot all be met, scale them down alike.
  for (const Step::Row& r : step.rows) step.goal_sum += r.set.goal;
  step.goal_sum += step.phantoms * cfg.default_goal;
  step.goal_scale = step.goal_sum > step.capacity ? step.capacity / step.goal_sum : 1.0;

  std::vector<Claim> claims;
  claims.reserve(step.rows.size() + static_cast<std::size_t>(step.phantoms));
  for (const Step::Row& r : step.rows) {
    claims.push_back({r.demand, r.set.weight, r.set.goal * step.goal_scale});
  }
  for (int i = 0; i < step.phantoms; ++i) {
    claims.push_back({kUnbounded, cfg.default_weight, cfg.default_goal * step.goal_scale});
  }
  const std::vector<double> alloc = water_fill(step.capacity, claims);

  double allocated = 0;
  double weight_sum = 0;
  for (double a : alloc) allocated += a;
  for (const Step::Row& r : step.rows) weight_sum += r.set.weight;
  step.surplus = std::max(0.0, step.capacity - allocated);
  const bool share_surplus =
      cfg.distribute_surplus && step.surplus > 1e-9 * step.capacity && weight_sum > 0;
  for (std::size_t i = 0; i < step.rows.size(); ++i) {
    Step::Row& r = step.rows[i];
    r.allocation = alloc[i];
    if (share_surplus) r.allocation += step.surplus * r.set.weight / weight_sum;
  }
}

void MaxminPolicy::emit(Step& step, PolicyOutput& out) {
  const MaxminConfig& cfg = config_;
  for (StageMemory* m : step.unknown) {
    m->allocation = step.unknown_share;
    m->allocated = false;
  }
  for (Step::Row& r : step.rows) {
    StageMemory& mem = *r.mem;
    const double factor = cfg.calibration.enabled ? mem.factor : 1.0;
    const std::int64_t rate = stage_view::to_rate(std::max(cfg.min_rate, r.allocation * factor));
    mem.allocation = r.allocation;
    mem.allocated = true;
    // A new stage without its limiter gets one (install_layout); one that has
    // it, the rate when it moved by more than the hysteresis.
    const bool install = !r.limiter_exists && cfg.install_layout && r.is_new;
    const bool changed =
        r.limiter_exists && (!mem.sent || std::abs(static_cast<double>(rate - mem.sent_rate)) >
                                              cfg.hysteresis * static_cast<double>(mem.sent_rate));
    r.missing = !r.limiter_exists && !install;
    if (!install && !changed) continue;
    auto batch = limiter_rules(cfg, r.set, *r.st, r.limiter_exists, rate).build();
    if (!batch.is_ok()) {
      r.error = batch.status().message();  // a name in the config a stage refuses
      continue;
    }
    mem.sent = true;
    mem.sent_rate = rate;
    out.rules[r.st->name] = std::move(batch).value();
  }
}

void MaxminPolicy::report(const PolicyInput& input, const Step& step, PolicyOutput& out) const {
  const MaxminConfig& cfg = config_;
  json report_stages = json::object();
  for (const Step::Row& r : step.rows) {
    const StageMemory& mem = *r.mem;
    json rep = {{"new", r.is_new},
                {"goal", r.set.goal * step.goal_scale},
                {"weight", r.set.weight},
                {"stage_rate", r.stage_rate},
                {"measured", r.real_rate},
                {"throttled", r.throttled},
                {"demand", finite_or(r.demand, "unbounded")},
                {"allocation", r.allocation},
                {"factor", cfg.calibration.enabled ? mem.factor : 1.0},
                {"rate", mem.sent ? json(mem.sent_rate) : json(nullptr)}};
    if (r.missing) rep["missing"] = r.set.channel + "/" + r.set.object;
    if (!r.error.empty()) rep["error"] = r.error;
    report_stages[r.st->name] = std::move(rep);
  }
  for (const auto& [name, kept_rep] : step.kept_report.items()) report_stages[name] = kept_rep;
  out.report = {{"policy", "maxmin"},
                {"max_bandwidth", cfg.max_bandwidth},
                {"capacity", step.capacity},
                {"surplus", step.surplus},
                {"stages", std::move(report_stages)}};
  if (step.held > 0) out.report["held"] = step.held_report;
  if (step.start_up) {
    out.report["start_up"] = {
        {"until_ns", input.started_ns + std::llround(cfg.startup_grace_ms * 1e6)},
        {"kept", step.kept_sum + step.unknown_held},
        {"unseen", step.phantoms}};
  }
  if (step.goal_scale < 1.0) {
    out.report["goals_scaled"] = {{"sum", step.goal_sum}, {"scale", step.goal_scale}};
  }
}

PolicyOutput MaxminPolicy::step(const PolicyInput& input) {
  PolicyOutput out;
  Step step;
  measure(input, step);
  decide(step);
  emit(step, out);
  report(input, step, out);
  return out;
}

}  // namespace sluice
