// The search for Pisces weight swaps; see pisces_swap.h.
//
// Capacities of a hop "x takes from y at stage n", in weight units:
//
//  - first hop, x = t, the tenant the swap is for:
//      t backlogged at n: (y's spare at n, if t is behind the fair level)
//                         + (damping * the normalised-throughput gap / rho_n,
//                            if y is ahead of t);
//      t not backlogged, but served more than R̂ at n (Pisces's D > R̂):
//                         min(t's excess (served - R̂) * total_n, y's spare at n);
//  - a middle hop (x, y both not t): y's spare at n, if x is not backlogged
//    at n;
//  - the last hop (y = t): t's spare at n, likewise, so that t loses no
//    service.
//
// Every hop is also capped so that the giver keeps its floor and the taker
// stays at most max_weight. Spare weight carries no service (its owner does
// not use it) and a taker that is not backlogged gains none, so service
// moves at the first hop only: from y to t when y is ahead, and from the
// flows backlogged at n to t when t takes spare there.
//
// Each swap found is checked against its expected effect (move()): if a
// tenant short of service, other than t, would lose below where t was, the
// swap is halved (at most kHalvings times) and tried again.
#include "pisces_swap.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <utility>

namespace sluice::pisces {
namespace {

constexpr std::size_t kNone = static_cast<std::size_t>(-1);

// The step's view of who is behind and who is ahead, from the tenants'
// current service estimates.
struct Levels {
  double fair = 0;  // weighted mean normalised throughput of the complete, unsatisfied
  double max = 0;   // largest normalised throughput of a complete tenant
};

Levels levels(const Model& m) {
  Levels l;
  l.fair = fair_level(m);
  for (const Tenant& t : m.tenants) {
    if (t.complete) l.max = std::max(l.max, t.normalised());
  }
  return l;
}

class Search {
 public:
  // fair_only: the first hop takes only from tenants ahead of t (what they
  // lose, t gains), not spare weight (which, where t is backlogged, takes
  // service from every backlogged flow there).
  Search(const Model& m, const Params& p, std::size_t t, bool fair_only)
      : m_(m), p_(p), t_(t), lv_(levels(m)), fair_only_(fair_only) {
    const Tenant& tt = m.tenants[t];
    behind_ = tt.complete && tt.unsatisfied && tt.normalised() * (1 + p.tolerance) < lv_.fair;
  }

  // The widest cycle through t, or an empty swap.
  Swap find() const { return p_.multilateral ? widest() : reciprocal(); }

  double gain_of(const Swap& s) const {
    const Cell& first = m_.cells[s.hops.front().taker];
    const Node& n = m_.nodes[first.node];
    return first.backlogged ? s.weight * n.rho() : s.weight / n.total;
  }

  bool fairness_of(const Swap& s) const {
    const Hop& h = s.hops.front();
    return m_.cells[h.taker].backlogged &&
           s.weight > spare_weight(m_, m_.cells[h.giver], p_.headroom) + 1e-12;
  }

 private:
  bool ahead(std::size_t u) const {
    const Tenant& tu = m_.tenants[u];
    const Tenant& tt = m_.tenants[t_];
    return tu.complete && tt.complete && tu.normalised() > tt.normalised() * (1 + p_.tolerance);
  }

  double room(const Cell& taker) const { return std::max(0.0, p_.max_weight - taker.weight); }

  double first_cap(const Cell& tc, const Cell& uc) const {
    if (!tc.measured || !uc.measured) return 0;
    const Node& n = m_.nodes[tc.node];
    const Tenant& tu = m_.tenants[uc.tenant];
    const double give_max = std::max(0.0, uc.weight - tu.floor);
    double part = 0;
    if (tc.backlogged) {
      if (behind_ && !fair_only_) part += spare_weight(m_, uc, p_.headroom);
      if (ahead(uc.tenant) && n.rho() > 0) {
        const Tenant& tt = m_.tenants[t_];
        const double gap = tu.normalised() - tt.normalised();
        part += p_.damping * gap / (1 / tt.global_weight + 1 / tu.global_weight) / n.rho();
      }
    } else {
      const double want = tc.served * n.total - tc.weight;  // (D - R̂) in weight
      if (want <= 0) return 0;
      part = std::min(want, spare_weight(m_, uc, p_.headroom));
    }
    return std::max(0.0, std::min({part, give_max, room(tc)}));
  }

