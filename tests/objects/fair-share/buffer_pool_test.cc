// The buffer-pool object: FairDB's write-buffer allocation rules case by case
// (reserved pool first below the fair share, global pool only at or above
// it, queueing, refills, the order waiters are served in), its limits
// (oversize, over-release, shrinking), its configuration and tunables, its
// counters, and its behaviour under concurrency and shutdown. A grant or a
// refusal is decided inside acquire() or release() on the calling thread, so
// the state collect() shows right after a call is that call's outcome: the
// tests read it without waiting, and wait only for threads to park.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "sluice/clock.h"
#include "sluice/hold.h"
#include "sluice/objects/buffer_pool.h"
#include "sluice/objects/builtin.h"
#include "sluice/stage.h"
#include "test_util.h"

using namespace sluice;
using nlohmann::json;

namespace {

using sluice::testing::kMs;

Context flow(std::uint32_t tenant, std::uint8_t flags = 0) {
  Context c;
  c.tenant = tenant;
  c.op = Op::kWrite;
  c.flags = flags;
  return c;
}

std::unique_ptr<BufferPool> make_pool(Clock* clock, const json& config) {
  auto p = std::make_unique<BufferPool>(clock);
  const Status st = p->configure(config);
  REQUIRE(st.is_ok());
  return p;
}

json pool_flow_of(const BufferPool& p, std::uint64_t id) {
  const json c = p.collect();
  for (const json& f : c["flows"]) {
    if (f["flow"] == id) return f;
  }
  FAIL("no flow " << id << " in " << c.dump());
  return {};
}

std::uint64_t stat(const BufferPool& p, const char* field) {
  return p.collect()[field].get<std::uint64_t>();
}

std::uint64_t flow_stat(const BufferPool& p, std::uint64_t id, const char* field) {
  return pool_flow_of(p, id)[field].get<std::uint64_t>();
}

bool would_wait(BufferPool& p, std::uint32_t tenant, std::uint64_t n) {
  return p.acquire(flow(tenant, context_flag::kNoWait), n).outcome == Outcome::kWouldWait;
}

// An acquire on a thread of its own, which may wait.
struct Waiting {
  Waiting(BufferPool& p, std::uint32_t tenant, std::uint64_t n)
      : thread([this, &p, tenant, n] {
          verdict = p.acquire(flow(tenant), n);
          done = true;
        }) {}
  ~Waiting() {
    if (thread.joinable()) thread.join();
  }
  Verdict finish() {
    thread.join();
    return verdict;
  }
  Verdict verdict;
  std::atomic<bool> done{false};
  std::thread thread;
};

// Blocks until `n` requests wait in the pool.
void until_queued(const BufferPool& p, std::uint64_t n) {
  REQUIRE(testing::wait_for([&] { return stat(p, "queued") == n; }, std::chrono::seconds(20)));
}

}  // namespace

TEST_CASE("below its fair share a flow takes from the reserved pool first, then the global") {
  SimClock clock;
  // Two known flows of weight 1: fair shares of 500.
  auto p =
      make_pool(&clock, {{"capacity", 1000}, {"reserved", 200}, {"weights", {{"1", 1}, {"2", 1}}}});
  CHECK(flow_stat(*p, 1, "fair_share") == 500);
  REQUIRE(p->acquire(flow(1), 150).ok());
  CHECK(flow_stat(*p, 1, "from_reserved_bytes") == 150);
  CHECK(stat(*p, "reserved_free") == 50);
  CHECK(stat(*p, "global_free") == 800);
  // The reserved pool's last 50, then 100 from the global pool.
  REQUIRE(p->acquire(flow(1), 150).ok());
  CHECK(flow_stat(*p, 1, "from_reserved_bytes") == 200);
  CHECK(stat(*p, "reserved_free") == 0);
  CHECK(stat(*p, "global_free") == 700);
  CHECK(flow_stat(*p, 1, "usage") == 300);
  CHECK(flow_stat(*p, 1, "grants") == 2);
  CHECK(stat(*p, "used") == 300);
}

