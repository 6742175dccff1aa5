#include "rules.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "sluice/wire.h"

namespace sluice {

namespace {
constexpr std::array<std::string_view, kClassifierCount> kClassifierNames = {
    "workflow", "operation", "size_class", "origin", "tenant", "level"};
}  // namespace

std::string_view classifier_name(Classifier c) noexcept {
  auto i = static_cast<std::size_t>(c);
  return i < kClassifierNames.size() ? kClassifierNames[i] : std::string_view("invalid");
}

std::optional<Classifier> parse_classifier(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kClassifierNames.size(); ++i) {
    if (kClassifierNames[i] == name) return static_cast<Classifier>(i);
  }
  return std::nullopt;
}

namespace detail {
namespace {

// A value quoted in an error: bounded, however large the peer made it.
std::string quoted(const nlohmann::json& v) {
  return wire::echo(v);
}

std::string joined_ops() {
  std::string s;
  for (int i = 0; i < kOpCount; ++i)
    s += (i ? ", " : "") + std::string(op_name(static_cast<Op>(i)));
  return s;
}

std::string joined_classifiers() {
  std::string s;
  for (auto n : kClassifierNames) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

// One classifier value in a match; `path` is "...match.origin".
StatusOr<std::uint64_t> parse_value(Classifier c, const nlohmann::json& v,
                                    const std::string& path) {
  auto integer = [&](std::uint64_t max) -> StatusOr<std::uint64_t> {
    if (!v.is_number_integer() ||
        (v.is_number_integer() && !v.is_number_unsigned() && v.get<std::int64_t>() < 0)) {
      return Status::invalid(path + ": must be an integer from 0 to " + std::to_string(max) +
                             ", got " + quoted(v));
    }
    auto x = v.get<std::uint64_t>();
    if (x > max) {
      return Status::invalid(path + ": must be an integer from 0 to " + std::to_string(max) +
                             ", got " + quoted(v));
    }
    return x;
  };
  switch (c) {
    case Classifier::kWorkflow:
      return integer(std::numeric_limits<std::uint64_t>::max());
    case Classifier::kSizeClass:
      return integer(64);
    case Classifier::kTenant:
      return integer(std::numeric_limits<std::uint32_t>::max());
    case Classifier::kLevel:
      return integer(255);
    case Classifier::kOperation: {
      if (!v.is_string())
        return Status::invalid(path + ": must be an operation name, got " + quoted(v));
      auto op = parse_op(v.get<std::string>());
      if (!op) {
        return Status::invalid(path + ": unknown operation " + quoted(v) + " (expected one of " +
                               joined_ops() + ")");
      }
      return static_cast<std::uint64_t>(*op);
    }
    case Classifier::kOrigin: {
      if (!v.is_string())
        return Status::invalid(path + ": must be an origin name, got " + quoted(v));
      auto id = intern_origin(v.get<std::string>());
      if (!id) {
        return Status::invalid(path + ": invalid origin name " + quoted(v) +
                               " (1-63 characters of A-Z a-z 0-9 _ . : -)");
      }
      return static_cast<std::uint64_t>(*id);
    }
  }
  return Status::internal(path + ": unhandled classifier");
}

StatusOr<ClassifierSet> parse_classifiers(const nlohmann::json& v, const std::string& path) {
  if (!v.is_array()) return Status::invalid(path + ": must be an array of classifier names");
  ClassifierSet set = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::string p = path + "[" + std::to_string(i) + "]";
    if (!v[i].is_string())
      return Status::invalid(p + ": must be a classifier name, got " + quoted(v[i]));
    auto c = parse_classifier(v[i].get<std::string>());
    if (!c) {
      return Status::invalid(p + ": unknown classifier " + quoted(v[i]) + " (expected one of " +
                             joined_classifiers() + ")");
    }
    auto bit = static_cast<ClassifierSet>(1u << static_cast<unsigned>(*c));
    if (set & bit) return Status::invalid(p + ": classifier " + quoted(v[i]) + " is listed twice");
    set |= bit;
  }
  return set;
}

// Field access with exact error messages.
class Fields {
 public:
  Fields(const nlohmann::json& obj, std::string path) : obj_(obj), path_(std::move(path)) {}

  const nlohmann::json* get(const char* key) {
    // A rule reads at most seven fields, every one a literal: a small array
    // rather than a set (an allocation per field on every applied rule).
    // Were a rule ever to read more than it holds, no_others() would refuse
    // the extra field as unknown: loud in tests, never an exception.
    if (used_count_ < used_.size() &&
        std::none_of(used_.begin(), used_.begin() + used_count_,
                     [&](const char* k) { return std::strcmp(k, key) == 0; })) {
      used_[used_count_++] = key;
    }
    auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }
  StatusOr<std::string> name(const char* key) {
    const nlohmann::json* v = get(key);
    if (v == nullptr) return Status::invalid(path_ + "." + key + ": missing");
    if (!v->is_string() || !valid_name(v->get_ref<const std::string&>())) {
      return Status::invalid(path_ + "." + key +
                             ": must be a name of 1-64 characters of A-Z a-z 0-9 _ . : -, got " +
                             quoted(*v));
    }
    return v->get_ref<const std::string&>();
  }
  StatusOr<bool> flag(const char* key) {
    const nlohmann::json* v = get(key);
    if (v == nullptr) return false;
    if (!v->is_boolean())
      return Status::invalid(path_ + "." + key + ": must be true or false, got " + quoted(*v));
    return v->get<bool>();
  }
  // Call after every get(): rejects fields the rule does not take.
  Status no_others() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      const std::string& key = it.key();
      if (std::none_of(used_.begin(), used_.begin() + used_count_,
                       [&](const char* k) { return key == k; })) {
        return Status::invalid(path_ + ": unknown field '" + key + "'");
      }
    }
    return {};
  }
  const std::string& path() const { return path_; }

