// Parsed, validated rules (docs/rules.md). Internal to libstage.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
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
  };
  Kind kind = Kind::kCreateChannel;
  std::string channel;  // empty: stage level (differentiate)
  std::string object;
  std::string type;
  std::unique_ptr<MatchSpec> match;
  bool is_default = false;
  ClassifierSet classifiers = 0;
  nlohmann::json config;  // an object, or null when the rule gave none
};

// Validates a batch (an array of rules or {"version": 1, "rules": [...]}).
// Errors name the rule and field: "rules[2].match.origin: ...".
StatusOr<std::vector<Rule>> parse_rules(const nlohmann::json& batch);

// parse_rules(nlohmann::json::parse(text)) for the batches the daemon sends,
// without building a JSON value for the batch: an array of rules, or
// {"rules": [...]} with an optional "version": 1, of the kinds configure,
// create_channel, remove_channel, create_object and remove_object, without
// match or classifiers, whose strings have no escapes and whose configs are
// flat objects (no object or array inside), as wire::dump() writes them
// (blanks are allowed). That covers what control loops send every cycle and
// the static policy's replacing batches. When it returns rules, they are the
// ones parse_rules would return for `text`. On anything else, other rules, an
// invalid or malformed batch included, it returns std::nullopt and has decided
// nothing: parse the text with nlohmann and call parse_rules, whose answer (or
// error) stands.
std::optional<std::vector<Rule>> parse_compact_text(std::string_view text);

// Validates one match object; `path` prefixes error messages.
StatusOr<MatchSpec> parse_match(const nlohmann::json& match, const std::string& path);

std::vector<std::string> classifier_names(ClassifierSet set);
bool valid_name(const std::string& name);

}  // namespace sluice::detail
