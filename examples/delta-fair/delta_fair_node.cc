// sluice-delta-fair-node: one run of the write-buffer experiment (examples/delta-fair):
// one RocksDB database, one column family per tenant, tenants writing 4 KiB puts in an
// open loop, under one of two setups.
//
//   sluice-delta-fair-node --db DIR --setup plain|gated --rules FILE --out FILE
//                          [--socket PATH] [--buffer-mib M] [--memtable-mib M] ...
//   sluice-delta-fair-node --probe --rules FILE
//       Says whether this build can run the gated setup: the rules apply to a stage (the
//       object types exist) and the tenant gate is built in. Exit 0 if so, 3 if not.
//
// Tenants 1..N are column families t01..tNN, in three classes, in this order: --steady
// tenants writing --steady-mib MiB/s from the start, --aggressive tenants writing
// --aggressive-mib MiB/s from the start, and --ramp tenants idle until --ramp-at-s, then
// offering a batch of --ramp-batch-mib (as puts all due at that instant) and from then on
// --steady-mib MiB/s. Every tenant has one writer thread serving its own queue in order:
// a put is due at its scheduled time, and its latency counts from then (queueing behind
// the tenant's earlier puts included), as an open-loop client would see it.
//
// The stage comes from --rules: the experiment's rules route flush writes (origin flush,
// the column family's tenant, through the RocksDB binding in TenantMode::kColumnFamily) to
// a fair queue at the scaled device's bandwidth, and, for the gated setup, the tenants'
// puts to a `buffer-pool` object named "write_buffer" (see README.md). With --socket the
// stage joins `sluice serve` (running the delta-fair policy, which sets the pool's
// reservation) and the run starts once the daemon's first rules are applied.
//  - plain: no gate; one WriteBufferManager of --buffer-mib with allow_stall for the DB
//    (RocksDB as is: when it is full every writer of the DB stops).
//  - gated: the RocksDB tenant gate (sluice/rocksdb_tenants.h) in front of the DB; a put
//    takes its bytes from the write-buffer pool, its memtable's flush gives them back.
//    With --admission segment (default) the pool is asked for whole segments of the
//    memtable's size, as FairDB allocates buffer pages; with put, for every put's bytes.
// Compactions are off in both (the paper gives them a bandwidth budget of their own;
// here they have none and L0 grows): the run measures the write buffer alone. With
// --serial-flush 1 (default) one column family's flush jobs run one after another, so
// that a tenant's segments are flushed and given back in order, one at a time.
//
// Output (--out, JSON lines): a config line; one line per bin (--bin-ms) with, per tenant
// class, puts completed, bytes and latency p50/p99/max of the puts due in that bin, and
// per tenant the memtable bytes and, gated, the pool's usage; a "ramp" line with every
// ramp-up tenant put's due time and latency (microseconds); an end line with totals per
// tenant (bytes, puts, p99, the time it had a put waiting longer than each stall
// threshold), RocksDB's and the pool's state and the control client's counters.
//
// Exit status: 0; 1 on a runtime error (stage, rules, DB, daemon not ready, a failed
// put); 2 on bad arguments (the message names the option).
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/statistics.h>
#include <rocksdb/write_buffer_manager.h>
#include <nlohmann/json.hpp>

#include "host_steal.h"
#include "node_util.h"
#include "sluice/control_client.h"
#include "sluice/objects/builtin.h"
#include "sluice/rocksdb.h"
#include "sluice/stage.h"
#include "support/cli.h"
#include "support/stage_setup.h"
#include "tenant_db.h"

