// TenantCache: a block cache for unmodified RocksDB that shares one capacity
// among tenants and keeps each tenant's reserved threshold (the
// `cache-reserve` object, sluice/objects/cache_reserve.h): a block is never
// evicted from a tenant at or below its threshold while another tenant is
// above its own.
//
// One shared core, sharded like RocksDB's LRUCache (2^num_shard_bits shards,
// a key's shard from its hash, the capacity split evenly over the shards,
// each shard a mutex, a chained hash table of entries and a TenantLru, the
// eviction core), and a rocksdb::Cache view per tenant: view(t) is what a
// column family (BlockBasedTableOptions::block_cache) or a DB uses, and
// every block inserted through it is tenant t's. Block-cache keys do not
// say whose a block is, so the view is how a block finds its owner. Keys
// are kept per view (the view's tenant is part of the key), so two column
// families never share an entry, not even the CacheEntryStatsCollector
// RocksDB keeps in the cache under one process-wide key.
//
// A view implements the whole rocksdb::Cache contract of RocksDB 7.8: the 19
// pure virtuals, with the secondary-cache overloads (Insert/Lookup with a
// helper, Release with `useful`: the table reader calls these) left to
// Cache's defaults, which forward to the basic methods (there is no
// secondary cache). Per view: GetUsage() and GetPinnedUsage() are the
// tenant's, ApplyToAllEntries() and EraseUnRefEntries() act on the tenant's
// entries only, Erase() and Lookup() see the tenant's keys only. Shared by
// all views: GetCapacity()/SetCapacity() (the reserve object's capacity),
// the strict capacity limit, NewId(). As NewLRUCache by default, an entry's
// charge includes its metadata (the entry and its key); the Priority
// argument is ignored (no high-priority pool). Strict capacity: an insert
// with a handle fails with MemoryLimit when nothing evictable is left (all
// pinned); without a handle it returns OK and the value is deleted at once,
// as LRUCache does. Pinned (referenced) entries are never evicted.
//
// Thresholds: tenant t's threshold in a shard is ρ_t / 2^num_shard_bits
// (rounded up), ρ_t read from the reserve object without a lock on every
// eviction choice (a changed reservation or capacity takes effect on the
// next insert). The cache reports each tenant's usage, hits, misses,
// inserts and evictions to the object (its collect()).
//
// Cost: a lookup or insert takes its shard's mutex once; insert, lookup and
// eviction are O(1) in the number of entries (TenantLru: O(log tenants) when
// a tenant's least recently used entry or side of its threshold changes).
//
// Thread safety: TenantCache and its views are safe from any thread, like
// RocksDB's caches. Handles follow the rocksdb::Cache rules (a handle is
// released once, through a view of the cache that gave it).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include <rocksdb/cache.h>

#include "sluice/objects/cache_reserve.h"
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
