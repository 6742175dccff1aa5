// The cache-reserve object: its configuration (errors naming the field,
// nothing changed on error, merges), the words caches read, acquire/release,
// collect with a cache's report, tunables, and the object in a stage's rules.
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "sluice/hold.h"
#include "sluice/objects/builtin.h"
#include "sluice/objects/cache_reserve.h"
#include "sluice/stage.h"
#include "test_util.h"

using nlohmann::json;
using sluice::CacheReserve;

namespace {

std::string reserve_error_of(const json& config, const json* first = nullptr) {
  CacheReserve r;
  if (first != nullptr) REQUIRE(r.configure(*first).is_ok());
  const json before = r.collect();
  const sluice::Status s = r.configure(config);
  CHECK(r.collect() == before);  // nothing changed
  CHECK(r.validate(config).message() == s.message());
  return s.message();
}

const json* reserve_flow_of(const json& stats, const json& id) {
  for (const json& f : stats["flows"]) {
    if (f["flow"] == id) return &f;
  }
  return nullptr;
}

struct FakeCache final : sluice::CacheReporter {
  void report(const std::function<void(std::uint64_t, const sluice::TenantLruStats&)>& each)
      const override {
    sluice::TenantLruStats s;
    s.usage = 300;
    s.pinned = 10;
    s.hits = 5;
    s.misses = 2;
    s.inserts = 7;
    s.inserted_bytes = 700;
    s.evictions = 4;
    each(7, s);
  }
};

}  // namespace

TEST_CASE("cache-reserve config: errors name the field and change nothing", "[cache]") {
  CHECK(reserve_error_of(json::object()) == "capacity: required (the cache's size in bytes)");
  CHECK(reserve_error_of({{"capacity", 0}})
            .starts_with("capacity: must be an integer number of bytes"));
  CHECK(reserve_error_of({{"capacity", -5}}).starts_with("capacity: must be an integer"));
  CHECK(reserve_error_of({{"capacity", 100}, {"reserved", {{"7", -1}}}}) ==
        "reserved.7: must be an integer number of bytes from 0 to capacity, got -1");
  CHECK(reserve_error_of({{"capacity", 100}, {"reserved", 5}})
            .starts_with("reserved: must be an object"));
  CHECK(reserve_error_of({{"capacity", 100}, {"reserved", {{"07", 1}}}})
            .starts_with("reserved: a flow id is a decimal integer"));
  CHECK(reserve_error_of({{"capacity", 100}, {"reserved_x", 1}})
            .starts_with("reserved_x: a flow id is a decimal integer"));
  CHECK(reserve_error_of({{"capacity", 100}, {"reserved", {{"1", 60}, {"2", 50}}}}) ==
        "reserved: the reservations sum to more than capacity (100 bytes)");
  CHECK(reserve_error_of({{"capacity", 100}, {"weight_3", 0}}) ==
        "weight_3: must be a number between 0.001 and 1000000, got 0");
  CHECK(reserve_error_of({{"capacity", 100}, {"flow_by", "disk"}}).starts_with("flow_by: must be"));
  CHECK(reserve_error_of({{"capacity", 100}, {"max_flows", 0}}).starts_with("max_flows: must be"));
  CHECK(reserve_error_of({{"capacity", 100}, {"speed", 1}}).starts_with("unknown field 'speed'"));
  const json first = {{"capacity", 100}, {"reserved_1", 60}, {"flow_by", "tenant"}};
  CHECK(reserve_error_of({{"capacity", 50}}, &first) ==
        "capacity: must be at least the reservations' sum, got 50");
  CHECK(reserve_error_of({{"reserved_2", 41}}, &first) ==
        "reserved: the reservations sum to more than capacity (100 bytes)");
  CHECK(reserve_error_of({{"flow_by", "origin"}}, &first)
            .starts_with("flow_by: cannot change once configured (it is \"tenant\")"));
}

TEST_CASE("cache-reserve: configuration merges; the words follow it", "[cache]") {
  CacheReserve r;
  REQUIRE(r.capacity() == 0);
  REQUIRE(r.configure({{"capacity", 1000}, {"reserved", {{"1", 100}}}, {"weight_2", 3}}).is_ok());
  const auto* w1 = r.reserved_word(1);
  const auto* w2 = r.reserved_word(2);
  const auto* w9 = r.reserved_word(9);
  CHECK(w1->load() == 100);
  CHECK(w2->load() == 0);
  const std::uint64_t e0 = r.epoch_word().load();
  REQUIRE(r.configure({{"reserved_2", 200}}).is_ok());
  CHECK(r.epoch_word().load() > e0);
  CHECK(w1->load() == 100);  // merged, kept
  CHECK(w2->load() == 200);
  CHECK(w9->load() == 0);
  CHECK(r.reserved_word(2) == w2);  // one word per flow, for the object's life
  REQUIRE(r.configure({{"reserved", {{"1", 0}}}}).is_ok());
  CHECK(w1->load() == 0);
  CHECK(r.capacity_word().load() == 1000);

  // Fair shares: weights 1 (flow 1), 3 (flow 2), 1 (flow 9): 200/600/200.
  const json stats = r.collect();
  CHECK(stats["capacity"] == 1000);
  CHECK(stats["reserved"] == 200);
  CHECK((*reserve_flow_of(stats, 1))["fair_share"] == 200);
  CHECK((*reserve_flow_of(stats, 2))["fair_share"] == 600);
  CHECK((*reserve_flow_of(stats, 2))["reserved"] == 200);
}

