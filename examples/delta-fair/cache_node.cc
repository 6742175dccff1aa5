// sluice-delta-fair-cache-node: one run of the read-cache experiments (examples/delta-fair,
// experiments `cache` and `composition`): one RocksDB database, one column family per
// tenant, all column families sharing one block cache of --cache-mib, readers in an open
// loop (steady, ramp-up) or a closed one (aggressive).
//
//   sluice-delta-fair-cache-node --db DIR --cache tenant|lru|static --rules FILE --out FILE
//                                [--socket PATH] [--setup plain|gated] ...
//   sluice-delta-fair-cache-node --probe --rules FILE
//       Says whether this build can run the tenant cache under these rules (the rules
//       apply, the stage has the `cache-reserve` object the cache consults). Exit 0 or 3.
//
// Tenants 1..N are column families t01..tNN: --steady readers, then --aggressive ones,
// then --ramp ones. A steady or ramp-up tenant's working set is as many records as fill
// --ws-mib of cache (its fair share; the charge of one record's block is measured on a
// scratch DB first), read Zipfian (θ 0.99) at --steady-mib MiB/s, open loop: a read is
// due at its scheduled time and its latency counts from then. An aggressive tenant reads
// a working set --agg-ws-factor times as large, uniformly, with --agg-threads threads
// in a closed loop paced to at most --agg-mib MiB/s. Ramp-up tenants stop reading at
// --offline-at-s; at --ramp-at-s they read their whole working set back (one MultiGet, due at the
// ramp) and then read steadily again. Every record is a --value-size value in a block of its own.
//
// The cache (--cache): `tenant`, the RocksDB binding's TenantCache (one view per column
// family) consulting the stage's `cache-reserve` object "read_cache" in channel "cache"
// (its thresholds come from the rules or the delta-fair policy through --socket);
// `lru`, one NewLRUCache of the same capacity shared by every column family; `static`,
// a NewLRUCache of the fair share (capacity / tenants) per column family. One shard
// (--shard-bits 0) unless told otherwise: a tenant's threshold is then exact.
//
// The device: the rules route foreground reads (the misses) through a fair queue by
// tenant (object "device"); with --setup gated also flush writes through a fair queue
// "flush_device" and the tenants' puts through the write-buffer pool behind the tenant
// gate (tenant_db.h). While the DB is loaded and the cache warmed both queues are
// lifted; at the start of the run they are set to --device-read-bps and
// --device-write-bps. With --setup gated (the `composition` experiment) the aggressive
// tenants also write --agg-write-mib MiB/s each, open loop, and a ramp-up tenant, after
// reading its working set back, writes --ramp-write-mib of it back modified (puts due
// at the ramp): a read-modify-write.
//
// Output (--out, JSON lines): a config line; a line per bin (--bin-ms) with, per class,
// reads completed, bytes and latency p50/p99/max of the reads due in the bin, and each
// tenant's cache usage; a "ramp" line per ramp-up tenant (when its MultiGet and each of
// its writes completed after the ramp, microseconds); an end line with totals per tenant
// (reads, bytes, p99, cache hits/misses/inserts/evictions), the objects' state and the
// control client's counters.
//
// Exit status: 0; 1 on a runtime error; 2 on bad arguments (the message names the option).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <nlohmann/json.hpp>

#include "host_steal.h"
#include "node_util.h"
#include "sluice/control_client.h"
#include "sluice/objects/builtin.h"
#include "sluice/rocksdb.h"
#include "sluice/rocksdb_cache.h"
#include "sluice/stage.h"
#include "support/cli.h"
#include "support/stage_setup.h"
#include "tenant_db.h"

