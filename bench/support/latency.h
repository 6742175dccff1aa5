// A latency histogram for the example programs' operations: log-linear, 16
// sub-buckets per power of two (at most 6.25% relative error), in
// microseconds, exact below 32 us and capped at about 2^44 us. One definition
// so that every example's p99 means the same.
//
// Thread safety: a plain value, owned by one thread at a time.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include <nlohmann/json.hpp>

namespace sluice::bench {

class LatencyHistogram {
 public:
  static constexpr int kSub = 16;
  static constexpr int kLinear = 2 * kSub;  // values below 32 us are exact
  static constexpr int kBuckets = kLinear + 40 * kSub;

  void add(std::uint64_t us) noexcept {
    ++buckets_[static_cast<std::size_t>(bucket_of(us))];
    ++count_;
    sum_us_ += static_cast<double>(us);
  }
  void merge(const LatencyHistogram& o) noexcept {
    for (int b = 0; b < kBuckets; ++b) buckets_[b] += o.buckets_[b];
    count_ += o.count_;
    sum_us_ += o.sum_us_;
  }
  std::uint64_t count() const noexcept { return count_; }
  double mean_us() const noexcept {
    return count_ == 0 ? 0 : sum_us_ / static_cast<double>(count_);
  }
  // The upper edge of the bucket that holds the q-quantile (q in (0, 1]; the
  // sample of rank ceil(q * count)), in us; 0 when empty. quantile_us(1) is
  // the largest sample's bucket.
  double quantile_us(double q) const noexcept {
    if (count_ == 0) return 0;
    const auto rank = std::max<std::uint64_t>(
        1, static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(count_))));
    std::uint64_t seen = 0;
    for (int b = 0; b < kBuckets; ++b) {
      seen += buckets_[b];
      if (seen >= rank) return upper_edge(b);
    }
    return upper_edge(kBuckets - 1);
  }
  // {"count"} alone when empty, else count, avg_ms, p50_ms, p99_ms, p999_ms
  // and max_ms.
  nlohmann::json summary_ms() const {
    if (count_ == 0) return {{"count", 0}};
    return {{"count", count_},
            {"avg_ms", mean_us() / 1e3},
            {"p50_ms", quantile_us(0.5) / 1e3},
            {"p99_ms", quantile_us(0.99) / 1e3},
            {"p999_ms", quantile_us(0.999) / 1e3},
            {"max_ms", quantile_us(1.0) / 1e3}};
  }

 private:
  static int bucket_of(std::uint64_t us) noexcept {
    if (us < kLinear) return static_cast<int>(us);
    const int e = 63 - __builtin_clzll(us);  // >= 5
    const int sub = static_cast<int>((us >> (e - 4)) & (kSub - 1));
    return std::min(kBuckets - 1, kLinear + (e - 5) * kSub + sub);
  }
  static double upper_edge(int b) noexcept {
    if (b < kLinear) return b;
    const int e = (b - kLinear) / kSub + 5;
    const int sub = (b - kLinear) % kSub;
    return std::ldexp(static_cast<double>(kSub + sub + 1), e - 4);
  }

  std::array<std::uint32_t, kBuckets> buckets_{};
  std::uint64_t count_ = 0;
  double sum_us_ = 0;
};

}  // namespace sluice::bench
