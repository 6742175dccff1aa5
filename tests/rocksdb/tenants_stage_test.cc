// The tenant gate with a stage as its admission (rb::StageAdmission): the gate's
// writes reach the stage's object for their context, a capacity-holding object of the
// stage is the pool (waits, no_slowdown, cancel on removal), and the built-in
// buffer-pool object serves as that pool.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include <rocksdb/db.h>

#include "rocksdb_test_util.h"
#include "sluice/objects/builtin.h"
#include "sluice/registry.h"
#include "sluice/rocksdb_tenants.h"
#include "sluice/thread_annotations.h"
#include "tenants_test_util.h"

using sluice::testing::eventually;
using sluice_test::TempDir;

TEST_CASE("StageAdmission: the gate's writes reach the stage's object for their context",
          "[rocksdb][tenants]") {
  // A stage whose rules route writes to per-request (noop) objects by origin: each write
  // is one request of its bytes, with origin foreground and op write; nothing is held.
  sluice::objects::register_builtin();
  auto stage = sluice_test::counting_stage("tenant-gate");
  TempDir dir("tenants");
  rb::TenantGateOptions g = cf_gate(nullptr);
  g.stage = stage.get();
  Opened o = open_two(dir.file("db"), g);
  for (int i = 0; i < 100; ++i) {
    REQUIRE(o.gate->Put(rocksdb::WriteOptions(), o.a(), tenant_key("a", i), tenant_value(i)).ok());
  }
  sluice_test::Tally tally;
  tally.add(stage->collect());
  const rb::GateCfStats sa = o.gate->stats(o.a());
  CHECK(sa.charged_bytes == 100u * (7 + 100 + rb::TenantGateOptions().entry_overhead));
  CHECK(tally.get("foreground", "write") == sa.charged_bytes);
  CHECK(tally.ops["foreground"]["write"] == 100);
  CHECK(sa.held == 0);  // a per-request object holds nothing
}

namespace {

// A capacity-holding object for the stage path: each tenant may hold `capacity` units
// (a request larger than that is granted when the tenant holds nothing); an acquire
// that does not fit waits for releases, or would wait under kNoWait.
class TenantCap final : public sluice::EnforcementObject {
 public:
  std::string_view type() const noexcept override { return "tenant-cap"; }
  sluice::Status validate(const nlohmann::json& c) const override {
    return c.contains("capacity") && c["capacity"].is_number_unsigned()
               ? sluice::Status{}
               : sluice::Status::invalid("capacity: required");
  }
  sluice::Status configure(const nlohmann::json& c) override {
    SLUICE_RETURN_IF_ERROR(validate(c));
    sluice::MutexLock lock(mu_);
    capacity_ = c["capacity"].get<std::uint64_t>();
    return {};
  }
  sluice::Verdict enforce_context(const sluice::Context&) noexcept override { return {}; }
  bool holds_capacity() const noexcept override { return true; }
  bool same_flow(const sluice::Context& a, const sluice::Context& b) const noexcept override {
    return a.tenant == b.tenant;
  }
  sluice::Verdict acquire(const sluice::Context& ctx, std::uint64_t n) noexcept override {
    sluice::MutexLock lock(mu_);
    std::uint64_t& used = usage_[ctx.tenant];
    while (used + n > capacity_ && used > 0) {
      if (shut_down_) return {sluice::Outcome::kCancelled, 0};
      if ((ctx.flags & sluice::context_flag::kNoWait) != 0) {
        return {sluice::Outcome::kWouldWait, 0};
      }
      ++waits_[ctx.tenant];
      lock.wait(cv_);
    }
    used += n;
    return {sluice::Outcome::kOk, 0};
  }
  void release(const sluice::Context& ctx, std::uint64_t n) noexcept override {
    sluice::MutexLock lock(mu_);
    std::uint64_t& used = usage_[ctx.tenant];
    used -= std::min(n, used);
    cv_.notify_all();
  }
  nlohmann::json collect() const override {
    sluice::MutexLock lock(mu_);
    nlohmann::json usage = nlohmann::json::object();
    nlohmann::json waits = nlohmann::json::object();
    for (const auto& [t, n] : usage_) usage[std::to_string(t)] = n;
    for (const auto& [t, n] : waits_) waits[std::to_string(t)] = n;
    return {{"usage", usage}, {"waits", waits}};
  }
  void shutdown() noexcept override {
    sluice::MutexLock lock(mu_);
    shut_down_ = true;
    cv_.notify_all();
  }

