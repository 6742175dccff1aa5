// The `sluice` command's subcommands, as the parser (cli.cc) calls them: each
// returns the process's exit code. Inspecting (stages, stats, top) is in
// cli_inspect.cc, steering (rules, policy) in cli_steer.cc, starting
// processes (serve, run) in cli_run.cc, their tables in cli_format.h.
//
// Exit codes (scripts rely on them):
//   0  success
//   1  runtime error (the daemon refused a request, a file could not be read, ...)
//   2  usage error (bad arguments; `run` without the preload library)
//   3  the daemon is unreachable
//   4  pending: rules sent to a stopped stage apply when it resumes
#pragma once

// First: its pragma (GCC false positives) covers the headers that follow.
#include "cli_format.h"

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "client.h"
#include "daemon.h"
#include "sluice/status.h"
#include "sluice/wire.h"

namespace sluice::control::cli {

using nlohmann::json;

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnreachable = 3;
// The request reached its target but is not confirmed yet (Code::kPending):
// rules sent to a stopped stage apply when it resumes.
inline constexpr int kExitPending = 4;

// The options every subcommand takes: the daemon's socket, and how long a
// request may take.
struct Global {
  std::string socket;
  int timeout_ms = kRequestTimeoutMs;
};

// `sluice serve`'s options: the daemon's, and the log level.
struct ServeOptions {
  std::string log_level = "info";
  int interval_ms = 0;  // 0: the policy file's, else kDefaultIntervalMs
  DaemonOptions daemon;
  // The node role (cluster_node.h): a cluster file, or etcd and node given
  // here (they override the file's). None: no cluster.
  std::string cluster_file;
  std::string etcd;  // comma-separated endpoints
  std::string node;
};

// Prints `s` and returns its exit code (1, 3 or 4).
int fail(const Status& s);
// One request to the daemon at g.socket.
StatusOr<json> call(const Global& g, wire::Type type, json fields = json::object());

int cmd_serve(const Global& g, ServeOptions serve);
struct RunOptions {
  std::string name;   // SLUICE_STAGE
  std::string rules;  // SLUICE_RULES
  bool require_daemon = false;
  std::vector<std::string> cmd;
};
int cmd_run(const Global& g, const RunOptions& run);
int cmd_stages(const Global& g, bool as_json);
int cmd_stats(const Global& g, bool as_json, const std::string& stage);
int cmd_top(const Global& g, int refresh_ms, const std::string& sort, bool once, int iterations);
int cmd_rules_apply(const Global& g, const std::string& file, const std::string& stage);
int cmd_policy_show(const Global& g, bool as_json);
int cmd_policy_set(const Global& g, const std::string& file);
int cmd_policy_check(const std::string& file, bool as_json);

}  // namespace sluice::control::cli
