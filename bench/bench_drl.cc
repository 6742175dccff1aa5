// sluice-bench-drl: does the drl token bucket hold its rate and its burst in
// real time?
//
// For each configuration (rate x request size x threads x refill period),
// closed-loop threads call Drl::enforce_context() directly on one bucket for
// --seconds of the system clock and record when each grant returned. Then:
//   achieved_bps   (bytes admitted - the initial full bucket) / (last grant -
//                  first request); error_pct is its deviation from the rate.
//   *_burst_bytes  the largest excess of a window [t_i, t_j] of grants over
//                  the rate: bytes admitted in it - rate * (t_j - t_i). A token
//                  bucket keeps it <= burst (+ one request's cost, for requests
//                  larger than the bucket). Grants are timed when the bucket
//                  decides them (Drl::set_grant_observer): a queued thread then
//                  resumes when the scheduler runs it, which can bunch grants
//                  that the bucket spaced out (max_burst_at_return_bytes, the
//                  same measure on return times, shows by how much). Reported
//                  over every window (max_burst_bytes), over windows that
//                  start while the initial full bucket drains
//                  (initial_burst_bytes, up to the first grant that had to
//                  wait), and over the rest (steady_burst_bytes).
//   offered_bps    the load generator's capacity (same threads and size, an
//                  unreachable rate, 0.3 s before the run); generator_bound
//                  when the rate is above 90% of it.
//   lost_pct       tokens the bucket lost, as % of rate x elapsed: to a full
//                  bucket with nobody waiting (overflow_bytes: every thread
//                  was away, e.g. granted but not yet running again) and to
//                  the lag cap (late_forfeited_bytes: a waiter woke more than
//                  one bucket late). Neither can be given back without a burst
//                  larger than configured. residual_error_pct = error_pct +
//                  lost_pct is the limiter's own error for the time it was
//                  given; scheduler_bound when error_pct misses 0.5% but the
//                  residual does not.
//   host_steal_pct the share of the machine's CPU time the hypervisor gave to
//                  other guests during the run (/proc/stat; -1 where unknown):
//                  on a virtual machine a waiter can wake late because its vCPU
//                  was not running, which no code in the guest can prevent.
//   --unobserved   runs without the grant observer, so that grants may take
//                  the bucket's lock-free path (leases, which an observer
//                  turns off); the burst measures then use return times.
//   --max-steal P --attempts K  runs a configuration again (up to K times in
//                  all) while the host stole more than P% during it; every
//                  attempt prints its JSON line (attempt, quiet), and the
//                  table shows each configuration's last attempt. This
//                  separates the limiter's accuracy from the hypervisor's
//                  pauses; it hides nothing, since every attempt is printed.
// Prints one JSON line per configuration, then (unless --json) a table on
// stderr.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "host_steal.h"
#include "sluice/clock.h"
#include "sluice/objects/drl.h"
#include "support/cli.h"
#include "support/percentile.h"

