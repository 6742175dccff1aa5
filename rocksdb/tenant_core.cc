// TenantGate's shared state: the column-family table, refresh passes (ledger
// reconciliation, limits, flush requests), the worker and the listener; IsolateStalls and
// StageAdmission. See include/sluice/rocksdb_tenants.h.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <limits>

#include "sluice/dcheck.h"
#include "tenant_core.h"

#include "sluice/hold.h"

namespace sluice::rocksdb_binding {

namespace rdb = ::rocksdb;

// --- the column-family table -----------------------------------------------------------

CfState* TenantGate::Core::find(std::uint32_t id) const {
  if (id < kDirect) return direct[id].load(std::memory_order_acquire);
  MutexLock lock(reg_mu);
  auto it = cfs.find(id);
  return it == cfs.end() ? nullptr : it->second.get();
}

std::vector<CfState*> TenantGate::Core::all() const {
  MutexLock lock(reg_mu);
  std::vector<CfState*> out;
  out.reserve(cfs.size());
  for (const auto& [id, st] : cfs) out.push_back(st.get());
  return out;
}

void TenantGate::Core::add(rdb::ColumnFamilyHandle* handle, const TenantLimits* fallback,
                           bool owned) {
  auto st = std::make_unique<CfState>();
  st->cf_id = handle->GetID();
  st->name = handle->GetName();
  st->tenant = options.tenants.tenant_of(st->name, st->cf_id);
  st->handle = handle;
  st->owned = owned;
  auto lim = options.limits.find(st->name);
  st->limits = lim != options.limits.end() ? lim->second
               : fallback != nullptr       ? *fallback
                                           : options.default_limits;
  MutexLock lock(reg_mu);
  CfState* raw = st.get();
  cfs[raw->cf_id] = std::move(st);
  if (raw->cf_id < kDirect) direct[raw->cf_id].store(raw, std::memory_order_release);
}

Context TenantGate::Core::context_of(const CfState& cf) const noexcept {
  Context ctx;
  ctx.workflow = current_thread_id();
  ctx.tenant = cf.tenant;
  ctx.origin = options.origin;
  ctx.op = Op::kWrite;
  return ctx;
}

// --- flushes ---------------------------------------------------------------------------

bool TenantGate::Core::try_flush(CfState& cf, bool stalled) {
  if ((!options.flush_on_wait && !stalled) || closed.load(std::memory_order_acquire)) return false;
  {
    MutexLock lock(cf.mu);
    if (cf.flush_pending) return false;
    cf.flush_pending = true;
    cf.flush_epoch = std::numeric_limits<std::uint64_t>::max();
  }
  rdb::FlushOptions fo;
  fo.wait = false;
  fo.allow_write_stall = true;
  const rdb::Status s = db->Flush(fo, cf.handle);
  cf.flushes.fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(cf.mu);
  if (!s.ok()) {
    cf.flush_pending = false;
    return true;
  }
  // A pass that began before this point may have read the memtable count before the
  // switch: only a later pass may clear the flag; make sure there is one (the flush may
  // already be done, its callback's pass come and gone).
  cf.flush_epoch = epoch.load(std::memory_order_acquire);
  lock.unlock();
  signal();
  return true;
}

void TenantGate::Core::flush_for_waiter(CfState& waiting, std::uint64_t need) {
  std::uint64_t own = 0;
  CfState* largest = nullptr;
  std::uint64_t largest_held = 0;
  for (CfState* cf : all()) {
    std::uint64_t held = 0;
    bool pending = false;
    {
      MutexLock lock(cf->mu);
      held = cf->held;
      pending = cf->flush_pending;
    }
    if (cf->tenant == waiting.tenant) {
      own += held;
      if (held > 0) try_flush(*cf);
    } else if (!pending && held > largest_held) {
      largest = cf;
      largest_held = held;
    }
  }
  // The tenant's own memtables cannot free what it asks for: free the biggest holder's.
  if (own < need && largest != nullptr) try_flush(*largest);
  // A pass after this point clears flags of flushes already done and asks again for the
  // column families its waiters still wait on.
  signal();
}

// --- refresh passes --------------------------------------------------------------------

namespace {

bool int_property(rdb::DB& db, rdb::ColumnFamilyHandle* cf, const std::string& name,
                  std::uint64_t* out) {
  return db.GetIntProperty(cf, name, out);
}

bool l0_files_of(rdb::DB& db, rdb::ColumnFamilyHandle* cf, std::uint64_t* out) {
  std::string s;
  if (!db.GetProperty(cf, "rocksdb.num-files-at-level0", &s)) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc();
}

}  // namespace

bool TenantGate::Core::refresh_cf(CfState& cf, std::uint64_t pass_epoch) {
  std::uint64_t completed_before = 0;
  {
    MutexLock lock(cf.mu);
    completed_before = cf.completed;
  }
  // Entries first, then immutable memtables, then bytes: an active memtable seen empty
  // and no immutable one seen after it means no write before the reads is in memory
  // (writes after them are inflight or completed since).
  std::uint64_t entries = 0;
  const bool have_entries =
      int_property(*db, cf.handle, rdb::DB::Properties::kNumEntriesActiveMemTable, &entries);
  if (!have_entries) entries = 0;
  std::uint64_t mem = 0;
  std::uint64_t imm = 0;
  const bool have_imm =
      int_property(*db, cf.handle, rdb::DB::Properties::kNumImmutableMemTable, &imm);
  const bool have_mem =
      int_property(*db, cf.handle, rdb::DB::Properties::kCurSizeAllMemTables, &mem);
  cf.active_entries.store(entries, std::memory_order_relaxed);
  // An empty memtable still reports its arena's first block (2 KiB): no write's bytes,
  // and charged to nobody, or every tenant would keep a segment of the pool for it.
  const bool empty = have_entries && entries == 0 && have_imm && imm == 0;
  bool at_limit = false;
  if (cf.limits.l0_files > 0) {
    std::uint64_t l0 = 0;
    if (l0_files_of(*db, cf.handle, &l0)) {
      cf.l0_files.store(l0, std::memory_order_relaxed);
      at_limit = l0 >= static_cast<std::uint64_t>(cf.limits.l0_files);
    }
  }
  if (cf.limits.pending_compaction_bytes > 0) {
    std::uint64_t pending = 0;
    if (int_property(*db, cf.handle, rdb::DB::Properties::kEstimatePendingCompactionBytes,
                     &pending)) {
      cf.pending_bytes.store(pending, std::memory_order_relaxed);
      at_limit = at_limit || pending >= cf.limits.pending_compaction_bytes;
    }
  }
  if (have_mem) cf.memtable_bytes.store(mem, std::memory_order_relaxed);
  if (have_imm) cf.immutable_memtables.store(imm, std::memory_order_relaxed);

  std::uint64_t give_back = 0;
  bool want_flush = false;
  {
    MutexLock lock(cf.mu);
    if (have_mem) {
      // What the memtables may not show yet: writes still on their way, and writes that
      // returned after the properties were read began (they may or may not be counted).
      const std::uint64_t keep =
          (empty ? 0 : mem) + cf.inflight + (cf.completed - completed_before);
      if (cf.held > keep) {
        give_back = cf.held - keep;
        cf.held = keep;
      }
    }
    if (cf.flush_pending && have_imm && imm == 0 && cf.flush_epoch < pass_epoch) {
      cf.flush_pending = false;
    }
    // (An empty memtable is not worth a flush: it would free nothing.)
    want_flush = cf.waiters > 0 && cf.held > 0 && !cf.flush_pending && entries > 0;
    const bool was = cf.at_limit.exchange(at_limit, std::memory_order_acq_rel);
    if (was && !at_limit) cf.limit_cleared.notify_all();
  }
  if (give_back > 0) {
    admission->release(context_of(cf), give_back);
    cf.released.fetch_add(give_back, std::memory_order_relaxed);
  }
  // Writers of this column family still wait after what this pass gave back: the
  // flush that freed it is done, so ask for the next one.
  if (want_flush) try_flush(cf);
  return give_back > 0;
}

void TenantGate::Core::pass() {
  MutexLock serial(pass_mu);
  if (closed.load(std::memory_order_acquire) || db == nullptr) return;
  const std::uint64_t e = epoch.fetch_add(1, std::memory_order_acq_rel) + 1;
  const std::vector<CfState*> states = all();
  bool gave_back = false;
  for (CfState* cf : states) gave_back = refresh_cf(*cf, e) || gave_back;
  // Waiters whose own column families hold less than they wait for wait for other
  // tenants' bytes (a tenant ramping up): unless some flush is on its way or this pass
  // gave bytes back (the pool grants them next), flush the column family that holds the
  // most. (Waiters whose own column families hold enough are served by their own
  // flushes, which refresh_cf asks for.)
  if (total_waiters.load(std::memory_order_acquire) > 0) {
    std::map<std::uint32_t, std::pair<std::uint64_t, std::uint64_t>> by_tenant;  // held, wait
    bool progress = gave_back;
    CfState* largest = nullptr;
    std::uint64_t largest_held = 0;
    for (CfState* cf : states) {
      MutexLock lock(cf->mu);
      auto& t = by_tenant[cf->tenant];
      t.first += cf->held;
      t.second += cf->waiting_bytes;
      if (cf->flush_pending) progress = true;
      if (cf->held > largest_held && cf->active_entries.load(std::memory_order_relaxed) > 0) {
        largest = cf;
        largest_held = cf->held;
      }
    }
    bool starved = false;
    for (const auto& [tenant, t] : by_tenant)
      starved = starved || (t.second > 0 && t.first < t.second);
    if (starved && !progress && largest != nullptr) try_flush(*largest);
    // (With flush_on_wait every waiter asks for its own flushes: no stall to break.)
    if (!options.flush_on_wait) break_stall_locked(states);
  }
}

void TenantGate::Core::break_stall_locked(const std::vector<CfState*>& states) {
  std::uint64_t moved = 0;
  bool flushing = false;
  std::vector<CfState*> holders;  // column families whose memtables hold bytes
  for (CfState* cf : states) {
    moved +=
        cf->charged.load(std::memory_order_relaxed) + cf->released.load(std::memory_order_relaxed);
    if (cf->immutable_memtables.load(std::memory_order_relaxed) > 0) flushing = true;
    MutexLock lock(cf->mu);
    if (cf->flush_pending) flushing = true;
    if (cf->held > 0 && cf->active_entries.load(std::memory_order_relaxed) > 0) {
      holders.push_back(cf);
    }
  }
  const std::int64_t now = options.clock->now_ns();
  if (moved != last_moved) {
    last_moved = moved;
    last_moved_ns = now;
    return;
  }
  const auto interval =
      std::chrono::duration_cast<std::chrono::nanoseconds>(options.refresh_interval).count();
  if (now - last_moved_ns < interval || flushing || holders.empty()) return;
  // Every writer waits for bytes that only flushes can give back, and none is coming
  // (the pool shrank below what partly filled memtables hold, and RocksDB flushes a
  // memtable only once a write overfills it): flush every memtable that holds bytes,
  // so that the pool gets back all it can at once rather than one memtable a pass.
  bool asked = false;
  for (CfState* cf : holders) asked = try_flush(*cf, /*stalled=*/true) || asked;
  if (asked) last_moved_ns = now;
}

// --- the worker ------------------------------------------------------------------------

void TenantGate::Core::start_worker() {
  worker = std::thread([this] { run_worker(); });
}

void TenantGate::Core::signal() {
  MutexLock lock(worker_mu);
  wake = true;
  worker_cv.notify_one();
}

void TenantGate::Core::stop_worker() {
  {
    MutexLock lock(worker_mu);
    stop = true;
    worker_cv.notify_one();
  }
  if (worker.joinable()) worker.join();
}

void TenantGate::Core::run_worker() {
  const auto interval =
      std::chrono::duration_cast<std::chrono::nanoseconds>(options.refresh_interval).count();
  for (;;) {
    {
      MutexLock lock(worker_mu);
      const std::int64_t deadline = options.clock->now_ns() + interval;
      while (!wake && !stop) {
        if (interval > 0) {
          if (options.clock->now_ns() >= deadline) break;
          options.clock->wait_until(lock.native(), worker_cv, deadline);
        } else {
          options.clock->wait(lock.native(), worker_cv);
        }
      }
      if (stop) return;
      wake = false;
    }
    pass();
  }
}

void TenantGate::Core::release_all() {
  closed.store(true, std::memory_order_release);
  for (CfState* cf : all()) {
    std::uint64_t held = 0;
    {
      MutexLock lock(cf->mu);
      held = cf->held;
      cf->held = 0;
      cf->inflight = 0;
      cf->at_limit.store(false, std::memory_order_release);
      cf->limit_cleared.notify_all();
    }
    if (held > 0) {
      admission->release(context_of(*cf), held);
      cf->released.fetch_add(held, std::memory_order_relaxed);
    }
  }
}

// --- the listener ----------------------------------------------------------------------

namespace {

// Wakes the worker after every flush and compaction. It calls nothing in RocksDB from
// the callback: the worker reads the properties and asks for flushes on its own thread.
class GateListener : public rdb::EventListener {
 public:
  explicit GateListener(std::shared_ptr<TenantGate::Core> core) : core_(std::move(core)) {}
  const char* Name() const override { return "SluiceTenantGateListener"; }
  void OnFlushCompleted(rdb::DB* /*db*/, const rdb::FlushJobInfo& /*info*/) override {
    core_->signal();
  }
  void OnCompactionCompleted(rdb::DB* /*db*/, const rdb::CompactionJobInfo& /*info*/) override {
    core_->signal();
  }

