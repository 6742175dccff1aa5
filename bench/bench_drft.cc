// sluice-bench-drft: what the drft transaction scheduler costs per transaction.
//
// One transaction is what the RocksDB binding does around a real one: an admission
// (acquire, with two declared items), a report of its end (on_end, with two items),
// and the release of its admission. No database runs: the figure is the scheduler's
// own cost, to set beside a transaction's (tens of microseconds and up on RocksDB).
// Variants, each over 64 tenants, closed-loop threads, the system clock:
//   object        the object called directly, slots enough that nobody waits (the
//                 no-wait path: one lock per call, no allocation, no system call)
//   stage         the same through a stage (Stage::acquire routes op begin to the
//                 object; the Hold releases)
//   contended     one slot, four threads or more, each transaction holding its slot
//                 for --work-ns of busy work: most admissions wait and are handed
//                 the slot by a release (the waiting path: a condition variable per
//                 waiter). Its ns_per_txn is the wall time per transaction (the slot
//                 serialises them) less the work: the hand-off, which is mostly the
//                 machine's wake-up latency under load, not the scheduler's bookkeeping
// each with policy drft at Δ 0 and 100 µs, and fifo. object and stage report the wall
// time per transaction of each thread.
// Prints one JSON line per run ({"variant", "policy", "delta_us", "threads", "slots",
// "tenants", "txns", "work_ns", "ns_per_txn", "waited_pct"}) and a table on stderr.
//   --txns N    transactions per thread (default 200000; --quick: 20000)
//   --threads L comma-separated thread counts (default 1,2)
//   --work-ns N the contended variant's work per transaction (default 2000)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/hold.h"
#include "sluice/objects/builtin.h"
#include "sluice/objects/drft.h"
#include "sluice/stage.h"
#include "sluice/txn.h"
#include "support/cli.h"