 private:
  mutable sluice::Mutex mu_;
  std::condition_variable cv_;
  std::uint64_t capacity_ SLUICE_GUARDED_BY(mu_) = 0;
  bool shut_down_ SLUICE_GUARDED_BY(mu_) = false;
  std::map<std::uint32_t, std::uint64_t> usage_ SLUICE_GUARDED_BY(mu_);
  std::map<std::uint32_t, std::uint64_t> waits_ SLUICE_GUARDED_BY(mu_);
};

sluice::Registry& cap_registry() {
  static sluice::Registry* r = [] {
    auto* reg = new sluice::Registry();
    (void)sluice::objects::register_builtin(*reg);
    (void)reg->add({"tenant-cap", "per-tenant capacity",
                    [](const sluice::ObjectEnv&) { return std::make_unique<TenantCap>(); }});
    return reg;
  }();
  return *r;
}

nlohmann::json object_state(sluice::Stage& stage, const std::string& name) {
  for (const auto& ch : stage.collect().channels) {
    for (const auto& obj : ch.objects) {
      if (obj.name == name) return obj.state;
    }
  }
  return {};
}

std::uint64_t usage_in(const nlohmann::json& state, std::uint32_t tenant) {
  const std::string k = std::to_string(tenant);
  return state.contains("usage") && state["usage"].contains(k)
             ? state["usage"][k].get<std::uint64_t>()
             : 0;
}

}  // namespace

TEST_CASE("StageAdmission: a capacity-holding object of the stage is the pool",
          "[rocksdb][tenants]") {
  sluice::StageOptions so;
  so.name = "tenant-pool";
  so.registry = &cap_registry();
  auto stage = sluice::Stage::create(so).value();
  REQUIRE(stage
              ->apply(nlohmann::json::parse(R"([
    {"rule": "create_channel", "channel": "writes", "default": true},
    {"rule": "create_object", "channel": "writes", "object": "write_buffer",
     "type": "tenant-cap", "config": {"capacity": 65536}}])"))
              .is_ok());
  TempDir dir("tenants");
  rb::TenantGateOptions g = cf_gate(nullptr);
  g.stage = stage.get();
  Opened o = open_two(dir.file("db"), g);
  rb::TenantGate& gate = *o.gate;

  constexpr int kAPuts = 2000;  // ~278 KB: A waits at 64 KiB until a flush gives back
  std::atomic<int> a_failures{0};
  std::thread a_writer([&] {
    for (int i = 0; i < kAPuts; ++i) {
      if (!gate.Put(rocksdb::WriteOptions(), o.a(), tenant_key("a", i), tenant_value(i)).ok()) {
        a_failures.fetch_add(1);
      }
    }
  });
  rocksdb::WriteOptions no_wait;
  no_wait.no_slowdown = true;
  for (int i = 0; i < 100; ++i) {  // B stays under its own 64 KiB: never waits
    REQUIRE(gate.Put(no_wait, o.b(), tenant_key("b", i), tenant_value(i)).ok());
  }
  a_writer.join();
  CHECK(a_failures.load() == 0);
  const rb::GateCfStats sa = gate.stats(o.a());
  CHECK(sa.waits > 0);
  CHECK(sa.flushes_requested > 0);
  CHECK(sa.released_bytes > 0);
  CHECK(gate.stats(o.b()).waits == 0);
  // What the object holds for each tenant is what the gate's ledger holds.
  // (A flush may still be completing: they agree once it has.)
  eventually([&] {
    const nlohmann::json state = object_state(*stage, "write_buffer");
    return usage_in(state, kA) == gate.stats(o.a()).held &&
           usage_in(state, kB) == gate.stats(o.b()).held;
  });
  std::string v;
  for (int i = 0; i < kAPuts; i += 97) {
    REQUIRE(gate.Get(rocksdb::ReadOptions(), o.a(), tenant_key("a", i), &v).ok());
  }
  // Closing gives everything back to the object.
  REQUIRE(gate.Close().ok());
  const nlohmann::json after = object_state(*stage, "write_buffer");
  CHECK(usage_in(after, kA) == 0);
  CHECK(usage_in(after, kB) == 0);
}

