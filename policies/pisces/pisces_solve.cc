// The weighted max-min fair allocation across stages; see pisces_solve.h.
//
// Feasibility of a level λ: the max flow source -> tenant (λ·G_t, or X_t once
// frozen) -> stage (the cell's demand) -> sink (the stage's capacity) carries
// every tenant's want. When it does not, the minimum cut's capacity is linear
// in λ, a + bλ, against the want A + Bλ, and allows at most
// λ' = (a - A) / (B - b): the next λ. When the flow at λ' is feasible, the
// tenants on the source side of the last cut freeze at λ'. From above every
// feasible level, λ decreases through finitely many cuts (the minimum cut is
// concave in λ), so a round takes a few max flows.
#include "pisces_solve.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "sluice/dcheck.h"
#include "water_fill.h"

namespace sluice::pisces {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Dinic's maximum flow over doubles.
class Network {
 public:
  explicit Network(std::size_t nodes) : adj_(nodes), level_(nodes), next_(nodes) {}

  std::size_t add(std::size_t from, std::size_t to, double cap) {
    const std::size_t e = to_.size();
    adj_[from].push_back(e);
    to_.push_back(to);
    cap_.push_back(cap);
    flow_.push_back(0);
    adj_[to].push_back(e + 1);
    to_.push_back(from);
    cap_.push_back(0);
    flow_.push_back(0);
    return e;
  }

  void set_cap(std::size_t e, double cap) { cap_[e] = cap; }
  double cap(std::size_t e) const { return cap_[e]; }
  double flow(std::size_t e) const { return flow_[e]; }
  std::size_t head(std::size_t e) const { return to_[e]; }

  // The maximum flow from s to t, from zero (or, with keep, from the flow
  // there is, returning what it adds); residuals below eps are none.
  double max_flow(std::size_t s, std::size_t t, double eps, bool keep = false) {
    if (!keep) std::fill(flow_.begin(), flow_.end(), 0.0);
    eps_ = eps;
    double total = 0;
    while (bfs(s, t)) {
      std::fill(next_.begin(), next_.end(), 0);
      for (double f = dfs(s, t, kInf); f > eps_; f = dfs(s, t, kInf)) total += f;
    }
    return total;
  }

  // The nodes the source reaches in the residual network (after max_flow).
  std::vector<bool> reached(std::size_t s) const {
    std::vector<bool> seen(adj_.size(), false);
    std::vector<std::size_t> stack{s};
    seen[s] = true;
    while (!stack.empty()) {
      const std::size_t u = stack.back();
      stack.pop_back();
      for (std::size_t e : adj_[u]) {
        if (residual(e) > eps_ && !seen[to_[e]]) {
          seen[to_[e]] = true;
          stack.push_back(to_[e]);
        }
      }
    }
    return seen;
  }

 private:
  double residual(std::size_t e) const { return cap_[e] - flow_[e]; }

  bool bfs(std::size_t s, std::size_t t) {
    std::fill(level_.begin(), level_.end(), -1);
    std::vector<std::size_t> queue{s};
    level_[s] = 0;
    for (std::size_t i = 0; i < queue.size(); ++i) {
      const std::size_t u = queue[i];
      for (std::size_t e : adj_[u]) {
        if (residual(e) > eps_ && level_[to_[e]] < 0) {
          level_[to_[e]] = level_[u] + 1;
          queue.push_back(to_[e]);
        }
      }
    }
    return level_[t] >= 0;
  }

  double dfs(std::size_t u, std::size_t t, double pushed) {
    if (u == t) return pushed;
    for (std::size_t& i = next_[u]; i < adj_[u].size(); ++i) {
      const std::size_t e = adj_[u][i];
      const std::size_t v = to_[e];
      if (level_[v] != level_[u] + 1 || residual(e) <= eps_) continue;
      const double f = dfs(v, t, std::min(pushed, residual(e)));
      if (f > eps_) {
        flow_[e] += f;
        flow_[e ^ 1] -= f;
        return f;
      }
    }
    return 0;
  }

