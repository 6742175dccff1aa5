// A test-only enforcement object that records which object took a request,
// registered through the public Registry exactly as a user's type would be.
#pragma once

#include <atomic>
#include <string>

#include <nlohmann/json.hpp>

#include "sluice/enforcement_object.h"
#include "sluice/objects/builtin.h"

namespace sluice::test {

// The id of the probe that enforced the calling thread's last request (0: none).
inline thread_local int last_probe = 0;

class Probe final : public EnforcementObject {
 public:
  std::string_view type() const noexcept override { return "probe"; }
  Status validate(const nlohmann::json& config) const override {
    auto it = config.find("id");
    if (it != config.end() && !it->is_number_integer())
      return Status::invalid("id: must be an integer");
    return {};
  }
  Status configure(const nlohmann::json& config) override {
    SLUICE_RETURN_IF_ERROR(validate(config));
    if (auto it = config.find("id"); it != config.end()) id_.store(it->get<int>());
    return {};
  }
  Verdict enforce_context(const Context&) noexcept override {
    last_probe = id_.load(std::memory_order_relaxed);
    return {};
  }
  nlohmann::json collect() const override { return {{"id", id_.load()}}; }

 private:
  std::atomic<int> id_{0};
};

inline Registry& probe_registry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    (void)objects::register_builtin(*reg);
    (void)reg->add({"probe", "records which object enforced",
                    [](const ObjectEnv&) { return std::make_unique<Probe>(); }});
    return reg;
  }();
  return *r;
}

}  // namespace sluice::test
