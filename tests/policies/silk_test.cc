// The SILK policy (PAIO Algorithm 1): tables of collected statistics in,
// rules out.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "silk_test_util.h"

namespace sluice {
namespace {

using nlohmann::json;

TEST_CASE("silk: Algorithm 1 lines 2-11", "[policies][silk]") {
  struct Case {
    std::string name;
    Load load;             // MiB/s in the last interval, and waiters
    int line;              // of Algorithm 1
    double flush, l0, ln;  // MiB/s expected
  };
  // KVS_B = 200 MiB/s, min_B = 10 MiB/s.
  // clang-format off
  const std::vector<Case> cases = {
    //                                       Fg  Fl  L0  LN  waiters  line   B_Fl  B_L0 B_LN
    {"idle KVS: everything to LN",         {  0,  0,  0,  0, 0, 0, 0},  11,   10,   10,  200},
    {"no background work: LN gets left_B", { 50,  0,  0,  0, 0, 0, 0},  11,   10,   10,  150},
    {"LN work only",                       {100,  0,  0, 40, 0, 0, 0},  11,   10,   10,  100},
    {"flush only",                         {100, 30,  0,  5, 0, 0, 0},   7,  100,   10,   10},
    {"L0 only",                            {100,  0, 30, 20, 0, 0, 0},   9,   10,  100,   10},
    {"flush and L0 split left_B",          { 60, 30, 30, 20, 0, 0, 0},   5,   70,   70,   10},
    {"fg above KVS_B: left_B is min_B",    {250,  5,  5,  0, 0, 0, 0},   5,    5,    5,   10},
    {"fg above KVS_B, no background",      {250,  0,  0,  0, 0, 0, 0},  11,   10,   10,   10},
    {"fg at KVS_B - min_B",                {190,  1,  0,  0, 0, 0, 0},   7,   10,   10,   10},
    {"flush held at its limit: waiters",   {100,  0,  0,  0, 3, 0, 0},   7,  100,   10,   10},
    {"L0 waiting, no bytes",               {100,  0,  0,  0, 0, 1, 0},   9,   10,  100,   10},
    {"LN waiters keep line 11",            {100,  0,  0,  0, 0, 0, 2},  11,   10,   10,  100},
  };
  // clang-format on
  for (const Case& c : cases) {
    INFO(c.name);
    SilkPolicy p = make_silk(kPaper);
    const PolicyOutput out = p.step(silk_input_of({rocksdb_stage("db", c.load)}));
    REQUIRE(out.rules.count("db") == 1);
    CHECK(out.rules.at("db") == three_rates(mib(c.flush), mib(c.l0), mib(c.ln)));
    CHECK(out.report["stages"]["db"]["line"] == c.line);
    CHECK(out.report["stages"]["db"]["fg"].get<double>() == Approx(c.load.fg * kMiB));
  }
}

TEST_CASE("silk: the pure split matches the paper's lines", "[policies][silk]") {
  struct Case {
    double fg;
    bool fl, l0;
    SilkRates expected;
  };
  const std::vector<Case> cases = {
      {0, false, false, {200, 10, 10, 200, 11}}, {50, true, true, {150, 75, 75, 10, 5}},
      {50, true, false, {150, 150, 10, 10, 7}},  {50, false, true, {150, 10, 150, 10, 9}},
      {500, true, true, {10, 5, 5, 10, 5}},      {195, false, false, {10, 10, 10, 10, 11}},
  };
  for (const Case& c : cases) {
    const SilkRates r = silk_rates(200, 10, c.fg, c.fl, c.l0);
    INFO("fg " << c.fg << " fl " << c.fl << " l0 " << c.l0);
    CHECK(r.left == c.expected.left);
    CHECK(r.flush == c.expected.flush);
    CHECK(r.l0 == c.expected.l0);
    CHECK(r.ln == c.expected.ln);
    CHECK(r.line == c.expected.line);
  }
}

TEST_CASE("silk: share reclaim gives line 5's unused half to the other flow", "[policies][silk]") {
  struct Case {
    double flush_used, l0_used;
    double flush, l0;  // expected caps; left_B = 150, half 75
  };
  const std::vector<Case> cases = {
      {0, 0, 150, 150},    // neither used anything yet: each may take left_B
      {20, 75, 75, 130},   // flush below its half, L0 at it: L0 takes the rest
      {20, 200, 75, 130},  // L0 above its half counts as the half
      {75, 10, 140, 75},   // the other way round
      {75, 75, 75, 75},    // both at their halves: the paper's split
      {-5, 300, 75, 150},  // nonsense measures are clamped
  };
  for (const Case& c : cases) {
    INFO("flush used " << c.flush_used << " l0 used " << c.l0_used);
    const SilkRates r =
        silk_rates(200, 10, 50, true, true, SilkShare::kReclaim, c.flush_used, c.l0_used);
    CHECK(r.left == 150);
    CHECK(r.flush == c.flush);
    CHECK(r.l0 == c.l0);
    CHECK(r.ln == 10);
    CHECK(r.line == 5);
    // kEqual ignores what the flows used.
    const SilkRates e =
        silk_rates(200, 10, 50, true, true, SilkShare::kEqual, c.flush_used, c.l0_used);
    CHECK(e.flush == 75);
    CHECK(e.l0 == 75);
  }
  SECTION("only line 5 changes") {
    const SilkRates fl = silk_rates(200, 10, 50, true, false, SilkShare::kReclaim, 5, 0);
    CHECK(fl.flush == 150);
    CHECK(fl.l0 == 10);
    const SilkRates l0 = silk_rates(200, 10, 50, false, true, SilkShare::kReclaim, 0, 5);
    CHECK(l0.l0 == 150);
    CHECK(l0.flush == 10);
  }
  SECTION("through the policy, from the collected bytes") {
    json cfg = kPaper;
    cfg["share"] = "reclaim";
    SilkPolicy p = make_silk(cfg);
    // Fg 60: left_B 140, half 70. The flush moved 10 MiB/s, L0 70 with waiters.
    const PolicyOutput out = p.step(
        silk_input_of({rocksdb_stage("db", {.fg = 60, .flush = 10, .l0 = 70, .l0_waiters = 2})}));
    CHECK(out.rules.at("db") == three_rates(mib(70), mib(130), mib(10)));
    const json& rep = out.report["stages"]["db"];
    CHECK(rep["line"] == 5);
    CHECK(rep["used"]["flush"].get<double>() == Approx(10.0 * kMiB));
    CHECK(rep["used"]["l0"].get<double>() == Approx(70.0 * kMiB));
    // The paper's split for the same input.
    SilkPolicy q = make_silk(kPaper);
    CHECK(q.step(silk_input_of({rocksdb_stage("db", {.fg = 60, .flush = 10, .l0 = 70})}))
              .rules.at("db") == three_rates(mib(70), mib(70), mib(10)));
  }
}

TEST_CASE("silk: demand threshold and foreground by origin", "[policies][silk]") {
  SECTION("a trickle below demand_threshold is not demand") {
    SilkPolicy p = make_silk({{"kvs_bandwidth", 200 * kMiB},
                              {"min_bandwidth", 10 * kMiB},
                              {"demand_threshold", 1 * kMiB}});
    const PolicyOutput out =
        p.step(silk_input_of({rocksdb_stage("db", {.fg = 100, .flush = 0.5})}));
    CHECK(out.rules.at("db") == three_rates(10 * kMiB, 10 * kMiB, 100 * kMiB));
  }
  SECTION("foreground counted by origin in a shared channel, plus unclassified") {
    json cfg = kPaper;
    cfg["foreground"] = {{"channels", json::array()}, {"origins", {"foreground", "wal"}}};
    SilkPolicy p = make_silk(cfg);
    StageView st = rocksdb_stage("db", {.flush = 20});
    add_object(st, "rest", "count", "foreground", mib(40), 0, "noop");
    add_object(st, "rest", "count", "wal", mib(10), 0, "noop");
    add_object(st, "rest", "count", "manifest", mib(5), 0, "noop");
    st.stats.unclassified = {10, mib(20)};
    const PolicyOutput out = p.step(silk_input_of({st}));
    // Fg = 40 + 10 + 20 (unclassified) = 70; flush only: left = 130.
    CHECK(out.report["stages"]["db"]["fg"].get<double>() == Approx(70.0 * kMiB));
    CHECK(out.rules.at("db") == three_rates(130 * kMiB, 10 * kMiB, 10 * kMiB));
  }
  SECTION("count_unclassified false ignores requests no channel took") {
    json cfg = kPaper;
    cfg["foreground"] = {{"count_unclassified", false}};
    SilkPolicy p = make_silk(cfg);
    StageView st = rocksdb_stage("db", {.fg = 30});
    st.stats.unclassified = {10, mib(20)};
    const PolicyOutput out = p.step(silk_input_of({st}));
    CHECK(out.rules.at("db") == three_rates(10 * kMiB, 10 * kMiB, 170 * kMiB));
  }
  SECTION("an interval of 0.5 s doubles the rates") {
    SilkPolicy p = make_silk(kPaper);
    StageView st = rocksdb_stage("db", {.fg = 50});
    st.stats.interval_ns = kSecond / 2;
    const PolicyOutput out = p.step(silk_input_of({st}));
    CHECK(out.rules.at("db") == three_rates(10 * kMiB, 10 * kMiB, 100 * kMiB));
  }
}

TEST_CASE("silk: B_LN split among several LN objects", "[policies][silk]") {
  // Four compaction threads, each with its own LN limiter in one channel.
  auto stage = [](std::vector<double> ln_mib, std::vector<std::uint64_t> waiters) {
    StageView st = rocksdb_stage("db", {.fg = 50});
    for (std::size_t i = 0; i < ln_mib.size(); ++i) {
      add_object(st, "compaction_ln", "t" + std::to_string(i), "compaction_LN", mib(ln_mib[i]),
                 waiters[i]);
    }
    return st;
  };
  const json objects = {{{"channel", "compaction_ln"}, {"object", "t0"}},
                        {{"channel", "compaction_ln"}, {"object", "t1"}},
                        {{"channel", "compaction_ln"}, {"object", "t2"}},
                        {{"channel", "compaction_ln"}, {"object", "t3"}}};
  struct Case {
    std::string split;
    std::vector<double> ln_mib;
    std::vector<std::uint64_t> waiters;
    std::vector<double> expected;  // MiB/s per LN object; left_B = 150
  };
  const std::vector<Case> cases = {
      {"even", {0, 0, 0, 0}, {0, 0, 0, 0}, {37.5, 37.5, 37.5, 37.5}},
      {"even", {10, 0, 30, 0}, {0, 0, 0, 0}, {37.5, 37.5, 37.5, 37.5}},
      {"each", {10, 0, 30, 0}, {0, 0, 0, 0}, {150, 150, 150, 150}},
      {"active", {10, 0, 30, 0}, {0, 0, 0, 0}, {75, 37.5, 75, 37.5}},
      {"active", {0, 0, 0, 5}, {0, 2, 0, 0}, {37.5, 75, 37.5, 75}},
      {"active", {0, 0, 0, 0}, {0, 0, 0, 0}, {37.5, 37.5, 37.5, 37.5}},
  };
  for (const Case& c : cases) {
    INFO("split " << c.split << " case " << (&c - cases.data()));
    json cfg = kPaper;
    cfg["ln"] = {{"objects", objects}, {"split", c.split}};
    SilkPolicy p = make_silk(cfg);
    const PolicyOutput out = p.step(silk_input_of({stage(c.ln_mib, c.waiters)}));
    json expected = {configure("flush", "limit", 10 * kMiB),
                     configure("compaction_l0", "limit", 10 * kMiB)};
    for (std::size_t i = 0; i < c.expected.size(); ++i) {
      expected.push_back(configure("compaction_ln", "t" + std::to_string(i), mib(c.expected[i])));
    }
    CHECK(out.rules.at("db") == batch(expected));
  }
  SECTION("LN objects in per-thread channels, flush busy: min_B split evenly") {
    json cfg = kPaper;
    cfg["ln"] = {
        {"objects",
         {{{"channel", "ln_a"}, {"object", "limit"}}, {{"channel", "ln_b"}, {"object", "limit"}}}}};
    SilkPolicy p = make_silk(cfg);
    StageView st = rocksdb_stage("db", {.fg = 50, .flush = 10});
    add_object(st, "ln_a", "limit", "compaction_LN", mib(3));
    add_object(st, "ln_b", "limit", "compaction_LN", 0);
    const PolicyOutput out = p.step(silk_input_of({st}));
    CHECK(out.rules.at("db") ==
          batch({configure("flush", "limit", 150 * kMiB),
                 configure("compaction_l0", "limit", 10 * kMiB),
                 configure("ln_a", "limit", 5 * kMiB), configure("ln_b", "limit", 5 * kMiB)}));
  }
}

TEST_CASE("silk: hysteresis and resending", "[policies][silk]") {
  SilkPolicy p = make_silk(kPaper);
  // Rates in bytes/s; left_B = KVS_B - Fg goes to LN (no flush, no L0).
  const std::int64_t kvs = 200 * kMiB;
  const std::int64_t ln0 = 100 * kMiB;
  struct Step {
    std::string name;
    std::int64_t ln;  // left_B wanted this step
    json expected;    // rules, or null for none
  };
  const std::vector<Step> steps = {
      {"first step sends everything", ln0, three_rates(10 * kMiB, 10 * kMiB, ln0)},
      {"same rates: nothing", ln0, nullptr},
      {"+0.5%: within hysteresis", ln0 + ln0 / 200, nullptr},
      {"+1% exactly: within hysteresis", ln0 + ln0 / 100, nullptr},
      {"+1.5% of the last sent: resent", ln0 + 3 * ln0 / 200,
       batch({configure("compaction_ln", "limit", ln0 + 3 * ln0 / 200)})},
      {"back by 0.9%: nothing", ln0 + 3 * ln0 / 200 - 9 * ln0 / 1000, nullptr},
      {"flush starts: flush and LN move, L0 stays", ln0,
       batch({configure("flush", "limit", ln0), configure("compaction_ln", "limit", 10 * kMiB)})},
  };
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    INFO(s.name);
    StageView st = rocksdb_stage("db", {});
    st.stats.channels[0].total.bytes = static_cast<std::uint64_t>(kvs - s.ln);  // foreground
    if (i == steps.size() - 1) add_object(st, "flush", "limit", "flush", mib(1));
    const PolicyOutput out = p.step(silk_input_of({st}));
    if (s.expected.is_null()) {
      CHECK(out.rules.empty());
    } else {
      REQUIRE(out.rules.count("db") == 1);
      CHECK(out.rules.at("db") == s.expected);
    }
  }
  SECTION("hysteresis 0 resends any change") {
    json cfg = kPaper;
    cfg["hysteresis"] = 0;
    SilkPolicy q = make_silk(cfg);
    (void)q.step(silk_input_of({rocksdb_stage("db", {.fg = 100})}));
    const PolicyOutput out = q.step(silk_input_of({rocksdb_stage("db", {.fg = 100.001})}));
    CHECK(out.rules.at("db") == batch({configure("compaction_ln", "limit",
                                                 kvs - static_cast<std::int64_t>(mib(100.001)))}));
  }
}

TEST_CASE("silk: stages leaving and arriving", "[policies][silk]") {
  SilkPolicy p = make_silk(kPaper);
  const Load busy = {.fg = 100, .flush = 20};
  const json busy_rules = three_rates(100 * kMiB, 10 * kMiB, 10 * kMiB);
  struct Step {
    std::string name;
    std::vector<StageView> stages;
    std::vector<std::string> departed;
    std::map<std::string, RulesBatch> expected;
  };
  const std::vector<Step> steps = {
      {"two stages, both new",
       {rocksdb_stage("a", busy), rocksdb_stage("b", busy)},
       {},
       {{"a", busy_rules}, {"b", busy_rules}}},
      {"unchanged: nothing", {rocksdb_stage("a", busy), rocksdb_stage("b", busy)}, {}, {}},
      {"b leaves, c arrives: only c is configured",
       {rocksdb_stage("a", busy), rocksdb_stage("c", busy)},
       {"b"},
       {{"c", busy_rules}}},
      {"b is back (same name, new connection): resent in full",
       {rocksdb_stage("a", busy), rocksdb_stage("b", busy, 2), rocksdb_stage("c", busy)},
       {},
       {{"b", busy_rules}}},
      {"c reconnected without a departure report: resent in full",
       {rocksdb_stage("a", busy), rocksdb_stage("b", busy, 2), rocksdb_stage("c", busy, 7)},
       {},
       {{"c", busy_rules}}},
      {"a misses a collect: absent, not departed",
       {rocksdb_stage("b", busy, 2), rocksdb_stage("c", busy, 7)},
       {},
       {}},
      {"a is back with the same connection: remembered, nothing to send",
       {rocksdb_stage("a", busy), rocksdb_stage("b", busy, 2), rocksdb_stage("c", busy, 7)},
       {},
       {}},
  };
  for (const Step& s : steps) {
    INFO(s.name);
    const PolicyOutput out = p.step(silk_input_of(s.stages, s.departed));
    CHECK(out.rules == s.expected);
  }
}

TEST_CASE("silk: a stage absent for long is forgotten", "[policies][silk]") {
  SilkPolicy p = make_silk(kPaper);
  const Load busy = {.fg = 100, .flush = 20};
  (void)p.step(silk_input_of({rocksdb_stage("a", busy), rocksdb_stage("b", busy)}));
  for (int i = 0; i < SilkPolicy::kForgetAfterAbsentSteps; ++i) {
    CHECK(p.step(silk_input_of({rocksdb_stage("b", busy)})).rules.empty());
  }
  CHECK(p.step(silk_input_of({rocksdb_stage("a", busy), rocksdb_stage("b", busy)})).rules.empty());
  for (int i = 0; i <= SilkPolicy::kForgetAfterAbsentSteps; ++i) {
    (void)p.step(silk_input_of({rocksdb_stage("b", busy)}));
  }
  const PolicyOutput out =
      p.step(silk_input_of({rocksdb_stage("a", busy), rocksdb_stage("b", busy)}));
  CHECK(out.rules ==
        std::map<std::string, RulesBatch>{{"a", three_rates(100 * kMiB, 10 * kMiB, 10 * kMiB)}});
}

TEST_CASE("silk: match_labels selects the stages it drives", "[policies][silk]") {
  json cfg = kPaper;
  cfg["match_labels"] = {{"app", "rocksdb"}};
  SilkPolicy p = make_silk(cfg);
  StageView db = rocksdb_stage("db", {.fg = 50});
  db.labels = {{"app", "rocksdb"}, {"tenant", "7"}};
  StageView other = rocksdb_stage("fio", {.fg = 50});
  other.labels = {{"app", "fio"}};
  const PolicyOutput out = p.step(silk_input_of({db, other}));
  CHECK(out.rules.size() == 1);
  CHECK(out.rules.count("db") == 1);
  CHECK_FALSE(out.report["stages"].contains("fio"));
}

TEST_CASE("silk: a name a stage would refuse is reported, and nothing is sent",
          "[policies][silk]") {
  // The configuration takes any non-empty name; a stage takes 1-64 of A-Z a-z 0-9 _ . : -.
  json cfg = kPaper;
  cfg["flush"] = {{"objects", {{{"channel", "fl ush"}, {"object", "limit"}}}}};
  SilkPolicy p = make_silk(cfg);
  StageView st = rocksdb_stage("db", {.flush = 20});
  add_object(st, "fl ush", "limit", "flush", mib(20));
  const PolicyOutput out = p.step(silk_input_of({st}));
  CHECK(out.rules.count("db") == 0);
  CHECK(out.report["stages"]["db"]["error"] ==
        "rules[0].channel: must be a name of 1-64 characters of A-Z a-z 0-9 _ . : -, got "
        "\"fl ush\"");
  CHECK(out.report["stages"]["db"]["rules"] == 3);
}

TEST_CASE("silk: configuration errors name the field", "[policies][silk]") {
  struct Case {
    json config;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"kvs_bandwidth", -5}}, "kvs_bandwidth: must be > 0, got -5"},
      {{{"kvs_bandwidth", "fast"}}, "kvs_bandwidth: must be a number, got \"fast\""},
      {{{"min_bandwidth", 0}}, "min_bandwidth: must be > 0, got 0"},
      {{{"kvs_bandwidth", 100}, {"min_bandwidth", 200}},
       "min_bandwidth: must be <= kvs_bandwidth (100), got 200"},
      {{{"kvs_bandwith", 100}}, "kvs_bandwith: unknown field"},
      {{{"hysteresis", 2}}, "hysteresis: must be >= 0 and <= 1, got 2"},
      {{{"install_layout", 1}}, "install_layout: must be true or false, got 1"},
      {{{"match_labels", {{"app", 3}}}}, "match_labels.app: must be a string, got 3"},
      {{{"foreground", {{"channels", "fg"}}}},
       "foreground.channels: must be an array of strings, got \"fg\""},
      {{{"foreground", {{"origin", {"fg"}}}}}, "foreground.origin: unknown field"},
      {{{"flush", {{"objects", json::array()}}}},
       "flush.objects: must be a non-empty array of {channel, object}, got []"},
      {{{"ln", {{"objects", {{{"channel", "x"}}}}}}}, "ln.objects[0].object: required"},
      {{{"ln", {{"objects", {{{"channel", ""}, {"object", "o"}}}}}}},
       "ln.objects[0].channel: must be a non-empty string, got \"\""},
      {{{"share", "fair"}}, "share: must be one of equal, reclaim, got \"fair\""},
      {{{"ln", {{"split", "random"}}}},
       "ln.split: must be one of each, even, active, got \"random\""},
      {{{"l0", {{"objects", {{{"channel", "flush"}, {"object", "limit"}}}}}}},
       "l0.objects[0]: object flush/limit already serves another flow"},
      {{{"ln", {{"objects", {{{"channel", "foreground"}, {"object", "x"}}}}}}},
       "ln.objects[0].channel: 'foreground' is a foreground channel"},
      {json::array(), "config: must be an object, got []"},
      {{{"directions", {{"read", json::object()}}}}, "directions.write: required"},
      {{{"directions", {{"read", json::object()}, {"write", json::object()}, {"both", 1}}}},
       "directions.both: unknown field"},
      {{{"directions", {{"read", json::object()}, {"write", {{"min_bandwidth", 300 * kMiB}}}}}},
       "directions.write.min_bandwidth: must be <= kvs_bandwidth (209715200), got 314572800"},
      {{{"directions", {{"read", {{"kvs_bandwidth", 0}}}, {"write", json::object()}}}},
       "directions.read.kvs_bandwidth: must be > 0, got 0"},
      {{{"directions", {{"read", json::object()}, {"write", json::object()}}}},
       "flush.objects[0].direction: required with directions (read or write)"},
      {{{"flush", {{"objects", {target("flush", "limit", "write")}}}}},
       "flush.objects[0].direction: only with directions"},
      {{{"flush", {{"objects", {target("flush", "limit", "up")}}}}},
       "flush.objects[0].direction: must be read or write, got \"up\""},
      {[] {
         json c = directional_config();
         c["directions"]["read"]["foreground"] =
             json::array({target("foreground", "read", "read")});
         return c;
       }(),
       "directions.read.foreground[0].direction: implied by the list it is in"},
      {[] {
         json c = directional_config();
         c["directions"]["write"]["foreground"] = {
             {{"channel", "compaction"}, {"object", "l0_write"}}};
         return c;
       }(),
       "directions.write.foreground[0]: object compaction/l0_write serves a background flow"},
      {[] {
         json c = directional_config();
         c["install_layout"] = true;
         return c;
       }(),
       "install_layout: not supported with directions (give the stage its layout)"},
  };
  for (const Case& c : cases) {
    INFO(c.config.dump());
    SilkPolicy p;
    const Status s = p.configure(c.config);
    CHECK(s.code() == Code::kInvalidArgument);
    CHECK(s.message() == c.message);
  }
}

