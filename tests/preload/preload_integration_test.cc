// Integration tests of libsluice_preload.so: the probe program
// (tests/preload/probe.cc) runs natively and under the preload with no rules,
// a Noop channel and a DRL, and must behave identically (exit status and
// output); the SLUICE_STATS_FILE hook must agree with the bytes it moved;
// invalid configuration must give one line on stderr and a pass-through.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "preload_env.h"
#include "test_util.h"

namespace {

struct RunResult {
  int status = -1;  // exit status, or 128 + signal
  std::string out;
  std::string err;
};

using sluice::testing::foreign_programs_load_preload;
using sluice::testing::TempDir;

using sluice::testing::preload_value;

// Runs argv with the SLUICE_* variables of `set` and the preload (or
// natively, with neither). A run still going after `timeout_s` seconds is
// killed (status 128 + SIGKILL): a call made to wait forever fails its test
// instead of hanging it.
RunResult run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& set,
              bool preload, int timeout_s = 120) {
  std::vector<std::string> env = sluice::testing::child_env(preload ? preload_value() : "", set);
  std::vector<std::string> argv_copy = argv;
  std::vector<char*> envp = sluice::testing::c_strings(env);
  std::vector<char*> args = sluice::testing::c_strings(argv_copy);

  int out[2], err[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setpgid(0, 0);  // its own group, so that a timeout kills its children too
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  ::close(out[1]);
  ::close(err[1]);
  RunResult r;
  struct pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  bool killed = false;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const int ready =
        ::poll(fds, 2, killed ? -1 : static_cast<int>(std::max<long long>(0, left.count())));
    if (ready < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (ready == 0 && !killed) {
      ::kill(-pid, SIGKILL);
      killed = true;
      continue;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? r.out : r.err).append(buf, static_cast<std::size_t>(n));
      }
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

const char* kNoopRules = R"([
  {"rule": "differentiate", "classifiers": []},
  {"rule": "create_channel", "channel": "all", "default": true},
  {"rule": "create_object", "channel": "all", "object": "count", "type": "noop", "default": true}
])";
// 64 MiB/s: every probe moves well under a second's worth.
const char* kDrlRules = R"([
  {"rule": "differentiate", "classifiers": []},
  {"rule": "create_channel", "channel": "all", "default": true},
  {"rule": "create_object", "channel": "all", "object": "limit", "type": "drl",
   "config": {"rate": 67108864}, "default": true}
])";

std::vector<std::string> stats_files(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind("stats.", 0) == 0 && n.size() > 5 && n.substr(n.size() - 5) == ".json") {
        out.push_back(dir + "/" + n);
      }
    }
    ::closedir(d);
  }
  return out;
}

nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(sluice::testing::read_file(path));
}

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace

TEST_CASE("probe scenarios behave the same natively and under the preload", "[preload][e2e]") {
  TempDir tmp;
  std::string noop = tmp.write("noop.json", kNoopRules);
  std::string drl = tmp.write("drl.json", kDrlRules);
  struct Mode {
    const char* name;
    std::map<std::string, std::string> env;
  };
  std::vector<Mode> modes = {
      {"passthrough", {}},
      {"noop", {{"SLUICE_RULES", noop}}},
      {"drl", {{"SLUICE_RULES", drl}}},
      {"noop-all-kinds", {{"SLUICE_RULES", noop}, {"SLUICE_KINDS", "all"}}},
  };
  for (const char* scenario : {"errno", "eagain", "eintr", "eof", "partial-write", "io", "threads",
                               "fork", "hello", "badiov", "huge"}) {
    // The fork scenario execs /bin/true.
    if (std::string(scenario) == "fork" && !foreign_programs_load_preload()) {
      WARN("sanitizer runtime linked into each program: not running the fork scenario");
      continue;
    }
    std::string dir = tmp.path + "/" + scenario;
    REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
    RunResult native = run({SLUICE_PROBE, scenario, dir}, {}, false);
    INFO("scenario " << scenario << " natively: " << native.err);
    REQUIRE(native.status == 0);
    for (const Mode& m : modes) {
      RunResult r = run({SLUICE_PROBE, scenario, dir}, m.env, true);
      INFO("scenario " << scenario << " mode " << m.name << ": " << r.err);
      CHECK(r.status == 0);
      CHECK(r.out == native.out);
      CHECK(r.err.empty());
    }
  }
}

// A DRL of `rate` bytes/s, default burst (a tenth of a second's worth).
std::string drl_rules(double rate) {
  nlohmann::json rules = nlohmann::json::parse(kDrlRules);
  rules[2]["config"]["rate"] = rate;
  return rules.dump();
}

