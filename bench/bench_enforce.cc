// sluice-bench-enforce: the cost of a stage's enforce path, the equivalent of
// PAIO's §9.1 microbenchmark, and the cost per request of each enforcement
// object type on it. Closed-loop threads each build a Context (as a binding
// does per request) and enforce it, either one channel (and object) per thread
// (differentiated by workflow) or all threads on one shared channel and
// object. Entries: "inline" is the bindings' (the preload's, the RocksDB
// binding's) fast path, sluice::fast::enforce, whose common case is inline;
// "call" is the installed API's Stage::enforce, one call more.
//
// --object TYPE[,TYPE...] names registered object types (default noop), each
// created with --config JSON or its default configuration, one that never
// makes a request wait (drl: a rate of 2^50 B/s, far above what the loop
// offers; prio-bucket: the same rate and a node bucket's three classes).
// "rocksdb-limiter" (when built with RocksDB) is RocksDB's
// GenericRateLimiter (NewGenericRateLimiter(2^50 B/s), kAllIo), registered here
// as an object type whose enforce calls Request(size, IO_USER, nullptr,
// kWrite): the baseline, through the same stage path and loop. With
// --path direct the loop calls the object's enforce_context itself, without a
// stage: the object's cost alone. An object that holds capacity (buffer-pool)
// is measured the way a binding uses it: Stage::acquire of
// the request's size, then the Hold's release of it (the pool never fills:
// its default capacity is 2^40 bytes); with --path direct, the object's
// acquire then release.
//
// Several objects are measured in one invocation, their runs interleaved
// (rep 1 of every object, then rep 2, ...), so that they share the machine's
// load. Each JSON line gives min/median/max over --reps runs of --seconds; with
// a baseline among the objects (--baseline, default rocksdb-limiter) each line
// also gives the ratio to it, paired run by run (run r of the object over run r
// of the baseline). Then a human table.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include <nlohmann/json.hpp>

#include "sluice/enforcement_object.h"
#include "sluice/objects/builtin.h"
#include "sluice/stage.h"
#include "sluice/stage_fast.h"
#include "support/cli.h"
#include "support/percentile.h"

#if SLUICE_BENCH_ROCKSDB
#include <rocksdb/env.h>
#include <rocksdb/rate_limiter.h>
#endif

namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr double kNeverWaits = 1125899906842624.0;  // 2^50 bytes/s

struct Config {
  int threads = 1;
  bool shared = false;
  std::uint64_t size = 0;
  bool inline_entry = true;  // sluice::fast::enforce, else Stage::enforce
};

struct ObjectSpec {
  std::string type;
  nlohmann::json config;
  bool holds = false;  // holds capacity: acquire then release
};

struct Options {
  std::vector<int> threads = {1, 2, 4};
  std::vector<std::uint64_t> sizes = {0, 1024, 4096, 131072};
  std::vector<bool> inline_entries = {true, false};
  std::vector<bool> shared_modes = {false, true};
  std::vector<ObjectSpec> objects;
  std::string baseline = "rocksdb-limiter";
  bool direct = false;
  double seconds = 1.0;
  int reps = 5;
  bool json_only = false;
};

[[noreturn]] void usage(const char* msg) {
  if (msg != nullptr) std::fprintf(stderr, "sluice-bench-enforce: %s\n", msg);
  std::fprintf(
      stderr,
      "usage: sluice-bench-enforce [--object TYPE[,TYPE...]] [--config [TYPE=]JSON]\n"
      "                            [--baseline TYPE] [--path stage|direct]\n"
      "                            [--threads N[,N...]] [--size BYTES] [--entry inline|call]\n"
      "                            [--shared | --per-thread] [--seconds S] [--reps R]\n"
      "                            [--json] [--quick]\n"
      "Objects: any registered type (noop, drl, buffer-pool, ...)%s; default noop. --config\n"
      "applies to every listed type, or to TYPE only with TYPE=JSON; without it a type\n"
      "gets a configuration that never waits (drl: rate 2^50 B/s; buffer-pool: 2^40 B,\n"
      "acquired then released). Runs of the listed\n"
      "objects are interleaved. Without selectors, runs threads {1,2,4} x sizes\n"
      "{0,1K,4K,128K} x both entries x channel-per-thread and shared channel.\n",
#if SLUICE_BENCH_ROCKSDB
      ", rocksdb-limiter"
#else
      ""
#endif
  );
  std::exit(2);
}

