// The "pisces" cluster policy: Pisces' weight allocation across nodes, each
// node one fair-queued resource, solved each step with the local pisces
// policy's weighted max-min solver (docs/cluster.md, "Cluster policies").
// Local weights are G_t * k * x_tn / X_t (k: the fewest nodes any tenant is
// on); what a tenant on more nodes holds beyond that goes to its cells whose
// demand is met. The damped weights are the state.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "cluster_policy.h"
#include "pisces/pisces_solve.h"
#include "sluice/config_reader.h"

namespace sluice::cluster {

using json = nlohmann::json;
namespace pc = sluice::config;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// The bounds an fq object puts on a weight.
constexpr double kFqMinWeight = 0.001;
constexpr double kFqMaxWeight = 1e6;

class PiscesClusterPolicy final : public ClusterPolicy {
 public:
  std::string_view name() const noexcept override { return "pisces"; }

  Status configure(const json& c) override {
    if (!c.is_object()) return Status::invalid("config: must be an object");
    static const std::set<std::string> kKnown = {
        "tenants", "default_weight", "capacity", "capacities", "unit",       "channel",
        "object",  "field",          "damping",  "min_weight", "max_weight", "backlog_wait"};
    for (const auto& [k, v] : c.items()) {
      if (!kKnown.count(k)) {
        std::string known;
        for (const std::string& n : kKnown) known += (known.empty() ? "" : ", ") + n;
        return Status::invalid(k + ": unknown field (known: " + known + ")");
      }
    }
    Config n;
    SLUICE_RETURN_IF_ERROR(
        pc::get_number(c, "", "default_weight", &n.default_weight, 0, false, 1e6));
    SLUICE_RETURN_IF_ERROR(pc::get_number(c, "", "damping", &n.damping, 0, false, 1));
    SLUICE_RETURN_IF_ERROR(pc::get_number(c, "", "backlog_wait", &n.backlog_wait, 0, true, 1e6));
    SLUICE_RETURN_IF_ERROR(
        pc::get_number(c, "", "min_weight", &n.min_weight, kFqMinWeight, true, kFqMaxWeight));
    SLUICE_RETURN_IF_ERROR(
        pc::get_number(c, "", "max_weight", &n.max_weight, kFqMinWeight, true, kFqMaxWeight));
    if (n.min_weight >= n.max_weight) {
      return Status::invalid("min_weight: must be below max_weight (" + json(n.max_weight).dump() +
                             "), got " + json(n.min_weight).dump());
    }
    SLUICE_RETURN_IF_ERROR(pc::get_string(c, "", "channel", &n.channel));
    SLUICE_RETURN_IF_ERROR(pc::get_string(c, "", "object", &n.object));
    SLUICE_RETURN_IF_ERROR(pc::get_string(c, "", "field", &n.field));
    SLUICE_RETURN_IF_ERROR(pc::get_string(c, "", "unit", &n.unit));
    if (n.unit != "bytes" && n.unit != "ops") {
      return Status::invalid("unit: must be \"bytes\" or \"ops\", got \"" + n.unit + "\"");
    }
    auto cap = c.find("capacity");
    if (cap == c.end()) {
      return Status::invalid(
          "capacity: required, a node's capacity (a number > 0, in the unit) or \"measured\"");
    }
    if (cap->is_string() && cap->get<std::string>() == "measured") {
      n.capacity = 0;
    } else if (cap->is_number() && std::isfinite(cap->get<double>()) && cap->get<double>() > 0 &&
               cap->get<double>() <= kMaxClusterValue) {
      n.capacity = cap->get<double>();
    } else {
      return Status::invalid("capacity: must be a number > 0 or \"measured\", got " +
                             config::shown(*cap));
    }
    if (auto cs = c.find("capacities"); cs != c.end()) {
      if (!cs->is_object()) return Status::invalid("capacities: an object of numbers by node");
      for (const auto& [node, v] : cs->items()) {
        double x = 0;
        SLUICE_RETURN_IF_ERROR(
            config::read_number(v, "capacities." + node, &x, 0, true, kMaxClusterValue));
        n.capacities[node] = x;
      }
    }
    if (auto t = c.find("tenants"); t != c.end()) {
      if (!t->is_object())
        return Status::invalid("tenants: an object of {\"weight\": G} by tenant");
      for (const auto& [tenant, tj] : t->items()) {
        if (!tj.is_object()) return Status::invalid("tenants." + tenant + ": an object");
        for (const auto& [k, v] : tj.items()) {
          if (k != "weight") return Status::invalid("tenants." + tenant + "." + k + ": unknown");
        }
        double w = n.default_weight;
        SLUICE_RETURN_IF_ERROR(
            pc::get_number(tj, "tenants." + tenant, "weight", &w, 0, false, 1e6));
        n.weights[tenant] = w;
      }
    }
    config_ = std::move(n);
    return Status::ok();
  }