 private:
  std::shared_ptr<TenantGate::Core> core_;
};

}  // namespace

std::shared_ptr<rdb::EventListener> make_gate_listener(std::shared_ptr<TenantGate::Core> core) {
  return std::make_shared<GateListener>(std::move(core));
}

// --- IsolateStalls ---------------------------------------------------------------------

StatusOr<TenantLimits> IsolateStalls(rdb::ColumnFamilyOptions& cf,
                                     const StallIsolation& isolation) {
  if (isolation.backstop_factor < 1) {
    return Status::invalid("isolation.backstop_factor: must be at least 1, got " +
                           std::to_string(isolation.backstop_factor));
  }
  if (isolation.tenant_memtable_bytes > 0 && cf.write_buffer_size == 0) {
    return Status::invalid(
        "write_buffer_size: must be positive when isolation.tenant_memtable_bytes is set");
  }
  TenantLimits limits;
  limits.l0_files = std::max(cf.level0_stop_writes_trigger, 1);
  limits.pending_compaction_bytes = cf.hard_pending_compaction_bytes_limit;
  const std::int64_t l0_backstop = std::int64_t{limits.l0_files} * isolation.backstop_factor;
  const int l0 =
      static_cast<int>(std::min<std::int64_t>(l0_backstop, std::numeric_limits<int>::max()));
  cf.level0_slowdown_writes_trigger = std::max(cf.level0_slowdown_writes_trigger, l0);
  cf.level0_stop_writes_trigger = std::max(cf.level0_stop_writes_trigger, l0);
  cf.level0_slowdown_writes_trigger = cf.level0_stop_writes_trigger;
  if (limits.pending_compaction_bytes > 0) {
    const std::uint64_t factor = static_cast<std::uint64_t>(isolation.backstop_factor);
    const std::uint64_t p = limits.pending_compaction_bytes;
    const std::uint64_t backstop = p > std::numeric_limits<std::uint64_t>::max() / factor
                                       ? std::numeric_limits<std::uint64_t>::max()
                                       : p * factor;
    cf.hard_pending_compaction_bytes_limit = backstop;
    cf.soft_pending_compaction_bytes_limit = backstop;
  }
  if (isolation.tenant_memtable_bytes > 0) {
    const std::uint64_t wbs = cf.write_buffer_size;
    const std::uint64_t n = (isolation.tenant_memtable_bytes + wbs - 1) / wbs + 3;
    const int want = static_cast<int>(std::min<std::uint64_t>(n, 1u << 20));
    cf.max_write_buffer_number = std::max(cf.max_write_buffer_number, want);
  }
  return limits;
}

// --- StageAdmission --------------------------------------------------------------------

namespace {

class StageAdmissionImpl final : public Admission {
 public:
  explicit StageAdmissionImpl(Stage& stage) : stage_(&stage) {}

