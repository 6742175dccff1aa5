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

}  // namespace sluice::bench
