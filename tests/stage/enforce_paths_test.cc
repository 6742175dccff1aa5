// The two enforce entries (the installed Stage::enforce, the bindings' inline
// fast::enforce) and the two paths behind them (the inline common case, the out-of-line rest)
// must route, call objects and count identically, and keep the contract that
// lets an interposer call them between an application's call and its return.
#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "sluice/objects/builtin.h"
#include "sluice/stage.h"
#include "sluice/stage_fast.h"

using namespace sluice;
using nlohmann::json;

namespace {

// Counts its calls; optionally declares that it passes everything through,
// clobbers errno, and records whether it ran inside an InternalIoScope.
class Counter final : public EnforcementObject {
 public:
  explicit Counter(bool passes) : passes_(passes) {}
  std::string_view type() const noexcept override { return passes_ ? "quiet" : "counter"; }
  Status validate(const json&) const override { return {}; }
  Status configure(const json&) override { return {}; }
  Verdict enforce_context(const Context&) noexcept override {
    calls.fetch_add(1);
    saw_internal.store(internal_io_active());
    errno = EIO;  // an object may leave errno changed; the stage must not
    return {Outcome::kOk, 5};
  }
  bool passes_through() const noexcept override { return passes_; }

  static inline std::atomic<int> calls{0};
  static inline std::atomic<bool> saw_internal{false};

 private:
  bool passes_;
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    (void)objects::register_builtin(*reg);
    (void)reg->add({"counter", "counts its calls",
                    [](const ObjectEnv&) { return std::make_unique<Counter>(false); }});
    (void)reg->add({"quiet", "counts its calls, declares it passes everything through",
                    [](const ObjectEnv&) { return std::make_unique<Counter>(true); }});
    return reg;
  }();
  return *r;
}

// Three channels by operation: one with an object the stage must call, one
// with a Noop, one with none; anything else is unclassified.
std::unique_ptr<Stage> make_stage(Clock* clock) {
  StageOptions o;
  o.clock = clock;
  o.registry = &registry();
  auto stage = Stage::create(o).value();
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "differentiate", "classifiers": ["operation"]},
    {"rule": "create_channel", "channel": "reads", "match": {"operation": "read"}},
    {"rule": "create_object", "channel": "reads", "object": "c", "type": "counter"},
    {"rule": "create_channel", "channel": "writes", "match": {"operation": "write"}},
    {"rule": "create_object", "channel": "writes", "object": "n", "type": "noop"},
    {"rule": "create_channel", "channel": "syncs", "match": {"operation": "sync"}}
  ])"))
              .is_ok());
  return stage;
}

json counts_of(Stage& stage) {
  json j;
  to_json(j, stage.collect());
  j.erase("stage");
  j.erase("interval_ns");
  j.erase("collected_at_ns");
  return j;
}

}  // namespace

TEST_CASE("Stage::enforce and the inline fast::enforce count identically on both paths") {
  SimClock clock;
  auto a = make_stage(&clock);
  auto b = make_stage(&clock);
  const Op ops[] = {Op::kRead, Op::kWrite, Op::kSync, Op::kOpen};
  std::mt19937 rng(7);
  Counter::calls = 0;
  int expected_calls = 0;
  std::uint64_t bytes = 0;
  for (int i = 0; i < 5000; ++i) {
    // Runs of one operation hit the memo; each change of operation misses it.
    const Op op = ops[(i / static_cast<int>(1 + rng() % 4)) % 4];
    const std::uint64_t size = rng() % 70000;
    OriginScope scope(static_cast<OriginId>(rng() % 40));  // counted apart or in the last slot
    const Context ctx = make_context(op, size);
    const Verdict r = a->enforce(ctx);
    const Verdict v = fast::enforce(*b, ctx);
    CHECK(r.outcome == v.outcome);
    CHECK(r.wait_ns == v.wait_ns);
    CHECK(v.wait_ns == (op == Op::kRead ? 5u : 0u));
    expected_calls += op == Op::kRead ? 2 : 0;
    bytes += size;
  }
  CHECK(Counter::calls.load() == expected_calls);
  const json ja = counts_of(*a);
  CHECK(ja == counts_of(*b));
  CHECK(ja["ops"] == 5000);
  CHECK(ja["bytes"] == bytes);
}

