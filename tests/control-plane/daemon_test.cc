// The daemon against live peers: malformed input, oversized and abandoned
// frames, name clashes, churn, a killed stage, and a new stage's first rules.
//
// Peers are real sockets and real processes, so conditions are awaited by
// polling with deadlines of seconds, and no assertion depends on how soon a
// busy machine runs a peer (stages are dropped for silence only where that is
// the subject).
#include "daemon_test_util.h"

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
