// The daemon against live peers: malformed input, churn, killed and stopped
// stages, refused uids, a daemon killed under traffic (fail-static).
//
// Peers are real sockets and real processes, so conditions are awaited by
// polling with deadlines of seconds, and no assertion depends on how soon a
// busy machine runs a peer (stages are dropped for silence only where that is
// the subject).
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

DaemonOptions options(const std::string& socket, int interval_ms, json config = json::object()) {
  DaemonOptions o;
  o.socket_path = socket;
  o.interval_ms = interval_ms;
  o.max_missed = kPatient;
  o.policy_doc = json{{"policy", "static"}, {"config", std::move(config)}};
  return o;
}

std::unique_ptr<Connection> connect(const std::string& socket) {
  auto c = Connection::open(socket, 2000);
  INFO(c.status().to_string());
  REQUIRE(c.is_ok());
  return std::move(*c);
}

json list_stages(const std::string& socket) {
  auto c = Connection::open(socket, 2000);
  if (!c) return json::array();
  auto r = (*c)->request(wire::Type::kListStages, json::object(), 2000);
  if (!r) return json::array();
  return (*r)["stages"];
}

bool has_stage(const std::string& socket, const std::string& name) {
  for (const auto& s : list_stages(socket)) {
    if (s["name"] == name) return true;
  }
  return false;
}

std::string frame_of(const std::string& payload) {
  std::string f;
  REQUIRE(wire::append_raw_frame(payload, f, 1u << 30).is_ok());
  return f;
}

// Sends `payload` as one frame and expects an error reply containing `what`.
void expect_error(Connection& c, const std::string& payload, const std::string& what) {
  REQUIRE(c.send_raw(frame_of(payload)).is_ok());
  auto r = c.receive(kWaitMs);
  INFO(payload);
  REQUIRE(r.is_ok());
  CHECK((*r)["type"] == "error");
  CHECK_THAT((*r).value("message", std::string()), Catch::Contains(what));
}

json hello(std::uint64_t id, const std::string& name) {
  return wire::make_message(wire::Type::kHello, id,
                            json{{"name", name}, {"pid", ::getpid()}, {"protocol", 1}});
}

pid_t spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  REQUIRE(::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) == 0);
  return pid;
}

// Stops child `pid` (SIGSTOP) and returns once it is stopped: kill() only
// queues the signal.
void stop_child(pid_t pid) {
  ::kill(pid, SIGSTOP);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, WUNTRACED) == pid);
  REQUIRE(WIFSTOPPED(status));
}

void kill_and_reap(pid_t pid, int sig = SIGKILL) {
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

}  // namespace

TEST_CASE("invalid messages get error replies while the daemon keeps serving", "[daemon]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  InProcDaemon d(options(sock, 50, json{{"rules", kBatch}}));
  Stage app(sock, "app");
  REQUIRE(wait_for([&] { return app.client->counters().rules_applied >= 1; }, kWait));

  auto c = connect(sock);
  expect_error(*c, "{\"v\": 1, \"type\": \"list_stages\", ", "malformed JSON at byte");
  expect_error(*c, "[1, 2, 3]", "must be a JSON object");
  expect_error(*c, R"({"v": 2, "type": "list_stages", "id": 4})", "unsupported protocol version");
  expect_error(*c, R"({"v": 1, "type": "teleport", "id": 5})", "unknown message type 'teleport'");
  expect_error(*c, R"({"v": 1, "type": "apply_rules", "id": 6, "rules": []})",
               "missing field 'stage'");
  expect_error(*c, R"({"v": 1, "type": "collect", "id": 7})", "sent by the daemon to stages");
  expect_error(*c, R"({"v": 1, "type": "hello", "id": 8, "name": "x y", "pid": 1, "protocol": 1})",
               "field 'name'");
  expect_error(*c, R"({"v": 1, "type": "get_stats", "id": 9, "stage": "ghost"})",
               "no stage named 'ghost'");

  // Invalid rule values: refused by the stage, reported to the requester,
  // and the stage keeps its rules.
  const auto version = app.stage->info().rules_version;
  auto apply = [&](const json& rules) {
    return c->request(wire::Type::kApplyRules, json{{"stage", "app"}, {"rules", rules}}, 5000);
  };
  auto neg = apply(json::array({{{"rule", "configure"},
                                 {"channel", "all"},
                                 {"object", "limit"},
                                 {"config", {{"rate", -5}}}}}));
  REQUIRE_FALSE(neg.is_ok());
  CHECK_THAT(neg.status().message(), Catch::Contains("stage 'app'") && Catch::Contains("rate"));
  auto no_channel = apply(json::array({{{"rule", "configure"},
                                        {"channel", "nope"},
                                        {"object", "limit"},
                                        {"config", {{"rate", 5}}}}}));
  REQUIRE_FALSE(no_channel.is_ok());
  CHECK_THAT(no_channel.status().message(), Catch::Contains("nope"));
  auto no_object = apply(json::array({{{"rule", "configure"},
                                       {"channel", "all"},
                                       {"object", "ghost"},
                                       {"config", {{"rate", 5}}}}}));
  REQUIRE_FALSE(no_object.is_ok());
  CHECK_THAT(no_object.status().message(), Catch::Contains("ghost"));
  CHECK(app.stage->info().rules_version == version);
  CHECK(app.client->counters().rules_rejected == 3);

  auto good = apply(json::array({{{"rule", "configure"},
                                  {"channel", "all"},
                                  {"object", "limit"},
                                  {"config", {{"rate", 2e12}}}}}));
  REQUIRE(good.is_ok());
  CHECK((*good)["rules_version"] == version + 1);

  // The same connection, and others, still work; the stage is collected.
  CHECK(c->request(wire::Type::kListStages).is_ok());
  REQUIRE(wait_for(
      [&] {
        auto r = connect(sock)->request(wire::Type::kGetStats, json{{"stage", "app"}});
        return r.is_ok() && (*r)["stages"].size() == 1 && (*r)["stages"][0]["stats"].is_object();
      },
      kWait));
  auto show = c->request(wire::Type::kPolicyShow);
  REQUIRE(show.is_ok());
  CHECK((*show)["policy"] == "static");
  CHECK((*show)["metrics"]["rounds"].get<int>() >= 1);
}

TEST_CASE("a stage's description is sent when it changes and kept between", "[daemon]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  InProcDaemon d(options(sock, 20, json{{"rules", kBatch}}));
  Stage app(sock, "app");
  REQUIRE(wait_for([&] { return app.client->counters().rules_applied >= 1; }, kWait));
  auto c = connect(sock);
  auto summary = [&]() -> json {
    auto r = c->request(wire::Type::kListStages);
    if (!r.is_ok() || (*r)["stages"].size() != 1) return json();
    return (*r)["stages"][0];
  };
  auto shows = [&](std::uint64_t version, int channels) {
    json s = summary();
    return s.is_object() && s["rules_version"] == version && s["channels"] == channels;
  };
  const std::uint64_t v1 = app.stage->rules_version();
  REQUIRE(wait_for([&] { return shows(v1, 1); }, kWait));
  // Collects whose answers leave the unchanged description out: the daemon
  // keeps the one it has.
  const std::uint64_t n = app.client->counters().collects;
  REQUIRE(wait_for([&] { return app.client->counters().collects >= n + 5; }, kWait));
  CHECK(shows(v1, 1));
  auto stats = c->request(wire::Type::kGetStats, json{{"stage", "app"}});
  REQUIRE(stats.is_ok());
  CHECK((*stats)["stages"][0]["info"]["channels"][0]["name"] == "all");
  // A new rules version: the next answer carries the new description.
  auto r =
      c->request(wire::Type::kApplyRules,
                 json{{"stage", "app"},
                      {"rules", json::array({{{"rule", "create_channel"}, {"channel", "extra"}}})}},
                 5000);
  REQUIRE(r.is_ok());
  REQUIRE(wait_for([&] { return shows(v1 + 1, 2); }, kWait));
}

// Counts the steps every stage answered (told on the daemon's thread).
struct AnsweredSteps : sluice::control::DaemonObserver {
  std::atomic<int> steps{0};
  void step_answered(std::int64_t) override { steps.fetch_add(1); }
};

