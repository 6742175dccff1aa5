// Scheduled transactions on unmodified RocksDB: a thin wrapper over a TransactionDB or
// an OptimisticTransactionDB through which each transaction's begin is admitted by a
// stage's transaction scheduler ("drft") and its end reports what it used. Begin
// acquires one unit ({op begin, tenant, workflow: its id}; sluice/txn.h) and may wait
// (Busy under no_wait or when refused; cancelled: begins unscheduled). Operations
// forward and note their items; lock waits are seen through mutex_factory() (set it in
// TransactionDBOptions::custom_mutex_factory before opening); Commit and Rollback report
// the end and release the admission; a ScheduledTxn destroyed without either rolls
// back. Report times are on TxnSchedulerOptions::clock, which must be the scheduler's.
// docs/rocksdb.md, "Scheduled transactions", has the details.
//
// Thread safety: TxnScheduler and ScheduledTransactionDB from any thread; a
// ScheduledTxn by one thread at a time (it may move). The scheduler, the stage and the
// DB must outlive every ScheduledTxn begun through them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

#include <rocksdb/slice.h>
#include <rocksdb/status.h>
#include <rocksdb/utilities/optimistic_transaction_db.h>
#include <rocksdb/utilities/transaction.h>
#include <rocksdb/utilities/transaction_db.h>
#include <rocksdb/utilities/transaction_db_mutex.h>

#include "sluice/clock.h"
#include "sluice/context.h"
#include "sluice/enforcement_object.h"
#include "sluice/hold.h"
#include "sluice/stage.h"
#include "sluice/thread_annotations.h"
#include "sluice/txn.h"

namespace sluice::rocksdb_binding {

struct TxnSchedulerOptions {
  OriginId origin = origin::kForeground;  // the Contexts' origin
  // Count each operation and end through the stage (when there is one).
  bool count_operations = true;
  Clock* clock = nullptr;  // null: system_clock()
};

// Totals since the scheduler was made.
struct TxnTotals {
  std::uint64_t begun = 0;
  std::uint64_t waited = 0;       // begins that waited for admission
  std::uint64_t wait_ns = 0;      // their waits
  std::uint64_t unscheduled = 0;  // begun fail-open (the scheduler cancelled)
  std::uint64_t refused = 0;      // refused or would have waited: nothing begun
  std::uint64_t committed = 0;
  std::uint64_t aborted = 0;
  std::uint64_t conflicts = 0;  // optimistic commits that returned Busy or TryAgain
  std::uint64_t lock_waits = 0;
  std::uint64_t lock_wait_ns = 0;
  std::uint64_t lock_timeouts = 0;  // operations that returned TimedOut
};

class ScheduledTxn;

class TxnScheduler {
 public:
  // Admission through `stage`'s routing (it must outlive the scheduler).
  explicit TxnScheduler(Stage& stage, TxnSchedulerOptions options = {});
  // Admission straight from `object` (e.g. a sluice::Drft), without a stage.
  explicit TxnScheduler(std::shared_ptr<EnforcementObject> object,
                        TxnSchedulerOptions options = {});
  ~TxnScheduler();
  TxnScheduler(const TxnScheduler&) = delete;
  TxnScheduler& operator=(const TxnScheduler&) = delete;

  // For TransactionDBOptions::custom_mutex_factory: lock waits become observable.
  std::shared_ptr<rocksdb::TransactionDBMutexFactory> mutex_factory();

  TxnTotals totals() const noexcept;
  const TxnSchedulerOptions& options() const noexcept { return options_; }
  Clock& clock() const noexcept { return *clock_; }
  // The tenants of the running transactions `ids` begun through this scheduler (unknown
  // ones left out); returns how many it wrote.
  std::size_t tenants_of(std::span<const rocksdb::TransactionID> ids,
                         std::span<std::uint32_t> out) const SLUICE_EXCLUDES(mu_);

 private:
  friend class ScheduledTransactionDB;
  friend class ScheduledTxn;
  struct Counters;

  Hold admit(const Context& ctx) noexcept;
  void count(const Context& ctx) noexcept;
  std::uint64_t next_id() noexcept { return next_id_.fetch_add(1, std::memory_order_relaxed); }
  void track(rocksdb::TransactionID id, std::uint32_t tenant) SLUICE_EXCLUDES(mu_);
  void untrack(rocksdb::TransactionID id) SLUICE_EXCLUDES(mu_);

  Stage* stage_ = nullptr;
  std::shared_ptr<EnforcementObject> object_;
  TxnSchedulerOptions options_;
  Clock* clock_;
  std::atomic<std::uint64_t> next_id_{1};
  std::unique_ptr<Counters> counters_;
  mutable Mutex mu_;
  std::unordered_map<rocksdb::TransactionID, std::uint32_t> running_ SLUICE_GUARDED_BY(mu_);
};

struct BeginOptions {
  rocksdb::WriteOptions write_options;
  rocksdb::TransactionOptions pessimistic;           // for a TransactionDB
  rocksdb::OptimisticTransactionOptions optimistic;  // for an OptimisticTransactionDB
  std::span<const rocksdb::Slice> declared_keys;     // of the default column family
  bool no_wait = false;                              // Busy instead of waiting for admission
};

class ScheduledTransactionDB {
 public:
  // `db` opened with TransactionDBOptions::custom_mutex_factory = s.mutex_factory() (else
  // lock waits go unobserved). Neither is owned.
  ScheduledTransactionDB(rocksdb::TransactionDB* db, TxnScheduler& s);
  ScheduledTransactionDB(rocksdb::OptimisticTransactionDB* db, TxnScheduler& s);

