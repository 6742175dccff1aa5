// Every way a rules batch can be wrong, with the exact message a user sees,
// and the guarantee that a failing batch changes nothing.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "mutate.h"
#include "sluice/json_text.h"
#include "sluice/objects/builtin.h"
#include "sluice/stage.h"

using namespace sluice;
using nlohmann::json;

namespace {

std::unique_ptr<Stage> base_stage() {
  auto stage = Stage::create().value();
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "differentiate", "classifiers": ["origin"]},
    {"rule": "create_channel", "channel": "flush", "match": {"origin": "flush"}},
    {"rule": "create_object", "channel": "flush", "object": "limit", "type": "drl",
     "config": {"rate": 1048576}}
  ])"))
              .is_ok());
  return stage;
}

std::string error_of(const std::string& rules) {
  auto stage = base_stage();
  auto before = stage->info();
  Status s = stage->apply_text(rules);
  auto after = stage->info();
  json a, b;
  to_json(a, before);
  to_json(b, after);
  CHECK(a == b);  // a rejected batch changes nothing
  return s.to_string();
}

}  // namespace

TEST_CASE("rules errors name the rule and the field") {
  struct Case {
    const char* rules;
    const char* error;
  };
  const Case cases[] = {
      {R"(not json)",
       "invalid argument: invalid JSON: [json.exception.parse_error.101] parse error at line 1, "
       "column 2: syntax error while parsing value - invalid literal"},
      {R"(42)", "invalid argument: rules: must be an array of rules (or an object with \"rules\")"},
      {R"({"rules": [], "extra": 1})", "invalid argument: unknown field 'extra'"},
      {R"({"version": 2, "rules": []})",
       "invalid argument: version: unsupported rules version 2 (expected 1)"},
      {R"({"version": 1})", "invalid argument: rules: missing"},
      {R"([7])", "invalid argument: rules[0]: must be an object, got 7"},
      {R"([{}])", "invalid argument: rules[0].rule: missing"},
      {R"([{"rule": 3}])", "invalid argument: rules[0].rule: must be a string, got 3"},
      {R"([{"rule": "create_chanel", "channel": "x"}])",
       "invalid argument: rules[0].rule: unknown rule \"create_chanel\" (expected create_channel, "
       "remove_channel, create_object, remove_object, differentiate, route, configure or lease)"},
      {R"([{"rule": "create_channel"}])", "invalid argument: rules[0].channel: missing"},
      {R"([{"rule": "lease", "fallback": []}])", "invalid argument: rules[0].ms: missing"},
      {R"([{"rule": "lease", "ms": 0, "fallback": []}])",
       "invalid argument: rules[0].ms: must be an integer from 1 to 86400000 (milliseconds), got "
       "0"},
      {R"([{"rule": "lease", "ms": 100}])", "invalid argument: rules[0].fallback: missing"},
      {R"([{"rule": "lease", "ms": 100, "fallback": [{"rule": "remove_channel", "channel": "flush"}]}])",
       "invalid argument: rules[0].fallback[0]: a lease falls back to configure rules only, got "
       "{\"channel\":\"flush\",\"rule\":\"remove_channel\"}"},
      {R"([{"rule": "lease", "ms": 100, "fallback": [{"rule": "configure", "channel": "flush",
            "object": "limit", "config": {"rate": 1}, "extra": 1}]}])",
       "invalid argument: rules[0].fallback[0]: unknown field 'extra'"},
      {R"([{"rule": "lease", "ms": 100, "fallback": [{"rule": "configure", "channel": "flush",
            "object": "nope", "config": {"rate": 1}}]}])",
       "not found: rules[0]: fallback[0]: object 'nope' does not exist in channel 'flush'"},
      {R"([{"rule": "lease", "ms": 100, "fallback": [{"rule": "configure", "channel": "flush",
            "object": "limit", "config": {"rate": -1}}]}])",
       "invalid argument: rules[0]: fallback[0]: config.rate: must be a positive number, got -1"},
      {R"([{"rule": "create_channel", "channel": "a b"}])",
       "invalid argument: rules[0].channel: must be a name of 1-64 characters of A-Z a-z 0-9 _ . : "
       "-, got \"a b\""},
      {R"([{"rule": "create_channel", "channel": "x", "colour": "red"}])",
       "invalid argument: rules[0]: unknown field 'colour'"},
      {R"([{"rule": "create_channel", "channel": "x", "default": "yes"}])",
       "invalid argument: rules[0].default: must be true or false, got \"yes\""},
      {R"([{"rule": "create_channel", "channel": "flush"}])",
       "already exists: rules[0]: channel 'flush' already exists"},
      {R"([{"rule": "remove_channel", "channel": "nope"}])",
       "not found: rules[0]: channel 'nope' does not exist"},
      {R"([{"rule": "create_channel", "channel": "x", "match": {"origin": "flush", "colour": 1}}])",
       "invalid argument: rules[0].match: unknown classifier 'colour' (expected one of workflow, "
       "operation, size_class, origin, tenant, level)"},
      {R"([{"rule": "create_channel", "channel": "x", "match": {"origin": "bad name"}}])",
       "invalid argument: rules[0].match.origin: invalid origin name \"bad name\" (1-63 characters "
       "of A-Z a-z 0-9 _ . : -)"},
      {R"([{"rule": "create_channel", "channel": "x", "match": {"origin": 5}}])",
       "invalid argument: rules[0].match.origin: must be an origin name, got 5"},
      {R"([{"rule": "differentiate", "classifiers": ["operation"]},
           {"rule": "create_channel", "channel": "x", "match": {"operation": "wirte"}}])",
       "invalid argument: rules[1].match.operation: unknown operation \"wirte\" (expected one of "
       "none, read, write, open, close, sync, put, get, delete, scan, merge, other, begin, commit, "
       "abort)"},
      {R"([{"rule": "create_channel", "channel": "x", "match": {"tenant": -1}}])",
       "invalid argument: rules[0].match.tenant: must be an integer from 0 to 4294967295, got -1"},
      {R"([{"rule": "create_channel", "channel": "x", "match": {"size_class": 65}}])",
       "invalid argument: rules[0].match.size_class: must be an integer from 0 to 64, got 65"},
      {R"([{"rule": "create_channel", "channel": "x", "match": {"level": [1, 256]}}])",
       "invalid argument: rules[0].match.level[1]: must be an integer from 0 to 255, got 256"},
      {R"([{"rule": "create_channel", "channel": "x", "match": {"level": []}}])",
       "invalid argument: rules[0].match.level: must not be an empty array"},
      {R"([{"rule": "create_channel", "channel": "x", "match": {"tenant": 1}}])",
       "invalid argument: channel 'x': match {\"tenant\":1} names classifier 'tenant', which the "
       "stage's differentiate rule does not select"},
      {R"([{"rule": "create_channel", "channel": "x", "match": {}}])",
       "invalid argument: channel 'x': match {} does not name classifier 'origin', which the "
       "stage's differentiate rule selects"},
      {R"([{"rule": "create_channel", "channel": "x", "match": {"origin": ["wal", "flush"]}}])",
       "invalid argument: channel 'x': match {\"origin\":[\"wal\",\"flush\"]} overlaps a match of "
       "channel 'flush'"},
      {R"([{"rule": "create_channel", "channel": "x", "default": true},
           {"rule": "create_channel", "channel": "y", "default": true}])",
       "invalid argument: channels 'x' and 'y' are both marked default"},
      {R"([{"rule": "differentiate"}])", "invalid argument: rules[0].classifiers: missing"},
      {R"([{"rule": "differentiate", "classifiers": "origin"}])",
       "invalid argument: rules[0].classifiers: must be an array of classifier names"},
      {R"([{"rule": "differentiate", "classifiers": ["origin", "origin"]}])",
       "invalid argument: rules[0].classifiers[1]: classifier \"origin\" is listed twice"},
      {R"([{"rule": "differentiate", "classifiers": ["thread"]}])",
       "invalid argument: rules[0].classifiers[0]: unknown classifier \"thread\" (expected one of "
       "workflow, operation, size_class, origin, tenant, level)"},
      {R"([{"rule": "differentiate", "channel": "nope", "classifiers": []}])",
       "not found: rules[0]: channel 'nope' does not exist"},
      {R"([{"rule": "route", "channel": "flush", "object": "limit", "match": {}},
           {"rule": "differentiate", "channel": "flush", "classifiers": ["tenant"]}])",
       "invalid argument: object 'flush/limit': match {} does not name classifier 'tenant', which "
       "the channel's differentiate rule selects"},
      {R"([{"rule": "create_object", "channel": "flush", "object": "o", "type": "drl"}])",
       "invalid argument: rules[0]: config.rate: required"},
      {R"([{"rule": "create_object", "channel": "flush", "object": "o", "type": "tbf"}])",
       "invalid argument: rules[0]: type: unknown object type 'tbf' (registered: buffer-pool, "
       "cache-reserve, deferral-gate, drft, drl, fq, noop, prio-bucket)"},
      {R"([{"rule": "create_object", "channel": "nope", "object": "o", "type": "noop"}])",
       "not found: rules[0]: channel 'nope' does not exist"},
      {R"([{"rule": "create_object", "channel": "flush", "object": "limit", "type": "noop"}])",
       "already exists: rules[0]: object 'limit' already exists in channel 'flush'"},
      {R"([{"rule": "create_object", "channel": "flush", "object": "o", "type": "noop", "config": 1}])",
       "invalid argument: rules[0].config: must be an object, got 1"},
      {R"([{"rule": "create_object", "channel": "flush", "object": "o", "type": "noop",
            "config": {"x": 1}}])",
       "invalid argument: rules[0]: config.unknown field 'x' (noop takes no configuration)"},
      {R"([{"rule": "create_object", "channel": "flush", "type": "noop"}])",
       "invalid argument: rules[0].object: missing"},
      {R"([{"rule": "remove_object", "channel": "flush", "object": "nope"}])",
       "not found: rules[0]: object 'nope' does not exist in channel 'flush'"},
      {R"([{"rule": "route", "channel": "flush"}])", "invalid argument: rules[0].match: missing"},
      {R"([{"rule": "route", "channel": "flush", "object": "nope", "match": {}}])",
       "not found: rules[0]: object 'nope' does not exist in channel 'flush'"},
      {R"([{"rule": "configure", "channel": "flush", "object": "limit"}])",
       "invalid argument: rules[0].config: missing"},
      {R"([{"rule": "configure", "channel": "flush", "object": "limit", "config": {"rate": -5}}])",
       "invalid argument: rules[0]: config.rate: must be a positive number, got -5"},
      {R"([{"rule": "configure", "channel": "flush", "object": "nope", "config": {}}])",
       "not found: rules[0]: object 'nope' does not exist in channel 'flush'"},
      // A valid rule followed by an invalid one: the whole batch is refused.
      {R"([{"rule": "create_channel", "channel": "ok"}, {"rule": "remove_channel", "channel": "zz"}])",
       "not found: rules[1]: channel 'zz' does not exist"},
      // Removals leading a batch (a replacing batch's) are applied as the
      // model is copied; they fail, and what follows sees them, as any rule.
      {R"([{"rule": "remove_channel", "channel": "flush"},
           {"rule": "remove_channel", "channel": "flush"}])",
       "not found: rules[1]: channel 'flush' does not exist"},
      {R"([{"rule": "remove_channel", "channel": "flush"},
           {"rule": "remove_channel", "channel": "zz"},
           {"rule": "create_channel", "channel": "flush"}])",
       "not found: rules[1]: channel 'zz' does not exist"},
      {R"([{"rule": "remove_channel", "channel": "flush"},
           {"rule": "configure", "channel": "flush", "object": "limit", "config": {"rate": 5}}])",
       "not found: rules[1]: channel 'flush' does not exist"},
      {R"([{"rule": "remove_channel", "channel": "flush"},
           {"rule": "create_channel", "channel": "a", "default": true},
           {"rule": "create_object", "channel": "a", "object": "o", "type": "drl",
            "config": {"rate": -1}}])",
       "invalid argument: rules[2]: config.rate: must be a positive number, got -1"},
  };
  for (const auto& c : cases) {
    INFO(c.rules);
    CHECK(error_of(c.rules) == c.error);
  }
}

