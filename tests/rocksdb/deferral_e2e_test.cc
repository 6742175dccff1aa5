// Compaction deferral end to end, with real processes: a `sluice serve`
// daemon runs the compaction-deferral policy with a node bandwidth far below
// what two RocksDB instances in this process write, so it defers both (their
// stage's `deferral-gate`, applied by a DeferralActuator per database) into
// the first and then the second stage. The daemon is then killed with
// SIGKILL while they are deferred. Nothing renews the decisions any more, so
// within the gate's default hold every option the actuators changed is back
// to its configured value and the gate reads recovering or normal; the trees
// recover (L0 below the slowdown trigger); the writers, which never stopped,
// saw no error and no hang; and every key reads back with the last value
// written, from the live databases and after they are reopened. Twice: with
// the second stage's intra-L0 compactions (L0 stays low), and without them,
// so that L0 is far past the slowdown trigger when the decisions expire and
// recovering must bring it down before the stall triggers go back.
//
// Bounds are generous on purpose (a shared, noisy machine): they check that
// recovery happens on its own within the hold plus slack, not how fast.
// Without the sluice binary the test exits 77 (skipped).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "sluice/control_client.h"
#include "sluice/objects/builtin.h"
#include "sluice/objects/deferral_gate.h"
#include "sluice/rocksdb.h"
#include "sluice/rocksdb_deferral.h"
#include "sluice/stage.h"
#include "test_util.h"

namespace rb = sluice::rocksdb_binding;
using sluice::DeferralGate;
using sluice::DeferralState;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using json = nlohmann::json;

namespace {

// The slack on top of the hold for the actuator's tick (50 ms) and a
// loaded machine.
constexpr milliseconds kSlack{5000};
// How long recovering may keep the stall triggers raised (the actuator's
// recover_timeout_ms, set here below its default to bound the test).
constexpr milliseconds kRecoverTimeout{20000};
// After the options are restored, L0 is below the slowdown trigger within this.
constexpr milliseconds kL0Settles{30000};
// A write that takes this long is a hang.
constexpr milliseconds kHang{20000};

constexpr int kKeys = 2000;                // per database, overwritten round after round
constexpr std::size_t kValueBytes = 240;   // ~256 bytes an entry
constexpr double kPutsPerS = 2000;         // per database: ~0.5 MiB/s
constexpr double kBandwidth = 256 * 1024;  // the node's, bytes/s: far below the use

constexpr int kSlowdownTrigger = 8;

std::string e2e_key(int i) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "k%05d", i);
  return buf;
}

// The value of the n-th put (to key n % kKeys).
std::string e2e_value(std::uint64_t n) {
  std::string v = "n=" + std::to_string(n) + ";";
  v.resize(kValueBytes, 'v');
  return v;
}

std::int64_t ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t).count();
}

// The daemon: `sluice serve`, its output in a log file; killed (SIGKILL) and
// reaped when it goes.
struct Daemon {
  pid_t pid = -1;
  std::string log;
  Daemon(const std::vector<std::string>& argv, std::string log_path) : log(std::move(log_path)) {
    std::vector<std::string> args = argv;
    std::vector<char*> cargs = sluice::testing::c_strings(args);
    pid = ::fork();
    if (pid == 0) {
      if (std::freopen(log.c_str(), "a", stdout) != nullptr) ::dup2(::fileno(stdout), 2);
      ::execv(cargs[0], cargs.data());
      std::_Exit(127);
    }
    REQUIRE(pid > 0);
  }
  // Kills it with `sig` and reaps it; true when it was still running.
  bool kill(int sig) {
    if (pid <= 0) return false;
    int status = 0;
    const bool alive = ::waitpid(pid, &status, WNOHANG) == 0;
    ::kill(pid, sig);
    ::waitpid(pid, &status, 0);
    pid = -1;
    return alive;
  }
  ~Daemon() { kill(SIGKILL); }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
};