TEST_CASE("the daemon takes a stage's answers to its rules in any form", "[daemon]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  AnsweredSteps observer;
  DaemonOptions o = options(sock, 30, json{{"rules", kBatch}});
  o.observer = &observer;
  InProcDaemon d(std::move(o));
  auto monitor = connect(sock);
  auto metric = [&](const char* name) {
    auto r = monitor->request(wire::Type::kPolicyShow);
    REQUIRE(r.is_ok());
    return (*r)["metrics"][name]["count"].get<int>();
  };
  // A stage written by hand: it answers collects, and the rules as told.
  auto stage = connect(sock);
  REQUIRE(stage->request(wire::Type::kHello, json{{"name", "raw"}, {"pid", 1}, {"protocol", 1}})
              .is_ok());
  auto next_rules = [&]() -> json {
    for (;;) {
      auto m = stage->receive(kWaitMs);
      REQUIRE(m.is_ok());
      if ((*m)["type"] == "rules") return *m;
      REQUIRE((*m)["type"] == "collect");
      REQUIRE(stage
                  ->send_raw(frame_of(wire::dump(
                      wire::make_message(wire::Type::kStats, (*m)["id"].get<std::uint64_t>()))))
                  .is_ok());
    }
  };
  auto resend = [&](double rate) {  // a new policy: every stage gets rules again
    json batch = kBatch;
    batch["rules"][1]["config"]["rate"] = rate;
    REQUIRE(monitor
                ->request(wire::Type::kPolicySet,
                          json{{"policy", {{"policy", "static"}, {"config", {{"rules", batch}}}}}})
                .is_ok());
  };
  // The form a stage's ControlClient writes, to the rules sent right after
  // the hello (not a step's: no step is answered by them).
  json rules = next_rules();
  std::string ack;
  wire::append_rules_ack_frame(rules["id"].get<std::uint64_t>(), 1, ack);
  REQUIRE(stage->send_raw(ack).is_ok());
  CHECK(wait_for([&] { return metric("propagation_us") == 1; }, kWait));
  CHECK(observer.steps.load() == 0);
  // Another valid form of the same answer (members in another order), to a
  // step's rules.
  resend(2e12);
  rules = next_rules();
  REQUIRE(stage
              ->send_raw(frame_of(R"({"v":1,"type":"ack","rules_version":2,"id":)" +
                                  std::to_string(rules["id"].get<std::uint64_t>()) + "}"))
              .is_ok());
  CHECK(wait_for([&] { return metric("propagation_us") == 2; }, kWait));
  CHECK(wait_for([&] { return observer.steps.load() == 1; }, kWait));
  // A refusal is not a propagation; an answer to nothing is ignored; an ack
  // in the ControlClient's form whose id was never asked goes the general way.
  resend(3e12);
  rules = next_rules();
  REQUIRE(stage
              ->send_raw(frame_of(wire::dump(wire::make_error(
                  rules["id"].get<std::uint64_t>(), sluice::Status::invalid("no, thanks")))))
              .is_ok());
  std::string stray;
  wire::append_rules_ack_frame(rules["id"].get<std::uint64_t>() + 1000, 3, stray);
  REQUIRE(stage->send_raw(stray).is_ok());
  resend(4e12);
  rules = next_rules();
  ack.clear();
  wire::append_rules_ack_frame(rules["id"].get<std::uint64_t>(), 4, ack);
  REQUIRE(stage->send_raw(ack).is_ok());
  CHECK(wait_for([&] { return metric("propagation_us") == 3; }, kWait));
  CHECK(has_stage(sock, "raw"));
}

TEST_CASE("oversized, truncated and abandoned frames do not disturb others", "[daemon]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  DaemonOptions o = options(sock, 100);
  o.max_frame = 64 * 1024;
  InProcDaemon d(std::move(o));
  auto bystander = connect(sock);

  // Oversized: an error naming the limit, then the connection is closed.
  {
    auto c = connect(sock);
    std::string header = frame_of(std::string(64 * 1024 + 1, ' ')).substr(0, 4);
    REQUIRE(c->send_raw(header).is_ok());
    auto r = c->receive(kWaitMs);
    REQUIRE(r.is_ok());
    CHECK((*r)["type"] == "error");
    CHECK_THAT((*r)["message"].get<std::string>(), Catch::Contains("exceeds the limit"));
    auto eof = c->receive(kWaitMs);
    CHECK_FALSE(eof.is_ok());
    CHECK(c->peer_closed());
  }
  // Truncated: half a frame, then silence; then the peer leaves mid-frame.
  {
    auto c = connect(sock);
    std::string f = frame_of(hello(1, "half").dump());
    REQUIRE(c->send_raw(f.substr(0, f.size() / 2)).is_ok());
    CHECK(bystander->request(wire::Type::kListStages).is_ok());
    auto r = c->receive(100);
    CHECK_FALSE(r.is_ok());  // nothing to answer yet
    CHECK_FALSE(c->peer_closed());
  }
  // A frame split into single bytes is one message.
  {
    auto c = connect(sock);
    std::string f = frame_of(wire::make_message(wire::Type::kListStages, 3).dump());
    for (char ch : f) REQUIRE(c->send_raw(std::string(1, ch)).is_ok());
    auto r = c->receive(kWaitMs);
    REQUIRE(r.is_ok());
    CHECK((*r)["type"] == "ack");
    CHECK((*r)["id"] == 3);
  }
  // Deeply nested JSON and a frame of garbage bytes.
  expect_error(*bystander, std::string(5000, '[') + std::string(5000, ']'), "nested deeper");
  expect_error(*bystander, std::string("\x00\x01\x02\xff", 4), "malformed JSON");
  CHECK(bystander->request(wire::Type::kListStages).is_ok());
}

TEST_CASE("stage names are unique and hello is said once", "[daemon]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  InProcDaemon d(options(sock, 1000));
  auto a = connect(sock);
  auto b = connect(sock);
  auto ra = a->request(wire::Type::kHello, json{{"name", "db"}, {"pid", 1}, {"protocol", 1}});
  REQUIRE(ra.is_ok());
  CHECK((*ra)["name"] == "db");
  auto rb = b->request(wire::Type::kHello, json{{"name", "db"}, {"pid", 2}, {"protocol", 1}});
  REQUIRE(rb.is_ok());
  CHECK((*rb)["name"] == "db-2");
  auto again = a->request(wire::Type::kHello, json{{"name", "db"}, {"pid", 1}, {"protocol", 1}});
  REQUIRE_FALSE(again.is_ok());
  CHECK_THAT(again.status().message(), Catch::Contains("already registered"));
  auto wrong =
      connect(sock)->request(wire::Type::kHello, json{{"name", "x"}, {"pid", 1}, {"protocol", 2}});
  REQUIRE_FALSE(wrong.is_ok());
  CHECK_THAT(wrong.status().message(), Catch::Contains("protocol version 2"));
}

TEST_CASE("200 simulated stages connect and disconnect repeatedly", "[daemon]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  InProcDaemon d(options(sock, 2000, json{{"rules", kBatch}}));
  for (int round = 0; round < 3; ++round) {
    std::vector<std::unique_ptr<Connection>> conns;
    for (int i = 0; i < 200; ++i) {
      conns.push_back(connect(sock));
      REQUIRE(
          conns.back()->send_raw(frame_of(hello(1, "sim-" + std::to_string(i)).dump())).is_ok());
    }
    for (auto& c : conns) {
      auto r = c->receive(kWaitMs);
      REQUIRE(r.is_ok());
      REQUIRE((*r)["type"] == "ack");
    }
    CHECK(list_stages(sock).size() == 200);
    // Half leave abruptly mid-frame, half cleanly.
    for (std::size_t i = 0; i < conns.size(); i += 2) {
      (void)conns[i]->send_raw(std::string("\x00\x00\x01", 3));
    }
    conns.clear();
    REQUIRE(wait_for([&] { return list_stages(sock).empty(); }, kWait));
  }
  auto show = connect(sock)->request(wire::Type::kPolicyShow);
  REQUIRE(show.is_ok());
  CHECK((*show)["metrics"]["sessions"].get<int>() == 1);  // just this one
}

TEST_CASE("a killed stage is dropped within one interval; a stopped one is dropped and returns",
          "[daemon]") {
  DaemonDir dir;
  {
    // The first interval is a minute away, so no collect can have gone
    // unanswered: the closed connection is what drops the stage.
    const std::string sock = dir.file("k.sock");
    InProcDaemon d(options(sock, 60000, json{{"rules", kBatch}}));
    pid_t victim = spawn({SLUICE_TEST_STAGE_BIN, sock, "victim"});
    REQUIRE(wait_for([&] { return has_stage(sock, "victim"); }, kWait));
    kill_and_reap(victim);
    CHECK(wait_for([&] { return !has_stage(sock, "victim"); }, kWait));
    auto show = connect(sock)->request(wire::Type::kPolicyShow);
    REQUIRE(show.is_ok());
    CHECK((*show)["metrics"]["dropped_missed"] == 0);
  }
  // A stopped stage leaves its collects unanswered and is dropped for that
  // (three in a row here, which a stage merely slowed down does not miss).
  const std::string sock = dir.file("s.sock");
  DaemonOptions o = options(sock, 500, json{{"rules", kBatch}});
  o.max_missed = 3;
  InProcDaemon d(std::move(o));
  auto dropped_missed = [&] {
    auto show = connect(sock)->request(wire::Type::kPolicyShow);
    REQUIRE(show.is_ok());
    return (*show)["metrics"]["dropped_missed"].get<int>();
  };
  pid_t sleeper = spawn({SLUICE_TEST_STAGE_BIN, sock, "sleeper"});
  REQUIRE(wait_for([&] { return has_stage(sock, "sleeper"); }, kWait));
  const int dropped_before = dropped_missed();
  stop_child(sleeper);
  REQUIRE(wait_for([&] { return !has_stage(sock, "sleeper"); }, kWait));
  CHECK(dropped_missed() == dropped_before + 1);
  ::kill(sleeper, SIGCONT);
  CHECK(wait_for([&] { return has_stage(sock, "sleeper"); }, kWait));
  kill_and_reap(sleeper);
}

