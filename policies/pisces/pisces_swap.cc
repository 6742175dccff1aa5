// The search for Pisces weight swaps; see pisces_swap.h. The capacity of each
// hop "x takes from y at stage n" and the rules that judge a swap before it
// is made (each stage it touches served again as weighted max-min, leximin
// for the least served, halved at most kHalvings times) are tabled in
// docs/policies.md, "The step, methods mbf and reciprocal".
#include "pisces_swap.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <utility>

#include "sluice/dcheck.h"
#include "water_fill.h"

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
      if (ahead(uc.tenant) && n.rho > 0) {
        const Tenant& tt = m_.tenants[t_];
        const double gap = tu.normalised() - tt.normalised();
        part += p_.damping * gap / (1 / tt.global_weight + 1 / tu.global_weight) / n.rho;
      }
    } else {
      const double want = tc.served * n.total - tc.weight;  // (D - R̂) in weight
      if (want <= 0) return 0;
      part = std::min(want, spare_weight(m_, uc, p_.headroom));
    }
    return std::max(0.0, std::min({part, give_max, room(tc)}));
  }

  // x takes from y where y is not t (a middle hop) or is t (the last): y's
  // spare, so that y loses no service. An x backlogged there gains service
  // from the other flows backlogged there: not an x already above the fair
  // level, unless every flow it would gain from is above that level too
  // (a tenant backlogged everywhere can then be paid back where only tenants
  // ahead compete with it; allocate() still refuses a swap whose gainers
  // would end above the most served tenant).
  double hop_cap(const Cell& xc, const Cell& yc) const {
    if (!xc.measured || !yc.measured) return 0;
    if (xc.backlogged && above_level(xc.tenant) && !only_ahead_compete(xc)) return 0;
    return std::min(spare_weight(m_, yc, p_.headroom), room(xc));
  }

  bool above_level(std::size_t x) const {
    const Tenant& tx = m_.tenants[x];
    return tx.complete && tx.normalised() > lv_.fair * (1 + p_.tolerance);
  }

  // Every other flow backlogged at c's stage is a tenant above the fair
  // level (or there is none: more weight then gives c nothing): what c gains
  // there comes only from tenants ahead.
  bool only_ahead_compete(const Cell& c) const {
    for (std::size_t ci : m_.nodes[c.node].cells) {
      const Cell& o = m_.cells[ci];
      if (&o != &c && o.expected_backlogged && !above_level(o.tenant)) return false;
    }
    return true;
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
      // Not at the stage where x just gave: taking it back there would undo
      // the hop before (and take what the others there have spare instead).
      const std::size_t gave_at = m_.cells[via[x].giver].node;
      for (std::size_t xc : m_.tenants[x].cells) {
        if (m_.cells[xc].node == gave_at) continue;
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

// Who gets a swap first. Max-min fairness helps the worst off first,
// whatever its weight: the complete, unsatisfied tenants below the most
// served one by more than the tolerance, least normalised throughput first.
// Then the tenants served beyond R̂ without queueing (Pisces's D > R̂), by
// their mismatch relative to R̂. Only tenants with spare weight somewhere can
// pay a swap back.
std::vector<std::size_t> candidates(const Model& m, const Params& p) {
  const Levels lv = levels(m);
  std::vector<std::pair<double, std::size_t>> behind, local;
  for (std::size_t i = 0; i < m.tenants.size(); ++i) {
    const Tenant& t = m.tenants[i];
    bool spare = false;
    double mismatch = 0;
    for (std::size_t ci : t.cells) {
      const Cell& c = m.cells[ci];
      if (!c.measured) continue;
      if (spare_weight(m, c, p.headroom) > 0) spare = true;
      const double share = c.weight / m.nodes[c.node].total;
      if (!c.backlogged && c.served - share >= threshold(m, p, i, i)) {
        mismatch = std::max(mismatch, (c.served - share) / share);
      }
    }
    if (!spare) continue;
    if (t.complete && t.unsatisfied && lv.max > t.normalised() * (1 + p.tolerance)) {
      behind.push_back({t.normalised(), i});
    }
    if (mismatch > 0) local.push_back({-mismatch, i});
  }
  std::stable_sort(behind.begin(), behind.end());
  std::stable_sort(local.begin(), local.end());
  std::vector<std::size_t> out;
  out.reserve(behind.size() + local.size());
  for (const auto& [v, i] : behind) out.push_back(i);
  for (const auto& [v, i] : local) out.push_back(i);
  return out;
}

// What the cells of node n are expected to be served under their weights:
// weighted max-min over their demands within what the node served, as a
// work-conserving fair queue serves them.
void serve(Model& m, std::size_t n) {
  Node& node = m.nodes[n];
  std::vector<Claim> claims;
  claims.reserve(node.cells.size());
  for (std::size_t ci : node.cells) {
    const Cell& c = m.cells[ci];
    claims.push_back({c.measured ? c.demand() : 0.0, c.weight, 0});
  }
  const std::vector<double> got = water_fill(node.capacity, claims);
  double bk_service = 0, bk_weight = 0;
  for (std::size_t i = 0; i < node.cells.size(); ++i) {
    Cell& c = m.cells[node.cells[i]];
    if (!c.measured) continue;
    m.tenants[c.tenant].service += got[i] - c.expected;
    c.expected = got[i];
    c.expected_backlogged = got[i] < c.demand() * (1 - 1e-9);
    if (c.expected_backlogged) {
      bk_service += got[i];
      bk_weight += c.weight;
    }
  }
  node.rho = bk_weight > 0 ? bk_service / bk_weight : 0;
}

// One hop's weight, and its expected effect at its stage.
void move(Model& m, const Hop& h, double weight) {
  m.cells[h.giver].weight -= weight;
  m.cells[h.taker].weight += weight;
  serve(m, m.cells[h.taker].node);
}

void apply(Model& m, const Swap& s) {
  for (const Hop& h : s.hops) move(m, h, s.weight);
}

constexpr int kHalvings = 4;

// What a swap changes, to take it back.
struct Undo {
  std::vector<std::pair<std::size_t, Cell>> cells;
  std::vector<std::pair<std::size_t, double>> rho;  // per node touched
  std::vector<double> service;                      // per tenant
};

Undo snapshot(const Model& m, const Swap& s) {
  Undo u;
  for (const Hop& h : s.hops) {
    const std::size_t n = m.cells[h.taker].node;
    if (std::any_of(u.rho.begin(), u.rho.end(), [&](const auto& e) { return e.first == n; })) {
      continue;
    }
    u.rho.push_back({n, m.nodes[n].rho});
    for (std::size_t ci : m.nodes[n].cells) u.cells.push_back({ci, m.cells[ci]});
  }
  u.service.reserve(m.tenants.size());
  for (const Tenant& t : m.tenants) u.service.push_back(t.service);
  return u;
}

void restore(Model& m, const Undo& u) {
  for (const auto& [ci, c] : u.cells) m.cells[ci] = c;
  for (const auto& [n, rho] : u.rho) m.nodes[n].rho = rho;
  for (std::size_t i = 0; i < m.tenants.size(); ++i) m.tenants[i].service = u.service[i];
}

// The highest normalised throughput of the complete, unsatisfied tenants.
double highest(const Model& m) {
  double hi = 0;
  for (const Tenant& t : m.tenants) {
    if (t.complete && t.unsatisfied) hi = std::max(hi, t.normalised());
  }
  return hi;
}

// The normalised throughputs of the complete, unsatisfied tenants, lowest
// first: max-min fairness compares these vectors lexicographically.
std::vector<double> leximin(const Model& m) {
  std::vector<double> v;
  v.reserve(m.tenants.size());
  for (const Tenant& t : m.tenants) {
    if (t.complete && t.unsatisfied) v.push_back(t.normalised());
  }
  std::sort(v.begin(), v.end());
  return v;
}

// `after` is fairer than `before`: at the first place where they differ by
// more than rounding, it is higher.
bool fairer(const std::vector<double>& after, const std::vector<double>& before) {
  for (std::size_t i = 0; i < after.size() && i < before.size(); ++i) {
    const double eps = 1e-9 * std::max(after[i], before[i]);
    if (after[i] > before[i] + eps) return true;
    if (after[i] < before[i] - eps) return false;
  }
  return false;
}

// Judged on a swap's expected effect, it must not take service from t, nor
// lift any other tenant above the most served one; and if it moves service
// at all, it must leave the least served better off (the sorted normalised
// throughputs, lowest first, lexicographically higher). A swap that moves no
// service moves guarantees only, which harms nobody.
struct Before {
  std::vector<double> service;  // per tenant
  std::vector<double> leximin;
  double hi = 0;  // the highest normalised throughput of the complete, unsatisfied
};

bool harmless(const Model& m, std::size_t t, const Before& b) {
  bool moved = false;
  for (std::size_t i = 0; i < m.tenants.size(); ++i) {
    const Tenant& u = m.tenants[i];
    const double eps = 1e-12 * std::max(1.0, b.service[i]);
    const bool lost = u.service < b.service[i] - eps;
    const bool gained = u.service > b.service[i] + eps;
    moved = moved || lost || gained;
    if (i == t && lost) return false;
    if (i != t && gained && u.complete && u.unsatisfied && u.normalised() > b.hi) return false;
  }
  return !moved || fairer(leximin(m), b.leximin);
}

// The stages a swap touched still hold their totals, and no weight there is
// below its tenant's floor (for SLUICE_DCHECK).
bool weights_kept(const Model& m, const Swap& s) {
  for (const Hop& h : s.hops) {
    const Node& n = m.nodes[m.cells[h.taker].node];
    double sum = 0;
    for (std::size_t ci : n.cells) {
      const Cell& c = m.cells[ci];
      sum += c.weight;
      if (c.weight < m.tenants[c.tenant].floor * (1 - 1e-9)) return false;
    }
    if (std::abs(sum - n.total) > 1e-9 * n.total) return false;
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
    n.total = n.capacity = 0;
    double bk_service = 0, bk_weight = 0;
    for (std::size_t ci : n.cells) {
      Cell& c = m.cells[ci];
      c.expected = c.served;
      c.expected_backlogged = c.measured && c.backlogged;
      m.tenants[c.tenant].service += c.served;
      n.total += c.weight;
      if (c.measured) n.capacity += c.served;
      if (c.expected_backlogged) {
        bk_service += c.served;
        bk_weight += c.weight;
      }
    }
    n.rho = bk_weight > 0 ? bk_service / bk_weight : 0;
  }
}

double Cell::demand() const {
  return backlogged ? std::numeric_limits<double>::infinity() : served;
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

// The largest swap for t of at most `s`'s size that does no harm (see
// harmless()), applied; false (and m unchanged) if none gains t at least
// the threshold.
bool try_swap(Model& m, const Params& p, const Search& search, std::size_t t, Swap& s) {
  // As Pisces bounds a swap so that the tenant it takes from does not end up
  // worse off than the tenant it is for: halve it until it does no harm.
  const std::size_t giver = m.cells[s.hops.front().giver].tenant;
  const double threshold_t = threshold(m, p, t, giver);
  for (int halvings = 0; halvings <= kHalvings; ++halvings) {
    s.fairness = search.fairness_of(s);
    const Undo undo = snapshot(m, s);
    // The swap is judged against the same model without it: the stages it
    // touches served again under the weights as they are. Measured service
    // is not the model's (a real queue does not split exactly by weight),
    // and that difference alone must not count as the swap's harm or gain.
    for (const auto& [n, rho] : undo.rho) serve(m, n);
    Before b;
    b.service.reserve(m.tenants.size());
    for (const Tenant& u : m.tenants) b.service.push_back(u.service);
    b.hi = highest(m);
    b.leximin = leximin(m);
    const Node& first = m.nodes[m.cells[s.hops.front().taker].node];
    apply(m, s);
    // What t gains: the service it is expected to gain, or the guarantee
    // (share of R̂) it takes, whichever is more.
    s.gain = std::max(m.tenants[t].service - b.service[t], s.weight / first.total);
    if (s.gain >= threshold_t && harmless(m, t, b)) return true;
    restore(m, undo);
    if (!(s.gain >= threshold_t)) return false;  // a smaller swap gains less
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
          SLUICE_DCHECK(weights_kept(m, s), "a swap keeps the stages' totals and the floors");
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
