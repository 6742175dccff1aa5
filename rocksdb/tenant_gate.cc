// TenantGate: the write path (charge every column family's bytes of a batch to its
// tenant's pool before writing it), the DB overrides that route every mutation through
// it, and Prepare / Wrap / Open / Close. See include/sluice/rocksdb_tenants.h.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <utility>

#include "sluice/dcheck.h"
#include "tenant_core.h"

namespace sluice::rocksdb_binding {

namespace rdb = ::rocksdb;

namespace {

// A few elements in place, more on the heap: nearly every batch touches one column
// family, and its charge must not allocate.
template <typename T, std::size_t N>
class SmallVec {
 public:
  void push_back(const T& v) {
    if (n_ < N) {
      small_[n_++] = v;
    } else {
      if (more_.empty()) more_.assign(small_.begin(), small_.end());
      more_.push_back(v);
      ++n_;
    }
  }
  std::size_t size() const noexcept { return n_; }
  T* begin() noexcept { return n_ <= N ? small_.data() : more_.data(); }
  T* end() noexcept { return begin() + n_; }
  T& operator[](std::size_t i) noexcept { return begin()[i]; }

 private:
  std::array<T, N> small_{};
  std::vector<T> more_;
  std::size_t n_ = 0;
};

struct CfBytes {
  std::uint32_t cf_id = 0;
  std::uint64_t bytes = 0;
};

// Sums a batch's bytes per column family: key + value (or the range's two keys) plus the
// memtable's cost of an entry, for every entry a memtable will hold.
class ChargeCounter final : public rdb::WriteBatch::Handler {
 public:
  explicit ChargeCounter(std::uint64_t overhead) : overhead_(overhead) {}

  rdb::Status PutCF(std::uint32_t cf, const rdb::Slice& k, const rdb::Slice& v) override {
    return add(cf, k.size() + v.size());
  }
  rdb::Status PutEntityCF(std::uint32_t cf, const rdb::Slice& k, const rdb::Slice& e) override {
    return add(cf, k.size() + e.size());
  }
  rdb::Status DeleteCF(std::uint32_t cf, const rdb::Slice& k) override { return add(cf, k.size()); }
  rdb::Status SingleDeleteCF(std::uint32_t cf, const rdb::Slice& k) override {
    return add(cf, k.size());
  }
  rdb::Status DeleteRangeCF(std::uint32_t cf, const rdb::Slice& b, const rdb::Slice& e) override {
    return add(cf, b.size() + e.size());
  }
  rdb::Status MergeCF(std::uint32_t cf, const rdb::Slice& k, const rdb::Slice& v) override {
    return add(cf, k.size() + v.size());
  }
  rdb::Status PutBlobIndexCF(std::uint32_t cf, const rdb::Slice& k, const rdb::Slice& v) override {
    return add(cf, k.size() + v.size());
  }
  // Markers of transactions' batches carry no memtable bytes.
  rdb::Status MarkBeginPrepare(bool) override { return rdb::Status::OK(); }
  rdb::Status MarkEndPrepare(const rdb::Slice&) override { return rdb::Status::OK(); }
  rdb::Status MarkNoop(bool) override { return rdb::Status::OK(); }
  rdb::Status MarkRollback(const rdb::Slice&) override { return rdb::Status::OK(); }
  rdb::Status MarkCommit(const rdb::Slice&) override { return rdb::Status::OK(); }
  rdb::Status MarkCommitWithTimestamp(const rdb::Slice&, const rdb::Slice&) override {
    return rdb::Status::OK();
  }

  SmallVec<CfBytes, 4>& sums() noexcept { return sums_; }

