// RocksDB's own rate limiter as a baseline: see internal/sluice/rocksdb_limiter.h.
#include "sluice/rocksdb_limiter.h"

#include <string>

namespace sluice::rocksdb_binding {

namespace rdb = ::rocksdb;

StatusOr<std::shared_ptr<rdb::RateLimiter>> UseRocksDbLimiter(rdb::DBOptions& options,
                                                              const LimiterOptions& l) {
  if (l.bytes_per_second <= 0) {
    return Status::invalid("rocksdb limiter: bytes_per_second must be > 0, got " +
                           std::to_string(l.bytes_per_second));
  }
  if (l.refill_period_us <= 0) {
    return Status::invalid("rocksdb limiter: refill_period_us must be > 0, got " +
                           std::to_string(l.refill_period_us));
  }
  if (l.fairness < 1) {
    return Status::invalid("rocksdb limiter: fairness must be >= 1, got " +
                           std::to_string(l.fairness));
  }
  std::shared_ptr<rdb::RateLimiter> limiter(rdb::NewGenericRateLimiter(
      l.bytes_per_second, l.refill_period_us, l.fairness,
      l.charge_reads ? rdb::RateLimiter::Mode::kAllIo : rdb::RateLimiter::Mode::kWritesOnly,
      l.auto_tuned));
  if (!limiter) return Status::internal("rocksdb limiter: NewGenericRateLimiter returned null");
  options.rate_limiter = limiter;
  if (l.bytes_per_sync > 0) options.bytes_per_sync = l.bytes_per_sync;
  return limiter;
}

rdb::ReadOptions LimitedReadOptions() {
  rdb::ReadOptions ro;
  ro.rate_limiter_priority = rdb::Env::IO_USER;
  return ro;
}

rdb::WriteOptions LimitedWriteOptions() {
  rdb::WriteOptions wo;
  wo.rate_limiter_priority = rdb::Env::IO_USER;
  return wo;
}

LimiterState ReadLimiter(const rdb::RateLimiter& limiter) {
  LimiterState s;
  s.bytes_per_second = limiter.GetBytesPerSecond();
  s.user_bytes = limiter.GetTotalBytesThrough(rdb::Env::IO_USER);
  s.high_bytes = limiter.GetTotalBytesThrough(rdb::Env::IO_HIGH);
  s.low_bytes = limiter.GetTotalBytesThrough(rdb::Env::IO_LOW);
  s.total_bytes = limiter.GetTotalBytesThrough(rdb::Env::IO_TOTAL);
  s.total_requests = limiter.GetTotalRequests(rdb::Env::IO_TOTAL);
  std::int64_t pending = 0;
  s.pending_requests =
      limiter.GetTotalPendingRequests(&pending, rdb::Env::IO_TOTAL).ok() ? pending : -1;
  return s;
}

}  // namespace sluice::rocksdb_binding
