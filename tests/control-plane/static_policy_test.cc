// The `static` policy and the policy registry: tables of inputs and outputs.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "policy_doc.h"
#include "sluice/policy.h"

using nlohmann::json;
using sluice::PolicyInput;
using sluice::StageView;

namespace {

const json kPolicyBatch = json::parse(R"({"version": 1, "rules": [
  {"rule": "create_channel", "channel": "all", "default": true},
  {"rule": "create_object", "channel": "all", "object": "limit", "type": "drl",
   "config": {"rate": 1048576}}]})");

StageView view(const std::string& name, std::int64_t connected_at,
               std::vector<std::string> channels = {}) {
  StageView v;
  v.name = name;
  v.connected_at_ns = connected_at;
  for (auto& c : channels) {
    sluice::ChannelInfo ci;
    ci.name = c;
    v.info.channels.push_back(ci);
  }
  return v;
}

std::unique_ptr<sluice::Policy> make(const json& config) {
  auto p = sluice::make_policy("static", config);
  REQUIRE(p.is_ok());
  return std::move(*p);
}

}  // namespace

TEST_CASE("static sends its batch once per stage connection", "[static]") {
  auto p = make(json{{"rules", kPolicyBatch}});
  PolicyInput in;
  in.stages = {view("a", 1), view("b", 2)};
  auto out = p->step(in);
  REQUIRE(out.rules.size() == 2);
  CHECK(out.rules["a"]["rules"] == kPolicyBatch["rules"]);

  // Nothing new: nothing sent.
  out = p->step(in);
  CHECK(out.rules.empty());

  // "a" reconnected (a new connection time) with the rules it kept: it gets
  // the batch again, prefixed by the removal of what it has.
  in.stages = {view("a", 10, {"all"}), view("b", 2)};
  out = p->step(in);
  REQUIRE(out.rules.size() == 1);
  const json& r = out.rules["a"]["rules"];
  REQUIRE(r.size() == kPolicyBatch["rules"].size() + 1);
  CHECK(r[0] == json{{"rule", "remove_channel"}, {"channel", "all"}});

  // "b" departs and comes back with the same connection time: resent.
  in.stages = {view("a", 10, {"all"})};
  in.departed = {"b"};
  out = p->step(in);
  CHECK(out.rules.empty());
  in.departed.clear();
  in.stages = {view("a", 10, {"all"}), view("b", 2)};
  out = p->step(in);
  CHECK(out.rules.count("b") == 1);
}

TEST_CASE("static gives a stage its batch at its hello, and not again at the step", "[static]") {
  auto p = make(json{{"rules", kPolicyBatch}, {"stages", {{"bare", json::array()}}}});
  PolicyInput hello;
  hello.stages = {view("a", 1, {"old"})};
  const sluice::RulesBatch first = p->admit(hello);
  REQUIRE(first->at("rules").size() == 3);
  CHECK(first->at("rules")[0] == json({{"rule", "remove_channel"}, {"channel", "old"}}));
  PolicyInput in;
  in.stages = {view("a", 1, {"all"})};
  CHECK(p->step(in).rules.empty());
  // A stage its configuration gives an empty batch gets that.
  hello.stages = {view("bare", 2)};
  CHECK(p->admit(hello)->at("rules").empty());
}

TEST_CASE("static builds a batch once for the stages that get the same one", "[static]") {
  auto p = make(json{{"rules", kPolicyBatch}, {"stages", {{"special", kPolicyBatch}}}});
  PolicyInput in;
  in.stages = {view("a", 1, {"all"}),    view("b", 2, {"all"}), view("c", 3, {"x", "y"}),
               view("d", 4, {"x", "y"}), view("e", 5),          view("special", 6, {"all"})};
  auto out = p->step(in);
  REQUIRE(out.rules.size() == 6);
  // Same batch and same channels to remove: one value, which the daemon then
  // serialises once. Any difference: a value of its own.
  CHECK(out.rules["a"].same_as(out.rules["b"]));
  CHECK(out.rules["c"].same_as(out.rules["d"]));
  CHECK_FALSE(out.rules["a"].same_as(out.rules["c"]));
  CHECK_FALSE(out.rules["a"].same_as(out.rules["e"]));
  // "special" matches its own entry (equal to the default batch, but another one).
  CHECK_FALSE(out.rules["a"].same_as(out.rules["special"]));
  CHECK(out.rules["a"] == out.rules["special"]);
  CHECK(out.rules["c"]["rules"][1] == json{{"rule", "remove_channel"}, {"channel", "y"}});
  CHECK(out.rules["e"]["rules"] == kPolicyBatch["rules"]);
}

