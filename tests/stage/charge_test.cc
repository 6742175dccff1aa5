// What a request is charged: a bounded pre-charge that Stage::settle
// completes with what the call moved (context_flag::kBounded), and requests
// that must not wait (context_flag::kNoWait), through the stage to a drl on a
// simulated clock (waiting jumps the clock, so wait times are exact).
#include <catch2/catch.hpp>

#include <cerrno>
#include <cstdint>
#include <string>

#include "sluice/stage.h"

using namespace sluice;
using nlohmann::json;

namespace {

// One default channel with one drl "limit" (its bucket starts full).
std::unique_ptr<Stage> drl_stage(Clock* clock, double rate, double burst) {
  StageOptions o;
  o.clock = clock;
  auto stage = Stage::create(o).value();
  json rules = json::parse(R"([
    {"rule": "differentiate", "classifiers": []},
    {"rule": "create_channel", "channel": "all", "default": true},
    {"rule": "create_object", "channel": "all", "object": "limit", "type": "drl", "default": true}
  ])");
  rules[2]["config"] = {{"rate", rate}, {"burst", burst}};
  REQUIRE(stage->apply(rules).is_ok());
  return stage;
}

double tokens(const Stage& stage) {
  return stage.totals().channels.at(0).objects.at(0).state["tokens"].get<double>();
}

Context with_flags(Op op, std::uint64_t size, std::uint8_t flags) {
  Context ctx = make_context(op, size);
  ctx.flags = flags;
  return ctx;
}

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

}  // namespace

TEST_CASE("a bounded pre-charge is settled with what the call moved") {
  SimClock clock;
  // 1 byte per microsecond, a 2 MB bucket.
  auto stage = drl_stage(&clock, 1e6, 2e6);

  // read(fd, buf, 1 GiB) with 10,000 bytes left: charged kMaxPreCharge, not
  // 1 GiB (which at this rate would wait 18 minutes), then given back all
  // but what it moved.
  const Context huge = with_flags(Op::kRead, 1024 * kMiB, context_flag::kBounded);
  CHECK(stage->enforce(huge).wait_ns == 0);
  CHECK(tokens(*stage) == 2e6 - kMaxPreCharge);
  errno = 4242;
  stage->settle(huge, 10'000);
  CHECK(errno == 4242);
  CHECK(tokens(*stage) == 2e6 - 10'000);

  // A read that moves more than its pre-charge pays the rest after the call,
  // waiting there: 4 MB moved, 1 MiB paid before, 990,000 in the bucket.
  const Context big = with_flags(Op::kRead, 4'000'000, context_flag::kBounded);
  CHECK(stage->enforce(big).wait_ns == 0);
  stage->settle(big, 4'000'000);
  const std::int64_t paid_at = clock.now_ns();
  CHECK(tokens(*stage) == Approx(0).margin(1e-3));

  // A request no larger than the bound is charged whole before the call, as
  // without the flag: 1 MiB waits for its whole cost now.
  const Context normal = with_flags(Op::kRead, kMiB, context_flag::kBounded);
  CHECK(stage->enforce(normal).wait_ns == kMiB * 1000);
  CHECK(clock.now_ns() - paid_at == static_cast<std::int64_t>(kMiB * 1000));

  // Statistics count what the calls moved, and the time waited after a call.
  const StageStats s = stage->collect();
  CHECK(s.total.ops == 3);
  CHECK(s.total.bytes == 10'000 + 4'000'000 + kMiB);
  const ObjectStats& limit = s.channels.at(0).objects.at(0);
  CHECK(limit.wait.total_ns ==
        (4'000'000 - kMaxPreCharge - (2'000'000 - 10'000 - kMaxPreCharge) + kMiB) * 1000);
}

TEST_CASE("a request that must not wait is granted at once, or refused having done nothing") {
  SimClock clock;
  auto stage = drl_stage(&clock, 1e6, 1e6);
  const Context c = with_flags(Op::kRead, 600'000, context_flag::kNoWait);
  const std::int64_t start = clock.now_ns();
  CHECK(stage->enforce(c).outcome == Outcome::kOk);
  // 400,000 left: the next would wait, so it is refused, charged nothing and
  // counted nowhere, through either entry point.
  CHECK(stage->enforce(c).outcome == Outcome::kWouldWait);
  CHECK(stage->enforce(c).outcome == Outcome::kWouldWait);
  CHECK(clock.now_ns() == start);
  CHECK(tokens(*stage) == 400'000);
  // A request that must not wait and moved less than it asked gets the rest
  // back.
  const Context small = with_flags(Op::kRead, 300'000, context_flag::kNoWait);
  CHECK(stage->enforce(small).outcome == Outcome::kOk);
  stage->settle(small, 0);
  CHECK(tokens(*stage) == 400'000);
  const StageStats s = stage->collect();
  CHECK(s.total.ops == 2);
  CHECK(s.total.bytes == 600'000);
  // After the bucket refills, it is granted.
  clock.advance(200'000'000);
  CHECK(stage->enforce(c).outcome == Outcome::kOk);
  CHECK(clock.now_ns() == start + 200'000'000);
}

TEST_CASE("what a request that must not wait moved beyond its charge is taken on credit") {
  SimClock clock;
  auto stage = drl_stage(&clock, 1e6, 1e6);
  const Context c = with_flags(Op::kWrite, 0, context_flag::kNoWait);
  CHECK(stage->enforce(c).outcome == Outcome::kOk);
  stage->settle(c, 3'000'000);  // never waits
  CHECK(tokens(*stage) == -2'000'000);
  // Later requests pay it back: 2 s of debt, then their own 1,000.
  CHECK(stage->enforce(Op::kWrite, 1000).wait_ns == 2'001'000'000);
}

TEST_CASE("routes without an object take any flags at once") {
  SimClock clock;
  auto stage = Stage::create().value();  // no rules: everything unclassified
  const Context c =
      with_flags(Op::kRead, ~std::uint64_t{0}, context_flag::kNoWait | context_flag::kBounded);
  CHECK(stage->enforce(c).outcome == Outcome::kOk);
  stage->settle(c, 5);
  const StageStats s = stage->collect();
  CHECK(s.unclassified.ops == 1);
  CHECK(s.unclassified.bytes == 5);
}

TEST_CASE("an object that cannot tell whether it would wait says it would") {
  struct Opaque final : EnforcementObject {
    std::string_view type() const noexcept override { return "opaque"; }
    Status validate(const json&) const override { return {}; }
    Status configure(const json&) override { return {}; }
    Verdict enforce_context(const Context&) noexcept override { return {}; }
  } opaque;
  const Context c = with_flags(Op::kRead, 1, context_flag::kNoWait);
  CHECK(opaque.try_enforce_context(c).outcome == Outcome::kWouldWait);
  // Its settle charges the excess as a request of that size would be.
  CHECK(opaque.settle(make_context(Op::kRead, 1), 10).outcome == Outcome::kOk);
}
