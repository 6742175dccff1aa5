// The stage's control client against a fake daemon (fake_daemon.h): its
// thread's signal mask, its reconnect backoff, readiness (the first rules
// after a hello ack), and its reserved descriptors (sluice/reserved_fd.h)
// moving out of the way of a host's dup2 while a session runs.
//
// Conditions are awaited by bounded polling with deadlines.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fake_daemon.h"
#include "sluice/control_client.h"
#include "sluice/reserved_fd.h"
#include "sluice/stage.h"
#include "test_util.h"

using namespace std::chrono_literals;
using sluice::testing::FakeDaemon;
using sluice::testing::FakeDaemonOptions;
using SteadyClock = std::chrono::steady_clock;

namespace {

// A directory of this test's own, removed at the end.
struct ClientDir : sluice::testing::TempDir {
  ClientDir() : sluice::testing::TempDir("cc") {}
};

using sluice::testing::wait_for;

struct Client {
  Client(const std::string& socket, std::chrono::milliseconds initial = 10ms,
         std::chrono::milliseconds max = 100ms) {
    sluice::StageOptions so;
    so.name = "cc";
    auto s = sluice::Stage::create(so);
    REQUIRE(s.is_ok());
    stage = std::move(*s);
    sluice::ControlClientOptions co;
    co.socket_path = socket;
    co.backoff_initial = initial;
    co.backoff_max = max;
    auto c = sluice::ControlClient::start(*stage, co);
    REQUIRE(c.is_ok());
    client = std::move(*c);
  }
  std::unique_ptr<sluice::Stage> stage;
  std::unique_ptr<sluice::ControlClient> client;
};

// The threads of this process named `name`.
std::vector<int> threads_named(const std::string& name) {
  std::vector<int> out;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string line;
      if (std::getline(comm, line) && line == name) out.push_back(std::atoi(e->d_name));
    }
    ::closedir(d);
  }
  return out;
}

std::uint64_t blocked_signals(int tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("SigBlk:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  }
  return 0;
}

std::vector<int> reserved_fds() {
  std::vector<int> out;
  for (int fd = 0; fd < 8192; ++fd) {
    if (sluice::is_reserved_fd(fd)) out.push_back(fd);
  }
  return out;
}

const nlohmann::json kNoopBatch = nlohmann::json::parse(R"({"version": 1, "rules": [
  {"rule": "create_channel", "channel": "all", "default": true},
  {"rule": "create_object", "channel": "all", "object": "count", "type": "noop", "default": true}]})");

}  // namespace

TEST_CASE("the client's thread blocks every signal; the caller's mask is untouched",
          "[control_client]") {
  ClientDir dir;
  sigset_t before;
  REQUIRE(pthread_sigmask(SIG_SETMASK, nullptr, &before) == 0);
  Client c(dir.file("none.sock"));
  // Read once the thread runs the client (a thread starting up may still have
  // the full mask glibc's pthread_create gives it until it sets its own).
  REQUIRE(wait_for([&] { return threads_named("sluice-client").size() == 1; }, 10s));
  const std::vector<int> started = threads_named("sluice-client");
  const std::uint64_t mask = blocked_signals(started[0]);
  for (int sig : {SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM, SIGTERM, SIGCHLD,
                  SIGWINCH, SIGRTMIN + 1, SIGRTMAX}) {
    INFO("signal " << sig << ", SigBlk " << std::hex << mask);
    CHECK((mask >> (sig - 1)) & 1);
  }
  sigset_t after;
  REQUIRE(pthread_sigmask(SIG_SETMASK, nullptr, &after) == 0);
  for (int sig = 1; sig < SIGRTMIN; ++sig) {
    CHECK(sigismember(&before, sig) == sigismember(&after, sig));
  }
}