namespace {

namespace fs = std::filesystem;
namespace rb = sluice::rocksdb_binding;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using sluice::examples::delta_fair::Histogram;
using sluice::examples::delta_fair::kMiB;
using sluice::examples::delta_fair::object_state;
using sluice::examples::delta_fair::TenantDb;

constexpr int kKeySize = 16;

struct Args {
  std::string db;
  std::string setup;
  std::string rules;
  std::string out;
  std::string socket;
  std::string stage_name = "delta-fair";
  std::string tag;
  int steady = 12;
  int aggressive = 2;
  int ramp = 2;
  double steady_mib = 1.5625;
  double aggressive_mib = 12;
  double ramp_at_s = 20;
  double ramp_batch_mib = 4;
  int entry_overhead = 32;  // what the gate charges per put beyond key and value
  double duration_s = 35;
  int value_size = 4096;
  double buffer_mib = 64;
  double memtable_mib = 2;
  int max_write_buffers = 64;
  int flush_threads = 48;  // enough for every pending flush job to hold one
  int serial_flush = 1;
  std::string admission = "segment";  // gated: the pool's unit, "segment" or "put"
  int file_buffer_kib = 64;
  int bin_ms = 250;
  std::uint64_t seed = 1;
  bool probe = false;
};

constexpr char kUsage[] =
    "usage: sluice-delta-fair-node --db DIR --setup plain|gated --rules FILE --out FILE\n"
    "       sluice-delta-fair-node --probe --rules FILE\n"
    "  [--socket PATH] [--stage NAME] [--tag TEXT] [--steady N] [--aggressive N] [--ramp N]\n"
    "  [--steady-mib M] [--aggressive-mib M] [--ramp-at-s S] [--ramp-batch-mib M]\n"
    "  [--entry-overhead B]\n"
    "  [--duration-s S] [--value-size B] [--buffer-mib M] [--memtable-mib M]\n"
    "  [--max-write-buffers N] [--flush-threads N] [--file-buffer-kib K] [--bin-ms MS]\n"
    "  [--serial-flush 0|1] [--admission segment|put] [--seed N]\n";

// Checks the arguments; prints what is wrong, naming the option.
bool valid(const Args& a) {
  auto bad = [](const char* what) {
    std::fprintf(stderr, "sluice-delta-fair-node: %s\n", what);
    return false;
  };
  if (a.db.empty() || a.rules.empty() || a.out.empty()) {
    return bad("--db, --rules and --out are required");
  }
  if (a.setup != "plain" && a.setup != "gated") return bad("--setup must be plain or gated");
  if (a.steady < 0 || a.aggressive < 0 || a.ramp < 0 || a.steady + a.aggressive + a.ramp < 1 ||
      a.steady + a.aggressive + a.ramp > 99) {
    return bad("--steady, --aggressive, --ramp: counts >= 0 adding up to 1..99");
  }
  if (!(a.steady_mib > 0) || !(a.aggressive_mib > 0)) {
    return bad("--steady-mib and --aggressive-mib must be > 0");
  }
  if (!(a.duration_s > 0) || a.ramp_at_s < 0 || a.ramp_at_s >= a.duration_s) {
    return bad("--duration-s must be > 0 and --ramp-at-s in [0, duration)");
  }
  if (a.ramp_batch_mib < 0) return bad("--ramp-batch-mib must be >= 0");
  if (a.entry_overhead < 0 || a.entry_overhead > 4096) return bad("--entry-overhead: 0..4096");
  if (a.value_size < 16 || a.value_size > (1 << 20)) return bad("--value-size: 16..1048576");
  if (!(a.buffer_mib > 0) || !(a.memtable_mib > 0)) {
    return bad("--buffer-mib and --memtable-mib must be > 0");
  }
  if (a.max_write_buffers < 2 || a.flush_threads < 1 || a.file_buffer_kib < 4) {
    return bad("--max-write-buffers >= 2, --flush-threads >= 1, --file-buffer-kib >= 4");
  }
  if (a.bin_ms < 10) return bad("--bin-ms must be >= 10");
  if (a.admission != "segment" && a.admission != "put") {
    return bad("--admission must be segment or put");
  }
  return true;
}

// ---------------------------------------------------------------------------
// Tenants and their writers.

enum class Class { kSteady, kAggressive, kRamp };
const char* class_name(Class c) {
  return c == Class::kSteady ? "steady" : c == Class::kAggressive ? "aggressive" : "ramp";
}

// Stall thresholds: a tenant "could not write" while one of its puts had been waiting
// longer than the threshold (the union over its puts of [due + threshold, done]).
constexpr std::array<int, 3> kStallMs = {10, 50, 200};

struct Tenant {
  std::uint32_t id = 0;
  std::string cf;
  Class cls = Class::kSteady;
  double rate = 0;  // puts/s in its steady phase
  // Written by the tenant's writer only, read after join.
  std::vector<Histogram> by_bin;          // latency of the puts due in each bin
  std::vector<std::uint64_t> done_bytes;  // bytes of the puts completed in each bin
  std::uint64_t puts = 0;
  std::uint64_t errors = 0;
  std::string first_error;
  std::array<double, kStallMs.size()> stall_s{};
  std::array<double, kStallMs.size()> stall_end{};  // end of the union so far (s)
  std::vector<std::uint32_t> ramp_due_us;           // ramp-up tenants: every put
  std::vector<std::uint32_t> ramp_lat_us;
};

// The due time (s from the start) of the tenant's n-th put, or a negative number once the
// tenant has no more puts before `end`.
struct Schedule {
  double phase = 0;  // first put's offset within one period
  double start = 0;  // steady puts start here (ramp-up tenants: after the batch)
  std::uint64_t batch = 0;
  double rate = 0;
  double end = 0;
  double due(std::uint64_t n) const {
    if (n < batch) return start;
    const double t = start + phase + static_cast<double>(n - batch) / rate;
    return t < end ? t : -1;
  }
};

void writer(const Args& a, TenantDb& db, Tenant& t, const Schedule& s, Clock::time_point t0) {
  std::string value(static_cast<std::size_t>(a.value_size), '\0');
  std::mt19937_64 rng(a.seed * 1000003 + t.id);
  for (std::size_t i = 0; i + 8 <= value.size(); i += 8) {
    const std::uint64_t x = rng();
    std::memcpy(value.data() + i, &x, 8);
  }
  const double bin_s = a.bin_ms / 1e3;
  char key[kKeySize + 1];
  for (std::uint64_t n = 0;; ++n) {
    const double due = s.due(n);
    if (due < 0) break;
    const auto due_at =
        t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(due));
    if (Clock::now() < due_at) std::this_thread::sleep_until(due_at);
    if (Clock::now() - t0 >= std::chrono::duration<double>(a.duration_s)) break;
    std::snprintf(key, sizeof key, "%02u%014llu", t.id, static_cast<unsigned long long>(n));
    std::memcpy(value.data(), &n, sizeof n);  // every value differs
    const rocksdb::Status st = db.put(t.id, rocksdb::Slice(key, kKeySize), value);
    const double done = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!st.ok()) {
      if (t.errors++ == 0) t.first_error = st.ToString();
      continue;
    }
    ++t.puts;
    const double lat = done - due;
    const auto bin = static_cast<std::size_t>(due / bin_s);
    if (bin < t.by_bin.size()) t.by_bin[bin].add(static_cast<std::uint64_t>(lat * 1e6));
    const auto dbin = std::min(t.done_bytes.size() - 1, static_cast<std::size_t>(done / bin_s));
    t.done_bytes[dbin] += kKeySize + value.size();
    for (std::size_t k = 0; k < kStallMs.size(); ++k) {
      // Puts complete in due order, so the union grows at its end only.
      const double from = std::max(due + kStallMs[k] / 1e3, t.stall_end[k]);
      if (done > from) {
        t.stall_s[k] += done - from;
        t.stall_end[k] = done;
      }
    }
    if (t.cls == Class::kRamp && t.ramp_due_us.size() < (1u << 22)) {
      t.ramp_due_us.push_back(static_cast<std::uint32_t>(due * 1e6));
      t.ramp_lat_us.push_back(static_cast<std::uint32_t>(std::min(lat * 1e6, 4e9)));
    }
  }
}

