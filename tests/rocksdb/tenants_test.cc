// Integration tests of the RocksDB tenant gate (sluice/rocksdb_tenants.h) on a real
// RocksDB in a temporary directory: only the tenant over its allowance waits, its writes
// all land in order, flushes give the ledger back, no_slowdown, cancel and reject, batches
// across tenants, the per-tenant L0 limit, the timer's reconciliation, DB instances.
// The pool is a test double behind the gate's Admission seam, so that a test decides
// when a tenant waits.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/transaction_log.h>

#include "rocksdb_test_util.h"
#include "sluice/clock.h"
#include "sluice/objects/builtin.h"
#include "sluice/registry.h"
#include "sluice/rocksdb_tenants.h"
#include "sluice/thread_annotations.h"
#include "tenants_test_util.h"

using sluice::testing::eventually;
using sluice_test::TempDir;

namespace {

// A pool per tenant: a tenant holds at most its limit (unlimited by default; a request
// larger than the limit is granted when the tenant holds nothing). A paused tenant's
// acquires wait (or would wait); cancel() ends waits with kCancelled; reject() refuses.
class TestPool final : public rb::Admission {
 public:
  rb::Admitted acquire(const sluice::Context& ctx, std::uint64_t n) noexcept override {
    std::unique_lock<std::mutex> lock(mu_);
    Tenant& t = tenants_[ctx.tenant];
    order_.push_back(ctx.tenant);
    if (t.reject) return {{sluice::Outcome::kRejected, 0}, 0};
    auto fits = [&] { return !t.paused && (t.usage + n <= t.limit || t.usage == 0); };
    if (!fits()) {
      if ((ctx.flags & sluice::context_flag::kNoWait) != 0) {
        return {{sluice::Outcome::kWouldWait, 0}, 0};
      }
      ++t.waits;
      ++t.waiting;
      while (!fits() && !t.cancel) cv_.wait(lock);
      --t.waiting;
      if (t.cancel) return {{sluice::Outcome::kCancelled, 0}, 0};
    }
    t.usage += n;
    return {{sluice::Outcome::kOk, 0}, n};
  }
  void release(const sluice::Context& ctx, std::uint64_t n) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    Tenant& t = tenants_[ctx.tenant];
    t.usage -= std::min(n, t.usage);
    t.released += n;
    cv_.notify_all();
  }

  void set_limit(std::uint32_t tenant, std::uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    tenants_[tenant].limit = bytes;
    cv_.notify_all();
  }
  void pause(std::uint32_t tenant, bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    tenants_[tenant].paused = on;
    cv_.notify_all();
  }
  void cancel(std::uint32_t tenant) {
    std::lock_guard<std::mutex> lock(mu_);
    tenants_[tenant].cancel = true;
    cv_.notify_all();
  }
  void reject(std::uint32_t tenant, bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    tenants_[tenant].reject = on;
  }
  std::uint64_t usage(std::uint32_t t) { return get(t).usage; }
  int waiting(std::uint32_t t) { return get(t).waiting; }
  int waits(std::uint32_t t) { return get(t).waits; }
  std::vector<std::uint32_t> take_order() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(order_, {});
  }

 private:
  struct Tenant {
    std::uint64_t limit = UINT64_MAX;
    std::uint64_t usage = 0;
    std::uint64_t released = 0;
    bool paused = false;
    bool cancel = false;
    bool reject = false;
    int waiting = 0;
    int waits = 0;
  };
  Tenant get(std::uint32_t t) {
    std::lock_guard<std::mutex> lock(mu_);
    return tenants_[t];
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint32_t, Tenant> tenants_;
  std::vector<std::uint32_t> order_;
};

std::uint64_t memtable_bytes(rocksdb::DB& db, rocksdb::ColumnFamilyHandle* cf) {
  std::uint64_t v = 0;
  REQUIRE(db.GetIntProperty(cf, rocksdb::DB::Properties::kCurSizeAllMemTables, &v));
  return v;
}

