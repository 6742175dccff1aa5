// Unit tests of the RocksDB binding: origin classification of WAL / MANIFEST / LOG /
// table files and foreground reads, tenant mapping, Attach wiring, data integrity, the
// node stage (two levels) and the RocksDB limiter helper.
#include <memory>
#include <string>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>

#include "rocksdb_test_util.h"
#include "sluice/enforcement_object.h"
#include "sluice/objects/builtin.h"
#include "sluice/rocksdb.h"
#include "sluice/rocksdb_limiter.h"

namespace rb = sluice::rocksdb_binding;
using sluice_test::Tally;
using sluice_test::TempDir;

namespace {

std::string key_of(int i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "key%08d", i);
  return buf;
}
std::string value_of(int i) {
  return std::string(100 + i % 50, static_cast<char>('a' + i % 26));
}

rocksdb::Options small_options() {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.create_missing_column_families = true;
  rocksdb::BlockBasedTableOptions t;
  t.no_block_cache = true;  // every Get reads the table file
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  return o;
}

}  // namespace

TEST_CASE("tenant mapping by DB instance and by column family", "[rocksdb]") {
  rb::TenantConfig db;
  db.db_tenant = 42;
  CHECK(db.tenant_of("default", 0) == 42);
  CHECK(db.tenant_of("anything", 9) == 42);

  rb::TenantConfig cf;
  cf.mode = rb::TenantMode::kColumnFamily;
  cf.db_tenant = 1;
  cf.cf_tenants = {{"hot", 7}};
  cf.cf_id_tenant_base = 100;
  CHECK(cf.tenant_of("hot", 3) == 7);
  CHECK(cf.tenant_of("cold", 3) == 103);
  CHECK(cf.tenant_of("default", 0) == 100);
}

TEST_CASE("compaction origin from input and output levels", "[rocksdb]") {
  using sluice::origin::kCompactionL0L0;
  using sluice::origin::kCompactionL0L1;
  using sluice::origin::kCompactionLN;
  CHECK(rb::ContextListener::compaction_origin(0, 1) == kCompactionL0L1);
  CHECK(rb::ContextListener::compaction_origin(0, 3) == kCompactionL0L1);  // L0 -> base level
  CHECK(rb::ContextListener::compaction_origin(0, 0) == kCompactionL0L0);
  CHECK(rb::ContextListener::compaction_origin(1, 2) == kCompactionLN);
  CHECK(rb::ContextListener::compaction_origin(5, 6) == kCompactionLN);
  CHECK(sluice::origin_name(rb::compaction_unknown_level_origin()) == "compaction");
}

TEST_CASE("Attach wires the env and the listener, once", "[rocksdb]") {
  auto stage = sluice_test::counting_stage();
  rocksdb::Options o = small_options();
  const std::size_t listeners_before = o.listeners.size();
  auto b = rb::Attach(o, *stage);
  REQUIRE(b.is_ok());
  CHECK(o.env == b->env.get());
  REQUIRE(o.listeners.size() == listeners_before + 1);
  CHECK(o.listeners.back() == b->listener);
  CHECK(std::string(b->fs->Name()) == rb::StageFileSystem::kClassName());
  CHECK(o.env->GetFileSystem() == b->fs);
  CHECK(&b->fs->stage() == stage.get());

  auto again = rb::Attach(o, *stage);
  CHECK_FALSE(again.is_ok());
  CHECK(again.status().code() == sluice::Code::kFailedPrecondition);
}

