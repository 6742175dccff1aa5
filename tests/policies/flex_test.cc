// The flex policy: Equation 2 and the LSM background amplification from the
// level count (§4.2.2's 46 at four levels) against FlexEngine's numbers,
// Equation 3 over a sliding ingest window, Equation 1 (RocksDB's auto-tuned
// limiter) and its slow climb, the configuration's errors, and the policy's
// steps over hand-built stage statistics.
#include "flex/flex.h"
#include "flex/flex_math.h"
#include "test_util.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

namespace sluice {
namespace {

using nlohmann::json;

constexpr double kKiB = 1024;
constexpr double kMiBd = 1024 * kKiB;
using sluice::testing::kSecond;

// A partition stage: channels fg and bg with their objects, `wal` and
// `flush` bytes over `interval`, and `waited` requests that waited in the
// object "io" of channel "io" (when it has one).
StageView partition_stage(const std::string& name, std::uint64_t wal, std::uint64_t flush,
                          std::int64_t interval = kSecond, std::int64_t connected_at = 1,
                          bool with_io = false, std::uint64_t waited = 0) {
  StageView st;
  st.name = name;
  st.connected_at_ns = connected_at;
  st.stats.stage = name;
  st.stats.interval_ns = interval;
  for (const char* ch : {"fg", "bg", "node"}) {
    ChannelStats c;
    c.name = ch;
    if (std::string(ch) == "fg" && wal > 0) c.by_origin["wal"] = Counters{1, wal};
    if (std::string(ch) == "bg" && flush > 0) c.by_origin["flush"] = Counters{1, flush};
    ObjectStats o;
    o.name = ch;
    o.type = "prio-bucket";
    c.objects.push_back(o);
    st.stats.channels.push_back(c);
    ChannelInfo ci;
    ci.name = ch;
    ci.objects.push_back(ObjectInfo{ch, "prio-bucket", json::array(), false, -1, 0, {}});
    st.info.channels.push_back(ci);
  }
  if (with_io) {
    ChannelStats c;
    c.name = "io";
    ObjectStats o;
    o.name = "io";
    o.type = "prio-bucket";
    o.wait.buckets[0] = 5;        // granted at once
    o.wait.buckets[10] = waited;  // waited
    c.objects.push_back(o);
    st.stats.channels.push_back(c);
    ChannelInfo ci;
    ci.name = "io";
    ci.objects.push_back(ObjectInfo{"io", "prio-bucket", json::array(), false, -1, 0, {}});
    st.info.channels.push_back(ci);
  }
  return st;
}

PolicyInput flex_input_of(std::vector<StageView> stages, std::int64_t now = kSecond) {
  PolicyInput in;
  in.now_ns = now;
  in.interval_ns = kSecond;
  in.stages = std::move(stages);
  return in;
}

// §5.3.2's partition: 3K WCUs of 1 KiB per second, reads of 4 KiB RCUs with
// RAF 4 (§4.2.1), four levels.
json flex_paper_config(double window_s = 60) {
  return {{"node", {{"bandwidth", 200 * kMiBd}}},
          {"partitions",
           {{{"name", "p1"},
             {"stage", "db1"},
             {"rcu_max_per_s", 3000},
             {"rcu_max_size", 4 * kKiB},
             {"read_amplification", 4},
             {"wcu_max_per_s", 3000},
             {"wcu_max_size", kKiB},
             {"background_amplification", "levels"},
             {"levels", 4},
             {"ingest_window_s", window_s}}}}};
}

// The configure rules of a batch, as (channel/object -> rate).
std::map<std::string, double> rates_in(const RulesBatch& b) {
  std::map<std::string, double> out;
  for (const json& r : b.value().at("rules")) {
    CHECK(r.at("rule") == "configure");
    out[r.at("channel").get<std::string>() + "/" + r.at("object").get<std::string>()] =
        r.at("config").at("rate").get<double>();
  }
  return out;
}

}  // namespace

TEST_CASE("flex: LSM-BA from the level count, 46 at four levels (§4.2.2)", "[flex]") {
  struct Row {
    int levels;
    double write, read, total;
  };
  const std::vector<Row> rows = {
      {2, 3, 0, 3}, {3, 14, 10, 24}, {4, 25, 21, 46}, {5, 36, 32, 68}, {7, 58, 54, 112}};
  for (const Row& r : rows) {
    const flex::LsmAmplification a = flex::lsm_amplification(r.levels);
    INFO("levels " << r.levels);
    CHECK(a.write == r.write);
    CHECK(a.read == r.read);
    CHECK(a.total == r.total);
  }
}

TEST_CASE("flex: Equation 2, the foreground reservation", "[flex]") {
  struct Row {
    double rcu, rcu_size, raf, wcu, wcu_size, want;
  };
  const std::vector<Row> rows = {
      // 3K RCUs of 4 KiB at RAF 4 plus 3K WCUs of 1 KiB: 48 + 3 MiB/s (KiB units).
      {3000, 4 * kKiB, 4, 3000, kKiB, 3000 * 4 * kKiB * 4 + 3000 * kKiB},
      {3000, 4 * kKiB, 4, 0, kKiB, 48000 * kKiB},
      {0, 4 * kKiB, 4, 3000, kKiB, 3000 * kKiB},
      {100, 8 * kKiB, 1, 50, 2 * kKiB, 900 * kKiB},
  };
  for (const Row& r : rows) {
    CHECK(flex::foreground_rate(r.rcu, r.rcu_size, r.raf, r.wcu, r.wcu_size) == r.want);
  }
  CHECK(flex::foreground_rate(3000, 4 * kKiB, 4, 3000, kKiB) == 51'000 * kKiB);
}

TEST_CASE("flex: Equation 3, the background rate, with its floor", "[flex]") {
  // §5.3.2: 3K WCUs of 1 KiB = 3000 KiB/s; with LSM-BA 20, 60000 KiB/s.
  CHECK(flex::background_rate(3000 * kKiB, 20, kMiBd) == 60'000 * kKiB);
  CHECK(flex::background_rate(3000 * kKiB, 46, kMiBd) == 138'000 * kKiB);
  CHECK(flex::background_rate(0, 46, kMiBd) == kMiBd);
  CHECK(flex::background_rate(10 * kKiB, 46, kMiBd) == kMiBd);
}

TEST_CASE("flex: the ingest window slides", "[flex]") {
  flex::IngestWindow one(kSecond);
  one.add(kSecond, 3 * kMiBd);
  CHECK(one.average() == 3 * kMiBd);
  one.add(kSecond, 9 * kMiBd);
  CHECK(one.average() == 9 * kMiBd);  // a window of one interval: the last one's

  flex::IngestWindow w(10 * kSecond);
  CHECK(w.average() == 0);
  for (int i = 0; i < 5; ++i) w.add(kSecond, kMiBd);
  CHECK(w.average() == kMiBd);  // not full yet: the average over what it holds
  CHECK(w.covered_ns() == 5 * kSecond);
  for (int i = 0; i < 10; ++i) w.add(kSecond, 3 * kMiBd);
  CHECK(w.average() == 3 * kMiBd);  // the first five have left it
  CHECK(w.samples() == 10);
  w.add(kSecond, 13 * kMiBd);  // one step moves it by a tenth of the change
  CHECK(w.average() == Approx(4 * kMiBd));
}

TEST_CASE("flex: Equation 1, RocksDB's auto-tuner, one tune", "[flex][auto-tuned]") {
  struct Row {
    std::int64_t drains, periods, rate_after;
  };
  // From max / 2 = 50'000'000, in whole bytes per second as RocksDB computes.
  const std::int64_t max = 100'000'000;
  const std::vector<Row> rows = {
      {0, 100, 5'000'000},      // never drained: max / 20 at once
      {49, 100, 47'619'047},    // < 50%: down to 100/105
      {50, 100, 50'000'000},    // 50..90%: unchanged
      {90, 100, 50'000'000},    //
      {91, 100, 52'500'000},    // > 90%: up 5%
      {100, 1000, 47'619'047},  // 10% of a longer span: down
  };
  for (const Row& r : rows) {
    flex::AutoTuner t(max);
    CHECK(t.rate() == max / 2);  // it starts at half the maximum
    CHECK(t.tune(r.drains, r.periods) == r.rate_after);
  }
  // The bounds.
  flex::AutoTuner low(max);
  low.tune(0, 100);
  CHECK(low.tune(10, 100) == 5'000'000);  // never below max / 20
  flex::AutoTuner high(max);
  for (int i = 0; i < 20; ++i) high.tune(100, 100);
  CHECK(high.rate() == max);  // never above max
  CHECK(high.tunes() == 20);
  // advance() tunes once per 100 refill periods, over what they drained.
  flex::AutoTuner steps(max);
  for (int i = 0; i < 9; ++i) CHECK(steps.advance(10, 10) == 0);
  CHECK(steps.rate() == max / 2);
  CHECK(steps.advance(10, 10) == 1);
  CHECK(steps.rate() == 52'500'000);
}

TEST_CASE("flex: the auto-tuner's slow climb from an idle spell to full demand",
          "[flex][auto-tuned]") {
  // A partition idle for 100 refills (10 s at 100 ms) falls to max / 20; then
  // demand is max, so every refill drains and each tune adds 5%.
  const std::int64_t max = 150 * static_cast<std::int64_t>(kMiBd);
  flex::AutoTuner t(max);
  CHECK(t.advance(100, 0) == 1);
  CHECK(t.rate() == max / 20);
  std::int64_t refills = 0;
  std::vector<std::int64_t> rates;
  while (t.rate() < 0.95 * static_cast<double>(max)) {
    t.advance(10, 10);  // one control step of 1 s: 10 refills, all drained
    refills += 10;
    rates.push_back(t.rate());
  }
  // 61 tunes of +5% (1.05^61 = 19.6 > 0.95 / 0.05 = 19): 6100 refills, 610 s
  // at 100 ms refills (61 s at 10 ms, the paper's "62 seconds"). After the
  // paper's 28 s (280 refills: 2 tunes) it serves 5.5% of max.
  CHECK(refills == 6100);
  CHECK(static_cast<double>(refills) * 0.1 == Approx(610));
  CHECK(rates[27] == max / 20 * 105 / 100 * 105 / 100);
  CHECK(static_cast<double>(rates[27]) / static_cast<double>(max) == Approx(0.0551).epsilon(0.01));
  CHECK(t.tunes() == 1 + 61);
}

TEST_CASE("flex config: errors name the field", "[flex]") {
  struct Case {
    json config;
    std::string message;
  };
  json base = flex_paper_config();
  auto with = [&](const std::string& pointer, const json& v) {
    json c = base;
    c[json::json_pointer(pointer)] = v;
    return c;
  };
  json no_partitions = base;
  no_partitions.erase("partitions");
  json two = base;
  two["partitions"].push_back(base["partitions"][0]);
  json two_stages = two;
  two_stages["partitions"][1]["name"] = "p2";
  const std::vector<Case> cases = {
      {no_partitions, "partitions: must be a non-empty array"},
      {with("/partitions/0/rcu_max_size", 0), "partitions[0].rcu_max_size: must be > 0, got 0"},
      {with("/partitions/0/read_amplification", 0.5),
       "partitions[0].read_amplification: must be >= 1"},
      {with("/partitions/0/levels", 1), "partitions[0].levels: must be an integer from 2 to 16"},
      {with("/partitions/0/background_amplification", "lots"),
       "partitions[0].background_amplification: must be a number"},
      {with("/partitions/0/ingest_window_s", 0), "partitions[0].ingest_window_s: must be > 0"},
      {with("/partitions/0/colour", 1), "partitions[0].colour: unknown field"},
      {with("/node/bandwidth", -1), "node.bandwidth: must be >= 1"},
      {with("/method", "fast"), "method: must be one of flex, auto-tuned"},
      {with("/nodes", 1), "nodes: unknown field"},
      {two, "partitions[1].name: 'p1' names another partition too"},
      {two_stages, "partitions[1].stage: 'db1' is another partition's stage"},
  };
  for (const Case& k : cases) {
    INFO(k.config.dump());
    auto p = make_policy("flex", k.config);
    REQUIRE_FALSE(p.is_ok());
    CHECK_THAT(p.status().message(), Catch::Matchers::Contains(k.message));
  }
  json missing = base;
  missing["partitions"][0].erase("stage");
  CHECK_THAT(make_policy("flex", missing).status().message(),
             Catch::Matchers::Contains("partitions[0].stage: required"));
}

TEST_CASE("flex: explain gives each partition's rates and the node's (policy check)", "[flex]") {
  auto p = make_policy("flex", flex_paper_config());
  REQUIRE(p.is_ok());
  const json e = (*p)->explain();
  const json& p1 = e.at("partitions").at("p1");
  CHECK(p1.at("foreground_rate") == 51'000 * kKiB);
  CHECK(p1.at("lsm_ba") == 46);
  CHECK(p1.at("lsm_write_amplification") == 25);
  CHECK(p1.at("lsm_read_amplification") == 21);
  CHECK(p1.at("background_rate") == kMiBd);  // no ingest seen yet: the floor
  CHECK(e.at("node_rate") == 200 * kMiBd);
  CHECK(e.at("config").at("partitions")[0].at("ingest_window_s") == 60);
}

TEST_CASE("flex: a step sets fg by Equation 2, bg by Equation 3 and the node rate", "[flex]") {
  FlexPolicy p;
  REQUIRE(p.configure(flex_paper_config(1)).is_ok());
  // Admission: the rates known so far, before the first request.
  PolicyInput hello = flex_input_of({partition_stage("db1", 0, 0)});
  const auto admitted = rates_in(p.admit(hello));
  CHECK(admitted.at("fg/fg") == 51'000 * kKiB);
  CHECK(admitted.at("bg/bg") == kMiBd);
  CHECK(admitted.at("node/node") == 200 * kMiBd);

  // 3000 KiB/s of WAL writes: bg = 3000 KiB x 46.
  PolicyOutput out = p.step(flex_input_of({partition_stage("db1", 3000 * 1024, 0)}));
  auto rates = rates_in(out.rules.at("db1"));
  CHECK(rates.size() == 1);  // fg and node unchanged since admission: not sent again
  CHECK(rates.at("bg/bg") == 3000 * kKiB * 46);
  CHECK(out.report.at("partitions").at("p1").at("ingest_origin") == "wal");
  // The load changes: with a window of one interval, bg follows within one step.
  out = p.step(flex_input_of({partition_stage("db1", 1000 * 1024, 0)}, 2 * kSecond));
  CHECK(rates_in(out.rules.at("db1")).at("bg/bg") == 1000 * kKiB * 46);
  // Unchanged: nothing sent.
  out = p.step(flex_input_of({partition_stage("db1", 1000 * 1024, 0)}, 3 * kSecond));
  CHECK(out.rules.count("db1") == 0);
  // Reconnected: everything again.
  out = p.step(flex_input_of({partition_stage("db1", 1000 * 1024, 0, kSecond, 7)}, 4 * kSecond));
  CHECK(rates_in(out.rules.at("db1")).size() == 3);
}

TEST_CASE("flex: with the default 60 s window, bg starts moving in the first step", "[flex]") {
  FlexPolicy p;
  REQUIRE(p.configure(flex_paper_config()).is_ok());
  for (int i = 0; i < 60; ++i) {
    (void)p.step(flex_input_of({partition_stage("db1", 1000 * 1024, 0)}, (i + 1) * kSecond));
  }
  CHECK(p.background_rate(0) == Approx(1000 * kKiB * 46));
  (void)p.step(flex_input_of({partition_stage("db1", 61000 * 1024, 0)}, 61 * kSecond));
  // (59 x 1000 + 61000) / 60 = 2000 KiB/s.
  CHECK(p.ingest(0) == Approx(2000 * kKiB));
  CHECK(p.background_rate(0) == Approx(2000 * kKiB * 46));
}

TEST_CASE("flex: without a WAL, the flush bytes are the ingest", "[flex]") {
  FlexPolicy p;
  REQUIRE(p.configure(flex_paper_config(1)).is_ok());
  (void)p.step(flex_input_of({partition_stage("db1", 0, 2 * 1024 * 1024)}));
  CHECK(p.ingest(0) == 2 * kMiBd);
  CHECK(p.background_rate(0) == 2 * kMiBd * 46);
}

TEST_CASE("flex: method auto-tuned drives one bucket per partition by Equation 1",
          "[flex][auto-tuned]") {
  json c = flex_paper_config();
  c["method"] = "auto-tuned";
  c["partitions"][0]["max_rate"] = 100 * kMiBd;
  FlexPolicy p;
  REQUIRE(p.configure(c).is_ok());
  CHECK(p.auto_tuned_rate(0) == 50 * kMiBd);  // max / 2 at the start
  auto hello = rates_in(p.admit(flex_input_of({partition_stage("db1", 0, 0, kSecond, 1, true)})));
  CHECK(hello.at("io/io") == 50 * kMiBd);
  CHECK(hello.count("fg/fg") == 0);
  // Ten idle seconds (100 refills): down to max / 20.
  for (int i = 0; i < 10; ++i) {
    (void)p.step(
        flex_input_of({partition_stage("db1", 0, 0, kSecond, 1, true, 0)}, (i + 1) * kSecond));
  }
  CHECK(p.auto_tuned_rate(0) == std::floor(100 * kMiBd / 20));
  // Every refill drains from now on: +5% every 10 s.
  for (int i = 0; i < 10; ++i) {
    (void)p.step(
        flex_input_of({partition_stage("db1", 0, 0, kSecond, 1, true, 50)}, (i + 11) * kSecond));
  }
  CHECK(p.auto_tuned_rate(0) == std::floor(std::floor(100 * kMiBd / 20) * 105 / 100));
}

}  // namespace sluice
