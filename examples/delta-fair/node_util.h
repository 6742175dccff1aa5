// What the delta-fair example's node programs share: a latency histogram
// (log-linear, 16 sub-buckets per power of two, at most 6.25% relative error,
// in microseconds) and its summary in milliseconds, Zipfian ranks, and the
// state of a stage's object by name.
//
// Thread safety: a Histogram is a plain array, owned by one thread at a time;
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

namespace sluice::examples::delta_fair {

inline constexpr double kMiB = 1024.0 * 1024.0;

inline constexpr int kSub = 16;
inline constexpr int kLinear = 2 * kSub;
inline constexpr int kBuckets = kLinear + 40 * kSub;
using Histogram = std::array<std::uint32_t, kBuckets>;

inline int bucket_of(std::uint64_t us) {
  if (us < kLinear) return static_cast<int>(us);
  const int e = 63 - __builtin_clzll(us);
  const int sub = static_cast<int>((us >> (e - 4)) & (kSub - 1));
  return std::min(kBuckets - 1, kLinear + (e - 5) * kSub + sub);
}

inline double bucket_value(int b) {  // the bucket's upper edge
  if (b < kLinear) return b;
  const int e = (b - kLinear) / kSub + 5;
  const int sub = (b - kLinear) % kSub;
  return std::ldexp(static_cast<double>(kSub + sub + 1), e - 4);
}

inline void add_into(Histogram& to, const Histogram& from) {
  for (int k = 0; k < kBuckets; ++k) to[k] += from[k];
}

// {"count"} alone when empty, else {"count", "p50_ms", "p99_ms", "max_ms"}.
inline nlohmann::json summarize_ms(const Histogram& h) {
  std::uint64_t n = 0;
  for (auto c : h) n += c;
  if (n == 0) return {{"count", 0}};
  auto quantile = [&](double q) {
    const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(n)));
    std::uint64_t seen = 0;
    for (int b = 0; b < kBuckets; ++b) {
      seen += h[b];
      if (seen >= rank) return bucket_value(b) / 1e3;
    }
    return bucket_value(kBuckets - 1) / 1e3;
  };
  return {{"count", n},
          {"p50_ms", quantile(0.5)},
          {"p99_ms", quantile(0.99)},
          {"max_ms", quantile(1.0)}};
}

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
