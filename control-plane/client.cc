// Blocking client-role connection to the daemon.
#include "client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "sluice/json_text.h"

namespace sluice::control {
namespace {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

int ms_left(SteadyClock::time_point deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

}  // namespace

StatusOr<std::unique_ptr<Connection>> Connection::open(const std::string& socket_path,
                                                       int timeout_ms) {
  if (socket_path.empty() || socket_path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return Status::invalid("socket path: empty or too long: '" + socket_path + "'");
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Status::io_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EAGAIN || errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      if (::poll(&p, 1, timeout_ms) <= 0 ||
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        ::close(fd);
        return Status::unavailable("cannot connect to " + socket_path + ": timed out");
      }
    } else {
      int err = errno;
      ::close(fd);
      return Status::unavailable("cannot connect to " + socket_path + ": " + std::strerror(err) +
                                 " (is `sluice serve` running?)");
    }
  }
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::io_error("cannot tell who serves " + socket_path + ": " + std::strerror(err));
  }
  if (cred.uid != 0 && cred.uid != ::geteuid()) {
    ::close(fd);
    return Status::permission_denied(
        "the process serving " + socket_path + " runs as uid " + std::to_string(cred.uid) +
        ", neither root nor you (uid " + std::to_string(::geteuid()) +
        "): not talking to it (choose the daemon's socket with --socket)");
  }
  return std::unique_ptr<Connection>(new Connection(fd));
}

Connection::~Connection() {
  if (fd_ >= 0) ::close(fd_);
}

Status Connection::send_raw(std::string_view bytes, int timeout_ms) {
  auto deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      int left = ms_left(deadline);
      if (left == 0 || ::poll(&p, 1, left) <= 0) return Status::unavailable("send: timed out");
      continue;
    }
    send_found_closed_ = errno == EPIPE || errno == ECONNRESET;
    return Status::unavailable(std::string("send: ") + std::strerror(errno));
  }
  return Status::ok();
}

std::optional<Status> Connection::closing_error(int timeout_ms) {
  auto deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto m = receive(ms_left(deadline));
    if (!m) return std::nullopt;  // closed or silent: nothing was said
    if (m->is_object() && m->value("type", std::string()) == "error" &&
        m->value("id", std::uint64_t{1}) == 0) {
      return wire::error_status(*m);
    }
  }
}

StatusOr<json> Connection::receive(int timeout_ms) {
  auto deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  std::string payload;
  char buf[64 * 1024];
  for (;;) {
    Status err;
    auto r = decoder_.next(&payload, &err);
    if (r == wire::FrameDecoder::Result::kFrame) {
      auto reply = parse_json_text(payload);
      if (!reply) return reply.status().with_prefix("the daemon's reply: ");
      return reply;
    }
    if (r == wire::FrameDecoder::Result::kError) return err;
    if (eof_) return Status::unavailable("the daemon closed the connection");
    pollfd p{fd_, POLLIN, 0};
    int left = ms_left(deadline);
    int pr = left == 0 ? 0 : ::poll(&p, 1, left);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) return Status::unavailable("no reply from the daemon in time");
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      eof_ = true;
      continue;
    }
    decoder_.feed(buf, static_cast<std::size_t>(n));
  }
}

StatusOr<json> Connection::request(wire::Type type, json fields, int timeout_ms) {
  std::uint64_t id = next_id_++;
  std::string frame;
  SLUICE_RETURN_IF_ERROR(
      wire::append_frame(wire::make_message(type, id, std::move(fields)), frame));
  if (Status sent = send_raw(frame, timeout_ms); !sent.is_ok()) {
    if (!send_found_closed_) return sent;
    // The daemon closed the connection before the request went out: it
    // refuses a peer (a uid it does not admit, no room) with an error and
    // closes, and that error, already here, says why.
    auto why = closing_error(std::min(timeout_ms, 1000));
    if (why) return *why;
    return Status::unavailable("the daemon closed the connection before the request was sent");
  }
  auto deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto reply = receive(ms_left(deadline));
    if (!reply) return reply.status();
    const json& r = *reply;
    if (!r.is_object()) continue;
    std::uint64_t rid = r.value("id", std::uint64_t{0});
    std::string t = r.value("type", std::string());
    if (t == "error" && (rid == id || rid == 0)) return wire::error_status(r);
    if (rid != id) continue;
    return reply;
  }
}

}  // namespace sluice::control
