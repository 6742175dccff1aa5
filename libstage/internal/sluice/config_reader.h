// Reading a JSON configuration into typed fields, with errors that name the
// field's path ("ln.objects[0].object: required"): the one field reader of
// the objects' and the policies' configurations and the example programs'
// plans. Not installed.
//
// Thread safety: pure functions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "sluice/status.h"

namespace sluice::config {

using nlohmann::json;

// 100 rather than 100.0 in messages; other numbers as JSON prints them.
inline std::string format_number(double v) {
  if (std::isfinite(v) && v == std::trunc(v) && std::abs(v) < 1e15) {
    return std::to_string(static_cast<std::int64_t>(v));
  }
  return json(v).dump();
}

// Every digit a double needs to read back as itself ("%.17g"): what a value
// that failed a check was, in an error message.
inline std::string exact_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// `v` as JSON text for an error message: ASCII only, and at most 256 bytes
// of it with the length of the whole (a value may come from a peer, who makes
// it as long as it likes).
inline std::string shown(const json& v) {
  std::string t = v.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
  if (t.size() > 256) {
    const std::size_t n = t.size();
    t.resize(256);
    t += "... (" + std::to_string(n) + " bytes)";
  }
  return t;
}

// A finite number > 0.
inline bool positive_number(const json& v) {
  return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0;
}

// A whole number within [lo, hi] (lo >= 0), or nothing.
inline std::optional<std::uint64_t> unsigned_in(const json& v, std::uint64_t lo, std::uint64_t hi) {
  if (!v.is_number_integer()) return std::nullopt;
  if (!v.is_number_unsigned() && v.get<std::int64_t>() < 0) return std::nullopt;
  const auto n = v.get<std::uint64_t>();
  if (n < lo || n > hi) return std::nullopt;
  return n;
}

inline std::string join_path(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

inline Status check_keys(const json& j, const std::string& path,
                         std::initializer_list<std::string_view> known) {
  if (!j.is_object()) {
    return Status::invalid((path.empty() ? std::string("config") : path) +
                           ": must be an object, got " + shown(j));
  }
  for (const auto& [key, value] : j.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return Status::invalid(join_path(path, key) + ": unknown field");
    }
  }
  return Status::ok();
}

// `v` into *out: a finite number in [min, max], or (min, max] without
// allow_equal; the error names the field `f`.
inline Status read_number(const json& v, const std::string& f, double* out, double min,
                          bool allow_equal, double max = HUGE_VAL) {
  if (!v.is_number() || !std::isfinite(v.get<double>())) {
    return Status::invalid(f + ": must be a number, got " + shown(v));
  }
  const double x = v.get<double>();
  if (x < min || (!allow_equal && x == min) || x > max) {
    std::string range = (allow_equal ? ">= " : "> ") + format_number(min);
    if (max != HUGE_VAL) range += " and <= " + format_number(max);
    return Status::invalid(f + ": must be " + range + ", got " + shown(v));
  }
  *out = x;
  return Status::ok();
}

// j[key], when present, as read_number reads it.
inline Status get_number(const json& j, const std::string& path, std::string_view key, double* out,
                         double min, bool allow_equal, double max = HUGE_VAL) {
  auto it = j.find(key);
  if (it == j.end()) return Status::ok();
  return read_number(*it, join_path(path, key), out, min, allow_equal, max);
}

// Reads j[key] into *out when present: a whole number within [lo, hi]
// ("bin_ms: must be an integer from 10 to 60000, got 5").
template <typename T>
Status get_integer(const json& j, const std::string& path, std::string_view key, T* out, T lo,
                   T hi) {
  static_assert(std::is_integral_v<T>);
  auto it = j.find(key);
  if (it == j.end()) return Status::ok();
  if (it->is_number_integer()) {
    const auto fits = [&](auto v) {
      return std::cmp_greater_equal(v, lo) && std::cmp_less_equal(v, hi);
    };
    if (it->is_number_unsigned()) {
      if (const auto v = it->get<std::uint64_t>(); fits(v)) {
        *out = static_cast<T>(v);
        return Status::ok();
      }
    } else if (const auto v = it->get<std::int64_t>(); fits(v)) {
      *out = static_cast<T>(v);
      return Status::ok();
    }
  }
  return Status::invalid(join_path(path, key) + ": must be an integer from " + std::to_string(lo) +
                         " to " + std::to_string(hi) + ", got " + shown(*it));
}

// "<path.key>: required" unless j has `key`.
inline Status require(const json& j, const std::string& path, std::string_view key) {
  return j.contains(key) ? Status::ok() : Status::invalid(join_path(path, key) + ": required");
}

// `v` as a non-empty string into *out; the error names the field `f`.
inline Status get_name(const json& v, const std::string& f, std::string* out) {
  if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
    return Status::invalid(f + ": must be a non-empty string, got " + shown(v));
  }
  *out = v.get<std::string>();
  return Status::ok();
}

// j[key], when present, as get_name reads it.
inline Status get_string(const json& j, const std::string& path, std::string_view key,
                         std::string* out) {
  auto it = j.find(key);
  if (it == j.end()) return Status::ok();
  return get_name(*it, join_path(path, key), out);
}

inline Status get_bool(const json& j, const std::string& path, std::string_view key, bool* out) {
  auto it = j.find(key);
  if (it == j.end()) return Status::ok();
  if (!it->is_boolean()) {
    return Status::invalid(join_path(path, key) + ": must be true or false, got " + shown(*it));
  }
  *out = it->get<bool>();
  return Status::ok();
}

// A string that names one of `choices`; absent leaves *out alone. The error
// lists the choices in order: "ln.split: must be one of each, even, active".
template <typename T>
Status get_choice(const json& j, const std::string& path, std::string_view key,
                  std::initializer_list<std::pair<std::string_view, T>> choices, T* out) {
  auto it = j.find(key);
  if (it == j.end()) return Status::ok();
  if (it->is_string()) {
    const std::string& v = it->get_ref<const std::string&>();
    for (const auto& [name, value] : choices) {
      if (name == v) {
        *out = value;
        return Status::ok();
      }
    }
  }
  std::string names;
  for (const auto& [name, value] : choices)
    names += (names.empty() ? "" : ", ") + std::string(name);
  return Status::invalid(join_path(path, key) + ": must be one of " + names + ", got " +
                         shown(*it));
}

inline Status get_labels(const json& j, const std::string& path, std::string_view key,
                         std::map<std::string, std::string>* out) {
  auto it = j.find(key);
  if (it == j.end()) return Status::ok();
  const std::string f = join_path(path, key);
  if (!it->is_object())
    return Status::invalid(f + ": must be an object of strings, got " + shown(*it));
  std::map<std::string, std::string> labels;
  for (const auto& [k, v] : it->items()) {
    if (!v.is_string()) return Status::invalid(f + "." + k + ": must be a string, got " + shown(v));
    labels[k] = v.get<std::string>();
  }
  *out = std::move(labels);
  return Status::ok();
}

}  // namespace sluice::config
