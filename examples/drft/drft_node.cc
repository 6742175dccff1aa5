// sluice-drft-node: one run of the drft example (examples/drft): tenants' client threads
// run transactions on one RocksDB TransactionDB (pessimistic, two-phase locking) or
// OptimisticTransactionDB through the scheduled-transaction wrapper
// (sluice/rocksdb_txn.h), whose begins a stage routes to a `drft` object (policy fifo,
// or drft with a Δ): the object decides the order in which waiting transactions start.
//
//   sluice-drft-node --plan PLAN.json --out RUN.jsonl
//
// PLAN (every field checked; an error names it):
//   db            "pessimistic" | "optimistic"
//   workload      "ycsb" | "smallbank" (workload.h), with keys, hot_keys,
//                 items_per_txn, hot_per_txn, write_frac, hot_prob
//   dir           where the database is made (removed first and at the end)
//   scheduler     the drft object's config, verbatim (policy, slots, delta_us, weights)
//   duration_s, bin_ms, op_delay_us (a pause after every access, while the transaction
//                 holds what it accessed: the time a disk-based store or the
//                 application spends), lock_timeout_ms, value_bytes, seed
//   tenants       [{id, clients, start_s, stop_s, extra_items}]: `clients` closed-loop
//                 client threads from start_s to stop_s, each running one transaction
//                 at a time (retried, with exponential back-off from 100 µs to 3.2 ms, on
//                 Busy, TryAgain or TimedOut), padding every one with extra_items
//                 hot keys it does not need.
//
// Output (JSON lines): a "start" line (the plan); per bin a "bin" line with, per tenant,
// the transactions committed and retried in the bin and the drft object's cumulative
// counters (usage_us, committed, admitted, waits, vt_us); an "end" line with the
// wrapper's totals, the object's final state and per-tenant totals.
//
// Exit status: 0; 1 on a runtime error (stage, rules, DB, an operation failing other
// than by contention); 2 on a bad plan (the message names the field).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <rocksdb/utilities/optimistic_transaction_db.h>
#include <rocksdb/utilities/transaction_db.h>
#include <nlohmann/json.hpp>

#include "sluice/config_reader.h"
#include "sluice/json_text.h"
#include "sluice/objects/builtin.h"
#include "sluice/rocksdb_txn.h"
#include "sluice/stage.h"
#include "support/cli.h"
#include "workload.h"

