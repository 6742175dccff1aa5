// water_fill(): weighted max-min with floors and demand caps, as a table.
#include "water_fill.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test_util.h"

namespace sluice {
namespace {

using sluice::testing::kInf;

struct FillCase {
  std::string name;
  double capacity;
  std::vector<Claim> claims;
  std::vector<double> expected;
};

TEST_CASE("water_fill: max-min fair shares", "[policies][water_fill]") {
  // clang-format off
  const std::vector<FillCase> cases = {
      // The naive "capacity / n, then hand out what is left once" gives 70/30.
      {"a small demand is met, the big one gets the rest",
       100, {{100, 1, 0}, {10, 1, 0}}, {90, 10}},
      {"equal unbounded claims share evenly",
       90, {{kInf, 1, 0}, {kInf, 1, 0}, {kInf, 1, 0}}, {30, 30, 30}},
      {"weights 2:1, both unbounded",
       100, {{kInf, 2, 0}, {kInf, 1, 0}}, {200.0 / 3, 100.0 / 3}},
      {"two capped, one unbounded",
       100, {{20, 1, 0}, {30, 1, 0}, {kInf, 1, 0}}, {20, 30, 50}},
      {"cascade: the second cap binds only after the first",
       100, {{10, 1, 0}, {40, 1, 0}, {kInf, 1, 0}}, {10, 40, 50}},
      {"demands above capacity, both bounded",
       100, {{50, 1, 0}, {60, 1, 0}}, {50, 50}},
      {"demands below capacity: the surplus stays unallocated",
       100, {{30, 1, 0}, {40, 1, 0}}, {30, 40}},
      {"weighted with a cap: 10, then 1:2",
       100, {{10, 1, 0}, {kInf, 1, 0}, {kInf, 2, 0}}, {10, 30, 60}},
      {"demand below goal: only the demand is held",
       1000, {{100, 1, 300}, {kInf, 1, 100}}, {100, 900}},
      {"a goal below the fair share changes nothing",
       1000, {{kInf, 1, 300}, {kInf, 1, 0}}, {500, 500}},
      {"a goal above the fair share is honoured",
       1000, {{kInf, 1, 600}, {kInf, 1, 0}}, {600, 400}},
      {"goal with weights: the floor binds before 1:3 does",
       1000, {{kInf, 1, 600}, {kInf, 3, 0}}, {600, 400}},
      {"goal with weights: 1:3 passes the floor",
       1000, {{kInf, 1, 200}, {kInf, 3, 0}}, {250, 750}},
      {"goals above capacity are scaled alike",
       900, {{kInf, 1, 150}, {kInf, 1, 200}, {kInf, 1, 300}, {kInf, 1, 350}},
       {135, 180, 270, 315}},
      {"goals exactly at capacity",
       1000, {{kInf, 1, 150}, {kInf, 1, 200}, {kInf, 1, 300}, {kInf, 1, 350}},
       {150, 200, 300, 350}},
      {"goals, one idle: its goal is not held",
       1000, {{0, 1, 150}, {kInf, 1, 200}, {kInf, 1, 300}, {kInf, 1, 350}},
       {0, 325, 325, 350}},
      {"zero weight gets its floor only",
       100, {{50, 0, 10}, {kInf, 1, 0}}, {10, 90}},
      {"zero capacity",
       0, {{kInf, 1, 10}, {kInf, 1, 0}}, {0, 0}},
      {"negative and NaN inputs count as zero",
       100, {{-5, 1, 0}, {std::nan(""), 1, 0}, {kInf, 1, -3}}, {0, 0, 100}},
      {"a single claim takes all it wants",
       100, {{kInf, 1, 0}}, {100}},
      {"no claims",
       100, {}, {}},
  };
  // clang-format on
  for (const FillCase& c : cases) {
    INFO(c.name);
    const std::vector<double> got = water_fill(c.capacity, c.claims);
    REQUIRE(got.size() == c.expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("claim " << i);
      CHECK(got[i] == Approx(c.expected[i]).margin(1e-9));
    }
  }
}

TEST_CASE("water_fill: never exceeds capacity nor a demand", "[policies][water_fill]") {
  // A grid of mixed claims; properties that must hold for every one.
  const std::vector<double> demands = {0, 5, 25, 60, kInf};
  const std::vector<double> weights = {0.5, 1, 3};
  const std::vector<double> floors = {0, 10, 40};
  for (double d1 : demands) {
    for (double w1 : weights) {
      for (double f1 : floors) {
        for (double d2 : demands) {
          const std::vector<Claim> claims = {{d1, w1, f1}, {d2, 1, 10}, {30, 2, 0}};
          const std::vector<double> got = water_fill(100, claims);
          double sum = 0;
          double demand_sum = 0;
          for (std::size_t i = 0; i < claims.size(); ++i) {
            CHECK(got[i] >= 0);
            CHECK(got[i] <= claims[i].demand + 1e-9);
            sum += got[i];
            demand_sum += claims[i].demand;
          }
          CHECK(sum <= 100 + 1e-9);
          // Work-conserving: either all demands are met or the capacity is used.
          CHECK((sum == Approx(100) || sum == Approx(demand_sum)));
        }
      }
    }
  }
}

}  // namespace
}  // namespace sluice