namespace {

namespace fs = std::filesystem;
namespace rb = sluice::rocksdb_binding;
namespace df = sluice::examples::delta_fair;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using df::Histogram;
using df::kMiB;
using df::TenantDb;
using df::Zipf;

constexpr int kKeySize = 16;
constexpr double kLiftedBps = 64.0 * 1024 * kMiB;  // the device while loading: no limit

struct Args {
  std::string db, cache = "tenant", setup = "plain", rules, out, socket, tag, ret = "pinned";
  std::string stage_name = "delta-fair-cache";
  int steady = 29, aggressive = 2, ramp = 1;
  double cache_mib = 160, ws_mib = 5, agg_ws_factor = 16, steady_mib = 0.78125, agg_mib = 21.875;
  int agg_threads = 4;
  double offline_at_s = 10, ramp_at_s = 20, duration_s = 30;
  double device_read_bps = 15 * kMiB, device_write_bps = 0;
  int value_size = 4000, shard_bits = 0, bin_ms = 250;
  double memtable_mib = 64, buffer_mib = 64, agg_write_mib = 0, ramp_write_mib = 0;
  int entry_overhead = 32;
  std::uint64_t seed = 1;
  bool probe = false;
};

constexpr char kUsage[] =
    "usage: sluice-delta-fair-cache-node --db DIR --cache tenant|lru|static --rules FILE "
    "--out FILE\n"
    "       sluice-delta-fair-cache-node --probe --rules FILE\n"
    "  [--socket PATH] [--setup plain|gated] [--stage NAME] [--tag TEXT] [--steady N]\n"
    "  [--aggressive N] [--ramp N] [--cache-mib M] [--ws-mib M] [--agg-ws-factor X]\n"
    "  [--steady-mib M] [--agg-mib M] [--agg-threads N] [--offline-at-s S] [--ramp-at-s S] "
    "[--duration-s S]\n"
    "  [--device-read-bps B] [--device-write-bps B] [--value-size B]\n"
    "  [--shard-bits N] [--bin-ms MS] [--memtable-mib M] [--buffer-mib M]\n"
    "  [--agg-write-mib M] [--ramp-write-mib M] [--entry-overhead B] [--return pinned|multiget] "
    "[--seed N]\n";

bool valid(const Args& a) {
  auto bad = [](const char* what) {
    std::fprintf(stderr, "sluice-delta-fair-cache-node: %s\n", what);
    return false;
  };
  if (a.db.empty() || a.rules.empty() || a.out.empty()) {
    return bad("--db, --rules and --out are required");
  }
  if (a.cache != "tenant" && a.cache != "lru" && a.cache != "static") {
    return bad("--cache must be tenant, lru or static");
  }
  if (a.setup != "plain" && a.setup != "gated") return bad("--setup must be plain or gated");
  if (a.ret != "pinned" && a.ret != "multiget") return bad("--return must be pinned or multiget");
  if (a.steady < 0 || a.aggressive < 0 || a.ramp < 0 || a.steady + a.aggressive + a.ramp < 1 ||
      a.steady + a.aggressive + a.ramp > 99) {
    return bad("--steady, --aggressive, --ramp: counts >= 0 adding up to 1..99");
  }
  if (!(a.cache_mib > 0) || !(a.ws_mib > 0) || !(a.agg_ws_factor >= 1) || !(a.steady_mib > 0) ||
      !(a.agg_mib > 0)) {
    return bad("--cache-mib, --ws-mib, --steady-mib, --agg-mib must be > 0, --agg-ws-factor >= 1");
  }
  if (a.agg_threads < 1 || a.agg_threads > 64) return bad("--agg-threads: 1..64");
  if (!(a.duration_s > 0) || !(a.offline_at_s >= 0) || a.ramp_at_s < a.offline_at_s ||
      a.ramp_at_s >= a.duration_s) {
    return bad("--offline-at-s <= --ramp-at-s < --duration-s, all >= 0");
  }
  if (!(a.device_read_bps > 0) || a.device_write_bps < 0) {
    return bad("--device-read-bps must be > 0 and --device-write-bps >= 0");
  }
  if (a.value_size < 16 || a.value_size > (1 << 20)) return bad("--value-size: 16..1048576");
  if (a.shard_bits < 0 || a.shard_bits > 19 || a.bin_ms < 10) {
    return bad("--shard-bits 0..19, --bin-ms >= 10");
  }
  if (!(a.memtable_mib > 0) || !(a.buffer_mib > 0) || a.agg_write_mib < 0 || a.ramp_write_mib < 0 ||
      a.entry_overhead < 0) {
    return bad(
        "--memtable-mib and --buffer-mib > 0; --agg-write-mib, --ramp-write-mib, "
        "--entry-overhead >= 0");
  }
  return true;
}

enum class Class { kSteady, kAggressive, kRamp };
const char* class_name(Class c) {
  return c == Class::kSteady ? "steady" : c == Class::kAggressive ? "aggressive" : "ramp";
}

// One reader thread's counts (written by it alone, read after join).
struct Stats {
  std::vector<Histogram> by_bin;          // latency of the reads due (issued) in each bin
  std::vector<std::uint64_t> done_bytes;  // bytes of the reads completed in each bin
  std::uint64_t reads = 0, errors = 0, writes = 0;
  std::string first_error;
};

struct Tenant {
  std::uint32_t id = 0;
  std::string cf;
  Class cls = Class::kSteady;
  std::uint64_t keys = 0;                   // its working set, in records
  std::vector<Stats> stats;                 // one per thread
  std::uint32_t multiget_us = 0;            // ramp-up: its return's reads, from the ramp
  std::uint64_t refilled = 0;               // of those, records read from the device
  std::vector<std::uint32_t> write_lat_us;  // ramp-up, gated: each write-back, from the ramp
};

void make_key(char* key, std::uint32_t tenant, std::uint64_t n, char kind = '0') {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%02u%c%013llu", tenant % 100, kind,
                static_cast<unsigned long long>(n % 10000000000000ull));
  std::memcpy(key, buf, kKeySize);
}

