// The prio-bucket object: configuration and its errors, classification by
// origin, strict priority, weighted shares within a priority, FIFO within a
// class, no starvation, reconfiguration with waiters, the no-wait path and
// the collected counters. Waiting threads run on a ManualClock: every grant
// is counted, never timed.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "sluice/clock.h"
#include "sluice/objects/builtin.h"
#include "sluice/objects/prio_bucket.h"
#include "sluice/registry.h"
#include "test_util.h"

namespace {

using nlohmann::json;
using sluice::ManualClock;
using sluice::Outcome;
using sluice::PrioBucket;
using sluice::PrioBucketConfig;
using sluice::Verdict;
using sluice::testing::eventually;

using sluice::testing::kMs;

// The partition background bucket and the node bucket of the two-level
// admission control (docs/rules.md).
json classes3() {
  return json::parse(R"([
    {"name": "foreground", "origins": ["foreground", "wal"], "priority": 0},
    {"name": "flush", "origins": ["flush"], "priority": 1, "weight": 10},
    {"name": "compaction", "origins": ["compaction*"], "priority": 1, "weight": 1}])");
}

json config3(double rate, double burst) {
  return {
      {"rate", rate}, {"burst", burst}, {"classes", classes3()}, {"default_class", "compaction"}};
}

sluice::Context prio_request(sluice::OriginId origin, std::uint64_t size) {
  sluice::Context ctx;
  ctx.origin = origin;
  ctx.size = size;
  ctx.op = sluice::Op::kWrite;
  return ctx;
}

json class_stats(const PrioBucket& b, const std::string& name) {
  const json all = b.collect();
  for (const json& c : all["classes"]) {
    if (c["name"] == name) return c;
  }
  FAIL("no class " << name);
  return {};
}

std::uint64_t requests(const PrioBucket& b, const std::string& name) {
  return class_stats(b, name)["requests"].get<std::uint64_t>();
}

std::uint64_t queued(const PrioBucket& b) {
  return b.collect()["queued"].get<std::uint64_t>();
}

// Threads that each enforce one request and record the order of grants.
struct PrioCrowd {
  explicit PrioCrowd(PrioBucket& b) : bucket(b) {}
  ~PrioCrowd() {
    for (auto& t : threads) t.join();
  }
  // Starts a request and returns once it is queued; returns its id.
  int add(sluice::OriginId origin, std::uint64_t size) {
    const int id = static_cast<int>(threads.size());
    const std::uint64_t before = queued(bucket);
    threads.emplace_back([this, id, origin, size] {
      const Verdict v = bucket.enforce_context(prio_request(origin, size));
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(id);
      verdicts.push_back(v);
    });
    eventually([&] { return queued(bucket) == before + 1; });
    return id;
  }
  std::size_t done() {
    std::lock_guard<std::mutex> lock(mu);
    return order.size();
  }
  std::vector<int> grants() {
    std::lock_guard<std::mutex> lock(mu);
    return order;
  }

  PrioBucket& bucket;
  std::vector<std::thread> threads;
  std::mutex mu;
  std::vector<int> order;
  std::vector<Verdict> verdicts;
};

// Threads that keep a request of their origin queued at all times; the
// test moves the clock one grant at a time and records which class each
// grant went to.
struct PrioBacklog {
  PrioBacklog(PrioBucket& b, ManualClock& c) : bucket(b), clock(c) {}
  ~PrioBacklog() { stop(); }
  void add(sluice::OriginId origin, std::uint64_t size, int threads_of_it) {
    for (int i = 0; i < threads_of_it; ++i) {
      threads.emplace_back([this, origin, size] {
        while (!stopping.load()) {
          if (!bucket.enforce_context(prio_request(origin, size)).ok()) break;
        }
      });
    }
    total += threads_of_it;
  }
  // Moves the clock by `step` and returns once one more request is granted
  // and its thread has queued again.
  void one_grant(std::int64_t step, const std::vector<std::string>& names,
                 std::vector<std::string>& served) {
    std::vector<std::uint64_t> before;
    for (const auto& n : names) before.push_back(requests(bucket, n));
    clock.advance(step);
    std::size_t who = names.size();
    eventually([&] {
      for (std::size_t i = 0; i < names.size(); ++i) {
        if (requests(bucket, names[i]) != before[i]) who = i;
      }
      return who != names.size() && queued(bucket) == static_cast<std::uint64_t>(total);
    });
    served.push_back(names[who]);
  }
  void stop() {
    if (stopping.exchange(true)) return;
    bucket.shutdown();
    for (auto& t : threads) t.join();
  }

