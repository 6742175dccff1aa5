// sluice-flex-bosr: one run of examples/flex's experiment `bosr` (FlexEngine §5.3.2 on
// Sluice): co-located RocksDB instances ("partitions") in one process, every one of them
// writing continuously, their I/O through a node stage whose bucket stands in for the
// device, while the node's bandwidth is short of their background demand (the
// background over-subscription ratio, BOSR), then after it returns.
//
//   sluice-flex-bosr --preload DIR --partitions N --items N [--value-size B] [shape]
//       Creates DIR/p0 .. DIR/p{N-1}: N items each, random keys of the run's key space,
//       written through memtables of the run's shape and left to settle into the LSM tree
//       (no stage), so that each run starts from the same multi-level trees.
//   sluice-flex-bosr --setup rocksdb|node|first-stage|sluice --data DIR --work DIR
//                    --out FILE --partition-rules FILE --node-rules FILE
//                    [--deferral] [--socket PATH] ...
//       One run: copies DIR/p* into --work and opens them. Every DB is attached to a
//       partition stage (--partition-rules) over the process's node stage
//       (--node-rules: the device's bucket at its bandwidth). --deferral: the rules put a
//       `deferral-gate` object "deferral" in channel "bg" and each DB gets a
//       DeferralActuator (its default column family is the gate's partition "p<i>") and
//       a DeferralWakeListener. --socket: the stages join `sluice serve` (the policy
//       decides).
//
// Timeline: from 0 to --window-s the node bucket has the rate of the rules (short);
// at --window-s the program raises it to --after-mib (the bandwidth returns; with
// --after-bg-mib each partition's "bg" bucket too) and the writes go on for --after-s. One writer
// per partition, open loop: put n is due at n / rate (--write-mib MiB/s of 16-byte keys and
// --value-size values, WAL on), and its latency counts from its due time.
//
// "Served" (FlexEngine's normally-served WCU): a put that RocksDB's write controller
// did not throttle: no write delay in its PerfContext, and its partition in no stall
// condition (delayed or stopped, from OnStallConditionsChanged) when it was issued or
// when it completed (FlexEngine: "even partial throttling is not acceptable"; a
// partition stalls from its slowdown trigger on), and completed within --served-ms of
// its due time (a client's deadline: a put the device's queue held that long was not
// served either). "Unthrottled" counts the first condition alone. A put due before
// the end and never issued (its writer behind) is neither, with the wait it had when
// the run ended as its latency (a lower bound).
//
// Output (--out, JSON lines): a config line; per sample (--bin-ms) a bin line with,
// per partition, L0 and L1 files, the bytes in L0 and L1 (what FlexEngine keeps in
// memory while it defers), the memtables' bytes, the stall condition, the deferral state
// applied, the puts issued and the unserved ones in the bin, and the node bucket's and
// each partition's background bytes; an end line with per partition the window's and
// the after-window's puts, served share and latency, RocksDB's stall micros, the time
// each spent stalled, the deferral gate's account and the actuator's, and recovery_s:
// the time from --window-s until every partition's options are back to their
// configured values (deferral state normal), it is in no stall condition and its L0 is
// below the slowdown trigger, and stays so in every later sample (null: not by the end).
//
// Exit status: 0; 1 on a runtime error; 2 on bad arguments (the message names the
// option).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/listener.h>
#include <rocksdb/options.h>
#include <rocksdb/perf_context.h>
#include <rocksdb/perf_level.h>
#include <rocksdb/statistics.h>
#include <rocksdb/table.h>
#include <nlohmann/json.hpp>

#include "sluice/control_client.h"
#include "sluice/objects/builtin.h"
#include "sluice/objects/deferral_gate.h"
#include "sluice/rocksdb.h"
#include "sluice/rocksdb_deferral.h"
#include "sluice/stage.h"
#include "support/cli.h"
#include "support/stage_setup.h"
#include "workload.h"

