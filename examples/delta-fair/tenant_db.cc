#include "tenant_db.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <thread>
#include <utility>

#include <rocksdb/convenience.h>
#include <rocksdb/listener.h>

#include "sluice/hold.h"
#include "sluice/thread_annotations.h"

#if __has_include("sluice/rocksdb_tenants.h")
#include "sluice/rocksdb_tenants.h"
#define SLUICE_DELTA_FAIR_HAVE_GATE 1
#else
#define SLUICE_DELTA_FAIR_HAVE_GATE 0
#endif

namespace sluice::examples::delta_fair {

#if SLUICE_DELTA_FAIR_HAVE_GATE
namespace rb = sluice::rocksdb_binding;
struct TenantDb::Gate {
  std::unique_ptr<rb::TenantGate> db;
};
bool TenantDb::has_gate() noexcept {
  return true;
}
#else
struct TenantDb::Gate {};
bool TenantDb::has_gate() noexcept {
  return false;
}
#endif

// Runs one column family's flushes one after another: a flush job waits in OnFlushBegin
// (on its own flush thread, before any I/O) while another job of its column family
// writes, and the running job lets the next one go once its table file is written
// (OnTableFileCreated; OnFlushCompleted when it wrote none). A tenant's memtables then
// reach the device one segment at a time, as the paper's buffer pages do, instead of as
// parallel jobs finishing together. RocksDB installs flush results in memtable order, so
// the file, not the completion, ends a job's turn: a later job that won the turn
// completes only with the earlier one. A job waits at most kMaxWait (a safety net).
class TenantDb::SerialFlush : public rocksdb::EventListener {
 public:
  static constexpr std::chrono::seconds kMaxWait{5};
  const char* Name() const override { return "DeltaFairSerialFlush"; }

  void OnFlushBegin(rocksdb::DB* /*db*/, const rocksdb::FlushJobInfo& info) override {
    MutexLock lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + kMaxWait;
    while (!stopped_ && busy_.count(info.cf_name) != 0 &&
           cv_.wait_until(lock.native(), deadline) == std::cv_status::no_timeout) {
    }
    busy_[info.cf_name] = info.job_id;
  }
  void OnTableFileCreated(const rocksdb::TableFileCreationInfo& info) override {
    if (info.reason == rocksdb::TableFileCreationReason::kFlush) done(info.cf_name, info.job_id);
  }
  void OnFlushCompleted(rocksdb::DB* /*db*/, const rocksdb::FlushJobInfo& info) override {
    done(info.cf_name, info.job_id);
  }
  // Lets every waiting and later flush go (closing the DB).
  void stop() {
    {
      MutexLock lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
  }

 private:
  void done(const std::string& cf, int job_id) {
    {
      MutexLock lock(mu_);
      auto it = busy_.find(cf);
      if (it == busy_.end() || it->second != job_id) return;
      busy_.erase(it);
    }
    cv_.notify_all();
  }

  Mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, int> busy_ SLUICE_GUARDED_BY(mu_);  // column family -> its job
  bool stopped_ SLUICE_GUARDED_BY(mu_) = false;
};

#if SLUICE_DELTA_FAIR_HAVE_GATE
// The gate's pool, asked for whole segments: a tenant takes one segment (B bytes, the
// memtable size) from the stage's pool when the bytes it holds are used up, and its puts
// are charged against that segment; flushed bytes give a segment back once it is wholly
// unused. This is how FairDB's write-buffer manager allocates buffer pages ("allocate
// the segment from the reserved pool ..."), where a put-by-put charge would make every
// put of a tenant below its share wait for the next release whenever the aggressive
// tenants' waiters drained the pool. The pool sees one acquire per segment (its
// statistics count segments).
class TenantDb::SegmentAdmission : public rb::Admission {
 public:
  SegmentAdmission(Stage& stage, std::uint64_t segment, std::uint32_t max_tenant)
      : stage_(stage), segment_(segment), tenants_(max_tenant + 1) {}

  rb::Admitted acquire(const Context& ctx, std::uint64_t bytes) noexcept override {
    if (ctx.tenant >= tenants_.size()) return {Verdict{}, 0};  // not a tenant: ungated
    Tenant& t = tenants_[ctx.tenant];
    std::uint64_t need = 0;
    {
      MutexLock lock(t.mu);
      if (t.used + bytes <= t.hold.amount()) {
        t.used += bytes;
        return {Verdict{}, bytes};
      }
      need = t.used + bytes - t.hold.amount();
    }
    // Wait in the pool without the tenant's lock: its flushes give back meanwhile.
    const std::uint64_t take = (need + segment_ - 1) / segment_ * segment_;
    Context c = ctx;
    c.size = take;
    Hold h = stage_.acquire(c, take);
    const Verdict v = h.verdict();
    if (!v.ok() || !h.holds()) return {v, 0};  // refused, cancelled or not a pool
    MutexLock lock(t.mu);
    if (!t.hold.absorb(std::move(h))) {
      // Another object grants now (the rules changed): the old one gets its units back.
      t.hold = std::move(h);
    }
    t.used += bytes;
    return {v, bytes};
  }

