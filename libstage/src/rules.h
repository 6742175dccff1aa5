// Parsed, validated rules (docs/rules.md). Internal to libstage.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
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

// One rule, validated. Kept small (a batch of them is parsed for every rules
// message a stage gets): the rare match lives behind a pointer and an absent
// config is null, not an empty object.
struct Rule {
  enum class Kind {
    kCreateChannel,
    kRemoveChannel,
    kCreateObject,
    kRemoveObject,
    kDifferentiate,
    kRoute,
    kConfigure,
    kLease,
  };
  Kind kind = Kind::kCreateChannel;
  std::string channel;  // empty: stage level (differentiate)
  std::string object;
  std::string type;
  std::unique_ptr<MatchSpec> match;
  bool is_default = false;
  ClassifierSet classifiers = 0;
  nlohmann::json config;  // an object, or null when the rule gave none
  // kLease: how long the lease lasts, and the configure rules applied when it runs out.
  std::uint32_t lease_ms = 0;
  std::shared_ptr<const std::vector<Rule>> fallback;
};

// The longest lease a rule may ask for (a day), and the most fallback rules it carries.
inline constexpr std::uint32_t kMaxLeaseMs = 86'400'000;
inline constexpr std::size_t kMaxFallbackRules = 1024;

// Validates a batch (an array of rules or {"version": 1, "rules": [...]}).
// Errors name the rule and field: "rules[2].match.origin: ...".
StatusOr<std::vector<Rule>> parse_rules(const nlohmann::json& batch);

// Validates one match object; `path` prefixes error messages.
StatusOr<MatchSpec> parse_match(const nlohmann::json& match, const std::string& path);

std::vector<std::string> classifier_names(ClassifierSet set);
bool valid_name(const std::string& name);

}  // namespace sluice::detail
