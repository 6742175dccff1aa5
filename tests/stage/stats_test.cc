// Statistics: per channel, object and origin; deltas; exact under concurrency.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include "sluice/stage.h"

using namespace sluice;
using nlohmann::json;

namespace {
std::unique_ptr<Stage> two_channel_stage(Clock* clock = nullptr) {
  StageOptions o;
  o.clock = clock;
  auto stage = Stage::create(o).value();
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "differentiate", "classifiers": ["operation"]},
    {"rule": "create_channel", "channel": "reads", "match": {"operation": "read"}},
    {"rule": "create_object", "channel": "reads", "object": "n", "type": "noop"},
    {"rule": "create_channel", "channel": "writes", "match": {"operation": "write"}},
    {"rule": "create_object", "channel": "writes", "object": "n", "type": "noop"}
  ])"))
              .is_ok());
  return stage;
}
}  // namespace

TEST_CASE("collect reports deltas per channel, object and origin") {
  SimClock clock;
  auto stage = two_channel_stage(&clock);
  clock.advance(1'000'000);
  {
    OriginScope s(origin::kFlush);
    stage->enforce(Op::kWrite, 100);
    stage->enforce(Op::kWrite, 50);
  }
  stage->enforce(Op::kRead, 7);
  stage->enforce(Op::kSync, 0);  // no channel: unclassified
  auto a = stage->collect();
  CHECK(a.interval_ns == 1'000'000);
  CHECK(a.total.ops == 4);
  CHECK(a.total.bytes == 157);
  CHECK(a.unclassified.ops == 1);
  const ChannelStats* w = a.channel("writes");
  REQUIRE(w != nullptr);
  CHECK(w->total.ops == 2);
  CHECK(w->total.bytes == 150);
  CHECK(w->by_origin.at("flush").bytes == 150);
  CHECK(w->objects.at(0).total.ops == 2);
  CHECK(w->wait.buckets[0] == 2);  // nothing waited
  CHECK(w->wait.count() == 2);
  CHECK(a.channel("reads")->by_origin.at("unknown").bytes == 7);

  stage->enforce(Op::kRead, 1);
  auto b = stage->collect();
  CHECK(b.interval_ns == 0);
  CHECK(b.total.ops == 1);
  CHECK(b.channel("writes")->total.ops == 0);
  CHECK(b.channel("reads")->total.bytes == 1);

  json j;
  to_json(j, b);
  auto back = stage_stats_from_json(j);
  REQUIRE(back.is_ok());
  CHECK(back->channel("reads")->objects.at(0).total.bytes == 1);
  CHECK(back->stage == "stage");
}

TEST_CASE("stats JSON parsing names the bad field") {
  auto stage = two_channel_stage();
  stage->enforce(Op::kRead, 3);
  json j;
  to_json(j, stage->collect());
  j["channels"][1]["objects"][0]["ops"] = "many";
  CHECK(stage_stats_from_json(j).status().to_string() ==
        "invalid argument: stats.channels[1].objects[0].ops: must be an unsigned integer");
  j.erase("channels");
  CHECK(stage_stats_from_json(j).status().to_string() ==
        "invalid argument: stats.channels: missing");
}