TEST_CASE("at or above its fair share a flow takes from the global pool only, else queues") {
  SimClock clock;
  auto p =
      make_pool(&clock, {{"capacity", 1000}, {"reserved", 400}, {"weights", {{"1", 1}, {"2", 1}}}});
  // Flow 1 reaches its share (500): 400 from the reserved pool, 100 global.
  REQUIRE(p->acquire(flow(1), 500).ok());
  CHECK(flow_stat(*p, 1, "from_reserved_bytes") == 400);
  CHECK(stat(*p, "global_free") == 500);
  // At its share: the global pool alone.
  REQUIRE(p->acquire(flow(1), 500).ok());
  CHECK(flow_stat(*p, 1, "from_reserved_bytes") == 400);
  CHECK(stat(*p, "global_free") == 0);
  // Flow 2 (below its share) releases nothing; flow 1 gives back 300, which
  // refill the reserved pool, where flow 1 may not take.
  p->release(flow(1), 300);
  CHECK(stat(*p, "reserved_free") == 300);
  CHECK(stat(*p, "global_free") == 0);
  CHECK(flow_stat(*p, 1, "usage") == 700);
  CHECK(would_wait(*p, 1, 1));
  // Flow 2, below its share, takes there.
  REQUIRE(p->acquire(flow(2), 300).ok());
  CHECK(flow_stat(*p, 2, "from_reserved_bytes") == 300);
  // Both pools empty: below its share, flow 2 still queues.
  CHECK(would_wait(*p, 2, 1));
  // A request that would wait took and counted nothing.
  CHECK(flow_stat(*p, 2, "grants") == 1);
  CHECK(stat(*p, "used") == 1000);
}

TEST_CASE("a release refills the reserved pool first, the rest goes to the global pool") {
  SimClock clock;
  auto p = make_pool(&clock, {{"capacity", 1000}, {"reserved", 300}, {"weights", {{"1", 1}}}});
  REQUIRE(p->acquire(flow(1), 800).ok());  // 300 reserved + 500 global
  CHECK(stat(*p, "reserved_free") == 0);
  CHECK(stat(*p, "global_free") == 200);
  p->release(flow(1), 100);
  CHECK(stat(*p, "reserved_free") == 100);
  CHECK(stat(*p, "global_free") == 200);
  p->release(flow(1), 400);  // 200 more fill the reserved pool, 200 go global
  CHECK(stat(*p, "reserved_free") == 300);
  CHECK(stat(*p, "global_free") == 400);
  CHECK(flow_stat(*p, 1, "released_bytes") == 500);
  CHECK(flow_stat(*p, 1, "granted_bytes") == 800);
}