TEST_CASE("a rejected configure leaves the object's state as it was") {
  auto stage = base_stage();
  REQUIRE_FALSE(stage
                    ->apply(json::parse(R"([
    {"rule": "configure", "channel": "flush", "object": "limit", "config": {"rate": 2048}},
    {"rule": "configure", "channel": "flush", "object": "limit", "config": {"rate": 0}}
  ])"))
                    .is_ok());
  auto stats = stage->collect();
  REQUIRE(stats.channels.size() == 1);
  CHECK(stats.channels[0].objects[0].state["rate"] == 1048576.0);
}

TEST_CASE("rules files: missing file, bad JSON, bad rule") {
  CHECK(Stage::from_rules_file("/nonexistent/rules.json").status().to_string() ==
        "I/O error: /nonexistent/rules.json: cannot open: No such file or directory");
  std::string path = "/tmp/sluice-test-rules-" + std::to_string(::getpid()) + ".json";
  { std::ofstream(path) << "[{\"rule\": \"create_channel\", \"channel\": \"x\"},\n {\"rule\": }]"; }
  CHECK(Stage::from_rules_file(path).status().to_string() ==
        "invalid argument: " + path +
            ": invalid JSON: [json.exception.parse_error.101] parse error at line 2, column 11: "
            "syntax error while parsing value - unexpected '}'; expected '[', '{', or a literal");
  {
    std::ofstream(path)
        << R"({"version": 1, "rules": [{"rule": "remove_channel", "channel": "x"}]})";
  }
  CHECK(Stage::from_rules_file(path).status().to_string() ==
        "not found: " + path + ": rules[0]: channel 'x' does not exist");
  // Valid JSON syntax with a number nlohmann cannot hold: an error, not an
  // exception.
  { std::ofstream(path) << R"([{"rule": "configure", "config": {"rate": 1e400}}])"; }
  CHECK(Stage::from_rules_file(path).status().to_string() ==
        "invalid argument: " + path + ": invalid JSON: a number is out of range");
  {
    std::ofstream(path)
        << R"({"version": 1, "rules": [{"rule": "create_channel", "channel": "x", "default": true},
      {"rule": "create_object", "channel": "x", "object": "n", "type": "noop"}]})";
  }
  auto stage = Stage::from_rules_file(path);
  REQUIRE(stage.is_ok());
  auto info = stage.value()->info();
  REQUIRE(info.channels.size() == 1);
  CHECK(info.channels[0].objects[0].type == "noop");
  CHECK(info.rules_version == 1);
  std::remove(path.c_str());
}