TEST_CASE("wait histogram buckets and quantiles") {
  WaitStats w;
  CHECK(WaitStats::bucket_of(0) == 0);
  CHECK(WaitStats::bucket_of(999) == 1);
  CHECK(WaitStats::bucket_of(1000) == 2);
  CHECK(WaitStats::bucket_of(1999) == 2);
  CHECK(WaitStats::bucket_of(2000) == 3);
  CHECK(WaitStats::bucket_of(~0ull) == kWaitBuckets - 1);
  w.buckets[0] = 98;
  w.buckets[11] = 2;  // [1024, 2048) us
  CHECK(w.count() == 100);
  CHECK(w.quantile_ns(0.5) == 0);
  CHECK(w.quantile_ns(0.99) == 1024'000);
}

TEST_CASE("counts are exact when many threads enforce while another collects") {
  auto stage = two_channel_stage();
  constexpr int kThreads = 48;  // more threads than statistics shards
  constexpr int kPerThread = 20000;
  std::atomic<bool> go{false};
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      OriginScope s(t % 2 ? origin::kFlush : origin::kWal);
      for (int i = 0; i < kPerThread; ++i) stage->enforce(i % 3 ? Op::kWrite : Op::kRead, 1 + t);
      done.fetch_add(1);
    });
  }
  go = true;
  Counters sum, reads, flush;
  while (done.load() < kThreads) {
    auto s = stage->collect();
    sum.add(s.total);
    reads.add(s.channel("reads")->total);
    if (auto it = s.channel("writes")->by_origin.find("flush");
        it != s.channel("writes")->by_origin.end()) {
      flush.add(it->second);
    }
    for (const auto& c : s.channels) {
      if (auto it = c.by_origin.find("flush"); it != c.by_origin.end() && c.name == "reads")
        flush.add(it->second);
    }
  }
  for (auto& th : threads) th.join();
  auto s = stage->collect();
  sum.add(s.total);
  reads.add(s.channel("reads")->total);
  for (const auto& c : s.channels) {
    if (auto it = c.by_origin.find("flush"); it != c.by_origin.end()) flush.add(it->second);
  }
  std::uint64_t bytes = 0, flush_bytes = 0, read_ops = 0;
  for (int t = 0; t < kThreads; ++t) {
    bytes += std::uint64_t(kPerThread) * std::uint64_t(1 + t);
    if (t % 2) flush_bytes += std::uint64_t(kPerThread) * std::uint64_t(1 + t);
  }
  for (int i = 0; i < kPerThread; ++i) read_ops += (i % 3 == 0);
  CHECK(sum.ops == std::uint64_t(kThreads) * kPerThread);
  CHECK(sum.bytes == bytes);
  CHECK(reads.ops == read_ops * kThreads);
  CHECK(flush.bytes == flush_bytes);
}

TEST_CASE("totals are cumulative and leave collect's deltas alone") {
  SimClock clock;
  auto stage = two_channel_stage(&clock);
  stage->enforce(Op::kRead, 10);
  clock.advance(500);
  auto t1 = stage->totals();
  CHECK(t1.total.bytes == 10);
  CHECK(t1.interval_ns == 500);
  auto c1 = stage->collect();  // unaffected by totals()
  CHECK(c1.total.bytes == 10);
  stage->enforce(Op::kWrite, 5);
  CHECK(stage->totals().total.bytes == 15);
  CHECK(stage->totals().channel("writes")->total.bytes == 5);
  CHECK(stage->collect().total.bytes == 5);
  CHECK(stage->totals().total.bytes == 15);
}

TEST_CASE("settle corrects byte counts to what the operation moved") {
  auto stage = two_channel_stage();
  Context shorter = make_context(Op::kRead, 4096);
  stage->enforce(shorter);
  stage->settle(shorter, 100);  // a short read at end of file
  Context longer = make_context(Op::kWrite, 10);
  stage->enforce(longer);
  stage->settle(longer, 30);  // larger than requested: counted as moved
  Context failed = make_context(Op::kWrite, 5);
  stage->enforce(failed);
  stage->settle(failed, 0);  // the call failed
  Context exact = make_context(Op::kRead, 8);
  stage->enforce(exact);
  stage->settle(exact, 8);  // nothing to correct
  auto s = stage->collect();
  CHECK(s.total.ops == 4);
  CHECK(s.total.bytes == 138);
  CHECK(s.channel("reads")->total.bytes == 108);
  CHECK(s.channel("reads")->objects.at(0).total.bytes == 108);
  CHECK(s.channel("writes")->total.bytes == 30);
  CHECK(s.channel("reads")->by_origin.at("unknown").bytes == 108);
  // A second interval starts from the corrected totals.
  stage->enforce(exact);
  auto t = stage->collect();
  CHECK(t.total.bytes == 8);
  CHECK(stage->totals().total.bytes == 146);
}

TEST_CASE("settle after a rules change leaves the new layout's counts alone") {
  auto stage = two_channel_stage();
  Context c = make_context(Op::kRead, 4096);
  stage->enforce(c);
  // The layout changes while the read is in flight: "reads" is recreated.
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "remove_channel", "channel": "reads"},
    {"rule": "create_channel", "channel": "reads", "match": {"operation": "read"}},
    {"rule": "create_object", "channel": "reads", "object": "n", "type": "noop"}
  ])"))
              .is_ok());
  // Dropped: settle cannot tell the new layout's counters from the old, so
  // the read stays counted at the size it was enforced with ("reads" was
  // recreated under its name in one batch, and kept its counters).
  stage->settle(c, 100);
  auto s = stage->collect();
  CHECK(s.channel("reads")->total.bytes == 4096);
  CHECK(s.total.bytes < (std::uint64_t{1} << 40));  // nothing wrapped below zero
}