TEST_CASE("waiters drain in increasing usage/fair-share order, FIFO within a flow, head first") {
  ManualClock clock;
  // Three flows of weight 1 (fair share 33 each), no reserved pool.
  auto p = make_pool(&clock, {{"capacity", 100}, {"weights", {{"1", 1}, {"2", 1}, {"3", 1}}}});
  REQUIRE(p->acquire(flow(1), 60).ok());
  REQUIRE(p->acquire(flow(2), 30).ok());
  REQUIRE(p->acquire(flow(3), 10).ok());
  // U/f: flow 3 0.3, flow 2 0.9, flow 1 1.8.
  Waiting w1a(*p, 1, 10);
  until_queued(*p, 1);
  Waiting w2a(*p, 2, 10);
  until_queued(*p, 2);
  Waiting w1b(*p, 1, 5);
  until_queued(*p, 3);
  Waiting w3a(*p, 3, 10);
  until_queued(*p, 4);
  Waiting w3b(*p, 3, 10);
  until_queued(*p, 5);
  // A request arriving while others wait queues, though it would fit later.
  CHECK(would_wait(*p, 2, 1));

  clock.advance(3 * kMs);
  // 5 free: the head (flow 3's first, 10) does not fit; nobody overtakes it.
  p->release(flow(1), 5);
  CHECK(stat(*p, "queued") == 5);
  p->release(flow(1), 5);  // 10 free: flow 3's first
  CHECK(w3a.finish().ok());
  CHECK(flow_stat(*p, 3, "queued") == 1);
  p->release(flow(1), 10);  // flow 3 (U/f 0.6) still first
  CHECK(w3b.finish().ok());
  p->release(flow(3), 10);  // flow 2 (0.9) before flow 1 (40/33: 1.2)
  CHECK(w2a.finish().ok());
  CHECK(flow_stat(*p, 1, "queued") == 2);
  // Flow 1's in order of arrival: its 10 first, then its 5.
  p->release(flow(3), 5);
  CHECK(flow_stat(*p, 1, "queued") == 2);
  p->release(flow(3), 10);
  CHECK(w1a.finish().ok());
  CHECK(w1b.finish().ok());
  CHECK(stat(*p, "queued") == 0);

  const Verdict v = w1b.verdict;
  CHECK(v.wait_ns == static_cast<std::uint64_t>(3 * kMs));
  const json f1 = pool_flow_of(*p, 1);
  CHECK(f1["stalls"] == 2);
  CHECK(f1["stall_ns"] == 6 * kMs);
  CHECK(f1["max_stall_ns"] == 3 * kMs);
  CHECK(pool_flow_of(*p, 2)["stalls"] == 1);
}

TEST_CASE("a new weight reorders the waiters by their new usage/fair-share") {
  SimClock clock;
  auto p = make_pool(&clock, {{"capacity", 100}, {"weights", {{"1", 1}, {"2", 1}}}});
  REQUIRE(p->acquire(flow(1), 40).ok());
  REQUIRE(p->acquire(flow(2), 60).ok());
  Waiting w1(*p, 1, 10);
  until_queued(*p, 1);
  Waiting w2(*p, 2, 10);
  until_queued(*p, 2);
  // Equal weights: flow 1 (40/50) before flow 2 (60/50). Flow 2 weighing 9
  // (share 90) puts it first (60/90 against 40/10).
  REQUIRE(p->configure({{"weight_2", 9}}).is_ok());
  CHECK(stat(*p, "queued") == 2);
  p->release(flow(1), 10);
  CHECK(w2.finish().ok());
  CHECK(flow_stat(*p, 1, "queued") == 1);
  p->release(flow(2), 10);
  CHECK(w1.finish().ok());
}

TEST_CASE("a request larger than the capacity is granted when its flow holds nothing") {
  SimClock clock;
  auto p = make_pool(&clock, {{"capacity", 100}, {"reserved", 20}});
  REQUIRE(p->acquire(flow(1), 150).ok());
  CHECK(stat(*p, "oversize") == 1);
  CHECK(stat(*p, "used") == 150);
  CHECK(stat(*p, "reserved_free") == 0);
  CHECK(stat(*p, "global_free") == 0);
  CHECK(would_wait(*p, 2, 1));    // nothing left for anyone
  CHECK(would_wait(*p, 1, 150));  // its flow holds something
  p->release(flow(1), 150);
  CHECK(stat(*p, "used") == 0);
  CHECK(stat(*p, "reserved_free") == 20);
  CHECK(stat(*p, "global_free") == 80);
  // Nobody may wait either: queued behind a waiter, it waits its turn.
  REQUIRE(p->acquire(flow(2), 100).ok());
  Waiting w(*p, 3, 10);
  until_queued(*p, 1);
  CHECK(would_wait(*p, 1, 150));
  p->release(flow(2), 100);
  CHECK(w.finish().ok());
  CHECK(stat(*p, "oversize") == 1);
}