TEST_CASE("rules nested deeper than 64 levels are refused before they are parsed") {
  // 80,000 levels would overflow the stack of a recursive reader.
  const std::string path = "/tmp/sluice-test-deep-" + std::to_string(::getpid()) + ".json";
  for (const std::string& text :
       {std::string(80000, '[') + std::string(80000, ']'),
        "[{\"rule\": \"configure\", \"config\": " + std::string(100, '{') + "}]",
        "[" + std::string(65, '[') + std::string(65, ']') + "]"}) {
    { std::ofstream(path) << text; }
    CHECK(Stage::from_rules_file(path).status().to_string() ==
          "invalid argument: " + path +
              ": invalid JSON: nested deeper than 64 levels of arrays and objects");
    auto stage = Stage::create().value();
    CHECK(stage->apply_text(text).message() ==
          "invalid JSON: nested deeper than 64 levels of arrays and objects");
  }
  // Brackets inside strings do not count, and 64 levels are read: these get
  // as far as the rules' own checks.
  const std::string strings =
      R"([{"rule": "create_channel", "channel": ")" + std::string(100, '[') + R"("}])";
  const std::string at_limit = std::string(64, '[') + std::string(64, ']');
  for (const std::string& text : {strings, at_limit}) {
    const std::string got = Stage::create().value()->apply_text(text).message();
    INFO(got);
    CHECK(got.rfind("rules[0]", 0) == 0);
  }
  std::remove(path.c_str());
}

TEST_CASE("rules files: errors quote none of the file's bytes") {
  // The file may be one its reader can read and its user cannot (a setuid
  // program's): an error says what is wrong and where, never what is there.
  std::string path = "/tmp/sluice-test-rules-" + std::to_string(::getpid()) + ".json";
  const std::vector<std::string> texts = {
      "root:$6$SECRETSECRET:19000:0:99999:7:::\n",  // not JSON at all
      "\"SECRETSECRET",                             // an unterminated string
      "[{\"rule\": SECRETSECRET}]",                 // an invalid literal inside a rule
      "[1, 2, 3e99999SECRET]",                      // a number out of range
      "[{\"rule\": \"x\"} SECRET]",                 // a token where a comma belongs
  };
  for (const std::string& text : texts) {
    { std::ofstream(path) << text; }
    const std::string error = Stage::from_rules_file(path).status().to_string();
    INFO(text << " -> " << error);
    CHECK(error.rfind("invalid argument: " + path + ": invalid JSON: ", 0) == 0);
    CHECK(error.find("SECRET") == std::string::npos);
    CHECK(error.find("root") == std::string::npos);
    CHECK(error.find("last read") == std::string::npos);
  }
  std::remove(path.c_str());
}