TEST_CASE("a channel or object recreated under its name in one batch keeps its counters") {
  auto stage = two_channel_stage();
  stage->enforce(Op::kRead, 10);
  stage->enforce(Op::kWrite, 20);
  auto before = stage->collect();
  REQUIRE(before.channel("reads")->total.bytes == 10);
  stage->enforce(Op::kRead, 1);   // not yet collected when "reads" is swapped
  stage->enforce(Op::kWrite, 2);  // nor when "writes/n" is
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "remove_channel", "channel": "reads"},
    {"rule": "create_channel", "channel": "reads", "match": {"operation": "read"}},
    {"rule": "create_object", "channel": "reads", "object": "n", "type": "noop"},
    {"rule": "remove_object", "channel": "writes", "object": "n"},
    {"rule": "create_object", "channel": "writes", "object": "n", "type": "drl",
     "config": {"rate": 1e12}}
  ])"))
              .is_ok());
  stage->enforce(Op::kRead, 100);
  stage->enforce(Op::kWrite, 200);
  // Deltas go on from the last collect, across the swap: nothing is lost and
  // nothing counted twice.
  auto after = stage->collect();
  CHECK(after.channel("reads")->total.ops == 2);
  CHECK(after.channel("reads")->total.bytes == 101);
  CHECK(after.channel("reads")->objects.at(0).total.bytes == 101);
  CHECK(after.channel("writes")->objects.at(0).type == "drl");
  CHECK(after.channel("writes")->objects.at(0).total.bytes == 202);
  CHECK(stage->totals().channel("reads")->total.bytes == 111);

  // Removed in one batch, created in the next: the new one starts from zero,
  // and so does an object created under a name it did not have.
  REQUIRE(stage->apply(json::parse(R"([{"rule": "remove_channel", "channel": "reads"}])")).is_ok());
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "create_channel", "channel": "reads", "match": {"operation": "read"}},
    {"rule": "create_object", "channel": "reads", "object": "m", "type": "noop"}
  ])"))
              .is_ok());
  stage->enforce(Op::kRead, 5);
  auto fresh = stage->totals();
  CHECK(fresh.channel("reads")->total.bytes == 5);
  CHECK(fresh.channel("reads")->objects.at(0).total.bytes == 5);

  // A failing batch that swapped a channel leaves its counters to the live one.
  CHECK_FALSE(stage
                  ->apply(json::parse(R"([
    {"rule": "remove_channel", "channel": "reads"},
    {"rule": "create_channel", "channel": "reads", "match": {"operation": "read"}},
    {"rule": "configure", "channel": "reads", "object": "gone", "config": {}}
  ])"))
                  .is_ok());
  stage->enforce(Op::kRead, 6);
  CHECK(stage->totals().channel("reads")->total.bytes == 11);
}

TEST_CASE("a configure-only batch keeps the routing: settle still corrects across it") {
  auto stage = two_channel_stage();
  const std::uint64_t before = stage->rules_version();
  Context c = make_context(Op::kRead, 4096);
  stage->enforce(c);
  // What a control loop sends every cycle: new state for an object, no layout change.
  REQUIRE(stage
              ->apply(json::parse(
                  R"([{"rule": "configure", "channel": "reads", "object": "n", "config": {}}])"))
              .is_ok());
  CHECK(stage->rules_version() == before + 1);
  stage->settle(c, 100);  // the snapshot that counted the read is still current
  auto s = stage->collect();
  CHECK(s.channel("reads")->total.bytes == 100);
  // A rejected configure-only batch changes nothing and says which rule failed.
  Status bad = stage->apply(json::parse(
      R"([{"rule": "configure", "channel": "reads", "object": "nope", "config": {}}])"));
  CHECK(bad.message().find("rules[0]") != std::string::npos);
  CHECK(stage->rules_version() == before + 1);
}