  // x takes from y where y is not t (a middle hop) or is t (the last): y's
  // spare, to an x that is not backlogged there. So these hops move only
  // guarantees; service moves at the first hop alone.
  double hop_cap(const Cell& xc, const Cell& yc) const {
    if (!xc.measured || !yc.measured || xc.backlogged) return 0;
    return std::min(spare_weight(m_, yc, p_.headroom), room(xc));
  }

  Swap reciprocal() const {
    // Per partner u: the best stage where t takes from u, and the best where
    // u takes back from t.
    std::vector<double> take(m_.tenants.size(), 0), give(m_.tenants.size(), 0);
    std::vector<Hop> take_hop(m_.tenants.size()), give_hop(m_.tenants.size());
    for (std::size_t tc : m_.tenants[t_].cells) {
      for (std::size_t uc : m_.nodes[m_.cells[tc].node].cells) {
        const std::size_t u = m_.cells[uc].tenant;
        if (u == t_) continue;
        const double c1 = first_cap(m_.cells[tc], m_.cells[uc]);
        if (c1 > take[u]) {
          take[u] = c1;
          take_hop[u] = {tc, uc};
        }
        const double c2 = hop_cap(m_.cells[uc], m_.cells[tc]);
        if (c2 > give[u]) {
          give[u] = c2;
          give_hop[u] = {uc, tc};
        }
      }
    }
    Swap best;
    for (std::size_t u = 0; u < m_.tenants.size(); ++u) {
      const double w = std::min(take[u], give[u]);
      if (w > best.weight) {
        best.weight = w;
        best.hops = {take_hop[u], give_hop[u]};
      }
    }
    best.tenant = t_;
    return best;
  }

  // Maximum bottleneck path from t (as source, taking) back to t (as sink,
  // giving), Dijkstra-like: the tenant with the widest path so far is settled
  // next; a settled tenant's hops relax the others.
  Swap widest() const {
    const std::size_t n = m_.tenants.size();
    const std::size_t sink = n;
    std::vector<double> width(n + 1, 0);
    std::vector<Hop> via(n + 1);
    std::vector<std::size_t> prev(n + 1, kNone);
    std::vector<bool> done(n + 1, false);
    using Item = std::pair<double, std::size_t>;
    auto later = [](const Item& a, const Item& b) {
      return a.first < b.first || (a.first == b.first && a.second > b.second);
    };
    std::priority_queue<Item, std::vector<Item>, decltype(later)> queue(later);
    auto relax = [&](std::size_t from, std::size_t to, double w, Hop hop) {
      if (w <= width[to] || done[to]) return;
      width[to] = w;
      via[to] = hop;
      prev[to] = from;
      queue.push({w, to});
    };
    done[t_] = true;
    for (std::size_t tc : m_.tenants[t_].cells) {
      for (std::size_t uc : m_.nodes[m_.cells[tc].node].cells) {
        const std::size_t u = m_.cells[uc].tenant;
        if (u != t_) relax(t_, u, first_cap(m_.cells[tc], m_.cells[uc]), {tc, uc});
      }
    }
    while (!queue.empty()) {
      const auto [w, x] = queue.top();
      queue.pop();
      if (done[x] || w < width[x]) continue;
      done[x] = true;
      if (x == sink) break;
      for (std::size_t xc : m_.tenants[x].cells) {
        for (std::size_t yc : m_.nodes[m_.cells[xc].node].cells) {
          const std::size_t y = m_.cells[yc].tenant;
          if (y == x) continue;
          const double c = std::min(w, hop_cap(m_.cells[xc], m_.cells[yc]));
          relax(x, y == t_ ? sink : y, c, {xc, yc});
        }
      }
    }
    Swap s;
    s.tenant = t_;
    if (!done[sink] || width[sink] <= 0) return s;
    s.weight = width[sink];
    for (std::size_t at = sink; at != t_; at = prev[at]) s.hops.push_back(via[at]);
    std::reverse(s.hops.begin(), s.hops.end());
    return s;
  }

