// TenantCache's rocksdb::Cache contract, tested on the views directly:
// Insert/Lookup/Ref/Release/Erase, the helper overloads, per-view keys and
// usage, pinned entries, strict capacity, ApplyToAllEntries,
// EraseUnRefEntries, SetCapacity, the reservations, and the counters the
// cache-reserve object collects.
#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "sluice/objects/cache_reserve.h"
#include "sluice/rocksdb_cache.h"

using rocksdb::Cache;
using rocksdb::Slice;
using sluice::rocksdb_binding::TenantCache;
using sluice::rocksdb_binding::TenantCacheOptions;

namespace {

std::atomic<int> g_deleted{0};
void count_delete(const Slice& /*key*/, void* value) {
  g_deleted.fetch_add(1);
  delete static_cast<int*>(value);
}

std::shared_ptr<TenantCache> make_cache(std::uint64_t capacity, int bits = 0,
                                        std::shared_ptr<sluice::CacheReserve> reserve = nullptr) {
  TenantCacheOptions o;
  o.capacity = capacity;
  o.num_shard_bits = bits;
  o.reserve = std::move(reserve);
  auto c = TenantCache::make(o);
  REQUIRE(c.is_ok());
  return *c;
}

// What one entry of `key` costs beyond its charge.
std::size_t meta(Cache& c, const std::string& key) {
  Cache::Handle* h = nullptr;
  REQUIRE(c.Insert(key, new int(0), 0, count_delete, &h).ok());
  const std::size_t m = c.GetUsage(h);
  c.Release(h, /*erase_if_last_ref=*/true);
  return m;
}

}  // namespace

TEST_CASE("TenantCache: options are checked", "[tenant-cache]") {
  TenantCacheOptions o;
  o.capacity = 0;
  CHECK(TenantCache::make(o).status().message().starts_with("capacity: must be"));
  o.capacity = 1 << 20;
  o.num_shard_bits = 20;
  CHECK(TenantCache::make(o).status().message() == "num_shard_bits: must be from -1 to 19, got 20");
  o.num_shard_bits = -1;
  o.capacity = 8 << 20;
  auto c = TenantCache::make(o);
  REQUIRE(c.is_ok());
  CHECK((*c)->num_shard_bits() == 4);  // as NewLRUCache: one shard per 512 KiB
  o.reserve = std::make_shared<sluice::CacheReserve>();
  CHECK(TenantCache::make(o).status().message() == "reserve: not configured (it has no capacity)");
}

TEST_CASE("TenantCache: Insert, Lookup, Ref, Release, Erase keep Cache's contract",
          "[tenant-cache]") {
  auto cache = make_cache(1 << 20);
  auto a = cache->view(1);
  CHECK(std::string(a->Name()) == "TenantCache");
  g_deleted = 0;
  Cache::Handle* h = nullptr;
  REQUIRE(a->Insert("k1", new int(11), 100, count_delete, &h).ok());
  REQUIRE(h != nullptr);
  CHECK(*static_cast<int*>(a->Value(h)) == 11);
  CHECK(a->GetCharge(h) == 100);
  CHECK(a->GetUsage(h) > 100);  // the entry's metadata is charged too
  CHECK(a->GetDeleter(h) == &count_delete);
  CHECK(a->GetPinnedUsage() == a->GetUsage());
  CHECK(a->Ref(h));
  CHECK_FALSE(a->Release(h));  // still referenced
  CHECK_FALSE(a->Release(h));  // kept in the cache
  CHECK(a->GetPinnedUsage() == 0);
  CHECK(g_deleted == 0);

  Cache::Handle* l = a->Lookup("k1");
  REQUIRE(l != nullptr);
  CHECK(*static_cast<int*>(a->Value(l)) == 11);
  CHECK(a->Lookup("nope") == nullptr);
  // Erase while referenced: gone from the cache, deleted on the last release.
  a->Erase("k1");
  CHECK(a->Lookup("k1") == nullptr);
  CHECK(g_deleted == 0);
  CHECK(a->Release(l));
  CHECK(g_deleted == 1);
  CHECK(a->GetUsage() == 0);

  // Release(erase_if_last_ref) erases; an insert of an existing key replaces.
  REQUIRE(a->Insert("k2", new int(2), 10, count_delete).ok());
  REQUIRE(a->Insert("k2", new int(3), 10, count_delete).ok());
  CHECK(g_deleted == 2);
  l = a->Lookup("k2");
  CHECK(*static_cast<int*>(a->Value(l)) == 3);
  CHECK(a->Release(l, /*erase_if_last_ref=*/true));
  CHECK(g_deleted == 3);
  CHECK(a->Lookup("k2") == nullptr);
  CHECK(a->NewId() != a->NewId());
}

