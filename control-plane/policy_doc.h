// Policy documents: {"policy": NAME, "interval_ms": N, "config": {...}}, as
// `sluice serve --policy FILE` reads them, `policy_set` carries them and
// `sluice policy set FILE` sends them (docs/policies.md).
//
// Thread safety: pure functions (the file readers read the files they name).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "sluice/status.h"

namespace sluice::control {

// The most a control loop's interval may be, in a policy document, on the
// daemon's command line and in the cluster roles' configuration: an hour.
inline constexpr int kMaxIntervalMs = 3'600'000;

// A parsed policy document.
struct PolicyDoc {
  std::string policy = "static";
  std::optional<int> interval_ms;  // 1..kMaxIntervalMs
  nlohmann::json config = nlohmann::json::object();
};

// Validates the document. `from_wire`: refuse path-valued config keys ("*_file",
// "*_path", "file", "path"), anywhere in the config. `base_dir`: relative
// "rules_file" paths are resolved against it.
StatusOr<PolicyDoc> parse_policy_doc(const nlohmann::json& doc, bool from_wire,
                                     const std::string& base_dir = "");
// Reads and parses a policy file; relative paths in it are the file's.
StatusOr<PolicyDoc> load_policy_file(const std::string& path);
// What `sluice policy check FILE` shows, offline: the document read and
// parsed as the daemon reads it and its policy configured, then
// {"policy": NAME, "interval_ms": N or null} with the members of the policy's
// explain() (a value that is not an object, or that would clash with those
// two, goes under "explain"). Errors name the file and the field; a document
// or configuration the policy refuses is an invalid-argument error.
StatusOr<nlohmann::json> check_policy_file(const std::string& path);
// Replaces config.rules_file by config.rules (read from the file, relative to
// base_dir): what the CLI does before `policy set` sends a policy.
Status inline_rules_files(nlohmann::json& doc, const std::string& base_dir);

// The JSON in the file at `path` (read with read_rules_file: a regular file
// of bounded size); errors name the path, and the byte where parsing failed.
StatusOr<nlohmann::json> read_json_file(const std::string& path);
// The directory of `path` ("." for a bare name, "/" for a file at the root).
std::string dir_of(const std::string& path);

}  // namespace sluice::control
