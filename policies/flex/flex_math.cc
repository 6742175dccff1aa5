// The flex policy's arithmetic; see flex_math.h.
#include "flex_math.h"

#include <algorithm>

namespace sluice::flex {

double foreground_rate(double rcu_per_s, double rcu_size, double read_amplification,
                       double wcu_per_s, double wcu_size) noexcept {
  return rcu_per_s * rcu_size * read_amplification + wcu_per_s * wcu_size;
}

LsmAmplification lsm_amplification(int levels) noexcept {
  levels = std::clamp(levels, kMinLevels, kMaxLevels);
  LsmAmplification a;
  a.write = 1 + 2 + 11.0 * (levels - 2);
  a.read = levels >= 3 ? 10 + 11.0 * (levels - 3) : 0;
  a.total = a.write + a.read;
  return a;
}

double background_rate(double ingest_per_s, double lsm_ba, double floor) noexcept {
  return std::max(floor, ingest_per_s * lsm_ba);
}

void IngestWindow::add(std::int64_t interval_ns, double bytes) {
  if (interval_ns <= 0) return;
  samples_.emplace_back(interval_ns, bytes);
  total_ns_ += interval_ns;
  total_bytes_ += bytes;
  // Keep the newest samples that cover the window (dropping the oldest while
  // the rest still do).
  while (samples_.size() > 1 && total_ns_ - samples_.front().first >= window_ns_) {
    total_ns_ -= samples_.front().first;
    total_bytes_ -= samples_.front().second;
    samples_.pop_front();
  }
  if (samples_.size() == 1) total_bytes_ = samples_.front().second;  // no drift
}

double IngestWindow::average() const noexcept {
  return total_ns_ > 0 ? std::max(0.0, total_bytes_) * 1e9 / static_cast<double>(total_ns_) : 0;
}

std::int64_t AutoTuner::tune(std::int64_t drains, std::int64_t periods) noexcept {
  ++tunes_;
  const std::int64_t floor = max_ / kAllowedRangeFactor;
  const std::int64_t pct = periods > 0 ? drains * 100 / periods : 0;
  if (pct == 0) {
    rate_ = floor;
  } else if (pct < kLowWatermarkPct) {
    rate_ = std::max(floor, rate_ * 100 / (100 + kAdjustFactorPct));
  } else if (pct > kHighWatermarkPct) {
    rate_ = std::min(max_, rate_ * (100 + kAdjustFactorPct) / 100);
  }
  return rate_;
}

int AutoTuner::advance(std::int64_t periods, std::int64_t drains) noexcept {
  int made = 0;
  drains = std::clamp<std::int64_t>(drains, 0, periods);
  while (periods > 0) {
    // Spread the drains evenly over the periods accounted.
    const std::int64_t take = std::min(periods, kRefillsPerTune - periods_);
    const std::int64_t d = periods > 0 ? drains * take / periods : 0;
    periods_ += take;
    drains_ += d;
    periods -= take;
    drains -= d;
    if (periods_ >= kRefillsPerTune) {
      tune(drains_, periods_);
      periods_ = 0;
      drains_ = 0;
      ++made;
    }
  }
  return made;
}

}  // namespace sluice::flex