TEST_CASE("TenantCache: the helper overloads the table reader calls forward", "[tenant-cache]") {
  auto cache = make_cache(1 << 20);
  auto a = cache->view(1);
  g_deleted = 0;
  static const Cache::CacheItemHelper helper(nullptr, nullptr, count_delete);
  Cache::Handle* h = nullptr;
  REQUIRE(a->Insert("k", new int(5), &helper, 64, &h, Cache::Priority::HIGH).ok());
  int refused = 6;  // no helper, so no deleter: the value stays the caller's
  CHECK(a->Insert("x", &refused, static_cast<const Cache::CacheItemHelper*>(nullptr), 1)
            .IsInvalidArgument());
  CHECK(a->Release(h, /*useful=*/true, /*erase_if_last_ref=*/false) == false);
  Cache::Handle* l = a->Lookup("k", &helper, Cache::CreateCallback(), Cache::Priority::LOW,
                               /*wait=*/true, nullptr);
  REQUIRE(l != nullptr);
  CHECK(a->IsReady(l));
  CHECK(*static_cast<int*>(a->Value(l)) == 5);
  CHECK(a->Release(l, /*useful=*/false, /*erase_if_last_ref=*/true));
  CHECK(g_deleted == 1);
}

TEST_CASE("TenantCache: each view has its own keys, usage, entries", "[tenant-cache]") {
  auto cache = make_cache(1 << 20, 2);
  auto a = cache->view(1);
  auto b = cache->view(2);
  g_deleted = 0;
  // The same key in two views: two entries (the CacheEntryStatsCollector
  // trap: one process-wide key per column family).
  REQUIRE(a->Insert("same", new int(1), 1000, count_delete).ok());
  REQUIRE(b->Insert("same", new int(2), 3000, count_delete).ok());
  Cache::Handle* ha = a->Lookup("same");
  Cache::Handle* hb = b->Lookup("same");
  REQUIRE(ha != nullptr);
  REQUIRE(hb != nullptr);
  CHECK(*static_cast<int*>(a->Value(ha)) == 1);
  CHECK(*static_cast<int*>(b->Value(hb)) == 2);
  CHECK(a->GetUsage() == a->GetUsage(ha));
  CHECK(b->GetUsage() == b->GetUsage(hb));
  CHECK(a->GetPinnedUsage() == a->GetUsage());
  CHECK(cache->usage() == a->GetUsage() + b->GetUsage());
  a->Release(ha);
  b->Release(hb);
  CHECK(a->GetPinnedUsage() == 0);
  CHECK(a->GetCapacity() == b->GetCapacity());
  // Another view of tenant 1 sees tenant 1's entries.
  auto a2 = cache->view(1);
  Cache::Handle* h2 = a2->Lookup("same");
  REQUIRE(h2 != nullptr);
  CHECK(*static_cast<int*>(a2->Value(h2)) == 1);
  a2->Release(h2);

  for (int i = 0; i < 50; ++i) {
    REQUIRE(a->Insert("a" + std::to_string(i), new int(i), 10, count_delete).ok());
    REQUIRE(b->Insert("b" + std::to_string(i), new int(i), 10, count_delete).ok());
  }
  std::set<std::string> seen;
  a->ApplyToAllEntries(
      [&](const Slice& key, void* /*value*/, size_t charge, Cache::DeleterFn deleter) {
        seen.insert(key.ToString());
        CHECK(deleter == &count_delete);
        CHECK((charge == 10 || charge == 1000));
      },
      {});
  CHECK(seen.size() == 51);
  CHECK(seen.count("same") == 1);
  CHECK(seen.count("b0") == 0);
  // EraseUnRefEntries empties the view's tenant only, keeping what is held.
  Cache::Handle* held = a->Lookup("a7");
  a->EraseUnRefEntries();
  CHECK(a->GetUsage() == a->GetUsage(held));
  Cache::Handle* b3 = b->Lookup("b3");
  CHECK(b3 != nullptr);
  b->Release(b3);
  CHECK(g_deleted == 50);
  a->Release(held, true);
  CHECK(a->GetUsage() == 0);
}