TEST_CASE("a RulesBatch is a shared immutable value", "[policy]") {
  sluice::RulesBatch none;
  CHECK(none.value().is_null());
  sluice::RulesBatch a = kPolicyBatch;
  sluice::RulesBatch b = a;  // a copy shares the value
  CHECK(b.same_as(a));
  CHECK(b.identity() == a.identity());
  sluice::RulesBatch c = kPolicyBatch;  // an equal value of its own
  CHECK_FALSE(c.same_as(a));
  CHECK(c == a);
  CHECK(a == kPolicyBatch);
  CHECK_FALSE(a == json::array());
  const json& j = a;  // reads as the JSON it holds
  CHECK(&j == &a.value());
  CHECK(a["version"] == 1);
  CHECK(a->at("rules").size() == 2);
  CHECK_THROWS(a["nope"]);
}

TEST_CASE("the combined batch applies to a stage that kept the old rules", "[static]") {
  auto p = make(json{{"rules", kPolicyBatch}});
  auto stage = sluice::Stage::create();
  REQUIRE(stage.is_ok());
  REQUIRE((*stage)->apply(kPolicyBatch).is_ok());
  CHECK((*stage)->rules_version() == 1);
  PolicyInput in;
  StageView v = view("s", 5);
  v.info = (*stage)->info();
  in.stages = {v};
  auto out = p->step(in);
  REQUIRE(out.rules.count("s"));
  sluice::Status st = (*stage)->apply(out.rules["s"]);
  INFO(st.to_string());
  CHECK(st.is_ok());
  CHECK((*stage)->info().channels.size() == 1);
  CHECK((*stage)->rules_version() == 2);
  CHECK((*stage)->info().rules_version == 2);
}

TEST_CASE("static selects per-stage batches: exact name, longest glob, default", "[static]") {
  json other = json::array({{{"rule", "create_channel"}, {"channel", "x"}}});
  json third = json::array({{{"rule", "create_channel"}, {"channel", "y"}}});
  auto p = make(json{{"rules", kPolicyBatch},
                     {"stages", {{"db-1", other}, {"db-*", third}, {"*", other}}},
                     {"replace", false}});
  PolicyInput in;
  in.stages = {view("db-1", 1), view("db-2", 1), view("web", 1)};
  auto out = p->step(in);
  CHECK(out.rules["db-1"]["rules"] == other);
  CHECK(out.rules["db-2"]["rules"] == third);
  CHECK(out.rules["web"]["rules"] == other);

  auto q = make(json{{"stages", {{"db-*", third}}}});
  in.stages = {view("web", 1)};
  CHECK(q->step(in).rules.empty());  // no default batch: nothing for "web"
}

TEST_CASE("reconfiguring static resends to every stage", "[static]") {
  auto p = make(json{{"rules", kPolicyBatch}});
  PolicyInput in;
  in.stages = {view("a", 1)};
  CHECK(p->step(in).rules.size() == 1);
  CHECK(p->step(in).rules.empty());
  REQUIRE(p->configure(json{{"rules", kPolicyBatch}}).is_ok());
  CHECK(p->step(in).rules.size() == 1);
  CHECK(p->describe()["rules"] == kPolicyBatch);
}