  ClusterOutput step(const ClusterInput& in) override {
    ++steps_;
    ClusterOutput out;
    const Config& c = config_;
    // The problem: nodes (stages of the solver), tenants, cells.
    std::vector<std::string> nodes;
    std::map<std::string, std::size_t> tenant_index;
    std::vector<std::string> tenants;
    struct CellIn {
      std::size_t node, tenant;
      double demand, service;
    };
    std::vector<CellIn> cells;
    std::map<std::pair<std::size_t, std::size_t>, std::size_t> cell_of;
    pisces::SolveProblem prob;
    for (const NodeSummary& ns : in.nodes) {
      out.decisions[ns.node];  // every live node is told, if only that it has nothing
      const std::size_t n = nodes.size();
      nodes.push_back(ns.node);
      double served = 0, wanted = 0;
      bool queued = false;
      for (const TenantLoad& l : ns.loads) {
        if (l.channel != c.channel) continue;
        auto [it, added] = tenant_index.emplace(l.tenant, tenants.size());
        if (added) tenants.push_back(l.tenant);
        double service = l.service, demand = l.demand;
        if (c.unit == "ops") {
          service = l.ops;
          demand = l.service > 0 ? l.demand * l.ops / l.service : (l.demand > 0 ? kInf : 0.0);
        }
        // Queued: it would take whatever the node's fair queue gave it.
        const bool waited = l.wait > 0 && l.wait >= c.backlog_wait * std::max(1, l.stages);
        if (waited && c.backlog_wait > 0) demand = kInf;
        served += service;
        wanted += demand;
        queued = queued || waited;
        auto [ci, fresh] = cell_of.emplace(std::make_pair(n, it->second), cells.size());
        if (fresh) {
          cells.push_back({n, it->second, demand, service});
        } else {
          cells[ci->second].demand += demand;
          cells[ci->second].service += service;
        }
      }
      double cap = c.capacity;
      if (auto it = c.capacities.find(ns.node); it != c.capacities.end()) {
        cap = it->second;
      } else if (cap == 0) {
        // Measured: what it served when somebody queued there; else at least
        // what was wanted (nobody is short of it).
        cap = queued ? served : std::max(served, std::isfinite(wanted) ? wanted : served);
      }
      prob.capacity.push_back(cap);
    }
    for (const std::string& t : tenants) prob.weight.push_back(global_weight(t));
    for (const CellIn& ci : cells) {
      prob.cells.push_back({ci.node, ci.tenant, ci.demand, ci.service});
    }
    const pisces::Allocation a = pisces::maxmin_allocate(prob);

    // Target weights per tenant, then damped from the last.
    std::vector<std::vector<std::size_t>> of_tenant(tenants.size());
    for (std::size_t i = 0; i < cells.size(); ++i) of_tenant[cells[i].tenant].push_back(i);
    std::size_t kappa = 0;
    for (const auto& v : of_tenant) kappa = kappa == 0 ? v.size() : std::min(kappa, v.size());
    std::map<std::string, std::map<std::string, double>> next;
    json report_tenants = json::object();
    for (std::size_t t = 0; t < tenants.size(); ++t) {
      const std::vector<std::size_t>& mine = of_tenant[t];
      const std::size_t n = mine.size();
      const double g = prob.weight[t];
      std::vector<double> x, d;
      for (std::size_t i : mine) {
        x.push_back(a.x[i]);
        d.push_back(cells[i].demand);
      }
      const double base = g * static_cast<double>(kappa);
      // Below min_weight where its weights could not add up otherwise, never
      // below what an fq takes.
      const double lo =
          std::max(kFqMinWeight, std::min(c.min_weight, base / static_cast<double>(n)));
      std::vector<double> w = target_weights(x, d, base, g * static_cast<double>(n), lo);
      const auto last = weights_.find(tenants[t]);
      json by_node = json::object();
      for (std::size_t k = 0; k < n; ++k) {
        const std::string& node = nodes[cells[mine[k]].node];
        double v = w[k];
        if (last != weights_.end()) {
          if (auto p = last->second.find(node); p != last->second.end()) {
            v = p->second + c.damping * (w[k] - p->second);
          }
        }
        v = std::clamp(v, lo, c.max_weight);
        next[tenants[t]][node] = v;
        out.decisions[node].settings.push_back({tenants[t], c.channel, c.object, c.field, v});
        by_node[node] = {{"demand", std::isfinite(d[k]) ? json(d[k]) : json("unbounded")},
                         {"allocation", x[k]},
                         {"target", w[k]},
                         {"weight", v}};
      }
      report_tenants[tenants[t]] = {{"global_weight", g},
                                    {"allocation", a.total[t]},
                                    {"level", a.level[t]},
                                    {"nodes", std::move(by_node)}};
    }
    json departed = json::object();
    for (const auto& [tenant, by_node] : weights_) {
      for (const auto& [node, v] : by_node) {
        auto it = next.find(tenant);
        if (it == next.end() || !it->second.count(node)) departed[tenant].push_back(node);
      }
    }
    weights_ = std::move(next);
    for (auto& [node, d] : out.decisions) {
      std::sort(d.settings.begin(), d.settings.end(),
                [](const Setting& x, const Setting& y) { return x.tenant < y.tenant; });
    }
    double capacity = 0;
    for (double v : prob.capacity) capacity += v;
    out.report = {{"steps", steps_},
                  {"rounds", a.rounds},
                  {"capacity", capacity},
                  {"tenants", std::move(report_tenants)},
                  {"departed", departed}};
    return out;
  }

