// Limits on connections (docs/protocol.md "Limits"): who may connect, the
// connection limit fitted to the descriptor limit with a reserve for
// administrators, eviction of silent and idle connections to make room, the
// budget on bytes held in unfinished frames, and the handshake, frame and
// idle timeouts.
#include <fcntl.h>
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>

#include "daemon_impl.h"

namespace sluice::control {

void Connections::setup() {
  const DaemonOptions& opt = d.opt;
  access.daemon_uid = ::geteuid();
  access.admin_uids = opt.admin_uids;
  access.allow_uids = opt.allow_uids;
  // Connections come and go with stages: a burst of them says little, and
  // the lines still go at ten a second.
  d.logs.set_limit("stage_connected", {10.0, 200.0});
  d.logs.set_limit("stage_disconnected", {10.0, 200.0});
  // The soft descriptor limit raised to the hard one; the connection limit
  // fitted below it.
  rlimit rl{};
  std::size_t descriptors = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    constexpr rlim_t kMost = rlim_t{1} << 20;
    const rlim_t want = std::min(rl.rlim_max, kMost);
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
      rlimit up = rl;
      up.rlim_cur = want;
      if (::setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
    }
    descriptors = rl.rlim_cur == RLIM_INFINITY ? kMost : static_cast<std::size_t>(rl.rlim_cur);
  }
  const std::size_t room = descriptors > kReservedDescriptors + kAdminReserve + 8
                               ? descriptors - kReservedDescriptors - kAdminReserve
                               : 8;
  limit = std::min(opt.max_connections, room);
  if (limit < opt.max_connections) {
    spdlog::info("connection limit lowered from {} to {} by the descriptor limit ({})",
                 opt.max_connections, limit, descriptors);
  }
  buffer_budget = std::max(opt.max_buffered, opt.max_frame + rbuf.size());
  spare.fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

bool Connections::make_room(Session& s) {
  while (sessions.size() > limit && evict_one(s.sid)) {
  }
  if (sessions.size() <= limit ||
      (access.is_admin(s.cred.uid) && sessions.size() <= limit + kAdminReserve)) {
    return true;
  }
  ++counts.refused_full;
  d.peer_log(spdlog::level::warn, "connection_limit",
             "session {}: refusing uid {} pid {}: {} connections open (limit {}), none to close",
             s.sid, s.cred.uid, s.cred.pid, sessions.size() - 1, limit);
  s.refuse(Status::unavailable("the daemon is at its connection limit (" + std::to_string(limit) +
                               "); try again later"));
  return false;
}

bool Connections::evict_one(std::uint64_t keep) {
  std::shared_ptr<Session> victim;
  for (std::uint64_t sid : silent) {
    if (sid == keep) continue;
    if (auto it = sessions.find(sid); it != sessions.end()) {
      victim = it->second;
      break;
    }
  }
  if (!victim) {
    for (auto& [sid, x] : sessions) {
      if (sid == keep || x->closed || x->is_stage || x->awaiting > 0 || x->counted_bytes > 0 ||
          !x->outq.empty()) {
        continue;
      }
      if (!victim || x->last_frame_ns < victim->last_frame_ns) victim = x;
    }
  }
  if (!victim) return false;
  ++counts.evicted;
  d.peer_log(spdlog::level::warn, "evicted",
             "session {} (uid {} pid {}): closed to make room for a newer connection ({} open)",
             victim->sid, victim->cred.uid, victim->cred.pid, sessions.size());
  victim->refuse(Status::unavailable(
      "closed to make room for a newer connection: the daemon is at its connection limit (" +
      std::to_string(limit) + ") and this one was " + (victim->said_anything ? "idle" : "silent")));
  return true;
}

void Connections::on_frame(Session& s) {
  s.last_frame_ns = now_ns();
  s.frame_started_ns = 0;
  if (!s.said_anything) {
    s.said_anything = true;
    silent.erase(s.sid);
  }
}

bool Connections::note_unfinished(Session& s) {
  const std::size_t held = s.decoder.buffered();
  if (held < s.counted_bytes) released_since_trim += s.counted_bytes - held;
  buffered_total = buffered_total - s.counted_bytes + held;
  s.counted_bytes = held;
  if (held == 0) {
    s.frame_started_ns = 0;
  } else if (s.frame_started_ns == 0) {
    s.frame_started_ns = now_ns();
  }
  if (buffered_total <= buffer_budget) return true;
  // Over the budget: the oldest unfinished frames go, clients' first (a
  // frame's bytes arrive in microseconds over a local socket; the oldest
  // are the stalled ones).
  std::vector<std::shared_ptr<Session>> holders;
  for (auto& [sid, x] : sessions) {
    if (x.get() != &s && x->counted_bytes > 0 && !x->closed) holders.push_back(x);
  }
  std::sort(holders.begin(), holders.end(), [](const auto& a, const auto& b) {
    return std::pair(a->is_stage, a->frame_started_ns) <
           std::pair(b->is_stage, b->frame_started_ns);
  });
  holders.push_back(s.shared_from_this());  // last: it alone never exceeds the budget
  for (auto& x : holders) {
    if (buffered_total <= buffer_budget) break;
    ++counts.over_budget;
    d.peer_log(spdlog::level::warn, "buffer_budget",
               "session {} (uid {} pid {}): closed with {} bytes of an unfinished frame: "
               "unfinished frames hold {} bytes, over the budget of {}",
               x->sid, x->cred.uid, x->cred.pid, x->counted_bytes, buffered_total, buffer_budget);
    x->refuse(Status::unavailable(
        "closed with an unfinished frame: the daemon holds " + std::to_string(buffered_total) +
        " bytes of unfinished frames, over its budget of " + std::to_string(buffer_budget)));
  }
  return !s.closed;
}

void Connections::on_closed(Session& s) {
  sessions.erase(s.sid);
  silent.erase(s.sid);
  ++closed_since_trim;
}

void Connections::schedule_sweep() {
  const DaemonOptions& opt = d.opt;
  std::chrono::milliseconds shortest = std::min(opt.handshake_timeout, opt.frame_timeout);
  if (opt.idle_timeout.count() > 0) shortest = std::min(shortest, opt.idle_timeout);
  const auto period =
      std::clamp(shortest / 4, std::chrono::milliseconds(5), std::chrono::milliseconds(1000));
  sweep_timer.expires_after(period);
  sweep_timer.async_wait([this](boost::system::error_code ec) {
    if (ec || d.stopped) return;
    sweep();
    schedule_sweep();
  });
}

void Connections::sweep() {
  const DaemonOptions& opt = d.opt;
  const std::int64_t now = now_ns();
  const std::int64_t handshake = ns_of(opt.handshake_timeout);
  const std::int64_t frame = ns_of(opt.frame_timeout);
  const std::int64_t idle = ns_of(opt.idle_timeout);
  std::vector<std::pair<std::shared_ptr<Session>, std::string>> expired;
  for (auto& [sid, s] : sessions) {
    if (s->closed || s->close_after_write) continue;
    if (!s->said_anything && now - s->accepted_ns > handshake) {
      expired.emplace_back(s, "no complete request within " +
                                  std::to_string(opt.handshake_timeout.count()) +
                                  " ms of connecting");
    } else if (s->frame_started_ns != 0 && now - s->frame_started_ns > frame) {
      expired.emplace_back(s, "a frame unfinished after " +
                                  std::to_string(opt.frame_timeout.count()) + " ms (" +
                                  std::to_string(s->decoder.buffered()) + " bytes received)");
    } else if (!s->is_stage && idle > 0 && s->awaiting == 0 && s->outq.empty() &&
               now - s->last_frame_ns > idle) {
      expired.emplace_back(s, "no request for " + std::to_string(opt.idle_timeout.count()) + " ms");
    }
  }
  for (auto& [s, why] : expired) {
    ++counts.timed_out;
    d.peer_log(spdlog::level::info, "timeout", "session {} (uid {} pid {}): {}; closing", s->sid,
               s->cred.uid, s->cred.pid, why);
    s->refuse(Status::unavailable(why + "; closing the connection"));
  }
  for (const auto& [kind, n] : d.logs.take_summaries(now)) {
    spdlog::warn("{} more '{}' messages suppressed", n, kind);
  }
  // Memory freed by many closed connections or large frames goes back to the
  // system rather than staying at its peak.
  if (closed_since_trim >= 64 || released_since_trim >= (8u << 20)) {
    ::malloc_trim(0);
    closed_since_trim = 0;
    released_since_trim = 0;
  }
}

nlohmann::json Connections::metrics() const {
  return {{"open", sessions.size()},
          {"limit", limit},
          {"admin_reserve", kAdminReserve},
          {"unfinished_frame_bytes", buffered_total},
          {"unfinished_frame_budget", buffer_budget},
          {"evicted", counts.evicted},
          {"refused_full", counts.refused_full},
          {"refused_uid", counts.refused_uid},
          {"denied", counts.denied},
          {"timed_out", counts.timed_out},
          {"over_budget", counts.over_budget},
          {"accept_errors", counts.accept_errors}};
}

}  // namespace sluice::control
