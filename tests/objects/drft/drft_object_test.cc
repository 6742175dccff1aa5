// The drft object: configuration and its errors, admission through a stage
// (op begin routed to it, the Hold as the admission), the order waiters are
// admitted in, reports, collect, shutdown, and many tenants on many threads.
// Decisions are made inside acquire()/release() on the calling thread, so
// the tests read collect() right after a call and wait only for threads to
// park.
#include <catch2/catch.hpp>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "sluice/clock.h"
#include "sluice/hold.h"
#include "sluice/objects/builtin.h"
#include "sluice/objects/drft.h"
#include "sluice/stage.h"
#include "sluice/txn.h"
#include "test_util.h"

using namespace sluice;
using nlohmann::json;
using sluice::testing::eventually;

namespace {

using sluice::testing::kUs;

Context begin_of(std::uint32_t tenant, std::uint64_t txn, std::uint8_t flags = 0) {
  Context c;
  c.tenant = tenant;
  c.workflow = txn;
  c.op = Op::kBegin;
  c.origin = origin::kForeground;
  c.flags = flags;
  return c;
}

json tenant_of(const Drft& d, std::uint32_t id) {
  const json c = d.collect();
  for (const json& t : c["tenants"]) {
    if (t["tenant"] == id) return t;
  }
  FAIL("no tenant " << id << " in " << c.dump());
  return {};
}

std::unique_ptr<Stage> drft_stage(Clock* clock, const std::string& config) {
  objects::register_builtin();
  StageOptions o;
  o.clock = clock;
  auto stage = Stage::create(o).value();
  const Status st = stage->apply(json::parse(R"([
    {"rule": "differentiate", "classifiers": ["operation"]},
    {"rule": "create_channel", "channel": "txn", "match": {"operation": "begin"}},
    {"rule": "create_object", "channel": "txn", "object": "sched", "type": "drft",
     "config": )" + config + R"(},
    {"rule": "create_channel", "channel": "rest", "default": true}
  ])"));
  REQUIRE(st.is_ok());
  return stage;
}

}  // namespace

TEST_CASE("drft: bad configuration names the field and changes nothing") {
  Drft d(nullptr);
  REQUIRE(d.configure(json{{"slots", 3}, {"delta_us", 50}}).is_ok());
  const std::pair<json, const char*> bad[] = {
      {{{"slots", 0}}, "slots: must be an integer from 1 to 65536, got 0"},
      {{{"delta_us", -1}}, "delta_us: must be a number of microseconds from 0 to 1e9, got -1"},
      {{{"policy", "lifo"}}, "policy: must be \"drft\" or \"fifo\", got \"lifo\""},
      {{{"weights", {{"01", 2}}}}, "weights: a tenant is a decimal integer"},
      {{{"weight_7", 0}}, "weight_7: must be a number between 0.001 and 1000000, got 0"},
      {{{"sketch_width", 100}}, "sketch_width: must be a power of two from 64 to 1048576"},
      {{{"hot_share", 0}}, "hot_share: must be a number in (0, 1], got 0"},
      {{{"slot", 1}}, "unknown field 'slot'"},
  };
  for (const auto& [config, message] : bad) {
    INFO(config.dump());
    const Status st = d.configure(config);
    CHECK_FALSE(st.is_ok());
    CHECK_THAT(st.message(), Catch::Matchers::StartsWith(message));
    CHECK(d.validate(config).message() == st.message());
  }
  const json c = d.collect();
  CHECK(c["slots"] == 3);
  CHECK(c["delta_us"] == 50);
  CHECK(c["policy"] == "drft");
  // Tunables: slots and delta_us, checked as configure checks them.
  std::array<double, kMaxTunables> v{};
  v[0] = 0;
  CHECK_FALSE(d.set_tunables(1, v).is_ok());
  v[0] = 5;
  v[1] = 7;
  REQUIRE(d.set_tunables(3, v).is_ok());
  CHECK(d.collect()["slots"] == 5);
  CHECK(d.collect()["delta_us"] == 7);
}