TEST_CASE("TenantCache: capacity, strict limit and pinned entries", "[tenant-cache]") {
  auto cache = make_cache(10000);
  auto a = cache->view(1);
  const std::size_t m = meta(*a, "p0");
  g_deleted = 0;
  // Pin everything: 4 entries of 2000 + metadata.
  std::vector<Cache::Handle*> held;
  for (int i = 0; i < 4; ++i) {
    Cache::Handle* h = nullptr;
    REQUIRE(a->Insert("p" + std::to_string(i), new int(i), 2000, count_delete, &h).ok());
    held.push_back(h);
  }
  CHECK(a->GetPinnedUsage() == 4 * (2000 + m));
  a->SetStrictCapacityLimit(true);
  CHECK(a->HasStrictCapacityLimit());
  CHECK(cache->strict_capacity_limit());
  Cache::Handle* h = nullptr;
  int* v = new int(9);
  rocksdb::Status s = a->Insert("big", v, 3000, count_delete, &h);
  CHECK(s.IsMemoryLimit());
  CHECK(h == nullptr);
  CHECK(g_deleted == 0);  // the caller keeps the value
  delete v;
  // Without a handle: OK, and the value is deleted at once.
  CHECK(a->Insert("big", new int(9), 3000, count_delete).ok());
  CHECK(g_deleted == 1);
  CHECK(a->Lookup("big") == nullptr);
  // Not strict: an insert with a handle goes over the capacity.
  a->SetStrictCapacityLimit(false);
  REQUIRE(a->Insert("big", new int(9), 3000, count_delete, &h).ok());
  CHECK(cache->usage() > cache->capacity());
  // Released while over the capacity: erased.
  CHECK(a->Release(h));
  for (Cache::Handle* p : held) a->Release(p);
  // Pinned entries are never evicted; unpinned ones are, oldest first.
  Cache::Handle* keep = a->Lookup("p0");
  for (int i = 0; i < 20; ++i)
    REQUIRE(a->Insert("n" + std::to_string(i), new int(i), 2000, count_delete).ok());
  CHECK(a->Lookup("p1") == nullptr);
  CHECK(a->Value(keep) != nullptr);
  a->Release(keep);
  Cache::Handle* p0 = a->Lookup("p0");
  CHECK(p0 != nullptr);  // still cached (most recently used)
  // SetCapacity through a view: the shared capacity; usage comes down now.
  a->SetCapacity(5000);
  CHECK(cache->capacity() == 5000);
  CHECK(cache->usage() <= 5000 + 2000 + m);  // p0 is still held by the Lookup above
  CHECK(cache->set_capacity(0).message().starts_with("capacity: must be"));
  a->Release(p0);
}

