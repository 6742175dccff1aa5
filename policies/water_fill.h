// Weighted max-min fair sharing (water-filling) with floors and demand caps,
// shared by the policies that divide one capacity among claimants. Claim i
// gets alloc_i = clamp(weight_i * L, lo_i, hi_i), lo_i = min(floor_i,
// demand_i), hi_i = demand_i (infinity: unbounded), with the level L such
// that sum(alloc) == capacity. Special cases:
//  - sum(hi) <= capacity: everyone gets its demand; the surplus is left.
//  - sum(lo) >= capacity: every claim gets lo_i * capacity / sum(lo).
//  - weight <= 0 (or NaN): only lo_i.
// Negative or NaN demands and floors count as 0, a negative capacity as 0.
//
// Thread safety: a pure function; O(n log n).
#pragma once

#include <limits>
#include <vector>

namespace sluice {

struct Claim {
  double demand = std::numeric_limits<double>::infinity();  // at most this
  double weight = 1.0;                                      // share above the floor
  double floor = 0.0;                                       // at least min(floor, demand)
};

std::vector<double> water_fill(double capacity, const std::vector<Claim>& claims);

}  // namespace sluice
