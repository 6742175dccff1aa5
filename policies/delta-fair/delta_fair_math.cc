// Delta Fair Sharing's reservation arithmetic; see delta_fair_math.h.
//
// Integer inputs (the common case: weights, bandwidth and δ written as whole
// numbers) are computed exactly in 128-bit integers, so that a reservation on
// a segment boundary (the paper's 90 MiB, 128 MiB) is not lost to rounding;
// others in long double.
#include "delta_fair_math.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "sluice/dcheck.h"

namespace sluice::delta_fair {
namespace {

__extension__ typedef unsigned __int128 u128;  // NOLINT(modernize-use-using)

constexpr double kExactLimit = 9007199254740992.0;  // 2^53: every integer below is a double

bool is_whole(double v) {
  return v >= 0 && v < kExactLimit && v == std::trunc(v);
}

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

std::vector<std::uint64_t> fair_shares(std::uint64_t capacity, const std::vector<double>& weights) {
  std::vector<std::uint64_t> f(weights.size(), 0);
  const bool whole = std::all_of(weights.begin(), weights.end(), is_whole);
  if (whole) {
    u128 total = 0;
    for (double w : weights) total += static_cast<u128>(w);
    if (total == 0) return f;
    for (std::size_t i = 0; i < weights.size(); ++i) {
      f[i] = static_cast<std::uint64_t>(u128{capacity} * static_cast<u128>(weights[i]) / total);
    }
    return f;
  }
  long double total = 0;
  for (double w : weights) total += w;
  if (!(total > 0)) return f;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const long double share = static_cast<long double>(capacity) * (weights[i] / total);
    f[i] = std::min(capacity, static_cast<std::uint64_t>(std::floor(share)));
  }
  return f;
}

// s: whole segments flushable within δ at R, rounded as asked, at most `cap`.
std::uint64_t flushable(const BufferModel& m, std::uint64_t cap) {
  if (std::isinf(m.delta_ms)) return cap;
  if (!(m.flush_bandwidth > 0) || !(m.delta_ms > 0)) return 0;
  if (is_whole(m.flush_bandwidth) && is_whole(m.delta_ms)) {
    const u128 num = static_cast<u128>(m.flush_bandwidth) * static_cast<u128>(m.delta_ms);
    const u128 den = u128{1000} * m.segment;
    const u128 s = m.rounding == Rounding::kStrict ? num / den : (2 * num + den) / (2 * den);
    return s >= cap ? cap : static_cast<std::uint64_t>(s);
  }
  const long double x = static_cast<long double>(m.flush_bandwidth) * m.delta_ms /
                        (1000.0L * static_cast<long double>(m.segment));
  const long double s = m.rounding == Rounding::kStrict ? std::floor(x) : std::floor(x + 0.5L);
  if (!(s < static_cast<long double>(cap))) return cap;
  return static_cast<std::uint64_t>(s);
}

// Flushing `bytes` in whole segments at R, in ms.
double flush_ms(const BufferModel& m, std::uint64_t bytes) {
  const std::uint64_t segments = ceil_div(bytes, m.segment);
  if (segments == 0) return 0;
  if (!(m.flush_bandwidth > 0)) return std::numeric_limits<double>::infinity();
  return static_cast<double>(static_cast<long double>(segments) * m.segment * 1000.0L /
                             m.flush_bandwidth);
}

}  // namespace

std::string_view rounding_name(Rounding r) noexcept {
  return r == Rounding::kNearest ? "nearest" : "strict";
}

Reservation reserve(const BufferModel& m, const std::vector<double>& weights) {
  SLUICE_DCHECK(m.segment >= 1 && m.capacity >= m.segment, "capacity >= segment >= 1");
  SLUICE_DCHECK(m.k >= 1, "k >= 1");
  SLUICE_DCHECK(m.delta_ms >= 0 && m.flush_bandwidth >= 0, "delta and bandwidth >= 0");
  SLUICE_DCHECK(!weights.empty(), "at least one tenant");
  Reservation r;
  if (m.segment == 0) return r;  // nothing can be said of a buffer without segments
  r.fair_share = fair_shares(m.capacity, weights);

  std::vector<std::uint64_t> sorted = r.fair_share;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const std::size_t k = std::min(sorted.size(), static_cast<std::size_t>(std::max(m.k, 1)));
  for (std::size_t i = 0; i < k; ++i) r.ramp_demand += sorted[i];
  const std::uint64_t d = r.ramp_demand;

  const std::uint64_t spans = ceil_div(d, m.segment);
  r.flushable_segments = flushable(m, spans);
  const u128 can_flush = u128{r.flushable_segments} * m.segment;
  const std::uint64_t residual = can_flush >= d ? 0 : d - static_cast<std::uint64_t>(can_flush);
  const u128 rounded = u128{ceil_div(residual, m.segment)} * m.segment;
  r.reserved = rounded >= d ? d : static_cast<std::uint64_t>(rounded);
  r.reserved_fraction = static_cast<double>(static_cast<long double>(r.reserved) /
                                            static_cast<long double>(m.capacity));

  r.per_tenant.resize(r.fair_share.size(), 0);
  if (d > 0) {
    for (std::size_t i = 0; i < r.fair_share.size(); ++i) {
      const u128 num = u128{r.fair_share[i]} * r.reserved;
      r.per_tenant[i] = static_cast<std::uint64_t>((2 * num + d) / (u128{2} * d));
    }
  }
  r.flush_time_ms = flush_ms(m, d - r.reserved);
  r.worst_case_delay_ms = flush_ms(m, d);
  return r;
}

