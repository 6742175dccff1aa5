// `static`: sends fixed rules batches, from the policy file or a rules file,
// to every stage when it (re)connects (Policy::admit: right after its hello)
// and to all stages when reconfigured (at the next step).
//
// Config (the "config" object of the policy file):
//   {"rules": <batch>}            the batch every stage gets, or
//   {"rules_file": "PATH"}        the same, read from a rules file
//   {"stages": {"<name or glob>": <batch>, ...}}
//                                 per-stage batches; an exact name wins over a
//                                 glob, a longer glob over a shorter one; a
//                                 stage that matches none gets "rules", if any
//   {"replace": true}             (default) prefix each batch with
//                                 remove_channel for every channel the stage
//                                 already has, so the stage ends up with
//                                 exactly the batch (a stage that reconnects
//                                 after a daemon restart still has its old
//                                 rules: fail-static)
// With "replace" (the default), each batch is validated against an empty stage
// at configure time: it must stand on its own. With "replace": false a batch
// goes on top of what each stage has (e.g. configure rules for objects the
// stages already hold), so only its form is checked at configure time and a
// stage refuses what does not fit its layout (the daemon logs the refusal).
#pragma once

#include <memory>

#include "sluice/policy.h"

namespace sluice {

std::unique_ptr<Policy> make_static_policy();

}  // namespace sluice