// The options the actuator moves, as RocksDB reports them now.
std::map<std::string, std::string> current_options(rocksdb::DB& db) {
  const rocksdb::Options o = db.GetOptions();
  return {{"max_bytes_for_level_base", std::to_string(o.max_bytes_for_level_base)},
          {"soft_pending_compaction_bytes_limit",
           std::to_string(o.soft_pending_compaction_bytes_limit)},
          {"hard_pending_compaction_bytes_limit",
           std::to_string(o.hard_pending_compaction_bytes_limit)},
          {"disable_auto_compactions", o.disable_auto_compactions ? "true" : "false"},
          {"level0_slowdown_writes_trigger", std::to_string(o.level0_slowdown_writes_trigger)},
          {"level0_stop_writes_trigger", std::to_string(o.level0_stop_writes_trigger)}};
}

int l0_files(rocksdb::DB& db) {
  rocksdb::ColumnFamilyMetaData m;
  db.GetColumnFamilyMetaData(&m);
  return m.levels.empty() ? 0 : static_cast<int>(m.levels[0].files.size());
}

rocksdb::Options db_options() {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.write_buffer_size = 128 << 10;  // a flush every ~0.25 s
  o.level0_file_num_compaction_trigger = 4;
  o.level0_slowdown_writes_trigger = kSlowdownTrigger;
  o.level0_stop_writes_trigger = 12;
  o.max_bytes_for_level_base = 1 << 20;  // L1+ compactions run when not deferred
  o.target_file_size_base = 256 << 10;
  o.compression = rocksdb::kNoCompression;
  return o;
}

// One partition: a database with its binding to the stage, its actuator and a
// writer thread putting keys round after round at a steady pace.
struct Partition {
  std::string name;
  std::string path;
  rb::Binding binding;
  std::shared_ptr<rb::DeferralWakeListener> wake = std::make_shared<rb::DeferralWakeListener>();
  std::unique_ptr<rocksdb::DB> db;
  std::unique_ptr<rb::DeferralActuator> actuator;
  std::map<std::string, std::string> configured;

  // The writer's account; read by the test's thread only after join, except
  // the atomics.
  std::atomic<bool> quit{false};
  std::atomic<std::uint64_t> puts{0};  // completed, in order: put n wrote e2e_value(n)
  std::uint64_t errors = 0;
  std::string first_error;
  std::int64_t longest_put_ms = 0;
  std::thread writer;

  void write_loop() {
    rocksdb::WriteOptions wo;
    const auto t0 = Clock::now();
    for (std::uint64_t n = 0; !quit.load(std::memory_order_relaxed); ++n) {
      const auto before = Clock::now();
      const rocksdb::Status s = db->Put(wo, e2e_key(static_cast<int>(n % kKeys)), e2e_value(n));
      longest_put_ms = std::max(longest_put_ms, ms_since(before));
      if (!s.ok()) {
        if (errors++ == 0) first_error = s.ToString();
        return;  // the keys after it would not be in order
      }
      puts.store(n + 1, std::memory_order_release);
      std::this_thread::sleep_until(
          t0 + std::chrono::duration_cast<Clock::duration>(
                   std::chrono::duration<double>(static_cast<double>(n + 1) / kPutsPerS)));
    }
  }
  void stop_writer() {
    quit = true;
    if (writer.joinable()) writer.join();
  }
  ~Partition() {
    stop_writer();
    wake->attach(nullptr);
    if (actuator) (void)actuator->stop();
    actuator.reset();
    db.reset();
  }

  // Every key holds the value of its last put (of `total`).
  void check_keys(rocksdb::DB& d, std::uint64_t total) const {
    int wrong = 0;
    std::string first_wrong;
    for (int i = 0; i < kKeys; ++i) {
      if (static_cast<std::uint64_t>(i) >= total) break;
      const std::uint64_t last = total - 1 - ((total - 1 - static_cast<std::uint64_t>(i)) % kKeys);
      std::string v;
      const rocksdb::Status s = d.Get(rocksdb::ReadOptions(), e2e_key(i), &v);
      if (!s.ok() || v != e2e_value(last)) {
        if (wrong++ == 0) {
          first_wrong = e2e_key(i) + ": " + (s.ok() ? v.substr(0, v.find(';')) : s.ToString()) +
                        ", want n=" + std::to_string(last);
        }
      }
    }
    INFO(name << ": " << wrong << " keys wrong, first " << first_wrong);
    CHECK(wrong == 0);
  }
};

bool deferred(DeferralState s) {
  return s == DeferralState::kFirstStage || s == DeferralState::kSecondStage;
}