TEST_CASE("calls are charged what they can move, never made to wait for what they cannot",
          "[preload][e2e]") {
  // At 50 MiB/s, read(fd, buf, SIZE_MAX) and readv of {buf, SIZE_MAX} once
  // waited forever, and a 1 GiB read 10,000 bytes before the end of its file
  // 20 s; natively each returns at once. The bounded wait of run() fails a
  // call made to wait so.
  TempDir tmp;
  std::string rules = tmp.write("drl.json", drl_rules(50.0 * 1024 * 1024));
  RunResult native = run({SLUICE_PROBE, "huge", tmp.path}, {}, false);
  INFO("natively: " << native.err);
  REQUIRE(native.status == 0);
  RunResult r = run({SLUICE_PROBE, "huge", tmp.path}, {{"SLUICE_RULES", rules}}, true, 60);
  INFO("under the preload: " << r.err);
  CHECK(r.status == 0);
  CHECK(r.out == native.out);
  CHECK(r.err.empty());
}

TEST_CASE("RWF_NOWAIT: a vector call the stage would make wait fails with EAGAIN",
          "[preload][e2e]") {
  TempDir tmp, native_dir, dir;
  // 1 MiB/s: a 1 MiB request would wait about a second; 4 KiB would not. Only
  // the file read and written with RWF_NOWAIT is enforced (not its making).
  std::string slow = tmp.write("drl.json", drl_rules(1024.0 * 1024));
  RunResult native = run({SLUICE_PROBE, "nowait", native_dir.path}, {}, false);
  INFO("natively: " << native.out << native.err);
  REQUIRE(native.status == 0);
  const nlohmann::json n = nlohmann::json::parse(native.out);

  RunResult r = run({SLUICE_PROBE, "nowait", dir.path},
                    {{"SLUICE_RULES", slow}, {"SLUICE_PATHS", dir.path + "/limited"}}, true, 60);
  INFO("under the preload: " << r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  const nlohmann::json p = nlohmann::json::parse(r.out);
  const std::string eagain = "-1/" + std::to_string(EAGAIN);
  for (const char* call : {"read_big", "read64_big", "write_big", "write64_big"}) {
    INFO(call);
    CHECK(p[call] == eagain);  // not made, whatever the file system says of RWF_NOWAIT
  }
  CHECK(p["read_small"] == n["read_small"]);  // made: the kernel's answer

  // A stage that makes nothing wait changes nothing.
  TempDir again;
  r = run({SLUICE_PROBE, "nowait", again.path}, {}, true, 60);
  CHECK(r.status == 0);
  CHECK(r.out == native.out);
}

TEST_CASE("statistics count the bytes the calls moved", "[preload][e2e]") {
  TempDir tmp;
  std::string noop = tmp.write("noop.json", kNoopRules);
  for (const char* scenario : {"io", "threads"}) {
    std::string dir = tmp.path + "/" + scenario;
    REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
    std::string stats = dir + "/stats.%p.json";
    RunResult r = run({SLUICE_PROBE, scenario, dir},
                      {{"SLUICE_RULES", noop}, {"SLUICE_STATS_FILE", stats}}, true);
    INFO(scenario << ": " << r.err);
    REQUIRE(r.status == 0);
    nlohmann::json expected = nlohmann::json::parse(r.out);
    auto files = stats_files(dir);
    REQUIRE(files.size() == 1);
    nlohmann::json s = read_json(files[0]);
    CHECK(s["preload"]["read"]["bytes"] == expected["read"]);
    CHECK(s["preload"]["write"]["bytes"] == expected["write"]);
    CHECK(s["preload"]["read"]["errors"] == 0);
    // Every counted call went through the stage's one channel.
    std::uint64_t calls = 0;
    for (const char* op : {"read", "write", "open", "close", "sync"}) {
      calls += s["preload"][op]["calls"].get<std::uint64_t>();
    }
    CHECK(s["stats"]["ops"].get<std::uint64_t>() == calls);
    REQUIRE(s["stats"]["channels"].size() == 1);
    CHECK(s["stats"]["channels"][0]["ops"].get<std::uint64_t>() == calls);
    CHECK(s["stats"]["unclassified"]["ops"] == 0);
    if (std::string(scenario) == "io") {
      CHECK(s["preload"]["sync"]["calls"] == 2);
      CHECK(s["preload"]["open"]["calls"].get<int>() >= 5);
    }
  }
}

TEST_CASE("stage statistics count bytes transferred, not requested", "[preload][e2e]") {
  // eof: reads that come back short or empty at end of file, through every
  // read call; partial-write: writes cut short by a full pipe, then EAGAIN.
  // Through a drl, most calls are granted by the stage's shortcut from the
  // thread's lease: it is charged, in the end, exactly what the calls moved.
  TempDir tmp;
  const std::string rules[] = {tmp.write("noop.json", kNoopRules),
                               tmp.write("drl.json", kDrlRules)};
  for (const std::string& rule : rules) {
    const bool drl = rule == rules[1];
    for (const char* scenario : {"eof", "partial-write", "io"}) {
      std::string dir = tmp.path + "/" + scenario + (drl ? "-drl" : "");
      REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
      std::string stats = dir + "/stats.%p.json";
      RunResult r = run(
          {SLUICE_PROBE, scenario, dir},
          {{"SLUICE_RULES", rule}, {"SLUICE_STATS_FILE", stats}, {"SLUICE_KINDS", "all"}}, true);
      INFO(scenario << (drl ? " through a drl" : "") << ": " << r.err);
      REQUIRE(r.status == 0);
      auto files = stats_files(dir);
      REQUIRE(files.size() == 1);
      nlohmann::json s = read_json(files[0]);
      const auto moved = s["preload"]["read"]["bytes"].get<std::uint64_t>() +
                         s["preload"]["write"]["bytes"].get<std::uint64_t>();
      CHECK(moved > 0);
      CHECK(s["stats"]["bytes"].get<std::uint64_t>() == moved);
      CHECK(s["stats"]["channels"][0]["bytes"].get<std::uint64_t>() == moved);
      if (drl) {
        const nlohmann::json& limit = s["stats"]["channels"][0]["objects"][0];
        CHECK(limit["ops"] == s["stats"]["ops"]);
        const nlohmann::json& state = limit["state"];
        CHECK(state["granted_ops"] == limit["ops"]);
        CHECK(state["granted_tokens"].get<double>() - state["refunded_tokens"].get<double>() ==
              static_cast<double>(moved));
      }
    }
  }
}

TEST_CASE("no rules: a pass-through that still counts", "[preload][e2e]") {
  TempDir tmp;
  std::string stats = tmp.path + "/stats.%p.json";
  RunResult r = run({SLUICE_PROBE, "io", tmp.path}, {{"SLUICE_STATS_FILE", stats}}, true);
  REQUIRE(r.status == 0);
  nlohmann::json expected = nlohmann::json::parse(r.out);
  auto files = stats_files(tmp.path);
  REQUIRE(files.size() == 1);
  nlohmann::json s = read_json(files[0]);
  CHECK(s["preload"]["read"]["bytes"] == expected["read"]);
  CHECK(s["preload"]["write"]["bytes"] == expected["write"]);
  CHECK(s["stats"]["unclassified"]["ops"].get<std::uint64_t>() > 0);
  CHECK(s["stage"].get<std::string>().rfind("sluice-preload-probe-", 0) == 0);
}

TEST_CASE("SLUICE_PATHS limits enforcement to files under the prefixes", "[preload][e2e]") {
  TempDir tmp, other;
  std::string stats = tmp.path + "/stats.%p.json";
  RunResult r = run({SLUICE_PROBE, "io", tmp.path},
                    {{"SLUICE_STATS_FILE", stats}, {"SLUICE_PATHS", other.path}}, true);
  REQUIRE(r.status == 0);
  auto files = stats_files(tmp.path);
  REQUIRE(files.size() == 1);
  nlohmann::json s = read_json(files[0]);
  CHECK(s["preload"]["read"]["bytes"] == 0);
  CHECK(s["preload"]["write"]["bytes"] == 0);
  ::unlink(files[0].c_str());

  r = run({SLUICE_PROBE, "io", tmp.path},
          {{"SLUICE_STATS_FILE", stats}, {"SLUICE_PATHS", other.path + ":" + tmp.path + "/"}},
          true);
  REQUIRE(r.status == 0);
  nlohmann::json expected = nlohmann::json::parse(r.out);
  files = stats_files(tmp.path);
  REQUIRE(files.size() == 1);
  s = read_json(files[0]);
  CHECK(s["preload"]["read"]["bytes"] == expected["read"]);
  CHECK(s["preload"]["write"]["bytes"] == expected["write"]);
}

TEST_CASE("invalid configuration: one line on stderr, then a pass-through", "[preload][e2e]") {
  TempDir tmp;
  std::string bad_json = tmp.write("bad.json", "[{\"rule\": ");
  std::string bad_rule = tmp.write("badrule.json", R"([{"rule": "create_channel"}])");
  // Rules files that are not: a device, a FIFO (which once blocked the program
  // before main), a file above 4 MiB, a file whose bytes the error must not
  // show.
  std::string fifo = tmp.path + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::string oversize = tmp.write("big.json", "[" + std::string(4 << 20, ' ') + "]");
  std::string secret = tmp.write("shadow", "\"SECRETSECRET:19000:0:99999:7:::\n");
  // Nested 80,000 levels deep: read recursively, it would overflow the host's stack.
  std::string deep = tmp.write("deep.json", std::string(80000, '[') + std::string(80000, ']'));
  struct Case {
    std::string var, value;
    std::string says = "";  // what the line must say, when given
  };
  std::vector<Case> cases = {
      {"SLUICE_LOG_LEVEL", "loud"},
      {"SLUICE_STAGE", "bad name"},
      {"SLUICE_PATHS", "relative/dir"},
      {"SLUICE_KINDS", "files"},
      {"SLUICE_FORK", "sometimes"},
      {"SLUICE_TENANT", "-3"},
      {"SLUICE_ORIGIN", "no good"},
      {"SLUICE_SOCKET", "/" + std::string(150, 's')},
      {"SLUICE_RULES", tmp.path + "/missing.json"},
      {"SLUICE_RULES", bad_json},
      {"SLUICE_RULES", bad_rule},
      {"SLUICE_RULES", "/dev/zero", "a character device; a rules file must be a regular file"},
      {"SLUICE_RULES", fifo, "a FIFO; a rules file must be a regular file"},
      {"SLUICE_RULES", oversize, "larger than 4 MiB"},
      {"SLUICE_RULES", secret, "invalid JSON"},
      {"SLUICE_RULES", deep, "invalid JSON: nested deeper than 64 levels"},
      {"SLUICE_RULES", tmp.path, "a directory; a rules file must be a regular file"},
      {"SLUICE_SOCKET", "rel.sock", "must be an absolute path"},
  };
  std::string stats = tmp.path + "/stats.%p.json";
  for (const Case& c : cases) {
    RunResult r = run({SLUICE_PROBE, "hello", tmp.path},
                      {{c.var, c.value}, {"SLUICE_STATS_FILE", stats}}, true, 60);
    INFO(c.var << "=" << c.value << " -> " << r.err);
    CHECK(r.status == 0);
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.find(c.says) != std::string::npos);
    CHECK(r.err.find("SECRET") == std::string::npos);  // no byte of the file quoted
    CHECK(r.err.find("last read") == std::string::npos);
    CHECK(r.err.rfind("sluice: " + c.var + "=" + c.value + ": ", 0) == 0);
    CHECK(r.err.find("; running unenforced\n") == r.err.size() - 21);
    CHECK(stats_files(tmp.path).empty());  // no stage ran
  }
  // SLUICE_LOG_LEVEL=off silences even that line.
  RunResult r = run({SLUICE_PROBE, "hello", tmp.path},
                    {{"SLUICE_RULES", bad_json}, {"SLUICE_LOG_LEVEL", "off"}}, true);
  CHECK(r.status == 0);
  CHECK(r.err.empty());
}

