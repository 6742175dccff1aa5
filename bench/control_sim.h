// Simulated stages for the control plane's benches (sluice-bench-control): real
// sluice::Stages, each with its own connection to a daemon speaking the real protocol
// (hello with its board, collect answers, rules applied with Stage::apply and acked), served
// by a few worker threads with an epoll set each, so that N stages make progress as if
// each were its own process on a machine with that many cores. bench_control.cc says why
// they are driven this way and what it measures with them.
//
// Thread safety: Driver::start, wait, stop and merged from one thread; the workers own
// their stages' connections while they run; `record` may be flipped from any thread.
// Probe runs its own thread over the stages' enforce path (thread-safe by Stage's
// contract).
#pragma once

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "control_observer.h"
#include "sluice/board.h"
#include "sluice/stage.h"
#include "sluice/stage_fast.h"
#include "sluice/wire.h"

namespace sluice::bench {

namespace wire = sluice::wire;
using json = nlohmann::json;

struct Sim {
  int index = 0;  // sim-<index>
  int fd = -1;
  std::unique_ptr<sluice::Stage> stage;
  // The probe's (see Probe): board writes it saw this stage take so far.
  std::uint64_t probe_seen = 0;
  std::atomic<bool> board_mapped{false};  // the daemon said so in its hello ack
  wire::FrameDecoder decoder;
  std::atomic<bool> acked{false};
  std::atomic<std::uint64_t> rules_applied{0};
  // As ControlClient: a stats answer carries the description only when its
  // rules version moved since the last one sent (the hello sends none).
  bool info_sent = false;
  std::uint64_t info_version_sent = 0;
};

// One rules message as a simulated stage saw it (steady clock, ns).
struct Record {
  int index = 0;              // the stage
  std::int64_t decided = 0;   // the daemon's decision (decided_ns)
  std::int64_t received = 0;  // epoll_wait returned with it readable
  std::int64_t started = 0;   // its worker started on it (before parsing)
  std::int64_t parsed = 0;    // wire::parse_message done
  std::int64_t applied = 0;   // Stage::apply done
  std::int64_t acked = 0;     // the ack written
};

// What one worker recorded.
struct Samples {
  std::vector<Record> records;
  std::uint64_t errors = 0;
  // CPU time of the worker's wake-ups that served rules messages and nothing
  // else: the epoll_wait that returned, the reads, the applies and the acks.
  std::int64_t rules_cpu_ns = 0;
};

// The probe (--probe-us US, configure runs only): an application thread of
// the stages' process. From the first policy change on, it sweeps every stage
// with a one-byte request (which the drl's rate never delays) and notes, per
// stage, when a request found a board write the stage had not taken yet and
// took it: the first request enforced under the new values, an upper bound
// on when the change was in effect there (by up to a sweep, ~10 us for 100
// stages). With --probe-us 0 it sweeps without pause, a thread that is always
// running; US > 0 sleeps that long between sweeps, an application issuing a
// request that often. Off by default, because on a machine with fewer CPUs
// than it, the daemon and the stages' threads need, it changes what it
// measures: spinning, it holds a CPU, and the daemon, sharing the other with
// the stages' threads, decided and then waited 1-4 ms to run in 3 of 60
// changes (sluice-bench-control --records on 2 vCPUs; none in 60 without
// the probe); sleeping, its own late wake-ups set what it reports.
struct ProbeSample {
  int index;
  std::int64_t at;
};
class Probe {
 public:
  Probe(std::vector<std::unique_ptr<Sim>>& sims, int sleep_us) : sims_(sims), sleep_us_(sleep_us) {
    samples_.reserve(1 << 16);
    for (auto& s : sims_) s->probe_seen = s->stage->board_updates();
  }
  void start() {
    thread_ = std::thread([this] { run(); });
  }
  // Stops and joins; then samples() may be read.
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  ~Probe() { stop(); }
  const std::vector<ProbeSample>& samples() const { return samples_; }
  double cpu_pct() const { return cpu_pct_; }

 private:
  void run() {
    sluice::Context ctx;
    ctx.size = 1;
    const std::int64_t cpu0 = thread_cpu_now_ns(), wall0 = now_ns();
    while (!stop_.load(std::memory_order_relaxed)) {
      for (auto& s : sims_) {
        (void)sluice::fast::enforce(*s->stage, ctx);
        const std::uint64_t n = s->stage->board_updates();
        if (n != s->probe_seen) {
          s->probe_seen = n;
          if (samples_.size() < samples_.capacity()) samples_.push_back({s->index, now_ns()});
        }
      }
      if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    }
    const std::int64_t wall = now_ns() - wall0;
    if (wall > 0) cpu_pct_ = 100.0 * static_cast<double>(thread_cpu_now_ns() - cpu0) / wall;
  }
  std::vector<std::unique_ptr<Sim>>& sims_;
  const int sleep_us_;
  std::vector<ProbeSample> samples_;
  double cpu_pct_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// One thread serving a fixed share of the stages through its own epoll set.
struct Worker {
  std::vector<Sim*> sims;
  int epfd = -1;
  Samples samples;
  std::thread thread;
};

class Driver {
 public:
  std::vector<std::unique_ptr<Sim>> sims;
  std::atomic<bool> record{false};
  // --change floor: rules messages are answered without being applied.
  bool floor = false;
  // Stages hand their boards over with their hellos (sluice/board.h), as
  // ControlClient does; --change configure-messages runs them without.
  bool boards = true;

