// Water-filling: see water_fill.h for the semantics.
//
// f(L) = sum_i clamp(w_i * L, lo_i, hi_i) is continuous, piecewise linear and
// nondecreasing in L, with breakpoints at lo_i / w_i and hi_i / w_i. We walk
// the sorted breakpoints until f reaches the capacity and solve the linear
// piece exactly, instead of iterating "give everyone capacity / n, take back
// what they do not use", which is not max-min unless it loops to a fixpoint.
#include "water_fill.h"

#include <algorithm>
#include <cmath>

namespace sluice {
namespace {

double non_negative(double v) {
  return (std::isnan(v) || v < 0) ? 0.0 : v;
}

}  // namespace

std::vector<double> water_fill(double capacity, const std::vector<Claim>& claims) {
  const std::size_t n = claims.size();
  std::vector<double> lo(n), hi(n), w(n), out(n, 0.0);
  capacity = non_negative(capacity);
  double sum_lo = 0;
  double sum_hi = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double wi = claims[i].weight;
    w[i] = (std::isfinite(wi) && wi > 0) ? wi : 0.0;
    hi[i] = non_negative(claims[i].demand);
    lo[i] = std::min(non_negative(claims[i].floor), hi[i]);
    if (w[i] == 0) hi[i] = lo[i];  // no share above the floor
    sum_lo += lo[i];
    sum_hi += hi[i];
  }
  if (n == 0) return out;
  if (sum_lo >= capacity) {
    // Floors alone exhaust the capacity: scale them down proportionally.
    if (sum_lo > 0 && std::isfinite(sum_lo)) {
      for (std::size_t i = 0; i < n; ++i) out[i] = lo[i] * (capacity / sum_lo);
    } else if (sum_lo > 0) {  // infinite floors: share among them evenly
      std::size_t inf_count = 0;
      for (std::size_t i = 0; i < n; ++i) inf_count += std::isinf(lo[i]) ? 1 : 0;
      for (std::size_t i = 0; i < n; ++i) {
        out[i] = std::isinf(lo[i]) ? capacity / static_cast<double>(inf_count) : 0.0;
      }
    }
    return out;
  }
  if (sum_hi <= capacity) return hi;  // everyone satisfied; the surplus is the caller's

  auto level_sum = [&](double level) {
    double s = 0;
    for (std::size_t i = 0; i < n; ++i) {
      s += w[i] > 0 ? std::clamp(w[i] * level, lo[i], hi[i]) : lo[i];
    }
    return s;
  };

  std::vector<double> points;
  points.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    if (w[i] <= 0) continue;
    points.push_back(lo[i] / w[i]);
    if (std::isfinite(hi[i])) points.push_back(hi[i] / w[i]);
  }
  std::sort(points.begin(), points.end());

  double prev = 0;
  double f_prev = sum_lo;  // f(0): every claim at its floor
  double level = -1;
  for (double p : points) {
    if (!(p > prev)) continue;
    const double f_p = level_sum(p);
    if (f_p >= capacity) {
      const double slope = (f_p - f_prev) / (p - prev);
      level = slope > 0 ? prev + (capacity - f_prev) / slope : p;
      break;
    }
    prev = p;
    f_prev = f_p;
  }
  if (level < 0) {
    // Past the last breakpoint only the unbounded claims still grow.
    double slope = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (w[i] > 0 && std::isinf(hi[i])) slope += w[i];
    }
    if (slope <= 0) return hi;  // unreachable: sum(hi) > capacity needs an unbounded claim here
    level = prev + (capacity - f_prev) / slope;
  }
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = w[i] > 0 ? std::clamp(w[i] * level, lo[i], hi[i]) : lo[i];
  }
  return out;
}

}  // namespace sluice