TEST_CASE("a release beyond what the flow holds is clamped and counted") {
  SimClock clock;
  auto p = make_pool(&clock, {{"capacity", 100}});
  REQUIRE(p->acquire(flow(1), 20).ok());
  p->release(flow(1), 50);
  CHECK(flow_stat(*p, 1, "usage") == 0);
  CHECK(flow_stat(*p, 1, "released_bytes") == 20);
  CHECK(stat(*p, "over_released") == 30);
  CHECK(stat(*p, "used") == 0);
  CHECK(stat(*p, "global_free") == 100);
  p->release(flow(7), 5);  // a flow that never acquired
  CHECK(stat(*p, "over_released") == 35);
  CHECK(stat(*p, "used") == 0);
}

TEST_CASE("shrinking the reserved pool or the capacity takes nothing back") {
  SimClock clock;
  auto p = make_pool(&clock, {{"capacity", 1000}, {"reserved", 400}, {"weights", {{"1", 1}}}});
  REQUIRE(p->acquire(flow(1), 300).ok());  // from the reserved pool
  REQUIRE(p->configure({{"reserved", 100}}).is_ok());
  CHECK(stat(*p, "used") == 300);
  CHECK(stat(*p, "reserved_free") == 0);
  CHECK(stat(*p, "global_free") == 700);
  p->release(flow(1), 50);  // refills the smaller reserved pool first
  CHECK(stat(*p, "reserved_free") == 50);
  CHECK(stat(*p, "global_free") == 700);

  REQUIRE(p->acquire(flow(1), 500).ok());  // used 750
  REQUIRE(p->configure({{"capacity", 600}}).is_ok());
  CHECK(stat(*p, "used") == 750);
  CHECK(stat(*p, "reserved_free") == 0);
  CHECK(stat(*p, "global_free") == 0);
  CHECK(would_wait(*p, 2, 1));
  p->release(flow(1), 200);  // 550 used: 50 free, all in the reserved pool
  CHECK(stat(*p, "reserved_free") == 50);
  CHECK(stat(*p, "global_free") == 0);
  p->release(flow(1), 550);
  CHECK(stat(*p, "reserved_free") == 100);
  CHECK(stat(*p, "global_free") == 500);
}

TEST_CASE("nothing is granted beyond the capacity after the reserved pool grew") {
  SimClock clock;
  auto p = make_pool(&clock, {{"capacity", 100}, {"weights", {{"1", 1}, {"2", 1}}}});
  REQUIRE(p->acquire(flow(1), 100).ok());
  REQUIRE(p->configure({{"reserved", 50}}).is_ok());
  CHECK(stat(*p, "reserved_free") == 0);
  CHECK(would_wait(*p, 2, 1));  // below its share, but the pool is full
  p->release(flow(1), 30);      // refills the reserved pool
  CHECK(stat(*p, "reserved_free") == 30);
  REQUIRE(p->acquire(flow(2), 30).ok());
  CHECK(flow_stat(*p, 2, "from_reserved_bytes") == 30);
}

TEST_CASE("weights give fair shares over the known flows") {
  SimClock clock;
  auto p = make_pool(&clock, {{"capacity", 1000}, {"weights", {{"1", 1}, {"2", 3}}}});
  CHECK(flow_stat(*p, 1, "fair_share") == 250);
  CHECK(flow_stat(*p, 2, "fair_share") == 750);
  REQUIRE(p->acquire(flow(3), 1).ok());    // seen: known, with the default weight
  CHECK(flow_stat(*p, 3, "stalls") == 0);  // its first acquire took the lock, did not wait
  CHECK(flow_stat(*p, 1, "fair_share") == 200);
  CHECK(flow_stat(*p, 2, "fair_share") == 600);
  CHECK(flow_stat(*p, 3, "fair_share") == 200);
  REQUIRE(p->configure({{"weight_3", 5}, {"default_weight", 2}}).is_ok());
  CHECK(flow_stat(*p, 3, "fair_share") == 556);  // 1000 * 5 / 9
  CHECK(pool_flow_of(*p, 3)["weight"] == 5.0);
  // The share decides where a flow may take: flow 1 (share 100) at 150 takes
  // from the global pool only.
  auto q =
      make_pool(&clock, {{"capacity", 1000}, {"reserved", 500}, {"weights", {{"1", 1}, {"2", 9}}}});
  REQUIRE(q->acquire(flow(1), 150).ok());
  CHECK(flow_stat(*q, 1, "from_reserved_bytes") == 150);
  REQUIRE(q->acquire(flow(1), 10).ok());
  CHECK(flow_stat(*q, 1, "from_reserved_bytes") == 150);
}

