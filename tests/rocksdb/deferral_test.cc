// The compaction-deferral actuator on a real RocksDB in a temporary directory:
// each state's options, their restoration on resume, on expiry of the
// decision, on the gate's removal and when the actuator stops; a write load
// through both stages with every key read back after recovery; intra-L0
// compactions keeping L0 below the stop trigger where deferral without them
// passes it; the L0 cap and the growth cap ending a deferral. Time is the
// gate's ManualClock; the tests poll themselves (no thread).
#include <map>
#include <memory>
#include <string>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <catch2/catch.hpp>

#include "sluice/objects/builtin.h"
#include "sluice/objects/deferral_gate.h"
#include "sluice/rocksdb_deferral.h"
#include "test_util.h"

using sluice::DeferralGate;
using sluice::DeferralState;
using sluice::ManualClock;
using sluice::rocksdb_binding::DeferralActuator;
using sluice::rocksdb_binding::DeferralActuatorOptions;

namespace {

constexpr std::int64_t kMs = 1'000'000;

struct DeferralDb {
  sluice::testing::TempDir dir{"deferral"};
  std::unique_ptr<rocksdb::DB> db;
  rocksdb::ColumnFamilyHandle* cf = nullptr;

  DeferralDb() {
    rocksdb::Options o;
    o.create_if_missing = true;
    o.write_buffer_size = 64 << 10;
    o.level0_file_num_compaction_trigger = 2;
    o.level0_slowdown_writes_trigger = 8;
    o.level0_stop_writes_trigger = 12;
    o.max_bytes_for_level_base = 256 << 10;
    o.target_file_size_base = 64 << 10;
    o.soft_pending_compaction_bytes_limit = 1 << 30;
    o.hard_pending_compaction_bytes_limit = 2u << 30;
    o.compression = rocksdb::kNoCompression;
    rocksdb::DB* raw = nullptr;
    REQUIRE(rocksdb::DB::Open(o, dir.path, &raw).ok());
    db.reset(raw);
    cf = db->DefaultColumnFamily();
  }

  // The six options the actuator moves, as GetOptions reports them.
  std::map<std::string, std::string> options() const {
    const rocksdb::Options o = db->GetOptions(cf);
    return {{"max_bytes_for_level_base", std::to_string(o.max_bytes_for_level_base)},
            {"soft_pending_compaction_bytes_limit",
             std::to_string(o.soft_pending_compaction_bytes_limit)},
            {"hard_pending_compaction_bytes_limit",
             std::to_string(o.hard_pending_compaction_bytes_limit)},
            {"disable_auto_compactions", o.disable_auto_compactions ? "true" : "false"},
            {"level0_slowdown_writes_trigger", std::to_string(o.level0_slowdown_writes_trigger)},
            {"level0_stop_writes_trigger", std::to_string(o.level0_stop_writes_trigger)}};
  }

  int l0() const {
    rocksdb::ColumnFamilyMetaData m;
    db->GetColumnFamilyMetaData(cf, &m);
    return static_cast<int>(m.levels[0].files.size());
  }

  // Writes `n` keys of round `round` (values say the round) and flushes: one L0 file.
  void write_round(int round, int n, int first = 0) {
    rocksdb::WriteOptions wo;
    wo.no_slowdown = true;  // a stall would fail the write
    for (int i = first; i < first + n; ++i) {
      const rocksdb::Status s =
          db->Put(wo, key(i), "round" + std::to_string(round) + "-" + std::string(200, 'v'));
      INFO(s.ToString());
      REQUIRE(s.ok());
    }
    rocksdb::FlushOptions fo;
    fo.allow_write_stall = true;
    REQUIRE(db->Flush(fo, cf).ok());
  }

  static std::string key(int i) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "key%06d", i);
    return buf;
  }
};

struct Rig {
  ManualClock clock;
  std::shared_ptr<DeferralGate> gate = std::make_shared<DeferralGate>(&clock);
  DeferralDb db;
  std::unique_ptr<DeferralActuator> act;

  explicit Rig(DeferralActuatorOptions o = {}) {
    REQUIRE(gate->configure({{"hold_ms", 1000}}).is_ok());
    o.gate = gate;
    o.families = {{db.cf, "7"}};
    o.poll_ms = 0;
    auto a = DeferralActuator::start(db.db.get(), std::move(o));
    REQUIRE(a.is_ok());
    act = std::move(a).value();
  }
  ~Rig() {
    if (act) REQUIRE(act->stop().is_ok());
  }
  DeferralGate::Partition& part() { return **gate->partition("7"); }
  void poll() {
    const sluice::Status s = act->poll();
    INFO(s.to_string());
    REQUIRE(s.is_ok());
  }
  void decide(DeferralState s) { REQUIRE(gate->decide("7", s).is_ok()); }
  std::string last_transition() {
    const auto log = gate->collect()["transitions"];
    const auto& t = log.back();
    return t["from"].get<std::string>() + ">" + t["to"].get<std::string>() + ":" +
           t["cause"].get<std::string>();
  }
};

}  // namespace

