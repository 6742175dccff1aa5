// A stage's description in JSON (to_json / stage_info_from_json) and the rule
// for stage names (valid_stage_name).
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "sluice/board.h"
#include "sluice/stage.h"

using namespace sluice;
using nlohmann::json;

namespace {

json json_of(const StageInfo& s) {
  json j;
  to_json(j, s);
  return j;
}

StageInfo sample_info() {
  StageInfo s;
  s.name = "db@host+1";
  s.pid = 4242;
  s.labels = {{"app", "db_bench"}, {"tier", "gold"}};
  s.classifiers = {"origin"};
  s.rules_version = 7;
  ChannelInfo fg;
  fg.name = "fg";
  fg.classifiers = {"operation"};
  fg.match = json::array({{{"origin", "foreground"}}});
  ObjectInfo limit;
  limit.name = "limit";
  limit.type = "drl";
  limit.match = json::array({{{"operation", "write"}}});
  limit.board_slot = 3;
  limit.board_tag = 99;
  limit.tunables = {"rate", "burst"};
  ObjectInfo pass;
  pass.name = "pass";
  pass.type = "noop";
  pass.is_default = true;
  fg.objects = {limit, pass};
  ChannelInfo rest;
  rest.name = "rest";
  rest.is_default = true;
  s.channels = {fg, rest};
  return s;
}

}  // namespace

TEST_CASE("a description survives its JSON form both ways", "[stage_info]") {
  const StageInfo in = sample_info();
  auto back = stage_info_from_json(json_of(in));
  REQUIRE(back.is_ok());
  CHECK(back->name == in.name);
  CHECK(back->pid == in.pid);
  CHECK(back->labels == in.labels);
  CHECK(back->classifiers == in.classifiers);
  CHECK(back->rules_version == in.rules_version);
  REQUIRE(back->channels.size() == 2);
  const ChannelInfo& fg = back->channels[0];
  CHECK(fg.name == "fg");
  CHECK(fg.classifiers == std::vector<std::string>{"operation"});
  CHECK(fg.match == in.channels[0].match);
  CHECK_FALSE(fg.is_default);
  CHECK(back->channels[1].is_default);
  REQUIRE(fg.objects.size() == 2);
  CHECK(fg.objects[0].type == "drl");
  CHECK(fg.objects[0].match == in.channels[0].objects[0].match);
  CHECK(fg.objects[0].board_slot == 3);
  CHECK(fg.objects[0].board_tag == 99);
  CHECK(fg.objects[0].tunables == std::vector<std::string>{"rate", "burst"});
  CHECK(fg.objects[1].board_slot == -1);  // none written, none read
  CHECK(fg.objects[1].is_default);
  // And the JSON of what came back is the JSON that went.
  CHECK(json_of(*back) == json_of(in));
}

TEST_CASE("a live stage's description survives its JSON form", "[stage_info]") {
  StageOptions o;
  o.name = "live";
  o.labels = {{"app", "test"}};
  auto stage = Stage::create(o);
  REQUIRE(stage.is_ok());
  REQUIRE((*stage)
              ->apply(json::parse(R"({"version": 1, "rules": [
                {"rule": "create_channel", "channel": "all", "default": true},
                {"rule": "create_object", "channel": "all", "object": "limit", "type": "drl",
                 "config": {"rate": 1048576}}]})"))
              .is_ok());
  REQUIRE((*stage)->board().is_ok());  // the drl gets a slot, listed in its description
  const StageInfo info = (*stage)->info();
  REQUIRE(info.channels.at(0).objects.at(0).board_slot >= 0);
  auto back = stage_info_from_json(json_of(info));
  REQUIRE(back.is_ok());
  CHECK(json_of(*back) == json_of(info));
}

TEST_CASE("a description that is not one is an error", "[stage_info]") {
  CHECK_FALSE(stage_info_from_json(json::array()).is_ok());
  CHECK_FALSE(stage_info_from_json(json{{"channels", "all"}}).is_ok());
  CHECK_FALSE(stage_info_from_json(json{{"channels", {1, 2}}}).is_ok());
  CHECK(stage_info_from_json(json{{"name", 5}}).status().message().rfind("info: ", 0) == 0);
  // What only informs is taken leniently: labels and classifiers that are
  // not strings are left out, objects that are not objects skipped.
  auto lenient = stage_info_from_json(json{{"labels", {{"a", "x"}, {"b", 1}}},
                                           {"classifiers", {"origin", 3}},
                                           {"channels", {{{"name", "c"}, {"objects", {1}}}}}});
  REQUIRE(lenient.is_ok());
  CHECK(lenient->labels.size() == 1);
  CHECK(lenient->classifiers == std::vector<std::string>{"origin"});
  CHECK(lenient->channels.at(0).objects.empty());
}

TEST_CASE("a description's board bindings are taken only when well-formed", "[stage_info]") {
  auto binding = [](const json& board) {
    json info = {{"name", "s"},
                 {"channels",
                  {{{"name", "all"},
                    {"objects", {{{"name", "limit"}, {"type", "drl"}, {"board", board}}}}}}}};
    auto parsed = stage_info_from_json(info);
    REQUIRE(parsed.is_ok());
    return parsed->channels.at(0).objects.at(0);
  };
  const auto ok = binding({{"slot", 3}, {"tag", 9}, {"tunables", {"rate", "burst"}}});
  CHECK(ok.board_slot == 3);
  CHECK(ok.board_tag == 9);
  CHECK(ok.tunables == std::vector<std::string>{"rate", "burst"});
  // A slot beyond the board, a negative one, a tag that is no count,
  // tunables that are not names or too many of them: no binding (the daemon
  // then sends that object messages only), never an error or a crash.
  for (const json& bad :
       {json{{"slot", kBoardSlots}, {"tag", 1}, {"tunables", {"rate"}}},
        json{{"slot", -1}, {"tag", 1}, {"tunables", {"rate"}}},
        json{{"slot", 0}, {"tag", "x"}, {"tunables", {"rate"}}},
        json{{"slot", 0}, {"tag", 1}, {"tunables", {1, 2}}},
        json{{"slot", 0}, {"tag", 1}, {"tunables", json(std::vector<std::string>(13, "r"))}},
        json{{"slot", 0}, {"tag", 1}}, json("slot 0")}) {
    INFO(bad.dump());
    CHECK(binding(bad).board_slot == -1);
  }
}

TEST_CASE("one rule for stage names", "[stage_info]") {
  const std::vector<std::string> good_names = {"a",
                                               "db-1",
                                               "rocksdb.main:L0",
                                               "user@host+db",
                                               "A_b.c:d@e+f-g",
                                               std::string(kMaxStageNameLength, 'x')};
  for (const std::string& good : good_names) {
    INFO(good);
    CHECK(valid_stage_name(good));
  }
  const std::vector<std::string> bad_names = {std::string(),
                                              std::string(kMaxStageNameLength + 1, 'x'),
                                              "bad name",
                                              "a/b",
                                              "a\nb",
                                              "caf\xc3\xa9",
                                              std::string("x\0y", 3)};
  for (const std::string& bad : bad_names) {
    INFO(bad);
    CHECK_FALSE(valid_stage_name(bad));
  }
  // Stage::create applies it, as the preload and the daemon do.
  StageOptions o;
  o.name = "user@host+" + std::string(kMaxStageNameLength - 10, 'x');
  CHECK(Stage::create(o).is_ok());
  o.name += "x";
  auto refused = Stage::create(o);
  REQUIRE_FALSE(refused.is_ok());
  CHECK(refused.status().message().find(std::string(kStageNameRule)) != std::string::npos);
}
