// The max-min policy (PAIO Algorithm 2, done as water-filling): tables of
// steps over a small simulator of processes behind DRL limiters.
#include "maxmin.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace sluice {
namespace {

using nlohmann::json;

constexpr double kMebibyte = 1024.0 * 1024.0;
using sluice::testing::kSecond;
constexpr double kGreedy = 5000;  // MiB/s: more than any capacity here

// A process behind a stage with one DRL limiter (channel "app", object "limit").
struct Proc {
  std::string name = "";
  double want = kGreedy;        // stage MiB/s it would move if nothing limited it
  double real_per_stage = 1.0;  // /proc bytes per stage byte (0.8: the disk sees 80%)
  std::int64_t connected = 1;
  std::map<std::string, std::string> labels = {};
  bool io_valid = true;
  bool has_limiter = true;
  bool absent = false;  // misses this step's collect (still connected)
  // Its collect answers have come (its stats list the limiter); false: it
  // said hello since the last collect, and only its description is known.
  bool collected = true;
  std::string channel = "app";
  std::string object = "limit";
  double drl = 0;  // bytes/s; 0: no rate set yet (unlimited)
  // What happened in the last interval.
  double stage_rate = 0;
  double real_rate = 0;
};

// Runs policy steps against simulated processes: each moves min(want, DRL
// rate) stage bytes per second (and has a request queued when the limit
// binds), and the disk sees real_per_stage times that.
class Sim {
 public:
  explicit Sim(const json& config) {
    const Status s = policy_.configure(config);
    INFO(s.to_string());
    REQUIRE(s.is_ok());
  }
  MaxminPolicy& policy() { return policy_; }
  void add(Proc p) { procs_.push_back(std::move(p)); }
  Proc& proc(const std::string& name) {
    for (auto& p : procs_) {
      if (p.name == name) return p;
    }
    FAIL("no process " << name);
    return procs_.front();
  }
  void remove(const std::string& name) {
    procs_.erase(
        std::remove_if(procs_.begin(), procs_.end(), [&](const Proc& p) { return p.name == name; }),
        procs_.end());
    departed_.push_back(name);
  }
  // DRL rate in MiB/s.
  double rate(const std::string& name) { return proc(name).drl / kMebibyte; }

  // The rules the policy gives `name` at its hello (applied, as a step's).
  RulesBatch admit(const std::string& name) {
    PolicyInput in;
    in.now_ns = steps_ * kSecond + kSecond / 2;  // between two steps
    in.interval_ns = kSecond;
    Proc& p = proc(name);
    StageView st;
    st.name = p.name;
    st.connected_at_ns = p.connected;
    st.labels = p.labels;
    if (p.has_limiter) {
      ObjectInfo oi;
      oi.name = p.object;
      oi.type = "drl";
      oi.match = json::array();
      oi.is_default = true;
      st.info.channels.push_back({p.channel, {}, json::array(), true, {std::move(oi)}});
    }
    in.stages.push_back(std::move(st));
    RulesBatch b = policy_.admit(in);
    if (!b.value().is_null()) apply(name, b);
    return b;
  }

  PolicyOutput step() {
    PolicyInput in;
    in.now_ns = ++steps_ * kSecond;
    in.interval_ns = kSecond;
    in.started_ns = 0;  // the daemon started at 0: start-up lasts until startup_grace_ms
    in.departed = std::move(departed_);
    departed_.clear();
    for (Proc& p : procs_) {
      if (p.absent) continue;
      const double want = p.want * kMebibyte;
      const bool limited = p.has_limiter && p.drl > 0 && want > p.drl;
      p.stage_rate = limited ? p.drl : want;
      p.real_rate = p.stage_rate * p.real_per_stage;
      StageView st;
      st.name = p.name;
      st.connected_at_ns = p.connected;
      st.labels = p.labels;
      st.stats.stage = p.name;
      st.stats.interval_ns = kSecond;
      const auto bytes = static_cast<std::uint64_t>(std::llround(p.stage_rate));
      st.stats.total = {bytes / 4096, bytes};
      if (p.has_limiter) {
        ChannelStats c;
        c.name = p.channel;
        c.total = st.stats.total;
        ObjectStats o;
        o.name = p.object;
        o.type = "drl";
        o.total = st.stats.total;
        o.state = {{"rate", p.drl}, {"waiters", limited ? 1 : 0}};
        c.objects.push_back(o);
        st.stats.channels.push_back(c);
        ObjectInfo oi;
        oi.name = p.object;
        oi.type = "drl";
        oi.match = json::array();
        oi.is_default = true;
        st.info.channels.push_back({p.channel, {}, json::array(), true, {std::move(oi)}});
      } else {
        st.stats.unclassified = st.stats.total;
      }
      st.io.valid = p.io_valid;
      st.io.delta_read_bytes = static_cast<std::uint64_t>(std::llround(p.real_rate));
      if (!p.collected) {  // nothing collected from it yet
        st.stats = StageStats{};
        st.io = ProcIo{};
      }
      in.stages.push_back(std::move(st));
    }
    PolicyOutput out = policy_.step(in);
    for (const auto& [stage, b] : out.rules) apply(stage, b);
    for (Proc& p : procs_) p.collected = true;
    return out;
  }

