// The rules batch both control-plane benches send: one default channel with a
// DRL object at `rate`. sluice-bench-control has the daemon send it to every
// stage; sluice-bench-rules-message runs the same frames through one stage.
#pragma once

#include <nlohmann/json.hpp>

namespace sluice::bench {

inline nlohmann::json drl_layout_batch(double rate) {
  return nlohmann::json{{"version", 1},
                        {"rules",
                         {{{"rule", "create_channel"}, {"channel", "all"}, {"default", true}},
                          {{"rule", "create_object"},
                           {"channel", "all"},
                           {"object", "limit"},
                           {"type", "drl"},
                           {"config", {{"rate", rate}}}}}}};
}

// What the static policy sends a stage that holds that layout when it is
// set again with a new rate (replace, its default): the channel removed, then
// the batch above. The "layout" change of both benches, and the floor's.
inline nlohmann::json drl_replacing_batch(double rate) {
  nlohmann::json b = drl_layout_batch(rate);
  b["rules"].insert(b["rules"].begin(),
                    nlohmann::json{{"rule", "remove_channel"}, {"channel", "all"}});
  return b;
}

}  // namespace sluice::bench
