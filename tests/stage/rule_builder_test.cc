// The typed rule builder (sluice/rule_builder.h): the JSON it writes, what a
// stage makes of it, and the values it refuses, with the stage's own messages.
#include <cmath>
#include <limits>
#include <string>

#include <catch2/catch.hpp>

#include "sluice/rule_builder.h"
#include "sluice/stage.h"

using namespace sluice;
using nlohmann::json;

namespace {

std::string error_of(const RulesBuilder& b) {
  auto batch = b.build();
  REQUIRE_FALSE(batch.is_ok());
  CHECK(batch.status().code() == Code::kInvalidArgument);
  return batch.status().message();
}

const ChannelInfo& channel_of(const StageInfo& info, const std::string& name) {
  for (const auto& c : info.channels) {
    if (c.name == name) return c;
  }
  FAIL("no channel " << name);
  return info.channels.front();
}

}  // namespace

TEST_CASE("the builder writes each rule as docs/rules.md spells it", "[rules][builder]") {
  RulesBuilder b;
  b.differentiate({Classifier::kOrigin, Classifier::kOperation})
      .create_channel(
          "flush",
          ChannelOptions().matching(Match().origins({"flush"})).selecting({Classifier::kTenant}))
      .create_channel("fg", ChannelOptions().as_default())
      .create_object("flush", "limit", "drl",
                     ObjectConfig().set("rate", std::int64_t{10485760}).set("unit", "bytes"))
      .create_object("fg", "monitor", "noop", ObjectConfig())
      .create_object("fg", "plain", "noop")
      .create_object("flush", "t7", "noop", std::nullopt,
                     ObjectOptions().matching(Match().tenants({7})).as_default())
      .route("flush", Match().operations({Op::kWrite}).levels({0, 1}), "limit")
      .configure("flush", "limit", ObjectConfig().set("rate", 2.5e6).set("burst", 4096u))
      .remove_object("fg", "plain")
      .remove_channel("gone");
  auto batch = b.build();
  REQUIRE(batch.is_ok());
  CHECK(b.size() == 11);
  const json want = json::parse(R"({"version": 1, "rules": [
    {"rule": "differentiate", "classifiers": ["origin", "operation"]},
    {"rule": "create_channel", "channel": "flush", "match": {"origin": ["flush"]},
     "classifiers": ["tenant"]},
    {"rule": "create_channel", "channel": "fg", "default": true},
    {"rule": "create_object", "channel": "flush", "object": "limit", "type": "drl",
     "config": {"rate": 10485760, "unit": "bytes"}},
    {"rule": "create_object", "channel": "fg", "object": "monitor", "type": "noop", "config": {}},
    {"rule": "create_object", "channel": "fg", "object": "plain", "type": "noop"},
    {"rule": "create_object", "channel": "flush", "object": "t7", "type": "noop",
     "match": {"tenant": [7]}, "default": true},
    {"rule": "route", "channel": "flush", "object": "limit",
     "match": {"operation": ["write"], "level": [0, 1]}},
    {"rule": "configure", "channel": "flush", "object": "limit",
     "config": {"rate": 2500000.0, "burst": 4096}},
    {"rule": "remove_object", "channel": "fg", "object": "plain"},
    {"rule": "remove_channel", "channel": "gone"}]})");
  CHECK(*batch == want);
  // Integers stay integers on the wire, numbers that are not stay numbers.
  CHECK((*batch)["rules"][3]["config"]["rate"].is_number_integer());
  CHECK((*batch)["rules"][8]["config"]["rate"].is_number_float());
  CHECK((*batch)["rules"][8]["config"]["burst"].is_number_unsigned());
}

