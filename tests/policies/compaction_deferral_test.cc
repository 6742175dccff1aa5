// The compaction-deferral policy: its configuration's errors, the node's
// bandwidth use from the stages' statistics, and a table of steps for every
// transition: normal -> first stage at the high watermark (after high_steps),
// first -> second stage at the L0 fraction, second stays, resume below the
// low watermark (after low_steps), no change between the watermarks
// (hysteresis), the choice of partitions by demand, resume of a partition
// deferred by an earlier policy, and the rules and report it sends.
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "compaction_deferral.h"
#include "sluice/policy.h"
#include "test_util.h"

using nlohmann::json;
using namespace sluice;

namespace {

using sluice::testing::kSecond;

// A gate partition as the object's collect() reports it.
struct Gp {
  std::string key;
  std::string state = "normal";
  int l0 = 0;
  int trigger = 20;
  double pending = 0;
};

// A stage "db<i>" that moved `bytes` in one second in channel "node", with a
// deferral-gate in channel "bg" reporting `parts`.
StageView stage(const std::string& name, std::uint64_t bytes, const std::vector<Gp>& parts) {
  StageView st;
  st.name = name;
  st.stats.stage = name;
  st.stats.interval_ns = kSecond;
  ChannelStats node;
  node.name = "node";
  node.total = Counters{10, bytes};
  ChannelStats bg;
  bg.name = "bg";
  bg.total = Counters{5, 1000};  // not the node channel's
  json ps = json::array();
  for (const Gp& p : parts) {
    ps.push_back({{"partition", p.key},
                  {"state", p.state},
                  {"l0_files", p.l0},
                  {"l0_slowdown_trigger", p.trigger},
                  {"pending_compaction_bytes", p.pending},
                  {"held_ms", {{"first_stage", 0}, {"second_stage", 0}}}});
  }
  ObjectStats o;
  o.name = "deferral";
  o.type = "deferral-gate";
  o.state = {{"hold_ms", 5000}, {"partitions", ps}};
  bg.objects.push_back(o);
  st.stats.channels = {node, bg};
  st.stats.total = Counters{15, bytes + 1000};
  return st;
}

PolicyInput input(std::vector<StageView> stages, std::int64_t step = 1) {
  PolicyInput in;
  in.now_ns = step * kSecond;
  in.interval_ns = kSecond;
  in.stages = std::move(stages);
  return in;
}

json base_config() {
  return {{"bandwidth", 1000}, {"measure_channels", {"node"}}, {"low_steps", 2}};
}

// The decisions sent to `stage` (partition -> decision), {} when none.
json sent(const PolicyOutput& out, const std::string& stage) {
  auto it = out.rules.find(stage);
  if (it == out.rules.end()) return json::object();
  const json& rules = it->second.value().at("rules");
  REQUIRE(rules.size() == 1);
  CHECK(rules[0]["rule"] == "configure");
  CHECK(rules[0]["channel"] == "bg");
  CHECK(rules[0]["object"] == "deferral");
  return rules[0]["config"]["decide"];
}

}  // namespace

TEST_CASE("compaction-deferral: configuration errors name the field", "[deferral]") {
  auto err = [](const json& c) { return make_policy("compaction-deferral", c).status().message(); };
  CHECK(err(json::object()) == "policy 'compaction-deferral': bandwidth: required");
  CHECK(err({{"bandwidth", 0}}) == "policy 'compaction-deferral': bandwidth: must be > 0, got 0");
  CHECK(err({{"bandwidth", 1}, {"high_watermark", 0.5}}) ==
        "policy 'compaction-deferral': low_watermark: must be below high_watermark (0.5), got 0.6");
  CHECK(err({{"bandwidth", 1}, {"l0_fraction", 1.5}}) ==
        "policy 'compaction-deferral': l0_fraction: must be > 0 and <= 1, got 1.5");
  CHECK(err({{"bandwidth", 1}, {"low_steps", 1.5}}) ==
        "policy 'compaction-deferral': low_steps: must be an integer, got 1.5");
  CHECK(err({{"bandwidth", 1}, {"measure_channels", {""}}}) ==
        "policy 'compaction-deferral': measure_channels[0]: must be a non-empty string, got \"\"");
  CHECK(err({{"bandwidth", 1}, {"watermark", 1}}) ==
        "policy 'compaction-deferral': watermark: unknown field");
  auto ok = make_policy("compaction-deferral", base_config());
  REQUIRE(ok.is_ok());
  CHECK((*ok)->describe()["high_watermark"] == 0.8);
  CHECK((*ok)->describe()["l0_fraction"] == 0.6);
}