TEST_CASE("origins of WAL, MANIFEST, LOG, flush and foreground I/O; data unchanged", "[rocksdb]") {
  TempDir dir("binding");
  auto stage = sluice_test::counting_stage();
  Tally tally;
  constexpr int kKeys = 3000;
  {
    rocksdb::Options o = small_options();
    auto b = rb::Attach(o, *stage);
    REQUIRE(b.is_ok());
    std::unique_ptr<rocksdb::DB> db = sluice_test::open_db(o, dir.file("db"));
    tally.add(stage->collect());  // DB::Open: manifest, LOG, other (CURRENT, OPTIONS...)
    CHECK(tally.get("manifest", "write") > 0);
    CHECK(tally.get("other", "write") > 0);

    rocksdb::WriteOptions wo;
    std::uint64_t payload = 0;
    for (int i = 0; i < kKeys; ++i) {
      REQUIRE(db->Put(wo, key_of(i), value_of(i)).ok());
      payload += key_of(i).size() + value_of(i).size();
    }
    tally.add(stage->collect());
    CHECK(tally.get("wal", "write") >= payload);  // payload plus batch and log framing
    CHECK(tally.get("flush", "write") == 0);

    REQUIRE(db->Flush(rocksdb::FlushOptions()).ok());
    tally.add(stage->collect());
    CHECK(tally.get("flush", "write") > 0);

    // Gets on the user's thread, no block cache: reads of the table file are foreground.
    const std::uint64_t fg_before = tally.get("foreground", "read");
    std::string v;
    for (int i = 0; i < kKeys; i += 7) {
      REQUIRE(db->Get(rocksdb::ReadOptions(), key_of(i), &v).ok());
      CHECK(v == value_of(i));
    }
    // An iterator too.
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
    int n = 0;
    for (it->SeekToFirst(); it->Valid(); it->Next()) ++n;
    CHECK(n == kKeys);
    it.reset();
    tally.add(stage->collect());
    CHECK(tally.get("foreground", "read") > fg_before);
    // Nothing read on the user's thread was mistaken for background work.
    CHECK(tally.get("unknown", "read") == 0);
    CHECK(tally.compaction("read") == 0);

    // An application scope on the user's thread wins for table files.
    const auto app = sluice::intern_origin("app_scan");
    REQUIRE(app.has_value());
    {
      sluice::OriginScope scope(*app, 5);
      REQUIRE(db->Get(rocksdb::ReadOptions(), key_of(11), &v).ok());
    }
    tally.add(stage->collect());
    CHECK(tally.get("app_scan", "read") > 0);

    REQUIRE(db->Close().ok());
  }
  tally.add(stage->collect());
  CHECK(tally.get("info_log", "write") > 0);  // the LOG goes through the wrapper
  CHECK(tally.get("unknown", "write") == 0);

  // Reopen with plain RocksDB: every key reads back unchanged.
  {
    rocksdb::Options o = small_options();
    o.create_if_missing = false;
    std::unique_ptr<rocksdb::DB> db = sluice_test::open_db(o, dir.file("db"));
    std::string v;
    for (int i = 0; i < kKeys; ++i) {
      REQUIRE(db->Get(rocksdb::ReadOptions(), key_of(i), &v).ok());
      REQUIRE(v == value_of(i));
    }
  }
}

