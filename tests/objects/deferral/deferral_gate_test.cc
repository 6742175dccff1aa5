// The deferral-gate object: its configuration (errors naming the field,
// nothing changed on error), the state machine with each transition's cause,
// the bounded hold of a decision (expiry on an injected clock), the growth
// cap, the binding's end() and recovered(), held time, the log's bound,
// tunables, shutdown, and the object in a stage's rules.
#include <array>
#include <memory>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "sluice/clock.h"
#include "sluice/objects/builtin.h"
#include "sluice/objects/deferral_gate.h"
#include "sluice/stage.h"
#include "test_util.h"

using nlohmann::json;
using sluice::DeferralGate;
using sluice::DeferralObservation;
using sluice::DeferralState;
using sluice::ManualClock;

namespace {

using sluice::testing::kMs;

std::string gate_error_of(const json& config, const json& first = json::object()) {
  ManualClock clock;
  DeferralGate g(&clock);
  REQUIRE(g.configure(first).is_ok());
  REQUIRE(g.partition("7").is_ok());
  const json before = g.collect();
  const sluice::Status s = g.configure(config);
  CHECK(g.collect() == before);  // nothing changed
  CHECK(g.validate(config).message() == s.message());
  return s.message();
}

const json& part(const json& stats, const std::string& key) {
  for (const json& p : stats["partitions"])
    if (p["partition"] == key) return p;
  FAIL("no partition " << key);
  static const json none;
  return none;
}

// The log's transitions as "partition:from>to:cause".
std::vector<std::string> log_of(const json& stats) {
  std::vector<std::string> out;
  for (const json& t : stats["transitions"]) {
    out.push_back(t["partition"].get<std::string>() + ":" + t["from"].get<std::string>() + ">" +
                  t["to"].get<std::string>() + ":" + t["cause"].get<std::string>());
  }
  return out;
}

}  // namespace

TEST_CASE("deferral-gate: bad configurations name the field and change nothing", "[deferral]") {
  CHECK(gate_error_of({{"hold_ms", 0}}) == "hold_ms: must be an integer from 1 to 3600000, got 0");
  CHECK(gate_error_of({{"hold_ms", 1.5}}) ==
        "hold_ms: must be an integer from 1 to 3600000, got 1.5");
  CHECK(gate_error_of({{"growth_cap_bytes", -1}}) ==
        "growth_cap_bytes: must be an integer from 0 to 4611686018427387904, got -1");
  CHECK(gate_error_of({{"log_size", 5000}}) ==
        "log_size: must be an integer from 1 to 4096, got 5000");
  CHECK(gate_error_of({{"partitions", "7"}}) ==
        "partitions: must be an array of partition names, or null, got \"7\"");
  CHECK(gate_error_of({{"partitions", {"7", ""}}}) ==
        "partitions[1]: must be a non-empty string of at most 256 bytes, got \"\"");
  CHECK(gate_error_of({{"decide", {{"7", "stop"}}}}) ==
        "decide.7: must be \"first-stage\", \"second-stage\" or \"resume\", got \"stop\"");
  CHECK(gate_error_of({{"decide", {{"9", "first-stage"}}}}, {{"partitions", {"7"}}}) ==
        "decide.9: this partition may not be deferred (not in partitions)");
  // A batch that names a bad decision applies none of its good ones.
  CHECK(gate_error_of({{"decide", {{"7", "first-stage"}, {"8", "nope"}}}}) ==
        "decide.8: must be \"first-stage\", \"second-stage\" or \"resume\", got \"nope\"");
  CHECK(gate_error_of({{"hold", 5}}) ==
        "hold: unknown field (known: hold_ms, partitions, growth_cap_bytes, log_size, decide)");
}

