// What the delta-fair policy's two test files (write buffer, read cache) share: units,
// equal weights, the configuration's error, a table of configurations each refused with
// its own error, and a step's input.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "delta-fair/delta_fair.h"
#include "test_util.h"

namespace sluice::delta_fair_test {

using nlohmann::json;

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * KiB;
constexpr std::uint64_t GiB = 1024 * MiB;
using sluice::testing::kInf;
using sluice::testing::kSecond;

inline std::vector<double> equal(std::size_t n) {
  return std::vector<double>(n, 1.0);
}

// The error a configuration gets, or "(accepted)".
inline std::string config_error(const json& config) {
  auto r = parse_delta_fair_config(config);
  return r.is_ok() ? std::string("(accepted)") : r.status().message();
}

// Edits of a good configuration, each refused with an error that starts with the
// expected text (the field's name first).
class ConfigErrors {
 public:
  explicit ConfigErrors(json base) : base_(std::move(base)) {}
  template <typename Edit>
  void with(const std::string& what, Edit edit, const std::string& starts) {
    json c = base_;
    edit(c);
    cases_.push_back({what, std::move(c), starts});
  }
  void check() const {
    for (const Case& c : cases_) {
      INFO(c.what);
      const std::string error = config_error(c.config);
      INFO(error);
      CHECK(error.rfind(c.starts, 0) == 0);
    }
  }

 private:
  struct Case {
    std::string what;
    json config;
    std::string starts;
  };
  json base_;
  std::vector<Case> cases_;
};

// One step's input: `stages` at `now`, one second after the last step.
inline PolicyInput input_of(std::vector<StageView> stages, std::int64_t now = kSecond) {
  PolicyInput in;
  in.now_ns = now;
  in.interval_ns = kSecond;
  in.stages = std::move(stages);
  return in;
}

}  // namespace sluice::delta_fair_test
