// sluice-bench-rocksdb: the RocksDB binding's overhead as paired ratios in one process.
//
// Two databases in the same process, same options, same key sequence: "plain" (RocksDB
// as is) and "sluice" (the binding attached, on a stage whose rules route every origin
// to a channel of its own with a noop object: the pass-through stage of
// bench/rocksdb_overhead.sh). The foreground thread runs blocks of --block-ops operations
// on one database, then the same on the other, alternating which goes first (ABBA), for
// --pairs pairs. Each pair gives a throughput ratio sluice/plain measured within a few
// milliseconds on the same CPU, so machine noise that lasts longer than a block (other
// jobs, frequency changes, page-cache state) cancels out; across processes on this
// shared machine it does not (db_bench runs of the same variant differ by up to 1.7x).
//
// Workloads, in the shape of db_bench's (16-byte keys, 100-byte values, uniform keys):
//   fillrandom        Put of random keys (WAL on, not synced), starting from empty DBs
//   readrandom        Get of random keys of a DB prefilled with --keys keys
//   readwhilewriting  readrandom while a writer thread Puts into the same DB (the writer
//                     of a DB runs only during that DB's blocks, as db_bench's does)
//
// Output: one JSON line per workload, then a table. Ratios are per-pair throughput
// sluice/plain: min, quartiles, median with its 95% confidence interval (order
// statistics), max. p99 is over every operation of a variant (log-linear histogram, 1/32
// relative resolution).
//
// Usage: sluice-bench-rocksdb [--dir DIR] [--pairs N] [--block-ops N] [--keys N]
//                             [--workloads a,b,c] [--quick]
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
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <nlohmann/json.hpp>

#include "rocksdb_rules.h"
#include "sluice/rocksdb.h"
#include "sluice/stage.h"

namespace {

namespace rdb = ::rocksdb;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kKeySize = 16;
constexpr std::size_t kValueSize = 100;

// Log-linear latency histogram in ns: 32 sub-buckets per power of two.
class Histogram {
 public:
  void add(std::uint64_t ns) { ++counts_[bucket(ns)]; }
  std::uint64_t quantile(double q) const {
    std::uint64_t total = 0;
    for (auto c : counts_) total += c;
    const auto want = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(total)));
    std::uint64_t seen = 0;
    for (std::size_t b = 0; b < counts_.size(); ++b) {
      seen += counts_[b];
      if (seen >= want && counts_[b] > 0) return upper(b);
    }
    return 0;
  }

 private:
  static constexpr int kSub = 5;  // 2^5 sub-buckets
  static std::size_t bucket(std::uint64_t v) {
    if (v < (1u << kSub)) return v;
    const int msb = 63 - __builtin_clzll(v);
    const std::uint64_t sub = (v >> (msb - kSub)) & ((1u << kSub) - 1);
    return static_cast<std::size_t>((msb - kSub + 1) << kSub) + sub;
  }
  static std::uint64_t upper(std::size_t b) {
    if (b < (1u << kSub)) return b;
    const int msb = static_cast<int>(b >> kSub) + kSub - 1;
    const std::uint64_t sub = b & ((1u << kSub) - 1);
    return ((std::uint64_t{1} << kSub | sub) + 1) << (msb - kSub);
  }
  std::array<std::uint64_t, (64 << kSub)> counts_{};
};

// db_bench-like keys: the number in 16 decimal digits, zero-padded.
void encode_key(std::uint64_t k, char* out) {
  for (std::size_t i = kKeySize; i-- > 0; k /= 10) out[i] = static_cast<char>('0' + k % 10);
}

struct Db {
  std::string name;
  std::unique_ptr<rdb::DB> db;
  sluice::rocksdb_binding::Binding binding;  // empty for plain
  Histogram latency;
  std::vector<double> ops_per_s;  // per block
};

std::unique_ptr<rdb::DB> open_db(const std::string& path, rdb::Options options) {
  options.create_if_missing = true;
  options.compression = rdb::kNoCompression;
  rdb::DB* raw = nullptr;
  const rdb::Status s = rdb::DB::Open(options, path, &raw);
  if (!s.ok()) {
    std::fprintf(stderr, "sluice-bench-rocksdb: open %s: %s\n", path.c_str(), s.ToString().c_str());
    std::exit(1);
  }
  return std::unique_ptr<rdb::DB>(raw);
}

enum class Workload { kFill, kRead, kReadWhileWriting };

