// Order statistics of a benchmark's samples, one definition for every
// benchmark and example program so that their figures mean the same.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <vector>

namespace sluice::bench {

// The q-quantile (q in [0, 1], clamped) of `v` as one of its values, the
// nearest rank: the value at index round(q * (n - 1)) of `v` sorted. 0 when `v`
// is empty. percentile(v, 0.5) is the upper of the two middle values when n is
// even.
double percentile(std::vector<double> v, double q);

struct Spread {
  double min = 0;
  double median = 0;  // percentile(v, 0.5)
  double max = 0;
};

// The smallest, median and largest of `v` (all 0 when `v` is empty).
Spread spread(std::vector<double> v);

}  // namespace sluice::bench
