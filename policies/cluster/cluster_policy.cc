// The cluster policies (cluster_policy.h): the JSON forms of node summaries
// and decisions, splitting a rate by demand, the built-in policies
// "global-rate" and "maxmin", and the registry (with "pisces",
// cluster_pisces.cc).
#include "cluster_policy.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <set>

#include "sluice/config_reader.h"
#include "water_fill.h"

namespace sluice::cluster {

using json = nlohmann::json;

// ---------------------------------------------------------------------------
// JSON forms.

namespace {

Status need_string(const json& j, const char* key, std::string* out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string() || it->get_ref<const std::string&>().empty()) {
    return Status::invalid(where + key + ": required, a non-empty string");
  }
  *out = it->get<std::string>();
  return Status::ok();
}

Status need_number(const json& j, const char* key, double* out, const std::string& where,
                   bool required = true) {
  auto it = j.find(key);
  if (it == j.end()) {
    return required ? Status::invalid(where + key + ": required, a number >= 0") : Status::ok();
  }
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0 ||
      it->get<double>() > kMaxClusterValue) {
    return Status::invalid(where + key + ": must be a number from 0 to 1e15, got " +
                           config::shown(*it));
  }
  *out = it->get<double>();
  return Status::ok();
}

// j[key], when present, a whole number within [lo, hi]; `where` ends with ".".
template <typename T>
Status get_whole(const json& j, const char* key, T* out, T lo, T hi, const std::string& where) {
  return config::get_integer(j, where.substr(0, where.size() - 1), key, out, lo, hi);
}

// j[key], when present, a string (possibly empty).
Status get_text(const json& j, const char* key, std::string* out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) return Status::ok();
  if (!it->is_string()) {
    return Status::invalid(where + key + ": must be a string, got " + config::shown(*it));
  }
  *out = it->get<std::string>();
  return Status::ok();
}

}  // namespace

json to_json(const NodeSummary& s) {
  json loads = json::array();
  for (const TenantLoad& l : s.loads) {
    loads.push_back({{"tenant", l.tenant},
                     {"channel", l.channel},
                     {"stages", l.stages},
                     {"demand", l.demand},
                     {"service", l.service},
                     {"ops", l.ops},
                     {"wait", l.wait},
                     {"budget", l.budget},
                     {"backlogged", l.backlogged}});
  }
  return {{"node", s.node}, {"seq", s.seq}, {"interval_s", s.interval_s}, {"loads", loads}};
}

StatusOr<NodeSummary> summary_from_json(const json& j) {
  if (!j.is_object()) return Status::invalid("summary: must be an object");
  NodeSummary s;
  SLUICE_RETURN_IF_ERROR(need_string(j, "node", &s.node, "summary."));
  SLUICE_RETURN_IF_ERROR(get_whole<std::uint64_t>(j, "seq", &s.seq, 0, UINT64_MAX, "summary."));
  SLUICE_RETURN_IF_ERROR(need_number(j, "interval_s", &s.interval_s, "summary.", false));
  auto loads = j.find("loads");
  if (loads == j.end() || !loads->is_array()) {
    return Status::invalid("summary.loads: required, an array");
  }
  for (std::size_t i = 0; i < loads->size(); ++i) {
    const json& lj = (*loads)[i];
    const std::string where = "summary.loads[" + std::to_string(i) + "].";
    if (!lj.is_object()) return Status::invalid(where.substr(0, where.size() - 1) + ": an object");
    TenantLoad l;
    SLUICE_RETURN_IF_ERROR(need_string(lj, "tenant", &l.tenant, where));
    SLUICE_RETURN_IF_ERROR(need_string(lj, "channel", &l.channel, where));
    SLUICE_RETURN_IF_ERROR(get_whole(lj, "stages", &l.stages, 0, 1 << 20, where));
    SLUICE_RETURN_IF_ERROR(need_number(lj, "demand", &l.demand, where));
    SLUICE_RETURN_IF_ERROR(need_number(lj, "service", &l.service, where));
    SLUICE_RETURN_IF_ERROR(need_number(lj, "ops", &l.ops, where, false));
    SLUICE_RETURN_IF_ERROR(need_number(lj, "wait", &l.wait, where, false));
    SLUICE_RETURN_IF_ERROR(need_number(lj, "budget", &l.budget, where, false));
    if (auto b = lj.find("backlogged"); b != lj.end()) {
      if (!b->is_boolean()) return Status::invalid(where + "backlogged: must be true or false");
      l.backlogged = b->get<bool>();
    }
    s.loads.push_back(std::move(l));
  }
  return s;
}

