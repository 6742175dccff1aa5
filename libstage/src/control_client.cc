// The stage's control-plane client: one background thread, plain POSIX I/O on
// a UNIX socket with poll() and timeouts (no Asio inside host processes).
//
// The thread runs entirely under an InternalIoScope: every syscall it makes is
// Sluice's own and a preloaded stage passes it through. It runs with every
// signal blocked, so a process-directed signal always goes to a thread of the
// host that does not block it (or stays pending for its sigwait/signalfd).
//
// Its socket and wake eventfd are reserved descriptors (sluice/reserved_fd.h):
// the thread reads their numbers and makes its non-blocking calls under a
// ReservedFdLock, and blocks only in ReservedPoller::poll, so that a host's
// dup2() onto one of their numbers moves them first, and the thread never
// touches the host's file that took the number.
#include "sluice/control_client.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <system_error>
#include <thread>

#include "sluice/board.h"
#include "sluice/context.h"
#include "sluice/reserved_fd.h"
#include "sluice/thread_annotations.h"
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
// Polls wait at most this long while the wake eventfd is lost (the host took
// its number when no other was free), so that stop() is still noticed.
constexpr int kNoWakePollMs = 100;

int remaining_ms(SteadyClock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<std::int64_t>(left, 1 << 30));
}

// Blocks every signal in the calling thread for its lifetime, then restores
// its mask: a thread created meanwhile inherits the full mask.
class AllSignalsBlocked {
 public:
  AllSignalsBlocked() noexcept {
    sigset_t all;
    sigfillset(&all);
    ok_ = pthread_sigmask(SIG_SETMASK, &all, &saved_) == 0;
  }
  ~AllSignalsBlocked() {
    if (ok_) pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
  }
  AllSignalsBlocked(const AllSignalsBlocked&) = delete;
  AllSignalsBlocked& operator=(const AllSignalsBlocked&) = delete;

 private:
  sigset_t saved_{};
  bool ok_ = false;
};

}  // namespace

struct ControlClient::Impl {
  Stage& stage;
  ControlClientOptions options;
  // The thread's wake-up: stop(), or a reserved descriptor moved. Read and
  // replaced under a ReservedFdLock only.
  ReservedFd wake;
  ReservedPoller poller;
  std::atomic<bool> stopping{false};
  std::atomic<bool> is_connected{false};
  std::atomic<std::uint64_t> attempts{0};
  std::atomic<std::uint64_t> connects{0};
  std::atomic<std::uint64_t> rules_applied{0};
  std::atomic<std::uint64_t> rules_rejected{0};
  std::atomic<std::uint64_t> collects{0};
  std::atomic<bool> board_in_use{false};
  std::thread thread;

  // Readiness (ControlClient::wait_ready).
  Mutex ready_mu;
  std::condition_variable ready_cv;
  bool ready SLUICE_GUARDED_BY(ready_mu) = false;  // also in ready_flag
  // An attempt is under way or about to start.
  bool hopeful SLUICE_GUARDED_BY(ready_mu) = true;
  bool stopped SLUICE_GUARDED_BY(ready_mu) = false;
  std::atomic<bool> ready_flag{false};

  Mutex stop_mu;
  bool stop_done SLUICE_GUARDED_BY(stop_mu) = false;

  // Owned by the thread.
  ReservedFd sock;
  std::uint64_t next_id = 1;
  std::uint64_t hello_id = 0;
  // The rules version of the description this connection last sent (in its
  // hello or a stats answer): a collect sends it again only when it moved.
  std::uint64_t info_version_sent = 0;
  std::minstd_rand rng;

  Impl(Stage& s, ControlClientOptions o)
      : stage(s), options(std::move(o)), poller(&Impl::on_move, this) {
    rng.seed(static_cast<unsigned>(::getpid()) ^
             static_cast<unsigned>(SteadyClock::now().time_since_epoch().count()));
  }

  // ReservedPoller's wake-up, from a host thread moving a reserved
  // descriptor, with the ReservedFdLock held.
  static void on_move(void* self) noexcept SLUICE_REQUIRES(detail::reserved_fd_mutex) {
    static_cast<Impl*>(self)->signal_wake_locked();
  }