TEST_CASE("flows beyond max_flows share one, reported as other") {
  SimClock clock;
  auto p = make_pool(&clock, {{"capacity", 100}, {"max_flows", 2}});
  REQUIRE(p->acquire(flow(1), 10).ok());
  REQUIRE(p->acquire(flow(2), 10).ok());
  REQUIRE(p->acquire(flow(3), 10).ok());
  REQUIRE(p->acquire(flow(4), 10).ok());
  const json flows = p->collect()["flows"];
  REQUIRE(flows.size() == 3);
  CHECK(flows[2]["flow"] == "other");
  CHECK(flows[2]["usage"] == 20);
  p->release(flow(4), 10);
  p->release(flow(3), 10);
  CHECK(p->collect()["flows"][2]["usage"] == 0);
  CHECK(stat(*p, "over_released") == 0);
}

TEST_CASE("configuration errors name the field and change nothing") {
  SimClock clock;
  BufferPool fresh(&clock);
  CHECK(fresh.configure({{"reserved", 10}}).message().find("capacity: required") == 0);
  CHECK(fresh.validate({{"capacity", 0}}).message().find("capacity: must be an integer") == 0);

  auto p = make_pool(&clock, {{"capacity", 1000}, {"reserved", 100}});
  const json before = p->collect();
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"capacity", 1.5}}, "capacity: must be an integer"},
      {{{"capacity", "big"}}, "capacity: must be an integer"},
      {{{"reserved", -1}}, "reserved: must be an integer"},
      {{{"reserved", 2000}}, "reserved: must be at most capacity (1000), got 2000"},
      {{{"capacity", 50}}, "capacity: must be at least reserved (100), got 50"},
      {{{"flow_by", "op"}}, "flow_by: must be \"tenant\", \"workflow\" or \"origin\""},
      {{{"flow_by", "origin"}}, "flow_by: cannot change once configured"},
      {{{"weights", {{"7", 0}}}}, "weights.7: must be a number between 0.001 and 1000000"},
      {{{"weights", {{"07", 1}}}}, "weights: a flow id is a decimal integer"},
      {{{"weights", 3}}, "weights: must be an object"},
      {{{"weight_x", 1}}, "weight_x: a flow id is a decimal integer"},
      {{{"weight_3", 2e6}}, "weight_3: must be a number between"},
      {{{"default_weight", 0}}, "default_weight: must be a number between"},
      {{{"max_flows", 0}}, "max_flows: must be an integer from 1 to 65536"},
      {{{"max_flows", 70000}}, "max_flows: must be an integer from 1 to 65536"},
      {{{"rate", 1}}, "unknown field 'rate'"},
      {json::array(), "config: must be an object"},
  };
  for (const auto& [config, message] : bad) {
    INFO(config.dump());
    const Status st = p->configure(config);
    CHECK_FALSE(st.is_ok());
    CHECK(st.message().find(message) == 0);
    CHECK(p->validate(config).message() == st.message());
  }
  // Valid fields before a bad one are not applied either.
  CHECK_FALSE(p->configure({{"capacity", 5000}, {"zzz", 1}}).is_ok());
  CHECK(p->collect() == before);
  // A change that keeps reserved <= capacity in the merged configuration is fine.
  CHECK(p->configure({{"capacity", 100}}).is_ok());
  CHECK(p->configure({{"capacity", 3000}, {"reserved", 2500}}).is_ok());
  CHECK(stat(*p, "reserved") == 2500);
}