namespace {

namespace fs = std::filesystem;
namespace rb = sluice::rocksdb_binding;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using sluice::examples::flex::encode_key;
using sluice::examples::flex::Histogram;
using sluice::examples::flex::kKeySize;
using sluice::examples::flex::random_value;

constexpr double kMiB = 1024.0 * 1024.0;

struct Args {
  std::string preload;
  std::string setup;
  std::string data;
  std::string work;
  std::string out;
  std::string tag;
  std::string partition_rules;
  std::string node_rules;
  std::string socket;
  std::string stage_prefix = "bosr";
  int partitions = 8;
  std::uint64_t items = 20000;
  int value_size = 1024;
  double write_mib = 0.5;
  double window_s = 10;
  double after_s = 5;
  double after_mib = 0;
  double after_bg_mib = 0;
  double served_ms = 100;
  double memtable_kib = 256;
  int l0_trigger = 4;
  int l0_slowdown = 20;
  int l0_stop = 36;
  double block_cache_mib = 2;
  int bin_ms = 500;
  std::uint64_t seed = 1;
  bool deferral = false;
};

constexpr char kUsage[] =
    "usage: sluice-flex-bosr --preload DIR --partitions N --items N [--value-size B]\n"
    "         [--memtable-kib K] [--l0-trigger N] [--l0-slowdown N] [--l0-stop N]\n"
    "       sluice-flex-bosr --setup rocksdb|node|first-stage|sluice --data DIR --work DIR\n"
    "         --out FILE --partition-rules FILE --node-rules FILE --after-mib M\n"
    "         [--after-bg-mib M] [--served-ms MS] [--deferral]\n"
    "         [--socket PATH] [--stage-prefix P] [--tag T] [--partitions N] [--items N]\n"
    "         [--value-size B] [--write-mib M] [--window-s S] [--after-s S]\n"
    "         [--memtable-kib K] [--l0-trigger N] [--l0-slowdown N] [--l0-stop N]\n"
    "         [--block-cache-mib M] [--bin-ms MS] [--seed N]\n";

bool bad(const char* what) {
  std::fprintf(stderr, "sluice-flex-bosr: %s\n", what);
  return false;
}

bool valid(const Args& a) {
  if (a.partitions < 1 || a.partitions > 64) return bad("--partitions: 1..64");
  if (a.items < 100 || a.items > 100'000'000) return bad("--items: 100..100000000");
  if (a.value_size < 16 || a.value_size > 65536) return bad("--value-size: 16..65536");
  if (!(a.memtable_kib >= 64)) return bad("--memtable-kib must be >= 64");
  if (a.l0_trigger < 1 || a.l0_slowdown <= a.l0_trigger || a.l0_stop < a.l0_slowdown) {
    return bad("--l0-trigger >= 1, --l0-slowdown > --l0-trigger, --l0-stop >= --l0-slowdown");
  }
  if (!a.preload.empty()) return true;
  if (a.setup != "rocksdb" && a.setup != "node" && a.setup != "first-stage" &&
      a.setup != "sluice") {
    return bad("--setup must be rocksdb, node, first-stage or sluice");
  }
  if (a.data.empty() || a.work.empty() || a.out.empty()) {
    return bad("--data, --work and --out are required");
  }
  if (a.partition_rules.empty() || a.node_rules.empty()) {
    return bad("--partition-rules and --node-rules are required");
  }
  if (!(a.write_mib > 0) || a.write_mib > 64) return bad("--write-mib: (0, 64]");
  if (!(a.window_s > 0) || !(a.after_s >= 0)) return bad("--window-s > 0 and --after-s >= 0");
  if (!(a.after_mib > 0)) return bad("--after-mib must be > 0");
  if (!(a.after_bg_mib >= 0)) return bad("--after-bg-mib must be >= 0");
  if (!(a.served_ms > 0)) return bad("--served-ms must be > 0");
  if (!(a.block_cache_mib > 0)) return bad("--block-cache-mib must be > 0");
  if (a.bin_ms < 50) return bad("--bin-ms must be >= 50");
  return true;
}

// The paper's shapes (§5.1), scaled: memtable --memtable-kib, at most 4 of them, L0
// compacting at --l0-trigger files, L1 at 4 memtables' worth, levels x10.
rocksdb::Options partition_options(const Args& a) {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.compression = rocksdb::kNoCompression;
  const auto memtable = static_cast<std::uint64_t>(a.memtable_kib * 1024);
  o.write_buffer_size = memtable;
  o.max_write_buffer_number = 4;
  o.level0_file_num_compaction_trigger = a.l0_trigger;
  o.level0_slowdown_writes_trigger = a.l0_slowdown;
  o.level0_stop_writes_trigger = a.l0_stop;
  o.max_bytes_for_level_base = 4 * memtable;
  o.target_file_size_base = memtable;
  o.bytes_per_sync = 1 << 20;
  o.writable_file_max_buffer_size = 64 << 10;
  rocksdb::BlockBasedTableOptions t;
  t.block_size = 4096;
  t.block_cache = rocksdb::NewLRUCache(static_cast<std::size_t>(a.block_cache_mib * kMiB));
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  return o;
}

// Whether the DB has flushes or compactions to do or doing.
bool busy(rocksdb::DB& db) {
  std::uint64_t pending = 0, compactions = 0, flushes = 0;
  db.GetIntProperty("rocksdb.compaction-pending", &pending);
  db.GetIntProperty("rocksdb.num-running-compactions", &compactions);
  db.GetIntProperty("rocksdb.num-running-flushes", &flushes);
  return pending + compactions + flushes != 0;
}

// RocksDB's background pools are the process's, shared by its DBs, and hold one
// compaction thread by default: a thread of each kind per partition, so that each
// partition's compactions run at its own bucket's pace, not one partition at a time.
void size_pools(int partitions) {
  rocksdb::Env::Default()->SetBackgroundThreads(partitions, rocksdb::Env::Priority::LOW);
  rocksdb::Env::Default()->SetBackgroundThreads(partitions, rocksdb::Env::Priority::HIGH);
}

int preload(const Args& a) {
  fs::remove_all(a.preload);
  fs::create_directories(a.preload);
  size_pools(a.partitions);
  for (int i = 0; i < a.partitions; ++i) {
    const std::string path = a.preload + "/p" + std::to_string(i);
    rocksdb::Options o = partition_options(a);
    rocksdb::DB* raw = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(o, path, &raw);
    if (!s.ok()) {
      std::fprintf(stderr, "sluice-flex-bosr: open %s: %s\n", path.c_str(), s.ToString().c_str());
      return 1;
    }
    std::unique_ptr<rocksdb::DB> db(raw);
    std::mt19937_64 rng(a.seed * 1000 + static_cast<std::uint64_t>(i));
    rocksdb::WriteOptions wo;
    wo.disableWAL = true;
    char key[kKeySize + 1];
    for (std::uint64_t k = 0; k < a.items && s.ok(); ++k) {
      encode_key(rng() % (a.items * 2), key);
      s = db->Put(wo, rocksdb::Slice(key, kKeySize), random_value(rng, a.value_size));
    }
    if (s.ok()) s = db->Flush(rocksdb::FlushOptions());
    while (s.ok() && busy(*db)) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (s.ok()) s = db->Close();
    if (!s.ok()) {
      std::fprintf(stderr, "sluice-flex-bosr: preload %s: %s\n", path.c_str(),
                   s.ToString().c_str());
      return 1;
    }
  }
  std::printf(
      "%s\n",
      json{{"type", "preload"}, {"partitions", a.partitions}, {"items", a.items}}.dump().c_str());
  return 0;
}

// A partition's write-stall condition as RocksDB reports it, and the time spent out of
// normal.
class StallListener final : public rocksdb::EventListener {
 public:
  void OnStallConditionsChanged(const rocksdb::WriteStallInfo& info) override {
    const auto now = Clock::now().time_since_epoch().count();
    const int cur = static_cast<int>(info.condition.cur);
    const int prev = condition_.exchange(cur, std::memory_order_acq_rel);
    if (prev == 0 && cur != 0) since_ns_.store(now, std::memory_order_relaxed);
    if (prev != 0 && cur == 0) {
      stalled_ns_.fetch_add(now - since_ns_.load(std::memory_order_relaxed),
                            std::memory_order_relaxed);
    }
    if (cur != 0) episodes_.fetch_add(prev == 0 ? 1 : 0, std::memory_order_relaxed);
  }
  const char* Name() const override { return "BosrStall"; }
  // 0 normal, 1 delayed, 2 stopped (rocksdb::WriteStallCondition).
  int condition() const noexcept { return condition_.load(std::memory_order_acquire); }
  double stalled_s() const noexcept {
    std::int64_t ns = stalled_ns_.load(std::memory_order_relaxed);
    if (condition() != 0) {
      ns += Clock::now().time_since_epoch().count() - since_ns_.load(std::memory_order_relaxed);
    }
    return static_cast<double>(ns) / 1e9;
  }
  std::uint64_t episodes() const noexcept { return episodes_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int> condition_{0};
  std::atomic<std::int64_t> since_ns_{0};
  std::atomic<std::int64_t> stalled_ns_{0};
  std::atomic<std::uint64_t> episodes_{0};
};

struct Partition {
  std::string name;
  std::unique_ptr<sluice::Stage> stage;
  rb::Binding binding;
  std::shared_ptr<StallListener> stall = std::make_shared<StallListener>();
  std::shared_ptr<rb::DeferralWakeListener> wake;
  std::shared_ptr<rocksdb::Statistics> stats;
  std::unique_ptr<rocksdb::DB> db;
  std::shared_ptr<sluice::DeferralGate> gate;
  sluice::DeferralGate::Partition* gate_part = nullptr;
  std::unique_ptr<rb::DeferralActuator> actuator;
  std::map<std::string, std::string> configured;  // the options the actuator restores
  std::unique_ptr<sluice::ControlClient> client;
};

struct Timeline {
  Clock::time_point t0;
  double since(Clock::time_point t) const { return std::chrono::duration<double>(t - t0).count(); }
  Clock::time_point at(double s) const {
    return t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
};

// One writer's account: per phase (0 the window, 1 after it, by due time) the puts,
// their latency, the served and the unthrottled ones; per bin the puts and the unserved.
struct WriterStats {
  Histogram lat[2];
  std::uint64_t puts[2] = {0, 0};
  std::uint64_t served[2] = {0, 0};
  std::uint64_t unthrottled[2] = {0, 0};  // not throttled by RocksDB, however late
  std::vector<std::atomic<std::uint64_t>> bin_puts;
  std::vector<std::atomic<std::uint64_t>> bin_unserved;
  std::uint64_t errors = 0;
  std::string first_error;
};

void writer(const Args& a, Partition& p, int index, const Timeline& tl, double bin_s,
            WriterStats& out) {
  rocksdb::SetPerfLevel(rocksdb::PerfLevel::kEnableTimeExceptForMutex);
  const double rate = a.write_mib * kMiB / (kKeySize + a.value_size);
  const double end_s = a.window_s + a.after_s;
  std::mt19937_64 rng(a.seed * 104729 + static_cast<std::uint64_t>(index));
  std::string value = random_value(rng, a.value_size);
  char key[kKeySize + 1];
  double due = (index % 7) / (7.0 * rate);  // writers out of step
  const rocksdb::WriteOptions wo;
  auto count = [&](double due_s, std::uint64_t us, bool unthrottled) {
    const int phase = due_s < a.window_s ? 0 : 1;
    const bool served = unthrottled && static_cast<double>(us) <= a.served_ms * 1e3;
    out.unthrottled[phase] += unthrottled ? 1 : 0;
    out.lat[phase].add(us);
    ++out.puts[phase];
    out.served[phase] += served ? 1 : 0;
    const auto b = std::min(out.bin_puts.size() - 1, static_cast<std::size_t>(due_s / bin_s));
    out.bin_puts[b].fetch_add(1, std::memory_order_relaxed);
    if (!served) out.bin_unserved[b].fetch_add(1, std::memory_order_relaxed);
  };
  for (std::uint64_t n = 0;; ++n, due += 1.0 / rate) {
    if (due >= end_s) break;
    if (Clock::now() < tl.at(due)) std::this_thread::sleep_until(tl.at(due));
    if (tl.since(Clock::now()) >= end_s) {
      // Behind past the end: the puts due and never issued are unserved, with the wait
      // they had when the run ended (a lower bound).
      for (; due < end_s; due += 1.0 / rate) {
        count(due, static_cast<std::uint64_t>((end_s - due) * 1e6), false);
      }
      break;
    }
    encode_key(rng() % (a.items * 2), key);
    std::memcpy(value.data(), &n, sizeof n);
    const bool stalled_before = p.stall->condition() != 0;
    rocksdb::get_perf_context()->Reset();
    const rocksdb::Status s = p.db->Put(wo, rocksdb::Slice(key, kKeySize), value);
    const double done = tl.since(Clock::now());
    if (!s.ok()) {
      if (out.errors++ == 0) out.first_error = s.ToString();
      continue;
    }
    const bool unthrottled = !stalled_before && p.stall->condition() == 0 &&
                             rocksdb::get_perf_context()->write_delay_time == 0;
    count(due, static_cast<std::uint64_t>(std::max(0.0, done - due) * 1e6), unthrottled);
  }
  rocksdb::SetPerfLevel(rocksdb::PerfLevel::kDisable);
}

// The bytes of channel `channel` of the stage (cumulative).
std::uint64_t channel_bytes(const sluice::Stage& stage, const std::string& channel) {
  const sluice::StageStats st = stage.totals();
  for (const auto& c : st.channels) {
    if (c.name == channel) return c.total.bytes;
  }
  return 0;
}

// A stage without rules: the DBs open through it unthrottled (opening reads every table's
// tail), and the rules apply from the start of the run.
sluice::StatusOr<std::unique_ptr<sluice::Stage>> make_stage(const std::string& name) {
  sluice::StageOptions so;
  so.name = name;
  so.labels["example"] = "flex-bosr";
  return sluice::Stage::create(so);
}

int fail(const std::string& what) {
  std::fprintf(stderr, "sluice-flex-bosr: %s\n", what.c_str());
  return 1;
}

// Whether the options the actuator moves are at their configured values.
bool options_restored(const Partition& p) {
  const rocksdb::Options o = p.db->GetOptions();
  const std::map<std::string, std::string> now = {
      {"max_bytes_for_level_base", std::to_string(o.max_bytes_for_level_base)},
      {"soft_pending_compaction_bytes_limit",
       std::to_string(o.soft_pending_compaction_bytes_limit)},
      {"hard_pending_compaction_bytes_limit",
       std::to_string(o.hard_pending_compaction_bytes_limit)},
      {"disable_auto_compactions", o.disable_auto_compactions ? "true" : "false"},
      {"level0_slowdown_writes_trigger", std::to_string(o.level0_slowdown_writes_trigger)},
      {"level0_stop_writes_trigger", std::to_string(o.level0_stop_writes_trigger)},
      {"level0_file_num_compaction_trigger", std::to_string(o.level0_file_num_compaction_trigger)}};
  for (const auto& [k, v] : p.configured) {
    const auto it = now.find(k);
    if (it != now.end() && it->second != v) return false;
  }
  return true;
}

// What one sample reads of a partition.
struct PartSample {
  std::uint64_t l0 = 0, l1 = 0, l0_bytes = 0, l1_bytes = 0, mem = 0, bg_bytes = 0;
  int stall = 0;
  std::string state = "normal";
};

PartSample sample_part(const Partition& p) {
  PartSample s;
  rocksdb::ColumnFamilyMetaData m;
  p.db->GetColumnFamilyMetaData(&m);
  if (!m.levels.empty()) {
    s.l0 = m.levels[0].files.size();
    s.l0_bytes = m.levels[0].size;
  }
  if (m.levels.size() > 1) {
    s.l1 = m.levels[1].files.size();
    s.l1_bytes = m.levels[1].size;
  }
  p.db->GetIntProperty("rocksdb.cur-size-all-mem-tables", &s.mem);
  s.bg_bytes = channel_bytes(*p.stage, "bg");
  s.stall = p.stall->condition();
  if (p.actuator) {
    // The gate's state (lock-free; the actuator's own account waits while it runs an
    // intra-L0 compaction), and "deferred" while the gate reads normal but an option
    // the actuator moves is not yet back at its configured value.
    s.state = std::string(sluice::deferral_state_name(p.gate->state(*p.gate_part)));
    if (s.state == "normal" && !options_restored(p)) s.state = "restoring";
  }
  return s;
}

int run(const Args& a) {
  std::ofstream out(a.out);
  if (!out) return fail("cannot write " + a.out);
  size_pools(a.partitions);
  auto n = make_stage(a.stage_prefix + "-node");
  if (!n.is_ok()) return fail("node stage: " + n.status().to_string());
  std::unique_ptr<sluice::Stage> node = std::move(n).value();
  std::vector<Partition> parts(static_cast<std::size_t>(a.partitions));
  for (int i = 0; i < a.partitions; ++i) {
    Partition& p = parts[static_cast<std::size_t>(i)];
    p.name = "p" + std::to_string(i);
    auto st = make_stage(a.stage_prefix + "-" + p.name);
    if (!st.is_ok()) return fail(p.name + " stage: " + st.status().to_string());
    p.stage = std::move(st).value();
    rocksdb::Options o = partition_options(a);
    rb::AttachOptions ao;
    ao.tenants.db_tenant = static_cast<std::uint32_t>(i + 1);
    ao.node_stage = node.get();
    auto b = rb::Attach(o, *p.stage, ao);
    if (!b.is_ok()) return fail(p.name + " attach: " + b.status().to_string());
    p.binding = std::move(b).value();
    p.stats = rocksdb::CreateDBStatistics();
    o.statistics = p.stats;
    o.listeners.push_back(p.stall);
    if (a.deferral) {
      p.wake = std::make_shared<rb::DeferralWakeListener>();
      o.listeners.push_back(p.wake);
    }
    const std::string path = a.work + "/" + p.name;
    fs::remove_all(path);
    std::error_code ec;
    fs::copy(a.data + "/" + p.name, path, fs::copy_options::recursive, ec);
    if (ec) return fail("copy " + a.data + "/" + p.name + ": " + ec.message());
    rocksdb::DB* raw = nullptr;
    const rocksdb::Status s = rocksdb::DB::Open(o, path, &raw);
    if (!s.ok()) return fail("open " + path + ": " + s.ToString());
    p.db.reset(raw);
    if (auto r = sluice::bench::apply_rules_file(*p.stage, a.partition_rules); !r.is_ok()) {
      return fail(p.name + " rules: " + r.to_string());
    }
    if (a.deferral) {
      auto g = rb::DeferralActuator::find_gate(*p.stage, "bg", "deferral");
      if (!g.is_ok()) return fail(p.name + ": " + g.status().to_string());
      p.gate = std::move(g).value();
      auto gp = p.gate->partition(p.name);
      if (!gp.is_ok()) return fail(p.name + ": " + gp.status().to_string());
      p.gate_part = gp.value();
      rb::DeferralActuatorOptions dao;
      dao.gate = p.gate;
      dao.families = {{p.db->DefaultColumnFamily(), p.name}};
      auto act = rb::DeferralActuator::start(p.db.get(), std::move(dao));
      if (!act.is_ok()) return fail(p.name + " actuator: " + act.status().to_string());
      p.actuator = std::move(act).value();
      p.configured = p.actuator->configured()[p.name];
      p.wake->attach(p.actuator.get());
    }
  }
  if (auto r = sluice::bench::apply_rules_file(*node, a.node_rules); !r.is_ok()) {
    return fail("node rules: " + r.to_string());
  }
  std::unique_ptr<sluice::ControlClient> node_client;
  if (!a.socket.empty()) {
    sluice::ControlClientOptions co;
    co.socket_path = a.socket;
    for (auto& p : parts) {
      auto c = sluice::ControlClient::start(*p.stage, co);
      if (!c.is_ok()) return fail("control client: " + c.status().to_string());
      p.client = std::move(c).value();
    }
    auto c = sluice::ControlClient::start(*node, co);
    if (!c.is_ok()) return fail("control client: " + c.status().to_string());
    node_client = std::move(c).value();
    // Every stage connected (5 s at most); a policy that sends no rules at its first
    // step (compaction-deferral while nothing is short) is not waited for.
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    auto all = [&] {
      for (const auto& p : parts) {
        if (p.client->counters().connects == 0) return false;
      }
      return node_client->counters().connects != 0;
    };
    while (!all() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!all()) return fail("the stages did not all connect to " + a.socket + " within 5 s");
  }

  Timeline tl;
  const double bin_s = a.bin_ms / 1e3;
  const double end_s = a.window_s + a.after_s;
  const auto bins = static_cast<std::size_t>(std::ceil(end_s / bin_s - 1e-9));
  std::vector<WriterStats> ws(parts.size());
  for (auto& w : ws) {
    w.bin_puts = std::vector<std::atomic<std::uint64_t>>(bins);
    w.bin_unserved = std::vector<std::atomic<std::uint64_t>>(bins);
  }
  tl.t0 = Clock::now();
  const double t0_unix_s =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  json cfg = {{"type", "config"},
              {"setup", a.setup},
              {"tag", a.tag},
              {"partitions", a.partitions},
              {"items", a.items},
              {"value_size", a.value_size},
              {"write_mib", a.write_mib},
              {"window_s", a.window_s},
              {"after_s", a.after_s},
              {"after_mib", a.after_mib},
              {"memtable_kib", a.memtable_kib},
              {"l0_trigger", a.l0_trigger},
              {"l0_slowdown", a.l0_slowdown},
              {"l0_stop", a.l0_stop},
              {"bin_ms", a.bin_ms},
              {"served_ms", a.served_ms},
              {"deferral", a.deferral},
              {"daemon", !a.socket.empty()},
              {"t0_unix_s", t0_unix_s}};
  out << cfg.dump() << "\n";
  out.flush();  // the driver reads t0 from it to time the policy's change

  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    threads.emplace_back(writer, std::cref(a), std::ref(parts[i]), static_cast<int>(i),
                         std::cref(tl), bin_s, std::ref(ws[i]));
  }
  auto rate_rule = [](const char* channel, double mib) {
    return json::array({{{"rule", "configure"},
                         {"channel", channel},
                         {"object", channel},
                         {"config", {{"rate", static_cast<std::int64_t>(mib * kMiB)}}}}})
        .dump();
  };
  const std::string node_rate_rule = rate_rule("node", a.after_mib);
  const std::string bg_rate_rule = rate_rule("bg", a.after_bg_mib);
  bool raised = false;
  double recovery_s = -1;
  std::uint64_t node_prev = channel_bytes(*node, "node");
  std::vector<std::uint64_t> bg_prev(parts.size(), 0);
  for (std::size_t i = 0; i < parts.size(); ++i) bg_prev[i] = channel_bytes(*parts[i].stage, "bg");
  std::string first_error;
  for (std::size_t b = 0; b < bins; ++b) {
    const double t_end = std::min(end_s, bin_s * static_cast<double>(b + 1));
    // The bandwidth returns at the window's end (a sample boundary or within one).
    if (!raised && t_end > a.window_s) {
      std::this_thread::sleep_until(tl.at(a.window_s));
      if (auto st = node->apply_text(node_rate_rule); !st.is_ok()) {
        first_error = "raising the node bucket: " + st.to_string();
      }
      for (auto& p : parts) {
        if (a.after_bg_mib <= 0) break;
        if (auto st = p.stage->apply_text(bg_rate_rule); !st.is_ok()) {
          first_error = "raising " + p.name + "'s bg bucket: " + st.to_string();
        }
      }
      raised = true;
    }
    std::this_thread::sleep_until(tl.at(t_end));
    // "at": when the sample was taken (a late one says the monitor fell behind).
    json line = {{"type", "bin"}, {"t", t_end}, {"at", tl.since(Clock::now())}};
    json l0 = json::array(), l1 = json::array(), l0b = json::array(), l1b = json::array(),
         mem = json::array(), stall = json::array(), state = json::array(), puts = json::array(),
         unserved = json::array(), bg = json::array();
    bool recovered = true;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const PartSample s = sample_part(parts[i]);
      l0.push_back(s.l0);
      l1.push_back(s.l1);
      l0b.push_back(s.l0_bytes);
      l1b.push_back(s.l1_bytes);
      mem.push_back(s.mem);
      stall.push_back(s.stall);
      state.push_back(s.state);
      puts.push_back(ws[i].bin_puts[b].load(std::memory_order_relaxed));
      unserved.push_back(ws[i].bin_unserved[b].load(std::memory_order_relaxed));
      bg.push_back(s.bg_bytes - bg_prev[i]);
      bg_prev[i] = s.bg_bytes;
      recovered = recovered && s.state == "normal" && s.stall == 0 &&
                  s.l0 < static_cast<std::uint64_t>(a.l0_slowdown);
    }
    const std::uint64_t node_now = channel_bytes(*node, "node");
    line.update({{"l0", l0},
                 {"l1", l1},
                 {"l0_bytes", l0b},
                 {"l1_bytes", l1b},
                 {"mem_bytes", mem},
                 {"stall", stall},
                 {"state", state},
                 {"puts", puts},
                 {"unserved", unserved},
                 {"bg_bytes", bg},
                 {"node_bytes", node_now - node_prev}});
    node_prev = node_now;
    // Recovered from the first sample after which every later one meets the conditions.
    if (raised && !recovered) recovery_s = -1;
    if (raised && recovery_s < 0 && recovered) recovery_s = t_end - a.window_s;
    out << line.dump() << "\n";
  }
  for (auto& t : threads) t.join();

