// Scheduled transactions on real RocksDB (sluice/rocksdb_txn.h) in temporary
// directories: a stage whose drft object admits begins, on a pessimistic
// TransactionDB (lock waits seen through the mutex factory, charged to the
// blockers' tenants) and an OptimisticTransactionDB (conflicts seen at commit);
// admission order and refusals, operations counted per tenant, and no commit lost
// under concurrency. Waits are awaited by state, never by time.
#include <catch2/catch.hpp>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <rocksdb/utilities/optimistic_transaction_db.h>
#include <rocksdb/utilities/transaction_db.h>
#include <nlohmann/json.hpp>

#include "sluice/objects/builtin.h"
#include "sluice/objects/drft.h"
#include "sluice/rocksdb_txn.h"
#include "sluice/stage.h"
#include "test_util.h"

using namespace sluice;
using namespace sluice::rocksdb_binding;
using nlohmann::json;
using sluice::testing::eventually;
using sluice::testing::TempDir;

namespace {

std::unique_ptr<Stage> txn_stage(const std::string& config) {
  objects::register_builtin();
  auto stage = Stage::create(StageOptions{}).value();
  const Status st = stage->apply(json::parse(R"([
    {"rule": "differentiate", "classifiers": ["operation"]},
    {"rule": "create_channel", "channel": "txn", "match": {"operation": "begin"}},
    {"rule": "create_object", "channel": "txn", "object": "sched", "type": "drft",
     "config": )" + config + R"(},
    {"rule": "create_channel", "channel": "ops", "default": true}
  ])"));
  REQUIRE(st.is_ok());
  return stage;
}

json sched_state(Stage& stage) {
  return stage.object("txn", "sched")->collect();
}

json tenant_of(Stage& stage, std::uint32_t id) {
  const json c = sched_state(stage);
  for (const json& t : c["tenants"]) {
    if (t["tenant"] == id) return t;
  }
  FAIL("no tenant " << id << " in " << c.dump());
  return {};
}

struct Pessimistic {
  TempDir dir;
  std::unique_ptr<rocksdb::TransactionDB> db;
  explicit Pessimistic(TxnScheduler& s) {
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::TransactionDBOptions t;
    t.custom_mutex_factory = s.mutex_factory();
    t.transaction_lock_timeout = 10'000;  // ms: waits end by commit, not by timeout
    rocksdb::TransactionDB* raw = nullptr;
    REQUIRE(rocksdb::TransactionDB::Open(o, t, dir.file("db"), &raw).ok());
    db.reset(raw);
  }
};

struct Optimistic {
  TempDir dir;
  std::unique_ptr<rocksdb::OptimisticTransactionDB> db;
  Optimistic() {
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::OptimisticTransactionDB* raw = nullptr;
    REQUIRE(rocksdb::OptimisticTransactionDB::Open(o, dir.file("db"), &raw).ok());
    db.reset(raw);
  }
};

}  // namespace

TEST_CASE("rocksdb txn: begins are admitted by the stage's scheduler, in its order") {
  auto stage = txn_stage(R"({"slots": 1})");
  TxnScheduler sched(*stage);
  Pessimistic p(sched);
  ScheduledTransactionDB db(p.db.get(), sched);
  std::unique_ptr<ScheduledTxn> a;
  REQUIRE(db.Begin(1, &a).ok());
  REQUIRE(a->Put("k1", "v").ok());
  // Full: a begin that must not wait is refused, and nothing is begun.
  BeginOptions nowait;
  nowait.no_wait = true;
  std::unique_ptr<ScheduledTxn> refused;
  CHECK(db.Begin(2, nowait, &refused).IsBusy());
  CHECK(refused == nullptr);
  CHECK(sched.totals().refused == 1);
  // Tenant 3 then tenant 2 wait, at equal virtual times: admitted in order of arrival
  // when the slot frees.
  // Catch's assertions are for the test's own thread: the others count failures.
  std::vector<std::uint32_t> order;
  std::mutex order_mu;
  std::atomic<int> failures{0};
  auto begin = [&](std::uint32_t tenant) {
    return std::thread([&, tenant] {
      std::unique_ptr<ScheduledTxn> t;
      if (!db.Begin(tenant, &t).ok()) {
        ++failures;
        return;
      }
      {
        std::lock_guard<std::mutex> lock(order_mu);
        order.push_back(tenant);
      }
      if (!t->Put("k" + std::to_string(tenant), "v").ok() || !t->Commit().ok()) ++failures;
    });
  };
  std::thread t3 = begin(3);
  eventually([&] { return sched_state(*stage)["queued"] == 1; });
  std::thread t2 = begin(2);
  eventually([&] { return sched_state(*stage)["queued"] == 2; });
  REQUIRE(a->Commit().ok());
  t3.join();
  t2.join();
  CHECK(failures == 0);
  CHECK(order == std::vector<std::uint32_t>{3, 2});
  const TxnTotals tot = sched.totals();
  CHECK(tot.begun == 3);
  CHECK(tot.committed == 3);
  CHECK(tot.waited == 2);
  CHECK(tenant_of(*stage, 1)["committed"] == 1);
  CHECK(tenant_of(*stage, 3)["waits"] == 1);
  // Operations and ends are counted through the stage, with the tenant.
  const StageStats st = stage->totals();
  const ChannelStats* ops = st.channel("ops");
  REQUIRE(ops != nullptr);
  CHECK(ops->total.ops == 3 /*puts*/ + 3 /*commits*/);
  const ChannelStats* txn = st.channel("txn");
  REQUIRE(txn != nullptr);
  CHECK(txn->total.ops == 3);  // the admitted begins (the refused one was not counted)
  std::string v;
  CHECK(p.db->Get(rocksdb::ReadOptions(), "k3", &v).ok());
}

