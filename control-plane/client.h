// A blocking client-role connection to `sluice serve`, for the CLI, tests and
// benchmarks: plain POSIX socket I/O with poll() deadlines.
//
// Thread safety: one Connection is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "sluice/status.h"
#include "sluice/wire.h"

namespace sluice::control {

// The longest a connection waits to connect, to send, or for a message, and
// for the answer to a request, unless told otherwise (ms).
inline constexpr int kIoTimeoutMs = 5000;
inline constexpr int kRequestTimeoutMs = 10000;
// The largest reply the daemon sends a client (get_stats with many stages),
// and so the largest frame a Connection takes.
inline constexpr std::size_t kMaxReplyBytes = std::size_t{32} << 20;

class Connection {
 public:
  // Connects to the daemon's socket. kUnavailable when nobody listens there;
  // kPermissionDenied when the process listening there runs as neither root
  // nor this user (SO_PEERCRED), as a stage refuses such a daemon: what the
  // CLI sends (a policy with its rules files inlined) must not reach another
  // user's process squatting on the path.
  static StatusOr<std::unique_ptr<Connection>> open(const std::string& socket_path,
                                                    int timeout_ms = kIoTimeoutMs);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends a request of `type` with `fields` and waits for its reply (matched
  // by id). An error reply becomes its Status; the value is the whole reply.
  // When the daemon closed the connection before the request went out (it
  // refuses a peer with an error, id 0, then closes), that error is returned,
  // not the failed send.
  StatusOr<nlohmann::json> request(wire::Type type,
                                   nlohmann::json fields = nlohmann::json::object(),
                                   int timeout_ms = kRequestTimeoutMs);

  // Lower level, for robustness tests: raw bytes out, next message in.
  Status send_raw(std::string_view bytes, int timeout_ms = kIoTimeoutMs);
  // Waits for the next message (any id). kUnavailable on EOF.
  StatusOr<nlohmann::json> receive(int timeout_ms = kIoTimeoutMs);
  // True once the peer closed the connection (observed by receive()).
  bool peer_closed() const noexcept { return eof_; }
  int fd() const noexcept { return fd_; }
  std::uint64_t next_id() { return next_id_++; }

 private:
  explicit Connection(int fd) : fd_(fd) {}
  // After a send found the connection closed: the error the daemon sent
  // before closing (id 0), if one comes within `timeout_ms`.
  std::optional<Status> closing_error(int timeout_ms);
  int fd_;
  bool send_found_closed_ = false;  // a send failed with EPIPE or ECONNRESET
  std::uint64_t next_id_ = 1;
  wire::FrameDecoder decoder_{kMaxReplyBytes};
  bool eof_ = false;
};

}  // namespace sluice::control