TEST_CASE("a daemon that drops every session at once is retried with a growing backoff",
          "[control_client]") {
  // Each session is acknowledged, then closed. The backoff (10 ms doubling to
  // 80 ms, slept for [0.5, 1) of it) starts over only after a session that
  // lived 80 ms, so over T ms there are at most 3 attempts while it grows and
  // one per 40 ms after: 3 + T / 40 (28 in a second). Were it to start over
  // after every acknowledged hello there would be one per 5-10 ms. T is
  // measured: a loaded machine stretches the sleep.
  ClientDir dir;
  FakeDaemonOptions o;
  o.drop_after_ack = true;
  FakeDaemon d(dir.file("d.sock"), o);
  REQUIRE(d.ok());
  Client c(dir.file("d.sock"), 10ms, 80ms);
  REQUIRE(wait_for([&] { return d.hellos.load() >= 1; }, 10s));
  const auto t0 = SteadyClock::now();
  const int first = d.connections.load();
  std::this_thread::sleep_for(1s);
  const int attempts = d.connections.load() - first;
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - t0).count();
  INFO("attempts in " << ms << " ms: " << attempts);
  CHECK(attempts <= 3 + ms / 40);
  CHECK(attempts >= 1);  // and it keeps trying
  CHECK(c.client->counters().connects == static_cast<std::uint64_t>(d.hellos.load()));
}

TEST_CASE("ready once the first rules after a hello ack are handled", "[control_client]") {
  ClientDir dir;
  FakeDaemonOptions o;
  o.rules = FakeDaemonOptions::Rules::kHeld;
  o.first_rules = kNoopBatch;
  FakeDaemon d(dir.file("d.sock"), o);
  REQUIRE(d.ok());
  Client c(dir.file("d.sock"));
  REQUIRE(wait_for([&] { return d.hellos.load() >= 1; }, 10s));
  REQUIRE(wait_for([&] { return c.client->connected(); }, 10s));
  // Acknowledged, no rules yet: not ready, and a wait runs to its timeout.
  CHECK_FALSE(c.client->ready());
  CHECK_FALSE(c.client->wait_ready(100ms));
  d.release_rules();
  CHECK(c.client->wait_ready(30s));
  CHECK(c.client->ready());
  CHECK(c.client->counters().rules_applied == 1);
  CHECK(c.stage->info().channels.size() == 1);
  // Ready for good: a new session does not undo it.
  d.stop();
  CHECK(c.client->wait_ready(0ms));
}

TEST_CASE("ready: an empty first rules message makes a stage ready too", "[control_client]") {
  ClientDir dir;
  FakeDaemonOptions o;  // {"version": 1, "rules": []} at once
  SECTION("in the daemon's form") {
    o.daemon_form = true;
  }
  SECTION("as a plain message") {
    o.daemon_form = false;
  }
  FakeDaemon d(dir.file("d.sock"), o);
  REQUIRE(d.ok());
  Client c(dir.file("d.sock"));
  CHECK(c.client->wait_ready(30s));
  CHECK(c.client->counters().rules_applied == 1);
  CHECK(c.stage->info().channels.empty());
}

TEST_CASE("wait_ready: a daemon that never sends rules, and no daemon at all", "[control_client]") {
  ClientDir dir;
  SECTION("never: the wait ends at its timeout") {
    FakeDaemonOptions o;
    o.rules = FakeDaemonOptions::Rules::kNever;
    FakeDaemon d(dir.file("d.sock"), o);
    REQUIRE(d.ok());
    Client c(dir.file("d.sock"));
    REQUIRE(wait_for([&] { return c.client->connected(); }, 10s));
    CHECK_FALSE(c.client->wait_ready(200ms));
    CHECK_FALSE(c.client->ready());
    CHECK(c.client->connected());
  }
  SECTION("no daemon: the wait ends when the attempt fails, not at its timeout") {
    Client c(dir.file("nobody.sock"), 10s, 10s);
    const auto t0 = SteadyClock::now();
    CHECK_FALSE(c.client->wait_ready(60s));
    CHECK(SteadyClock::now() - t0 < 30s);
  }
  SECTION("stop() ends a wait") {
    FakeDaemonOptions o;
    o.rules = FakeDaemonOptions::Rules::kNever;
    FakeDaemon d(dir.file("d.sock"), o);
    REQUIRE(d.ok());
    Client c(dir.file("d.sock"));
    REQUIRE(wait_for([&] { return c.client->connected(); }, 10s));
    bool result = true;
    std::thread waiter([&] { result = c.client->wait_ready(60s); });
    const auto t0 = SteadyClock::now();
    c.client->stop();
    waiter.join();
    CHECK_FALSE(result);
    CHECK(SteadyClock::now() - t0 < 30s);
  }
}

