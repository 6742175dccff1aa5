// The arithmetic of FlexEngine's two-level I/O admission control (the flex
// policy, flex.h): Equation 2 (a partition's foreground reservation),
// Equation 3 (its background rate from the ingest over a sliding window and
// the LSM tree's background amplification), the amplification derived from
// the level count (§4.2.2), and Equation 1, RocksDB's auto-tuned rate
// limiter, modelled as RocksDB's GenericRateLimiter tunes its rate (the
// baseline). Pure functions and small value types: table-tested.
//
// Thread safety: pure functions; an IngestWindow or AutoTuner is used by one
// thread at a time.
#pragma once

#include <cstdint>
#include <deque>
#include <utility>

namespace sluice::flex {

// Equation 2: RCU_max/s × RCU_size × RAF + WCU_max/s × WCU_size, bytes/s.
double foreground_rate(double rcu_per_s, double rcu_size, double read_amplification,
                       double wcu_per_s, double wcu_size) noexcept;

// The LSM tree's background I/O amplification from its level count (levels
// L0..L{n-1}, L0 as large as L1, then a factor of 10 per level; L0 and L1
// cached): writes 1 (L0) + 2 (L0 to L1) + 11 per level below L1; reads 10
// (L1 to L2) + 11 per level below L2. 4 levels: 25 + 21 = 46.
struct LsmAmplification {
  double write = 0;
  double read = 0;
  double total = 0;
};
inline constexpr int kMinLevels = 2;
inline constexpr int kMaxLevels = 16;
LsmAmplification lsm_amplification(int levels) noexcept;

// Equation 3: Data_avg_psec × LSM-BA, at least `floor`, bytes/s.
double background_rate(double ingest_per_s, double lsm_ba, double floor) noexcept;

// Data_avg_psec: the bytes ingested per second over the last `window_ns` of
// samples (each the bytes counted over an interval). Before the window has
// filled, the average over what it holds. A sample that ends the window
// moves the average at once: with a window of one control interval, the
// average is the last interval's.
class IngestWindow {
 public:
  explicit IngestWindow(std::int64_t window_ns = 60'000'000'000) : window_ns_(window_ns) {}
  void add(std::int64_t interval_ns, double bytes);
  // Bytes per second; 0 before any sample.
  double average() const noexcept;
  std::int64_t covered_ns() const noexcept { return total_ns_; }
  std::size_t samples() const noexcept { return samples_.size(); }

 private:
  std::int64_t window_ns_;
  std::deque<std::pair<std::int64_t, double>> samples_;  // (interval, bytes), oldest first
  std::int64_t total_ns_ = 0;
  double total_bytes_ = 0;
};

// Equation 1: RocksDB's auto-tuned GenericRateLimiter (util/rate_limiter.cc
// of RocksDB 7.8). It starts at max/2. Every kRefillsPerTune refill periods
// (at the first request after that many), it takes the share of refill
// periods since the last tune in which the bucket drained (a request found
// too few bytes and waited for the next refill), drained_pct = drains × 100
// / periods (integers), and sets the rate to
//   max / 20                              when drained_pct == 0,
//   max(max / 20, rate × 100 / 105)       when drained_pct < 50,
//   min(max, rate × 105 / 100)            when drained_pct > 90,
//   rate                                  otherwise,
// in whole bytes per second, then counts drains afresh.
class AutoTuner {
 public:
  static constexpr std::int64_t kRefillsPerTune = 100;
  static constexpr std::int64_t kAllowedRangeFactor = 20;
  static constexpr std::int64_t kLowWatermarkPct = 50;
  static constexpr std::int64_t kHighWatermarkPct = 90;
  static constexpr std::int64_t kAdjustFactorPct = 5;

  explicit AutoTuner(std::int64_t max_rate) : max_(max_rate), rate_(max_rate / 2) {}
  std::int64_t rate() const noexcept { return rate_; }
  std::int64_t max_rate() const noexcept { return max_; }
  // One tune over `periods` refill periods of which `drains` drained.
  std::int64_t tune(std::int64_t drains, std::int64_t periods) noexcept;
  // Accounts `periods` refill periods of which `drains` drained, tuning
  // whenever kRefillsPerTune have passed since the last tune. Returns the
  // number of tunes made.
  int advance(std::int64_t periods, std::int64_t drains) noexcept;
  std::int64_t tunes() const noexcept { return tunes_; }

 private:
  std::int64_t max_;
  std::int64_t rate_;
  std::int64_t periods_ = 0;  // since the last tune
  std::int64_t drains_ = 0;
  std::int64_t tunes_ = 0;
};

}  // namespace sluice::flex
