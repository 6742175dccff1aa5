// The search for Pisces weight swaps over one step's measurements, internal
// to sluice::policies. A model is stages and tenants; a cell is one tenant's
// flow at one stage, with its local weight and what it was served. A swap is
// a cycle of "takes" t -> x1 -> ... -> t, each hop moving d within one stage,
// so each tenant's sum and each stage's total are unchanged; d is the
// cycle's bottleneck (docs/policies.md has the hop capacities).
//
// Thread safety: pure functions of the values passed in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sluice::pisces {

struct Cell {
  std::size_t node = 0;
  std::size_t tenant = 0;
  double weight = 0;        // the local weight; swaps change it
  bool measured = false;    // the interval's service is known
  bool backlogged = false;  // queued for most of the interval: wants more here
  double served = 0;        // share of the stage's capacity served in the interval
  double arrived = 0;       // share of the stage's capacity that arrived
  // The service expected under the weights as swapped so far, as fair
  // queuing serves the demands (allocate() keeps it), and whether it is
  // then short of its demand (backlogged).
  double expected = 0;
  bool expected_backlogged = false;

  // What it would use: unbounded where it queued, else what it was served.
  double demand() const;
};

struct Node {
  double total = 0;     // sum of its cells' weights; swaps keep it
  double capacity = 0;  // what it served in the interval (sum of the measured cells')
  std::vector<std::size_t> cells;
  // Service share per unit of weight of its backlogged flows under the
  // weights as swapped so far: what one more unit of weight gives a
  // backlogged flow (0: none backlogged). allocate() keeps it.
  double rho = 0;
};

struct Tenant {
  std::uint64_t id = 0;
  double global_weight = 1;
  double floor = 0;          // the smallest local weight it may be left with
  bool complete = false;     // measured at every stage where it appears
  bool unsatisfied = false;  // backlogged at some stage
  double service = 0;        // sum of its cells' expected service
  std::vector<std::size_t> cells;

  double normalised() const { return service / global_weight; }
};

struct Model {
  std::vector<Node> nodes;
  std::vector<Tenant> tenants;
  std::vector<Cell> cells;
};

struct Params {
  bool multilateral = true;  // widest cycle (MBF); false: two tenants only
  double min_swap = 0.005;
  int max_swaps = 8;
  double headroom = 0;
  double tolerance = 0.01;
  double damping = 0.5;
  double max_weight = 1e6;
};

// One hop of a swap: `taker` and `giver` are cells of the same node.
struct Hop {
  std::size_t taker = 0;
  std::size_t giver = 0;
};

struct Swap {
  std::size_t tenant = 0;  // the tenant the swap is for
  double weight = 0;       // moved along every hop
  double gain = 0;         // share of the first hop's stage the tenant gains
  bool fairness = false;   // the first hop takes service from a tenant ahead
  std::vector<Hop> hops;   // the first takes for the tenant; the last from it
};

// Links cells to their nodes and tenants (the cells' node and tenant indices
// must be set); computes every node's total and backlogged share, and every
// cell's and tenant's expected service from what was measured.
void prepare(Model& m);

// Spare weight of a cell: weight above what keeps its share at least its use
// times (1 + headroom) and its weight at least its tenant's floor; 0 where it
// is backlogged or not measured.
double spare_weight(const Model& m, const Cell& c, double headroom);

// The weighted mean normalised throughput of the complete, unsatisfied
// tenants (0 without any).
double fair_level(const Model& m);

// Up to p.max_swaps swaps, each applied to m's weights (and its expected
// effect to the service of the cells at the stages it touches) before the
// next is sought; the tenant with the largest mismatch that has a swap of at
// least p.min_swap goes first.
std::vector<Swap> allocate(Model& m, const Params& p);

}  // namespace sluice::pisces