TEST_CASE("a lease the daemon stops renewing runs out in the stage, daemon silent or gone",
          "[control_client]") {
  // The daemon's first rules set a rate under a 1 s lease and never renew it: the
  // client's thread applies the fallback when the lease runs out, whether the daemon keeps
  // the session open and says nothing (a stopped daemon) or has gone (the thread then
  // waits to reconnect).
  ClientDir dir;
  FakeDaemonOptions o;
  o.first_rules = nlohmann::json::parse(R"({"version": 1, "rules": [
    {"rule": "create_channel", "channel": "app", "default": true},
    {"rule": "create_object", "channel": "app", "object": "limit", "type": "drl",
     "config": {"rate": 4194304}, "default": true},
    {"rule": "lease", "ms": 1000, "fallback": [
      {"rule": "configure", "channel": "app", "object": "limit", "config": {"rate": 65536}}]}]})");
  bool gone = false;
  SECTION("silent") {}
  SECTION("gone") {
    gone = true;
  }
  FakeDaemon d(dir.file("d.sock"), o);
  REQUIRE(d.ok());
  Client c(dir.file("d.sock"), 10s, 10s);  // no reconnect within the test once it is gone
  REQUIRE(c.client->wait_ready(30s));
  auto rate = [&] { return c.stage->totals().channels[0].objects[0].state["rate"].get<double>(); };
  CHECK(rate() == 4194304);
  if (gone) d.stop();
  REQUIRE(wait_for([&] { return c.stage->leases_expired() == 1; }, 10s));
  CHECK(rate() == 65536);
  CHECK_FALSE(c.stage->lease_left().has_value());
}

