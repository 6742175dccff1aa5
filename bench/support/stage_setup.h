// Setting up an example program's stage from its command line: a rules file
// applied to it, or a control-plane client that delivered its first rules.
//
// Thread safety: as Stage::apply() and ControlClient::start(); each call
// blocks its caller only.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "sluice/control_client.h"
#include "sluice/stage.h"
#include "sluice/status.h"

namespace sluice::bench {

// Reads the rules file at `path` (read_rules_file: a regular file of bounded
// size) and applies it to `stage`. The error names the file.
Status apply_rules_file(Stage& stage, const std::string& path);

// Starts a control-plane client for `stage` at the daemon's `socket` and waits
// until it applied the daemon's first rules, so that the program's measured
// run starts under the policy. The error's message is a sentence to print as
// is: the client did not start ("control client: ..."), or no rules came
// within `timeout` ("no rules from the control plane at <socket> within N s").
StatusOr<std::unique_ptr<ControlClient>> start_control_client(
    Stage& stage, const std::string& socket,
    std::chrono::seconds timeout = std::chrono::seconds(10));

}  // namespace sluice::bench
