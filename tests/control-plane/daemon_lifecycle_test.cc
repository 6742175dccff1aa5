// The daemon and its stages over their lives: stopped and returning stages,
// rules pending while a stage is away, the socket file's modes and owners,
// peers of other uids, and the daemon killed under traffic (fail-static).
#include "daemon_test_util.h"

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
    // Named for its uid: it cannot take a name an administrator's rules select.
    CHECK_THAT(reply, Catch::Contains("\"type\":\"ack\"") && Catch::Contains("\"intruder@65534\""));
    // Admitted is not in charge: the policy is for administrators only.
    reply = as_nobody(frame_of(
        wire::make_message(wire::Type::kPolicySet, 1, json{{"policy", {{"policy", "static"}}}})
            .dump()));
    CHECK_THAT(reply, Catch::Contains("permission denied: uid 65534 may not set the policy"));
  }
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