struct Run {
  const Args& a;
  TenantDb& db;
  Clock::time_point t0;
  std::size_t bins;
  const Zipf& zipf;
  double dur() const { return a.duration_s; }
  double now() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }
  void sleep_to(double s) const {
    std::this_thread::sleep_until(
        t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)));
  }
  void record(Stats& st, double due, double done, std::uint64_t bytes) const {
    const double bin_s = a.bin_ms / 1e3;
    const auto b = static_cast<std::size_t>(std::max(0.0, due) / bin_s);
    if (b < bins) st.by_bin[b].add(static_cast<std::uint64_t>((done - due) * 1e6));
    st.done_bytes[std::min(bins - 1, static_cast<std::size_t>(done / bin_s))] += bytes;
    ++st.reads;
  }
  void fail(Stats& st, const rocksdb::Status& s) const {
    if (st.errors++ == 0) st.first_error = s.ToString();
  }
};

// Steady reads of a tenant's working set from `from` to `to` (s), open loop.
void steady_reads(const Run& r, Tenant& t, Stats& st, std::mt19937_64& rng, double from, double to,
                  double phase) {
  const double rate = r.a.steady_mib * kMiB / r.a.value_size;
  char key[kKeySize];
  std::string value;
  for (std::uint64_t n = 0;; ++n) {
    const double due = from + phase + static_cast<double>(n) / rate;
    if (due >= to) return;
    r.sleep_to(due);
    if (r.now() >= to) return;
    make_key(key, t.id, r.zipf.next(rng) % t.keys);
    const rocksdb::Status s = r.db.get(t.id, rocksdb::Slice(key, kKeySize), &value);
    if (!s.ok()) {
      r.fail(st, s);
      continue;
    }
    r.record(st, due, r.now(), value.size());
  }
}

void steady_reader(const Run& r, Tenant& t) {
  Stats& st = t.stats[0];
  std::mt19937_64 rng(r.a.seed * 7919 + t.id);
  const double phase =
      std::uniform_real_distribution<double>(0, 1)(rng) * r.a.value_size / (r.a.steady_mib * kMiB);
  if (t.cls != Class::kRamp) {
    steady_reads(r, t, st, rng, 0, r.dur(), phase);
    return;
  }
  steady_reads(r, t, st, rng, 0, r.a.offline_at_s, phase);
  // The return: the whole working set, due at the ramp. --return pinned: first what the
  // cache still holds, pinned (Gets from the block cache alone), then the rest in one
  // MultiGet; multiget: one MultiGet of it all (RocksDB looks blocks up batch by batch,
  // so refilling an early batch can evict the reader's own blocks of a later one).
  const double ramp = r.a.ramp_at_s;
  r.sleep_to(ramp);
  std::vector<std::string> keys(t.keys);
  char key[kKeySize];
  for (std::uint64_t i = 0; i < t.keys; ++i) {
    make_key(key, t.id, i);
    keys[i].assign(key, kKeySize);
  }
  const std::vector<rocksdb::Slice> slices(keys.begin(), keys.end());
  {
    std::vector<rocksdb::PinnableSlice> held(r.a.ret == "pinned" ? keys.size() : 0);
    std::vector<rocksdb::Slice> missed;
    for (std::size_t k = 0; k < held.size(); ++k) {
      const rocksdb::Status s = r.db.get_pinned(t.id, slices[k], &held[k], true);
      if (s.IsIncomplete()) missed.push_back(slices[k]);
      if (!s.ok() && !s.IsIncomplete()) r.fail(st, s);
    }
    if (held.empty()) missed = slices;
    std::vector<rocksdb::PinnableSlice> values;
    std::vector<rocksdb::Status> statuses;
    r.db.multi_get(t.id, missed, &values, &statuses);
    const double done = r.now();
    for (std::size_t k = 0; k < missed.size(); ++k) {
      if (!statuses[k].ok()) r.fail(st, statuses[k]);
    }
    for (std::size_t k = 0; k < keys.size(); ++k) r.record(st, ramp, done, r.a.value_size);
    t.multiget_us = static_cast<std::uint32_t>(std::min(4e9, (done - ramp) * 1e6));
    t.refilled = missed.size();
  }
  // Read-modify-write (gated): the first records of the working set written back, a
  // byte changed, all due at the ramp too.
  const auto writes = static_cast<std::uint64_t>(r.a.ramp_write_mib * kMiB / r.a.value_size);
  std::string value(static_cast<std::size_t>(r.a.value_size), 'm');
  for (std::uint64_t i = 0; i < std::min(writes, t.keys); ++i) {
    std::memcpy(value.data(), &i, sizeof i);
    const rocksdb::Status s = r.db.put(t.id, slices[i], value);
    if (!s.ok()) {
      r.fail(st, s);
      continue;
    }
    ++st.writes;
    t.write_lat_us.push_back(static_cast<std::uint32_t>(std::min(4e9, (r.now() - ramp) * 1e6)));
  }
  steady_reads(r, t, st, rng, ramp, r.dur(), phase);
}

