// Token buckets for the daemon's messages about peers (log_limiter.h).
#include "log_limiter.h"

#include <algorithm>

namespace sluice::control {

LogLimiter::Bucket& LogLimiter::bucket(std::string_view kind) {
  auto it = buckets_.find(kind);
  if (it == buckets_.end()) {
    it = buckets_.emplace(std::string(kind), Bucket{}).first;
    it->second.limit = default_;
  }
  return it->second;
}

void LogLimiter::set_limit(std::string_view kind, Limit limit) {
  Bucket& b = bucket(kind);
  b.limit = limit;
  b.tokens = limit.burst;
}

void LogLimiter::refill(Bucket& b, std::int64_t now_ns) {
  if (!b.started) {
    b.started = true;
    b.tokens = b.limit.burst;
    b.refilled_ns = now_ns;
    return;
  }
  if (now_ns <= b.refilled_ns) return;
  const double added = static_cast<double>(now_ns - b.refilled_ns) / 1e9 * b.limit.per_second;
  b.tokens = std::min(b.limit.burst, b.tokens + added);
  b.refilled_ns = now_ns;
}

bool LogLimiter::admit(std::string_view kind, std::int64_t now_ns, std::uint64_t* suppressed) {
  Bucket& b = bucket(kind);
  refill(b, now_ns);
  if (b.tokens < 1.0) {
    ++b.pending;
    ++b.suppressed;
    ++suppressed_total_;
    return false;
  }
  b.tokens -= 1.0;
  ++b.logged;
  if (suppressed) *suppressed = b.pending;
  b.pending = 0;
  return true;
}

std::vector<std::pair<std::string, std::uint64_t>> LogLimiter::take_summaries(std::int64_t now_ns) {
  std::vector<std::pair<std::string, std::uint64_t>> out;
  for (auto& [kind, b] : buckets_) {
    if (b.pending == 0) continue;
    refill(b, now_ns);
    if (b.tokens < 1.0) continue;
    b.tokens -= 1.0;
    out.emplace_back(kind, b.pending);
    b.pending = 0;
  }
  return out;
}

nlohmann::json LogLimiter::counts() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [kind, b] : buckets_) {
    j[kind] = {{"logged", b.logged}, {"suppressed", b.suppressed}};
  }
  return j;
}

}  // namespace sluice::control