TEST_CASE("an object that passes everything through is counted, never called") {
  StageOptions o;
  o.registry = &registry();
  auto stage = Stage::create(o).value();
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "create_channel", "channel": "all", "default": true},
    {"rule": "create_object", "channel": "all", "object": "q", "type": "quiet"}
  ])"))
              .is_ok());
  Counter::calls = 0;
  for (int i = 0; i < 100; ++i) {
    CHECK(fast::enforce(*stage, make_context(Op::kWrite, 10)).ok());
    CHECK(stage->enforce(Op::kWrite, 10).ok());
  }
  CHECK(Counter::calls.load() == 0);
  const StageStats s = stage->collect();
  CHECK(s.channel("all")->objects.at(0).total.ops == 200);
  CHECK(s.channel("all")->objects.at(0).total.bytes == 2000);
}

TEST_CASE("enforce leaves errno alone and runs objects as internal I/O") {
  SimClock clock;
  auto stage = make_stage(&clock);
  for (int i = 0; i < 3; ++i) {  // the first call refreshes the snapshot; later ones do not
    for (Op op : {Op::kRead, Op::kWrite, Op::kSync, Op::kOpen}) {
      errno = EDOM;
      Counter::saw_internal = false;
      (void)fast::enforce(*stage, make_context(op, 4096));
      CHECK(errno == EDOM);
      errno = ERANGE;
      (void)stage->enforce(make_context(op, 4096));
      CHECK(errno == ERANGE);
      CHECK(Counter::saw_internal.load() == (op == Op::kRead));
      CHECK_FALSE(internal_io_active());
    }
  }
}