#if SLUICE_BENCH_ROCKSDB
// RocksDB's GenericRateLimiter as an enforcement object: the baseline.
// Config: {"rate": bytes/s (integer), "refill_period_us", "fairness"}, as
// NewGenericRateLimiter takes them.
class RocksDbLimiter final : public sluice::EnforcementObject {
 public:
  std::string_view type() const noexcept override { return "rocksdb-limiter"; }
  sluice::Status validate(const nlohmann::json& config) const override {
    if (!config.is_object()) return sluice::Status::invalid("config: must be an object");
    for (const auto& [key, value] : config.items()) {
      if (key != "rate" && key != "refill_period_us" && key != "fairness") {
        return sluice::Status::invalid("unknown field '" + key + "'");
      }
      if (!value.is_number_integer() || value.get<std::int64_t>() < 1) {
        return sluice::Status::invalid(key + ": must be an integer >= 1");
      }
    }
    return {};
  }
  sluice::Status configure(const nlohmann::json& config) override {
    SLUICE_RETURN_IF_ERROR(validate(config));
    limiter_.reset(rocksdb::NewGenericRateLimiter(
        config.value("rate", static_cast<std::int64_t>(kNeverWaits)),
        config.value("refill_period_us", std::int64_t{100'000}),
        config.value("fairness", std::int32_t{10}), rocksdb::RateLimiter::Mode::kAllIo));
    return {};
  }
  sluice::Verdict enforce_context(const sluice::Context& ctx) noexcept override {
    return {sluice::Outcome::kOk, request(ctx)};
  }

 private:
  std::uint64_t request(const sluice::Context& ctx) noexcept {
    limiter_->Request(static_cast<std::int64_t>(ctx.size), rocksdb::Env::IO_USER, nullptr,
                      rocksdb::RateLimiter::OpType::kWrite);
    return 0;
  }
  std::unique_ptr<rocksdb::RateLimiter> limiter_;
};
#endif

// A configuration under which `type` never makes a request wait.
nlohmann::json default_config(const std::string& type) {
  if (type == "drl") return {{"rate", kNeverWaits}};
  if (type == "prio-bucket") {
    // A node bucket's three classes; the loop's requests are foreground.
    nlohmann::json c = nlohmann::json::parse(R"({"classes": [
        {"name": "foreground", "origins": ["foreground", "wal"], "priority": 0},
        {"name": "flush", "origins": ["flush"], "priority": 1, "weight": 10},
        {"name": "compaction", "origins": ["compaction*"], "priority": 1, "weight": 1}]})");
    c["rate"] = kNeverWaits;
    return c;
  }
  if (type == "rocksdb-limiter") return {{"rate", static_cast<std::int64_t>(kNeverWaits)}};
  if (type == "buffer-pool") {
    return {{"capacity", std::int64_t{1} << 40}, {"reserved", std::int64_t{1} << 38}};
  }
  return nlohmann::json::object();
}

[[noreturn]] void die(const std::string& what, const sluice::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), s.to_string().c_str());
  std::exit(1);
}

