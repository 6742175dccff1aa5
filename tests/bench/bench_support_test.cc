// bench/support/: the command-line option table, the percentile and spread
// every benchmark reports, and setting up an example's stage from a rules file
// or a control plane.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "sluice/stage.h"
#include "support/cli.h"
#include "support/percentile.h"
#include "support/stage_setup.h"
#include "test_util.h"

using sluice::bench::Option;
using sluice::bench::parse_options;
using Error = sluice::bench::ParseResult::Error;

namespace {

// argv for parse_options: the strings live as long as the vector of them.
struct Argv {
  explicit Argv(std::vector<std::string> a) : args(std::move(a)) {
    for (auto& s : args) ptrs.push_back(s.data());
  }
  int argc() const { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> args;
  std::vector<char*> ptrs;
};

struct Values {
  std::string text = "default";
  double d = -1;
  int i = -1;
  std::uint64_t u = 0;
  bool on = false;
  bool off = true;
  int actions = 0;
  int even = 0;
};

std::vector<Option> table(Values* v) {
  return {
      {"--text", &v->text},
      {"--double", &v->d},
      {"--int", &v->i},
      {"--u64", &v->u},
      {"--on", &v->on, true},
      {"--off", &v->off, false},
      Option::flag("--act", [v] { ++v->actions; }),
      Option::with_value("--even",
                         [v](const std::string& s) {
                           const int n = std::stoi(s);
                           if (n % 2 != 0) return false;
                           v->even = n;
                           return true;
                         }),
  };
}

}  // namespace

TEST_CASE("options store their values as the program's own parsers did", "[bench][cli]") {
  Values v;
  Argv a({"prog", "--text", "abc", "--double", "2.5", "--int", "42", "--u64",
          "18446744073709551615", "--on", "--off", "--act", "--act", "--even", "4"});
  const auto r = parse_options(table(&v), a.argc(), a.argv());
  REQUIRE(r.ok());
  CHECK(v.text == "abc");
  CHECK(v.d == 2.5);
  CHECK(v.i == 42);
  CHECK(v.u == UINT64_MAX);
  CHECK(v.on);
  CHECK_FALSE(v.off);
  CHECK(v.actions == 2);
  CHECK(v.even == 4);
}

TEST_CASE("an option's reader makes its value of the text and may refuse it by throwing",
          "[bench][cli]") {
  std::vector<int> list;
  unsigned at_least_one = 0;
  const Option options[] = {
      {"--list", &list,
       [](const std::string& v) {
         return std::vector<int>(static_cast<std::size_t>(std::stoi(v)), 1);
       }},
      {"--n", &at_least_one,
       [](const std::string& v) { return static_cast<unsigned>(std::max(1, std::stoi(v))); }},
  };
  Argv a({"prog", "--list", "3", "--n", "-5"});
  REQUIRE(parse_options(options, a.argc(), a.argv()).ok());
  CHECK(list == std::vector<int>{1, 1, 1});
  CHECK(at_least_one == 1);
  Argv bad({"prog", "--n", "many"});
  CHECK_THROWS_AS(parse_options(options, bad.argc(), bad.argv()), std::invalid_argument);
}

TEST_CASE("numbers are read leniently, as atof, atoi and strtoull read them", "[bench][cli]") {
  Values v;
  Argv a({"prog", "--double", "x", "--int", "7z"});
  REQUIRE(parse_options(table(&v), a.argc(), a.argv()).ok());
  CHECK(v.d == 0);
  CHECK(v.i == 7);
}

TEST_CASE("parsing starts at the given argument and the last of a repeated option stays",
          "[bench][cli]") {
  Values v;
  Argv a({"prog", "run", "--int", "1", "--int", "2"});
  REQUIRE(parse_options(table(&v), a.argc(), a.argv(), 2).ok());
  CHECK(v.i == 2);
}

TEST_CASE("parsing stops at the first argument it cannot read and says why", "[bench][cli]") {
  SECTION("an unknown option") {
    Values v;
    Argv a({"prog", "--int", "3", "--nope", "--text", "x"});
    const auto r = parse_options(table(&v), a.argc(), a.argv());
    CHECK(r.error == Error::kUnknown);
    CHECK(r.option == "--nope");
    CHECK(v.i == 3);             // applied before the error
    CHECK(v.text == "default");  // not after it
  }
  SECTION("a value missing at the end") {
    Values v;
    Argv a({"prog", "--on", "--text"});
    const auto r = parse_options(table(&v), a.argc(), a.argv());
    CHECK(r.error == Error::kMissingValue);
    CHECK(r.option == "--text");
    CHECK(v.on);
  }
  SECTION("a value the option refuses") {
    Values v;
    Argv a({"prog", "--even", "3", "--act"});
    const auto r = parse_options(table(&v), a.argc(), a.argv());
    CHECK(r.error == Error::kBadValue);
    CHECK(r.option == "--even");
    CHECK(r.value == "3");
    CHECK(v.actions == 0);
  }
  SECTION("a value is taken as a value even when it looks like an option") {
    Values v;
    Argv a({"prog", "--text", "--on"});
    REQUIRE(parse_options(table(&v), a.argc(), a.argv()).ok());
    CHECK(v.text == "--on");
    CHECK_FALSE(v.on);
  }
}

TEST_CASE("a comma-separated list splits into its items, empty ones included", "[bench][cli]") {
  using sluice::bench::split_list;
  using List = std::vector<std::string>;
  CHECK(split_list("a,bc,d") == List{"a", "bc", "d"});
  CHECK(split_list("one") == List{"one"});
  CHECK(split_list("") == List{""});
  CHECK(split_list("a,,b") == List{"a", "", "b"});
  CHECK(split_list("a,") == List{"a", ""});
  CHECK(split_list(",a") == List{"", "a"});
}

TEST_CASE("percentile is the nearest rank of the sorted samples", "[bench][percentile]") {
  using sluice::bench::percentile;
  CHECK(percentile({}, 0.5) == 0);
  CHECK(percentile({7}, 0.99) == 7);
  const std::vector<double> four = {4, 1, 3, 2};  // unsorted on purpose
  CHECK(percentile(four, 0) == 1);
  CHECK(percentile(four, 0.5) == 3);  // index round(1.5) = 2: the upper middle
  CHECK(percentile(four, 0.49) == 2);
  CHECK(percentile(four, 1) == 4);
  CHECK(percentile(four, -1) == 1);  // clamped
  CHECK(percentile(four, 2) == 4);
  std::vector<double> hundred;
  for (int i = 99; i >= 0; --i) hundred.push_back(i);
  CHECK(percentile(hundred, 0.5) == 50);
  CHECK(percentile(hundred, 0.99) == 98);
  CHECK(percentile(hundred, 0.025) == 2);
}

TEST_CASE("spread is the smallest, the median percentile and the largest", "[bench][percentile]") {
  const sluice::bench::Spread s = sluice::bench::spread({5, 1, 9, 3});
  CHECK(s.min == 1);
  CHECK(s.median == 5);
  CHECK(s.max == 9);
  const sluice::bench::Spread odd = sluice::bench::spread({2, 8, 4});
  CHECK(odd.median == 4);
  const sluice::bench::Spread none = sluice::bench::spread({});
  CHECK(none.min == 0);
  CHECK(none.median == 0);
  CHECK(none.max == 0);
}

TEST_CASE("a rules file applies to an existing stage; errors name the file",
          "[bench][stage_setup]") {
  sluice::testing::TempDir dir("bench-support");
  auto stage = sluice::Stage::create({});
  REQUIRE(stage.is_ok());
  const std::string good = dir.write("good.json", R"([
    {"rule": "create_channel", "channel": "all", "default": true},
    {"rule": "create_object", "channel": "all", "object": "count", "type": "noop"}
  ])");
  REQUIRE(sluice::bench::apply_rules_file(**stage, good).is_ok());
  REQUIRE((*stage)->info().channels.size() == 1);
  CHECK((*stage)->info().channels[0].name == "all");

