#include <nlohmann/json.hpp>

#include "sluice/registry.h"

namespace sluice {

nlohmann::json EnforcementObject::collect() const {
  return nlohmann::json::object();
}

Status EnforcementObject::set_tunables(std::uint64_t /*mask*/,
                                       std::span<const double, kMaxTunables> /*values*/) noexcept {
  return Status::precondition("object type '" + std::string(type()) + "' has no tunables");
}

Verdict EnforcementObject::settle(const Context& ctx, std::uint64_t actual) noexcept {
  if (actual <= ctx.size) return {};
  Context excess = ctx;
  excess.size = actual - ctx.size;
  if ((ctx.flags & context_flag::kNoWait) == 0) return enforce_context(excess);
  const Verdict v = try_enforce_context(excess);
  return v.outcome == Outcome::kWouldWait ? Verdict{} : v;
}

Verdict EnforcementObject::acquire(const Context& ctx, std::uint64_t amount) noexcept {
  Context c = ctx;
  c.size = amount;
  return (ctx.flags & context_flag::kNoWait) != 0 ? try_enforce_context(c) : enforce_context(c);
}

Registry& Registry::global() {
  static auto* registry = new Registry();  // never destroyed: see registry.h
  return *registry;
}

Status Registry::add(ObjectType type) {
  if (type.name.empty()) return Status::invalid("object type name must not be empty");
  if (!type.make) return Status::invalid("object type '" + type.name + "' has no factory");
  MutexLock lock(mu_);
  if (types_.count(type.name) != 0) {
    return Status::exists("object type '" + type.name + "' is already registered");
  }
  std::string name = type.name;
  types_.emplace(std::move(name), std::move(type));
  return {};
}

StatusOr<std::unique_ptr<EnforcementObject>> Registry::create(std::string_view name,
                                                              const nlohmann::json& config,
                                                              const ObjectEnv& env) const {
  std::function<std::unique_ptr<EnforcementObject>(const ObjectEnv&)> make;
  {
    MutexLock lock(mu_);
    auto it = types_.find(name);
    if (it != types_.end()) make = it->second.make;
  }
  if (!make) return Status::not_found(unknown_type(name));
  std::unique_ptr<EnforcementObject> object = make(env);
  if (!object) return Status::internal("factory of '" + std::string(name) + "' returned null");
  static const nlohmann::json kNoConfig = nlohmann::json::object();
  Status s = object->configure(config.is_null() ? kNoConfig : config);
  if (!s.is_ok()) return s;
  return object;
}

bool Registry::contains(std::string_view name) const {
  MutexLock lock(mu_);
  return types_.find(name) != types_.end();
}

std::vector<std::string> Registry::names() const {
  MutexLock lock(mu_);
  std::vector<std::string> out;
  for (const auto& [n, t] : types_) out.push_back(n);
  return out;
}

std::string Registry::unknown_type(std::string_view name) const {
  std::string known;
  for (const std::string& n : names()) known += (known.empty() ? "" : ", ") + n;
  if (known.empty()) {
    return "unknown object type '" + std::string(name) +
           "': no object types are registered (the built-in ones are added by "
           "sluice::objects::register_builtin(), sluice/objects/builtin.h)";
  }
  return "unknown object type '" + std::string(name) + "' (registered: " + known + ")";
}

}  // namespace sluice
