#include "support/percentile.h"

#include <algorithm>
#include <cstddef>

namespace sluice::bench {

namespace {

// `v` sorted.
double at_quantile(const std::vector<double>& v, double q) {
  const double last = static_cast<double>(v.size() - 1);
  return v[static_cast<std::size_t>(std::clamp(q, 0.0, 1.0) * last + 0.5)];
}

}  // namespace

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return at_quantile(v, q);
}

Spread spread(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  return {v.front(), at_quantile(v, 0.5), v.back()};
}

}  // namespace sluice::bench
