// The database of the delta-fair experiments (examples/delta-fair): one RocksDB DB with
// one column family per tenant, opened either as is ("plain": the caller's options, e.g.
// a DB-wide WriteBufferManager) or behind the RocksDB tenant gate ("gated": every put
// takes its bytes from the stage's write-buffer pool first, see sluice/rocksdb_tenants.h).
// Puts go to a tenant's column family without the WAL; reads (get, multi_get) go to the
// DB as it is (the gate passes reads through).
//
// Thread safety: put(), get() and multi_get() from any number of threads (RocksDB's
// contract); flush(), memtable_bytes(),
// int_property() and counters() from any thread; open() and close() from one thread with
// no put() running.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <nlohmann/json.hpp>

#include "sluice/stage.h"
#include "sluice/status.h"

namespace sluice::examples::delta_fair {

class TenantDb {
 public:
  struct TenantCf {
    std::string cf;      // column family name
    std::uint32_t id{};  // tenant id (1-based, distinct)
  };
  struct Config {
    std::string path;
    bool gated = false;
    Stage* stage = nullptr;  // gated: the stage whose rules route puts to the pool
    std::vector<TenantCf> tenants;
    rocksdb::Options options;  // for the DB and every column family
    // Changes one tenant's column family options before the DB opens (its own block
    // cache, for example); may be empty.
    std::function<void(std::uint32_t tenant, rocksdb::ColumnFamilyOptions&)> cf_options;
    // gated: the most memtable bytes one tenant may hold (the pool's capacity), for the
    // gate's settings of RocksDB's stall triggers.
    std::uint64_t buffer_bytes = 0;
    // gated: the pool's unit of allocation. 0: the gate charges every put in the pool
    // (StageAdmission, and a flush when a tenant would wait); > 0: whole segments of this
    // many bytes (SegmentAdmission in the .cc).
    std::uint64_t segment_bytes = 0;
    // gated: bytes the gate charges per put beyond its key and value.
    std::uint64_t entry_overhead = 32;
    // Flush one column family's memtables one job at a time (see SerialFlush in the .cc).
    bool serial_flush = true;
  };

  // Opens (creating) the DB with one column family per tenant. The error names the path
  // or what is missing ("this build has no tenant gate" for a gated DB without one).
  static StatusOr<std::unique_ptr<TenantDb>> open(Config config);
  ~TenantDb();
  TenantDb(const TenantDb&) = delete;
  TenantDb& operator=(const TenantDb&) = delete;

  // Writes key -> value in the tenant's column family (disableWAL), through the gate
  // when gated: waits while the pool makes this tenant wait.
  rocksdb::Status put(std::uint32_t tenant, const rocksdb::Slice& key, const rocksdb::Slice& value);
  // Reads key from the tenant's column family (NotFound when absent).
  rocksdb::Status get(std::uint32_t tenant, const rocksdb::Slice& key, std::string* value);
  // Reads key into a PinnableSlice (a block cache hit stays pinned while `value` holds
  // it). cache_only: from the block cache alone (Incomplete when it is not there).
  rocksdb::Status get_pinned(std::uint32_t tenant, const rocksdb::Slice& key,
                             rocksdb::PinnableSlice* value, bool cache_only);
  // Reads keys from the tenant's column family in one MultiGet; statuses[i] is key i's.
  void multi_get(std::uint32_t tenant, const std::vector<rocksdb::Slice>& keys,
                 std::vector<rocksdb::PinnableSlice>* values,
                 std::vector<rocksdb::Status>* statuses);
  // Flushes the tenant's memtables and waits for the flush.
  rocksdb::Status flush(std::uint32_t tenant);
  // Sets a mutable option of the tenant's column family (DB::SetOptions).
  rocksdb::Status set_option(std::uint32_t tenant, const std::string& name,
                             const std::string& value);
  // The tenant's "rocksdb.cur-size-all-mem-tables" (takes the DB mutex: sample it).
  std::uint64_t memtable_bytes(std::uint32_t tenant);
  // An integer property of the tenant's column family, -1 when RocksDB does not know it.
  std::int64_t int_property(std::uint32_t tenant, const char* name);
  // The gate's counters when gated (null otherwise).
  nlohmann::json counters() const;
  // Waits for background work to stop and closes the DB.
  void close();

  // Whether this build has the tenant gate.
  static bool has_gate() noexcept;

 private:
  struct Gate;
  class SerialFlush;
  class SegmentAdmission;
  TenantDb() = default;
  rocksdb::ColumnFamilyHandle* cf_of(std::uint32_t tenant) const;

  Config config_;
  rocksdb::DB* base_ = nullptr;    // plain: the DB (owned)
  rocksdb::DB* writer_ = nullptr;  // base_, or the gate (which owns the DB and handles)
  std::unique_ptr<Gate> gate_;
  std::shared_ptr<SerialFlush> serial_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;    // [0] default, then tenants
  std::vector<rocksdb::ColumnFamilyHandle*> by_tenant_;  // index: tenant id
  bool closed_ = false;
};

}  // namespace sluice::examples::delta_fair