// Keys of column family `cf_id` in the order the WAL holds them.
class KeysOf : public rocksdb::WriteBatch::Handler {
 public:
  explicit KeysOf(std::uint32_t cf_id) : cf_id_(cf_id) {}
  rocksdb::Status PutCF(std::uint32_t cf, const rocksdb::Slice& k, const rocksdb::Slice&) override {
    if (cf == cf_id_) keys.push_back(k.ToString());
    return rocksdb::Status::OK();
  }
  std::vector<std::string> keys;

 private:
  std::uint32_t cf_id_;
};

}  // namespace

TEST_CASE("IsolateStalls moves RocksDB's triggers and returns the gate's limits",
          "[rocksdb][tenants]") {
  rocksdb::ColumnFamilyOptions cf;
  cf.write_buffer_size = 4 << 20;
  cf.max_write_buffer_number = 2;
  cf.level0_slowdown_writes_trigger = 20;
  cf.level0_stop_writes_trigger = 36;
  cf.soft_pending_compaction_bytes_limit = 64ull << 30;
  cf.hard_pending_compaction_bytes_limit = 256ull << 30;
  rb::StallIsolation iso;
  iso.tenant_memtable_bytes = 64 << 20;  // 16 memtables
  auto limits = rb::IsolateStalls(cf, iso);
  REQUIRE(limits.is_ok());
  CHECK(limits->l0_files == 36);
  CHECK(limits->pending_compaction_bytes == 256ull << 30);
  CHECK(cf.level0_slowdown_writes_trigger == 72);
  CHECK(cf.level0_stop_writes_trigger == 72);
  CHECK(cf.soft_pending_compaction_bytes_limit == 512ull << 30);
  CHECK(cf.hard_pending_compaction_bytes_limit == 512ull << 30);
  CHECK(cf.max_write_buffer_number == 16 + 3);

  SECTION("RocksDB's pending-bytes stall stays off when it was off") {
    rocksdb::ColumnFamilyOptions off;
    off.soft_pending_compaction_bytes_limit = 0;
    off.hard_pending_compaction_bytes_limit = 0;
    auto l = rb::IsolateStalls(off);
    REQUIRE(l.is_ok());
    CHECK(l->pending_compaction_bytes == 0);
    CHECK(off.hard_pending_compaction_bytes_limit == 0);
    CHECK(off.max_write_buffer_number == rocksdb::ColumnFamilyOptions().max_write_buffer_number);
  }
  SECTION("bad settings name the field and change nothing") {
    rocksdb::ColumnFamilyOptions before;
    rocksdb::ColumnFamilyOptions o = before;
    rb::StallIsolation bad;
    bad.backstop_factor = 0;
    auto l = rb::IsolateStalls(o, bad);
    REQUIRE_FALSE(l.is_ok());
    CHECK(l.status().message().find("backstop_factor") != std::string::npos);
    CHECK(o.level0_stop_writes_trigger == before.level0_stop_writes_trigger);
  }
}

TEST_CASE("Prepare checks its options", "[rocksdb][tenants]") {
  rocksdb::DBOptions db;
  rb::TenantGateOptions none;
  auto r = rb::TenantGate::Prepare(db, none);
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().message().find("stage") != std::string::npos);
  CHECK(db.listeners.empty());

  auto pool = std::make_shared<TestPool>();
  rb::TenantGateOptions wbm = cf_gate(pool);
  wbm.write_buffer_manager_bytes = 1 << 20;  // column-family tenants: refused
  r = rb::TenantGate::Prepare(db, wbm);
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().message().find("write_buffer_manager_bytes") != std::string::npos);
  CHECK(db.listeners.empty());
  CHECK(db.write_buffer_manager == nullptr);

  REQUIRE(rb::TenantGate::Prepare(db, cf_gate(pool)).is_ok());
  CHECK(db.listeners.size() == 1);
  r = rb::TenantGate::Prepare(db, cf_gate(pool));
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == sluice::Code::kFailedPrecondition);
}

