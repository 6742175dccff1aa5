#include "sluice/objects/noop.h"

#include <nlohmann/json.hpp>

namespace sluice {

Status Noop::validate(const nlohmann::json& config) const {
  if (!config.is_object()) return Status::invalid("config: must be an object");
  if (!config.empty()) {
    return Status::invalid("unknown field '" + config.begin().key() +
                           "' (noop takes no configuration)");
  }
  return {};
}

std::unique_ptr<EnforcementObject> make_noop(const ObjectEnv&) {
  return std::make_unique<Noop>();
}

}  // namespace sluice