TEST_CASE("fork: a fresh stage per child, or a pass-through", "[preload][e2e]") {
  if (!foreign_programs_load_preload()) {  // it execs /bin/true
    WARN("sanitizer runtime linked into each program: not checking fork and exec");
    return;
  }
  for (const char* mode : {"fresh", "passthrough"}) {
    TempDir tmp;
    std::string stats = tmp.path + "/stats.%p.json";
    RunResult r = run(
        {SLUICE_PROBE, "fork", tmp.path},
        {{"SLUICE_STATS_FILE", stats}, {"SLUICE_FORK", mode}, {"SLUICE_STAGE", "forker"}}, true);
    INFO(mode << ": " << r.err);
    REQUIRE(r.status == 0);
    auto files = stats_files(tmp.path);
    // Exec'd images (the posix_spawn'ed probe, the vfork'ed true) always start
    // their own stage; the fork child has one only when fresh.
    bool fresh = std::string(mode) == "fresh";
    CHECK(files.size() == (fresh ? 4u : 3u));
    int parents = 0, children = 0, spawned = 0;
    for (const auto& f : files) {
      nlohmann::json s = read_json(f);
      std::string name = s["stage"];
      if (name == "forker" && s["preload"]["read"]["bytes"] == 2000) ++parents;
      if (name == "forker" && s["preload"]["write"]["bytes"] == 500) ++spawned;
      if (name == "forker-" + std::to_string(s["pid"].get<int>())) {
        ++children;
        CHECK(s["preload"]["write"]["bytes"] == 3000);
        CHECK(s["preload"]["read"]["bytes"] == 3000);
      }
    }
    CHECK(parents == 1);
    CHECK(spawned == 1);
    CHECK(children == (fresh ? 1 : 0));
  }
}