namespace {

using nlohmann::json;
using sluice::examples::drft::Access;
using sluice::examples::drft::Workload;
using sluice::examples::drft::WorkloadSpec;
using namespace sluice::rocksdb_binding;
using Clock = std::chrono::steady_clock;

struct TenantPlan {
  std::uint32_t id = 0;
  int clients = 1;
  double start_s = 0;
  double stop_s = 0;
  int extra_items = 0;
};

struct Plan {
  bool pessimistic = true;
  WorkloadSpec workload;
  std::string dir;
  json scheduler;
  double duration_s = 5;
  int bin_ms = 250;
  int op_delay_us = 200;
  int lock_timeout_ms = 200;
  int value_bytes = 100;
  std::uint64_t seed = 1;
  std::vector<TenantPlan> tenants;
};

// The plan (a JSON object) as run() takes it; the error names the field at fault
// ("tenants[1].stop_s: must be >= 2 and <= 5, got 7").
sluice::StatusOr<Plan> parse_plan(const json& j) {
  namespace cfg = sluice::config;
  SLUICE_RETURN_IF_ERROR(
      cfg::check_keys(j, "",
                      {"db", "workload", "dir", "scheduler", "keys", "hot_keys", "items_per_txn",
                       "hot_per_txn", "write_frac", "hot_prob", "duration_s", "bin_ms",
                       "op_delay_us", "lock_timeout_ms", "value_bytes", "seed", "tenants"}));
  Plan p;
  for (const char* key : {"db", "workload", "dir", "scheduler", "duration_s", "tenants"}) {
    SLUICE_RETURN_IF_ERROR(cfg::require(j, "", key));
  }
  SLUICE_RETURN_IF_ERROR(cfg::get_choice<bool>(
      j, "", "db", {{"pessimistic", true}, {"optimistic", false}}, &p.pessimistic));
  auto& w = p.workload;
  SLUICE_RETURN_IF_ERROR(cfg::get_choice<bool>(
      j, "", "workload", {{"ycsb", false}, {"smallbank", true}}, &w.smallbank));
  SLUICE_RETURN_IF_ERROR(cfg::get_string(j, "", "dir", &p.dir));
  if (!j["scheduler"].is_object()) {
    return sluice::Status::invalid("scheduler: must be the drft object's config (an object)");
  }
  p.scheduler = j["scheduler"];
  SLUICE_RETURN_IF_ERROR(cfg::get_integer<std::uint64_t>(j, "", "keys", &w.keys, 16, 100'000'000));
  SLUICE_RETURN_IF_ERROR(
      cfg::get_integer<std::uint64_t>(j, "", "hot_keys", &w.hot_keys, 0, w.keys / 2));
  SLUICE_RETURN_IF_ERROR(cfg::get_integer(j, "", "items_per_txn", &w.items_per_txn, 1, 64));
  SLUICE_RETURN_IF_ERROR(
      cfg::get_integer(j, "", "hot_per_txn", &w.hot_per_txn, 0, w.items_per_txn));
  SLUICE_RETURN_IF_ERROR(cfg::get_number(j, "", "write_frac", &w.write_frac, 0, true, 1));
  SLUICE_RETURN_IF_ERROR(cfg::get_number(j, "", "hot_prob", &w.hot_prob, 0, true, 1));
  SLUICE_RETURN_IF_ERROR(cfg::get_number(j, "", "duration_s", &p.duration_s, 0.1, true, 3600));
  SLUICE_RETURN_IF_ERROR(cfg::get_integer(j, "", "bin_ms", &p.bin_ms, 10, 60'000));
  SLUICE_RETURN_IF_ERROR(cfg::get_integer(j, "", "op_delay_us", &p.op_delay_us, 0, 1'000'000));
  SLUICE_RETURN_IF_ERROR(cfg::get_integer(j, "", "lock_timeout_ms", &p.lock_timeout_ms, 1, 60'000));
  SLUICE_RETURN_IF_ERROR(cfg::get_integer(j, "", "value_bytes", &p.value_bytes, 1, 1 << 20));
  SLUICE_RETURN_IF_ERROR(cfg::get_integer<std::uint64_t>(j, "", "seed", &p.seed, 0, UINT64_MAX));
  const json& tenants = j["tenants"];
  if (!tenants.is_array() || tenants.empty()) {
    return sluice::Status::invalid("tenants: must be a non-empty array");
  }
  for (std::size_t i = 0; i < tenants.size(); ++i) {
    const json& t = tenants[i];
    const std::string at = "tenants[" + std::to_string(i) + "]";
    SLUICE_RETURN_IF_ERROR(
        cfg::check_keys(t, at, {"id", "clients", "start_s", "stop_s", "extra_items"}));
    SLUICE_RETURN_IF_ERROR(cfg::require(t, at, "id"));
    TenantPlan tp;
    tp.stop_s = p.duration_s;
    SLUICE_RETURN_IF_ERROR(cfg::get_integer<std::uint32_t>(t, at, "id", &tp.id, 1, 1'000'000));
    SLUICE_RETURN_IF_ERROR(cfg::get_integer(t, at, "clients", &tp.clients, 0, 256));
    SLUICE_RETURN_IF_ERROR(cfg::get_number(t, at, "start_s", &tp.start_s, 0, true, p.duration_s));
    SLUICE_RETURN_IF_ERROR(
        cfg::get_number(t, at, "stop_s", &tp.stop_s, tp.start_s, true, p.duration_s));
    SLUICE_RETURN_IF_ERROR(cfg::get_integer(t, at, "extra_items", &tp.extra_items, 0, 8));
    for (const TenantPlan& o : p.tenants) {
      if (o.id == tp.id) {
        return sluice::Status::invalid(at + ".id: " + std::to_string(tp.id) + " appears twice");
      }
    }
    p.tenants.push_back(tp);
  }
  return p;
}

bool contention(const rocksdb::Status& s) {
  return s.IsBusy() || s.IsTryAgain() || s.IsTimedOut();
}

struct TenantCounters {
  std::atomic<std::uint64_t> commits{0};
  std::atomic<std::uint64_t> retries{0};
};

struct Shared {
  const Plan* plan = nullptr;
  const Workload* workload = nullptr;
  ScheduledTransactionDB* db = nullptr;
  Clock::time_point t0;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> errors{0};
  std::string first_error;  // written once, by the thread that set errors from 0
};

void note_error(Shared& sh, const std::string& what) {
  if (sh.errors.fetch_add(1) == 0) sh.first_error = what;
}

// One closed-loop client of `tenant`: a transaction at a time until its stop time.
void client(Shared& sh, const TenantPlan& tenant, TenantCounters& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Plan& p = *sh.plan;
  const auto at = [&](double s) {
    return sh.t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  const auto stop_at = at(tenant.stop_s);
  while (!sh.stop && Clock::now() < at(tenant.start_s)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string value(static_cast<std::size_t>(p.value_bytes), 'v');
  const auto pause = std::chrono::microseconds(p.op_delay_us);
  std::vector<rocksdb::Slice> declared;
  while (!sh.stop && Clock::now() < stop_at) {
    const std::vector<Access> txn = sh.workload->next(rng, tenant.extra_items);
    declared.clear();
    for (std::size_t i = 0; i < txn.size() && i < sluice::txn::kMaxReportedItems; ++i) {
      declared.emplace_back(txn[i].key);
    }
    BeginOptions opts;
    opts.write_options.disableWAL = true;
    opts.pessimistic.deadlock_detect = true;
    opts.declared_keys = declared;
    auto backoff = std::chrono::microseconds(100);
    for (;;) {  // attempts, until committed or the run is over
      std::unique_ptr<ScheduledTxn> t;
      rocksdb::Status s = sh.db->Begin(tenant.id, opts, &t);
      if (!s.ok()) {
        note_error(sh, "begin: " + s.ToString());
        return;
      }
      std::string v;
      for (const Access& a : txn) {
        s = a.write ? t->GetForUpdate(a.key, &v) : t->Get(a.key, &v);
        if (s.ok() && a.write) s = t->Put(a.key, value);
        if (!s.ok()) break;
        if (p.op_delay_us > 0) std::this_thread::sleep_for(pause);
      }
      if (s.ok()) s = t->Commit();
      if (s.ok()) {
        c.commits.fetch_add(1, std::memory_order_relaxed);
        break;
      }
      if (!t->ended()) (void)t->Rollback();
      if (!contention(s)) {
        note_error(sh, "transaction: " + s.ToString());
        return;
      }
      c.retries.fetch_add(1, std::memory_order_relaxed);
      if (sh.stop) return;
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::microseconds(3200));
    }
  }
}

json tenant_state(const json& sched, std::uint32_t id) {
  for (const json& t : sched["tenants"]) {
    if (t["tenant"] == id) return t;
  }
  return json::object();
}

int run(const Plan& p, const std::string& out_path, const json& plan_json) {
  namespace fs = std::filesystem;
  sluice::objects::register_builtin();
  auto stage_or = sluice::Stage::create(sluice::StageOptions{});
  if (!stage_or.is_ok()) {
    std::fprintf(stderr, "drft-node: stage: %s\n", stage_or.status().to_string().c_str());
    return 1;
  }
  std::unique_ptr<sluice::Stage> stage = std::move(stage_or).value();
  const json rules = json::array(
      {{{"rule", "differentiate"}, {"classifiers", {"operation"}}},
       {{"rule", "create_channel"}, {"channel", "txn"}, {"match", {{"operation", "begin"}}}},
       {{"rule", "create_object"},
        {"channel", "txn"},
        {"object", "sched"},
        {"type", "drft"},
        {"config", p.scheduler}},
       {{"rule", "create_channel"}, {"channel", "ops"}, {"default", true}}});
  if (const sluice::Status st = stage->apply(rules); !st.is_ok()) {
    std::fprintf(stderr, "drft-node: scheduler: %s\n", st.to_string().c_str());
    return 2;
  }
  std::ofstream out(out_path);
  if (!out) {
    std::fprintf(stderr, "drft-node: --out: cannot write %s\n", out_path.c_str());
    return 1;
  }
  auto sched_obj = stage->object("txn", "sched");
  TxnScheduler sched(*stage);

  std::error_code ec;
  fs::remove_all(p.dir, ec);
  fs::create_directories(p.dir, ec);
  rocksdb::Options o;
  o.create_if_missing = true;
  o.write_buffer_size = 64 << 20;
  std::unique_ptr<rocksdb::TransactionDB> pdb;
  std::unique_ptr<rocksdb::OptimisticTransactionDB> odb;
  std::unique_ptr<ScheduledTransactionDB> db;
  rocksdb::Status s;
  if (p.pessimistic) {
    rocksdb::TransactionDBOptions t;
    t.custom_mutex_factory = sched.mutex_factory();
    t.transaction_lock_timeout = p.lock_timeout_ms;
    rocksdb::TransactionDB* raw = nullptr;
    s = rocksdb::TransactionDB::Open(o, t, p.dir + "/db", &raw);
    pdb.reset(raw);
    if (s.ok()) db = std::make_unique<ScheduledTransactionDB>(pdb.get(), sched);
  } else {
    rocksdb::OptimisticTransactionDB* raw = nullptr;
    s = rocksdb::OptimisticTransactionDB::Open(o, p.dir + "/db", &raw);
    odb.reset(raw);
    if (s.ok()) db = std::make_unique<ScheduledTransactionDB>(odb.get(), sched);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "drft-node: open %s: %s\n", p.dir.c_str(), s.ToString().c_str());
    return 1;
  }
  const Workload workload(p.workload);
  {  // the load, outside any transaction
    const std::string value(static_cast<std::size_t>(p.value_bytes), 'v');
    rocksdb::WriteOptions wo;
    wo.disableWAL = true;
    for (const std::string& k : workload.all_keys()) {
      if (s = db->db()->Put(wo, k, value); !s.ok()) {
        std::fprintf(stderr, "drft-node: load: %s\n", s.ToString().c_str());
        return 1;
      }
    }
  }
  out << json{{"kind", "start"}, {"plan", plan_json}}.dump() << "\n";

  Shared sh;
  sh.plan = &p;
  sh.workload = &workload;
  sh.db = db.get();
  std::vector<std::unique_ptr<TenantCounters>> counters;
  for (std::size_t i = 0; i < p.tenants.size(); ++i) {
    counters.push_back(std::make_unique<TenantCounters>());
  }
  std::vector<std::thread> threads;
  sh.t0 = Clock::now();
  for (std::size_t i = 0; i < p.tenants.size(); ++i) {
    for (int c = 0; c < p.tenants[i].clients; ++c) {
      const std::uint64_t seed = p.seed * 1'000'003 + p.tenants[i].id * 1009 + c;
      threads.emplace_back(client, std::ref(sh), std::cref(p.tenants[i]), std::ref(*counters[i]),
                           seed);
    }
  }
  std::vector<std::uint64_t> last_commits(p.tenants.size()), last_retries(p.tenants.size());
  const auto bin = std::chrono::milliseconds(p.bin_ms);
  const auto end = sh.t0 + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(p.duration_s));
  for (auto next = sh.t0 + bin; next <= end + bin / 2 && sh.errors == 0; next += bin) {
    std::this_thread::sleep_until(next);
    const json state = sched_obj->collect();
    json tenants = json::array();
    for (std::size_t i = 0; i < p.tenants.size(); ++i) {
      const std::uint64_t c = counters[i]->commits.load(), r = counters[i]->retries.load();
      const json t = tenant_state(state, p.tenants[i].id);
      tenants.push_back({{"tenant", p.tenants[i].id},
                         {"commits", c - last_commits[i]},
                         {"retries", r - last_retries[i]},
                         {"usage_us", t.value("usage_us", 0.0)},
                         {"committed", t.value("committed", 0)},
                         {"admitted", t.value("admitted", 0)},
                         {"waits", t.value("waits", 0)},
                         {"vt_us", t.value("vt_us", 0.0)}});
      last_commits[i] = c;
      last_retries[i] = r;
    }
    const double t_s = std::chrono::duration<double>(next - sh.t0).count();
    out << json{{"kind", "bin"}, {"t", t_s}, {"tenants", tenants}}.dump() << "\n";
  }
  sh.stop = true;
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - sh.t0).count();
  const TxnTotals tot = sched.totals();
  json per = json::array();
  for (std::size_t i = 0; i < p.tenants.size(); ++i) {
    per.push_back({{"tenant", p.tenants[i].id},
                   {"commits", counters[i]->commits.load()},
                   {"retries", counters[i]->retries.load()}});
  }
  out << json{{"kind", "end"},
              {"elapsed_s", elapsed},
              {"errors", sh.errors.load()},
              {"first_error", sh.first_error},
              {"totals",
               {{"begun", tot.begun},
                {"waited", tot.waited},
                {"wait_us", tot.wait_ns / 1000},
                {"unscheduled", tot.unscheduled},
                {"refused", tot.refused},
                {"committed", tot.committed},
                {"aborted", tot.aborted},
                {"conflicts", tot.conflicts},
                {"lock_waits", tot.lock_waits},
                {"lock_wait_us", tot.lock_wait_ns / 1000},
                {"lock_timeouts", tot.lock_timeouts}}},
              {"sched", sched_obj->collect()},
              {"tenants", per}}
             .dump()
      << "\n";
  out.flush();
  db.reset();
  pdb.reset();
  odb.reset();
  fs::remove_all(p.dir, ec);
  if (sh.errors != 0) {
    std::fprintf(stderr, "drft-node: %llu failed transactions, the first: %s\n",
                 static_cast<unsigned long long>(sh.errors.load()), sh.first_error.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr char kUsage[] = "usage: sluice-drft-node --plan PLAN.json --out RUN.jsonl\n";
  std::string plan_path, out_path;
  const sluice::bench::Option options[] = {{"--plan", &plan_path}, {"--out", &out_path}};
  sluice::bench::parse_options_or_exit(options, argc, argv, kUsage);
  if (plan_path.empty() || out_path.empty()) sluice::bench::exit_with_usage(2, kUsage);
  auto text = sluice::read_rules_file(plan_path);  // the error names the path
  if (!text.is_ok()) {
    std::fprintf(stderr, "drft-node: --plan %s\n", text.status().message().c_str());
    return 2;
  }
  auto read = sluice::parse_json_text(*text);
  if (!read.is_ok()) {
    std::fprintf(stderr, "drft-node: --plan %s: %s\n", plan_path.c_str(),
                 read.status().message().c_str());
    return 2;
  }
  const json& plan_json = *read;
  auto plan = parse_plan(plan_json);
  if (!plan.is_ok()) {
    std::fprintf(stderr, "drft-node: --plan %s: %s\n", plan_path.c_str(),
                 plan.status().message().c_str());
    return 2;
  }
  return run(plan.value(), out_path, plan_json);
}