  PrioBucket& bucket;
  ManualClock& clock;
  std::vector<std::thread> threads;
  std::atomic<bool> stopping{false};
  int total = 0;
};

}  // namespace

TEST_CASE("prio-bucket config: defaults, the two-level buckets' configuration, partial updates",
          "[prio-bucket]") {
  auto c = sluice::parse_prio_bucket_config(
      json{{"rate", 1000}, {"classes", json::parse(R"([{"name": "all", "origins": ["*"]}])")}},
      nullptr);
  REQUIRE(c.is_ok());
  CHECK(c->unit == PrioBucketConfig::kBytes);
  CHECK(c->burst == Approx(100));  // 100 ms of the rate
  REQUIRE(c->classes.size() == 1);
  CHECK(c->classes[0].priority == 0);
  CHECK(c->classes[0].weight == 1);
  CHECK(c->default_class == 0);

  auto d = sluice::parse_prio_bucket_config(json{{"rate", 5e6}, {"classes", classes3()}}, nullptr);
  REQUIRE(d.is_ok());
  CHECK(d->default_class == 2);  // the last class
  CHECK(d->classes[1].weight == 10);
  CHECK(d->classes[2].origins == std::vector<std::string>{"compaction*"});

  // Weights and priorities may change; a derived burst follows the rate.
  json again = classes3();
  again[1]["weight"] = 4;
  auto e = sluice::parse_prio_bucket_config(json{{"rate", 1e7}, {"classes", again}}, &*d);
  REQUIRE(e.is_ok());
  CHECK(e->classes[1].weight == 4);
  CHECK(e->burst == Approx(1e6));
  CHECK(sluice::parse_prio_bucket_config(json::object(), &*e).is_ok());

  CHECK(sluice::prio_origin_matches("compaction*", "compaction_L0_L1"));
  CHECK(sluice::prio_origin_matches("compaction*", "compaction"));
  CHECK(sluice::prio_origin_matches("*", "anything"));
  CHECK_FALSE(sluice::prio_origin_matches("compaction", "compaction_LN"));
  CHECK_FALSE(sluice::prio_origin_matches("flush", "flushes"));
}

TEST_CASE("prio-bucket config: every error names its field and changes nothing", "[prio-bucket]") {
  struct Case {
    json config;
    std::string message;
  };
  const json one = json::parse(R"([{"name": "a", "origins": ["foreground"]}])");
  const std::vector<Case> cases = {
      {{{"classes", one}}, "rate: required"},
      {{{"rate", 10}}, "classes: required"},
      {{{"rate", 0.5}, {"classes", one}}, "rate: must be a number of at least 1 token per second"},
      {{{"rate", "x"}, {"classes", one}}, "rate: must be"},
      {{{"rate", 10}, {"burst", 0}, {"classes", one}}, "burst: must be a number of at least 1"},
      {{{"rate", 10}, {"unit", "pages"}, {"classes", one}}, "unit: must be \"bytes\" or \"ops\""},
      {{{"rate", 10}, {"classes", json::array()}}, "classes: must be an array of 1 to 8"},
      {{{"rate", 10}, {"classes", json::parse(R"([{"origins": []}])")}},
       "classes[0].name: required"},
      {{{"rate", 10}, {"classes", json::parse(R"([{"name": "a b"}])")}},
       "classes[0].name: must be 1-32 characters"},
      {{{"rate", 10}, {"classes", json::parse(R"([{"name": "a"}, {"name": "a"}])")}},
       "classes[1].name: 'a' is already the name of classes[0]"},
      {{{"rate", 10}, {"classes", json::parse(R"([{"name": "a", "origins": ["fl ush"]}])")}},
       "classes[0].origins[0]: must be an origin name"},
      {{{"rate", 10}, {"classes", json::parse(R"([{"name": "a", "priority": 8}])")}},
       "classes[0].priority: must be an integer from 0 (first) to 7"},
      {{{"rate", 10}, {"classes", json::parse(R"([{"name": "a", "priority": -1}])")}},
       "classes[0].priority"},
      {{{"rate", 10}, {"classes", json::parse(R"([{"name": "a"}, {"name": "b", "weight": 0}])")}},
       "classes[1].weight: must be a number between 0.001 and 1000000, got 0"},
      {{{"rate", 10}, {"classes", json::parse(R"([{"name": "a", "colour": 1}])")}},
       "classes[0]: unknown field 'colour'"},
      {{{"rate", 10}, {"classes", one}, {"default_class", "b"}},
       "default_class: no class named \"b\""},
      {{{"rate", 10}, {"classes", one}, {"flavour", 1}}, "unknown field 'flavour'"},
  };
  for (const Case& k : cases) {
    auto r = sluice::parse_prio_bucket_config(k.config, nullptr);
    INFO(k.config.dump());
    REQUIRE_FALSE(r.is_ok());
    CHECK_THAT(r.status().message(), Catch::Matchers::Contains(k.message));
  }

  ManualClock clock;
  PrioBucket b(&clock);
  REQUIRE(b.configure(config3(1000, 100)).is_ok());
  json renamed = classes3();
  renamed[2]["name"] = "compact";
  const sluice::Status s = b.configure({{"rate", 5}, {"classes", renamed}});
  CHECK_THAT(s.message(),
             Catch::Matchers::Contains("classes: the classes' names, order and origins cannot "
                                       "change"));
  json moved = classes3();
  moved[1]["origins"] = json::array({"flush", "wal"});
  CHECK_FALSE(b.configure({{"classes", moved}}).is_ok());
  CHECK_FALSE(b.configure({{"default_class", "flush"}}).is_ok());
  CHECK(b.collect()["rate"] == 1000.0);  // nothing changed

  // A board's values are checked the same way, by the tunable's name.
  const auto names = b.tunables();
  REQUIRE(names.size() == 5);
  CHECK(names[0] == "rate");
  CHECK(names[1] == "burst");
  CHECK(names[2] == "weight_foreground");
  CHECK(names[3] == "weight_flush");
  CHECK(names[4] == "weight_compaction");
  std::array<double, sluice::kMaxTunables> values{};
  values[3] = 0;
  CHECK_THAT(b.set_tunables(1u << 3, values).message(),
             Catch::Matchers::Contains("weight_flush: must be a number between 0.001 and 1000000"));
  values[0] = 0.5;
  CHECK_THAT(b.set_tunables(1u, values).message(), Catch::Matchers::Contains("rate: must be"));
  CHECK_FALSE(b.set_tunables(1u << 5, values).is_ok());
  CHECK(b.collect()["rate"] == 1000.0);
  CHECK(class_stats(b, "flush")["weight"] == 10.0);
}

