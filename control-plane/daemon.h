// The control-plane daemon behind `sluice serve`: a UNIX socket (Boost.Asio,
// one io_context on one thread), sessions for stages and CLI clients, and the
// control loop that collects from every stage, feeds the policy and sends the
// rules it returns, through a stage's board first when it handed one over
// (docs/design.md, "The control loop"; docs/protocol.md). Peers are known by
// SO_PEERCRED, never by what they claim; what each may do depends on its uid
// (access.h); /proc/PID/io is read for the kernel's pid; path-valued policy
// settings are refused over the socket; connections, frames and idle peers
// are limited (docs/protocol.md, "Limits"). daemon_impl.h lists the parts.
//
// Thread safety: run() on one thread; stop() and request_reload() from any
// thread or a signal-free context; everything else is private to the loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "policy_doc.h"
#include "sluice/status.h"
#include "sluice/wire.h"

namespace sluice {
class Policy;
}

namespace sluice::control {

class DaemonObserver;

// Bounds in milliseconds, shared by the daemon and the CLI: the control
// loop's default interval (its most, kMaxIntervalMs, is policy_doc.h's), the
// most any timeout the CLI takes may be, and the most a client's idle timeout
// may be.
inline constexpr int kDefaultIntervalMs = 1000;
inline constexpr int kMaxTimeoutMs = 3'600'000;       // an hour
inline constexpr int kMaxIdleTimeoutMs = 86'400'000;  // a day

struct DaemonOptions {
  std::string socket_path;         // required
  std::string socket_group;        // "": socket 0600; else 0660 owned by this group
  std::string policy_file;         // "": policy_doc, or `static` without rules
  nlohmann::json policy_doc;       // used when policy_file is empty (tests)
  std::optional<int> interval_ms;  // overrides the policy file's interval_ms
  std::vector<std::uint32_t> allow_uids;
  std::size_t max_frame = wire::kDefaultMaxFrame;
  // A stage that leaves this many collects in a row unanswered is dropped.
  int max_missed = 1;
  // Forwarded apply_rules requests a stage leaves unanswered this long are
  // answered `pending` (Code::kPending: the rules reached the stage, or wait
  // for it, and apply when it reads them); the daemon still takes the stage's
  // late answer and logs it (docs/protocol.md).
  std::chrono::milliseconds forward_timeout{5000};
  bool handle_signals = false;  // SIGHUP reloads, SIGINT/SIGTERM stop
  // "": none. Else a file the daemon appends one JSON line to after every
  // policy step: {"unix_time": s, "policy": NAME, "report": {...}} (the
  // report `policy show` returns). For experiments that plot a policy's
  // decisions without polling the daemon from another process. Opened by
  // create() (an error if it cannot be); set by whoever starts the daemon,
  // never over the socket.
  std::string report_log;
  // Told of the control loop's events as they happen, for benchmarks and
  // tools that time the daemon (daemon_observer.h); not owned, and must
  // outlive the daemon. Null: the daemon measures nothing for anyone.
  DaemonObserver* observer = nullptr;

  // Administrators besides root and the daemon's own uid: they may set the
  // policy and apply rules to any stage (access.h). Admitted like allow_uids.
  std::vector<std::uint32_t> admin_uids;
  // At most this many connections (stages and clients). create() raises the
  // soft descriptor limit to the hard one and lowers this to fit it, keeping
  // descriptors for the daemon's own use and kAdminReserve more connections
  // for administrators. When full, a newcomer takes the place of the oldest
  // connection that has sent nothing yet, else of the client idle longest;
  // stages are never evicted. With none to evict it is refused (unavailable).
  std::size_t max_connections = 4096;
  // A connection that has not completed its first frame this long after
  // connecting is closed (slow or silent peers).
  std::chrono::milliseconds handshake_timeout{10000};
  // A frame whose first bytes arrived this long ago and is still unfinished
  // closes its connection (slowloris).
  std::chrono::milliseconds frame_timeout{10000};
  // A client's connection (not a stage's) with no request for this long is
  // closed. 0: never.
  std::chrono::milliseconds idle_timeout{600000};
  // The bytes all connections together may hold in unfinished frames (never
  // less than max_frame + 64 KiB). Past it, the connections whose unfinished
  // frames are oldest are closed, clients' before stages'.
  std::size_t max_buffered = 64u << 20;
  // Tests only: called with each new connection's descriptor and the
  // credentials the kernel reported for it, which it may change (to fake
  // peers of other uids).
  struct PeerCredentials {
    std::int64_t pid = 0;
    std::uint32_t uid = 0;
    std::uint32_t gid = 0;
  };
  std::function<void(int fd, PeerCredentials& cred)> peer_credentials_hook;
  // Null: the policy a document names is the one in force. Else every policy
  // installed (at start, reload and policy_set) is handed to this first and
  // what it returns is in force: the cluster node role wraps the local
  // policy this way (cluster_node.h).
  std::function<std::unique_ptr<Policy>(std::unique_ptr<Policy>)> wrap_policy;
};

// Connections the daemon keeps for administrators beyond max_connections, and
// descriptors it keeps for its own use (the listening socket, the event loop,
// files it reads) below the descriptor limit.
inline constexpr std::size_t kAdminReserve = 16;
inline constexpr std::size_t kReservedDescriptors = 64;

class Daemon {
 public:
  // Loads the policy and binds the socket (a live daemon on the same path is an
  // error; a stale socket file is replaced; a non-socket file is never touched).
  static StatusOr<std::unique_ptr<Daemon>> create(DaemonOptions options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Serves until stop(). Removes the socket file on return.
  Status run();
  void stop();
  // Re-reads the policy file, as SIGHUP does.
  void request_reload();

  struct Impl;

 private:
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The default socket path: $SLUICE_SOCKET, else $XDG_RUNTIME_DIR/sluice.sock,
// else /tmp/sluice-$UID.sock.
std::string default_socket_path();

}  // namespace sluice::control