// An aggressive tenant's reader thread: uniform over its working set, at most
// --agg-mib / --agg-threads MiB/s, closed loop (a read late for its slot goes at once and
// the lost slots are not made up).
void aggressive_reader(const Run& r, Tenant& t, int thread) {
  Stats& st = t.stats[static_cast<std::size_t>(thread)];
  std::mt19937_64 rng(r.a.seed * 104729 + t.id * 131 + static_cast<std::uint64_t>(thread));
  std::uniform_int_distribution<std::uint64_t> pick(0, t.keys - 1);
  const double gap = r.a.value_size * r.a.agg_threads / (r.a.agg_mib * kMiB);
  char key[kKeySize];
  std::string value;
  for (double next = gap * thread / r.a.agg_threads;; next += gap) {
    const double due = std::max(next, r.now());
    if (due >= r.dur()) return;
    r.sleep_to(due);
    next = due;
    make_key(key, t.id, pick(rng));
    const rocksdb::Status s = r.db.get(t.id, rocksdb::Slice(key, kKeySize), &value);
    if (!s.ok()) {
      r.fail(st, s);
      continue;
    }
    r.record(st, due, r.now(), value.size());
  }
}

// An aggressive tenant's writer (gated setup): new keys at --agg-write-mib, open loop.
void aggressive_writer(const Run& r, Tenant& t, Stats& st) {
  const double rate = r.a.agg_write_mib * kMiB / (kKeySize + r.a.value_size);
  std::string value(static_cast<std::size_t>(r.a.value_size), 'w');
  char key[kKeySize];
  for (std::uint64_t n = 0;; ++n) {
    const double due = static_cast<double>(n) / rate;
    if (due >= r.dur()) return;
    r.sleep_to(due);
    if (r.now() >= r.dur()) return;
    make_key(key, t.id, n, 'w');
    std::memcpy(value.data(), &n, sizeof n);
    const rocksdb::Status s = r.db.put(t.id, rocksdb::Slice(key, kKeySize), value);
    if (!s.ok()) {
      r.fail(st, s);
    } else {
      ++st.writes;
    }
  }
}

rocksdb::BlockBasedTableOptions table_options(std::shared_ptr<rocksdb::Cache> cache) {
  rocksdb::BlockBasedTableOptions t;
  t.block_cache = std::move(cache);
  t.block_size = 1024;  // below one record: every record is a block of its own
  t.cache_index_and_filter_blocks = false;
  return t;
}

// The cache charge of one record's block, measured through a TenantCache view on a
// scratch DB (what the working sets are sized by).
sluice::StatusOr<double> block_charge(const Args& a) {
  const std::string path = a.db + "-charge";
  fs::remove_all(path);
  rb::TenantCacheOptions co;
  co.capacity = 64 << 20;
  co.num_shard_bits = 0;
  auto made = rb::TenantCache::make(co);
  if (!made.is_ok()) return made.status();
  auto tc = std::move(made).value();
  rocksdb::Options o;
  o.create_if_missing = true;
  o.compression = rocksdb::kNoCompression;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table_options(tc->view(1))));
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, path, &raw);
  if (!s.ok()) return sluice::Status::io_error("open " + path + ": " + s.ToString());
  std::unique_ptr<rocksdb::DB> db(raw);
  const int n = 256;
  std::string value(static_cast<std::size_t>(a.value_size), 'v');
  char key[kKeySize];
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;
  for (int i = 0; i < n; ++i) {
    make_key(key, 1, static_cast<std::uint64_t>(i));
    s = db->Put(wo, rocksdb::Slice(key, kKeySize), value);
    if (!s.ok()) break;
  }
  if (s.ok()) s = db->Flush(rocksdb::FlushOptions());
  const std::uint64_t before = tc->stats(1).usage;
  std::string got;
  for (int i = 0; i < n && s.ok(); ++i) {
    make_key(key, 1, static_cast<std::uint64_t>(i));
    s = db->Get(rocksdb::ReadOptions(), rocksdb::Slice(key, kKeySize), &got);
  }
  const std::uint64_t after = tc->stats(1).usage;
  s = s.ok() ? db->Close() : s;
  db.reset();
  fs::remove_all(path);
  if (!s.ok()) return sluice::Status::io_error("measuring the block charge: " + s.ToString());
  return static_cast<double>(after - before) / n;
}

