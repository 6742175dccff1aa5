// Tenants in unmodified RocksDB: TenantGate, a StackableDB whose every mutation ends in
// Write, acquires each batch's bytes per column family from a capacity-holding object
// of the stage ("buffer-pool") for that column family's tenant before the batch is
// written, and gives back, after each flush and on a timer, what the memtables no
// longer hold; a tenant that would wait first has its memtables' flush requested. Tenants
// are column families of one DB (kColumnFamily) or DB instances (kDbInstance).
// IsolateStalls() moves RocksDB's DB-wide stall triggers out of the way and enforces
// them per column family instead. One caller's writes reach RocksDB in order; a
// cancelled acquire proceeds, a rejected one returns Busy (docs/rocksdb.md).
//
// Thread safety: TenantGate is a rocksdb::DB (any number of threads); Refresh(),
// SetBufferLimit() and statistics from any thread; Admission implementations must be
// too. The gate owns its column family handles (destroyed at Close). Stop writing before
// Close() or destroying the gate.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/utilities/stackable_db.h>
#include <rocksdb/write_buffer_manager.h>

#include "sluice/clock.h"
#include "sluice/context.h"
#include "sluice/enforcement_object.h"
#include "sluice/rocksdb.h"
#include "sluice/stage.h"
#include "sluice/status.h"

namespace sluice::rocksdb_binding {

// What one acquire did: the verdict, and how many units are now held for the caller
// (0 when nothing is: a per-request object, a cancelled or refused acquire).
struct Admitted {
  Verdict verdict;
  std::uint64_t held = 0;
};

// Where the gate takes and gives back a tenant's bytes: the pool. The production one is
// StageAdmission(stage); tests and other pools implement their own.
// acquire(ctx, n): ctx.tenant is the tenant, ctx.flags may carry context_flag::kNoWait
// (then Outcome::kWouldWait without taking anything when it would wait).
// release(ctx, n): gives back n of the units acquire() reported held for ctx.tenant.
// Both are called from any thread; release() never waits beyond a bounded section.
class Admission {
 public:
  virtual ~Admission() = default;
  virtual Admitted acquire(const Context& ctx, std::uint64_t bytes) noexcept = 0;
  virtual void release(const Context& ctx, std::uint64_t bytes) noexcept = 0;
};

// The pool is whatever object the stage's rules route the gate's contexts to
// (op write, origin `origin` of TenantGateOptions, the tenant): Stage::acquire there, the
// Holds kept per tenant. A per-request object (a token bucket) is enforced per write and
// holds nothing. `stage` must outlive the returned object.
std::shared_ptr<Admission> StageAdmission(Stage& stage);

// Limits the gate enforces on one column family (0: none).
struct TenantLimits {
  int l0_files = 0;                            // wait while L0 has at least this many files
  std::uint64_t pending_compaction_bytes = 0;  // ... or this many bytes pending compaction
};

struct StallIsolation {
  // The most memtable bytes the tenant may hold (its largest allowance, e.g. the pool's
  // capacity). 0: max_write_buffer_number is left as it is.
  std::uint64_t tenant_memtable_bytes = 0;
  // RocksDB's own triggers move to this multiple of the gate's limits (a backstop for
  // writes that bypass the gate); at least 1.
  int backstop_factor = 2;
};

// Keeps RocksDB's write controller from slowing or stopping the whole DB because of this
// column family, and returns the limits the gate enforces instead:
//  - gate: l0_files = cf.level0_stop_writes_trigger, pending_compaction_bytes =
//    cf.hard_pending_compaction_bytes_limit (0 if RocksDB's is disabled), as given;
//  - RocksDB: level0_slowdown_writes_trigger = level0_stop_writes_trigger =
//    backstop_factor * l0_files; soft = hard pending limit = backstop_factor * the gate's
//    (left 0, disabled, when it was); max_write_buffer_number at least
//    ceil(tenant_memtable_bytes / write_buffer_size) + 3 (a tenant's unflushed memtables,
//    the active one and one small one a gate flush seals, and the slowdown RocksDB
//    applies one memtable before the stop).
// Errors (nothing changed): backstop_factor < 1; a zero write_buffer_size with
// tenant_memtable_bytes set.
StatusOr<TenantLimits> IsolateStalls(::rocksdb::ColumnFamilyOptions& cf,
                                     const StallIsolation& isolation = {});

struct TenantGateOptions {
  // The pool: `admission` when set, else StageAdmission(*stage). One of them is required.
  Stage* stage = nullptr;
  std::shared_ptr<Admission> admission;
  // Tenant of each column family (kColumnFamily: by name, else cf_id_tenant_base + id)
  // or of the whole DB (kDbInstance: db_tenant).
  TenantConfig tenants;
  // The origin of the contexts the gate acquires with (op is Op::kWrite).
  OriginId origin = origin::kForeground;
  // Bytes charged per batch entry on top of its key and value: the memtable's own cost
  // of an entry (internal key trailer, lengths, skip-list node), so that the ledger
  // tracks rocksdb.cur-size-all-mem-tables.
  std::uint64_t entry_overhead = 32;
  // Ask RocksDB to flush when a tenant's acquire would wait. When false, RocksDB's own
  // flushes of full memtables give bytes back, and the gate flushes only to end a stall:
  // writers wait, no flush is on its way and no byte was charged or released over one
  // refresh interval (the pool shrank below what partly filled memtables hold). It then
  // flushes every column family whose memtable holds bytes (with refresh_interval 0, at
  // the second Refresh() that finds the writers stuck).
  bool flush_on_wait = true;
  // Open(): apply IsolateStalls to every column family, with these settings; the
  // returned limits become the column family's unless `limits` names it.
  bool isolate_stalls = true;
  StallIsolation isolation;
  // Gate limits by column family name; others get default_limits (or IsolateStalls').
  std::map<std::string, TenantLimits, std::less<>> limits;
  TenantLimits default_limits;
  // How often a background thread reconciles every ledger and re-reads the limits'
  // properties, in case a listener callback was missed. 0: no thread (call Refresh()).
  std::chrono::milliseconds refresh_interval{200};
  // kDbInstance only: a WriteBufferManager(allow_stall) of this many bytes for the DB,
  // a backstop the gate resizes with SetBufferLimit. 0: none.
  std::uint64_t write_buffer_manager_bytes = 0;
  Clock* clock = &system_clock();  // times the refresh thread
};

// One column family's state, for statistics and tests.
struct GateCfStats {
  std::string name;
  std::uint32_t cf_id = 0;
  std::uint32_t tenant = 0;
  std::uint64_t held = 0;           // units the ledger holds
  std::uint64_t charged_bytes = 0;  // bytes the pool admitted (kOk), in all
  std::uint64_t released_bytes = 0;
  std::uint64_t waits = 0;              // acquires that could not be granted at once
  std::uint64_t incomplete = 0;         // writes refused with Incomplete (no_slowdown)
  std::uint64_t cancelled = 0;          // acquires cancelled (the write proceeded)
  std::uint64_t flushes_requested = 0;  // Flush requests the gate made
  std::uint64_t limit_waits = 0;        // writes that waited for the L0 / pending limit
  bool at_limit = false;                // L0 / pending limit reached at the last read
  std::uint64_t l0_files = 0;           // at the last read
  std::uint64_t pending_compaction_bytes = 0;
  std::uint64_t memtable_bytes = 0;  // rocksdb.cur-size-all-mem-tables at the last read
};

class TenantGate : public ::rocksdb::StackableDB {
 public:
  struct Core;  // the state the gate and its listener share (defined in the .cc)