  Admitted acquire(const Context& ctx, std::uint64_t bytes) noexcept override {
    Hold h = stage_->acquire(ctx, bytes);
    Admitted a{h.verdict(), h.amount()};
    if (h.holds()) {
      Holds& t = holds_of(ctx.tenant);
      MutexLock lock(t.mu);
      if (t.holds.empty() || !t.holds.back().absorb(std::move(h))) {
        t.holds.push_back(std::move(h));
      }
    }
    return a;
  }

  // Gives back from the oldest holds first (they are of the rules in force longest).
  void release(const Context& ctx, std::uint64_t bytes) noexcept override {
    Holds& t = holds_of(ctx.tenant);
    MutexLock lock(t.mu);
    while (bytes > 0 && !t.holds.empty()) {
      Hold& front = t.holds.front();
      const std::uint64_t n = std::min(bytes, front.amount());
      front.release(n);
      bytes -= n;
      if (!front.holds()) t.holds.erase(t.holds.begin());
    }
  }

 private:
  struct Holds {
    Mutex mu;
    std::vector<Hold> holds SLUICE_GUARDED_BY(mu);
  };
  Holds& holds_of(std::uint32_t tenant) {
    MutexLock lock(mu_);
    auto& slot = by_tenant_[tenant];
    if (!slot) slot = std::make_unique<Holds>();
    return *slot;
  }
  Mutex mu_;
  std::map<std::uint32_t, std::unique_ptr<Holds>> by_tenant_ SLUICE_GUARDED_BY(mu_);
  Stage* stage_;
};

}  // namespace

std::shared_ptr<Admission> StageAdmission(Stage& stage) {
  return std::make_shared<StageAdmissionImpl>(stage);
}

}  // namespace sluice::rocksdb_binding
