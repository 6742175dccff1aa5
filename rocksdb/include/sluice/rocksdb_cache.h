// TenantCache: a block cache for unmodified RocksDB that shares one capacity among
// tenants and keeps each tenant's reserved threshold from a `cache-reserve` object: a
// block is never evicted from a tenant at or below its threshold while another is
// above its own. One sharded core (each shard a mutex, a hash table and a TenantLru)
// and a rocksdb::Cache view per tenant (view(t)); keys are kept per view, so tenants
// never share an entry. A view implements RocksDB 7.8's Cache contract: usage, entries,
// Erase and Lookup are the tenant's; capacity, the strict limit and NewId are shared.
// docs/rocksdb.md, "Tenant-aware block cache", has the details.
//
// Thread safety: TenantCache and its views are safe from any thread, like RocksDB's
// caches. A handle is released once, through a view of the cache that gave it.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include <rocksdb/cache.h>

#include "sluice/objects/types.h"
#include "sluice/stage.h"
#include "sluice/status.h"

namespace sluice::rocksdb_binding {

struct TenantCacheOptions {
  // The shared capacity in bytes, for a cache without `reserve`: it then
  // gets a private cache-reserve object of this capacity (nothing reserved).
  std::uint64_t capacity = 0;
  // -1: as NewLRUCache picks (one shard per 512 KiB, at most 64); else
  // 0..19.
  int num_shard_bits = -1;
  bool strict_capacity_limit = false;
  // The cache-reserve object to consult (capacity and thresholds), or null.
  std::shared_ptr<CacheReserve> reserve;
};

class TenantCache {
 public:
  // Errors name the option: "num_shard_bits: must be from -1 to 19, got 20",
  // "capacity: ...", "reserve: not configured (it has no capacity)".
  static StatusOr<std::shared_ptr<TenantCache>> make(const TenantCacheOptions& options);

  // The cache-reserve object named `object` in channel `channel` of `stage`
  // (the object the stage's rules created; a later rule that removes it
  // does not move a cache made from it).
  static StatusOr<std::shared_ptr<CacheReserve>> find_reserve(const Stage& stage,
                                                              std::string_view channel,
                                                              std::string_view object);

  ~TenantCache();
  TenantCache(const TenantCache&) = delete;
  TenantCache& operator=(const TenantCache&) = delete;

  // Tenant `tenant`'s view (one per tenant: another call gives another
  // handle on the same entries). Keeps the cache alive.
  std::shared_ptr<rocksdb::Cache> view(std::uint64_t tenant);

  std::uint64_t capacity() const noexcept;
  // The reserve object's capacity; evicts down to it now (unpinned entries).
  Status set_capacity(std::uint64_t bytes);
  void set_strict_capacity_limit(bool strict) noexcept;
  bool strict_capacity_limit() const noexcept;
  int num_shard_bits() const noexcept;
  CacheReserve& reserve() const noexcept;

  // Everyone's, or one tenant's (zeros for a tenant without a view).
  std::uint64_t usage() const;
  std::uint64_t pinned_usage() const;
  TenantLruStats stats(std::uint64_t tenant) const;
  // Work of the eviction cores (TenantLru::steps), summed over the shards.
  std::uint64_t steps() const;

  class Core;

 private:
  explicit TenantCache(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  std::shared_ptr<Core> core_;
};

}  // namespace sluice::rocksdb_binding
