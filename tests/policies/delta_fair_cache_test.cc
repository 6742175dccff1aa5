// Delta Fair Sharing for a read cache: Equation 2 against FairDB's published
// numbers (§7.2.2, Table 6) and more cases, then the policy's `cache` member:
// its configuration, and its steps over hand-built stage statistics.
//
// Units: the paper writes MB and GB; these tables use MiB and GiB, in which
// its examples are exact (10 GiB / 32 = 320 MiB; 320 MiB/s * 750 ms = 240 MiB).
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "delta-fair/delta_fair.h"
#include "delta-fair/delta_fair_math.h"
#include "delta_fair_test_util.h"

namespace sluice {
namespace {

using delta_fair::CacheModel;
using delta_fair::CacheReservation;
using nlohmann::json;
using namespace delta_fair_test;  // NOLINT: the tests' shared units and helpers

CacheModel cache_model(std::uint64_t c, double r, double amp, double delta, int k) {
  CacheModel m;
  m.capacity = c;
  m.refill_bandwidth = r;
  m.read_amplification = amp;
  m.delta_ms = delta;
  m.k = k;
  return m;
}

// §7.2.2: 10 GiB shared by 32 equal readers (f = 320 MiB), R_read / AMP =
// 320 MiB/s.
CacheReservation paper_cache(double delta, int k, double r = 320.0 * MiB, double amp = 1) {
  return delta_fair::reserve_cache(cache_model(10 * GiB, r, amp, delta, k), equal(32));
}

// ---------------------------------------------------------------------------
// Equation 2.

TEST_CASE("§7.2.2: f = 320 MiB, 320 MiB/s, k = 1, δ = 250 ms: 240 MiB reserved per tenant",
          "[delta_fair][cache][math]") {
  // R_read / AMP as one rate, as the disk's 1280 MiB/s at AMP = 4 (exact
  // integers), and as 800 MiB/s at AMP = 2.5 (floating point).
  for (const CacheReservation& r : {paper_cache(250, 1), paper_cache(250, 1, 1280.0 * MiB, 4),
                                    paper_cache(250, 1, 800.0 * MiB, 2.5)}) {
    for (std::uint64_t f : r.fair_share) CHECK(f == 320 * MiB);
    for (std::uint64_t rho : r.per_tenant) CHECK(rho == 240 * MiB);
    CHECK(r.reserved == 32 * 240 * MiB);
    CHECK(r.reserved_fraction == 0.75);
    CHECK(r.ramp_ups == 1);
    CHECK(r.refill_budget == 80.0 * MiB);
    CHECK(r.refill_rate == 320.0 * MiB);
    // Without reservations a returning reader refills all 320 MiB: 1 s (the
    // paper's Figure 8 shows about 1 s; Table 4 measures 977 ms).
    CHECK(r.refill_time_ms == Approx(1000.0));
    // With them, the 80 MiB above its threshold: δ.
    CHECK(r.refill_time_reserved_ms == Approx(250.0));
  }
}

TEST_CASE("Table 6: δ = 750 ms, k = 1..6 reserve 25 / 62.5 / 75 / 81.25 / 85 / 87.5% of f",
          "[delta_fair][cache][math]") {
  const std::vector<double> pct = {25, 62.5, 75, 81.25, 85, 87.5};
  const std::vector<std::uint64_t> rho_mib = {80, 200, 240, 260, 272, 280};
  for (int k = 1; k <= 6; ++k) {
    INFO("k " << k);
    const CacheReservation r = paper_cache(750, k);
    // 240 MiB refill within 750 ms, shared by k ramp-ups.
    CHECK(r.refill_budget == Approx(240.0 * MiB / k));
    for (std::uint64_t rho : r.per_tenant) CHECK(rho == rho_mib[k - 1] * MiB);
    CHECK(static_cast<double>(rho_mib[k - 1]) / 320 * 100 == Approx(pct[k - 1]));
    CHECK(r.reserved == 32 * r.per_tenant[0]);
    CHECK(r.reserved_fraction == Approx(pct[k - 1] / 100).epsilon(1e-12));
    CHECK(r.refill_time_ms == Approx(1000.0 * k));
    CHECK(r.refill_time_reserved_ms == Approx(750.0));
  }
  // The same at AMP = 4 over 1280 MiB/s.
  CHECK(paper_cache(750, 6, 1280.0 * MiB, 4).per_tenant[7] == 280 * MiB);
}

TEST_CASE("δ = 0 reserves f, δ = inf nothing, no refill bandwidth f", "[delta_fair][cache][math]") {
  const CacheReservation zero = paper_cache(0, 1);
  for (std::uint64_t rho : zero.per_tenant) CHECK(rho == 320 * MiB);
  CHECK(zero.reserved == 10 * GiB);
  CHECK(zero.reserved_fraction == 1.0);
  CHECK(zero.refill_time_reserved_ms == 0);

  const CacheReservation inf = paper_cache(kInf, 3);
  CHECK(inf.reserved == 0);
  CHECK(std::isinf(inf.refill_budget));
  CHECK(inf.refill_time_reserved_ms == inf.refill_time_ms);
  CHECK(inf.refill_time_ms == Approx(3000.0));

  const CacheReservation stopped = paper_cache(250, 1, 0);
  CHECK(stopped.reserved == 10 * GiB);
  CHECK(std::isinf(stopped.refill_time_ms));
  CHECK(stopped.refill_time_reserved_ms == 0);  // nothing to refill
  // δ = inf without bandwidth: instantaneous fair sharing all the same.
  CHECK(paper_cache(kInf, 1, 0).reserved == 0);
  // A δ longer than the refill of a whole share: nothing reserved.
  CHECK(paper_cache(1000, 1).reserved == 0);
  CHECK(paper_cache(999, 1).per_tenant[0] > 0);
}

TEST_CASE("weighted tenants: each f_i its weight's share, the same refill budget each",
          "[delta_fair][cache][math]") {
  // Weights 1:4:1:2 of 800 MiB: 100, 400, 100, 200 MiB. R_read = 100 MiB/s,
  // AMP = 2, k = 2, δ = 1 s: each ramp-up refills 100 / (2 * 2) = 25 MiB.
  const CacheReservation r =
      delta_fair::reserve_cache(cache_model(800 * MiB, 100.0 * MiB, 2, 1000, 2), {1, 4, 1, 2});
  CHECK(r.fair_share == std::vector<std::uint64_t>{100 * MiB, 400 * MiB, 100 * MiB, 200 * MiB});
  CHECK(r.per_tenant == std::vector<std::uint64_t>{75 * MiB, 375 * MiB, 75 * MiB, 175 * MiB});
  CHECK(r.reserved == 700 * MiB);
  CHECK(r.reserved_fraction == 0.875);
  CHECK(r.refill_time_ms == Approx(2.0 * 400 * 2 / 100 * 1000));  // the largest share
  CHECK(r.refill_time_reserved_ms == Approx(1000.0));
  // A share smaller than the budget reserves nothing.
  const CacheReservation small =
      delta_fair::reserve_cache(cache_model(800 * MiB, 100.0 * MiB, 2, 1000, 2), {1, 40});
  CHECK(small.fair_share[0] == 800 * MiB / 41);
  CHECK(small.per_tenant[0] == 0);
}

TEST_CASE("k above the number of tenants counts every tenant once", "[delta_fair][cache][math]") {
  const CacheReservation r =
      delta_fair::reserve_cache(cache_model(400 * MiB, 100.0 * MiB, 1, 1000, 10), equal(4));
  CHECK(r.ramp_ups == 4);
  for (std::uint64_t rho : r.per_tenant) CHECK(rho == 75 * MiB);
}

TEST_CASE("ρ_i is rounded down to whole bytes, on both paths", "[delta_fair][cache][math]") {
  // b = 10 * 1000 / (1000 * 3) = 3.33 bytes: ρ = floor(996.67) = 996.
  CHECK(delta_fair::reserve_cache(cache_model(1000, 10, 3, 1000, 1), equal(1)).per_tenant[0] ==
        996);
  // b = 4 exactly, with AMP not a whole number.
  CHECK(delta_fair::reserve_cache(cache_model(1000, 10, 2.5, 1000, 1), equal(1)).per_tenant[0] ==
        996);
  // b = 3.5, with R not a whole number.
  CHECK(delta_fair::reserve_cache(cache_model(1000, 10.5, 3, 1000, 1), equal(1)).per_tenant[0] ==
        996);
  // Weights that are not whole numbers: 1.5 : 0.5 of 1000 bytes, nothing refills.
  const CacheReservation frac =
      delta_fair::reserve_cache(cache_model(1000, 0, 1, 100, 1), {1.5, 0.5});
  CHECK(frac.per_tenant == std::vector<std::uint64_t>{750, 250});
}

// ---------------------------------------------------------------------------
// Configuration.

json cache_member(json delta = 250) {
  return {{"capacity", 10 * GiB}, {"refill_bandwidth", 320 * MiB}, {"delta_ms", delta}};
}

json cache_paper_config(json delta = 250, int n = 32) {
  json tenants = json::array();
  for (int i = 1; i <= n; ++i) {
    tenants.push_back(
        {{"name", "r" + std::string(i < 10 ? "0" : "") + std::to_string(i)}, {"weight", 1}});
  }
  return {{"k", 1}, {"tenants", tenants}, {"cache", cache_member(std::move(delta))}};
}

TEST_CASE("cache configuration: defaults, either member or both, describe round-trips",
          "[delta_fair][cache][config]") {
  auto c = parse_delta_fair_config(cache_paper_config());
  REQUIRE(c.is_ok());
  CHECK_FALSE(c->write_buffer.has_value());
  REQUIRE(c->cache.has_value());
  CHECK(c->cache->capacity == 10 * GiB);
  CHECK(c->cache->refill_bandwidth == 320.0 * MiB);
  CHECK(c->cache->read_amplification == 1);
  CHECK(c->cache->object == "read_cache");
  CHECK(c->cache->read_origin == "foreground");
  CHECK_FALSE(c->cache->refill_measured);
  const json described = delta_fair_config_to_json(*c);
  CHECK_FALSE(described.contains("write_buffer"));
  auto again = parse_delta_fair_config(described);
  REQUIRE(again.is_ok());
  CHECK(delta_fair_config_to_json(*again) == described);

  json both = cache_paper_config("inf");
  both["write_buffer"] = {{"capacity", 2 * GiB},
                          {"segment", 64 * MiB},
                          {"flush_bandwidth", 380 * MiB},
                          {"delta_ms", 350}};
  both["cache"]["refill_bandwidth"] = "measured";
  both["cache"]["refill_bandwidth_initial"] = 1000;
  both["cache"]["read_amplification"] = "measured";
  both["cache"]["read_amplification_initial"] = 4;
  both["cache"]["refill_smoothing"] = 0.5;
  both["cache"]["read_origin"] = "get";
  both["cache"]["object"] = "bc";
  auto m = parse_delta_fair_config(both);
  REQUIRE(m.is_ok());
  CHECK(m->write_buffer.has_value());
  CHECK(std::isinf(m->cache->delta_ms));
  CHECK(m->cache->refill_measured);
  CHECK(m->cache->refill_bandwidth == 1000);
  CHECK(m->cache->amplification_measured);
  CHECK(m->cache->read_amplification == 4);
  CHECK(m->cache->smoothing == 0.5);
  const json d = delta_fair_config_to_json(*m);
  CHECK(d["cache"]["delta_ms"] == "inf");
  CHECK(d["cache"]["read_origin"] == "get");
  CHECK(delta_fair_config_to_json(*parse_delta_fair_config(d)) == d);
}

TEST_CASE("cache configuration errors name the field", "[delta_fair][cache][config]") {
  ConfigErrors errors(cache_paper_config());
  errors.with(
      "neither member", [](json& c) { c.erase("cache"); },
      "write_buffer: required when there is no cache");
  errors.with(
      "cache not an object", [](json& c) { c["cache"] = 5; }, "cache: must be an object");
  errors.with(
      "unknown field", [](json& c) { c["cache"]["capacty"] = 1; }, "cache.capacty: unknown field");
  errors.with(
      "no capacity", [](json& c) { c["cache"].erase("capacity"); }, "cache.capacity: required");
  errors.with(
      "capacity zero", [](json& c) { c["cache"]["capacity"] = 0; },
      "cache.capacity: must be an integer number of bytes from 1 to 2^62");
  errors.with(
      "no bandwidth", [](json& c) { c["cache"].erase("refill_bandwidth"); },
      "cache.refill_bandwidth: required");
  errors.with(
      "bandwidth zero", [](json& c) { c["cache"]["refill_bandwidth"] = 0; },
      "cache.refill_bandwidth: must be > 0");
  errors.with(
      "bandwidth word", [](json& c) { c["cache"]["refill_bandwidth"] = "fast"; },
      "cache.refill_bandwidth: must be bytes per second (> 0) or \"measured\"");
  errors.with(
      "initial without measured", [](json& c) { c["cache"]["refill_bandwidth_initial"] = 5; },
      "cache.refill_bandwidth_initial: only with \"refill_bandwidth\": \"measured\"");
  errors.with(
      "amplification below 1", [](json& c) { c["cache"]["read_amplification"] = 0.5; },
      "cache.read_amplification: must be >= 1");
  errors.with(
      "amplification word", [](json& c) { c["cache"]["read_amplification"] = "high"; },
      "cache.read_amplification: must be a number >= 1 or \"measured\"");
  errors.with(
      "amplification initial below 1",
      [](json& c) {
        c["cache"]["read_amplification"] = "measured";
        c["cache"]["read_amplification_initial"] = 0.5;
      },
      "cache.read_amplification_initial: must be >= 1");
  errors.with(
      "amplification initial without measured",
      [](json& c) { c["cache"]["read_amplification_initial"] = 2; },
      "cache.read_amplification_initial: only with");
  errors.with(
      "no delta", [](json& c) { c["cache"].erase("delta_ms"); }, "cache.delta_ms: required");
  errors.with(
      "negative delta", [](json& c) { c["cache"]["delta_ms"] = -1; },
      "cache.delta_ms: must be >= 0");
  errors.with(
      "delta word", [](json& c) { c["cache"]["delta_ms"] = "never"; },
      "cache.delta_ms: must be a number of ms >= 0 or \"inf\"");
  errors.with(
      "smoothing", [](json& c) { c["cache"]["refill_smoothing"] = 1.5; },
      "cache.refill_smoothing: must be > 0 and <= 1");
  errors.with(
      "object", [](json& c) { c["cache"]["object"] = ""; },
      "cache.object: must be a non-empty string");
  errors.with(
      "bad write buffer beside a good cache", [](json& c) { c["write_buffer"] = json::object(); },
      "write_buffer.capacity: required");
  errors.check();
}

TEST_CASE("a refused cache configuration changes nothing", "[delta_fair][cache][config]") {
  DeltaFairPolicy p;
  REQUIRE(p.configure(cache_paper_config()).is_ok());
  const json before = p.describe();
  json bad = cache_paper_config(0);
  bad["cache"]["read_amplification"] = 0;
  CHECK_FALSE(p.configure(bad).is_ok());
  CHECK(p.describe() == before);
  CHECK(p.cache_reservation().per_tenant[0] == 240 * MiB);
}

TEST_CASE("explain: reservations.cache, and no write_buffer without one", "[delta_fair][cache]") {
  auto p = make_policy("delta-fair", cache_paper_config());
  REQUIRE(p.is_ok());
  const json e = (*p)->explain();
  CHECK_FALSE(e.at("reservations").contains("write_buffer"));
  const json& c = e.at("reservations").at("cache");
  CHECK(c.at("reserved_bytes") == 32 * 240 * MiB);
  CHECK(c.at("reserved_fraction") == 0.75);
  CHECK(c.at("per_tenant_bytes").size() == 32);
  CHECK(c.at("per_tenant_bytes").at("r07") == 240 * MiB);
  CHECK(c.at("fair_share_bytes").at("r32") == 320 * MiB);
  CHECK(c.at("refill_time_ms").get<double>() == Approx(1000.0));
  CHECK(c.at("refill_time_reserved_ms").get<double>() == Approx(250.0));
  CHECK(c.at("refill_budget_bytes") == 80.0 * MiB);
  CHECK(c.at("refill_bandwidth_source") == "configured");
  CHECK(c.at("read_amplification") == 1.0);
  CHECK(c.at("delta_ms") == 250.0);

  // Measured without starting values: nothing known, everything reserved.
  json m = cache_paper_config();
  m["cache"]["refill_bandwidth"] = "measured";
  auto q = make_policy("delta-fair", m);
  REQUIRE(q.is_ok());
  const json qe = (*q)->explain();
  const json& mc = qe.at("reservations").at("cache");
  CHECK(mc.at("refill_bandwidth_source") == "none");
  CHECK(mc.at("reserved_fraction") == 1.0);
  CHECK(mc.at("refill_time_ms").is_null());
}

// ---------------------------------------------------------------------------
// The step.

struct CacheFlow {
  std::uint64_t id;
  double usage = 0, misses = 0, inserted_bytes = -1;  // -1: not reported
  double hits = 0, inserts = 0, evictions = 0;
  double reserved = -1;  // -1: as the policy sent it (240 MiB)
};

// A cache-reserve object's collect: per flow its configuration and counters
// since the object was created.
json cache_state(std::uint64_t capacity, const std::vector<CacheFlow>& flows) {
  json fl = json::array();
  double used = 0;
  for (const CacheFlow& f : flows) {
    used += f.usage;
    json e = {{"flow", f.id},
              {"weight", 1.0},
              {"fair_share", 320 * MiB},
              {"reserved", f.reserved >= 0 ? f.reserved : 240.0 * MiB},
              {"usage", f.usage},
              {"pinned", 1},
              {"hits", f.hits},
              {"misses", f.misses},
              {"inserts", f.inserts},
              {"evictions", f.evictions},
              {"evictions_below_reserved", 0}};
    if (f.inserted_bytes >= 0) e["inserted_bytes"] = f.inserted_bytes;
    fl.push_back(std::move(e));
  }
  return {{"capacity", capacity}, {"used", used}, {"flows", fl}};
}

ObjectStats object_stats(const std::string& name, const std::string& type, const json& state) {
  ObjectStats o;
  o.name = name;
  o.type = type;
  o.state = state;
  return o;
}

// A stage with a cache object in channel "get", and `read_bytes` of the
// foreground origin in that channel over one second.
StageView cache_stage(const std::string& name, const json& state, std::uint64_t read_bytes = 0,
                      std::int64_t connected_at = 1, const std::string& type = "cache-reserve",
                      const std::string& object = "read_cache") {
  StageView st;
  st.name = name;
  st.connected_at_ns = connected_at;
  st.stats.stage = name;
  st.stats.interval_ns = kSecond;
  ChannelStats c;
  c.name = "get";
  c.objects.push_back(object_stats(object, type, state));
  c.by_origin["foreground"] = Counters{100, read_bytes};
  c.by_origin["compaction"] = Counters{100, 999 * MiB};  // not a refill
  c.total = Counters{200, read_bytes + 999 * MiB};
  st.stats.channels.push_back(c);
  ChannelInfo ci;
  ci.name = "get";
  ci.objects.push_back(ObjectInfo{object, type, json::array(), false, -1, 0, {}});
  st.info.channels.push_back(ci);
  return st;
}

json cache_rule(std::uint64_t rho, std::size_t n = 32, const std::string& object = "read_cache",
                const std::string& channel = "get") {
  json reserved = json::object(), weights = json::object();
  for (std::size_t i = 1; i <= n; ++i) {
    reserved[std::to_string(i)] = rho;
    weights[std::to_string(i)] = 1.0;
  }
  return {{"rule", "configure"},
          {"channel", channel},
          {"object", object},
          {"config", {{"capacity", 10 * GiB}, {"reserved", reserved}, {"weights", weights}}}};
}

std::uint64_t sent_rho(const PolicyOutput& out, const std::string& stage) {
  return out.rules.at(stage).value().at("rules").back().at("config").at("reserved").at("1");
}

TEST_CASE("step: configures the cache objects when something changed, and only then",
          "[delta_fair][cache][step]") {
  DeltaFairPolicy p;
  REQUIRE(p.configure(cache_paper_config()).is_ok());
  const json expected = {{"version", 1}, {"rules", {cache_rule(240 * MiB)}}};

  PolicyOutput out = p.step(input_of({cache_stage("db", cache_state(GiB, {}))}));
  CHECK(out.rules.at("db") == expected);
  // Holds what was sent: nothing.
  out = p.step(input_of({cache_stage("db", cache_state(10 * GiB, {{1}}))}));
  CHECK(out.rules.empty());
  // Another capacity (recreated): again.
  out = p.step(input_of({cache_stage("db", cache_state(GiB, {{1}}))}));
  CHECK(out.rules.at("db") == expected);
  // A flow holding another threshold: again.
  CacheFlow odd{3};
  odd.reserved = 0;
  out = p.step(input_of({cache_stage("db", cache_state(10 * GiB, {odd}))}));
  CHECK(out.rules.at("db") == expected);
  // Reconnected: again, then quiet.
  out = p.step(input_of({cache_stage("db", cache_state(10 * GiB, {}), 0, 2)}));
  CHECK(out.rules.at("db") == expected);
  CHECK(p.step(input_of({cache_stage("db", cache_state(10 * GiB, {}), 0, 2)})).rules.empty());

  // An object of another type by that name: not configured, an error.
  out = p.step(input_of({cache_stage("odd", json::object(), 0, 1, "buffer-pool")}));
  CHECK(out.rules.empty());
  CHECK(out.report.at("errors").at("odd").get<std::string>().find("not a 'cache-reserve'") !=
        std::string::npos);
  CHECK_FALSE(out.report.contains("flush_bandwidth"));  // no write buffer
}

TEST_CASE("step and admit: a stage with both a pool and a cache gets both in one batch",
          "[delta_fair][cache][step]") {
  json cfg = cache_paper_config();
  cfg["write_buffer"] = {{"capacity", 2 * GiB},
                         {"segment", 64 * MiB},
                         {"flush_bandwidth", 380 * MiB},
                         {"delta_ms", 0},
                         {"object", "wb"}};
  DeltaFairPolicy p;
  REQUIRE(p.configure(cfg).is_ok());
  StageView st = cache_stage("db", json::object());
  st.info.channels.front().objects.push_back(
      ObjectInfo{"wb", "buffer-pool", json::array(), false, -1, 0, {}});
  StageView hello = st;
  hello.stats = StageStats{};
  const RulesBatch first = p.admit(input_of({hello}));
  const json& rules = first.value().at("rules");
  REQUIRE(rules.size() == 2);
  CHECK(rules[0].at("object") == "wb");
  CHECK(rules[0].at("config").at("reserved") == 64 * MiB);  // δ = 0: D = f = 2 GiB / 32
  CHECK(rules[1] == cache_rule(240 * MiB));
  // Its first step sends nothing more.
  CHECK(p.step(input_of({hello})).rules.empty());
  const json e = p.explain();
  CHECK(e.at("reservations").contains("write_buffer"));
  CHECK(e.at("reservations").contains("cache"));
}

TEST_CASE("measured R_read: foreground reads while a tenant below its share misses",
          "[delta_fair][cache][step]") {
  json cfg = cache_paper_config();
  cfg["cache"]["refill_bandwidth"] = "measured";
  cfg["cache"]["refill_bandwidth_initial"] = 320 * MiB;
  cfg["cache"]["refill_smoothing"] = 0.5;
  DeltaFairPolicy p;
  REQUIRE(p.configure(cfg).is_ok());
  CHECK(p.refill_bandwidth() == 320.0 * MiB);
  CHECK(p.cache_reservation().per_tenant[0] == 240 * MiB);

  // The first collect gives no differences: nothing measured.
  PolicyOutput out =
      p.step(input_of({cache_stage("db", cache_state(10 * GiB, {{1, 10 * MiB, 5}}), 100 * MiB)}));
  CHECK(p.refill_bandwidth() == 320.0 * MiB);
  CHECK(out.report.at("cache").at("refill_bandwidth").at("source") == "initial");

  // Tenant 1 missed again while at its fair share, tenant 2 has no misses:
  // the reads are what the tenants ask for.
  out = p.step(input_of({cache_stage(
      "db", cache_state(10 * GiB, {{1, 320 * MiB, 9}, {2, 10 * MiB, 0}}), 100 * MiB)}));
  CHECK(p.refill_bandwidth() == 320.0 * MiB);
  CHECK(out.report.at("cache").at("refill_bandwidth").at("estimate").at("backlogged") == false);
  CHECK(out.report.at("cache").at("refill_bandwidth").at("estimate").at("rate") == 100.0 * MiB);

  // Tenant 2 below its share misses: 160 MiB read in the second. Halfway
  // from 320: 240 MiB/s, so 60 MiB refill in 250 ms and ρ = 260 MiB.
  out = p.step(input_of({cache_stage(
      "db", cache_state(10 * GiB, {{1, 320 * MiB, 9}, {2, 20 * MiB, 4}}), 160 * MiB)}));
  CHECK(p.refill_bandwidth() == 240.0 * MiB);
  CHECK(out.report.at("cache").at("refill_bandwidth").at("source") == "measured");
  CHECK(out.report.at("cache").at("refill_bandwidth").at("estimate").at("used") == true);
  CHECK(sent_rho(out, "db") == 260 * MiB);
  CHECK(out.report.at("reservations").at("cache").at("refill_bandwidth") == 240.0 * MiB);
}

TEST_CASE("measured AMP: disk bytes read per byte inserted, at least 1",
          "[delta_fair][cache][step]") {
  json cfg = cache_paper_config();
  cfg["cache"]["refill_bandwidth"] = 1280 * MiB;
  cfg["cache"]["read_amplification"] = "measured";
  DeltaFairPolicy p;
  REQUIRE(p.configure(cfg).is_ok());
  // AMP unknown: the refill rate too, so ρ_i = f_i.
  CHECK(p.cache_reservation().per_tenant[0] == 320 * MiB);
  CHECK(p.explain()["reservations"]["cache"]["read_amplification_source"] == "none");

  CacheFlow a{1, 10 * MiB, 0, 0};
  p.step(input_of({cache_stage("db", cache_state(10 * GiB, {a}), 0)}));
  // 400 MiB read from disk, 100 MiB inserted: AMP = 4, the first
  // measurement taken as it is. 1280 / 4 = 320 MiB/s: ρ = 240 MiB at 250 ms.
  a.inserted_bytes = 100.0 * MiB;
  PolicyOutput out = p.step(input_of({cache_stage("db", cache_state(10 * GiB, {a}), 400 * MiB)}));
  CHECK(p.read_amplification() == 4.0);
  const json& est = out.report.at("cache").at("read_amplification").at("estimate");
  CHECK(est.at("read_bytes") == 400.0 * MiB);
  CHECK(est.at("inserted_bytes") == 100.0 * MiB);
  CHECK(est.at("used") == true);
  CHECK(sent_rho(out, "db") == 240 * MiB);

  // Fewer disk bytes than inserted (compressed blocks): counted as 1.
  // Smoothed: 4 + 0.25 * (1 - 4) = 3.25.
  a.inserted_bytes = 200.0 * MiB;
  out = p.step(input_of({cache_stage("db", cache_state(10 * GiB, {a}), 50 * MiB)}));
  CHECK(out.report.at("cache").at("read_amplification").at("estimate").at("sample") == 1.0);
  CHECK(p.read_amplification() == 3.25);

  // An object that reports no inserted bytes: nothing to measure, said so.
  DeltaFairPolicy q;
  REQUIRE(q.configure(cfg).is_ok());
  CacheFlow b{1, 10 * MiB, 0};
  b.inserts = 10;
  q.step(input_of({cache_stage("db", cache_state(10 * GiB, {b}), 0)}));
  b.inserts = 20;
  out = q.step(input_of({cache_stage("db", cache_state(10 * GiB, {b}), 400 * MiB)}));
  CHECK(out.report.at("cache")
            .at("read_amplification")
            .at("estimate")
            .at("inserted_bytes_reported") == false);
  CHECK(out.report.at("cache").at("read_amplification").at("source") == "none");
  CHECK(q.cache_reservation().per_tenant[0] == 320 * MiB);
}

TEST_CASE("report: the cache block, per tenant the objects' counters summed over stages",
          "[delta_fair][cache][step]") {
  DeltaFairPolicy p;
  REQUIRE(p.configure(cache_paper_config(250, 2)).is_ok());
  CacheFlow a1{1, 100, 3, -1, 7, 2, 1};
  CacheFlow a9{9, 5};
  CacheFlow b1{1, 50, 1, -1, 3, 1, 0};
  const PolicyOutput out = p.step(input_of({cache_stage("a", cache_state(10 * GiB, {a1, a9})),
                                            cache_stage("b", cache_state(10 * GiB, {b1}))}));
  const json& c = out.report.at("cache");
  CHECK(out.report.at("reservations").at("cache").at("reserved_bytes") == 2 * 5040 * MiB);
  CHECK(c.at("refill_bandwidth").at("in_use") == 320.0 * MiB);
  CHECK(c.at("refill_bandwidth").at("source") == "configured");
  CHECK(c.at("read_amplification").at("in_use") == 1.0);
  const json& r01 = c.at("tenants").at("r01");
  CHECK(r01.at("id") == 1);
  CHECK(r01.at("fair_share") == 5 * GiB);
  CHECK(r01.at("reserved") == 5 * GiB - 80 * MiB);
  CHECK(r01.at("usage") == 150.0);
  CHECK(r01.at("pinned") == 2.0);
  CHECK(r01.at("misses") == 4.0);
  CHECK(r01.at("hits") == 10.0);
  CHECK(r01.at("inserts") == 3.0);
  CHECK(r01.at("evictions") == 1.0);
  CHECK(r01.at("evictions_below_reserved") == 0.0);
  CHECK_FALSE(c.at("tenants").at("r02").contains("usage"));
  CHECK(c.at("other_flows").at("9").at("usage") == 5.0);
  CHECK(c.at("stages").at("a").at("channels") == json::array({"get"}));
  CHECK(c.at("stages").at("a").at("sent") == true);
  CHECK(out.report.at("tenants").at("r01").at("id") == 1);
}

}  // namespace
}  // namespace sluice