  std::vector<std::vector<std::size_t>> adj_;
  std::vector<std::size_t> to_;
  std::vector<double> cap_, flow_;
  std::vector<int> level_;
  std::vector<std::size_t> next_;
  double eps_ = 0;
};

}  // namespace

Allocation maxmin_allocate(const SolveProblem& p) {
  const std::size_t nt = p.weight.size();
  const std::size_t ns = p.capacity.size();
  Allocation out;
  out.x.assign(p.cells.size(), 0);
  out.total.assign(nt, 0);
  out.level.assign(nt, 0);
  if (nt == 0 || ns == 0) return out;

  // Nodes: 0 the source, 1..nt the tenants, then the stages, then the sink.
  const std::size_t source = 0, sink = 1 + nt + ns;
  auto tenant_node = [](std::size_t t) { return 1 + t; };
  auto stage_node = [nt](std::size_t s) { return 1 + nt + s; };
  Network net(sink + 1);
  std::vector<std::size_t> source_edge(nt), cell_edge(p.cells.size()), sink_edge(ns);
  double scale = 1;
  for (std::size_t s = 0; s < ns; ++s) {
    const double c = std::max(0.0, p.capacity[s]);
    sink_edge[s] = net.add(stage_node(s), sink, c);
    scale += c;
  }
  for (std::size_t t = 0; t < nt; ++t) source_edge[t] = net.add(source, tenant_node(t), 0);
  std::vector<bool> frozen(nt, true);
  for (std::size_t i = 0; i < p.cells.size(); ++i) {
    const SolveCell& c = p.cells[i];
    SLUICE_DCHECK(c.stage < ns && c.tenant < nt, "a cell names a stage and a tenant");
    const double d = std::isnan(c.demand) ? 0.0 : std::max(0.0, c.demand);
    cell_edge[i] = net.add(tenant_node(c.tenant), stage_node(c.stage), d);
    // A tenant with somewhere to grow takes part; the others stay at 0.
    if (d > 0 && p.capacity[c.stage] > 0 && p.weight[c.tenant] > 0) frozen[c.tenant] = false;
  }
  const double eps = 1e-12 * scale;

  double lambda_lo = 0;  // feasible: every unfrozen tenant can have lambda_lo * G_t
  auto want = [&](double lambda) {
    double a = 0, b = 0;
    for (std::size_t t = 0; t < nt; ++t) {
      if (frozen[t]) {
        a += out.total[t];
      } else {
        b += p.weight[t];
      }
    }
    return a + b * lambda;
  };
  auto set_level = [&](double lambda) {
    for (std::size_t t = 0; t < nt; ++t) {
      net.set_cap(source_edge[t], frozen[t] ? out.total[t] : lambda * p.weight[t]);
    }
  };
  while (std::any_of(frozen.begin(), frozen.end(), [](bool f) { return !f; })) {
    ++out.rounds;
    double min_weight = kInf;
    for (std::size_t t = 0; t < nt; ++t) {
      if (!frozen[t]) min_weight = std::min(min_weight, p.weight[t]);
    }
    // Above every feasible level: the lightest tenant alone would want more
    // than all the capacity there is.
    double lambda = lambda_lo + scale / min_weight;
    std::vector<bool> tight;  // the source side of the last cut that did not hold
    for (int iter = 0; iter < 256; ++iter) {
      set_level(lambda);
      const double flow = net.max_flow(source, sink, eps);
      const double need = want(lambda);
      if (flow >= need - 1e-9 * std::max(1.0, need)) break;
      tight = net.reached(source);
      double a = 0, b = 0, a_frozen = 0, b_all = 0;
      for (std::size_t t = 0; t < nt; ++t) {
        const bool in_s = tight[tenant_node(t)];
        if (frozen[t]) {
          a_frozen += out.total[t];
          if (!in_s) a += out.total[t];
        } else {
          b_all += p.weight[t];
          if (!in_s) b += p.weight[t];
        }
      }
      for (std::size_t i = 0; i < p.cells.size(); ++i) {
        const SolveCell& c = p.cells[i];
        if (tight[tenant_node(c.tenant)] && !tight[stage_node(c.stage)]) {
          a += net.cap(cell_edge[i]);
        }
      }
      for (std::size_t s = 0; s < ns; ++s) {
        if (tight[stage_node(s)]) a += net.cap(sink_edge[s]);
      }
      const double next = b_all > b ? (a - a_frozen) / (b_all - b) : lambda_lo;
      // Rounding must not stall the descent nor take it below a level known
      // to be feasible.
      lambda = std::max(lambda_lo, std::min(next, lambda * (1 - 1e-12)));
      if (lambda <= lambda_lo) {
        set_level(lambda);
        net.max_flow(source, sink, eps);
        break;
      }
    }
    // Freeze the tenants on the source side of the last cut that did not
    // hold (none: every unfrozen tenant, which cannot happen above the
    // starting level unless the capacity is unbounded).
    bool any = false;
    for (std::size_t t = 0; t < nt; ++t) {
      if (frozen[t]) continue;
      if (tight.empty() || tight[tenant_node(t)]) {
        frozen[t] = true;
        out.total[t] = lambda * p.weight[t];
        any = true;
      }
    }
    if (!any) {
      for (std::size_t t = 0; t < nt; ++t) {
        if (!frozen[t]) {
          frozen[t] = true;
          out.total[t] = lambda * p.weight[t];
        }
      }
    }
    lambda_lo = lambda;
    set_level(lambda);  // the flow that carries the totals frozen so far
  }
  // The flow that carries the totals: first over what each cell prefers
  // (so that of the many splits of a tenant's total over its stages, the
  // one closest to that is taken), then over the cells' whole demands.
  for (std::size_t i = 0; i < p.cells.size(); ++i) {
    const double d = net.cap(cell_edge[i]);
    net.set_cap(cell_edge[i], std::min(d, std::max(0.0, p.cells[i].prefer)));
  }
  net.max_flow(source, sink, eps);
  for (std::size_t i = 0; i < p.cells.size(); ++i) {
    const double d = p.cells[i].demand;
    net.set_cap(cell_edge[i], std::isnan(d) ? 0.0 : std::max(0.0, d));
  }
  net.max_flow(source, sink, eps, true);
  for (std::size_t t = 0; t < nt; ++t) out.total[t] = 0;
  for (std::size_t i = 0; i < p.cells.size(); ++i) {
    out.x[i] = std::max(0.0, net.flow(cell_edge[i]));
    out.total[p.cells[i].tenant] += out.x[i];
  }
  for (std::size_t t = 0; t < nt; ++t) {
    out.level[t] = p.weight[t] > 0 ? out.total[t] / p.weight[t] : 0;
  }
  return out;
}

