// The registry of control policies, by name.
#include <map>
#include <utility>

#include "compaction_deferral.h"
#include "delta-fair/delta_fair.h"
#include "flex/flex.h"
#include "maxmin.h"
#include "pisces/pisces.h"
#include "silk.h"
#include "sluice/policy.h"
#include "sluice/thread_annotations.h"
#include "static_policy.h"

namespace sluice {
namespace {

// The policies shipped with Sluice. Add a line per policy.
std::vector<std::pair<std::string, PolicyFactory>> builtin_policies() {
  // One per line (clang-format would pack five into columns).
  // clang-format off
  return {
      {"static", make_static_policy},
      {"silk", make_silk_policy},
      {"maxmin", make_maxmin_policy},
      {"pisces", make_pisces_policy},
      {"delta-fair", make_delta_fair_policy},
      {"compaction-deferral", make_compaction_deferral_policy},
      {"flex", make_flex_policy},
  };
  // clang-format on
}

struct PolicyRegistry {
  Mutex mu;
  std::map<std::string, PolicyFactory, std::less<>> factories SLUICE_GUARDED_BY(mu);
};

PolicyRegistry& registry() {
  static PolicyRegistry* r = [] {
    auto* reg = new PolicyRegistry;
    MutexLock lock(reg->mu);  // not shared yet; for the analysis, which cannot know that
    for (auto& [name, factory] : builtin_policies()) reg->factories.emplace(name, factory);
    return reg;
  }();
  return *r;
}

}  // namespace

RulesBatch Policy::admit(const PolicyInput& /*input*/) {
  return {};
}

Status register_policy(std::string name, PolicyFactory factory) {
  if (name.empty()) return Status::invalid("policy name must not be empty");
  if (!factory) return Status::invalid("policy '" + name + "': null factory");
  auto& r = registry();
  MutexLock lock(r.mu);
  if (r.factories.count(name)) return Status::exists("policy '" + name + "' already registered");
  r.factories.emplace(std::move(name), std::move(factory));
  return Status::ok();
}

StatusOr<std::unique_ptr<Policy>> make_policy(std::string_view name, const nlohmann::json& config) {
  PolicyFactory factory;
  {
    auto& r = registry();
    MutexLock lock(r.mu);
    auto it = r.factories.find(name);
    if (it == r.factories.end()) {
      std::string known;
      for (auto& [n, f] : r.factories) known += (known.empty() ? "" : ", ") + n;
      // Invalid input, as an unknown object type in a rule is: `sluice serve`
      // exits with its usage code for it, as for any other policy file error.
      return Status::invalid("unknown policy '" + std::string(name) + "' (known: " + known + ")");
    }
    factory = it->second;
  }
  std::unique_ptr<Policy> p = factory();
  if (!p) return Status::internal("policy '" + std::string(name) + "': factory returned null");
  Status s = p->configure(config.is_null() ? nlohmann::json::object() : config);
  if (!s.is_ok()) return s.with_prefix("policy '" + std::string(name) + "': ");
  return p;
}

std::vector<std::string> policy_names() {
  auto& r = registry();
  MutexLock lock(r.mu);
  std::vector<std::string> names;
  for (auto& [n, f] : r.factories) names.push_back(n);
  return names;
}

}  // namespace sluice
