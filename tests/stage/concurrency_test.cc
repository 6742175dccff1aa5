// Rules changing under traffic, objects removed while requests wait, and
// shutdown: the hot path never sees a torn layout and never loses a request.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include "probe.h"
#include "sluice/stage.h"

using namespace sluice;
using nlohmann::json;

TEST_CASE("rules change under traffic without torn routing or lost counts") {
  StageOptions o;
  o.registry = &test::probe_registry();
  auto stage = Stage::create(o).value();
  // Layout A routes flush to probe 1; layout B routes it to probe 2 via a
  // different channel. Either is fine for a request; nothing else is.
  const json layout_a = json::parse(R"([
    {"rule": "differentiate", "classifiers": ["origin"]},
    {"rule": "create_channel", "channel": "a", "match": {"origin": "flush"}},
    {"rule": "create_object", "channel": "a", "object": "p", "type": "probe", "config": {"id": 1}}
  ])");
  const json a_to_b = json::parse(R"([
    {"rule": "remove_channel", "channel": "a"},
    {"rule": "create_channel", "channel": "b", "match": {"origin": ["flush", "wal"]}},
    {"rule": "create_object", "channel": "b", "object": "p", "type": "probe", "config": {"id": 2}}
  ])");
  const json b_to_a = json::parse(R"([
    {"rule": "remove_channel", "channel": "b"},
    {"rule": "create_channel", "channel": "a", "match": {"origin": "flush"}},
    {"rule": "create_object", "channel": "a", "object": "p", "type": "probe", "config": {"id": 1}}
  ])");
  REQUIRE(stage->apply(layout_a).is_ok());

  constexpr int kThreads = 4;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> sent{0}, bad{0};
  std::atomic<int> running{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      OriginScope s(origin::kFlush);
      std::uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        test::last_probe = 0;
        stage->enforce(Op::kWrite, 10);
        if (test::last_probe != 1 && test::last_probe != 2) bad.fetch_add(1);
        if (++n == 1) running.fetch_add(1);
      }
      sent.fetch_add(n);
    });
  }
  // On a loaded machine the workers may not have run yet: the rules must
  // change under traffic, so start once every worker is enforcing.
  while (running.load() < kThreads) std::this_thread::yield();
  std::uint64_t counted = 0;
  for (int i = 0; i < 400; ++i) {
    REQUIRE(stage->apply(i % 2 == 0 ? a_to_b : b_to_a).is_ok());
    counted += stage->collect().total.ops;  // removed channels take their uncollected counts along
  }
  stop = true;
  for (auto& th : threads) th.join();
  counted += stage->collect().total.ops;
  CHECK(bad.load() == 0);
  CHECK(sent.load() > 0);
  CHECK(counted <= sent.load());
  CHECK(stage->info().rules_version == 401);
}

// A stage whose one channel holds a 1 token/s bucket of one token.
std::unique_ptr<Stage> slow_stage(ManualClock& clock) {
  StageOptions o;
  o.clock = &clock;
  auto stage = Stage::create(o).value();
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "create_channel", "channel": "c", "default": true},
    {"rule": "create_object", "channel": "c", "object": "slow", "type": "drl",
     "config": {"rate": 1, "burst": 1}}
  ])"))
              .is_ok());
  return stage;
}

TEST_CASE("removing an object wakes its waiters; they proceed unenforced") {
  ManualClock clock;
  auto stage = slow_stage(clock);
  stage->enforce(Op::kWrite, 1);  // takes the only token
  std::atomic<int> finished{0};
  std::vector<Outcome> outcomes(3);
  std::vector<std::thread> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&, i] {
      outcomes[static_cast<std::size_t>(i)] = stage->enforce(Op::kWrite, 1000).outcome;
      finished.fetch_add(1);
    });
  }
  // All three are queued in the bucket (the head on the clock, the others behind it).
  auto queued = [&] {
    auto st = stage->collect();
    return st.channels.at(0).objects.at(0).state.value("waiters", 0);
  };
  while (queued() < 3) std::this_thread::yield();
  CHECK(finished.load() == 0);
  REQUIRE(
      stage->apply(json::parse(R"([{"rule": "remove_object", "channel": "c", "object": "slow"}])"))
          .is_ok());
  for (auto& w : waiters) w.join();
  for (auto oc : outcomes) CHECK(oc == Outcome::kCancelled);
  // Later requests find the channel without objects and pass through.
  CHECK(stage->enforce(Op::kWrite, 1000).outcome == Outcome::kOk);
}

TEST_CASE("shutdown releases waiters and turns the stage into a pass-through") {
  ManualClock clock;
  auto stage = slow_stage(clock);
  stage->enforce(Op::kWrite, 1);
  std::thread waiter([&] { CHECK(stage->enforce(Op::kWrite, 5).outcome == Outcome::kCancelled); });
  while (clock.waiters() < 1) std::this_thread::yield();
  stage->shutdown();
  waiter.join();
  CHECK(stage->enforce(Op::kWrite, 5).outcome == Outcome::kOk);
  CHECK(stage->apply(json::array()).to_string() ==
        "failed precondition: stage 'stage' is shut down");
}

TEST_CASE("threads that exit release their snapshots and shards") {
  auto stage = Stage::create().value();
  REQUIRE(stage
              ->apply(json::parse(R"([{"rule": "create_channel", "channel": "c", "default": true},
      {"rule": "create_object", "channel": "c", "object": "n", "type": "noop"}])"))
              .is_ok());
  for (int round = 0; round < 100; ++round) {  // far more threads than shards over time
    std::thread t([&] { stage->enforce(Op::kRead, 1); });
    t.join();
  }
  CHECK(stage->collect().total.ops == 100);
}