json to_json(const NodeDecision& d) {
  json budgets = json::array();
  for (const Budget& b : d.budgets) {
    json e = {{"tenant", b.tenant},
              {"channel", b.channel},
              {"object", b.object},
              {"field", b.field},
              {"value", b.value}};
    if (b.fallback) e["fallback"] = *b.fallback;
    budgets.push_back(std::move(e));
  }
  json settings = json::array();
  for (const Setting& s : d.settings) {
    settings.push_back({{"tenant", s.tenant},
                        {"channel", s.channel},
                        {"object", s.object},
                        {"field", s.field},
                        {"value", s.value}});
  }
  json rules = json::object();
  for (const auto& [tenant, batch] : d.rules) rules[tenant] = batch;
  return {{"seq", d.seq},       {"term", d.term},       {"leader", d.leader},
          {"budgets", budgets}, {"settings", settings}, {"rules", rules}};
}

StatusOr<NodeDecision> decision_from_json(const json& j) {
  if (!j.is_object()) return Status::invalid("decision: must be an object");
  NodeDecision d;
  SLUICE_RETURN_IF_ERROR(get_whole<std::uint64_t>(j, "seq", &d.seq, 0, UINT64_MAX, "decision."));
  SLUICE_RETURN_IF_ERROR(get_whole<std::int64_t>(j, "term", &d.term, 0, INT64_MAX, "decision."));
  SLUICE_RETURN_IF_ERROR(get_text(j, "leader", &d.leader, "decision."));
  auto parse_set = [&](const char* key, auto&& add) -> Status {
    auto it = j.find(key);
    if (it == j.end()) return Status::ok();
    if (!it->is_array()) return Status::invalid(std::string("decision.") + key + ": an array");
    for (std::size_t i = 0; i < it->size(); ++i) {
      const json& e = (*it)[i];
      const std::string where = std::string("decision.") + key + "[" + std::to_string(i) + "].";
      if (!e.is_object()) return Status::invalid(where + ": an object");
      Setting s;
      SLUICE_RETURN_IF_ERROR(need_string(e, "tenant", &s.tenant, where));
      SLUICE_RETURN_IF_ERROR(need_string(e, "channel", &s.channel, where));
      SLUICE_RETURN_IF_ERROR(need_string(e, "object", &s.object, where));
      s.field = "rate";
      SLUICE_RETURN_IF_ERROR(get_text(e, "field", &s.field, where));
      if (s.field.empty()) return Status::invalid(where + "field: must not be empty");
      SLUICE_RETURN_IF_ERROR(need_number(e, "value", &s.value, where));
      SLUICE_RETURN_IF_ERROR(add(std::move(s), e, where));
    }
    return Status::ok();
  };
  auto add_budget = [&](Setting s, const json& e, const std::string& where) -> Status {
    Budget b{s.tenant, s.channel, s.object, s.field, s.value, std::nullopt};
    if (e.contains("fallback")) {
      double fallback = 0;
      SLUICE_RETURN_IF_ERROR(need_number(e, "fallback", &fallback, where));
      b.fallback = fallback;
    }
    d.budgets.push_back(std::move(b));
    return Status::ok();
  };
  auto add_setting = [&](Setting s, const json& e, const std::string& where) -> Status {
    if (e.contains("fallback")) return Status::invalid(where + "fallback: only a budget has one");
    d.settings.push_back(std::move(s));
    return Status::ok();
  };
  SLUICE_RETURN_IF_ERROR(parse_set("budgets", add_budget));
  SLUICE_RETURN_IF_ERROR(parse_set("settings", add_setting));
  if (auto r = j.find("rules"); r != j.end()) {
    if (!r->is_object()) return Status::invalid("decision.rules: an object of batches by tenant");
    for (const auto& [tenant, batch] : r->items()) d.rules[tenant] = batch;
  }
  return d;
}

