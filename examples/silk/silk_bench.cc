// PAIO §9.2 scaled to a small machine: RocksDB under bursty closed-loop clients, with
// and without tail-latency control of its background I/O.
//
// Two commands:
//   silk_bench load --db DIR --keys N ...
//       Creates a DB with keys 0..N-1 (8-byte big-endian keys, 1 KiB values) written
//       in a random order, and closes it without waiting for compactions, so that the
//       DB keeps the loading phase's backlog (as PAIO's preloaded stores do).
//   silk_bench run --template DIR --db DIR --setup S --workload W ...
//       Clones the loaded DB (table files hard-linked: RocksDB never rewrites them;
//       everything else copied), opens it as setup S and runs workload W: client
//       threads in a closed loop, each paced to its share of the phase's target rate
//       (an initial valley, then peaks at `--peak-ops` and short valleys at
//       `--valley-ops`), reads = Get of a uniformly random existing key, writes = Put
//       of a uniformly random key. Every operation's latency (client side, issue to
//       completion) goes into a log-linear histogram of its second; one JSON line per
//       second is printed at the end with throughput, p50/p99/max and RocksDB's state.
//
// Setups (S): plain (RocksDB as is), auto (RocksDB's generic rate limiter, auto-tuned,
// max rate --kvs-mib), static (the generic rate limiter at --static-mib), sluice (a
// Sluice stage under RocksDB with the layout of --layout, driven by `sluice serve`
// running the silk policy at --socket), bound (the same stage and --layout, no control
// plane: the layout's rates stay above what the throttled device can move, so nothing is
// limited; the control for what the binding itself costs under direct I/O).
//
// The I/O bandwidth bound of the store (KVS_B) is not enforced here: run.sh runs this
// program inside a blkio cgroup that throttles its reads and writes (see README.md).
// Direct I/O is on for reads, flushes and compactions so that the throttle applies to
// all of RocksDB's data I/O and the page cache does not hide the disk.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/rate_limiter.h>
#include <rocksdb/statistics.h>
#include <rocksdb/table.h>
#include <nlohmann/json.hpp>

#include "host_steal.h"
#include "sluice/control_client.h"
#include "sluice/objects/builtin.h"
#include "sluice/rocksdb.h"
#include "sluice/stage.h"
#include "support/cli.h"
#include "support/latency.h"
#include "support/rocksdb_open.h"
#include "support/stage_setup.h"