TEST_CASE("cache-reserve: capacity as a tunable and through set_capacity", "[cache]") {
  CacheReserve r;
  std::array<double, sluice::kMaxTunables> v{};
  v[0] = 500;
  CHECK(r.set_tunables(1, v).code() == sluice::Code::kFailedPrecondition);
  REQUIRE(r.configure({{"capacity", 1000}, {"reserved_1", 400}}).is_ok());
  REQUIRE(r.tunables().size() == 1);
  CHECK(r.tunables()[0] == "capacity");
  REQUIRE(r.set_tunables(1, v).is_ok());
  CHECK(r.capacity() == 500);
  v[0] = 300;
  CHECK(r.set_tunables(1, v).message() ==
        "capacity: must be at least the reservations' sum (400), got 300");
  v[0] = 0.5;
  CHECK(r.set_tunables(1, v).message().starts_with("capacity: must be an integer"));
  CHECK(r.set_tunables(2, v).message() == "cache-reserve has tunable capacity only");
  CHECK(r.capacity() == 500);
  REQUIRE(r.set_capacity(2000).is_ok());
  CHECK(r.collect()["capacity"] == 2000);
}

TEST_CASE("cache-reserve: acquire and release account a flow's usage; caches report theirs",
          "[cache]") {
  CacheReserve r;
  REQUIRE(r.configure({{"capacity", 1000}, {"max_flows", 1}}).is_ok());
  CHECK(r.holds_capacity());
  sluice::Context a{};
  a.tenant = 7;
  CHECK(r.acquire(a, 100).ok());
  CHECK(r.acquire(a, 50).ok());
  r.release(a, 30);
  sluice::Context b{};
  b.tenant = 8;  // beyond max_flows: "other"
  CHECK(r.acquire(b, 10).ok());
  r.release(b, 1000);  // clamped
  CHECK(r.enforce_context(a).ok());
  FakeCache cache;
  r.attach(&cache);
  json stats = r.collect();
  CHECK(stats["caches"] == 1);
  const json& f7 = *reserve_flow_of(stats, 7);
  CHECK(f7["usage"] == 120 + 300);
  CHECK(f7["inserts"] == 2 + 7);
  CHECK(f7["inserted_bytes"] == 100 + 50 + 700);
  CHECK(f7["hits"] == 5);
  CHECK(f7["misses"] == 2);
  CHECK(f7["evictions"] == 4);
  CHECK(f7["pinned"] == 10);
  CHECK(f7["evictions_below_reserved"] == 0);
  REQUIRE(reserve_flow_of(stats, "other") != nullptr);
  CHECK((*reserve_flow_of(stats, "other"))["usage"] == 0);
  CHECK(stats["used"] == 420);
  r.detach(&cache);
  stats = r.collect();
  CHECK(stats["caches"] == 0);
  CHECK((*reserve_flow_of(stats, 7))["usage"] == 120);
}

TEST_CASE("cache-reserve: created by rules, found in the stage by channel and name", "[cache]") {
  sluice::objects::register_builtin();
  auto stage = sluice::Stage::create();
  REQUIRE(stage.is_ok());
  REQUIRE((*stage)
              ->apply(json::parse(R"([
    {"rule": "create_channel", "channel": "reads", "default": true},
    {"rule": "create_object", "channel": "reads", "object": "read_cache", "type": "cache-reserve",
     "config": {"capacity": 4096, "reserved": {"1": 1024}}}])"))
              .is_ok());
  auto o = (*stage)->object("reads", "read_cache");
  REQUIRE(o != nullptr);
  CHECK(o->type() == "cache-reserve");
  CHECK((*stage)->object("reads", "nope") == nullptr);
  CHECK((*stage)->object("writes", "read_cache") == nullptr);
  auto* reserve = dynamic_cast<CacheReserve*>(o.get());
  REQUIRE(reserve != nullptr);
  const auto* w = reserve->reserved_word(1);
  CHECK(w->load() == 1024);
  REQUIRE((*stage)
              ->apply(json::parse(R"([{"rule": "configure", "channel": "reads",
                                       "object": "read_cache", "config": {"reserved_1": 2048}}])"))
              .is_ok());
  CHECK(w->load() == 2048);
  // A Hold through the stage counts in the flow.
  sluice::Context ctx{};
  ctx.tenant = 1;
  {
    sluice::Hold h = (*stage)->acquire(ctx, 512);
    CHECK(h.amount() == 512);
    CHECK((*reserve_flow_of(reserve->collect(), 1))["usage"] == 512);
  }
  CHECK((*reserve_flow_of(reserve->collect(), 1))["usage"] == 0);
  // Removed by rules, the object lives on for whoever holds it.
  REQUIRE((*stage)
              ->apply(json::parse(
                  R"([{"rule": "remove_object", "channel": "reads", "object": "read_cache"}])"))
              .is_ok());
  CHECK((*stage)->object("reads", "read_cache") == nullptr);
  CHECK(reserve->capacity() == 4096);
}