  // With the ReservedFdLock held: wakes the thread. Only ever written to the
  // eventfd this client owns, under its current number (raw syscall: never
  // enforced, never the preload's wrapper).
  void signal_wake_locked() noexcept SLUICE_REQUIRES(detail::reserved_fd_mutex) {
    const int fd = wake.get();
    if (fd < 0) return;
    const std::uint64_t one = 1;
    const int saved = errno;
    (void)::syscall(SYS_write, fd, &one, sizeof one);
    errno = saved;
  }

  void drain_wake_locked() noexcept SLUICE_REQUIRES(detail::reserved_fd_mutex) {
    const int fd = wake.get();
    if (fd < 0) return;
    std::uint64_t v = 0;
    (void)::syscall(SYS_read, fd, &v, sizeof v);
  }

  // With the ReservedFdLock held: makes a new wake eventfd when the host took
  // the number of the last one and nothing was free to move it to.
  void ensure_wake_locked(const ReservedFdLock& lock) noexcept
      SLUICE_REQUIRES(detail::reserved_fd_mutex) {
    if (wake.get() >= 0) return;
    wake.close(lock);
    wake = ReservedFd::adopt(lock, ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  }

  // A poll timeout, shortened while there is no wake eventfd.
  int poll_timeout(int ms) const noexcept {
    if (wake.get() >= 0) return ms;
    return ms < 0 ? kNoWakePollMs : std::min(ms, kNoWakePollMs);
  }

  // A timeout (ms, -1: none) shortened to when the stage's lease runs out, after applying
  // a lease that has run out (Stage::expire_lease): the thread keeps the lease whether a
  // daemon is connected or not. Called before taking a ReservedFdLock: the stage's control
  // lock comes first (Stage::board takes both).
  int until_lease(int ms) noexcept SLUICE_EXCLUDES(detail::reserved_fd_mutex) {
    std::optional<std::chrono::nanoseconds> lease = stage.lease_left();
    if (lease && lease->count() == 0) {
      (void)stage.expire_lease();
      lease = stage.lease_left();
    }
    if (lease) {
      const auto lease_ms = std::chrono::ceil<std::chrono::milliseconds>(*lease).count();
      const int l = static_cast<int>(std::clamp<std::int64_t>(lease_ms, 1, 1 << 30));
      ms = ms < 0 ? l : std::min(ms, l);
    }
    return ms;
  }

  void set_hopeful(bool h) {
    MutexLock lock(ready_mu);
    hopeful = h;
    if (!h) ready_cv.notify_all();
  }

  // The first rules message of a session was handled: the stage is ready.
  void mark_ready() {
    if (ready_flag.load(std::memory_order_acquire)) return;
    MutexLock lock(ready_mu);
    ready = true;
    ready_flag.store(true, std::memory_order_release);
    ready_cv.notify_all();
  }

  void run() {
    InternalIoScope internal;
    // Named, for a host's ps/top and debuggers.
    (void)pthread_setname_np(pthread_self(), "sluice-client");
    auto backoff = options.backoff_initial;
    while (!stopping.load(std::memory_order_acquire)) {
      attempts.fetch_add(1, std::memory_order_relaxed);
      set_hopeful(true);
      bool greeted = false;
      const auto began = SteadyClock::now();
      if (connect_socket()) greeted = serve();
      is_connected.store(false, std::memory_order_release);
      sock.close();
      set_hopeful(false);  // no session: nobody need wait for rules until the next one
      if (stopping.load(std::memory_order_acquire)) break;
      // The backoff starts over only after a session that lived at least as
      // long as the longest backoff: a daemon that acks and drops at once (or
      // a session that fails at once) gets at most one attempt per backoff_max.
      if (greeted && SteadyClock::now() - began >= options.backoff_max) {
        backoff = options.backoff_initial;
      }
      // Sleep backoff * [0.5, 1.0): jitter spreads reconnecting stages out.
      std::uniform_real_distribution<double> jitter(0.5, 1.0);
      auto delay = std::chrono::milliseconds(
          std::max<std::int64_t>(1, static_cast<std::int64_t>(backoff.count() * jitter(rng))));
      sleep_until(SteadyClock::now() + delay);
      backoff = std::min(options.backoff_max, backoff * 2);
    }
  }

  // Sleeps until `deadline` or stop(); a move of a reserved descriptor wakes
  // the thread but does not end the sleep.
  void sleep_until(SteadyClock::time_point deadline) {
    while (!stopping.load(std::memory_order_acquire)) {
      const int left = remaining_ms(deadline);
      if (left <= 0) return;
      const int wait = until_lease(left);
      ReservedFdLock lock;
      ensure_wake_locked(lock);
      pollfd p{wake.get(), POLLIN, 0};
      bool moved = false;
      const int r = poller.poll(lock, &p, 1, poll_timeout(wait), &moved);
      if (!moved && r > 0 && (p.revents & POLLIN)) drain_wake_locked();
    }
  }

  bool connect_socket() {
    ReservedFdLock lock;
    ensure_wake_locked(lock);
    sock.close(lock);
    sock =
        ReservedFd::adopt(lock, ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (sock.get() < 0) return false;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, options.socket_path.data(), options.socket_path.size());
    if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      if (errno != EINPROGRESS && errno != EAGAIN) return false;
      // A UNIX socket connect rarely pends; wait a little if it does.
      const auto deadline = SteadyClock::now() + std::chrono::milliseconds(kWriteTimeoutMs);
      for (;;) {
        if (stopping.load(std::memory_order_acquire)) return false;
        const int left = remaining_ms(deadline);
        if (left <= 0 || sock.get() < 0) return false;
        pollfd p[2] = {{sock.get(), POLLOUT, 0}, {wake.get(), POLLIN, 0}};
        bool moved = false;
        const int r = poller.poll(lock, p, 2, poll_timeout(left), &moved);
        if (moved || (r < 0 && errno == EINTR) || r == 0) continue;
        if (r < 0) return false;
        if (p[1].revents & POLLIN) {
          drain_wake_locked();
          continue;
        }
        if (p[0].revents & (POLLOUT | POLLERR | POLLHUP)) break;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      if (::getsockopt(sock.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        return false;
      }
    }
    // Only a daemon run by our own user (or root) may steer this stage.
    ucred cred{};
    socklen_t len = sizeof(cred);
    return ::getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 &&
           (cred.uid == ::geteuid() || cred.uid == 0);
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
    return send_bytes(out) == Sent::kOk;
  }

  enum class Sent { kOk, kFailed, kRetry };

  // Writes already framed bytes, waiting for POLLOUT with a timeout. With
  // `pass_fd` >= 0 (a reserved descriptor's number, read after
  // reserved_fd_generation() returned `gen`), that descriptor goes with the
  // first byte (SCM_RIGHTS); kRetry, nothing sent, when a reserved descriptor
  // moved since (the number may no longer be the one meant).
  Sent send_bytes(const std::string& out, int pass_fd = -1, std::uint64_t gen = 0) {
    std::size_t done = 0;
    const auto deadline = SteadyClock::now() + std::chrono::milliseconds(kWriteTimeoutMs);
    ReservedFdLock lock;
    if (pass_fd >= 0 && lock.generation() != gen) return Sent::kRetry;
    while (done < out.size()) {
      const int fd = sock.get();
      if (fd < 0) return Sent::kFailed;
      ssize_t n = done == 0 && pass_fd >= 0
                      ? send_with_fd(fd, out.data(), out.size(), pass_fd)
                      : ::send(fd, out.data() + done, out.size() - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        const int left = remaining_ms(deadline);
        if (left <= 0) return Sent::kFailed;
        pollfd p[2] = {{fd, POLLOUT, 0}, {wake.get(), POLLIN, 0}};
        bool moved = false;
        const int r = poller.poll(lock, p, 2, poll_timeout(left), &moved);
        if (stopping.load(std::memory_order_acquire)) return Sent::kFailed;
        if (moved) {
          if (done == 0 && pass_fd >= 0) return Sent::kRetry;
          continue;
        }
        if (r > 0 && (p[1].revents & POLLIN)) drain_wake_locked();
        continue;
      }
      return Sent::kFailed;
    }
    return Sent::kOk;
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
  // system offers one. The board's number is read again whenever a reserved
  // descriptor moved between reading it and sending it, so the descriptor
  // sent is always the board, never a host file that took its old number.
  bool send_hello() {
    const bool with_board = stage.board().is_ok();
    std::string out;
    if (!wire::append_frame(hello_message(with_board), out).is_ok()) return false;
    for (int tries = 0; tries < 8; ++tries) {
      const std::uint64_t gen = reserved_fd_generation();
      int pass_fd = -1;
      if (with_board) {
        StatusOr<int> board = stage.board();
        pass_fd = board.is_ok() ? *board : -1;
        if (pass_fd < 0) return false;  // lost: the next session makes no difference
      }
      const Sent sent = send_bytes(out, pass_fd, gen);
      if (sent != Sent::kRetry) return sent == Sent::kOk;
    }
    return false;
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
        timeout = remaining_ms(hello_deadline);
        if (timeout <= 0) return false;
      }
      timeout = until_lease(timeout);
      ssize_t n = 0;
      {
        ReservedFdLock lock;
        ensure_wake_locked(lock);
        pollfd p[2] = {{sock.get(), POLLIN, 0}, {wake.get(), POLLIN, 0}};
        if (p[0].fd < 0) return greeted;  // lost to the host
        bool moved = false;
        const int r = poller.poll(lock, p, 2, poll_timeout(timeout), &moved);
        if (moved) continue;
        if (r < 0) {
          if (errno == EINTR) continue;
          return greeted;
        }
        if (p[1].revents & POLLIN) {
          drain_wake_locked();  // stop() (checked above), or a move
          continue;
        }
        if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        n = ::recv(p[0].fd, buf, sizeof(buf), 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (n <= 0) return greeted;  // closed by the daemon, or an error
      }
      decoder.feed(buf, static_cast<std::size_t>(n));
      for (;;) {
        Status err;
        auto res = decoder.next(&payload, &err);
        if (res == wire::FrameDecoder::Result::kNeedMore) break;
        if (res == wire::FrameDecoder::Result::kError) {
          (void)send(wire::make_error(0, err));
          return greeted;
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
    return send_bytes(ack) == Sent::kOk;
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
        const bool answered = answer_rules(m.id, stage.apply(m.body.at("rules")));
        mark_ready();
        return answered;
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
  {
    InternalIoScope internal;
    ReservedFdLock lock;
    impl->wake = ReservedFd::adopt(lock, ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (impl->wake.get() < 0) {
      return Status::io_error(std::string("eventfd: ") + std::strerror(errno));
    }
  }
  Impl* raw = impl.get();
  try {
    // The thread inherits a mask blocking every signal; this thread's own
    // mask is restored at once.
    AllSignalsBlocked blocked;
    impl->thread = std::thread([raw] { raw->run(); });
  } catch (const std::system_error& e) {
    return Status::unavailable(std::string("cannot start the control client's thread: ") +
                               e.what());
  }
  return std::unique_ptr<ControlClient>(new ControlClient(std::move(impl)));
}

ControlClient::ControlClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ControlClient::~ControlClient() {
  if (impl_) stop();
}

void ControlClient::stop() noexcept {
  Impl& s = *impl_;
  MutexLock guard(s.stop_mu);
  if (s.stop_done) return;
  s.stop_done = true;
  InternalIoScope internal;
  s.stopping.store(true, std::memory_order_release);
  {
    MutexLock lock(s.ready_mu);
    s.stopped = true;
    s.ready_cv.notify_all();
  }
  {
    ReservedFdLock lock;
    s.signal_wake_locked();
  }
  if (s.thread.joinable()) s.thread.join();
  ReservedFdLock lock;
  s.sock.close(lock);
  s.wake.close(lock);
}

bool ControlClient::connected() const noexcept {
  return impl_->is_connected.load(std::memory_order_acquire);
}

bool ControlClient::ready() const noexcept {
  return impl_->ready_flag.load(std::memory_order_acquire);
}

bool ControlClient::wait_ready(std::chrono::milliseconds timeout) const {
  Impl& s = *impl_;
  if (s.ready_flag.load(std::memory_order_acquire)) return true;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(s.ready_mu);
  while (!s.ready && !s.stopped && s.hopeful) {
    if (s.ready_cv.wait_until(lock.native(), deadline) == std::cv_status::timeout) break;
  }
  return s.ready;
}

ControlClientCounters ControlClient::counters() const noexcept {
  ControlClientCounters c;
  c.attempts = impl_->attempts.load(std::memory_order_relaxed);
  c.connects = impl_->connects.load(std::memory_order_relaxed);
  c.rules_applied = impl_->rules_applied.load(std::memory_order_relaxed);
  c.rules_rejected = impl_->rules_rejected.load(std::memory_order_relaxed);
  c.collects = impl_->collects.load(std::memory_order_relaxed);
  c.board = impl_->board_in_use.load(std::memory_order_relaxed);
  return c;
}

}  // namespace sluice