struct Args {
  std::string dir = "/dev/shm/sluice-bench-rocksdb";
  int pairs = 1500;
  int block_ops = 500;
  std::uint64_t keys = 500'000;
  std::vector<std::string> workloads = {"fillrandom", "readrandom", "readwhilewriting"};
};

// One block of `n` operations on `d`, timed as a whole (throughput) and per operation.
void run_block(Db& d, Workload w, int n, std::uint64_t keys, std::mt19937_64& rng,
               const std::string& value) {
  std::uniform_int_distribution<std::uint64_t> pick(0, keys - 1);
  char key[kKeySize];
  std::string got;
  rdb::WriteOptions wo;
  rdb::ReadOptions ro;
  const auto t0 = Clock::now();
  auto last = t0;
  for (int i = 0; i < n; ++i) {
    encode_key(pick(rng), key);
    if (w == Workload::kFill) {
      d.db->Put(wo, rdb::Slice(key, kKeySize), value).PermitUncheckedError();
    } else {
      d.db->Get(ro, rdb::Slice(key, kKeySize), &got).PermitUncheckedError();
    }
    const auto now = Clock::now();
    d.latency.add(static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - last).count()));
    last = now;
  }
  d.ops_per_s.push_back(n / std::chrono::duration<double>(last - t0).count());
}

// The writer of readwhilewriting: Puts into `d` while `active` is set.
void writer_loop(Db& d, const std::atomic<bool>& active, const std::atomic<bool>& stop,
                 std::uint64_t keys, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint64_t> pick(0, keys - 1);
  const std::string value(kValueSize, 'w');
  char key[kKeySize];
  while (!stop.load(std::memory_order_relaxed)) {
    if (!active.load(std::memory_order_acquire)) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      continue;
    }
    encode_key(pick(rng), key);
    d.db->Put(rdb::WriteOptions(), rdb::Slice(key, kKeySize), value).PermitUncheckedError();
  }
}

double order_stat(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(
      std::clamp(q * static_cast<double>(v.size() - 1), 0.0, static_cast<double>(v.size() - 1)));
  return v[i];
}