TEST_CASE("static configuration errors name the field", "[static]") {
  auto err = [](const json& config) {
    auto p = sluice::make_policy("static", config);
    REQUIRE_FALSE(p.is_ok());
    return p.status().message();
  };
  json negative = kPolicyBatch;
  negative["rules"][1]["config"]["rate"] = -5;
  CHECK_THAT(err(json{{"rules", negative}}),
             Catch::Contains("config.rules: rules[1]") && Catch::Contains("rate"));
  CHECK_THAT(err(json{{"stages",
                       {{"a", json::array({{{"rule", "configure"},
                                            {"channel", "nope"},
                                            {"object", "x"},
                                            {"config", json::object()}}})}}}}),
             Catch::Contains("config.stages.a: "));
  CHECK_THAT(err(json{{"bogus", 1}}), Catch::Contains("config.bogus: unknown field"));
  CHECK_THAT(err(json{{"rules", 5}}), Catch::Contains("config.rules"));
  CHECK_THAT(err(json{{"rules_file", "/nonexistent/rules.json"}}),
             Catch::Contains("config.rules_file"));
  CHECK_THAT(err(json{{"rules", kPolicyBatch}, {"rules_file", "/x"}}), Catch::Contains("not both"));
  {
    // A number out of nlohmann's range is an error in the file, not an exception.
    const std::string path = "/tmp/sluice-static-overflow-" + std::to_string(::getpid()) + ".json";
    { std::ofstream(path) << R"([{"rule": "configure", "config": {"rate": 1e400}}])"; }
    CHECK_THAT(err(json{{"rules_file", path}}),
               Catch::Contains("invalid JSON: a number is out of range"));
    std::string policy = path + ".policy";
    { std::ofstream(policy) << R"({"policy": "static", "interval_ms": 1e400})"; }
    auto doc = sluice::control::load_policy_file(policy);
    REQUIRE_FALSE(doc.is_ok());
    CHECK_THAT(doc.status().message(), Catch::Contains("invalid JSON: a number is out of range"));
    std::remove(path.c_str());
    std::remove(policy.c_str());
  }
  // A device or a FIFO is refused unread: /dev/zero would fill memory, a FIFO
  // block the daemon.
  CHECK_THAT(err(json{{"rules_file", "/dev/zero"}}),
             Catch::Contains("config.rules_file") && Catch::Contains("regular file"));
  {
    auto doc = sluice::control::load_policy_file("/dev/zero");
    REQUIRE_FALSE(doc.is_ok());
    CHECK_THAT(doc.status().message(), Catch::Contains("regular file"));
  }
  auto unknown = sluice::make_policy("nope", json::object());
  REQUIRE_FALSE(unknown.is_ok());
  CHECK_THAT(unknown.status().message(),
             Catch::Contains("unknown policy 'nope'") && Catch::Contains("static"));
}

TEST_CASE("policy documents over the socket may not name files", "[static]") {
  using sluice::control::parse_policy_doc;
  auto d = parse_policy_doc(
      json{{"policy", "static"}, {"interval_ms", 50}, {"config", {{"rules", kPolicyBatch}}}}, true);
  REQUIRE(d.is_ok());
  CHECK(d->interval_ms == 50);
  auto f =
      parse_policy_doc(json{{"policy", "static"}, {"config", {{"rules_file", "/etc/x"}}}}, true);
  REQUIRE_FALSE(f.is_ok());
  CHECK_THAT(f.status().message(), Catch::Contains("config.rules_file") &&
                                       Catch::Contains("not accepted over the socket"));
  CHECK_FALSE(parse_policy_doc(json{{"interval_ms", 0}}, false).is_ok());
  CHECK_FALSE(parse_policy_doc(json{{"polcy", "static"}}, false).is_ok());
  CHECK(parse_policy_doc(json{{"policy", "static"}, {"config", {{"rules_file", "r.json"}}}}, false,
                         "/base")
            ->config["rules_file"] == "/base/r.json");
}

TEST_CASE("with replace false a batch may configure objects the stages already hold", "[static]") {
  const json rules = json::parse(
      R"([{"rule": "configure", "channel": "all", "object": "limit", "config": {"rate": 5}}])");
  auto p = make(json{{"rules", rules}, {"replace", false}});
  PolicyInput in;
  in.stages = {view("a", 1, {"all"})};
  auto out = p->step(in);
  REQUIRE(out.rules.size() == 1);
  CHECK(out.rules["a"]["rules"] == rules);  // as given: no remove_channel prefix

  // Standing alone (replace, the default) the same batch is refused.
  auto alone = sluice::make_policy("static", json{{"rules", rules}});
  REQUIRE_FALSE(alone.is_ok());
  CHECK(alone.status().message().find("channel 'all' does not exist") != std::string::npos);

  // A malformed rule is refused either way, naming the field.
  auto bad = sluice::make_policy(
      "static", json{{"rules", json::parse(R"([{"rule": "configure", "channel": "all"}])")},
                     {"replace", false}});
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().message().find("config.rules: rules[0]") != std::string::npos);
}
