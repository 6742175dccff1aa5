// Policy documents: parsing, loading and inlining rules files (policy_doc.h).
#include "policy_doc.h"

#include <cstdint>
#include <string_view>

#include "sluice/json_text.h"
#include "sluice/policy.h"
#include "sluice/stage.h"

namespace sluice::control {

using nlohmann::json;

namespace {

// Refuses keys naming files or paths anywhere in a policy configuration that
// arrived over the socket.
Status check_no_paths(const json& j, const std::string& where) {
  if (j.is_object()) {
    for (auto& [k, v] : j.items()) {
      const std::string_view key = k;
      if (key.ends_with("_file") || key.ends_with("_path") || key == "file" || key == "path") {
        return Status::invalid(where + "." + k +
                               ": path-valued settings are not accepted over the socket "
                               "(`sluice policy set` inlines rules files)");
      }
      SLUICE_RETURN_IF_ERROR(check_no_paths(v, where + "." + k));
    }
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i) {
      SLUICE_RETURN_IF_ERROR(check_no_paths(j[i], where + "[" + std::to_string(i) + "]"));
    }
  }
  return Status::ok();
}

}  // namespace

StatusOr<json> read_json_file(const std::string& path) {
  auto text = read_rules_file(path);
  if (!text) return text.status();
  auto j = parse_json_text(*text);
  if (!j) return j.status().with_prefix(path + ": ");
  return j;
}

std::string dir_of(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

StatusOr<PolicyDoc> parse_policy_doc(const json& doc, bool from_wire, const std::string& base_dir) {
  if (!doc.is_object()) return Status::invalid("policy: expected a JSON object");
  PolicyDoc p;
  for (auto& [k, v] : doc.items()) {
    if (k == "policy") {
      if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
        return Status::invalid("policy: expected a policy name");
      }
      p.policy = v.get<std::string>();
    } else if (k == "interval_ms") {
      if (!v.is_number_integer() || v.get<std::int64_t>() < 1 ||
          v.get<std::int64_t>() > kMaxIntervalMs) {
        return Status::invalid("interval_ms: expected an integer in 1.." +
                               std::to_string(kMaxIntervalMs));
      }
      p.interval_ms = v.get<int>();
    } else if (k == "config") {
      if (!v.is_object()) return Status::invalid("config: expected an object");
      p.config = v;
    } else if (k == "version" || k == "comment") {
      // accepted, ignored
    } else {
      return Status::invalid(k + ": unknown field (expected policy, interval_ms, config)");
    }
  }
  if (from_wire) {
    SLUICE_RETURN_IF_ERROR(check_no_paths(p.config, "config"));
  } else if (auto it = p.config.find("rules_file");
             it != p.config.end() && it->is_string() && !base_dir.empty()) {
    std::string f = it->get<std::string>();
    if (!f.empty() && f[0] != '/') *it = base_dir + "/" + f;
  }
  return p;
}

StatusOr<PolicyDoc> load_policy_file(const std::string& path) {
  auto doc = read_json_file(path);
  if (!doc) return doc.status();
  auto p = parse_policy_doc(*doc, false, dir_of(path));
  if (!p) return p.status().with_prefix(path + ": ");
  return p;
}

StatusOr<json> check_policy_file(const std::string& path) {
  auto doc = load_policy_file(path);
  if (!doc) return doc.status();
  auto policy = make_policy(doc->policy, doc->config);
  if (!policy) return policy.status().with_prefix(path + ": ");
  json out = {{"policy", doc->policy},
              {"interval_ms", doc->interval_ms ? json(*doc->interval_ms) : json(nullptr)}};
  json explained = (*policy)->explain();
  if (explained.is_object() && !explained.contains("policy") &&
      !explained.contains("interval_ms")) {
    out.update(explained);
  } else {
    out["explain"] = std::move(explained);
  }
  return out;
}

Status inline_rules_files(json& doc, const std::string& base_dir) {
  if (!doc.is_object()) return Status::invalid("policy: expected a JSON object");
  auto c = doc.find("config");
  if (c == doc.end() || !c->is_object()) return Status::ok();
  auto f = c->find("rules_file");
  if (f == c->end()) return Status::ok();
  if (!f->is_string()) return Status::invalid("config.rules_file: expected a path");
  std::string path = f->get<std::string>();
  if (!path.empty() && path[0] != '/') path = base_dir + "/" + path;
  auto rules = read_json_file(path);
  if (!rules) return rules.status().with_prefix("config.rules_file: ");
  (*c)["rules"] = std::move(*rules);
  c->erase("rules_file");
  return Status::ok();
}

}  // namespace sluice::control
