// sluice-bench-rocksdb: the RocksDB binding's overhead as paired ratios in one process.
//
// Two databases in the same process, same options, same key sequence: "plain" (RocksDB
// as is) and "sluice" (the binding attached, on a stage whose rules route every origin
// to a channel of its own with a noop object: the pass-through stage of
// bench/rocksdb_overhead.sh).
//
// Interleaving. The foreground thread runs --pairs block pairs; in each, both databases
// do the same --block-ops operations (same keys, same order), interleaved in runs of
// --interleave operations in ABBA order: with the default of 1, plain, sluice, sluice,
// plain, plain, sluice, ... one operation at a time. So a slowdown that lasts several
// operations (a compaction on the other core, a neighbour's cache traffic) hits both
// variants alike, a single stall (the vCPU descheduled) lands on one operation of either
// variant with equal chance rather than on a whole block of one, and the ABBA order
// cancels the first/second position effect (the second of two consecutive operations
// finds RocksDB's shared code warm). --interleave equal to --block-ops is the block
// method: a whole block on one database, then on the other (stalls shorter than a block
// land on one variant only, enough to make its p99 ratios swing from 0.99 to 1.41).
//
// Timing. One steady_clock read after each operation; an operation's latency is the time
// since the previous read (the operation plus the loop's key lookup and one clock read,
// about 30 ns with the TSC clocksource here: the same for both variants, so it dilutes a
// ratio by about 1% of itself, e.g. a true 2.0% shows as 1.98%). One clock read per
// operation rather than two keeps that constant small; timing blocks separately from
// operations would need the blocks to be one variant's alone, which is what the fine
// interleaving removes.
//
// Throughput: per block pair, sluice/plain of (operations / summed latencies of that
// variant's operations in the block), both taken within the same milliseconds on the same
// CPU, so noise slower than an operation cancels out; reported as min, quartiles, median
// with its 95% confidence interval (order statistics of the per-pair ratios), max.
//
// Tail: exact per-operation latencies (ns, no histogram buckets). p99 per variant is the
// nearest-rank quantile over all of that variant's operations; the p99 ratio's 95%
// interval is a paired block bootstrap: resample the block pairs with replacement
// (kBootstrap resamples, fixed seed), recompute both p99s and their ratio from the
// resampled pairs, take the 2.5% and 97.5% points. Resampling whole block pairs keeps
// what happens close in time together: the serial correlation of latencies inside a block
// (a stall slows a run of operations) and the pairing of the two variants (a stall that
// hits both stays in both), so the interval reflects how much the p99 ratio would move if
// the stalls had fallen on other blocks. Each variant's p99 gets a percentile interval
// the same way; p50 is reported as a point estimate.
//
// Workloads, in the shape of db_bench's (16-byte keys, 100-byte values, uniform keys):
//   fillrandom        Put of random keys (WAL on, not synced), starting from empty DBs
//   readrandom        Get of random keys of a DB prefilled with --keys keys
//   readwhilewriting  readrandom while one writer thread Puts random keys into both DBs
//                     alternately (ABBA), so that both see the same write load whatever
//                     the interleaving (db_bench's writer writes the DB being read)
//
// The A/A control (--aa): the same run with neither database attached. Two plain databases
// still differ (which was opened first, where their memory landed, which one's
// background jobs the shared thread pool runs first); the ratios it reports are that
// bias, and the binding's ratios are read against them, measured on the same machine
// minutes apart. It shows one here: readrandom's p99 is 6-22% higher in the second slot,
// whichever database was opened first. --swap puts the bound database in the first slot,
// so that the slot's bias counts against plain RocksDB; runs in both slots cancel it.
// (one_op<0> and one_op<1> are slots: with --swap, one_op<0> runs the bound database.)
//
// Output: one JSON line per workload, then a table.
//
// Profiling: each variant's operations go through their own function (one_op<0> for
// plain, one_op<1> for sluice), so that callgrind's inclusive cost per call of each is
// the instructions per operation of that variant, e.g.
//   valgrind --tool=callgrind --toggle-collect='*one_op<1>*'
//     sluice-bench-rocksdb --workloads readrandom --quick
//
// --node: the bound database's I/O is enforced on a second pass-through stage after its
// own (FsOptions::node_stage, the node level of two-level admission): the ratios are then
// the cost of both levels; read them against a run without --node.
//
// Usage: sluice-bench-rocksdb [--dir DIR] [--pairs N] [--block-ops N] [--interleave N]
//                             [--keys N] [--workloads a,b,c] [--quick] [--aa] [--swap]
//                             [--node]
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <nlohmann/json.hpp>