TEST_CASE("compaction-deferral: use is the measured channels' bytes per second over bandwidth",
          "[deferral]") {
  CompactionDeferral d(*parse_compaction_deferral_config(base_config()));
  PolicyInput in = input({stage("db1", 300, {}), stage("db2", 200, {})});
  in.stages[1].stats.interval_ns = kSecond / 2;  // 200 B in half a second
  CHECK(d.measure(in) == Approx(700));
  auto all = base_config();
  all.erase("measure_channels");
  CompactionDeferral e(*parse_compaction_deferral_config(all));
  CHECK(e.measure(input({stage("db1", 300, {})})) == Approx(1300));  // every channel
  auto labelled = base_config();
  labelled["labels"] = {{"node", "a"}};
  CompactionDeferral f(*parse_compaction_deferral_config(labelled));
  in.stages[0].labels["node"] = "a";
  CHECK(f.measure(in) == Approx(300));
}

TEST_CASE("compaction-deferral: a table of steps through every transition", "[deferral]") {
  auto cfg = base_config();
  cfg["high_steps"] = 2;
  auto p = make_policy("compaction-deferral", cfg);
  REQUIRE(p.is_ok());
  Policy& pol = **p;

  // Each row: the node's use (bytes of 1000/s), partition a's gate state and
  // L0 files (trigger 20: second stage at 12), what is sent to a, the
  // policy's short-of-bandwidth state after the step.
  struct Row {
    std::uint64_t bytes;
    std::string gate_state;
    int l0;
    json want;  // decision for "a", or null for nothing sent
    bool is_short;
    const char* why;
  };
  const std::vector<Row> rows = {
      {500, "normal", 2, nullptr, false, "below high: nothing"},
      {850, "normal", 2, nullptr, false, "at high for 1 step of 2: not yet"},
      {700, "normal", 2, nullptr, false, "between the watermarks resets the count"},
      {850, "normal", 2, nullptr, false, "at high, 1 step"},
      {900, "normal", 3, "first-stage", true, "at high for 2 steps: first stage"},
      {990, "first-stage", 11, "first-stage", true, "renewed; L0 below 0.6 x 20"},
      {990, "first-stage", 12, "second-stage", true, "L0 at 0.6 x 20: second stage"},
      {990, "second-stage", 5, "second-stage", true, "second stays though L0 fell"},
      {700, "second-stage", 5, "second-stage", true, "between the watermarks: held"},
      {500, "second-stage", 5, "second-stage", true, "below low, 1 step of 2: held"},
      {700, "second-stage", 5, "second-stage", true, "between again resets the count"},
      {500, "second-stage", 5, "second-stage", true, "below low, 1 step"},
      {500, "second-stage", 5, "resume", false, "below low for 2 steps: resume"},
      {500, "recovering", 5, nullptr, false, "recovering: nothing more to send"},
      {500, "normal", 1, nullptr, false, "normal: nothing"},
      {900, "normal", 1, nullptr, false, "high again, 1 step"},
      {900, "normal", 14, "second-stage", true, "a new episode with L0 already high"},
  };
  int step = 0;
  for (const Row& r : rows) {
    ++step;
    INFO("step " << step << ": " << r.why);
    const PolicyOutput out =
        pol.step(input({stage("db1", r.bytes, {{"a", r.gate_state, r.l0, 20, 0}})}, step));
    const json d = sent(out, "db1");
    if (r.want.is_null()) {
      CHECK(d == json::object());
    } else {
      CHECK(d == json{{"a", r.want}});
    }
    CHECK(out.report["short"] == r.is_short);
    CHECK(out.report["use"] == Approx(r.bytes / 1000.0));
  }
}

TEST_CASE("compaction-deferral: second_stage false keeps the first stage", "[deferral]") {
  auto cfg = base_config();
  cfg["second_stage"] = false;
  CompactionDeferral d(*parse_compaction_deferral_config(cfg));
  auto s = d.step(input({stage("db1", 900, {{"a", "first-stage", 19, 20, 0}})}));
  CHECK(s.rules.at("db1")[0]["config"]["decide"] == json{{"a", "first-stage"}});
  CHECK(compaction_deferral_config_to_json(d.config())["second_stage"] == false);
  CHECK(parse_compaction_deferral_config({{"bandwidth", 1}, {"second_stage", 1}})
            .status()
            .message() == "second_stage: must be true or false, got 1");
}

