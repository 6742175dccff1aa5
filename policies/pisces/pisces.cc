// Pisces weight allocation across stages; see pisces.h. The swap search
// itself is in pisces_swap.cc.
#include "pisces.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <utility>

#include "pisces_solve.h"
#include "pisces_swap.h"
#include "sluice/config_reader.h"
#include "sluice/rule_builder.h"
#include "stage_view.h"

namespace sluice {
namespace {

using nlohmann::json;
using namespace config;  // NOLINT(google-build-using-namespace)

// Two weights the fq would not tell apart (a JSON double round-trips
// exactly; this absorbs only arithmetic noise).
bool same_weight(double a, double b) {
  return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b));
}

// A tenant (flow) id written as JSON object key: decimal digits only.
bool parse_id(std::string_view s, std::uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

std::string_view method_name(PiscesMethod m) {
  switch (m) {
    case PiscesMethod::kReciprocal:
      return "reciprocal";
    case PiscesMethod::kMaxmin:
      return "maxmin";
    case PiscesMethod::kMbf:
      break;
  }
  return "mbf";
}

// The fq object of a stage: its channel and statistics, or null.
struct Located {
  std::string channel;
  const ObjectStats* object = nullptr;
};

Located locate(const PiscesConfig& cfg, const StageView& st) {
  for (const ChannelStats& c : st.stats.channels) {
    if (!cfg.channel.empty() && c.name != cfg.channel) continue;
    if (const ObjectStats* o = stage_view::find_object(&c, cfg.object)) return {c.name, o};
  }
  return {};
}

// A non-negative number of a flow's entry; 0 when absent or not a number.
double counter(const json& flow, const char* field) {
  auto it = flow.find(field);
  if (it == flow.end() || !it->is_number()) return 0;
  return std::max(0.0, it->get<double>());
}

// A flow entry's id: a non-negative integer ("other", the flows beyond the
// fq's max_flows, is no tenant).
bool fq_flow_id(const json& flow, std::uint64_t* out) {
  auto it = flow.find("flow");
  if (it == flow.end()) return false;
  if (it->is_number_unsigned()) {
    *out = it->get<std::uint64_t>();
    return true;
  }
  if (it->is_number_integer() && it->get<std::int64_t>() >= 0) {
    *out = static_cast<std::uint64_t>(it->get<std::int64_t>());
    return true;
  }
  return false;
}

}  // namespace

// ---------------------------------------------------------------------------
// Configuration.

double PiscesConfig::global_weight(std::uint64_t tenant) const {
  auto it = global_weights.find(tenant);
  return it == global_weights.end() ? default_weight : it->second;
}

StatusOr<PiscesConfig> parse_pisces_config(const json& j) {
  PiscesConfig c;
  if (j.is_null()) return c;
  SLUICE_RETURN_IF_ERROR(check_keys(
      j, "",
      {"object", "channel", "global_weights", "default_weight", "method", "min_swap", "max_swaps",
       "backlog_fraction", "headroom", "tolerance", "damping", "floor", "match_labels"}));
  SLUICE_RETURN_IF_ERROR(get_string(j, "", "object", &c.object));
  if (auto it = j.find("channel"); it != j.end() && !it->is_null()) {
    SLUICE_RETURN_IF_ERROR(get_string(j, "", "channel", &c.channel));
  }
  const double lo = PiscesPolicy::kMinWeight;
  const double hi = PiscesPolicy::kMaxWeight;
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "default_weight", &c.default_weight, lo, true, hi));
  if (auto it = j.find("global_weights"); it != j.end()) {
    if (!it->is_object()) {
      return Status::invalid("global_weights: must be an object of tenant id -> weight, got " +
                             it->dump());
    }
    for (const auto& [key, value] : it->items()) {
      std::uint64_t id = 0;
      if (!parse_id(key, &id)) {
        return Status::invalid("global_weights." + key +
                               ": a tenant id must be a decimal integer >= 0");
      }
      double w = 0;
      SLUICE_RETURN_IF_ERROR(get_number(*it, "global_weights", key, &w, lo, true, hi));
      c.global_weights[id] = w;
    }
  }
  SLUICE_RETURN_IF_ERROR(get_choice<PiscesMethod>(j, "", "method",
                                                  {{"mbf", PiscesMethod::kMbf},
                                                   {"reciprocal", PiscesMethod::kReciprocal},
                                                   {"maxmin", PiscesMethod::kMaxmin}},
                                                  &c.method));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "min_swap", &c.min_swap, 0, false, 1));
  if (auto it = j.find("max_swaps"); it != j.end()) {
    if (!it->is_number_integer() || it->get<std::int64_t>() < 0 ||
        it->get<std::int64_t>() > 100000) {
      return Status::invalid("max_swaps: must be an integer in 0..100000, got " + it->dump());
    }
    c.max_swaps = it->get<int>();
  }
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "backlog_fraction", &c.backlog_fraction, 0, false, 1));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "headroom", &c.headroom, 0, true, 10));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "tolerance", &c.tolerance, 0, true, 10));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "damping", &c.damping, 0, false, 1));
  SLUICE_RETURN_IF_ERROR(get_number(j, "", "floor", &c.floor, 0, false, 1));
  if (c.floor >= 1) {
    return Status::invalid("floor: must be < 1 (a fraction of the global weight), got " +
                           format_number(c.floor));
  }
  SLUICE_RETURN_IF_ERROR(get_labels(j, "", "match_labels", &c.match_labels));
  return c;
}

