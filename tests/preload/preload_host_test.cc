// The preload stays out of its host's way: programs (bash, and
// tests/preload/host_probe.cc) run under libsluice_preload.so with a control
// socket, as `sluice run` starts them (LD_PRELOAD and SLUICE_SOCKET), served
// by a fake daemon (tests/control-plane/fake_daemon.h) that records every session
// and every descriptor sent to it. Checked: the host's files get exactly its
// own bytes, whatever numbers it dup2()s onto; close_range/closefrom leave
// the control connection working; signals the host blocks reach its signalfd;
// the first enforced I/O waits (boundedly) for the daemon's first rules.
//
// Conditions are awaited by bounded waits for events.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "fake_daemon.h"
#include "preload_env.h"
#include "test_util.h"

using namespace std::chrono_literals;
using sluice::testing::FakeDaemon;
using sluice::testing::FakeDaemonOptions;
using sluice::testing::foreign_programs_load_preload;
using SteadyClock = std::chrono::steady_clock;

namespace {

using sluice::testing::read_file;
using sluice::testing::TempDir;
using sluice::testing::wait_for;

using sluice::testing::preload_value;

// A program under the preload with pipes on its stdin, stdout and stderr.
struct Child {
  pid_t pid = -1;
  int in = -1, out = -1, err = -1;
  std::string out_text, err_text;

  Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& set) {
    std::vector<std::string> env = sluice::testing::child_env(preload_value(), set);
    std::vector<std::string> argv_copy = argv;
    std::vector<char*> envp = sluice::testing::c_strings(env);
    std::vector<char*> args = sluice::testing::c_strings(argv_copy);
    int pin[2], pout[2], perr[2];
    REQUIRE(::pipe2(pin, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(pout, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(perr, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pin[0], 0);
    posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
    posix_spawn_file_actions_adddup2(&fa, perr[1], 2);
    REQUIRE(::posix_spawn(&pid, args[0], &fa, nullptr, args.data(), envp.data()) == 0);
    posix_spawn_file_actions_destroy(&fa);
    ::close(pin[0]);
    ::close(pout[1]);
    ::close(perr[1]);
    in = pin[1];
    out = pout[0];
    err = perr[0];
  }
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      (void)finish();
    }
  }

  // The next line on its stdout (without the newline), or "" after `timeout`.
  std::string read_line(std::chrono::milliseconds timeout) {
    const auto deadline = SteadyClock::now() + timeout;
    for (;;) {
      auto nl = out_text.find('\n');
      if (nl != std::string::npos) {
        std::string line = out_text.substr(0, nl);
        out_text.erase(0, nl + 1);
        return line;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
      if (left.count() <= 0) return "";
      pollfd p{out, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return "";
      char buf[4096];
      ssize_t n = ::read(out, buf, sizeof buf);
      if (n <= 0) return "";
      out_text.append(buf, static_cast<std::size_t>(n));
    }
  }

  void go() { REQUIRE(::write(in, "go\n", 3) == 3); }

  // Waits for it to exit; returns its exit status (128 + signal when killed).
  int finish() {
    if (in >= 0) ::close(in);
    in = -1;
    for (int* fd : {&out, &err}) {
      if (*fd < 0) continue;
      char buf[4096];
      ssize_t n;
      while ((n = ::read(*fd, buf, sizeof buf)) > 0) {
        (fd == &out ? out_text : err_text).append(buf, static_cast<std::size_t>(n));
      }
      ::close(*fd);
      *fd = -1;
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

FakeDaemonOptions collecting(int every_ms) {
  FakeDaemonOptions o;
  o.collect_every_ms = every_ms;
  return o;
}

const nlohmann::json kNoopBatch = nlohmann::json::parse(R"({"version": 1, "rules": [
  {"rule": "differentiate", "classifiers": []},
  {"rule": "create_channel", "channel": "all", "default": true},
  {"rule": "create_object", "channel": "all", "object": "count", "type": "noop", "default": true}]})");

}  // namespace

TEST_CASE("bash's redirections get only the program's bytes", "[preload][host]") {
  if (::access("/bin/bash", X_OK) != 0) {
    WARN("no /bin/bash: skipped");
    return;
  }
  if (!foreign_programs_load_preload()) {
    WARN("sanitizer runtime linked into each program: bash cannot load the preload");
    return;
  }
  TempDir dir;
  FakeDaemon d(dir.file("d.sock"), collecting(10));
  REQUIRE(d.ok());
  const std::map<std::string, std::string> env = {{"SLUICE_SOCKET", dir.file("d.sock")}};
  {
    Child c({"/bin/bash", "-c", "cd " + dir.path + " && exec 4>out4; echo payload >&4"}, env);
    CHECK(c.finish() == 0);
    CHECK(c.err_text.empty());
    CHECK(read_file(dir.file("out4")) == "payload\n");
  }
  {
    // Every low number, while the session is up.
    Child c({"/bin/bash", "-c",
             "cd " + dir.path +
                 " && exec 3>f3 4>f4 5>f5 6>f6 7>f7 8>f8 9>f9; read go;"
                 " for i in 3 4 5 6 7 8 9; do echo $i >&$i; sleep 0.01; echo $i >&$i; done"},
            env);
    REQUIRE(wait_for([&] { return d.stats_answers.load() >= 2; }, 10s));
    c.go();
    CHECK(c.finish() == 0);
    CHECK(c.err_text.empty());
    for (int i = 3; i <= 9; ++i) {
      INFO("f" << i);
      CHECK(read_file(dir.file("f" + std::to_string(i))) ==
            std::to_string(i) + "\n" + std::to_string(i) + "\n");
    }
  }
  CHECK(d.boards_bad.load() == 0);
}

TEST_CASE("a program that dup2()s onto every descriptor loses nothing", "[preload][host]") {
  TempDir dir;
  FakeDaemon d(dir.file("d.sock"), collecting(5));
  REQUIRE(d.ok());
  Child c({SLUICE_HOST_PROBE, "dup2-all", dir.path}, {{"SLUICE_SOCKET", dir.file("d.sock")}});
  REQUIRE(c.read_line(10s) == "started");
  // Connected, its board handed over, collects answered: now take every number.
  REQUIRE(wait_for([&] { return d.stats_answers.load() >= 2; }, 10s));
  const int before = d.stats_answers.load();
  c.go();
  const int status = c.finish();
  INFO(c.out_text << c.err_text);
  CHECK(status == 0);
  CHECK(c.err_text.empty());
  // The session lived on through it, and no file of the program's was ever
  // sent as a board.
  CHECK(d.stats_answers.load() > before);
  CHECK(d.boards_bad.load() == 0);
  CHECK(d.boards_ok.load() >= 1);
  struct stat st {};
  REQUIRE(::stat(dir.file("dup2-all.txt").c_str(), &st) == 0);
  for (auto [dev, ino] : d.received_files()) CHECK_FALSE((dev == st.st_dev && ino == st.st_ino));
}

TEST_CASE("close_range and closefrom leave the control connection working", "[preload][host]") {
#if SLUICE_TEST_TSAN
  // TSan's close() interceptor runs before the preload's (its runtime is in the
  // program, or first in LD_PRELOAD): it records as closed the reserved
  // descriptors the preload then keeps open, and its descriptor bookkeeping, at
  // odds with the kernel's, aborts the program at exit. No real host runs under TSan's
  // interceptors; the plain and ASan+UBSan builds run this case.
  WARN("TSan build: not closing every descriptor under TSan's own close()");
  return;
#endif
  TempDir dir;
  FakeDaemon d(dir.file("d.sock"), collecting(5));
  REQUIRE(d.ok());
  Child c({SLUICE_HOST_PROBE, "close-all", dir.path}, {{"SLUICE_SOCKET", dir.file("d.sock")}});
  REQUIRE(c.read_line(10s) == "started");
  REQUIRE(wait_for([&] { return d.stats_answers.load() >= 2; }, 10s));
  c.go();
  REQUIRE(c.read_line(30s) == "closed");
  // The client still answers (on its connection, or on a new one).
  const int answers = d.stats_answers.load();
  CHECK(wait_for([&] { return d.stats_answers.load() >= answers + 3; }, 10s));
  c.go();
  const int status = c.finish();
  INFO(c.out_text << c.err_text);
  CHECK(status == 0);
  CHECK(c.err_text.empty());
  CHECK(read_file(dir.file("after-close.txt")) == "after\n");
  CHECK(d.boards_bad.load() == 0);
}

TEST_CASE("signals the program blocks reach its signalfd", "[preload][host]") {
  TempDir dir;
  FakeDaemon d(dir.file("d.sock"), collecting(10));
  REQUIRE(d.ok());
  const std::map<std::string, std::string> env = {{"SLUICE_SOCKET", dir.file("d.sock")}};
  SECTION("SIGTERM: a graceful shutdown") {
    Child c({SLUICE_HOST_PROBE, "sigterm"}, env);
    REQUIRE(c.read_line(10s) == "ready");
    REQUIRE(wait_for([&] { return d.hellos.load() >= 1; }, 10s));  // the client's thread runs
    REQUIRE(::kill(c.pid, SIGTERM) == 0);
    const int status = c.finish();
    INFO(c.err_text);
    CHECK(status == 0);
    CHECK(c.out_text == "got SIGTERM, shutting down\n");
  }
  SECTION("SIGCHLD: one per child") {
    Child c({SLUICE_HOST_PROBE, "sigchld", "50"}, env);
    const int status = c.finish();
    INFO(c.err_text);
    CHECK(status == 0);
    CHECK(c.out_text == "seen 50 of 50\n");
  }
}

TEST_CASE("the first enforced I/O waits for the daemon's first rules, boundedly",
          "[preload][host]") {
  TempDir dir;
  auto stats_of = [&](const std::string& name) {
    return nlohmann::json::parse(read_file(dir.file(name)));
  };
  SECTION("rules after 300 ms: the first write is enforced under them") {
    FakeDaemonOptions o;
    o.rules = FakeDaemonOptions::Rules::kDelayed;
    o.rules_delay = 300ms;
    o.first_rules = kNoopBatch;
    FakeDaemon d(dir.file("d.sock"), o);
    REQUIRE(d.ok());
    Child c({SLUICE_HOST_PROBE, "write", dir.path}, {{"SLUICE_SOCKET", dir.file("d.sock")},
                                                     {"SLUICE_READY_MS", "30000"},
                                                     {"SLUICE_STATS_FILE", dir.file("s.json")}});
    CHECK(c.finish() == 0);
    CHECK(c.err_text.empty());
    auto s = stats_of("s.json");
    CHECK(s["stats"]["unclassified"]["ops"] == 0);
    REQUIRE(s["stats"]["channels"].size() == 1);
    CHECK(s["stats"]["channels"][0]["ops"] == 3);  // open, write, close
    // The ack may reach the fake daemon's thread after the child exited.
    CHECK(wait_for([&] { return d.rules_answers.load() >= 1; }, 10s));
    CHECK(d.rules_answers.load() == 1);
  }
  SECTION("no rules ever: the wait ends and the program runs") {
    FakeDaemonOptions o;
    o.rules = FakeDaemonOptions::Rules::kNever;
    FakeDaemon d(dir.file("d.sock"), o);
    REQUIRE(d.ok());
    Child c({SLUICE_HOST_PROBE, "write", dir.path}, {{"SLUICE_SOCKET", dir.file("d.sock")},
                                                     {"SLUICE_READY_MS", "300"},
                                                     {"SLUICE_STATS_FILE", dir.file("s.json")}});
    CHECK(c.finish() == 0);
    CHECK(c.err_text.empty());
    CHECK(read_file(dir.file("first.txt")) == "first\n");
    auto s = stats_of("s.json");
    CHECK(s["stats"]["unclassified"]["ops"] == 3);
    CHECK(d.hellos.load() >= 1);
  }
  SECTION("SLUICE_READY_MS=0: no wait") {
    FakeDaemonOptions o;
    o.rules = FakeDaemonOptions::Rules::kDelayed;
    o.rules_delay = 10s;
    o.first_rules = kNoopBatch;
    FakeDaemon d(dir.file("d.sock"), o);
    REQUIRE(d.ok());
    Child c({SLUICE_HOST_PROBE, "write", dir.path}, {{"SLUICE_SOCKET", dir.file("d.sock")},
                                                     {"SLUICE_READY_MS", "0"},
                                                     {"SLUICE_STATS_FILE", dir.file("s.json")}});
    CHECK(c.finish() == 0);
    auto s = stats_of("s.json");
    CHECK(s["stats"]["unclassified"]["ops"] == 3);
  }
}

TEST_CASE("fcntl's argument reaches the call as it was passed, for every kind of command",
          "[preload][host]") {
  TempDir dir;
  FakeDaemon d(dir.file("d.sock"), collecting(10));
  REQUIRE(d.ok());
  for (bool socket : {false, true}) {
    std::map<std::string, std::string> env = {{"SLUICE_KINDS", "all"}};
    if (socket) env["SLUICE_SOCKET"] = dir.file("d.sock");
    Child c({SLUICE_HOST_PROBE, "fcntl", dir.path}, env);
    const int status = c.finish();
    INFO("socket " << socket << ": " << c.err_text);
    CHECK(status == 0);
    CHECK(c.err_text.empty());
  }
}
