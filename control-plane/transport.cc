// Connection transport: the listening socket (bind, stale sockets, the
// socket's mode and group), accepting with the peer's credentials
// (SO_PEERCRED), and each session's socket I/O: reads into the shared buffer,
// the board descriptor a stage's first bytes may bring (SCM_RIGHTS), framing,
// and writes that go out at once or queue.
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "daemon_impl.h"

namespace sluice::control {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------------------
// The listening socket.

Connections::Connections(Daemon::Impl& daemon)
    : d(daemon), acceptor(daemon.io), accept_timer(daemon.io), sweep_timer(daemon.io) {}

Status Connections::bind_socket() {
  const std::string& path = d.opt.socket_path;
  if (path.empty()) return Status::invalid("socket path: required");
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return Status::invalid("socket path: longer than " +
                           std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + " bytes: " + path);
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status::precondition(path + " exists and is not a socket; refusing to replace it");
    }
    // A socket file: is a daemon behind it?
    int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) return Status::io_error(std::string("socket: ") + std::strerror(errno));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    int r = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    int err = errno;
    ::close(probe);
    if (r == 0) return Status::precondition("a daemon is already serving on " + path);
    if (err != ECONNREFUSED) {
      return Status::io_error("cannot probe " + path + ": " + std::strerror(err));
    }
    spdlog::info("removing stale socket {}", path);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status::io_error("cannot remove stale socket " + path + ": " + std::strerror(errno));
    }
  }
  gid_t gid = static_cast<gid_t>(-1);
  const std::string& group_name = d.opt.socket_group;
  if (!group_name.empty()) {
    std::vector<char> buf(16384);
    group g{};
    group* res = nullptr;
    if (::getgrnam_r(group_name.c_str(), &g, buf.data(), buf.size(), &res) != 0 || !res) {
      return Status::not_found("socket group '" + group_name + "' does not exist");
    }
    gid = res->gr_gid;
  }
  boost::system::error_code ec;
  acceptor.open(stream(), ec);
  if (ec) return Status::io_error("socket: " + ec.message());
  // The umask makes the socket 0600 from the moment it exists.
  mode_t old = ::umask(0177);
  acceptor.bind(stream::endpoint(path), ec);
  ::umask(old);
  if (ec) return Status::io_error("bind " + path + ": " + ec.message());
  if (gid != static_cast<gid_t>(-1)) {
    if (::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0 || ::chmod(path.c_str(), 0660)) {
      Status s = Status::io_error("cannot give " + path + " to group " + group_name + ": " +
                                  std::strerror(errno));
      ::unlink(path.c_str());
      return s;
    }
  } else if (::chmod(path.c_str(), 0600) != 0) {
    return Status::io_error("chmod " + path + ": " + std::strerror(errno));
  }
  acceptor.listen(1024, ec);
  if (ec) return Status::io_error("listen " + path + ": " + ec.message());
  if (::lstat(path.c_str(), &st) == 0) socket_ino = st.st_ino;
  return Status::ok();
}

void Connections::unlink_socket() {
  struct stat st {};
  if (socket_ino && ::lstat(d.opt.socket_path.c_str(), &st) == 0 && st.st_ino == socket_ino) {
    ::unlink(d.opt.socket_path.c_str());
  }
  socket_ino = 0;
}

void Connections::start_accept() {
  acceptor.async_accept([this](boost::system::error_code ec, stream::socket sock) {
    if (d.stopped) return;
    if (!ec) {
      accept_backoff = std::chrono::milliseconds(0);
      on_accept(std::move(sock));
    } else if (ec == asio::error::operation_aborted) {
      return;
    } else {
      on_accept_error(ec);
      return;
    }
    start_accept();
  });
}

void Connections::on_accept_error(const boost::system::error_code& ec) {
  ++counts.accept_errors;
  const bool no_descriptors = ec == asio::error::no_descriptors || ec.value() == ENFILE;
  if (no_descriptors && evict_one(0)) {  // a descriptor is free again
    d.peer_log(spdlog::level::warn, "accept", "accept: {}; closed an idle connection for room",
               ec.message());
    start_accept();
    return;
  }
  if (no_descriptors) refuse_with_spare();
  // Back off (10 ms doubling to 1 s, reset by the next connection accepted)
  // rather than spin on an error that persists.
  accept_backoff = std::clamp(accept_backoff * 2, std::chrono::milliseconds(10),
                              std::chrono::milliseconds(1000));
  d.peer_log(spdlog::level::warn, "accept", "accept: {}; accepting again in {} ms", ec.message(),
             accept_backoff.count());
  accept_timer.expires_after(accept_backoff);
  accept_timer.async_wait([this](boost::system::error_code e) {
    if (!e && !d.stopped) start_accept();
  });
}