// How the second stage runs before the kill.
struct Variant {
  const char* name;
  int intra_l0_min_files;  // the actuator's
  int max_l0_files;        // the actuator's L0 cap
  int kill_at_l0;          // the kill waits for a partition in the second stage with this L0
};

}  // namespace

TEST_CASE("a daemon killed while partitions are deferred: they recover on their own, nothing lost",
          "[deferral][e2e]") {
  if (::access(SLUICE_BIN, X_OK) != 0) {
    std::fprintf(stderr, "%s not found: skipping\n", SLUICE_BIN);
    std::exit(77);
  }
  // With intra-L0 compactions, as deployed: L0 stays low. Without them (a
  // threshold never reached) and a high L0 cap: L0 is past the slowdown
  // trigger at the kill, so recovering keeps the stall triggers raised until
  // L0->L1 brought it below, then restores them too.
  const Variant v = GENERATE(Variant{"intra-L0", 4, 0, 0}, Variant{"L0 past the slowdown trigger",
                                                                   1000, 60, kSlowdownTrigger + 2});
  INFO("variant: " << v.name);
  sluice::objects::register_builtin();
  sluice::testing::TempDir dir("deferral-e2e");
  const std::string socket = dir.file("sluice.sock");
  // The gates keep their default hold: the policy does not set one.
  const std::string policy = dir.write("policy.json", json{{"policy", "compaction-deferral"},
                                                           {"interval_ms", 100},
                                                           {"config",
                                                            {{"bandwidth", kBandwidth},
                                                             {"high_watermark", 0.8},
                                                             {"low_watermark", 0.6},
                                                             {"l0_fraction", 0.25}}}}
                                                          .dump());
  // Forked from this thread; the child only execs. The stage is never dropped
  // for a collect answered late on a loaded machine: the daemon's kill is what
  // takes its decisions away.
  Daemon daemon(
      {SLUICE_BIN, "serve", "--socket", socket, "--policy", policy, "--max-missed", "1000"},
      dir.file("serve.log"));
  INFO("daemon log: " << dir.file("serve.log"));

  sluice::StageOptions so;
  so.name = "host";
  auto created = sluice::Stage::create(so);
  REQUIRE(created.is_ok());
  std::unique_ptr<sluice::Stage> stage = std::move(created).value();
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "create_channel", "channel": "bg", "default": true},
    {"rule": "create_object", "channel": "bg", "object": "deferral", "type": "deferral-gate"}])"))
              .is_ok());
  auto gate_or = rb::DeferralActuator::find_gate(*stage, "bg", "deferral");
  REQUIRE(gate_or.is_ok());
  std::shared_ptr<DeferralGate> gate = *gate_or;
  const std::int64_t hold_ms = gate->collect()["hold_ms"].get<std::int64_t>();
  CHECK(hold_ms == sluice::kDeferralDefaultHoldMs);

  sluice::ControlClientOptions co;
  co.socket_path = socket;
  co.backoff_initial = milliseconds(20);
  co.backoff_max = milliseconds(200);
  auto client_or = sluice::ControlClient::start(*stage, co);
  REQUIRE(client_or.is_ok());
  std::unique_ptr<sluice::ControlClient> client = std::move(client_or).value();
  REQUIRE(sluice::testing::wait_for([&] { return client->ready(); }, milliseconds(30000)));

  // Two databases on the stage, each a partition of the gate.
  std::vector<std::unique_ptr<Partition>> parts;
  for (const char* name : {"p0", "p1"}) {
    auto p = std::make_unique<Partition>();
    p->name = name;
    p->path = dir.file(name);
    rocksdb::Options o = db_options();
    o.listeners.push_back(p->wake);
    auto b = rb::Attach(o, *stage);
    REQUIRE(b.is_ok());
    p->binding = std::move(b).value();
    rocksdb::DB* raw = nullptr;
    const rocksdb::Status s = rocksdb::DB::Open(o, p->path, &raw);
    INFO(s.ToString());
    REQUIRE(s.ok());
    p->db.reset(raw);
    p->configured = current_options(*p->db);
    rb::DeferralActuatorOptions ao;
    ao.gate = gate;
    ao.families = {{p->db->DefaultColumnFamily(), name}};
    ao.recover_timeout_ms = kRecoverTimeout.count();
    ao.intra_l0_min_files = v.intra_l0_min_files;
    ao.intra_l0_max_files = std::max(32, v.intra_l0_min_files);
    ao.max_l0_files = v.max_l0_files;
    auto a = rb::DeferralActuator::start(p->db.get(), ao);
    REQUIRE(a.is_ok());
    p->actuator = std::move(a).value();
    p->wake->attach(p->actuator.get());
    CHECK(p->actuator->configured().at(name) == p->configured);
    parts.push_back(std::move(p));
  }
  for (auto& p : parts) p->writer = std::thread([q = p.get()] { q->write_loop(); });
  auto state_of = [&](const Partition& p) { return gate->state(**gate->partition(p.name)); };

  // The policy defers both partitions, and at least one into the second stage.
  const bool deferring = sluice::testing::wait_for(
      [&] {
        bool all = true, second = false;
        for (auto& p : parts) {
          all = all && deferred(state_of(*p));
          second = second || state_of(*p) == DeferralState::kSecondStage;
        }
        return all && second;
      },
      milliseconds(60000));
  INFO("gate: " << gate->collect().dump());
  REQUIRE(deferring);
  // Deferred for a while, so that the trees hold what deferral kept back.
  std::this_thread::sleep_for(milliseconds(2000));
  if (v.kill_at_l0 > 0) {
    const bool high = sluice::testing::wait_for(
        [&] {
          for (auto& p : parts) {
            if (state_of(*p) == DeferralState::kSecondStage && l0_files(*p->db) >= v.kill_at_l0)
              return true;
          }
          return false;
        },
        milliseconds(60000));
    REQUIRE(high);
  }
  int second_stage = 0;
  for (auto& p : parts) {
    const DeferralState s = state_of(*p);
    INFO(p->name << " is " << sluice::deferral_state_name(s));
    REQUIRE(deferred(s));
    const auto o = current_options(*p->db);
    CHECK(o != p->configured);
    CHECK(o.at("max_bytes_for_level_base") == std::to_string(std::uint64_t{1} << 40));
    if (s == DeferralState::kSecondStage) {
      ++second_stage;
      CHECK(o.at("disable_auto_compactions") == "true");
    }
  }
  CHECK(second_stage >= 1);

  // kill -9: no resume will come, no decision is renewed.
  const auto killed_at = Clock::now();
  REQUIRE(daemon.kill(SIGKILL));
  std::map<std::string, std::uint64_t> puts_at_kill;
  std::map<std::string, int> l0_at_kill;
  for (auto& p : parts) {
    puts_at_kill[p->name] = p->puts.load();
    l0_at_kill[p->name] = l0_files(*p->db);
  }

  // (a) Within the hold plus slack, the options deferral changes are back and
  // the gate reads recovering or normal; then every option, once L0 is below
  // the slowdown trigger (recovering keeps the stall triggers up till then,
  // at most kRecoverTimeout), and the gate reads normal.
  // (d) L0 falls below the slowdown trigger within kL0Settles after that.
  struct Seen {
    std::int64_t deferral_off_ms = -1;  // level base and auto compactions back, gate not deferring
    std::int64_t all_restored_ms = -1;  // every option back, gate normal
    std::int64_t l0_below_ms = -1;      // then L0 below the slowdown trigger
    int l0_deferral_off = -1;           // L0 when the deferral ended
  };
  std::map<std::string, Seen> seen;
  const milliseconds give_up = milliseconds(hold_ms) + kRecoverTimeout + kL0Settles + kSlack;
  sluice::testing::wait_for(
      [&] {
        bool done = true;
        for (auto& p : parts) {
          Seen& s = seen[p->name];
          const auto o = current_options(*p->db);
          const DeferralState st = state_of(*p);
          const std::int64_t now = ms_since(killed_at);
          if (s.deferral_off_ms < 0 && !deferred(st) &&
              o.at("max_bytes_for_level_base") == p->configured.at("max_bytes_for_level_base") &&
              o.at("disable_auto_compactions") == p->configured.at("disable_auto_compactions")) {
            s.deferral_off_ms = now;
            s.l0_deferral_off = l0_files(*p->db);
          }
          if (s.deferral_off_ms >= 0 && s.all_restored_ms < 0 && o == p->configured &&
              st == DeferralState::kNormal) {
            s.all_restored_ms = now;
          }
          if (s.all_restored_ms >= 0 && s.l0_below_ms < 0 && l0_files(*p->db) < kSlowdownTrigger)
            s.l0_below_ms = now;
          done = done && s.l0_below_ms >= 0;
        }
        return done;
      },
      give_up);
  const json g = gate->collect();
  INFO("gate after the kill: " << g.dump());
  int high_at_expiry = 0;
  for (auto& p : parts) {
    const Seen& s = seen[p->name];
    if (s.l0_deferral_off >= kSlowdownTrigger) ++high_at_expiry;
    INFO(p->name << ": deferral off after " << s.deferral_off_ms << " ms, all restored after "
                 << s.all_restored_ms << " ms, L0 below " << kSlowdownTrigger << " after "
                 << s.l0_below_ms << " ms (hold " << hold_ms << " ms)");
    CHECK(s.deferral_off_ms >= 0);
    CHECK(s.deferral_off_ms <= hold_ms + kSlack.count());
    CHECK(s.all_restored_ms >= 0);
    CHECK(s.all_restored_ms <= hold_ms + kRecoverTimeout.count() + kSlack.count());
    CHECK(s.l0_below_ms >= 0);
    CHECK(s.l0_below_ms <= s.all_restored_ms + kL0Settles.count());
    // The deferral ended because the decision expired (no cap ended it).
    std::string cause;
    for (const json& t : g["transitions"]) {
      if (t["partition"] == p->name && t["to"] == "recovering")
        cause = t["cause"].get<std::string>();
    }
    CHECK(cause == "expired");
    WARN(v.name << ", " << p->name << " (L0 " << l0_at_kill[p->name] << " at the kill, "
                << s.l0_deferral_off << " when it expired): deferral off " << s.deferral_off_ms
                << " ms after the kill, every option " << s.all_restored_ms
                << " ms, L0 below the slowdown trigger " << s.l0_below_ms << " ms (hold " << hold_ms
                << " ms)");
  }

  // The second variant left L0 past the slowdown trigger when the decision
  // expired (no compaction out of L0 ran since the kill).
  if (v.kill_at_l0 > 0) CHECK(high_at_expiry >= 1);

  // (b) The writers kept going through the kill and the recovery, without an
  // error or a hang. A little more after recovery, then they stop.
  std::this_thread::sleep_for(milliseconds(1000));
  for (auto& p : parts) p->stop_writer();
  for (auto& p : parts) {
    INFO(p->name << ": " << p->errors << " write errors, first: " << p->first_error
                 << "; longest put " << p->longest_put_ms << " ms; " << p->puts.load() << " puts, "
                 << puts_at_kill[p->name] << " at the kill");
    CHECK(p->errors == 0);
    CHECK(p->longest_put_ms < kHang.count());
    CHECK(p->puts.load() > puts_at_kill[p->name]);
    CHECK(p->puts.load() > static_cast<std::uint64_t>(kKeys));  // every key written
    std::uint64_t stopped = 1;
    CHECK(p->db->GetIntProperty("rocksdb.is-write-stopped", &stopped));
    CHECK(stopped == 0);
  }

  // (c) Every key holds its last value: now, and after closing and reopening
  // each database without the binding.
  for (auto& p : parts) p->check_keys(*p->db, p->puts.load());
  for (auto& p : parts) {
    const auto stats = p->actuator->stats();
    REQUIRE(stats.size() == 1);
    WARN(p->name << ": " << stats[0].set_options << " SetOptions, " << stats[0].intra_l0
                 << " intra-L0 compactions of " << stats[0].intra_l0_files << " files");
    p->wake->attach(nullptr);
    REQUIRE(p->actuator->stop().is_ok());
    p->actuator.reset();
    REQUIRE(p->db->Close().ok());
    p->db.reset();
    rocksdb::Options o = db_options();
    o.create_if_missing = false;
    rocksdb::DB* raw = nullptr;
    const rocksdb::Status s = rocksdb::DB::Open(o, p->path, &raw);
    INFO(s.ToString());
    REQUIRE(s.ok());
    std::unique_ptr<rocksdb::DB> reopened(raw);
    p->check_keys(*reopened, p->puts.load());
  }
  client->stop();
}
