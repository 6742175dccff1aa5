// The daemon's limits: what each admitted uid may do, refused peers, the
// connection and frame budgets, timeouts, a low descriptor limit, rate-limited
// logs, and a restarted maxmin daemon keeping returning stages' rates.
#include "daemon_test_util.h"

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

  // A stage of uid 4242 (not an administrator) and then one of the daemon's own
  // uid, both asking for "own": the first is named for its uid, so it cannot
  // take the name the administrator's stage (and its rules) use.
  auto users = uids.open(sock, 4242);
  CHECK(hello_as(*users, "own")["name"] == "own@4242");
  auto own = uids.open(sock, me);
  CHECK(hello_as(*own, "own")["name"] == "own");

  // Any admitted uid reads.
  auto reader = uids.open(sock, 4343);
  CHECK(reader->request(wire::Type::kListStages).is_ok());
  CHECK(reader->request(wire::Type::kGetStats).is_ok());
  CHECK(reader->request(wire::Type::kPolicyShow).is_ok());
  // But rules go to a stage only from its owner or an administrator.
  expect_denied(apply_rules_as(*reader, "own", nullptr),
                "permission denied: uid 4343 may not apply rules to stage 'own', which uid " +
                    std::to_string(me) + " owns");
  expect_denied(apply_rules_as(*reader, "own@4242", nullptr),
                "uid 4343 may not apply rules to stage 'own@4242', which uid 4242 owns");
  expect_denied(policy_set_as(*reader), "permission denied: uid 4343 may not set the policy");

  auto owner = uids.open(sock, 4242);
  CHECK(apply_rules_as(*owner, "own@4242", users.get())["type"] == "ack");
  expect_denied(apply_rules_as(*owner, "own", nullptr), "uid 4242 may not apply rules");
  expect_denied(policy_set_as(*owner), "uid 4242 may not set the policy");

  for (std::uint32_t admin : {5151u, me}) {
    INFO(admin);
    auto a = uids.open(sock, admin);
    CHECK(apply_rules_as(*a, "own@4242", users.get())["type"] == "ack");
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