  json end = {{"type", "end"}, {"tag", a.tag}, {"partitions", json::array()}};
  std::uint64_t errors = first_error.empty() ? 0 : 1;
  const double put_bytes = kKeySize + a.value_size;
  std::uint64_t transitions = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Partition& p = parts[i];
    const WriterStats& w = ws[i];
    json e = {{"partition", p.name}};
    const char* phase_name[2] = {"window", "after"};
    for (int ph = 0; ph < 2; ++ph) {
      json ph_j = w.lat[ph].summary_ms();
      ph_j["puts"] = w.puts[ph];
      ph_j["served"] = w.served[ph];
      ph_j["unthrottled"] = w.unthrottled[ph];
      ph_j["bytes"] = static_cast<double>(w.puts[ph]) * put_bytes;
      e[phase_name[ph]] = ph_j;
    }
    e["errors"] = w.errors;
    if (w.errors != 0) e["first_error"] = w.first_error;
    errors += w.errors;
    if (first_error.empty()) first_error = w.first_error;
    e["stall_micros"] = p.stats->getTickerCount(rocksdb::STALL_MICROS);
    e["stalled_s"] = p.stall->stalled_s();
    e["stall_episodes"] = p.stall->episodes();
    if (p.actuator) {
      const auto st = p.actuator->stats()[0];
      e["actuator"] = {{"set_options", st.set_options},
                       {"intra_l0", st.intra_l0},
                       {"intra_l0_files", st.intra_l0_files},
                       {"intra_l0_aborted", st.intra_l0_aborted},
                       {"l0_cap_ends", st.l0_cap_ends},
                       {"applied", sluice::deferral_state_name(st.applied)}};
      const json g = p.gate->collect();
      for (const auto& gp : g["partitions"]) {
        if (gp.value("partition", "") != p.name) continue;
        e["gate"] = {{"held_ms", gp["held_ms"]},
                     {"deferrals", gp["deferrals"]},
                     {"refused", gp["refused"]},
                     {"ended", gp["ended"]},
                     {"state", gp["state"]}};
      }
      e["gate_transitions"] = g.value("transitions_total", 0);
      transitions += g.value("transitions_total", std::uint64_t{0});
    }
    end["partitions"].push_back(e);
  }
  end["recovery_s"] = recovery_s >= 0 ? json(recovery_s) : json(nullptr);
  end["gate_transitions"] = transitions;
  end["errors"] = errors;
  if (!first_error.empty()) end["first_error"] = first_error;
  if (node_client) {
    json c = json::array();
    for (const auto& p : parts) {
      const auto pc = p.client->counters();
      c.push_back({{"rules_applied", pc.rules_applied}, {"rules_rejected", pc.rules_rejected}});
    }
    const auto nc = node_client->counters();
    end["control"] = {
        {"partitions", c},
        {"node", {{"rules_applied", nc.rules_applied}, {"rules_rejected", nc.rules_rejected}}}};
  }
  out << end.dump() << "\n";
  out.flush();