json pisces_config_to_json(const PiscesConfig& c) {
  json weights = json::object();
  for (const auto& [id, w] : c.global_weights) weights[std::to_string(id)] = w;
  return {{"object", c.object},
          {"channel", c.channel.empty() ? json(nullptr) : json(c.channel)},
          {"global_weights", weights},
          {"default_weight", c.default_weight},
          {"method", method_name(c.method)},
          {"min_swap", c.min_swap},
          {"max_swaps", c.max_swaps},
          {"backlog_fraction", c.backlog_fraction},
          {"headroom", c.headroom},
          {"tolerance", c.tolerance},
          {"damping", c.damping},
          {"floor", c.floor},
          {"match_labels", c.match_labels}};
}

Status PiscesPolicy::configure(const json& config) {
  auto parsed = parse_pisces_config(config);
  if (!parsed.is_ok()) return parsed.status();
  config_ = std::move(parsed).value();
  stages_.clear();  // every stage starts again from the global weights
  return Status::ok();
}

json PiscesPolicy::describe() const {
  return pisces_config_to_json(config_);
}

std::map<std::string, std::map<std::uint64_t, double>> PiscesPolicy::local_weights() const {
  std::map<std::string, std::map<std::uint64_t, double>> out;
  for (const auto& [name, mem] : stages_) {
    auto& w = out[name];
    for (const auto& [id, f] : mem.flows) w[id] = f.weight;
  }
  return out;
}

std::unique_ptr<Policy> make_pisces_policy() {
  return std::make_unique<PiscesPolicy>();
}

// ---------------------------------------------------------------------------
// The step.

struct PiscesPolicy::Step {
  struct Row {
    std::string name;
    StageMemory* mem = nullptr;
    bool present = false;  // in this step's input with its fq (else held: absent)
    bool is_new = false;
    bool resend = false;  // restarted, or its fq lost a weight: send every weight again
    std::vector<std::uint64_t> flows;  // its cells' tenants, in cell order
    std::size_t first_cell = 0;
  };
  // One flow's reading, before the model is built.
  struct Reading {
    bool measured = false;
    double served = 0, arrived = 0, backlogged = 0;  // fractions of the interval
    double reported = std::nan("");
  };
  std::vector<Row> rows;
  std::vector<std::map<std::uint64_t, Reading>> readings;  // per row
  pisces::Model model;
  std::vector<double> measured_service;  // per tenant, before the swaps' estimates
  double fair_level = 0;
  std::vector<pisces::Swap> swaps;
  std::vector<double> weights_before;  // per cell, as measured
  bool solved = false;                 // method "maxmin": the step below holds its figures
  pisces::MaxminStep maxmin;
  json errors = json::object();
  json departed = json::object();
};