  const Model& m_;
  const Params& p_;
  std::size_t t_;
  Levels lv_;
  bool fair_only_ = false;
  bool behind_ = false;
};

// The smallest gain worth a swap for tenant t from tenant u (the first hop's
// giver; u = t when there is none yet): min_swap of a node's capacity, or of
// the lighter tenant's fair service when that is less than a node (a light
// tenant among many never moves a whole min_swap of a node; a swap between a
// heavy and a light tenant moves service on the light one's scale).
double threshold(const Model& m, const Params& p, std::size_t t, std::size_t u) {
  const double level = fair_level(m);
  const double w = std::min(m.tenants[t].global_weight, m.tenants[u].global_weight);
  const double fair = level > 0 ? w * level : 1.0;
  return p.min_swap * std::min(1.0, fair);
}

// Largest mismatch first: a tenant's cost is the larger of its rate
// mismatch where it is served beyond R̂ without queueing, and (for a
// complete, unsatisfied tenant) its service short of the most served
// tenant's normalised throughput. Only tenants with spare weight somewhere
// can pay a swap back.
std::vector<std::size_t> candidates(const Model& m, const Params& p) {
  const Levels lv = levels(m);
  std::vector<std::pair<double, std::size_t>> order;
  for (std::size_t i = 0; i < m.tenants.size(); ++i) {
    const Tenant& t = m.tenants[i];
    bool spare = false;
    double local = 0;
    for (std::size_t ci : t.cells) {
      const Cell& c = m.cells[ci];
      if (!c.measured) continue;
      if (spare_weight(m, c, p.headroom) > 0) spare = true;
      if (!c.backlogged) {
        local = std::max(local, c.served - c.weight / m.nodes[c.node].total);
      }
    }
    if (!spare) continue;
    double fair = 0;
    if (t.complete && t.unsatisfied && lv.max > t.normalised() * (1 + p.tolerance)) {
      fair = (lv.max - t.normalised()) * t.global_weight;
    }
    const double cost = std::max(local >= threshold(m, p, i, i) ? local : 0.0, fair);
    if (cost > 0) order.push_back({cost, i});
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::size_t> out;
  out.reserve(order.size());
  for (const auto& [cost, i] : order) out.push_back(i);
  return out;
}

// One hop's expected effect at its stage, as work-conserving fair queuing
// would serve it: backlogged flows share what the others leave by weight; a
// giver cut below what its use needs at the stage's level joins them.
void move(Model& m, const Hop& h, double weight) {
  Cell& taker = m.cells[h.taker];
  Cell& giver = m.cells[h.giver];
  Node& n = m.nodes[taker.node];
  const double rho = n.rho();
  giver.weight -= weight;
  taker.weight += weight;
  if (giver.expected_backlogged) {
    n.backlogged_weight -= weight;
  } else if (rho > 0 && giver.weight * rho < giver.expected) {
    giver.expected_backlogged = true;
    n.backlogged_weight += giver.weight;
    n.shared += giver.expected;
  }
  if (taker.expected_backlogged) n.backlogged_weight += weight;
  if (n.backlogged_weight <= 0) return;
  for (std::size_t ci : n.cells) {
    Cell& c = m.cells[ci];
    if (!c.expected_backlogged) continue;
    const double now = n.shared * c.weight / n.backlogged_weight;
    m.tenants[c.tenant].service += now - c.expected;
    c.expected = now;
  }
}

void apply(Model& m, const Swap& s) {
  for (const Hop& h : s.hops) move(m, h, s.weight);
}

constexpr int kHalvings = 4;

// What a swap changes, to take it back.
struct Undo {
  std::vector<std::pair<std::size_t, Cell>> cells;
  std::vector<std::pair<std::size_t, std::pair<double, double>>> nodes;  // shared, backlogged
  std::vector<double> service;                                           // per tenant
};

Undo snapshot(const Model& m, const Swap& s) {
  Undo u;
  for (const Hop& h : s.hops) {
    const std::size_t n = m.cells[h.taker].node;
    if (std::any_of(u.nodes.begin(), u.nodes.end(), [&](const auto& e) { return e.first == n; })) {
      continue;
    }
    u.nodes.push_back({n, {m.nodes[n].shared, m.nodes[n].backlogged_weight}});
    for (std::size_t ci : m.nodes[n].cells) u.cells.push_back({ci, m.cells[ci]});
  }
  u.service.reserve(m.tenants.size());
  for (const Tenant& t : m.tenants) u.service.push_back(t.service);
  return u;
}

void restore(Model& m, const Undo& u) {
  for (const auto& [ci, c] : u.cells) m.cells[ci] = c;
  for (const auto& [n, v] : u.nodes) {
    m.nodes[n].shared = v.first;
    m.nodes[n].backlogged_weight = v.second;
  }
  for (std::size_t i = 0; i < m.tenants.size(); ++i) m.tenants[i].service = u.service[i];
}

// No complete, unsatisfied tenant other than t lost service below t's
// normalised throughput before the swap.
bool harmless(const Model& m, const std::vector<double>& before, std::size_t t, double t_before) {
  for (std::size_t i = 0; i < m.tenants.size(); ++i) {
    const Tenant& u = m.tenants[i];
    if (i == t || !u.complete || !u.unsatisfied) continue;
    if (u.service < before[i] - 1e-12 && u.normalised() < t_before) return false;
  }
  return true;
}

}  // namespace

void prepare(Model& m) {
  for (Node& n : m.nodes) n.cells.clear();
  for (Tenant& t : m.tenants) t.cells.clear();
  for (std::size_t i = 0; i < m.cells.size(); ++i) {
    m.nodes[m.cells[i].node].cells.push_back(i);
    m.tenants[m.cells[i].tenant].cells.push_back(i);
  }
  for (Tenant& t : m.tenants) t.service = 0;
  for (Node& n : m.nodes) {
    n.total = n.shared = n.backlogged_weight = 0;
    for (std::size_t ci : n.cells) {
      Cell& c = m.cells[ci];
      c.expected = c.served;
      c.expected_backlogged = c.measured && c.backlogged;
      m.tenants[c.tenant].service += c.served;
      n.total += c.weight;
      if (c.expected_backlogged) {
        n.shared += c.served;
        n.backlogged_weight += c.weight;
      }
    }
  }
}

double spare_weight(const Model& m, const Cell& c, double headroom) {
  if (!c.measured || c.backlogged) return 0;
  const Node& n = m.nodes[c.node];
  const double need = std::max(c.served, c.arrived) * (1 + headroom) * n.total;
  const double floor = m.tenants[c.tenant].floor;
  return std::max(0.0, c.weight - std::max(need, floor));
}

double fair_level(const Model& m) {
  double service = 0, weight = 0;
  for (const Tenant& t : m.tenants) {
    if (!t.complete || !t.unsatisfied) continue;
    service += t.service;
    weight += t.global_weight;
  }
  return weight > 0 ? service / weight : 0;
}

// The largest swap for t of at most `s`'s size that harms nobody (see
// harmless()), applied; false (and m unchanged) if none reaches the
// threshold.
bool try_swap(Model& m, const Params& p, const Search& search, std::size_t t, Swap& s) {
  // As Pisces bounds a swap so that the tenant it takes from does not end up
  // worse than the tenant it is for: halve it until nobody else who is short
  // of service loses below where t was.
  const double t_before = m.tenants[t].normalised();
  for (int halvings = 0; halvings <= kHalvings; ++halvings) {
    s.gain = search.gain_of(s);
    const std::size_t giver = m.cells[s.hops.front().giver].tenant;
    if (!(s.gain >= threshold(m, p, t, giver))) return false;
    s.fairness = search.fairness_of(s);
    const Undo undo = snapshot(m, s);
    apply(m, s);
    if (harmless(m, undo.service, t, t_before)) return true;
    restore(m, undo);
    s.weight /= 2;
  }
  return false;
}

std::vector<Swap> allocate(Model& m, const Params& p) {
  std::vector<Swap> swaps;
  while (static_cast<int>(swaps.size()) < p.max_swaps) {
    bool made = false;
    for (std::size_t t : candidates(m, p)) {
      // First from the tenants ahead alone, then from spare weight too.
      for (const bool fair_only : {true, false}) {
        const Search search(m, p, t, fair_only);
        Swap s = search.find();
        if (s.hops.empty() || s.weight <= 0) continue;
        if (try_swap(m, p, search, t, s)) {
          swaps.push_back(std::move(s));
          made = true;
          break;
        }
      }
      if (made) break;
    }
    if (!made) break;
  }
  return swaps;
}

}  // namespace sluice::pisces