#include "host_steal.h"
#include "rocksdb_rules.h"
#include "sluice/objects/builtin.h"
#include "sluice/rocksdb.h"
#include "sluice/stage.h"
#include "support/cli.h"
#include "support/percentile.h"
#include "support/rocksdb_open.h"

namespace {

namespace rdb = ::rocksdb;
using sluice::bench::percentile;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kKeySize = 16;
constexpr std::size_t kValueSize = 100;

constexpr int kBootstrap = 1000;                    // resamples for the p99 intervals
constexpr std::uint64_t kBootstrapSeed = 20261121;  // fixed: the same data, the same interval

// db_bench-like keys: the number in 16 decimal digits, zero-padded.
void encode_key(std::uint64_t k, char* out) {
  for (std::size_t i = kKeySize; i-- > 0; k /= 10) out[i] = static_cast<char>('0' + k % 10);
}

struct Db {
  std::string name;
  std::unique_ptr<rdb::DB> db;
  sluice::rocksdb_binding::Binding binding;  // empty for plain
  std::vector<std::uint64_t> latency_ns;     // every recorded operation, block after block
  std::vector<double> ops_per_s;             // per block
};

std::unique_ptr<rdb::DB> open_db(const std::string& path, rdb::Options options) {
  options.create_if_missing = true;
  options.compression = rdb::kNoCompression;
  std::unique_ptr<rdb::DB> db = sluice::bench::open_db(options, path, "sluice-bench-rocksdb: ");
  if (!db) std::exit(1);
  return db;
}

enum class Workload { kFill, kRead, kReadWhileWriting };

struct Args {
  std::string dir = "/dev/shm/sluice-bench-rocksdb";
  int pairs = 1500;
  int block_ops = 500;
  int interleave = 1;
  std::uint64_t keys = 500'000;
  bool aa = false;    // A/A control: neither database gets the binding
  bool swap = false;  // the bound database in the first slot
  bool node = false;  // the bound database also enforced on a node stage (two levels)
  std::vector<std::string> workloads = {"fillrandom", "readrandom", "readwhilewriting"};
};

// One operation on variant V (0 plain, 1 sluice): a function of its own per variant so
// that a profiler can tell the two apart (see the file comment). noipa, not noinline:
// GCC's identical-code folding (-fipa-icf, on at -O2) would make one_op<1> an alias of
// one_op<0>.
template <int V>
[[gnu::noipa]] void one_op(rdb::DB& db, Workload w, const char* key, const std::string& value,
                           std::string* got) {
  if (w == Workload::kFill) {
    db.Put(rdb::WriteOptions(), rdb::Slice(key, kKeySize), value).PermitUncheckedError();
  } else {
    db.Get(rdb::ReadOptions(), rdb::Slice(key, kKeySize), got).PermitUncheckedError();
  }
}

// One block pair: the `keys.size() / kKeySize` operations on each database, interleaved in
// runs of `run` operations, ABBA by runs (`run_pair` counts run pairs across blocks so
// that the order keeps alternating when a block holds one run pair). Each operation is
// timed from the previous clock read; `record` keeps the latencies.
void run_block(std::array<Db, 2>& dbs, Workload w, const std::vector<char>& keys, int run,
               std::uint64_t& run_pair, const std::string& value, bool record) {
  const int n = static_cast<int>(keys.size() / kKeySize);
  std::array<int, 2> next{};
  std::array<std::uint64_t, 2> total_ns{};
  std::string got;
  auto last = Clock::now();
  while (next[0] < n || next[1] < n) {
    const int first = (run_pair++ & 1) ? 1 : 0;
    for (int k = 0; k < 2; ++k) {
      const int i = k == 0 ? first : 1 - first;
      Db& d = dbs[static_cast<std::size_t>(i)];
      const int end = std::min(n, next[i] + run);
      for (; next[i] < end; ++next[i]) {
        const char* key = keys.data() + static_cast<std::size_t>(next[i]) * kKeySize;
        if (i == 0) {
          one_op<0>(*d.db, w, key, value, &got);
        } else {
          one_op<1>(*d.db, w, key, value, &got);
        }
        const auto now = Clock::now();
        const auto ns = static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(now - last).count());
        last = now;
        total_ns[i] += ns;
        if (record) d.latency_ns.push_back(ns);  // capacity reserved: no reallocation here
      }
    }
  }
  if (record) {
    for (int i = 0; i < 2; ++i) {
      dbs[i].ops_per_s.push_back(n / (static_cast<double>(total_ns[i]) * 1e-9));
    }
  }
}

