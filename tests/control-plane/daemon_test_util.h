// What the daemon's tests share: a daemon on a thread, stages in process,
// connections, frames, child processes, and the waits they use.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>
#include <catch2/catch.hpp>

#include "client.h"
#include "daemon.h"
#include "daemon_observer.h"
#include "sluice/board.h"
#include "sluice/control_client.h"
#include "sluice/stage.h"
#include "test_util.h"

extern char** environ;

using nlohmann::json;
using sluice::control::Connection;
using sluice::control::Daemon;
using sluice::control::DaemonOptions;
namespace wire = sluice::wire;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

namespace {

// The daemon's logs only for trouble.
const bool kQuiet = [] {
  spdlog::set_level(spdlog::level::warn);
  return true;
}();

const json kBatch = json::parse(R"({"version": 1, "rules": [
  {"rule": "create_channel", "channel": "all", "default": true},
  {"rule": "create_object", "channel": "all", "object": "limit", "type": "drl",
   "config": {"rate": 1e12}}]})");

// A directory of this test's own, removed at the end.
struct DaemonDir : sluice::testing::TempDir {
  DaemonDir() : sluice::testing::TempDir("ctl") {}
};

using sluice::testing::wait_for;

// How long a condition another thread or process brings about is awaited:
// only a failure waits that long, and a machine busy with other work may take
// seconds to run a stage, a reconnect or the daemon's loop.
constexpr auto kWait = 30s;
constexpr int kWaitMs = 30000;

// A daemon on a thread of this process.
struct InProcDaemon {
  explicit InProcDaemon(DaemonOptions o) {
    auto d = Daemon::create(std::move(o));
    INFO(d.status().to_string());
    REQUIRE(d.is_ok());
    daemon = std::move(*d);
    thread = std::thread([this] { (void)daemon->run(); });
  }
  ~InProcDaemon() {
    daemon->stop();
    thread.join();
  }
  std::unique_ptr<Daemon> daemon;
  std::thread thread;
};

// A stage that leaves this many collects in a row unanswered is dropped: far
// more than a stage slowed down by a loaded machine misses. Only the tests of
// dropping a stage for its silence set a small max_missed.
constexpr int kPatient = 1000;

inline DaemonOptions options(const std::string& socket, int interval_ms,
                             json config = json::object()) {
  DaemonOptions o;
  o.socket_path = socket;
  o.interval_ms = interval_ms;
  o.max_missed = kPatient;
  o.policy_doc = json{{"policy", "static"}, {"config", std::move(config)}};
  return o;
}

inline std::unique_ptr<Connection> connect(const std::string& socket) {
  auto c = Connection::open(socket, 2000);
  INFO(c.status().to_string());
  REQUIRE(c.is_ok());
  return std::move(*c);
}

inline json list_stages(const std::string& socket) {
  auto c = Connection::open(socket, 2000);
  if (!c) return json::array();
  auto r = (*c)->request(wire::Type::kListStages, json::object(), 2000);
  if (!r) return json::array();
  return (*r)["stages"];
}

inline bool has_stage(const std::string& socket, const std::string& name) {
  for (const auto& s : list_stages(socket)) {
    if (s["name"] == name) return true;
  }
  return false;
}

inline std::string frame_of(const std::string& payload) {
  std::string f;
  REQUIRE(wire::append_raw_frame(payload, f, 1u << 30).is_ok());
  return f;
}

// Sends `payload` as one frame and expects an error reply containing `what`.
inline void expect_error(Connection& c, const std::string& payload, const std::string& what) {
  REQUIRE(c.send_raw(frame_of(payload)).is_ok());
  auto r = c.receive(kWaitMs);
  INFO(payload);
  REQUIRE(r.is_ok());
  CHECK((*r)["type"] == "error");
  CHECK_THAT((*r).value("message", std::string()), Catch::Contains(what));
}

inline json hello(std::uint64_t id, const std::string& name) {
  return wire::make_message(wire::Type::kHello, id,
                            json{{"name", name}, {"pid", ::getpid()}, {"protocol", 1}});
}

inline pid_t spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  REQUIRE(::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) == 0);
  return pid;
}

// Stops child `pid` (SIGSTOP) and returns once it is stopped: kill() only
// queues the signal.
inline void stop_child(pid_t pid) {
  ::kill(pid, SIGSTOP);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, WUNTRACED) == pid);
  REQUIRE(WIFSTOPPED(status));
}

inline void kill_and_reap(pid_t pid, int sig = SIGKILL) {
  ::kill(pid, sig);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

struct Stage {
  explicit Stage(const std::string& socket, const std::string& name = "app") {
    sluice::StageOptions so;
    so.name = name;
    auto s = sluice::Stage::create(so);
    REQUIRE(s.is_ok());
    stage = std::move(*s);
    sluice::ControlClientOptions co;
    co.socket_path = socket;
    co.backoff_initial = 10ms;
    co.backoff_max = 100ms;
    auto c = sluice::ControlClient::start(*stage, co);
    REQUIRE(c.is_ok());
    client = std::move(*c);
  }
  std::unique_ptr<sluice::Stage> stage;
  std::unique_ptr<sluice::ControlClient> client;
};

inline std::unique_ptr<sluice::Stage> named_stage(const std::string& name) {
  sluice::StageOptions o;
  o.name = name;
  return sluice::Stage::create(o).value();
}

constexpr double kMiB = 1024.0 * 1024.0;

// A stage written by hand: says hello (with `info`) and returns the hello's
// answer.
inline json raw_hello(Connection& c, const std::string& name, const json& info = json()) {
  json body = {{"name", name}, {"pid", ::getpid()}, {"protocol", 1}};
  if (!info.is_null()) body["info"] = info;
  REQUIRE(c.send_raw(wire::encode_frame(wire::make_message(wire::Type::kHello, c.next_id(), body)))
              .is_ok());
  auto ack = c.receive(kWaitMs);
  REQUIRE(ack.is_ok());
  REQUIRE((*ack)["type"] == "ack");
  return *ack;
}

}  // namespace
