// The per-thread shortcut for a place whose object grants without a Context
// (EnforcementObject::fast_grant, fast::try_grant), through a
// stage to a drl: it charges the object what the full path would, counts
// exactly, lets a board write through at once, and lapses or refuses the
// moment the rules change.
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "sluice/board.h"
#include "sluice/clock.h"
#include "sluice/stage.h"
#include "sluice/stage_fast.h"

using namespace sluice;
using nlohmann::json;

namespace {

// One default channel with one drl "limit" (its bucket starts full).
std::unique_ptr<Stage> drl_stage(Clock* clock, const json& config) {
  StageOptions o;
  o.clock = clock;
  auto stage = Stage::create(o).value();
  json rules = json::parse(R"([
    {"rule": "create_channel", "channel": "all", "default": true},
    {"rule": "create_object", "channel": "all", "object": "limit", "type": "drl"}
  ])");
  rules[1]["config"] = config;
  REQUIRE(stage->apply(rules).is_ok());
  return stage;
}

const ObjectStats& limit_stats(const StageStats& s) {
  REQUIRE(s.channel("all") != nullptr);
  REQUIRE(s.channel("all")->objects.size() == 1);
  return s.channel("all")->objects.at(0);
}

Context with_flags(Op op, std::uint64_t size, std::uint8_t flags) {
  Context ctx = make_context(op, size);
  ctx.flags = flags;
  return ctx;
}

std::array<double, kMaxTunables> tunables(double rate, double burst = 0) {
  std::array<double, kMaxTunables> v{};
  v[0] = rate;
  v[1] = burst;
  return v;
}

constexpr OriginId kOrigin = origin::kUnknown;  // this thread's: no scope is open

}  // namespace

TEST_CASE("the grant shortcut charges a drl exactly what its bucket holds, then the next waits") {
  SimClock clock;  // a wait jumps the clock: wait times are exact
  // 1 MB/s, a bucket of 1 MiB: 1024 requests of 1 KiB drain it.
  auto stage = drl_stage(&clock, {{"rate", 1e6}, {"burst", 1 << 20}});
  constexpr std::uint64_t kSize = 1024;
  constexpr int kFit = 1024;

  // Not armed before this thread's first request on the stage; the plain
  // shortcut never covers a place whose object must be called.
  CHECK_FALSE(fast::try_grant(*stage, kOrigin, kSize));
  CHECK(fast::enforce(*stage, make_context(Op::kRead, kSize)).wait_ns == 0);
  CHECK_FALSE(fast::try_count(*stage, kOrigin, kSize));

  int shortcut = 0;
  int full = 1;
  while (shortcut + full < kFit) {
    errno = 4242;
    if (fast::try_grant(*stage, kOrigin, kSize)) {
      ++shortcut;
    } else {
      CHECK(fast::enforce_rest(*stage, make_context(Op::kRead, kSize)).wait_ns == 0);
      ++full;
    }
    CHECK(errno == 4242);
  }
  // Most requests took the shortcut: the full path draws a lease for the
  // next ones.
  CHECK(shortcut > full);

  // The bucket is empty: the shortcut refuses, a request that must not wait
  // is refused having done nothing, and the next one waits for its cost.
  CHECK_FALSE(fast::try_grant(*stage, kOrigin, kSize));
  CHECK(fast::enforce(*stage, with_flags(Op::kRead, kSize, context_flag::kNoWait)).outcome ==
        Outcome::kWouldWait);
  CHECK(fast::enforce(*stage, make_context(Op::kRead, kSize)).wait_ns == kSize * 1000);

  const StageStats s = stage->collect();
  const ObjectStats& o = limit_stats(s);
  CHECK(o.total.ops == kFit + 1);
  CHECK(o.total.bytes == (kFit + 1) * kSize);
  CHECK(o.by_origin.at(std::string(origin_name(kOrigin))).ops == kFit + 1);
  CHECK(o.wait.total_ns == kSize * 1000);
  CHECK(o.wait.count() == kFit + 1);
  CHECK(o.wait.buckets[0] == kFit);
  CHECK(o.state["granted_ops"] == kFit + 1);
  CHECK(o.state["granted_tokens"] == static_cast<double>((kFit + 1) * kSize));
  CHECK(s.channel("all")->total.ops == kFit + 1);
}

TEST_CASE("the grant shortcut refuses what it cannot charge whole") {
  SimClock clock;
  auto stage = drl_stage(&clock, {{"rate", 1e12}});
  CHECK(fast::enforce(*stage, make_context(Op::kRead, 1)).ok());
  REQUIRE(fast::try_grant(*stage, kOrigin, 1));
  // Above the bounded pre-charge the flags decide what is charged: the full
  // path's business.
  CHECK_FALSE(fast::try_grant(*stage, kOrigin, kMaxPreCharge + 1));
  // Another origin is not the one armed.
  CHECK_FALSE(fast::try_grant(*stage, origin::kFlush, 1));
  const StageStats s = stage->collect();
  CHECK(limit_stats(s).total.ops == 2);
  CHECK(limit_stats(s).total.bytes == 2);
}