nlohmann::json run_workload(const Args& a, const std::string& name, sluice::Stage& stage) {
  const Workload w = name == "fillrandom"   ? Workload::kFill
                     : name == "readrandom" ? Workload::kRead
                                            : Workload::kReadWhileWriting;
  std::array<Db, 2> dbs;
  dbs[0].name = "plain";
  dbs[1].name = "sluice";
  for (auto& d : dbs) {
    const std::string path = a.dir + "/" + name + "-" + d.name;
    std::filesystem::remove_all(path);
    rdb::Options options;
    if (d.name == "sluice") {
      auto b = sluice::rocksdb_binding::Attach(options, stage);
      if (!b) {
        std::fprintf(stderr, "sluice-bench-rocksdb: attach: %s\n", b.status().message().c_str());
        std::exit(1);
      }
      d.binding = *b;
    }
    d.db = open_db(path, options);
  }
  const std::string value(kValueSize, 'v');
  if (w != Workload::kFill) {  // prefill both the same way, then settle their trees
    for (auto& d : dbs) {
      std::mt19937_64 rng(7);
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
  std::array<std::atomic<bool>, 2> active{};
  std::vector<std::thread> writers;
  if (w == Workload::kReadWhileWriting) {
    for (int i = 0; i < 2; ++i) {
      writers.emplace_back(writer_loop, std::ref(dbs[i]), std::cref(active[i]), std::cref(stop),
                           a.keys, 11);
    }
  }
  // The same key sequence for both: each pair's two blocks draw from generators seeded
  // alike.
  for (int p = -2; p < a.pairs; ++p) {  // two warm-up pairs, not recorded
    const int first = (p & 1) ? 1 : 0;
    for (int k = 0; k < 2; ++k) {
      const int i = k == 0 ? first : 1 - first;
      std::mt19937_64 rng(1000 + static_cast<std::uint64_t>(p + 2));
      active[i].store(true, std::memory_order_release);
      run_block(dbs[i], w, a.block_ops, a.keys, rng, value);
      active[i].store(false, std::memory_order_release);
    }
    if (p < 0) {
      for (auto& d : dbs) {
        d.ops_per_s.clear();
        d.latency = Histogram();
      }
    }
  }
  stop = true;
  for (auto& t : writers) t.join();

  std::vector<double> ratio;
  for (std::size_t i = 0; i < dbs[0].ops_per_s.size(); ++i) {
    ratio.push_back(dbs[1].ops_per_s[i] / dbs[0].ops_per_s[i]);
  }
  // 95% confidence interval of the median from order statistics.
  const double n = static_cast<double>(ratio.size());
  const double half = 0.98 * std::sqrt(n) / n;  // 1.96 * sqrt(n) / 2, as a fraction of n
  const double p99_plain = static_cast<double>(dbs[0].latency.quantile(0.99)) / 1e3;
  const double p99_sluice = static_cast<double>(dbs[1].latency.quantile(0.99)) / 1e3;
  nlohmann::json out = {{"workload", name},
                        {"pairs", ratio.size()},
                        {"block_ops", a.block_ops},
                        {"plain_ops_per_s_median", order_stat(dbs[0].ops_per_s, 0.5)},
                        {"sluice_ops_per_s_median", order_stat(dbs[1].ops_per_s, 0.5)},
                        {"ratio_min", order_stat(ratio, 0)},
                        {"ratio_p25", order_stat(ratio, 0.25)},
                        {"ratio_median", order_stat(ratio, 0.5)},
                        {"ratio_median_ci95_low", order_stat(ratio, 0.5 - half)},
                        {"ratio_median_ci95_high", order_stat(ratio, 0.5 + half)},
                        {"ratio_p75", order_stat(ratio, 0.75)},
                        {"ratio_max", order_stat(ratio, 1)},
                        {"p99_us_plain", p99_plain},
                        {"p99_us_sluice", p99_sluice},
                        {"p99_ratio", p99_sluice / p99_plain}};
  for (auto& d : dbs) {
    d.db->Close().PermitUncheckedError();
    d.db.reset();
    std::filesystem::remove_all(a.dir + "/" + name + "-" + d.name);
  }
  return out;
}

[[noreturn]] void usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: sluice-bench-rocksdb [--dir DIR] [--pairs N] [--block-ops N] [--keys N]\n"
               "                            [--workloads fillrandom,readrandom,readwhilewriting]"
               " [--quick]\n"
               "Plain RocksDB vs RocksDB with the Sluice binding on a pass-through stage, in\n"
               "one process: alternating blocks of operations, per-pair throughput ratios.\n");
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(2);
      return argv[++i];
    };
    auto count = [&]() {
      const std::string v = value();
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 1) {
        std::fprintf(stderr, "sluice-bench-rocksdb: %s: not a positive integer: %s\n", k.c_str(),
                     v.c_str());
        std::exit(2);
      }
      return n;
    };
    if (k == "--dir") {
      a.dir = value();
    } else if (k == "--pairs") {
      a.pairs = static_cast<int>(count());
    } else if (k == "--block-ops") {
      a.block_ops = static_cast<int>(count());
    } else if (k == "--keys") {
      a.keys = static_cast<std::uint64_t>(count());
    } else if (k == "--quick") {
      a.pairs = 100;
      a.keys = 50'000;
    } else if (k == "--workloads") {
      a.workloads.clear();
      std::string v = value();
      for (std::size_t pos = 0; pos <= v.size();) {
        const std::size_t comma = std::min(v.find(',', pos), v.size());
        a.workloads.push_back(v.substr(pos, comma - pos));
        pos = comma + 1;
      }
    } else if (k == "--help" || k == "-h") {
      usage(0);
    } else {
      std::fprintf(stderr, "sluice-bench-rocksdb: unknown argument %s\n", k.c_str());
      usage(2);
    }
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
  std::vector<nlohmann::json> results;
  for (const auto& w : a.workloads) {
    results.push_back(run_workload(a, w, **stage));
    std::printf("%s\n", results.back().dump().c_str());
    std::fflush(stdout);
  }
  std::printf("\n%-17s %6s %28s %22s %16s %8s\n", "workload", "pairs", "ratio min/median/max",
              "median 95% CI", "p99 us plain/sl", "p99 x");
  for (const auto& r : results) {
    std::printf("%-17s %6d %8.3f / %7.3f / %7.3f %10.3f - %-9.3f %7.1f / %-7.1f %8.3f\n",
                r["workload"].get<std::string>().c_str(), r["pairs"].get<int>(),
                r["ratio_min"].get<double>(), r["ratio_median"].get<double>(),
                r["ratio_max"].get<double>(), r["ratio_median_ci95_low"].get<double>(),
                r["ratio_median_ci95_high"].get<double>(), r["p99_us_plain"].get<double>(),
                r["p99_us_sluice"].get<double>(), r["p99_ratio"].get<double>());
  }
  return 0;
}