// The writer of readwhilewriting: Puts into both databases, alternately in ABBA order
// (the same key into each), until `stop`.
void writer_loop(std::array<Db, 2>& dbs, const std::atomic<bool>& stop, std::uint64_t keys,
                 std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint64_t> pick(0, keys - 1);
  const std::string value(kValueSize, 'w');
  char key[kKeySize];
  for (std::uint64_t j = 0; !stop.load(std::memory_order_relaxed); ++j) {
    encode_key(pick(rng), key);
    const std::size_t first = (j & 1) ? 1 : 0;
    for (std::size_t i : {first, 1 - first}) {
      dbs[i].db->Put(rdb::WriteOptions(), rdb::Slice(key, kKeySize), value).PermitUncheckedError();
    }
  }
}

// One variant's latencies arranged for quantiles of resampled blocks.
class Tail {
 public:
  Tail(std::vector<std::uint64_t> by_block, std::size_t block_ops)
      : n_(block_ops), blocks_(std::move(by_block)) {
    all_ = blocks_;
    std::sort(all_.begin(), all_.end());
    for (std::size_t b = 0; b < blocks_.size(); b += n_) {
      std::sort(blocks_.begin() + static_cast<std::ptrdiff_t>(b),
                blocks_.begin() + static_cast<std::ptrdiff_t>(b + n_));
    }
  }
  std::size_t blocks() const { return blocks_.size() / n_; }

  // Nearest-rank q-quantile of all operations, in ns.
  std::uint64_t quantile(double q) const { return all_[rank(q, all_.size()) - 1]; }

  // The same over the multiset in which block b appears weight[b] times: the smallest
  // latency v of the whole run with at least rank(q) resampled operations <= v (every
  // resampled latency is one of the run's, and the count is monotonic in v).
  std::uint64_t quantile(double q, const std::vector<std::pair<std::size_t, std::uint64_t>>&
                                       weights /* (block, times) */) const {
    std::uint64_t total = 0;
    for (const auto& bw : weights) total += bw.second * n_;
    const std::uint64_t want = rank(q, total);
    std::size_t lo = 0;
    std::size_t hi = all_.size() - 1;
    while (lo < hi) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (at_most(all_[mid], weights) >= want) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return all_[lo];
  }

