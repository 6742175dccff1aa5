// sluice-bench-enforce: the cost of a stage's enforce path, the equivalent of
// PAIO's §9.1 microbenchmark. Closed-loop threads each build a Context (as a
// binding does per request) and enforce it on Noop objects, either one channel
// per thread (differentiated by workflow) or all threads on one shared
// channel. Modes: "context" passes metadata only (Stage::enforce_context, as
// the preload and the RocksDB binding do); "payload" also hands the request's
// buffer to the stage (Stage::enforce; Noop never copies it).
//
// Prints one JSON line per configuration (min/median/max over --reps runs of
// --seconds each), then a human table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include <nlohmann/json.hpp>

#include "sluice/stage.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int threads = 1;
  bool shared = false;
  std::uint64_t size = 0;
  bool payload = false;
};

struct Options {
  std::vector<int> threads = {1, 2, 4};
  std::vector<std::uint64_t> sizes = {0, 1024, 4096, 131072};
  std::vector<bool> payload_modes = {false, true};
  std::vector<bool> shared_modes = {false, true};
  double seconds = 1.0;
  int reps = 5;
  bool json_only = false;
};

[[noreturn]] void usage(const char* msg) {
  if (msg != nullptr) std::fprintf(stderr, "sluice-bench-enforce: %s\n", msg);
  std::fprintf(stderr,
               "usage: sluice-bench-enforce [--threads N] [--size BYTES] [--mode context|payload]\n"
               "                            [--shared | --per-thread] [--seconds S] [--reps R]\n"
               "                            [--json] [--quick]\n"
               "Without selectors, runs threads {1,2,4} x sizes {0,1K,4K,128K} x both modes x\n"
               "channel-per-thread and shared channel.\n");
  std::exit(2);
}

std::unique_ptr<sluice::Stage> make_stage(const Config& c) {
  sluice::StageOptions options;
  options.name = "bench";
  auto stage = sluice::Stage::create(options);
  if (!stage.is_ok()) {
    std::fprintf(stderr, "stage: %s\n", stage.status().to_string().c_str());
    std::exit(1);
  }
  nlohmann::json rules = nlohmann::json::array();
  if (c.shared) {
    rules.push_back({{"rule", "create_channel"}, {"channel", "shared"}, {"default", true}});
    rules.push_back(
        {{"rule", "create_object"}, {"channel", "shared"}, {"object", "noop"}, {"type", "noop"}});
  } else {
    rules.push_back({{"rule", "differentiate"}, {"classifiers", {"workflow"}}});
    for (int t = 0; t < c.threads; ++t) {
      std::string ch = "ch" + std::to_string(t);
      rules.push_back(
          {{"rule", "create_channel"}, {"channel", ch}, {"match", {{"workflow", t + 1}}}});
      rules.push_back(
          {{"rule", "create_object"}, {"channel", ch}, {"object", "noop"}, {"type", "noop"}});
    }
  }
  sluice::Status s = stage.value()->apply(rules);
  if (!s.is_ok()) {
    std::fprintf(stderr, "rules: %s\n", s.to_string().c_str());
    std::exit(1);
  }
  return std::move(stage).value();
}

std::int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

struct RunResult {
  double ops_per_s;      // wall clock, all threads
  double cpu_ns_per_op;  // thread CPU time per operation: robust to a loaded machine
};

// One timed run.
RunResult run_once(const Config& c, double seconds) {
  auto stage = make_stage(c);
  std::vector<std::uint64_t> ops(static_cast<std::size_t>(c.threads));
  std::vector<std::int64_t> cpu(static_cast<std::size_t>(c.threads));
  std::vector<std::byte> buffer(std::max<std::uint64_t>(c.size, 1));
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < c.threads; ++t) {
    threads.emplace_back([&, t] {
      sluice::OriginScope scope(sluice::Propagated{sluice::origin::kForeground, 0, 0, 0,
                                                   static_cast<std::uint64_t>(t + 1)});
      const sluice::Request req =
          c.payload ? sluice::Request{buffer.data(), c.size} : sluice::Request{};
      std::uint64_t n = 0;
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      const std::int64_t cpu0 = thread_cpu_ns();
      auto loop = [&](auto&& one) {
        while (!stop.load(std::memory_order_relaxed)) {
          for (int i = 0; i < 1024; ++i) one(sluice::make_context(sluice::Op::kWrite, c.size));
          n += 1024;
        }
      };
      if (c.payload) {
        loop([&](const sluice::Context& ctx) {
          sluice::Result r = stage->enforce(ctx, req);
          asm volatile("" : : "r"(&r) : "memory");  // keep the result alive
        });
      } else {  // a layer with no payload: the preload, the RocksDB binding
        loop([&](const sluice::Context& ctx) {
          sluice::Verdict v = stage->enforce_context(ctx);
          asm volatile("" : : "r"(&v) : "memory");
        });
      }
      ops[static_cast<std::size_t>(t)] = n;
      cpu[static_cast<std::size_t>(t)] = thread_cpu_ns() - cpu0;
    });
  }
  while (ready.load() < c.threads) std::this_thread::yield();
  auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (auto& th : threads) th.join();
  double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  std::uint64_t total = 0;
  for (auto n : ops) total += n;
  // Sanity: the stage counted exactly what the threads sent.
  auto stats = stage->collect();
  if (stats.total.ops != total) {
    std::fprintf(stderr, "stage counted %llu ops, threads sent %llu\n",
                 static_cast<unsigned long long>(stats.total.ops),
                 static_cast<unsigned long long>(total));
    std::exit(1);
  }
  std::int64_t cpu_total = 0;
  for (auto ns : cpu) cpu_total += ns;
  return {static_cast<double>(total) / elapsed,
          static_cast<double>(cpu_total) / static_cast<double>(total)};
}

