// The stage's control-plane client: one background thread, plain POSIX I/O on
// a UNIX socket with poll() and timeouts (no Asio inside host processes).
//
// The thread runs entirely under an InternalIoScope: every syscall it makes is
// Sluice's own and a preloaded stage passes it through.
#include "sluice/control_client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include "sluice/board.h"
#include "sluice/context.h"
#include "sluice/wire.h"

namespace sluice {
namespace {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

// A write that cannot complete in this long means the daemon is stuck: the
// connection is dropped (and re-established later).
constexpr int kWriteTimeoutMs = 5000;
// The daemon must answer hello within this long.
constexpr int kHelloTimeoutMs = 5000;

void close_fd(int& fd) {
  if (fd >= 0) {
    ::close(fd);
    fd = -1;
  }
}

}  // namespace

struct ControlClient::Impl {
  Stage& stage;
  ControlClientOptions options;
  int wake_read = -1;
  int wake_write = -1;
  std::atomic<bool> stopping{false};
  std::atomic<bool> is_connected{false};
  std::atomic<std::uint64_t> connects{0};
  std::atomic<std::uint64_t> rules_applied{0};
  std::atomic<std::uint64_t> rules_rejected{0};
  std::atomic<std::uint64_t> collects{0};
  std::atomic<bool> board_in_use{false};
  std::thread thread;

  // Owned by the thread.
  int fd = -1;
  std::uint64_t next_id = 1;
  std::uint64_t hello_id = 0;
  // The rules version of the description this connection last sent (in its
  // hello or a stats answer): a collect sends it again only when it moved.
  std::uint64_t info_version_sent = 0;
  std::minstd_rand rng;

  Impl(Stage& s, ControlClientOptions o) : stage(s), options(std::move(o)) {
    rng.seed(static_cast<unsigned>(::getpid()) ^
             static_cast<unsigned>(SteadyClock::now().time_since_epoch().count()));
  }

  void run() {
    InternalIoScope internal;
    auto backoff = options.backoff_initial;
    while (!stopping.load(std::memory_order_acquire)) {
      bool greeted = false;
      if (connect_socket()) {
        greeted = serve();
        is_connected.store(false, std::memory_order_release);
        close_fd(fd);
      }
      if (stopping.load(std::memory_order_acquire)) break;
      if (greeted) backoff = options.backoff_initial;  // a session was established
      // Sleep backoff * [0.5, 1.0): jitter spreads reconnecting stages out.
      std::uniform_real_distribution<double> jitter(0.5, 1.0);
      auto delay = std::chrono::milliseconds(
          std::max<std::int64_t>(1, static_cast<std::int64_t>(backoff.count() * jitter(rng))));
      wait_wake(static_cast<int>(delay.count()));
      backoff = std::min(options.backoff_max, backoff * 2);
    }
  }

  // Blocks up to `ms` or until the destructor wakes us. Returns true if woken.
  bool wait_wake(int ms) {
    pollfd p{wake_read, POLLIN, 0};
    int r = ::poll(&p, 1, ms);
    return r > 0;
  }