TEST_CASE("a built batch is what the stage applies: channels, objects, configs",
          "[rules][builder]") {
  RulesBuilder b;
  b.differentiate({Classifier::kOrigin})
      .create_channel("flush", ChannelOptions().matching(Match().origins({"flush", "wal"})))
      .create_object("flush", "limit", "drl", ObjectConfig().set("rate", 1048576))
      .create_channel("fg", ChannelOptions().as_default())
      .create_object("fg", "monitor", "noop", ObjectConfig());
  auto batch = b.build();
  REQUIRE(batch.is_ok());
  auto stage = Stage::create().value();
  REQUIRE(stage->apply(*batch).is_ok());
  const StageInfo info = stage->info();
  CHECK(info.classifiers == std::vector<std::string>{"origin"});
  REQUIRE(info.channels.size() == 2);
  const ChannelInfo& flush = channel_of(info, "flush");
  CHECK(flush.match == json::array({json{{"origin", {"flush", "wal"}}}}));
  CHECK_FALSE(flush.is_default);
  REQUIRE(flush.objects.size() == 1);
  CHECK(flush.objects[0].name == "limit");
  CHECK(flush.objects[0].type == "drl");
  const ChannelInfo& fg = channel_of(info, "fg");
  CHECK(fg.is_default);
  REQUIRE(fg.objects.size() == 1);
  CHECK(fg.objects[0].type == "noop");

  // A configure batch changes the object's rate, as the stage reports it.
  RulesBuilder c;
  c.configure("flush", "limit", ObjectConfig().set("rate", 2097152));
  auto again = c.build();
  REQUIRE(again.is_ok());
  REQUIRE(stage->apply(*again).is_ok());
  double rate = 0;
  for (const auto& ch : stage->totals().channels) {
    for (const auto& o : ch.objects) {
      if (ch.name == "flush" && o.name == "limit") rate = o.state.at("rate").get<double>();
    }
  }
  CHECK(rate == 2097152);
  // And Stage::check_rules takes every batch the builder gives.
  CHECK(Stage::check_rules(*batch).is_ok());
  CHECK(Stage::check_rules(*again).is_ok());
}

TEST_CASE("an empty builder gives an empty batch", "[rules][builder]") {
  RulesBuilder b;
  CHECK(b.empty());
  auto batch = b.build();
  REQUIRE(batch.is_ok());
  CHECK(*batch == json{{"version", 1}, {"rules", json::array()}});
}

TEST_CASE("the builder refuses what a stage would, naming the rule and field", "[rules][builder]") {
  CHECK(error_of(RulesBuilder().create_channel("fl ush")) ==
        "rules[0].channel: must be a name of 1-64 characters of A-Z a-z 0-9 _ . : -, got "
        "\"fl ush\"");
  CHECK(error_of(RulesBuilder().remove_channel("a").configure("a", "", ObjectConfig())) ==
        "rules[1].object: must be a name of 1-64 characters of A-Z a-z 0-9 _ . : -, got \"\"");
  CHECK(error_of(RulesBuilder().create_object("a", "b", std::string(65, 't'))) ==
        "rules[0].type: must be a name of 1-64 characters of A-Z a-z 0-9 _ . : -, got \"" +
            std::string(65, 't') + "\"");
  CHECK(error_of(RulesBuilder().create_channel(
            "a", ChannelOptions().matching(Match().origins({"no spaces"})))) ==
        "rules[0].match.origin[0]: invalid origin name \"no spaces\" (1-63 characters of A-Z a-z "
        "0-9 _ . : -)");
  CHECK(error_of(RulesBuilder().differentiate({Classifier::kOrigin, Classifier::kOrigin})) ==
        "rules[0].classifiers[1]: classifier \"origin\" is listed twice");
  CHECK(error_of(
            RulesBuilder().create_channel("a", ChannelOptions().matching(Match().levels({256})))) ==
        "rules[0].match.level[0]: must be an integer from 0 to 255, got 256");
  CHECK(error_of(RulesBuilder().add_json(json{{"rule", "configure"}, {"channel", "a"}})) ==
        "rules[0].object: missing");
  // Numbers JSON cannot carry: refused rather than sent as null.
  CHECK(error_of(RulesBuilder().remove_channel("x").configure(
            "a", "b", ObjectConfig().set("rate", std::nan("")))) ==
        "rules[1].config.rate: must be a finite number, got nan");
  CHECK(error_of(RulesBuilder().create_object(
            "a", "b", "drl",
            ObjectConfig().set("burst", 1).set("rate", std::numeric_limits<double>::infinity()))) ==
        "rules[0].config.rate: must be a finite number, got inf");
}

TEST_CASE("a config field set twice keeps the last value", "[rules][builder]") {
  ObjectConfig c;
  c.set("rate", 1).set("rate", 2.5).set("on", true).set("unit", std::string("ops"));
  CHECK(c.fields() == json{{"rate", 2.5}, {"on", true}, {"unit", "ops"}});
  CHECK(c.error().is_ok());
  CHECK_FALSE(c.empty());
  CHECK(ObjectConfig().empty());
}