TEST_CASE("tenant by column family: flushes and later reads of their files", "[rocksdb]") {
  TempDir dir("tenants");
  sluice::StageOptions so;
  so.name = "tenants";
  auto created = sluice::Stage::create(so);
  REQUIRE(created.is_ok());
  auto stage = std::move(created).value();
  // Channels by tenant; the object inside splits by origin so that we can tell flush
  // writes from foreground reads.
  nlohmann::json rules = nlohmann::json::array();
  rules.push_back({{"rule", "differentiate"}, {"classifiers", {"tenant"}}});
  for (int t : {1, 7, 100, 102}) {
    const std::string ch = "t" + std::to_string(t);
    rules.push_back({{"rule", "create_channel"}, {"channel", ch}, {"match", {{"tenant", t}}}});
    rules.push_back(
        {{"rule", "create_object"}, {"channel", ch}, {"object", "n"}, {"type", "noop"}});
  }
  rules.push_back({{"rule", "create_channel"}, {"channel", "rest"}, {"default", true}});
  rules.push_back(
      {{"rule", "create_object"}, {"channel", "rest"}, {"object", "n"}, {"type", "noop"}});
  REQUIRE(stage->apply(rules).is_ok());

  rocksdb::Options o = small_options();
  rb::AttachOptions ao;
  ao.tenants.mode = rb::TenantMode::kColumnFamily;
  ao.tenants.db_tenant = 1;
  ao.tenants.cf_tenants = {{"hot", 7}};
  ao.tenants.cf_id_tenant_base = 100;
  auto b = rb::Attach(o, *stage, ao);
  REQUIRE(b.is_ok());

  std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions(o)},
      {"hot", rocksdb::ColumnFamilyOptions(o)},
      {"cold", rocksdb::ColumnFamilyOptions(o)}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  REQUIRE(rocksdb::DB::Open(o, dir.file("db"), cfs, &handles, &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  REQUIRE(handles.size() == 3);
  const std::uint32_t cold_id = handles[2]->GetID();
  REQUIRE(cold_id == 2);
  stage->collect();

  for (int i = 0; i < 500; ++i) {
    REQUIRE(db->Put(rocksdb::WriteOptions(), handles[1], key_of(i), value_of(i)).ok());
    REQUIRE(db->Put(rocksdb::WriteOptions(), handles[2], key_of(i), value_of(i)).ok());
  }
  auto wal = stage->collect();
  // WAL writes are shared by all column families: the DB tenant.
  REQUIRE(wal.channel("t1") != nullptr);
  CHECK(wal.channel("t1")->by_origin.count("wal") == 1);
  CHECK(wal.channel("t7")->total.bytes == 0);

  REQUIRE(db->Flush(rocksdb::FlushOptions(), handles[1]).ok());
  REQUIRE(db->Flush(rocksdb::FlushOptions(), handles[2]).ok());
  auto fl = stage->collect();
  REQUIRE(fl.channel("t7") != nullptr);
  REQUIRE(fl.channel("t102") != nullptr);
  auto flush_bytes = [](const sluice::ChannelStats* ch) -> std::uint64_t {
    auto it = ch->by_origin.find("flush");
    return it == ch->by_origin.end() ? 0 : it->second.bytes;
  };
  CHECK(flush_bytes(fl.channel("t7")) > 0);
  CHECK(flush_bytes(fl.channel("t102")) > 0);
  CHECK(flush_bytes(fl.channel("t1")) == 0);

  // Foreground reads of the files each flush created carry that column family's tenant.
  std::string v;
  for (int i = 0; i < 500; i += 5) {
    REQUIRE(db->Get(rocksdb::ReadOptions(), handles[1], key_of(i), &v).ok());
  }
  auto rd = stage->collect();
  auto fg_bytes = [](const sluice::ChannelStats* ch) -> std::uint64_t {
    auto it = ch->by_origin.find("foreground");
    return it == ch->by_origin.end() ? 0 : it->second.bytes;
  };
  CHECK(fg_bytes(rd.channel("t7")) > 0);
  CHECK(fg_bytes(rd.channel("t102")) == 0);

  for (auto* h : handles) REQUIRE(db->DestroyColumnFamilyHandle(h).ok());
  handles.clear();
  REQUIRE(db->Close().ok());
  db.reset();

  // Reopened by a new process (a new binding): the files predate it. Until learnt, their
  // foreground reads carry the DB tenant; LearnLiveFiles fixes that, for files RocksDB
  // already opened inside DB::Open too.
  rocksdb::Options o2 = small_options();
  auto b2 = rb::Attach(o2, *stage, ao);
  REQUIRE(b2.is_ok());
  for (auto& cf : cfs) cf.options = rocksdb::ColumnFamilyOptions(o2);
  REQUIRE(rocksdb::DB::Open(o2, dir.file("db"), cfs, &handles, &raw).ok());
  db.reset(raw);
  stage->collect();
  for (int i = 0; i < 500; i += 5) {
    REQUIRE(db->Get(rocksdb::ReadOptions(), handles[1], key_of(i), &v).ok());
  }
  auto before = stage->collect();
  CHECK(fg_bytes(before.channel("t1")) > 0);
  CHECK(fg_bytes(before.channel("t7")) == 0);
  CHECK(b2->fs->LearnLiveFiles(*db, handles) >= 2);
  for (int i = 0; i < 500; i += 5) {
    REQUIRE(db->Get(rocksdb::ReadOptions(), handles[1], key_of(i), &v).ok());
  }
  auto after = stage->collect();
  CHECK(fg_bytes(after.channel("t7")) > 0);
  CHECK(fg_bytes(after.channel("t1")) == 0);
  for (auto* h : handles) REQUIRE(db->DestroyColumnFamilyHandle(h).ok());
  REQUIRE(db->Close().ok());
}

namespace {
// Refuses every request: admission control in its simplest form.
class RejectAll final : public sluice::EnforcementObject {
 public:
  std::string_view type() const noexcept override { return "reject_all"; }
  sluice::Status validate(const nlohmann::json&) const override { return {}; }
  sluice::Status configure(const nlohmann::json&) override { return {}; }
  sluice::Verdict enforce_context(const sluice::Context&) noexcept override {
    return {sluice::Outcome::kRejected, 0};
  }
};

// A stage whose foreground I/O a reject_all object refuses while everything else passes
// (noop); the registry that knows reject_all lives as long as the stage.
struct RejectingStage {
  explicit RejectingStage(const std::string& name) {
    REQUIRE(sluice::objects::register_builtin(registry).is_ok());
    REQUIRE(registry
                .add({"reject_all", "rejects every request",
                      [](const sluice::ObjectEnv&) { return std::make_unique<RejectAll>(); }})
                .is_ok());
    sluice::StageOptions so;
    so.name = name;
    so.registry = &registry;
    auto created = sluice::Stage::create(so);
    REQUIRE(created.is_ok());
    stage = std::move(created).value();
    nlohmann::json rules = nlohmann::json::array();
    rules.push_back({{"rule", "differentiate"}, {"classifiers", {"origin"}}});
    rules.push_back(
        {{"rule", "create_channel"}, {"channel", "fg"}, {"match", {{"origin", "foreground"}}}});
    rules.push_back(
        {{"rule", "create_object"}, {"channel", "fg"}, {"object", "no"}, {"type", "reject_all"}});
    rules.push_back({{"rule", "create_channel"}, {"channel", "rest"}, {"default", true}});
    rules.push_back(
        {{"rule", "create_object"}, {"channel", "rest"}, {"object", "n"}, {"type", "noop"}});
    REQUIRE(stage->apply(rules).is_ok());
  }
  sluice::Registry registry;
  std::unique_ptr<sluice::Stage> stage;
};
}  // namespace

TEST_CASE("a rejected read proceeds, or fails as Busy with reject_as_busy", "[rocksdb]") {
  // Foreground reads are rejected; WAL, flush, MANIFEST... pass.
  RejectingStage rejecting("reject");
  auto& stage = rejecting.stage;

  for (const bool busy : {false, true}) {
    INFO("reject_as_busy " << busy);
    TempDir dir(busy ? "reject-busy" : "reject-proceed");
    rocksdb::Options o = small_options();  // no block cache: every Get reads the file
    rb::AttachOptions ao;
    ao.reject_as_busy = busy;
    auto b = rb::Attach(o, *stage, ao);
    REQUIRE(b.is_ok());
    std::unique_ptr<rocksdb::DB> db = sluice_test::open_db(o, dir.file("db"));
    for (int i = 0; i < 100; ++i) {
      REQUIRE(db->Put(rocksdb::WriteOptions(), key_of(i), value_of(i)).ok());
    }
    REQUIRE(db->Flush(rocksdb::FlushOptions()).ok());  // not foreground: admitted
    std::string got;
    const rocksdb::Status s = db->Get(rocksdb::ReadOptions(), key_of(7), &got);
    INFO(s.ToString());
    if (busy) {
      CHECK(s.IsBusy());
    } else {
      REQUIRE(s.ok());
      CHECK(got == value_of(7));
    }
    REQUIRE(db->Close().ok());
  }
  const auto stats = stage->collect();
  const sluice::ChannelStats* fg = stats.channel("fg");
  REQUIRE(fg != nullptr);
  REQUIRE(fg->objects.size() == 1);
  CHECK(fg->objects[0].rejected > 0);
}

TEST_CASE("two levels: each I/O on the partition's stage, then the node stage, same context",
          "[rocksdb]") {
  TempDir dir("two-levels");
  auto p1 = sluice_test::counting_stage("p1");
  auto p2 = sluice_test::counting_stage("p2");
  auto node = sluice_test::counting_stage("node");

  SECTION("Attach refuses the partition's own stage as the node stage") {
    rocksdb::Options o = small_options();
    rocksdb::Env* const env = o.env;
    rb::AttachOptions ao;
    ao.node_stage = p1.get();
    auto b = rb::Attach(o, *p1, ao);
    REQUIRE_FALSE(b.is_ok());
    CHECK(b.status().code() == sluice::Code::kInvalidArgument);
    CHECK(b.status().message().find("node_stage") != std::string::npos);
    CHECK(o.env == env);  // options unchanged
    CHECK(o.listeners.empty());
  }

  SECTION("two partitions share the node stage; it sees the sum of theirs") {
    {
      std::vector<std::unique_ptr<rocksdb::DB>> dbs;
      std::vector<rb::Binding> bindings;
      int n = 0;
      for (sluice::Stage* s : {p1.get(), p2.get()}) {
        rocksdb::Options o = small_options();
        rb::AttachOptions ao;
        ao.tenants.db_tenant = static_cast<std::uint32_t>(++n);
        ao.node_stage = node.get();
        auto b = rb::Attach(o, *s, ao);
        REQUIRE(b.is_ok());
        CHECK(b->fs->options().node_stage == node.get());
        bindings.push_back(*b);
        dbs.push_back(sluice_test::open_db(o, dir.file("db" + std::to_string(n))));
      }
      for (auto& db : dbs) {
        for (int i = 0; i < 500; ++i) {
          REQUIRE(db->Put(rocksdb::WriteOptions(), key_of(i), value_of(i)).ok());
        }
        REQUIRE(db->Flush(rocksdb::FlushOptions()).ok());
        std::string v;
        for (int i = 0; i < 500; i += 5) {
          REQUIRE(db->Get(rocksdb::ReadOptions(), key_of(i), &v).ok());
          REQUIRE(v == value_of(i));
        }
      }
      for (auto& db : dbs) REQUIRE(db->Close().ok());
    }
    Tally t1, t2, tn;
    t1.add(p1->collect());
    t2.add(p2->collect());
    tn.add(node->collect());
    for (const char* origin : {"foreground", "wal", "flush", "manifest", "info_log", "other"}) {
      for (const char* op : {"read", "write", "other"}) {
        INFO(origin << " " << op);
        CHECK(tn.get(origin, op) == t1.get(origin, op) + t2.get(origin, op));
        CHECK(tn.ops[origin][op] == t1.ops[origin][op] + t2.ops[origin][op]);
      }
    }
    CHECK(tn.get("foreground", "read") > 0);
    CHECK(tn.get("flush", "write") > 0);
    CHECK(t1.get("wal", "write") > 0);
    CHECK(t2.get("wal", "write") > 0);
  }
}

TEST_CASE("a request the partition stage refuses as busy never reaches the node stage",
          "[rocksdb]") {
  RejectingStage rejecting("partition");
  auto& stage = rejecting.stage;
  auto node = sluice_test::counting_stage("node");

  TempDir dir("two-levels-busy");
  rocksdb::Options o = small_options();
  rb::AttachOptions ao;
  ao.reject_as_busy = true;
  ao.node_stage = node.get();
  auto b = rb::Attach(o, *stage, ao);
  REQUIRE(b.is_ok());
  std::unique_ptr<rocksdb::DB> db = sluice_test::open_db(o, dir.file("db"));
  for (int i = 0; i < 100; ++i) {
    REQUIRE(db->Put(rocksdb::WriteOptions(), key_of(i), value_of(i)).ok());
  }
  REQUIRE(db->Flush(rocksdb::FlushOptions()).ok());
  std::string got;
  CHECK(db->Get(rocksdb::ReadOptions(), key_of(7), &got).IsBusy());
  REQUIRE(db->Close().ok());
  Tally tn;
  tn.add(node->collect());
  CHECK(tn.get("foreground", "read") == 0);  // refused above: never charged below
  CHECK(tn.get("flush", "write") > 0);       // admitted above: charged below
  CHECK(tn.get("wal", "write") > 0);
}

TEST_CASE("RocksDB's own limiter as a baseline: options, traps, charged reads", "[rocksdb]") {
  SECTION("bad options name the field and change nothing") {
    const std::vector<std::pair<rb::LimiterOptions, std::string>> bad = {
        {{.bytes_per_second = 0}, "bytes_per_second"},
        {{.bytes_per_second = 1 << 20, .refill_period_us = 0}, "refill_period_us"},
        {{.bytes_per_second = 1 << 20, .fairness = 0}, "fairness"},
    };
    for (const auto& [l, field] : bad) {
      INFO(field);
      rocksdb::DBOptions o;
      o.bytes_per_sync = 7;
      auto r = rb::UseRocksDbLimiter(o, l);
      REQUIRE_FALSE(r.is_ok());
      CHECK(r.status().code() == sluice::Code::kInvalidArgument);
      CHECK(r.status().message().find(field) != std::string::npos);
      CHECK(o.rate_limiter == nullptr);
      CHECK(o.bytes_per_sync == 7);
    }
  }

  SECTION("static at its rate; auto-tuned starts at half of it") {
    rocksdb::DBOptions o;
    auto fixed = rb::UseRocksDbLimiter(o, {.bytes_per_second = 8 << 20, .bytes_per_sync = 4096});
    REQUIRE(fixed.is_ok());
    CHECK(o.rate_limiter == *fixed);
    CHECK(o.bytes_per_sync == 4096);
    CHECK(rb::ReadLimiter(**fixed).bytes_per_second == 8 << 20);
    CHECK((*fixed)->IsRateLimited(rocksdb::RateLimiter::OpType::kRead));
    auto tuned = rb::UseRocksDbLimiter(o, {.bytes_per_second = 8 << 20, .auto_tuned = true});
    REQUIRE(tuned.is_ok());
    CHECK(rb::ReadLimiter(**tuned).bytes_per_second == 4 << 20);
    auto writes = rb::UseRocksDbLimiter(o, {.bytes_per_second = 8 << 20, .charge_reads = false});
    REQUIRE(writes.is_ok());
    CHECK_FALSE((*writes)->IsRateLimited(rocksdb::RateLimiter::OpType::kRead));
  }

  SECTION("user reads and WAL writes are charged only with the limited options") {
    TempDir dir("limiter");
    rocksdb::Options o = small_options();  // no block cache: every Get reads the file
    auto l = rb::UseRocksDbLimiter(o, {.bytes_per_second = 1 << 30});
    REQUIRE(l.is_ok());
    std::unique_ptr<rocksdb::DB> db = sluice_test::open_db(o, dir.file("db"));
    for (int i = 0; i < 200; ++i) {
      REQUIRE(db->Put(rocksdb::WriteOptions(), key_of(i), value_of(i)).ok());
    }
    CHECK(rb::ReadLimiter(**l).user_bytes == 0);  // WAL not charged by default
    REQUIRE(db->Put(rb::LimitedWriteOptions(), key_of(200), value_of(200)).ok());
    const std::int64_t after_wal = rb::ReadLimiter(**l).user_bytes;
    CHECK(after_wal > 0);
    REQUIRE(db->Flush(rocksdb::FlushOptions()).ok());
    CHECK(rb::ReadLimiter(**l).high_bytes > 0);  // flush at IO_HIGH
    std::string v;
    REQUIRE(db->Get(rocksdb::ReadOptions(), key_of(3), &v).ok());
    CHECK(rb::ReadLimiter(**l).user_bytes == after_wal);  // not charged
    REQUIRE(db->Get(rb::LimitedReadOptions(), key_of(3), &v).ok());
    CHECK(v == value_of(3));
    CHECK(rb::ReadLimiter(**l).user_bytes > after_wal);  // charged at IO_USER
    REQUIRE(db->Close().ok());
  }
}
