// PAIO §3.3 end to end: "limit the rate of RocksDB flushes to X MiB/s".
//
// RocksDB (Debian's 7.8.3, unmodified) runs on a stage through the binding
// (sluice::rocksdb_binding::Attach); the stage gets its rules either from the control
// plane (--socket: a `sluice serve` running the static policy, see policy.json) or from
// a local rules file / the built-in rules (a flush channel with a drl token bucket at X,
// everything else through noop objects). A write-heavy load (random-key puts, 1 KiB
// values) runs in two phases: unlimited (the baseline, same process), then limited. Each
// second the program prints the flush rate the stage measured, the flush rate from
// RocksDB's FLUSH_WRITE_BYTES ticker, and X; at the end the overall figures.
//
// Usage: rocksdb_flush_limit [--rate-mib X] [--seconds N] [--baseline-seconds N]
//                            [--socket PATH | --rules FILE] [--db DIR] [--json]
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/statistics.h>

#include "sluice/control_client.h"
#ifdef SLUICE_EXAMPLE_HAVE_CONTROL
#include "client.h"  // control-plane/: get_stats from the daemon
#endif
#include "sluice/objects/builtin.h"
#include "sluice/rocksdb.h"
#include "sluice/stage.h"
#include "support/cli.h"
#include "support/rocksdb_open.h"
#include "support/stage_setup.h"

namespace {

namespace rb = sluice::rocksdb_binding;
using Clock = std::chrono::steady_clock;

constexpr double kMiB = 1024.0 * 1024.0;

struct Args {
  double rate_mib = 4;
  int seconds = 8;
  int baseline_seconds = 4;
  std::string socket;
  std::string rules;
  std::string db = "/tmp/sluice-flush-limit-db";
  bool json = false;
};

constexpr char kUsage[] =
    "usage: rocksdb_flush_limit [--rate-mib X] [--seconds N] [--baseline-seconds N]\n"
    "                           [--socket PATH | --rules FILE] [--db DIR] [--json]\n";

bool parse(int argc, char** argv, Args* a) {
  const sluice::bench::Option options[] = {
      {"--json", &a->json, true}, {"--rate-mib", &a->rate_mib},
      {"--seconds", &a->seconds}, {"--baseline-seconds", &a->baseline_seconds},
      {"--socket", &a->socket},   {"--rules", &a->rules},
      {"--db", &a->db},
  };
  return sluice::bench::parse_options(options, argc, argv).ok() && a->rate_mib > 0 &&
         a->seconds > 0 && a->baseline_seconds >= 0;
}

// PAIO §3.3's policy as rules: flushes through a token bucket at `rate` bytes/s (only
// their writes carry bytes; opens, syncs and closes are size 0), everything else counted.
nlohmann::json flush_limit_rules(double rate) {
  return {
      {"version", 1},
      {"rules",
       {{{"rule", "differentiate"}, {"classifiers", {"origin"}}},
        {{"rule", "create_channel"}, {"channel", "flush"}, {"match", {{"origin", "flush"}}}},
        {{"rule", "create_object"},
         {"channel", "flush"},
         {"object", "limit"},
         {"type", "drl"},
         {"config", {{"rate", rate}}}},
        {{"rule", "create_channel"}, {"channel", "rest"}, {"default", true}},
        {{"rule", "create_object"}, {"channel", "rest"}, {"object", "count"}, {"type", "noop"}}}}};
}

nlohmann::json unlimited_rules() {
  return {
      {"version", 1},
      {"rules",
       {{{"rule", "differentiate"}, {"classifiers", {"origin"}}},
        {{"rule", "create_channel"}, {"channel", "flush"}, {"match", {{"origin", "flush"}}}},
        {{"rule", "create_object"}, {"channel", "flush"}, {"object", "count"}, {"type", "noop"}},
        {{"rule", "create_channel"}, {"channel", "rest"}, {"default", true}},
        {{"rule", "create_object"}, {"channel", "rest"}, {"object", "count"}, {"type", "noop"}}}}};
}

// Flush bytes in one collect: origin "flush" wherever it was routed.
std::uint64_t flush_bytes(const sluice::StageStats& s) {
  std::uint64_t b = 0;
  for (const auto& ch : s.channels) {
    if (auto it = ch.by_origin.find("flush"); it != ch.by_origin.end()) b += it->second.bytes;
  }
  return b;
}

std::string limit_text(double limit_mib) {
  if (limit_mib <= 0) return "none";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f MiB/s", limit_mib);
  return buf;
}

struct Phase {
  std::uint64_t stage_bytes = 0;
  std::uint64_t ticker_bytes = 0;
  std::uint64_t puts = 0;
  double seconds = 0;        // wall time of the printed seconds
  double stage_seconds = 0;  // time the stage's collects covered
  double max_second_mib = 0;
};

// Where a phase reads the stage's flush bytes from. Stage::collect() hands out what
// happened since the previous collect, whoever asked: with a control plane attached its
// daemon collects every interval, so then the figures come from the daemon's view
// (get_stats: the latest collect it made), not from a competing local collect.
class FlushMeter {
 public:
  virtual ~FlushMeter() = default;
  virtual void start() = 0;
  // Waits until `deadline`, then returns the flush bytes and the seconds they cover
  // since the previous call.
  virtual std::pair<std::uint64_t, double> next(Clock::time_point deadline) = 0;
};

class LocalMeter final : public FlushMeter {
 public:
  explicit LocalMeter(sluice::Stage& stage) : stage_(stage) {}
  void start() override { stage_.collect(); }
  std::pair<std::uint64_t, double> next(Clock::time_point deadline) override {
    std::this_thread::sleep_until(deadline);
    const sluice::StageStats st = stage_.collect();
    return {flush_bytes(st), static_cast<double>(st.interval_ns) / 1e9};
  }