TEST_CASE("column-family tenants: B writes while A waits, A's writes land in order",
          "[rocksdb][tenants]") {
  TempDir dir("tenants");
  auto pool = std::make_shared<TestPool>();
  pool->set_limit(kA, 64 << 10);  // A waits every ~450 puts until a flush gives back
  rocksdb::DBOptions db;
  db.WAL_ttl_seconds = 3600;  // keep the WAL: it shows the order writes were applied in
  Opened o = open_two(dir.file("db"), cf_gate(pool), db);
  rb::TenantGate& gate = *o.gate;

  constexpr int kAPuts = 2000;
  pool->pause(kA, true);
  std::atomic<int> a_failures{0};
  std::thread a_writer([&] {
    for (int i = 0; i < kAPuts; ++i) {
      if (!gate.Put(rocksdb::WriteOptions(), o.a(), tenant_key("a", i), tenant_value(i)).ok()) {
        a_failures.fetch_add(1);
      }
    }
  });
  eventually([&] { return pool->waiting(kA) == 1; });
  CHECK(gate.stats(o.a()).waits >= 1);

  // B is not held up by A's wait: with no_slowdown none of its writes may wait.
  rocksdb::WriteOptions no_wait;
  no_wait.no_slowdown = true;
  for (int i = 0; i < 500; ++i) {
    INFO(i);
    REQUIRE(gate.Put(no_wait, o.b(), tenant_key("b", i), tenant_value(i)).ok());
  }
  CHECK(pool->waiting(kA) == 1);  // A still waits
  CHECK(pool->waits(kB) == 0);
  CHECK(gate.stats(o.b()).waits == 0);

  pool->pause(kA, false);
  a_writer.join();
  CHECK(a_failures.load() == 0);
  const rb::GateCfStats sa = gate.stats(o.a());
  CHECK(sa.waits > 1);               // the 64 KiB limit, again and again
  CHECK(sa.flushes_requested >= 1);  // each wait asked for A's flush
  // (A flush may still be completing: the ledger and the pool agree once it has.)
  eventually([&] { return pool->usage(kA) == gate.stats(o.a()).held; });

  // Everything landed.
  std::string v;
  for (int i = 0; i < kAPuts; ++i) {
    REQUIRE(gate.Get(rocksdb::ReadOptions(), o.a(), tenant_key("a", i), &v).ok());
    REQUIRE(v == tenant_value(i));
  }
  for (int i = 0; i < 500; ++i) {
    REQUIRE(gate.Get(rocksdb::ReadOptions(), o.b(), tenant_key("b", i), &v).ok());
  }
  // In order: A's puts appear in the WAL (sequence order) as they were issued.
  std::unique_ptr<rocksdb::TransactionLogIterator> it;
  REQUIRE(gate.GetUpdatesSince(1, &it, rocksdb::TransactionLogIterator::ReadOptions()).ok());
  KeysOf keys(o.a()->GetID());
  for (; it->Valid(); it->Next()) {
    rocksdb::BatchResult batch = it->GetBatch();
    REQUIRE(batch.writeBatchPtr->Iterate(&keys).ok());
  }
  REQUIRE(keys.keys.size() == static_cast<std::size_t>(kAPuts));
  for (int i = 0; i < kAPuts; ++i)
    REQUIRE(keys.keys[static_cast<std::size_t>(i)] == tenant_key("a", i));
}