  ~Driver() {
    stop();
    for (auto& w : workers_) {
      if (w.epfd >= 0) ::close(w.epfd);
    }
    for (auto& s : sims) {
      if (s->fd >= 0) ::close(s->fd);
    }
  }

  // Connects n stages, says hello for each and starts `threads` workers,
  // each with room for `records` records (growing the vector on a worker's
  // path, page faults and all, showed in the tail).
  bool start(const std::string& socket, int n, unsigned threads, std::size_t records) {
    for (int i = 0; i < n; ++i) {
      auto s = std::make_unique<Sim>();
      s->index = i;
      sluice::StageOptions o;
      o.name = "sim-" + std::to_string(i);
      auto st = sluice::Stage::create(o);
      if (!st) return false;
      s->stage = std::move(*st);
      s->fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (s->fd < 0) return false;
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::memcpy(addr.sun_path, socket.data(), socket.size());
      if (::connect(s->fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return false;
      sims.push_back(std::move(s));
      Sim& sim = *sims.back();
      json hello = {{"name", o.name}, {"pid", ::getpid()}, {"protocol", 1}};
      int board = -1;
      if (boards) {
        auto b = sim.stage->board();
        if (!b) return false;
        board = *b;
        hello["board"] = wire::board_offer();
      }
      const std::string frame =
          wire::encode_frame(wire::make_message(wire::Type::kHello, 1, hello));
      if (board >= 0) {  // a fresh socket takes a hello whole
        if (sluice::send_with_fd(sim.fd, frame.data(), frame.size(), board) !=
            static_cast<long>(frame.size())) {
          return false;
        }
      } else {
        send_bytes(sim, frame, hello_errors_);
      }
    }
    threads = std::max(1u, std::min(threads, static_cast<unsigned>(sims.size())));
    workers_ = std::vector<Worker>(threads);
    for (auto& w : workers_) w.samples.records.reserve(records);
    for (std::size_t i = 0; i < sims.size(); ++i)
      workers_[i % threads].sims.push_back(sims[i].get());
    for (auto& w : workers_) {
      w.epfd = ::epoll_create1(EPOLL_CLOEXEC);
      if (w.epfd < 0) return false;
      for (Sim* s : w.sims) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.ptr = s;
        if (::epoll_ctl(w.epfd, EPOLL_CTL_ADD, s->fd, &ev) != 0) return false;
      }
    }
    for (auto& w : workers_) w.thread = std::thread([this, &w] { serve(w); });
    return true;
  }

  // Waits (the workers serve the daemon meanwhile) until `done()` or the
  // budget runs out; false on timeout.
  template <typename Pred>
  bool wait(std::chrono::milliseconds budget, Pred done) {
    auto deadline = SteadyClock::now() + budget;
    while (!done()) {
      if (SteadyClock::now() >= deadline) return false;
      // Not 1 ms: each wake-up of this thread preempts the daemon or a worker.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

  // Stops and joins the workers; then their samples may be read.
  void stop() {
    stopping_.store(true);
    for (auto& w : workers_) {
      if (w.thread.joinable()) w.thread.join();
    }
  }

  Samples merged() const {
    Samples all;
    all.errors = hello_errors_;
    for (const auto& w : workers_) {
      const Samples& s = w.samples;
      all.records.insert(all.records.end(), s.records.begin(), s.records.end());
      all.errors += s.errors;
      all.rules_cpu_ns += s.rules_cpu_ns;
    }
    return all;
  }

 private:
  std::vector<Worker> workers_;
  std::atomic<bool> stopping_{false};
  std::uint64_t hello_errors_ = 0;

  static void send(Sim& s, const json& msg, std::uint64_t& errors) {
    send_bytes(s, wire::encode_frame(msg), errors);
  }

  static void send_bytes(Sim& s, const std::string& f, std::uint64_t& errors) {
    std::size_t done = 0;
    while (done < f.size()) {
      ssize_t n = ::send(s.fd, f.data() + done, f.size() - done, MSG_NOSIGNAL);
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        ++errors;
        return;
      }
      done += static_cast<std::size_t>(n);
    }
  }

  // What ControlClient does with one message, timed. Returns its type.
  wire::Type handle(Sim& s, const std::string& payload, std::int64_t received_ns, Samples& out) {
    const std::int64_t started = now_ns();
    // The floor's stages answer a rules frame without Sluice's parser: its id
    // and time from the head the stand-in daemon wrote (write_rules_frame_head).
    long long decided = 0;
    unsigned long long rules_id = 0;
    if (floor && std::sscanf(payload.c_str(), R"({"decided_ns":%lld,"id":%llu,"type":"rules")",
                             &decided, &rules_id) == 2) {
      answer_rules(s, rules_id, decided, sluice::Status::ok(), received_ns, started, now_ns(), out);
      return wire::Type::kRules;
    }
    auto m = wire::parse_message(payload);
    const std::int64_t parsed = now_ns();
    if (!m) {
      ++out.errors;
      return wire::Type::kError;
    }
    switch (m->type) {
      case wire::Type::kAck: {
        auto b = m->body.find("board");
        s.board_mapped.store(b != m->body.end() && b->is_boolean() && b->get<bool>());
        s.acked.store(true);
        break;
      }
      case wire::Type::kRules:
        if (auto rules = wire::read_rules(*m)) {
          answer_rules(s, rules->id, rules->decided_ns, s.stage->apply(*rules->rules), received_ns,
                       started, parsed, out);
        }
        break;
      case wire::Type::kCollect: {
        json body = json::object();
        to_json(body["stats"], s.stage->collect());
        if (!s.info_sent || s.stage->rules_version() != s.info_version_sent) {
          sluice::StageInfo info = s.stage->info();
          s.info_sent = true;
          s.info_version_sent = info.rules_version;
          to_json(body["info"], info);
        }
        send(s, wire::make_message(wire::Type::kStats, m->id, std::move(body)), out.errors);
        break;
      }
      default:
        break;
    }
    return m->type;
  }

  // A rules message's answer, as ControlClient sends it, and its record.
  void answer_rules(Sim& s, std::uint64_t id, std::int64_t decided, const sluice::Status& st,
                    std::int64_t received, std::int64_t started, std::int64_t parsed,
                    Samples& out) {
    const std::int64_t applied = now_ns();
    if (!st.is_ok()) {
      ++out.errors;
      send(s, wire::make_error(id, st), out.errors);
      return;
    }
    s.rules_applied.fetch_add(1);
    std::string ack;
    wire::append_rules_ack_frame(id, s.stage->rules_version(), ack);
    send_bytes(s, ack, out.errors);
    if (record.load(std::memory_order_relaxed)) {
      out.records.push_back(Record{s.index, decided, received, started, parsed, applied, now_ns()});
    }
  }

  void serve(Worker& w) {
    std::vector<epoll_event> events(std::min<std::size_t>(w.sims.size(), 256));
    std::vector<Sim*> ready;
    char buf[64 * 1024];
    std::string payload;
    while (!stopping_.load(std::memory_order_relaxed)) {
      const std::int64_t cpu0 = thread_cpu_now_ns();
      int r = ::epoll_wait(w.epfd, events.data(), static_cast<int>(events.size()), 20);
      if (r <= 0) continue;
      // Read everything that arrived first (stamping its arrival), then serve
      // it, so that one stage's work does not delay another's arrival time.
      const std::int64_t received = now_ns();
      ready.clear();
      for (int i = 0; i < r; ++i) {
        Sim* s = static_cast<Sim*>(events[static_cast<std::size_t>(i)].data.ptr);
        // One recv per readiness, as ControlClient does after poll(): a
        // second one would only return EAGAIN (a syscall per stage per
        // message); what a full buffer leaves, level-triggered epoll reports.
        ssize_t n;
        while ((n = ::recv(s->fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
          s->decoder.feed(buf, static_cast<std::size_t>(n));
          if (static_cast<std::size_t>(n) < sizeof(buf)) break;
        }
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          // The daemon closed (or reset) this stage's connection: stop
          // watching it, or level-triggered epoll would report it forever.
          ::epoll_ctl(w.epfd, EPOLL_CTL_DEL, s->fd, nullptr);
        }
        ready.push_back(s);
      }
      bool rules = false, other = false;
      for (Sim* s : ready) {
        sluice::Status err;
        while (s->decoder.next(&payload, &err) == wire::FrameDecoder::Result::kFrame) {
          (handle(*s, payload, received, w.samples) == wire::Type::kRules ? rules : other) = true;
        }
      }
      if (rules && !other && record.load(std::memory_order_relaxed)) {
        w.samples.rules_cpu_ns += thread_cpu_now_ns() - cpu0;
      }
    }
  }
};

}  // namespace sluice::bench
