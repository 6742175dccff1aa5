// The prio-bucket object's configuration: parsing and checking
// (sluice/objects/prio_bucket.h).
#include <algorithm>
#include <cmath>
#include <exception>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "sluice/config_reader.h"
#include "sluice/objects/prio_bucket.h"
#include "sluice/wire.h"

namespace sluice {
namespace {

using config::positive_number;

// A class name: 1-32 characters of [A-Za-z0-9_.-] (it becomes part of a
// tunable's name, weight_<name>).
bool good_name(std::string_view s) {
  if (s.empty() || s.size() > 32) return false;
  for (char ch : s) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == '-';
    if (!ok) return false;
  }
  return true;
}

// An origin pattern: an origin name (1-63 of [A-Za-z0-9_.:-]), optionally
// ending in '*'; "*" alone matches every origin.
bool good_pattern(std::string_view s) {
  if (!s.empty() && s.back() == '*') s.remove_suffix(1);
  if (s.size() > 63) return false;
  for (char ch : s) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == ':' || ch == '-';
    if (!ok) return false;
  }
  return true;
}

Status parse_class(const nlohmann::json& v, const std::string& at, PrioBucketConfig::Class& c) {
  if (!v.is_object()) {
    return Status::invalid(at +
                           ": must be an object {\"name\", \"origins\", \"priority\", "
                           "\"weight\"}, got " +
                           wire::echo(v));
  }
  for (const auto& [key, value] : v.items()) {
    if (key == "name") {
      if (!value.is_string() || !good_name(value.get<std::string>())) {
        return Status::invalid(at + ".name: must be 1-32 characters of [A-Za-z0-9_.-], got " +
                               wire::echo(value));
      }
      c.name = value.get<std::string>();
    } else if (key == "origins") {
      if (!value.is_array()) {
        return Status::invalid(at + ".origins: must be an array of origin names, got " +
                               wire::echo(value));
      }
      c.origins.clear();
      for (std::size_t i = 0; i < value.size(); ++i) {
        const auto& o = value[i];
        if (!o.is_string() || !good_pattern(o.get<std::string>())) {
          return Status::invalid(at + ".origins[" + std::to_string(i) +
                                 "]: must be an origin name (1-63 characters of "
                                 "[A-Za-z0-9_.:-]), optionally ending in '*', got " +
                                 wire::echo(o));
        }
        c.origins.push_back(o.get<std::string>());
      }
    } else if (key == "priority") {
      if (!value.is_number_integer() || value.get<std::int64_t>() < 0 ||
          value.get<std::int64_t>() > kPrioMaxPriority ||
          (value.is_number_unsigned() && value.get<std::uint64_t>() > kPrioMaxPriority)) {
        return Status::invalid(at + ".priority: must be an integer from 0 (first) to 7, got " +
                               wire::echo(value));
      }
      c.priority = value.get<int>();
    } else if (key == "weight") {
      const double w = value.is_number() ? value.get<double>() : -1;
      if (!std::isfinite(w) || w < kPrioMinWeight || w > kPrioMaxWeight) {
        return Status::invalid(at + ".weight: must be a number between 0.001 and 1000000, got " +
                               wire::echo(value));
      }
      c.weight = w;
    } else {
      return Status::invalid(at + ": unknown field '" + key +
                             "' (expected name, origins, priority, weight)");
    }
  }
  if (c.name.empty()) return Status::invalid(at + ".name: required");
  return {};
}