sluice::Status set_device(sluice::Stage& stage, const char* channel, const char* object,
                          const char* resource, double bps) {
  if (!stage.object(channel, object)) return sluice::Status::ok();
  return stage.apply(json::array({{{"rule", "configure"},
                                   {"channel", channel},
                                   {"object", object},
                                   {"config", {{"capacity", {{resource, bps}}}}}}}));
}

int fail(const char* what, const sluice::Status& s) {
  std::fprintf(stderr, "sluice-delta-fair-cache-node: %s: %s\n", what, s.to_string().c_str());
  return 1;
}

int run(const Args& a) {
  std::ofstream out(a.out);
  if (!out) {
    std::fprintf(stderr, "sluice-delta-fair-cache-node: cannot write %s\n", a.out.c_str());
    return 1;
  }
  auto charge = block_charge(a);
  if (!charge.is_ok()) return fail("block charge", charge.status());
  const double per_block = charge.value();
  const int n = a.steady + a.aggressive + a.ramp;
  const auto ws_keys = static_cast<std::uint64_t>(std::floor(a.ws_mib * kMiB / per_block));
  const auto bins = static_cast<std::size_t>(std::ceil(a.duration_s * 1e3 / a.bin_ms));
  std::vector<Tenant> tenants(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    Tenant& t = tenants[static_cast<std::size_t>(i)];
    t.id = static_cast<std::uint32_t>(i + 1);
    char name[16];
    std::snprintf(name, sizeof name, "t%02d", i + 1);
    t.cf = name;
    t.cls = i < a.steady                  ? Class::kSteady
            : i < a.steady + a.aggressive ? Class::kAggressive
                                          : Class::kRamp;
    t.keys = t.cls == Class::kAggressive
                 ? static_cast<std::uint64_t>(static_cast<double>(ws_keys) * a.agg_ws_factor)
                 : ws_keys;
    t.stats.resize(t.cls == Class::kAggressive
                       ? static_cast<std::size_t>(a.agg_threads) + (a.agg_write_mib > 0 ? 1 : 0)
                       : 1);
    for (auto& s : t.stats) {
      s.by_bin.assign(bins, Histogram{});
      s.done_bytes.assign(bins, 0);
    }
  }

  // The stage: the experiment's rules, the RocksDB binding, optionally the daemon.
  sluice::StageOptions so;
  so.name = a.stage_name;
  so.labels["example"] = "delta-fair";
  so.labels["cache"] = a.cache;
  auto created = sluice::Stage::create(so);
  if (!created.is_ok()) return fail("stage", created.status());
  std::unique_ptr<sluice::Stage> stage = std::move(created).value();
  if (auto st = sluice::bench::apply_rules_file(*stage, a.rules); !st.is_ok()) {
    return fail("rules", st);
  }
  std::unique_ptr<sluice::ControlClient> client;
  if (!a.socket.empty()) {
    auto c = sluice::bench::start_control_client(*stage, a.socket);
    if (!c.is_ok()) return fail("daemon", c.status());
    client = std::move(c).value();
  }

  // The caches.
  const auto capacity = static_cast<std::size_t>(a.cache_mib * kMiB);
  std::shared_ptr<rb::TenantCache> tc;
  std::vector<std::shared_ptr<rocksdb::Cache>> per_tenant(static_cast<std::size_t>(n) + 1);
  std::shared_ptr<rocksdb::Cache> shared_lru;
  if (a.cache == "tenant") {
    auto reserve = rb::TenantCache::find_reserve(*stage, "cache", "read_cache");
    if (!reserve.is_ok()) return fail("cache", reserve.status());
    rb::TenantCacheOptions co;
    co.num_shard_bits = a.shard_bits;
    co.reserve = std::move(reserve).value();
    auto made = rb::TenantCache::make(co);
    if (!made.is_ok()) return fail("cache", made.status());
    tc = std::move(made).value();
    for (const auto& t : tenants) per_tenant[t.id] = tc->view(t.id);
  } else if (a.cache == "lru") {
    shared_lru = rocksdb::NewLRUCache(capacity, a.shard_bits);
    for (const auto& t : tenants) per_tenant[t.id] = shared_lru;
  } else {
    for (const auto& t : tenants) {
      per_tenant[t.id] = rocksdb::NewLRUCache(capacity / static_cast<std::size_t>(n), a.shard_bits);
    }
  }
  auto usage_of = [&](std::uint32_t id) -> std::uint64_t {
    if (tc) return tc->stats(id).usage;
    if (shared_lru) return 0;  // not attributable
    return per_tenant[id]->GetUsage();
  };

  // The DB, loaded with every tenant's working set, flushed; the device lifted meanwhile.
  if (auto st = set_device(*stage, "device", "device", "read_bytes", kLiftedBps); !st.is_ok()) {
    return fail("device", st);
  }
  if (auto st = set_device(*stage, "flush", "flush_device", "write_bytes", kLiftedBps);
      !st.is_ok()) {
    return fail("device", st);
  }
  TenantDb::Config dc;
  dc.path = a.db;
  dc.gated = a.setup == "gated";
  dc.stage = stage.get();
  dc.buffer_bytes = static_cast<std::uint64_t>(a.buffer_mib * kMiB);
  dc.segment_bytes = static_cast<std::uint64_t>(a.memtable_mib * kMiB);
  dc.entry_overhead = static_cast<std::uint64_t>(a.entry_overhead);
  dc.serial_flush = dc.gated;
  for (const auto& t : tenants) dc.tenants.push_back({t.cf, t.id});
  dc.options.create_if_missing = true;
  dc.options.create_missing_column_families = true;
  dc.options.compression = rocksdb::kNoCompression;
  dc.options.write_buffer_size = static_cast<std::size_t>(a.memtable_mib * kMiB);
  dc.options.max_write_buffer_number = 64;
  dc.options.disable_auto_compactions = true;
  dc.options.level0_slowdown_writes_trigger = 1000000;
  dc.options.level0_stop_writes_trigger = 1000000;
  dc.options.soft_pending_compaction_bytes_limit = 0;
  dc.options.hard_pending_compaction_bytes_limit = 0;
  // Gated: enough flush threads for every pending flush job to hold one (the serial
  // flush makes a column family's jobs wait their turn on their threads).
  const int flush_threads = dc.gated ? 48 : 8;
  dc.options.max_background_flushes = flush_threads;
  dc.options.max_open_files = -1;
  dc.options.env->SetBackgroundThreads(flush_threads, rocksdb::Env::Priority::HIGH);
  dc.cf_options = [&](std::uint32_t id, rocksdb::ColumnFamilyOptions& o) {
    o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table_options(per_tenant[id])));
  };
  rb::AttachOptions attach;
  attach.tenants.mode = rb::TenantMode::kColumnFamily;
  for (const auto& t : tenants) attach.tenants.cf_tenants[t.cf] = t.id;
  auto attached = rb::Attach(dc.options, *stage, attach);
  if (!attached.is_ok()) return fail("attach", attached.status());
  rb::Binding binding = std::move(attached).value();
  fs::remove_all(a.db);
  auto opened = TenantDb::open(dc);
  if (!opened.is_ok()) return fail("open", opened.status());
  std::unique_ptr<TenantDb> db = std::move(opened).value();
  {
    std::string value(static_cast<std::size_t>(a.value_size), '\0');
    std::mt19937_64 rng(a.seed);
    char key[kKeySize];
    // Loaded in memtables of 64 MiB flushed every 8 MiB (the write buffer's memtables,
    // gated, are smaller: the load would make many small files), then the run's size.
    const std::uint64_t load_flush = 8 << 20;
    const auto per_flush = std::max<std::uint64_t>(1, load_flush / (a.value_size + kKeySize));
    for (const auto& t : tenants) {
      rocksdb::Status s = db->set_option(t.id, "write_buffer_size", std::to_string(64 << 20));
      for (std::uint64_t i = 0; s.ok() && i < t.keys; ++i) {
        for (std::size_t b = 0; b + 8 <= value.size(); b += 8) {
          const std::uint64_t x = rng();
          std::memcpy(value.data() + b, &x, 8);
        }
        make_key(key, t.id, i);
        s = db->put(t.id, rocksdb::Slice(key, kKeySize), value);
        if (s.ok() && (i + 1) % per_flush == 0) s = db->flush(t.id);
      }
      if (s.ok()) s = db->flush(t.id);
      if (s.ok()) {
        s = db->set_option(t.id, "write_buffer_size",
                           std::to_string(static_cast<std::uint64_t>(a.memtable_mib * kMiB)));
      }
      if (!s.ok()) return fail("load", sluice::Status::io_error(t.cf + ": " + s.ToString()));
    }
  }
  // Warm the cache: the ramp-up tenants' working sets first (the least recently used
  // blocks once they go offline, as after the paper's long idle period), then the
  // aggressive tenants', then the steady ones', so that the run starts with every steady
  // and ramp-up tenant holding its own.
  for (Class c : {Class::kRamp, Class::kAggressive, Class::kSteady}) {
    std::string value;
    char key[kKeySize];
    for (const auto& t : tenants) {
      if (t.cls != c) continue;
      for (std::uint64_t i = 0; i < t.keys; ++i) {
        make_key(key, t.id, i);
        db->get(t.id, rocksdb::Slice(key, kKeySize), &value).PermitUncheckedError();
      }
    }
  }
  if (auto st = set_device(*stage, "device", "device", "read_bytes", a.device_read_bps);
      !st.is_ok()) {
    return fail("device", st);
  }
  if (auto st = set_device(*stage, "flush", "flush_device", "write_bytes",
                           a.device_write_bps > 0 ? a.device_write_bps : kLiftedBps);
      !st.is_ok()) {
    return fail("device", st);
  }

  json cfg = {{"type", "config"},
              {"tag", a.tag},
              {"cache", a.cache},
              {"setup", a.setup},
              {"tenants", json::array()},
              {"block_charge", per_block},
              {"ws_keys", ws_keys},
              {"value_size", a.value_size},
              {"cache_mib", a.cache_mib},
              {"ws_mib", a.ws_mib},
              {"offline_at_s", a.offline_at_s},
              {"ramp_at_s", a.ramp_at_s},
              {"duration_s", a.duration_s},
              {"device_read_bps", a.device_read_bps},
              {"device_write_bps", a.device_write_bps},
              {"shard_bits", a.shard_bits},
              {"bin_ms", a.bin_ms},
              {"daemon", !a.socket.empty()},
              {"reserve_at_start", df::object_state(*stage, "read_cache")}};
  for (const auto& t : tenants) {
    cfg["tenants"].push_back({{"id", t.id},
                              {"cf", t.cf},
                              {"class", class_name(t.cls)},
                              {"keys", t.keys},
                              {"usage_at_start", usage_of(t.id)}});
  }
  out << cfg.dump() << "\n";

  // The run.
  Zipf zipf(ws_keys);
  const Run r{a, *db, Clock::now() + std::chrono::milliseconds(20), bins, zipf};
  std::vector<std::thread> threads;
  for (auto& t : tenants) {
    if (t.cls != Class::kAggressive) {
      threads.emplace_back(steady_reader, std::cref(r), std::ref(t));
      continue;
    }
    for (int k = 0; k < a.agg_threads; ++k) {
      threads.emplace_back(aggressive_reader, std::cref(r), std::ref(t), k);
    }
    if (a.agg_write_mib > 0) {
      threads.emplace_back(aggressive_writer, std::cref(r), std::ref(t), std::ref(t.stats.back()));
    }
  }
  std::vector<std::vector<std::uint64_t>> usage(bins);
  std::vector<json> reserve_used(bins);
  const sluice::bench::CpuTicks ticks0 = sluice::bench::read_cpu_ticks();
  for (std::size_t b = 0; b < bins; ++b) {
    std::this_thread::sleep_until(r.t0 + std::chrono::milliseconds(a.bin_ms * (b + 1)));
    for (const auto& t : tenants) usage[b].push_back(usage_of(t.id));
    if (dc.gated) {
      json pool = df::object_state(*stage, "write_buffer");
      if (pool.is_object()) reserve_used[b] = pool.value("used", 0ull);
    }
  }
  for (auto& th : threads) th.join();
  const sluice::bench::CpuTicks ticks1 = sluice::bench::read_cpu_ticks();

  const double bin_s = a.bin_ms / 1e3;
  for (std::size_t b = 0; b < bins; ++b) {
    json line = {{"type", "bin"}, {"t", static_cast<double>(b) * bin_s}};
    for (Class c : {Class::kSteady, Class::kAggressive, Class::kRamp}) {
      Histogram h{};
      std::uint64_t bytes = 0;
      for (const auto& t : tenants) {
        if (t.cls != c) continue;
        for (const auto& s : t.stats) {
          h.merge(s.by_bin[b]);
          bytes += s.done_bytes[b];
        }
      }
      json s = h.summary_ms();
      s["mib_s"] = static_cast<double>(bytes) / kMiB / bin_s;
      line["classes"][class_name(c)] = s;
    }
    line["cache_usage"] = usage[b];
    if (dc.gated) line["pool_used"] = reserve_used[b];
    out << line.dump() << "\n";
  }
  for (const auto& t : tenants) {
    if (t.cls != Class::kRamp) continue;
    out << json{{"type", "ramp"},
                {"tenant", t.id},
                {"multiget_us", t.multiget_us},
                {"refilled", t.refilled},
                {"write_lat_us", t.write_lat_us}}
               .dump()
        << "\n";
  }
  json end = {{"type", "end"}, {"tag", a.tag}, {"tenants", json::array()}};
  std::uint64_t errors = 0;
  for (const auto& t : tenants) {
    Histogram h{};
    std::uint64_t bytes = 0, reads = 0, writes = 0, errs = 0;
    std::string first_error;
    for (const auto& s : t.stats) {
      for (std::size_t b = 0; b < bins; ++b) {
        h.merge(s.by_bin[b]);
        bytes += s.done_bytes[b];
      }
      reads += s.reads;
      writes += s.writes;
      errs += s.errors;
      if (first_error.empty()) first_error = s.first_error;
    }
    json e = h.summary_ms();
    e.update({{"id", t.id},
              {"class", class_name(t.cls)},
              {"reads", reads},
              {"writes", writes},
              {"bytes", bytes},
              {"errors", errs},
              {"cache_usage", usage_of(t.id)}});
    if (tc) {
      const auto cs = tc->stats(t.id);
      e["cache"] = {
          {"hits", cs.hits},           {"misses", cs.misses},
          {"inserts", cs.inserts},     {"inserted_bytes", cs.inserted_bytes},
          {"evictions", cs.evictions}, {"evictions_below_reserved", cs.evictions_below_reserved}};
    }
    if (errs != 0) e["first_error"] = first_error;
    errors += errs;
    end["tenants"].push_back(e);
  }
  end["errors"] = errors;
  end["reserve"] = df::object_state(*stage, "read_cache");
  end["device"] = df::object_state(*stage, "device");
  end["pool"] = df::object_state(*stage, "write_buffer");
  end["gate"] = db->counters();
  if (tc) end["eviction_steps"] = tc->steps();
  end["host_steal_pct"] = sluice::bench::steal_pct(ticks0, ticks1);
  if (client) {
    const auto c = client->counters();
    end["control"] = {{"rules_applied", c.rules_applied},
                      {"rules_rejected", c.rules_rejected},
                      {"collects", c.collects}};
  }
  out << end.dump() << "\n";
  out.flush();

  client.reset();
  stage->shutdown();
  db->close();
  db.reset();
  std::error_code ec;
  fs::remove_all(a.db, ec);
  if (errors != 0) {
    std::fprintf(stderr, "sluice-delta-fair-cache-node: %llu operations failed\n",
                 static_cast<unsigned long long>(errors));
    return 1;
  }
  return 0;
}

