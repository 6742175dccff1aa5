// The `sluice` command line (serve, stages, stats, top, rules, policy, run).
#pragma once

namespace sluice::control {

// Parses argv and runs the subcommand. Returns the process exit code:
// 0 ok, 1 runtime error, 2 usage error, 3 daemon unreachable.
int run_cli(int argc, char** argv);

}  // namespace sluice::control