TEST_CASE("a flush gives the ledger back down to the memtables", "[rocksdb][tenants]") {
  TempDir dir("tenants");
  auto pool = std::make_shared<TestPool>();
  Opened o = open_two(dir.file("db"), cf_gate(pool));
  rb::TenantGate& gate = *o.gate;
  for (int i = 0; i < 1000; ++i) {
    REQUIRE(gate.Put(rocksdb::WriteOptions(), o.a(), tenant_key("a", i), tenant_value(i)).ok());
  }
  const rb::GateCfStats before = gate.stats(o.a());
  CHECK(before.charged_bytes == before.held);
  CHECK(before.held >= 1000u * (7 + 100));  // keys and values at least
  CHECK(pool->usage(kA) == before.held);

  REQUIRE(gate.Flush(rocksdb::FlushOptions(), o.a()).ok());
  // The listener wakes the gate's worker, which reconciles.
  // (The ledger drops first, then what it dropped goes back to the pool.)
  eventually([&] {
    const rb::GateCfStats now = gate.stats(o.a());
    return now.held <= memtable_bytes(gate, o.a()) && pool->usage(kA) == now.held &&
           now.released_bytes == before.held - now.held;
  });
  const rb::GateCfStats after = gate.stats(o.a());
  CHECK(after.held < before.held);
  CHECK(gate.stats(o.b()).held == 0);  // B wrote nothing

  // The memtable's own size tracks what was charged (entry_overhead is about right):
  // a fresh memtable with the same puts is within 15% of the ledger.
  for (int i = 0; i < 1000; ++i) {
    REQUIRE(gate.Put(rocksdb::WriteOptions(), o.b(), tenant_key("b", i), tenant_value(i)).ok());
  }
  const double ratio = static_cast<double>(gate.stats(o.b()).held) /
                       static_cast<double>(memtable_bytes(gate, o.b()));
  INFO("ledger / memtable " << ratio);
  CHECK(ratio > 0.85);
  CHECK(ratio < 1.15);
}

TEST_CASE("no_slowdown, cancel and reject", "[rocksdb][tenants]") {
  TempDir dir("tenants");
  auto pool = std::make_shared<TestPool>();
  Opened o = open_two(dir.file("db"), cf_gate(pool));
  rb::TenantGate& gate = *o.gate;
  REQUIRE(gate.Put(rocksdb::WriteOptions(), o.a(), "k0", "v0").ok());
  const std::uint64_t held = gate.stats(o.a()).held;

  rocksdb::WriteOptions no_wait;
  no_wait.no_slowdown = true;
  pool->pause(kA, true);

  SECTION("no_slowdown returns Incomplete and charges nothing") {
    const rocksdb::Status s = gate.Put(no_wait, o.a(), "k1", "v1");
    CHECK(s.IsIncomplete());
    CHECK(s.ToString().find("tenant 1") != std::string::npos);
    std::string v;
    CHECK(gate.Get(rocksdb::ReadOptions(), o.a(), "k1", &v).IsNotFound());
    CHECK(gate.stats(o.a()).incomplete == 1);
    CHECK(gate.stats(o.a()).held == held);
    CHECK(pool->usage(kA) == held);
    CHECK(gate.Put(no_wait, o.b(), "k1", "v1").ok());  // B is not A
  }
  SECTION("a cancelled wait proceeds with the write") {
    const std::uint64_t charged = gate.stats(o.a()).charged_bytes;
    rocksdb::Status s;
    std::thread w([&] { s = gate.Put(rocksdb::WriteOptions(), o.a(), "k2", "v2"); });
    eventually([&] { return pool->waiting(kA) == 1; });
    pool->cancel(kA);
    w.join();
    CHECK(s.ok());
    std::string v;
    CHECK(gate.Get(rocksdb::ReadOptions(), o.a(), "k2", &v).ok());
    CHECK(gate.stats(o.a()).cancelled == 1);
    // Nothing more is charged or held. (The wait asked for a flush of A's memtable: once
    // it is done, the ledger gives k0's bytes back too, so held may drop, never grow.)
    CHECK(gate.stats(o.a()).charged_bytes == charged);
    CHECK(gate.stats(o.a()).held <= held);
  }
  SECTION("a rejected write returns Busy and writes nothing") {
    pool->pause(kA, false);
    pool->reject(kA, true);
    CHECK(gate.Put(rocksdb::WriteOptions(), o.a(), "k3", "v3").IsBusy());
    std::string v;
    CHECK(gate.Get(rocksdb::ReadOptions(), o.a(), "k3", &v).IsNotFound());
    CHECK(gate.stats(o.a()).held == held);
  }
  pool->pause(kA, false);
}

