// The state TenantGate and its listener share (private to the binding): one CfState per
// gated column family (the ledger, the flush and limit state, the statistics) and the
// background worker that reconciles ledgers, re-reads limits and asks for flushes.
//
// Locking: reg_mu guards the table of column families (states are never freed before
// the Core, so a pointer taken from the table stays valid); each CfState::mu guards that
// column family's ledger; pass_mu serialises refresh passes; worker_mu the worker's
// wake-up. No gate lock is held while calling into RocksDB or the Admission, except
// pass_mu around a pass (which calls RocksDB's property getters and Flush): RocksDB never
// calls back into the gate with its own locks held, and the listener only sets a flag.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sluice/rocksdb_tenants.h"
#include "sluice/thread_annotations.h"

namespace sluice::rocksdb_binding {

struct CfState {
  std::uint32_t cf_id = 0;
  std::string name;
  std::uint32_t tenant = 0;
  ::rocksdb::ColumnFamilyHandle* handle = nullptr;
  bool owned = true;  // the gate destroys the handle at close
  TenantLimits limits;

  // Written by refresh passes, read lock-free by every write.
  std::atomic<bool> at_limit{false};

  Mutex mu;
  std::condition_variable limit_cleared;              // at_limit went false (or the gate closed)
  std::uint64_t held SLUICE_GUARDED_BY(mu) = 0;       // units the pool holds for this CF
  std::uint64_t inflight SLUICE_GUARDED_BY(mu) = 0;   // of those, writes not returned yet
  std::uint64_t completed SLUICE_GUARDED_BY(mu) = 0;  // held units of returned writes, total
  bool flush_pending SLUICE_GUARDED_BY(mu) = false;
  // The pass epoch after the gate's Flush request returned (UINT64_MAX while it runs).
  std::uint64_t flush_epoch SLUICE_GUARDED_BY(mu) = 0;
  int waiters SLUICE_GUARDED_BY(mu) = 0;                  // writers waiting in the pool for this CF
  std::uint64_t waiting_bytes SLUICE_GUARDED_BY(mu) = 0;  // what they wait for

  std::atomic<std::uint64_t> charged{0}, released{0}, waits{0}, incomplete{0}, cancelled{0},
      flushes{0}, limit_waits{0}, l0_files{0}, pending_bytes{0}, memtable_bytes{0},
      active_entries{0}, immutable_memtables{0};
};

struct TenantGate::Core {
  static constexpr std::uint32_t kDirect = 1024;  // column family ids looked up lock-free

  TenantGateOptions options;
  std::shared_ptr<Admission> admission;
  std::shared_ptr<::rocksdb::WriteBufferManager> wbm;
  ::rocksdb::DB* db = nullptr;  // the wrapped DB, set once by Wrap

  std::array<std::atomic<CfState*>, kDirect> direct{};
  mutable Mutex reg_mu;
  std::map<std::uint32_t, std::unique_ptr<CfState>> cfs SLUICE_GUARDED_BY(reg_mu);

  std::atomic<std::uint64_t> epoch{0};
  std::atomic<int> total_waiters{0};

  Mutex pass_mu;  // one refresh pass at a time
  // Bytes charged and released over every column family, and when that sum last moved
  // (as seen by passes with waiters): a stall is a refresh interval in which it did not.
  std::uint64_t last_moved SLUICE_GUARDED_BY(pass_mu) = 0;
  std::int64_t last_moved_ns SLUICE_GUARDED_BY(pass_mu) = 0;
  Mutex worker_mu;
  std::condition_variable worker_cv;
  bool wake SLUICE_GUARDED_BY(worker_mu) = false;
  bool stop SLUICE_GUARDED_BY(worker_mu) = false;
  std::thread worker;
  std::atomic<bool> closed{false};

  // The state of column family `id`, or null when the gate does not know it.
  CfState* find(std::uint32_t id) const;
  // Every known column family (a copy of the table's pointers).
  std::vector<CfState*> all() const;
  // Registers a column family; limits by name, else `fallback`, else default_limits.
  void add(::rocksdb::ColumnFamilyHandle* handle, const TenantLimits* fallback, bool owned);

  Context context_of(const CfState& cf) const noexcept;
  // Asks RocksDB to flush `cf` unless a request is pending; true if it asked. Only with
  // options.flush_on_wait, unless `stalled` (the pass found every writer stuck).
  bool try_flush(CfState& cf, bool stalled = false);
  // A writer of `cf` is about to wait for `need` units: flush what can free them.
  void flush_for_waiter(CfState& cf, std::uint64_t need);
  // One refresh pass over every column family (see TenantGate::Refresh).
  void pass() SLUICE_EXCLUDES(pass_mu);
  // True when it gave bytes back to the pool.
  bool refresh_cf(CfState& cf, std::uint64_t pass_epoch);
  // Waiters, no flush on its way and nothing charged or released for a refresh interval:
  // flushes every column family that holds bytes (see TenantGateOptions::flush_on_wait).
  void break_stall_locked(const std::vector<CfState*>& states) SLUICE_REQUIRES(pass_mu);

  void start_worker();
  void signal();  // wakes the worker for a pass
  void stop_worker();
  void run_worker();
  // Gives back everything held and releases every waiter (at close).
  void release_all();
};

// The listener Prepare() adds to the DB's options: wakes the worker after every flush and
// compaction.
std::shared_ptr<::rocksdb::EventListener> make_gate_listener(
    std::shared_ptr<TenantGate::Core> core);

}  // namespace sluice::rocksdb_binding