TEST_CASE("settle corrects a request the grant shortcut charged") {
  SimClock clock;
  auto stage = drl_stage(&clock, {{"rate", 1e6}, {"burst", 1e6}});
  CHECK(fast::enforce(*stage, make_context(Op::kRead, 100)).ok());
  REQUIRE(fast::try_grant(*stage, kOrigin, 4096));
  // A short read: the bytes it did not move go back to the bucket and out of
  // the statistics.
  errno = 4242;
  stage->settle(with_flags(Op::kRead, 4096, context_flag::kBounded), 1000);
  CHECK(errno == 4242);
  const StageStats s = stage->collect();
  const ObjectStats& o = limit_stats(s);
  CHECK(o.total.ops == 2);
  CHECK(o.total.bytes == 100 + 1000);
  CHECK(o.state["refunded_tokens"] == 3096.0);
  CHECK(o.state["tokens"] == 1e6 - 100 - 1000);
}

TEST_CASE("a board write reaches a thread that enforces through the grant shortcut") {
  SimClock clock;
  auto stage = drl_stage(&clock, {{"rate", 1e12}});
  auto w = BoardWriter::map(stage->board().value()).value();
  const ObjectInfo limit = stage->info().channels.at(0).objects.at(0);
  REQUIRE(limit.board_slot >= 0);
  const auto slot = static_cast<std::size_t>(limit.board_slot);

  CHECK(fast::enforce(*stage, make_context(Op::kRead, 10)).ok());
  REQUIRE(fast::try_grant(*stage, kOrigin, 10));

  // A write not taken yet sends the next request the full way, which takes
  // it before enforcing; the shortcut then applies again.
  REQUIRE(w.write(slot, limit.board_tag, 0b01, tunables(2e12)));
  CHECK_FALSE(fast::try_grant(*stage, kOrigin, 10));
  CHECK(stage->board_updates() == 0);
  CHECK(fast::enforce(*stage, make_context(Op::kRead, 10)).ok());
  CHECK(stage->board_updates() == 1);
  CHECK(w.taken(slot));
  CHECK(fast::try_grant(*stage, kOrigin, 10));

  // A cut to 1 byte per second holds for the very next request: the lease
  // the shortcut paid from was taken back.
  REQUIRE(w.write(slot, limit.board_tag, 0b11, tunables(1, 1)));
  CHECK(fast::enforce(*stage, with_flags(Op::kRead, 10, context_flag::kNoWait)).outcome ==
        Outcome::kWouldWait);
  CHECK(stage->board_updates() == 2);
  CHECK_FALSE(fast::try_grant(*stage, kOrigin, 10));

  const StageStats s = stage->collect();
  const ObjectStats& o = limit_stats(s);
  CHECK(o.total.ops == 4);
  CHECK(o.total.bytes == 40);
  CHECK(o.state["rate"] == 1.0);
}

TEST_CASE("a board made after a thread armed its grant shortcut reaches that thread") {
  SimClock clock;
  auto stage = drl_stage(&clock, {{"rate", 1e12}});
  CHECK(fast::enforce(*stage, make_context(Op::kRead, 10)).ok());
  REQUIRE(fast::try_grant(*stage, kOrigin, 10));
  // Making the board gives the object a slot and publishes the layout anew:
  // the shortcut lapses, and arms again with the slot.
  auto w = BoardWriter::map(stage->board().value()).value();
  const ObjectInfo limit = stage->info().channels.at(0).objects.at(0);
  REQUIRE(limit.board_slot >= 0);
  CHECK_FALSE(fast::try_grant(*stage, kOrigin, 10));
  CHECK(fast::enforce(*stage, make_context(Op::kRead, 10)).ok());
  REQUIRE(fast::try_grant(*stage, kOrigin, 10));
  REQUIRE(
      w.write(static_cast<std::size_t>(limit.board_slot), limit.board_tag, 0b11, tunables(1, 1)));
  CHECK(fast::enforce(*stage, with_flags(Op::kRead, 10, context_flag::kNoWait)).outcome ==
        Outcome::kWouldWait);
  CHECK(stage->board_updates() == 1);
  CHECK(limit_stats(stage->collect()).total.ops == 4);
}