 private:
  const nlohmann::json& obj_;
  std::string path_;
  std::array<const char*, 12> used_{};
  std::size_t used_count_ = 0;
};

#define SLUICE_ASSIGN_OR_RETURN(lhs, expr)         \
  auto lhs##_or = (expr);                          \
  if (!lhs##_or.is_ok()) return lhs##_or.status(); \
  auto lhs = std::move(lhs##_or).value()

StatusOr<Rule> parse_rule(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object()) return Status::invalid(path + ": must be an object, got " + quoted(j));
  Fields f(j, path);
  const nlohmann::json* kind = f.get("rule");
  if (kind == nullptr) return Status::invalid(path + ".rule: missing");
  if (!kind->is_string())
    return Status::invalid(path + ".rule: must be a string, got " + quoted(*kind));
  const std::string k = kind->get<std::string>();
  Rule r;
  auto match = [&]() -> Status {
    if (const nlohmann::json* m = f.get("match")) {
      auto spec = parse_match(*m, path + ".match");
      if (!spec.is_ok()) return spec.status();
      r.match = std::make_unique<MatchSpec>(std::move(spec).value());
    }
    return {};
  };
  if (k == "create_channel") {
    r.kind = Rule::Kind::kCreateChannel;
    SLUICE_ASSIGN_OR_RETURN(channel, f.name("channel"));
    r.channel = channel;
    SLUICE_RETURN_IF_ERROR(match());
    SLUICE_ASSIGN_OR_RETURN(def, f.flag("default"));
    r.is_default = def;
    if (const nlohmann::json* c = f.get("classifiers")) {
      SLUICE_ASSIGN_OR_RETURN(set, parse_classifiers(*c, path + ".classifiers"));
      r.classifiers = set;
    }
  } else if (k == "remove_channel") {
    r.kind = Rule::Kind::kRemoveChannel;
    SLUICE_ASSIGN_OR_RETURN(channel, f.name("channel"));
    r.channel = channel;
  } else if (k == "create_object") {
    r.kind = Rule::Kind::kCreateObject;
    SLUICE_ASSIGN_OR_RETURN(channel, f.name("channel"));
    SLUICE_ASSIGN_OR_RETURN(object, f.name("object"));
    SLUICE_ASSIGN_OR_RETURN(type, f.name("type"));
    r.channel = channel;
    r.object = object;
    r.type = type;
    if (const nlohmann::json* c = f.get("config")) {
      if (!c->is_object())
        return Status::invalid(path + ".config: must be an object, got " + quoted(*c));
      r.config = *c;
    }
    SLUICE_RETURN_IF_ERROR(match());
    SLUICE_ASSIGN_OR_RETURN(def, f.flag("default"));
    r.is_default = def;
  } else if (k == "remove_object") {
    r.kind = Rule::Kind::kRemoveObject;
    SLUICE_ASSIGN_OR_RETURN(channel, f.name("channel"));
    SLUICE_ASSIGN_OR_RETURN(object, f.name("object"));
    r.channel = channel;
    r.object = object;
  } else if (k == "differentiate") {
    r.kind = Rule::Kind::kDifferentiate;
    if (f.get("channel") != nullptr) {
      SLUICE_ASSIGN_OR_RETURN(channel, f.name("channel"));
      r.channel = channel;
    }
    const nlohmann::json* c = f.get("classifiers");
    if (c == nullptr) return Status::invalid(path + ".classifiers: missing");
    SLUICE_ASSIGN_OR_RETURN(set, parse_classifiers(*c, path + ".classifiers"));
    r.classifiers = set;
  } else if (k == "route") {
    r.kind = Rule::Kind::kRoute;
    SLUICE_ASSIGN_OR_RETURN(channel, f.name("channel"));
    r.channel = channel;
    if (f.get("object") != nullptr) {
      SLUICE_ASSIGN_OR_RETURN(object, f.name("object"));
      r.object = object;
    }
    if (j.find("match") == j.end()) return Status::invalid(path + ".match: missing");
    SLUICE_RETURN_IF_ERROR(match());
  } else if (k == "configure") {
    r.kind = Rule::Kind::kConfigure;
    SLUICE_ASSIGN_OR_RETURN(channel, f.name("channel"));
    SLUICE_ASSIGN_OR_RETURN(object, f.name("object"));
    r.channel = channel;
    r.object = object;
    const nlohmann::json* c = f.get("config");
    if (c == nullptr) return Status::invalid(path + ".config: missing");
    if (!c->is_object())
      return Status::invalid(path + ".config: must be an object, got " + quoted(*c));
    r.config = *c;
  } else if (k == "lease") {
    r.kind = Rule::Kind::kLease;
    const nlohmann::json* ms = f.get("ms");
    if (ms == nullptr) return Status::invalid(path + ".ms: missing");
    // (A positive integer from JSON text is unsigned; one a program wrote may be signed.)
    if (!ms->is_number_integer() || ms->get<std::int64_t>() < 1 ||
        ms->get<std::int64_t>() > kMaxLeaseMs) {
      return Status::invalid(path + ".ms: must be an integer from 1 to " +
                             std::to_string(kMaxLeaseMs) + " (milliseconds), got " + quoted(*ms));
    }
    r.lease_ms = static_cast<std::uint32_t>(ms->get<std::int64_t>());
    const nlohmann::json* fb = f.get("fallback");
    if (fb == nullptr) return Status::invalid(path + ".fallback: missing");
    if (!fb->is_array() || fb->size() > kMaxFallbackRules) {
      return Status::invalid(path + ".fallback: must be an array of at most " +
                             std::to_string(kMaxFallbackRules) + " configure rules, got " +
                             quoted(*fb));
    }
    auto rules = std::make_shared<std::vector<Rule>>();
    rules->reserve(fb->size());
    for (std::size_t i = 0; i < fb->size(); ++i) {
      const std::string p = path + ".fallback[" + std::to_string(i) + "]";
      const nlohmann::json& one = (*fb)[i];
      if (!one.is_object() || one.value("rule", nlohmann::json()) != "configure") {
        return Status::invalid(p + ": a lease falls back to configure rules only, got " +
                               quoted(one));
      }
      SLUICE_ASSIGN_OR_RETURN(rule, parse_rule(one, p));
      rules->push_back(std::move(rule));
    }
    r.fallback = std::move(rules);
  } else {
    return Status::invalid(path + ".rule: unknown rule " + quoted(*kind) +
                           " (expected create_channel, remove_channel, create_object, "
                           "remove_object, differentiate, route, configure or lease)");
  }
  SLUICE_RETURN_IF_ERROR(f.no_others());
  return r;
}

}  // namespace

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::vector<std::string> classifier_names(ClassifierSet set) {
  std::vector<std::string> out;
  for (int i = 0; i < kClassifierCount; ++i) {
    if (set & (1u << i)) out.emplace_back(kClassifierNames[static_cast<std::size_t>(i)]);
  }
  return out;
}

