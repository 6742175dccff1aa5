// The `sluice` command line: its options and subcommands (CLI11), each run
// by a cmd_* function (cli_commands.h).
#include "cli.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_commands.h"
#include "cluster_controller.h"
#include "cluster_node.h"

namespace sluice::control {
namespace cli {

int fail(const Status& s) {
  if (s.code() == Code::kPending) {
    std::fprintf(stderr, "sluice: pending: %s\n", s.message().c_str());
    return kExitPending;
  }
  std::fprintf(stderr, "sluice: %s\n", s.message().c_str());
  return s.code() == Code::kUnavailable ? kExitUnreachable : kExitError;
}

StatusOr<json> call(const Global& g, wire::Type type, json fields) {
  auto c = Connection::open(g.socket, g.timeout_ms);
  if (!c) return c.status();
  auto r = (*c)->request(type, std::move(fields), g.timeout_ms);
  // Errors the daemon reports are runtime errors, not unreachability.
  if (!r && r.status().code() == Code::kUnavailable &&
      r.status().message().find("stage") != std::string::npos) {
    return Status::io_error(r.status().message());
  }
  return r;
}

}  // namespace cli

namespace {

using namespace cli;  // NOLINT(google-build-using-namespace): the subcommands

// An option in milliseconds, in lo..hi, stored in `target` as it is parsed.
CLI::Option* add_ms_option(CLI::App* app, const std::string& name,
                           std::chrono::milliseconds& target, const std::string& description,
                           int lo, int hi) {
  return app
      ->add_option_function<int>(
          name, [&target](const int& ms) { target = std::chrono::milliseconds(ms); }, description)
      ->default_str(std::to_string(target.count()))
      ->check(CLI::Range(lo, hi));
}

}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{"sluice: the Sluice control plane (daemon and tools)", "sluice"};
  app.footer(
      "Exit codes: 0 ok, 1 runtime error, 2 usage error, 3 daemon unreachable, 4 pending (the\n"
      "stage has not confirmed the rules yet: it applies them when it resumes).\n"
      "Socket: --socket, else $SLUICE_SOCKET, else $XDG_RUNTIME_DIR/sluice.sock, else "
      "/tmp/sluice-$UID.sock.");
  app.require_subcommand(1);
  // Subcommands (created below, which inherit this) pass the options they do
  // not know to their parent, so that `sluice stages --socket S` works as
  // `sluice --socket S stages` does.
  app.fallthrough();
  Global g;
  g.socket = default_socket_path();
  app.add_option("--socket", g.socket, "The daemon's UNIX socket")->capture_default_str();
  app.add_option("--timeout", g.timeout_ms, "Request timeout in milliseconds")
      ->capture_default_str()
      ->check(CLI::Range(1, kMaxTimeoutMs));

  int rc = kExitOk;