TEST_CASE("the grant shortcut follows a reconfiguration and lapses when the object is removed") {
  SimClock clock;
  auto stage = drl_stage(&clock, {{"rate", 1e12}});
  CHECK(fast::enforce(*stage, make_context(Op::kRead, 10)).ok());
  REQUIRE(fast::try_grant(*stage, kOrigin, 10));

  // configure changes no routing (the shortcut stays armed), and takes the
  // leases back: a cut holds at once.
  REQUIRE(stage
              ->apply(json::parse(R"([{"rule": "configure", "channel": "all", "object": "limit",
                                       "config": {"rate": 1, "burst": 1}}])"))
              .is_ok());
  CHECK_FALSE(fast::try_grant(*stage, kOrigin, 10));
  CHECK(fast::enforce(*stage, with_flags(Op::kRead, 10, context_flag::kNoWait)).outcome ==
        Outcome::kWouldWait);
  REQUIRE(stage
              ->apply(json::parse(R"([{"rule": "configure", "channel": "all", "object": "limit",
                                       "config": {"rate": 1e12, "burst": 1e9}}])"))
              .is_ok());
  clock.advance(1'000'000'000);  // the bucket fills again
  CHECK(fast::enforce(*stage, make_context(Op::kRead, 10)).ok());
  REQUIRE(fast::try_grant(*stage, kOrigin, 10));

  // Removing the object publishes a new layout: the shortcut lapses at once
  // and counts nothing; what it counted stays counted.
  REQUIRE(stage
              ->apply(json::parse(R"([{"rule": "remove_object", "channel": "all",
                                        "object": "limit"}])"))
              .is_ok());
  CHECK_FALSE(fast::try_grant(*stage, kOrigin, 10));
  CHECK(fast::enforce(*stage, make_context(Op::kRead, 10)).ok());  // the channel's own
  CHECK_FALSE(fast::try_grant(*stage, kOrigin, 10));
  CHECK(fast::try_count(*stage, kOrigin, 10));  // a place without an object now
  StageStats s = stage->collect();
  REQUIRE(s.channel("all") != nullptr);
  CHECK(s.channel("all")->total.ops == 6);
  CHECK(limit_stats(s).total.ops == 4);

  // An object created again is armed by its first request.
  REQUIRE(stage
              ->apply(json::parse(R"([{"rule": "create_object", "channel": "all",
                                       "object": "limit", "type": "drl",
                                       "config": {"rate": 1e12}}])"))
              .is_ok());
  CHECK_FALSE(fast::try_count(*stage, kOrigin, 10));
  CHECK_FALSE(fast::try_grant(*stage, kOrigin, 10));
  CHECK(fast::enforce(*stage, make_context(Op::kRead, 10)).ok());
  CHECK(fast::try_grant(*stage, kOrigin, 10));
  s = stage->collect();
  CHECK(limit_stats(s).total.ops == 2);
  CHECK(limit_stats(s).state["granted_ops"] == 2);
}

TEST_CASE("the grant shortcut does not cover a stage that selects on more than the origin") {
  SimClock clock;
  auto stage = drl_stage(&clock, {{"rate", 1e12}});
  // A channel chosen by operation: the shortcut never applies, with or
  // without a grant.
  REQUIRE(stage
              ->apply(json::parse(R"([{"rule": "differentiate", "classifiers": ["operation"]},
                                      {"rule": "create_channel", "channel": "writes",
                                       "match": {"operation": "write"}}])"))
              .is_ok());
  CHECK(fast::enforce(*stage, make_context(Op::kRead, 10)).ok());
  CHECK_FALSE(fast::try_grant(*stage, kOrigin, 10));
  CHECK_FALSE(fast::try_count(*stage, kOrigin, 10));
  CHECK(limit_stats(stage->collect()).total.ops == 1);
}

// Threads enforcing through the shortcut while rules reconfigure, remove and
// create the object again and the board is written: every request is
// counted once, none is lost.
TEST_CASE("grant shortcuts under concurrent reconfiguration count every request once") {
  auto stage = drl_stage(nullptr, {{"rate", 1e12}});
  auto w = BoardWriter::map(stage->board().value()).value();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 20000;
  std::atomic<int> done{0};
  std::atomic<int> fast{0};
  std::atomic<int> not_ok{0};  // Catch2's assertions are for the main thread
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      int mine = 0;
      for (int i = 0; i < kPerThread; ++i) {
        if (fast::try_grant(*stage, kOrigin, 7)) {
          ++mine;
        } else {
          if (!fast::enforce_rest(*stage, make_context(Op::kWrite, 7)).ok()) not_ok.fetch_add(1);
        }
      }
      fast.fetch_add(mine);
      done.fetch_add(1);
    });
  }
  const json configure = json::parse(R"([{"rule": "configure", "channel": "all",
      "object": "limit", "config": {"rate": 1e12}}])");
  const json recreate = json::parse(R"([
      {"rule": "remove_object", "channel": "all", "object": "limit"},
      {"rule": "create_object", "channel": "all", "object": "limit", "type": "drl",
       "config": {"rate": 1e12}}])");
  for (int round = 0; done.load() < kThreads; ++round) {
    REQUIRE(stage->apply(round % 2 == 0 ? configure : recreate).is_ok());
    const ObjectInfo limit = stage->info().channels.at(0).objects.at(0);
    if (limit.board_slot >= 0) {
      (void)w.write(static_cast<std::size_t>(limit.board_slot), limit.board_tag, 0b01,
                    tunables(1e12 + round));
    }
    std::this_thread::yield();
  }
  for (auto& t : threads) t.join();
  CHECK(not_ok.load() == 0);
  const StageStats s = stage->collect();
  CHECK(s.total.ops == kThreads * kPerThread);
  CHECK(s.total.bytes == 7u * kThreads * kPerThread);
  REQUIRE(s.channel("all") != nullptr);
  CHECK(s.channel("all")->total.ops == kThreads * kPerThread);
  CHECK(fast.load() > 0);
}
