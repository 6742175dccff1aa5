// sluice-bench-tenant-cache: the tenant-aware block cache (TenantCache,
// nothing reserved) against RocksDB's NewLRUCache of the same capacity and
// shard count.
//
//   readrandom  a DB whose working set fits the cache, warmed, then random
//               Gets on `threads` threads for `seconds`; the two caches in
//               interleaved repetitions (the DB reopened with each); ops/s
//               min/median/max per cache and the ratio of the medians.
//   micro       the caches alone: ns per Lookup (hit) + Release, and per
//               Insert that evicts, on 1 and 2 threads.
//
//   sluice-bench-tenant-cache [--quick] [--dir DIR] [--reps N] [--seconds S]
//       [--threads T] [--keys N] [--shard-bits B]
// Prints one JSON object.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/table.h>
#include <nlohmann/json.hpp>

#include "sluice/rocksdb_cache.h"

namespace {

using Clock = std::chrono::steady_clock;
using sluice::rocksdb_binding::TenantCache;

struct Args {
  std::string dir = "/tmp/sluice-bench-tenant-cache";
  int reps = 5;
  double seconds = 3;
  int threads = 2;
  int keys = 200000;
  int shard_bits = 4;
  std::uint64_t capacity = 0;  // 0: twice the DB's data
  int micro_ops = 2000000;
};

std::string key(std::uint64_t i) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "key%012llu", static_cast<unsigned long long>(i));
  return buf;
}

std::shared_ptr<rocksdb::Cache> make(bool tenant, const Args& a) {
  if (!tenant) return rocksdb::NewLRUCache(a.capacity, a.shard_bits);
  sluice::rocksdb_binding::TenantCacheOptions o;
  o.capacity = a.capacity;
  o.num_shard_bits = a.shard_bits;
  auto c = TenantCache::make(o);
  if (!c) {
    std::fprintf(stderr, "%s\n", c.status().message().c_str());
    std::exit(1);
  }
  return (*c)->view(1);
}

std::unique_ptr<rocksdb::DB> open(const Args& a, std::shared_ptr<rocksdb::Cache> cache) {
  rocksdb::Options o;
  o.create_if_missing = true;
  rocksdb::BlockBasedTableOptions t;
  t.block_cache = std::move(cache);
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  rocksdb::DB* db = nullptr;
  const rocksdb::Status s = rocksdb::DB::Open(o, a.dir, &db);
  if (!s.ok()) {
    std::fprintf(stderr, "open %s: %s\n", a.dir.c_str(), s.ToString().c_str());
    std::exit(1);
  }
  return std::unique_ptr<rocksdb::DB>(db);
}

double readrandom(const Args& a, bool tenant) {
  auto db = open(a, make(tenant, a));
  std::string v;
  for (int i = 0; i < a.keys; ++i) (void)db->Get({}, key(static_cast<std::uint64_t>(i)), &v);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> ops{0};
  std::vector<std::thread> th;
  for (int t = 0; t < a.threads; ++t) {
    th.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 1);
      std::string value;
      std::uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        for (int k = 0; k < 64; ++k) {
          (void)db->Get({}, key(rng() % static_cast<std::uint64_t>(a.keys)), &value);
        }
        n += 64;
      }
      ops.fetch_add(n);
    });
  }
  const auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(a.seconds));
  stop = true;
  for (auto& x : th) x.join();
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(ops.load()) / secs;
}

void noop_delete(const rocksdb::Slice&, void*) {}

