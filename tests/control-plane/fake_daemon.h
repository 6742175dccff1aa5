// A stand-in for `sluice serve` that speaks just enough of the protocol
// (docs/protocol.md) to test a stage's side: it acknowledges hellos, sends
// the first rules at once, after a delay, or never, sends collects, can drop
// every session right after its ack, and records what it saw, including every
// descriptor a stage sent with its hello (checked as a board would be).
//
// Thread safety: the counters may be read from any thread while it runs.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/board.h"
#include "sluice/wire.h"

namespace sluice::testing {

struct FakeDaemonOptions {
  enum class Rules { kAtOnce, kDelayed, kHeld, kNever };
  // The first rules message after each hello ack: right after it, after
  // `rules_delay`, once release_rules() was called, or never (a daemon that
  // predates the readiness contract, or is stuck).
  Rules rules = Rules::kAtOnce;
  std::chrono::milliseconds rules_delay{0};
  nlohmann::json first_rules = {{"version", 1}, {"rules", nlohmann::json::array()}};
  // In the daemon's own form (wire::make_rules_frame, which a stage applies
  // without building JSON when it can), else as a plain JSON message.
  bool daemon_form = true;
  // Close each session right after acknowledging its hello.
  bool drop_after_ack = false;
  // Send a collect to each session this often once its first rules went out
  // (0: never).
  int collect_every_ms = 0;
};

class FakeDaemon {
 public:
  FakeDaemon(std::string socket_path, FakeDaemonOptions o)
      : path_(std::move(socket_path)), o_(std::move(o)) {
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    ::unlink(path_.c_str());
    ok_ = listen_fd_ >= 0 &&
          ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
          ::listen(listen_fd_, 64) == 0 && ::pipe2(stop_pipe_, O_CLOEXEC | O_NONBLOCK) == 0;
    if (ok_) thread_ = std::thread([this] { run(); });
  }
  ~FakeDaemon() { stop(); }
  FakeDaemon(const FakeDaemon&) = delete;
  FakeDaemon& operator=(const FakeDaemon&) = delete;

  bool ok() const { return ok_; }

  // Rules::kHeld: the first rules go out now (and to later sessions at once).
  void release_rules() { released_.store(true); }

  // Stops accepting and closes every session.
  void stop() {
    if (!thread_.joinable()) return;
    char b = 1;
    (void)::write(stop_pipe_[1], &b, 1);
    thread_.join();
    for (int fd : {listen_fd_, stop_pipe_[0], stop_pipe_[1]}) {
      if (fd >= 0) ::close(fd);
    }
    ::unlink(path_.c_str());
  }

  std::atomic<int> connections{0};      // sessions accepted
  std::atomic<int> hellos{0};           // hellos acknowledged
  std::atomic<int> rules_sent{0};       // first rules messages sent
  std::atomic<int> rules_answers{0};    // their answers (ack or error)
  std::atomic<int> stats_answers{0};    // answers to collects
  std::atomic<int> boards_ok{0};        // descriptors sent with a hello that map as a board
  std::atomic<int> boards_bad{0};       // any other descriptor a stage sent
  std::atomic<int> protocol_errors{0};  // frames that did not parse

  // (st_dev, st_ino) of every descriptor received.
  std::vector<std::pair<dev_t, ino_t>> received_files() {
    std::lock_guard lock(mu_);
    return received_;
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Session {
    int fd = -1;
    wire::FrameDecoder decoder;
    bool acked = false;
    bool rules_out = false;
    Clock::time_point rules_at{};
    Clock::time_point next_collect{};
    std::uint64_t next_id = 1000;
  };

  void send_msg(Session& s, const nlohmann::json& msg) { send_raw(s, wire::encode_frame(msg)); }

  void send_raw(Session& s, const std::string& out) {
    std::size_t done = 0;
    while (done < out.size()) {
      ssize_t n = ::send(s.fd, out.data() + done, out.size() - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<std::size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        pollfd p{s.fd, POLLOUT, 0};
        (void)::poll(&p, 1, 100);
      } else {
        return;
      }
    }
  }

  void take_fds(msghdr& mh) {
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < n; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        struct stat st {};
        if (::fstat(fd, &st) == 0) {
          std::lock_guard lock(mu_);
          received_.emplace_back(st.st_dev, st.st_ino);
        }
        (BoardWriter::map(fd).is_ok() ? boards_ok : boards_bad).fetch_add(1);
        ::close(fd);
      }
    }
  }