TEST_CASE("rules files: only regular files, of at most 4 MiB") {
  const std::string dir = "/tmp/sluice-test-rules-" + std::to_string(::getpid());
  REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
  // Character devices: /dev/zero would fill memory, /dev/null reads empty.
  for (const char* dev : {"/dev/zero", "/dev/null"}) {
    CHECK(Stage::from_rules_file(dev).status().to_string() ==
          std::string("invalid argument: ") + dev +
              ": a character device; a rules file must be a regular file");
  }
  // A FIFO with no writer: refused at once, not waited on.
  const std::string fifo = dir + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(Stage::from_rules_file(fifo).status().to_string() ==
        "invalid argument: " + fifo + ": a FIFO; a rules file must be a regular file");
  CHECK(Stage::from_rules_file(dir).status().to_string() ==
        "invalid argument: " + dir + ": a directory; a rules file must be a regular file");
  // A symlink to a regular file is that file.
  const std::string file = dir + "/rules.json";
  const std::string link = dir + "/link.json";
  auto write_rules = [&](std::size_t padding) {
    std::ofstream out(file, std::ios::trunc);
    out << "[{\"rule\": \"create_channel\", \"channel\": \"x\", \"default\": true}";
    out << std::string(padding, ' ') << "]";
  };
  write_rules(0);
  REQUIRE(::symlink(file.c_str(), link.c_str()) == 0);
  CHECK(Stage::from_rules_file(link).is_ok());
  // Exactly kMaxRulesFileBytes is accepted; one byte more is not.
  write_rules(0);
  const auto base = static_cast<std::size_t>(std::ifstream(file, std::ios::ate).tellg());
  write_rules(kMaxRulesFileBytes - base);
  CHECK(Stage::from_rules_file(file).is_ok());
  write_rules(kMaxRulesFileBytes - base + 1);
  CHECK(Stage::from_rules_file(file).status().to_string() ==
        "invalid argument: " + file + ": larger than 4 MiB, the most a rules file may hold");
  CHECK(std::system(("rm -rf '" + dir + "'").c_str()) == 0);
}

TEST_CASE("invalid stage names are refused") {
  StageOptions o;
  o.name = "";
  CHECK(Stage::create(o).status().to_string() ==
        "invalid argument: stage name must be 1-128 characters of [A-Za-z0-9_.:@+-], got ''");
}

TEST_CASE("user types register without touching the core") {
  struct Mine final : EnforcementObject {
    std::string_view type() const noexcept override { return "mine"; }
    Status validate(const json&) const override { return {}; }
    Status configure(const json&) override { return {}; }
    Verdict enforce_context(const Context&) noexcept override { return {}; }
  };
  Registry reg;
  REQUIRE(objects::register_builtin(reg).is_ok());
  REQUIRE(
      reg.add({"mine", "test", [](const ObjectEnv&) { return std::make_unique<Mine>(); }}).is_ok());
  CHECK(reg.add({"mine", "again", [](const ObjectEnv&) { return std::make_unique<Mine>(); }})
            .to_string() == "already exists: object type 'mine' is already registered");
  CHECK(reg.add({"", "x", nullptr}).to_string() ==
        "invalid argument: object type name must not be empty");
  StageOptions o;
  o.registry = &reg;
  auto stage = Stage::create(o).value();
  REQUIRE(stage
              ->apply(json::parse(R"([{"rule": "create_channel", "channel": "c", "default": true},
      {"rule": "create_object", "channel": "c", "object": "m", "type": "mine"}])"))
              .is_ok());
  stage->enforce(Op::kRead, 5);
  auto stats = stage->collect();
  CHECK(stats.channels[0].objects[0].type == "mine");
  CHECK(stats.channels[0].objects[0].total.bytes == 5);
}

TEST_CASE("a replacing batch removes and recreates what it names, and only that", "[rules]") {
  auto stage = base_stage();
  REQUIRE(stage
              ->apply_text(R"([{"rule": "create_channel", "channel": "rest", "default": true},
      {"rule": "create_object", "channel": "rest", "object": "count", "type": "noop"}])")
              .is_ok());
  REQUIRE(stage
              ->apply_text(R"([{"rule": "remove_channel", "channel": "flush"},
      {"rule": "create_channel", "channel": "flush", "match": {"origin": "flush"}},
      {"rule": "create_object", "channel": "flush", "object": "limit", "type": "drl",
       "config": {"rate": 7}}])")
              .is_ok());
  const StageInfo info = stage->info();
  REQUIRE(info.channels.size() == 2);
  CHECK(info.channels[0].name == "rest");  // kept, in its place
  CHECK(info.channels[1].name == "flush");
  CHECK(stage->totals().channels[1].objects[0].state["rate"] == 7);
  // Removing every channel at the head of a batch leaves a stage with none.
  REQUIRE(stage
              ->apply_text(R"([{"rule": "remove_channel", "channel": "flush"},
      {"rule": "remove_channel", "channel": "rest"}])")
              .is_ok());
  CHECK(stage->info().channels.empty());
}

