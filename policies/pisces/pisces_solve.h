// The `pisces` policy's "maxmin" method, internal to sluice::policies: the
// weighted max-min fair allocation of every stage's capacity to the tenants
// (maxmin_allocate: progressive filling, each level found exactly from a
// bipartite max flow's minimum cut), and the local weights that make fair
// queues deliver it (maxmin_weights: per tenant proportional to its
// allocation at each stage, summing to G_t times its stage count). Each cell
// (tenant t at stage s) has a demand cap d_ts (infinite where t queued),
// each stage a capacity c_s. docs/policies.md, "pisces", has the method.
//
// Thread safety: pure functions of the values passed in.
#pragma once

#include <cstddef>
#include <vector>

#include "pisces_swap.h"

namespace sluice::pisces {

struct SolveCell {
  std::size_t stage = 0;
  std::size_t tenant = 0;
  double demand = 0;  // the most it may get here; +infinity: unbounded
  // Of the splits of a tenant's total over its cells, the allocation takes
  // one that gives each cell up to this first (what it was served: the
  // allocation then moves no more service between stages than it must).
  double prefer = 0;
};

struct SolveProblem {
  std::vector<double> capacity;  // per stage, >= 0
  std::vector<double> weight;    // per tenant, G_t > 0
  std::vector<SolveCell> cells;  // at most one per (stage, tenant)
};

struct Allocation {
  std::vector<double> x;      // per cell: its part of the allocation
  std::vector<double> total;  // per tenant: X_t, the sum of its cells' x
  std::vector<double> level;  // per tenant: X_t / G_t, the level it froze at
  int rounds = 0;             // levels frozen (for reports and tests)
};

// The weighted max-min fair allocation of `p` (see above). A tenant with no
// cell, or none with demand at a stage with capacity, gets 0.
Allocation maxmin_allocate(const SolveProblem& p);

// Local weights for one tenant's cells that realise an allocation: given
// the cells' allocations x (all >= 0), the sum the weights must keep, and
// the smallest and largest weight a cell may have, weights proportional to x
// where that leaves every cell within [lo, hi], else the cells that would
// fall below lo held at lo (above hi at hi) and the others proportional to x
// within what is left. With every x = 0, the sum shared equally. `sum` must
// lie within [lo, hi] times the number of cells.
std::vector<double> maxmin_weights(const std::vector<double>& x, double sum, double lo, double hi);

// One step of the "maxmin" method over a model built from measurements
// (pisces_swap.h: cells with their weights, served and arrived shares and
// whether they were backlogged; tenants with their global weights, floors
// and whether they were measured at every stage where they appear).
struct MaxminParams {
  double headroom = 0;   // a cell that did not queue may grow by this fraction
  double damping = 0.5;  // the fraction of the way to the target one step goes
  double max_weight = 1e6;
  // A stage's capacity in the model's units (an fq serves 1 s of work per
  // second: 1); a stage where nobody queued is taken to have at least this,
  // one where somebody did, what it served.
  double stage_capacity = 1;
};

struct MaxminStep {
  // Per model cell: its demand as the allocation took it (+infinity where
  // it queued), its part x of the allocation and its target weight; NaN for
  // the cells of tenants held (not measured at every stage: their weights
  // stay and what they were served is taken off their stages' capacity).
  std::vector<double> demand, allocation, target;
  // Per model tenant: the level it froze at (NaN: held).
  std::vector<double> level;
  std::vector<double> capacity;  // per model node, as the allocation took it
  int rounds = 0;
  // The min-max ratio of normalised service over the tenants measured
  // everywhere that queued somewhere, as fair queues would serve the demands
  // under the weights before the step, under the target weights, and the
  // allocation's own (0 without such a tenant).
  double expected_mmr_before = 0, expected_mmr_target = 0, allocation_mmr = 0;
  // The largest |sum of a tenant's weights - what it held before| over that
  // sum, after the step (0: every tenant's sum kept).
  double invariant_deviation = 0;
};

// Computes the allocation and the target weights, and moves every measured
// tenant's cells' weights in `m` a `damping` fraction toward their targets.
MaxminStep maxmin_step(Model& m, const MaxminParams& p);

// Tenant service (in the model's units) as fair queues at every node serve
// the cells' demands (`demand`, per cell) under `weights` (per cell) within
// `capacity` (per node); cells with a NaN demand are served what they were.
std::vector<double> fq_service(const Model& m, const std::vector<double>& demand,
                               const std::vector<double>& weights,
                               const std::vector<double>& capacity);

}  // namespace sluice::pisces