void Connections::refuse_with_spare() {
  if (spare.fd < 0) return;
  ::close(spare.fd);
  spare.fd = -1;
  const int fd = ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) {
    std::string frame;
    (void)wire::append_frame(
        wire::make_error(0, Status::unavailable("the daemon is out of file descriptors; "
                                                "try again later")),
        frame);
    (void)::send(fd, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    ::close(fd);
    ++counts.refused_full;
  }
  spare.fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

void Connections::on_accept(stream::socket sock) {
  // In the session arena, with its queues: their memory goes back when the
  // connection closes (session_arena.h).
  auto s =
      std::allocate_shared<Session>(SessionAllocator<Session>(), d, std::move(sock), next_sid++);
  socklen_t len = sizeof(s->cred);
  if (::getsockopt(s->sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &s->cred, &len) != 0) {
    d.peer_log(spdlog::level::warn, "peer_credentials",
               "session {}: SO_PEERCRED failed: {}; refusing", s->sid, std::strerror(errno));
    boost::system::error_code ignored;
    s->sock.close(ignored);
    return;
  }
  if (d.opt.peer_credentials_hook) {
    DaemonOptions::PeerCredentials c{s->cred.pid, s->cred.uid, s->cred.gid};
    d.opt.peer_credentials_hook(s->sock.native_handle(), c);
    s->cred.pid = static_cast<pid_t>(c.pid);
    s->cred.uid = c.uid;
    s->cred.gid = c.gid;
  }
  s->accepted_ns = s->last_frame_ns = now_ns();
  sessions.emplace(s->sid, s);
  if (Status allowed = authorize(access, s->cred.uid, Action::kConnect); !allowed.is_ok()) {
    ++counts.refused_uid;
    d.peer_log(spdlog::level::warn, "refused_uid", "session {}: refusing peer uid {} pid {}",
               s->sid, s->cred.uid, s->cred.pid);
    s->refuse(allowed);
    return;
  }
  if (!make_room(*s)) return;
  silent.insert(s->sid);
  spdlog::debug("session {}: peer pid {} uid {}", s->sid, s->cred.pid, s->cred.uid);
  s->start_read();
}

// ---------------------------------------------------------------------------
// A session's socket I/O.

Session::Session(Daemon::Impl& daemon, stream::socket s, std::uint64_t id)
    : d(daemon), sock(std::move(s)), sid(id), decoder(daemon.opt.max_frame) {}

Session::~Session() {
  drop_offered_fd();
}

void Session::drop_offered_fd() {
  if (offered_fd >= 0) {
    ::close(offered_fd);
    offered_fd = -1;
  }
}

void Session::start_read() {
  auto self = shared_from_this();
  sock.async_wait(stream::socket::wait_read, [self](boost::system::error_code ec) {
    if (self->closed || self->close_after_write) return;
    if (ec) {
      self->on_read(ec, 0);
      return;
    }
    self->read_now();
  });
}

void Session::read_now() {
  if (closed || close_after_write) return;
  ssize_t n;
  do {
    n = receive();
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    start_read();
    return;
  }
  first_read = false;
  if (n <= 0) {
    on_read(n == 0 ? asio::error::eof
                   : boost::system::error_code(errno, boost::system::system_category()),
            0);
    return;
  }
  on_read({}, static_cast<std::size_t>(n));
}

// The first bytes may carry a stage's board (SCM_RIGHTS), which only recvmsg
// with room for it receives: the first descriptor that came with them is kept
// in offered_fd, any other closed. Later reads never take descriptors (the
// kernel discards any that come).
ssize_t Session::receive() {
  std::array<char, 64 * 1024>& rbuf = d.conns.rbuf;
  iovec iov{rbuf.data(), rbuf.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (first_read) {
    mh.msg_control = control;
    mh.msg_controllen = sizeof(control);
  }
  const ssize_t n = ::recvmsg(sock.native_handle(), &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0 || !first_read) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (offered_fd < 0) {
        offered_fd = fd;
      } else {
        ::close(fd);
      }
    }
  }
  return n;
}

void Session::on_read(boost::system::error_code ec, std::size_t n) {
  if (closed) return;
  if (ec) {
    if (decoder.mid_frame()) {
      d.peer_log(spdlog::level::info, "mid_frame_close",
                 "session {}: peer disconnected mid-frame ({} bytes buffered)", sid,
                 decoder.buffered());
    }
    close();
    return;
  }
  decoder.feed(d.conns.rbuf.data(), n);
  std::string payload;
  auto self = shared_from_this();
  for (;;) {
    Status err;
    auto r = decoder.next(&payload, &err);
    if (r == wire::FrameDecoder::Result::kNeedMore) break;
    if (r == wire::FrameDecoder::Result::kError) {
      d.peer_log(spdlog::level::warn, "bad_frame", "session {} (uid {}): {}; closing", sid,
                 cred.uid, err.message());
      refuse(err);
      return;
    }
    d.conns.on_frame(*this);
    d.stages.handle(self, payload);
    drop_offered_fd();  // for the first frame only: a hello has mapped it by now
    if (closed || close_after_write) return;
  }
  if (!d.conns.note_unfinished(*this)) return;
  if (n == d.conns.rbuf.size()) {
    // The socket may hold more; it would not wake a wait again (the
    // reactor waits for new data), so read again after the others' turn.
    asio::post(d.io, [self] { self->read_now(); });
  } else {
    start_read();
  }
}

