// SILK over a stage's layout: which channels and objects it drives, and the
// per-direction variant (Algorithm 1 for reads and for writes).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "silk_test_util.h"

namespace sluice {
namespace {

using nlohmann::json;

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

}  // namespace
}  // namespace sluice
