// sluice-flex-node: one run of examples/flex's experiment `sudden-load` (FlexEngine
// §5.3.1 on Sluice): co-located RocksDB instances ("partitions") in one process, one of
// them idle and then reading at a fixed rate, the others writing, under one setup.
//
//   sluice-flex-node --preload DIR --items N [--value-size B] [--memtable-mib M]
//       Creates the sudden-load partition's data: N items of B bytes, keys in order,
//       settled into the LSM tree (no limiter, no stage). The runs open it read-only in
//       effect (they only read it), so one preload serves every setup of an invocation.
//   sluice-flex-node --setup auto-tuned|static|sluice --data DIR --work DIR --out FILE
//                    [--partition-rules FILE --node-rules FILE [--socket PATH]] ...
//       One run. Partition p0 is DIR (the preload); p1..p{N-1} are new DBs in --work.
//   sluice-flex-node --probe --partition-rules FILE --node-rules FILE
//       Exit 0 when the rules apply to a stage in this build (the object types exist),
//       3 when not (the reason on stdout).
//
// Timeline (s from the start): p0 idle for --idle-s, then --rcu-per-s Zipfian Gets
// (--zipf-theta) for --load-s, open loop: read n is due at idle + n / rate, --readers
// threads take the reads in due order, and a read's latency counts from its due time
// (waiting behind earlier reads included), as a client with a deadline would see it.
// p1..: one writer each, --write-mib MiB/s of puts (16-byte keys, --value-size values,
// WAL on) from the start; p1's rate is multiplied by --change-factor at --change-at-s
// (the change of write load whose background rate the sluice setup must follow).
//
// Setups (the device is tmpfs; what stands in for its bandwidth differs, as stated):
//  - auto-tuned: each DB has RocksDB's GenericRateLimiter, auto-tuned, ceiling
//    --limiter-mib (reads and WAL writes charged at IO_USER; sluice/rocksdb_limiter.h).
//  - static: the same limiter, not tuned, at --limiter-mib.
//  - sluice: each DB on a partition stage of its own (--partition-rules: channels fg
//    and bg, one bucket each), every I/O then on the process's node stage
//    (--node-rules: one bucket at the device's bandwidth, foreground first); with
//    --socket the stages join `sluice serve` (the flex policy sets the buckets' rates).
//
// Output (--out, JSON lines): a config line; one line per bin (--bin-ms): p0's reads
// due and served in the bin and the latency of those due in it (a read never served
// counts with the wait it had when the run ended, a lower bound; "unserved" counts them
// by the bin they were due in), the bytes p0 read from
// the "device", each writer's bytes, each partition's background rate (the bg bucket's,
// or the limiter's), the node bucket's bytes in the bin over the bin's length (sluice)
// or the limiters' summed bytes (baselines); an end line with totals, the node bucket's
// state and the control clients' counters.
//
// Exit status: 0; 1 on a runtime error (DB, stage, rules, a failed Get or Put); 2 on bad
// arguments (the message names the option); 3 from --probe when the rules do not apply.
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
#include "sluice/control_client.h"
#include "sluice/objects/builtin.h"
#include "sluice/rocksdb.h"
#include "sluice/rocksdb_limiter.h"
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
using sluice::examples::flex::Zipfian;

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
  std::string stage_prefix = "flex";
  std::uint64_t items = 200000;
  int value_size = 1024;
  int partitions = 4;
  double idle_s = 10;
  double load_s = 30;
  double rcu_per_s = 3000;
  double zipf_theta = 0.99;
  int readers = 4;
  double write_mib = 1;
  double change_at_s = -1;
  double change_factor = 2;
  double limiter_mib = 0;
  int refill_ms = 100;
  double block_cache_mib = 8;
  double memtable_mib = 4;
  int bin_ms = 1000;
  std::uint64_t seed = 1;
  bool probe = false;
};

constexpr char kUsage[] =
    "usage: sluice-flex-node --preload DIR --items N [--value-size B] [--memtable-mib M]\n"
    "       sluice-flex-node --setup auto-tuned|static|sluice --data DIR --work DIR --out FILE\n"
    "         [--partition-rules FILE --node-rules FILE] [--socket PATH] [--stage-prefix P]\n"
    "         [--tag T] [--items N] [--value-size B] [--partitions N] [--idle-s S]\n"
    "         [--load-s S] [--rcu-per-s R] [--zipf-theta T] [--readers N] [--write-mib M]\n"
    "         [--change-at-s S] [--change-factor X] [--limiter-mib M] [--refill-ms MS]\n"
    "         [--block-cache-mib M] [--memtable-mib M] [--bin-ms MS] [--seed N]\n"
    "       sluice-flex-node --probe --partition-rules FILE --node-rules FILE\n";