// --probe: whether this build runs the tenant cache under these rules.
int probe(const Args& a) {
  if (a.rules.empty()) {
    std::fprintf(stderr, "sluice-delta-fair-cache-node: --probe needs --rules\n");
    return 2;
  }
  auto created = sluice::Stage::create();
  if (!created.is_ok()) return fail("stage", created.status());
  bool ok = true;
  if (auto st = sluice::bench::apply_rules_file(*created.value(), a.rules); !st.is_ok()) {
    std::printf("rules: %s\n", st.to_string().c_str());
    ok = false;
  } else if (auto r = rb::TenantCache::find_reserve(*created.value(), "cache", "read_cache");
             !r.is_ok()) {
    std::printf("cache: %s\n", r.status().to_string().c_str());
    ok = false;
  }
  if (a.setup == "gated" && !TenantDb::has_gate()) {
    std::printf("gate: this build has no tenant gate (sluice/rocksdb_tenants.h)\n");
    ok = false;
  }
  return ok ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
  Args a;
  const sluice::bench::Option options[] = {
      {"--db", &a.db},
      {"--cache", &a.cache},
      {"--setup", &a.setup},
      {"--rules", &a.rules},
      {"--out", &a.out},
      {"--socket", &a.socket},
      {"--stage", &a.stage_name},
      {"--tag", &a.tag},
      {"--steady", &a.steady},
      {"--aggressive", &a.aggressive},
      {"--ramp", &a.ramp},
      {"--cache-mib", &a.cache_mib},
      {"--ws-mib", &a.ws_mib},
      {"--agg-ws-factor", &a.agg_ws_factor},
      {"--steady-mib", &a.steady_mib},
      {"--agg-threads", &a.agg_threads},
      {"--agg-mib", &a.agg_mib},
      {"--offline-at-s", &a.offline_at_s},
      {"--ramp-at-s", &a.ramp_at_s},
      {"--duration-s", &a.duration_s},
      {"--device-read-bps", &a.device_read_bps},
      {"--device-write-bps", &a.device_write_bps},
      {"--value-size", &a.value_size},
      {"--shard-bits", &a.shard_bits},
      {"--bin-ms", &a.bin_ms},
      {"--memtable-mib", &a.memtable_mib},
      {"--buffer-mib", &a.buffer_mib},
      {"--agg-write-mib", &a.agg_write_mib},
      {"--ramp-write-mib", &a.ramp_write_mib},
      {"--entry-overhead", &a.entry_overhead},
      {"--return", &a.ret},
      {"--seed", &a.seed},
      {"--probe", &a.probe, true},
  };
  sluice::bench::parse_options_or_exit(options, argc, argv, kUsage);
  if (a.probe) return probe(a);
  if (!valid(a)) sluice::bench::exit_with_usage(2, kUsage);
  return run(a);
}