TEST_CASE("deferral-gate: normal -> first -> second -> recovering -> normal, with causes",
          "[deferral]") {
  ManualClock clock;
  DeferralGate g(&clock);
  auto* p = *g.partition("7");
  CHECK(g.state(*p) == DeferralState::kNormal);

  REQUIRE(g.configure({{"decide", {{"7", "first-stage"}}}}).is_ok());
  CHECK(g.state(*p) == DeferralState::kFirstStage);
  clock.advance(100 * kMs);
  REQUIRE(g.decide("7", DeferralState::kSecondStage).is_ok());
  CHECK(g.state(*p) == DeferralState::kSecondStage);
  clock.advance(300 * kMs);
  REQUIRE(g.configure({{"decide", {{"7", "resume"}}}}).is_ok());
  CHECK(g.state(*p) == DeferralState::kRecovering);
  // Deciding to resume again, or a recovering partition: nothing moves.
  REQUIRE(g.decide("7", DeferralState::kNormal).is_ok());
  g.recovered(*p);
  CHECK(g.state(*p) == DeferralState::kNormal);
  g.recovered(*p);  // not recovering: nothing

  const json s = g.collect();
  CHECK(log_of(s) == std::vector<std::string>{
                         "7:normal>first-stage:decision", "7:first-stage>second-stage:decision",
                         "7:second-stage>recovering:resume", "7:recovering>normal:recovered"});
  const json& st = part(s, "7");
  CHECK(st["state"] == "normal");
  CHECK(st["decision"] == "resume");
  CHECK(st["held_ms"]["first_stage"] == 100.0);
  CHECK(st["held_ms"]["second_stage"] == 300.0);
  CHECK(st["deferrals"] == 1);
  CHECK(s["transitions_total"] == 4);
  CHECK(g.decide("7", DeferralState::kRecovering).code() == sluice::Code::kInvalidArgument);
}

TEST_CASE("deferral-gate: a decision not renewed within hold_ms expires to recovering",
          "[deferral]") {
  ManualClock clock;
  DeferralGate g(&clock);
  REQUIRE(g.configure({{"hold_ms", 1000}}).is_ok());
  auto* p = *g.partition("orders");
  REQUIRE(g.decide("orders", DeferralState::kFirstStage).is_ok());
  clock.advance(900 * kMs);
  REQUIRE(g.decide("orders", DeferralState::kFirstStage).is_ok());  // renewed
  clock.advance(900 * kMs);
  CHECK(g.state(*p) == DeferralState::kFirstStage);
  CHECK(part(g.collect(), "orders")["decision_left_ms"] == 100.0);
  clock.advance(100 * kMs);
  // The reader sees the expiry at once, before anything records it.
  CHECK(g.state(*p) == DeferralState::kRecovering);
  const json s = g.collect();
  CHECK(part(s, "orders")["state"] == "recovering");
  CHECK(part(s, "orders")["decision"] == "none");
  CHECK(part(s, "orders")["held_ms"]["first_stage"] == 1900.0);
  CHECK(log_of(s).back() == "orders:first-stage>recovering:expired");
  // A binding that saw the expiry and restored reports it recovered before
  // anything recorded the expiry: both transitions are recorded, in order.
  auto* q = *g.partition("q");
  REQUIRE(g.decide("q", DeferralState::kSecondStage).is_ok());
  clock.advance(1000 * kMs);
  CHECK(g.state(*q) == DeferralState::kRecovering);
  g.recovered(*q);
  CHECK(g.state(*q) == DeferralState::kNormal);
  const auto tail = log_of(g.collect());
  CHECK(std::vector<std::string>(tail.end() - 2, tail.end()) ==
        std::vector<std::string>{"q:second-stage>recovering:expired",
                                 "q:recovering>normal:recovered"});
  // Default hold without configuration.
  DeferralGate d(&clock);
  CHECK(d.collect()["hold_ms"] == sluice::kDeferralDefaultHoldMs);
}