TEST_CASE("tunables reserved and capacity are set from the board's numbers") {
  SimClock clock;
  auto p = make_pool(&clock, {{"capacity", 1000}, {"reserved", 100}});
  REQUIRE(p->tunables().size() == 2);
  CHECK(p->tunables()[0] == "reserved");
  CHECK(p->tunables()[1] == "capacity");
  std::array<double, kMaxTunables> v{};
  v[0] = 300;
  v[1] = 2000;
  REQUIRE(p->set_tunables(0b11, v).is_ok());
  CHECK(stat(*p, "reserved") == 300);
  CHECK(stat(*p, "capacity") == 2000);
  v[0] = 5000;
  Status st = p->set_tunables(0b01, v);
  CHECK(st.message().find("reserved: must be at most capacity (2000), got 5000") == 0);
  v[1] = 200;
  st = p->set_tunables(0b10, v);
  CHECK(st.message().find("capacity: must be at least reserved (300), got 200") == 0);
  v[1] = 1500.5;
  CHECK(p->set_tunables(0b10, v).message().find("capacity: must be an integer") == 0);
  v[0] = -1;
  CHECK(p->set_tunables(0b01, v).message().find("reserved: must be an integer") == 0);
  CHECK_FALSE(p->set_tunables(0b100, v).is_ok());
  CHECK(stat(*p, "reserved") == 300);
  CHECK(stat(*p, "capacity") == 2000);
  // A larger capacity serves a waiter at once.
  REQUIRE(p->acquire(flow(1), 2000).ok());
  Waiting w(*p, 1, 500);
  until_queued(*p, 1);
  v[1] = 2500;
  REQUIRE(p->set_tunables(0b10, v).is_ok());
  CHECK(w.finish().ok());
}

TEST_CASE("collect reports every field") {
  SimClock clock;
  auto p = make_pool(&clock, {{"capacity", 1000}, {"reserved", 100}, {"weights", {{"4", 2}}}});
  REQUIRE(p->acquire(flow(4), 10).ok());
  const json c = p->collect();
  for (const char* k : {"capacity", "reserved", "reserved_free", "global_free", "used", "queued",
                        "flows", "oversize", "over_released"}) {
    CHECK(c.contains(k));
  }
  REQUIRE(c["flows"].size() == 1);
  const json f = c["flows"][0];
  CHECK(f["flow"] == 4);
  CHECK(f["weight"] == 2.0);
  CHECK(f["fair_share"] == 1000);
  for (const char* k : {"usage", "granted_bytes", "grants", "from_reserved_bytes", "released_bytes",
                        "stalls", "stall_ns", "queued", "max_stall_ns"}) {
    CHECK(f.contains(k));
  }
  CHECK(f.size() == 12);
}

TEST_CASE("shutdown wakes every waiter promptly; releases still give back") {
  SimClock clock;
  auto p = make_pool(&clock, {{"capacity", 100}});
  REQUIRE(p->acquire(flow(1), 100).ok());
  std::vector<std::unique_ptr<Waiting>> ws;
  for (std::uint32_t i = 0; i < 6; ++i) {
    ws.push_back(std::make_unique<Waiting>(*p, i % 3, 10 + i));
  }
  until_queued(*p, 6);
  p->shutdown();
  for (auto& w : ws) CHECK(w->finish().outcome == Outcome::kCancelled);
  CHECK(stat(*p, "queued") == 0);
  CHECK(p->acquire(flow(1), 1).outcome == Outcome::kCancelled);
  p->release(flow(1), 100);
  CHECK(stat(*p, "used") == 0);
}