TEST_CASE("deferral actuator: each stage's options, restored on resume", "[deferral]") {
  Rig r;
  const auto configured = r.db.options();
  CHECK(r.act->configured().at("7") == configured);

  r.decide(DeferralState::kFirstStage);
  r.poll();
  auto o = r.db.options();
  CHECK(o["max_bytes_for_level_base"] == std::to_string(std::uint64_t{1} << 40));
  CHECK(o["soft_pending_compaction_bytes_limit"] == "0");
  CHECK(o["hard_pending_compaction_bytes_limit"] == "0");
  CHECK(o["disable_auto_compactions"] == "false");  // L0->L1 still runs
  CHECK(o["level0_slowdown_writes_trigger"] == "8");

  r.decide(DeferralState::kSecondStage);
  r.poll();
  o = r.db.options();
  CHECK(o["disable_auto_compactions"] == "true");
  CHECK(o["level0_slowdown_writes_trigger"] == "24");  // the L0 cap: twice the stop trigger
  CHECK(o["level0_stop_writes_trigger"] == "28");
  CHECK(r.act->stats()[0].applied == DeferralState::kSecondStage);

  r.decide(DeferralState::kNormal);  // resume
  r.poll();                          // L0 is empty: everything restored at once
  CHECK(r.db.options() == configured);
  CHECK(r.gate->state(r.part()) == DeferralState::kNormal);
  CHECK(r.last_transition() == "recovering>normal:recovered");
}

TEST_CASE("deferral actuator: a decision that expires restores the options", "[deferral]") {
  Rig r;
  const auto configured = r.db.options();
  r.decide(DeferralState::kSecondStage);
  r.poll();
  REQUIRE(r.db.options() != configured);
  r.clock.advance(900 * kMs);
  r.poll();
  CHECK(r.db.options() != configured);  // still held
  r.clock.advance(100 * kMs);           // hold_ms passed without renewal: the daemon is gone
  r.poll();
  CHECK(r.db.options() == configured);
  CHECK(r.gate->state(r.part()) == DeferralState::kNormal);
  const auto log = r.gate->collect()["transitions"];
  CHECK(log[log.size() - 2]["cause"] == "expired");
}

TEST_CASE("deferral actuator: gate removal and stop restore the options", "[deferral]") {
  SECTION("the gate is shut down (removed by a rule, or its stage went away)") {
    Rig r;
    const auto configured = r.db.options();
    r.decide(DeferralState::kSecondStage);
    r.poll();
    REQUIRE(r.db.options() != configured);
    r.gate->shutdown();
    r.poll();
    CHECK(r.db.options() == configured);
  }
  SECTION("a stage's gate: removed by a rule, or the stage shuts down") {
    sluice::objects::register_builtin();
    auto stage = sluice::Stage::create();
    REQUIRE(stage.is_ok());
    REQUIRE((*stage)
                ->apply(nlohmann::json::parse(R"([
      {"rule": "create_channel", "channel": "bg", "default": true},
      {"rule": "create_object", "channel": "bg", "object": "deferral", "type": "deferral-gate",
       "config": {"decide": {"7": "second-stage"}}}])"))
                .is_ok());
    DeferralDb db;
    const auto configured = db.options();
    DeferralActuatorOptions o;
    o.gate = *DeferralActuator::find_gate(**stage, "bg", "deferral");
    o.families = {{db.cf, "7"}};
    o.poll_ms = 0;
    auto a = DeferralActuator::start(db.db.get(), o);
    REQUIRE(a.is_ok());
    REQUIRE((*a)->poll().is_ok());
    REQUIRE(db.options() != configured);
    const bool by_rule = GENERATE(true, false);
    if (by_rule) {
      REQUIRE((*stage)
                  ->apply(nlohmann::json::parse(
                      R"([{"rule": "remove_object", "channel": "bg", "object": "deferral"}])"))
                  .is_ok());
    } else {
      (*stage)->shutdown();
    }
    REQUIRE((*a)->poll().is_ok());
    CHECK(db.options() == configured);
  }
  SECTION("the actuator stops") {
    Rig r;
    const auto configured = r.db.options();
    r.decide(DeferralState::kFirstStage);
    r.poll();
    REQUIRE(r.db.options() != configured);
    REQUIRE(r.act->stop().is_ok());
    CHECK(r.db.options() == configured);
    r.decide(DeferralState::kSecondStage);
    REQUIRE(r.act->poll().is_ok());  // stopped: nothing more
    CHECK(r.db.options() == configured);
  }
  SECTION("the actuator is destroyed, its thread running") {
    DeferralDb db;
    const auto configured = db.options();
    auto gate = std::make_shared<DeferralGate>();
    DeferralActuatorOptions o;
    o.gate = gate;
    o.families = {{db.cf, "7"}};
    o.poll_ms = 1;
    auto a = DeferralActuator::start(db.db.get(), o);
    REQUIRE(a.is_ok());
    REQUIRE(gate->decide("7", DeferralState::kSecondStage).is_ok());
    REQUIRE((*a)->poll().is_ok());
    REQUIRE(db.options() != configured);
    a->reset();
    CHECK(db.options() == configured);
  }
}