TEST_CASE("deferral-gate: the growth cap refuses or ends deferral", "[deferral]") {
  ManualClock clock;
  DeferralGate g(&clock);
  REQUIRE(g.configure({{"growth_cap_bytes", 1000}}).is_ok());
  auto* a = *g.partition("1");
  auto* b = *g.partition("2");
  REQUIRE(g.decide("1", DeferralState::kFirstStage).is_ok());
  REQUIRE(g.decide("2", DeferralState::kFirstStage).is_ok());
  DeferralObservation o;
  o.growth_bytes = 600;
  CHECK(g.observe(*a, o) == DeferralState::kFirstStage);
  o.growth_bytes = 500;  // together 1100 > 1000: the reporter ends
  CHECK(g.observe(*b, o) == DeferralState::kRecovering);
  CHECK(log_of(g.collect()).back() == "2:first-stage>recovering:growth cap");
  // Ended: refuses deferral until normal again, and counts the refusals.
  REQUIRE(g.decide("2", DeferralState::kFirstStage).is_ok());
  CHECK(g.state(*b) == DeferralState::kRecovering);
  g.recovered(*b);
  CHECK(g.state(*b) == DeferralState::kNormal);
  // Normal again, but a's growth (600) + nothing < cap: admitted.
  REQUIRE(g.decide("2", DeferralState::kFirstStage).is_ok());
  CHECK(g.state(*b) == DeferralState::kFirstStage);
  // At the cap, a normal partition is refused; a deferred one renews.
  auto* c = *g.partition("3");
  o.growth_bytes = 400;
  CHECK(g.observe(*b, o) == DeferralState::kFirstStage);
  REQUIRE(g.decide("3", DeferralState::kFirstStage).is_ok());
  CHECK(g.state(*c) == DeferralState::kNormal);
  REQUIRE(g.decide("1", DeferralState::kSecondStage).is_ok());
  CHECK(g.state(*a) == DeferralState::kSecondStage);
  const json s = g.collect();
  CHECK(part(s, "2")["refused"] == 1);
  CHECK(part(s, "2")["ended"] == 1);
  CHECK(part(s, "3")["refused"] == 1);
  CHECK(s["growth_bytes"] == 1000);
  // A cap of 0 refuses every deferral.
  DeferralGate z(&clock);
  REQUIRE(z.configure({{"growth_cap_bytes", 0}, {"decide", {{"1", "first-stage"}}}}).is_ok());
  CHECK(z.state(**z.partition("1")) == DeferralState::kNormal);
}

TEST_CASE("deferral-gate: one batch lists and decides 20,000 partitions", "[deferral]") {
  // Each decision finds its partition and checks the growth cap in O(log N), not by
  // scanning every partition: a batch stays well under a second under the gate's lock.
  ManualClock clock;
  DeferralGate g(&clock);
  constexpr int kN = 20000;
  json names = json::array();
  json decide = json::object();
  for (int i = 0; i < kN; ++i) {
    names.push_back("p" + std::to_string(i));
    decide["p" + std::to_string(i)] = i % 2 == 0 ? "first-stage" : "second-stage";
  }
  REQUIRE(g.configure({{"partitions", names}, {"growth_cap_bytes", 1ull << 40}, {"decide", decide}})
              .is_ok());
  CHECK(g.state(**g.partition("p0")) == DeferralState::kFirstStage);
  CHECK(g.state(**g.partition("p19999")) == DeferralState::kSecondStage);
  const json s = g.collect();
  CHECK(s["partitions"].size() == kN);
  CHECK(s["deferred"] == kN);
  // The running sum of growth follows observations and returns to normal.
  DeferralObservation o;
  o.growth_bytes = 7;
  CHECK(g.observe(**g.partition("p5"), o) == DeferralState::kSecondStage);
  CHECK(g.collect()["growth_bytes"] == 7);
  REQUIRE(g.decide("p5", DeferralState::kNormal).is_ok());
  g.recovered(**g.partition("p5"));
  CHECK(g.collect()["growth_bytes"] == 0);
}