std::unique_ptr<sluice::Stage> make_stage(const Config& c, const ObjectSpec& o) {
  sluice::StageOptions options;
  options.name = "bench";
  auto stage = sluice::Stage::create(options);
  if (!stage.is_ok()) die("stage", stage.status());
  nlohmann::json rules = nlohmann::json::array();
  auto object = [&](const std::string& ch) {
    return nlohmann::json{{"rule", "create_object"},
                          {"channel", ch},
                          {"object", "o"},
                          {"type", o.type},
                          {"config", o.config}};
  };
  if (c.shared) {
    rules.push_back({{"rule", "create_channel"}, {"channel", "shared"}, {"default", true}});
    rules.push_back(object("shared"));
  } else {
    rules.push_back({{"rule", "differentiate"}, {"classifiers", {"workflow"}}});
    for (int t = 0; t < c.threads; ++t) {
      std::string ch = "ch" + std::to_string(t);
      rules.push_back(
          {{"rule", "create_channel"}, {"channel", ch}, {"match", {{"workflow", t + 1}}}});
      rules.push_back(object(ch));
    }
  }
  sluice::Status s = stage.value()->apply(rules);
  if (!s.is_ok()) die("rules", s);
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

// One timed run of `o` under `c`.
RunResult run_once(const Config& c, const ObjectSpec& o, bool direct, double seconds) {
  std::unique_ptr<sluice::Stage> stage;
  std::vector<std::unique_ptr<sluice::EnforcementObject>> objects;  // --path direct
  if (direct) {
    for (int t = 0; t < (c.shared ? 1 : c.threads); ++t) {
      auto made = sluice::Registry::global().create(o.type, o.config, {});
      if (!made.is_ok()) die(o.type, made.status());
      objects.push_back(std::move(made).value());
    }
  } else {
    stage = make_stage(c, o);
  }
  std::vector<std::uint64_t> ops(static_cast<std::size_t>(c.threads));
  std::vector<std::int64_t> cpu(static_cast<std::size_t>(c.threads));
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < c.threads; ++t) {
    threads.emplace_back([&, t] {
      sluice::OriginScope scope(sluice::Propagated{sluice::origin::kForeground, 0, 0, 0,
                                                   static_cast<std::uint64_t>(t + 1)});
      sluice::EnforcementObject* object =
          direct ? objects[c.shared ? 0 : static_cast<std::size_t>(t)].get() : nullptr;
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
      if (direct && o.holds) {
        loop([&](const sluice::Context& ctx) {
          sluice::Verdict v = object->acquire(ctx, ctx.size);
          asm volatile("" : : "r"(&v) : "memory");
          object->release(ctx, ctx.size);
        });
      } else if (direct) {
        loop([&](const sluice::Context& ctx) {
          sluice::Verdict v = object->enforce_context(ctx);
          asm volatile("" : : "r"(&v) : "memory");
        });
      } else if (o.holds) {  // capacity held between two events: the RocksDB binding
        loop([&](const sluice::Context& ctx) {
          sluice::Hold h = stage->acquire(ctx, ctx.size);
          asm volatile("" : : "r"(&h) : "memory");
          h.release_all();
        });
      } else if (c.inline_entry) {  // the preload, the RocksDB binding
        loop([&](const sluice::Context& ctx) {
          sluice::Verdict v = sluice::fast::enforce(*stage, ctx);
          asm volatile("" : : "r"(&v) : "memory");  // keep the verdict alive
        });
      } else {  // an application on the installed API
        loop([&](const sluice::Context& ctx) {
          sluice::Verdict v = stage->enforce(ctx);
          asm volatile("" : : "r"(&v) : "memory");
        });
      }
      ops[static_cast<std::size_t>(t)] = n;
      cpu[static_cast<std::size_t>(t)] = thread_cpu_ns() - cpu0;
    });
  }
  while (ready.load() < c.threads) std::this_thread::yield();
  auto t0 = SteadyClock::now();
  go.store(true, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (auto& th : threads) th.join();
  double elapsed = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  std::uint64_t total = 0;
  for (auto n : ops) total += n;
  if (stage) {  // sanity: the stage counted exactly what the threads sent
    auto stats = stage->collect();
    if (stats.total.ops != total) {
      std::fprintf(stderr, "stage counted %llu ops, threads sent %llu\n",
                   static_cast<unsigned long long>(stats.total.ops),
                   static_cast<unsigned long long>(total));
      std::exit(1);
    }
    std::uint64_t waited = 0;  // bucket 0 counts the requests that did not wait
    for (const sluice::ChannelStats& ch : stats.channels) {
      for (std::size_t b = 1; b < ch.wait.buckets.size(); ++b) waited += ch.wait.buckets[b];
    }
    if (waited != 0) {
      std::fprintf(stderr, "warning: %s made %llu requests wait\n", o.type.c_str(),
                   static_cast<unsigned long long>(waited));
    }
  }
  std::int64_t cpu_total = 0;
  for (auto ns : cpu) cpu_total += ns;
  return {static_cast<double>(total) / elapsed,
          static_cast<double>(cpu_total) / static_cast<double>(total)};
}

using sluice::bench::Spread;
using sluice::bench::spread;

struct Row {
  Config c;
  std::string object;
  Spread ns;   // wall ns per op (x threads) over reps
  Spread cpu;  // thread CPU ns per op over reps
  Spread ops;  // ops/s over reps
  bool has_ratio = false;
  Spread ratio;  // ns / baseline's ns, paired by rep
};

}  // namespace

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
#if SLUICE_BENCH_ROCKSDB
  (void)sluice::Registry::global().add(
      {"rocksdb-limiter", "RocksDB's GenericRateLimiter (benchmark baseline)",
       [](const sluice::ObjectEnv&) { return std::make_unique<RocksDbLimiter>(); }});