void PiscesPolicy::forget(const PolicyInput& input, Step& step) {
  std::set<std::string> present;
  for (const StageView& st : input.stages) {
    if (stage_view::labels_match(config_.match_labels, st.labels) &&
        locate(config_, st).object != nullptr) {
      present.insert(st.name);
    }
  }
  // What each tenant holds above (> 0) or below (< 0) its due over the stages
  // left, once the removed stages' weights are gone.
  std::map<std::uint64_t, double> excess;
  auto remove = [&](std::map<std::string, StageMemory>::iterator it, const char* why) {
    for (const auto& [id, f] : it->second.flows) excess[id] += config_.global_weight(id) - f.weight;
    step.departed[it->first] = why;
    return stages_.erase(it);
  };
  for (const auto& name : input.departed) {
    if (auto it = stages_.find(name); it != stages_.end()) remove(it, "departed");
  }
  for (auto it = stages_.begin(); it != stages_.end();) {
    if (present.count(it->first)) {
      it->second.absent_steps = 0;
      ++it;
    } else if (++it->second.absent_steps > kForgetAfterAbsentSteps) {
      it = remove(it, "absent");
    } else {
      ++it;
    }
  }
  if (excess.empty()) return;
  // Repair: at each stage left, a tenant holding too much gives to one
  // holding too little. A tenant with no stage left has nothing to repair.
  std::set<std::uint64_t> remaining;
  for (const auto& [name, mem] : stages_) {
    for (const auto& [id, f] : mem.flows) remaining.insert(id);
  }
  for (auto it = excess.begin(); it != excess.end();) {
    it = remaining.count(it->first) ? std::next(it) : excess.erase(it);
  }
  auto unsettled = [&](std::uint64_t id) {
    return std::abs(excess[id]) > 1e-9 * config_.global_weight(id);
  };
  for (auto& [name, mem] : stages_) {
    for (auto& [giver, fg] : mem.flows) {
      if (!excess.count(giver) || excess[giver] <= 0) continue;
      const double floor = std::max(kMinWeight, config_.floor * config_.global_weight(giver));
      for (auto& [taker, ft] : mem.flows) {
        if (!excess.count(taker) || excess[taker] >= 0 || !unsettled(giver)) continue;
        const double x =
            std::min({excess[giver], -excess[taker], fg.weight - floor, kMaxWeight - ft.weight});
        if (x <= 0) continue;
        fg.weight -= x;
        ft.weight += x;
        excess[giver] -= x;
        excess[taker] += x;
      }
    }
  }
  bool reset = false;
  for (const auto& [id, e] : excess) reset = reset || unsettled(id);
  if (reset) {
    // No repair within the stages left: everyone back to the global weights.
    for (auto& [name, mem] : stages_) {
      for (auto& [id, f] : mem.flows) f.weight = config_.global_weight(id);
    }
  }
  step.departed["reset"] = reset;
}

