// static: sends fixed rules batches, from the policy document or a rules
// file, to every stage when it (re)connects (Policy::admit) and to all stages
// when reconfigured. Per-stage batches by name or glob; with "replace" (the
// default) each batch replaces the stage's channels and is validated against
// an empty stage. docs/policies.md, "static", has the configuration.
//
// Thread safety: as Policy (one thread at a time).
#pragma once

#include <memory>

#include "sluice/policy.h"

namespace sluice {

std::unique_ptr<Policy> make_static_policy();

}  // namespace sluice