Status parse_classes(const nlohmann::json& v, PrioBucketConfig& c, const PrioBucketConfig* base) {
  if (!v.is_array() || v.empty() || v.size() > kPrioMaxClasses) {
    return Status::invalid("classes: must be an array of 1 to 8 classes, got " + wire::echo(v));
  }
  std::vector<PrioBucketConfig::Class> classes(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string at = "classes[" + std::to_string(i) + "]";
    SLUICE_RETURN_IF_ERROR(parse_class(v[i], at, classes[i]));
    for (std::size_t j = 0; j < i; ++j) {
      if (classes[j].name == classes[i].name) {
        return Status::invalid(at + ".name: '" + classes[i].name + "' is already the name of " +
                               "classes[" + std::to_string(j) + "]");
      }
    }
  }
  if (base != nullptr) {
    // Waiters are queued in their classes and armed shortcuts pay from a
    // class's lease: the classes and their origins stay as first configured.
    bool same = classes.size() == base->classes.size();
    for (std::size_t i = 0; same && i < classes.size(); ++i) {
      same = classes[i].name == base->classes[i].name &&
             classes[i].origins == base->classes[i].origins;
    }
    if (!same) {
      return Status::invalid(
          "classes: the classes' names, order and origins cannot change once configured "
          "(priorities and weights may); create a new object instead");
    }
  }
  c.classes = std::move(classes);
  return {};
}

Status parse_into(const nlohmann::json& config, PrioBucketConfig& c, const PrioBucketConfig* base) {
  if (!config.is_object()) return Status::invalid("config: must be an object");
  for (const auto& [key, value] : config.items()) {
    if (key != "rate" && key != "unit" && key != "burst" && key != "classes" &&
        key != "default_class") {
      return Status::invalid("unknown field '" + key + "'");
    }
  }
  if (auto it = config.find("rate"); it != config.end()) {
    if (!positive_number(*it) || it->get<double>() < 1) {
      return Status::invalid("rate: must be a number of at least 1 token per second, got " +
                             wire::echo(*it));
    }
    c.rate = it->get<double>();
  }
  if (auto it = config.find("unit"); it != config.end()) {
    if (*it == "bytes") {
      c.unit = PrioBucketConfig::kBytes;
    } else if (*it == "ops") {
      c.unit = PrioBucketConfig::kOps;
    } else {
      return Status::invalid("unit: must be \"bytes\" or \"ops\", got " + wire::echo(*it));
    }
  }
  if (auto it = config.find("burst"); it != config.end()) {
    if (!positive_number(*it) || it->get<double>() < 1) {
      return Status::invalid("burst: must be a number of at least 1 token, got " + wire::echo(*it));
    }
    c.burst = it->get<double>();
    c.burst_set = true;
  }
  if (auto it = config.find("classes"); it != config.end()) {
    SLUICE_RETURN_IF_ERROR(parse_classes(*it, c, base));
    if (!config.contains("default_class") && base == nullptr) {
      c.default_class = static_cast<unsigned>(c.classes.size() - 1);
    }
  }
  if (auto it = config.find("default_class"); it != config.end()) {
    if (!it->is_string()) {
      return Status::invalid("default_class: must be the name of a class, got " + wire::echo(*it));
    }
    unsigned i = 0;
    while (i < c.classes.size() && c.classes[i].name != it->get<std::string>()) ++i;
    if (i == c.classes.size()) {
      return Status::invalid("default_class: no class named " + wire::echo(*it));
    }
    if (base != nullptr && i != base->default_class) {
      return Status::invalid("default_class: cannot change once configured");
    }
    c.default_class = i;
  }
  return {};
}

}  // namespace

bool prio_origin_matches(std::string_view pattern, std::string_view name) noexcept {
  if (!pattern.empty() && pattern.back() == '*') {
    return name.starts_with(pattern.substr(0, pattern.size() - 1));
  }
  return pattern == name;
}

StatusOr<PrioBucketConfig> parse_prio_bucket_config(const nlohmann::json& config,
                                                    const PrioBucketConfig* base) {
  PrioBucketConfig c = base ? *base : PrioBucketConfig{};
  try {
    SLUICE_RETURN_IF_ERROR(parse_into(config, c, base));
  } catch (const std::exception& e) {  // nlohmann's type errors, should any slip through
    return Status::invalid(std::string("config: ") + e.what());
  }
  if (base == nullptr) {
    if (!config.contains("rate")) return Status::invalid("rate: required");
    if (!config.contains("classes")) {
      return Status::invalid(
          "classes: required (an array of {\"name\", \"origins\", \"priority\", \"weight\"})");
    }
  }
  if (!c.burst_set) c.burst = std::max(1.0, c.rate / 10);
  return c;
}

}  // namespace sluice