  // Begins a transaction for `tenant`, after the scheduler admits it. On error (refused,
  // or would wait under no_wait: Status::Busy) nothing is begun and *out is unchanged.
  rocksdb::Status Begin(std::uint32_t tenant, const BeginOptions& options,
                        std::unique_ptr<ScheduledTxn>* out);
  rocksdb::Status Begin(std::uint32_t tenant, std::unique_ptr<ScheduledTxn>* out) {
    return Begin(tenant, BeginOptions{}, out);
  }

  bool pessimistic() const noexcept { return pessimistic_ != nullptr; }
  rocksdb::DB* db() const noexcept;
  TxnScheduler& scheduler() const noexcept { return scheduler_; }

 private:
  rocksdb::TransactionDB* pessimistic_ = nullptr;
  rocksdb::OptimisticTransactionDB* optimistic_ = nullptr;
  TxnScheduler& scheduler_;
};

class ScheduledTxn {
 public:
  ~ScheduledTxn();  // rolls back a transaction neither committed nor rolled back
  ScheduledTxn(const ScheduledTxn&) = delete;
  ScheduledTxn& operator=(const ScheduledTxn&) = delete;

  rocksdb::Status Get(const rocksdb::ReadOptions& ro, rocksdb::ColumnFamilyHandle* cf,
                      const rocksdb::Slice& key, std::string* value);
  rocksdb::Status GetForUpdate(const rocksdb::ReadOptions& ro, rocksdb::ColumnFamilyHandle* cf,
                               const rocksdb::Slice& key, std::string* value);
  rocksdb::Status Put(rocksdb::ColumnFamilyHandle* cf, const rocksdb::Slice& key,
                      const rocksdb::Slice& value);
  rocksdb::Status Delete(rocksdb::ColumnFamilyHandle* cf, const rocksdb::Slice& key);
  rocksdb::Status Merge(rocksdb::ColumnFamilyHandle* cf, const rocksdb::Slice& key,
                        const rocksdb::Slice& value);
  // The default column family.
  rocksdb::Status Get(const rocksdb::Slice& key, std::string* value) {
    return Get(rocksdb::ReadOptions(), nullptr, key, value);
  }
  rocksdb::Status GetForUpdate(const rocksdb::Slice& key, std::string* value) {
    return GetForUpdate(rocksdb::ReadOptions(), nullptr, key, value);
  }
  rocksdb::Status Put(const rocksdb::Slice& key, const rocksdb::Slice& value) {
    return Put(nullptr, key, value);
  }
  rocksdb::Status Delete(const rocksdb::Slice& key) { return Delete(nullptr, key); }

  rocksdb::Status Commit();
  rocksdb::Status Rollback();

  std::uint64_t id() const noexcept { return ctx_.workflow; }  // the workflow in its Contexts
  std::uint32_t tenant() const noexcept { return ctx_.tenant; }
  Verdict admission() const noexcept { return admission_; }
  bool ended() const noexcept { return ended_; }
  bool pessimistic() const noexcept { return pessimistic_; }
  // The RocksDB transaction, for what the wrapper does not forward (its operations
  // are then neither counted nor noted).
  rocksdb::Transaction* raw() const noexcept { return txn_.get(); }

  // For the mutex factory's condition variable: one wait of this transaction for the
  // lock on `item`, held by transactions of `blocker_tenants` (at most kMaxBlockers
  // kept). Reported after the operation returns.
  struct LockWait {
    txn::ItemId item = 0;
    std::span<const std::uint32_t> blocker_tenants;
    std::int64_t wait_ns = 0;
  };
  void note_lock_wait(const LockWait& w) noexcept;
  static constexpr std::size_t kMaxBlockers = 8;
  TxnScheduler& scheduler() const noexcept { return scheduler_; }

 private:
  friend class ScheduledTransactionDB;
  ScheduledTxn(TxnScheduler& s, bool pessimistic, const Context& ctx, Hold hold,
               rocksdb::Transaction* txn);
  std::uint32_t cf_id(rocksdb::ColumnFamilyHandle* cf) const noexcept;
  // After an operation on `key`: notes its item (held when `locks`), counts it, and
  // reports the lock waits it had.
  void after(const rocksdb::Status& s, Op op, rocksdb::ColumnFamilyHandle* cf,
             const rocksdb::Slice& key, std::size_t bytes, bool locks) noexcept;
  void finish(txn::TxnEnd end) noexcept;

  TxnScheduler& scheduler_;
  bool pessimistic_;
  Context ctx_;
  Hold hold_;
  Verdict admission_;
  std::unique_ptr<rocksdb::Transaction> txn_;
  bool ended_ = false;
  std::int64_t first_access_ns_ = 0;
  txn::ItemId items_[txn::kMaxReportedItems] = {};
  std::uint8_t n_items_ = 0;
  // Lock waits seen during the current operation, reported after it.
  static constexpr std::size_t kMaxPendingWaits = 4;
  struct Pending {
    txn::ItemId item = 0;
    std::uint32_t blockers[kMaxBlockers] = {};
    std::uint8_t n_blockers = 0;
    std::int64_t wait_ns = 0;
  };
  Pending pending_[kMaxPendingWaits];
  std::uint8_t n_pending_ = 0;
};

}  // namespace sluice::rocksdb_binding