  // serve
  auto* serve = app.add_subcommand("serve", "Run the control-plane daemon");
  ServeOptions so;
  DaemonOptions& dopt = so.daemon;
  serve->add_option("--socket", g.socket, "The UNIX socket to serve on")->capture_default_str();
  serve
      ->add_option("--policy", dopt.policy_file,
                   "Policy file: {\"policy\": NAME, \"interval_ms\": N, \"config\": {...}}; "
                   "reloaded on SIGHUP")
      ->check(CLI::ExistingFile);
  serve
      ->add_option("--interval", so.interval_ms,
                   "Control loop interval in ms (default: the policy file's, else " +
                       std::to_string(kDefaultIntervalMs) + ")")
      ->check(CLI::Range(1, kMaxIntervalMs));
  serve->add_option("--log-level", so.log_level, "trace, debug, info, warn, error, critical, off")
      ->capture_default_str();
  serve->add_option("--allow-uid", dopt.allow_uids,
                    "Also admit peers of this uid: they may read, run stages and apply rules to "
                    "their own stages (repeatable)");
  serve->add_option("--socket-group", dopt.socket_group, "Make the socket 0660 owned by GROUP");
  serve->add_option("--max-frame", dopt.max_frame, "Frame size limit in bytes")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1024}, std::size_t{1} << 30));
  serve
      ->add_option("--max-missed", dopt.max_missed,
                   "Drop a stage after this many unanswered collects in a row")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  serve->add_option("--report-log", dopt.report_log,
                    "Append the policy's report after every step to FILE, one JSON line each");
  serve->add_option("--admin-uid", dopt.admin_uids,
                    "Also make this uid an administrator: it may set the policy and apply rules "
                    "to any stage (repeatable; root and the daemon's uid always are)");
  serve
      ->add_option("--max-connections", dopt.max_connections,
                   "Connections at most (lowered to fit the descriptor limit); when full, the "
                   "oldest silent or idle client connection makes room")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
  add_ms_option(serve, "--handshake-timeout", dopt.handshake_timeout,
                "Close a connection whose first request is not complete this many ms after it "
                "connected",
                1, kMaxTimeoutMs);
  add_ms_option(serve, "--frame-timeout", dopt.frame_timeout,
                "Close a connection whose frame is still unfinished this many ms after it began", 1,
                kMaxTimeoutMs);
  add_ms_option(serve, "--idle-timeout", dopt.idle_timeout,
                "Close a client connection (not a stage's) after this many ms without a "
                "request; 0: never",
                0, kMaxIdleTimeoutMs);
  serve
      ->add_option("--max-buffered", dopt.max_buffered,
                   "Bytes all connections together may hold in unfinished frames")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1} << 16, std::size_t{1} << 34));
  serve->add_option("--cluster", so.cluster_file,
                    "Take part in a cluster as a node: its file (docs/cluster.md)");
  serve->add_option("--etcd", so.etcd, "The cluster's etcd endpoints, comma-separated");
  serve->add_option("--node", so.node, "This node's name in the cluster");
  serve->callback([&] { rc = cmd_serve(g, std::move(so)); });

  // cluster
  auto* clu = app.add_subcommand("cluster", "Run a replica of the cluster controller");
  cluster::ControllerOptions copt;
  std::string clu_etcd, clu_policy, clu_log = "info";
  clu->add_option("--etcd", clu_etcd, "etcd endpoints, comma-separated")->required();
  clu->add_option("--cluster", copt.cluster, "The cluster's name")->capture_default_str();
  clu->add_option("--policy", clu_policy, "The cluster policy file (docs/cluster.md)")
      ->required()
      ->check(CLI::ExistingFile);
  clu->add_option("--id", copt.id, "This replica's name (default: host name and pid)");
  clu->add_option("--report-log", copt.report_log,
                  "Append a JSON line per step while leading (the policy's report)");
  clu->add_option("--log-level", clu_log, "trace, debug, info, warn, error, critical, off")
      ->capture_default_str();
  clu->callback([&] {
    copt.etcd = cluster::split_endpoints(clu_etcd);
    rc = cluster::run_cluster_command(std::move(copt), clu_policy, clu_log);
  });

  // stages
  auto* stages = app.add_subcommand("stages", "List connected stages");
  bool stages_json = false;
  stages->add_flag("--json", stages_json, "Print JSON");
  stages->callback([&] { rc = cmd_stages(g, stages_json); });

  // stats
  auto* stats = app.add_subcommand("stats", "Per stage/channel/object rates and wait times");
  bool stats_json = false;
  std::string stats_stage;
  stats->add_flag("--json", stats_json, "Print the collected statistics as JSON");
  stats->add_option("--stage", stats_stage, "Only this stage");
  stats->callback([&] { rc = cmd_stats(g, stats_json, stats_stage); });

  // top
  auto* top = app.add_subcommand("top", "Live view of stages and channels (Ctrl-C quits)");
  int refresh = 1000, iterations = 0;
  std::string sort = "bytes";
  bool once = false;
  top->add_option("--refresh", refresh, "Refresh period in ms")
      ->capture_default_str()
      ->check(CLI::Range(50, kMaxIntervalMs));
  top->add_option("--sort", sort, "Sort key: name, ops, bytes, wait")->capture_default_str();
  top->add_flag("--once", once, "Print one frame (no screen control) and exit");
  top->add_option("--iterations", iterations, "Stop after N frames (0: until interrupted)");
  top->callback([&] { rc = cmd_top(g, refresh, sort, once, iterations); });

  // rules apply
  auto* rules = app.add_subcommand("rules", "Send rules to a stage");
  rules->require_subcommand(1);
  auto* apply = rules->add_subcommand("apply", "Apply a rules file (docs/rules.md) to one stage");
  std::string rules_file, rules_stage;
  apply->add_option("FILE", rules_file, "Rules batch (JSON)")->required()->check(CLI::ExistingFile);
  apply->add_option("--stage", rules_stage, "Target stage name")->required();
  apply->callback([&] { rc = cmd_rules_apply(g, rules_file, rules_stage); });

  // policy show|set|check
  auto* pol = app.add_subcommand("policy", "Show, replace or check a policy");
  pol->require_subcommand(1);
  auto* show = pol->add_subcommand("show", "Show the policy in force, its last report, metrics");
  bool show_json = false;
  show->add_flag("--json", show_json, "Print JSON");
  show->callback([&] { rc = cmd_policy_show(g, show_json); });
  auto* set = pol->add_subcommand("set", "Replace the policy (rules_file is inlined by the CLI)");
  std::string set_file;
  set->add_option("FILE", set_file, "Policy file")->required()->check(CLI::ExistingFile);
  set->callback([&] { rc = cmd_policy_set(g, set_file); });
  auto* check = pol->add_subcommand(
      "check", "Validate a policy file offline and print what the policy derives from it");
  std::string check_file;
  bool check_json = false;
  check->add_option("FILE", check_file, "Policy file")->required()->check(CLI::ExistingFile);
  check->add_flag("--json", check_json, "Print JSON");
  check->callback([&] { rc = cmd_policy_check(check_file, check_json); });

  // run
  auto* run = app.add_subcommand("run", "Run a command with the preload stage: run [opts] -- CMD");
  RunOptions run_opt;
  run->add_option("--name", run_opt.name, "Stage name (SLUICE_STAGE)");
  run->add_option("--rules", run_opt.rules, "Local rules file (SLUICE_RULES)");
  run->add_flag("--require-daemon", run_opt.require_daemon,
                "Refuse to start the command when no daemon answers at the socket");
  run->add_option("CMD", run_opt.cmd, "The command and its arguments (after --)")->required();
  run->callback([&] { rc = cmd_run(g, run_opt); });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }
  return rc;
}

}  // namespace sluice::control
