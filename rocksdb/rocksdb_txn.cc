// Scheduled transactions on unmodified RocksDB (sluice/rocksdb_txn.h): admission at
// begin, items noted per operation, lock waits seen through the mutex factory, and the
// report at the end.
#include "sluice/rocksdb_txn.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

namespace sluice::rocksdb_binding {
namespace rdb = ROCKSDB_NAMESPACE;

struct TxnScheduler::Counters {
  std::atomic<std::uint64_t> begun{0}, waited{0}, wait_ns{0}, unscheduled{0}, refused{0};
  std::atomic<std::uint64_t> committed{0}, aborted{0}, conflicts{0};
  std::atomic<std::uint64_t> lock_waits{0}, lock_wait_ns{0}, lock_timeouts{0};
};

namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

// The transaction whose operation runs on this thread: the condition variable's wait
// is that transaction's lock wait.
thread_local ScheduledTxn* t_current = nullptr;

class CurrentTxn {
 public:
  explicit CurrentTxn(ScheduledTxn* txn) noexcept : saved_(t_current) { t_current = txn; }
  ~CurrentTxn() { t_current = saved_; }
  CurrentTxn(const CurrentTxn&) = delete;
  CurrentTxn& operator=(const CurrentTxn&) = delete;

 private:
  ScheduledTxn* saved_;
};

// RocksDB's default TransactionDBMutex: a std::mutex whose lock and unlock RocksDB's
// lock manager calls (its protocol, not a scope: outside the analysis).
class TxnMutex final : public rdb::TransactionDBMutex {
 public:
  rdb::Status Lock() override SLUICE_NO_THREAD_SAFETY_ANALYSIS {
    mu_.lock();
    return rdb::Status::OK();
  }
  // As RocksDB's own: the mutex is held briefly, so only a zero timeout is honoured.
  rdb::Status TryLockFor(int64_t timeout_us) override SLUICE_NO_THREAD_SAFETY_ANALYSIS {
    if (timeout_us == 0) {
      return mu_.try_lock() ? rdb::Status::OK()
                            : rdb::Status::TimedOut(rdb::Status::SubCode::kMutexTimeout);
    }
    mu_.lock();
    return rdb::Status::OK();
  }
  void UnLock() override SLUICE_NO_THREAD_SAFETY_ANALYSIS { mu_.unlock(); }
  std::mutex& native() noexcept { return mu_; }

 private:
  std::mutex mu_;
};

// RocksDB's default TransactionDBCondVar, timing the waits of scheduled transactions.
class TxnCondVar final : public rdb::TransactionDBCondVar {
 public:
  explicit TxnCondVar(Clock& clock) : clock_(clock) {}
  rdb::Status Wait(std::shared_ptr<rdb::TransactionDBMutex> mutex) override {
    return WaitFor(std::move(mutex), -1);
  }
  rdb::Status WaitFor(std::shared_ptr<rdb::TransactionDBMutex> mutex, int64_t timeout_us) override {
    ScheduledTxn* cur = t_current;
    std::string key;
    std::uint32_t cf = 0;
    std::uint32_t tenants[ScheduledTxn::kMaxBlockers];
    std::size_t n = 0;
    // The lock manager named the key and its holders (SetWaitingTxn) before waiting;
    // their tenants are looked up now, while they still run.
    if (cur != nullptr && cur->pessimistic()) {
      const std::vector<rdb::TransactionID> ids = cur->raw()->GetWaitingTxns(&cf, &key);
      n = cur->scheduler().tenants_of(ids, tenants);
    }
    const std::int64_t start = clock_.now_ns();
    auto* m = static_cast<TxnMutex*>(mutex.get());
    std::unique_lock<std::mutex> lock(m->native(), std::adopt_lock);
    rdb::Status s;
    if (timeout_us < 0) {
      cv_.wait(lock);
    } else if (cv_.wait_for(lock, std::chrono::microseconds(timeout_us)) ==
               std::cv_status::timeout) {
      s = rdb::Status::TimedOut(rdb::Status::SubCode::kMutexTimeout);
    }
    lock.release();  // RocksDB unlocks it
    if (cur != nullptr) {
      cur->note_lock_wait({txn::item_of(key, cf), std::span<const std::uint32_t>(tenants, n),
                           std::max<std::int64_t>(0, clock_.now_ns() - start)});
    }
    return s;
  }
  void Notify() override { cv_.notify_one(); }
  void NotifyAll() override { cv_.notify_all(); }

