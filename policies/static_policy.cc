// `static`: fixed rules batches, sent to stages as they (re)connect.
#include "static_policy.h"

#include <fnmatch.h>

#include <set>
#include <string>
#include <utility>

#include "sluice/json_text.h"
#include "sluice/rule_builder.h"
#include "sluice/stage.h"

namespace sluice {
namespace {

using nlohmann::json;

bool is_glob(const std::string& s) {
  return s.find_first_of("*?[") != std::string::npos;
}

// The rules of a batch as an array (a batch is an array or {"version", "rules"}).
json batch_rules(const json& batch) {
  if (batch.is_array()) return batch;
  if (batch.is_object()) {
    auto it = batch.find("rules");
    if (it != batch.end() && it->is_array()) return *it;
  }
  return json::array();
}

// Validates a batch. `standalone` (replace): against an empty stage, since
// the batch must stand on its own. Otherwise the batch goes on top of what
// each stage already has (a configure of an existing object, say), so only
// its form is checked here; a stage refuses what does not fit its layout and
// the daemon logs the refusal.
Status validate_batch(const json& batch, bool standalone) {
  if (!batch.is_array() && !batch.is_object()) {
    return Status::invalid(
        "expected a rules batch (an array or {\"version\": 1, \"rules\": [...]})");
  }
  if (!standalone) return Stage::check_rules(batch);
  StageOptions o;
  o.name = "static-policy-validation";
  auto stage = Stage::create(o);
  if (!stage) return stage.status();
  return (*stage)->apply(batch);
}

class StaticPolicy final : public Policy {
 public:
  std::string_view name() const noexcept override { return "static"; }

  Status configure(const json& config) override {
    if (!config.is_object()) return Status::invalid("config: expected an object");
    json rules;  // null: none
    std::string rules_file;
    std::map<std::string, json> stages;
    bool replace = true;
    // Read first: it decides how the batches are validated.
    if (auto it = config.find("replace"); it != config.end()) {
      if (!it->is_boolean()) return Status::invalid("config.replace: expected true or false");
      replace = it->get<bool>();
    }
    for (auto& [k, v] : config.items()) {
      if (k == "rules") {
        SLUICE_RETURN_IF_ERROR(validate_batch(v, replace).with_prefix("config.rules: "));
        rules = v;
      } else if (k == "rules_file") {
        if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
          return Status::invalid("config.rules_file: expected a path");
        }
        rules_file = v.get<std::string>();
      } else if (k == "stages") {
        if (!v.is_object()) {
          return Status::invalid("config.stages: expected an object {\"<name or glob>\": <batch>}");
        }
        for (auto& [pattern, batch] : v.items()) {
          if (pattern.empty()) return Status::invalid("config.stages: empty stage name");
          SLUICE_RETURN_IF_ERROR(
              validate_batch(batch, replace).with_prefix("config.stages." + pattern + ": "));
          stages[pattern] = batch;
        }
      } else if (k == "replace") {
        // read above
      } else {
        return Status::invalid("config." + k +
                               ": unknown field (expected rules, rules_file, stages, replace)");
      }
    }
    if (!rules.is_null() && !rules_file.empty()) {
      return Status::invalid("config: give either rules or rules_file, not both");
    }
    if (!rules_file.empty()) {
      auto text = read_rules_file(rules_file);
      if (!text) return text.status().with_prefix("config.rules_file: ");
      auto parsed = parse_json_text(*text);
      if (!parsed) return parsed.status().with_prefix("config.rules_file: " + rules_file + ": ");
      rules = std::move(parsed).value();
      SLUICE_RETURN_IF_ERROR(
          validate_batch(rules, replace).with_prefix("config.rules_file: " + rules_file + ": "));
    }
    rules_ = std::move(rules);
    rules_file_ = std::move(rules_file);
    stages_ = std::move(stages);
    replace_ = replace;
    sent_.clear();  // a new configuration goes to every stage
    return Status::ok();
  }

  PolicyOutput step(const PolicyInput& input) override {
    PolicyOutput out;
    for (const auto& name : input.departed) forget(name);
    json sent = json::array();
    json errors = json::object();
    // Stages that get the same batch and hold the same channels get one
    // RulesBatch, built once (and serialised once by the daemon).
    std::map<std::pair<const json*, std::vector<std::string>>, RulesBatch> built;
    for (const auto& view : input.stages) {
      std::string key = view.name + '\0' + std::to_string(view.connected_at_ns);
      if (sent_.count(key)) continue;
      // A stage connected anew under a reused name: forget its past.
      forget(view.name);
      sent_.insert(key);
      const json* batch = select(view.name);
      if (!batch) continue;
      std::vector<std::string> removed;
      if (replace_) {
        for (const auto& ch : view.info.channels) removed.push_back(ch.name);
      }
      auto [it, added] = built.try_emplace({batch, std::move(removed)});
      if (added) {
        RulesBuilder rules;
        for (const auto& name : it->first.second) rules.remove_channel(name);
        for (const auto& r : batch_rules(*batch)) rules.add_json(r);
        auto b = rules.build();
        if (b.is_ok()) {
          it->second = std::move(b).value();
        } else {
          errors[view.name] = b.status().message();  // a channel name a stage cannot have
        }
      }
      if (it->second.value().is_null()) continue;
      out.rules[view.name] = it->second;
      sent.push_back(view.name);
    }
    out.report = json{{"sent_to", std::move(sent)}};
    if (!errors.empty()) out.report["errors"] = std::move(errors);
    return out;
  }

  // What the first step after the hello would send: the stage's batch, at
  // once (the step then knows the connection was served).
  RulesBatch admit(const PolicyInput& input) override {
    if (input.stages.size() != 1) return {};
    PolicyOutput out = step(input);
    auto it = out.rules.find(input.stages.front().name);
    return it == out.rules.end() ? RulesBatch{} : it->second;
  }

  json describe() const override {
    json d = json::object();
    if (!rules_file_.empty()) d["rules_file"] = rules_file_;
    if (!rules_.is_null()) d["rules"] = rules_;
    if (!stages_.empty()) d["stages"] = stages_;
    d["replace"] = replace_;
    return d;
  }

 private:
  const json* select(const std::string& stage) const {
    if (auto it = stages_.find(stage); it != stages_.end()) return &it->second;
    const json* best = nullptr;
    std::size_t best_len = 0;
    for (const auto& [pattern, batch] : stages_) {
      if (!is_glob(pattern)) continue;
      if (fnmatch(pattern.c_str(), stage.c_str(), 0) != 0) continue;
      if (!best || pattern.size() > best_len) {
        best = &batch;
        best_len = pattern.size();
      }
    }
    if (best) return best;
    return rules_.is_null() ? nullptr : &rules_;
  }

  void forget(const std::string& name) {
    auto it = sent_.lower_bound(name + '\0');
    while (it != sent_.end() && it->compare(0, name.size() + 1, name + '\0') == 0) {
      it = sent_.erase(it);
    }
  }

  json rules_;  // null: no default batch
  std::string rules_file_;
  std::map<std::string, json> stages_;
  bool replace_ = true;
  std::set<std::string> sent_;  // name '\0' connected_at_ns of stages served
};

}  // namespace

std::unique_ptr<Policy> make_static_policy() {
  return std::make_unique<StaticPolicy>();
}

}  // namespace sluice