TEST_CASE("the built-in buffer-pool object as the gate's pool", "[rocksdb][tenants]") {
  sluice::objects::register_builtin();
  if (!sluice::Registry::global().contains("buffer-pool")) {
    WARN("no buffer-pool object type in this build: nothing to check");
    return;
  }
  sluice::StageOptions so;
  so.name = "tenant-buffer-pool";
  auto stage = sluice::Stage::create(so).value();
  const sluice::Status applied = stage->apply(nlohmann::json::parse(R"([
    {"rule": "create_channel", "channel": "writes", "default": true},
    {"rule": "create_object", "channel": "writes", "object": "write_buffer",
     "type": "buffer-pool",
     "config": {"capacity": 262144, "reserved": 65536, "weights": {"1": 1, "2": 1}}}])"));
  INFO(applied.to_string());
  REQUIRE(applied.is_ok());
  TempDir dir("tenants");
  rb::TenantGateOptions g = cf_gate(nullptr);
  g.stage = stage.get();
  Opened o = open_two(dir.file("db"), g);
  rb::TenantGate& gate = *o.gate;

  rocksdb::WriteOptions no_wait;
  no_wait.no_slowdown = true;
  for (int i = 0; i < 100; ++i) {  // B: 14 KB, well below its 128 KiB fair share
    REQUIRE(gate.Put(no_wait, o.b(), tenant_key("b", i), tenant_value(i)).ok());
  }
  constexpr int kAPuts = 4000;  // A: 556 KB through a 256 KiB pool
  for (int i = 0; i < kAPuts; ++i) {
    INFO(i);
    REQUIRE(gate.Put(rocksdb::WriteOptions(), o.a(), tenant_key("a", i), tenant_value(i)).ok());
  }
  const rb::GateCfStats sa = gate.stats(o.a());
  CHECK(sa.waits > 0);
  CHECK(sa.flushes_requested > 0);
  CHECK(sa.released_bytes > 0);
  CHECK(gate.stats(o.b()).waits == 0);
  // A's own flushes serve A: B's memtable is left alone.
  CHECK(gate.stats(o.b()).flushes_requested == 0);

  auto usage_of = [&](std::uint32_t tenant) -> std::uint64_t {
    const nlohmann::json state = object_state(*stage, "write_buffer");
    for (const auto& f : state.value("flows", nlohmann::json::array())) {
      if (f["flow"].is_number() && f["flow"].get<std::uint32_t>() == tenant) {
        return f["usage"].get<std::uint64_t>();
      }
    }
    return 0;
  };
  // (A flush may still be completing: they agree once it has.)
  eventually([&] {
    return usage_of(kA) == gate.stats(o.a()).held && usage_of(kB) == gate.stats(o.b()).held;
  });
  CHECK(sa.held <= 262144);
  std::string v;
  for (int i = 0; i < kAPuts; i += 101) {
    REQUIRE(gate.Get(rocksdb::ReadOptions(), o.a(), tenant_key("a", i), &v).ok());
  }
  REQUIRE(gate.Close().ok());
  CHECK(usage_of(kA) == 0);
  CHECK(usage_of(kB) == 0);
}