 private:
  Clock& clock_;
  std::condition_variable cv_;
};

class TxnMutexFactory final : public rdb::TransactionDBMutexFactory {
 public:
  explicit TxnMutexFactory(Clock& clock) : clock_(clock) {}
  std::shared_ptr<rdb::TransactionDBMutex> AllocateMutex() override {
    return std::make_shared<TxnMutex>();
  }
  std::shared_ptr<rdb::TransactionDBCondVar> AllocateCondVar() override {
    return std::make_shared<TxnCondVar>(clock_);
  }

 private:
  Clock& clock_;
};

}  // namespace

// ---------------------------------------------------------------------------
// TxnScheduler

TxnScheduler::TxnScheduler(Stage& stage, TxnSchedulerOptions options)
    : stage_(&stage),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : &system_clock()),
      counters_(std::make_unique<Counters>()) {}

TxnScheduler::TxnScheduler(std::shared_ptr<EnforcementObject> object, TxnSchedulerOptions options)
    : object_(std::move(object)),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : &system_clock()),
      counters_(std::make_unique<Counters>()) {}

TxnScheduler::~TxnScheduler() = default;

std::shared_ptr<rdb::TransactionDBMutexFactory> TxnScheduler::mutex_factory() {
  return std::make_shared<TxnMutexFactory>(*clock_);
}

Hold TxnScheduler::admit(const Context& ctx) noexcept {
  if (stage_ != nullptr) return stage_->acquire(ctx, 1);
  if (object_ == nullptr) return Hold();
  const Verdict v = object_->acquire(ctx, 1);
  return Hold(object_, ctx, 1, v);
}

void TxnScheduler::count(const Context& ctx) noexcept {
  if (stage_ != nullptr && options_.count_operations) (void)stage_->enforce(ctx);
}

void TxnScheduler::track(rdb::TransactionID id, std::uint32_t tenant) {
  MutexLock lock(mu_);
  running_[id] = tenant;
}

void TxnScheduler::untrack(rdb::TransactionID id) {
  MutexLock lock(mu_);
  running_.erase(id);
}

std::size_t TxnScheduler::tenants_of(std::span<const rdb::TransactionID> ids,
                                     std::span<std::uint32_t> out) const {
  MutexLock lock(mu_);
  std::size_t n = 0;
  for (rdb::TransactionID id : ids) {
    if (n == out.size()) break;
    if (auto it = running_.find(id); it != running_.end()) out[n++] = it->second;
  }
  return n;
}

TxnTotals TxnScheduler::totals() const noexcept {
  const Counters& c = *counters_;
  TxnTotals t;
  t.begun = c.begun.load(kRelaxed);
  t.waited = c.waited.load(kRelaxed);
  t.wait_ns = c.wait_ns.load(kRelaxed);
  t.unscheduled = c.unscheduled.load(kRelaxed);
  t.refused = c.refused.load(kRelaxed);
  t.committed = c.committed.load(kRelaxed);
  t.aborted = c.aborted.load(kRelaxed);
  t.conflicts = c.conflicts.load(kRelaxed);
  t.lock_waits = c.lock_waits.load(kRelaxed);
  t.lock_wait_ns = c.lock_wait_ns.load(kRelaxed);
  t.lock_timeouts = c.lock_timeouts.load(kRelaxed);
  return t;
}

// ---------------------------------------------------------------------------
// ScheduledTransactionDB

ScheduledTransactionDB::ScheduledTransactionDB(rdb::TransactionDB* db, TxnScheduler& s)
    : pessimistic_(db), scheduler_(s) {}

ScheduledTransactionDB::ScheduledTransactionDB(rdb::OptimisticTransactionDB* db, TxnScheduler& s)
    : optimistic_(db), scheduler_(s) {}

rdb::DB* ScheduledTransactionDB::db() const noexcept {
  return pessimistic_ != nullptr ? static_cast<rdb::DB*>(pessimistic_) : optimistic_->GetBaseDB();
}