#endif
  Options o;
  bool quick = false;
  std::vector<std::string> types;
  nlohmann::json config_all;
  std::map<std::string, nlohmann::json> config_of;
  // A reader whose body throws on a value it cannot read (JSON, a number): the
  // value is refused.
  auto checked = [](std::function<void(const std::string&)> body) {
    return [body = std::move(body)](const std::string& v) {
      try {
        body(v);
        return true;
      } catch (const std::exception&) {
        return false;
      }
    };
  };
  using sluice::bench::Option;
  const Option options[] = {
      Option::with_value("--object",
                         [&](const std::string& v) {
                           for (const std::string& t : sluice::bench::split_list(v)) {
                             types.push_back(t);
                           }
                           return true;
                         }),
      Option::with_value("--config", checked([&](const std::string& v) {
                           const std::size_t eq = v.find('=');
                           if (!v.empty() && v[0] != '{' && eq != std::string::npos) {
                             config_of[v.substr(0, eq)] = nlohmann::json::parse(v.substr(eq + 1));
                           } else {
                             config_all = nlohmann::json::parse(v);
                           }
                         })),
      {"--baseline", &o.baseline},
      Option::with_value("--path",
                         [&](const std::string& p) {
                           if (p != "stage" && p != "direct") usage("--path is stage or direct");
                           o.direct = p == "direct";
                           return true;
                         }),
      Option::with_value("--threads", checked([&](const std::string& v) {
                           o.threads.clear();
                           for (const std::string& t : sluice::bench::split_list(v)) {
                             o.threads.push_back(std::stoi(t));
                           }
                         })),
      Option::with_value("--size",
                         checked([&](const std::string& v) { o.sizes = {std::stoull(v)}; })),
      Option::with_value("--entry",
                         [&](const std::string& m) {
                           if (m != "inline" && m != "call") usage("--entry is inline or call");
                           o.inline_entries = {m == "inline"};
                           return true;
                         }),
      Option::flag("--shared", [&] { o.shared_modes = {true}; }),
      Option::flag("--per-thread", [&] { o.shared_modes = {false}; }),
      Option::with_value("--seconds",
                         checked([&](const std::string& v) { o.seconds = std::stod(v); })),
      Option::with_value("--reps", checked([&](const std::string& v) { o.reps = std::stoi(v); })),
      {"--json", &o.json_only, true},
      {"--quick", &quick, true},
      Option::flag("--help", [] { usage(nullptr); }),
      Option::flag("-h", [] { usage(nullptr); }),
  };
  const sluice::bench::ParseResult parsed = sluice::bench::parse_options(options, argc, argv);
  switch (parsed.error) {
    case sluice::bench::ParseResult::Error::kNone:
      break;
    case sluice::bench::ParseResult::Error::kUnknown:
      usage(("unknown argument " + parsed.option).c_str());
    case sluice::bench::ParseResult::Error::kMissingValue:
      usage((parsed.option + " needs a value").c_str());
    case sluice::bench::ParseResult::Error::kBadValue:
      usage(("bad value for " + parsed.option).c_str());
  }
  if (quick) {
    o.seconds = 0.5;
    o.reps = 3;
  }
  if (o.reps < 1 || o.seconds <= 0) usage("--reps and --seconds must be positive");
  for (int t : o.threads) {
    if (t < 1 || t > 1024) usage("--threads must be 1..1024");
  }
  // Without a stage there is no entry to choose: one run per configuration.
  if (o.direct) o.inline_entries = {true};
  if (types.empty()) types = {"noop"};
  for (const std::string& t : types) {
    if (!sluice::Registry::global().contains(t)) {
      usage(("unknown object type '" + t + "' (not registered in this build)").c_str());
    }
    nlohmann::json config = default_config(t);
    if (auto it = config_of.find(t); it != config_of.end()) {
      config = it->second;
    } else if (!config_all.is_null()) {
      config = config_all;
    }
    // Checked once here rather than in the middle of a run.
    auto made = sluice::Registry::global().create(t, config, {});
    if (!made.is_ok()) die(t + " " + config.dump(), made.status());
    o.objects.push_back({t, config, made.value()->holds_capacity()});
  }
  int baseline = -1;
  for (std::size_t k = 0; k < o.objects.size(); ++k) {
    if (o.objects[k].type == o.baseline) baseline = static_cast<int>(k);
  }

  std::vector<Row> rows;
  for (bool shared : o.shared_modes) {
    for (int threads : o.threads) {
      if (shared && threads == 1 && o.shared_modes.size() > 1) continue;  // same as per-thread
      for (std::uint64_t size : o.sizes) {
        for (bool inline_entry : o.inline_entries) {
          const Config c{threads, shared, size, inline_entry};
          const std::size_t n = o.objects.size();
          std::vector<std::vector<double>> ops(n), ns(n), cpu(n);
          for (int r = 0; r < o.reps; ++r) {
            for (std::size_t k = 0; k < n; ++k) {  // interleaved: one run of each in turn
              const RunResult rr = run_once(c, o.objects[k], o.direct, o.seconds);
              ops[k].push_back(rr.ops_per_s);
              ns[k].push_back(1e9 * threads / rr.ops_per_s);
              cpu[k].push_back(rr.cpu_ns_per_op);
            }
          }
          for (std::size_t k = 0; k < n; ++k) {
            Row row{c, o.objects[k].type, spread(ns[k]), spread(cpu[k]), spread(ops[k]), false, {}};
            nlohmann::json j = {
                {"bench", "enforce"},
                {"object", row.object},
                {"config", o.objects[k].config},
                {"path", o.direct ? "direct" : "stage"},
                {"threads", threads},
                {"shared", shared},
                {"channels", shared ? 1 : threads},
                {"shared_channel", shared},
                {"size", size},
                {"entry", inline_entry ? "inline" : "call"},
                {"ops_per_s", row.ops.median},
                {"ops_per_s_min", row.ops.min},
                {"ops_per_s_max", row.ops.max},
                {"ns_per_op", row.ns.median},
                {"ns_per_op_min", row.ns.min},
                {"ns_per_op_max", row.ns.max},
                {"cpu_ns_per_op", row.cpu.median},
                {"cpu_ns_per_op_min", row.cpu.min},
                {"cpu_ns_per_op_max", row.cpu.max},
                {"gib_per_s", row.ops.median * static_cast<double>(size) / (1024.0 * 1024 * 1024)},
                {"reps", o.reps},
                {"seconds", o.seconds}};
            if (baseline >= 0 && static_cast<int>(k) != baseline) {
              std::vector<double> ratio, cpu_ratio;
              for (int r = 0; r < o.reps; ++r) {
                const auto u = static_cast<std::size_t>(r);
                ratio.push_back(ns[k][u] / ns[static_cast<std::size_t>(baseline)][u]);
                cpu_ratio.push_back(cpu[k][u] / cpu[static_cast<std::size_t>(baseline)][u]);
              }
              row.has_ratio = true;
              row.ratio = spread(ratio);
              const Spread cr = spread(cpu_ratio);
              j["baseline"] = o.baseline;
              j["ratio_to_baseline"] = row.ratio.median;
              j["ratio_to_baseline_min"] = row.ratio.min;
              j["ratio_to_baseline_max"] = row.ratio.max;
              j["cpu_ratio_to_baseline"] = cr.median;
            }
            std::printf("%s\n", j.dump().c_str());
            std::fflush(stdout);
            rows.push_back(row);
          }
        }
      }
    }
  }
  if (!o.json_only) {
    std::printf("\nns/op is wall time x threads / ops; cpu ns/op is thread CPU time / ops");
    if (baseline >= 0) {
      std::printf("; ratio is ns/op over %s's in the same rep (median [min, max])",
                  o.baseline.c_str());
    }
    std::printf(".\n%-16s %-8s %-9s %-8s %-8s %10s %10s %10s %12s %s\n", "object", "threads",
                "channels", "size", "entry", "ns/op min", "ns/op med", "ns/op max", "cpu ns/op med",
                baseline >= 0 ? "ratio" : "");
    for (const Row& r : rows) {
      std::printf("%-16s %-8d %-9s %-8llu %-8s %10.2f %10.2f %10.2f %12.2f", r.object.c_str(),
                  r.c.threads, r.c.shared ? "shared" : "1/thread",
                  static_cast<unsigned long long>(r.c.size), r.c.inline_entry ? "inline" : "call",
                  r.ns.min, r.ns.median, r.ns.max, r.cpu.median);
      if (r.has_ratio) {
        std::printf("  %.3f [%.3f, %.3f]", r.ratio.median, r.ratio.min, r.ratio.max);
      }
      std::printf("\n");
    }
  }
  return 0;
}