  // False when the session is over.
  bool on_readable(Session& s) {
    char buf[64 * 1024];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
    iovec iov{buf, sizeof buf};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(s.fd, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n <= 0) return false;
    take_fds(mh);
    s.decoder.feed(buf, static_cast<std::size_t>(n));
    std::string payload;
    for (;;) {
      Status err;
      auto r = s.decoder.next(&payload, &err);
      if (r == wire::FrameDecoder::Result::kNeedMore) return true;
      if (r == wire::FrameDecoder::Result::kError) {
        protocol_errors.fetch_add(1);
        return false;
      }
      auto msg = wire::parse_message(payload);
      if (!msg.is_ok()) {
        protocol_errors.fetch_add(1);
        continue;
      }
      switch (msg->type) {
        case wire::Type::kHello:
          send_msg(s, wire::make_ack(msg->id, {{"name", msg->body.value("name", "stage")},
                                               {"interval_ms", 10},
                                               {"board", false}}));
          s.acked = true;
          hellos.fetch_add(1);
          if (o_.drop_after_ack) return false;
          s.rules_at = Clock::now() + o_.rules_delay;
          break;
        case wire::Type::kStats:
          stats_answers.fetch_add(1);
          break;
        case wire::Type::kAck:
        case wire::Type::kError:
          rules_answers.fetch_add(1);
          break;
        default:
          break;
      }
    }
  }

  void on_tick(Session& s) {
    if (!s.acked) return;
    const auto now = Clock::now();
    const bool due = o_.rules == FakeDaemonOptions::Rules::kHeld
                         ? released_.load()
                         : o_.rules != FakeDaemonOptions::Rules::kNever && now >= s.rules_at;
    if (!s.rules_out && due) {
      if (o_.daemon_form) {
        wire::SharedFrame f;
        auto batch = std::make_shared<const std::string>(wire::dump(o_.first_rules));
        if (wire::make_rules_frame(s.next_id++, 0, batch, f).is_ok()) {
          send_raw(s, f.head + *f.shared + f.tail);
        }
      } else {
        send_msg(s,
                 wire::make_message(wire::Type::kRules, s.next_id++, {{"rules", o_.first_rules}}));
      }
      s.rules_out = true;
      rules_sent.fetch_add(1);
      s.next_collect = now;
    }
    if (s.rules_out && o_.collect_every_ms > 0 && now >= s.next_collect) {
      send_msg(s, wire::make_message(wire::Type::kCollect, s.next_id++));
      s.next_collect = now + std::chrono::milliseconds(o_.collect_every_ms);
    }
  }

  void run() {
    std::vector<Session> sessions;
    for (;;) {
      std::vector<pollfd> p;
      p.push_back({stop_pipe_[0], POLLIN, 0});
      p.push_back({listen_fd_, POLLIN, 0});
      for (auto& s : sessions) p.push_back({s.fd, POLLIN, 0});
      (void)::poll(p.data(), p.size(), 2);
      if (p[0].revents & POLLIN) break;
      if (p[1].revents & POLLIN) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
          connections.fetch_add(1);
          sessions.emplace_back();
          sessions.back().fd = fd;
        }
      }
      for (std::size_t i = 0; i < sessions.size(); ++i) {
        Session& s = sessions[i];
        bool alive = true;
        if (i + 2 < p.size() && p[i + 2].fd == s.fd && (p[i + 2].revents & (POLLIN | POLLHUP))) {
          alive = on_readable(s);
        }
        if (alive) on_tick(s);
        if (!alive) {
          ::close(s.fd);
          s.fd = -1;
        }
      }
      std::erase_if(sessions, [](const Session& s) { return s.fd < 0; });
    }
    for (auto& s : sessions) ::close(s.fd);
  }

  std::string path_;
  FakeDaemonOptions o_;
  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  bool ok_ = false;
  std::atomic<bool> released_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::pair<dev_t, ino_t>> received_;
};

}  // namespace sluice::testing