  for (auto& p : parts) p.client.reset();
  node_client.reset();
  for (auto& p : parts) {
    if (p.wake) p.wake->attach(nullptr);
    if (p.actuator) {
      if (auto st = p.actuator->stop(); !st.is_ok() && first_error.empty()) {
        first_error = p.name + " actuator stop: " + st.to_string();
        ++errors;
      }
    }
    p.actuator.reset();
    p.stage->shutdown();  // wake I/O waiting in a bucket
  }
  node->shutdown();
  for (auto& p : parts) {
    p.db->Close().PermitUncheckedError();
    p.db.reset();
    std::error_code ec;
    fs::remove_all(a.work + "/" + p.name, ec);
  }
  if (errors != 0) return fail(std::to_string(errors) + " operations failed: " + first_error);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
  Args a;
  const sluice::bench::Option options[] = {
      {"--preload", &a.preload},
      {"--setup", &a.setup},
      {"--data", &a.data},
      {"--work", &a.work},
      {"--out", &a.out},
      {"--tag", &a.tag},
      {"--partition-rules", &a.partition_rules},
      {"--node-rules", &a.node_rules},
      {"--socket", &a.socket},
      {"--stage-prefix", &a.stage_prefix},
      {"--partitions", &a.partitions},
      {"--items", &a.items},
      {"--value-size", &a.value_size},
      {"--write-mib", &a.write_mib},
      {"--window-s", &a.window_s},
      {"--after-s", &a.after_s},
      {"--after-mib", &a.after_mib},
      {"--after-bg-mib", &a.after_bg_mib},
      {"--served-ms", &a.served_ms},
      {"--memtable-kib", &a.memtable_kib},
      {"--l0-trigger", &a.l0_trigger},
      {"--l0-slowdown", &a.l0_slowdown},
      {"--l0-stop", &a.l0_stop},
      {"--block-cache-mib", &a.block_cache_mib},
      {"--bin-ms", &a.bin_ms},
      {"--seed", &a.seed},
      {"--deferral", &a.deferral, true},
  };
  sluice::bench::parse_options_or_exit(options, argc, argv, kUsage);
  if (!valid(a)) sluice::bench::exit_with_usage(2, kUsage);
  return a.preload.empty() ? run(a) : preload(a);
}