TEST_CASE("prio-bucket: requests are classified by origin, first match wins", "[prio-bucket]") {
  ManualClock clock;
  PrioBucket b(&clock);
  REQUIRE(b.configure(config3(1e12, 1e12)).is_ok());
  using namespace sluice::origin;
  for (sluice::OriginId o : {kForeground, kWal, kFlush, kCompactionL0L1, kCompactionL0L0,
                             kCompactionLN, kManifest, kUnknown}) {
    REQUIRE(b.enforce_context(prio_request(o, 100)).ok());
  }
  const auto dyn = sluice::intern_origin("compaction_bottom");
  REQUIRE(dyn);
  REQUIRE(b.enforce_context(prio_request(*dyn, 100)).ok());
  CHECK(requests(b, "foreground") == 2);
  CHECK(requests(b, "flush") == 1);
  CHECK(requests(b, "compaction") == 6);  // 4 by pattern, manifest and unknown by default
  CHECK(class_stats(b, "compaction")["bytes"] == 600);
  CHECK(class_stats(b, "foreground")["waits"] == 0);
}

TEST_CASE("prio-bucket: a higher priority is served first, whoever came first",
          "[prio-bucket][priority]") {
  const std::int64_t t0 = 1'000'000'000;
  ManualClock clock(t0);
  PrioBucket b(&clock);
  REQUIRE(b.configure(config3(1000, 100)).is_ok());
  REQUIRE(b.enforce_context(prio_request(sluice::origin::kFlush, 100)).wait_ns == 0);  // empties it
  PrioCrowd crowd(b);
  const int compaction = crowd.add(sluice::origin::kCompactionLN, 100);
  const int flush = crowd.add(sluice::origin::kFlush, 100);
  const int fg = crowd.add(sluice::origin::kForeground, 100);
  const int wal = crowd.add(sluice::origin::kWal, 100);
  // Only the one served next sleeps on the clock (an old head leaves it once
  // its thread has run).
  eventually([&] { return clock.waiters() == 1; });
  for (std::size_t i = 1; i <= 4; ++i) {
    clock.set(t0 + static_cast<std::int64_t>(i) * 100 * kMs - 1);
    eventually([&] { return clock.waiters() == 1; });
    CHECK(crowd.done() == i - 1);
    clock.set(t0 + static_cast<std::int64_t>(i) * 100 * kMs);
    eventually([&] { return crowd.done() == i; });
    if (i < 4) eventually([&] { return clock.waiters() == 1; });
  }
  // Foreground (priority 0) first, in its order of arrival; then the
  // background: both of its classes were idle, so both requests start at V,
  // and a tie goes to the class configured first (flush), whoever came first.
  CHECK(crowd.grants() == std::vector<int>{fg, wal, flush, compaction});
  CHECK(class_stats(b, "foreground")["waits"] == 2);
  CHECK(class_stats(b, "foreground")["wait_us_max"] == 200'000);
  CHECK(class_stats(b, "compaction")["wait_us_total"] == 400'000);
}

TEST_CASE(
    "prio-bucket: a request larger than the burst keeps what it saved while a higher "
    "priority is served",
    "[prio-bucket][priority]") {
  const std::int64_t t0 = 1'000'000'000;
  ManualClock clock(t0);
  PrioBucket b(&clock);
  REQUIRE(b.configure(config3(1000, 100)).is_ok());
  REQUIRE(b.enforce_context(prio_request(sluice::origin::kFlush, 100)).wait_ns == 0);  // empties it
  PrioCrowd crowd(b);
  crowd.add(sluice::origin::kFlush, 500);  // five bursts: it saves up past the burst
  eventually([&] { return clock.waiters() == 1; });
  clock.set(t0 + 400 * kMs);  // 400 saved
  // A foreground request takes 50 of them at once; the flush keeps the other
  // 350 and is due 150 ms later, not 450 ms later, as it would be if the
  // bucket fell back to its burst while the foreground request was served next.
  CHECK(b.enforce_context(prio_request(sluice::origin::kForeground, 50)).ok());
  clock.set(t0 + 550 * kMs - 1);
  eventually([&] { return clock.waiters() == 1; });
  CHECK(crowd.done() == 0);
  clock.set(t0 + 550 * kMs);
  eventually([&] { return crowd.done() == 1; });
}

TEST_CASE("prio-bucket: FIFO within a class, at exact times", "[prio-bucket][fifo]") {
  const std::int64_t t0 = 1'000'000'000;
  ManualClock clock(t0);
  PrioBucket b(&clock);
  REQUIRE(b.configure(config3(1000, 1000)).is_ok());
  REQUIRE(b.enforce_context(prio_request(sluice::origin::kCompactionLN, 1000)).ok());
  PrioCrowd crowd(b);
  const std::vector<std::uint64_t> sizes = {300, 100, 500, 200};
  for (std::uint64_t s : sizes) crowd.add(sluice::origin::kCompactionL0L1, s);
  std::int64_t due = t0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    due += static_cast<std::int64_t>(sizes[i]) * kMs;
    clock.set(due - 1);
    eventually([&] { return clock.waiters() == 1; });
    CHECK(crowd.done() == i);
    clock.set(due);
    eventually([&] { return crowd.done() == i + 1; });
    if (i + 1 < sizes.size()) eventually([&] { return clock.waiters() == 1; });
  }
  CHECK(crowd.grants() == std::vector<int>{0, 1, 2, 3});
  for (const Verdict& v : crowd.verdicts) CHECK(v.ok());
}

TEST_CASE("prio-bucket: equal priorities share by weight, 10:1, and neither starves",
          "[prio-bucket][weights]") {
  ManualClock clock;
  PrioBucket b(&clock);
  REQUIRE(b.configure(config3(1000, 100)).is_ok());
  REQUIRE(b.enforce_context(prio_request(sluice::origin::kFlush, 100)).ok());  // empties it
  PrioBacklog backlog(b, clock);
  backlog.add(sluice::origin::kFlush, 100, 3);
  backlog.add(sluice::origin::kCompactionLN, 100, 3);
  eventually([&] { return queued(b) == 6; });
  const std::vector<std::string> names = {"flush", "compaction"};
  std::vector<std::string> served;
  for (int i = 0; i < 220; ++i) backlog.one_grant(100 * kMs, names, served);
  const auto flushes = std::count(served.begin(), served.end(), "flush");
  CHECK(flushes >= 198);
  CHECK(flushes <= 202);
  // No starvation: compaction is served at least once in every 12 grants.
  for (std::size_t i = 0; i + 12 <= served.size(); ++i) {
    CHECK(std::count(served.begin() + static_cast<std::ptrdiff_t>(i),
                     served.begin() + static_cast<std::ptrdiff_t>(i) + 12, "compaction") >= 1);
  }

  // A new weight (through the board's path) applies to the next tags; the
  // waiters stay queued.
  std::array<double, sluice::kMaxTunables> values{};
  values[3] = 1;  // weight_flush
  REQUIRE(b.set_tunables(1u << 3, values).is_ok());
  CHECK(queued(b) == 6);
  served.clear();
  for (int i = 0; i < 40; ++i) backlog.one_grant(100 * kMs, names, served);
  const auto even = std::count(served.begin() + 10, served.end(), "flush");
  CHECK(even >= 13);
  CHECK(even <= 17);
  backlog.stop();
  CHECK(queued(b) == 0);
}

TEST_CASE("prio-bucket: a new rate re-times the waiters and keeps them",
          "[prio-bucket][configure]") {
  const std::int64_t t0 = 1'000'000'000;
  ManualClock clock(t0);
  PrioBucket b(&clock);
  REQUIRE(b.configure(config3(1000, 1000)).is_ok());
  REQUIRE(b.enforce_context(prio_request(sluice::origin::kFlush, 1000)).ok());
  PrioCrowd crowd(b);
  crowd.add(sluice::origin::kFlush, 1000);
  crowd.add(sluice::origin::kCompactionLN, 1000);
  clock.set(t0 + 500 * kMs);  // the head has 500 of its 1000
  std::array<double, sluice::kMaxTunables> values{};
  values[0] = 2000;
  REQUIRE(b.set_tunables(1, values).is_ok());
  CHECK(queued(b) == 2);
  eventually([&] { return clock.waiters() == 1; });
  clock.set(t0 + 750 * kMs - 1);
  eventually([&] { return clock.waiters() == 1; });
  CHECK(crowd.done() == 0);
  clock.set(t0 + 750 * kMs);  // 500 more at 2000/s
  eventually([&] { return crowd.done() == 1; });
  REQUIRE(b.configure(json{{"rate", 500}}).is_ok());
  CHECK(queued(b) == 1);
  clock.set(t0 + 2750 * kMs);
  eventually([&] { return crowd.done() == 2; });
  for (const Verdict& v : crowd.verdicts) CHECK(v.ok());
  CHECK(b.collect()["rate"] == 500.0);
  CHECK(b.collect()["burst"] == 1000.0);  // set explicitly: it stays
}

TEST_CASE("prio-bucket: a request that must wait takes the leases back; later ones queue",
          "[prio-bucket][lease]") {
  ManualClock clock;
  PrioBucket b(&clock);
  REQUIRE(b.configure(config3(1000, 1000)).is_ok());
  // Leases are drawn: these are granted, and the first draws a lease.
  REQUIRE(b.enforce_context(prio_request(sluice::origin::kFlush, 10)).ok());
  REQUIRE(b.enforce_context(prio_request(sluice::origin::kFlush, 10)).ok());
  PrioCrowd crowd(b);
  crowd.add(sluice::origin::kCompactionLN, 5000);  // more than there is: waits
  // Nobody overtakes a waiter from a lease, and a try says so.
  CHECK(b.try_enforce_context(prio_request(sluice::origin::kFlush, 1)).outcome ==
        Outcome::kWouldWait);
  crowd.add(sluice::origin::kCompactionL0L1, 1);  // behind it, in its class
  CHECK(queued(b) == 2);
  // A foreground request is served next: at once, from the tokens the
  // compaction was saving up.
  const Verdict fg = b.enforce_context(prio_request(sluice::origin::kForeground, 1));
  CHECK(fg.ok());
  CHECK(fg.wait_ns == 0);
  CHECK(queued(b) == 2);
  CHECK(class_stats(b, "foreground")["waits"] == 1);
  b.shutdown();
  eventually([&] { return crowd.done() == 2; });
  for (const Verdict& v : crowd.verdicts) CHECK(v.outcome == Outcome::kCancelled);
  CHECK(b.enforce_context(prio_request(sluice::origin::kFlush, 1 << 20)).ok());  // passes now
}

TEST_CASE("prio-bucket: the fast grant pays from the lease of the thread's last class",
          "[prio-bucket][lease]") {
  ManualClock clock;
  PrioBucket b(&clock);
  REQUIRE(b.configure(config3(1e9, 1e9)).is_ok());
  REQUIRE(b.enforce_context(prio_request(sluice::origin::kWal, 100)).ok());
  const sluice::FastGrant g = b.fast_grant();
  REQUIRE(g);
  for (int i = 0; i < 10; ++i) CHECK(g.grant(g.state, 1000));
  const json fg = class_stats(b, "foreground");
  CHECK(fg["requests"] == 11);
  CHECK(fg["bytes"] == 10'100);
  CHECK(requests(b, "flush") == 0);
  // The last request here was a flush: the grant pays from flush's lease.
  REQUIRE(b.enforce_context(prio_request(sluice::origin::kFlush, 100)).ok());
  const sluice::FastGrant h = b.fast_grant();
  REQUIRE(h);
  CHECK(h.grant(h.state, 1));
  CHECK(requests(b, "flush") == 2);
  // Another bucket's last request is not this one's.
  PrioBucket other(&clock);
  REQUIRE(other.configure(config3(1e9, 1e9)).is_ok());
  CHECK_FALSE(other.fast_grant());
  // A bucket that is shut down keeps its grant and has it refuse.
  b.shutdown();
  CHECK_FALSE(h.grant(h.state, 1));
}

TEST_CASE("prio-bucket: collect reports the bucket and every class", "[prio-bucket]") {
  ManualClock clock;
  PrioBucket b(&clock);
  REQUIRE(b.configure(json{{"rate", 100},
                           {"unit", "ops"},
                           {"classes", classes3()},
                           {"default_class", "compaction"}})
              .is_ok());
  REQUIRE(b.enforce_context(prio_request(sluice::origin::kFlush, 4096)).ok());
  REQUIRE(b.enforce_context(prio_request(sluice::origin::kFlush, 4096)).ok());
  const json c = b.collect();
  CHECK(c["rate"] == 100.0);
  CHECK(c["unit"] == "ops");
  CHECK(c["burst"] == 10.0);
  CHECK(c["tokens"] == Approx(8));
  CHECK(c["queued"] == 0);
  REQUIRE(c["classes"].size() == 3);
  const json& flush = c["classes"][1];
  for (const char* key : {"name", "priority", "weight", "requests", "bytes", "waits",
                          "wait_us_total", "wait_us_max", "queued"}) {
    CHECK(flush.contains(key));
  }
  CHECK(flush["requests"] == 2);
  CHECK(flush["bytes"] == 8192);
  CHECK(flush["priority"] == 1);
  CHECK(flush["weight"] == 10.0);
}

TEST_CASE("prio-bucket: the registry creates it by name", "[prio-bucket]") {
  sluice::objects::register_builtin();
  auto made = sluice::Registry::global().create("prio-bucket", config3(1e6, 1e5), {});
  REQUIRE(made.is_ok());
  CHECK(made.value()->type() == "prio-bucket");
  auto bad = sluice::Registry::global().create("prio-bucket", json{{"rate", 5}}, {});
  REQUIRE_FALSE(bad.is_ok());
  CHECK_THAT(bad.status().message(), Catch::Matchers::Contains("classes: required"));
}

TEST_CASE("prio-bucket: concurrent enforce, configure and collect (system clock)",
          "[prio-bucket][concurrency]") {
  PrioBucket b(nullptr);
  REQUIRE(b.configure(config3(1e8, 1e6)).is_ok());
  std::atomic<bool> stop{false};
  std::array<std::atomic<std::uint64_t>, 3> done{};
  std::vector<std::thread> threads;
  const sluice::OriginId origins[] = {sluice::origin::kForeground, sluice::origin::kFlush,
                                      sluice::origin::kCompactionLN};
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      while (!stop.load()) {
        if (b.enforce_context(prio_request(origins[t], 4096)).ok()) done[t].fetch_add(1);
      }
    });
  }
  int rounds = 0;
  eventually([&] {
    REQUIRE(b.configure(json{{"rate", ++rounds % 2 ? 1e8 : 1e7}}).is_ok());
    (void)b.collect();
    return rounds >= 200 && done[0] > 100 && done[1] > 100 && done[2] > 100;
  });
  // Every request counted by its thread so far was granted, and counted by
  // its class.
  std::array<std::uint64_t, 3> granted{};
  for (int t = 0; t < 3; ++t) granted[t] = done[t].load();
  const json all = b.collect();
  stop = true;
  b.shutdown();
  for (auto& t : threads) t.join();
  CHECK(all["classes"][0]["requests"].get<std::uint64_t>() >= granted[0]);
  CHECK(all["classes"][1]["requests"].get<std::uint64_t>() >= granted[1]);
  CHECK(all["classes"][2]["requests"].get<std::uint64_t>() >= granted[2]);
}