void Session::refuse(const Status& why) {
  if (closed) return;
  if (!writing && outq.empty()) {
    std::string frame;
    if (wire::append_frame(wire::make_error(0, why), frame, d.opt.max_frame).is_ok()) {
      (void)write_now(frame, nullptr, {});
    }
  }
  close();
}

void Session::drop_unfinished() {
  d.conns.buffered_total -= counted_bytes;
  d.conns.released_since_trim += counted_bytes;
  counted_bytes = 0;
  frame_started_ns = 0;
  decoder = wire::FrameDecoder(decoder.max_frame());
}

void Session::send(const nlohmann::json& msg, std::size_t limit) {
  if (closed) return;
  std::string frame;
  if (!wire::append_frame(msg, frame, limit ? limit : d.opt.max_frame).is_ok()) {
    frame.clear();
    (void)wire::append_frame(
        wire::make_error(msg.value("id", std::uint64_t{0}),
                         Status::internal("reply exceeds the frame size limit")),
        frame, d.opt.max_frame);
  }
  wire::SharedFrame f;
  f.head = std::move(frame);
  send_frame(std::move(f));
}

void Session::send_frame(wire::SharedFrame frame) {
  send_parts(frame.head, frame.shared, frame.tail, &frame);
}

// With nothing queued the frame is written at once, in one non-blocking
// sendmsg, and nothing is built or copied: the daemon sends a rules frame to
// every stage in one step, and an async write chain (or just a frame built)
// per stage cost more than the write itself. What the socket does not take,
// or a failed write, is queued and goes the asynchronous way (errors then
// close the session from the loop, never from inside this call). `owner`,
// when given, is a frame holding these parts, moved into the queue.
void Session::send_parts(std::string_view head, const std::shared_ptr<const std::string>& shared,
                         std::string_view tail, wire::SharedFrame* owner) {
  if (closed) return;
  const std::size_t size = head.size() + (shared ? shared->size() : 0) + tail.size();
  queued_bytes += size;
  std::size_t written = 0;
  if (!writing && outq.empty()) {
    written = write_now(head, shared.get(), tail);
    written_bytes += written;
    if (written == size) return;
  }
  wire::SharedFrame rest;
  if (written > 0) {  // the part the socket did not take, flattened
    std::string all(head);
    if (shared) all += *shared;
    all += tail;
    rest.head = all.substr(written);
  } else if (owner != nullptr) {
    rest = std::move(*owner);
  } else {
    rest.head.assign(head);
    rest.shared = shared;
    rest.tail.assign(tail);
  }
  out_bytes += rest.size();
  outq.push_back(std::move(rest));
  if (out_bytes > kMaxQueuedBytes) {
    d.peer_log(spdlog::level::warn, "slow_reader",
               "session {}: peer does not read ({} bytes queued); closing", sid, out_bytes);
    close();
    return;
  }
  if (!writing) do_write();
}

std::size_t Session::write_now(std::string_view head, const std::string* shared,
                               std::string_view tail) {
  std::array<iovec, 3> iov{};
  std::size_t cnt = 0;
  auto add = [&](std::string_view part) {
    if (part.empty()) return;
    iov[cnt].iov_base = const_cast<char*>(part.data());
    iov[cnt].iov_len = part.size();
    ++cnt;
  };
  add(head);
  if (shared) add(*shared);
  add(tail);
  msghdr mh{};
  mh.msg_iov = iov.data();
  mh.msg_iovlen = cnt;
  for (;;) {
    ssize_t n = ::sendmsg(sock.native_handle(), &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno != EINTR) return 0;
  }
}

void Session::do_write() {
  if (closed || outq.empty()) {
    writing = false;
    return;
  }
  writing = true;
  auto self = shared_from_this();
  const wire::SharedFrame& f = outq.front();
  std::array<asio::const_buffer, 3> bufs = {
      asio::buffer(f.head), f.shared ? asio::buffer(*f.shared) : asio::const_buffer(),
      asio::buffer(f.tail)};
  asio::async_write(sock, bufs, [self](boost::system::error_code ec, std::size_t) {
    if (self->closed) return;
    if (ec) {
      self->close();
      return;
    }
    self->out_bytes -= self->outq.front().size();
    self->written_bytes += self->outq.front().size();
    self->outq.pop_front();
    if (self->outq.empty()) {
      self->writing = false;
      if (self->close_after_write) self->close();
      return;
    }
    self->do_write();
  });
}

void Session::close() {
  if (closed) return;
  closed = true;
  drop_offered_fd();
  drop_unfinished();
  boost::system::error_code ignored;
  sock.shutdown(stream::socket::shutdown_both, ignored);
  sock.close(ignored);
  d.on_closed(*this);
}

}  // namespace sluice::control