StatusOr<MatchSpec> parse_match(const nlohmann::json& match, const std::string& path) {
  if (!match.is_object())
    return Status::invalid(path + ": must be an object, got " + quoted(match));
  MatchSpec spec;
  spec.source = match;
  for (const auto& [key, value] : match.items()) {
    auto c = parse_classifier(key);
    if (!c) {
      return Status::invalid(path + ": unknown classifier '" + key + "' (expected one of " +
                             joined_classifiers() + ")");
    }
    auto ci = static_cast<std::size_t>(*c);
    spec.given |= static_cast<ClassifierSet>(1u << ci);
    std::string p = path + "." + key;
    if (value.is_array()) {
      if (value.empty()) return Status::invalid(p + ": must not be an empty array");
      for (std::size_t i = 0; i < value.size(); ++i) {
        SLUICE_ASSIGN_OR_RETURN(x, parse_value(*c, value[i], p + "[" + std::to_string(i) + "]"));
        spec.values[ci].push_back(x);
      }
    } else {
      SLUICE_ASSIGN_OR_RETURN(x, parse_value(*c, value, p));
      spec.values[ci].push_back(x);
    }
  }
  return spec;
}

StatusOr<std::vector<Rule>> parse_rules(const nlohmann::json& batch) {
  const nlohmann::json* list = &batch;
  if (batch.is_object()) {
    for (const auto& [key, value] : batch.items()) {
      if (key != "version" && key != "rules") return Status::invalid("unknown field '" + key + "'");
    }
    auto v = batch.find("version");
    if (v != batch.end() && !(v->is_number_integer() && v->get<std::int64_t>() == 1)) {
      return Status::invalid("version: unsupported rules version " + quoted(*v) + " (expected 1)");
    }
    auto r = batch.find("rules");
    if (r == batch.end()) return Status::invalid("rules: missing");
    list = &*r;
  }
  if (!list->is_array()) {
    return Status::invalid("rules: must be an array of rules (or an object with \"rules\")");
  }
  std::vector<Rule> out;
  out.reserve(list->size());
  for (std::size_t i = 0; i < list->size(); ++i) {
    SLUICE_ASSIGN_OR_RETURN(rule, parse_rule((*list)[i], "rules[" + std::to_string(i) + "]"));
    out.push_back(std::move(rule));
  }
  return out;
}

}  // namespace detail
}  // namespace sluice