std::vector<double> maxmin_weights(const std::vector<double>& x, double sum, double lo, double hi) {
  const std::size_t n = x.size();
  std::vector<double> w(n, 0);
  if (n == 0) return w;
  // 0: free (proportional to x); -1: held at lo; +1: held at hi.
  std::vector<int> held(n, 0);
  for (std::size_t pass = 0; pass <= n; ++pass) {
    double rest = sum, xs = 0;
    std::size_t free = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (held[i] < 0) rest -= lo;
      if (held[i] > 0) rest -= hi;
      if (held[i] == 0) {
        xs += std::max(0.0, x[i]);
        ++free;
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (held[i] != 0) {
        w[i] = held[i] < 0 ? lo : hi;
      } else {
        w[i] = xs > 0 ? rest * std::max(0.0, x[i]) / xs : rest / static_cast<double>(free);
      }
    }
    if (free == 0) break;
    bool changed = false;
    for (std::size_t i = 0; i < n; ++i) {
      if (held[i] == 0 && w[i] < lo * (1 - 1e-12)) {
        held[i] = -1;
        changed = true;
      }
    }
    if (!changed) {
      for (std::size_t i = 0; i < n; ++i) {
        if (held[i] == 0 && w[i] > hi * (1 + 1e-12)) {
          held[i] = 1;
          changed = true;
        }
      }
    }
    if (!changed) break;
  }
  for (double& v : w) v = std::clamp(v, lo, hi);
  return w;
}

