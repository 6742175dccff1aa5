// sluice-bench-control: the control plane's cost and latency.
//
// For N simulated stages (10, 100, 1000) collected at 1 Hz and 10 Hz:
//  - daemon CPU: utime+stime of the daemon process (/proc/PID/stat) over a
//    collect-only phase, as % of one core;
//  - collect round time: collect sent to every stage -> last answer, as the
//    daemon's observer is told, p50/p99 over the rounds up to the end of the
//    collect-only phase;
//  - rule propagation: policy decision (the daemon's `decided_ns`, on the
//    machine's monotonic clock) -> the rules applied in the stage, p50/p99;
//    with its two parts: delivery (decision -> the frame read by the stage)
//    and apply (Stage::apply alone). Delivery and apply are further split per
//    rules message (phases_us in the JSON line): daemon_written (decision ->
//    the daemon's write of this stage's frame returned; the bench's observer
//    of the daemon notes it in memory shared with the bench), wake_read (->
//    the stage's epoll_wait returned with it), queue (-> its worker started
//    on it, after other stages that woke with it),
//    parse (wire::parse_message), apply, ack (building and writing the
//    ack).
//    daemon_send_us holds the daemon's side of each step, timed by the
//    bench's DaemonObserver on the daemon's loop thread: rules_build_us
//    (decision -> every frame written, less the writes), rules_write_us (the
//    writes alone), rules_send_us (decision -> the last frame written),
//    rules_send_preemptions (involuntary context switches of the loop thread
//    while it wrote them), rules_cpu_us (its CPU time from the decision to
//    the last answer) and board_us (decision -> the last board written);
//    stage_cpu_us_per_change is the simulated stages' CPU time per change
//    (the workers' wake-ups that served rules messages only: epoll_wait,
//    reads, applies, acks). On a machine with fewer cores than the daemon
//    and the workers need, propagation is bounded by these two.
//    Two kinds of change (--change):
//    "configure", a new rate for each stage's drl object (what the silk and
//    maxmin policies send every cycle), and "layout", a static policy batch
//    that removes and recreates each stage's channel and object. A third,
//    "floor", measures the same as "layout" with no Sluice code on either
//    side of the socket (see floor_daemon): this machine's own floor for a
//    change, which Sluice's figures are read against.
//
// The daemon is the real one (control-plane/daemon.h) in a child process. The
// stages live in this process: each is a real sluice::Stage with its own
// connection speaking the real protocol (every message is parsed with
// wire::parse_message and applied with Stage::apply, as ControlClient does).
//
// How the stages are driven, and why: in production every stage is its own
// process with its own connection thread, so N stages parse and apply a rules
// message in parallel, limited only by the machine's cores. One thread per
// simulated stage (1000 threads) would measure the scheduler, not the control
// plane; one thread for all of them serialises them, so the N-th stage's
// rules wait for N-1 other stages' parsing and applying, a queue that no
// deployment has. The driver therefore runs
// `--threads` workers (default: std::thread::hardware_concurrency()), each
// with its own epoll set over a fixed share of the stages: as many stages
// make progress at once as the machine has cores, which is what separate
// processes would get. On a machine with fewer cores than the daemon plus
// the workers need, the daemon and the workers compete for the CPU: that is
// part of what is measured, and why the machine's load matters. The driver's
// own main thread checks for progress every 10 ms: checking every millisecond,
// each wake-up would preempt the daemon or a worker (perf sched timehist shows
// it), and the bench would measure some of its own polling.
//
// How a 2-vCPU machine schedules a change (--records timelines, perf sched):
// the kernel queues a worker woken by the daemon's write on the daemon's vCPU
// (a sync wake-up) even with the other vCPU idle; a woken thread whose
// previous CPU was the waker's lands there in nearly every wake-up, for
// socket and eventfd wake-ups alike. A change then often runs daemon, worker,
// worker one after the other on one vCPU, and a worker's 50 stages start only
// when the daemon lets go of the CPU, which is why the daemon yields after a
// step's last frame.
//
// Host steal (bench/host_steal.h): the share of the machine's CPU time the hypervisor
// gave to other guests, over the collect-only phase (collect_host_steal_pct) and over
// the rule changes (host_steal_pct). A stage whose vCPU is not running reads its frame
// late whatever the control plane does; on a shared VM that sets the tail.
//
// Output: one JSON line per run, then a table of min/median/max over runs.
// Exit status 1 when a run failed, saw errors or took no propagation sample.
// With --max-steal P --attempts K, a run whose rule changes the host stole more
// than P% from is repeated (up to K runs in all); every attempt prints its
// line (attempt, quiet) and the table takes each run's last attempt.
// With --records PATH, every rules message a stage applied is appended to PATH
// as one JSON line (its stage and worker, and the clock stamps above), and
// every board the daemon wrote (its "board_written" stamp), for timelines of
// each change: which stages waited, and for what.
//   sluice-bench-control [--quick] [--runs N] [--seconds S] [--stages 10,100,1000]
//                        [--hz 1,10] [--threads T] [--json PATH] [--records PATH]
#include <signal.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "client.h"
#include "control_rules.h"
#include "daemon.h"
#include "daemon_observer.h"
#include "host_steal.h"
#include "sluice/objects/builtin.h"
#include "sluice/stage.h"
#include "sluice/wire.h"
#include "support/cli.h"
#include "support/percentile.h"