 private:
  static std::uint64_t rank(double q, std::uint64_t total) {
    return std::clamp<std::uint64_t>(
        static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(total))), 1, total);
  }
  std::uint64_t at_most(std::uint64_t v,
                        const std::vector<std::pair<std::size_t, std::uint64_t>>& weights) const {
    std::uint64_t c = 0;
    for (const auto& [b, times] : weights) {
      const auto first = blocks_.begin() + static_cast<std::ptrdiff_t>(b * n_);
      const auto le = std::upper_bound(first, first + static_cast<std::ptrdiff_t>(n_), v) - first;
      c += times * static_cast<std::uint64_t>(le);
    }
    return c;
  }

  std::size_t n_;
  std::vector<std::uint64_t> blocks_;  // each block's latencies, sorted within the block
  std::vector<std::uint64_t> all_;     // all latencies, sorted
};

struct TailSummary {
  double p50_us[2], p99_us[2], p99_ratio;
  double p99_us_ci[2][2], p99_ratio_ci[2];  // [variant][low, high]
};

// Point estimates from every operation; 95% percentile intervals from a paired block
// bootstrap (the same resampled block pairs for both variants).
TailSummary tail_summary(const std::array<Db, 2>& dbs, std::size_t block_ops) {
  const std::array<Tail, 2> tails = {Tail(dbs[0].latency_ns, block_ops),
                                     Tail(dbs[1].latency_ns, block_ops)};
  TailSummary t{};
  for (int i = 0; i < 2; ++i) {
    t.p50_us[i] = static_cast<double>(tails[i].quantile(0.5)) / 1e3;
    t.p99_us[i] = static_cast<double>(tails[i].quantile(0.99)) / 1e3;
  }
  t.p99_ratio = t.p99_us[1] / t.p99_us[0];
  const std::size_t nb = tails[0].blocks();
  // Self-check of the resampling quantile: every block once is the whole run.
  std::vector<std::pair<std::size_t, std::uint64_t>> weights;
  for (std::size_t b = 0; b < nb; ++b) weights.emplace_back(b, 1);
  for (int i = 0; i < 2; ++i) {
    if (tails[i].quantile(0.99, weights) != tails[i].quantile(0.99)) {
      std::fprintf(stderr, "sluice-bench-rocksdb: bootstrap quantile disagrees with the sample\n");
      std::exit(1);
    }
  }
  std::mt19937_64 rng(kBootstrapSeed);
  std::uniform_int_distribution<std::size_t> pick(0, nb - 1);
  std::vector<std::uint64_t> times(nb);
  std::array<std::vector<double>, 2> p99;
  std::vector<double> ratio;
  for (int r = 0; r < kBootstrap; ++r) {
    std::fill(times.begin(), times.end(), 0);
    for (std::size_t k = 0; k < nb; ++k) ++times[pick(rng)];
    weights.clear();
    for (std::size_t b = 0; b < nb; ++b) {
      if (times[b] != 0) weights.emplace_back(b, times[b]);
    }
    for (int i = 0; i < 2; ++i) {
      p99[i].push_back(static_cast<double>(tails[i].quantile(0.99, weights)) / 1e3);
    }
    ratio.push_back(p99[1].back() / p99[0].back());
  }
  for (int i = 0; i < 2; ++i) {
    t.p99_us_ci[i][0] = percentile(p99[i], 0.025);
    t.p99_us_ci[i][1] = percentile(p99[i], 0.975);
  }
  t.p99_ratio_ci[0] = percentile(ratio, 0.025);
  t.p99_ratio_ci[1] = percentile(ratio, 0.975);
  return t;
}