TEST_CASE("deferral actuator: a write load through both stages, every key read back",
          "[deferral]") {
  Rig r;
  const auto configured = r.db.options();
  constexpr int kKeys = 600;
  int round = 0;
  // Each round overwrites every key (in three flushes), then renews the
  // decision and polls.
  auto rounds = [&](int n, DeferralState state) {
    for (int i = 0; i < n; ++i, ++round) {
      for (int third = 0; third < 3; ++third) r.db.write_round(round, kKeys / 3, third * kKeys / 3);
      r.decide(state);
      r.poll();
    }
  };
  rounds(2, DeferralState::kNormal);
  rounds(3, DeferralState::kFirstStage);
  rounds(6, DeferralState::kSecondStage);
  CHECK(r.act->stats()[0].intra_l0 > 0);
  r.decide(DeferralState::kNormal);
  for (int i = 0; i < 200 && r.gate->state(r.part()) != DeferralState::kNormal; ++i) {
    r.poll();
    REQUIRE(r.db.db->CompactRange(rocksdb::CompactRangeOptions(), nullptr, nullptr).ok());
  }
  CHECK(r.gate->state(r.part()) == DeferralState::kNormal);
  CHECK(r.db.options() == configured);
  // The newest round of every key wins: nothing lost, nothing reordered.
  const std::string want = "round" + std::to_string(round - 1) + "-";
  for (int i = 0; i < kKeys; ++i) {
    std::string v;
    REQUIRE(r.db.db->Get(rocksdb::ReadOptions(), DeferralDb::key(i), &v).ok());
    INFO(DeferralDb::key(i));
    CHECK(v.rfind(want, 0) == 0);
  }
}

TEST_CASE("deferral actuator: intra-L0 keeps L0 below the stop trigger", "[deferral]") {
  // The second stage suspends L0->L1. Without intra-L0 compactions (a
  // threshold never reached), 20 flushes leave 20 files in L0, past the stop
  // trigger (12): writes would stop as soon as compactions were back on.
  // With them, L0 never reaches the slowdown trigger (8) and no write stalls.
  auto run = [](int intra_min) {
    DeferralActuatorOptions o;
    o.intra_l0_min_files = intra_min;
    o.intra_l0_max_files = std::max(intra_min, 32);
    o.max_l0_files = 100;
    Rig r(o);
    r.decide(DeferralState::kSecondStage);
    r.poll();
    int max_l0 = 0;
    for (int round = 0; round < 20; ++round) {
      r.db.write_round(round, 100, round * 100);  // fresh keys: no overwrite shrinks a merge
      max_l0 = std::max(max_l0, r.db.l0());
      r.decide(DeferralState::kSecondStage);
      r.poll();
    }
    std::uint64_t stops = 0;
    r.db.db->GetIntProperty("rocksdb.is-write-stopped", &stops);
    CHECK(stops == 0);
    return std::make_pair(max_l0, r.act->stats()[0].intra_l0);
  };
  const auto [plain_l0, plain_intra] = run(1000);
  CHECK(plain_intra == 0);
  CHECK(plain_l0 >= 12);
  const auto [intra_l0, intra] = run(4);
  CHECK(intra > 0);
  CHECK(intra_l0 < 8);
}