bool bad(const char* what) {
  std::fprintf(stderr, "sluice-flex-node: %s\n", what);
  return false;
}

bool valid(const Args& a) {
  if (a.items < 100 || a.items > 100'000'000) return bad("--items: 100..100000000");
  if (a.value_size < 16 || a.value_size > 65536) return bad("--value-size: 16..65536");
  if (!(a.memtable_mib >= 0.25)) return bad("--memtable-mib must be >= 0.25");
  if (!a.preload.empty()) return true;
  if (a.setup != "auto-tuned" && a.setup != "static" && a.setup != "sluice") {
    return bad("--setup must be auto-tuned, static or sluice");
  }
  if (a.data.empty() || a.work.empty() || a.out.empty()) {
    return bad("--data, --work and --out are required");
  }
  if (a.setup == "sluice" && (a.partition_rules.empty() || a.node_rules.empty())) {
    return bad("--setup sluice needs --partition-rules and --node-rules");
  }
  if (a.setup != "sluice" && !(a.limiter_mib > 0)) {
    return bad("--limiter-mib must be > 0 for the RocksDB limiter setups");
  }
  if (a.partitions < 1 || a.partitions > 64) return bad("--partitions: 1..64");
  if (!(a.idle_s >= 0) || !(a.load_s > 0)) return bad("--idle-s >= 0 and --load-s > 0");
  if (!(a.rcu_per_s > 0) || a.rcu_per_s > 1e6) return bad("--rcu-per-s: (0, 1e6]");
  if (!(a.zipf_theta > 0) || a.zipf_theta >= 1) return bad("--zipf-theta: (0, 1)");
  if (a.readers < 1 || a.readers > 64) return bad("--readers: 1..64");
  if (!(a.write_mib >= 0) || !(a.change_factor > 0)) {
    return bad("--write-mib >= 0 and --change-factor > 0");
  }
  if (a.refill_ms < 1 || a.refill_ms > 10000) return bad("--refill-ms: 1..10000");
  if (!(a.block_cache_mib > 0)) return bad("--block-cache-mib must be > 0");
  if (a.bin_ms < 50) return bad("--bin-ms must be >= 50");
  return true;
}

// "user" and the key's 12 low decimal digits, zero-padded (16 bytes, sorted as numbers).
// The options every partition has (the paper's §5.1 shapes, scaled: memtable
// --memtable-mib, at most 4 of them, L0 and L1 compacting into the next level at 4
// memtables' worth).
rocksdb::Options partition_options(const Args& a) {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.compression = rocksdb::kNoCompression;
  const auto memtable = static_cast<std::uint64_t>(a.memtable_mib * kMiB);
  o.write_buffer_size = memtable;
  o.max_write_buffer_number = 4;
  o.level0_file_num_compaction_trigger = 4;
  o.max_bytes_for_level_base = 4 * memtable;
  o.target_file_size_base = memtable;
  o.bytes_per_sync = 1 << 20;  // what a RocksDB limiter would make it anyway: every setup
  o.writable_file_max_buffer_size = 64 << 10;  // I/O in requests well below a bucket's burst
  rocksdb::BlockBasedTableOptions t;
  t.block_size = 4096;
  t.block_cache = rocksdb::NewLRUCache(static_cast<std::size_t>(a.block_cache_mib * kMiB));
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  return o;
}