void PiscesPolicy::measure(const PolicyInput& input, Step& step) {
  const PiscesConfig& cfg = config_;
  std::set<std::string> seen;
  for (const StageView& st : input.stages) {
    if (!stage_view::labels_match(cfg.match_labels, st.labels)) continue;
    const Located at = locate(cfg, st);
    if (at.object == nullptr) continue;
    const json& state = at.object->state;
    auto flows_it = state.is_object() ? state.find("flows") : state.end();
    if (!state.is_object() || flows_it == state.end() || !flows_it->is_array()) {
      step.errors[st.name] = "object '" + cfg.object + "' in channel '" + at.channel +
                             "' reports no flows (is it an fq object?)";
      continue;
    }
    Step::Row row;
    row.name = st.name;
    auto it = stages_.find(st.name);
    row.is_new = it == stages_.end();
    if (row.is_new) it = stages_.emplace(st.name, StageMemory{}).first;
    StageMemory& mem = it->second;
    if (!row.is_new && mem.connected_at_ns != st.connected_at_ns) {
      row.resend = true;  // a new connection: its fq may be new too
      for (auto& [id, f] : mem.flows) f.counted = false;
    }
    if (mem.channel != at.channel) row.resend = true;
    // The time the counters cover: between the two collects, else the
    // stage's own interval.
    std::int64_t dt = stage_view::interval_ns(st, input);
    if (mem.collected_at_ns > 0 && st.stats.collected_at_ns > mem.collected_at_ns) {
      dt = st.stats.collected_at_ns - mem.collected_at_ns;
    }
    mem.connected_at_ns = st.connected_at_ns;
    mem.collected_at_ns = st.stats.collected_at_ns;
    mem.channel = at.channel;
    row.mem = &mem;
    row.present = true;
    seen.insert(st.name);

    std::map<std::uint64_t, Step::Reading> reading;
    for (const json& f : *flows_it) {
      std::uint64_t id = 0;
      if (!f.is_object() || !fq_flow_id(f, &id)) continue;
      auto [fit, added] = mem.flows.try_emplace(id);
      FlowMemory& fm = fit->second;
      if (added) fm.weight = cfg.global_weight(id);  // a flow joins with its global weight
      const double served = counter(f, "served_work_ns");
      const double arrived = counter(f, "arrived_work_ns");
      const double backlogged = counter(f, "backlogged_ns");
      Step::Reading& r = reading[id];
      if (auto w = f.find("weight"); w != f.end() && w->is_number()) r.reported = w->get<double>();
      if (fm.counted) {
        const bool forward =
            served >= fm.served_ns && arrived >= fm.arrived_ns && backlogged >= fm.backlogged_ns;
        if (forward && dt > 0) {
          const double s = static_cast<double>(dt);
          r.measured = true;
          r.served = (served - fm.served_ns) / s;
          r.arrived = (arrived - fm.arrived_ns) / s;
          r.backlogged = (backlogged - fm.backlogged_ns) / s;
        } else if (!forward) {
          row.resend = true;  // the fq restarted: it lost its weights too
        }
      }
      fm.counted = true;
      fm.served_ns = served;
      fm.arrived_ns = arrived;
      fm.backlogged_ns = backlogged;
      if (fm.sent >= 0 && !std::isnan(r.reported) && !same_weight(r.reported, fm.weight)) {
        row.resend = true;  // the fq holds another weight than the one sent
      }
    }
    for (auto& [id, fm] : mem.flows) {
      if (reading.count(id)) continue;
      row.resend = true;  // a flow the fq no longer lists: tell it again
      fm.counted = false;
      reading[id];
    }
    step.rows.push_back(std::move(row));
    step.readings.push_back(std::move(reading));
  }
  // Stages absent from this step still enforce what they hold: their
  // weights count in their tenants' sums, and their tenants are not
  // measured in full.
  for (auto& [name, mem] : stages_) {
    if (seen.count(name)) continue;
    Step::Row row;
    row.name = name;
    row.mem = &mem;
    std::map<std::uint64_t, Step::Reading> reading;
    for (const auto& [id, f] : mem.flows) reading[id];
    step.rows.push_back(std::move(row));
    step.readings.push_back(std::move(reading));
  }

  // The model: a node per row, a cell per flow, a tenant per flow id.
  pisces::Model& m = step.model;
  std::map<std::uint64_t, std::size_t> tenant_of;
  for (const auto& reading : step.readings) {
    for (const auto& [id, r] : reading) tenant_of.emplace(id, 0);
  }
  for (auto& [id, index] : tenant_of) {
    index = m.tenants.size();
    pisces::Tenant t;
    t.id = id;
    t.global_weight = cfg.global_weight(id);
    t.floor = std::max(kMinWeight, cfg.floor * t.global_weight);
    t.complete = true;
    m.tenants.push_back(t);
  }
  m.nodes.resize(step.rows.size());
  for (std::size_t n = 0; n < step.rows.size(); ++n) {
    Step::Row& row = step.rows[n];
    row.first_cell = m.cells.size();
    for (const auto& [id, r] : step.readings[n]) {
      pisces::Cell c;
      c.node = n;
      c.tenant = tenant_of.at(id);
      c.weight = row.mem->flows.at(id).weight;
      c.measured = r.measured;
      c.backlogged = r.measured && r.backlogged >= cfg.backlog_fraction;
      c.served = r.served;
      c.arrived = r.arrived;
      pisces::Tenant& t = m.tenants[c.tenant];
      t.complete = t.complete && r.measured;
      t.unsatisfied = t.unsatisfied || c.backlogged;
      m.cells.push_back(c);
      row.flows.push_back(id);
    }
  }
  pisces::prepare(m);
  for (const pisces::Tenant& t : m.tenants) step.measured_service.push_back(t.service);
  for (const pisces::Cell& c : m.cells) step.weights_before.push_back(c.weight);
  step.fair_level = pisces::fair_level(m);
}