namespace {

constexpr double kKiB = 1024.0;
constexpr double kMiB = 1024.0 * kKiB;
constexpr double kGiB = 1024.0 * kMiB;
// A target above this fraction of the generator's capacity is flagged
// generator_bound: its error says more about the machine than the limiter.
constexpr double kGeneratorBound = 0.9;
// The accuracy target: |achieved - rate| <= 0.5% of the rate.
constexpr double kTargetPct = 0.5;
// Whether grants are timed when the bucket decides them (--unobserved: no).
bool g_observe = true;

struct BenchConfig {
  double rate;  // bytes per second
  std::uint64_t size;
  int threads;
  std::int64_t refill_us;
  double seconds;
};

struct Measured {
  double burst_bytes = 0;
  std::uint64_t grants = 0;
  double elapsed_s = 0;
  double achieved_bps = 0;
  double error_pct = 0;
  double max_burst_bytes = 0;
  double initial_burst_bytes = 0;
  double steady_burst_bytes = 0;
  double max_burst_at_return_bytes = 0;
  // From the bucket's own counters: tokens lost to a full bucket with nobody
  // waiting (the load generator was not there to take them) and to the lag
  // cap (a waiter woke up later than one bucket).
  double overflow_bytes = 0;
  double late_forfeited_bytes = 0;
};

struct ThreadLog {
  std::vector<std::int64_t> grants;  // ns, when enforce_context() returned
  std::int64_t start = 0;            // ns, before the first enforce_context()
  std::int64_t first_wait = std::numeric_limits<std::int64_t>::max();
  bool overflow = false;
};

// The largest excess over `rate` of the bytes granted in any window [t_i, t_j]
// of sorted grant times, O(n): for window (i, j), (P_j - rate t_j) +
// (rate t_i - P_{i-1}) with P the prefix sum of bytes; keeps the best start
// seen so far, one for starts before `first_wait` (the initial full bucket
// draining) and one for the rest. Returns {initial, steady}.
std::pair<double, double> window_excess(const std::vector<std::int64_t>& times,
                                        std::int64_t first_wait, double size, double rate_bps) {
  constexpr long double kNone = -std::numeric_limits<long double>::infinity();
  long double best_initial = kNone, best_steady = kNone;
  long double worst_initial = kNone, worst_steady = kNone;
  long double prefix = 0;
  const long double rate = rate_bps;
  for (std::int64_t at : times) {
    const long double t = static_cast<long double>(at - times.front()) / 1e9L;
    long double& best = at < first_wait ? best_initial : best_steady;
    best = std::max(best, rate * t - prefix);
    prefix += size;
    worst_initial = std::max(worst_initial, prefix - rate * t + best_initial);
    worst_steady = std::max(worst_steady, prefix - rate * t + best_steady);
  }
  return {static_cast<double>(std::max(worst_initial, 0.0L)),
          static_cast<double>(std::max(worst_steady, 0.0L))};
}

Measured run(const BenchConfig& c) {
  sluice::Clock& clock = sluice::system_clock();
  sluice::Drl drl(&clock);
  Measured m;
  m.burst_bytes = c.rate * static_cast<double>(c.refill_us) / 1e6;
  if (c.rate > 1e15) m.burst_bytes = 0;  // offered(): never empties, none to subtract
  // Any one thread may take every grant; no buffer grows while measuring.
  // (At most 2^22 grants a thread: offered() runs briefly, the generator
  // makes < 2^23 a second.)
  const auto capacity =
      std::min<std::size_t>(std::size_t{1} << 22,
                            static_cast<std::size_t>((m.burst_bytes + c.rate * (c.seconds + 1)) /
                                                     static_cast<double>(c.size) * 1.05)) +
      1024;
  std::vector<ThreadLog> logs(static_cast<std::size_t>(c.threads));
  for (ThreadLog& log : logs) log.grants.reserve(capacity);
  // Decision times, appended under the bucket's lock (no allocation while
  // measuring: one thread may take every grant).
  std::vector<std::int64_t> decided;
  decided.reserve(capacity);
  if (g_observe) {
    drl.set_grant_observer([&decided](std::int64_t at, double /*cost*/) {
      if (decided.size() < decided.capacity()) decided.push_back(at);
    });
  }

  std::atomic<bool> go{false};
  std::int64_t end_ns = 0;  // written before `go`
  std::vector<std::thread> threads;
  for (ThreadLog& log : logs) {
    threads.emplace_back([&, &log = log] {
      sluice::Context ctx;
      ctx.size = c.size;
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      log.start = clock.now_ns();
      for (;;) {
        const sluice::Verdict r = drl.enforce_context(ctx);
        const std::int64_t t = clock.now_ns();
        if (log.grants.size() == log.grants.capacity()) {
          log.overflow = true;
          break;
        }
        log.grants.push_back(t);
        if (r.wait_ns > 0 && t < log.first_wait) log.first_wait = t;
        if (t >= end_ns) break;
      }
    });
  }
  const nlohmann::json config = {{"rate", c.rate}, {"refill_period_us", c.refill_us}};
  if (!drl.configure(config).is_ok()) std::abort();
  end_ns = clock.now_ns() + static_cast<std::int64_t>(c.seconds * 1e9);
  go.store(true, std::memory_order_release);
  for (std::thread& t : threads) t.join();
  const nlohmann::json stats = drl.collect();
  m.overflow_bytes = stats["overflow_tokens"].get<double>();
  m.late_forfeited_bytes = stats["late_forfeited_tokens"].get<double>();

  std::vector<std::int64_t> all;
  std::int64_t first_wait = std::numeric_limits<std::int64_t>::max();
  std::int64_t start = std::numeric_limits<std::int64_t>::max();
  for (const ThreadLog& log : logs) {
    start = std::min(start, log.start);
    if (log.overflow) std::fprintf(stderr, "warning: grant buffer overflow\n");
    all.insert(all.end(), log.grants.begin(), log.grants.end());
    first_wait = std::min(first_wait, log.first_wait);
  }
  std::sort(all.begin(), all.end());
  const auto size = static_cast<double>(c.size);
  m.grants = all.size();
  m.elapsed_s = static_cast<double>(all.back() - start) / 1e9;
  // The bucket was full when the first request came; nothing accrued before
  // that (a full bucket accrues nothing).
  m.achieved_bps = (static_cast<double>(all.size()) * size - m.burst_bytes) / m.elapsed_s;
  m.error_pct = (m.achieved_bps - c.rate) / c.rate * 100;

  if (!g_observe) decided = all;  // the closest to decision times without an observer
  if (g_observe && decided.size() == decided.capacity()) {
    std::fprintf(stderr, "warning: decision log full\n");
  }
  std::sort(decided.begin(), decided.end());  // in lock order already; cheap
  std::tie(m.initial_burst_bytes, m.steady_burst_bytes) =
      window_excess(decided, first_wait, size, c.rate);
  m.max_burst_bytes = std::max(m.initial_burst_bytes, m.steady_burst_bytes);
  const auto [initial_at_return, steady_at_return] = window_excess(all, first_wait, size, c.rate);
  m.max_burst_at_return_bytes = std::max(initial_at_return, steady_at_return);
  return m;
}

// The load generator's capacity for `size` x `threads`: the same closed loop
// through the bucket's fast path, at a rate it cannot reach (a bucket of
// 1e15 B that never empties). A target near it measures the generator (and
// the machine's other load), not the limiter.
double offered_bps(std::uint64_t size, int threads, double seconds) {
  return run({1e18, size, threads, 1000, seconds}).achieved_bps;
}

// How late a 1 ms timed wait on the system clock returns (p50, p99, in us):
// the scheduling noise a real-time token bucket has to absorb. A late wakeup
// longer than the refill period is rate the bucket cannot give back.
std::pair<double, double> wake_latency_us() {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<double> late;
  sluice::Clock& clock = sluice::system_clock();
  for (int i = 0; i < 100; ++i) {
    std::unique_lock<std::mutex> lock(mu);
    const std::int64_t deadline = clock.now_ns() + 1'000'000;
    while (clock.now_ns() < deadline) clock.wait_until(lock, cv, deadline);
    late.push_back(static_cast<double>(clock.now_ns() - deadline) / 1e3);
  }
  return {sluice::bench::percentile(late, 0.5), sluice::bench::percentile(late, 0.99)};
}

// "4096", "4k", "4KiB", "16MiB", "2G", "1.5M/s": binary multiples.
std::optional<double> parse_amount(std::string_view text) {
  if (text.size() >= 2 && text.substr(text.size() - 2) == "/s") text.remove_suffix(2);
  const std::string s(text);
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !(value > 0)) return std::nullopt;
  std::string suffix(end);
  for (char& ch : suffix) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (suffix == "" || suffix == "b") return value;
  if (suffix == "k" || suffix == "kib") return value * kKiB;
  if (suffix == "m" || suffix == "mib") return value * kMiB;
  if (suffix == "g" || suffix == "gib") return value * kGiB;
  return std::nullopt;
}

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (std::abs(bytes) >= 1024 && u < 3) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g %s", bytes, units[u]);
  return buf;
}