int preload(const Args& a) {
  fs::remove_all(a.preload);
  rocksdb::Options o = partition_options(a);
  o.write_buffer_size = 64 << 20;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, a.preload, &raw);
  if (!s.ok()) {
    std::fprintf(stderr, "sluice-flex-node: open %s: %s\n", a.preload.c_str(),
                 s.ToString().c_str());
    return 1;
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  std::mt19937_64 rng(a.seed);
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;
  char key[kKeySize + 1];
  for (std::uint64_t i = 0; i < a.items && s.ok(); i += 1000) {
    rocksdb::WriteBatch batch;
    for (std::uint64_t k = i; k < std::min(a.items, i + 1000); ++k) {
      encode_key(k, key);
      s = batch.Put(rocksdb::Slice(key, kKeySize), random_value(rng, a.value_size));
    }
    if (s.ok()) s = db->Write(wo, &batch);
  }
  if (s.ok()) s = db->Flush(rocksdb::FlushOptions());
  if (s.ok()) s = db->CompactRange(rocksdb::CompactRangeOptions(), nullptr, nullptr);
  if (s.ok()) s = db->Close();
  if (!s.ok()) {
    std::fprintf(stderr, "sluice-flex-node: preload: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf(
      "%s\n",
      json{{"type", "preload"}, {"items", a.items}, {"value_size", a.value_size}}.dump().c_str());
  return 0;
}

// One partition: a RocksDB instance with its limiter (baselines) or its stage (sluice).
struct Partition {
  std::string name;
  std::unique_ptr<sluice::Stage> stage;
  rb::Binding binding;
  std::shared_ptr<rocksdb::RateLimiter> limiter;
  std::unique_ptr<rocksdb::DB> db;
  std::unique_ptr<sluice::ControlClient> client;
};

// The object `name` of the stage, cumulative (totals()): bytes and state; null if none.
const sluice::ObjectStats* find_object(const sluice::StageStats& st, const std::string& name) {
  for (const auto& c : st.channels) {
    for (const auto& o : c.objects) {
      if (o.name == name) return &o;
    }
  }
  return nullptr;
}

double state_rate(const sluice::ObjectStats* o) {
  if (o == nullptr || !o->state.is_object()) return -1;
  return o->state.value("rate", -1.0);
}

sluice::StatusOr<std::unique_ptr<sluice::Stage>> make_stage(const std::string& name,
                                                            const std::string& rules) {
  sluice::StageOptions so;
  so.name = name;
  so.labels["example"] = "flex";
  auto created = sluice::Stage::create(so);
  if (!created.is_ok()) return created.status();
  std::unique_ptr<sluice::Stage> stage = std::move(created).value();
  if (auto st = sluice::bench::apply_rules_file(*stage, rules); !st.is_ok()) return st;
  return stage;
}

// Joins the daemon: starts the stage's control client and waits (5 s at most) for the
// daemon's first rules. A stage the policy leaves alone gets none; that is recorded,
// not an error.
sluice::StatusOr<std::unique_ptr<sluice::ControlClient>> join_daemon(sluice::Stage& stage,
                                                                     const std::string& socket) {
  sluice::ControlClientOptions options;
  options.socket_path = socket;
  auto started = sluice::ControlClient::start(stage, options);
  if (!started.is_ok()) return started.status().with_prefix("control client: ");
  std::unique_ptr<sluice::ControlClient> client = std::move(started).value();
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (client->counters().rules_applied == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return client;
}

// The reads of p0 (one reader thread's share) and the writes of one writer.
struct ReaderStats {
  std::vector<Histogram> lat_by_due;       // latency of reads due in each bin
  std::vector<std::uint64_t> done_by_bin;  // reads completed in each bin
  std::uint64_t errors = 0;
  std::uint64_t not_found = 0;
  std::string first_error;
  double abandoned_due = -1;  // the read this thread took and left when the run ended
};
struct WriterStats {
  std::vector<std::uint64_t> bytes_by_bin;  // bytes of puts completed in each bin
  Histogram lat;
  std::uint64_t puts = 0;
  std::uint64_t errors = 0;
  std::string first_error;
};

struct Timeline {
  Clock::time_point t0;
  double bin_s = 1;
  std::size_t bins = 0;
  double end_s = 0;
  std::size_t bin_of(double t) const {
    return std::min(bins - 1, static_cast<std::size_t>(std::max(0.0, t) / bin_s));
  }
  double since(Clock::time_point t) const { return std::chrono::duration<double>(t - t0).count(); }
  Clock::time_point at(double s) const {
    return t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
};

void reader(const Args& a, rocksdb::DB& db, const rocksdb::ReadOptions& ro, const Zipfian& zipf,
            std::atomic<std::uint64_t>& next, const Timeline& tl, int id, ReaderStats& out) {
  std::mt19937_64 rng(a.seed * 7919 + static_cast<std::uint64_t>(id));
  char key[kKeySize + 1];
  std::string value;
  for (;;) {
    const std::uint64_t n = next.fetch_add(1, std::memory_order_relaxed);
    const double due = a.idle_s + static_cast<double>(n) / a.rcu_per_s;
    if (due >= tl.end_s) break;
    if (Clock::now() < tl.at(due)) std::this_thread::sleep_until(tl.at(due));
    if (tl.since(Clock::now()) >= tl.end_s) {  // behind past the end: the run is over
      out.abandoned_due = due;
      break;
    }
    encode_key(zipf.next(rng), key);
    const rocksdb::Status s = db.Get(ro, rocksdb::Slice(key, kKeySize), &value);
    const double done = tl.since(Clock::now());
    if (s.IsNotFound()) {
      ++out.not_found;
    } else if (!s.ok()) {
      if (out.errors++ == 0) out.first_error = s.ToString();
      continue;
    }
    out.lat_by_due[tl.bin_of(due)].add(static_cast<std::uint64_t>((done - due) * 1e6));
    ++out.done_by_bin[tl.bin_of(done)];
  }
}

void writer(const Args& a, rocksdb::DB& db, const rocksdb::WriteOptions& wo, int index,
            bool changes, const Timeline& tl, WriterStats& out) {
  const double put_bytes = kKeySize + a.value_size;
  const double rate0 = a.write_mib * kMiB / put_bytes;
  if (!(rate0 > 0)) return;
  std::mt19937_64 rng(a.seed * 104729 + static_cast<std::uint64_t>(index));
  std::string value = random_value(rng, a.value_size);
  char key[kKeySize + 1];
  double due = (index % 7) / (7.0 * rate0);  // writers out of step
  for (std::uint64_t n = 0;; ++n) {
    const bool changed = changes && a.change_at_s >= 0 && due >= a.change_at_s;
    due += 1.0 / (changed ? rate0 * a.change_factor : rate0);
    if (due >= tl.end_s) break;
    if (Clock::now() < tl.at(due)) std::this_thread::sleep_until(tl.at(due));
    if (tl.since(Clock::now()) >= tl.end_s) break;
    encode_key(rng() % (a.items * 4), key);
    std::memcpy(value.data(), &n, sizeof n);
    const rocksdb::Status s = db.Put(wo, rocksdb::Slice(key, kKeySize), value);
    const double done = tl.since(Clock::now());
    if (!s.ok()) {
      if (out.errors++ == 0) out.first_error = s.ToString();
      continue;
    }
    ++out.puts;
    out.lat.add(static_cast<std::uint64_t>((done - due) * 1e6));
    out.bytes_by_bin[tl.bin_of(done)] += static_cast<std::uint64_t>(put_bytes);
  }
}

// What the monitor samples at the end of each bin (cumulative; differences later).
struct Sample {
  double t = 0;                         // s since t0
  std::vector<double> bg_rate;          // per partition: bg bucket rate / limiter rate
  std::vector<double> fg_rate;          // per partition: fg bucket rate (sluice)
  std::vector<std::uint64_t> fg_bytes;  // per partition: fg bucket / IO_USER bytes
  std::vector<std::uint64_t> bg_bytes;  // per partition: bg bucket / flush+compaction bytes
  std::uint64_t node_bytes = 0;         // node bucket (sluice) or limiters' sum
  json node_state;                      // sluice: the node bucket's collect()
};

Sample sample(const std::vector<Partition>& parts, sluice::Stage* node, const Timeline& tl) {
  Sample m;
  m.t = tl.since(Clock::now());
  for (const auto& p : parts) {
    if (p.stage) {
      const sluice::StageStats st = p.stage->totals();
      const sluice::ObjectStats* fg = find_object(st, "fg");
      const sluice::ObjectStats* bg = find_object(st, "bg");
      m.fg_rate.push_back(state_rate(fg));
      m.bg_rate.push_back(state_rate(bg));
      m.fg_bytes.push_back(fg != nullptr ? fg->total.bytes : 0);
      m.bg_bytes.push_back(bg != nullptr ? bg->total.bytes : 0);
    } else {
      const rb::LimiterState l = rb::ReadLimiter(*p.limiter);
      m.fg_rate.push_back(static_cast<double>(l.bytes_per_second));
      m.bg_rate.push_back(static_cast<double>(l.bytes_per_second));
      m.fg_bytes.push_back(static_cast<std::uint64_t>(l.user_bytes));
      m.bg_bytes.push_back(static_cast<std::uint64_t>(l.high_bytes + l.low_bytes));
      m.node_bytes += static_cast<std::uint64_t>(l.total_bytes);
    }
  }
  if (node != nullptr) {
    const sluice::StageStats st = node->totals();
    if (const sluice::ObjectStats* o = find_object(st, "node"); o != nullptr) {
      m.node_bytes = o->total.bytes;
      m.node_state = o->state;
    }
  }
  return m;
}

int fail(const std::string& what) {
  std::fprintf(stderr, "sluice-flex-node: %s\n", what.c_str());
  return 1;
}

int run(const Args& a) {
  std::ofstream out(a.out);
  if (!out) return fail("cannot write " + a.out);
  const bool sluice_setup = a.setup == "sluice";
  std::unique_ptr<sluice::Stage> node;
  std::unique_ptr<sluice::ControlClient> node_client;
  if (sluice_setup) {
    auto n = make_stage(a.stage_prefix + "-node", a.node_rules);
    if (!n.is_ok()) return fail("node stage: " + n.status().to_string());
    node = std::move(n).value();
  }
  std::vector<Partition> parts(static_cast<std::size_t>(a.partitions));
  for (int i = 0; i < a.partitions; ++i) {
    Partition& p = parts[static_cast<std::size_t>(i)];
    p.name = "p" + std::to_string(i);
    rocksdb::Options o = partition_options(a);
    if (sluice_setup) {
      auto st = make_stage(a.stage_prefix + "-" + p.name, a.partition_rules);
      if (!st.is_ok()) return fail(p.name + " stage: " + st.status().to_string());
      p.stage = std::move(st).value();
      rb::AttachOptions ao;
      ao.tenants.db_tenant = static_cast<std::uint32_t>(i + 1);
      ao.node_stage = node.get();
      auto b = rb::Attach(o, *p.stage, ao);
      if (!b.is_ok()) return fail(p.name + " attach: " + b.status().to_string());
      p.binding = std::move(b).value();
    } else {
      rb::LimiterOptions lo;
      lo.bytes_per_second = static_cast<std::int64_t>(a.limiter_mib * kMiB);
      lo.auto_tuned = a.setup == "auto-tuned";
      lo.refill_period_us = static_cast<std::int64_t>(a.refill_ms) * 1000;
      lo.bytes_per_sync = 1 << 20;
      auto l = rb::UseRocksDbLimiter(o, lo);
      if (!l.is_ok()) return fail(p.name + " limiter: " + l.status().to_string());
      p.limiter = std::move(l).value();
    }
    const std::string path = i == 0 ? a.data : a.work + "/" + p.name;
    if (i != 0) fs::remove_all(path);
    o.create_if_missing = i != 0;
    rocksdb::DB* raw = nullptr;
    const rocksdb::Status s = rocksdb::DB::Open(o, path, &raw);
    if (!s.ok()) return fail("open " + path + ": " + s.ToString());
    p.db.reset(raw);
  }
  if (!a.socket.empty()) {
    for (auto& p : parts) {
      auto c = join_daemon(*p.stage, a.socket);
      if (!c.is_ok()) return fail(c.status().to_string());
      p.client = std::move(c).value();
    }
    auto c = join_daemon(*node, a.socket);
    if (!c.is_ok()) return fail(c.status().to_string());
    node_client = std::move(c).value();
  }

  Timeline tl;
  tl.bin_s = a.bin_ms / 1e3;
  tl.end_s = a.idle_s + a.load_s;
  tl.bins = static_cast<std::size_t>(std::ceil(tl.end_s / tl.bin_s));
  const Zipfian zipf(a.items, a.zipf_theta);
  const Sample first = [&] {
    tl.t0 = Clock::now();
    return sample(parts, node.get(), tl);
  }();
  // The start on the wall clock, to line the daemon's policy reports up with the run.
  const double t0_unix_s =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
      tl.since(Clock::now());
  json cfg = {{"type", "config"},
              {"setup", a.setup},
              {"tag", a.tag},
              {"partitions", a.partitions},
              {"items", a.items},
              {"value_size", a.value_size},
              {"idle_s", a.idle_s},
              {"load_s", a.load_s},
              {"rcu_per_s", a.rcu_per_s},
              {"zipf_theta", a.zipf_theta},
              {"readers", a.readers},
              {"write_mib", a.write_mib},
              {"change_at_s", a.change_at_s},
              {"change_factor", a.change_factor},
              {"limiter_mib", a.limiter_mib},
              {"refill_ms", a.refill_ms},
              {"block_cache_mib", a.block_cache_mib},
              {"memtable_mib", a.memtable_mib},
              {"bin_ms", a.bin_ms},
              {"daemon", !a.socket.empty()},
              {"t0_unix_s", t0_unix_s},
              {"rates_at_start", {{"fg", first.fg_rate}, {"bg", first.bg_rate}}}};
  if (!a.socket.empty()) {
    json applied = json::array();
    for (const auto& p : parts) applied.push_back(p.client->counters().rules_applied);
    cfg["daemon_rules_applied"] = {{"partitions", applied},
                                   {"node", node_client->counters().rules_applied}};
  }
  out << cfg.dump() << "\n";

  // The run.
  const rocksdb::ReadOptions ro = sluice_setup ? rocksdb::ReadOptions() : rb::LimitedReadOptions();
  const rocksdb::WriteOptions wo =
      sluice_setup ? rocksdb::WriteOptions() : rb::LimitedWriteOptions();
  std::atomic<std::uint64_t> next{0};
  std::vector<ReaderStats> rstats(static_cast<std::size_t>(a.readers));
  std::vector<WriterStats> wstats(parts.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < a.readers; ++r) {
    ReaderStats& rs = rstats[static_cast<std::size_t>(r)];
    rs.lat_by_due.assign(tl.bins, Histogram{});
    rs.done_by_bin.assign(tl.bins, 0);
    threads.emplace_back(reader, std::cref(a), std::ref(*parts[0].db), std::cref(ro),
                         std::cref(zipf), std::ref(next), std::cref(tl), r, std::ref(rs));
  }
  for (std::size_t i = 1; i < parts.size(); ++i) {
    wstats[i].bytes_by_bin.assign(tl.bins, 0);
    threads.emplace_back(writer, std::cref(a), std::ref(*parts[i].db), std::cref(wo),
                         static_cast<int>(i), i == 1, std::cref(tl), std::ref(wstats[i]));
  }
  const sluice::bench::CpuTicks ticks0 = sluice::bench::read_cpu_ticks();
  std::vector<Sample> samples;
  samples.push_back(first);
  for (std::size_t b = 0; b < tl.bins; ++b) {
    std::this_thread::sleep_until(tl.at(tl.bin_s * static_cast<double>(b + 1)));
    samples.push_back(sample(parts, node.get(), tl));
  }
  for (auto& t : threads) t.join();
  const sluice::bench::CpuTicks ticks1 = sluice::bench::read_cpu_ticks();
  // Reads due before the end and never served count with the wait they had when the run
  // ended (a lower bound of their latency), in the bin they were due in.
  std::vector<std::uint64_t> unserved(tl.bins, 0);
  auto censor = [&](double due) {
    rstats[0].lat_by_due[tl.bin_of(due)].add(static_cast<std::uint64_t>((tl.end_s - due) * 1e6));
    ++unserved[tl.bin_of(due)];
  };
  for (const auto& rs : rstats) {
    if (rs.abandoned_due >= 0) censor(rs.abandoned_due);
  }
  for (std::uint64_t n = next.load();; ++n) {
    const double due = a.idle_s + static_cast<double>(n) / a.rcu_per_s;
    if (due >= tl.end_s) break;
    censor(due);
  }

  // Per bin.
  const double put_bytes = kKeySize + a.value_size;
  for (std::size_t b = 0; b < tl.bins; ++b) {
    const Sample& m0 = samples[b];
    const Sample& m1 = samples[b + 1];
    const double t = static_cast<double>(b) * tl.bin_s;
    const double due_from = std::max(t, a.idle_s);
    const double due_to = std::min(t + tl.bin_s, tl.end_s);
    Histogram h;
    std::uint64_t served = 0;
    for (const auto& rs : rstats) {
      h.merge(rs.lat_by_due[b]);
      served += rs.done_by_bin[b];
    }
    json line = {{"type", "bin"},
                 {"t", t},
                 {"elapsed_s", m1.t - m0.t},
                 {"requested", due_to > due_from ? (due_to - due_from) * a.rcu_per_s : 0.0},
                 {"served", served},
                 {"unserved", unserved[b]},
                 {"latency", h.summary_ms()},
                 {"p0_fg_bytes", m1.fg_bytes[0] - m0.fg_bytes[0]},
                 {"fg_rate", m1.fg_rate},
                 {"bg_rate", m1.bg_rate},
                 {"node_bytes", m1.node_bytes - m0.node_bytes}};
    json wbytes = json::array();
    json bg_bytes = json::array();
    for (std::size_t i = 0; i < parts.size(); ++i) {
      wbytes.push_back(i == 0 ? 0 : wstats[i].bytes_by_bin[b]);
      bg_bytes.push_back(m1.bg_bytes[i] - m0.bg_bytes[i]);
    }
    line["write_bytes"] = wbytes;
    line["bg_bytes"] = bg_bytes;
    if (!m1.node_state.is_null()) line["node_state"] = m1.node_state;
    out << line.dump() << "\n";
  }
  Histogram all;
  std::uint64_t errors = 0;
  std::uint64_t not_found = 0;
  std::string first_error;
  for (const auto& rs : rstats) {
    for (const auto& h : rs.lat_by_due) all.merge(h);
    errors += rs.errors;
    not_found += rs.not_found;
    if (first_error.empty()) first_error = rs.first_error;
  }
  json end = {{"type", "end"},         {"tag", a.tag},           {"reads", all.summary_ms()},
              {"read_errors", errors}, {"not_found", not_found}, {"writers", json::array()}};
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const WriterStats& w = wstats[i];
    json e = w.lat.summary_ms();
    e.update({{"partition", parts[i].name},
              {"puts", w.puts},
              {"bytes", static_cast<double>(w.puts) * put_bytes},
              {"errors", w.errors}});
    if (w.errors != 0) e["first_error"] = w.first_error;
    errors += w.errors;
    if (first_error.empty()) first_error = w.first_error;
    end["writers"].push_back(e);
  }
  end["errors"] = errors;
  if (!first_error.empty()) end["first_error"] = first_error;
  end["node_state"] = samples.back().node_state;
  end["host_steal_pct"] = sluice::bench::steal_pct(ticks0, ticks1);
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
    if (p.stage) p.stage->shutdown();  // wake I/O waiting in a bucket
  }
  if (node) node->shutdown();
  for (auto& p : parts) {
    if (p.db) p.db->Close().PermitUncheckedError();
    p.db.reset();
  }
  for (std::size_t i = 1; i < parts.size(); ++i) {
    std::error_code ec;
    fs::remove_all(a.work + "/" + parts[i].name, ec);
  }
  if (errors != 0) return fail(std::to_string(errors) + " operations failed: " + first_error);
  return 0;
}

int probe(const Args& a) {
  if (a.partition_rules.empty() || a.node_rules.empty()) {
    std::fprintf(stderr, "sluice-flex-node: --probe needs --partition-rules and --node-rules\n");
    return 2;
  }
  bool ok = true;
  for (const auto* rules : {&a.partition_rules, &a.node_rules}) {
    auto st = make_stage("probe", *rules);
    if (!st.is_ok()) {
      std::printf("rules: %s\n", st.status().to_string().c_str());
      ok = false;
    }
  }
  return ok ? 0 : 3;
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
      {"--items", &a.items},
      {"--value-size", &a.value_size},
      {"--partitions", &a.partitions},
      {"--idle-s", &a.idle_s},
      {"--load-s", &a.load_s},
      {"--rcu-per-s", &a.rcu_per_s},
      {"--zipf-theta", &a.zipf_theta},
      {"--readers", &a.readers},
      {"--write-mib", &a.write_mib},
      {"--change-at-s", &a.change_at_s},
      {"--change-factor", &a.change_factor},
      {"--limiter-mib", &a.limiter_mib},
      {"--refill-ms", &a.refill_ms},
      {"--block-cache-mib", &a.block_cache_mib},
      {"--memtable-mib", &a.memtable_mib},
      {"--bin-ms", &a.bin_ms},
      {"--seed", &a.seed},
      {"--probe", &a.probe, true},
  };
  sluice::bench::parse_options_or_exit(options, argc, argv, kUsage);
  if (a.probe) return probe(a);
  if (!valid(a)) sluice::bench::exit_with_usage(2, kUsage);
  return a.preload.empty() ? run(a) : preload(a);
}
