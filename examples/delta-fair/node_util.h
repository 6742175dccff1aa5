// What the delta-fair example's node programs share: the examples' latency
// histogram (support/latency.h), Zipfian ranks, and the state of a stage's
// object by name.
//
// Thread safety: a Histogram is a plain value, owned by one thread at a time;
// a Zipf is immutable after construction (next() from any thread, each with
// its own generator); object_state() is as Stage::totals() (any thread).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/stage.h"
#include "support/latency.h"

namespace sluice::examples::delta_fair {

inline constexpr double kMiB = 1024.0 * 1024.0;

using Histogram = bench::LatencyHistogram;

// Zipfian ranks over n items (θ = 0.99, YCSB's default), by a precomputed CDF.
class Zipf {
 public:
  explicit Zipf(std::uint64_t n) : cdf_(n) {
    double s = 0;
    for (std::uint64_t i = 0; i < n; ++i) cdf_[i] = s += 1.0 / std::pow(double(i + 1), 0.99);
    for (auto& c : cdf_) c /= s;
  }
  std::uint64_t next(std::mt19937_64& rng) const {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return std::min<std::uint64_t>(cdf_.size() - 1,
                                   std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
  }

 private:
  std::vector<double> cdf_;
};

// The state of the stage's object named `name` (totals()), or null.
inline nlohmann::json object_state(const Stage& stage, const std::string& name) {
  const StageStats st = stage.totals();
  for (const auto& c : st.channels) {
    for (const auto& o : c.objects) {
      if (o.name == name) return o.state;
    }
  }
  return nullptr;
}

}  // namespace sluice::examples::delta_fair