TEST_CASE("deferral actuator: the L0 cap and the growth cap end a deferral", "[deferral]") {
  SECTION("L0 cap") {
    DeferralActuatorOptions o;
    o.intra_l0_min_files = 1000;  // no intra-L0: L0 only grows
    o.intra_l0_max_files = 1000;
    o.max_l0_files = 10;
    Rig r(o);
    r.decide(DeferralState::kSecondStage);
    r.poll();
    for (int round = 0; round < 10; ++round) r.db.write_round(round, 50, round * 50);
    r.poll();
    CHECK(r.gate->state(r.part()) == DeferralState::kRecovering);
    CHECK(r.last_transition() == "second-stage>recovering:L0 cap");
    CHECK(r.act->stats()[0].l0_cap_ends == 1);
    r.poll();  // recovering: compactions back, triggers still raised while L0 is high
    auto o2 = r.db.options();
    CHECK(o2["disable_auto_compactions"] == "false");
    CHECK(o2["level0_slowdown_writes_trigger"] == "10");
    r.decide(DeferralState::kSecondStage);  // refused until normal again
    CHECK(r.gate->state(r.part()) == DeferralState::kRecovering);
  }
  SECTION("growth cap") {
    Rig r;
    REQUIRE(r.gate->configure({{"growth_cap_bytes", 100 << 10}}).is_ok());
    r.decide(DeferralState::kFirstStage);
    r.poll();
    for (int round = 0; round < 4; ++round) r.db.write_round(round, 200, round * 200);
    r.poll();
    CHECK(r.gate->state(r.part()) == DeferralState::kRecovering);
    CHECK(r.last_transition() == "first-stage>recovering:growth cap");
    CHECK(r.gate->collect()["partitions"][0]["growth_bytes"].get<std::uint64_t>() > (100 << 10));
  }
}

TEST_CASE("deferral actuator: a flush wakes the thread through the listener", "[deferral]") {
  // A poll period of an hour: only the listener's wake-up makes it act.
  auto listener = std::make_shared<sluice::rocksdb_binding::DeferralWakeListener>();
  sluice::testing::TempDir dir{"deferral-wake"};
  rocksdb::Options ro;
  ro.create_if_missing = true;
  ro.listeners.push_back(listener);
  rocksdb::DB* raw = nullptr;
  REQUIRE(rocksdb::DB::Open(ro, dir.path, &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  auto gate = std::make_shared<DeferralGate>();
  DeferralActuatorOptions o;
  o.gate = gate;
  o.families = {{db->DefaultColumnFamily(), "7"}};
  o.poll_ms = 3'600'000;
  auto a = DeferralActuator::start(db.get(), o);
  REQUIRE(a.is_ok());
  listener->attach(a->get());
  REQUIRE(gate->decide("7", DeferralState::kFirstStage).is_ok());
  REQUIRE(db->Put(rocksdb::WriteOptions(), "k", "v").ok());
  REQUIRE(db->Flush(rocksdb::FlushOptions()).ok());
  const bool applied = sluice::testing::wait_for(
      [&] { return (*a)->stats()[0].applied == DeferralState::kFirstStage; },
      std::chrono::seconds(30));
  CHECK(applied);
  CHECK(db->GetOptions().max_bytes_for_level_base == std::uint64_t{1} << 40);
  listener->attach(nullptr);
  a->reset();
  CHECK(db->GetOptions().max_bytes_for_level_base != std::uint64_t{1} << 40);
}

TEST_CASE("deferral actuator: bad options name the field", "[deferral]") {
  DeferralDb db;
  DeferralActuatorOptions o;
  CHECK(DeferralActuator::start(db.db.get(), o).status().message() == "gate: required");
  o.gate = std::make_shared<DeferralGate>();
  CHECK(DeferralActuator::start(db.db.get(), o).status().message() ==
        "families: at least one column family");
  o.families = {{db.cf, "7"}, {db.cf, "8"}};
  CHECK(DeferralActuator::start(db.db.get(), o).status().message() ==
        "families[1].cf: listed twice");
  o.families = {{db.cf, ""}};
  CHECK(DeferralActuator::start(db.db.get(), o).status().message() ==
        "families[0].partition: a partition name is 1 to 256 bytes");
  o.families = {{db.cf, "7"}};
  o.max_l0_files = 5;
  CHECK(DeferralActuator::start(db.db.get(), o).status().message() ==
        "max_l0_files: must be at least families[0]'s level0_slowdown_writes_trigger (8), got 5");
  o.max_l0_files = 0;
  o.intra_l0_min_files = 1;
  CHECK(DeferralActuator::start(db.db.get(), o).status().message() ==
        "intra_l0_min_files: must be >= 2, got 1");
  // A stage's object, found by channel and name.
  sluice::objects::register_builtin();
  auto stage = sluice::Stage::create();
  REQUIRE(stage.is_ok());
  REQUIRE((*stage)
              ->apply(nlohmann::json::parse(R"([
    {"rule": "create_channel", "channel": "bg", "default": true},
    {"rule": "create_object", "channel": "bg", "object": "deferral", "type": "deferral-gate"},
    {"rule": "create_object", "channel": "bg", "object": "n", "type": "noop"}])"))
              .is_ok());
  CHECK(DeferralActuator::find_gate(**stage, "bg", "deferral").is_ok());
  CHECK(DeferralActuator::find_gate(**stage, "bg", "n").status().message() ==
        "object 'n' in channel 'bg' is a noop, not a deferral-gate");
  CHECK(DeferralActuator::find_gate(**stage, "bg", "x").status().code() == sluice::Code::kNotFound);
}