namespace {

namespace fs = std::filesystem;
namespace rb = sluice::rocksdb_binding;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr double kMiB = 1024.0 * 1024.0;
constexpr std::size_t kKeySize = 8;

// ---------------------------------------------------------------------------
// Arguments.

struct Args {
  std::string command;
  std::string db;
  std::string templ;  // run: the loaded DB to clone
  std::string setup = "plain";
  std::string workload = "mixture";
  std::string socket;  // sluice: the daemon
  std::string layout;  // sluice: the stage's rules (channels and DRL objects)
  std::string stage_name = "silk-bench";
  std::string tag;  // free text copied into every line (e.g. the repetition)
  std::uint64_t keys = 1000000;
  int value_size = 1024;
  int clients = 4;
  double valley_ops = 1250;
  double peak_ops = 5000;
  double initial_valley_s = 20;
  double peak_s = 10;
  double valley_s = 2;
  double duration_s = 68;
  double kvs_mib = 48;     // auto: the limiter's maximum rate
  double static_mib = 24;  // static: the limiter's rate
  double memtable_mib = 4;
  int max_write_buffers = 2;
  double level_base_mib = 16;
  double target_file_mib = 4;
  double block_cache_mib = 8;
  int flush_threads = 1;
  int compaction_threads = 2;
  int readahead_kib = 256;         // compaction_readahead_size
  double settle_pending_mib = -1;  // load: wait for compactions down to this backlog
  int bloom_bits = 10;
  bool direct_io = true;
  std::uint64_t seed = 1;
};

constexpr char kUsage[] =
    "usage: silk_bench load --db DIR [--keys N] [options]\n"
    "       silk_bench run --template DIR --db DIR --setup plain|auto|static|sluice|bound\n"
    "                      --workload mixture|read-heavy|write-heavy [options]\n"
    "options: --clients N --valley-ops R --peak-ops R --initial-valley-s S\n"
    "  --peak-s S --valley-s S --duration-s S --kvs-mib M --static-mib M\n"
    "  --memtable-mib M --max-write-buffers N --level-base-mib M\n"
    "  --target-file-mib M --block-cache-mib M --flush-threads N\n"
    "  --compaction-threads N --readahead-kib K --bloom-bits B --buffered\n"
    "  --value-size B --seed N --socket PATH --layout FILE --stage NAME --tag TEXT\n"
    "  --settle-pending-mib M (load)\n";

bool parse(int argc, char** argv, Args* a) {
  if (argc < 2) return false;
  a->command = argv[1];
  const sluice::bench::Option options[] = {
      {"--buffered", &a->direct_io, false},
      {"--db", &a->db},
      {"--template", &a->templ},
      {"--setup", &a->setup},
      {"--workload", &a->workload},
      {"--socket", &a->socket},
      {"--layout", &a->layout},
      {"--stage", &a->stage_name},
      {"--tag", &a->tag},
      {"--keys", &a->keys},
      {"--value-size", &a->value_size},
      {"--clients", &a->clients},
      {"--valley-ops", &a->valley_ops},
      {"--peak-ops", &a->peak_ops},
      {"--initial-valley-s", &a->initial_valley_s},
      {"--peak-s", &a->peak_s},
      {"--valley-s", &a->valley_s},
      {"--duration-s", &a->duration_s},
      {"--kvs-mib", &a->kvs_mib},
      {"--static-mib", &a->static_mib},
      {"--memtable-mib", &a->memtable_mib},
      {"--max-write-buffers", &a->max_write_buffers},
      {"--level-base-mib", &a->level_base_mib},
      {"--target-file-mib", &a->target_file_mib},
      {"--block-cache-mib", &a->block_cache_mib},
      {"--flush-threads", &a->flush_threads},
      {"--compaction-threads", &a->compaction_threads},
      {"--readahead-kib", &a->readahead_kib},
      {"--bloom-bits", &a->bloom_bits},
      {"--settle-pending-mib", &a->settle_pending_mib},
      {"--seed", &a->seed},
  };
  const sluice::bench::ParseResult r = sluice::bench::parse_options(options, argc, argv, 2);
  if (r.error == sluice::bench::ParseResult::Error::kUnknown) {
    std::fprintf(stderr, "unknown option %s\n", r.option.c_str());
  }
  if (!r.ok()) return false;
  if (a->db.empty() || a->keys == 0 || a->clients < 1 || a->value_size < 1) return false;
  if (a->command == "run") {
    if (a->templ.empty() || a->peak_ops <= 0 || a->valley_ops <= 0 || a->duration_s <= 0 ||
        a->peak_s <= 0 || a->valley_s < 0 || a->initial_valley_s < 0) {
      return false;
    }
    const bool known_setup = a->setup == "plain" || a->setup == "auto" || a->setup == "static" ||
                             a->setup == "sluice" || a->setup == "bound";
    if (!known_setup) return false;
    if (a->setup == "bound" && a->layout.empty()) {
      std::fprintf(stderr, "setup bound needs --layout\n");
      return false;
    }
    if (a->setup == "sluice" && (a->socket.empty() || a->layout.empty())) {
      std::fprintf(stderr, "setup sluice needs --socket and --layout\n");
      return false;
    }
  } else if (a->command != "load") {
    return false;
  }
  return true;
}

// The share of reads of a workload, or -1 if unknown.
double read_fraction(const std::string& w) {
  if (w == "mixture") return 0.5;
  if (w == "read-heavy") return 0.9;
  if (w == "write-heavy") return 0.1;
  return -1;
}

// ---------------------------------------------------------------------------
// RocksDB configuration shared by load and run (see README.md for the scaling).

rocksdb::Options make_options(const Args& a) {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.statistics = rocksdb::CreateDBStatistics();
  o.compression = rocksdb::kNoCompression;
  o.write_buffer_size = static_cast<std::size_t>(a.memtable_mib * kMiB);
  o.max_write_buffer_number = a.max_write_buffers;
  o.target_file_size_base = static_cast<std::uint64_t>(a.target_file_mib * kMiB);
  o.max_bytes_for_level_base = static_cast<std::uint64_t>(a.level_base_mib * kMiB);
  o.max_background_flushes = a.flush_threads;
  o.max_background_compactions = a.compaction_threads;
  o.env->SetBackgroundThreads(a.flush_threads, rocksdb::Env::Priority::HIGH);
  o.env->SetBackgroundThreads(a.compaction_threads, rocksdb::Env::Priority::LOW);
  o.use_direct_reads = a.direct_io;
  o.use_direct_io_for_flush_and_compaction = a.direct_io;
  o.compaction_readahead_size = static_cast<std::size_t>(a.readahead_kib) * 1024;
  o.max_open_files = -1;
  rocksdb::BlockBasedTableOptions t;
  t.block_size = 4096;
  t.block_cache = rocksdb::NewLRUCache(static_cast<std::size_t>(a.block_cache_mib * kMiB));
  if (a.bloom_bits > 0) t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(a.bloom_bits));
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  return o;
}