TEST_CASE("the client's descriptors are reserved: high, close-on-exec, moved from a host dup2",
          "[control_client]") {
  ClientDir dir;
  FakeDaemonOptions o;
  o.collect_every_ms = 5;
  FakeDaemon d(dir.file("d.sock"), o);
  REQUIRE(d.ok());
  Client c(dir.file("d.sock"));
  REQUIRE(wait_for([&] { return d.stats_answers.load() >= 3; }, 10s));

  rlimit rl{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &rl) == 0);
  const long top = rl.rlim_cur == RLIM_INFINITY ? 4096 : std::min<long>(rl.rlim_cur, 4096);
  const long base = top - std::clamp<long>(top / 4, 1, 32);
  const std::vector<int> fds = reserved_fds();
  REQUIRE(fds.size() == 3);  // the socket, the wake eventfd, the board
  for (int fd : fds) {
    INFO("fd " << fd);
    CHECK(fd >= base);
    CHECK((::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
  }

  // A "host" takes every one of those numbers, as its dup2 would under the
  // preload: Sluice's descriptor moves first.
  std::vector<std::pair<int, std::string>> taken;
  for (int fd : fds) {
    std::string path = dir.file("host-" + std::to_string(fd));
    int f = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(f >= 0);
    bool busy = true;
    CHECK(sluice::vacate_reserved_fd(fd, &busy));
    CHECK_FALSE(busy);
    CHECK_FALSE(sluice::is_reserved_fd(fd));
    REQUIRE(::dup2(f, fd) == fd);
    ::close(f);
    taken.emplace_back(fd, path);
  }
  const std::vector<int> moved = reserved_fds();
  CHECK(moved.size() == 3);
  for (int fd : moved) CHECK(std::find(fds.begin(), fds.end(), fd) == fds.end());

  // The session goes on, on the same connection, and nothing of Sluice's
  // reaches the host's files.
  const int answers = d.stats_answers.load();
  CHECK(wait_for([&] { return d.stats_answers.load() >= answers + 5; }, 10s));
  CHECK(d.connections.load() == 1);
  CHECK(d.boards_bad.load() == 0);
  for (auto& [fd, path] : taken) {
    struct stat by_fd {
    }, by_path{};
    REQUIRE(::fstat(fd, &by_fd) == 0);
    REQUIRE(::stat(path.c_str(), &by_path) == 0);
    CHECK(by_fd.st_ino == by_path.st_ino);  // still the host's file
    CHECK(by_path.st_size == 0);
    ::close(fd);
  }

  // stop() closes all three, wherever they are now.
  c.client->stop();
  CHECK(reserved_fds().size() == 1);  // the board is the stage's: it lives as long as the stage
  c.stage.reset();
  CHECK(reserved_fds().empty());
}

TEST_CASE("a new session hands over the board, never a host file that took its number",
          "[control_client]") {
  ClientDir dir;
  FakeDaemonOptions o;
  o.drop_after_ack = true;
  FakeDaemon d(dir.file("d.sock"), o);
  REQUIRE(d.ok());
  Client c(dir.file("d.sock"), 5ms, 5ms);
  REQUIRE(wait_for([&] { return d.hellos.load() >= 1; }, 10s));
  // The host keeps taking whatever number the board has while the client
  // keeps reconnecting (and sending the board with each hello).
  std::string path = dir.file("host");
  int f = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(f >= 0);
  const int sessions = d.hellos.load();
  for (int i = 0; i < 50; ++i) {
    auto b = c.stage->board();
    REQUIRE(b.is_ok());
    bool busy = false;
    if (*b >= 0 && sluice::vacate_reserved_fd(*b, &busy)) {
      REQUIRE(::dup2(f, *b) == *b);
      ::close(*b);
    }
    std::this_thread::sleep_for(1ms);
  }
  ::close(f);
  CHECK(wait_for([&] { return d.hellos.load() >= sessions + 5; }, 10s));
  CHECK(d.boards_bad.load() == 0);
  CHECK(d.boards_ok.load() >= 1);
}

TEST_CASE("for_unreserved_ranges splits a range around reserved descriptors", "[control_client]") {
  sluice::ReservedFd a, b;
  {
    sluice::ReservedFdLock lock;
    a = sluice::ReservedFd::adopt(lock, ::eventfd(0, EFD_CLOEXEC));
    b = sluice::ReservedFd::adopt(lock, ::eventfd(0, EFD_CLOEXEC));
  }
  REQUIRE(a.get() >= 3);
  REQUIRE(b.get() > a.get());
  const auto lo = static_cast<unsigned>(a.get()), hi = static_cast<unsigned>(b.get());
  std::vector<std::pair<unsigned, unsigned>> parts;
  auto collect = [](unsigned x, unsigned y, void* ctx) {
    static_cast<std::vector<std::pair<unsigned, unsigned>>*>(ctx)->emplace_back(x, y);
    return 0;
  };
  REQUIRE(sluice::for_unreserved_ranges(3, ~0U, collect, &parts) == 0);
  std::vector<std::pair<unsigned, unsigned>> want = {{3, lo - 1}, {hi + 1, ~0U}};
  if (hi > lo + 1) want.insert(want.begin() + 1, {lo + 1, hi - 1});
  CHECK(parts == want);
  parts.clear();
  REQUIRE(sluice::for_unreserved_ranges(lo, hi, collect, &parts) == 0);
  if (hi > lo + 1) {
    CHECK(parts == std::vector<std::pair<unsigned, unsigned>>{{lo + 1, hi - 1}});
  } else {
    CHECK(parts.empty());
  }
  // A failing part stops the walk and its result is returned.
  parts.clear();
  auto fail = [](unsigned, unsigned, void*) { return -1; };
  CHECK(sluice::for_unreserved_ranges(3, ~0U, fail, nullptr) == -1);
}