namespace {

// The listing of one stage, or an empty object.
json stage_summary(const std::string& socket, const std::string& name) {
  for (const auto& s : list_stages(socket)) {
    if (s["name"] == name) return s;
  }
  return json::object();
}

// A stage process of its own, killed (stopped or not) and reaped at scope exit.
struct StageProcess {
  StageProcess(const std::string& socket, const std::string& name)
      : pid(spawn({SLUICE_TEST_STAGE_BIN, socket, name})) {}
  ~StageProcess() { kill_and_reap(pid); }
  StageProcess(const StageProcess&) = delete;
  StageProcess& operator=(const StageProcess&) = delete;
  pid_t pid;
};

json add_channel(const std::string& name) {
  return json::array({{{"rule", "create_channel"}, {"channel", name}}});
}

}  // namespace

TEST_CASE(
    "rules for a stopped stage are pending; it applies them on resuming and the daemon follows",
    "[daemon]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  DaemonOptions o = options(sock, 50, json{{"rules", kBatch}});
  o.max_missed = 1'000'000;  // the stopped stage stays listed
  o.forward_timeout = 300ms;
  InProcDaemon d(std::move(o));
  StageProcess sleeper(sock, "sleeper");
  const pid_t pid = sleeper.pid;
  REQUIRE(
      wait_for([&] { return stage_summary(sock, "sleeper").value("channels", 0) == 1; }, kWait));
  const auto version = stage_summary(sock, "sleeper")["rules_version"].get<std::uint64_t>();

  stop_child(pid);
  auto c = connect(sock);
  auto r = c->request(wire::Type::kApplyRules,
                      json{{"stage", "sleeper"}, {"rules", add_channel("extra")}}, 10000);
  REQUIRE_FALSE(r.is_ok());
  INFO(r.status().to_string());
  CHECK(r.status().code() == sluice::Code::kPending);
  CHECK_THAT(r.status().message(), Catch::Contains("applies them when it resumes"));
  // The CLI says so, and exits 4.
  std::ofstream(dir.file("more.json")) << add_channel("more").dump();
  const int rc = std::system((std::string(SLUICE_BIN) + " --socket " + sock + " rules apply " +
                              dir.file("more.json") + " --stage sleeper 2>" + dir.file("err"))
                                 .c_str());
  CHECK((WIFEXITED(rc) ? WEXITSTATUS(rc) : -1) == 4);
  std::ifstream err(dir.file("err"));
  const std::string said((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  CHECK_THAT(said, Catch::StartsWith("sluice: pending: stage 'sleeper' has not answered"));
  json stopped = stage_summary(sock, "sleeper");
  CHECK(stopped["unanswered_rules"] == 2);
  CHECK(stopped["rules_version"] == version);

  // Resumed, the stage applies the rules it was sent and answers everything
  // it was asked; the daemon takes the late answers, the new description
  // (which the stage sends once, in its first answer) included.
  ::kill(pid, SIGCONT);
  CHECK(wait_for(
      [&] {
        json s = stage_summary(sock, "sleeper");
        return s.value("rules_version", std::uint64_t{0}) == version + 2 &&
               s.value("channels", 0) == 3;
      },
      kWait));
  CHECK(wait_for([&] { return stage_summary(sock, "sleeper").value("unanswered_rules", -1) == 0; },
                 kWait));
  auto show = c->request(wire::Type::kPolicyShow);
  REQUIRE(show.is_ok());
  CHECK((*show)["metrics"]["late_rules_answers"] == 2);
  CHECK((*show)["metrics"]["late_collect_answers"].get<int>() >= 1);
}

TEST_CASE("rules that reached a stage dropped while stopped are pending and not failed",
          "[daemon]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  DaemonOptions o = options(sock, 500, json{{"rules", kBatch}});
  o.max_missed = 3;         // dropped for its silence while stopped, not when slow
  o.forward_timeout = 20s;  // the drop (three missed collects) comes first
  InProcDaemon d(std::move(o));
  StageProcess dropped(sock, "dropped");
  const pid_t pid = dropped.pid;
  REQUIRE(
      wait_for([&] { return stage_summary(sock, "dropped").value("channels", 0) == 1; }, kWait));

  stop_child(pid);
  auto r = connect(sock)->request(
      wire::Type::kApplyRules, json{{"stage", "dropped"}, {"rules", add_channel("extra")}}, 30000);
  REQUIRE_FALSE(r.is_ok());
  INFO(r.status().to_string());
  CHECK(r.status().code() == sluice::Code::kPending);
  CHECK_THAT(r.status().message(), Catch::Contains("disconnected before answering"));
  CHECK_FALSE(has_stage(sock, "dropped"));
  // The rules were in its connection's queue: it applies them on resuming,
  // then reconnects and says so.
  ::kill(pid, SIGCONT);
  CHECK(wait_for([&] { return stage_summary(sock, "dropped").value("channels", 0) == 2; }, kWait));
}

TEST_CASE("the socket is 0600, stale sockets are replaced, other files and live daemons are not",
          "[daemon]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  {
    InProcDaemon d(options(sock, 1000));
    struct stat st {};
    REQUIRE(::lstat(sock.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    auto second = Daemon::create(options(sock, 1000));
    REQUIRE_FALSE(second.is_ok());
    CHECK_THAT(second.status().message(), Catch::Contains("already serving"));
  }
  // A stale socket (nobody listening) is replaced.
  {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, sock.c_str());
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    ::close(fd);
    InProcDaemon d(options(sock, 1000));
    CHECK(connect(sock)->request(wire::Type::kListStages).is_ok());
  }
  // A regular file is never removed.
  std::ofstream(dir.file("plain")) << "data";
  auto refused = Daemon::create(options(dir.file("plain"), 1000));
  REQUIRE_FALSE(refused.is_ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("not a socket"));
  CHECK(std::ifstream(dir.file("plain")).good());
}

TEST_CASE("--socket-group makes the socket 0660 owned by that group", "[daemon]") {
  if (::geteuid() != 0) {
    WARN("not root: cannot chown the socket");
    return;
  }
  DaemonDir dir;
  const std::string sock = dir.file("g.sock");
  DaemonOptions o = options(sock, 1000);
  o.socket_group = "nogroup";
  InProcDaemon d(std::move(o));
  struct stat st {};
  REQUIRE(::lstat(sock.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0660);
  CHECK(st.st_gid == 65534);
  DaemonOptions bad = options(dir.file("h.sock"), 1000);
  bad.socket_group = "no-such-group-here";
  auto refused = Daemon::create(std::move(bad));
  REQUIRE_FALSE(refused.is_ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("does not exist"));
}

TEST_CASE("peers of another uid are refused unless allowed", "[daemon]") {
  if (::geteuid() != 0) {
    WARN("not root: cannot run a peer under another uid");
    return;
  }
  DaemonDir dir;
  REQUIRE(::chmod(dir.path.c_str(), 0755) == 0);
  const std::string sock = dir.file("d.sock");
  const std::string hello_frame = frame_of(hello(1, "intruder").dump());

  // Connects as uid 65534 and returns what the daemon answered ("" if the
  // connection failed, "EACCES" if the socket's mode refused it).
  auto as_nobody = [&](const std::string& frame) -> std::string {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(p[0]);
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
      int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::memcpy(addr.sun_path, sock.c_str(), sock.size());
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        const char* e = errno == EACCES ? "EACCES" : "CONNECT";
        (void)!::write(p[1], e, std::strlen(e));
        ::_exit(0);
      }
      // The daemon may refuse and close before the hello arrives: send() with
      // MSG_NOSIGNAL so that race costs an EPIPE, not the child (SIGPIPE), and
      // the refusal already queued for us is still read below.
      (void)!::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
      char buf[4096];
      pollfd pf{fd, POLLIN, 0};
      std::size_t got = 0;
      while (got < sizeof(buf) && ::poll(&pf, 1, 5000) > 0) {
        ssize_t n = ::read(fd, buf + got, sizeof(buf) - got);
        if (n <= 0) break;
        got += static_cast<std::size_t>(n);
        if (got > 4) break;  // enough to see the reply
      }
      (void)!::write(p[1], buf, got);
      ::_exit(0);
    }
    ::close(p[1]);
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(p[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<std::size_t>(n));
    ::close(p[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return out;
  };

  {
    InProcDaemon d(options(sock, 1000));
    CHECK(as_nobody(hello_frame) == "EACCES");  // mode 0600 stops it first
    REQUIRE(::chmod(sock.c_str(), 0666) == 0);  // now only SO_PEERCRED stands in the way
    std::string reply = as_nobody(hello_frame);
    CHECK_THAT(reply, Catch::Contains("permission denied: uid 65534") &&
                          Catch::Contains("\"code\":\"permission_denied\""));
    CHECK(list_stages(sock).empty());
  }
  {
    DaemonOptions o = options(sock, 1000);
    o.allow_uids = {65534};
    InProcDaemon d(std::move(o));
    REQUIRE(::chmod(sock.c_str(), 0666) == 0);
    std::string reply = as_nobody(hello_frame);
    CHECK_THAT(reply, Catch::Contains("\"type\":\"ack\"") && Catch::Contains("intruder"));
    // Admitted is not in charge: the policy is for administrators only.
    reply = as_nobody(frame_of(
        wire::make_message(wire::Type::kPolicySet, 1, json{{"policy", {{"policy", "static"}}}})
            .dump()));
    CHECK_THAT(reply, Catch::Contains("permission denied: uid 65534 may not set the policy"));
  }
}

TEST_CASE("policy set over the socket resends rules; path settings are refused", "[daemon]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  InProcDaemon d(options(sock, 50, json{{"rules", kBatch}}));
  Stage app(sock, "app");
  REQUIRE(wait_for([&] { return app.client->counters().rules_applied >= 1; }, kWait));
  auto c = connect(sock);
  json batch = kBatch;
  batch["rules"][1]["config"]["rate"] = 12345;
  auto r = c->request(wire::Type::kPolicySet,
                      json{{"policy", {{"policy", "static"}, {"config", {{"rules", batch}}}}}});
  REQUIRE(r.is_ok());
  REQUIRE(wait_for([&] { return app.client->counters().rules_applied >= 2; }, kWait));
  auto bad = c->request(
      wire::Type::kPolicySet,
      json{{"policy", {{"policy", "static"}, {"config", {{"rules_file", "/etc/shadow"}}}}}});
  REQUIRE_FALSE(bad.is_ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("not accepted over the socket"));
  auto unknown = c->request(wire::Type::kPolicySet, json{{"policy", {{"policy", "nope"}}}});
  REQUIRE_FALSE(unknown.is_ok());
  CHECK_THAT(unknown.status().message(), Catch::Contains("unknown policy"));
  auto show = c->request(wire::Type::kPolicyShow);
  REQUIRE(show.is_ok());
  CHECK((*show)["describe"]["rules"]["rules"][1]["config"]["rate"] == 12345);
}

TEST_CASE("the daemon SIGKILLed under traffic: stages keep enforcing, reconnect, rules return",
          "[daemon][failover]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  const std::string policy = dir.file("policy.json");
  const int interval = 200;
  std::ofstream(policy) << json{
      {"policy", "static"},
      {"interval_ms", interval},
      {"config",
       {{"rules", kBatch}}}}.dump();
  // The stage's reconnects are the daemon's restarts only (kPatient).
  const std::vector<std::string> serve = {
      SLUICE_BIN, "serve",       "--socket", sock,           "--policy",
      policy,     "--log-level", "warn",     "--max-missed", std::to_string(kPatient)};
  pid_t daemon = spawn(serve);
  REQUIRE(wait_for([&] { return Connection::open(sock, 100).is_ok(); }, kWait));

  Stage app(sock, "app");
  REQUIRE(wait_for([&] { return app.client->counters().rules_applied >= 1; }, kWait));

  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> issued{0}, returned{0}, rejected{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 2; ++t) {
    workers.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        issued.fetch_add(1, std::memory_order_relaxed);
        auto r = app.stage->enforce(sluice::Op::kWrite, 4096);
        if (r.outcome == sluice::Outcome::kRejected) rejected.fetch_add(1);
        returned.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  REQUIRE(wait_for([&] { return returned.load() > 1000; }, kWait));

  kill_and_reap(daemon);
  REQUIRE(wait_for([&] { return !app.client->connected(); }, kWait));
  const auto connects = app.client->counters().connects;
  const auto applied = app.client->counters().rules_applied;
  // Fail-static: enforcement goes on with the last rules.
  const auto before = returned.load();
  REQUIRE(wait_for([&] { return returned.load() > before + 10000; }, kWait));
  CHECK(app.stage->info().channels.size() == 1);

  // Back, the daemon sends the stage its rules with the hello's answer (how
  // soon is the subject of "a new stage gets its first rules right after its
  // hello's answer").
  daemon = spawn(serve);  // the SIGKILLed daemon left a stale socket behind
  REQUIRE(wait_for([&] { return app.client->counters().connects > connects; }, kWait));
  REQUIRE(wait_for([&] { return app.client->counters().rules_applied > applied; }, kWait));
  CHECK(app.stage->info().channels.size() == 1);

  // SIGHUP re-reads the policy file; the new rules reach the stage.
  json changed = kBatch;
  changed["rules"][1]["config"]["rate"] = 5e11;
  std::ofstream(policy) << json{
      {"policy", "static"},
      {"interval_ms", interval},
      {"config",
       {{"rules", changed}}}}.dump();
  const auto applied_before_hup = app.client->counters().rules_applied;
  ::kill(daemon, SIGHUP);
  REQUIRE(
      wait_for([&] { return app.client->counters().rules_applied > applied_before_hup; }, kWait));
  CHECK(app.stage->info().rules_version > 0);

  stop = true;
  for (auto& w : workers) w.join();
  CHECK(returned.load() == issued.load());  // no request was lost or stuck
  CHECK(rejected.load() == 0);
  kill_and_reap(daemon, SIGTERM);
}

TEST_CASE("report_log gets one JSON line per policy step", "[daemon]") {
  DaemonDir dir;
  {
    DaemonOptions o = options(dir.file("r.sock"), 20);
    o.report_log = dir.file("report.jsonl");
    InProcDaemon d(std::move(o));
    auto lines = [&] {
      std::ifstream f(dir.file("report.jsonl"));
      std::vector<std::string> out;
      for (std::string l; std::getline(f, l);) out.push_back(l);
      return out;
    };
    REQUIRE(wait_for([&] { return lines().size() >= 3; }, kWait));
    for (const auto& l : lines()) {
      const json j = json::parse(l);  // every line whole
      CHECK(j.at("policy") == "static");
      CHECK(j.at("report").is_object());
      CHECK(j.at("unix_time").get<double>() > 1.6e9);
    }
  }
  DaemonOptions bad = options(dir.file("b.sock"), 20);
  bad.report_log = dir.file("no/such/dir/report.jsonl");
  auto d = Daemon::create(std::move(bad));
  REQUIRE_FALSE(d.is_ok());
  CHECK_THAT(d.status().message(), Catch::Contains("report log") && Catch::Contains("no/such/dir"));
}

TEST_CASE("sluice stats and top list the deferral gates' partitions", "[daemon][cli]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  InProcDaemon d(options(sock, 100));
  auto output = [&](const std::string& args) {
    std::string out;
    FILE* f = ::popen((std::string(SLUICE_BIN) + " --socket " + sock + " " + args).c_str(), "r");
    REQUIRE(f != nullptr);
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) out.append(buf, n);
    CHECK(::pclose(f) == 0);
    return out;
  };
  CHECK(output("stats").find("PARTITION") == std::string::npos);  // no gate, no section
  sluice::StageOptions so;
  so.name = "gated";
  auto st = sluice::Stage::create(so);
  REQUIRE(st.is_ok());
  REQUIRE((*st)
              ->apply(json::parse(R"([
    {"rule": "create_channel", "channel": "bg", "default": true},
    {"rule": "create_object", "channel": "bg", "object": "deferral", "type": "deferral-gate",
     "config": {"hold_ms": 600000, "decide": {"orders": "first-stage", "7": "resume"}}}])"))
              .is_ok());
  sluice::ControlClientOptions co;
  co.socket_path = sock;
  auto c = sluice::ControlClient::start(**st, co);
  REQUIRE(c.is_ok());
  REQUIRE(wait_for([&] { return (*c)->counters().collects >= 1; }, kWait));
  for (const std::string args : {"stats", "top --once"}) {
    INFO(args);
    const std::string out = output(args);
    CHECK_THAT(out, Catch::Contains("PARTITION") && Catch::Contains("bg/deferral"));
    CHECK_THAT(out, Catch::Contains("orders       first-stage  first-stage"));
    CHECK_THAT(out, Catch::Contains("7            normal       resume"));
  }
}

TEST_CASE("the CLI's exit codes", "[daemon][cli]") {
  DaemonDir dir;
  auto run = [&](const std::string& args) {
    int st = std::system((std::string(SLUICE_BIN) + " " + args + " >/dev/null 2>&1").c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  CHECK(run("--help") == 0);
  CHECK(run("stages --help") == 0);
  CHECK(run("") == 2);
  CHECK(run("frobnicate") == 2);
  CHECK(run("--socket " + dir.file("none.sock") + " stages") == 3);
  // The global options are taken after the subcommand too.
  CHECK(run("stages --socket " + dir.file("none.sock")) == 3);
  CHECK(run("policy show --timeout 50 --socket " + dir.file("none.sock")) == 3);
  CHECK(run("stages --timeout 0") == 2);  // out of range, wherever it is given
  CHECK(run("stages --frobnicate") == 2);
  CHECK(run("rules apply /nonexistent --stage x") == 2);
  CHECK(run("serve --report-log /nonexistent/dir/r.jsonl --socket " + dir.file("x.sock")) == 1);
  // A policy file that is wrong in any way is a usage error, malformed or not.
  std::ofstream(dir.file("unknown.json")) << R"({"policy": "nope"})";
  std::ofstream(dir.file("broken.json")) << R"({"policy": )";
  std::ofstream(dir.file("invalid.json")) << R"({"policy": "static", "config": {"rules": 5}})";
  for (const char* f : {"unknown.json", "broken.json", "invalid.json"}) {
    INFO(f);
    CHECK(run("serve --socket " + dir.file("y.sock") + " --policy " + dir.file(f)) == 2);
  }
#if SLUICE_TEST_ASAN || SLUICE_TEST_TSAN
  // A sanitized preload library cannot load into an uninstrumented `true`: the
  // sanitizer runtime refuses, and exits or aborts depending on *SAN_OPTIONS.
  // What `run` itself does is checked in the plain build.
  WARN("sanitizer build: not checking `sluice run -- true`");
#else
  CHECK(run("--socket " + dir.file("none.sock") + " run -- true") == 0);
#endif
  CHECK(::setenv("SLUICE_PRELOAD_LIB", "/nonexistent/libsluice_preload.so", 1) == 0);
  CHECK(run("run -- true") == 2);
  ::unsetenv("SLUICE_PRELOAD_LIB");

  const std::string sock = dir.file("d.sock");
  InProcDaemon d(options(sock, 100));
  CHECK(run("--socket " + sock + " stages") == 0);
  CHECK(run("--socket " + sock + " stats --json") == 0);
  CHECK(run("--socket " + sock + " top --once") == 0);
  CHECK(run("--socket " + sock + " policy show") == 0);
  CHECK(run("policy show --socket " + sock) == 0);
  CHECK(run("stats --json --socket " + sock) == 0);
  {
    // The listings with a stage to list, labels and all (`stages` once read
    // its labels through a dangling reference and crashed).
    sluice::StageOptions so;
    so.name = "labelled";
    so.labels = {{"app", "db"}, {"tier", "gold"}};
    auto st = sluice::Stage::create(so);
    REQUIRE(st.is_ok());
    REQUIRE((*st)->apply(kBatch).is_ok());
    sluice::ControlClientOptions co;
    co.socket_path = sock;
    auto c = sluice::ControlClient::start(**st, co);
    REQUIRE(c.is_ok());
    REQUIRE(wait_for([&] { return has_stage(sock, "labelled"); }, kWait));
    REQUIRE(wait_for([&] { return (*c)->counters().collects >= 1; }, kWait));
    CHECK(run("--socket " + sock + " stages") == 0);
    CHECK(run("--socket " + sock + " stages --json") == 0);
    CHECK(run("--socket " + sock + " stats") == 0);
    CHECK(run("--socket " + sock + " stats --json") == 0);
    CHECK(run("--socket " + sock + " top --once") == 0);
  }
  std::ofstream(dir.file("rules.json")) << kBatch.dump();
  CHECK(run("--socket " + sock + " rules apply " + dir.file("rules.json") + " --stage ghost") == 1);
  std::ofstream(dir.file("p.json"))
      << json{{"policy", "static"}, {"config", {{"rules_file", "rules.json"}}}}.dump();
  CHECK(run("--socket " + sock + " policy set " + dir.file("p.json")) == 0);
  auto show = connect(sock)->request(wire::Type::kPolicyShow);
  REQUIRE(show.is_ok());
  CHECK((*show)["describe"]["rules"] == kBatch);  // the CLI inlined the rules file
}

namespace {

// A stage that says hello with `board_fd` (-1: none) on its first bytes and
// an offer of a board, then reads nothing but the hello's answer.
json hello_with_board(Connection& c, sluice::Stage& stage, int board_fd) {
  json info;
  to_json(info, stage.info());
  json msg = wire::make_message(wire::Type::kHello, c.next_id(),
                                json{{"name", stage.name()},
                                     {"pid", ::getpid()},
                                     {"protocol", 1},
                                     {"info", info},
                                     {"board", wire::board_offer()}});
  const std::string frame = wire::encode_frame(msg);
  if (board_fd >= 0) {
    REQUIRE(sluice::send_with_fd(c.fd(), frame.data(), frame.size(), board_fd) ==
            static_cast<long>(frame.size()));
  } else {
    REQUIRE(c.send_raw(frame).is_ok());
  }
  auto ack = c.receive(kWaitMs);
  REQUIRE(ack.is_ok());
  REQUIRE((*ack)["type"] == "ack");
  return *ack;
}

// Answers what the daemon sent a stage written by hand (collects and rules
// alike with a plain ack) without applying anything, until it sends nothing
// for 10 ms.
void answer_all(Connection& c) {
  for (;;) {
    auto m = c.receive(10);
    if (!m.is_ok()) return;
    const std::string type = (*m)["type"];
    if (type == "collect" || type == "rules") {
      REQUIRE(c.send_raw(wire::encode_frame(wire::make_ack((*m)["id"]))).is_ok());
    }
  }
}

std::unique_ptr<sluice::Stage> named_stage(const std::string& name) {
  sluice::StageOptions o;
  o.name = name;
  return sluice::Stage::create(o).value();
}

// A new rate for the drl of kBatch's layout, which a board can carry.
const json kConfigure = json::parse(R"({"version": 1, "rules": [
  {"rule": "configure", "channel": "all", "object": "limit", "config": {"rate": 12345}}]})");

double drl_rate(sluice::Stage& stage) {
  for (const auto& ch : stage.totals().channels) {
    for (const auto& o : ch.objects) {
      if (o.type == "drl") return o.state.value("rate", 0.0);
    }
  }
  return 0;
}

}  // namespace

TEST_CASE("a policy's tunables reach a stage's board with no message read", "[daemon][board]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  InProcDaemon d(options(sock, 20, json{{"rules", kConfigure}, {"replace", false}}));

  // The stage holds the layout already (a local rules file, say) and answers
  // the daemon without applying anything: only the board can change its rate.
  auto stage = named_stage("raw");
  REQUIRE(stage->apply(kBatch).is_ok());
  const int board = stage->board().value();
  auto conn = connect(sock);
  CHECK(hello_with_board(*conn, *stage, board)["board"] == true);
  const std::uint64_t version = stage->rules_version();
  REQUIRE(wait_for(
      [&] {
        answer_all(*conn);
        return drl_rate(*stage) == 12345;
      },
      kWait));
  CHECK(stage->rules_version() == version);
  CHECK(stage->board_updates() >= 1);

  auto monitor = connect(sock);
  auto listed = monitor->request(wire::Type::kListStages);
  REQUIRE(listed.is_ok());
  CHECK((*listed)["stages"][0]["board"] == true);
  auto shown = monitor->request(wire::Type::kPolicyShow);
  REQUIRE(shown.is_ok());
  CHECK((*shown)["metrics"]["board_writes"].get<int>() >= 1);
  CHECK((*shown)["metrics"]["board_propagation_us"]["count"].get<int>() >= 1);

  // A batch the board cannot carry whole (a field that is no tunable) goes by
  // message only: this stage, which reads none, keeps its rate.
  const auto writes = [&] {
    auto r = monitor->request(wire::Type::kPolicyShow);
    REQUIRE(r.is_ok());
    return (*r)["metrics"]["board_writes"].get<int>();
  };
  const int before = writes();
  REQUIRE(
      monitor
          ->request(
              wire::Type::kPolicySet,
              json{{"policy",
                    {{"policy", "static"},
                     {"config", {{"replace", false}, {"rules", json::parse(R"([{"rule": "configure",
                                  "channel": "all", "object": "limit",
                                  "config": {"rate": 777, "unit": "ops"}}])")}}}}}})
          .is_ok());
  // The step that decided it has run once its message is here (the board is
  // written before the message is sent).
  REQUIRE(wait_for(
      [&] {
        auto m = conn->receive(10);
        if (!m.is_ok()) return false;
        const std::string type = (*m)["type"];
        if (type == "collect" || type == "rules") {
          REQUIRE(conn->send_raw(wire::encode_frame(wire::make_ack((*m)["id"]))).is_ok());
        }
        return type == "rules" && (*m)["rules"].dump().find("\"ops\"") != std::string::npos;
      },
      kWait));
  CHECK(writes() == before);
  CHECK(drl_rate(*stage) == 12345);
}

namespace {

// The events an observer is told, as text, in the order told (on the
// daemon's thread).
struct EventLog : sluice::control::DaemonObserver {
  std::mutex mu;
  std::vector<std::string> events;
  std::atomic<int> rounds{0};
  void add(std::string e) {
    std::lock_guard lock(mu);
    events.push_back(std::move(e));
  }
  std::vector<std::string> snapshot() {
    std::lock_guard lock(mu);
    return events;
  }
  static std::string at(std::int64_t ns) { return " @" + std::to_string(ns); }
  void round_finished(std::int64_t started_ns) override {
    if (started_ns > 0) rounds.fetch_add(1);
  }
  void step_decided(std::int64_t d) override { add("decided" + at(d)); }
  void board_written(std::string_view stage, std::int64_t d) override {
    add("board " + std::string(stage) + at(d));
  }
  void rules_writing(std::string_view stage, std::int64_t d) override {
    add("writing " + std::string(stage) + at(d));
  }
  void rules_written(std::string_view stage, std::int64_t d) override {
    add("written " + std::string(stage) + at(d));
  }
  void step_sent(std::int64_t d, std::size_t frames) override {
    add("sent " + std::to_string(frames) + at(d));
  }
  void step_answered(std::int64_t d) override { add("answered" + at(d)); }
};

}  // namespace

TEST_CASE("an observer is told of each step's events, in order", "[daemon][observer]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  EventLog log;
  DaemonOptions o = options(sock, 20, json{{"rules", kConfigure}, {"replace", false}});
  o.observer = &log;
  InProcDaemon d(std::move(o));
  auto stage = named_stage("raw");
  REQUIRE(stage->apply(kBatch).is_ok());
  auto conn = connect(sock);
  REQUIRE(hello_with_board(*conn, *stage, stage->board().value())["board"] == true);
  // Its first rules are no step's: their board write is told, no frame is.
  REQUIRE(wait_for(
      [&] {
        answer_all(*conn);
        return drl_rate(*stage) == 12345 && log.rounds.load() >= 2;
      },
      kWait));

  // A new policy: the next step writes the board and sends the batch, which
  // the stage answers. The frame carries the decision time the observer got.
  json batch = kConfigure;
  batch["rules"][0]["config"]["rate"] = 999;
  REQUIRE(connect(sock)
              ->request(wire::Type::kPolicySet,
                        json{{"policy",
                              {{"policy", "static"},
                               {"config", {{"rules", batch}, {"replace", false}}}}}})
              .is_ok());
  std::int64_t decided = 0;
  REQUIRE(wait_for(
      [&] {
        auto m = conn->receive(10);
        if (!m.is_ok()) return false;
        const std::string type = (*m)["type"];
        if (type == "collect" || type == "rules") {
          REQUIRE(conn->send_raw(wire::encode_frame(wire::make_ack((*m)["id"]))).is_ok());
        }
        if (type == "rules" && (*m)["rules"]["rules"][0]["config"]["rate"] == 999) {
          decided = (*m)["decided_ns"].get<std::int64_t>();
        }
        return decided != 0;
      },
      kWait));
  const std::string at = EventLog::at(decided);
  const std::vector<std::string> want = {"decided" + at,     "board raw" + at, "writing raw" + at,
                                         "written raw" + at, "sent 1" + at,    "answered" + at};
  std::vector<std::string> got;
  REQUIRE(wait_for(
      [&] {
        got.clear();
        for (const std::string& e : log.snapshot()) {
          if (e.size() > at.size() && e.compare(e.size() - at.size(), at.size(), at) == 0) {
            got.push_back(e);
          }
        }
        return got.size() >= want.size();
      },
      kWait));
  CHECK(got == want);
  // The first event about the stage is its first rules' board write.
  for (const std::string& e : log.snapshot()) {
    if (e.find(" raw @") == std::string::npos) continue;
    CHECK(e.rfind("board raw @", 0) == 0);
    break;
  }
}

TEST_CASE("boards that are not one are refused; the stage is served by messages",
          "[daemon][board]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  InProcDaemon d(options(sock, 20));
  auto stage = named_stage("s");
  REQUIRE(stage->apply(kBatch).is_ok());

  auto no_fd = connect(sock);
  CHECK(hello_with_board(*no_fd, *stage, -1)["board"] == false);

  int p[2];
  REQUIRE(::pipe(p) == 0);
  auto pipe_fd = connect(sock);
  CHECK(hello_with_board(*pipe_fd, *stage, p[0])["board"] == false);
  ::close(p[0]);
  ::close(p[1]);

  const int unsealed = ::memfd_create("unsealed", MFD_CLOEXEC);
  REQUIRE(unsealed >= 0);
  REQUIRE(::ftruncate(unsealed, static_cast<off_t>(sluice::kBoardBytes)) == 0);
  auto open_ended = connect(sock);
  CHECK(hello_with_board(*open_ended, *stage, unsealed)["board"] == false);
  ::close(unsealed);

  // A client that sends a descriptor with a request: closed, answered.
  auto client = connect(sock);
  const std::string frame =
      wire::encode_frame(wire::make_message(wire::Type::kListStages, client->next_id()));
  REQUIRE(sluice::send_with_fd(client->fd(), frame.data(), frame.size(), stage->board().value()) ==
          static_cast<long>(frame.size()));
  auto r = client->receive(kWaitMs);
  REQUIRE(r.is_ok());
  CHECK((*r)["stages"].size() == 3);
  for (const auto& s : (*r)["stages"]) CHECK(s["board"] == false);

  // A stage with a control client: its board is mapped, and the daemon's
  // rules still arrive as messages too.
  Stage app(sock, "app");
  REQUIRE(wait_for([&] { return app.client->counters().board; }, kWait));
}

namespace {

// Fakes the uid the daemon sees for the next connection it accepts
// (DaemonOptions::peer_credentials_hook). Peers connect one at a time: open()
// waits until the daemon has accepted the connection.
struct FakeUids {
  std::atomic<std::int64_t> next{-1};
  std::atomic<int> accepted{0};

  void install(DaemonOptions& o) {
    o.peer_credentials_hook = [this](int, DaemonOptions::PeerCredentials& c) {
      const std::int64_t uid = next.exchange(-1);
      if (uid >= 0) c.uid = static_cast<std::uint32_t>(uid);
      ++accepted;
    };
  }
  std::unique_ptr<Connection> open(const std::string& sock, std::uint32_t uid) {
    const int before = accepted.load();
    next = uid;
    auto c = connect(sock);
    REQUIRE(wait_for([&] { return accepted.load() > before; }, kWait));
    return c;
  }
};

// Says hello as stage `name`, then reads and acks the first rules frame the
// daemon sends every new stage after the hello's answer.
json hello_as(Connection& c, const std::string& name) {
  auto r = c.request(wire::Type::kHello, json{{"name", name}, {"pid", 1}, {"protocol", 1}});
  INFO(r.status().to_string());
  REQUIRE(r.is_ok());
  auto first = c.receive(kWaitMs);
  REQUIRE(first.is_ok());
  REQUIRE((*first)["type"] == "rules");
  REQUIRE(c.send_raw(wire::encode_frame(wire::make_ack((*first)["id"].get<std::uint64_t>(),
                                                       json{{"rules_version", 1}})))
              .is_ok());
  return *r;
}

// Sends `c` an apply_rules for `stage` and returns the answer; `stage_conn`,
// when given, is that stage's connection (written by hand), which then
// answers the forwarded rules with an ack.
json apply_rules_as(Connection& c, const std::string& stage, Connection* stage_conn) {
  const auto id = c.next_id();
  REQUIRE(c.send_raw(wire::encode_frame(wire::make_message(
                         wire::Type::kApplyRules, id, json{{"stage", stage}, {"rules", kBatch}})))
              .is_ok());
  if (stage_conn != nullptr) {
    auto m = stage_conn->receive(kWaitMs);
    REQUIRE(m.is_ok());
    REQUIRE((*m)["type"] == "rules");
    REQUIRE(stage_conn
                ->send_raw(wire::encode_frame(
                    wire::make_ack((*m)["id"].get<std::uint64_t>(), json{{"rules_version", 7}})))
                .is_ok());
  }
  auto r = c.receive(kWaitMs);
  REQUIRE(r.is_ok());
  CHECK((*r)["id"] == id);
  return *r;
}

json policy_set_as(Connection& c) {
  auto r = c.request(wire::Type::kPolicySet, json{{"policy", {{"policy", "static"}}}});
  if (r.is_ok()) return *r;
  return wire::make_error(0, r.status());
}

void expect_denied(const json& reply, const std::string& what) {
  INFO(reply.dump());
  CHECK(reply["type"] == "error");
  CHECK(reply["code"] == "permission_denied");
  CHECK_THAT(reply.value("message", std::string()), Catch::Contains(what));
}

json connection_metrics(const std::string& sock) {
  auto r = connect(sock)->request(wire::Type::kPolicyShow);
  REQUIRE(r.is_ok());
  return (*r)["metrics"]["connections"];
}

// `c` gets an error containing `why` (id 0), then its connection is closed.
void expect_dropped(Connection& c, const std::string& why) {
  auto r = c.receive(10000);
  INFO(r.status().to_string());
  REQUIRE(r.is_ok());
  CHECK((*r)["type"] == "error");
  CHECK((*r)["id"] == 0);
  CHECK((*r)["code"] == "unavailable");
  CHECK_THAT((*r).value("message", std::string()), Catch::Contains(why));
  CHECK_FALSE(c.receive(kWaitMs).is_ok());
  CHECK(c.peer_closed());
}

void expect_open(Connection& c) {
  CHECK_FALSE(c.receive(50).is_ok());
  CHECK_FALSE(c.peer_closed());
}

constexpr double kMiB = 1024.0 * 1024.0;

// A stage written by hand: says hello (with `info`) and returns the hello's
// answer.
json raw_hello(Connection& c, const std::string& name, const json& info = json()) {
  json body = {{"name", name}, {"pid", ::getpid()}, {"protocol", 1}};
  if (!info.is_null()) body["info"] = info;
  REQUIRE(c.send_raw(wire::encode_frame(wire::make_message(wire::Type::kHello, c.next_id(), body)))
              .is_ok());
  auto ack = c.receive(kWaitMs);
  REQUIRE(ack.is_ok());
  REQUIRE((*ack)["type"] == "ack");
  return *ack;
}

// The description of a stage whose channel "app" holds a drl "limit".
json limited_info(const std::string& name) {
  auto stage = named_stage(name);
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "create_channel", "channel": "app", "default": true},
    {"rule": "create_object", "channel": "app", "object": "limit", "type": "drl",
     "config": {"rate": 20971520}}])"))
              .is_ok());
  json info;
  to_json(info, stage->info());
  return info;
}

// What that stage answers a collect: its drl at 20 MiB/s with requests
// queued (it wants more).
json held_back_stats(const std::string& name) {
  sluice::StageStats st;
  st.stage = name;
  st.interval_ns = 20'000'000;
  st.collected_at_ns = 1;
  st.total = {100, 419430};
  sluice::ChannelStats ch;
  ch.name = "app";
  ch.total = st.total;
  sluice::ObjectStats o;
  o.name = "limit";
  o.type = "drl";
  o.total = st.total;
  o.state = {{"rate", 20 * kMiB}, {"waiters", 3}};
  ch.objects.push_back(o);
  st.channels.push_back(ch);
  json j;
  to_json(j, st);
  return j;
}

}  // namespace

TEST_CASE("what an admitted uid may do depends on who it is", "[daemon][access]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  const std::uint32_t me = ::geteuid();
  FakeUids uids;
  DaemonOptions o = options(sock, 60000);
  o.allow_uids = {4242, 4343};
  o.admin_uids = {5151};
  uids.install(o);
  InProcDaemon d(std::move(o));

  // A stage of the daemon's own uid and one of uid 4242.
  auto own = uids.open(sock, me);
  hello_as(*own, "own");
  auto users = uids.open(sock, 4242);
  hello_as(*users, "users");

  // Any admitted uid reads.
  auto reader = uids.open(sock, 4343);
  CHECK(reader->request(wire::Type::kListStages).is_ok());
  CHECK(reader->request(wire::Type::kGetStats).is_ok());
  CHECK(reader->request(wire::Type::kPolicyShow).is_ok());
  // But rules go to a stage only from its owner or an administrator.
  expect_denied(apply_rules_as(*reader, "own", nullptr),
                "permission denied: uid 4343 may not apply rules to stage 'own', which uid " +
                    std::to_string(me) + " owns");
  expect_denied(apply_rules_as(*reader, "users", nullptr),
                "uid 4343 may not apply rules to stage 'users', which uid 4242 owns");
  expect_denied(policy_set_as(*reader), "permission denied: uid 4343 may not set the policy");

  auto owner = uids.open(sock, 4242);
  CHECK(apply_rules_as(*owner, "users", users.get())["type"] == "ack");
  expect_denied(apply_rules_as(*owner, "own", nullptr), "uid 4242 may not apply rules");
  expect_denied(policy_set_as(*owner), "uid 4242 may not set the policy");

  for (std::uint32_t admin : {5151u, me}) {
    INFO(admin);
    auto a = uids.open(sock, admin);
    CHECK(apply_rules_as(*a, "users", users.get())["type"] == "ack");
    CHECK(apply_rules_as(*a, "own", own.get())["type"] == "ack");
    CHECK(policy_set_as(*a)["type"] == "ack");
  }
  CHECK(connection_metrics(sock)["denied"] == 5);

  // A uid nobody admitted is told so at connect.
  auto stranger = uids.open(sock, 6000);
  auto r = stranger->request(wire::Type::kListStages);
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == sluice::Code::kPermissionDenied);
  CHECK_THAT(r.status().message(),
             Catch::StartsWith("permission denied: uid 6000 may not use this daemon"));
}

TEST_CASE("a refused peer reads why, and errors are bounded and snake_case", "[daemon]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  FakeUids uids;
  DaemonOptions o = options(sock, 50, json{{"rules", kBatch}});
  o.max_missed = 1000;  // the stage takes its time over a large batch (sanitizers)
  o.forward_timeout = 60s;
  uids.install(o);
  InProcDaemon d(std::move(o));

  // Refused and closed before the request goes out: the request reports the
  // daemon's refusal, not the failed send.
  {
    auto c = uids.open(sock, 6000);
    pollfd p{c->fd(), POLLRDHUP, 0};
    REQUIRE(::poll(&p, 1, 5000) == 1);  // the daemon has shut the connection
    auto r = c->request(wire::Type::kListStages);
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().code() == sluice::Code::kPermissionDenied);
    CHECK_THAT(r.status().message(),
               Catch::StartsWith("permission denied: uid 6000 may not use this daemon"));
  }
  // And so does the CLI.
  {
    const int before = uids.accepted.load();
    uids.next = 6000;
    const std::string cmd = std::string(SLUICE_BIN) + " --socket " + sock + " stages 2>&1";
    std::FILE* f = ::popen(cmd.c_str(), "r");
    REQUIRE(f != nullptr);
    std::string out;
    char buf[512];
    while (std::fgets(buf, sizeof(buf), f)) out += buf;
    const int st = ::pclose(f);
    CHECK(uids.accepted.load() > before);
    CHECK(WEXITSTATUS(st) == 1);
    CHECK_THAT(out,
               Catch::StartsWith("sluice: permission denied: uid 6000 may not use this daemon"));
  }

  // Codes are snake_case on the wire.
  auto c = connect(sock);
  REQUIRE(c->send_raw(frame_of(R"({"v": 1, "type": "teleport", "id": 5})")).is_ok());
  auto bad = c->receive(kWaitMs);
  REQUIRE(bad.is_ok());
  CHECK((*bad)["code"] == "invalid_argument");

  // A 100,000-value match (600 KB) a stage refuses comes back as a short line.
  Stage app(sock, "app");
  REQUIRE(wait_for([&] { return app.client->counters().rules_applied >= 1; }, kWait));
  json tenants = json::array();
  for (int i = 0; i < 100000; ++i) tenants.push_back(i);
  json batch = json::array(
      {{{"rule", "create_channel"}, {"channel", "x"}, {"match", {{"tenant", tenants}}}}});
  auto r = c->request(wire::Type::kApplyRules, json{{"stage", "app"}, {"rules", batch}}, 60000);
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == sluice::Code::kInvalidArgument);
  CHECK_THAT(r.status().message(),
             Catch::StartsWith("stage 'app': channel 'x': match {\"tenant\":[0,1,2,") &&
                 Catch::Contains(" bytes)") && Catch::Contains("names classifier 'tenant'"));
  CHECK(r.status().message().size() < 1024);
}

TEST_CASE("past the connection limit silent peers make room; stages and requests are served",
          "[daemon][limits]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  DaemonOptions o = options(sock, 60000);
  o.max_connections = 20;
  InProcDaemon d(std::move(o));

  auto stage = connect(sock);
  hello_as(*stage, "kept");
  std::vector<std::unique_ptr<Connection>> silent;
  for (int i = 0; i < 60; ++i) silent.push_back(connect(sock));
  auto stages = connect(sock)->request(wire::Type::kListStages, json::object(), 2000);
  REQUIRE(stages.is_ok());
  REQUIRE((*stages)["stages"].size() == 1);
  CHECK((*stages)["stages"][0]["name"] == "kept");
  // A new stage gets in too.
  auto newcomer = connect(sock);
  hello_as(*newcomer, "new");
  // The oldest silent ones were told why and closed; the newest are open.
  expect_dropped(*silent.front(), "connection limit (20)");
  expect_open(*silent.back());
  CHECK(stage->request(wire::Type::kListStages).is_ok());
  json m = connection_metrics(sock);
  CHECK(m["limit"] == 20);
  CHECK(m["open"] <= 20);
  CHECK(m["evicted"] >= 40);
}

TEST_CASE("a daemon full of stages refuses newcomers but keeps room for administrators",
          "[daemon][limits]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  FakeUids uids;
  DaemonOptions o = options(sock, 60000);
  o.max_connections = 4;
  o.allow_uids = {4242};
  uids.install(o);
  InProcDaemon d(std::move(o));
  std::vector<std::unique_ptr<Connection>> stages;
  for (int i = 0; i < 4; ++i) {
    stages.push_back(uids.open(sock, 4242));
    hello_as(*stages.back(), "s" + std::to_string(i));
  }
  auto late = uids.open(sock, 4242);
  auto r = late->request(wire::Type::kListStages);
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == sluice::Code::kUnavailable);
  CHECK_THAT(r.status().message(), Catch::Contains("connection limit (4)"));
  // The daemon's own uid is an administrator: it gets in and sees them all.
  auto admin = uids.open(sock, ::geteuid());
  auto listed = admin->request(wire::Type::kListStages);
  REQUIRE(listed.is_ok());
  CHECK((*listed)["stages"].size() == 4);
  CHECK((*admin->request(wire::Type::kPolicyShow))["metrics"]["connections"]["refused_full"] == 1);
}

TEST_CASE("silent, slow and idle peers are dropped after their timeouts; stages are not",
          "[daemon][limits]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  DaemonOptions o = options(sock, 60000);
  // Seconds: a peer here that should not time out must not do so while this
  // thread waits for a CPU between connecting and its first request.
  o.handshake_timeout = 2s;
  o.frame_timeout = 3s;
  o.idle_timeout = 4s;
  InProcDaemon d(std::move(o));

  auto stage = connect(sock);
  hello_as(*stage, "patient");
  auto silent = connect(sock);
  auto slow = connect(sock);
  REQUIRE(slow->request(wire::Type::kListStages).is_ok());
  const std::string f = frame_of(hello(1, "slowloris").dump());
  REQUIRE(slow->send_raw(f.substr(0, f.size() - 1)).is_ok());
  auto idle = connect(sock);
  REQUIRE(idle->request(wire::Type::kListStages).is_ok());

  expect_dropped(*silent, "no complete request within 2000 ms of connecting");
  expect_dropped(*slow, "a frame unfinished after 3000 ms (" + std::to_string(f.size() - 1) +
                            " bytes received)");
  expect_dropped(*idle, "no request for 4000 ms");
  CHECK(stage->request(wire::Type::kListStages).is_ok());
  CHECK(has_stage(sock, "patient"));
  CHECK(connection_metrics(sock)["timed_out"] == 3);
}

TEST_CASE("unfinished frames share a budget; the oldest go when it is exceeded",
          "[daemon][limits]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  DaemonOptions o = options(sock, 60000);
  o.max_frame = 64 * 1024;
  o.max_buffered = 64 * 1024;  // raised to a frame and a read: 128 KiB
  InProcDaemon d(std::move(o));
  REQUIRE(connection_metrics(sock)["unfinished_frame_budget"] == 128 * 1024);

  std::string partial = frame_of(std::string(65000, ' ')).substr(0, 60004);
  std::vector<std::unique_ptr<Connection>> peers;
  for (int i = 0; i < 3; ++i) {
    peers.push_back(connect(sock));
    REQUIRE(peers.back()->send_raw(partial).is_ok());
    if (i < 2) {
      REQUIRE(wait_for(
          [&] {
            return connection_metrics(sock)["unfinished_frame_bytes"] == (i + 1) * partial.size();
          },
          kWait));
    }
  }
  expect_dropped(*peers[0], "over its budget of 131072");
  expect_open(*peers[1]);
  expect_open(*peers[2]);
  json m = connection_metrics(sock);
  CHECK(m["over_budget"] == 1);
  CHECK(m["unfinished_frame_bytes"] == 2 * partial.size());
  // Finished, a frame leaves the budget.
  REQUIRE(peers[1]->send_raw(std::string(65000 - 60000, ' ')).is_ok());
  auto answer = peers[1]->receive(kWaitMs);  // blanks are not a message
  REQUIRE(answer.is_ok());
  CHECK((*answer)["type"] == "error");
  CHECK(connection_metrics(sock)["unfinished_frame_bytes"] == partial.size());
}

TEST_CASE("under a low descriptor limit idle peers lock out neither the CLI nor stages",
          "[daemon][limits]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  // Killed and reaped however the test ends.
  struct Child {
    pid_t pid;
    int sig;
    ~Child() { kill_and_reap(pid, sig); }
  };
  Child daemon{spawn({"/bin/sh", "-c",
                      "ulimit -n 200 && exec " + std::string(SLUICE_BIN) + " serve --socket " +
                          sock + " --interval 100 --log-level error"}),
               SIGTERM};
  REQUIRE(wait_for([&] { return Connection::open(sock, 100).is_ok(); }, kWait));
  // More idle connections than the daemon has descriptors.
  std::vector<std::unique_ptr<Connection>> idle;
  for (int i = 0; i < 400; ++i) idle.push_back(connect(sock));
  auto listed = connect(sock)->request(wire::Type::kListStages, json::object(), 2000);
  INFO(listed.status().to_string());
  CHECK(listed.is_ok());
  Child stage{spawn({SLUICE_TEST_STAGE_BIN, sock, "late"}), SIGKILL};
  CHECK(wait_for([&] { return has_stage(sock, "late"); }, kWait));
  auto show = connect(sock)->request(wire::Type::kPolicyShow, json::object(), 2000);
  REQUIRE(show.is_ok());
  CHECK((*show)["metrics"]["connections"]["limit"] == 200 - 64 - 16);
}

TEST_CASE("lines about bad peers are rate-limited and counted", "[daemon][log]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  DaemonOptions o = options(sock, 60000);
  o.max_frame = 4096;
  const auto started = SteadyClock::now();
  InProcDaemon d(std::move(o));
  const std::string oversized = frame_of(std::string(5000, ' ')).substr(0, 4);
  for (int i = 0; i < 100; ++i) {
    auto c = connect(sock);
    REQUIRE(c->send_raw(oversized).is_ok());
    auto r = c->receive(kWaitMs);
    REQUIRE(r.is_ok());
    CHECK_THAT((*r).value("message", std::string()), Catch::Contains("exceeds the limit"));
  }
  auto show = connect(sock)->request(wire::Type::kPolicyShow);
  REQUIRE(show.is_ok());
  const json lines = (*show)["metrics"]["log_lines"]["bad_frame"];
  INFO(lines.dump());
  CHECK(lines["logged"].get<int>() + lines["suppressed"].get<int>() == 100);
  // A burst of 10, then one a second of however long the 100 took.
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - started).count();
  INFO(seconds << " s");
  CHECK(lines["logged"].get<double>() <= 10 + std::ceil(seconds));
}

