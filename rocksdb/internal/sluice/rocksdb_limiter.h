// RocksDB's own rate limiter, set up as a baseline beside the binding's stages: one
// GenericRateLimiter per DB (or shared) charging every I/O class RocksDB can charge,
// with the traps of RocksDB 7.8's limiter avoided (docs/rocksdb.md, "RocksDB's own
// limiter as a baseline"). Callers of the returned limiter must go through
// RequestToken: a Request() above one burst aborts in a build with assertions.
//
//   auto limiter = UseRocksDbLimiter(options, {.bytes_per_second = 64 << 20,
//                                              .auto_tuned = true});
//   db->Get(LimitedReadOptions(), key, &value);      // user reads are charged
//   db->Put(LimitedWriteOptions(), key, value);      // so are WAL writes
//
// Thread safety: UseRocksDbLimiter is not thread-safe with respect to other users of
// `options`. The limiter is RocksDB's (thread-safe); ReadLimiter from any thread.
#pragma once

#include <cstdint>
#include <memory>

#include <rocksdb/options.h>
#include <rocksdb/rate_limiter.h>

#include "sluice/status.h"

namespace sluice::rocksdb_binding {

struct LimiterOptions {
  // The limiter's rate, bytes/s (> 0); auto-tuned: its ceiling.
  std::int64_t bytes_per_second = 0;
  bool auto_tuned = false;
  std::int64_t refill_period_us = 100 * 1000;  // RocksDB's default (> 0)
  std::int32_t fairness = 10;                  // RocksDB's default (>= 1)
  // Charge reads too (RateLimiter::Mode::kAllIo, the default) or writes only.
  bool charge_reads = true;
  // Set DBOptions::bytes_per_sync to this (> 0), so that it does not silently become
  // RocksDB's 1 MiB; 0 leaves the caller's value (and RocksDB's rewrite of a 0).
  std::uint64_t bytes_per_sync = 0;
};

// Builds the limiter and sets options.rate_limiter (and bytes_per_sync). Returns the
// limiter, also held by `options`. Bad options: an error naming the field, and `options`
// unchanged.
StatusOr<std::shared_ptr<::rocksdb::RateLimiter>> UseRocksDbLimiter(::rocksdb::DBOptions& options,
                                                                    const LimiterOptions& limiter);

// ReadOptions whose reads the limiter charges (rate_limiter_priority = IO_USER).
::rocksdb::ReadOptions LimitedReadOptions();
// WriteOptions whose WAL writes the limiter charges (rate_limiter_priority = IO_USER).
::rocksdb::WriteOptions LimitedWriteOptions();

// What a limiter has let through (monotonic) and its rate now.
struct LimiterState {
  std::int64_t bytes_per_second = 0;  // current (auto-tuned: moves)
  std::int64_t user_bytes = 0;        // IO_USER: charged reads and WAL writes
  std::int64_t high_bytes = 0;        // IO_HIGH: flush
  std::int64_t low_bytes = 0;         // IO_LOW: compaction
  std::int64_t total_bytes = 0;
  std::int64_t total_requests = 0;
  std::int64_t pending_requests = 0;  // -1 when the limiter does not say
};
LimiterState ReadLimiter(const ::rocksdb::RateLimiter& limiter);

}  // namespace sluice::rocksdb_binding