  // What Prepare() made; hand it to Wrap().
  struct Prepared {
    TenantGateOptions options;
    std::shared_ptr<Admission> admission;
    std::shared_ptr<::rocksdb::EventListener> listener;
    std::shared_ptr<::rocksdb::WriteBufferManager> write_buffer_manager;
    std::shared_ptr<Core> core;
    // Limits IsolateStalls returned, by column family name (used unless
    // options.limits names the column family).
    std::map<std::string, TenantLimits, std::less<>> cf_limits;
  };

  // Before DB::Open: appends the gate's listener to options.listeners and, with
  // write_buffer_manager_bytes, sets options.write_buffer_manager. Errors name the field.
  static StatusOr<Prepared> Prepare(::rocksdb::DBOptions& options, TenantGateOptions gate);
  // Wraps the DB opened with the prepared options (takes ownership of it and of
  // `handles`, the column families it was opened with; none: the default one, whose
  // handle the DB owns).
  static StatusOr<std::unique_ptr<TenantGate>> Wrap(
      Prepared prepared, ::rocksdb::DB* db,
      const std::vector<::rocksdb::ColumnFamilyHandle*>& handles);
  // Prepare + DB::Open(options, path, column_families) + Wrap; with isolate_stalls and
  // kColumnFamily, the column families' options are adjusted first (kDbInstance needs
  // no isolation: RocksDB's stalls stop only that DB, i.e. that tenant).
  // `handles` (out) are owned by the gate.
  static StatusOr<std::unique_ptr<TenantGate>> Open(
      ::rocksdb::DBOptions options, const std::string& path,
      std::vector<::rocksdb::ColumnFamilyDescriptor> column_families,
      std::vector<::rocksdb::ColumnFamilyHandle*>* handles, TenantGateOptions gate);

  ~TenantGate() override;