TEST_CASE("a new stage gets its first rules right after its hello's answer", "[daemon][hello]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  SECTION("static: its batch, at once (the first step is a minute away)") {
    InProcDaemon d(options(sock, 60000, json{{"rules", kBatch}}));
    auto c = connect(sock);
    raw_hello(*c, "raw");
    auto first = c->receive(kWaitMs);
    REQUIRE(first.is_ok());
    CHECK((*first)["type"] == "rules");
    CHECK((*first)["rules"]["rules"] == kBatch["rules"]);
    // A stage with a control client applies it before the first step.
    Stage app(sock, "app");
    CHECK(wait_for([&] { return app.client->counters().rules_applied >= 1; }, kWait));
    CHECK(app.stage->info().channels.size() == 1);
  }
  SECTION("a policy with nothing for it: an empty batch") {
    InProcDaemon d(options(sock, 60000));
    auto c = connect(sock);
    raw_hello(*c, "raw");
    auto first = c->receive(kWaitMs);
    REQUIRE(first.is_ok());
    CHECK((*first)["type"] == "rules");
    CHECK((*first)["rules"] == json({{"version", 1}, {"rules", json::array()}}));
  }
  SECTION("maxmin: what the stages already there leave") {
    DaemonOptions o = options(sock, 60000);
    o.policy_doc =
        json{{"policy", "maxmin"},
             {"config",
              {{"max_bandwidth", 40 * kMiB}, {"install_layout", true}, {"startup_grace_ms", 0}}}};
    InProcDaemon d(std::move(o));
    auto rate_of = [](const json& rules) {
      for (const auto& r : rules["rules"]["rules"]) {
        if (r.contains("config")) return r["config"]["rate"].get<double>();
      }
      return -1.0;
    };
    auto a = connect(sock);
    raw_hello(*a, "a");
    auto first = a->receive(kWaitMs);
    REQUIRE(first.is_ok());
    CHECK(rate_of(*first) == 40 * kMiB);  // alone: all of it
    auto b = connect(sock);
    raw_hello(*b, "b");
    first = b->receive(kWaitMs);
    REQUIRE(first.is_ok());
    CHECK(rate_of(*first) == 1 * kMiB);  // a holds all: min_rate until the next step
  }
}