TEST_CASE("TenantCache: a reserved tenant keeps its entries while another fills the cache",
          "[tenant-cache]") {
  auto reserve = std::make_shared<sluice::CacheReserve>();
  REQUIRE(reserve->configure({{"capacity", 400000}, {"reserved", {{"1", 150000}}}}).is_ok());
  auto cache = make_cache(0, 2, reserve);
  auto a = cache->view(1);
  auto b = cache->view(2);
  for (int i = 0; i < 60; ++i)
    REQUIRE(a->Insert("a" + std::to_string(i), new int(i), 1000, count_delete).ok());
  for (int i = 0; i < 5000; ++i)
    REQUIRE(b->Insert("b" + std::to_string(i), new int(i), 1000, count_delete).ok());
  const auto sa = cache->stats(1);
  const auto sb = cache->stats(2);
  CHECK(sa.evictions == 0);
  CHECK(sa.usage == a->GetUsage());
  CHECK(sb.evictions_below_reserved == 0);
  CHECK(sb.evictions > 4000);
  CHECK(cache->usage() <= 400000);
  // Without the reservation, A's entries go.
  REQUIRE(reserve->configure({{"reserved_1", 0}}).is_ok());
  for (int i = 0; i < 5000; ++i)
    REQUIRE(b->Insert("c" + std::to_string(i), new int(i), 1000, count_delete).ok());
  CHECK(a->GetUsage() == 0);
  // The object collects the cache's counters per tenant.
  const nlohmann::json stats = reserve->collect();
  CHECK(stats["caches"] == 1);
  bool found = false;
  for (const auto& f : stats["flows"]) {
    if (f["flow"] == 2) {
      found = true;
      CHECK(f["inserts"] == 10000);
      CHECK(f["usage"] == b->GetUsage());
    }
  }
  CHECK(found);
  int hits = 0;
  for (int i = 0; i < 10; ++i) {
    if (Cache::Handle* h = b->Lookup("c" + std::to_string(4999 - i))) {
      ++hits;
      b->Release(h);
    }
  }
  CHECK(hits == 10);
  CHECK(cache->stats(2).hits == 10);
  CHECK(cache->stats(2).misses == 0);
  CHECK(cache->stats(9).inserts == 0);
}

TEST_CASE("TenantCache: concurrent use keeps usage consistent", "[tenant-cache]") {
  auto cache = make_cache(64 << 10, 2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto v = cache->view(static_cast<std::uint64_t>(t % 2));
      for (int i = 0; i < 20000; ++i) {
        const std::string key = std::to_string(i % 700);
        if (Cache::Handle* h = v->Lookup(key)) {
          v->Release(h);
        } else {
          (void)v->Insert(key, new int(i), 100 + i % 50, count_delete);
        }
        if (i % 97 == 0) v->Erase(std::to_string(i % 300));
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(cache->usage() <= cache->capacity());
  CHECK(cache->pinned_usage() == 0);
  CHECK(cache->usage() == cache->stats(0).usage + cache->stats(1).usage);
}

TEST_CASE("TenantCache: inserting a key its tenant has cached replaces the entry, in any view",
          "[tenant-cache]") {
  // Two threads that miss the same block both insert it. Each view's second
  // insert must replace the first (one entry, the first value deleted), for
  // every tenant, not only the first view's.
  auto cache = make_cache(1 << 20, 0);
  auto first = cache->view(1);
  auto second = cache->view(2);
  for (Cache* view : {first.get(), second.get()}) {
    g_deleted = 0;
    REQUIRE(view->Insert("block", new int(1), 100, count_delete).ok());
    const std::size_t one = view->GetUsage();
    REQUIRE(view->Insert("block", new int(2), 100, count_delete).ok());
    CHECK(g_deleted == 1);
    CHECK(view->GetUsage() == one);
    Cache::Handle* h = view->Lookup("block");
    REQUIRE(h != nullptr);
    CHECK(*static_cast<int*>(view->Value(h)) == 2);
    view->Release(h);
    view->Erase("block");
    CHECK(g_deleted == 2);
    CHECK(view->GetUsage() == 0);
    CHECK(view->Lookup("block") == nullptr);
  }
}