TEST_CASE("a tenant that holds nothing and waits has the biggest holder flushed",
          "[rocksdb][tenants]") {
  TempDir dir("tenants");
  auto pool = std::make_shared<TestPool>();
  Opened o = open_two(dir.file("db"), cf_gate(pool));
  rb::TenantGate& gate = *o.gate;
  for (int i = 0; i < 500; ++i) {
    REQUIRE(gate.Put(rocksdb::WriteOptions(), o.a(), tenant_key("a", i), tenant_value(i)).ok());
  }
  const std::uint64_t a_held = gate.stats(o.a()).held;
  pool->pause(kB, true);  // B, ramping up from nothing, must wait for others' bytes
  rocksdb::Status s;
  std::thread w([&] { s = gate.Put(rocksdb::WriteOptions(), o.b(), "k", "v"); });
  eventually([&] { return pool->waiting(kB) == 1; });
  CHECK(gate.stats(o.a()).flushes_requested == 1);
  eventually([&] { return gate.stats(o.a()).held < a_held; });  // A's flush gave back
  pool->pause(kB, false);
  w.join();
  CHECK(s.ok());
  CHECK(gate.stats(o.b()).flushes_requested == 0);  // B held nothing to flush
}

TEST_CASE("a batch across tenants acquires in tenant order and gives back on failure",
          "[rocksdb][tenants]") {
  TempDir dir("tenants");
  auto pool = std::make_shared<TestPool>();
  Opened o = open_two(dir.file("db"), cf_gate(pool));
  rb::TenantGate& gate = *o.gate;

  rocksdb::WriteBatch batch;  // B's entries first, then A's
  REQUIRE(batch.Put(o.b(), "kb", std::string(50, 'b')).ok());
  REQUIRE(batch.Put(o.a(), "ka", std::string(30, 'a')).ok());
  REQUIRE(batch.Delete(o.b(), "kb2").ok());
  REQUIRE(gate.Write(rocksdb::WriteOptions(), &batch).ok());
  CHECK(pool->take_order() == std::vector<std::uint32_t>{kA, kB});
  const std::uint64_t overhead = rb::TenantGateOptions().entry_overhead;
  CHECK(gate.stats(o.a()).held == 2 + 30 + overhead);
  CHECK(gate.stats(o.b()).held == (2 + 50 + overhead) + (3 + overhead));

  const std::uint64_t a_held = gate.stats(o.a()).held;
  pool->reject(kB, true);
  CHECK(gate.Write(rocksdb::WriteOptions(), &batch).IsBusy());
  CHECK(gate.stats(o.a()).held == a_held);  // A's charge of the failed batch given back
  CHECK(pool->usage(kA) == a_held);
}