  bool connect_socket() {
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return false;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, options.socket_path.data(), options.socket_path.size());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      if (errno != EINPROGRESS && errno != EAGAIN) {
        close_fd(fd);
        return false;
      }
      // A UNIX socket connect rarely pends; wait a little if it does.
      pollfd p[2] = {{fd, POLLOUT, 0}, {wake_read, POLLIN, 0}};
      if (::poll(p, 2, kWriteTimeoutMs) <= 0 || !(p[0].revents & POLLOUT)) {
        close_fd(fd);
        return false;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        close_fd(fd);
        return false;
      }
    }
    // Only a daemon run by our own user (or root) may steer this stage.
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        (cred.uid != ::geteuid() && cred.uid != 0)) {
      close_fd(fd);
      return false;
    }
    return true;
  }

  // Writes a whole frame, waiting for POLLOUT with a timeout.
  bool send(const json& msg) {
    std::string out;
    if (!wire::append_frame(msg, out).is_ok()) {
      // Too large (an enormous stats reply): say so instead.
      out.clear();
      std::uint64_t id = msg.value("id", std::uint64_t{0});
      if (!wire::append_frame(wire::make_error(id, Status::internal("reply exceeds frame limit")),
                              out)
               .is_ok()) {
        return false;
      }
    }
    return send_bytes(out);
  }

  // Writes already framed bytes, waiting for POLLOUT with a timeout; with
  // `pass_fd` >= 0, that descriptor goes with the first byte (SCM_RIGHTS).
  bool send_bytes(const std::string& out, int pass_fd = -1) {
    std::size_t done = 0;
    auto deadline = SteadyClock::now() + std::chrono::milliseconds(kWriteTimeoutMs);
    while (done < out.size()) {
      ssize_t n = done == 0 && pass_fd >= 0
                      ? send_with_fd(fd, out.data(), out.size(), pass_fd)
                      : ::send(fd, out.data() + done, out.size() - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
        if (left.count() <= 0) return false;
        pollfd p[2] = {{fd, POLLOUT, 0}, {wake_read, POLLIN, 0}};
        int r = ::poll(p, 2, static_cast<int>(left.count()));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0 || (p[1].revents & POLLIN)) return false;
        continue;
      }
      return false;
    }
    return true;
  }

  // The board is made before the description is taken, so that the
  // description lists the objects' slots.
  json hello_message(bool with_board) {
    StageInfo info = stage.info();
    json labels = json::object();
    for (auto& [k, v] : info.labels) labels[k] = v;
    json jinfo;
    to_json(jinfo, info);
    info_version_sent = info.rules_version;
    hello_id = next_id++;
    json body = {{"name", stage.name()},
                 {"pid", static_cast<std::int64_t>(::getpid())},
                 {"uid", static_cast<std::int64_t>(::getuid())},
                 {"protocol", wire::kProtocolVersion},
                 {"labels", std::move(labels)},
                 {"info", std::move(jinfo)}};
    if (with_board) body["board"] = wire::board_offer();
    return wire::make_message(wire::Type::kHello, hello_id, std::move(body));
  }

  // Sends hello, with the stage's board (made on the first session) when the
  // system offers one.
  bool send_hello() {
    StatusOr<int> board = stage.board();
    std::string out;
    if (!wire::append_frame(hello_message(board.is_ok()), out).is_ok()) return false;
    return send_bytes(out, board.is_ok() ? *board : -1);
  }

  // Runs one session. Returns true if the daemon accepted our hello.
  bool serve() {
    wire::FrameDecoder decoder;
    board_in_use.store(false, std::memory_order_relaxed);
    if (!send_hello()) return false;
    bool greeted = false;
    auto hello_deadline = SteadyClock::now() + std::chrono::milliseconds(kHelloTimeoutMs);
    char buf[64 * 1024];
    std::string payload;
    while (!stopping.load(std::memory_order_acquire)) {
      int timeout = -1;
      if (!greeted) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(hello_deadline -
                                                                          SteadyClock::now());
        if (left.count() <= 0) return false;
        timeout = static_cast<int>(left.count());
      }
      pollfd p[2] = {{fd, POLLIN, 0}, {wake_read, POLLIN, 0}};
      int r = ::poll(p, 2, timeout);
      if (r < 0) {
        if (errno == EINTR) continue;
        return greeted;
      }
      if (p[1].revents & POLLIN) return greeted;
      if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n <= 0) return greeted;  // closed by the daemon, or an error
      decoder.feed(buf, static_cast<std::size_t>(n));
      for (;;) {
        Status err;
        auto res = decoder.next(&payload, &err);
        if (res == wire::FrameDecoder::Result::kNeedMore) break;
        if (res == wire::FrameDecoder::Result::kError) {
          (void)send(wire::make_error(0, err));
          return greeted;
        }
        // The rules the daemon sends every cycle, straight from the text;
        // anything else, as parsed JSON.
        bool closed = false;
        if (greeted && handle_compact_rules(payload, closed)) {
          if (closed) return greeted;
          continue;
        }
        std::uint64_t id = 0;
        auto msg = wire::parse_message(payload, &id);
        if (!msg) {
          if (!send(wire::make_error(id, msg.status()))) return greeted;
          continue;
        }
        if (!handle(*msg, greeted)) return greeted;
      }
    }
    return greeted;
  }

  // A rules message in the daemon's form with a batch Stage::try_apply_compact
  // takes: applied and answered as handle() would, true. False when it is
  // anything else (nothing done). `closed` is set when the answer could not
  // be sent (the session must end).
  bool handle_compact_rules(std::string_view payload, bool& closed) {
    closed = false;
    auto view = wire::view_rules_message(payload);
    if (!view) return false;
    std::optional<Status> s = stage.try_apply_compact(view->batch);
    if (!s) return false;
    closed = !answer_rules(view->id, *s);
    return true;
  }

  // Answers a rules message: an ack with the stage's rules version, or the
  // error. False when it could not be sent.
  bool answer_rules(std::uint64_t id, const Status& s) {
    if (!s.is_ok()) {
      rules_rejected.fetch_add(1, std::memory_order_relaxed);
      return send(wire::make_error(id, s));
    }
    rules_applied.fetch_add(1, std::memory_order_relaxed);
    std::string ack;
    wire::append_rules_ack_frame(id, stage.rules_version(), ack);
    return send_bytes(ack);
  }

  // Returns false when the session must end.
  bool handle(const wire::Message& m, bool& greeted) {
    switch (m.type) {
      case wire::Type::kAck:
        if (m.id == hello_id && !greeted) {
          greeted = true;
          auto b = m.body.find("board");
          board_in_use.store(b != m.body.end() && b->is_boolean() && b->get<bool>(),
                             std::memory_order_relaxed);
          connects.fetch_add(1, std::memory_order_relaxed);
          is_connected.store(true, std::memory_order_release);
        }
        return true;
      case wire::Type::kError:
        // The daemon refused our hello (or an earlier reply): start over later.
        if (m.id == hello_id && !greeted) return false;
        return true;
      case wire::Type::kStats:
        return true;  // we never ask for stats
      case wire::Type::kRules: {
        if (!greeted) {
          return send(wire::make_error(m.id, Status::precondition("rules before hello ack")));
        }
        return answer_rules(m.id, stage.apply(m.body.at("rules")));
      }
      case wire::Type::kCollect: {
        json body = json::object();
        to_json(body["stats"], stage.collect());
        // The description only when it changed since this connection sent
        // one (protocol.md): the daemon keeps the last it got.
        if (stage.rules_version() != info_version_sent) {
          StageInfo info = stage.info();
          info_version_sent = info.rules_version;
          to_json(body["info"], info);
        }
        collects.fetch_add(1, std::memory_order_relaxed);
        return send(wire::make_message(wire::Type::kStats, m.id, std::move(body)));
      }
      default:
        return send(
            wire::make_error(m.id, Status::invalid("'" + std::string(wire::type_name(m.type)) +
                                                   "' is not a request a stage serves")));
    }
  }
};