TEST_CASE("compaction-deferral: partitions chosen by demand, across stages", "[deferral]") {
  auto cfg = base_config();
  cfg["max_partitions"] = 2;
  cfg["hold_ms"] = 3000;
  CompactionDeferral d(*parse_compaction_deferral_config(cfg));
  auto stages = [](const std::string& y_state, std::uint64_t bytes = 500) {
    return std::vector<StageView>{
        stage("db1", bytes, {{"x", "normal", 0, 20, 10}, {"y", y_state, 0, 20, 500}}),
        stage("db2", bytes, {{"z", "normal", 0, 20, 300}, {"zz", "normal", 0, 20, 300}})};
  };
  auto s = d.step(input(stages("normal")));
  CHECK(s.report["short"] == true);
  CHECK(s.report["chosen"] == 2);
  // y (500) and then z before zz (300 each, by name).
  REQUIRE(s.rules.at("db1").size() == 1);
  CHECK(s.rules.at("db1")[0]["config"] ==
        json{{"decide", {{"y", "first-stage"}}}, {"hold_ms", 3000}});
  CHECK(s.rules.at("db2")[0]["config"]["decide"] == json{{"z", "first-stage"}});
  CHECK(s.report["last_change"]["to"] == "short");
  // A partition's demand growing later does not change the choice.
  s = d.step(input(stages("first-stage")));
  CHECK(s.rules.at("db2")[0]["config"]["decide"] == json{{"z", "first-stage"}});
  // A stage that connects mid-episode: its partitions are chosen while there
  // is room (none here: the two chosen stay).
  auto more = stages("first-stage");
  more.push_back(stage("db3", 0, {{"v", "normal", 0, 20, 1e9}}));
  s = d.step(input(more));
  CHECK(s.rules.count("db3") == 0);
  CHECK(s.report["chosen"] == 2);
  // The node recovers: resume what the gates report deferred.
  d.step(input({stage("db1", 100, {}), stage("db2", 100, {})}));
  s = d.step(input(stages("first-stage", 250)));
  CHECK(s.report["short"] == false);
  CHECK(s.report["last_change"]["to"] == "sufficient");
  CHECK(s.rules.at("db1")[0]["config"]["decide"] == json{{"y", "resume"}});
  CHECK(s.rules.count("db2") == 0);
}

TEST_CASE("compaction-deferral: a partition deferred without a live episode is resumed",
          "[deferral]") {
  // A policy that restarted while a gate still holds an earlier decision.
  CompactionDeferral d(*parse_compaction_deferral_config(base_config()));
  auto s = d.step(input({stage("db1", 700, {{"a", "second-stage", 3, 20, 0}})}));
  CHECK(s.report["short"] == false);
  CHECK(s.rules.at("db1")[0]["config"]["decide"] == json{{"a", "resume"}});
  // With every partition to be deferred (max_partitions 0), one reported
  // later in the episode is deferred too.
  CompactionDeferral all(*parse_compaction_deferral_config(base_config()));
  s = all.step(input({stage("db1", 900, {})}));
  CHECK(s.report["short"] == true);
  CHECK(s.rules.empty());
  s = all.step(input({stage("db1", 900, {{"late", "normal", 0, 20, 0}})}));
  CHECK(s.rules.at("db1")[0]["config"]["decide"] == json{{"late", "first-stage"}});
  // Another object of the same name but not a gate is not read.
  auto st = stage("db2", 700, {{"b", "first-stage"}});
  st.stats.channels[1].objects[0].type = "noop";
  s = d.step(input({st}));
  CHECK(s.rules.empty());
  // The report warns when the loop's interval is not well below the gate's hold.
  PolicyInput slow = input({stage("db1", 100, {})});
  slow.interval_ns = 3 * kSecond;
  s = d.step(slow);
  REQUIRE(s.report.contains("warnings"));
  CHECK_THAT(s.report["warnings"][0].get<std::string>(),
             Catch::Contains("interval_ms 3000 is not well below the gate's hold_ms 5000"));
}