rdb::Status ScheduledTransactionDB::Begin(std::uint32_t tenant, const BeginOptions& options,
                                          std::unique_ptr<ScheduledTxn>* out) {
  if (out == nullptr) return rdb::Status::InvalidArgument("out: must not be null");
  TxnScheduler& s = scheduler_;
  Context ctx;
  ctx.op = Op::kBegin;
  ctx.tenant = tenant;
  ctx.workflow = s.next_id();
  ctx.origin = s.options().origin;
  ctx.size = 1;
  if (options.no_wait) ctx.flags |= context_flag::kNoWait;
  txn::ItemId declared[txn::kMaxReportedItems];
  const std::size_t n = std::min(options.declared_keys.size(), txn::kMaxReportedItems);
  for (std::size_t i = 0; i < n; ++i) {
    const rdb::Slice& k = options.declared_keys[i];
    declared[i] = txn::item_of(std::string_view(k.data(), k.size()));
  }
  Hold hold;
  {
    txn::DeclaredItemsScope scope(std::span<const txn::ItemId>(declared, n));
    hold = s.admit(ctx);
  }
  const Verdict v = hold.verdict();
  TxnScheduler::Counters& c = *s.counters_;
  if (v.outcome == Outcome::kRejected || v.outcome == Outcome::kWouldWait) {
    c.refused.fetch_add(1, kRelaxed);
    return rdb::Status::Busy(v.outcome == Outcome::kRejected
                                 ? "sluice: the transaction scheduler refused the begin"
                                 : "sluice: the transaction scheduler would make the begin wait");
  }
  if (v.outcome == Outcome::kCancelled) c.unscheduled.fetch_add(1, kRelaxed);
  if (v.wait_ns > 0) {
    c.waited.fetch_add(1, kRelaxed);
    c.wait_ns.fetch_add(v.wait_ns, kRelaxed);
  }
  rdb::Transaction* t =
      pessimistic_ != nullptr
          ? pessimistic_->BeginTransaction(options.write_options, options.pessimistic)
          : optimistic_->BeginTransaction(options.write_options, options.optimistic);
  if (pessimistic_ != nullptr) s.track(t->GetID(), tenant);
  c.begun.fetch_add(1, kRelaxed);
  out->reset(new ScheduledTxn(s, pessimistic_ != nullptr, ctx, std::move(hold), t));
  (*out)->admission_ = v;
  return rdb::Status::OK();
}

// ---------------------------------------------------------------------------
// ScheduledTxn

ScheduledTxn::ScheduledTxn(TxnScheduler& s, bool pessimistic, const Context& ctx, Hold hold,
                           rdb::Transaction* txn)
    : scheduler_(s), pessimistic_(pessimistic), ctx_(ctx), hold_(std::move(hold)), txn_(txn) {
  ctx_.flags = 0;
}

ScheduledTxn::~ScheduledTxn() {
  if (!ended_) (void)Rollback();
}

std::uint32_t ScheduledTxn::cf_id(rdb::ColumnFamilyHandle* cf) const noexcept {
  return cf != nullptr ? cf->GetID() : 0;
}

void ScheduledTxn::note_lock_wait(const LockWait& w) noexcept {
  TxnScheduler::Counters& c = *scheduler_.counters_;
  c.lock_waits.fetch_add(1, kRelaxed);
  c.lock_wait_ns.fetch_add(static_cast<std::uint64_t>(w.wait_ns), kRelaxed);
  // A wait that goes on (several rounds on one key) adds to the last.
  if (n_pending_ > 0 && pending_[n_pending_ - 1].item == w.item) {
    pending_[n_pending_ - 1].wait_ns += w.wait_ns;
    return;
  }
  if (n_pending_ == kMaxPendingWaits) return;
  Pending& p = pending_[n_pending_++];
  p.item = w.item;
  p.wait_ns = w.wait_ns;
  p.n_blockers = static_cast<std::uint8_t>(std::min(w.blocker_tenants.size(), kMaxBlockers));
  std::copy_n(w.blocker_tenants.begin(), p.n_blockers, p.blockers);
}

void ScheduledTxn::after(const rdb::Status& s, Op op, rdb::ColumnFamilyHandle* cf,
                         const rdb::Slice& key, std::size_t bytes, bool locks) noexcept {
  if (s.IsTimedOut()) scheduler_.counters_->lock_timeouts.fetch_add(1, kRelaxed);
  txn::TxnAccounting* acct = txn::accounting_of(hold_);
  for (std::uint8_t i = 0; i < n_pending_; ++i) {
    const Pending& p = pending_[i];
    if (acct != nullptr) {
      acct->on_lock_wait(ctx_, p.item, std::span<const std::uint32_t>(p.blockers, p.n_blockers),
                         p.wait_ns, first_access_ns_ != 0);
    }
  }
  n_pending_ = 0;
  if (s.ok() || s.IsNotFound()) {
    const txn::ItemId item = txn::item_of(std::string_view(key.data(), key.size()), cf_id(cf));
    if (locks && first_access_ns_ == 0) first_access_ns_ = scheduler_.clock().now_ns();
    if (n_items_ < txn::kMaxReportedItems &&
        std::find(items_, items_ + n_items_, item) == items_ + n_items_) {
      items_[n_items_++] = item;
    }
  }
  Context c = ctx_;
  c.op = op;
  c.size = bytes;
  scheduler_.count(c);
}

