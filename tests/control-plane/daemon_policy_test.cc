// The daemon's policy loop as its users see it: policies set over the socket,
// the report log, `sluice stats` and `top`, the CLI's exit codes, tunables on
// a stage's board, observers, and boards refused.
#include "daemon_test_util.h"

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
