// Rules batches (docs/rules.md) built from typed C++ values rather than JSON.
// build() gives {"version": 1, "rules": [...]}, checked by the stage's own
// rule parser, so a batch that builds is one a stage accepts in form and an
// error names the rule and field as the stage would; what depends on a
// stage's layout is still the stage's to judge.
//
//   RulesBuilder b;
//   b.create_channel("flush", ChannelOptions().matching(Match().origins({"flush"})))
//       .create_object("flush", "limit", "drl", ObjectConfig().set("rate", 10485760));
//   StatusOr<nlohmann::json> batch = b.build();
//
// Thread safety: values used by one thread at a time; build() changes nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/context.h"
#include "sluice/stage.h"
#include "sluice/status.h"

namespace sluice {

// An object's configuration (the "config" of create_object and configure):
// fields by name, each a number, a flag or a string, as the object's type
// documents them (a drl's "rate", "burst", "unit", "refill_period_us").
// Setting a field again replaces it. A number that is not finite (JSON has
// no such number) is an error that build() reports with the field's path.
class ObjectConfig {
 public:
  ObjectConfig() = default;

  // An integer stays one (10485760, not 10485760.0).
  template <typename T>
  requires(std::is_integral_v<T> &&
           !std::is_same_v<T, bool>) ObjectConfig& set(const std::string& field, T value) {
    if constexpr (std::is_signed_v<T>) {
      return put(field, nlohmann::json(static_cast<std::int64_t>(value)));
    } else {
      return put(field, nlohmann::json(static_cast<std::uint64_t>(value)));
    }
  }
  ObjectConfig& set(const std::string& field, double value);
  ObjectConfig& set(const std::string& field, bool value) {
    return put(field, nlohmann::json(value));
  }
  ObjectConfig& set(const std::string& field, std::string value) {
    return put(field, nlohmann::json(std::move(value)));
  }
  ObjectConfig& set(const std::string& field, const char* value) {
    return put(field, nlohmann::json(value));
  }

  bool empty() const noexcept { return fields_.empty(); }
  // The fields as a JSON object.
  const nlohmann::json& fields() const noexcept { return fields_; }
  // The first field set to a value JSON cannot carry, with why; ok otherwise.
  const Status& error() const noexcept { return error_; }

 private:
  ObjectConfig& put(const std::string& field, nlohmann::json value);

  nlohmann::json fields_ = nlohmann::json::object();
  Status error_;
};

// A match (docs/rules.md): for each classifier it names, the values it
// accepts; a request matches when each named classifier has one of them.
// Every call adds values to its classifier.
class Match {
 public:
  Match& origins(const std::vector<std::string>& names);
  Match& operations(const std::vector<Op>& ops);
  Match& tenants(const std::vector<std::uint32_t>& tenants);
  Match& workflows(const std::vector<std::uint64_t>& workflows);
  Match& size_classes(const std::vector<std::uint32_t>& size_classes);
  Match& levels(const std::vector<std::uint32_t>& levels);

  bool empty() const noexcept { return source_.empty(); }
  // {"<classifier>": [values...], ...}
  const nlohmann::json& source() const noexcept { return source_; }

 private:
  // Appends the array `values` to c's accepted values.
  Match& add(Classifier c, const nlohmann::json& values);
  nlohmann::json source_ = nlohmann::json::object();
};

// What create_channel and create_object rules may add: a match, and whether
// the channel (object) takes the requests no other one matches. Setters chain:
// ChannelOptions().matching(Match().origins({"flush"})).as_default().
template <typename Options>
struct MatchOptions {
  Match match;  // empty: none
  bool is_default = false;

  Options& matching(Match m) {
    match = std::move(m);
    return static_cast<Options&>(*this);
  }
  Options& as_default(bool d = true) {
    is_default = d;
    return static_cast<Options&>(*this);
  }
};

struct ChannelOptions : MatchOptions<ChannelOptions> {
  std::vector<Classifier> classifiers;  // how the channel picks among its objects; empty: none

  ChannelOptions& selecting(std::vector<Classifier> c) {
    classifiers = std::move(c);
    return *this;
  }
};

struct ObjectOptions : MatchOptions<ObjectOptions> {};

class RulesBuilder {
 public:
  // differentiate: the classifiers that select channels (empty `channel`),
  // or objects within `channel`.
  RulesBuilder& differentiate(const std::vector<Classifier>& classifiers,
                              const std::string& channel = {});
  RulesBuilder& create_channel(const std::string& channel, const ChannelOptions& options = {});
  RulesBuilder& remove_channel(const std::string& channel);
  // With a config (an empty one included) the rule carries it; without, the
  // object starts from its type's defaults.
  RulesBuilder& create_object(const std::string& channel, const std::string& object,
                              const std::string& type,
                              const std::optional<ObjectConfig>& config = std::nullopt,
                              const ObjectOptions& options = {});
  RulesBuilder& remove_object(const std::string& channel, const std::string& object);
  // route: requests of `channel` that `match` selects go to `object` (empty:
  // the channel's own choice).
  RulesBuilder& route(const std::string& channel, const Match& match,
                      const std::string& object = {});
  RulesBuilder& configure(const std::string& channel, const std::string& object,
                          const ObjectConfig& config);
  // A rule already in JSON (one read from a user's rules file), checked with
  // the others by build().
  RulesBuilder& add_json(nlohmann::json rule);

  std::size_t size() const noexcept { return rules_.size(); }
  bool empty() const noexcept { return rules_.empty(); }

  // {"version": 1, "rules": [...]}, or why a stage would refuse its form.
  StatusOr<nlohmann::json> build() const;

 private:
  RulesBuilder& add(nlohmann::json rule, const ObjectConfig* config = nullptr);

  nlohmann::json rules_ = nlohmann::json::array();
  Status error_;  // the first config error, with its rule's path
};

}  // namespace sluice
