// The `sluice` command: the daemon and the tools that inspect and steer it.
//
// Exit codes (scripts rely on them):
//   0  success
//   1  runtime error (the daemon refused a request, a file could not be read, ...)
//   2  usage error (bad arguments; `run` without the preload library)
//   3  the daemon is unreachable
// GCC 12 reports false positives inside libstdc++'s and nlohmann's headers
// after inlining; they are not in our code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wnull-dereference"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "cli.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <map>
#include <thread>
#include <tuple>

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "client.h"
#include "daemon.h"
#include "policy_doc.h"
#include "sluice/stats.h"

#ifndef SLUICE_INSTALL_LIBDIR
#define SLUICE_INSTALL_LIBDIR "/usr/local/lib"
#endif

namespace sluice::control {
namespace {

using nlohmann::json;

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitUnreachable = 3;
// The request reached its target but is not confirmed yet (Code::kPending):
// rules sent to a stopped stage apply when it resumes.
constexpr int kExitPending = 4;

struct Global {
  std::string socket;
  int timeout_ms = kRequestTimeoutMs;
};

// `sluice serve`'s options: the daemon's, and the log level.
struct ServeOptions {
  std::string log_level = "info";
  int interval_ms = 0;  // 0: the policy file's, else kDefaultIntervalMs
  DaemonOptions daemon;
};

int fail(const Status& s) {
  if (s.code() == Code::kPending) {
    std::fprintf(stderr, "sluice: pending: %s\n", s.message().c_str());
    return kExitPending;
  }
  std::fprintf(stderr, "sluice: %s\n", s.message().c_str());
  return s.code() == Code::kUnavailable ? kExitUnreachable : kExitError;
}

StatusOr<json> call(const Global& g, wire::Type type, json fields = json::object()) {
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

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

std::string human_ns(std::uint64_t ns) {
  char buf[32];
  if (ns == 0) return "0";
  if (ns < 1000)
    std::snprintf(buf, sizeof(buf), "%lluns", static_cast<unsigned long long>(ns));
  else if (ns < 1000000)
    std::snprintf(buf, sizeof(buf), "%.1fus", static_cast<double>(ns) / 1e3);
  else if (ns < 1000000000)
    std::snprintf(buf, sizeof(buf), "%.1fms", static_cast<double>(ns) / 1e6);
  else
    std::snprintf(buf, sizeof(buf), "%.2fs", static_cast<double>(ns) / 1e9);
  return buf;
}

std::string human_duration(double s) {
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof(buf), "%.0fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof(buf), "%.0fm%02.0fs", s / 60 - 0.5, std::fmod(s, 60));
  else
    std::snprintf(buf, sizeof(buf), "%.1fh", s / 3600);
  return buf;
}

// One row of `stats` / `top`: a stage, a channel or an object.
struct Row {
  std::string stage, channel, object;
  double ops_s = 0, bytes_s = 0;
  std::uint64_t ops = 0, bytes = 0, p50 = 0, p99 = 0;
};

std::vector<Row> stats_rows(const json& reply, bool objects) {
  std::vector<Row> rows;
  for (const auto& e : reply.value("stages", json::array())) {
    std::string name = e.value("name", std::string());
    const json& js = e.contains("stats") ? e["stats"] : json();
    if (js.is_null()) {
      rows.push_back({name, "-", "", 0, 0, 0, 0, 0, 0});
      continue;
    }
    auto st = stage_stats_from_json(js);
    if (!st) continue;
    double secs = st->interval_ns > 0 ? static_cast<double>(st->interval_ns) / 1e9 : 1.0;
    auto rate = [&](std::uint64_t v) { return static_cast<double>(v) / secs; };
    rows.push_back({name, "*", "", rate(st->total.ops), rate(st->total.bytes), st->total.ops,
                    st->total.bytes, 0, 0});
    for (const auto& ch : st->channels) {
      rows.push_back({name, ch.name, "", rate(ch.total.ops), rate(ch.total.bytes), ch.total.ops,
                      ch.total.bytes, ch.wait.quantile_ns(0.5), ch.wait.quantile_ns(0.99)});
      if (!objects) continue;
      for (const auto& o : ch.objects) {
        rows.push_back({name, ch.name, o.name, rate(o.total.ops), rate(o.total.bytes), o.total.ops,
                        o.total.bytes, o.wait.quantile_ns(0.5), o.wait.quantile_ns(0.99)});
      }
    }
  }
  return rows;
}

void print_rows(const std::vector<Row>& rows, std::FILE* out) {
  std::fprintf(out, "%-24s %-16s %-16s %12s %12s %10s %10s\n", "STAGE", "CHANNEL", "OBJECT",
               "OPS/S", "BYTES/S", "WAIT-P50", "WAIT-P99");
  for (const auto& r : rows) {
    std::fprintf(out, "%-24.24s %-16.16s %-16.16s %12.1f %12s %10s %10s\n", r.stage.c_str(),
                 r.channel.c_str(), r.object.c_str(), r.ops_s, human_bytes(r.bytes_s).c_str(),
                 human_ns(r.p50).c_str(), human_ns(r.p99).c_str());
  }
}

// ---------------------------------------------------------------------------

int cmd_serve(const Global& g, ServeOptions serve) {
  auto lvl = spdlog::level::from_str(serve.log_level);
  if (lvl == spdlog::level::off && serve.log_level != "off") {
    std::fprintf(stderr, "sluice serve: unknown log level '%s'\n", serve.log_level.c_str());
    return kExitUsage;
  }
  spdlog::set_level(lvl);
  std::signal(SIGPIPE, SIG_IGN);
  DaemonOptions& o = serve.daemon;
  o.socket_path = g.socket;
  if (serve.interval_ms > 0) o.interval_ms = serve.interval_ms;
  o.handle_signals = true;
  auto d = Daemon::create(std::move(o));
  if (!d) {
    std::fprintf(stderr, "sluice serve: %s\n", d.status().message().c_str());
    return d.status().code() == Code::kInvalidArgument ? kExitUsage : kExitError;
  }
  Status s = (*d)->run();
  if (!s.is_ok()) {
    std::fprintf(stderr, "sluice serve: %s\n", s.message().c_str());
    return kExitError;
  }
  return kExitOk;
}

int cmd_stages(const Global& g, bool as_json) {
  auto r = call(g, wire::Type::kListStages);
  if (!r) return fail(r.status());
  const json& stages = (*r)["stages"];
  if (as_json) {
    std::printf("%s\n", stages.dump(2).c_str());
    return kExitOk;
  }
  std::printf("%-24s %8s %6s %9s %6s %4s %5s  %s\n", "NAME", "PID", "UID", "UPTIME", "RULES",
              "CHAN", "BOARD", "LABELS");
  for (const auto& s : stages) {
    std::string labels;
    // Named: a range-for over items() of value()'s temporary would iterate a
    // destroyed object (C++20 extends only the proxy's life), which crashed
    // `sluice stages` as soon as a stage was connected.
    const json label_map = s.value("labels", json::object());
    for (auto& [k, v] : label_map.items()) {
      // Labels are strings by protocol, but a listing must not abort on a peer that bends it.
      labels +=
          (labels.empty() ? "" : ",") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
    }
    // A daemon from before boards does not say: "-".
    const auto board = s.find("board");
    const char* has_board = board == s.end() || !board->is_boolean() ? "-"
                            : board->get<bool>()                     ? "yes"
                                                                     : "no";
    std::printf("%-24.24s %8lld %6llu %9s %6llu %4llu %5s  %s\n",
                s.value("name", std::string()).c_str(),
                static_cast<long long>(s.value("pid", std::int64_t{0})),
                static_cast<unsigned long long>(s.value("uid", std::uint64_t{0})),
                human_duration(s.value("uptime_s", 0.0)).c_str(),
                static_cast<unsigned long long>(s.value("rules_version", std::uint64_t{0})),
                static_cast<unsigned long long>(s.value("channels", std::uint64_t{0})), has_board,
                labels.c_str());
  }
  return kExitOk;
}

int cmd_stats(const Global& g, bool as_json, const std::string& stage) {
  json fields = json::object();
  if (!stage.empty()) fields["stage"] = stage;
  auto r = call(g, wire::Type::kGetStats, fields);
  if (!r) return fail(r.status());
  if (as_json) {
    std::printf("%s\n", (*r)["stages"].dump(2).c_str());
    return kExitOk;
  }
  print_rows(stats_rows(*r, true), stdout);
  return kExitOk;
}

int cmd_top(const Global& g, int refresh_ms, const std::string& sort, bool once, int iterations) {
  static const std::vector<std::string> keys = {"name", "ops", "bytes", "wait"};
  if (std::find(keys.begin(), keys.end(), sort) == keys.end()) {
    std::fprintf(stderr, "sluice top: --sort must be one of name, ops, bytes, wait\n");
    return kExitUsage;
  }
  auto conn = Connection::open(g.socket, g.timeout_ms);
  if (!conn) return fail(conn.status());
  for (int i = 0; once ? i < 1 : (iterations <= 0 || i < iterations); ++i) {
    auto r = (*conn)->request(wire::Type::kGetStats, json::object(), g.timeout_ms);
    if (!r && (*conn)->peer_closed()) {
      // The daemon closes connections idle longer than its idle timeout
      // (a long --refresh): connect again.
      conn = Connection::open(g.socket, g.timeout_ms);
      if (!conn) return fail(conn.status());
      r = (*conn)->request(wire::Type::kGetStats, json::object(), g.timeout_ms);
    }
    if (!r) return fail(r.status());
    auto rows = stats_rows(*r, false);
    std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
      if (sort == "name") return std::tie(a.stage, a.channel) < std::tie(b.stage, b.channel);
      if (sort == "ops") return a.ops_s > b.ops_s;
      if (sort == "bytes") return a.bytes_s > b.bytes_s;
      return a.p99 > b.p99;
    });
    std::string frame;
    if (!once) frame += "\x1b[H\x1b[2J";
    char head[256];
    auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char when[64];
    std::strftime(when, sizeof(when), "%H:%M:%S", std::localtime(&now));
    std::snprintf(
        head, sizeof(head),
        "\x1b[1msluice top\x1b[0m  %s  socket %s  stages %zu  interval %d ms  sort %s\n\n", when,
        g.socket.c_str(), r->value("stages", json::array()).size(), r->value("interval_ms", 0),
        sort.c_str());
    frame += head;
    std::fputs(frame.c_str(), stdout);
    std::fputs("\x1b[7m", stdout);
    print_rows({}, stdout);
    std::fputs("\x1b[0m", stdout);
    for (const auto& row : rows) {
      std::printf("%-24.24s %-16.16s %-16.16s %12.1f %12s %10s %10s\n", row.stage.c_str(),
                  row.channel.c_str(), row.object.c_str(), row.ops_s,
                  human_bytes(row.bytes_s).c_str(), human_ns(row.p50).c_str(),
                  human_ns(row.p99).c_str());
    }
    std::fflush(stdout);
    if (once || (iterations > 0 && i + 1 >= iterations)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(refresh_ms));
  }
  return kExitOk;
}

int cmd_rules_apply(const Global& g, const std::string& file, const std::string& stage) {
  auto rules = read_json_file(file);
  if (!rules) return fail(rules.status());
  auto r = call(g, wire::Type::kApplyRules, json{{"stage", stage}, {"rules", *rules}});
  if (!r) return fail(r.status());
  std::printf("applied to stage '%s' (rules_version %llu)\n", stage.c_str(),
              static_cast<unsigned long long>(r->value("rules_version", std::uint64_t{0})));
  return kExitOk;
}

int cmd_policy_show(const Global& g, bool as_json) {
  auto r = call(g, wire::Type::kPolicyShow);
  if (!r) return fail(r.status());
  json out = *r;
  for (const char* k : {"v", "type", "id"}) out.erase(k);
  if (as_json) {
    std::printf("%s\n", out.dump(2).c_str());
    return kExitOk;
  }
  std::printf("policy:   %s\nsource:   %s\ninterval: %d ms\nconfig:   %s\nreport:   %s\n",
              out.value("policy", std::string()).c_str(),
              out.value("source", std::string()).c_str(), out.value("interval_ms", 0),
              out.value("describe", json()).dump().c_str(),
              out.value("report", json()).dump().c_str());
  const json m = out.value("metrics", json::object());
  std::printf("metrics:  %s\n", m.dump().c_str());
  return kExitOk;
}

int cmd_policy_set(const Global& g, const std::string& file) {
  auto doc = read_json_file(file);
  if (!doc) return fail(doc.status());
  Status s = inline_rules_files(*doc, dir_of(file));
  if (!s.is_ok()) return fail(s);
  auto r = call(g, wire::Type::kPolicySet, json{{"policy", *doc}});
  if (!r) return fail(r.status());
  std::printf("policy '%s' in force (interval %d ms)\n", r->value("policy", std::string()).c_str(),
              r->value("interval_ms", 0));
  return kExitOk;
}

// A number of milliseconds, or "-" for none (an unbounded time).
std::string human_ms(const json& v) {
  if (!v.is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f ms", v.get<double>());
  return buf;
}

int cmd_policy_check(const std::string& file, bool as_json) {
  auto r = check_policy_file(file);
  if (!r) {
    std::fprintf(stderr, "sluice policy check: %s\n", r.status().message().c_str());
    return r.status().code() == Code::kInvalidArgument ? kExitUsage : kExitError;
  }
  const json& out = *r;
  if (as_json) {
    std::printf("%s\n", out.dump(2).c_str());
    return kExitOk;
  }
  const json& interval = out["interval_ms"];
  std::printf("policy:   %s\ninterval: %s\n", out.value("policy", std::string()).c_str(),
              interval.is_number() ? (interval.dump() + " ms").c_str() : "(the daemon's)");
  const json reservations = out.value("reservations", json::object());
  for (const auto& [resource, res] : reservations.items()) {
    if (!res.is_object()) continue;
    const json& delta = res.value("delta_ms", json());
    std::printf("%s: reserved %s of %s (%.2f%%), delta %s, k %s\n", resource.c_str(),
                human_bytes(res.value("reserved_bytes", 0.0)).c_str(),
                human_bytes(res.value("capacity", 0.0)).c_str(),
                100 * res.value("reserved_fraction", 0.0),
                delta.is_number() ? human_ms(delta).c_str() : delta.dump().c_str(),
                res.value("k", json()).dump().c_str());
    if (res.contains("refill_time_ms")) {  // a read cache
      std::printf(
          "  refill bandwidth %s/s (%s), read amplification %.2f (%s); refill time without "
          "reservations %s; with them %s\n",
          human_bytes(res.value("refill_bandwidth", 0.0)).c_str(),
          res.value("refill_bandwidth_source", std::string()).c_str(),
          res.value("read_amplification", 1.0),
          res.value("read_amplification_source", std::string()).c_str(),
          human_ms(res.value("refill_time_ms", json())).c_str(),
          human_ms(res.value("refill_time_reserved_ms", json())).c_str());
    } else {
      std::printf("  flush bandwidth %s/s (%s); worst case without reservations %s; with them %s\n",
                  human_bytes(res.value("flush_bandwidth", 0.0)).c_str(),
                  res.value("flush_bandwidth_source", std::string()).c_str(),
                  human_ms(res.value("worst_case_delay_ms", json())).c_str(),
                  human_ms(res.value("flush_time_ms", json())).c_str());
    }
    const json shares = res.value("fair_share_bytes", json::object());
    const json held = res.value("per_tenant_bytes", json::object());
    std::printf("  %-24s %14s %14s\n", "TENANT", "FAIR-SHARE", "RESERVED");
    for (const auto& [tenant, bytes] : held.items()) {
      const double share = shares.contains(tenant) ? shares[tenant].get<double>() : 0.0;
      std::printf("  %-24.24s %14s %14s\n", tenant.c_str(), human_bytes(share).c_str(),
                  human_bytes(bytes.is_number() ? bytes.get<double>() : 0.0).c_str());
    }
  }
  // flex: each partition's buckets, and the node's.
  const json partitions = out.value("partitions", json::object());
  if (out.contains("node_rate") && partitions.is_object()) {
    const json& node = out["node_rate"];
    std::printf("node:     %s\n",
                node.is_number() ? (human_bytes(node.get<double>()) + "/s").c_str() : "-");
    std::printf("  %-16s %-16s %14s %14s %8s\n", "PARTITION", "STAGE", "FOREGROUND/s",
                "BACKGROUND/s", "LSM-BA");
    for (const auto& [name, p] : partitions.items()) {
      std::printf("  %-16.16s %-16.16s %14s %14s %8.1f\n", name.c_str(),
                  p.value("stage", std::string()).c_str(),
                  human_bytes(p.value("foreground_rate", 0.0)).c_str(),
                  human_bytes(p.value("background_rate", 0.0)).c_str(), p.value("lsm_ba", 0.0));
    }
  }
  const json config = out.value("config", out.value("explain", json()));
  std::printf("config:   %s\n", config.dump().c_str());
  return kExitOk;
}

std::string self_dir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<std::size_t>(n));
  auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

std::string find_preload() {
  if (const char* env = std::getenv("SLUICE_PRELOAD_LIB"); env && *env) {
    return ::access(env, R_OK) == 0 ? env : "";
  }
  const std::string dir = self_dir();
  for (const std::string& c :
       {dir + "/libsluice_preload.so", dir + "/../preload/libsluice_preload.so",
        dir + "/../lib/libsluice_preload.so",
        std::string(SLUICE_INSTALL_LIBDIR) + "/libsluice_preload.so"}) {
    if (::access(c.c_str(), R_OK) == 0) {
      char real[4096];
      return ::realpath(c.c_str(), real) ? std::string(real) : c;
    }
  }
  return "";
}

int cmd_run(const Global& g, const std::string& name, const std::string& rules,
            const std::vector<std::string>& cmd) {
  if (cmd.empty()) {
    std::fprintf(stderr, "sluice run: give a command after --\n");
    return kExitUsage;
  }
  std::string lib = find_preload();
  if (lib.empty()) {
    std::fprintf(stderr,
                 "sluice run: libsluice_preload.so not found (looked next to %s/sluice, in "
                 "../preload, ../lib and %s; set SLUICE_PRELOAD_LIB to override). Build the "
                 "preload target or install Sluice.\n",
                 self_dir().c_str(), SLUICE_INSTALL_LIBDIR);
    return kExitUsage;
  }
  std::string ld = lib;
  if (const char* old = std::getenv("LD_PRELOAD"); old && *old) ld += std::string(":") + old;
  ::setenv("LD_PRELOAD", ld.c_str(), 1);
  // The program may change directory before its stage connects (and every
  // image it execs makes its own stage): the preload takes only an absolute
  // socket path.
  std::string socket = g.socket;
  if (!socket.empty() && socket.front() != '/') {
    char cwd[4096];
    if (::getcwd(cwd, sizeof cwd) == nullptr) {
      std::fprintf(stderr, "sluice run: cannot make the socket path %s absolute: %s\n",
                   socket.c_str(), std::strerror(errno));
      return kExitUsage;
    }
    socket = std::string(cwd) + (cwd[1] == '\0' ? "" : "/") + socket;  // cwd "/": no "//"
  }
  if (socket.size() > 107) {
    std::fprintf(stderr,
                 "sluice run: the socket path %s is %zu bytes; a UNIX socket path is at most 107 "
                 "(give a shorter --socket)\n",
                 socket.c_str(), socket.size());
    return kExitUsage;
  }
  ::setenv("SLUICE_SOCKET", socket.c_str(), 1);
  if (!name.empty()) ::setenv("SLUICE_STAGE", name.c_str(), 1);
  if (!rules.empty()) {
    char real[4096];
    if (!::realpath(rules.c_str(), real) || ::access(real, R_OK) != 0) {
      std::fprintf(stderr, "sluice run: cannot read rules file %s: %s\n", rules.c_str(),
                   std::strerror(errno));
      return kExitUsage;
    }
    ::setenv("SLUICE_RULES", real, 1);
  }
  std::vector<char*> argv;
  for (const auto& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  std::fprintf(stderr, "sluice run: cannot execute %s: %s\n", argv[0], std::strerror(errno));
  return kExitError;
}

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
  serve->callback([&] { rc = cmd_serve(g, std::move(so)); });

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
  std::string run_name, run_rules;
  std::vector<std::string> run_cmd;
  run->add_option("--name", run_name, "Stage name (SLUICE_STAGE)");
  run->add_option("--rules", run_rules, "Local rules file (SLUICE_RULES)");
  run->add_option("CMD", run_cmd, "The command and its arguments (after --)")->required();
  run->callback([&] { rc = cmd_run(g, run_name, run_rules, run_cmd); });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }
  return rc;
}

}  // namespace sluice::control
