// Weighted max-min fair sharing (water-filling) with floors and demand caps.
//
// A pure function, shared by the policies that divide one capacity among
// claimants (maxmin; silk may use it to split by demand) and exposed for tests.
//
// Semantics. Claim i asks for at most `demand` (infinity: unbounded), is
// guaranteed at least min(floor, demand), and shares the rest in proportion to
// `weight`. The result is
//
//   alloc_i = clamp(weight_i * L, lo_i, hi_i),  lo_i = min(floor_i, demand_i), hi_i = demand_i
//
// with the water level L chosen so that sum(alloc) == capacity. So a claim
// that wants less than its weighted share gets exactly what it wants and the
// rest is poured over the others (demands A=100, B=10 at capacity 100 give
// A=90, B=10), and no claim gets more than it can use. Special cases:
//  - sum(hi) <= capacity: everyone gets its demand; the surplus stays
//    unallocated (the caller decides what to do with it).
//  - sum(lo) >= capacity: the floors cannot all be met; every claim gets
//    lo_i * capacity / sum(lo) (floors scaled down proportionally).
//  - weight <= 0 (or NaN): the claim gets only its floor part lo_i.
// Negative or NaN demands and floors count as 0; a negative capacity as 0.
// Cost: O(n log n).
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