namespace {

using nlohmann::json;
using sluice::bench::percentile;
namespace wire = sluice::wire;
using SteadyClock = std::chrono::steady_clock;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch())
      .count();
}

json batch(double rate) {
  return sluice::bench::drl_layout_batch(rate);
}

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

// CPU time the calling thread has used (ns).
std::int64_t thread_cpu_now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// The daemon's side, written by the bench's observer of the daemon into
// memory shared with the (forked) daemon: when each stage's frame left the
// daemon, or its board was written.
struct Written {
  std::int32_t index;
  std::int64_t decided;
  std::int64_t written;
};
struct WrittenLog {
  static constexpr std::uint32_t kCapacity = 1u << 16;
  std::atomic<std::uint32_t> count{0};
  Written entries[kCapacity];

  // Notes that the frame of `stage` ("sim-<index>") for the decision
  // `decided` left at `written`. By the one writer, the daemon's process.
  void add(std::string_view stage, std::int64_t decided, std::int64_t written) {
    int index = -1;  // parsed in place: this runs on the daemon's send path
    if (stage.substr(0, 4) == "sim-" &&
        std::from_chars(stage.data() + 4, stage.data() + stage.size(), index).ec != std::errc()) {
      index = -1;
    }
    const std::uint32_t i = count.load(std::memory_order_relaxed);
    if (index < 0 || i >= kCapacity) return;
    entries[i] = Written{index, decided, written};
    count.store(i + 1, std::memory_order_release);
  }
};

// Durations (us) the daemon's observer notes, one per round or step, in
// memory shared with the (forked) daemon.
struct SampleLog {
  static constexpr std::uint32_t kCapacity = 1u << 14;
  std::atomic<std::uint32_t> count{0};
  double values[kCapacity];

  // By the one writer, the daemon's process.
  void add(double v) {
    const std::uint32_t i = count.load(std::memory_order_relaxed);
    if (i >= kCapacity) return;
    values[i] = v;
    count.store(i + 1, std::memory_order_release);
  }
  // The first `n` noted (all of them by default).
  std::vector<double> first(std::uint32_t n = kCapacity) const {
    n = std::min(n, count.load(std::memory_order_acquire));
    return std::vector<double>(values, values + n);
  }
};

// The daemon's logs, in one mapping shared with the (forked) daemon: when
// each stage's rules frame left, when its board was written, how long each
// collect round took, and each step's send, as the daemon_send_us fields name
// them.
struct Logs {
  WrittenLog rules;
  WrittenLog board;
  SampleLog rounds;
  SampleLog build, write, send, preemptions, cpu, boards;
};

// The daemon's observer (sluice/daemon_observer.h), in the daemon's process:
// it reads the clocks and the loop thread's CPU time and context switches
// itself, at the events the daemon tells it of, and notes them in `logs`.
class StepTimer final : public sluice::control::DaemonObserver {
 public:
  explicit StepTimer(Logs* logs) : logs_(logs) {}

  void round_finished(std::int64_t started_ns) override {
    logs_->rounds.add(static_cast<double>(now_ns() - started_ns) / 1e3);
  }
  void step_decided(std::int64_t decided_ns) override {
    decided_ = decided_ns;
    cpu0_ = thread_cpu_now_ns();
    write_ns_ = 0;
    last_board_ = 0;
    first_write_ = true;
  }
  void board_written(std::string_view stage, std::int64_t decided_ns) override {
    const std::int64_t t = now_ns();
    logs_->board.add(stage, decided_ns, t);
    if (decided_ns == decided_) last_board_ = t;
  }
  void rules_writing(std::string_view, std::int64_t) override {
    if (first_write_) {  // preemptions are counted over the writes alone
      first_write_ = false;
      ::getrusage(RUSAGE_THREAD, &ru0_);
    }
    write_start_ = now_ns();
  }
  void rules_written(std::string_view stage, std::int64_t decided_ns) override {
    const std::int64_t t = now_ns();
    write_ns_ += t - write_start_;
    logs_->rules.add(stage, decided_ns, t);
  }
  void step_sent(std::int64_t decided_ns, std::size_t frames) override {
    const std::int64_t t = now_ns();
    if (last_board_ != 0) logs_->boards.add(static_cast<double>(last_board_ - decided_ns) / 1e3);
    if (frames == 0) return;
    rusage ru1{};
    ::getrusage(RUSAGE_THREAD, &ru1);
    const std::int64_t total = t - decided_ns;
    logs_->send.add(static_cast<double>(total) / 1e3);
    logs_->write.add(static_cast<double>(write_ns_) / 1e3);
    logs_->build.add(static_cast<double>(total - write_ns_) / 1e3);
    logs_->preemptions.add(static_cast<double>(ru1.ru_nivcsw - ru0_.ru_nivcsw));
  }
  void step_answered(std::int64_t decided_ns) override {
    if (decided_ns == decided_) {
      logs_->cpu.add(static_cast<double>(thread_cpu_now_ns() - cpu0_) / 1e3);
    }
  }