  const sluice::Status missing = sluice::bench::apply_rules_file(**stage, dir.file("none.json"));
  CHECK(missing.code() == sluice::Code::kIoError);
  CHECK(missing.message().find(dir.file("none.json")) == 0);

  const std::string bad = dir.write("bad.json", R"([{"rule": "no_such_rule"}])");
  const sluice::Status refused = sluice::bench::apply_rules_file(**stage, bad);
  CHECK(refused.code() == sluice::Code::kInvalidArgument);
  CHECK(refused.message().find(bad + ": ") == 0);

  const sluice::Status not_json =
      sluice::bench::apply_rules_file(**stage, dir.write("x.json", "{"));
  CHECK_FALSE(not_json.is_ok());
  CHECK(not_json.message().find(dir.file("x.json")) == 0);

  const sluice::Status directory = sluice::bench::apply_rules_file(**stage, dir.path);
  CHECK_FALSE(directory.is_ok());
  CHECK(directory.message().find("a directory") != std::string::npos);
  CHECK((*stage)->info().channels.size() == 1);  // what failed changed nothing
}

TEST_CASE("a control client that gets no rules is an error that says where it waited",
          "[bench][stage_setup]") {
  auto stage = sluice::Stage::create({});
  REQUIRE(stage.is_ok());
  SECTION("no socket: the client does not start") {
    auto c = sluice::bench::start_control_client(**stage, "");
    REQUIRE_FALSE(c.is_ok());
    CHECK(c.status().code() == sluice::Code::kInvalidArgument);
    CHECK(c.status().message().find("control client: ") == 0);
  }
  SECTION("no daemon at the socket") {
    sluice::testing::TempDir dir("bench-support");
    const std::string socket = dir.file("nobody.sock");
    auto c = sluice::bench::start_control_client(**stage, socket, std::chrono::seconds(1));
    REQUIRE_FALSE(c.is_ok());
    CHECK(c.status().code() == sluice::Code::kUnavailable);
    CHECK(c.status().message() == "no rules from the control plane at " + socket + " within 1 s");
  }
}

TEST_CASE("a parse error is said in the programs' shared words", "[bench][cli]") {
  using sluice::bench::ParseResult;
  using sluice::bench::print_parse_error;
  const auto said = [](const ParseResult& r, std::string_view hint = "") {
    std::FILE* capture = std::tmpfile();
    REQUIRE(capture != nullptr);
    std::FILE* saved = stderr;
    stderr = capture;
    print_parse_error(r, hint);
    stderr = saved;
    std::rewind(capture);
    std::string text(256, '\0');
    text.resize(std::fread(text.data(), 1, text.size(), capture));
    std::fclose(capture);
    return text;
  };
  CHECK(said({ParseResult::Error::kMissingValue, "--runs", {}}) == "--runs needs a value\n");
  CHECK(said({ParseResult::Error::kUnknown, "--x", {}}, " (try --help)") ==
        "unknown argument --x (try --help)\n");
  CHECK(said({ParseResult::Error::kBadValue, "--clock", "x"}).empty());
  CHECK(said({}).empty());
}