TEST_CASE("a stage holds at most 1024 channels and objects together", "[rules]") {
  auto stage = Stage::create().value();
  json full = json::array();
  for (int i = 0; i < 1000; ++i) {
    full.push_back({{"rule", "create_channel"}, {"channel", "c" + std::to_string(i)}});
  }
  for (int i = 0; i < 24; ++i) {
    full.push_back({{"rule", "create_object"},
                    {"channel", "c0"},
                    {"object", "o" + std::to_string(i)},
                    {"type", "noop"}});
  }
  REQUIRE(stage->apply(full).is_ok());  // 1024 exactly
  const std::uint64_t version = stage->rules_version();
  CHECK(
      stage->apply(json::array({{{"rule", "create_channel"}, {"channel", "more"}}})).to_string() ==
      "invalid argument: rules[0]: a stage holds at most 1024 channels and objects together");
  CHECK(
      stage
          ->apply(json::array(
              {{{"rule", "create_object"}, {"channel", "c1"}, {"object", "o"}, {"type", "noop"}}}))
          .message()
          .find("at most 1024") != std::string::npos);
  CHECK(stage->rules_version() == version);  // refused whole
  CHECK(stage->info().channels.size() == 1000);
  // What a batch removes makes room for what it creates: c0 held 25.
  json swap = json::array({{{"rule", "remove_channel"}, {"channel", "c0"}}});
  for (int i = 0; i < 25; ++i) {
    swap.push_back({{"rule", "create_channel"}, {"channel", "n" + std::to_string(i)}});
  }
  CHECK(stage->apply(swap).is_ok());
  CHECK(stage->info().channels.size() == 1024);
  // The count carries over from batch to batch (the stage keeps it rather
  // than counting the model each time): full again, and one removal makes
  // room for exactly one.
  CHECK(stage->apply(json::array({{{"rule", "create_channel"}, {"channel", "more"}}}))
            .message()
            .find("at most 1024") != std::string::npos);
  CHECK(stage
            ->apply(json::array({{{"rule", "remove_channel"}, {"channel", "n0"}},
                                 {{"rule", "create_channel"}, {"channel", "more"}}}))
            .is_ok());
  CHECK(stage
            ->apply(json::array({{{"rule", "remove_channel"}, {"channel", "n1"}},
                                 {{"rule", "create_channel"}, {"channel", "x1"}},
                                 {{"rule", "create_channel"}, {"channel", "x2"}}}))
            .message()
            .find("rules[2]: a stage holds at most 1024") != std::string::npos);
  CHECK(stage->info().channels.size() == 1024);
}

// ---------------------------------------------------------------------------
// apply_text, the daemon's batches and their variants: each applied whole with
// the expected effect, or refused with the expected message and nothing
// changed.