TEST_CASE("sluice run exports an absolute SLUICE_SOCKET", "[preload][e2e][cli]") {
  // `sluice --socket rel.sock run -- sh -c 'cd /; ...'` once exported the
  // relative path, which named no socket once the program changed directory
  // (and the preload now refuses a relative one).
#if SLUICE_TEST_ASAN || SLUICE_TEST_TSAN
  // A sanitized preload cannot load into the uninstrumented shell.
  WARN("sanitizer build: not checking `sluice run`");
  return;
#endif
  TempDir tmp;
  const std::string inner = "cd / && printenv SLUICE_SOCKET";
  const std::string outer = "cd '" + tmp.path + "' && SLUICE_PRELOAD_LIB='" + preload_value() +
                            "' exec '" + SLUICE_BIN + "' --socket rel.sock run -- /bin/sh -c '" +
                            inner + "'";
  RunResult r = run({"/bin/sh", "-c", outer}, {}, false, 60);
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(r.out == tmp.path + "/rel.sock\n");
  // Nobody serves rel.sock: said once, naming the absolute path.
  CHECK(r.err == "sluice run: cannot connect to " + tmp.path +
                     "/rel.sock: No such file or directory (is `sluice serve` running?); "
                     "/bin/sh runs unenforced until a daemon answers there\n");
  // One that is too long once absolute is refused, not exported.
  const std::string longer = "cd '" + tmp.path + "' && SLUICE_PRELOAD_LIB='" + preload_value() +
                             "' exec '" + SLUICE_BIN + "' --socket " + std::string(100, 's') +
                             " run -- /bin/true";
  r = run({"/bin/sh", "-c", longer}, {}, false, 60);
  CHECK(r.status == 2);
  CHECK(r.err.find("at most 107") != std::string::npos);
}