namespace {

using nlohmann::json;
using sluice::Context;

constexpr std::uint32_t kTenants = 64;

struct Run {
  std::string variant;
  std::string policy;
  double delta_us = 0;
  int threads = 1;
  std::uint32_t slots = 0;
  std::uint64_t txns = 0;
  std::uint64_t work_ns = 0;
  double ns_per_txn = 0;
  double waited_pct = 0;
};

json config_of(const Run& r) {
  json c = {{"slots", r.slots}, {"policy", r.policy}, {"delta_us", r.delta_us}};
  return c;
}

// One transaction's scheduling on the calling thread; true when its admission waited.
void busy_for(std::uint64_t ns) {
  if (ns == 0) return;
  const auto end = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  while (std::chrono::steady_clock::now() < end) {
  }
}

template <typename Admit>
bool one_txn(Admit&& admit, std::uint32_t tenant, std::uint64_t id, std::uint64_t work_ns) {
  static const sluice::txn::ItemId items[] = {sluice::txn::item_of("hot"),
                                              sluice::txn::item_of("cold")};
  Context ctx;
  ctx.op = sluice::Op::kBegin;
  ctx.tenant = tenant;
  ctx.workflow = id;
  ctx.origin = sluice::origin::kForeground;
  sluice::Hold hold;
  {
    sluice::txn::DeclaredItemsScope scope(items);
    hold = admit(ctx);
  }
  busy_for(work_ns);
  if (sluice::txn::TxnAccounting* acct = sluice::txn::accounting_of(hold)) {
    sluice::txn::TxnReport r;
    r.items = items;
    acct->on_end(hold.context(), r);
  }
  const bool waited = hold.verdict().wait_ns > 0;
  hold.release_all();
  return waited;
}

void measure(Run& r, std::uint64_t per_thread) {
  std::shared_ptr<sluice::Drft> object;
  std::unique_ptr<sluice::Stage> stage;
  if (r.variant == "stage") {
    stage = sluice::Stage::create(sluice::StageOptions{}).value();
    const json rules = json::array(
        {{{"rule", "differentiate"}, {"classifiers", {"operation"}}},
         {{"rule", "create_channel"}, {"channel", "txn"}, {"match", {{"operation", "begin"}}}},
         {{"rule", "create_object"},
          {"channel", "txn"},
          {"object", "sched"},
          {"type", "drft"},
          {"config", config_of(r)}},
         {{"rule", "create_channel"}, {"channel", "rest"}, {"default", true}}});
    if (sluice::Status st = stage->apply(rules); !st.is_ok()) {
      std::fprintf(stderr, "rules: %s\n", st.message().c_str());
      std::exit(1);
    }
  } else {
    object = std::make_shared<sluice::Drft>(nullptr);
    if (sluice::Status st = object->configure(config_of(r)); !st.is_ok()) {
      std::fprintf(stderr, "config: %s\n", st.message().c_str());
      std::exit(1);
    }
  }
  auto admit = [&](const Context& ctx) {
    if (stage) return stage->acquire(ctx, 1);
    return sluice::Hold(object, ctx, 1, object->acquire(ctx, 1));
  };
  std::atomic<std::uint64_t> waited{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < r.threads; ++t) {
    ts.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) {
      }
      std::uint64_t w = 0;
      for (std::uint64_t i = 0; i < per_thread; ++i) {
        const auto tenant =
            static_cast<std::uint32_t>((i * 7 + static_cast<std::uint64_t>(t)) % kTenants);
        const std::uint64_t id = (static_cast<std::uint64_t>(t) << 40) | (i + 1);
        if (one_txn(admit, tenant, id, r.work_ns)) ++w;
      }
      waited.fetch_add(w);
    });
  }
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& t : ts) t.join();
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  r.txns = per_thread * static_cast<std::uint64_t>(r.threads);
  // Uncontended: wall time per transaction per thread, what one thread pays for each of
  // its own. Contended: the slot serialises them; wall time per transaction less its work.
  r.ns_per_txn = r.work_ns == 0 ? ns / static_cast<double>(per_thread)
                                : ns / static_cast<double>(r.txns) - static_cast<double>(r.work_ns);
  r.waited_pct = 100.0 * static_cast<double>(waited.load()) / static_cast<double>(r.txns);
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t txns = 200000;
  bool quick = false;
  std::string threads_list = "1,2";
  std::uint64_t work_ns = 2000;
  const sluice::bench::Option options[] = {
      {"--work-ns", &work_ns},
      {"--txns", &txns},
      {"--quick", &quick, true},
      {"--threads", &threads_list},
      sluice::bench::Option::flag("--help",
                                  [] {
                                    sluice::bench::exit_with_usage(
                                        0,
                                        "usage: sluice-bench-drft [--quick] [--txns N] "
                                        "[--threads 1,2] [--work-ns N]\n");
                                  }),
  };
  const auto parsed = sluice::bench::parse_options(options, argc, argv);
  if (!parsed.ok()) {
    sluice::bench::print_parse_error(parsed);
    return 2;
  }
  if (quick) txns = std::min<std::uint64_t>(txns, 20000);
  std::vector<int> threads;
  for (const std::string& t : sluice::bench::split_list(threads_list)) {
    const int n = std::atoi(t.c_str());
    if (n < 1 || n > 256) {
      std::fprintf(stderr, "--threads: each count must be from 1 to 256, got '%s'\n", t.c_str());
      return 2;
    }
    threads.push_back(n);
  }
  sluice::objects::register_builtin();
  std::vector<Run> runs;
  for (const char* variant : {"object", "stage", "contended"}) {
    for (auto [policy, delta] : {std::pair{"drft", 0.0}, {"drft", 100.0}, {"fifo", 0.0}}) {
      for (int n : threads) {
        Run r;
        r.variant = variant;
        r.policy = policy;
        r.delta_us = delta;
        r.threads = std::string(variant) == "contended" ? std::max(n, 2) * 2 : n;
        r.slots = std::string(variant) == "contended" ? 1 : 65536;
        r.work_ns = std::string(variant) == "contended" ? work_ns : 0;
        measure(r, txns / (std::string(variant) == "contended" ? 10 : 1));
        runs.push_back(r);
        std::printf("%s\n", json{{"variant", r.variant},
                                 {"policy", r.policy},
                                 {"delta_us", r.delta_us},
                                 {"threads", r.threads},
                                 {"slots", r.slots},
                                 {"tenants", kTenants},
                                 {"txns", r.txns},
                                 {"work_ns", r.work_ns},
                                 {"ns_per_txn", std::round(r.ns_per_txn * 10) / 10},
                                 {"waited_pct", std::round(r.waited_pct * 10) / 10}}
                                .dump()
                                .c_str());
        std::fflush(stdout);
      }
    }
  }
  std::fprintf(stderr, "%-10s %-6s %8s %7s %6s %10s %8s\n", "variant", "policy", "delta_us",
               "threads", "slots", "ns/txn", "waited%");
  for (const Run& r : runs) {
    std::fprintf(stderr, "%-10s %-6s %8.0f %7d %6u %10.1f %8.1f\n", r.variant.c_str(),
                 r.policy.c_str(), r.delta_us, r.threads, r.slots, r.ns_per_txn, r.waited_pct);
  }
  return 0;
}