// A stage that selects on nothing (no rules, or a default channel whose object
// passes everything through) lets each thread count through an inline
// shortcut (fast::try_count). It must count exactly what the full
// path would, stop applying the moment the rules change, follow a thread from
// stage to stage, and leave settle() able to correct what it counted.
TEST_CASE("the inline shortcut counts exactly and lapses when the rules change") {
  StageOptions o;
  o.registry = &registry();
  auto bare = Stage::create(o).value();  // no rules: everything is unclassified
  auto quiet = Stage::create(o).value();
  REQUIRE(quiet
              ->apply(json::parse(R"([
    {"rule": "create_channel", "channel": "all", "default": true},
    {"rule": "create_object", "channel": "all", "object": "q", "type": "quiet"}
  ])"))
              .is_ok());
  const OriginId origins[] = {origin::kUnknown, origin::kFlush, 30, 31, 500};

  // Before any enforce on this thread the shortcut is not armed for either.
  CHECK_FALSE(fast::try_count(*bare, origin::kUnknown, 1));
  CHECK_FALSE(fast::try_count(*quiet, origin::kUnknown, 1));

  std::uint64_t bare_ops = 0, bare_bytes = 0, quiet_ops = 0, quiet_bytes = 0;
  std::map<std::string, Counters> quiet_by_origin;
  for (int i = 0; i < 300; ++i) {
    const OriginId og = origins[i % 5];
    const std::uint64_t size = 1000u + static_cast<std::uint64_t>(i);
    OriginScope scope(og);
    // Alternating stages every 10 requests refreshes this thread's cache each
    // time; within a run the shortcut applies after the first request.
    Stage& s = (i / 10) % 2 == 0 ? *bare : *quiet;
    if (i % 10 == 0) CHECK_FALSE(fast::try_count(s, og, size));
    CHECK(fast::enforce(s, make_context(Op::kRead, size)).ok());
    if (i % 10 != 9) {
      CHECK(fast::try_count(s, og, size));  // armed now: counts a second request
    }
    const std::uint64_t n = i % 10 != 9 ? 2 : 1;
    if (&s == bare.get()) {
      bare_ops += n;
      bare_bytes += n * size;
    } else {
      quiet_ops += n;
      quiet_bytes += n * size;
      // Origins from 31 on share the last slot, reported as "more".
      Counters& c = quiet_by_origin[og < 31 ? std::string(origin_name(og)) : "more"];
      c.ops += n;
      c.bytes += n * size;
    }
  }
  // The shortcut covers only the origin it was armed with (the last request's,
  // 500): another origin is refused with nothing counted, until the full path
  // re-arms it for that one.
  CHECK_FALSE(fast::try_count(*quiet, origin::kUnknown, 100));
  CHECK(fast::try_count(*quiet, 500, 3));
  CHECK(fast::enforce(*quiet, make_context(Op::kRead, 5)).ok());  // origin::kUnknown
  CHECK_FALSE(fast::try_count(*quiet, 500, 100));
  quiet_ops += 2;
  quiet_bytes += 3 + 5;
  quiet_by_origin["more"].ops += 1;
  quiet_by_origin["more"].bytes += 3;
  quiet_by_origin[std::string(origin_name(origin::kUnknown))].ops += 1;
  quiet_by_origin[std::string(origin_name(origin::kUnknown))].bytes += 5;
  // settle() corrects a request the shortcut counted.
  REQUIRE(fast::try_count(*quiet, origin::kUnknown, 100));
  quiet->settle(make_context(Op::kRead, 100), 40);
  quiet_ops += 1;
  quiet_bytes += 40;
  quiet_by_origin[std::string(origin_name(origin::kUnknown))].ops += 1;
  quiet_by_origin[std::string(origin_name(origin::kUnknown))].bytes += 40;

  const StageStats b = bare->collect();
  CHECK(b.unclassified.ops == bare_ops);
  CHECK(b.unclassified.bytes == bare_bytes);
  CHECK(b.total.ops == bare_ops);
  const StageStats q = quiet->collect();
  REQUIRE(q.channel("all") != nullptr);
  const ObjectStats& qo = q.channel("all")->objects.at(0);
  CHECK(qo.total.ops == quiet_ops);
  CHECK(qo.total.bytes == quiet_bytes);
  for (const auto& [name, c] : quiet_by_origin) {
    INFO(name);
    REQUIRE(qo.by_origin.count(name) == 1);
    CHECK(qo.by_origin.at(name).ops == c.ops);
    CHECK(qo.by_origin.at(name).bytes == c.bytes);
  }

  // A layout change publishes a new snapshot: the shortcut lapses at once and
  // counts nothing; a stage that now selects on a classifier never re-arms it.
  REQUIRE(fast::try_count(*quiet, origin::kUnknown, 1));
  REQUIRE(quiet
              ->apply(json::parse(R"([
    {"rule": "differentiate", "classifiers": ["operation"]},
    {"rule": "create_channel", "channel": "reads", "match": {"operation": "read"}}
  ])"))
              .is_ok());
  CHECK_FALSE(fast::try_count(*quiet, origin::kUnknown, 1));
  CHECK(fast::enforce(*quiet, make_context(Op::kRead, 7)).ok());
  CHECK_FALSE(fast::try_count(*quiet, origin::kUnknown, 1));
  const StageStats q2 = quiet->collect();
  CHECK(q2.total.ops == 2);  // the armed one before the change, and the full-path one
  REQUIRE(q2.channel("reads") != nullptr);
  CHECK(q2.channel("reads")->total.ops == 1);
  CHECK(q2.channel("reads")->total.bytes == 7);
}