nlohmann::json run_workload(const Args& a, const std::string& name, sluice::Stage& stage,
                            sluice::Stage* node) {
  const Workload w = name == "fillrandom"   ? Workload::kFill
                     : name == "readrandom" ? Workload::kRead
                                            : Workload::kReadWhileWriting;
  std::array<Db, 2> dbs;
  // The bound database takes the second slot (opened and prefilled second; ABBA
  // alternates which slot goes first), or with --swap the first; the results are
  // reported by name, whatever the slot.
  dbs[0].name = a.swap ? "sluice" : "plain";
  dbs[1].name = a.swap ? "plain" : "sluice";
  for (auto& d : dbs) {
    const std::string path = a.dir + "/" + name + "-" + d.name;
    std::filesystem::remove_all(path);
    rdb::Options options;
    if (d.name == "sluice" && !a.aa) {
      sluice::rocksdb_binding::AttachOptions ao;
      ao.node_stage = node;
      auto b = sluice::rocksdb_binding::Attach(options, stage, ao);
      if (!b) {
        std::fprintf(stderr, "sluice-bench-rocksdb: attach: %s\n", b.status().message().c_str());
        std::exit(1);
      }
      d.binding = *b;
    }
    d.db = open_db(path, options);
    d.latency_ns.reserve(static_cast<std::size_t>(a.pairs) * static_cast<std::size_t>(a.block_ops));
  }
  const std::string value(kValueSize, 'v');
  if (w != Workload::kFill) {  // prefill both the same way, then settle their trees
    for (auto& d : dbs) {
      for (std::uint64_t i = 0; i < a.keys; i += 1000) {
        rdb::WriteBatch batch;
        char key[kKeySize];
        for (std::uint64_t k = i; k < std::min(a.keys, i + 1000); ++k) {
          encode_key(k, key);
          batch.Put(rdb::Slice(key, kKeySize), value).PermitUncheckedError();
        }
        d.db->Write(rdb::WriteOptions(), &batch).PermitUncheckedError();
      }
      d.db->Flush(rdb::FlushOptions()).PermitUncheckedError();
      d.db->CompactRange(rdb::CompactRangeOptions(), nullptr, nullptr).PermitUncheckedError();
    }
  }
  std::atomic<bool> stop{false};
  std::thread writer;
  if (w == Workload::kReadWhileWriting) {
    writer = std::thread(writer_loop, std::ref(dbs), std::cref(stop), a.keys, 11);
  }
  // Both databases get the same keys in the same order: each block pair's keys come from
  // a generator seeded by the pair's number.
  std::vector<char> keys(static_cast<std::size_t>(a.block_ops) * kKeySize);
  std::uint64_t run_pair = 0;
  const sluice::bench::CpuTicks ticks0 = sluice::bench::read_cpu_ticks();
  for (int p = -2; p < a.pairs; ++p) {  // two warm-up pairs, not recorded
    std::mt19937_64 rng(1000 + static_cast<std::uint64_t>(p + 2));
    std::uniform_int_distribution<std::uint64_t> pick(0, a.keys - 1);
    for (std::size_t k = 0; k < keys.size(); k += kKeySize) encode_key(pick(rng), &keys[k]);
    run_block(dbs, w, keys, a.interleave, run_pair, value, p >= 0);
  }
  const double steal = sluice::bench::steal_pct(ticks0, sluice::bench::read_cpu_ticks());
  stop = true;
  if (writer.joinable()) writer.join();
  if (a.swap) std::swap(dbs[0], dbs[1]);  // from here on, [0] is plain and [1] sluice

  std::vector<double> ratio;
  for (std::size_t i = 0; i < dbs[0].ops_per_s.size(); ++i) {
    ratio.push_back(dbs[1].ops_per_s[i] / dbs[0].ops_per_s[i]);
  }
  // 95% confidence interval of the median from order statistics.
  const double n = static_cast<double>(ratio.size());
  const double half = 0.98 * std::sqrt(n) / n;  // 1.96 * sqrt(n) / 2, as a fraction of n
  const TailSummary t = tail_summary(dbs, static_cast<std::size_t>(a.block_ops));
  nlohmann::json out = {{"workload", name},
                        {"pairs", ratio.size()},
                        {"block_ops", a.block_ops},
                        {"interleave", a.interleave},
                        {"aa_control", a.aa},
                        {"node_stage", a.node},
                        {"sluice_slot", a.swap ? 0 : 1},
                        {"host_steal_pct", steal},
                        {"plain_ops_per_s_median", percentile(dbs[0].ops_per_s, 0.5)},
                        {"sluice_ops_per_s_median", percentile(dbs[1].ops_per_s, 0.5)},
                        {"ratio_min", percentile(ratio, 0)},
                        {"ratio_p25", percentile(ratio, 0.25)},
                        {"ratio_median", percentile(ratio, 0.5)},
                        {"ratio_median_ci95_low", percentile(ratio, 0.5 - half)},
                        {"ratio_median_ci95_high", percentile(ratio, 0.5 + half)},
                        {"ratio_p75", percentile(ratio, 0.75)},
                        {"ratio_max", percentile(ratio, 1)},
                        {"p50_us_plain", t.p50_us[0]},
                        {"p50_us_sluice", t.p50_us[1]},
                        {"p99_us_plain", t.p99_us[0]},
                        {"p99_us_sluice", t.p99_us[1]},
                        {"p99_ratio", t.p99_ratio},
                        {"p99_us_plain_ci95_low", t.p99_us_ci[0][0]},
                        {"p99_us_plain_ci95_high", t.p99_us_ci[0][1]},
                        {"p99_us_sluice_ci95_low", t.p99_us_ci[1][0]},
                        {"p99_us_sluice_ci95_high", t.p99_us_ci[1][1]},
                        {"p99_ratio_ci95_low", t.p99_ratio_ci[0]},
                        {"p99_ratio_ci95_high", t.p99_ratio_ci[1]},
                        {"p99_bootstrap", kBootstrap}};
  for (auto& d : dbs) {
    d.db->Close().PermitUncheckedError();
    d.db.reset();
    std::filesystem::remove_all(a.dir + "/" + name + "-" + d.name);
  }
  return out;
}