namespace {

// What a batch can change: the description (rules version included) and
// each object's configuration.
json observable(Stage& stage) {
  json j;
  to_json(j, stage.info());
  json objects = json::array();
  for (const auto& c : stage.totals().channels) {
    for (const auto& o : c.objects) {
      json cfg = json::object();
      for (const char* k : {"rate", "unit", "burst", "refill_period_us"}) {
        if (o.state.contains(k)) cfg[k] = o.state[k];
      }
      objects.push_back({{"channel", c.name}, {"object", o.name}, {"config", cfg}});
    }
  }
  j["objects"] = objects;
  return j;
}

struct BatchCase {
  std::string text;
  const char* error;  // nullptr: applied
};

std::vector<BatchCase> batch_cases() {
  return {
      // What the daemon sends: wire::dump of the policies' batches.
      {R"([{"channel":"flush","config":{"rate":2048.0},"object":"limit","rule":"configure"}])",
       nullptr},
      {R"({"rules":[{"channel":"flush","config":{"burst":4096,"rate":1e9},"object":"limit","rule":"configure"}],"version":1})",
       nullptr},
      {R"({"rules":[{"channel":"flush","config":{"rate":3000},"object":"limit","rule":"configure"},{"channel":"flush","config":{"refill_period_us":500},"object":"limit","rule":"configure"}]})",
       nullptr},
      {"[]", nullptr},
      {R"({"rules":[]})", nullptr},
      {R"({"version":1,"rules":[]})", nullptr},
      // Hand-written: blanks, member order.
      {" [ { \"rule\" : \"configure\" , \"object\" : \"limit\" ,\n\t\"channel\" : \"flush\" , "
       "\"config\" : { \"rate\" : 5 } } ] ",
       nullptr},
      // The static policy's replacing batch, as the daemon writes it.
      {R"({"rules":[{"channel":"flush","rule":"remove_channel"},{"channel":"flush","default":true,"rule":"create_channel"},{"channel":"flush","config":{"rate":1e12},"object":"limit","rule":"create_object","type":"drl"}],"version":1})",
       nullptr},
      // Valid JSON the stage refuses, at apply or at parse.
      {R"([{"channel":"nope","config":{"rate":1},"object":"limit","rule":"configure"}])",
       "rules[0]: channel 'nope' does not exist"},
      {R"([{"channel":"flush","config":{"rate":1},"object":"nope","rule":"configure"}])",
       "rules[0]: object 'nope' does not exist in channel 'flush'"},
      {R"([{"channel":"flush","config":{"rate":-1},"object":"limit","rule":"configure"}])",
       "rules[0]: config.rate: must be a positive number, got -1"},
      {R"([{"channel":"flush","config":{"rate":0},"object":"limit","rule":"configure"}])",
       "rules[0]: config.rate: must be a positive number, got 0"},
      {R"([{"channel":"flush","config":{"speed":1},"object":"limit","rule":"configure"}])",
       "rules[0]: config.unknown field 'speed'"},
      {R"([{"channel":"flush","config":{"unit":"ops"},"object":"limit","rule":"configure"}])",
       nullptr},
      {R"([{"channel":"flush","config":{"unit":"kg"},"object":"limit","rule":"configure"}])",
       R"(rules[0]: config.unit: must be "bytes" or "ops", got "kg")"},
      {R"([{"channel":"flush","config":{"refill_period_us":1.5},"object":"limit","rule":"configure"}])",
       "rules[0]: config.refill_period_us: must be an integer >= 1, got 1.5"},
      {R"([{"channel":"flush","config":{"rate":2048},"object":"limit","rule":"configure"},{"channel":"flush","config":{"rate":0},"object":"limit","rule":"configure"}])",
       "rules[1]: config.rate: must be a positive number, got 0"},
      {R"([{"channel":"flush","config":{},"object":"limit","rule":"configure"}])", nullptr},
      {R"([{"channel":"flush","config":[],"object":"limit","rule":"configure"}])",
       "rules[0].config: must be an object, got []"},
      {R"([{"channel":"flush","config":{"rate":{"x":1}},"object":"limit","rule":"configure"}])",
       R"(rules[0]: config.rate: must be a positive number, got {"x":1})"},
      {R"([{"channel":"flush","config":{"rate":[1]},"object":"limit","rule":"configure"}])",
       "rules[0]: config.rate: must be a positive number, got [1]"},
      {R"([{"channel":"flush","config":{"rate":1,"rate":2},"object":"limit","rule":"configure"}])",
       nullptr},
      {R"([{"channel":"flush","channel":"flush","config":{"rate":1},"object":"limit","rule":"configure"}])",
       nullptr},
      {R"([{"channel":"fl ush","config":{"rate":1},"object":"limit","rule":"configure"}])",
       R"(rules[0].channel: must be a name of 1-64 characters of A-Z a-z 0-9 _ . : -, got "fl ush")"},
      {R"([{"channel":"","config":{"rate":1},"object":"limit","rule":"configure"}])",
       R"(rules[0].channel: must be a name of 1-64 characters of A-Z a-z 0-9 _ . : -, got "")"},
      {R"([{"channel":7,"config":{"rate":1},"object":"limit","rule":"configure"}])",
       "rules[0].channel: must be a name of 1-64 characters of A-Z a-z 0-9 _ . : -, got 7"},
      {R"([{"config":{"rate":1},"object":"limit","rule":"configure"}])",
       "rules[0].channel: missing"},
      {R"([{"channel":"flush","config":{"rate":1},"object":"limit","rule":"configure","x":1}])",
       "rules[0]: unknown field 'x'"},
      {R"([{"channel":"flush","config":{"rate":1},"object":"limit","rule":"Configure"}])",
       R"(rules[0].rule: unknown rule "Configure" (expected create_channel, remove_channel, create_object, remove_object, differentiate, route, configure or lease))"},
      {R"([{"channel":"flush","rule":"remove_channel"}])", nullptr},
      // Layout rules: accepted, refused, or declined (match, classifiers).
      {R"([{"channel":"flush","object":"limit","rule":"remove_object"},{"channel":"flush","object":"limit","rule":"create_object","type":"noop"}])",
       nullptr},
      {R"([{"channel":"flush","object":"more","rule":"create_object","type":"drl","config":{"rate":5,"unit":"ops"},"default":false}])",
       nullptr},
      {R"([{"channel":"flush","object":"limit","rule":"create_object","type":"noop"}])",
       "rules[0]: object 'limit' already exists in channel 'flush'"},
      {R"([{"channel":"flush","object":"x","rule":"create_object","type":"nope"}])",
       "rules[0]: type: unknown object type 'nope' (registered: buffer-pool, cache-reserve, "
       "deferral-gate, drft, drl, fq, noop, prio-bucket)"},
      {R"([{"channel":"flush","object":"x","rule":"create_object","type":"drl"}])",
       "rules[0]: config.rate: required"},
      {R"([{"channel":"flush","object":"x","rule":"create_object","type":"drl","config":{"rate":-2}}])",
       "rules[0]: config.rate: must be a positive number, got -2"},
      {R"([{"channel":"flush","object":"x","rule":"create_object","type":"drl","config":{"rate":1,"x":[1]}}])",
       "rules[0]: config.unknown field 'x'"},
      {R"([{"channel":"flush","object":"x","rule":"create_object","type":"drl","config":[]}])",
       "rules[0].config: must be an object, got []"},
      {R"([{"channel":"flush","object":"x","rule":"create_object"}])", "rules[0].type: missing"},
      {R"([{"channel":"flush","object":"x","rule":"remove_object"}])",
       "rules[0]: object 'x' does not exist in channel 'flush'"},
      {R"([{"channel":"flush","object":"limit","rule":"remove_object","type":"drl"}])",
       "rules[0]: unknown field 'type'"},
      {R"([{"channel":"flush","rule":"remove_channel","default":true}])",
       "rules[0]: unknown field 'default'"},
      {R"([{"channel":"other","rule":"create_channel","default":true},{"channel":"other","object":"n","rule":"create_object","type":"noop","default":true}])",
       nullptr},
      {R"([{"channel":"other","rule":"create_channel","default":1}])",
       "rules[0].default: must be true or false, got 1"},
      {R"([{"channel":"other","rule":"create_channel","default":true,"default":false}])", nullptr},
      {R"([{"channel":"flush","rule":"create_channel"}])",
       "rules[0]: channel 'flush' already exists"},
      {R"([{"channel":"gone","rule":"remove_channel"}])",
       "rules[0]: channel 'gone' does not exist"},
      {R"([{"channel":"other","rule":"create_channel","default":true},{"channel":"more","rule":"create_channel","default":true}])",
       "channels 'other' and 'more' are both marked default"},
      {R"([{"channel":"other","rule":"create_channel","match":{"origin":"wal"}}])", nullptr},
      {R"([{"channel":"other","rule":"create_channel","classifiers":["tenant"]}])", nullptr},
      {R"([{"classifiers":["tenant"],"rule":"differentiate"}])",
       R"(channel 'flush': match {"origin":"flush"} names classifier 'origin', which the stage's differentiate rule does not select)"},
      {R"([{"channel":"other","rule":"create_channel","object":"x"}])",
       "rules[0]: unknown field 'object'"},
      {R"([{"channel":"flush","rule":"remove_channel"},{"channel":"flush","config":{"rate":1},"object":"limit","rule":"configure"}])",
       "rules[1]: channel 'flush' does not exist"},
      {R"([{"channel":"flu\u0073h","config":{"rate":1},"object":"limit","rule":"configure"}])",
       nullptr},
      {R"({"rules":[],"version":2})", "version: unsupported rules version 2 (expected 1)"},
      {R"({"rules":[],"version":1.0})", "version: unsupported rules version 1.0 (expected 1)"},
      {R"({"rules":{}})", R"(rules: must be an array of rules (or an object with "rules"))"},
      {R"({"version":1})", "rules: missing"},
      {R"({"rules":[],"extra":1})", "unknown field 'extra'"},
      {R"({"rules":[],"rules":[]})", nullptr},
      {"{}", "rules: missing"},
      {"[1]", "rules[0]: must be an object, got 1"},
      {"[[]]", "rules[0]: must be an object, got []"},
      {"null", R"(rules: must be an array of rules (or an object with "rules"))"},
      {"1", R"(rules: must be an array of rules (or an object with "rules"))"},
      {"\"x\"", R"(rules: must be an array of rules (or an object with "rules"))"},
      // Malformed.
      {"",
       "invalid JSON: [json.exception.parse_error.101] parse error at line 1, column 1: syntax "
       "error while parsing value - unexpected end of input; expected '[', '{', or a literal"},
      {" ",
       "invalid JSON: [json.exception.parse_error.101] parse error at line 1, column 2: syntax "
       "error while parsing value - unexpected end of input; expected '[', '{', or a literal"},
      {"[",
       "invalid JSON: [json.exception.parse_error.101] parse error at line 1, column 2: syntax "
       "error while parsing value - unexpected end of input; expected '[', '{', or a literal"},
      {"]",
       "invalid JSON: [json.exception.parse_error.101] parse error at line 1, column 1: syntax "
       "error while parsing value - unexpected ']'; expected '[', '{', or a literal"},
      {"[{}",
       "invalid JSON: [json.exception.parse_error.101] parse error at line 1, column 4: syntax "
       "error while parsing array - unexpected end of input; expected ']'"},
      {"[{}]x",
       "invalid JSON: [json.exception.parse_error.101] parse error at line 1, column 5: syntax "
       "error while parsing value - invalid literal; expected end of input"},
      {"[] []",
       "invalid JSON: [json.exception.parse_error.101] parse error at line 1, column 4: syntax "
       "error while parsing value - unexpected '['; expected end of input"},
      {R"([{"rule":"configure",}])",
       "invalid JSON: [json.exception.parse_error.101] parse error at line 1, column 22: syntax "
       "error while parsing object key - unexpected '}'; expected string literal"},
      {R"([{"channel":"flush","config":{"rate":1},"object":"limit","rule":"configure"},])",
       "invalid JSON: [json.exception.parse_error.101] parse error at line 1, column 78: syntax "
       "error while parsing value - unexpected ']'; expected '[', '{', or a literal"},
  };
}

// Applies `text` to a fresh base stage: checks that a refused batch changed
// nothing and an applied one moved the rules version. Returns the status.
Status apply_to_base(const std::string& text, json* after = nullptr) {
  INFO("text: " << text);
  auto stage = base_stage();
  const json before = observable(*stage);
  const std::uint64_t version = stage->rules_version();
  Status s = stage->apply_text(text);
  if (s.is_ok()) {
    CHECK(stage->rules_version() == version + 1);
  } else {
    CHECK(observable(*stage) == before);
  }
  if (after != nullptr) *after = observable(*stage);
  return s;
}

// The config of the base stage's flush/limit object after `text`.
json limit_config(const std::string& text) {
  json after;
  REQUIRE(apply_to_base(text, &after).is_ok());
  for (const auto& o : after["objects"]) {
    if (o["channel"] == "flush" && o["object"] == "limit") return o["config"];
  }
  FAIL("no flush/limit object after " << text);
  return json();
}

}  // namespace

