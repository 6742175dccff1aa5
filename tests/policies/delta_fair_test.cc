// Delta Fair Sharing for write buffers: the reservation arithmetic against
// FairDB's published numbers (§4, §7.2.1, Table 4) and more cases, then the
// policy's configuration and its steps over hand-built stage statistics.
//
// Units: the paper writes MB and kB; these tables use MiB and KiB, in which
// its examples are exact (2 GiB / 16 = 128 MiB, 50 MiB/s * 200 ms = 10 MiB =
// 160 segments of 64 KiB).
#include "delta-fair/delta_fair.h"
#include "delta-fair/delta_fair_math.h"
#include "delta_fair_test_util.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

namespace sluice {
namespace {

using delta_fair::BufferModel;
using delta_fair::Reservation;
using delta_fair::Rounding;
using nlohmann::json;
using namespace delta_fair_test;  // NOLINT: the tests' shared units and helpers

BufferModel model(std::uint64_t c, std::uint64_t b, double r, double delta, int k,
                  Rounding rounding = Rounding::kStrict) {
  BufferModel m;
  m.capacity = c;
  m.segment = b;
  m.flush_bandwidth = r;
  m.delta_ms = delta;
  m.k = k;
  m.rounding = rounding;
  return m;
}

// A byte count rounded to the nearest.
std::uint64_t bytes(double v) {
  return static_cast<std::uint64_t>(std::llround(v));
}

// §7.2.1: 2 GiB, 64 MiB segments, 380 MiB/s, k = 2, 16 equal tenants.
Reservation paper_buffer(double delta, Rounding rounding) {
  return delta_fair::reserve(model(2 * GiB, 64 * MiB, 380.0 * MiB, delta, 2, rounding), equal(16));
}

// ---------------------------------------------------------------------------
// The arithmetic.

TEST_CASE("§4's toy example: f = 100 MiB, 50 MiB/s, 200 ms, 64 KiB segments: 90 MiB reserved",
          "[delta_fair][math]") {
  for (Rounding rounding : {Rounding::kStrict, Rounding::kNearest}) {
    // One tenant (k = 1) of a 100 MiB buffer, and one of two in 200 MiB.
    for (std::size_t n : {1, 2}) {
      const Reservation r = delta_fair::reserve(
          model(n * 100 * MiB, 64 * KiB, 50.0 * MiB, 200, 1, rounding), equal(n));
      CHECK(r.fair_share.front() == 100 * MiB);
      CHECK(r.ramp_demand == 100 * MiB);
      CHECK(r.flushable_segments == 160);  // 10 MiB of 64 KiB
      CHECK(r.reserved == 90 * MiB);
      for (std::uint64_t each : r.per_tenant) CHECK(each == 90 * MiB);
      CHECK(r.flush_time_ms == Approx(200.0));
      CHECK(r.worst_case_delay_ms == Approx(2000.0));
    }
  }
}

TEST_CASE("§7.2.1: 673 ms worst case; 128 MiB (6.25%) at 350 ms, 64 MiB per ramp-up tenant",
          "[delta_fair][math]") {
  const Reservation r = paper_buffer(350, Rounding::kStrict);
  for (std::uint64_t f : r.fair_share) CHECK(f == 128 * MiB);
  CHECK(r.ramp_demand == 256 * MiB);
  // 256 MiB at 380 MiB/s: the paper's 673 ms.
  CHECK(r.worst_case_delay_ms == Approx(256.0 / 380.0 * 1000.0));
  CHECK(std::floor(r.worst_case_delay_ms) == 673);
  CHECK(r.reserved == 128 * MiB);
  CHECK(r.reserved_fraction == 0.0625);
  CHECK(std::round(r.reserved_fraction * 100) == 6);  // the paper prints 6%
  for (std::uint64_t each : r.per_tenant) CHECK(each == 64 * MiB);
  // What is left flushes within δ: 128 MiB at 380 MiB/s.
  CHECK(r.flush_time_ms == Approx(128.0 / 380.0 * 1000.0));
  CHECK(r.flush_time_ms <= 350);
}

TEST_CASE("Table 4's reservation column: round-to-nearest gives the paper's, strict keeps δ",
          "[delta_fair][math]") {
  struct Row {
    double delta;
    double paper_pct;    // as printed
    double nearest_pct;  // exact
    double strict_pct;
    double unflushed;  // (k f - R δ) / B, the segments that cannot flush within δ
  };
  const std::vector<Row> rows = {
      {0, 12.5, 12.5, 12.5, 4},      {200, 9.4, 9.375, 9.375, 2.81}, {350, 6.3, 6.25, 6.25, 1.92},
      {500, 3.1, 3.125, 6.25, 1.03}, {kInf, 0, 0, 0, -kInf},
  };
  for (const Row& row : rows) {
    INFO("delta_ms " << row.delta);
    const Reservation nearest = paper_buffer(row.delta, Rounding::kNearest);
    const Reservation strict = paper_buffer(row.delta, Rounding::kStrict);
    CHECK(nearest.reserved_fraction * 100 == row.nearest_pct);
    CHECK(std::round(nearest.reserved_fraction * 1000) / 10 == Approx(row.paper_pct));
    CHECK(strict.reserved_fraction * 100 == row.strict_pct);
    // Every reservation is whole segments.
    CHECK(nearest.reserved % (64 * MiB) == 0);
    CHECK(strict.reserved % (64 * MiB) == 0);
    if (std::isfinite(row.delta)) {
      const double unflushed = (256.0 - 380.0 * row.delta / 1000.0) / 64.0;
      CHECK(std::round(unflushed * 100) / 100 == Approx(row.unflushed));
      // Strict: what is not reserved always flushes within δ (δ = 0: nothing
      // is left to flush).
      CHECK(strict.flush_time_ms <= row.delta);
    }
  }
  // Nearest at 500 ms: 64 MiB reserved leaves 192 MiB, 505 ms at 380 MiB/s.
  const Reservation r500 = paper_buffer(500, Rounding::kNearest);
  CHECK(r500.reserved == 64 * MiB);
  CHECK(r500.flush_time_ms == Approx(192.0 / 380.0 * 1000.0));
  CHECK(r500.flush_time_ms > 500);
  CHECK(std::floor(r500.flush_time_ms) == 505);
}

TEST_CASE("weighted tenants: D is the sum of the k largest fair shares", "[delta_fair][math]") {
  // Weights 4:2:1:1 of 800 MiB: 400, 200, 100, 100 MiB. 50 MiB segments,
  // 100 MiB/s, δ = 1 s: two segments flush within δ.
  const std::vector<double> w = {1, 4, 1, 2};
  const Reservation k2 = delta_fair::reserve(model(800 * MiB, 50 * MiB, 100.0 * MiB, 1000, 2), w);
  CHECK(k2.fair_share == std::vector<std::uint64_t>{100 * MiB, 400 * MiB, 100 * MiB, 200 * MiB});
  CHECK(k2.ramp_demand == 600 * MiB);
  CHECK(k2.flushable_segments == 2);
  CHECK(k2.reserved == 500 * MiB);
  // ρ_i = f_i ρ / D, to the byte: the two largest sum to ρ.
  CHECK(k2.per_tenant[1] == bytes(400.0 * MiB * 500 / 600));
  CHECK(k2.per_tenant[3] == bytes(200.0 * MiB * 500 / 600));
  CHECK(k2.per_tenant[0] == bytes(100.0 * MiB * 500 / 600));
  CHECK(k2.per_tenant[1] + k2.per_tenant[3] == k2.reserved);

  const Reservation k1 = delta_fair::reserve(model(800 * MiB, 50 * MiB, 100.0 * MiB, 1000, 1), w);
  CHECK(k1.ramp_demand == 400 * MiB);
  CHECK(k1.reserved == 300 * MiB);
  CHECK(k1.per_tenant[1] == 300 * MiB);
  CHECK(k1.per_tenant[3] == 150 * MiB);

  // Weights that are not whole numbers: 1.5 : 0.5 of 1000 bytes.
  const Reservation frac = delta_fair::reserve(model(1000, 10, 0, 100, 1), {1.5, 0.5});
  CHECK(frac.fair_share == std::vector<std::uint64_t>{750, 250});
  CHECK(frac.reserved == 750);  // nothing flushes: ρ = D
}

TEST_CASE("k >= n: every tenant may ramp up at once; D is the whole buffer", "[delta_fair][math]") {
  for (int k : {4, 5, 100}) {
    const Reservation r =
        delta_fair::reserve(model(1 * GiB, 64 * MiB, 64.0 * MiB, 1000, k), equal(4));
    CHECK(r.ramp_demand == 1 * GiB);
    CHECK(r.reserved == 1 * GiB - 64 * MiB);
  }
  // δ = 0 with k = n: static quotas of the whole buffer.
  const Reservation q = delta_fair::reserve(model(1 * GiB, 64 * MiB, 64.0 * MiB, 0, 4), equal(4));
  CHECK(q.reserved == 1 * GiB);
  CHECK(q.reserved_fraction == 1.0);
  for (std::uint64_t each : q.per_tenant) CHECK(each == 256 * MiB);
}

TEST_CASE("δ = 0 reserves D, δ = inf nothing, no flush bandwidth D", "[delta_fair][math]") {
  const BufferModel base = model(2 * GiB, 64 * MiB, 380.0 * MiB, 0, 2);
  CHECK(delta_fair::reserve(base, equal(16)).reserved == 256 * MiB);
  CHECK(delta_fair::reserve(base, equal(16)).flush_time_ms == 0);
  BufferModel inf = base;
  inf.delta_ms = kInf;
  const Reservation none = delta_fair::reserve(inf, equal(16));
  CHECK(none.reserved == 0);
  CHECK(none.flush_time_ms == none.worst_case_delay_ms);
  BufferModel stopped = base;
  stopped.delta_ms = 350;
  stopped.flush_bandwidth = 0;
  const Reservation all = delta_fair::reserve(stopped, equal(16));
  CHECK(all.reserved == 256 * MiB);
  CHECK(std::isinf(all.worst_case_delay_ms));
  CHECK(all.flush_time_ms == 0);
  // A δ longer than the worst case: nothing reserved.
  BufferModel lax = base;
  lax.delta_ms = 1000;
  CHECK(delta_fair::reserve(lax, equal(16)).reserved == 0);
}

TEST_CASE("a capacity that is not a segment multiple", "[delta_fair][math]") {
  // 1000 bytes, 4 tenants of 250, k = 2: D = 500; 64-byte segments; 6400 B/s
  // for 20 ms flushes 2 segments (128 bytes).
  const Reservation r = delta_fair::reserve(model(1000, 64, 6400, 20, 2), equal(4));
  CHECK(r.ramp_demand == 500);
  CHECK(r.flushable_segments == 2);
  CHECK(r.reserved == 384);  // 372 rounded up to 6 segments
  CHECK(r.flush_time_ms == Approx(20.0));
  // δ = 0: D itself, not rounded past it.
  CHECK(delta_fair::reserve(model(1000, 64, 6400, 0, 2), equal(4)).reserved == 500);
  // Rounding up never passes D: 1 segment flushable leaves 436 -> 448.
  CHECK(delta_fair::reserve(model(1000, 64, 6400, 10, 2), equal(4)).reserved == 448);
  // A bandwidth that is not a whole number takes the floating-point path
  // with the same result.
  CHECK(delta_fair::reserve(model(1000, 64, 6400.5, 20, 2), equal(4)).reserved == 384);
  // Nearest rounds 1.5 segments up, strict down.
  CHECK(delta_fair::reserve(model(1000, 64, 4800, 20, 2), equal(4)).reserved == 448);
  CHECK(delta_fair::reserve(model(1000, 64, 4800, 20, 2, Rounding::kNearest), equal(4)).reserved ==
        384);
}

// ---------------------------------------------------------------------------
// Configuration.

json paper_config(json delta = 350) {
  json tenants = json::array();
  for (int i = 1; i <= 16; ++i) {
    tenants.push_back(
        {{"name", "t" + std::string(i < 10 ? "0" : "") + std::to_string(i)}, {"weight", 1}});
  }
  return {{"k", 2},
          {"tenants", tenants},
          {"write_buffer",
           {{"capacity", 2 * GiB},
            {"segment", 64 * MiB},
            {"flush_bandwidth", 380 * MiB},
            {"delta_ms", delta}}}};
}

TEST_CASE("configuration: defaults, ids by position, describe round-trips",
          "[delta_fair][config]") {
  auto c = parse_delta_fair_config(paper_config());
  REQUIRE(c.is_ok());
  CHECK(c->k == 2);
  CHECK(c->tenants.size() == 16);
  CHECK(c->tenants[0].id == 1);
  CHECK(c->tenants[15].id == 16);
  CHECK(c->write_buffer->object == "write_buffer");
  CHECK(c->write_buffer->rounding == Rounding::kStrict);
  CHECK_FALSE(c->write_buffer->measured);
  CHECK_FALSE(c->cache.has_value());
  const json described = delta_fair_config_to_json(*c);
  auto again = parse_delta_fair_config(described);
  REQUIRE(again.is_ok());
  CHECK(delta_fair_config_to_json(*again) == described);

  json inf = paper_config("inf");
  inf["write_buffer"]["flush_bandwidth"] = "measured";
  inf["write_buffer"]["flush_bandwidth_initial"] = 1000;
  inf["write_buffer"]["rounding"] = "nearest";
  auto m = parse_delta_fair_config(inf);
  REQUIRE(m.is_ok());
  CHECK(std::isinf(m->write_buffer->delta_ms));
  CHECK(m->write_buffer->measured);
  CHECK(m->write_buffer->flush_bandwidth == 1000);
  CHECK(m->write_buffer->rounding == Rounding::kNearest);
  CHECK(delta_fair_config_to_json(*m)["write_buffer"]["delta_ms"] == "inf");
}

TEST_CASE("configuration errors name the field", "[delta_fair][config]") {
  ConfigErrors errors(paper_config());
  errors.with(
      "unknown top field", [](json& c) { c["kk"] = 1; }, "kk: unknown field");
  errors.with(
      "cache without its fields", [](json& c) { c["cache"] = json::object(); },
      "cache.capacity: required");
  errors.with(
      "unknown buffer field", [](json& c) { c["write_buffer"]["sgement"] = 1; },
      "write_buffer.sgement: unknown field");
  errors.with(
      "unknown tenant field", [](json& c) { c["tenants"][2]["wieght"] = 1; },
      "tenants[2].wieght: unknown field");
  errors.with(
      "no tenants", [](json& c) { c.erase("tenants"); }, "tenants: required");
  errors.with(
      "empty tenants", [](json& c) { c["tenants"] = json::array(); }, "tenants: must be");
  errors.with(
      "tenant without a name", [](json& c) { c["tenants"][1].erase("name"); },
      "tenants[1].name: required");
  errors.with(
      "duplicate name", [](json& c) { c["tenants"][3]["name"] = "t01"; },
      "tenants[3].name: 't01' names another tenant too");
  errors.with(
      "duplicate id", [](json& c) { c["tenants"][4]["id"] = 2; },
      "tenants[4].id: 2 is another tenant's id too");
  errors.with(
      "id out of range", [](json& c) { c["tenants"][0]["id"] = 4294967296ULL; },
      "tenants[0].id: must be a tenant id");
  errors.with(
      "weight too small", [](json& c) { c["tenants"][0]["weight"] = 0.0001; },
      "tenants[0].weight: must be >= 0.001");
  errors.with(
      "weight too large", [](json& c) { c["tenants"][0]["weight"] = 2e6; },
      "tenants[0].weight: must be >= 0.001 and <= 1000000");
  errors.with(
      "k zero", [](json& c) { c["k"] = 0; }, "k: must be an integer in 1..");
  errors.with(
      "k not an integer", [](json& c) { c["k"] = 1.5; }, "k: must be an integer");
  errors.with(
      "no write_buffer", [](json& c) { c.erase("write_buffer"); }, "write_buffer: required");
  errors.with(
      "no capacity", [](json& c) { c["write_buffer"].erase("capacity"); },
      "write_buffer.capacity: required");
  errors.with(
      "segment zero", [](json& c) { c["write_buffer"]["segment"] = 0; },
      "write_buffer.segment: must be an integer number of bytes from 1 to 2^62");
  errors.with(
      "capacity above what a buffer-pool takes",  // every stage would refuse every batch
      [](json& c) { c["write_buffer"]["capacity"] = std::uint64_t{1} << 63; },
      "write_buffer.capacity: must be an integer number of bytes from 1 to 2^62, got "
      "9223372036854775808");
  errors.with(
      "segment above capacity", [](json& c) { c["write_buffer"]["segment"] = 4 * GiB; },
      "write_buffer.segment: must be <= capacity");
  errors.with(
      "capacity not whole", [](json& c) { c["write_buffer"]["capacity"] = 1.5; },
      "write_buffer.capacity: must be an integer");
  errors.with(
      "no bandwidth", [](json& c) { c["write_buffer"].erase("flush_bandwidth"); },
      "write_buffer.flush_bandwidth: required");
  errors.with(
      "bandwidth zero", [](json& c) { c["write_buffer"]["flush_bandwidth"] = 0; },
      "write_buffer.flush_bandwidth: must be > 0");
  errors.with(
      "bandwidth word", [](json& c) { c["write_buffer"]["flush_bandwidth"] = "fast"; },
      "write_buffer.flush_bandwidth: must be bytes per second");
  errors.with(
      "initial without measured", [](json& c) { c["write_buffer"]["flush_bandwidth_initial"] = 5; },
      "write_buffer.flush_bandwidth_initial: only with");
  errors.with(
      "no delta", [](json& c) { c["write_buffer"].erase("delta_ms"); },
      "write_buffer.delta_ms: required");
  errors.with(
      "negative delta", [](json& c) { c["write_buffer"]["delta_ms"] = -1; },
      "write_buffer.delta_ms: must be >= 0");
  errors.with(
      "delta word", [](json& c) { c["write_buffer"]["delta_ms"] = "forever"; },
      "write_buffer.delta_ms: must be a number of ms >= 0 or \"inf\"");
  errors.with(
      "rounding", [](json& c) { c["write_buffer"]["rounding"] = "up"; },
      "write_buffer.rounding: must be one of strict, nearest");
  errors.with(
      "smoothing", [](json& c) { c["write_buffer"]["flush_smoothing"] = 0; },
      "write_buffer.flush_smoothing: must be > 0");
  errors.with(
      "object", [](json& c) { c["write_buffer"]["object"] = ""; },
      "write_buffer.object: must be a non-empty string");
  errors.check();
}

TEST_CASE("a refused configuration changes nothing", "[delta_fair][config]") {
  DeltaFairPolicy p;
  REQUIRE(p.configure(paper_config()).is_ok());
  const json before = p.describe();
  json bad = paper_config(200);
  bad["write_buffer"]["segment"] = 0;
  CHECK_FALSE(p.configure(bad).is_ok());
  CHECK(p.describe() == before);
  CHECK(p.reservation().reserved == 128 * MiB);
}

TEST_CASE("the registry knows delta-fair; explain gives the reservations", "[delta_fair]") {
  auto p = make_policy("delta-fair", paper_config());
  REQUIRE(p.is_ok());
  const json e = (*p)->explain();
  const json& wb = e.at("reservations").at("write_buffer");
  CHECK(wb.at("reserved_bytes") == 128 * MiB);
  CHECK(wb.at("reserved_fraction") == 0.0625);
  CHECK(wb.at("per_tenant_bytes").size() == 16);
  CHECK(wb.at("per_tenant_bytes").at("t07") == 64 * MiB);
  CHECK(wb.at("fair_share_bytes").at("t16") == 128 * MiB);
  CHECK(wb.at("worst_case_delay_ms").get<double>() == Approx(673.68).epsilon(1e-4));
  CHECK(wb.at("flush_time_ms").get<double>() <= 350);
  CHECK(wb.at("flush_bandwidth_source") == "configured");
  CHECK(e.at("config") == (*p)->describe());

  auto bad = make_policy("delta-fair", json{{"k", 2}});
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().message() ==
        "policy 'delta-fair': tenants: required (a list of {name, "
        "weight, id})");
}

// ---------------------------------------------------------------------------
// The step.

struct PoolFlow {
  std::uint64_t id;
  double usage = 0, stalls = 0, stall_ns = 0, queued = 0, weight = 1;
};

// A pool's collect() as the buffer-pool object reports it.
json pool_state(std::uint64_t capacity, std::uint64_t reserved, std::uint64_t queued,
                const std::vector<PoolFlow>& flows) {
  json fl = json::array();
  std::uint64_t used = 0;
  for (const PoolFlow& f : flows) {
    used += static_cast<std::uint64_t>(f.usage);
    fl.push_back({{"flow", f.id},
                  {"weight", f.weight},
                  {"fair_share", 0},
                  {"usage", f.usage},
                  {"granted_bytes", f.usage},
                  {"grants", 1},
                  {"from_reserved_bytes", 0},
                  {"released_bytes", 0},
                  {"stalls", f.stalls},
                  {"stall_ns", f.stall_ns},
                  {"queued", f.queued},
                  {"max_stall_ns", f.stall_ns}});
  }
  return {{"capacity", capacity}, {"reserved", reserved}, {"reserved_free", 0},
          {"global_free", 0},     {"used", used},         {"queued", queued},
          {"flows", fl},          {"oversize", 0},        {"over_released", 0}};
}

// A stage with a pool object in `channel`, and `flush_bytes` of the flush
// origin in its channel "flush" over one second.
StageView pool_stage(const std::string& name, const json& state, std::uint64_t flush_bytes = 0,
                     std::int64_t connected_at = 1, const std::string& channel = "fg",
                     const std::string& type = "buffer-pool",
                     const std::string& object = "write_buffer") {
  StageView st;
  st.name = name;
  st.connected_at_ns = connected_at;
  st.stats.stage = name;
  st.stats.interval_ns = kSecond;
  ChannelStats c;
  c.name = channel;
  ObjectStats o;
  o.name = object;
  o.type = type;
  o.state = state;
  c.objects.push_back(o);
  st.stats.channels.push_back(c);
  ChannelStats f;
  f.name = "flush";
  f.by_origin["flush"] = Counters{10, flush_bytes};
  f.total = Counters{10, flush_bytes};
  st.stats.channels.push_back(f);
  ChannelInfo ci;
  ci.name = channel;
  ci.objects.push_back(ObjectInfo{object, type, json::array(), false, -1, 0, {}});
  st.info.channels.push_back(ci);
  return st;
}

json weights_of(std::size_t n) {
  json w = json::object();
  for (std::size_t i = 1; i <= n; ++i) w[std::to_string(i)] = 1.0;
  return w;
}

json configure_rule(const std::string& channel, std::uint64_t capacity, std::uint64_t reserved,
                    const json& weights) {
  return {{"rule", "configure"},
          {"channel", channel},
          {"object", "write_buffer"},
          {"config", {{"capacity", capacity}, {"reserved", reserved}, {"weights", weights}}}};
}

TEST_CASE("step: configures the pool when something changed, and only then", "[delta_fair][step]") {
  DeltaFairPolicy p;
  REQUIRE(p.configure(paper_config()).is_ok());
  const json expected = {{"version", 1},
                         {"rules", {configure_rule("fg", 2 * GiB, 128 * MiB, weights_of(16))}}};

  // A fresh pool (created with some other reservation).
  PolicyOutput out = p.step(input_of({pool_stage("db", pool_state(2 * GiB, 0, 0, {}))}));
  REQUIRE(out.rules.count("db"));
  CHECK(out.rules.at("db") == expected);

  // The pool now holds what was sent: nothing to send.
  out = p.step(input_of({pool_stage("db", pool_state(2 * GiB, 128 * MiB, 0, {}))}));
  CHECK(out.rules.empty());

  // The pool reports another reservation (it was recreated): sent again.
  out = p.step(input_of({pool_stage("db", pool_state(2 * GiB, 0, 0, {}))}));
  CHECK(out.rules.at("db") == expected);

  // A weight the pool holds differs from the configured one: sent again.
  out =
      p.step(input_of({pool_stage("db", pool_state(2 * GiB, 128 * MiB, 0, {{3, 0, 0, 0, 0, 5}}))}));
  CHECK(out.rules.at("db") == expected);

  // The stage reconnected: sent again, whatever the pool says.
  out = p.step(input_of({pool_stage("db", pool_state(2 * GiB, 128 * MiB, 0, {}), 0, 2)}));
  CHECK(out.rules.at("db") == expected);
  out = p.step(input_of({pool_stage("db", pool_state(2 * GiB, 128 * MiB, 0, {}), 0, 2)}));
  CHECK(out.rules.empty());

  // A stage without the pool gets nothing; one whose object is of another
  // type neither, with an error in the report.
  StageView plain;
  plain.name = "plain";
  out = p.step(input_of({plain, pool_stage("odd", json::object(), 0, 1, "fg", "drl")}));
  CHECK(out.rules.empty());
  CHECK(out.report.at("errors").at("odd").get<std::string>().find("not a 'buffer-pool'") !=
        std::string::npos);
}

TEST_CASE("step: every channel that has the pool, and the object's configured name",
          "[delta_fair][step]") {
  json cfg = paper_config(0);
  cfg["write_buffer"]["object"] = "wb";
  DeltaFairPolicy p;
  REQUIRE(p.configure(cfg).is_ok());
  StageView st = pool_stage("db", json::object(), 0, 1, "a", "buffer-pool", "wb");
  StageView other = pool_stage("x", json::object(), 0, 1, "b", "buffer-pool", "wb");
  st.stats.channels.push_back(other.stats.channels.front());
  st.info.channels.push_back(other.info.channels.front());
  const PolicyOutput out = p.step(input_of({st}));
  const json& rules = out.rules.at("db").value().at("rules");
  REQUIRE(rules.size() == 2);
  CHECK(rules[0].at("channel") == "a");
  CHECK(rules[1].at("channel") == "b");
  CHECK(rules[0].at("object") == "wb");
  CHECK(rules[0].at("config").at("reserved") == 256 * MiB);  // δ = 0: D
}

TEST_CASE("admit: a new stage gets its pool configured before its first step",
          "[delta_fair][step]") {
  DeltaFairPolicy p;
  REQUIRE(p.configure(paper_config()).is_ok());
  StageView hello = pool_stage("db", json::object());
  hello.stats = StageStats{};  // a hello carries the description only
  const RulesBatch first = p.admit(input_of({hello}));
  CHECK(first == json{{"version", 1},
                      {"rules", {configure_rule("fg", 2 * GiB, 128 * MiB, weights_of(16))}}});
  // Its first step sends nothing more.
  CHECK(p.step(input_of({pool_stage("db", pool_state(2 * GiB, 128 * MiB, 0, {}))})).rules.empty());
  // A stage without the pool: nothing.
  StageView plain;
  plain.name = "plain";
  CHECK(p.admit(input_of({plain})).value().is_null());
}

TEST_CASE("measured R_write: the flush rate while writers wait, smoothed", "[delta_fair][step]") {
  json cfg = paper_config();
  cfg["write_buffer"]["flush_bandwidth"] = "measured";
  cfg["write_buffer"]["flush_bandwidth_initial"] = 380 * MiB;
  cfg["write_buffer"]["flush_smoothing"] = 0.5;
  DeltaFairPolicy p;
  REQUIRE(p.configure(cfg).is_ok());
  CHECK(p.flush_bandwidth() == 380.0 * MiB);
  CHECK(p.explain()["reservations"]["write_buffer"]["flush_bandwidth_source"] == "initial");

  // Nobody waits: flushing gets what it needs, which says nothing of what
  // it could get. R_write stays.
  PolicyOutput out = p.step(input_of({pool_stage("db", pool_state(2 * GiB, 0, 0, {}), 64 * MiB)}));
  CHECK(p.flush_bandwidth() == 380.0 * MiB);
  CHECK(out.report.at("flush_bandwidth").at("estimate").at("backlogged") == false);
  CHECK(out.rules.at("db")["rules"][0]["config"]["reserved"] == 128 * MiB);

  // Writers queued at the collect: 180 MiB flushed in the second. Halfway
  // from 380: 280 MiB/s. 280 * 0.35 / 64 = 1.53 segments, of which one
  // whole: 256 - 64 = 192 MiB reserved.
  out = p.step(input_of({pool_stage("db", pool_state(2 * GiB, 128 * MiB, 3, {}), 180 * MiB)}));
  CHECK(p.flush_bandwidth() == 280.0 * MiB);
  CHECK(out.report.at("flush_bandwidth").at("source") == "measured");
  CHECK(out.report.at("flush_bandwidth").at("estimate").at("rate") == 180.0 * MiB);
  CHECK(out.rules.at("db")["rules"][0]["config"]["reserved"] == 192 * MiB);

  // An acquire that waited in the interval (the object's wait histogram)
  // counts as backlog too; two stages' flushes add up.
  StageView a = pool_stage("db", pool_state(2 * GiB, 192 * MiB, 0, {}), 200 * MiB);
  StageView b = pool_stage("db2", pool_state(2 * GiB, 192 * MiB, 0, {}), 280 * MiB);
  a.stats.channels[0].objects[0].wait.buckets[5] = 1;
  out = p.step(input_of({a, b}));
  CHECK(p.flush_bandwidth() == 380.0 * MiB);  // 280 + (480 - 280) / 2
  CHECK(out.rules.at("db")["rules"][0]["config"]["reserved"] == 128 * MiB);
  CHECK(out.rules.at("db2")["rules"][0]["config"]["reserved"] == 128 * MiB);
}

TEST_CASE("measured R_write without a starting value: ρ = D until measured", "[delta_fair][step]") {
  json cfg = paper_config();
  cfg["write_buffer"]["flush_bandwidth"] = "measured";
  DeltaFairPolicy p;
  REQUIRE(p.configure(cfg).is_ok());
  CHECK(p.reservation().reserved == 256 * MiB);
  CHECK(p.explain()["reservations"]["write_buffer"]["flush_bandwidth_source"] == "none");
  CHECK(p.explain()["reservations"]["write_buffer"]["worst_case_delay_ms"].is_null());
  p.step(input_of({pool_stage("db", pool_state(2 * GiB, 0, 2, {}), 380 * MiB)}));
  CHECK(p.flush_bandwidth() == 380.0 * MiB);  // the first measurement, unsmoothed
  CHECK(p.reservation().reserved == 128 * MiB);
}

TEST_CASE("report: reservations, and per tenant the pools' counters summed over stages",
          "[delta_fair][step]") {
  DeltaFairPolicy p;
  REQUIRE(p.configure(paper_config()).is_ok());
  const PolicyOutput out = p.step(input_of(
      {pool_stage("a", pool_state(2 * GiB, 128 * MiB, 1, {{1, 100, 2, 3000, 1}, {99, 7, 0, 0, 0}})),
       pool_stage("b", pool_state(2 * GiB, 128 * MiB, 0, {{1, 50, 1, 1000, 0}}))}));
  const json& r = out.report;
  CHECK(r.at("policy") == "delta-fair");
  CHECK(r.at("reservations").at("write_buffer").at("reserved_bytes") == 128 * MiB);
  CHECK(r.at("flush_bandwidth").at("in_use") == 380.0 * MiB);
  const json& t01 = r.at("tenants").at("t01");
  CHECK(t01.at("id") == 1);
  CHECK(t01.at("fair_share") == 128 * MiB);
  CHECK(t01.at("reserved") == 64 * MiB);
  CHECK(t01.at("usage") == 150.0);
  CHECK(t01.at("stalls") == 3.0);
  CHECK(t01.at("stall_ns") == 4000.0);
  CHECK(t01.at("queued") == 1.0);
  CHECK_FALSE(r.at("tenants").at("t02").contains("usage"));  // no pool lists it
  CHECK(r.at("other_flows").at("99").at("usage") == 7.0);
  CHECK(r.at("stages").at("a").at("queued") == 1.0);
  CHECK(r.at("stages").at("a").at("sent") == true);
}

TEST_CASE("departed and long-absent stages are forgotten", "[delta_fair][step]") {
  DeltaFairPolicy p;
  REQUIRE(p.configure(paper_config()).is_ok());
  const StageView db = pool_stage("db", pool_state(2 * GiB, 128 * MiB, 0, {}));
  CHECK_FALSE(p.step(input_of({db})).rules.empty());
  CHECK(p.step(input_of({db})).rules.empty());
  PolicyInput gone = input_of({});
  gone.departed = {"db"};
  CHECK(p.step(gone).report.at("departed") == json::array({"db"}));
  // Back under the same name: a stage like any new one.
  CHECK_FALSE(p.step(input_of({db})).rules.empty());
  for (int i = 0; i <= DeltaFairPolicy::kForgetAfterAbsentSteps; ++i) p.step(input_of({}));
  CHECK_FALSE(p.step(input_of({db})).rules.empty());
}

}  // namespace
}  // namespace sluice