TEST_CASE("many threads acquiring and releasing conserve every unit") {
  SimClock clock;
  auto p = make_pool(&clock, {{"capacity", 4096},
                              {"reserved", 1024},
                              {"weights", {{"0", 1}, {"1", 2}, {"2", 1}, {"3", 4}}}});
  constexpr int kThreads = 8;
  constexpr int kRounds = 3000;
  std::atomic<std::uint64_t> granted{0};
  std::atomic<int> failures{0};  // Catch2 asserts on the test's thread only
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      const std::uint32_t tenant = static_cast<std::uint32_t>(t % 4);
      for (int i = 0; i < kRounds; ++i) {
        const std::uint64_t n = 1 + rng() % 1500;
        const bool nowait = rng() % 4 == 0;
        const Verdict v = p->acquire(flow(tenant, nowait ? context_flag::kNoWait : 0), n);
        if (v.outcome == Outcome::kWouldWait) continue;
        if (!v.ok()) ++failures;
        granted += n;
        // Given back in two parts.
        const std::uint64_t part = rng() % (n + 1);
        p->release(flow(tenant), part);
        p->release(flow(tenant), n - part);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  const json c = p->collect();
  CHECK(c["used"] == 0);
  CHECK(c["queued"] == 0);
  CHECK(c["over_released"] == 0);
  CHECK(c["reserved_free"] == 1024);
  CHECK(c["global_free"] == 3072);
  std::uint64_t released = 0;
  for (const json& f : c["flows"]) {
    CHECK(f["usage"] == 0);
    CHECK(f["granted_bytes"] == f["released_bytes"]);
    released += f["released_bytes"].get<std::uint64_t>();
  }
  CHECK(released == granted.load());
}

TEST_CASE("a release racing a new waiter never loses the wake-up") {
  SimClock clock;
  auto p = make_pool(&clock, {{"capacity", 1}});
  for (int i = 0; i < 3000; ++i) {
    REQUIRE(p->acquire(flow(1), 1).ok());
    std::atomic<bool> got{false};
    std::atomic<bool> ok{false};
    std::thread waiter([&] {
      ok = p->acquire(flow(2), 1).ok();
      got = true;
    });
    if (i % 2 == 0) std::this_thread::yield();
    p->release(flow(1), 1);  // races the waiter's arrival
    // A lost wake-up leaves the waiter asleep with the unit free.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!got.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    REQUIRE(got.load());
    waiter.join();
    REQUIRE(ok);
    p->release(flow(2), 1);
  }
  CHECK(stat(*p, "used") == 0);
  CHECK(stat(*p, "queued") == 0);
}

TEST_CASE("through a stage: acquire routes to the pool and the Hold gives back") {
  StageOptions o;
  SimClock clock;
  o.clock = &clock;
  objects::register_builtin();
  auto stage = Stage::create(o).value();
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "create_channel", "channel": "writes", "default": true},
    {"rule": "create_object", "channel": "writes", "object": "write_buffer",
     "type": "buffer-pool", "config": {"capacity": 1000, "reserved": 100}}
  ])"))
              .is_ok());
  auto state = [&] { return stage->totals().channels.at(0).objects.at(0).state; };
  Hold a = stage->acquire(flow(1), 600);
  Hold b = stage->acquire(flow(2), 400);
  CHECK(a.amount() == 600);
  CHECK(b.amount() == 400);
  Hold c = stage->acquire(flow(3, context_flag::kNoWait), 1);
  CHECK(c.verdict().outcome == Outcome::kWouldWait);
  Hold more = stage->acquire(flow(1), 0);
  CHECK(a.absorb(std::move(more)));
  Hold again = stage->acquire(flow(2), 0);
  CHECK_FALSE(again.holds());
  a.release(150);  // refills the reserved pool (100), then 50 global
  CHECK(state()["used"] == 850);
  {
    // Flow 1 is above its share (333 of 3 flows): the global pool's 50.
    Hold d = stage->acquire(flow(1), 50);
    CHECK(d.holds());
    CHECK(a.absorb(std::move(d)));
  }
  CHECK(a.amount() == 500);
  CHECK(state()["used"] == 900);
  // A per-request enforce waits as an acquire would and gives back at once.
  CHECK(stage->enforce(flow(4)).ok());
  a.release_all();
  b.release_all();
  CHECK(state()["used"] == 0);
  const StageStats s = stage->collect();
  CHECK(s.channels.at(0).objects.at(0).total.ops == 6);  // the would-wait one is not counted
  CHECK(s.channels.at(0).objects.at(0).total.bytes == 1050);
}