TEST_CASE("without flush_on_wait, a pool shrunk below what memtables hold does not stall writers",
          "[rocksdb][tenants]") {
  // RocksDB flushes a memtable only when it is full: with the pool lowered below what
  // two tenants' partly filled memtables hold, every writer waits for bytes no flush
  // will give back, unless the gate ends the stall by flushing.
  sluice::objects::register_builtin();
  if (!sluice::Registry::global().contains("buffer-pool")) {
    WARN("no buffer-pool object type in this build: nothing to check");
    return;
  }
  sluice::StageOptions so;
  so.name = "tenant-shrunk-pool";
  auto stage = sluice::Stage::create(so).value();
  REQUIRE(stage
              ->apply(nlohmann::json::parse(R"([
    {"rule": "create_channel", "channel": "writes", "default": true},
    {"rule": "create_object", "channel": "writes", "object": "write_buffer",
     "type": "buffer-pool", "config": {"capacity": 262144, "weights": {"1": 1, "2": 1}}}])"))
              .is_ok());
  TempDir dir("tenants");
  rb::TenantGateOptions g = cf_gate(nullptr);
  g.stage = stage.get();
  g.flush_on_wait = false;
  g.refresh_interval = std::chrono::milliseconds(20);
  Opened o = open_two(dir.file("db"), g);
  rb::TenantGate& gate = *o.gate;

  rocksdb::WriteOptions no_wait;
  no_wait.no_slowdown = true;
  for (int i = 0; i < 600; ++i) {  // ~85 KB each, together well inside 256 KiB
    REQUIRE(gate.Put(no_wait, o.a(), tenant_key("a", i), tenant_value(i)).ok());
    REQUIRE(gate.Put(no_wait, o.b(), tenant_key("b", i), tenant_value(i)).ok());
  }
  CHECK(gate.stats(o.a()).flushes_requested == 0);  // nobody waited: nothing flushed
  CHECK(gate.stats(o.b()).flushes_requested == 0);
  REQUIRE(stage
              ->apply(nlohmann::json::parse(R"([{"rule": "configure", "channel": "writes",
      "object": "write_buffer", "config": {"capacity": 65536}}])"))
              .is_ok());

  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::thread writer([&] {
    for (int i = 600; i < 800; ++i) {
      if (!gate.Put(rocksdb::WriteOptions(), o.a(), tenant_key("a", i), tenant_value(i)).ok()) {
        failures.fetch_add(1);
      }
    }
    done.store(true);
  });
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done.load() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const bool moved_on = done.load();
  if (!moved_on) {  // removing the pool cancels the waits, so that the test can end
    REQUIRE(stage
                ->apply(nlohmann::json::parse(R"([{"rule": "remove_object", "channel": "writes",
        "object": "write_buffer"}])"))
                .is_ok());
  }
  writer.join();
  CHECK(moved_on);
  CHECK(failures.load() == 0);
  CHECK(gate.stats(o.a()).waits > 0);
  CHECK(gate.stats(o.a()).flushes_requested + gate.stats(o.b()).flushes_requested > 0);
  // Flushed empty, a memtable holds no write's bytes: the ledger gives all back (an
  // empty memtable's own 2 KiB block would otherwise keep a part of the pool per tenant).
  rocksdb::FlushOptions fo;
  REQUIRE(gate.Flush(fo, o.a()).ok());
  REQUIRE(gate.Flush(fo, o.b()).ok());
  eventually([&] { return gate.stats(o.a()).held == 0 && gate.stats(o.b()).held == 0; });
  std::string v;
  for (int i = 0; i < 800; i += 53) {
    REQUIRE(gate.Get(rocksdb::ReadOptions(), o.a(), tenant_key("a", i), &v).ok());
  }
  REQUIRE(gate.Close().ok());
}