TEST_CASE("sluice run says once when no daemon answers; --require-daemon refuses to start",
          "[preload][e2e][cli]") {
#if SLUICE_TEST_ASAN || SLUICE_TEST_TSAN
  WARN("sanitizer build: not checking `sluice run`");
  return;
#endif
  TempDir tmp;
  const std::string sock = tmp.path + "/d.sock";
  const std::string sluice = "SLUICE_PRELOAD_LIB='" + preload_value() + "' '" +
                             std::string(SLUICE_BIN) + "' --socket '" + sock + "' ";
  // No daemon: the program runs, unenforced, and the user is told once.
  RunResult r = run({"/bin/sh", "-c", sluice + "run -- /bin/echo ran"}, {}, false, 60);
  CHECK(r.status == 0);
  CHECK(r.out == "ran\n");
  CHECK(r.err.find("runs unenforced until a daemon answers there") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  // With --rules, it runs under them alone.
  const std::string rules = tmp.path + "/rules.json";
  std::ofstream(rules) << R"({"version": 1, "rules": []})";
  r = run({"/bin/sh", "-c", sluice + "run --rules '" + rules + "' -- /bin/echo ran"}, {}, false,
          60);
  CHECK(r.status == 0);
  CHECK(r.err.find("runs under " + rules + " alone") != std::string::npos);
  // --require-daemon: not started, exit 3 (daemon unreachable).
  r = run({"/bin/sh", "-c", sluice + "run --require-daemon -- /bin/echo ran"}, {}, false, 60);
  CHECK(r.status == 3);
  CHECK(r.out.empty());
  CHECK(r.err.find("not starting /bin/echo (--require-daemon)") != std::string::npos);
  // A daemon answers: nothing said, and --require-daemon starts the program.
  const std::string with_daemon =
      "'" + std::string(SLUICE_BIN) + "' serve --socket '" + sock +
      "' --log-level error & d=$!; i=0; while [ ! -S '" + sock +
      "' ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; " + sluice +
      "run --require-daemon -- /bin/echo ran; rc=$?; kill $d; wait $d; exit $rc";
  r = run({"/bin/sh", "-c", with_daemon}, {}, false, 60);
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(r.out == "ran\n");
  CHECK(r.err.empty());
}