TEST_CASE("deferral-gate: the binding ends a deferral; shutdown reads as recovering",
          "[deferral]") {
  ManualClock clock;
  DeferralGate g(&clock);
  auto* p = *g.partition("7");
  auto* q = *g.partition("8");
  g.end(*p, "L0 cap");  // not deferred: nothing
  REQUIRE(g.decide("7", DeferralState::kSecondStage).is_ok());
  g.end(*p, "L0 cap");
  CHECK(g.state(*p) == DeferralState::kRecovering);
  CHECK(log_of(g.collect()).back() == "7:second-stage>recovering:L0 cap");

  REQUIRE(g.decide("8", DeferralState::kFirstStage).is_ok());
  g.shutdown();
  CHECK(g.is_shut_down());
  CHECK(g.state(*q) == DeferralState::kRecovering);
  CHECK(log_of(g.collect()).back() == "8:first-stage>recovering:shutdown");
  REQUIRE(g.decide("8", DeferralState::kFirstStage).is_ok());  // ignored
  CHECK(g.state(*q) == DeferralState::kRecovering);
  g.recovered(*q);
  CHECK(g.state(*q) == DeferralState::kRecovering);
}

TEST_CASE("deferral-gate: the log keeps log_size transitions; tunables", "[deferral]") {
  ManualClock clock;
  DeferralGate g(&clock);
  REQUIRE(g.configure({{"log_size", 3}}).is_ok());
  auto* p = *g.partition("7");
  for (int i = 0; i < 3; ++i) {
    REQUIRE(g.decide("7", DeferralState::kFirstStage).is_ok());
    REQUIRE(g.decide("7", DeferralState::kNormal).is_ok());
    g.recovered(*p);
  }
  const json s = g.collect();
  CHECK(s["transitions"].size() == 3);
  CHECK(s["transitions_total"] == 9);
  CHECK(s["transitions"][0]["seq"] == 7);

  std::array<double, sluice::kMaxTunables> v{};
  v[0] = 250;
  v[1] = 4096;
  REQUIRE(g.set_tunables(3, v).is_ok());
  CHECK(g.collect()["hold_ms"] == 250);
  CHECK(g.collect()["growth_cap_bytes"] == 4096);
  v[0] = 0;
  CHECK(g.set_tunables(1, v).message() ==
        "hold_ms: must be an integer from 1 to 3600000, got 0.000000");
  CHECK(g.set_tunables(4, v).code() == sluice::Code::kInvalidArgument);
  CHECK(g.collect()["hold_ms"] == 250);
}

TEST_CASE("deferral-gate: created and decided by rules, found by a binding in its stage",
          "[deferral]") {
  sluice::objects::register_builtin();
  ManualClock clock;
  sluice::StageOptions opts;
  opts.name = "db";
  opts.clock = &clock;
  auto stage = sluice::Stage::create(opts);
  REQUIRE(stage.is_ok());
  REQUIRE((*stage)
              ->apply(json::parse(R"([
    {"rule": "create_channel", "channel": "bg", "default": true},
    {"rule": "create_object", "channel": "bg", "object": "deferral", "type": "deferral-gate",
     "config": {"hold_ms": 200, "partitions": ["1", "2"]}}])"))
              .is_ok());
  auto o = std::dynamic_pointer_cast<DeferralGate>((*stage)->object("bg", "deferral"));
  REQUIRE(o);
  auto* p = *o->partition("1");
  REQUIRE((*stage)
              ->apply(json::parse(R"([{"rule": "configure", "channel": "bg",
                  "object": "deferral", "config": {"decide": {"1": "first-stage"}}}])"))
              .is_ok());
  CHECK(o->state(*p) == DeferralState::kFirstStage);
  const auto bad = (*stage)->apply(json::parse(R"([{"rule": "configure", "channel": "bg",
      "object": "deferral", "config": {"decide": {"3": "first-stage"}}}])"));
  CHECK_THAT(bad.message(), Catch::Matchers::Contains("decide.3: this partition may not be"));
  // Removing the object shuts it down: the binding that holds it sees recovering.
  REQUIRE((*stage)
              ->apply(json::parse(
                  R"([{"rule": "remove_object", "channel": "bg", "object": "deferral"}])"))
              .is_ok());
  CHECK(o->state(*p) == DeferralState::kRecovering);
}
