// noop: the pass-through object. It changes nothing and waits for nothing;
// the stage still counts every request routed to it (ops, bytes, origins).
// Useful to measure a stage's own cost and to watch a flow without shaping it.
//
// Thread safety: stateless; every member is safe from any thread.
#pragma once

#include <memory>

#include "sluice/enforcement_object.h"

namespace sluice {

class Noop final : public EnforcementObject {
 public:
  std::string_view type() const noexcept override { return "noop"; }
  Status validate(const nlohmann::json& config) const override;
  Status configure(const nlohmann::json& config) override { return validate(config); }
  Verdict enforce_context(const Context&) noexcept override { return {}; }
  bool passes_through() const noexcept override { return true; }
};

std::unique_ptr<EnforcementObject> make_noop(const ObjectEnv& env);

}  // namespace sluice