  void release(const Context& ctx, std::uint64_t bytes) noexcept override {
    if (ctx.tenant >= tenants_.size()) return;
    Tenant& t = tenants_[ctx.tenant];
    MutexLock lock(t.mu);
    t.used -= std::min(bytes, t.used);
    const std::uint64_t keep = (t.used + segment_ - 1) / segment_ * segment_;
    if (t.hold.amount() > keep) t.hold.release(t.hold.amount() - keep);
  }

 private:
  struct Tenant {
    Mutex mu;
    std::uint64_t used SLUICE_GUARDED_BY(mu) = 0;  // bytes the gate charged and holds
    Hold hold SLUICE_GUARDED_BY(mu);               // whole segments from the pool
  };
  Stage& stage_;
  const std::uint64_t segment_;
  std::deque<Tenant> tenants_;  // by tenant id; fixed size
};
#endif

StatusOr<std::unique_ptr<TenantDb>> TenantDb::open(Config config) {
  std::unique_ptr<TenantDb> t(new TenantDb());
  t->config_ = std::move(config);
  Config& c = t->config_;
  if (c.gated && c.stage == nullptr) return Status::invalid("a gated DB needs a stage");
#if !SLUICE_DELTA_FAIR_HAVE_GATE
  if (c.gated) {
    return Status::precondition(
        "this build has no tenant gate (sluice/rocksdb_tenants.h): only --setup plain runs");
  }
#endif
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
  cfs.emplace_back(rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions(c.options));
  std::uint32_t max_id = 0;
  for (const auto& tc : c.tenants) {
    rocksdb::ColumnFamilyOptions cfo(c.options);
    if (c.cf_options) c.cf_options(tc.id, cfo);
    cfs.emplace_back(tc.cf, std::move(cfo));
    max_id = std::max(max_id, tc.id);
  }
  rocksdb::DBOptions dbo(c.options);
  if (c.serial_flush) {
    t->serial_ = std::make_shared<SerialFlush>();
    dbo.listeners.push_back(t->serial_);
  }
  if (c.gated) {
#if SLUICE_DELTA_FAIR_HAVE_GATE
    // The gate moves each tenant's RocksDB stall triggers out of the DB's way (a tenant
    // may hold up to the whole buffer in memtables) and opens the DB.
    rb::TenantGateOptions go;
    go.stage = c.stage;
    if (c.segment_bytes > 0) {
      go.admission = std::make_shared<SegmentAdmission>(*c.stage, c.segment_bytes, max_id);
      go.flush_on_wait = false;  // RocksDB flushes a full memtable, a segment, by itself
    }
    go.tenants.mode = rb::TenantMode::kColumnFamily;
    for (const auto& tc : c.tenants) go.tenants.cf_tenants[tc.cf] = tc.id;
    go.isolation.tenant_memtable_bytes = c.buffer_bytes;
    go.entry_overhead = c.entry_overhead;
    auto gate = rb::TenantGate::Open(dbo, c.path, std::move(cfs), &t->handles_, std::move(go));
    if (!gate.is_ok()) return gate.status().with_prefix("open " + c.path + " (gated): ");
    t->gate_ = std::make_unique<Gate>();
    t->gate_->db = std::move(gate).value();
    t->writer_ = t->gate_->db.get();
#endif
  } else {
    rocksdb::DB* db = nullptr;
    const rocksdb::Status s = rocksdb::DB::Open(dbo, c.path, cfs, &t->handles_, &db);
    if (!s.ok()) return Status::io_error("open " + c.path + ": " + s.ToString());
    t->base_ = db;
    t->writer_ = db;
  }
  t->by_tenant_.assign(max_id + 1, nullptr);
  for (std::size_t i = 0; i < c.tenants.size(); ++i) {
    t->by_tenant_[c.tenants[i].id] = t->handles_[i + 1];
  }
  return t;
}

TenantDb::~TenantDb() {
  close();
}

rocksdb::ColumnFamilyHandle* TenantDb::cf_of(std::uint32_t tenant) const {
  return tenant < by_tenant_.size() ? by_tenant_[tenant] : nullptr;
}

rocksdb::Status TenantDb::put(std::uint32_t tenant, const rocksdb::Slice& key,
                              const rocksdb::Slice& value) {
  rocksdb::ColumnFamilyHandle* cf = cf_of(tenant);
  if (cf == nullptr) return rocksdb::Status::InvalidArgument("unknown tenant");
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;
  return writer_->Put(wo, cf, key, value);
}

rocksdb::Status TenantDb::get(std::uint32_t tenant, const rocksdb::Slice& key, std::string* value) {
  rocksdb::ColumnFamilyHandle* cf = cf_of(tenant);
  if (cf == nullptr) return rocksdb::Status::InvalidArgument("unknown tenant");
  return writer_->Get(rocksdb::ReadOptions(), cf, key, value);
}

rocksdb::Status TenantDb::get_pinned(std::uint32_t tenant, const rocksdb::Slice& key,
                                     rocksdb::PinnableSlice* value, bool cache_only) {
  rocksdb::ColumnFamilyHandle* cf = cf_of(tenant);
  if (cf == nullptr) return rocksdb::Status::InvalidArgument("unknown tenant");
  rocksdb::ReadOptions ro;
  if (cache_only) ro.read_tier = rocksdb::kBlockCacheTier;
  return writer_->Get(ro, cf, key, value);
}

void TenantDb::multi_get(std::uint32_t tenant, const std::vector<rocksdb::Slice>& keys,
                         std::vector<rocksdb::PinnableSlice>* values,
                         std::vector<rocksdb::Status>* statuses) {
  values->resize(keys.size());
  statuses->assign(keys.size(), rocksdb::Status::InvalidArgument("unknown tenant"));
  rocksdb::ColumnFamilyHandle* cf = cf_of(tenant);
  if (cf == nullptr || keys.empty()) return;
  writer_->MultiGet(rocksdb::ReadOptions(), cf, keys.size(), keys.data(), values->data(),
                    statuses->data());
}

rocksdb::Status TenantDb::flush(std::uint32_t tenant) {
  rocksdb::ColumnFamilyHandle* cf = cf_of(tenant);
  if (cf == nullptr) return rocksdb::Status::InvalidArgument("unknown tenant");
  return writer_->Flush(rocksdb::FlushOptions(), cf);
}

rocksdb::Status TenantDb::set_option(std::uint32_t tenant, const std::string& name,
                                     const std::string& value) {
  rocksdb::ColumnFamilyHandle* cf = cf_of(tenant);
  if (cf == nullptr) return rocksdb::Status::InvalidArgument("unknown tenant");
  return writer_->SetOptions(cf, {{name, value}});
}

std::uint64_t TenantDb::memtable_bytes(std::uint32_t tenant) {
  rocksdb::ColumnFamilyHandle* cf = cf_of(tenant);
  std::uint64_t v = 0;
  if (cf == nullptr || !writer_->GetIntProperty(cf, "rocksdb.cur-size-all-mem-tables", &v))
    return 0;
  return v;
}

std::int64_t TenantDb::int_property(std::uint32_t tenant, const char* name) {
  rocksdb::ColumnFamilyHandle* cf = cf_of(tenant);
  std::uint64_t v = 0;
  if (cf == nullptr) return -1;
  if (writer_->GetIntProperty(cf, name, &v)) return static_cast<std::int64_t>(v);
  std::string text;  // a property RocksDB keeps as text ("rocksdb.num-files-at-level0")
  return writer_->GetProperty(cf, name, &text) ? std::atoll(text.c_str()) : -1;
}

nlohmann::json TenantDb::counters() const {
  nlohmann::json out = nullptr;
#if SLUICE_DELTA_FAIR_HAVE_GATE
  if (!gate_) return out;
  out = nlohmann::json::array();
  for (const auto& g : gate_->db->stats()) {
    out.push_back({{"cf", g.name},
                   {"tenant", g.tenant},
                   {"held", g.held},
                   {"charged_bytes", g.charged_bytes},
                   {"released_bytes", g.released_bytes},
                   {"waits", g.waits},
                   {"incomplete", g.incomplete},
                   {"cancelled", g.cancelled},
                   {"flushes_requested", g.flushes_requested},
                   {"limit_waits", g.limit_waits},
                   {"memtable_bytes", g.memtable_bytes}});
  }
#endif
  return out;
}

void TenantDb::close() {
  if (closed_ || writer_ == nullptr) return;
  closed_ = true;
  if (serial_) serial_->stop();
  rocksdb::CancelAllBackgroundWork(writer_, /*wait=*/true);
#if SLUICE_DELTA_FAIR_HAVE_GATE
  if (gate_) {
    // The gate owns the DB and the handles.
    gate_->db->Close().PermitUncheckedError();
    gate_.reset();
    handles_.clear();
    writer_ = nullptr;
    return;
  }
#endif
  for (auto* h : handles_) base_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  handles_.clear();
  base_->Close().PermitUncheckedError();
  delete base_;
  base_ = nullptr;
  writer_ = nullptr;
}

}  // namespace sluice::examples::delta_fair