constexpr char kUsage[] =
    "usage: sluice-bench-drl [--rate R] [--size S] [--threads T] [--refill-us P]\n"
    "                        [--seconds N] [--quick] [--json] [--unobserved]\n"
    "                        [--max-steal PCT --attempts K]\n"
    "Runs the matrix rates {1M, 16M, 256M, 2G}/s x sizes {4K, 64K, 1M} x threads\n"
    "{1, 2, 4} x refill periods {1000, 10000, 100000, 1000000} us, --seconds each\n"
    "(default 10). Each of --rate/--size/--threads/--refill-us fixes its dimension;\n"
    "all four select one configuration. --quick: 8 representative configurations\n"
    "of 5 s. --json: JSON lines only, no table. Sizes take K/M/G (binary).\n"
    "--unobserved: no grant observer (grants may take the lock-free path); bursts\n"
    "are then measured on return times.\n"
    "--max-steal PCT --attempts K: run a configuration again, up to K times in\n"
    "all, while the host stole more than PCT% of the CPU during it (every\n"
    "attempt is printed; the table shows the last).\n";

[[noreturn]] void usage(int code) {
  sluice::bench::exit_with_usage(code, kUsage);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> rates = {kMiB, 16 * kMiB, 256 * kMiB, 2 * kGiB};
  std::vector<std::uint64_t> sizes = {4096, 65536, 1 << 20};
  std::vector<int> thread_counts = {1, 2, 4};
  std::vector<std::int64_t> refills = {1000, 10'000, 100'000, 1'000'000};
  std::optional<double> seconds;
  bool quick = false, json_only = false, fixed = false;
  sluice::bench::StealRetry retry;

  // --rate, --size, --threads and --refill-us each fix their dimension to one amount.
  auto fix = [&fixed](auto& dimension) {
    return [&fixed, &dimension](const std::string& v) {
      const std::optional<double> x = parse_amount(v);
      if (!x) return false;
      using T = typename std::decay_t<decltype(dimension)>::value_type;
      dimension = {static_cast<T>(*x)};
      fixed = true;
      return true;
    };
  };
  using sluice::bench::Option;
  const Option options[] = {
      Option::with_value("--rate", fix(rates)),
      Option::with_value("--size", fix(sizes)),
      Option::with_value("--threads", fix(thread_counts)),
      Option::with_value("--refill-us", fix(refills)),
      Option::with_value("--seconds",
                         [&seconds](const std::string& v) {
                           seconds = std::strtod(v.c_str(), nullptr);
                           return *seconds > 0;
                         }),
      {"--quick", &quick, true},
      {"--json", &json_only, true},
      {"--unobserved", &g_observe, false},
      Option::with_value("--max-steal",
                         [&retry](const std::string& v) {
                           char* end = nullptr;
                           retry.max_steal_pct = std::strtod(v.c_str(), &end);
                           return end != v.c_str() && *end == '\0' && retry.max_steal_pct >= 0;
                         }),
      Option::with_value("--attempts",
                         [&retry](const std::string& v) {
                           retry.attempts = std::atoi(v.c_str());
                           return retry.attempts >= 1;
                         }),
      Option::flag("--help", [] { usage(0); }),
      Option::flag("-h", [] { usage(0); }),
  };
  if (!sluice::bench::parse_options(options, argc, argv).ok()) usage(2);
  if (quick && fixed) usage(2);

  std::vector<BenchConfig> configs;
  if (quick) {
    const double s = seconds.value_or(5);
    configs = {{kMiB, 4096, 1, 1000, s},
               {kMiB, 1 << 20, 2, 1'000'000, s},
               {16 * kMiB, 65536, 4, 10'000, s},
               {16 * kMiB, 4096, 2, 100'000, s},
               {256 * kMiB, 1 << 20, 1, 10'000, s},
               {256 * kMiB, 4096, 4, 1'000'000, s},
               {2 * kGiB, 4096, 4, 1000, s},
               {2 * kGiB, 65536, 2, 100'000, s}};
  } else {
    for (double rate : rates)
      for (std::uint64_t size : sizes)
        for (int threads : thread_counts)
          for (std::int64_t refill : refills)
            configs.push_back({rate, size, threads, refill, seconds.value_or(10)});
  }
  for (const BenchConfig& c : configs) {
    if (c.threads < 1 || c.size < 1 || c.refill_us < 1) usage(2);
  }

  const auto [wake_p50_us, wake_p99_us] = wake_latency_us();
  std::vector<Measured> results;
  std::vector<double> offered;
  std::vector<double> steal;
  std::vector<int> tries;
  for (const BenchConfig& c : configs) {
    offered.emplace_back();
    steal.emplace_back();
    results.emplace_back();
    tries.emplace_back();
    for (int attempt = 1; attempt <= retry.attempts; ++attempt) {
      // Measured next to each run: the machine's load changes under us.
      const double offered_now = offered_bps(c.size, c.threads, 0.3);
      const sluice::bench::CpuTicks before = sluice::bench::read_cpu_ticks();
      const Measured m = run(c);
      const double steal_now = sluice::bench::steal_pct(before, sluice::bench::read_cpu_ticks());
      offered.back() = offered_now;
      steal.back() = steal_now;
      results.back() = m;
      tries.back() = attempt;
      const bool generator_bound = c.rate > kGeneratorBound * offered.back();
      const double lost_pct =
          (m.overflow_bytes + m.late_forfeited_bytes) / (c.rate * m.elapsed_s) * 100;
      const double residual_pct = m.error_pct + lost_pct;
      const bool scheduler_bound =
          std::abs(m.error_pct) > kTargetPct && std::abs(residual_pct) <= kTargetPct;
      const nlohmann::json line = {
          {"bench", "drl"},
          {"rate_bps", c.rate},
          {"size", c.size},
          {"threads", c.threads},
          {"refill_period_us", c.refill_us},
          {"seconds", c.seconds},
          {"burst_bytes", m.burst_bytes},
          {"grants", m.grants},
          {"elapsed_s", m.elapsed_s},
          {"achieved_bps", m.achieved_bps},
          {"error_pct", m.error_pct},
          {"max_burst_bytes", m.max_burst_bytes},
          {"initial_burst_bytes", m.initial_burst_bytes},
          {"steady_burst_bytes", m.steady_burst_bytes},
          {"max_burst_at_return_bytes", m.max_burst_at_return_bytes},
          {"wake_p50_us", wake_p50_us},
          {"wake_p99_us", wake_p99_us},
          {"offered_bps", offered.back()},
          {"generator_bound", generator_bound},
          {"overflow_bytes", m.overflow_bytes},
          {"late_forfeited_bytes", m.late_forfeited_bytes},
          {"lost_pct", lost_pct},
          {"residual_error_pct", residual_pct},
          {"scheduler_bound", scheduler_bound},
          {"host_steal_pct", steal.back()},
          {"observed", g_observe},
          {"attempt", attempt},
          {"quiet", retry.quiet(steal_now)},
          {"burst_ok", m.max_burst_bytes <= m.burst_bytes + static_cast<double>(c.size)}};
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
      if (retry.last(attempt, steal_now)) break;
    }
  }
  if (json_only) return 0;

  std::fprintf(stderr, "\nlate wakeups of a 1 ms timed wait: p50 %.0f us, p99 %.0f us\n",
               wake_p50_us, wake_p99_us);
  std::fprintf(stderr, "%-10s %-8s %3s %9s %12s %9s %12s %12s %12s %12s %12s %7s %7s %9s %6s %3s\n",
               "rate", "size", "thr", "refill", "achieved", "error%", "burst", "initial", "steady",
               "at return", "offered", "late%", "idle%", "residual%", "steal%", "try");
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const BenchConfig& c = configs[i];
    const Measured& m = results[i];
    const double expected = c.rate * m.elapsed_s / 100;  // bytes per percent of the run
    const double late = m.late_forfeited_bytes / expected, idle = m.overflow_bytes / expected;
    const double residual = m.error_pct + late + idle;
    std::string flags;
    if (c.rate > kGeneratorBound * offered[i]) flags += "  generator-bound";
    if (std::abs(m.error_pct) > kTargetPct && std::abs(residual) <= kTargetPct) {
      flags += "  scheduler-bound";
    }
    if (m.max_burst_bytes > m.burst_bytes + static_cast<double>(c.size)) flags += "  burst!";
    std::fprintf(stderr,
                 "%-10s %-8s %3d %7lldus %12s %+9.4f %12s %12s %12s %12s %12s %7.3f %7.3f %+9.4f "
                 "%6.1f %3d%s\n",
                 (human(c.rate) + "/s").c_str(), human(static_cast<double>(c.size)).c_str(),
                 c.threads, static_cast<long long>(c.refill_us),
                 (human(m.achieved_bps) + "/s").c_str(), m.error_pct, human(m.burst_bytes).c_str(),
                 human(m.initial_burst_bytes).c_str(), human(m.steady_burst_bytes).c_str(),
                 human(m.max_burst_at_return_bytes).c_str(), (human(offered[i]) + "/s").c_str(),
                 late, idle, residual, steal[i], tries[i], flags.c_str());
  }
  int within = 0, quiet = 0, quiet_within = 0, bursts = 0;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const bool hit = std::abs(results[i].error_pct) <= kTargetPct;
    const bool q = retry.quiet(steal[i]);
    within += hit ? 1 : 0;
    quiet += q ? 1 : 0;
    quiet_within += (q && hit) ? 1 : 0;
    bursts +=
        results[i].max_burst_bytes <= results[i].burst_bytes + static_cast<double>(configs[i].size)
            ? 1
            : 0;
  }
  std::fprintf(stderr,
               "within %.1f%% of the rate: %d of %zu; burst within the configured: %d of %zu\n",
               kTargetPct, within, configs.size(), bursts, configs.size());
  if (retry.attempts > 1) {
    std::fprintf(stderr, "last attempts at host steal <= %.2f%%: %d, of which within %.1f%%: %d\n",
                 retry.max_steal_pct, quiet, kTargetPct, quiet_within);
  }
  return 0;
}