TEST_CASE("a column family at its L0 limit makes only its tenant wait", "[rocksdb][tenants]") {
  TempDir dir("tenants");
  auto pool = std::make_shared<TestPool>();
  rb::TenantGateOptions g = cf_gate(pool);
  g.limits["a"] = rb::TenantLimits{2, 0};  // below RocksDB's compaction trigger (4)
  Opened o = open_two(dir.file("db"), g);
  rb::TenantGate& gate = *o.gate;

  // IsolateStalls moved RocksDB's own L0 triggers of every tenant out of the way.
  rocksdb::Options got = gate.GetOptions(o.b());
  CHECK(got.level0_stop_writes_trigger ==
        2 * rocksdb::ColumnFamilyOptions().level0_stop_writes_trigger);
  CHECK(got.level0_slowdown_writes_trigger == got.level0_stop_writes_trigger);

  for (int f = 0; f < 2; ++f) {
    REQUIRE(gate.Put(rocksdb::WriteOptions(), o.a(), tenant_key("a", f), "v").ok());
    REQUIRE(gate.Flush(rocksdb::FlushOptions(), o.a()).ok());
  }
  eventually([&] { return gate.stats(o.a()).at_limit; });
  CHECK(gate.stats(o.a()).l0_files == 2);

  rocksdb::WriteOptions no_wait;
  no_wait.no_slowdown = true;
  const rocksdb::Status s = gate.Put(no_wait, o.a(), "x", "y");
  CHECK(s.IsIncomplete());
  CHECK(s.ToString().find("L0") != std::string::npos);

  rocksdb::Status a_status;
  std::thread w([&] { a_status = gate.Put(rocksdb::WriteOptions(), o.a(), "late", "v"); });
  eventually([&] { return gate.stats(o.a()).limit_waits == 1; });
  for (int i = 0; i < 200; ++i) REQUIRE(gate.Put(no_wait, o.b(), tenant_key("b", i), "v").ok());
  CHECK(gate.stats(o.a()).limit_waits == 1);  // still waiting

  // A's compaction catches up: L0 empties and A's writer goes on.
  REQUIRE(gate.CompactRange(rocksdb::CompactRangeOptions(), o.a(), nullptr, nullptr).ok());
  w.join();
  CHECK(a_status.ok());
  CHECK_FALSE(gate.stats(o.a()).at_limit);
  std::string v;
  CHECK(gate.Get(rocksdb::ReadOptions(), o.a(), "late", &v).ok());
}

TEST_CASE("a column family at its pending-compaction limit makes only its tenant wait",
          "[rocksdb][tenants]") {
  TempDir dir("tenants");
  auto pool = std::make_shared<TestPool>();
  rb::TenantGateOptions g = cf_gate(pool);
  g.limits["a"] = rb::TenantLimits{0, 1};  // any byte pending compaction
  Opened o = open_two(dir.file("db"), g);
  rb::TenantGate& gate = *o.gate;
  // A's compactions are held: what L0 needs compacting stays pending.
  REQUIRE(gate.SetOptions(o.a(), {{"disable_auto_compactions", "true"},
                                  {"level0_file_num_compaction_trigger", "2"}})
              .ok());
  for (int f = 0; f < 2; ++f) {
    REQUIRE(gate.Put(rocksdb::WriteOptions(), o.a(), tenant_key("a", f), "v").ok());
    REQUIRE(gate.Flush(rocksdb::FlushOptions(), o.a()).ok());
  }
  eventually([&] { return gate.stats(o.a()).at_limit; });
  CHECK(gate.stats(o.a()).pending_compaction_bytes > 0);
  rocksdb::WriteOptions no_wait;
  no_wait.no_slowdown = true;
  CHECK(gate.Put(no_wait, o.a(), "x", "y").IsIncomplete());
  CHECK(gate.Put(no_wait, o.b(), "x", "y").ok());
  // Compaction catches up: A writes again.
  REQUIRE(gate.CompactRange(rocksdb::CompactRangeOptions(), o.a(), nullptr, nullptr).ok());
  eventually([&] { return !gate.stats(o.a()).at_limit; });
  CHECK(gate.Put(no_wait, o.a(), "x", "y").ok());
}

