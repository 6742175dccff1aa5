// The SILK policy (PAIO Algorithm 1): tables of collected statistics in,
// rules out.
#include "silk.h"

#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace sluice {
namespace {

using nlohmann::json;

using sluice::testing::kMiB;
using sluice::testing::kSecond;

// ---------------------------------------------------------------------------
// Building the policy's input.

ChannelStats& stats_channel(StageView& st, const std::string& channel) {
  for (auto& c : st.stats.channels) {
    if (c.name == channel) return c;
  }
  st.stats.channels.push_back({});
  st.stats.channels.back().name = channel;
  return st.stats.channels.back();
}

ChannelInfo& info_channel(StageView& st, const std::string& channel) {
  for (auto& c : st.info.channels) {
    if (c.name == channel) return c;
  }
  st.info.channels.push_back({});
  st.info.channels.back().name = channel;
  return st.info.channels.back();
}

// An object that moved `bytes` of `origin` in the last interval (1 s), with
// `waiters` requests queued at collect time.
void add_object(StageView& st, const std::string& channel, const std::string& object,
                const std::string& origin, std::uint64_t bytes, std::uint64_t waiters = 0,
                const std::string& type = "drl") {
  ChannelStats& c = stats_channel(st, channel);
  ObjectStats* o = nullptr;
  for (auto& existing : c.objects) {
    if (existing.name == object) o = &existing;
  }
  if (o == nullptr) {
    c.objects.push_back({});
    o = &c.objects.back();
    o->name = object;
    o->type = type;
    o->state = {{"waiters", 0}};
    ChannelInfo& ci = info_channel(st, channel);
    ObjectInfo oi;
    oi.name = object;
    oi.type = type;
    oi.match = json::array();
    ci.objects.push_back(std::move(oi));
  }
  if (bytes > 0) {
    o->total.add({bytes / 4096 + 1, bytes});
    o->by_origin[origin].add({bytes / 4096 + 1, bytes});
    c.total.add({bytes / 4096 + 1, bytes});
    c.by_origin[origin].add({bytes / 4096 + 1, bytes});
    st.stats.total.add({bytes / 4096 + 1, bytes});
  }
  o->state["waiters"] = o->state["waiters"].get<std::uint64_t>() + waiters;
}

// What a RocksDB instance did in one second, in MiB, under the default layout.
struct Load {
  double fg = 0;
  double flush = 0;
  double l0 = 0;
  double ln = 0;
  std::uint64_t flush_waiters = 0;
  std::uint64_t l0_waiters = 0;
  std::uint64_t ln_waiters = 0;
};

std::uint64_t mib(double v) {
  return static_cast<std::uint64_t>(v * kMiB);
}

StageView rocksdb_stage(const std::string& name, const Load& load, std::int64_t connected = 1) {
  StageView st;
  st.name = name;
  st.connected_at_ns = connected;
  st.info.name = name;
  st.info.classifiers = {"origin"};
  st.stats.stage = name;
  st.stats.interval_ns = kSecond;
  add_object(st, "foreground", "monitor", "foreground", mib(load.fg), 0, "noop");
  add_object(st, "flush", "limit", "flush", mib(load.flush), load.flush_waiters);
  add_object(st, "compaction_l0", "limit", "compaction_L0_L1", mib(load.l0), load.l0_waiters);
  add_object(st, "compaction_ln", "limit", "compaction_LN", mib(load.ln), load.ln_waiters);
  return st;
}

PolicyInput silk_input_of(std::vector<StageView> stages, std::vector<std::string> departed = {}) {
  PolicyInput in;
  in.now_ns = 10 * kSecond;
  in.interval_ns = kSecond;
  in.stages = std::move(stages);
  in.departed = std::move(departed);
  return in;
}

json configure(const std::string& channel, const std::string& object, std::int64_t rate) {
  return {{"rule", "configure"},
          {"channel", channel},
          {"object", object},
          {"config", {{"rate", rate}}}};
}

json batch(json rules) {
  return {{"version", 1}, {"rules", std::move(rules)}};
}

// batch({rule, ...}): the rules as an array, one rule or many (a braced list
// of one json is that json itself to clang, an array to g++).
json batch(std::initializer_list<json> rules) {
  json list = json::array();
  for (const json& r : rules) list.push_back(r);
  return batch(std::move(list));
}

json three_rates(std::int64_t flush, std::int64_t l0, std::int64_t ln) {
  return batch({configure("flush", "limit", flush), configure("compaction_l0", "limit", l0),
                configure("compaction_ln", "limit", ln)});
}

SilkPolicy make_silk(const json& config) {
  SilkPolicy p;
  const Status s = p.configure(config);
  INFO(s.to_string());
  REQUIRE(s.is_ok());
  return p;
}

const json kPaper = {{"kvs_bandwidth", 200 * kMiB}, {"min_bandwidth", 10 * kMiB}};

// ---------------------------------------------------------------------------

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

TEST_CASE("silk: layout", "[policies][silk]") {
  SECTION("install_layout creates the layout on a bare stage, then only tunes it") {
    json cfg = kPaper;
    cfg["install_layout"] = true;
    SilkPolicy p = make_silk(cfg);
    StageView bare;
    bare.name = "db";
    bare.connected_at_ns = 5;
    bare.stats.interval_ns = kSecond;
    bare.stats.unclassified = {100, mib(50)};  // everything passed through so far
    const PolicyOutput out = p.step(silk_input_of({bare}));
    const json expected = batch({
        {{"rule", "differentiate"}, {"classifiers", {"origin"}}},
        {{"rule", "create_channel"}, {"channel", "flush"}, {"match", {{"origin", {"flush"}}}}},
        {{"rule", "create_object"},
         {"channel", "flush"},
         {"object", "limit"},
         {"type", "drl"},
         {"config", {{"rate", 10 * kMiB}}}},
        {{"rule", "create_channel"},
         {"channel", "compaction_l0"},
         {"match", {{"origin", {"compaction_L0_L1", "compaction_L0_L0"}}}}},
        {{"rule", "create_object"},
         {"channel", "compaction_l0"},
         {"object", "limit"},
         {"type", "drl"},
         {"config", {{"rate", 10 * kMiB}}}},
        {{"rule", "create_channel"},
         {"channel", "compaction_ln"},
         {"match", {{"origin", {"compaction_LN"}}}}},
        {{"rule", "create_object"},
         {"channel", "compaction_ln"},
         {"object", "limit"},
         {"type", "drl"},
         {"config", {{"rate", 150 * kMiB}}}},
        {{"rule", "create_channel"}, {"channel", "foreground"}, {"default", true}},
        {{"rule", "create_object"},
         {"channel", "foreground"},
         {"object", "monitor"},
         {"type", "noop"},
         {"config", json::object()}},
    });
    CHECK(out.rules.at("db") == expected);
    // Next step the stage reports the layout and the same load: nothing to send.
    const PolicyOutput again = p.step(silk_input_of({rocksdb_stage("db", {.fg = 50}, 5)}));
    CHECK(again.rules.empty());
  }
  SECTION("install_layout adds only what is missing") {
    json cfg = kPaper;
    cfg["install_layout"] = true;
    SilkPolicy p = make_silk(cfg);
    StageView st;
    st.name = "db";
    st.stats.interval_ns = kSecond;
    st.info.classifiers = {"origin"};
    add_object(st, "flush", "limit", "flush", mib(20));
    add_object(st, "foreground", "monitor", "foreground", mib(50), 0, "noop");
    const PolicyOutput out = p.step(silk_input_of({st}));
    CHECK(out.rules.at("db") ==
          batch({configure("flush", "limit", 150 * kMiB),
                 {{"rule", "create_channel"},
                  {"channel", "compaction_l0"},
                  {"match", {{"origin", {"compaction_L0_L1", "compaction_L0_L0"}}}}},
                 {{"rule", "create_object"},
                  {"channel", "compaction_l0"},
                  {"object", "limit"},
                  {"type", "drl"},
                  {"config", {{"rate", 10 * kMiB}}}},
                 {{"rule", "create_channel"},
                  {"channel", "compaction_ln"},
                  {"match", {{"origin", {"compaction_LN"}}}}},
                 {{"rule", "create_object"},
                  {"channel", "compaction_ln"},
                  {"object", "limit"},
                  {"type", "drl"},
                  {"config", {{"rate", 10 * kMiB}}}}}));
  }
  SECTION("a stage routed by other classifiers is not re-laid out") {
    json cfg = kPaper;
    cfg["install_layout"] = true;
    SilkPolicy p = make_silk(cfg);
    StageView st;
    st.name = "db";
    st.stats.interval_ns = kSecond;
    st.info.classifiers = {"tenant"};
    add_object(st, "flush", "limit", "flush", mib(20));
    const PolicyOutput out = p.step(silk_input_of({st}));
    CHECK(out.rules.at("db") == batch({configure("flush", "limit", 200 * kMiB)}));
    CHECK(out.report["stages"]["db"].contains("layout_conflict"));
    CHECK(out.report["stages"]["db"]["missing"] ==
          json({"compaction_l0/limit", "compaction_ln/limit"}));
  }
  SECTION("without install_layout, missing objects are reported, not configured") {
    SilkPolicy p = make_silk(kPaper);
    StageView st;
    st.name = "db";
    st.stats.interval_ns = kSecond;
    const PolicyOutput out = p.step(silk_input_of({st}));
    CHECK(out.rules.empty());
    CHECK(out.report["stages"]["db"]["missing"] ==
          json({"flush/limit", "compaction_l0/limit", "compaction_ln/limit"}));
  }
}

// ---------------------------------------------------------------------------
// Per direction: a device with a read and a write budget (blkio throttles each
// direction separately). Every background channel has a read and a write DRL
// object; the foreground channel a read and a write monitor.

struct DirLoad {  // MiB/s in the last interval, per direction
  double fg_r = 0, fg_w = 0;
  double fl_r = 0, fl_w = 0;
  double l0_r = 0, l0_w = 0;
  double ln_r = 0, ln_w = 0;
  std::uint64_t fl_w_waiters = 0;  // flush held at its write limit
  std::uint64_t l0_r_waiters = 0;  // L0 compaction held at its read limit
  std::uint64_t ln_w_waiters = 0;
};

StageView directional_stage(const DirLoad& d) {
  StageView st;
  st.name = "db";
  st.connected_at_ns = 1;
  st.info.name = "db";
  st.info.classifiers = {"origin"};
  st.stats.stage = "db";
  st.stats.interval_ns = kSecond;
  add_object(st, "foreground", "read", "foreground", mib(d.fg_r), 0, "noop");
  add_object(st, "foreground", "write", "foreground", mib(d.fg_w), 0, "noop");
  add_object(st, "flush", "read", "flush", mib(d.fl_r));
  add_object(st, "flush", "write", "flush", mib(d.fl_w), d.fl_w_waiters);
  add_object(st, "compaction", "l0_read", "compaction_L0_L1", mib(d.l0_r), d.l0_r_waiters);
  add_object(st, "compaction", "l0_write", "compaction_L0_L1", mib(d.l0_w));
  add_object(st, "compaction", "ln_read", "compaction_LN", mib(d.ln_r));
  add_object(st, "compaction", "ln_write", "compaction_LN", mib(d.ln_w), d.ln_w_waiters);
  return st;
}

json target(const std::string& channel, const std::string& object, const std::string& dir) {
  return {{"channel", channel}, {"object", object}, {"direction", dir}};
}

// KVS_B 200 MiB/s read and 100 MiB/s write; min_B 10 and 5.
json directional_config() {
  return {
      {"kvs_bandwidth", 200 * kMiB},
      {"min_bandwidth", 10 * kMiB},
      {"directions",
       {{"read",
         {{"kvs_bandwidth", 200 * kMiB},
          {"min_bandwidth", 10 * kMiB},
          {"foreground", {{{"channel", "foreground"}, {"object", "read"}}}}}},
        {"write",
         {{"kvs_bandwidth", 100 * kMiB},
          {"min_bandwidth", 5 * kMiB},
          {"foreground", {{{"channel", "foreground"}, {"object", "write"}}}}}}}},
      {"foreground", {{"channels", {"foreground"}}}},
      {"flush",
       {{"origins", {"flush"}},
        {"objects", {target("flush", "read", "read"), target("flush", "write", "write")}}}},
      {"l0",
       {{"origins", {"compaction_L0_L1", "compaction_L0_L0"}},
        {"objects",
         {target("compaction", "l0_read", "read"), target("compaction", "l0_write", "write")}}}},
      {"ln",
       {{"origins", {"compaction_LN"}},
        {"objects",
         {target("compaction", "ln_read", "read"), target("compaction", "ln_write", "write")}}}}};
}

// The six rates, read objects first (flush, L0, LN), then write objects.
json six_rates(double fl_r, double l0_r, double ln_r, double fl_w, double l0_w, double ln_w) {
  return batch(
      {configure("flush", "read", mib(fl_r)), configure("compaction", "l0_read", mib(l0_r)),
       configure("compaction", "ln_read", mib(ln_r)), configure("flush", "write", mib(fl_w)),
       configure("compaction", "l0_write", mib(l0_w)),
       configure("compaction", "ln_write", mib(ln_w))});
}

TEST_CASE("silk: per direction, Algorithm 1 in each direction", "[policies][silk]") {
  struct Case {
    std::string name;
    DirLoad load;
    int line_r, line_w;       // of Algorithm 1, per direction
    double fl_r, l0_r, ln_r;  // MiB/s expected, read objects
    double fl_w, l0_w, ln_w;  // and write objects
  };
  // Read: KVS_B 200, min_B 10. Write: KVS_B 100, min_B 5.
  // clang-format off
  const std::vector<Case> cases = {
    {"idle KVS: everything to LN in both directions",
     {}, 11, 11,                                           10, 10, 200,   5, 5, 100},
    {"no background work: LN gets each direction's left_B",
     {.fg_r = 50, .fg_w = 20}, 11, 11,                     10, 10, 150,   5, 5, 80},
    {"read-heavy, WAL off: reads fill the read budget, writes idle; L0 compaction",
     {.fg_r = 180, .l0_r = 10, .l0_w = 10}, 9, 9,          10, 20, 10,    5, 100, 5},
    {"flush writes only: the read direction gives L0 all of left_B",
     {.fg_r = 100, .fl_w = 30, .l0_r = 10, .l0_w = 10}, 9, 5,
                                                           10, 100, 10,   50, 50, 5},
    {"flush only, no reads: line 7 in write, line 11 in read",
     {.fg_r = 40, .fl_w = 30}, 11, 7,                      10, 10, 160,   100, 5, 5},
    {"fg above KVS_B in both directions: min_B everywhere",
     {.fg_r = 250, .fg_w = 150, .l0_r = 5, .l0_w = 5}, 9, 9,
                                                           10, 10, 10,    5, 5, 5},
    {"fg above KVS_B, no background",
     {.fg_r = 250, .fg_w = 150}, 11, 11,                   10, 10, 10,    5, 5, 5},
    {"fg at KVS_B - min_B in writes only",
     {.fg_r = 100, .fg_w = 95, .fl_w = 1}, 11, 7,          10, 10, 100,   5, 5, 5},
    {"flush held at its write limit: waiters are demand",
     {.fg_r = 100, .fl_w_waiters = 3}, 11, 7,              10, 10, 100,   100, 5, 5},
    {"L0 waiting on reads, no bytes: active in reads only",
     {.fg_r = 100, .l0_r_waiters = 1}, 9, 11,              10, 100, 10,   5, 5, 100},
    {"LN waiters keep line 11",
     {.fg_r = 100, .ln_w_waiters = 2}, 11, 11,             10, 10, 100,   5, 5, 100},
  };
  // clang-format on
  for (const Case& c : cases) {
    INFO(c.name);
    SilkPolicy p = make_silk(directional_config());
    const PolicyOutput out = p.step(silk_input_of({directional_stage(c.load)}));
    REQUIRE(out.rules.count("db") == 1);
    CHECK(out.rules.at("db") == six_rates(c.fl_r, c.l0_r, c.ln_r, c.fl_w, c.l0_w, c.ln_w));
    const json& rep = out.report["stages"]["db"];
    CHECK(rep["directions"]["read"]["line"] == c.line_r);
    CHECK(rep["directions"]["write"]["line"] == c.line_w);
    CHECK(rep["directions"]["read"]["fg"].get<double>() == Approx(c.load.fg_r * kMiB));
    CHECK(rep["directions"]["write"]["fg"].get<double>() == Approx(c.load.fg_w * kMiB));
    CHECK(rep["fg"].get<double>() == Approx((c.load.fg_r + c.load.fg_w) * kMiB));
    CHECK(rep["rates"]["l0"].get<double>() == Approx((c.l0_r + c.l0_w) * kMiB));
  }
}

TEST_CASE("silk: per direction, what counts and what does not", "[policies][silk]") {
  SECTION("bytes of the flow's origin elsewhere are not demand in any direction") {
    // Per-origin counts carry no direction: a flush seen only by origin (in
    // the foreground channel) does not make the flush flow active.
    SilkPolicy p = make_silk(directional_config());
    StageView st = directional_stage({.fg_r = 100});
    add_object(st, "foreground", "read", "flush", mib(30), 0, "noop");
    const PolicyOutput out = p.step(silk_input_of({st}));
    // Fg read = 100 + 30 (the flush's bytes are in the read monitor): left 70.
    CHECK(out.rules.at("db") == six_rates(10, 10, 70, 5, 5, 100));
  }
  SECTION("unclassified requests and other channels are not foreground") {
    SilkPolicy p = make_silk(directional_config());
    StageView st = directional_stage({.fg_r = 50});
    st.stats.unclassified = {10, mib(20)};
    add_object(st, "other", "count", "manifest", mib(40), 0, "noop");
    const PolicyOutput out = p.step(silk_input_of({st}));
    CHECK(out.rules.at("db") == six_rates(10, 10, 150, 5, 5, 100));
  }
  SECTION("the default configuration stays one KVS_B over both directions") {
    // The same load under the paper's policy (no directions, one object per
    // flow): Fg = 180 + 0, left_B = 20 for L0's reads and writes together.
    SilkPolicy p = make_silk({{"kvs_bandwidth", 200 * kMiB}, {"min_bandwidth", 10 * kMiB}});
    const PolicyOutput out = p.step(silk_input_of({rocksdb_stage("db", {.fg = 180, .l0 = 20})}));
    CHECK(out.rules.at("db") == three_rates(10 * kMiB, 20 * kMiB, 10 * kMiB));
    CHECK_FALSE(out.report["stages"]["db"].contains("directions"));
  }
  SECTION("hysteresis per object: only the direction that moved is resent") {
    SilkPolicy p = make_silk(directional_config());
    (void)p.step(silk_input_of({directional_stage({.fg_r = 100, .fg_w = 20})}));
    const PolicyOutput out = p.step(silk_input_of({directional_stage({.fg_r = 100, .fg_w = 40})}));
    CHECK(out.rules.at("db") == batch({configure("compaction", "ln_write", mib(60))}));
  }
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