bool same_content(const NodeDecision& a, const NodeDecision& b, double tolerance) {
  auto close = [&](double x, double y) {
    return std::fabs(x - y) <= tolerance * std::max(std::fabs(x), std::fabs(y));
  };
  if (a.budgets.size() != b.budgets.size() || a.settings.size() != b.settings.size() ||
      a.rules != b.rules) {
    return false;
  }
  for (std::size_t i = 0; i < a.budgets.size(); ++i) {
    const Budget& x = a.budgets[i];
    const Budget& y = b.budgets[i];
    if (x.tenant != y.tenant || x.channel != y.channel || x.object != y.object ||
        x.field != y.field || !close(x.value, y.value) ||
        x.fallback.has_value() != y.fallback.has_value() ||
        (x.fallback && !close(*x.fallback, *y.fallback))) {
      return false;
    }
  }
  for (std::size_t i = 0; i < a.settings.size(); ++i) {
    const Setting& x = a.settings[i];
    const Setting& y = b.settings[i];
    if (x.tenant != y.tenant || x.channel != y.channel || x.object != y.object ||
        x.field != y.field || !close(x.value, y.value)) {
      return false;
    }
  }
  return true;
}

std::vector<double> split_by_demand(double total, const std::vector<double>& demands, double floor,
                                    const std::vector<bool>& backlogged) {
  const std::size_t n = demands.size();
  if (n == 0) return {};
  total = std::isfinite(total) && total > 0 ? total : 0.0;
  const double fl = std::min(floor, total / static_cast<double>(n));
  std::vector<Claim> claims(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double dm = std::isfinite(demands[i]) && demands[i] > 0 ? demands[i] : 0.0;
    claims[i] = Claim{std::max(dm, fl), 1.0, fl};  // the floor even for an idle claimant
  }
  std::vector<double> out = water_fill(total, claims);
  const double given = std::accumulate(out.begin(), out.end(), 0.0);
  const double surplus = total - given;
  if (surplus > 0) {
    // To the held back if any (a claimant that is not would leave it unused).
    std::vector<bool> takes(n, true);
    if (backlogged.size() == n &&
        std::find(backlogged.begin(), backlogged.end(), true) != backlogged.end()) {
      takes = backlogged;
    }
    double sum_demand = 0;
    std::size_t takers = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!takes[i]) continue;
      sum_demand += claims[i].demand;
      ++takers;
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (!takes[i]) continue;
      out[i] += sum_demand > 0 ? surplus * claims[i].demand / sum_demand
                               : surplus / static_cast<double>(takers);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// The policies: a tenant's total, decided by each policy its own way, split
// across the nodes that host it by their demands, moved toward from the last
// split by `gain` (kept in the state, with the step count).

namespace {

struct TenantTarget {
  std::string channel;
  std::string object;
  std::string field = "rate";
};

class SplitPolicy : public ClusterPolicy {
 public:
  json state() const override {
    json alloc = json::object();
    for (const auto& [tenant, nodes] : alloc_) alloc[tenant] = nodes;
    json left = json::object();
    for (const auto& [tenant, nodes] : left_) {
      for (const auto& [node, l] : nodes) left[tenant][node] = {l.step, l.reserve};
    }
    return {{"steps", steps_}, {"alloc", alloc}, {"left", left}};
  }

  Status restore(const json& s) override {
    if (!s.is_object()) return Status::invalid("state: must be an object");
    auto steps = s.find("steps");
    if (steps == s.end() || !steps->is_number_unsigned()) {
      return Status::invalid("state.steps: required, a count");
    }
    std::map<std::string, std::map<std::string, double>> alloc;
    auto a = s.find("alloc");
    if (a == s.end() || !a->is_object()) return Status::invalid("state.alloc: required, an object");
    for (const auto& [tenant, nodes] : a->items()) {
      if (!nodes.is_object()) return Status::invalid("state.alloc." + tenant + ": an object");
      for (const auto& [node, v] : nodes.items()) {
        double x = 0;
        SLUICE_RETURN_IF_ERROR(config::read_number(v, "state.alloc." + tenant + "." + node, &x, 0,
                                                   true, kMaxClusterValue));
        alloc[tenant][node] = x;
      }
    }
    std::map<std::string, std::map<std::string, Left>> left;
    if (auto l = s.find("left"); l != s.end()) {  // optional: no node has departed
      if (!l->is_object()) return Status::invalid("state.left: must be an object");
      for (const auto& [tenant, nodes] : l->items()) {
        if (!nodes.is_object()) return Status::invalid("state.left." + tenant + ": an object");
        for (const auto& [node, v] : nodes.items()) {
          const std::string where = "state.left." + tenant + "." + node;
          if (!v.is_array() || v.size() != 2 || !v[0].is_number_unsigned()) {
            return Status::invalid(where + ": must be [step, reserve]");
          }
          Left e{v[0].get<std::uint64_t>(), 0};
          SLUICE_RETURN_IF_ERROR(
              config::read_number(v[1], where + "[1]", &e.reserve, 0, true, kMaxClusterValue));
          left[tenant][node] = e;
        }
      }
    }
    steps_ = steps->get<std::uint64_t>();
    alloc_ = std::move(alloc);
    left_ = std::move(left);
    return Status::ok();
  }

 protected:
  // Common settings: channel, object, min_rate, gain.
  Status configure_common(const json& c) {
    if (!c.is_object()) return Status::invalid("config: must be an object");
    std::string channel = "app";
    std::string object = "limit";
    SLUICE_RETURN_IF_ERROR(get_text(c, "channel", &channel, ""));
    SLUICE_RETURN_IF_ERROR(get_text(c, "object", &object, ""));
    double min_rate = 65536;
    double gain = 1;
    double hold = 300;
    SLUICE_RETURN_IF_ERROR(need_number(c, "min_rate", &min_rate, "", false));
    SLUICE_RETURN_IF_ERROR(need_number(c, "gain", &gain, "", false));
    SLUICE_RETURN_IF_ERROR(need_number(c, "departed_hold_s", &hold, "", false));
    if (gain <= 0 || gain > 1) return Status::invalid("gain: must be in (0, 1]");
    if (channel.empty() || object.empty()) {
      return Status::invalid("channel, object: must not be empty");
    }
    channel_ = std::move(channel);
    object_ = std::move(object);
    min_rate_ = min_rate;
    gain_ = gain;
    departed_hold_s_ = hold;
    return Status::ok();
  }

  json common_json() const {
    return {{"channel", channel_},
            {"object", object_},
            {"min_rate", min_rate_},
            {"gain", gain_},
            {"departed_hold_s", departed_hold_s_}};
  }

  // Tenant demands by node, for `channel`.
  static std::map<std::string, double> demands_of(const ClusterInput& in, const std::string& tenant,
                                                  const std::string& channel) {
    std::map<std::string, double> d;
    for (const NodeSummary& n : in.nodes) {
      for (const TenantLoad& l : n.loads) {
        if (l.tenant == tenant && l.channel == channel) d[n.node] += l.demand;
      }
    }
    return d;
  }

  // The nodes where a tenant's stages of `channel` are held back.
  static std::set<std::string> backlogged_of(const ClusterInput& in, const std::string& tenant,
                                             const std::string& channel) {
    std::set<std::string> b;
    for (const NodeSummary& n : in.nodes) {
      for (const TenantLoad& l : n.loads) {
        if (l.tenant == tenant && l.channel == channel && l.backlogged) b.insert(n.node);
      }
    }
    return b;
  }

  // Splits `total` for `tenant` across the nodes in `demands` (what nobody
  // demands to the `backlogged` among them, if any), from the last split
  // toward the new one by gain, into `out` and the report.
  void split(const std::string& tenant, const TenantTarget& t, double total,
             const std::map<std::string, double>& demands, const std::set<std::string>& backlogged,
             const ClusterInput& in, ClusterOutput& out, json& report) {
    auto& last = alloc_[tenant];
    // Nodes whose leases are gone may still run, cut off from etcd, at the fallback they
    // were given: it stays reserved for departed_hold_s, out of what the others share.
    // Every node of the last step was told that step's fallback.
    auto& left = left_[tenant];
    const auto told = fallback_.find(tenant);
    const double last_fallback = told != fallback_.end() ? told->second : min_rate_;
    for (const auto& [node, v] : last) {
      if (!demands.count(node) && !left.count(node)) left[node] = Left{steps_, last_fallback};
    }
    const double interval_s = in.interval_ns > 0 ? static_cast<double>(in.interval_ns) / 1e9 : 1.0;
    const auto hold_steps = static_cast<std::uint64_t>(std::ceil(departed_hold_s_ / interval_s));
    double reserved = 0;
    json departed = json::array();
    for (auto it = left.begin(); it != left.end();) {
      if (demands.count(it->first) || steps_ - it->second.step >= hold_steps) {
        it = left.erase(it);  // back, or gone long enough
        continue;
      }
      reserved += it->second.reserve;
      departed.push_back({{"node", it->first}, {"reserve", it->second.reserve}});
      ++it;
    }
    if (left.empty()) left_.erase(tenant);
    total = std::max(0.0, total - reserved);
    std::vector<std::string> nodes;
    std::vector<double> dm;
    std::vector<bool> held;
    for (const auto& [node, d] : demands) {
      nodes.push_back(node);
      held.push_back(backlogged.count(node) > 0);
      // A node held back claims at least what it was last given: its summary
      // may still describe an interval under an older, smaller budget (it
      // applies a decision at its own next step), and taking that for its
      // demand would swing its budget between the two every other step.
      auto it = last.find(node);
      dm.push_back(held.back() && it != last.end() ? std::max(d, it->second) : d);
    }
    std::vector<double> target = split_by_demand(total, dm, min_rate_, held);
    // What each node falls back to without its lease: the floor split_by_demand gives.
    const double fallback =
        nodes.empty() ? 0.0 : std::min(min_rate_, total / static_cast<double>(nodes.size()));
    std::map<std::string, double> next;
    double sum = 0;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      auto it = last.find(nodes[i]);
      double v = it == last.end() ? target[i] : it->second + gain_ * (target[i] - it->second);
      next[nodes[i]] = v;
      sum += v;
    }
    if (sum > 0) {
      for (auto& [node, v] : next) v *= total / sum;  // the parts make the total exactly
    }
    last = next;
    fallback_[tenant] = fallback;
    json by_node = json::object();
    for (const auto& [node, v] : next) {
      out.decisions[node].budgets.push_back({tenant, t.channel, t.object, t.field, v, fallback});
      by_node[node] = {
          {"demand", demands.at(node)}, {"budget", v}, {"backlogged", backlogged.count(node) > 0}};
    }
    report[tenant] = {
        {"total", total}, {"reserved", reserved}, {"nodes", by_node}, {"departed", departed}};
  }

  void begin_step(const ClusterInput& in, ClusterOutput& out) {
    ++steps_;
    for (const NodeSummary& n : in.nodes) out.decisions[n.node];  // every live node is told
  }

  void end_step(ClusterOutput& out, json tenants) const {
    for (auto& [node, d] : out.decisions) {
      std::sort(d.budgets.begin(), d.budgets.end(),
                [](const Budget& a, const Budget& b) { return a.tenant < b.tenant; });
    }
    out.report = {{"steps", steps_}, {"tenants", std::move(tenants)}};
  }

  // A departed node: the step it was first missing at, and what stays reserved for it.
  struct Left {
    std::uint64_t step = 0;
    double reserve = 0;
  };

  std::string channel_ = "app";
  std::string object_ = "limit";
  double min_rate_ = 65536;
  double gain_ = 1;
  double departed_hold_s_ = 300;
  std::uint64_t steps_ = 0;
  std::map<std::string, std::map<std::string, double>> alloc_;  // tenant -> node -> bytes/s
  std::map<std::string, std::map<std::string, Left>> left_;     // tenant -> departed node
  // tenant -> the fallback the last step's decisions carried, the same for every node
  // (what a departure reserves; a new leader, which has no record of it, reserves the
  // floor, min_rate).
  std::map<std::string, double> fallback_;
};

// "global-rate": every configured tenant's limit holds over the cluster.
class GlobalRatePolicy final : public SplitPolicy {
 public:
  std::string_view name() const noexcept override { return "global-rate"; }

  Status configure(const json& c) override {
    SLUICE_RETURN_IF_ERROR(configure_common(c));
    auto t = c.find("tenants");
    if (t == c.end() || !t->is_object() || t->empty()) {
      return Status::invalid("tenants: required, an object of {\"limit\": bytes/s} by tenant");
    }
    std::map<std::string, Tenant> tenants;
    for (const auto& [name, tj] : t->items()) {
      const std::string where = "tenants." + name + ".";
      if (!tj.is_object()) return Status::invalid(where.substr(0, where.size() - 1) + ": object");
      Tenant tn;
      SLUICE_RETURN_IF_ERROR(need_number(tj, "limit", &tn.limit, where));
      tn.target = {channel_, object_, "rate"};
      SLUICE_RETURN_IF_ERROR(get_text(tj, "channel", &tn.target.channel, where));
      SLUICE_RETURN_IF_ERROR(get_text(tj, "object", &tn.target.object, where));
      SLUICE_RETURN_IF_ERROR(get_text(tj, "field", &tn.target.field, where));
      if (tn.target.channel.empty() || tn.target.object.empty() || tn.target.field.empty()) {
        return Status::invalid(where + "channel, object, field: must not be empty");
      }
      tenants[name] = tn;
    }
    tenants_ = std::move(tenants);
    return Status::ok();
  }

  ClusterOutput step(const ClusterInput& in) override {
    ClusterOutput out;
    begin_step(in, out);
    json report = json::object();
    for (const auto& [name, t] : tenants_) {
      split(name, t.target, t.limit, demands_of(in, name, t.target.channel),
            backlogged_of(in, name, t.target.channel), in, out, report);
    }
    end_step(out, std::move(report));
    return out;
  }

  json describe() const override {
    json j = common_json();
    for (const auto& [name, t] : tenants_) {
      j["tenants"][name] = {{"limit", t.limit},
                            {"channel", t.target.channel},
                            {"object", t.target.object},
                            {"field", t.target.field}};
    }
    return j;
  }

 private:
  struct Tenant {
    double limit = 0;
    TenantTarget target;
  };
  std::map<std::string, Tenant> tenants_;
};

// "maxmin": tenants share `capacity` max-min fairly (weights, floors, demand
// caps: water_fill) by their cluster-wide demands; each tenant's share is
// split across its nodes by demand. Tenants not configured take part with
// default_weight.
class ClusterMaxminPolicy final : public SplitPolicy {
 public:
  std::string_view name() const noexcept override { return "maxmin"; }

  Status configure(const json& c) override {
    SLUICE_RETURN_IF_ERROR(configure_common(c));
    double capacity = 0;
    double default_weight = 1;
    SLUICE_RETURN_IF_ERROR(need_number(c, "capacity", &capacity, ""));
    SLUICE_RETURN_IF_ERROR(need_number(c, "default_weight", &default_weight, "", false));
    std::map<std::string, Claim> tenants;
    if (auto t = c.find("tenants"); t != c.end()) {
      if (!t->is_object()) return Status::invalid("tenants: an object by tenant");
      for (const auto& [name, tj] : t->items()) {
        const std::string where = "tenants." + name + ".";
        if (!tj.is_object()) return Status::invalid(where.substr(0, where.size() - 1) + ": object");
        Claim cl{0, default_weight, 0};
        SLUICE_RETURN_IF_ERROR(need_number(tj, "weight", &cl.weight, where, false));
        SLUICE_RETURN_IF_ERROR(need_number(tj, "floor", &cl.floor, where, false));
        tenants[name] = cl;
      }
    }
    capacity_ = capacity;
    default_weight_ = default_weight;
    tenants_ = std::move(tenants);
    return Status::ok();
  }

  ClusterOutput step(const ClusterInput& in) override {
    ClusterOutput out;
    begin_step(in, out);
    std::set<std::string> names;
    for (const NodeSummary& n : in.nodes) {
      for (const TenantLoad& l : n.loads) {
        if (l.channel == channel_) names.insert(l.tenant);
      }
    }
    std::vector<std::string> order(names.begin(), names.end());
    std::vector<std::map<std::string, double>> demands;
    std::vector<Claim> claims;
    for (const std::string& t : order) {
      demands.push_back(demands_of(in, t, channel_));
      double total = 0;
      for (const auto& [node, d] : demands.back()) total += d;
      auto it = tenants_.find(t);
      Claim cl = it == tenants_.end() ? Claim{0, default_weight_, 0} : it->second;
      cl.demand = total;
      claims.push_back(cl);
    }
    std::vector<double> shares = water_fill(capacity_, claims);
    // What nobody demands goes by weight, so that demand can grow into it.
    double given = std::accumulate(shares.begin(), shares.end(), 0.0);
    double weights = 0;
    for (const Claim& cl : claims) weights += cl.weight;
    for (std::size_t i = 0; i < shares.size() && weights > 0 && given < capacity_; ++i) {
      shares[i] += (capacity_ - given) * claims[i].weight / weights;
    }
    json report = json::object();
    const TenantTarget target{channel_, object_, "rate"};
    for (std::size_t i = 0; i < order.size(); ++i) {
      split(order[i], target, shares[i], demands[i], backlogged_of(in, order[i], channel_), in, out,
            report);
    }
    end_step(out, std::move(report));
    out.report["capacity"] = capacity_;
    return out;
  }

  json describe() const override {
    json j = common_json();
    j["capacity"] = capacity_;
    j["default_weight"] = default_weight_;
    for (const auto& [name, cl] : tenants_) {
      j["tenants"][name] = {{"weight", cl.weight}, {"floor", cl.floor}};
    }
    return j;
  }

 private:
  double capacity_ = 0;
  double default_weight_ = 1;
  std::map<std::string, Claim> tenants_;
};

using Factory = std::function<std::unique_ptr<ClusterPolicy>()>;

const std::map<std::string, Factory, std::less<>>& factories() {
  static const auto* f = new std::map<std::string, Factory, std::less<>>{
      {"global-rate", [] { return std::make_unique<GlobalRatePolicy>(); }},
      {"maxmin", [] { return std::make_unique<ClusterMaxminPolicy>(); }},
      {"pisces", [] { return make_pisces_cluster_policy(); }},
  };
  return *f;
}

}  // namespace

std::vector<std::string> cluster_policy_names() {
  std::vector<std::string> names;
  for (const auto& [name, f] : factories()) names.push_back(name);
  return names;
}

StatusOr<std::unique_ptr<ClusterPolicy>> make_cluster_policy(std::string_view name,
                                                             const json& config) {
  auto it = factories().find(name);
  if (it == factories().end()) {
    std::string known;
    for (const std::string& n : cluster_policy_names()) known += (known.empty() ? "" : ", ") + n;
    return Status::invalid("unknown cluster policy '" + std::string(name) + "' (known: " + known +
                           ")");
  }
  std::unique_ptr<ClusterPolicy> p = it->second();
  Status s = p->configure(config.is_null() ? json::object() : config);
  if (!s.is_ok()) return s.with_prefix("cluster policy '" + std::string(name) + "': ");
  return p;
}

}  // namespace sluice::cluster