TEST_CASE("the timer reconciles a ledger whose flush callback was missed", "[rocksdb][tenants]") {
  TempDir dir("tenants");
  auto pool = std::make_shared<TestPool>();
  sluice::ManualClock clock;
  rb::TenantGateOptions g = cf_gate(pool);
  g.refresh_interval = std::chrono::milliseconds(100);
  g.clock = &clock;
  rocksdb::Options db;
  db.create_if_missing = true;
  db.create_missing_column_families = true;
  auto prepared = rb::TenantGate::Prepare(db, g);
  REQUIRE(prepared.is_ok());
  db.listeners.clear();  // every flush callback is missed
  rocksdb::DB* raw = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  REQUIRE(rocksdb::DB::Open(db, dir.file("db"),
                            {{rocksdb::kDefaultColumnFamilyName, {}}, {"a", {}}}, &handles, &raw)
              .ok());
  auto wrapped = rb::TenantGate::Wrap(std::move(prepared).value(), raw, handles);
  REQUIRE(wrapped.is_ok());
  rb::TenantGate& gate = **wrapped;
  rocksdb::ColumnFamilyHandle* a = handles[1];

  for (int i = 0; i < 500; ++i) {
    REQUIRE(gate.Put(rocksdb::WriteOptions(), a, tenant_key("a", i), tenant_value(i)).ok());
  }
  const std::uint64_t before = gate.stats(a).held;
  REQUIRE(gate.Flush(rocksdb::FlushOptions(), a).ok());
  CHECK(gate.stats(a).held == before);  // no callback, no timer tick yet
  eventually([&] {
    clock.advance(100'000'000);
    return gate.stats(a).held < before;
  });
  eventually([&] { return pool->usage(kA) == gate.stats(a).held; });
  CHECK(gate.stats(a).held <= memtable_bytes(gate, a));
}

TEST_CASE("tenants as DB instances: one gate per DB, a write-buffer manager each",
          "[rocksdb][tenants]") {
  TempDir dir("tenants");
  auto pool = std::make_shared<TestPool>();
  auto open = [&](std::uint32_t tenant, const std::string& name) {
    rb::TenantGateOptions g;
    g.admission = pool;
    g.tenants.db_tenant = tenant;  // kDbInstance
    g.refresh_interval = std::chrono::milliseconds(0);
    // The manager counts arena blocks (write_buffer_size / 8 here): room for several.
    g.write_buffer_manager_bytes = 4 << 20;
    rocksdb::DBOptions db;
    db.create_if_missing = true;
    rocksdb::ColumnFamilyOptions cf;
    cf.write_buffer_size = 1 << 20;
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    auto r = rb::TenantGate::Open(db, dir.file(name), {{rocksdb::kDefaultColumnFamilyName, cf}},
                                  &handles, g);
    INFO(r.status().to_string());
    REQUIRE(r.is_ok());
    return std::make_pair(std::move(r).value(), handles.front());
  };
  auto [db1, h1] = open(kA, "one");
  auto [db2, h2] = open(kB, "two");
  REQUIRE(db1->write_buffer_manager() != nullptr);
  CHECK(db1->write_buffer_manager() != db2->write_buffer_manager());
  CHECK(db1->write_buffer_manager()->buffer_size() == 4 << 20);
  REQUIRE(db1->SetBufferLimit(8 << 20).is_ok());
  CHECK(db1->write_buffer_manager()->buffer_size() == 8 << 20);
  CHECK_FALSE(db1->SetBufferLimit(0).is_ok());
  CHECK(db1->write_buffer_manager()->buffer_size() == 8 << 20);

  pool->pause(kA, true);
  rocksdb::Status s1;
  std::thread w(
      [&, db = db1.get(), h = h1] { s1 = db->Put(rocksdb::WriteOptions(), h, "k", "v"); });
  eventually([&] { return pool->waiting(kA) == 1; });
  rocksdb::WriteOptions no_wait;
  no_wait.no_slowdown = true;
  int b_ok = 0;
  for (int i = 0; i < 100; ++i) b_ok += db2->Put(no_wait, h2, tenant_key("b", i), "v").ok() ? 1 : 0;
  CHECK(b_ok == 100);
  CHECK(pool->waiting(kA) == 1);
  pool->pause(kA, false);
  w.join();
  CHECK(s1.ok());
  CHECK(db1->stats(h1).tenant == kA);
  CHECK(db2->stats(h2).tenant == kB);
  CHECK(db2->stats(h2).held == pool->usage(kB));
  REQUIRE(db1->Close().ok());
  CHECK(pool->usage(kA) == 0);  // closing gives everything back
}
