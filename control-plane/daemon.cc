// The daemon's lifecycle (daemon.h): creating it (options checked, the policy
// loaded, the report log opened, limits set, the socket bound), running its
// event loop, stopping it, reloading the policy on SIGHUP or request, and what
// every part does when a session closes. The parts are in daemon_impl.h.
#include <sys/stat.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "daemon_impl.h"

namespace sluice::control {

std::string default_socket_path() {
  if (const char* s = std::getenv("SLUICE_SOCKET"); s && *s) return s;
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x) {
    return std::string(x) + "/sluice.sock";
  }
  return "/tmp/sluice-" + std::to_string(::getuid()) + ".sock";
}

Daemon::Impl::Impl(DaemonOptions o)
    : opt(std::move(o)),
      observer(opt.observer),
      signals(io),
      conns(*this),
      stages(*this),
      rounds(*this),
      step(*this),
      requests(*this) {}

void Daemon::Impl::on_closed(Session& s) {
  std::shared_ptr<Session> keep;  // s stays alive until every part is done with it
  if (auto it = conns.sessions.find(s.sid); it != conns.sessions.end()) keep = it->second;
  conns.on_closed(s);
  if (s.is_stage) stages.on_closed(s);
  rounds.on_closed(s);
  step.on_closed(s);
  requests.on_closed(s);
}

void Daemon::Impl::reload() {
  if (opt.policy_file.empty()) {
    spdlog::info("no policy file to reload");
    return;
  }
  auto d = load_policy_file(opt.policy_file);
  Status st = d ? step.install(std::move(*d), opt.policy_file) : d.status();
  if (!st.is_ok()) spdlog::error("reload failed; keeping the current policy: {}", st.message());
}

void Daemon::Impl::wait_signal() {
  signals.async_wait([this](boost::system::error_code ec, int sig) {
    if (ec || stopped) return;
    if (sig == SIGHUP) {
      reload();
      wait_signal();
    } else {
      spdlog::info("signal {}: shutting down", sig);
      shutdown();
    }
  });
}

void Daemon::Impl::shutdown() {
  if (stopped) return;
  stopped = true;
  boost::system::error_code ignored;
  conns.acceptor.close(ignored);
  rounds.tick_timer.cancel();
  rounds.round_timer.cancel();
  conns.sweep_timer.cancel();
  conns.accept_timer.cancel();
  signals.cancel(ignored);
  auto all = conns.sessions;
  for (auto& [id, s] : all) s->close();
  io.stop();
}

// ---------------------------------------------------------------------------

StatusOr<std::unique_ptr<Daemon>> Daemon::create(DaemonOptions options) {
  if (options.max_missed < 1) return Status::invalid("max_missed: must be >= 1");
  if (options.interval_ms && (*options.interval_ms < 1 || *options.interval_ms > kMaxIntervalMs)) {
    return Status::invalid("interval: must be 1.." + std::to_string(kMaxIntervalMs) + " ms");
  }
  if (options.max_frame < 1024) return Status::invalid("max_frame: must be >= 1024 bytes");
  if (options.max_connections < 1) return Status::invalid("max_connections: must be >= 1");
  if (options.handshake_timeout.count() < 1 || options.frame_timeout.count() < 1 ||
      options.idle_timeout.count() < 0) {
    return Status::invalid(
        "timeouts: the handshake and frame timeouts must be >= 1 ms, the idle timeout >= 0");
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  const DaemonOptions& opt = impl->opt;
  PolicyDoc doc;
  std::string source = "default";
  if (!opt.policy_file.empty()) {
    auto d = load_policy_file(opt.policy_file);
    if (!d) return d.status();
    doc = std::move(*d);
    source = opt.policy_file;
  } else if (!opt.policy_doc.is_null()) {
    auto d = parse_policy_doc(opt.policy_doc, false);
    if (!d) return d.status();
    doc = std::move(*d);
    source = "options";
  }
  SLUICE_RETURN_IF_ERROR(impl->step.install(std::move(doc), source));
  if (!opt.report_log.empty()) {
    impl->step.report_log.reset(std::fopen(opt.report_log.c_str(), "ae"));
    if (!impl->step.report_log) {
      return Status::io_error("report log " + opt.report_log + ": " + std::strerror(errno));
    }
  }
  impl->conns.setup();
  SLUICE_RETURN_IF_ERROR(impl->conns.bind_socket());
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Daemon::~Daemon() {
  if (impl_) impl_->conns.unlink_socket();
}

Status Daemon::run() {
  Impl& d = *impl_;
  if (d.opt.handle_signals) {
    boost::system::error_code ec;
    d.signals.add(SIGHUP, ec);
    d.signals.add(SIGINT, ec);
    d.signals.add(SIGTERM, ec);
    d.wait_signal();
  }
  d.started_ns = now_ns();
  d.conns.start_accept();
  d.conns.schedule_sweep();
  d.rounds.start();
  spdlog::info("serving on {}", d.opt.socket_path);
  try {
    d.io.run();
  } catch (const std::exception& e) {
    return Status::internal(std::string("event loop: ") + e.what());
  }
  d.conns.unlink_socket();
  return Status::ok();
}

void Daemon::stop() {
  asio::post(impl_->io, [d = impl_.get()] { d->shutdown(); });
}

void Daemon::request_reload() {
  asio::post(impl_->io, [d = impl_.get()] { d->reload(); });
}

}  // namespace sluice::control