// A stage that chooses channels and objects by origin alone routes every
// request of one origin to one place: the shortcut covers an origin whose
// place passes everything through, one origin at a time, and never one whose
// object must be called.
TEST_CASE("the inline shortcut covers a stage that selects by origin alone") {
  StageOptions o;
  o.registry = &registry();
  auto stage = Stage::create(o).value();
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "differentiate", "classifiers": ["origin"]},
    {"rule": "create_channel", "channel": "fg", "match": {"origin": "foreground"}},
    {"rule": "create_object", "channel": "fg", "object": "n", "type": "noop"},
    {"rule": "create_channel", "channel": "bg",
     "match": {"origin": ["flush", "compaction_L0_L1"]}},
    {"rule": "differentiate", "channel": "bg", "classifiers": ["origin"]},
    {"rule": "create_object", "channel": "bg", "object": "q", "type": "quiet",
     "match": {"origin": "flush"}},
    {"rule": "create_object", "channel": "bg", "object": "c", "type": "counter",
     "match": {"origin": "compaction_L0_L1"}}
  ])"))
              .is_ok());
  Counter::calls = 0;
  auto run = [&](OriginId og, Op op, std::uint64_t size) {
    OriginScope scope(og);
    return fast::enforce(*stage, make_context(op, size)).ok();
  };
  // The first request of an origin arms the shortcut for it; the operation
  // and size then decide nothing.
  CHECK_FALSE(fast::try_count(*stage, origin::kForeground, 1));
  CHECK(run(origin::kForeground, Op::kRead, 10));
  CHECK(fast::try_count(*stage, origin::kForeground, 20));
  // Another origin is refused until its own first request re-arms it.
  CHECK_FALSE(fast::try_count(*stage, origin::kFlush, 1));
  CHECK(run(origin::kFlush, Op::kWrite, 30));
  CHECK(fast::try_count(*stage, origin::kFlush, 40));
  CHECK_FALSE(fast::try_count(*stage, origin::kForeground, 1));
  // An origin whose object must be called never arms it, and leaves the last
  // armed origin's shortcut standing.
  CHECK(run(origin::kCompactionL0L1, Op::kWrite, 50));
  CHECK(run(origin::kCompactionL0L1, Op::kWrite, 60));
  CHECK_FALSE(fast::try_count(*stage, origin::kCompactionL0L1, 1));
  CHECK(Counter::calls == 2);
  CHECK(fast::try_count(*stage, origin::kFlush, 70));
  // An origin no channel matches goes to the unclassified place: armed as well.
  CHECK(run(origin::kWal, Op::kWrite, 80));
  CHECK(fast::try_count(*stage, origin::kWal, 90));

  const StageStats st = stage->collect();
  REQUIRE(st.channel("fg") != nullptr);
  CHECK(st.channel("fg")->total.ops == 2);
  CHECK(st.channel("fg")->total.bytes == 30);
  REQUIRE(st.channel("bg") != nullptr);
  std::map<std::string, Counters> by_object;
  for (const ObjectStats& ob : st.channel("bg")->objects) {
    by_object[ob.name] = ob.total;
  }
  CHECK(by_object["q"].ops == 3);
  CHECK(by_object["q"].bytes == 30 + 40 + 70);
  CHECK(by_object["c"].ops == 2);
  CHECK(by_object["c"].bytes == 110);
  CHECK(st.unclassified.ops == 2);
  CHECK(st.unclassified.bytes == 170);
}

TEST_CASE("the inline shortcut is per thread and lapses when a thread gives up its shard") {
  auto stage = Stage::create().value();
  constexpr int kThreads = 40;  // more than the exclusive shards: some threads share
  constexpr int kPerThread = 2000;
  std::vector<std::thread> threads;
  std::atomic<int> fast{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        if (fast::try_count(*stage, origin::kUnknown, 3)) {
          fast.fetch_add(1);
        } else {
          (void)fast::enforce(*stage, make_context(Op::kWrite, 3));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  // This thread never enforced on the stage: another thread's shortcut is not its.
  CHECK_FALSE(fast::try_count(*stage, origin::kUnknown, 3));
  const StageStats s = stage->collect();
  CHECK(s.unclassified.ops == kThreads * kPerThread);
  CHECK(s.unclassified.bytes == 3u * kThreads * kPerThread);
  CHECK(fast.load() > 0);
}