 private:
  sluice::Stage& stage_;
};

#ifdef SLUICE_EXAMPLE_HAVE_CONTROL
class DaemonMeter final : public FlushMeter {
 public:
  DaemonMeter(std::unique_ptr<sluice::control::Connection> c, std::string stage)
      : conn_(std::move(c)), stage_(std::move(stage)) {}
  void start() override { (void)poll(); }
  std::pair<std::uint64_t, double> next(Clock::time_point deadline) override {
    std::pair<std::uint64_t, double> r{0, 0};
    // Sum every collect the daemon made since the last call (it keeps only the latest,
    // so poll more often than its interval: every 100 ms here).
    while (Clock::now() < deadline) {
      std::this_thread::sleep_until(
          std::min(deadline, Clock::now() + std::chrono::milliseconds(100)));
      auto p = poll();
      r.first += p.first;
      r.second += p.second;
    }
    return r;
  }

 private:
  std::pair<std::uint64_t, double> poll() {
    auto reply = conn_->request(sluice::wire::Type::kGetStats, {{"stage", stage_}});
    if (!reply.is_ok()) return {0, 0};
    for (const auto& e : reply->value("stages", nlohmann::json::array())) {
      if (!e.contains("stats") || e["stats"].is_null()) continue;
      auto st = sluice::stage_stats_from_json(e["stats"]);
      if (!st.is_ok() || st->collected_at_ns == last_) continue;
      last_ = st->collected_at_ns;
      return {flush_bytes(*st), static_cast<double>(st->interval_ns) / 1e9};
    }
    return {0, 0};
  }
  std::unique_ptr<sluice::control::Connection> conn_;
  std::string stage_;
  std::int64_t last_ = 0;
};
#endif

// Runs the writer for `seconds`, printing one line per second.
Phase run_phase(const char* name, rocksdb::DB* db, FlushMeter& meter, rocksdb::Statistics& stats,
                int seconds, double limit_mib, bool json) {
  Phase p;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> puts{0};
  std::thread writer([&] {
    std::mt19937_64 rng(7);
    const std::string value(1024, 'x');
    char key[32];
    rocksdb::WriteOptions wo;
    while (!stop.load(std::memory_order_relaxed)) {
      std::snprintf(key, sizeof(key), "key%016llx",
                    static_cast<unsigned long long>(rng() % 10000000));
      if (!db->Put(wo, key, value).ok()) break;
      puts.fetch_add(1, std::memory_order_relaxed);
    }
  });
  meter.start();  // start the interval now
  std::uint64_t ticker0 = stats.getTickerCount(rocksdb::FLUSH_WRITE_BYTES);
  const std::uint64_t ticker_start = ticker0;
  std::uint64_t puts0 = 0;
  const auto start = Clock::now();
  auto last = start;
  for (int s = 1; s <= seconds; ++s) {
    const auto [fb, covered] = meter.next(start + std::chrono::seconds(s));
    const auto now = Clock::now();
    const double wall = std::chrono::duration<double>(now - last).count();
    last = now;
    // Stage bytes over the time the collects covered; the ticker over wall time.
    const double dt = covered > 0 ? covered : wall;
    p.seconds += wall;
    p.stage_seconds += covered;
    const std::uint64_t ticker = stats.getTickerCount(rocksdb::FLUSH_WRITE_BYTES);
    const std::uint64_t pu = puts.load();
    const double stage_mib = static_cast<double>(fb) / kMiB / dt;
    const double ticker_mib = static_cast<double>(ticker - ticker0) / kMiB / wall;
    p.stage_bytes += fb;
    p.max_second_mib = std::max(p.max_second_mib, stage_mib);
    if (json) {
      std::printf(
          "{\"phase\":\"%s\",\"t\":%d,\"flush_mib_s_stage\":%.3f,\"flush_mib_s_ticker\":%.3f,"
          "\"limit_mib_s\":%.3f,\"puts_s\":%.0f}\n",
          name, s, stage_mib, ticker_mib, limit_mib, static_cast<double>(pu - puts0) / wall);
    } else {
      std::printf(
          "%-9s t=%2ds  flush %7.2f MiB/s (stage)  %7.2f MiB/s (FLUSH_WRITE_BYTES)  "
          "limit %s  puts %7.0f/s\n",
          name, s, stage_mib, ticker_mib, limit_text(limit_mib).c_str(),
          static_cast<double>(pu - puts0) / wall);
    }
    std::fflush(stdout);
    ticker0 = ticker;
    puts0 = pu;
  }
  // Overall figures cover the printed seconds only (not the writer's shutdown).
  p.ticker_bytes = ticker0 - ticker_start;
  p.puts = puts0;
  stop = true;
  writer.join();
  return p;
}

void summary(const char* name, const Phase& p, double limit_mib, bool json) {
  const double stage_mib = static_cast<double>(p.stage_bytes) / kMiB /
                           (p.stage_seconds > 0 ? p.stage_seconds : p.seconds);
  const double ticker_mib = static_cast<double>(p.ticker_bytes) / kMiB / p.seconds;
  if (json) {
    std::printf(
        "{\"phase\":\"%s\",\"summary\":true,\"seconds\":%.2f,\"flush_mib_s_stage\":%.3f,"
        "\"flush_mib_s_ticker\":%.3f,\"limit_mib_s\":%.3f,\"max_second_mib_s\":%.3f,"
        "\"puts_s\":%.0f}\n",
        name, p.seconds, stage_mib, ticker_mib, limit_mib, p.max_second_mib,
        static_cast<double>(p.puts) / p.seconds);
  } else {
    std::printf(
        "%-9s overall over %.1f s: flush %.2f MiB/s (stage), %.2f MiB/s "
        "(FLUSH_WRITE_BYTES), busiest second %.2f MiB/s, limit %s, %.0f puts/s\n",
        name, p.seconds, stage_mib, ticker_mib, p.max_second_mib, limit_text(limit_mib).c_str(),
        static_cast<double>(p.puts) / p.seconds);
  }
}

}  // namespace

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
  Args a;
  if (!parse(argc, argv, &a)) sluice::bench::exit_with_usage(2, kUsage);
  const double rate = a.rate_mib * kMiB;

  sluice::StageOptions so;
  so.name = "rocksdb-flush-limit";
  so.labels["app"] = "rocksdb";
  auto created = sluice::Stage::create(so);
  if (!created.is_ok()) {
    std::fprintf(stderr, "stage: %s\n", created.status().to_string().c_str());
    return 1;
  }
  std::unique_ptr<sluice::Stage> stage = std::move(created).value();

  std::filesystem::remove_all(a.db);
  rocksdb::Options o;
  o.create_if_missing = true;
  o.statistics = rocksdb::CreateDBStatistics();
  o.write_buffer_size = 4 << 20;
  o.max_write_buffer_number = 3;
  o.max_background_jobs = 2;
  o.compression = rocksdb::kNoCompression;
  auto binding = rb::Attach(o, *stage);
  if (!binding.is_ok()) {
    std::fprintf(stderr, "attach: %s\n", binding.status().to_string().c_str());
    return 1;
  }
  std::unique_ptr<rocksdb::DB> db = sluice::bench::open_db(o, a.db);
  if (!db) return 1;

  if (a.baseline_seconds > 0) {
    if (auto st = stage->apply(unlimited_rules()); !st.is_ok()) {
      std::fprintf(stderr, "rules: %s\n", st.to_string().c_str());
      return 1;
    }
    LocalMeter meter(*stage);
    const Phase base =
        run_phase("baseline", db.get(), meter, *o.statistics, a.baseline_seconds, 0, a.json);
    summary("baseline", base, 0, a.json);
  }

  // Drop the baseline's channels (the control plane's static policy does the same with
  // "replace": true).
  {
    nlohmann::json clear = nlohmann::json::array();
    for (const auto& ch : stage->info().channels) {
      clear.push_back({{"rule", "remove_channel"}, {"channel", ch.name}});
    }
    if (!clear.empty()) {
      if (auto st = stage->apply(clear); !st.is_ok()) {
        std::fprintf(stderr, "rules: %s\n", st.to_string().c_str());
        return 1;
      }
    }
  }
  // The limit: from the control plane, a rules file, or built in.
  std::unique_ptr<sluice::ControlClient> client;
  std::string source;
  if (!a.socket.empty()) {
    auto c = sluice::bench::start_control_client(*stage, a.socket);
    if (!c.is_ok()) {
      std::fprintf(stderr, "%s\n", c.status().message().c_str());
      return 1;
    }
    client = std::move(c).value();
    source = "control plane at " + a.socket;
  } else if (!a.rules.empty()) {
    if (auto st = sluice::bench::apply_rules_file(*stage, a.rules); !st.is_ok()) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      return 1;
    }
    source = "rules file " + a.rules;
  } else {
    if (auto st = stage->apply(flush_limit_rules(rate)); !st.is_ok()) {
      std::fprintf(stderr, "rules: %s\n", st.to_string().c_str());
      return 1;
    }
    source = "built-in rules";
  }
  if (!a.json) {
    std::printf("limiting flushes to %.2f MiB/s (%s)\n", a.rate_mib, source.c_str());
  }
  std::unique_ptr<FlushMeter> meter = std::make_unique<LocalMeter>(*stage);
#ifdef SLUICE_EXAMPLE_HAVE_CONTROL
  if (client) {
    auto conn = sluice::control::Connection::open(a.socket);
    if (!conn.is_ok()) {
      std::fprintf(stderr, "get_stats connection: %s\n", conn.status().to_string().c_str());
      return 1;
    }
    meter = std::make_unique<DaemonMeter>(std::move(conn).value(), stage->name());
  }
#endif
  const Phase lim =
      run_phase("limited", db.get(), *meter, *o.statistics, a.seconds, a.rate_mib, a.json);
  summary("limited", lim, a.rate_mib, a.json);

  client.reset();
  stage->shutdown();  // wake a flush waiting for tokens so that Close does not wait on it
  db->Close().PermitUncheckedError();
  db.reset();
  std::filesystem::remove_all(a.db);
  return 0;
}
