// `sluice serve` and `sluice run`: the daemon (and the cluster node agent)
// in this process, and a program under the preload.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "cli_commands.h"
#include "cluster_controller.h"
#include "cluster_node.h"
#include "policy_doc.h"

#ifndef SLUICE_INSTALL_LIBDIR
#define SLUICE_INSTALL_LIBDIR "/usr/local/lib"
#endif

namespace sluice::control::cli {
namespace {

// The node role's agent, from a cluster file and/or --etcd and --node.
StatusOr<std::unique_ptr<cluster::ClusterNode>> start_cluster_node(const std::string& file,
                                                                   const std::string& etcd,
                                                                   const std::string& node) {
  json doc = json::object();
  if (!file.empty()) {
    auto j = read_json_file(file);
    if (!j) return j.status();
    doc = std::move(*j);
  }
  if (!etcd.empty()) doc["etcd"] = cluster::split_endpoints(etcd);
  if (!node.empty()) doc["node"] = node;
  auto c = cluster::parse_cluster_node_config(doc);
  if (!c) return file.empty() ? c.status() : c.status().with_prefix(file + ": ");
  return cluster::ClusterNode::start(std::move(*c));
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

}  // namespace

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
  std::unique_ptr<cluster::ClusterNode> node;
  if (!serve.cluster_file.empty() || !serve.etcd.empty() || !serve.node.empty()) {
    auto n = start_cluster_node(serve.cluster_file, serve.etcd, serve.node);
    if (!n) {
      std::fprintf(stderr, "sluice serve: %s\n", n.status().message().c_str());
      return kExitUsage;
    }
    node = std::move(*n);
    node->attach(o);
  }
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

int cmd_run(const Global& g, const RunOptions& run) {
  const std::string& name = run.name;
  const std::string& rules = run.rules;
  const std::vector<std::string>& cmd = run.cmd;
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
  // Whether a daemon answers there. Without one the program runs under --rules alone,
  // or unenforced, until one does: say so once, or refuse (--require-daemon).
  Global probe = g;
  probe.socket = socket;
  probe.timeout_ms = std::min(g.timeout_ms, 2000);
  if (auto reached = call(probe, wire::Type::kListStages); !reached) {
    if (run.require_daemon) {
      std::fprintf(stderr, "sluice run: %s; not starting %s (--require-daemon)\n",
                   reached.status().message().c_str(), cmd.front().c_str());
      return reached.status().code() == Code::kUnavailable ? kExitUnreachable : kExitError;
    }
    const std::string how = rules.empty() ? "unenforced" : "under " + rules + " alone";
    std::fprintf(stderr, "sluice run: %s; %s runs %s until a daemon answers there\n",
                 reached.status().message().c_str(), cmd.front().c_str(), how.c_str());
  }
  std::vector<char*> argv;
  for (const auto& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  std::fprintf(stderr, "sluice run: cannot execute %s: %s\n", argv[0], std::strerror(errno));
  return kExitError;
}

}  // namespace sluice::control::cli
