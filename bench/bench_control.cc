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
// The daemon is the real one (control-plane/daemon.h) in a child process, with
// the bench's observer (control_observer.h). The stages (control_sim.h) live in
// this process: each is a real sluice::Stage with its own
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
#include "control_observer.h"
#include "control_rules.h"
#include "control_sim.h"
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
using sluice::bench::Driver;
using sluice::bench::Logs;
using sluice::bench::now_ns;
using sluice::bench::Probe;
using sluice::bench::ProbeSample;
using sluice::bench::Record;
using sluice::bench::Samples;
using sluice::bench::Sim;
using sluice::bench::SteadyClock;
using sluice::bench::StepTimer;
using sluice::bench::thread_cpu_now_ns;
using sluice::bench::Written;
using sluice::bench::WrittenLog;

json batch(double rate) {
  return sluice::bench::drl_layout_batch(rate);
}

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