 private:
  rdb::Status add(std::uint32_t cf, std::size_t n) {
    const std::uint64_t bytes = n + overhead_;
    // The column family of the previous entry, most likely; else a short scan.
    if (sums_.size() > 0 && sums_[last_].cf_id == cf) {
      sums_[last_].bytes += bytes;
      return rdb::Status::OK();
    }
    for (std::size_t i = 0; i < sums_.size(); ++i) {
      if (sums_[i].cf_id == cf) {
        sums_[i].bytes += bytes;
        last_ = i;
        return rdb::Status::OK();
      }
    }
    sums_.push_back(CfBytes{cf, bytes});
    last_ = sums_.size() - 1;
    return rdb::Status::OK();
  }

  std::uint64_t overhead_;
  SmallVec<CfBytes, 4> sums_;
  std::size_t last_ = 0;
};

struct Charge {
  CfState* cf = nullptr;
  std::uint64_t bytes = 0;
  std::uint64_t held = 0;  // units the pool holds for this charge
};

rdb::Status incomplete(const CfState& cf, const char* why) {
  return rdb::Status::Incomplete("Write stall", "sluice: tenant " + std::to_string(cf.tenant) +
                                                    " (column family '" + cf.name + "') " + why +
                                                    "; no_slowdown was set");
}

}  // namespace

// --- the write path --------------------------------------------------------------------

namespace {

// Takes `c.cf`'s charge back (a later acquire of the batch failed, or RocksDB did).
void give_back(TenantGate::Core& core, Charge& c) {
  if (c.held == 0) return;
  std::uint64_t n = 0;
  {
    MutexLock lock(c.cf->mu);
    n = std::min(c.held, c.cf->held);
    c.cf->held -= n;
    c.cf->inflight -= std::min(c.held, c.cf->inflight);
  }
  if (n > 0) {
    core.admission->release(core.context_of(*c.cf), n);
    c.cf->released.fetch_add(n, std::memory_order_relaxed);
  }
  c.held = 0;
}

// Waits while `cf` is at its L0 / pending-bytes limit. False: no_slowdown and it is.
bool wait_below_limit(TenantGate::Core& core, CfState& cf, bool no_slowdown) {
  if (!cf.at_limit.load(std::memory_order_acquire)) return true;
  if (no_slowdown) return false;
  cf.limit_waits.fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(cf.mu);
  while (cf.at_limit.load(std::memory_order_acquire) &&
         !core.closed.load(std::memory_order_acquire)) {
    lock.wait(cf.limit_cleared);
  }
  return true;
}

// Acquires `c.bytes` for c.cf's tenant; on success the units are in the ledger.
rdb::Status acquire(TenantGate::Core& core, Charge& c, bool no_slowdown) {
  CfState& cf = *c.cf;
  Context ctx = core.context_of(cf);
  ctx.size = c.bytes;
  ctx.flags = context_flag::kNoWait;
  Admitted a = core.admission->acquire(ctx, c.bytes);
  if (a.verdict.outcome == Outcome::kWouldWait) {
    cf.waits.fetch_add(1, std::memory_order_relaxed);
    if (no_slowdown) {
      cf.incomplete.fetch_add(1, std::memory_order_relaxed);
      return incomplete(cf, "is at its write-buffer allowance");
    }
    {
      MutexLock lock(cf.mu);
      ++cf.waiters;
      cf.waiting_bytes += c.bytes;
    }
    core.total_waiters.fetch_add(1, std::memory_order_acq_rel);
    core.flush_for_waiter(cf, c.bytes);
    ctx.flags = 0;
    a = core.admission->acquire(ctx, c.bytes);
    core.total_waiters.fetch_sub(1, std::memory_order_acq_rel);
    MutexLock lock(cf.mu);
    --cf.waiters;
    cf.waiting_bytes -= c.bytes;
  }
  switch (a.verdict.outcome) {
    case Outcome::kOk:
    case Outcome::kCancelled:  // the pool went away while it waited: proceed
      if (a.verdict.outcome == Outcome::kCancelled) {
        cf.cancelled.fetch_add(1, std::memory_order_relaxed);
      } else {
        cf.charged.fetch_add(c.bytes, std::memory_order_relaxed);
      }
      c.held = a.held;
      if (c.held > 0) {
        MutexLock lock(cf.mu);
        cf.held += c.held;
        cf.inflight += c.held;
      }
      return rdb::Status::OK();
    case Outcome::kRejected:
      return rdb::Status::Busy("sluice: the pool rejected a write of tenant " +
                               std::to_string(cf.tenant) + " (column family '" + cf.name + "')");
    case Outcome::kWouldWait:
      break;
  }
  cf.incomplete.fetch_add(1, std::memory_order_relaxed);
  return incomplete(cf, "is at its write-buffer allowance");
}

}  // namespace

rdb::Status TenantGate::Write(const rdb::WriteOptions& options, rdb::WriteBatch* updates) {
  Core& core = *core_;
  if (updates == nullptr || core.closed.load(std::memory_order_acquire)) {
    return db_->Write(options, updates);
  }
  ChargeCounter counter(core.options.entry_overhead);
  // A batch that cannot be read is RocksDB's to refuse.
  if (!updates->Iterate(&counter).ok()) return db_->Write(options, updates);

  SmallVec<Charge, 4> charges;
  for (const CfBytes& s : counter.sums()) {
    CfState* cf = core.find(s.cf_id);
    if (cf != nullptr) charges.push_back(Charge{cf, s.bytes, 0});  // unknown: ungated
  }
  // Several tenants: acquire in (tenant, column family) order, so that two batches that
  // both span tenants never hold one and wait for the other's.
  std::sort(charges.begin(), charges.end(), [](const Charge& a, const Charge& b) {
    return a.cf->tenant != b.cf->tenant ? a.cf->tenant < b.cf->tenant : a.cf->cf_id < b.cf->cf_id;
  });
  for (Charge& c : charges) {
    if (!wait_below_limit(core, *c.cf, options.no_slowdown)) {
      c.cf->incomplete.fetch_add(1, std::memory_order_relaxed);
      return incomplete(*c.cf, "is at its L0 / pending compaction limit");
    }
  }
  for (std::size_t i = 0; i < charges.size(); ++i) {
    const rdb::Status s = acquire(core, charges[i], options.no_slowdown);
    if (!s.ok()) {
      for (std::size_t j = 0; j < i; ++j) give_back(core, charges[j]);
      return s;
    }
  }

  const rdb::Status s = db_->Write(options, updates);

  for (Charge& c : charges) {
    if (c.held == 0) continue;
    if (!s.ok()) {
      give_back(core, c);
      continue;
    }
    MutexLock lock(c.cf->mu);
    SLUICE_DCHECK(c.cf->inflight >= c.held || core.closed.load(), "in-flight bytes counted");
    c.cf->inflight -= std::min(c.held, c.cf->inflight);
    c.cf->completed += c.held;
  }
  return s;
}

// Every mutation goes through DB::'s own implementation, which builds a batch and calls
// this->Write (StackableDB's versions would call the wrapped DB's and bypass the gate).
rdb::Status TenantGate::Put(const rdb::WriteOptions& o, rdb::ColumnFamilyHandle* cf,
                            const rdb::Slice& key, const rdb::Slice& value) {
  return DB::Put(o, cf, key, value);
}
rdb::Status TenantGate::Put(const rdb::WriteOptions& o, rdb::ColumnFamilyHandle* cf,
                            const rdb::Slice& key, const rdb::Slice& ts, const rdb::Slice& value) {
  return DB::Put(o, cf, key, ts, value);
}
rdb::Status TenantGate::PutEntity(const rdb::WriteOptions& o, rdb::ColumnFamilyHandle* cf,
                                  const rdb::Slice& key, const rdb::WideColumns& columns) {
  return DB::PutEntity(o, cf, key, columns);
}
rdb::Status TenantGate::Delete(const rdb::WriteOptions& o, rdb::ColumnFamilyHandle* cf,
                               const rdb::Slice& key) {
  return DB::Delete(o, cf, key);
}
rdb::Status TenantGate::Delete(const rdb::WriteOptions& o, rdb::ColumnFamilyHandle* cf,
                               const rdb::Slice& key, const rdb::Slice& ts) {
  return DB::Delete(o, cf, key, ts);
}
rdb::Status TenantGate::SingleDelete(const rdb::WriteOptions& o, rdb::ColumnFamilyHandle* cf,
                                     const rdb::Slice& key) {
  return DB::SingleDelete(o, cf, key);
}
rdb::Status TenantGate::SingleDelete(const rdb::WriteOptions& o, rdb::ColumnFamilyHandle* cf,
                                     const rdb::Slice& key, const rdb::Slice& ts) {
  return DB::SingleDelete(o, cf, key, ts);
}
rdb::Status TenantGate::DeleteRange(const rdb::WriteOptions& o, rdb::ColumnFamilyHandle* cf,
                                    const rdb::Slice& begin, const rdb::Slice& end) {
  return DB::DeleteRange(o, cf, begin, end);
}
rdb::Status TenantGate::DeleteRange(const rdb::WriteOptions& o, rdb::ColumnFamilyHandle* cf,
                                    const rdb::Slice& begin, const rdb::Slice& end,
                                    const rdb::Slice& ts) {
  return DB::DeleteRange(o, cf, begin, end, ts);
}
rdb::Status TenantGate::Merge(const rdb::WriteOptions& o, rdb::ColumnFamilyHandle* cf,
                              const rdb::Slice& key, const rdb::Slice& value) {
  return DB::Merge(o, cf, key, value);
}

// --- column families -------------------------------------------------------------------

StatusOr<TenantLimits> TenantGate::isolate(rdb::ColumnFamilyOptions& options) const {
  return IsolateStalls(options, core_->options.isolation);
}

namespace {
bool isolating(const TenantGateOptions& o) {
  return o.isolate_stalls && o.tenants.mode == TenantMode::kColumnFamily;
}
rdb::Status to_rocksdb(const Status& s) {
  return rdb::Status::InvalidArgument(s.to_string());
}
}  // namespace

rdb::Status TenantGate::CreateColumnFamily(const rdb::ColumnFamilyOptions& options,
                                           const std::string& name,
                                           rdb::ColumnFamilyHandle** handle) {
  std::vector<rdb::ColumnFamilyHandle*> created;
  const rdb::Status s =
      CreateColumnFamilies({rdb::ColumnFamilyDescriptor(name, options)}, &created);
  if (handle != nullptr) *handle = created.empty() ? nullptr : created.front();
  return s;
}

rdb::Status TenantGate::CreateColumnFamilies(const rdb::ColumnFamilyOptions& options,
                                             const std::vector<std::string>& names,
                                             std::vector<rdb::ColumnFamilyHandle*>* handles) {
  std::vector<rdb::ColumnFamilyDescriptor> descriptors;
  descriptors.reserve(names.size());
  for (const std::string& n : names) descriptors.emplace_back(n, options);
  return CreateColumnFamilies(descriptors, handles);
}

rdb::Status TenantGate::CreateColumnFamilies(
    const std::vector<rdb::ColumnFamilyDescriptor>& column_families,
    std::vector<rdb::ColumnFamilyHandle*>* handles) {
  std::vector<rdb::ColumnFamilyDescriptor> descriptors = column_families;
  std::vector<TenantLimits> limits(descriptors.size(), core_->options.default_limits);
  if (isolating(core_->options)) {
    for (std::size_t i = 0; i < descriptors.size(); ++i) {
      auto r = isolate(descriptors[i].options);
      if (!r.is_ok()) return to_rocksdb(r.status());
      limits[i] = *r;
    }
  }
  std::vector<rdb::ColumnFamilyHandle*> created;
  const rdb::Status s = db_->CreateColumnFamilies(descriptors, &created);
  for (std::size_t i = 0; i < created.size(); ++i) core_->add(created[i], &limits[i], true);
  if (handles != nullptr) *handles = created;
  return s;
}

rdb::Status TenantGate::DestroyColumnFamilyHandle(rdb::ColumnFamilyHandle* cf) {
  if (cf != nullptr) {
    const CfState* st = core_->find(cf->GetID());
    if (st != nullptr && st->handle == cf) return rdb::Status::OK();  // at Close
  }
  return db_->DestroyColumnFamilyHandle(cf);
}

// --- open and close --------------------------------------------------------------------

TenantGate::TenantGate(rdb::DB* db, std::shared_ptr<Core> core)
    : StackableDB(db), core_(std::move(core)) {}

TenantGate::~TenantGate() {
  shutdown();
}

void TenantGate::shutdown() {
  if (shut_) return;
  shut_ = true;
  core_->closed.store(true, std::memory_order_release);
  core_->stop_worker();
  core_->release_all();
  for (CfState* cf : core_->all()) {
    if (cf->owned && cf->handle != nullptr) {
      (void)db_->DestroyColumnFamilyHandle(cf->handle);
    }
  }
}

rdb::Status TenantGate::Close() {
  shutdown();
  return db_->Close();
}

StatusOr<TenantGate::Prepared> TenantGate::Prepare(rdb::DBOptions& options,
                                                   TenantGateOptions gate) {
  if (!gate.admission && gate.stage == nullptr) {
    return Status::invalid("stage: a stage (or an admission) is required");
  }
  if (gate.clock == nullptr) return Status::invalid("clock: must not be null");
  if (gate.refresh_interval.count() < 0) {
    return Status::invalid("refresh_interval: must not be negative");
  }
  for (const auto& l : options.listeners) {
    if (l && std::string_view(l->Name()) == "SluiceTenantGateListener") {
      return Status::precondition("options: a tenant gate is already prepared on them");
    }
  }
  Prepared p;
  if (gate.write_buffer_manager_bytes > 0) {
    if (gate.tenants.mode != TenantMode::kDbInstance) {
      return Status::invalid(
          "write_buffer_manager_bytes: only with TenantMode::kDbInstance (a DB's write-buffer "
          "manager stalls every column family of the DB)");
    }
    if (options.write_buffer_manager) {
      return Status::precondition(
          "write_buffer_manager_bytes: the options already have a write_buffer_manager");
    }
    p.write_buffer_manager = std::make_shared<rdb::WriteBufferManager>(
        static_cast<std::size_t>(gate.write_buffer_manager_bytes), nullptr,
        /*allow_stall=*/true);
  }
  p.admission = gate.admission ? gate.admission : StageAdmission(*gate.stage);
  p.core = std::make_shared<Core>();
  p.core->options = gate;
  p.core->admission = p.admission;
  p.core->wbm = p.write_buffer_manager;
  p.listener = make_gate_listener(p.core);
  p.options = std::move(gate);
  if (p.write_buffer_manager) options.write_buffer_manager = p.write_buffer_manager;
  options.listeners.push_back(p.listener);
  return p;
}

StatusOr<std::unique_ptr<TenantGate>> TenantGate::Wrap(
    Prepared prepared, rdb::DB* db, const std::vector<rdb::ColumnFamilyHandle*>& handles) {
  if (db == nullptr) return Status::invalid("db: must not be null");
  if (!prepared.core || prepared.core->db != nullptr) {
    return Status::invalid("prepared: must come from Prepare() and be wrapped once");
  }
  Core& core = *prepared.core;
  core.db = db;
  if (handles.empty()) {
    core.add(db->DefaultColumnFamily(), nullptr, /*owned=*/false);
  }
  for (rdb::ColumnFamilyHandle* h : handles) {
    auto it = prepared.cf_limits.find(h->GetName());
    core.add(h, it == prepared.cf_limits.end() ? nullptr : &it->second, /*owned=*/true);
  }
  std::unique_ptr<TenantGate> gate(new TenantGate(db, prepared.core));
  core.pass();  // the limits' state before the first write
  core.start_worker();
  return gate;
}

StatusOr<std::unique_ptr<TenantGate>> TenantGate::Open(
    rdb::DBOptions options, const std::string& path,
    std::vector<rdb::ColumnFamilyDescriptor> column_families,
    std::vector<rdb::ColumnFamilyHandle*>* handles, TenantGateOptions gate) {
  if (handles == nullptr) return Status::invalid("handles: must not be null");
  std::map<std::string, TenantLimits, std::less<>> isolated;
  if (isolating(gate)) {
    for (auto& d : column_families) {
      auto r = IsolateStalls(d.options, gate.isolation);
      if (!r.is_ok()) {
        return Status::invalid("column family '" + d.name + "': " + r.status().message());
      }
      isolated[d.name] = *r;
    }
  }
  auto prepared = Prepare(options, std::move(gate));
  if (!prepared.is_ok()) return prepared.status();
  prepared->cf_limits = std::move(isolated);
  rdb::DB* raw = nullptr;
  std::vector<rdb::ColumnFamilyHandle*> opened;
  const rdb::Status s = rdb::DB::Open(options, path, column_families, &opened, &raw);
  if (!s.ok()) return Status::io_error("rocksdb open " + path + ": " + s.ToString());
  auto wrapped = Wrap(std::move(prepared).value(), raw, opened);
  if (!wrapped.is_ok()) {
    for (auto* h : opened) (void)raw->DestroyColumnFamilyHandle(h);
    delete raw;
    return wrapped.status();
  }
  *handles = opened;
  return wrapped;
}

// --- control and statistics ------------------------------------------------------------

void TenantGate::Refresh() {
  core_->pass();
}

Status TenantGate::SetBufferLimit(std::uint64_t bytes) {
  if (!core_->wbm) {
    return Status::precondition(
        "SetBufferLimit: the gate has no write-buffer manager (write_buffer_manager_bytes "
        "was 0)");
  }
  if (bytes == 0) {
    return Status::invalid("bytes: must be positive (0 would turn the write-buffer manager off)");
  }
  core_->wbm->SetBufferSize(static_cast<std::size_t>(bytes));
  return Status::ok();
}

std::shared_ptr<rdb::WriteBufferManager> TenantGate::write_buffer_manager() const {
  return core_->wbm;
}

namespace {
GateCfStats stats_of(CfState& cf) {
  GateCfStats s;
  s.name = cf.name;
  s.cf_id = cf.cf_id;
  s.tenant = cf.tenant;
  {
    MutexLock lock(cf.mu);
    s.held = cf.held;
  }
  s.charged_bytes = cf.charged.load(std::memory_order_relaxed);
  s.released_bytes = cf.released.load(std::memory_order_relaxed);
  s.waits = cf.waits.load(std::memory_order_relaxed);
  s.incomplete = cf.incomplete.load(std::memory_order_relaxed);
  s.cancelled = cf.cancelled.load(std::memory_order_relaxed);
  s.flushes_requested = cf.flushes.load(std::memory_order_relaxed);
  s.limit_waits = cf.limit_waits.load(std::memory_order_relaxed);
  s.at_limit = cf.at_limit.load(std::memory_order_relaxed);
  s.l0_files = cf.l0_files.load(std::memory_order_relaxed);
  s.pending_compaction_bytes = cf.pending_bytes.load(std::memory_order_relaxed);
  s.memtable_bytes = cf.memtable_bytes.load(std::memory_order_relaxed);
  return s;
}
}  // namespace

std::vector<GateCfStats> TenantGate::stats() const {
  std::vector<GateCfStats> out;
  for (CfState* cf : core_->all()) out.push_back(stats_of(*cf));
  return out;
}

GateCfStats TenantGate::stats(rdb::ColumnFamilyHandle* cf) const {
  CfState* st = cf == nullptr ? nullptr : core_->find(cf->GetID());
  return st == nullptr ? GateCfStats{} : stats_of(*st);
}

}  // namespace sluice::rocksdb_binding