namespace {

// The min-max ratio of service / global weight over the tenants measured
// everywhere that queued somewhere.
double mmr_of(const Model& m, const std::vector<double>& service) {
  double lo = kInf, hi = 0;
  for (std::size_t t = 0; t < m.tenants.size(); ++t) {
    const Tenant& tt = m.tenants[t];
    if (!tt.complete || !tt.unsatisfied) continue;
    const double v = service[t] / tt.global_weight;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  return hi > 0 ? lo / hi : 0;
}

}  // namespace

std::vector<double> fq_service(const Model& m, const std::vector<double>& demand,
                               const std::vector<double>& weights,
                               const std::vector<double>& capacity) {
  std::vector<double> out(m.tenants.size(), 0);
  std::vector<Claim> claims;
  std::vector<std::size_t> who;
  for (std::size_t n = 0; n < m.nodes.size(); ++n) {
    claims.clear();
    who.clear();
    double cap = capacity[n];
    for (std::size_t ci : m.nodes[n].cells) {
      const Cell& c = m.cells[ci];
      if (!c.measured) continue;
      if (std::isnan(demand[ci])) {
        out[c.tenant] += c.served;
        cap -= c.served;
        continue;
      }
      claims.push_back({demand[ci], weights[ci], 0});
      who.push_back(ci);
    }
    const std::vector<double> got = water_fill(std::max(0.0, cap), claims);
    for (std::size_t i = 0; i < who.size(); ++i) out[m.cells[who[i]].tenant] += got[i];
  }
  return out;
}

MaxminStep maxmin_step(Model& m, const MaxminParams& p) {
  const double nan = std::nan("");
  MaxminStep r;
  r.demand.assign(m.cells.size(), nan);
  r.allocation.assign(m.cells.size(), nan);
  r.target.assign(m.cells.size(), nan);
  r.level.assign(m.tenants.size(), nan);
  r.capacity.assign(m.nodes.size(), 0);
  for (std::size_t n = 0; n < m.nodes.size(); ++n) {
    double served = 0;
    bool queued = false;
    for (std::size_t ci : m.nodes[n].cells) {
      const Cell& c = m.cells[ci];
      if (!c.measured) continue;
      served += c.served;
      queued = queued || c.backlogged;
    }
    r.capacity[n] = queued ? served : std::max(served, p.stage_capacity);
  }

  // The problem: the tenants measured at every stage where they appear; what
  // the others were served is taken off their stages' capacity.
  SolveProblem prob;
  prob.capacity = r.capacity;
  std::vector<std::size_t> index(m.tenants.size(), static_cast<std::size_t>(-1));
  std::vector<std::size_t> members;
  for (std::size_t t = 0; t < m.tenants.size(); ++t) {
    if (!m.tenants[t].complete || m.tenants[t].cells.empty()) continue;
    index[t] = members.size();
    members.push_back(t);
    prob.weight.push_back(m.tenants[t].global_weight);
  }
  std::vector<std::size_t> cell_of;  // problem cell -> model cell
  for (std::size_t ci = 0; ci < m.cells.size(); ++ci) {
    const Cell& c = m.cells[ci];
    if (index[c.tenant] == static_cast<std::size_t>(-1)) {
      if (c.measured) prob.capacity[c.node] = std::max(0.0, prob.capacity[c.node] - c.served);
      continue;
    }
    const double d = c.backlogged ? kInf : std::max(c.served, c.arrived) * (1 + p.headroom);
    r.demand[ci] = d;
    prob.cells.push_back({c.node, index[c.tenant], d, c.served});
    cell_of.push_back(ci);
  }
  const Allocation a = maxmin_allocate(prob);
  r.rounds = a.rounds;
  for (std::size_t i = 0; i < cell_of.size(); ++i) r.allocation[cell_of[i]] = a.x[i];

  std::vector<double> before(m.cells.size());
  for (std::size_t ci = 0; ci < m.cells.size(); ++ci) before[ci] = m.cells[ci].weight;
  // Weights G_t * kappa * x_ts / X_t serve every cell bottlenecked at a
  // stage in the ratio of its allocation (kappa x_ts / level_t, and the
  // cells bottlenecked at a stage share its level). kappa is common to all
  // tenants: the fewest stages a tenant appears at. What a tenant appearing
  // at more stages holds beyond that (the invariant: G_t times its stages)
  // goes to its cells whose demand the allocation meets, where weight above
  // the allocation takes nothing from anybody; without such a cell, the
  // allocation wins and its sum falls short (invariant_deviation).
  std::size_t kappa = 0;
  for (std::size_t t : members) {
    const std::size_t n = m.tenants[t].cells.size();
    kappa = kappa == 0 ? n : std::min(kappa, n);
  }
  std::vector<double> target = before;
  for (std::size_t k = 0; k < members.size(); ++k) {
    const std::size_t t = members[k];
    Tenant& tt = m.tenants[t];
    r.level[t] = a.level[k];
    const std::size_t n = tt.cells.size();
    std::vector<double> x;
    x.reserve(n);
    for (std::size_t ci : tt.cells) x.push_back(r.allocation[ci]);
    const double sum = tt.global_weight * static_cast<double>(n);
    const double base = tt.global_weight * static_cast<double>(kappa);
    const double lo = std::min(tt.floor, base / static_cast<double>(n));
    std::vector<double> w = maxmin_weights(x, base, lo, p.max_weight);
    double extra = sum - std::accumulate(w.begin(), w.end(), 0.0);
    if (extra > 0) {
      std::vector<std::size_t> met;
      double met_x = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double d = r.demand[tt.cells[i]];
        if (std::isfinite(d) && x[i] >= d * (1 - 1e-9)) {
          met.push_back(i);
          met_x += x[i];
        }
      }
      for (std::size_t i : met) {
        const double share = met_x > 0 ? x[i] / met_x : 1.0 / static_cast<double>(met.size());
        w[i] = std::min(p.max_weight, w[i] + extra * share);
      }
    }
    double held = 0;
    for (std::size_t i = 0; i < n; ++i) {
      Cell& c = m.cells[tt.cells[i]];
      target[tt.cells[i]] = r.target[tt.cells[i]] = w[i];
      c.weight = std::clamp(c.weight + p.damping * (w[i] - c.weight), lo, p.max_weight);
      held += c.weight;
    }
    r.invariant_deviation = std::max(r.invariant_deviation, std::abs(held - sum) / sum);
  }
  for (Node& n : m.nodes) {
    n.total = 0;
    for (std::size_t ci : n.cells) n.total += m.cells[ci].weight;
  }
  r.expected_mmr_before = mmr_of(m, fq_service(m, r.demand, before, r.capacity));
  r.expected_mmr_target = mmr_of(m, fq_service(m, r.demand, target, r.capacity));
  std::vector<double> totals(m.tenants.size(), 0);
  for (std::size_t k = 0; k < members.size(); ++k) totals[members[k]] = a.total[k];
  r.allocation_mmr = mmr_of(m, totals);
  return r;
}

}  // namespace sluice::pisces