StatusOr<std::unique_ptr<ControlClient>> ControlClient::start(Stage& stage,
                                                              ControlClientOptions options) {
  if (options.socket_path.empty()) return Status::invalid("socket_path: required");
  if (options.socket_path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return Status::invalid("socket_path: longer than " +
                           std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + " bytes");
  }
  if (options.backoff_initial.count() <= 0) {
    return Status::invalid("backoff_initial: must be positive");
  }
  if (options.backoff_max < options.backoff_initial) {
    return Status::invalid("backoff_max: must be >= backoff_initial");
  }
  auto impl = std::make_unique<Impl>(stage, std::move(options));
  int p[2];
  {
    InternalIoScope internal;
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
      return Status::io_error(std::string("pipe2: ") + std::strerror(errno));
    }
  }
  impl->wake_read = p[0];
  impl->wake_write = p[1];
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<ControlClient>(new ControlClient(std::move(impl)));
}

ControlClient::ControlClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ControlClient::~ControlClient() {
  if (!impl_) return;
  InternalIoScope internal;
  impl_->stopping.store(true, std::memory_order_release);
  char b = 1;
  while (::write(impl_->wake_write, &b, 1) < 0 && errno == EINTR) {
  }
  if (impl_->thread.joinable()) impl_->thread.join();
  close_fd(impl_->wake_read);
  close_fd(impl_->wake_write);
}

bool ControlClient::connected() const noexcept {
  return impl_->is_connected.load(std::memory_order_acquire);
}

ControlClientCounters ControlClient::counters() const noexcept {
  ControlClientCounters c;
  c.connects = impl_->connects.load(std::memory_order_relaxed);
  c.rules_applied = impl_->rules_applied.load(std::memory_order_relaxed);
  c.rules_rejected = impl_->rules_rejected.load(std::memory_order_relaxed);
  c.collects = impl_->collects.load(std::memory_order_relaxed);
  c.board = impl_->board_in_use.load(std::memory_order_relaxed);
  return c;
}

}  // namespace sluice