  json state() const override {
    json w = json::object();
    for (const auto& [tenant, by_node] : weights_) w[tenant] = by_node;
    return {{"steps", steps_}, {"weights", w}};
  }

  Status restore(const json& s) override {
    if (!s.is_object()) return Status::invalid("state: must be an object");
    auto steps = s.find("steps");
    if (steps == s.end() || !steps->is_number_integer() || steps->get<std::int64_t>() < 0) {
      return Status::invalid("state.steps: required, a count");
    }
    auto w = s.find("weights");
    if (w == s.end() || !w->is_object()) {
      return Status::invalid("state.weights: required, an object of weights by tenant and node");
    }
    std::map<std::string, std::map<std::string, double>> weights;
    for (const auto& [tenant, by_node] : w->items()) {
      if (!by_node.is_object()) return Status::invalid("state.weights." + tenant + ": an object");
      for (const auto& [node, v] : by_node.items()) {
        double x = 0;
        SLUICE_RETURN_IF_ERROR(config::read_number(v, "state.weights." + tenant + "." + node, &x, 0,
                                                   false, kMaxClusterValue));
        weights[tenant][node] = x;
      }
    }
    steps_ = steps->get<std::uint64_t>();
    weights_ = std::move(weights);
    return Status::ok();
  }

  json describe() const override {
    const Config& c = config_;
    json j = {{"capacity", c.capacity > 0 ? json(c.capacity) : json("measured")},
              {"unit", c.unit},
              {"default_weight", c.default_weight},
              {"channel", c.channel},
              {"object", c.object},
              {"field", c.field},
              {"damping", c.damping},
              {"backlog_wait", c.backlog_wait},
              {"min_weight", c.min_weight},
              {"max_weight", c.max_weight},
              {"tenants", json::object()}};
    if (!c.capacities.empty()) j["capacities"] = c.capacities;
    for (const auto& [t, w] : c.weights) j["tenants"][t] = {{"weight", w}};
    return j;
  }

 private:
  struct Config {
    std::map<std::string, double> weights;  // global weights by tenant
    double default_weight = 1;
    double capacity = 0;  // per node, in the unit; 0: measured
    std::map<std::string, double> capacities;
    std::string unit = "bytes";
    std::string channel = "app";
    std::string object = "fq";
    std::string field = "default_weight";
    double damping = 0.5;
    double backlog_wait = 0.02;  // seconds waited per second per stage; 0: never
    double min_weight = kFqMinWeight;
    double max_weight = kFqMaxWeight;
  };

  double global_weight(const std::string& tenant) const {
    auto it = config_.weights.find(tenant);
    return it == config_.weights.end() ? config_.default_weight : it->second;
  }

  // One tenant's target weights over its cells: proportional to its parts
  // x of the allocation and summing to `base`, then what is left of `sum`
  // to the cells whose demand d the allocation meets.
  std::vector<double> target_weights(const std::vector<double>& x, const std::vector<double>& d,
                                     double base, double sum, double lo) const {
    std::vector<double> w = pisces::maxmin_weights(x, base, lo, config_.max_weight);
    const double extra = sum - std::accumulate(w.begin(), w.end(), 0.0);
    if (extra <= 0) return w;
    std::vector<std::size_t> met;
    double met_x = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (std::isfinite(d[i]) && x[i] >= d[i] * (1 - 1e-9)) {
        met.push_back(i);
        met_x += x[i];
      }
    }
    for (std::size_t i : met) {
      const double share = met_x > 0 ? x[i] / met_x : 1.0 / static_cast<double>(met.size());
      w[i] = std::min(config_.max_weight, w[i] + extra * share);
    }
    return w;
  }

  Config config_;
  std::uint64_t steps_ = 0;
  std::map<std::string, std::map<std::string, double>> weights_;  // tenant -> node -> weight
};

}  // namespace

std::unique_ptr<ClusterPolicy> make_pisces_cluster_policy() {
  return std::make_unique<PiscesClusterPolicy>();
}

}  // namespace sluice::cluster
