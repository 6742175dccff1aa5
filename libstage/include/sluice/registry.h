// The registry of enforcement-object types: the names rules create objects
// by ({"rule": "create_object", "type": "drl", ...}), each with a factory.
//
// Registry::global(), which a stage uses unless StageOptions::registry names
// another, starts empty. The built-in types (noop, drl, ...) live in their
// own library, sluice::objects: its sluice::objects::register_builtin()
// (sluice/objects/builtin.h) adds them, once, and every Sluice program calls
// it before it makes a stage. A user's own type is added the same way:
//   sluice::Registry::global().add({"my-type", "what it does",
//       [](const sluice::ObjectEnv& env) { return std::make_unique<My>(env); }});
//
// Thread safety: every member is safe from any thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sluice/enforcement_object.h"
#include "sluice/status.h"
#include "sluice/thread_annotations.h"

namespace sluice {

struct ObjectType {
  std::string name;
  std::string summary;  // one line, for `sluice` help and stage info
  std::function<std::unique_ptr<EnforcementObject>(const ObjectEnv&)> make;
};

// Object types by name.
class Registry {
 public:
  Registry() = default;
  // The process's registry (never destroyed: objects may outlive static
  // destruction).
  static Registry& global();

  // Fails with kAlreadyExists for a taken name, kInvalidArgument for an
  // empty name or factory.
  Status add(ObjectType type) SLUICE_EXCLUDES(mu_);
  // A configured object of type `name`: make + configure(config). An unknown
  // name is kNotFound, with unknown_type()'s message.
  StatusOr<std::unique_ptr<EnforcementObject>> create(std::string_view name,
                                                      const nlohmann::json& config,
                                                      const ObjectEnv& env) const
      SLUICE_EXCLUDES(mu_);
  bool contains(std::string_view name) const SLUICE_EXCLUDES(mu_);
  std::vector<std::string> names() const SLUICE_EXCLUDES(mu_);
  // What to tell a user who named a type this registry does not hold: the
  // types it does, or, when it holds none, where the built-in ones come from.
  std::string unknown_type(std::string_view name) const SLUICE_EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  std::map<std::string, ObjectType, std::less<>> types_ SLUICE_GUARDED_BY(mu_);
};

}  // namespace sluice