void encode_key(std::uint64_t k, char* out) {
  for (std::size_t i = 0; i < kKeySize; ++i) {
    out[i] = static_cast<char>((k >> (8 * (kKeySize - 1 - i))) & 0xff);
  }
}

// A value that differs per key and write (so that nothing compresses or dedups).
void fill_value(std::mt19937_64& rng, std::string* v) {
  for (std::size_t i = 0; i + 8 <= v->size(); i += 8) {
    const std::uint64_t x = rng();
    std::memcpy(v->data() + i, &x, 8);
  }
}

int load(const Args& a) {
  fs::remove_all(a.db);
  rocksdb::Options o = make_options(a);
  std::unique_ptr<rocksdb::DB> db = sluice::bench::open_db(o, a.db);
  if (!db) return 1;
  std::vector<std::uint32_t> order(a.keys);
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937_64 rng(a.seed);
  std::shuffle(order.begin(), order.end(), rng);
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;
  std::string value(static_cast<std::size_t>(a.value_size), 'v');
  char key[kKeySize];
  const auto start = Clock::now();
  rocksdb::Status s;
  for (std::size_t i = 0; i < order.size(); ++i) {
    encode_key(order[i], key);
    fill_value(rng, &value);
    s = db->Put(wo, rocksdb::Slice(key, kKeySize), value);
    if (!s.ok()) {
      std::fprintf(stderr, "put: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  s = db->Flush(rocksdb::FlushOptions());
  if (!s.ok()) {
    std::fprintf(stderr, "flush: %s\n", s.ToString().c_str());
    return 1;
  }
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  // Let compactions run (unthrottled) until the backlog is down to --settle-pending-mib:
  // the runs start from a store with a moderate backlog to drain, not a pathological one.
  const auto settle_start = Clock::now();
  double settled_s = 0;
  if (a.settle_pending_mib >= 0) {
    for (;;) {
      std::uint64_t pending = 0;
      db->GetIntProperty("rocksdb.estimate-pending-compaction-bytes", &pending);
      settled_s = std::chrono::duration<double>(Clock::now() - settle_start).count();
      if (static_cast<double>(pending) <= a.settle_pending_mib * kMiB || settled_s > 600) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  std::string l0;
  std::string pending;
  db->GetProperty("rocksdb.num-files-at-level0", &l0);
  db->GetProperty("rocksdb.estimate-pending-compaction-bytes", &pending);
  std::string levels;
  db->GetProperty("rocksdb.levelstats", &levels);
  rocksdb::CancelAllBackgroundWork(db.get(), /*wait=*/true);
  s = db->Close();
  json line = {{"type", "load"},
               {"keys", a.keys},
               {"seconds", secs},
               {"settle_seconds", settled_s},
               {"l0_files", std::atoll(l0.c_str())},
               {"pending_compaction_mib", std::atof(pending.c_str()) / kMiB}};
  std::printf("%s\n", line.dump().c_str());
  std::fprintf(stderr, "%s", levels.c_str());
  return s.ok() ? 0 : 1;
}

// Clones a loaded DB: table files hard-linked (immutable), the rest copied.
bool clone_db(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::remove_all(to, ec);
  fs::create_directories(to, ec);
  if (ec) {
    std::fprintf(stderr, "mkdir %s: %s\n", to.c_str(), ec.message().c_str());
    return false;
  }
  for (const auto& e : fs::directory_iterator(from)) {
    const fs::path dst = fs::path(to) / e.path().filename();
    if (e.path().extension() == ".sst") {
      fs::create_hard_link(e.path(), dst, ec);
    } else if (e.path().filename() != "LOCK") {
      fs::copy_file(e.path(), dst, ec);
    }
    if (ec) {
      std::fprintf(stderr, "clone %s: %s\n", e.path().c_str(), ec.message().c_str());
      return false;
    }
  }
  return true;
}

using Histogram = sluice::bench::LatencyHistogram;

// ---------------------------------------------------------------------------
// The bursty load.

struct Schedule {
  double initial_valley_s;
  double peak_s;
  double valley_s;
  double valley_ops;
  double peak_ops;

  bool in_peak(double t) const {
    if (t < initial_valley_s) return false;
    return std::fmod(t - initial_valley_s, peak_s + valley_s) < peak_s;
  }
  const char* phase(double t) const {
    if (t < initial_valley_s) return "initial";
    return in_peak(t) ? "peak" : "valley";
  }
  double rate(double t) const { return in_peak(t) ? peak_ops : valley_ops; }
};

struct ClientRecord {
  std::vector<Histogram> reads;  // per second
  std::vector<Histogram> writes;
  std::uint64_t errors = 0;
};

void client_loop(const Args& a, rocksdb::DB* db, const Schedule& sched, Clock::time_point t0,
                 int id, ClientRecord* rec) {
  const std::size_t seconds = rec->reads.size();
  std::mt19937_64 rng(a.seed * 1000003 + static_cast<std::uint64_t>(id) + 17);
  std::uniform_int_distribution<std::uint64_t> pick(0, a.keys - 1);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  const double reads = read_fraction(a.workload);
  rocksdb::ReadOptions ro;
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;
  std::string value(static_cast<std::size_t>(a.value_size), 'w');
  std::string got;
  char key[kKeySize];
  // Closed loop: one operation outstanding; operations are paced to this client's share
  // of the phase's rate. A client that falls behind (a stalled operation) does not catch
  // up by more than `slack`: the missed operations are lost, as with a real client.
  constexpr double kSlack = 0.05;
  double next = 0;
  for (;;) {
    double now = std::chrono::duration<double>(Clock::now() - t0).count();
    if (now >= a.duration_s) break;
    if (next < now - kSlack) next = now - kSlack;
    if (next > now) {
      std::this_thread::sleep_until(
          t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(next)));
    }
    if (next >= a.duration_s) break;
    encode_key(pick(rng), key);
    const bool is_read = coin(rng) < reads;
    const auto start = Clock::now();
    rocksdb::Status s;
    if (is_read) {
      s = db->Get(ro, rocksdb::Slice(key, kKeySize), &got);
    } else {
      fill_value(rng, &value);
      s = db->Put(wo, rocksdb::Slice(key, kKeySize), value);
    }
    const auto end = Clock::now();
    if (!s.ok()) ++rec->errors;
    const auto sec = static_cast<std::size_t>(std::chrono::duration<double>(start - t0).count());
    if (sec < seconds) {
      const auto us = static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(end - start).count());
      (is_read ? rec->reads[sec] : rec->writes[sec]).add(us);
    }
    next += static_cast<double>(a.clients) / sched.rate(next);
  }
}

// What the monitor samples each second.
struct Sample {
  std::int64_t l0_files = 0;
  double pending_mib = 0;
  double stall_ms = 0;  // STALL_MICROS delta
  double flush_mib = 0;
  double compact_read_mib = 0;
  double compact_write_mib = 0;
  std::int64_t write_stopped = 0;
  double delayed_write_rate_mib = 0;
  double limiter_mib = -1;  // the generic rate limiter's current rate
  std::uint64_t rules_applied = 0;
  std::uint64_t rules_version = 0;
  double host_steal_pct = -1;  // the hypervisor's share of this second (host_steal.h)
};

std::int64_t int_property(rocksdb::DB* db, const char* name) {
  std::uint64_t v = 0;
  if (db->GetIntProperty(name, &v)) return static_cast<std::int64_t>(v);
  std::string text;
  return db->GetProperty(name, &text) ? std::atoll(text.c_str()) : -1;
}

int run(const Args& a) {
  if (read_fraction(a.workload) < 0) {
    std::fprintf(stderr, "unknown workload %s\n", a.workload.c_str());
    return 2;
  }
  if (!clone_db(a.templ, a.db)) return 1;
  rocksdb::Options o = make_options(a);
  o.create_if_missing = false;
  if (a.setup == "auto") {
    o.rate_limiter.reset(rocksdb::NewGenericRateLimiter(
        static_cast<std::int64_t>(a.kvs_mib * kMiB), 100 * 1000, 10,
        rocksdb::RateLimiter::Mode::kWritesOnly, /*auto_tuned=*/true));
  } else if (a.setup == "static") {
    o.rate_limiter.reset(
        rocksdb::NewGenericRateLimiter(static_cast<std::int64_t>(a.static_mib * kMiB)));
  }

  std::unique_ptr<sluice::Stage> stage;
  std::unique_ptr<sluice::ControlClient> client;
  rb::Binding binding;
  if (a.setup == "sluice" || a.setup == "bound") {
    sluice::StageOptions so;
    so.name = a.stage_name;
    so.labels["app"] = "rocksdb";
    so.labels["example"] = "silk";
    auto created = sluice::Stage::create(so);
    if (!created.is_ok()) {
      std::fprintf(stderr, "stage: %s\n", created.status().to_string().c_str());
      return 1;
    }
    stage = std::move(created).value();
    if (auto st = sluice::bench::apply_rules_file(*stage, a.layout); !st.is_ok()) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      return 1;
    }
    auto attached = rb::Attach(o, *stage);
    if (!attached.is_ok()) {
      std::fprintf(stderr, "attach: %s\n", attached.status().to_string().c_str());
      return 1;
    }
    binding = std::move(attached).value();
  }

  std::unique_ptr<rocksdb::DB> db = sluice::bench::open_db(o, a.db);
  if (!db) return 1;

  if (stage && a.setup == "sluice") {
    // Start the clock once the policy has set the rates at least once.
    auto c = sluice::bench::start_control_client(*stage, a.socket);
    if (!c.is_ok()) {
      std::fprintf(stderr, "%s\n", c.status().message().c_str());
      return 1;
    }
    client = std::move(c).value();
  }

  const Schedule sched{a.initial_valley_s, a.peak_s, a.valley_s, a.valley_ops, a.peak_ops};
  const auto seconds = static_cast<std::size_t>(std::ceil(a.duration_s));
  std::vector<ClientRecord> records(static_cast<std::size_t>(a.clients));
  for (auto& r : records) {
    r.reads.assign(seconds, Histogram{});
    r.writes.assign(seconds, Histogram{});
  }
  std::vector<Sample> samples(seconds);
  rocksdb::Statistics& stats = *o.statistics;
  auto ticker_mib = [&](rocksdb::Tickers t) {
    return static_cast<double>(stats.getTickerCount(t)) / kMiB;
  };

  const auto t0 = Clock::now() + std::chrono::milliseconds(20);
  const double t0_unix =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() +
      0.02;
  std::vector<std::thread> threads;
  for (int i = 0; i < a.clients; ++i) {
    threads.emplace_back(client_loop, std::cref(a), db.get(), std::cref(sched), t0, i,
                         &records[static_cast<std::size_t>(i)]);
  }
  // The monitor: RocksDB's state at the end of each second.
  double stall0 = static_cast<double>(stats.getTickerCount(rocksdb::STALL_MICROS));
  double flush0 = ticker_mib(rocksdb::FLUSH_WRITE_BYTES);
  double cr0 = ticker_mib(rocksdb::COMPACT_READ_BYTES);
  double cw0 = ticker_mib(rocksdb::COMPACT_WRITE_BYTES);
  const sluice::bench::CpuTicks ticks_start = sluice::bench::read_cpu_ticks();
  sluice::bench::CpuTicks ticks0 = ticks_start;
  for (std::size_t sec = 0; sec < seconds; ++sec) {
    std::this_thread::sleep_until(t0 + std::chrono::seconds(sec + 1));
    Sample& m = samples[sec];
    m.l0_files = int_property(db.get(), "rocksdb.num-files-at-level0");
    m.pending_mib =
        static_cast<double>(int_property(db.get(), "rocksdb.estimate-pending-compaction-bytes")) /
        kMiB;
    m.write_stopped = int_property(db.get(), "rocksdb.is-write-stopped");
    m.delayed_write_rate_mib =
        static_cast<double>(int_property(db.get(), "rocksdb.actual-delayed-write-rate")) / kMiB;
    const double stall = static_cast<double>(stats.getTickerCount(rocksdb::STALL_MICROS));
    const double flush = ticker_mib(rocksdb::FLUSH_WRITE_BYTES);
    const double cr = ticker_mib(rocksdb::COMPACT_READ_BYTES);
    const double cw = ticker_mib(rocksdb::COMPACT_WRITE_BYTES);
    m.stall_ms = (stall - stall0) / 1e3;
    m.flush_mib = flush - flush0;
    m.compact_read_mib = cr - cr0;
    m.compact_write_mib = cw - cw0;
    stall0 = stall;
    flush0 = flush;
    cr0 = cr;
    cw0 = cw;
    if (o.rate_limiter) {
      m.limiter_mib = static_cast<double>(o.rate_limiter->GetBytesPerSecond()) / kMiB;
    }
    if (client) m.rules_applied = client->counters().rules_applied;
    if (stage) m.rules_version = stage->info().rules_version;
    const sluice::bench::CpuTicks ticks = sluice::bench::read_cpu_ticks();
    m.host_steal_pct = sluice::bench::steal_pct(ticks0, ticks);
    ticks0 = ticks;
  }
  for (auto& t : threads) t.join();

  // One line per second, then the end line.
  std::uint64_t total_ops = 0;
  std::uint64_t errors = 0;
  std::map<std::string, Histogram> by_phase;  // all operations of a phase, and "all"
  for (const auto& r : records) errors += r.errors;
  const json common = {{"setup", a.setup}, {"workload", a.workload}, {"tag", a.tag}};
  for (std::size_t sec = 0; sec < seconds; ++sec) {
    Histogram rd, wr;
    for (const auto& r : records) {
      rd.merge(r.reads[sec]);
      wr.merge(r.writes[sec]);
    }
    Histogram all = rd;
    all.merge(wr);
    for (const char* ph : {sched.phase(static_cast<double>(sec) + 0.5), "all"}) {
      by_phase[ph].merge(all);
    }
    total_ops += all.count();
    const double mid = static_cast<double>(sec) + 0.5;
    const Sample& m = samples[sec];
    json line = common;
    line.update({{"type", "second"},
                 {"t", sec},
                 {"phase", sched.phase(mid)},
                 {"target_ops", sched.rate(mid)},
                 {"ops", all.count()},
                 {"reads", rd.count()},
                 {"writes", wr.count()},
                 {"p50_us", all.quantile_us(0.5)},
                 {"p99_us", all.quantile_us(0.99)},
                 {"max_us", all.quantile_us(1.0)},
                 {"read_p99_us", rd.quantile_us(0.99)},
                 {"write_p99_us", wr.quantile_us(0.99)},
                 {"l0_files", m.l0_files},
                 {"pending_compaction_mib", m.pending_mib},
                 {"stall_ms", m.stall_ms},
                 {"write_stopped", m.write_stopped},
                 {"flush_mib", m.flush_mib},
                 {"compact_read_mib", m.compact_read_mib},
                 {"compact_write_mib", m.compact_write_mib},
                 {"host_steal_pct", m.host_steal_pct}});
    if (m.limiter_mib >= 0) line["limiter_mib"] = m.limiter_mib;
    if (stage) {
      line["rules_applied"] = m.rules_applied;
      line["rules_version"] = m.rules_version;
    }
    std::printf("%s\n", line.dump().c_str());
  }
  json end = common;
  end.update({{"type", "end"},
              {"seconds", a.duration_s},
              {"ops", total_ops},
              {"errors", errors},
              {"t0_unix", t0_unix},
              {"host_steal_pct", sluice::bench::steal_pct(ticks_start, ticks0)},
              {"mean_ops", static_cast<double>(total_ops) / a.duration_s}});
  // Latency over every operation of each phase (not a mean of per-second figures).
  for (const auto& [ph, h] : by_phase) {
    end["phases"][ph] = {{"ops", h.count()},
                         {"p50_us", h.quantile_us(0.5)},
                         {"p99_us", h.quantile_us(0.99)},
                         {"max_us", h.quantile_us(1.0)}};
  }
  if (client) {
    const auto c = client->counters();
    end["rules_applied"] = c.rules_applied;
    end["rules_rejected"] = c.rules_rejected;
    end["collects"] = c.collects;
    end["rules_version"] = stage->info().rules_version;
  }
  std::printf("%s\n", end.dump().c_str());
  std::fflush(stdout);

  client.reset();
  if (stage) stage->shutdown();  // wake background I/O waiting for tokens
  rocksdb::CancelAllBackgroundWork(db.get(), /*wait=*/true);
  db->Close().PermitUncheckedError();
  db.reset();
  std::error_code ec;
  fs::remove_all(a.db, ec);
  return errors == 0 ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
  Args a;
  if (!parse(argc, argv, &a)) sluice::bench::exit_with_usage(2, kUsage);
  // The config line: every parameter of this run, for the summary and the README.
  if (a.command == "run") {
    json cfg = {{"type", "config"},
                {"setup", a.setup},
                {"workload", a.workload},
                {"tag", a.tag},
                {"keys", a.keys},
                {"key_size", kKeySize},
                {"value_size", a.value_size},
                {"clients", a.clients},
                {"valley_ops", a.valley_ops},
                {"peak_ops", a.peak_ops},
                {"initial_valley_s", a.initial_valley_s},
                {"peak_s", a.peak_s},
                {"valley_s", a.valley_s},
                {"duration_s", a.duration_s},
                {"kvs_mib", a.kvs_mib},
                {"static_mib", a.static_mib},
                {"memtable_mib", a.memtable_mib},
                {"max_write_buffers", a.max_write_buffers},
                {"level_base_mib", a.level_base_mib},
                {"target_file_mib", a.target_file_mib},
                {"block_cache_mib", a.block_cache_mib},
                {"flush_threads", a.flush_threads},
                {"compaction_threads", a.compaction_threads},
                {"readahead_kib", a.readahead_kib},
                {"bloom_bits", a.bloom_bits},
                {"direct_io", a.direct_io},
                {"read_fraction", read_fraction(a.workload)}};
    std::printf("%s\n", cfg.dump().c_str());
    std::fflush(stdout);
    return run(a);
  }
  return load(a);
}