TEST_CASE("apply_text applies the daemon's batches and refuses their faults by name",
          "[rules][text]") {
  for (const BatchCase& c : batch_cases()) {
    INFO("text: " << c.text);
    const Status s = apply_to_base(c.text);
    if (c.error == nullptr) {
      CHECK(s.is_ok());
    } else {
      CHECK_FALSE(s.is_ok());
      CHECK(s.message() == c.error);
    }
  }
}

TEST_CASE("apply_text gives the daemon's batches their effect", "[rules][text]") {
  const auto cases = batch_cases();
  CHECK(limit_config(cases[0].text)["rate"] == 2048);
  CHECK(limit_config(cases[1].text) ==
        json{{"rate", 1e9}, {"burst", 4096}, {"unit", "bytes"}, {"refill_period_us", 100000}});
  const json two = limit_config(cases[2].text);  // both rules, in order
  CHECK(two["rate"] == 3000);
  CHECK(two["refill_period_us"] == 500);
  CHECK(limit_config(cases[6].text)["rate"] == 5);  // blanks and member order
  CHECK(limit_config(cases[13].text)["unit"] == "ops");
  CHECK(limit_config(cases[21].text)["rate"] == 2);  // the last duplicate wins
  CHECK(limit_config(cases[53].text)["rate"] == 1);  // an escaped name
  // The replacing batch: the channel again, now the default, its object anew.
  json after;
  REQUIRE(apply_to_base(cases[7].text, &after).is_ok());
  REQUIRE(after["channels"].size() == 1);
  CHECK(after["channels"][0]["default"] == true);
  CHECK(after["objects"][0]["config"]["rate"] == 1e12);
}