  // The write path: every mutation ends here.
  ::rocksdb::Status Write(const ::rocksdb::WriteOptions& options,
                          ::rocksdb::WriteBatch* updates) override;
  using StackableDB::Put;
  ::rocksdb::Status Put(const ::rocksdb::WriteOptions& o, ::rocksdb::ColumnFamilyHandle* cf,
                        const ::rocksdb::Slice& key, const ::rocksdb::Slice& value) override;
  ::rocksdb::Status Put(const ::rocksdb::WriteOptions& o, ::rocksdb::ColumnFamilyHandle* cf,
                        const ::rocksdb::Slice& key, const ::rocksdb::Slice& ts,
                        const ::rocksdb::Slice& value) override;
  using StackableDB::PutEntity;
  ::rocksdb::Status PutEntity(const ::rocksdb::WriteOptions& o, ::rocksdb::ColumnFamilyHandle* cf,
                              const ::rocksdb::Slice& key,
                              const ::rocksdb::WideColumns& columns) override;
  using StackableDB::Delete;
  ::rocksdb::Status Delete(const ::rocksdb::WriteOptions& o, ::rocksdb::ColumnFamilyHandle* cf,
                           const ::rocksdb::Slice& key) override;
  ::rocksdb::Status Delete(const ::rocksdb::WriteOptions& o, ::rocksdb::ColumnFamilyHandle* cf,
                           const ::rocksdb::Slice& key, const ::rocksdb::Slice& ts) override;
  using StackableDB::SingleDelete;
  ::rocksdb::Status SingleDelete(const ::rocksdb::WriteOptions& o,
                                 ::rocksdb::ColumnFamilyHandle* cf,
                                 const ::rocksdb::Slice& key) override;
  ::rocksdb::Status SingleDelete(const ::rocksdb::WriteOptions& o,
                                 ::rocksdb::ColumnFamilyHandle* cf, const ::rocksdb::Slice& key,
                                 const ::rocksdb::Slice& ts) override;
  using StackableDB::DeleteRange;
  ::rocksdb::Status DeleteRange(const ::rocksdb::WriteOptions& o, ::rocksdb::ColumnFamilyHandle* cf,
                                const ::rocksdb::Slice& begin,
                                const ::rocksdb::Slice& end) override;
  ::rocksdb::Status DeleteRange(const ::rocksdb::WriteOptions& o, ::rocksdb::ColumnFamilyHandle* cf,
                                const ::rocksdb::Slice& begin, const ::rocksdb::Slice& end,
                                const ::rocksdb::Slice& ts) override;
  using StackableDB::Merge;
  ::rocksdb::Status Merge(const ::rocksdb::WriteOptions& o, ::rocksdb::ColumnFamilyHandle* cf,
                          const ::rocksdb::Slice& key, const ::rocksdb::Slice& value) override;

  // Column families created through the gate are gated (with isolate_stalls, their
  // options adjusted first). Column families the gate does not know are written ungated.
  using StackableDB::CreateColumnFamily;
  ::rocksdb::Status CreateColumnFamily(const ::rocksdb::ColumnFamilyOptions& options,
                                       const std::string& name,
                                       ::rocksdb::ColumnFamilyHandle** handle) override;
  ::rocksdb::Status CreateColumnFamilies(
      const ::rocksdb::ColumnFamilyOptions& options, const std::vector<std::string>& names,
      std::vector<::rocksdb::ColumnFamilyHandle*>* handles) override;
  ::rocksdb::Status CreateColumnFamilies(
      const std::vector<::rocksdb::ColumnFamilyDescriptor>& column_families,
      std::vector<::rocksdb::ColumnFamilyHandle*>* handles) override;
  ::rocksdb::Status DestroyColumnFamilyHandle(::rocksdb::ColumnFamilyHandle* cf) override;
  // Stops the refresh thread, gives every held unit back, destroys the handles, closes.
  ::rocksdb::Status Close() override;

  // Reconciles every ledger with its memtables and re-reads the limits' properties now
  // (what the listener does after a flush or compaction, for every column family).
  void Refresh();
  // kDbInstance with a write-buffer manager: its size (SetBufferSize). Errors otherwise.
  Status SetBufferLimit(std::uint64_t bytes);
  std::shared_ptr<::rocksdb::WriteBufferManager> write_buffer_manager() const;

  std::vector<GateCfStats> stats() const;
  // One column family's statistics (by handle); all zero for a column family not gated.
  GateCfStats stats(::rocksdb::ColumnFamilyHandle* cf) const;

 private:
  TenantGate(::rocksdb::DB* db, std::shared_ptr<Core> core);
  // Adjusts `options` for a column family about to be created (isolate_stalls).
  StatusOr<TenantLimits> isolate(::rocksdb::ColumnFamilyOptions& options) const;
  void shutdown();

  std::shared_ptr<Core> core_;
  bool shut_ = false;
};

}  // namespace sluice::rocksdb_binding