  void apply(const std::string& stage, const RulesBatch& b) {
    Proc& p = proc(stage);
    for (const json& r : b["rules"]) {
      const std::string rule = r["rule"];
      if (rule == "create_object") p.has_limiter = true;
      if (rule == "configure" || rule == "create_object") p.drl = r["config"]["rate"].get<double>();
    }
  }

 private:
  MaxminPolicy policy_;
  std::vector<Proc> procs_;
  std::vector<std::string> departed_;
  std::int64_t steps_ = 0;
};

json cfg(double max_mib, json extra = json::object()) {
  json c = {{"max_bandwidth", max_mib * kMebibyte}};
  c.update(extra);
  return c;
}

// One step of a table: what changes before it, and the DRL rates after it
// (MiB/s, by stage). `quiet` asserts that the step sent no rules at all.
struct Step {
  std::string name = "";
  std::function<void(Sim&)> before;
  std::map<std::string, double> rates;
  bool quiet = false;
};

void run(Sim& sim, const std::vector<Step>& steps) {
  for (const Step& s : steps) {
    INFO("step: " << s.name);
    if (s.before) s.before(sim);
    const PolicyOutput out = sim.step();
    INFO("report: " << out.report.dump());
    for (const auto& [name, mib] : s.rates) {
      INFO("stage " << name);
      CHECK(sim.rate(name) == Approx(mib).margin(1e-6));
    }
    if (s.quiet) CHECK(out.rules.empty());
  }
}

TEST_CASE("maxmin: leftover goes to whoever can use it", "[policies][maxmin]") {
  Sim sim(cfg(1000));
  sim.add({.name = "A", .want = kGreedy});
  sim.add({.name = "B", .want = 100});
  run(sim, {
               {"both new: equal shares", nullptr, {{"A", 500}, {"B", 500}}},
               // A naive single pass (share, then hand out the rest once) would
               // not reach 890/110 in one step; water-filling does.
               {"B uses 100 (+10% headroom), A the rest", nullptr, {{"A", 890}, {"B", 110}}},
               {"stable", nullptr, {{"A", 890}, {"B", 110}}, true},
               {"B grows to 300: throttled, so unbounded",
                [](Sim& s) { s.proc("B").want = 300; },
                {{"A", 500}, {"B", 500}}},
               {"B settles at 330", nullptr, {{"A", 670}, {"B", 330}}},
               {"stable again", nullptr, {{"A", 670}, {"B", 330}}, true},
           });
}

TEST_CASE("maxmin: weights", "[policies][maxmin]") {
  Sim sim(cfg(1000, {{"stages",
                      {{{"name", "A"}, {"weight", 2}},
                       {{"labels", {{"tier", "bronze"}}}, {"weight", 1}}}}}));
  sim.add({.name = "A"});
  sim.add({.name = "B", .labels = {{"tier", "bronze"}}});
  run(sim, {
               {"2:1, both unbounded", nullptr, {{"A", 2000.0 / 3}, {"B", 1000.0 / 3}}},
               {"stable", nullptr, {{"A", 2000.0 / 3}, {"B", 1000.0 / 3}}, true},
               {"a third, weight 1 by default",
                [](Sim& s) { s.add({.name = "C"}); },
                {{"A", 500}, {"B", 250}, {"C", 250}}},
               {"A uses only 100: it keeps 110, B and C split the rest",
                [](Sim& s) { s.proc("A").want = 100; },
                {{"A", 110}, {"B", 445}, {"C", 445}}},
               {"stable", nullptr, {{"A", 110}, {"B", 445}, {"C", 445}}, true},
           });
}

TEST_CASE("maxmin: goals", "[policies][maxmin]") {
  SECTION("demand below the goal: the goal is not held idle, and comes back at once") {
    Sim sim(cfg(1000, {{"stages",
                        {{{"name", "A"}, {"goal", 300 * kMebibyte}},
                         {{"name", "B"}, {"goal", 100 * kMebibyte}}}}}));
    sim.add({.name = "A", .want = 100});
    sim.add({.name = "B"});
    run(sim, {
                 {"new: equal shares above both goals", nullptr, {{"A", 500}, {"B", 500}}},
                 {"A uses 100: it keeps 110, B gets 890", nullptr, {{"A", 110}, {"B", 890}}},
                 {"A wants 400: throttled, back to at least its goal",
                  [](Sim& s) { s.proc("A").want = 400; },
                  {{"A", 500}, {"B", 500}}},
                 {"A settles at 440", nullptr, {{"A", 440}, {"B", 560}}},
             });
  }
  SECTION("a goal above the fair share is met") {
    Sim sim(cfg(1000, {{"stages", {{{"name", "A"}, {"goal", 700 * kMebibyte}}}}}));
    sim.add({.name = "A"});
    sim.add({.name = "B"});
    run(sim, {{"700 for A, the rest for B", nullptr, {{"A", 700}, {"B", 300}}},
              {"stable", nullptr, {{"A", 700}, {"B", 300}}, true}});
  }
  SECTION("goals in the ratio 150:200:300:350 summing to MaxB: each gets its goal") {
    json stages = json::array();
    const std::vector<double> goals = {150, 200, 300, 350};
    for (int i = 0; i < 4; ++i)
      stages.push_back({{"name", "I" + std::to_string(i + 1)}, {"goal", goals[i] * kMebibyte}});
    Sim sim(cfg(1000, {{"stages", stages}}));
    for (int i = 0; i < 4; ++i) sim.add({.name = "I" + std::to_string(i + 1)});
    run(sim, {{"each at its goal", nullptr, {{"I1", 150}, {"I2", 200}, {"I3", 300}, {"I4", 350}}},
              {"I4 leaves: its 350 lifts everyone above the goals",
               [](Sim& s) { s.remove("I4"); },
               {{"I1", 1000.0 / 3}, {"I2", 1000.0 / 3}, {"I3", 1000.0 / 3}}}});
  }
  SECTION("goals summing above MaxB are scaled down alike, and reported") {
    json stages = json::array();
    const std::vector<double> goals = {150, 200, 300, 350};
    for (int i = 0; i < 4; ++i)
      stages.push_back({{"name", "I" + std::to_string(i + 1)}, {"goal", goals[i] * kMebibyte}});
    Sim sim(cfg(900, {{"stages", stages}}));
    for (int i = 0; i < 4; ++i) sim.add({.name = "I" + std::to_string(i + 1)});
    const PolicyOutput out = sim.step();
    CHECK(sim.rate("I1") == Approx(135));
    CHECK(sim.rate("I2") == Approx(180));
    CHECK(sim.rate("I3") == Approx(270));
    CHECK(sim.rate("I4") == Approx(315));
    REQUIRE(out.report.contains("goals_scaled"));
    CHECK(out.report["goals_scaled"]["sum"].get<double>() == Approx(1000 * kMebibyte));
    CHECK(out.report["goals_scaled"]["scale"].get<double>() == Approx(0.9));
    CHECK(out.report["stages"]["I4"]["goal"].get<double>() == Approx(315 * kMebibyte));
  }
}

TEST_CASE("maxmin: instances come and go", "[policies][maxmin]") {
  Sim sim(cfg(900));
  sim.add({.name = "A"});
  sim.add({.name = "B"});
  sim.add({.name = "C"});
  run(sim, {
               {"three", nullptr, {{"A", 300}, {"B", 300}, {"C", 300}}},
               {"C leaves: its share is redistributed in the next step",
                [](Sim& s) { s.remove("C"); },
                {{"A", 450}, {"B", 450}}},
               {"stable", nullptr, {{"A", 450}, {"B", 450}}, true},
               {"D arrives: fair share at once",
                [](Sim& s) { s.add({.name = "D"}); },
                {{"A", 300}, {"B", 300}, {"D", 300}}},
               {"D misses a collect: its 300 is held, the others keep theirs",
                [](Sim& s) { s.proc("D").absent = true; },
                {{"A", 300}, {"B", 300}, {"D", 300}},
                true},
               {"D is back: nothing changes",
                [](Sim& s) { s.proc("D").absent = false; },
                {{"A", 300}, {"B", 300}, {"D", 300}},
                true},
               {"B restarts (same name, new connection)",
                [](Sim& s) {
                  s.proc("B").connected = 99;
                  s.proc("B").drl = 0;
                },
                {{"A", 300}, {"B", 300}, {"D", 300}}},
           });
}

TEST_CASE("maxmin: calibration converges to the allocation", "[policies][maxmin]") {
  // A's disk sees 0.8 of what passes its DRL (e.g. part of its reads hit the
  // page cache); B's disk sees exactly what passes.
  Sim sim(cfg(1000));
  sim.add({.name = "A", .real_per_stage = 0.8});
  sim.add({.name = "B", .real_per_stage = 1.0});
  int first_within = 0;
  for (int step = 1; step <= 12; ++step) {
    sim.step();
    // The rate just sent is in force during the next interval.
    const double real_a = std::min(sim.rate("A"), kGreedy) * 0.8;
    const double err = std::abs(real_a - 500) / 500;
    INFO("step " << step << " A real " << real_a << " MiB/s");
    if (first_within == 0 && err < 0.02) first_within = step;
    if (first_within != 0) CHECK(err < 0.02);  // and stays there
    CHECK(sim.rate("B") == Approx(500).margin(1e-6));
  }
  CHECK(first_within > 0);
  CHECK(first_within <= 5);
  CHECK(sim.policy().factor("A") == Approx(1.25).epsilon(0.01));
  CHECK(sim.policy().factor("B") == 1.0);

  SECTION("calibration off: the DRL rate is the allocation") {
    Sim off(cfg(1000, {{"calibration", {{"enabled", false}}}}));
    off.add({.name = "A", .real_per_stage = 0.8});
    off.add({.name = "B"});
    for (int i = 0; i < 5; ++i) off.step();
    CHECK(off.rate("A") == Approx(500));
    CHECK(off.policy().factor("A") == 1.0);
  }
  SECTION("no /proc counters: nothing to calibrate against") {
    Sim blind(cfg(1000));
    blind.add({.name = "A", .real_per_stage = 0.8, .io_valid = false});
    blind.add({.name = "B"});
    for (int i = 0; i < 5; ++i) blind.step();
    CHECK(blind.rate("A") == Approx(500));
  }
  SECTION("the factor is clamped") {
    Sim clamped(cfg(1000, {{"calibration", {{"max_factor", 1.1}, {"gain", 1}}}}));
    clamped.add({.name = "A", .real_per_stage = 0.5});
    for (int i = 0; i < 5; ++i) clamped.step();
    CHECK(clamped.policy().factor("A") == Approx(1.1));
    CHECK(clamped.rate("A") == Approx(1100));
  }
}

TEST_CASE("maxmin: no calibration from a stage's first step", "[policies][maxmin]") {
  // The daemon has no earlier /proc reading of a new stage: its deltas are 0
  // although bytes moved. That must not read as "nothing reached the disk".
  MaxminPolicy p;
  REQUIRE(p.configure(cfg(1000)).is_ok());
  StageView st;
  st.name = "A";
  st.connected_at_ns = 1;
  st.stats.interval_ns = kSecond;
  ChannelStats ch;
  ch.name = "app";
  ObjectStats o;
  o.name = "limit";
  o.total.bytes = static_cast<std::uint64_t>(300 * kMebibyte);
  ch.objects.push_back(o);
  st.stats.channels.push_back(ch);
  st.io.valid = true;  // deltas 0
  PolicyInput in;
  in.interval_ns = kSecond;
  in.stages = {st};
  const PolicyOutput out = p.step(in);
  CHECK(p.factor("A") == 1.0);
  CHECK(out.rules.at("A")["rules"][0]["config"]["rate"] ==
        static_cast<std::int64_t>(1000 * kMebibyte));
}

TEST_CASE("maxmin: constant demand does not oscillate", "[policies][maxmin]") {
  Sim sim(cfg(
      1000,
      {{"stages", {{{"name", "D"}, {"weight", 2}}, {{"name", "C"}, {"goal", 200 * kMebibyte}}}}}));
  sim.add({.name = "A", .want = 200, .real_per_stage = 0.9});
  sim.add({.name = "B", .real_per_stage = 1.0});
  sim.add({.name = "C", .want = 50, .real_per_stage = 1.1});
  sim.add({.name = "D", .real_per_stage = 0.95});
  std::map<std::string, double> previous;
  int quiet_since = 0;
  for (int step = 1; step <= 40; ++step) {
    const PolicyOutput out = sim.step();
    if (!out.rules.empty()) quiet_since = step + 1;
  }
  INFO("rules stopped after step " << quiet_since);
  CHECK(quiet_since <= 10);
  // The allocations (real bandwidth) at the fixpoint: A 198 (180 real + 10%),
  // C 60.5 (55 real + 10%; its goal of 200 is not held idle), B and D share
  // the rest 1:2. A and C achieve their whole demand.
  const double rest = 1000 - 198 - 60.5;
  CHECK(sim.proc("A").real_rate / kMebibyte == Approx(180));
  CHECK(sim.proc("C").real_rate / kMebibyte == Approx(55));
  CHECK(sim.proc("A").drl > sim.proc("A").want * kMebibyte);  // not throttled
  CHECK(sim.proc("C").drl > sim.proc("C").want * kMebibyte);
  CHECK(sim.proc("B").real_rate / kMebibyte == Approx(rest / 3).epsilon(0.02));
  CHECK(sim.proc("D").real_rate / kMebibyte == Approx(2 * rest / 3).epsilon(0.02));
}

TEST_CASE("maxmin: surplus and probing", "[policies][maxmin]") {
  SECTION("capacity nobody demands is shared by weight") {
    Sim sim(cfg(1000));
    sim.add({.name = "A", .want = 100});
    sim.add({.name = "B", .want = 200});
    run(sim, {{"new", nullptr, {{"A", 500}, {"B", 500}}},
              {"demands 110 and 220, surplus 670 split", nullptr, {{"A", 445}, {"B", 555}}},
              {"stable", nullptr, {{"A", 445}, {"B", 555}}, true}});
  }
  SECTION("distribute_surplus false keeps the caps at the demands") {
    Sim sim(cfg(1000, {{"distribute_surplus", false}}));
    sim.add({.name = "A", .want = 100});
    sim.add({.name = "B", .want = 200});
    run(sim, {{"new", nullptr, {{"A", 500}, {"B", 500}}},
              {"demands", nullptr, {{"A", 110}, {"B", 220}}}});
  }
  SECTION("probe 2: a throttled stage's demand doubles per step") {
    Sim sim(cfg(1000, {{"distribute_surplus", false}, {"probe", 2}}));
    sim.add({.name = "A", .want = 100});
    sim.add({.name = "B", .want = 100});
    run(sim, {{"new", nullptr, {{"A", 500}, {"B", 500}}},
              {"both at 110", nullptr, {{"A", 110}, {"B", 110}}},
              {"A wants everything",
               [](Sim& s) { s.proc("A").want = kGreedy; },
               {{"A", 220}, {"B", 110}}},
              {"x2", nullptr, {{"A", 440}, {"B", 110}}},
              {"x2", nullptr, {{"A", 880}, {"B", 110}}},
              {"capped by B's share", nullptr, {{"A", 890}, {"B", 110}}}});
  }
}

TEST_CASE("maxmin: throttling is detected three ways", "[policies][maxmin]") {
  // One stage configured at 500 MiB/s; then an interval of the given shape.
  struct Case {
    std::string name;
    double moved;  // MiB in the interval
    int waiters;
    double waited_s;  // total wait time in the interval
    bool throttled;
  };
  const std::vector<Case> cases = {
      {"well below the limit", 200, 0, 0, false},
      {"at 96% of the limit (saturation 0.95)", 480, 0, 0, true},
      {"queued requests at collect", 200, 2, 0, true},
      {"waited 5% of the interval", 200, 0, 0.05, true},
      {"waited 1% of the interval (below 2%)", 200, 0, 0.01, false},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    MaxminPolicy p;
    REQUIRE(p.configure(cfg(1000)).is_ok());
    auto view = [&](double moved, int waiters, double waited_s) {
      StageView st;
      st.name = "A";
      st.stats.interval_ns = kSecond;
      ChannelStats ch;
      ch.name = "app";
      ObjectStats o;
      o.name = "limit";
      o.total.bytes = static_cast<std::uint64_t>(moved * kMebibyte);
      o.state = {{"waiters", waiters}};
      o.wait.total_ns = static_cast<std::uint64_t>(waited_s * 1e9);
      ch.objects.push_back(o);
      st.stats.channels.push_back(ch);
      st.io.valid = true;
      st.io.delta_read_bytes = o.total.bytes;
      StageView other = st;
      other.name = "B";
      other.stats.channels[0].objects[0].total.bytes = static_cast<std::uint64_t>(100 * kMebibyte);
      other.stats.channels[0].objects[0].state = {{"waiters", 0}};
      other.stats.channels[0].objects[0].wait.total_ns = 0;
      other.io.delta_read_bytes = static_cast<std::uint64_t>(100 * kMebibyte);
      PolicyInput in;
      in.interval_ns = kSecond;
      in.stages = {st, other};
      return in;
    };
    (void)p.step(view(500, 1, 0));  // both new: 500 each
    const PolicyOutput out = p.step(view(c.moved, c.waiters, c.waited_s));
    CHECK(out.report["stages"]["A"]["throttled"] == c.throttled);
    if (c.throttled) {
      CHECK(out.report["stages"]["A"]["demand"] == "unbounded");
    } else {
      CHECK(out.report["stages"]["A"]["demand"].get<double>() == Approx(c.moved * 1.1 * kMebibyte));
    }
  }
}

TEST_CASE("maxmin: limiter layout", "[policies][maxmin]") {
  SECTION("install_layout creates a missing limiter once") {
    Sim sim(cfg(1000, {{"install_layout", true}}));
    sim.add({.name = "A", .has_limiter = false});
    sim.add({.name = "B"});
    const PolicyOutput out = sim.step();
    CHECK(out.rules.at("A") ==
          json({{"version", 1},
                {"rules",
                 {{{"rule", "create_channel"}, {"channel", "app"}, {"default", true}},
                  {{"rule", "create_object"},
                   {"channel", "app"},
                   {"object", "limit"},
                   {"type", "drl"},
                   {"config", {{"rate", static_cast<std::int64_t>(500 * kMebibyte)}}}}}}}));
    CHECK(out.rules.at("B") ==
          json({{"version", 1},
                {"rules",
                 {{{"rule", "configure"},
                   {"channel", "app"},
                   {"object", "limit"},
                   {"config", {{"rate", static_cast<std::int64_t>(500 * kMebibyte)}}}}}}}));
    const PolicyOutput again = sim.step();
    CHECK(again.rules.empty());
  }
  SECTION("without install_layout a stage with no limiter is reported and still counted") {
    Sim sim(cfg(1000));
    sim.add({.name = "A", .want = 300, .has_limiter = false});
    sim.add({.name = "B"});
    sim.step();
    const PolicyOutput out = sim.step();
    CHECK(out.rules.count("A") == 0);
    CHECK(out.report["stages"]["A"]["missing"] == "app/limit");
    CHECK(sim.rate("B") == Approx(1000 - 330));
  }
  SECTION("a per-stage limiter elsewhere, and match_labels") {
    Sim sim(cfg(1000, {{"match_labels", {{"qos", "on"}}},
                       {"stages", {{{"name", "A"}, {"channel", "reads"}, {"object", "drl"}}}}}));
    sim.add({.name = "A", .labels = {{"qos", "on"}}, .channel = "reads", .object = "drl"});
    sim.add({.name = "B", .labels = {{"qos", "on"}}});
    sim.add({.name = "X", .labels = {{"qos", "off"}}});
    const PolicyOutput out = sim.step();
    CHECK(out.rules.at("A")["rules"][0]["channel"] == "reads");
    CHECK(out.rules.at("A")["rules"][0]["object"] == "drl");
    CHECK(sim.rate("A") == Approx(500));
    CHECK(sim.rate("B") == Approx(500));
    CHECK(out.rules.count("X") == 0);
  }
}

TEST_CASE("maxmin: after a restart the first stage back does not get the whole capacity",
          "[policies][maxmin][start-up]") {
  // An earlier daemon left A and B at 20 MiB/s each of 40. This one started
  // at 0 s and steps every second; start-up lasts 5 s (steps 1 to 4).
  Sim sim(cfg(40));
  sim.add({.name = "A", .drl = 20 * kMebibyte});
  run(sim, {
               {"A is back first: it keeps its 20 (not all 40: B still uses its own 20)",
                nullptr,
                {{"A", 20}},
                true},
               {"B is back: both keep theirs",
                [](Sim& s) { s.add({.name = "B", .drl = 20 * kMebibyte}); },
                {{"A", 20}, {"B", 20}},
                true},
               {"a new stage gets what they leave: none, so min_rate",
                [](Sim& s) { s.add({.name = "C"}); },
                {{"A", 20}, {"B", 20}, {"C", 1}}},
               {"still starting", nullptr, {{"A", 20}, {"B", 20}, {"C", 1}}, true},
               {"start-up over: everyone shares",
                nullptr,
                {{"A", 40.0 / 3}, {"B", 40.0 / 3}, {"C", 40.0 / 3}}},
           });
  SECTION("a stage whose rate is not known yet holds an equal share") {
    Sim s2(cfg(40));
    s2.add(
        {.name = "A", .collected = false, .drl = 30 * kMebibyte});  // said hello after the collect
    s2.add({.name = "N"});                                          // new, no rate yet
    const PolicyOutput out = s2.step();
    CHECK(out.rules.count("A") == 0);
    CHECK(s2.rate("N") == Approx(20));
    CHECK(out.report["stages"]["A"]["kept"] == true);
    CHECK(out.report["start_up"]["kept"].get<double>() == Approx(20 * kMebibyte));
    s2.step();  // A's rate (30) is known now and kept; N gets the rest
    CHECK(s2.rate("A") == Approx(30));
    CHECK(s2.rate("N") == Approx(10));
  }
  SECTION("startup_grace_ms 0: no start-up") {
    Sim s3(cfg(40, {{"startup_grace_ms", 0}}));
    s3.add({.name = "A", .drl = 20 * kMebibyte});
    s3.step();
    CHECK(s3.rate("A") == Approx(40));
  }
}

TEST_CASE("maxmin: expected_stages holds shares for stages not back yet",
          "[policies][maxmin][start-up]") {
  Sim sim(cfg(40, {{"expected_stages", 2}}));
  sim.add({.name = "A"});
  run(sim, {
               {"A alone, one more expected: half", nullptr, {{"A", 20}}},
               {"B comes", [](Sim& s) { s.add({.name = "B"}); }, {{"A", 20}, {"B", 20}}},
               {"B leaves during start-up: its share stays held",
                [](Sim& s) { s.remove("B"); },
                {{"A", 20}}},
               {"", nullptr, {{"A", 20}}},
               {"start-up over: A gets what nobody uses", nullptr, {{"A", 40}}},
           });
}

TEST_CASE("maxmin: a stage gets its rules at its hello, within what the others leave",
          "[policies][maxmin][admit]") {
  Sim sim(cfg(40, {{"startup_grace_ms", 0}, {"install_layout", true}}));
  sim.add({.name = "A"});
  // Alone: the whole capacity.
  RulesBatch a = sim.admit("A");
  CHECK(a == json({{"version", 1},
                   {"rules",
                    {{{"rule", "configure"},
                      {"channel", "app"},
                      {"object", "limit"},
                      {"config", {{"rate", static_cast<std::int64_t>(40 * kMebibyte)}}}}}}}));
  // While A holds all of it: min_rate, and the limiter is installed.
  sim.add({.name = "B", .has_limiter = false});
  RulesBatch b = sim.admit("B");
  REQUIRE(b->at("rules").size() == 2);
  CHECK(b->at("rules")[0]["rule"] == "create_channel");
  CHECK(b->at("rules")[1]["rule"] == "create_object");
  CHECK(sim.rate("B") == Approx(1));  // min_rate: 1 MiB/s
  // The next step shares fairly and does not create B's limiter again.
  const PolicyOutput out = sim.step();
  CHECK(sim.rate("A") == Approx(20));
  CHECK(sim.rate("B") == Approx(20));
  CHECK(out.rules.at("B")["rules"].size() == 1);
  CHECK(out.rules.at("B")["rules"][0]["rule"] == "configure");
  CHECK(out.report["stages"]["B"]["new"] == true);  // its first step: no calibration yet
  // A stage the policy does not drive gets nothing.
  Sim other(cfg(40, {{"match_labels", {{"qos", "on"}}}}));
  other.add({.name = "X"});
  CHECK(other.admit("X").value().is_null());
}

TEST_CASE("maxmin: at start-up a stage with its limiter keeps it at its hello",
          "[policies][maxmin][admit][start-up]") {
  Sim sim(cfg(40, {{"install_layout", true}, {"expected_stages", 4}}));
  sim.add({.name = "A", .drl = 20 * kMebibyte});
  CHECK(sim.admit("A").value().is_null());  // the daemon sends an empty batch
  CHECK(sim.rate("A") == 20);
  // One without: a share of max_bandwidth among the expected stages.
  sim.add({.name = "B", .has_limiter = false});
  sim.admit("B");
  CHECK(sim.rate("B") == Approx(10));
}

TEST_CASE("maxmin: a limiter name a stage would refuse is reported, and nothing is sent",
          "[policies][maxmin]") {
  // The configuration takes any non-empty name; a stage takes 1-64 of A-Z a-z 0-9 _ . : -.
  Sim sim(cfg(1000, {{"channel", "a pp"}}));
  sim.add({.name = "A", .want = 100, .channel = "a pp"});
  CHECK(sim.admit("A").value().is_null());
  const PolicyOutput out = sim.step();
  CHECK(out.rules.empty());
  CHECK(out.report["stages"]["A"]["error"] ==
        "rules[0].channel: must be a name of 1-64 characters of A-Z a-z 0-9 _ . : -, got "
        "\"a pp\"");
  CHECK(out.report["stages"]["A"]["rate"].is_null());
}

TEST_CASE("maxmin: configuration errors name the field", "[policies][maxmin]") {
  struct Case {
    json config;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"max_bandwidth", 0}}, "max_bandwidth: must be > 0, got 0"},
      {{{"startup_grace_ms", -1}}, "startup_grace_ms: must be >= 0 and <= 3600000, got -1"},
      {{{"expected_stages", 2.5}}, "expected_stages: must be an integer in 0..1000000, got 2.5"},
      {{{"max_bandwith", 1}}, "max_bandwith: unknown field"},
      {{{"channel", ""}}, "channel: must be a non-empty string, got \"\""},
      {{{"default_weight", 0}}, "default_weight: must be > 0, got 0"},
      {{{"headroom", -0.1}}, "headroom: must be > 0 and <= 10, got -0.1"},
      {{{"headroom", 0.02}},
       "headroom: (1 + headroom) * saturation must exceed 1, got (1 + 0.02) * 0.95"},
      {{{"probe", 1}}, "probe: must be 0 (unbounded) or > 1, got 1"},
      {{{"saturation", 1.5}}, "saturation: must be > 0 and <= 1, got 1.5"},
      {{{"stages", {{"name", "a"}}}}, "stages: must be an array, got {\"name\":\"a\"}"},
      {{{"stages", {{{"name", "a"}, {"goal", -1}}}}}, "stages[0].goal: must be >= 0, got -1"},
      {{{"stages", {{{"name", "a"}}, {{"weight", "heavy"}}}}},
       "stages[1].weight: must be a number, got \"heavy\""},
      {{{"stages", {{{"nam", "a"}}}}}, "stages[0].nam: unknown field"},
      {{{"stages", {{{"labels", {{"k", 1}}}}}}}, "stages[0].labels.k: must be a string, got 1"},
      {{{"calibration", {{"io", "disk"}}}},
       "calibration.io: must be one of read, write, both, got \"disk\""},
      {{{"calibration", {{"gain", 0}}}}, "calibration.gain: must be > 0 and <= 1, got 0"},
      {{{"calibration", {{"max_factor", 0.5}}}}, "calibration.max_factor: must be >= 1, got 0.5"},
      {{{"calibration", {{"enabled", "yes"}}}},
       "calibration.enabled: must be true or false, got \"yes\""},
      {{{"calibration", true}}, "calibration: must be an object, got true"},
  };
  for (const Case& c : cases) {
    INFO(c.config.dump());
    MaxminPolicy p;
    const Status s = p.configure(c.config);
    CHECK(s.code() == Code::kInvalidArgument);
    CHECK(s.message() == c.message);
  }
}

TEST_CASE("maxmin: describe() round-trips the configuration", "[policies][maxmin]") {
  MaxminPolicy p;
  REQUIRE(p.configure({{"max_bandwidth", 500 * kMebibyte},
                       {"stages",
                        {{{"name", "a"}, {"goal", 100 * kMebibyte}, {"weight", 2}},
                         {{"labels", {{"job", "x"}}}, {"channel", "c"}}}},
                       {"calibration", {{"io", "read"}, {"gain", 0.5}}}})
              .is_ok());
  const json d = p.describe();
  CHECK(d["max_bandwidth"] == 500 * kMebibyte);
  CHECK(d["headroom"] == 0.1);
  CHECK(d["calibration"]["io"] == "read");
  CHECK(d["stages"][1] == json({{"labels", {{"job", "x"}}}, {"channel", "c"}}));
  MaxminPolicy q;
  REQUIRE(q.configure(d).is_ok());
  CHECK(q.describe() == d);
  CHECK(make_maxmin_policy()->name() == "maxmin");
}

}  // namespace
}  // namespace sluice