// ns per operation of `threads` threads doing `what` on one cache.
nlohmann::json micro(const Args& a, bool tenant, int threads) {
  nlohmann::json out;
  for (const char* what : {"lookup_hit", "insert_evict"}) {
    Args b = a;
    b.capacity = 1 << 20;  // 16 K entries of 64 B (and metadata)
    auto cache = make(tenant, b);
    const int live = 4096;
    for (int i = 0; i < live; ++i)
      (void)cache->Insert(key(static_cast<std::uint64_t>(i)), nullptr, 64, noop_delete);
    const int per = a.micro_ops / threads;
    std::vector<std::thread> th;
    const auto start = Clock::now();
    for (int t = 0; t < threads; ++t) {
      th.emplace_back([&, t] {
        std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 7);
        std::vector<std::string> keys;
        for (int i = 0; i < 1024; ++i) keys.push_back(key(rng() % live));
        std::uint64_t next = 1'000'000ULL * static_cast<std::uint64_t>(t + 1);
        for (int i = 0; i < per; ++i) {
          if (what[0] == 'l') {
            rocksdb::Cache::Handle* h = cache->Lookup(keys[static_cast<std::size_t>(i) & 1023]);
            if (h != nullptr) cache->Release(h);
          } else {
            (void)cache->Insert(key(next++), nullptr, 1024, noop_delete);
          }
        }
      });
    }
    for (auto& x : th) x.join();
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
    out[what] = ns * threads / (static_cast<double>(per) * threads);
  }
  return out;
}

nlohmann::json summary(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {{"min", v.front()}, {"median", v[v.size() / 2]}, {"max", v.back()}, {"runs", v}};
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: needs a value\n", s.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (s == "--quick") {
      a.reps = 2;
      a.seconds = 0.3;
      a.keys = 20000;
      a.micro_ops = 100000;
    } else if (s == "--dir") {
      a.dir = next();
    } else if (s == "--reps") {
      a.reps = std::stoi(next());
    } else if (s == "--seconds") {
      a.seconds = std::stod(next());
    } else if (s == "--threads") {
      a.threads = std::stoi(next());
    } else if (s == "--keys") {
      a.keys = std::stoi(next());
    } else if (s == "--shard-bits") {
      a.shard_bits = std::stoi(next());
    } else {
      std::fprintf(stderr, "unknown argument %s (see the file's comment)\n", s.c_str());
      return 2;
    }
  }
  std::filesystem::remove_all(a.dir);
  {
    auto db = open(a, rocksdb::NewLRUCache(8 << 20));
    for (int i = 0; i < a.keys; ++i) {
      (void)db->Put({}, key(static_cast<std::uint64_t>(i)), std::string(100, 'v'));
    }
    (void)db->Flush({});
    (void)db->CompactRange({}, nullptr, nullptr);
    std::uint64_t live = 0;
    db->GetIntProperty("rocksdb.live-sst-files-size", &live);
    if (a.capacity == 0) a.capacity = std::max<std::uint64_t>(2 * live, 8 << 20);
  }
  std::vector<double> lru, tenant;
  for (int r = 0; r < a.reps; ++r) {  // interleaved, the order alternating
    const bool tenant_first = r % 2 == 1;
    const double x = readrandom(a, tenant_first);
    const double y = readrandom(a, !tenant_first);
    (tenant_first ? tenant : lru).push_back(x);
    (tenant_first ? lru : tenant).push_back(y);
  }
  nlohmann::json out;
  out["readrandom"] = {{"threads", a.threads},
                       {"seconds", a.seconds},
                       {"keys", a.keys},
                       {"capacity", a.capacity},
                       {"shard_bits", a.shard_bits},
                       {"lru_ops_per_s", summary(lru)},
                       {"tenant_ops_per_s", summary(tenant)}};
  out["readrandom"]["ratio_of_medians"] =
      out["readrandom"]["tenant_ops_per_s"]["median"].get<double>() /
      out["readrandom"]["lru_ops_per_s"]["median"].get<double>();
  for (int threads : {1, 2}) {
    out["micro_ns_per_op"][std::to_string(threads) + "_threads"] = {
        {"lru", micro(a, false, threads)}, {"tenant", micro(a, true, threads)}};
  }
  std::printf("%s\n", out.dump().c_str());
  std::filesystem::remove_all(a.dir);
  return 0;
}