TEST_CASE("rocksdb txn: lock waits are observed and charged to the blockers' tenants") {
  auto stage = txn_stage(R"({"slots": 4})");
  TxnScheduler sched(*stage);
  Pessimistic p(sched);
  ScheduledTransactionDB db(p.db.get(), sched);
  std::unique_ptr<ScheduledTxn> a;
  REQUIRE(db.Begin(1, &a).ok());
  std::string v;
  REQUIRE(a->GetForUpdate("hot", &v).IsNotFound());
  REQUIRE(a->Put("hot", "a").ok());
  std::unique_ptr<ScheduledTxn> b;
  REQUIRE(db.Begin(2, &b).ok());
  REQUIRE(b->Put("b-own", "b").ok());  // b holds an item while it waits
  std::atomic<bool> waiter_ok{false};  // Catch asserts on the test's thread only
  std::thread waiter([&] { waiter_ok = b->Put("hot", "b").ok() && b->Commit().ok(); });
  // b is waiting when RocksDB names its blocker.
  eventually([&] { return !b->raw()->GetWaitingTxns(nullptr, nullptr).empty(); });
  CHECK(b->raw()->GetWaitingTxns(nullptr, nullptr) ==
        std::vector<rocksdb::TransactionID>{a->raw()->GetID()});
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a wait of some length
  REQUIRE(a->Commit().ok());
  waiter.join();
  CHECK(waiter_ok);
  const TxnTotals tot = sched.totals();
  CHECK(tot.lock_waits >= 1);
  CHECK(tot.lock_wait_ns > 0);
  CHECK(tot.committed == 2);
  const json t2 = tenant_of(*stage, 2);
  CHECK(t2["lock_waits"].get<int>() >= 1);
  CHECK(t2["sdu_passed_us"].get<double>() > 0);
  CHECK(tenant_of(*stage, 1)["sdu_charged_us"].get<double>() > 0);
  REQUIRE(p.db->Get(rocksdb::ReadOptions(), "hot", &v).ok());
  CHECK(v == "b");
}

TEST_CASE("rocksdb txn: optimistic conflicts are observed at commit") {
  auto stage = txn_stage(R"({"slots": 4})");
  TxnScheduler sched(*stage);
  Optimistic o;
  ScheduledTransactionDB db(o.db.get(), sched);
  CHECK_FALSE(db.pessimistic());
  std::unique_ptr<ScheduledTxn> a, b;
  REQUIRE(db.Begin(1, &a).ok());
  REQUIRE(db.Begin(2, &b).ok());
  std::string v;
  REQUIRE(a->GetForUpdate("k", &v).IsNotFound());
  REQUIRE(a->Put("k", "a").ok());
  REQUIRE(b->Put("k", "b").ok());
  REQUIRE(b->Commit().ok());
  const rocksdb::Status s = a->Commit();
  CHECK(s.IsBusy());
  CHECK(a->ended());
  const TxnTotals tot = sched.totals();
  CHECK(tot.conflicts == 1);
  CHECK(tot.committed == 1);
  CHECK(tenant_of(*stage, 1)["conflicts"] == 1);
  CHECK(tenant_of(*stage, 2)["committed"] == 1);
  CHECK(sched_state(*stage)["running"] == 0);
  // The abort is counted through the stage as one.
  const sluice::StageStats ops_totals = stage->totals();
  const ChannelStats* ops = ops_totals.channel("ops");
  REQUIRE(ops != nullptr);
  CHECK(ops->total.ops == 3 /*get for update, two puts*/ + 2 /*a commit, an abort*/);
}