void PiscesPolicy::decide(Step& step) const {
  if (config_.method == PiscesMethod::kMaxmin) {
    pisces::MaxminParams p;
    p.headroom = config_.headroom;
    p.damping = config_.damping;
    p.max_weight = kMaxWeight;
    step.maxmin = pisces::maxmin_step(step.model, p);
    step.solved = true;
    return;
  }
  pisces::Params p;
  p.multilateral = config_.method == PiscesMethod::kMbf;
  p.min_swap = config_.min_swap;
  p.max_swaps = config_.max_swaps;
  p.headroom = config_.headroom;
  p.tolerance = config_.tolerance;
  p.damping = config_.damping;
  p.max_weight = kMaxWeight;
  step.swaps = pisces::allocate(step.model, p);
}

void PiscesPolicy::emit(Step& step, PolicyOutput& out) {
  for (std::size_t n = 0; n < step.rows.size(); ++n) {
    const Step::Row& row = step.rows[n];
    if (!row.present) continue;
    bool send = row.is_new || row.resend;
    ObjectConfig weights;
    for (std::size_t i = 0; i < row.flows.size(); ++i) {
      const double w = step.model.cells[row.first_cell + i].weight;
      FlowMemory& fm = row.mem->flows.at(row.flows[i]);
      fm.weight = w;
      send = send || fm.sent < 0 || !same_weight(fm.sent, w);
      weights.set("weight_" + std::to_string(row.flows[i]), w);
    }
    if (!send || row.flows.empty()) continue;
    auto batch = RulesBuilder().configure(row.mem->channel, config_.object, weights).build();
    if (!batch.is_ok()) {
      step.errors[row.name] = batch.status().message();  // a name the stage would refuse
      continue;
    }
    for (auto& [id, fm] : row.mem->flows) fm.sent = fm.weight;
    out.rules[row.name] = std::move(batch).value();
  }
}

