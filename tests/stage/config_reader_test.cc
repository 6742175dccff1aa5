// The field reader of configurations and plans (libstage/internal/sluice/config_reader.h):
// each reader leaves its output alone when the field is absent, takes what is in range,
// and refuses the rest with the field's path and what it wanted.
#include <cstdint>
#include <string>

#include <catch2/catch.hpp>

#include "sluice/config_reader.h"

using nlohmann::json;
namespace cfg = sluice::config;

TEST_CASE("get_integer takes whole numbers in range and names the field otherwise", "[config]") {
  const json j =
      json::parse(R"({"n": 7, "big": 18446744073709551615, "neg": -3, "half": 2.5, "text": "7"})");
  int n = -1;
  CHECK(cfg::get_integer(j, "", "absent", &n, 0, 10).is_ok());
  CHECK(n == -1);  // absent: left alone
  REQUIRE(cfg::get_integer(j, "", "n", &n, 0, 10).is_ok());
  CHECK(n == 7);
  const sluice::Status low = cfg::get_integer(j, "plan", "n", &n, 8, 10);
  CHECK(low.message() == "plan.n: must be an integer from 8 to 10, got 7");
  CHECK(cfg::get_integer(j, "", "neg", &n, 0, 10).message() ==
        "neg: must be an integer from 0 to 10, got -3");
  CHECK(cfg::get_integer(j, "", "neg", &n, -5, 10).is_ok());
  CHECK(n == -3);
  CHECK_FALSE(cfg::get_integer(j, "", "half", &n, 0, 10).is_ok());
  CHECK_FALSE(cfg::get_integer(j, "", "text", &n, 0, 10).is_ok());
  // The full unsigned range, and a value that does not fit the output's type.
  std::uint64_t u = 0;
  REQUIRE(cfg::get_integer<std::uint64_t>(j, "", "big", &u, 0, UINT64_MAX).is_ok());
  CHECK(u == UINT64_MAX);
  CHECK_FALSE(cfg::get_integer(j, "", "big", &n, 0, 10).is_ok());
  CHECK_FALSE(cfg::get_integer<std::uint64_t>(j, "", "neg", &u, 0, UINT64_MAX).is_ok());
  CHECK(n == -3);  // every refusal left it alone
}

TEST_CASE("read_number and get_number check finiteness and either bound", "[config]") {
  const json j = json::parse(R"({"x": 0.5, "zero": 0, "s": "1", "list": [2, 1e7]})");
  double x = -1;
  REQUIRE(cfg::get_number(j, "", "x", &x, 0, true, 1).is_ok());
  CHECK(x == 0.5);
  CHECK(cfg::get_number(j, "", "zero", &x, 0, false).message() == "zero: must be > 0, got 0");
  CHECK(cfg::get_number(j, "a", "x", &x, 1, true, 2).message() ==
        "a.x: must be >= 1 and <= 2, got 0.5");
  CHECK(cfg::get_number(j, "", "s", &x, 0, true).message() == "s: must be a number, got \"1\"");
  CHECK(cfg::read_number(j["list"][1], "list[1]", &x, 0, true, 1e6).message() ==
        "list[1]: must be >= 0 and <= 1000000, got 10000000.0");
  REQUIRE(cfg::read_number(j["list"][0], "list[0]", &x, 0, true, 1e6).is_ok());
  CHECK(x == 2);
}

TEST_CASE("require, check_keys and get_choice name what is missing, unknown or unlisted",
          "[config]") {
  const json j = json::parse(R"({"db": "optimistic", "extra": 1})");
  CHECK(cfg::require(j, "", "db").is_ok());
  CHECK(cfg::require(j, "tenants[2]", "id").message() == "tenants[2].id: required");
  CHECK(cfg::check_keys(j, "", {"db"}).message() == "extra: unknown field");
  CHECK(cfg::check_keys(json::array(), "plan", {"db"}).message() ==
        "plan: must be an object, got []");
  bool pessimistic = true;
  REQUIRE(cfg::get_choice<bool>(j, "", "db", {{"pessimistic", true}, {"optimistic", false}},
                                &pessimistic)
              .is_ok());
  CHECK_FALSE(pessimistic);
  CHECK(cfg::get_choice<bool>(j, "", "db", {{"a", true}, {"b", false}}, &pessimistic).message() ==
        "db: must be one of a, b, got \"optimistic\"");
}