TEST_CASE("rocksdb txn: a transaction dropped without an end rolls back and frees its slot") {
  auto stage = txn_stage(R"({"slots": 1})");
  TxnScheduler sched(*stage);
  Optimistic o;
  ScheduledTransactionDB db(o.db.get(), sched);
  {
    std::unique_ptr<ScheduledTxn> a;
    REQUIRE(db.Begin(5, &a).ok());
    REQUIRE(a->Put("x", "1").ok());
  }
  CHECK(sched.totals().aborted == 1);
  CHECK(sched_state(*stage)["running"] == 0);
  std::string v;
  CHECK(o.db->Get(rocksdb::ReadOptions(), "x", &v).IsNotFound());
  BeginOptions nowait;
  nowait.no_wait = true;
  std::unique_ptr<ScheduledTxn> b;
  CHECK(db.Begin(5, nowait, &b).ok());
}

TEST_CASE("rocksdb txn: no commit lost under concurrency, on both kinds") {
  for (bool pessimistic : {true, false}) {
    INFO((pessimistic ? "pessimistic" : "optimistic"));
    auto stage = txn_stage(R"({"slots": 4, "delta_us": 200})");
    TxnScheduler sched(*stage);
    std::unique_ptr<Pessimistic> p;
    std::unique_ptr<Optimistic> o;
    std::unique_ptr<ScheduledTransactionDB> db;
    if (pessimistic) {
      p = std::make_unique<Pessimistic>(sched);
      db = std::make_unique<ScheduledTransactionDB>(p->db.get(), sched);
    } else {
      o = std::make_unique<Optimistic>();
      db = std::make_unique<ScheduledTransactionDB>(o->db.get(), sched);
    }
    constexpr int kThreads = 8;
    constexpr int kEach = 150;
    std::atomic<int> committed{0};
    std::atomic<int> unexpected{0};  // a failed begin, or an error other than a conflict
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t) {
      ts.emplace_back([&, t] {
        for (int i = 0; i < kEach;) {
          const auto tenant = static_cast<std::uint32_t>((t * 2 + i) % 16);
          const rocksdb::Slice keys[] = {"counter"};
          BeginOptions bo;
          bo.declared_keys = keys;
          std::unique_ptr<ScheduledTxn> x;
          if (!db->Begin(tenant, bo, &x).ok()) {  // Catch asserts on the test's thread only
            ++unexpected;
            return;
          }
          std::string v;
          rocksdb::Status s = x->GetForUpdate("counter", &v);
          if (s.IsNotFound()) v = "0";
          if (s.ok() || s.IsNotFound()) s = x->Put("counter", std::to_string(std::stoi(v) + 1));
          if (s.ok()) s = x->Commit();
          if (s.ok()) {
            ++committed;
            ++i;
          } else if (!(s.IsBusy() || s.IsTryAgain() || s.IsTimedOut())) {
            ++unexpected;
            return;
          }
        }
      });
    }
    for (auto& t : ts) t.join();
    CHECK(unexpected == 0);
    rocksdb::DB* base = db->db();
    std::string v;
    REQUIRE(base->Get(rocksdb::ReadOptions(), "counter", &v).ok());
    CHECK(std::stoi(v) == kThreads * kEach);
    CHECK(committed == kThreads * kEach);
    const TxnTotals tot = sched.totals();
    CHECK(tot.committed == static_cast<std::uint64_t>(kThreads * kEach));
    const json c = sched_state(*stage);
    CHECK(c["running"] == 0);
    CHECK(c["queued"] == 0);
    std::uint64_t sched_committed = 0;
    for (const json& t : c["tenants"]) sched_committed += t["committed"].get<std::uint64_t>();
    CHECK(sched_committed == tot.committed);
    CHECK(c["unknown_reports"] == 0);
  }
}