TEST_CASE("maxmin after a daemon restart: a stage back with its rate keeps it during start-up",
          "[daemon][start-up]") {
  DaemonDir dir;
  const std::string sock = dir.file("d.sock");
  auto daemon_options = [&](double grace_ms) {
    DaemonOptions o = options(sock, 100);
    o.policy_doc = json{{"policy", "maxmin"},
                        {"config", {{"max_bandwidth", 40 * kMiB}, {"startup_grace_ms", grace_ms}}}};
    return o;
  };
  // Answers collects as the stage held at 20 MiB/s would, and returns the
  // rules it is sent meanwhile (acked) over `collects` collects.
  auto serve = [](Connection& c, int collects) {
    json rules = json::array();
    while (collects > 0) {
      auto m = c.receive(kWaitMs);
      REQUIRE(m.is_ok());
      const std::uint64_t id = (*m)["id"];
      if ((*m)["type"] == "collect") {
        --collects;
        REQUIRE(c.send_raw(wire::encode_frame(wire::make_message(
                               wire::Type::kStats, id, json{{"stats", held_back_stats("a")}})))
                    .is_ok());
      } else if ((*m)["type"] == "rules") {
        rules.push_back((*m)["rules"]);
        REQUIRE(
            c.send_raw(wire::encode_frame(wire::make_ack(id, json{{"rules_version", 2}}))).is_ok());
      }
    }
    return rules;
  };
  const json info = limited_info("a");
  {
    // A start-up longer than the test: the stage keeps its 20 MiB/s however
    // many steps run (the other stages of the earlier daemon, not back yet,
    // still use the rest), rather than get all 40.
    InProcDaemon d(daemon_options(60000));
    auto c = connect(sock);
    raw_hello(*c, "a", info);
    const json rules = serve(*c, 10);
    REQUIRE(rules.size() == 1);  // the first rules, right after the hello: nothing
    CHECK(rules[0]["rules"].empty());
  }
  {
    // Without a start-up period the lone stage is given everything at once.
    InProcDaemon d(daemon_options(0));
    auto c = connect(sock);
    raw_hello(*c, "a", info);
    const json rules = serve(*c, 3);
    REQUIRE(rules.size() >= 1);
    CHECK(rules[0]["rules"][0]["config"]["rate"] == static_cast<std::int64_t>(40 * kMiB));
  }
}