TEST_CASE(
    "apply_text on truncated and mutated batches: apply() of the parsed text, or invalid JSON",
    "[rules][text]") {
  // Deterministic: a fixed seed and a fixed number of mutations.
  sluice::testing::Mutator mutator(0x2545f4914f6cdd1du);
  const std::string alphabet = "{}[]:,\"\\-.0123456789eE xflushratedefaultruemovbj_";
  std::size_t parsed = 0;
  const auto cases = batch_cases();
  auto check = [&](const std::string& text) {
    json after;
    const Status got = apply_to_base(text, &after);
    INFO("text: " << text);
    json j;
    try {
      j = json::parse(text);
    } catch (const json::parse_error& e) {
      CHECK(got.message() == "invalid JSON: " + sluice::json_error_text(e));
      return;
    } catch (const json::exception&) {
      CHECK(got.message() == "invalid JSON: a number is out of range");
      return;
    }
    ++parsed;
    auto twin = base_stage();
    const Status want = twin->apply(j);
    CHECK(got.code() == want.code());
    CHECK(got.message() == want.message());
    CHECK(after == observable(*twin));
  };
  for (std::size_t seed = 0; seed < 8; ++seed) {
    const std::string& s = cases[seed].text;
    for (std::size_t n = 0; n <= s.size(); ++n) check(s.substr(0, n));
    for (int i = 0; i < 150; ++i) check(mutator.mutate(s, alphabet));
  }
  CHECK(parsed > 100);  // the comparison ran on parsed texts, not only refusals
}

TEST_CASE("a lease rule: its fallback applies when it runs out unless a later lease renews it") {
  ManualClock clock;
  StageOptions so;
  so.clock = &clock;
  auto stage = Stage::create(so).value();
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "create_channel", "channel": "app", "default": true},
    {"rule": "create_object", "channel": "app", "object": "limit", "type": "drl",
     "config": {"rate": 1048576}, "default": true}])"))
              .is_ok());
  auto rate = [&] { return stage->totals().channels[0].objects[0].state["rate"].get<double>(); };
  const json lease = json::parse(R"([
    {"rule": "configure", "channel": "app", "object": "limit", "config": {"rate": 4194304}},
    {"rule": "lease", "ms": 100, "fallback": [
      {"rule": "configure", "channel": "app", "object": "limit", "config": {"rate": 65536}}]}])");
  CHECK_FALSE(stage->lease_left().has_value());
  CHECK_FALSE(stage->expire_lease());  // no lease: nothing to run out
  // Built by a program, not parsed: its integers are signed, and as good.
  const json built = json::array(
      {json{{"rule", "lease"}, {"ms", std::int64_t{100}}, {"fallback", json::array()}}});
  REQUIRE(stage->apply(built).is_ok());
  CHECK(stage->lease_left() == std::chrono::milliseconds(100));
  CHECK_FALSE(stage
                  ->apply(json::array({json{
                      {"rule", "lease"}, {"ms", std::int64_t{-5}}, {"fallback", json::array()}}}))
                  .is_ok());
  REQUIRE(stage->apply(lease).is_ok());
  CHECK(rate() == 4194304);
  CHECK(stage->lease_left() == std::chrono::milliseconds(100));

  // Renewed before it runs out: the value holds.
  clock.advance(99'000'000);
  CHECK_FALSE(stage->expire_lease());
  REQUIRE(stage->apply(lease).is_ok());
  clock.advance(99'000'000);
  CHECK_FALSE(stage->expire_lease());
  CHECK(rate() == 4194304);
  CHECK(stage->lease_left() == std::chrono::milliseconds(1));

  // Not renewed: the fallback, once, and no lease after it.
  const std::uint64_t version = stage->rules_version();
  clock.advance(1'000'000);
  CHECK(stage->lease_left() == std::chrono::nanoseconds(0));
  CHECK(stage->expire_lease());
  CHECK(rate() == 65536);
  CHECK(stage->rules_version() == version + 1);
  CHECK(stage->leases_expired() == 1);
  CHECK_FALSE(stage->lease_left().has_value());
  CHECK_FALSE(stage->expire_lease());

  // A batch that fails leaves the lease as it was; a fallback naming an object removed
  // since still applies the rest of it.
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "create_object", "channel": "app", "object": "other", "type": "drl",
     "config": {"rate": 1000000}},
    {"rule": "lease", "ms": 50, "fallback": [
      {"rule": "configure", "channel": "app", "object": "other", "config": {"rate": 1000}},
      {"rule": "configure", "channel": "app", "object": "limit", "config": {"rate": 2000}}]}])"))
              .is_ok());
  CHECK_FALSE(stage
                  ->apply(json::parse(R"([{"rule": "lease", "ms": 5000, "fallback": [
      {"rule": "configure", "channel": "app", "object": "gone", "config": {"rate": 1}}]}])"))
                  .is_ok());
  CHECK(stage->lease_left() == std::chrono::milliseconds(50));
  REQUIRE(stage
              ->apply(json::parse(R"([{"rule": "remove_object", "channel": "app",
                                        "object": "other"}])"))
              .is_ok());
  clock.advance(50'000'000);
  CHECK(stage->expire_lease());
  CHECK(rate() == 2000);
  CHECK(stage->leases_expired() == 2);
}
