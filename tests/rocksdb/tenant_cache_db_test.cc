// TenantCache under real RocksDB: three column families, each with its own
// view of one 4 MiB cache. A reserved tenant keeps its blocks while another
// scans (and loses them without the reservation); per-view usage is what
// RocksDB reports per column family; a block an iterator pins survives the
// scan; the cache serves a reopened DB.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/table.h>
#include <catch2/catch.hpp>

#include "rocksdb_test_util.h"
#include "sluice/objects/cache_reserve.h"
#include "sluice/rocksdb_cache.h"

using sluice::rocksdb_binding::TenantCache;
using sluice::rocksdb_binding::TenantCacheOptions;

namespace {

constexpr std::uint64_t kCapacity = 4 << 20;
constexpr int kHotKeys = 2000;    // tenant 1: ~2 MB of values, ~500 blocks
constexpr int kScanKeys = 20000;  // tenant 2: ~20 MB, scanned
const std::string kValue(1000, 'v');

std::string key(int i) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "k%08d", i);
  return buf;
}

struct CacheDb {
  CacheDb(const std::string& path, const std::shared_ptr<TenantCache>& cache) {
    rocksdb::Options o;
    o.create_if_missing = true;
    o.create_missing_column_families = true;
    o.compression = rocksdb::kNoCompression;
    std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
    for (int t = 0; t < 3; ++t) {
      rocksdb::BlockBasedTableOptions bbt;
      bbt.block_cache = cache->view(static_cast<std::uint64_t>(t));
      rocksdb::ColumnFamilyOptions cfo;
      cfo.compression = rocksdb::kNoCompression;
      cfo.table_factory.reset(rocksdb::NewBlockBasedTableFactory(bbt));
      cfs.emplace_back(t == 0 ? rocksdb::kDefaultColumnFamilyName : "t" + std::to_string(t), cfo);
      views.push_back(bbt.block_cache);
    }
    rocksdb::DB* raw = nullptr;
    const rocksdb::Status s = rocksdb::DB::Open(o, path, cfs, &handles, &raw);
    INFO(s.ToString());
    REQUIRE(s.ok());
    db.reset(raw);
  }
  ~CacheDb() {
    for (auto* h : handles) (void)db->DestroyColumnFamilyHandle(h);
    (void)db->Close();
  }
  void fill(int cf, int n) {
    for (int i = 0; i < n; ++i) REQUIRE(db->Put({}, handles[cf], key(i), kValue).ok());
    REQUIRE(db->Flush({}, handles[cf]).ok());
  }
  void read_all(int cf, int n, bool backwards = false) {
    std::string v;
    for (int j = 0; j < n; ++j) {
      const int i = backwards ? n - 1 - j : j;
      REQUIRE(db->Get({}, handles[cf], key(i), &v).ok());
      REQUIRE(v == kValue);
    }
  }
  void scan(int cf) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator({}, handles[cf]));
    int n = 0;
    for (it->SeekToFirst(); it->Valid(); it->Next()) ++n;
    REQUIRE(n == kScanKeys);
  }

  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  std::vector<std::shared_ptr<rocksdb::Cache>> views;
};

// Tenant 1's block misses when it reads its keys again after tenant 2's two
// scans, with `reserved` bytes reserved for it.
struct Outcome {
  std::uint64_t misses = 0;
  std::uint64_t lookups = 0;
  std::uint64_t usage_after_scan = 0;
  std::uint64_t evictions_below = 0;
};

Outcome ramp(std::uint64_t reserved) {
  sluice_test::TempDir dir;
  auto reserve = std::make_shared<sluice::CacheReserve>();
  REQUIRE(reserve->configure({{"capacity", kCapacity}, {"reserved_1", reserved}}).is_ok());
  TenantCacheOptions opt;
  opt.reserve = reserve;
  opt.num_shard_bits = 2;
  auto cache = TenantCache::make(opt);
  REQUIRE(cache.is_ok());
  CacheDb d(dir.path, *cache);
  d.fill(1, kHotKeys);
  d.fill(2, kScanKeys);
  d.read_all(1, kHotKeys);  // warm
  d.scan(2);
  d.scan(2);
  Outcome out;
  out.usage_after_scan = d.views[1]->GetUsage();
  // Newest first: the blocks it kept are hit (and become its most recent)
  // before the misses make room, so that LRU does not evict a kept block
  // just before it is read (a re-read in LRU order evicts each in turn).
  const auto before = (*cache)->stats(1);
  d.read_all(1, kHotKeys, /*backwards=*/true);
  const auto after = (*cache)->stats(1);
  out.misses = after.misses - before.misses;
  out.lookups = out.misses + after.hits - before.hits;
  out.evictions_below = (*cache)->stats(2).evictions_below_reserved;
  return out;
}

}  // namespace