TEST_CASE("counts of a channel removed in one batch and recreated in a later one are collected") {
  auto stage = two_channel_stage();
  stage->enforce(Op::kRead, 10);
  auto a = stage->collect();
  REQUIRE(a.channel("reads")->total.bytes == 10);
  stage->enforce(Op::kRead, 1);  // not collected when "reads" goes
  stage->enforce(Op::kWrite, 2);
  REQUIRE(stage->apply(json::parse(R"([{"rule": "remove_channel", "channel": "reads"}])")).is_ok());
  stage->enforce(Op::kRead, 3);  // no channel for reads now: unclassified
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "create_channel", "channel": "reads", "match": {"operation": "read"}},
    {"rule": "create_object", "channel": "reads", "object": "n", "type": "noop"}
  ])"))
              .is_ok());
  stage->enforce(Op::kRead, 100);
  auto b = stage->collect();
  CHECK(b.total.ops == 4);
  CHECK(b.total.bytes == 106);
  CHECK(b.unclassified.bytes == 3);
  CHECK(b.channel("reads")->total.ops == 2);  // the removed one's and the new one's
  CHECK(b.channel("reads")->total.bytes == 101);
  CHECK(b.channel("reads")->objects.at(0).total.bytes == 101);
  CHECK(b.channel("reads")->wait.count() == 2);
  CHECK(b.channel("writes")->total.bytes == 2);
  // Counted once: the next collect has nothing more of it.
  auto c = stage->collect();
  CHECK(c.total.ops == 0);

  // Removed and not recreated: its last counts come under its name, once.
  stage->enforce(Op::kWrite, 7);
  REQUIRE(
      stage->apply(json::parse(R"([{"rule": "remove_channel", "channel": "writes"}])")).is_ok());
  auto d = stage->collect();
  REQUIRE(d.channel("writes") != nullptr);
  CHECK(d.channel("writes")->total.bytes == 7);
  REQUIRE(d.channel("writes")->objects.size() == 1);
  CHECK(d.channel("writes")->objects[0].name == "n");
  CHECK(d.channel("writes")->objects[0].type == "noop");
  CHECK(d.channel("writes")->objects[0].total.bytes == 7);
  CHECK(d.total.bytes == 7);
  CHECK(stage->collect().channel("writes") == nullptr);
}

TEST_CASE("no count is lost while threads enforce across removals and recreations") {
  // Channel "reads" holds a drl that makes requests wait, so that requests
  // are waiting in it when it is removed (they are cancelled and go on), and
  // threads still hold the removed channel's snapshot when they count them.
  auto stage = two_channel_stage();
  const json recreate = json::parse(R"([
    {"rule": "create_channel", "channel": "reads", "match": {"operation": "read"}},
    {"rule": "create_object", "channel": "reads", "object": "n", "type": "drl",
     "config": {"rate": 2000000, "burst": 4096}}
  ])");
  const json remove = json::parse(R"([{"rule": "remove_channel", "channel": "reads"}])");
  REQUIRE(stage->apply(remove).is_ok());
  REQUIRE(stage->apply(recreate).is_ok());
  constexpr int kThreads = 8;
  constexpr int kSwaps = 300;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> ops{0}, bytes{0};
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::uint64_t n = 0, b = 0;
      started.fetch_add(1);
      while (!stop.load(std::memory_order_relaxed)) {
        stage->enforce(n % 2 ? Op::kWrite : Op::kRead, 1 + t);
        ++n;
        b += 1 + t;
      }
      ops.fetch_add(n);
      bytes.fetch_add(b);
    });
  }
  while (started.load() < kThreads) std::this_thread::yield();
  Counters sum;
  for (int swap = 0; swap < kSwaps; ++swap) {
    REQUIRE(stage->apply(remove).is_ok());
    if (swap % 2) sum.add(stage->collect().total);  // between the two batches
    REQUIRE(stage->apply(recreate).is_ok());
    if (swap % 3 == 0) sum.add(stage->collect().total);
  }
  stop = true;
  for (auto& th : threads) th.join();
  sum.add(stage->collect().total);
  CHECK(sum.ops == ops.load());
  CHECK(sum.bytes == bytes.load());
  CHECK(stage->collect().total.ops == 0);
}
