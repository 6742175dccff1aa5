// Parsed, validated rules (docs/rules.md). Internal to libstage.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/stage.h"
#include "sluice/status.h"

namespace sluice::detail {

// A match: for each classifier it names, the values it accepts.
struct MatchSpec {
  ClassifierSet given = 0;
  std::array<std::vector<std::uint64_t>, kClassifierCount> values;
  nlohmann::json source;  // as written, for stage info
};

struct Rule {
  enum class Kind {
    kCreateChannel,
    kRemoveChannel,
    kCreateObject,
    kRemoveObject,
    kDifferentiate,
    kRoute,
    kConfigure,
  };
  Kind kind = Kind::kCreateChannel;
  std::string channel;  // empty: stage level (differentiate)
  std::string object;
  std::string type;
  std::optional<MatchSpec> match;
  bool is_default = false;
  ClassifierSet classifiers = 0;
  nlohmann::json config = nlohmann::json::object();
};

// Validates a batch (an array of rules or {"version": 1, "rules": [...]}).
// Errors name the rule and field: "rules[2].match.origin: ...".
StatusOr<std::vector<Rule>> parse_rules(const nlohmann::json& batch);

// Validates one match object; `path` prefixes error messages.
StatusOr<MatchSpec> parse_match(const nlohmann::json& match, const std::string& path);

std::vector<std::string> classifier_names(ClassifierSet set);
bool valid_name(const std::string& name);

}  // namespace sluice::detail