 private:
  Logs* logs_;
  std::int64_t decided_ = 0, cpu0_ = 0, write_start_ = 0, write_ns_ = 0, last_board_ = 0;
  bool first_write_ = true;
  rusage ru0_{};
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
        (void)s->stage->enforce_context(ctx);
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

double cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  auto close_paren = line.rfind(')');
  if (close_paren == std::string::npos) return 0;
  std::istringstream rest(line.substr(close_paren + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  // Fields after the command: state(3) ... utime(14) stime(15).
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

struct Result {
  int stages = 0, hz = 0, run = 0;
  std::string change;
  double cpu_pct = 0, round_p50 = 0, round_p99 = 0, prop_p50 = 0, prop_p99 = 0;
  // propagation is the change in effect: through the board where the daemon
  // wrote one, else the message applied. message_* is always the latter;
  // probe_* an application thread's first request under the new values.
  double message_p50 = 0, message_p99 = 0, probe_p50 = 0, probe_p99 = 0, probe_cpu_pct = 0;
  std::size_t probe_samples = 0;
  std::uint32_t board_writes = 0;
  int board_stages = 0;
  double deliver_p50 = 0, deliver_p99 = 0, apply_p50 = 0, apply_p99 = 0;
  // Where delivery and propagation go, p50/p99 per phase (us): see phases().
  json phases = json::object();
  json daemon_send = json::object();  // the daemon's own rules_*_us metrics
  std::size_t prop_samples = 0;
  // The simulated stages' CPU time per change (their wake-ups that served
  // rules and nothing else), in microseconds.
  double stage_cpu_us = 0;
  double collect_steal_pct = -1, steal_pct = -1;  // host steal per phase
  std::uint64_t errors = 0;
  bool ok = true;
};

// --change floor: the same messages over the same sockets with no control
// plane behind them, for the kernel's and this machine's share of a change.
// It accepts the stages, acks their hellos, and on every frame from any other
// connection (the bench's trigger) writes, at its next tick of `interval_ms`
// (the daemon's changes leave at its ticks, after the machine sat idle), a
// layout swap's rules frame to every stage at once, in name order, as the
// daemon does (head, shared batch and brace in one sendmsg; then one
// sched_yield), and reads their acks (one recv per readiness). The workers
// answer without applying. What the real runs add to this is Sluice's own
// cost: daemon and stage code, and the collect round before each change.
[[noreturn]] void floor_daemon(const std::string& sock, int interval_ms, WrittenLog* log) {
  const int lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, sock.data(), sock.size());
  if (lfd < 0 || ::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(lfd, 1024) != 0) {
    ::_exit(1);
  }
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  auto watch = [ep](int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  };
  watch(lfd);
  struct Peer {
    wire::FrameDecoder decoder;
    std::string stage;  // empty: not a stage
    std::uint64_t next_id = 1;
  };
  std::map<int, Peer> peers;
  std::map<std::string, int> stages;  // by name, as the daemon's map
  const auto text =
      std::make_shared<const std::string>(wire::dump(sluice::bench::drl_replacing_batch(1e12)));
  // Small frames: never partial here.
  auto send_all = [](int fd, std::string_view head, std::string_view body = {},
                     std::string_view tail = {}) {
    iovec iov[3] = {{const_cast<char*>(head.data()), head.size()},
                    {const_cast<char*>(body.data()), body.size()},
                    {const_cast<char*>(tail.data()), tail.size()}};
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = 3;
    (void)::sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
  };
  auto rules_to = [&](int fd, Peer& p, std::int64_t decided) {
    char head[wire::kRulesFrameHeadMax];
    const std::size_t n = wire::write_rules_frame_head(p.next_id++, decided, text->size(), head);
    send_all(fd, std::string_view(head, n), *text, "}");
  };
  std::vector<epoll_event> events(256);
  char buf[64 * 1024];
  std::string payload;
  const std::int64_t interval_ns = std::int64_t{interval_ms} * 1'000'000;
  const std::int64_t start = now_ns();
  std::int64_t due = -1;  // the pending change's tick, -1: none
  for (;;) {
    int timeout = -1;
    if (due >= 0) {  // rounded up: sleep to the tick rather than spin the last millisecond
      timeout = static_cast<int>((std::max<std::int64_t>(0, due - now_ns()) + 999'999) / 1'000'000);
    }
    const int r = ::epoll_wait(ep, events.data(), static_cast<int>(events.size()), timeout);
    if (due >= 0 && now_ns() >= due) {  // the tick: one change to every stage
      due = -1;
      const std::int64_t decided = now_ns();
      for (const auto& [name, sfd] : stages) {
        rules_to(sfd, peers[sfd], decided);
        log->add(name, decided, now_ns());
      }
      ::sched_yield();
    }
    for (int i = 0; i < r; ++i) {
      const int fd = events[static_cast<std::size_t>(i)].data.fd;
      if (fd == lfd) {
        int c;
        while ((c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC)) >= 0) {
          peers.try_emplace(c);
          watch(c);
        }
        continue;
      }
      Peer& p = peers[fd];
      const ssize_t got = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
        ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
        ::close(fd);
        if (!p.stage.empty()) stages.erase(p.stage);
        peers.erase(fd);
        continue;
      }
      if (got < 0) continue;
      p.decoder.feed(buf, static_cast<std::size_t>(got));
      sluice::Status err;
      while (p.decoder.next(&payload, &err) == wire::FrameDecoder::Result::kFrame) {
        if (!p.stage.empty()) continue;  // a stage's ack: read, nothing more
        auto m = wire::parse_message(payload);
        if (m && m->type == wire::Type::kHello) {
          p.stage = m->body.value("name", std::string());
          stages[p.stage] = fd;
          std::string out = wire::encode_frame(wire::make_ack(m->id));
          send_all(fd, out);
          rules_to(fd, p, now_ns());  // its first rules, as the static policy's
          continue;
        }
        // The bench's trigger: answered at once, the change at the next tick.
        const std::uint64_t id = m ? m->id : 0;
        std::string out = wire::encode_frame(wire::make_ack(id));
        send_all(fd, out);
        const std::int64_t now = now_ns();
        due = start + ((now - start) / interval_ns + 1) * interval_ns;
      }
    }
  }
}

Result run_one(int n, int hz, int run, double seconds, int updates, unsigned threads,
               const std::string& change, int attempt, int probe_us, std::FILE* records_out) {
  Result res{n, hz, run, change};
  char dir_tmpl[] = "/tmp/sluice-bench-XXXXXX";
  std::string dir = ::mkdtemp(dir_tmpl);
  const std::string sock = dir + "/bench.sock";
  const int interval = 1000 / hz;

  // Populated now: a page faulted in by the daemon's observer, on its send path,
  // cost it tens of microseconds here (shmem faults under a VM).
  void* shm = ::mmap(nullptr, sizeof(Logs), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (shm == MAP_FAILED) {
    res.ok = false;
    return res;
  }
  auto* logs = new (shm) Logs;
  WrittenLog* written_log = &logs->rules;
  struct Unmap {
    void* p;
    ~Unmap() { ::munmap(p, sizeof(Logs)); }
  } unmap{shm};
  // configure-messages: the same change as configure, to stages that offer
  // the daemon no board (every change then travels as a message only).
  const bool configure = change == "configure" || change == "configure-messages";

  const pid_t bench_pid = ::getpid();
  pid_t child = ::fork();
  if (child == 0) {
    // Gone with the bench, whatever ends it (or it would hold the bench's
    // stdout open forever).
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != bench_pid) ::_exit(1);
    if (change == "floor") floor_daemon(sock, interval, written_log);
    spdlog::set_level(spdlog::level::err);
    sluice::control::DaemonOptions o;
    o.socket_path = sock;
    o.interval_ms = interval;
    o.handle_signals = true;
    o.policy_doc = json{{"policy", "static"}, {"config", {{"rules", batch(1e12)}}}};
    StepTimer timer(logs);  // declared before the daemon, so it outlives it
    o.observer = &timer;
    auto d = sluice::control::Daemon::create(std::move(o));
    if (!d) ::_exit(1);
    (void)(*d)->run();
    ::_exit(0);
  }
  auto cleanup = [&] {
    ::kill(child, SIGTERM);
    int st = 0;
    ::waitpid(child, &st, 0);
    ::rmdir(dir.c_str());
  };
  auto deadline = SteadyClock::now() + std::chrono::seconds(10);
  while (!sluice::control::Connection::open(sock, 100).is_ok()) {
    if (SteadyClock::now() > deadline) {
      cleanup();
      res.ok = false;
      return res;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Driver drv;
  drv.floor = change == "floor";
  drv.boards = change != "floor" && change != "configure-messages";
  auto all_served = [&] {
    return std::all_of(drv.sims.begin(), drv.sims.end(), [](const std::unique_ptr<Sim>& s) {
      return s->acked.load() && s->rules_applied.load() >= 1;
    });
  };
  // Every stage records each change; a worker serves n / threads of them.
  const std::size_t records =
      static_cast<std::size_t>(updates + 1) * static_cast<std::size_t>(n) / std::max(1u, threads) +
      static_cast<std::size_t>(n);
  if (!drv.start(sock, n, threads, records) || !drv.wait(std::chrono::seconds(30), all_served)) {
    drv.stop();
    cleanup();
    res.ok = false;
    return res;
  }

  // Phase 1: collect only.
  const double cpu0 = cpu_seconds(child);
  const sluice::bench::CpuTicks ticks0 = sluice::bench::read_cpu_ticks();
  const auto t0 = SteadyClock::now();
  drv.wait(std::chrono::milliseconds(static_cast<int>(seconds * 1000)), [] { return false; });
  const double wall = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  res.cpu_pct = 100.0 * (cpu_seconds(child) - cpu0) / wall;
  const sluice::bench::CpuTicks ticks1 = sluice::bench::read_cpu_ticks();
  res.collect_steal_pct = sluice::bench::steal_pct(ticks0, ticks1);
  {  // the rounds so far (none for the floor's stand-in daemon)
    const std::vector<double> rounds = logs->rounds.first();
    res.round_p50 = percentile(rounds, 0.5);
    res.round_p99 = percentile(rounds, 0.99);
  }

  // Phase 2: policy changes, each sent to every stage at the next step.
  res.board_stages = static_cast<int>(std::count_if(
      drv.sims.begin(), drv.sims.end(), [](const auto& s) { return s->board_mapped.load(); }));
  std::unique_ptr<Probe> probe;
  if (configure && drv.boards && probe_us >= 0) {
    probe = std::make_unique<Probe>(drv.sims, probe_us);
    probe->start();
  }
  drv.record.store(true);
  auto conn = sluice::control::Connection::open(sock);
  const std::uint64_t applied1 = drv.sims.front()->rules_applied.load();
  for (int u = 0; u < updates && conn; ++u) {
    std::uint64_t want = drv.sims.front()->rules_applied.load() + 1;
    const double rate = 1e12 + u + 1;
    json doc = {{"policy", "static"}, {"config", {{"rules", batch(rate)}}}};
    if (configure) {  // the same layout; a new rate for the object
      json rule = {{"rule", "configure"},
                   {"channel", "all"},
                   {"object", "limit"},
                   {"config", {{"rate", rate}}}};
      doc = {{"policy", "static"},
             {"config", {{"rules", json::array({rule})}, {"replace", false}}}};
    }
    // (The floor's stand-in daemon takes any request as its trigger.)
    auto set = (*conn)->request(wire::Type::kPolicySet, json{{"policy", doc}});
    if (!set.is_ok()) {  // say why, rather than report a run without samples
      std::fprintf(stderr, "policy_set failed: %s\n", set.status().message().c_str());
      break;
    }
    drv.wait(std::chrono::milliseconds(interval * 3 + 2000), [&] {
      return std::all_of(drv.sims.begin(), drv.sims.end(), [&](const std::unique_ptr<Sim>& s) {
        return s->rules_applied.load() >= want;
      });
    });
  }
  const std::uint64_t changes = drv.sims.front()->rules_applied.load() - applied1;
  if (probe) {
    probe->stop();
    res.probe_cpu_pct = probe->cpu_pct();
  }
  drv.stop();
  res.steal_pct = sluice::bench::steal_pct(ticks1, sluice::bench::read_cpu_ticks());
  if (change != "floor") {
    for (const auto& [k, log] :
         {std::pair{"rules_build_us", &logs->build}, std::pair{"rules_write_us", &logs->write},
          std::pair{"rules_send_us", &logs->send},
          std::pair{"rules_send_preemptions", &logs->preemptions},
          std::pair{"rules_cpu_us", &logs->cpu}, std::pair{"board_us", &logs->boards}}) {
      const std::vector<double> v = log->first();
      res.daemon_send[k] = {{"p50", percentile(v, 0.5)}, {"p99", percentile(v, 0.99)}};
    }
  }
  const Samples got = drv.merged();
  if (changes > 0) {
    res.stage_cpu_us = static_cast<double>(got.rules_cpu_ns) / static_cast<double>(changes) / 1e3;
  }
  // When each frame left the daemon, by (stage, decision).
  std::map<std::pair<int, std::int64_t>, std::int64_t> written;
  const std::uint32_t nw = written_log->count.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < nw; ++i) {
    const Written& w = written_log->entries[i];
    written[{w.index, w.decided}] = w.written;
  }
  std::vector<double> prop, deliver, apply, daemon, wake, queue, parse, ack;
  if (records_out) {  // every rules message, for a timeline of each change
    auto line = [&](json fields) {
      json j = {{"stages", n}, {"hz", hz}, {"run", run}, {"attempt", attempt}, {"change", change}};
      j.update(fields);
      std::fprintf(records_out, "%s\n", j.dump().c_str());
    };
    for (const Record& r : got.records) {
      auto it = written.find({r.index, r.decided});
      line({{"stage", r.index},
            {"worker", r.index % static_cast<int>(threads)},
            {"decided", r.decided},
            {"written", it == written.end() ? 0 : it->second},
            {"received", r.received},
            {"started", r.started},
            {"parsed", r.parsed},
            {"applied", r.applied},
            {"acked", r.acked}});
    }
    // And every board the daemon wrote ("board_written": when its store landed).
    const std::uint32_t nb = logs->board.count.load(std::memory_order_acquire);
    for (std::uint32_t i = 0; i < nb; ++i) {
      const Written& w = logs->board.entries[i];
      line({{"stage", w.index}, {"decided", w.decided}, {"board_written", w.written}});
    }
  }

  for (const Record& r : got.records) {
    auto us = [](std::int64_t a, std::int64_t b) { return static_cast<double>(b - a) / 1e3; };
    prop.push_back(us(r.decided, r.applied));
    deliver.push_back(us(r.decided, r.received));
    apply.push_back(us(r.parsed, r.applied));
    queue.push_back(us(r.received, r.started));
    parse.push_back(us(r.started, r.parsed));
    ack.push_back(us(r.applied, r.acked));
    if (auto it = written.find({r.index, r.decided}); it != written.end()) {
      daemon.push_back(us(r.decided, it->second));
      wake.push_back(us(it->second, r.received));
    }
  }
  auto pp = [](const std::vector<double>& v) {
    return json{{"p50", percentile(v, 0.5)}, {"p99", percentile(v, 0.99)}};
  };
  res.phases = {{"daemon_written", pp(daemon)}, {"wake_read", pp(wake)}, {"queue", pp(queue)},
                {"parse", pp(parse)},           {"apply", pp(apply)},    {"ack", pp(ack)}};
  res.message_p50 = percentile(prop, 0.5);
  res.message_p99 = percentile(prop, 0.99);
  // In effect: through the board where the daemon wrote one (decision -> the
  // store done), else through the message (decision -> applied).
  std::map<int, std::vector<std::pair<std::int64_t, std::int64_t>>> board_by_stage;
  const std::uint32_t nb = logs->board.count.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < nb; ++i) {
    const Written& w = logs->board.entries[i];
    board_by_stage[w.index].emplace_back(w.written, w.decided);
  }
  if (nb > 0) {
    std::vector<double> board_prop;
    for (const auto& [index, ws] : board_by_stage) {
      for (const auto& [at, decided] : ws) {
        board_prop.push_back(static_cast<double>(at - decided) / 1e3);
      }
    }
    prop = std::move(board_prop);
  }
  res.board_writes = nb;
  if (probe) {
    // Each probe sample: the latest board write to its stage before it,
    // each write counted once.
    std::vector<double> seen;
    std::map<int, std::size_t> used;  // per stage, writes already matched
    for (const ProbeSample& p : probe->samples()) {
      auto it = board_by_stage.find(p.index);
      if (it == board_by_stage.end()) continue;
      const auto& ws = it->second;
      std::size_t k = used[p.index];
      while (k + 1 < ws.size() && ws[k + 1].first <= p.at) ++k;
      if (k >= ws.size() || ws[k].first > p.at) continue;
      seen.push_back(static_cast<double>(p.at - ws[k].second) / 1e3);
      used[p.index] = k + 1;
    }
    res.probe_samples = seen.size();
    res.probe_p50 = percentile(seen, 0.5);
    res.probe_p99 = percentile(seen, 0.99);
  }
  res.prop_samples = prop.size();
  res.prop_p50 = percentile(prop, 0.5);
  res.prop_p99 = percentile(prop, 0.99);
  res.deliver_p50 = percentile(deliver, 0.5);
  res.deliver_p99 = percentile(deliver, 0.99);
  res.apply_p50 = percentile(apply, 0.5);
  res.apply_p99 = percentile(apply, 0.99);
  res.errors = got.errors;
  cleanup();
  return res;
}

// "10,100,1000": the numbers of a comma-separated list (empty items skipped).
std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  for (const std::string& item : sluice::bench::split_list(s)) {
    if (!item.empty()) out.push_back(std::stoi(item));
  }
  return out;
}

// --help: prints the usage and exits.
[[noreturn]] void print_help() {
  std::printf(
      "usage: sluice-bench-control [--quick] [--runs N] [--seconds S] [--updates U]\n"
      "                            [--stages 10,100,1000] [--hz 1,10] [--threads T]\n"
      "                            [--json PATH] [--max-steal PCT --attempts K]\n"
      "                            [--change "
      "configure|configure-messages|layout|floor|both|all]\n"
      "                            [--records PATH] [--probe-us US]\n"
      "--threads: driver threads serving the simulated stages (default: the\n"
      "number of CPUs, %u here)\n"
      "--max-steal PCT --attempts K: run a configuration again, up to K times in\n"
      "all, while the host stole more than PCT%% of the CPU during its rule\n"
      "changes (every attempt is printed; the table takes the last)\n"
      "--records PATH: append one JSON line per rules message a stage applied\n"
      "(its clock stamps, steady clock ns), for timelines of each change\n"
      "--change configure: a new rate for every stage's drl, which the daemon\n"
      "writes to the stages' boards and then sends as messages; propagation is\n"
      "the board written (message_propagation the message applied, probe the\n"
      "first request under the new rate); configure-messages: the same with\n"
      "stages that offer no board; layout: the static policy's replacing batch;\n"
      "both: configure and layout; all: all four\n"
      "--change floor: the layout change's messages with no Sluice code behind\n"
      "them (a stand-in daemon, stages that do not apply): the machine's floor\n"
      "--probe-us US: run the probe in configure runs, an application thread\n"
      "timing its first request under the new rate, sleeping US between sweeps\n"
      "of the stages (0: it spins, holding a CPU)\n",
      std::max(1u, std::thread::hardware_concurrency()));
  std::exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
  int runs = 3;
  double seconds = 5;
  int updates = 10;
  std::vector<int> stages = {10, 100, 1000}, rates = {1, 10};
  std::vector<std::string> changes = {"configure", "layout"};
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::string json_path, records_path;
  int probe_us = -1;  // -1: no probe
  sluice::bench::StealRetry retry;
  // An option's own check that fails prints why; main() then returns 2.
  auto refuse = [](const char* why) {
    std::fprintf(stderr, "%s\n", why);
    return false;
  };
  auto to_int = [](const std::string& v) { return std::stoi(v); };
  using sluice::bench::Option;
  const Option options[] = {
      Option::flag("--quick",
                   [&] {
                     runs = 1;
                     seconds = 2;
                     updates = 3;
                   }),
      {"--runs", &runs, to_int},
      {"--seconds", &seconds, [](const std::string& v) { return std::stod(v); }},
      {"--updates", &updates, to_int},
      {"--stages", &stages, parse_list},
      {"--hz", &rates, parse_list},
      {"--threads", &threads,
       [](const std::string& v) { return static_cast<unsigned>(std::max(1, std::stoi(v))); }},
      {"--json", &json_path},
      {"--records", &records_path},
      Option::with_value("--probe-us",
                         [&](const std::string& v) {
                           probe_us = std::stoi(v);
                           return probe_us >= 0 ||
                                  refuse("--probe-us is a number of microseconds >= 0");
                         }),
      Option::with_value("--max-steal",
                         [&](const std::string& v) {
                           retry.max_steal_pct = std::stod(v);
                           return retry.max_steal_pct >= 0 ||
                                  refuse("--max-steal is a percentage >= 0");
                         }),
      Option::with_value("--attempts",
                         [&](const std::string& v) {
                           retry.attempts = std::stoi(v);
                           return retry.attempts >= 1 || refuse("--attempts is at least 1");
                         }),
      Option::with_value("--change",
                         [&](const std::string& c) {
                           if (c == "both") {
                             changes = {"configure", "layout"};
                           } else if (c == "configure" || c == "configure-messages" ||
                                      c == "layout" || c == "floor") {
                             changes = {c};
                           } else if (c == "all") {
                             changes = {"configure", "configure-messages", "layout", "floor"};
                           } else {
                             return refuse(
                                 "--change is configure, configure-messages, layout, floor, both "
                                 "or all");
                           }
                           return true;
                         }),
      Option::flag("--help", [] { print_help(); }),
      Option::flag("-h", [] { print_help(); }),
  };
  const sluice::bench::ParseResult parsed = sluice::bench::parse_options(options, argc, argv);
  if (!parsed.ok()) {
    sluice::bench::print_parse_error(parsed, " (try --help)");
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  std::FILE* jf = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "a");
  std::FILE* rf = records_path.empty() ? nullptr : std::fopen(records_path.c_str(), "a");
  for (auto [path, file] : {std::pair{&json_path, jf}, std::pair{&records_path, rf}}) {
    if (!path->empty() && file == nullptr) {
      std::fprintf(stderr, "cannot open %s: %s\n", path->c_str(), std::strerror(errno));
      return 2;
    }
  }
  std::vector<Result> all;
  for (int n : stages) {
    for (int hz : rates) {
      for (int r = 0; r < runs; ++r) {
        for (const std::string& change : changes) {
          for (int attempt = 1; attempt <= retry.attempts; ++attempt) {
            Result res =
                run_one(n, hz, r, seconds, updates, threads, change, attempt, probe_us, rf);
            json line = {{"bench", "control"},
                         {"change", res.change},
                         {"stages", res.stages},
                         {"hz", res.hz},
                         {"run", res.run},
                         {"threads", threads},
                         {"ok", res.ok},
                         {"daemon_cpu_pct", res.cpu_pct},
                         {"collect_round_us_p50", res.round_p50},
                         {"collect_round_us_p99", res.round_p99},
                         {"propagation_us_p50", res.prop_p50},
                         {"propagation_us_p99", res.prop_p99},
                         {"propagation_samples", res.prop_samples},
                         {"message_propagation_us_p50", res.message_p50},
                         {"message_propagation_us_p99", res.message_p99},
                         {"probe_us_p50", res.probe_p50},
                         {"probe_us_p99", res.probe_p99},
                         {"probe_samples", res.probe_samples},
                         {"probe_cpu_pct", res.probe_cpu_pct},
                         {"board_stages", res.board_stages},
                         {"board_writes", res.board_writes},
                         {"delivery_us_p50", res.deliver_p50},
                         {"delivery_us_p99", res.deliver_p99},
                         {"apply_us_p50", res.apply_p50},
                         {"apply_us_p99", res.apply_p99},
                         {"phases_us", res.phases},
                         {"daemon_send_us", res.daemon_send},
                         {"stage_cpu_us_per_change", res.stage_cpu_us},
                         {"collect_host_steal_pct", res.collect_steal_pct},
                         {"host_steal_pct", res.steal_pct},
                         {"attempt", attempt},
                         {"quiet", retry.quiet(res.steal_pct)},
                         {"errors", res.errors}};
            std::printf("%s\n", line.dump().c_str());
            std::fflush(stdout);
            if (jf) std::fprintf(jf, "%s\n", line.dump().c_str());
            if (retry.last(attempt, res.steal_pct)) {
              all.push_back(res);
              break;
            }
          }
        }
      }
    }
  }
  if (jf) std::fclose(jf);
  if (rf) std::fclose(rf);

  auto mmm = [](const std::vector<double>& v) {
    if (v.empty()) return std::string("-");
    const sluice::bench::Spread s = sluice::bench::spread(v);
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.1f/%.1f/%.1f", s.min, s.median, s.max);
    return std::string(buf);
  };
  std::printf("\nmin/median/max over runs; times in microseconds\n");
  std::printf("%-6s %-3s %-18s %-16s %-22s %-22s %-22s %-22s %-22s %-22s %-16s\n", "stages", "hz",
              "change", "daemon CPU %", "round p99", "propagation p50", "propagation p99",
              "message p99", "probe p99", "delivery p99", "host steal %");
  for (int n : stages) {
    for (int hz : rates) {
      for (const std::string& change : changes) {
        std::vector<double> cpu, rp99, pp50, pp99, mp99, qp99, dp99, steal;
        for (const auto& r : all) {
          if (r.stages != n || r.hz != hz || r.change != change || !r.ok) continue;
          cpu.push_back(r.cpu_pct);
          rp99.push_back(r.round_p99);
          mp99.push_back(r.message_p99);
          if (r.probe_samples > 0) qp99.push_back(r.probe_p99);
          pp50.push_back(r.prop_p50);
          pp99.push_back(r.prop_p99);
          dp99.push_back(r.deliver_p99);
          steal.push_back(r.steal_pct);
        }
        std::printf("%-6d %-3d %-18s %-16s %-22s %-22s %-22s %-22s %-22s %-22s %-16s\n", n, hz,
                    change.c_str(), mmm(cpu).c_str(), mmm(rp99).c_str(), mmm(pp50).c_str(),
                    mmm(pp99).c_str(), mmm(mp99).c_str(), mmm(qp99).c_str(), mmm(dp99).c_str(),
                    mmm(steal).c_str());
      }
    }
  }
  // A run that failed or whose stages saw errors fails the bench (its smoke
  // test checks the pipeline, never the figures).
  // Configure runs must have gone through the boards too (every stage's
  // mapped, writes made, and the probe, when on, saw them taken).
  const bool all_ok = std::all_of(all.begin(), all.end(), [probe_us](const Result& r) {
    const bool boards =
        r.change != "configure" ||
        (r.board_stages == r.stages && r.board_writes > 0 && (probe_us < 0 || r.probe_samples > 0));
    return r.ok && r.errors == 0 && r.prop_samples > 0 && boards;
  });
  return all_ok ? 0 : 1;
}