namespace {

// ρ = floor(max(0, f - b)) for b = R * δ / (1000 * k * AMP), δ finite.
std::uint64_t cache_threshold(const CacheModel& m, int k, std::uint64_t f) {
  if (!(m.refill_bandwidth > 0) || !(m.delta_ms > 0)) return f;
  const long double den_ld = 1000.0L * k * m.read_amplification;
  if (is_whole(m.refill_bandwidth) && is_whole(m.delta_ms) && is_whole(m.read_amplification) &&
      den_ld < 18446744073709551616.0L) {
    // Exact: f * den < 2^128, R * δ < 2^106.
    const u128 num = static_cast<u128>(m.refill_bandwidth) * static_cast<u128>(m.delta_ms);
    const u128 den = u128{1000} * static_cast<u128>(k) * static_cast<u128>(m.read_amplification);
    const u128 have = u128{f} * den;
    return have <= num ? 0 : static_cast<std::uint64_t>((have - num) / den);
  }
  const long double b = static_cast<long double>(m.refill_bandwidth) * m.delta_ms / den_ld;
  const long double rho = std::floor(static_cast<long double>(f) - b);
  if (!(rho > 0)) return 0;
  return std::min(f, static_cast<std::uint64_t>(rho));
}

// Refilling `bytes` at R / (k * AMP), in ms.
double refill_ms(const CacheModel& m, int k, std::uint64_t bytes) {
  if (bytes == 0) return 0;
  if (!(m.refill_bandwidth > 0)) return std::numeric_limits<double>::infinity();
  return static_cast<double>(static_cast<long double>(bytes) * k * m.read_amplification * 1000.0L /
                             m.refill_bandwidth);
}

}  // namespace

CacheReservation reserve_cache(const CacheModel& m, const std::vector<double>& weights) {
  SLUICE_DCHECK(m.capacity >= 1, "capacity >= 1");
  SLUICE_DCHECK(m.k >= 1, "k >= 1");
  SLUICE_DCHECK(m.delta_ms >= 0 && m.refill_bandwidth >= 0, "delta and bandwidth >= 0");
  SLUICE_DCHECK(m.read_amplification >= 1, "read amplification >= 1");
  SLUICE_DCHECK(!weights.empty(), "at least one tenant");
  CacheReservation r;
  r.fair_share = fair_shares(m.capacity, weights);
  const int k = static_cast<int>(
      std::min<std::size_t>(std::max<std::size_t>(weights.size(), 1), std::max(m.k, 1)));
  r.ramp_ups = k;
  const long double amp = std::max(1.0, m.read_amplification);
  r.refill_rate = static_cast<double>(m.refill_bandwidth / (k * amp));
  if (std::isinf(m.delta_ms)) {
    r.refill_budget = std::numeric_limits<double>::infinity();
  } else {
    r.refill_budget = static_cast<double>(static_cast<long double>(m.refill_bandwidth) *
                                          m.delta_ms / (1000.0L * k * amp));
  }
  r.per_tenant.resize(r.fair_share.size(), 0);
  std::uint64_t largest = 0, residual = 0;
  for (std::size_t i = 0; i < r.fair_share.size(); ++i) {
    const std::uint64_t f = r.fair_share[i];
    r.per_tenant[i] = std::isinf(m.delta_ms) ? 0 : cache_threshold(m, k, f);
    r.reserved += r.per_tenant[i];
    largest = std::max(largest, f);
    residual = std::max(residual, f - r.per_tenant[i]);
  }
  r.reserved_fraction =
      static_cast<double>(static_cast<long double>(r.reserved) /
                          static_cast<long double>(std::max<std::uint64_t>(m.capacity, 1)));
  r.refill_time_ms = refill_ms(m, k, largest);
  r.refill_time_reserved_ms = refill_ms(m, k, residual);
  return r;
}

}  // namespace sluice::delta_fair