TEST_CASE("TenantCache in RocksDB: a reserved tenant keeps its blocks while another scans",
          "[tenant-cache][rocksdb]") {
  const Outcome none = ramp(0);
  const Outcome kept = ramp(1536 << 10);
  INFO("no reservation: " << none.misses << " of " << none.lookups << " missed, usage "
                          << none.usage_after_scan);
  INFO("1.5 MiB reserved: " << kept.misses << " of " << kept.lookups << " missed, usage "
                            << kept.usage_after_scan);
  // Without a reservation the scans take every block of tenant 1's (what is
  // left is the statistics collector RocksDB keeps pinned per column family:
  // its entry's metadata), and it misses every block (~500 of 4 KiB).
  CHECK(none.usage_after_scan < 4096);
  CHECK(none.misses >= 400);
  // With 1.5 MiB reserved it keeps about that (each shard a quarter of it),
  // and misses only the rest: ~a quarter of its blocks.
  CHECK(kept.usage_after_scan >= (1536 << 10) * 9 / 10);
  CHECK(kept.usage_after_scan <= (1536 << 10) + (64 << 10));
  CHECK(kept.misses * 3 < none.misses);
  CHECK(kept.evictions_below == 0);
}

TEST_CASE("TenantCache in RocksDB: per-view usage, pinned blocks, reopen",
          "[tenant-cache][rocksdb]") {
  sluice_test::TempDir dir;
  TenantCacheOptions opt;
  opt.capacity = kCapacity;
  opt.num_shard_bits = 2;
  auto made = TenantCache::make(opt);
  REQUIRE(made.is_ok());
  std::shared_ptr<TenantCache> cache = *made;
  {
    CacheDb d(dir.path, cache);
    d.fill(1, kHotKeys);
    d.fill(2, kScanKeys);
    d.fill(0, 100);
    d.read_all(0, 100);
    d.read_all(1, 200);
    // RocksDB's per-CF property is the view's usage.
    for (int cf = 0; cf < 3; ++cf) {
      std::uint64_t v = 0;
      REQUIRE(d.db->GetIntProperty(d.handles[cf], "rocksdb.block-cache-usage", &v));
      CHECK(v == d.views[cf]->GetUsage());
    }
    CHECK(d.views[0]->GetUsage() > 0);
    CHECK(d.views[1]->GetUsage() > 0);
    CHECK(cache->usage() ==
          d.views[0]->GetUsage() + d.views[1]->GetUsage() + d.views[2]->GetUsage());

    // An iterator pins its block: the scan does not evict it. (RocksDB keeps
    // one entry pinned per column family: its statistics collector.)
    const std::uint64_t pinned = d.views[1]->GetPinnedUsage();
    const std::uint64_t pinned_all = cache->pinned_usage();
    std::unique_ptr<rocksdb::Iterator> it(d.db->NewIterator({}, d.handles[1]));
    it->Seek(key(100));
    REQUIRE(it->Valid());
    CHECK(d.views[1]->GetPinnedUsage() > pinned + 4096);
    d.scan(2);
    CHECK(d.views[1]->GetPinnedUsage() > pinned + 4096);
    CHECK(it->key().ToString() == key(100));
    CHECK(it->value().ToString() == kValue);
    it->Next();
    REQUIRE(it->Valid());
    CHECK(it->key().ToString() == key(101));
    it.reset();
    CHECK(d.views[1]->GetPinnedUsage() == pinned);
    CHECK(cache->usage() <= kCapacity);
    CHECK(cache->pinned_usage() == pinned_all);
  }
  // Closed: every block RocksDB held is released; reopened, the same cache
  // serves the new DB instance.
  CHECK(cache->pinned_usage() == 0);
  const std::uint64_t inserts = cache->stats(1).inserts;
  {
    CacheDb d(dir.path, cache);
    d.read_all(1, 200);
    CHECK(cache->stats(1).inserts > inserts);
    d.read_all(1, 200);
    CHECK(d.views[1]->GetUsage() > 0);
  }
}