rdb::Status ScheduledTxn::Get(const rdb::ReadOptions& ro, rdb::ColumnFamilyHandle* cf,
                              const rdb::Slice& key, std::string* value) {
  CurrentTxn scope(this);
  rdb::Status s = cf != nullptr ? txn_->Get(ro, cf, key, value) : txn_->Get(ro, key, value);
  after(s, Op::kGet, cf, key, key.size() + (s.ok() ? value->size() : 0), false);
  return s;
}

rdb::Status ScheduledTxn::GetForUpdate(const rdb::ReadOptions& ro, rdb::ColumnFamilyHandle* cf,
                                       const rdb::Slice& key, std::string* value) {
  CurrentTxn scope(this);
  rdb::Status s =
      cf != nullptr ? txn_->GetForUpdate(ro, cf, key, value) : txn_->GetForUpdate(ro, key, value);
  after(s, Op::kGet, cf, key, key.size() + (s.ok() ? value->size() : 0), true);
  return s;
}

rdb::Status ScheduledTxn::Put(rdb::ColumnFamilyHandle* cf, const rdb::Slice& key,
                              const rdb::Slice& value) {
  CurrentTxn scope(this);
  rdb::Status s = cf != nullptr ? txn_->Put(cf, key, value) : txn_->Put(key, value);
  after(s, Op::kPut, cf, key, key.size() + value.size(), true);
  return s;
}

rdb::Status ScheduledTxn::Delete(rdb::ColumnFamilyHandle* cf, const rdb::Slice& key) {
  CurrentTxn scope(this);
  rdb::Status s = cf != nullptr ? txn_->Delete(cf, key) : txn_->Delete(key);
  after(s, Op::kDelete, cf, key, key.size(), true);
  return s;
}

rdb::Status ScheduledTxn::Merge(rdb::ColumnFamilyHandle* cf, const rdb::Slice& key,
                                const rdb::Slice& value) {
  CurrentTxn scope(this);
  rdb::Status s = cf != nullptr ? txn_->Merge(cf, key, value) : txn_->Merge(key, value);
  after(s, Op::kMerge, cf, key, key.size() + value.size(), true);
  return s;
}

rdb::Status ScheduledTxn::Commit() {
  if (ended_) return rdb::Status::InvalidArgument("sluice: the transaction has ended");
  rdb::Status s;
  {
    CurrentTxn scope(this);
    s = txn_->Commit();
  }
  const bool conflict = !pessimistic_ && (s.IsBusy() || s.IsTryAgain());
  finish(s.ok()     ? txn::TxnEnd::kCommitted
         : conflict ? txn::TxnEnd::kConflict
                    : txn::TxnEnd::kAborted);
  return s;
}

rdb::Status ScheduledTxn::Rollback() {
  if (ended_) return rdb::Status::InvalidArgument("sluice: the transaction has ended");
  rdb::Status s = txn_->Rollback();
  finish(txn::TxnEnd::kAborted);
  return s;
}

void ScheduledTxn::finish(txn::TxnEnd end) noexcept {
  ended_ = true;
  if (pessimistic_) scheduler_.untrack(txn_->GetID());
  TxnScheduler::Counters& c = *scheduler_.counters_;
  (end == txn::TxnEnd::kCommitted  ? c.committed
   : end == txn::TxnEnd::kConflict ? c.conflicts
                                   : c.aborted)
      .fetch_add(1, kRelaxed);
  if (txn::TxnAccounting* acct = txn::accounting_of(hold_)) {
    txn::TxnReport r;
    r.end = end;
    r.first_access_ns = first_access_ns_;
    r.end_ns = scheduler_.clock().now_ns();
    r.items = std::span<const txn::ItemId>(items_, n_items_);
    acct->on_end(ctx_, r);
  }
  hold_.release_all();
  Context e = ctx_;
  e.op = end == txn::TxnEnd::kCommitted ? Op::kCommit : Op::kAbort;
  e.size = 0;
  scheduler_.count(e);
}

}  // namespace sluice::rocksdb_binding