// What the monitor samples at the end of each bin.
struct Sample {
  std::vector<std::uint64_t> memtable_bytes;  // per tenant
  std::vector<std::uint64_t> pool_usage;      // per tenant (gated)
  json pool;                                  // the pool's figures besides its flows
  std::uint64_t wbm_usage = 0;                // plain
  double stall_ms = 0;                        // RocksDB's STALL_MICROS over the bin
};

int run(const Args& a) {
  std::ofstream out(a.out);
  if (!out) {
    std::fprintf(stderr, "sluice-delta-fair-node: cannot write %s\n", a.out.c_str());
    return 1;
  }
  // Tenants and their schedules.
  std::vector<Tenant> tenants;
  const int n = a.steady + a.aggressive + a.ramp;
  const double put_bytes = kKeySize + a.value_size;
  std::mt19937_64 rng(a.seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<Schedule> schedules;
  const auto bins = static_cast<std::size_t>(std::ceil(a.duration_s * 1e3 / a.bin_ms));
  for (int i = 0; i < n; ++i) {
    Tenant t;
    t.id = static_cast<std::uint32_t>(i + 1);
    char name[16];
    std::snprintf(name, sizeof name, "t%02d", i + 1);
    t.cf = name;
    t.cls = i < a.steady                  ? Class::kSteady
            : i < a.steady + a.aggressive ? Class::kAggressive
                                          : Class::kRamp;
    t.rate = (t.cls == Class::kAggressive ? a.aggressive_mib : a.steady_mib) * kMiB / put_bytes;
    t.by_bin.assign(bins, Histogram{});
    t.done_bytes.assign(bins, 0);
    Schedule s;
    s.rate = t.rate;
    s.end = a.duration_s;
    // Tenants of a class start spread over the time one of them takes to fill a
    // memtable, so that their memtables fill and flush out of step (started together,
    // the steady tenants would all flush at once, every time).
    const double fill_s = a.memtable_mib * kMiB / (t.rate * put_bytes);
    const int rank = t.cls == Class::kSteady ? i : i - a.steady;
    const int count = t.cls == Class::kSteady ? a.steady : a.aggressive;
    s.phase = (rank + unit(rng)) / std::max(1, count) * fill_s;
    if (t.cls == Class::kRamp) {
      s.start = a.ramp_at_s;
      // As many puts as the pool counts in the batch's bytes (key, value and the gate's
      // charge per entry), so that the batch brings the tenant to its fair share, not over.
      s.batch = static_cast<std::uint64_t>(
          std::floor(a.ramp_batch_mib * kMiB / (put_bytes + a.entry_overhead)));
      s.phase = 0;
    }
    tenants.push_back(std::move(t));
    schedules.push_back(s);
  }

  // The stage: the experiment's rules, the RocksDB binding, optionally the daemon.
  sluice::StageOptions so;
  so.name = a.stage_name;
  so.labels["example"] = "delta-fair";
  so.labels["setup"] = a.setup;
  auto created = sluice::Stage::create(so);
  if (!created.is_ok()) {
    std::fprintf(stderr, "stage: %s\n", created.status().to_string().c_str());
    return 1;
  }
  std::unique_ptr<sluice::Stage> stage = std::move(created).value();
  if (auto st = sluice::bench::apply_rules_file(*stage, a.rules); !st.is_ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }

  TenantDb::Config dc;
  dc.path = a.db;
  dc.gated = a.setup == "gated";
  dc.buffer_bytes = static_cast<std::uint64_t>(a.buffer_mib * kMiB);
  dc.serial_flush = a.serial_flush != 0;
  dc.entry_overhead = static_cast<std::uint64_t>(a.entry_overhead);
  dc.segment_bytes =
      a.admission == "segment" ? static_cast<std::uint64_t>(a.memtable_mib * kMiB) : 0;
  dc.stage = stage.get();
  for (const auto& t : tenants) dc.tenants.push_back({t.cf, t.id});
  dc.options.create_if_missing = true;
  dc.options.create_missing_column_families = true;
  dc.options.statistics = rocksdb::CreateDBStatistics();
  dc.options.compression = rocksdb::kNoCompression;
  dc.options.write_buffer_size = static_cast<std::size_t>(a.memtable_mib * kMiB);
  dc.options.max_write_buffer_number = a.max_write_buffers;
  dc.options.min_write_buffer_number_to_merge = 1;
  dc.options.disable_auto_compactions = true;
  dc.options.level0_slowdown_writes_trigger = 1000000;
  dc.options.level0_stop_writes_trigger = 1000000;
  dc.options.soft_pending_compaction_bytes_limit = 0;
  dc.options.hard_pending_compaction_bytes_limit = 0;
  dc.options.max_background_flushes = a.flush_threads;
  dc.options.max_background_compactions = 1;
  dc.options.env->SetBackgroundThreads(a.flush_threads, rocksdb::Env::Priority::HIGH);
  dc.options.writable_file_max_buffer_size = static_cast<std::size_t>(a.file_buffer_kib) * 1024;
  if (!dc.gated) {
    dc.options.write_buffer_manager = std::make_shared<rocksdb::WriteBufferManager>(
        static_cast<std::size_t>(a.buffer_mib * kMiB), nullptr, /*allow_stall=*/true);
  }
  rb::AttachOptions attach;
  attach.tenants.mode = rb::TenantMode::kColumnFamily;
  for (const auto& t : tenants) attach.tenants.cf_tenants[t.cf] = t.id;
  auto attached = rb::Attach(dc.options, *stage, attach);
  if (!attached.is_ok()) {
    std::fprintf(stderr, "attach: %s\n", attached.status().to_string().c_str());
    return 1;
  }
  rb::Binding binding = std::move(attached).value();
  fs::remove_all(a.db);
  auto opened = TenantDb::open(dc);
  if (!opened.is_ok()) {
    std::fprintf(stderr, "%s\n", opened.status().to_string().c_str());
    return 1;
  }
  std::unique_ptr<TenantDb> db = std::move(opened).value();
  std::unique_ptr<sluice::ControlClient> client;
  if (!a.socket.empty()) {
    auto c = sluice::bench::start_control_client(*stage, a.socket);
    if (!c.is_ok()) {
      std::fprintf(stderr, "%s\n", c.status().message().c_str());
      return 1;
    }
    client = std::move(c).value();
  }

  json cfg = {{"type", "config"},
              {"setup", a.setup},
              {"tag", a.tag},
              {"tenants", json::array()},
              {"put_bytes", put_bytes},
              {"value_size", a.value_size},
              {"ramp_at_s", a.ramp_at_s},
              {"ramp_batch_mib", a.ramp_batch_mib},
              {"entry_overhead", a.entry_overhead},
              {"ramp_batch_puts", schedules.back().batch},
              {"duration_s", a.duration_s},
              {"buffer_mib", a.buffer_mib},
              {"memtable_mib", a.memtable_mib},
              {"max_write_buffers", a.max_write_buffers},
              {"flush_threads", a.flush_threads},
              {"serial_flush", a.serial_flush != 0},
              {"admission", a.admission},
              {"file_buffer_kib", a.file_buffer_kib},
              {"bin_ms", a.bin_ms},
              {"stall_thresholds_ms", kStallMs},
              {"daemon", !a.socket.empty()},
              {"pool_at_start", object_state(*stage, "write_buffer")}};
  for (const auto& t : tenants) {
    cfg["tenants"].push_back(
        {{"id", t.id}, {"cf", t.cf}, {"class", class_name(t.cls)}, {"puts_per_s", t.rate}});
  }
  out << cfg.dump() << "\n";

  // The run.
  const auto t0 = Clock::now() + std::chrono::milliseconds(20);
  std::vector<std::thread> threads;
  threads.reserve(tenants.size());
  for (std::size_t i = 0; i < tenants.size(); ++i) {
    threads.emplace_back(writer, std::cref(a), std::ref(*db), std::ref(tenants[i]),
                         std::cref(schedules[i]), t0);
  }
  std::vector<Sample> samples(bins);
  rocksdb::Statistics& stats = *dc.options.statistics;
  double stall0 = static_cast<double>(stats.getTickerCount(rocksdb::STALL_MICROS));
  const sluice::bench::CpuTicks ticks0 = sluice::bench::read_cpu_ticks();
  for (std::size_t b = 0; b < bins; ++b) {
    std::this_thread::sleep_until(t0 + std::chrono::milliseconds(a.bin_ms * (b + 1)));
    Sample& m = samples[b];
    for (const auto& t : tenants) m.memtable_bytes.push_back(db->memtable_bytes(t.id));
    if (dc.gated) {
      json pool = object_state(*stage, "write_buffer");
      m.pool_usage.assign(tenants.size(), 0);
      if (pool.is_object()) {
        for (const auto& f : pool.value("flows", json::array())) {
          const std::uint64_t id = f.value("flow", std::uint64_t{0});
          if (id >= 1 && id <= tenants.size()) m.pool_usage[id - 1] = f.value("usage", 0ull);
        }
        pool.erase("flows");
        m.pool = std::move(pool);
      }
    } else {
      m.wbm_usage = dc.options.write_buffer_manager->memory_usage();
    }
    const double stall = static_cast<double>(stats.getTickerCount(rocksdb::STALL_MICROS));
    m.stall_ms = (stall - stall0) / 1e3;
    stall0 = stall;
  }
  for (auto& t : threads) t.join();
  const sluice::bench::CpuTicks ticks1 = sluice::bench::read_cpu_ticks();

  // Per bin: each class's latency and throughput, each tenant's buffer.
  const double bin_s = a.bin_ms / 1e3;
  for (std::size_t b = 0; b < bins; ++b) {
    json line = {{"type", "bin"}, {"t", static_cast<double>(b) * bin_s}};
    for (Class c : {Class::kSteady, Class::kAggressive, Class::kRamp}) {
      Histogram h{};
      std::uint64_t bytes = 0;
      for (const auto& t : tenants) {
        if (t.cls != c) continue;
        h.merge(t.by_bin[b]);
        bytes += t.done_bytes[b];
      }
      json s = h.summary_ms();
      s["mib_s"] = static_cast<double>(bytes) / kMiB / bin_s;
      line["classes"][class_name(c)] = s;
    }
    const Sample& m = samples[b];
    line["memtable_bytes"] = m.memtable_bytes;
    line["tenant_bytes"] = json::array();
    for (const auto& t : tenants) line["tenant_bytes"].push_back(t.done_bytes[b]);
    if (dc.gated) {
      line["pool_usage"] = m.pool_usage;
      line["pool"] = m.pool;
    } else {
      line["wbm_usage"] = m.wbm_usage;
    }
    line["rocksdb_stall_ms"] = m.stall_ms;
    out << line.dump() << "\n";
  }
  for (const auto& t : tenants) {
    if (t.cls != Class::kRamp) continue;
    out << json{{"type", "ramp"},
                {"tenant", t.id},
                {"due_us", t.ramp_due_us},
                {"lat_us", t.ramp_lat_us}}
               .dump()
        << "\n";
  }
  json end = {{"type", "end"}, {"tag", a.tag}, {"tenants", json::array()}};
  std::uint64_t errors = 0;
  for (const auto& t : tenants) {
    Histogram h{};
    std::uint64_t bytes = 0;
    for (std::size_t b = 0; b < bins; ++b) {
      h.merge(t.by_bin[b]);
      bytes += t.done_bytes[b];
    }
    json e = h.summary_ms();
    e.update({{"id", t.id},
              {"class", class_name(t.cls)},
              {"puts", t.puts},
              {"bytes", bytes},
              {"errors", t.errors},
              {"stall_s", t.stall_s}});
    if (t.errors != 0) e["first_error"] = t.first_error;
    errors += t.errors;
    end["tenants"].push_back(e);
  }
  end["errors"] = errors;
  end["rocksdb"] = {
      {"stall_micros", stats.getTickerCount(rocksdb::STALL_MICROS)},
      {"flush_write_bytes", stats.getTickerCount(rocksdb::FLUSH_WRITE_BYTES)},
  };
  for (const auto& t : tenants) {
    end["rocksdb"]["l0_files"].push_back(db->int_property(t.id, "rocksdb.num-files-at-level0"));
  }
  end["gate"] = db->counters();
  end["pool"] = object_state(*stage, "write_buffer");
  end["device"] = object_state(*stage, "device");
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
  stage->shutdown();  // wake flushes waiting in the device's queue
  db->close();
  db.reset();
  std::error_code ec;
  fs::remove_all(a.db, ec);
  if (errors != 0) {
    std::fprintf(stderr, "sluice-delta-fair-node: %llu puts failed\n",
                 static_cast<unsigned long long>(errors));
    return 1;
  }
  return 0;
}

// --probe: whether the gated setup can run in this build.
int probe(const Args& a) {
  if (a.rules.empty()) {
    std::fprintf(stderr, "sluice-delta-fair-node: --probe needs --rules\n");
    return 2;
  }
  auto created = sluice::Stage::create();
  if (!created.is_ok()) {
    std::fprintf(stderr, "stage: %s\n", created.status().to_string().c_str());
    return 1;
  }
  bool ok = true;
  if (auto st = sluice::bench::apply_rules_file(*created.value(), a.rules); !st.is_ok()) {
    std::printf("rules: %s\n", st.to_string().c_str());
    ok = false;
  }
  if (!TenantDb::has_gate()) {
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
      {"--setup", &a.setup},
      {"--rules", &a.rules},
      {"--out", &a.out},
      {"--socket", &a.socket},
      {"--stage", &a.stage_name},
      {"--tag", &a.tag},
      {"--steady", &a.steady},
      {"--aggressive", &a.aggressive},
      {"--ramp", &a.ramp},
      {"--steady-mib", &a.steady_mib},
      {"--aggressive-mib", &a.aggressive_mib},
      {"--ramp-at-s", &a.ramp_at_s},
      {"--ramp-batch-mib", &a.ramp_batch_mib},
      {"--entry-overhead", &a.entry_overhead},
      {"--duration-s", &a.duration_s},
      {"--value-size", &a.value_size},
      {"--buffer-mib", &a.buffer_mib},
      {"--memtable-mib", &a.memtable_mib},
      {"--max-write-buffers", &a.max_write_buffers},
      {"--flush-threads", &a.flush_threads},
      {"--file-buffer-kib", &a.file_buffer_kib},
      {"--bin-ms", &a.bin_ms},
      {"--serial-flush", &a.serial_flush},
      {"--admission", &a.admission},
      {"--seed", &a.seed},
      {"--probe", &a.probe, true},
  };
  sluice::bench::parse_options_or_exit(options, argc, argv, kUsage);
  if (a.probe) return probe(a);
  if (!valid(a)) sluice::bench::exit_with_usage(2, kUsage);
  return run(a);
}