TEST_CASE("drft through a stage: begins admitted up to slots, the Hold frees a slot") {
  ManualClock clock;
  auto stage = drft_stage(&clock, R"({"slots": 2})");
  Hold a = stage->acquire(begin_of(1, 1), 1);
  Hold b = stage->acquire(begin_of(2, 2), 1);
  REQUIRE(a.holds());
  REQUIRE(b.holds());
  txn::TxnAccounting* acct = txn::accounting_of(a);
  REQUIRE(acct != nullptr);
  // Full: a begin that must not wait says so and is not admitted.
  Hold c = stage->acquire(begin_of(3, 3, context_flag::kNoWait), 1);
  CHECK(c.verdict().outcome == Outcome::kWouldWait);
  CHECK_FALSE(c.holds());
  // Other operations are not routed to the scheduler.
  CHECK(stage->enforce(make_context(Op::kGet, 10)).ok());
  clock.advance(100 * kUs);
  const txn::ItemId items[] = {txn::item_of("hot")};
  txn::TxnReport r;
  r.first_access_ns = clock.now_ns() - 40 * kUs;
  r.end_ns = clock.now_ns();
  r.items = items;
  acct->on_end(a.context(), r);
  a.release_all();
  Hold d = stage->acquire(begin_of(3, 3, context_flag::kNoWait), 1);
  CHECK(d.holds());
  auto* sched = dynamic_cast<Drft*>(txn::accounting_of(d));
  REQUIRE(sched != nullptr);
  const json t1 = tenant_of(*sched, 1);
  CHECK(t1["usage_us"] == 40);
  CHECK(t1["committed"] == 1);
  CHECK(t1["running"] == 0);
  CHECK(tenant_of(*sched, 2)["running"] == 1);
  // A Hold released without a report ends the transaction as committed, from admission.
  b.release_all();
  CHECK(tenant_of(*sched, 2)["usage_us"] == 100);
  CHECK(sched->collect()["running"] == 1);
}

TEST_CASE("drft: waiters are admitted by least virtual time, fifo by arrival") {
  for (const char* policy : {"drft", "fifo"}) {
    INFO(policy);
    ManualClock clock;
    Drft d(&clock);
    REQUIRE(d.configure(json{{"slots", 1}, {"policy", policy}}).is_ok());
    // Tenant 1 has used 500 µs; tenant 2 nothing yet.
    REQUIRE(d.acquire(begin_of(1, 1), 1).ok());
    clock.advance(500 * kUs);
    d.release(begin_of(1, 1), 1);
    REQUIRE(d.acquire(begin_of(9, 2), 1).ok());  // holds the slot
    std::vector<std::uint32_t> order;
    std::mutex order_mu;
    auto begin = [&](std::uint32_t tenant, std::uint64_t id) {
      return std::thread([&, tenant, id] {
        const Verdict v = d.acquire(begin_of(tenant, id), 1);
        CHECK(v.ok());
        {
          std::lock_guard<std::mutex> lock(order_mu);
          order.push_back(tenant);
        }
        d.release(begin_of(tenant, id), 1);
      });
    };
    std::thread t1 = begin(1, 3);  // arrives first
    eventually([&] { return d.collect()["queued"] == 1; });
    std::thread t2 = begin(2, 4);
    eventually([&] { return d.collect()["queued"] == 2; });
    d.release(begin_of(9, 2), 1);
    t1.join();
    t2.join();
    REQUIRE(order.size() == 2);
    if (std::string(policy) == "fifo") {
      CHECK(order == std::vector<std::uint32_t>{1, 2});
    } else {
      CHECK(order == std::vector<std::uint32_t>{2, 1});
    }
    CHECK(tenant_of(d, 1)["waits"] == 1);
    CHECK(d.collect()["running"] == 0);
  }
}

TEST_CASE("drft: declared items reach the picker through the acquiring thread") {
  ManualClock clock;
  Drft d(&clock);
  REQUIRE(d.configure(json{{"slots", 2}, {"delta_us", 1000}}).is_ok());
  const txn::ItemId x[] = {txn::item_of("x")};
  const txn::ItemId y[] = {txn::item_of("y")};
  {
    txn::DeclaredItemsScope scope(x);
    REQUIRE(d.acquire(begin_of(9, 1), 1).ok());  // runs holding x
  }
  CHECK(txn::declared_items().empty());
  REQUIRE(d.acquire(begin_of(8, 2), 1).ok());
  std::vector<std::uint32_t> order;
  std::mutex order_mu;
  auto begin = [&](std::uint32_t tenant, std::uint64_t id, std::span<const txn::ItemId> items) {
    return std::thread([&, tenant, id, items] {
      txn::DeclaredItemsScope scope(items);
      REQUIRE(d.acquire(begin_of(tenant, id), 1).ok());
      std::lock_guard<std::mutex> lock(order_mu);
      order.push_back(tenant);
    });
  };
  std::thread a = begin(1, 3, x);  // first, same virtual time, but conflicts with txn 1
  eventually([&] { return d.collect()["queued"] == 1; });
  std::thread b = begin(2, 4, y);
  eventually([&] { return d.collect()["queued"] == 2; });
  d.release(begin_of(8, 2), 1);
  b.join();
  CHECK(order == std::vector<std::uint32_t>{2});
  CHECK(d.collect()["picks"]["throughput"] == 1);
  d.release(begin_of(9, 1), 1);
  a.join();
  d.release(begin_of(1, 3), 1);
  d.release(begin_of(2, 4), 1);
  CHECK(d.collect()["running"] == 0);
}