void PiscesPolicy::report(const Step& step, PolicyOutput& out) const {
  const pisces::Model& m = step.model;
  json stages = json::object();
  for (std::size_t n = 0; n < step.rows.size(); ++n) {
    const Step::Row& row = step.rows[n];
    json weights = json::object();
    for (std::size_t i = 0; i < row.flows.size(); ++i) {
      weights[std::to_string(row.flows[i])] = m.cells[row.first_cell + i].weight;
    }
    json rep = {{"weights", std::move(weights)}, {"total", m.nodes[n].total}};
    // What the step read, per flow: enough to replay it (served, arrived
    // and backlogged as fractions of the interval; the weight it held).
    json flows = json::object();
    for (std::size_t i = 0; i < row.flows.size(); ++i) {
      const std::size_t ci = row.first_cell + i;
      const Step::Reading& r = step.readings[n].at(row.flows[i]);
      json f = {{"weight", step.weights_before[ci]}, {"measured", r.measured}};
      if (r.measured) {
        f["served"] = r.served;
        f["arrived"] = r.arrived;
        f["backlogged"] = r.backlogged;
      }
      if (step.solved && !std::isnan(step.maxmin.target[ci])) {
        f["allocation"] = step.maxmin.allocation[ci];
        f["target"] = step.maxmin.target[ci];
      }
      flows[std::to_string(row.flows[i])] = std::move(f);
    }
    rep["flows"] = std::move(flows);
    if (step.solved) rep["capacity"] = step.maxmin.capacity[n];
    if (row.present) {
      rep["new"] = row.is_new;
      rep["channel"] = row.mem->channel;
    } else {
      rep["absent"] = true;
    }
    stages[row.name] = std::move(rep);
  }
  // Shares over the tenants of this step: what each got of all the service
  // measured, against its global weight's part of all the global weights.
  double service_sum = 0, weight_sum = 0;
  for (std::size_t i = 0; i < m.tenants.size(); ++i) {
    service_sum += step.measured_service[i];
    weight_sum += m.tenants[i].global_weight;
  }
  json tenants = json::object();
  double lo = 0, hi = 0;
  bool any = false;
  for (std::size_t i = 0; i < m.tenants.size(); ++i) {
    const pisces::Tenant& t = m.tenants[i];
    const double target = weight_sum > 0 ? t.global_weight / weight_sum : 0;
    const double achieved = service_sum > 0 ? step.measured_service[i] / service_sum : 0;
    json backlogged = json::array();
    for (std::size_t ci : t.cells) {
      if (m.cells[ci].backlogged) backlogged.push_back(step.rows[m.cells[ci].node].name);
    }
    tenants[std::to_string(t.id)] = {
        {"global_weight", t.global_weight}, {"stages", t.cells.size()},
        {"target_share", target},           {"achieved_share", achieved},
        {"complete", t.complete},           {"backlogged", std::move(backlogged)}};
    if (step.solved && !std::isnan(step.maxmin.level[i])) {
      tenants[std::to_string(t.id)]["level"] = step.maxmin.level[i];
    }
    if (t.complete && t.unsatisfied && target > 0) {
      const double ratio = achieved / target;
      lo = any ? std::min(lo, ratio) : ratio;
      hi = any ? std::max(hi, ratio) : ratio;
      any = true;
    }
  }
  json swaps = json::array();
  for (const pisces::Swap& s : step.swaps) {
    json path = json::array();
    for (const pisces::Hop& h : s.hops) {
      const pisces::Cell& taker = m.cells[h.taker];
      path.push_back({{"stage", step.rows[taker.node].name},
                      {"taker", m.tenants[taker.tenant].id},
                      {"giver", m.tenants[m.cells[h.giver].tenant].id}});
    }
    swaps.push_back({{"tenant", m.tenants[s.tenant].id},
                     {"weight", s.weight},
                     {"gain", s.gain},
                     {"fairness", s.fairness},
                     {"path", std::move(path)}});
  }
  out.report = {{"policy", "pisces"},
                {"method", method_name(config_.method)},
                {"fair_level", step.fair_level},
                {"stages", std::move(stages)},
                {"tenants", std::move(tenants)},
                {"swaps", std::move(swaps)}};
  // Min-max ratio of achieved / target share over the tenants that queued
  // somewhere (those whose share is not set by their own demand).
  if (any && hi > 0) out.report["mmr"] = lo / hi;
  if (step.solved) {
    const pisces::MaxminStep& r = step.maxmin;
    out.report["maxmin"] = {{"rounds", r.rounds},
                            {"allocation_mmr", r.allocation_mmr},
                            {"expected_mmr_before", r.expected_mmr_before},
                            {"expected_mmr_target", r.expected_mmr_target},
                            {"invariant_deviation", r.invariant_deviation}};
  }
  // The same after the swaps, as the step expects fair queuing to serve them.
  double elo = 0, ehi = 0;
  bool eany = false;
  for (const pisces::Tenant& t : m.tenants) {
    if (step.solved || !t.complete || !t.unsatisfied) continue;
    const double v = t.normalised();
    elo = eany ? std::min(elo, v) : v;
    ehi = eany ? std::max(ehi, v) : v;
    eany = true;
  }
  if (eany && ehi > 0) out.report["expected_mmr"] = elo / ehi;
  if (!step.departed.empty()) out.report["departed"] = step.departed;
  if (!step.errors.empty()) out.report["errors"] = step.errors;
}

PolicyOutput PiscesPolicy::step(const PolicyInput& input) {
  PolicyOutput out;
  Step step;
  forget(input, step);
  measure(input, step);
  decide(step);
  emit(step, out);
  report(step, out);
  return out;
}

}  // namespace sluice