struct Row {
  Config c;
  double min, median, max;              // ops/s over reps
  double cpu_min, cpu_median, cpu_max;  // CPU ns per op over reps
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    try {
      if (a == "--threads")
        o.threads = {std::stoi(next())};
      else if (a == "--size")
        o.sizes = {std::stoull(next())};
      else if (a == "--mode") {
        std::string m = next();
        if (m != "context" && m != "payload") usage("--mode is context or payload");
        o.payload_modes = {m == "payload"};
      } else if (a == "--shared")
        o.shared_modes = {true};
      else if (a == "--per-thread")
        o.shared_modes = {false};
      else if (a == "--seconds")
        o.seconds = std::stod(next());
      else if (a == "--reps")
        o.reps = std::stoi(next());
      else if (a == "--json")
        o.json_only = true;
      else if (a == "--quick")
        quick = true;
      else if (a == "--help" || a == "-h")
        usage(nullptr);
      else
        usage(("unknown argument " + a).c_str());
    } catch (const std::exception&) {
      usage(("bad value for " + a).c_str());
    }
  }
  if (quick) {
    o.seconds = 0.5;
    o.reps = 3;
  }
  if (o.reps < 1 || o.seconds <= 0) usage("--reps and --seconds must be positive");
  for (int t : o.threads) {
    if (t < 1 || t > 1024) usage("--threads must be 1..1024");
  }

  std::vector<Row> rows;
  for (bool shared : o.shared_modes) {
    for (int threads : o.threads) {
      if (shared && threads == 1 && o.shared_modes.size() > 1) continue;  // same as per-thread
      for (std::uint64_t size : o.sizes) {
        for (bool payload : o.payload_modes) {
          Config c{threads, shared, size, payload};
          std::vector<double> v, cpu;
          for (int r = 0; r < o.reps; ++r) {
            RunResult rr = run_once(c, o.seconds);
            v.push_back(rr.ops_per_s);
            cpu.push_back(rr.cpu_ns_per_op);
          }
          std::sort(v.begin(), v.end());
          std::sort(cpu.begin(), cpu.end());
          Row row{c,           v.front(),           v[v.size() / 2], v.back(),
                  cpu.front(), cpu[cpu.size() / 2], cpu.back()};
          rows.push_back(row);
          double ns = 1e9 * threads / row.median;
          nlohmann::json j = {
              {"bench", "enforce"},
              {"threads", threads},
              {"channels", shared ? 1 : threads},
              {"shared_channel", shared},
              {"size", size},
              {"mode", payload ? "payload" : "context"},
              {"ops_per_s", row.median},
              {"ops_per_s_min", row.min},
              {"ops_per_s_max", row.max},
              {"ns_per_op", ns},
              {"ns_per_op_min", 1e9 * threads / row.max},
              {"ns_per_op_max", 1e9 * threads / row.min},
              {"cpu_ns_per_op", row.cpu_median},
              {"cpu_ns_per_op_min", row.cpu_min},
              {"cpu_ns_per_op_max", row.cpu_max},
              {"gib_per_s", row.median * static_cast<double>(size) / (1024.0 * 1024 * 1024)},
              {"reps", o.reps},
              {"seconds", o.seconds}};
          std::printf("%s\n", j.dump().c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  if (!o.json_only) {
    std::printf("\nns/op is wall time x threads / ops; cpu ns/op is thread CPU time / ops.\n");
    std::printf("%-8s %-9s %-8s %-8s %12s %10s %10s %10s %12s %9s\n", "threads", "channels", "size",
                "mode", "Mops/s(med)", "ns/op min", "ns/op med", "ns/op max", "cpu ns/op med",
                "GiB/s");
    for (const Row& r : rows) {
      double t = r.c.threads;
      std::printf("%-8d %-9s %-8llu %-8s %12.2f %10.2f %10.2f %10.2f %12.2f %9.2f\n", r.c.threads,
                  r.c.shared ? "shared" : "1/thread", static_cast<unsigned long long>(r.c.size),
                  r.c.payload ? "payload" : "context", r.median / 1e6, 1e9 * t / r.max,
                  1e9 * t / r.median, 1e9 * t / r.min, r.cpu_median,
                  r.median * static_cast<double>(r.c.size) / (1024.0 * 1024 * 1024));
    }
  }
  return 0;
}