TEST_CASE("drft: lock waits are charged to the blockers' tenants") {
  ManualClock clock;
  Drft d(&clock);
  REQUIRE(d.configure(json{{"slots", 4}}).is_ok());
  REQUIRE(d.acquire(begin_of(1, 1), 1).ok());
  const std::uint32_t blockers[] = {2};
  d.on_lock_wait(begin_of(1, 1), txn::item_of("k"), blockers, 80 * kUs, true);
  CHECK(tenant_of(d, 2)["sdu_charged_us"] == 40);
  CHECK(tenant_of(d, 1)["sdu_passed_us"] == 40);
  CHECK(tenant_of(d, 1)["lock_waits"] == 1);
  CHECK(tenant_of(d, 1)["lock_wait_us"] == 80);
  d.release(begin_of(1, 1), 1);
  // A report for a transaction not running is counted, not applied.
  txn::TxnReport r;
  d.on_end(begin_of(1, 77), r);
  CHECK(d.collect()["unknown_reports"] == 1);
}

TEST_CASE("drft: shutdown cancels waiters and later begins") {
  Drft d(nullptr);
  REQUIRE(d.configure(json{{"slots", 1}}).is_ok());
  REQUIRE(d.acquire(begin_of(1, 1), 1).ok());
  std::atomic<int> cancelled{0};
  std::vector<std::thread> ts;
  for (std::uint32_t i = 0; i < 3; ++i) {
    ts.emplace_back([&, i] {
      if (d.acquire(begin_of(2 + i, 10 + i), 1).outcome == Outcome::kCancelled) ++cancelled;
    });
  }
  eventually([&] { return d.collect()["queued"] == 3; });
  d.shutdown();
  for (auto& t : ts) t.join();
  CHECK(cancelled == 3);
  CHECK(d.acquire(begin_of(1, 2), 1).outcome == Outcome::kCancelled);
  d.release(begin_of(1, 1), 1);  // still taken back
  CHECK(d.collect()["running"] == 0);
}

TEST_CASE("drft: 64 tenants on 16 threads, every begin admitted and ended once") {
  Drft d(nullptr);
  REQUIRE(d.configure(json{{"slots", 4}, {"delta_us", 100}}).is_ok());
  constexpr int kThreads = 16;
  constexpr int kPerThread = 400;
  std::vector<std::thread> ts;
  std::atomic<int> admitted{0};
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const auto tenant = static_cast<std::uint32_t>((t * kPerThread + i) % 64);
        const std::uint64_t id = static_cast<std::uint64_t>(t) * 1'000'000 + i + 1;
        const txn::ItemId items[] = {txn::item_of(i % 3 == 0 ? "hot" : "cold")};
        txn::DeclaredItemsScope scope(items);
        if (d.acquire(begin_of(tenant, id), 1).ok()) ++admitted;
        txn::TxnReport r;
        r.items = items;
        d.on_end(begin_of(tenant, id), r);
        d.release(begin_of(tenant, id), 1);
      }
    });
  }
  for (auto& t : ts) t.join();
  CHECK(admitted == kThreads * kPerThread);
  const json c = d.collect();
  CHECK(c["running"] == 0);
  CHECK(c["queued"] == 0);
  CHECK(c["tenants"].size() == 64);
  std::uint64_t committed = 0;
  for (const json& t : c["tenants"]) committed += t["committed"].get<std::uint64_t>();
  CHECK(committed == kThreads * kPerThread);
  CHECK(c["unknown_reports"] == 0);
}