TEST_CASE("silk: describe() round-trips the configuration", "[policies][silk]") {
  SilkPolicy p = make_silk({{"kvs_bandwidth", 300 * kMiB},
                            {"hysteresis", 0.05},
                            {"ln", {{"split", "active"}}},
                            {"share", "reclaim"},
                            {"match_labels", {{"app", "rocksdb"}}}});
  const json d = p.describe();
  CHECK(d["share"] == "reclaim");
  CHECK(d["kvs_bandwidth"] == 300.0 * kMiB);
  CHECK(d["min_bandwidth"] == 10.0 * kMiB);
  CHECK(d["ln"]["split"] == "active");
  CHECK(d["l0"]["origins"] == json({"compaction_L0_L1", "compaction_L0_L0"}));
  SilkPolicy q = make_silk(d);
  CHECK(q.describe() == d);
  CHECK(make_silk_policy()->name() == "silk");
  CHECK_FALSE(d.contains("directions"));
  SECTION("with directions") {
    SilkPolicy r = make_silk(directional_config());
    const json dd = r.describe();
    CHECK(dd["directions"]["write"]["kvs_bandwidth"] == 100.0 * kMiB);
    CHECK(dd["directions"]["read"]["foreground"] ==
          json({{{"channel", "foreground"}, {"object", "read"}}}));
    CHECK(dd["l0"]["objects"][1] == target("compaction", "l0_write", "write"));
    SilkPolicy s = make_silk(dd);
    CHECK(s.describe() == dd);
  }
}

}  // namespace
}  // namespace sluice
