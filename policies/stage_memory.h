// Per-stage memory kept by a policy across steps (internal to
// sluice::policies). A stage that departed is forgotten at once. A stage
// merely absent from a step (it missed a collect) still enforces the rules it
// was sent, so its memory is kept until it has been absent for more than
// `forget_after` consecutive steps.
#pragma once

#include <map>
#include <set>
#include <string>

#include "sluice/policy.h"

namespace sluice::policy_memory {

// Ages `stages` (a map from stage name to a state with an `int absent_steps`)
// by one step of `input`. `on_held(name, state)` is called for every stage
// kept although absent from this step.
template <typename State, typename OnHeld>
void age(std::map<std::string, State>& stages, const PolicyInput& input, int forget_after,
         OnHeld&& on_held) {
  for (const auto& name : input.departed) stages.erase(name);
  std::set<std::string> present;
  for (const auto& st : input.stages) present.insert(st.name);
  for (auto it = stages.begin(); it != stages.end();) {
    if (present.count(it->first)) {
      it->second.absent_steps = 0;
      ++it;
    } else if (++it->second.absent_steps > forget_after) {
      it = stages.erase(it);
    } else {
      on_held(it->first, it->second);
      ++it;
    }
  }
}

}  // namespace sluice::policy_memory