constexpr char kUsage[] =
    "usage: sluice-bench-rocksdb [--dir DIR] [--pairs N] [--block-ops N]\n"
    "                            [--interleave N] [--keys N]\n"
    "                            [--workloads fillrandom,readrandom,readwhilewriting]"
    " [--quick] [--aa] [--swap] [--node]\n"
    "Plain RocksDB vs RocksDB with the Sluice binding on a pass-through stage, in\n"
    "one process: the same operations on both, interleaved ABBA in runs of\n"
    "--interleave (default 1); per-block-pair throughput ratios, exact p99s and\n"
    "the p99 ratio with a bootstrap 95% interval.\n"
    "--aa: the A/A control, both databases plain (the \"sluice\" one too): its\n"
    "ratios are the method's own bias, the floor for reading the binding's.\n"
    "--swap: the bound database in the first slot rather than the second;\n"
    "runs in both slots cancel a bias of the slot.\n"
    "--node: the bound database's I/O also enforced on a second pass-through\n"
    "stage, the node level (FsOptions::node_stage): the cost of two levels.\n";

[[noreturn]] void usage(int code) {
  sluice::bench::exit_with_usage(code, kUsage);
}

}  // namespace

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
  Args a;
  // A count is a whole number >= 1.
  auto count = [](auto& out) {
    return [&out](const std::string& v) {
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 1) return false;
      out = static_cast<std::decay_t<decltype(out)>>(n);
      return true;
    };
  };
  using sluice::bench::Option;
  const Option options[] = {
      {"--dir", &a.dir},
      Option::with_value("--pairs", count(a.pairs)),
      Option::with_value("--block-ops", count(a.block_ops)),
      Option::with_value("--interleave", count(a.interleave)),
      Option::with_value("--keys", count(a.keys)),
      Option::flag("--quick",
                   [&a] {
                     a.pairs = 100;
                     a.keys = 50'000;
                   }),
      {"--workloads", &a.workloads, sluice::bench::split_list},
      {"--aa", &a.aa, true},
      {"--swap", &a.swap, true},
      {"--node", &a.node, true},
      Option::flag("--help", [] { usage(0); }),
      Option::flag("-h", [] { usage(0); }),
  };
  const sluice::bench::ParseResult parsed = sluice::bench::parse_options(options, argc, argv);
  switch (parsed.error) {
    case sluice::bench::ParseResult::Error::kNone:
      break;
    case sluice::bench::ParseResult::Error::kBadValue:
      std::fprintf(stderr, "sluice-bench-rocksdb: %s: not a positive integer: %s\n",
                   parsed.option.c_str(), parsed.value.c_str());
      return 2;
    case sluice::bench::ParseResult::Error::kUnknown:
      std::fprintf(stderr, "sluice-bench-rocksdb: unknown argument %s\n", parsed.option.c_str());
      usage(2);
    case sluice::bench::ParseResult::Error::kMissingValue:
      usage(2);
  }
  for (const auto& w : a.workloads) {
    if (w != "fillrandom" && w != "readrandom" && w != "readwhilewriting") {
      std::fprintf(stderr, "sluice-bench-rocksdb: unknown workload '%s'\n", w.c_str());
      return 2;
    }
  }
  std::filesystem::create_directories(a.dir);
  sluice::StageOptions so;
  so.name = "bench-rocksdb";
  auto stage = sluice::Stage::create(so);
  if (!stage) {
    std::fprintf(stderr, "sluice-bench-rocksdb: %s\n", stage.status().message().c_str());
    return 1;
  }
  if (auto s = (*stage)->apply(sluice::bench::per_origin_noop_rules()); !s.is_ok()) {
    std::fprintf(stderr, "sluice-bench-rocksdb: rules: %s\n", s.message().c_str());
    return 1;
  }
  std::unique_ptr<sluice::Stage> node;
  if (a.node) {
    sluice::StageOptions no;
    no.name = "bench-rocksdb-node";
    auto n = sluice::Stage::create(no);
    if (!n || !(*n)->apply(sluice::bench::per_origin_noop_rules()).is_ok()) {
      std::fprintf(stderr, "sluice-bench-rocksdb: cannot set up the node stage\n");
      return 1;
    }
    node = std::move(n).value();
  }
  std::vector<nlohmann::json> results;
  for (const auto& w : a.workloads) {
    results.push_back(run_workload(a, w, **stage, node.get()));
    std::printf("%s\n", results.back().dump().c_str());
    std::fflush(stdout);
  }
  if (a.aa) std::printf("\nA/A control: both databases plain\n");
  if (a.swap) std::printf("\nthe bound database in the first slot\n");
  if (a.node) std::printf("\nthe bound database on two stages (partition, node)\n");
  std::printf("\n%-17s %6s %28s %22s %16s %8s %16s %6s\n", "workload", "pairs",
              "ratio min/median/max", "median 95% CI", "p99 us plain/sl", "p99 x", "p99 x 95% CI",
              "steal%");
  for (const auto& r : results) {
    std::printf(
        "%-17s %6d %8.3f / %7.3f / %7.3f %10.3f - %-9.3f %7.1f / %-7.1f %8.3f %7.3f - %-7.3f "
        "%6.1f\n",
        r["workload"].get<std::string>().c_str(), r["pairs"].get<int>(),
        r["ratio_min"].get<double>(), r["ratio_median"].get<double>(), r["ratio_max"].get<double>(),
        r["ratio_median_ci95_low"].get<double>(), r["ratio_median_ci95_high"].get<double>(),
        r["p99_us_plain"].get<double>(), r["p99_us_sluice"].get<double>(),
        r["p99_ratio"].get<double>(), r["p99_ratio_ci95_low"].get<double>(),
        r["p99_ratio_ci95_high"].get<double>(), r["host_steal_pct"].get<double>());
  }
  return 0;
}
