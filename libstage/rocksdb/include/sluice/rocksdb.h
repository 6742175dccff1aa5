// The RocksDB binding: every file I/O RocksDB issues goes through a sluice::Stage with
// its context (foreground read, WAL, flush, compaction by kind and level, manifest,
// info log, other; tenant; level), with no change to RocksDB's source.
//
// Two pieces, attached together by Attach():
//  - StageFileSystem, a rocksdb::FileSystemWrapper. Every file it opens is tagged once,
//    at open, from its name (WAL "*.log", "MANIFEST-*", info "LOG", table "*.sst" /
//    "*.blob", anything else "other") and, for table files it creates, from the job
//    context active on the creating thread. Each I/O then builds a Context on the stack
//    and calls Stage::enforce before forwarding to the wrapped file system.
//  - ContextListener, a rocksdb::EventListener. RocksDB runs OnFlushBegin/Completed,
//    OnCompactionBegin/Completed and OnSubcompactionBegin/Completed on the thread that
//    then does the job's file I/O; the listener opens a propagated scope there
//    (sluice::set_propagated) carrying the origin, tenant and levels.
//
// How one I/O's origin is decided (fixed rules, cheap, documented in docs/rocksdb.md):
//  1. WAL, MANIFEST, info LOG and other non-table files: the file's own origin, even
//     inside a flush/compaction scope (a flush's MANIFEST edit counts as manifest).
//  2. Table files inside a listener scope: the scope's origin, tenant and levels.
//  3. Table files outside any scope, on a RocksDB background thread (thread name
//     "rocksdb:high/low/bottom", e.g. subcompaction helpers or output verification):
//     the context the file was created with when this file system created it (exact for
//     output verification), otherwise inferred from the thread's pool and the file's IO
//     priority (flush: high pool or IO_HIGH; compaction: low/bottom pool or IO_LOW,
//     origin "compaction" since the levels are unknown). With infer_background off such
//     bytes get origin "unknown" (that is what the accuracy test measures).
//  4. Table files outside any scope on other threads: reads are "foreground" (Get,
//     MultiGet, iterators), carrying the level the file was created at when known;
//     writes are classified by the file's IO priority as in 3, else "other".
//
// Tenant: TenantMode::kDbInstance gives every I/O of the DB the tenant given at attach.
// TenantMode::kColumnFamily gives flush/compaction I/O the tenant of the job's column
// family (cf_tenants by name, else cf_id_tenant_base + cf id), later reads of a table
// file the tenant of the job that created it (when created by this process, or learnt
// with StageFileSystem::LearnLiveFiles after DB::Open), and everything not attributable
// to one column family (WAL, MANIFEST, LOG) db_tenant.
//
// Hot path: per I/O one thread-local read of the propagated scope, a Context on the
// stack, Stage::enforce; no lock, no allocation. Locks are taken only when files are
// opened or deleted (the file-number -> creation-context table).
//
// Two levels (FsOptions::node_stage): each I/O is enforced on the file system's own stage
// (the partition's: one per DB, or one per process with column families as tenants),
// then on the node stage, shared by every partition attached in the process, with the
// same Context (built once). A request the partition stage refuses with reject_as_busy
// never reaches the node stage. The node stage is per process: partitions in other
// processes (other programs, preloaded ones) do not share it; a policy dividing the
// node's budget among processes is the answer across them.
//
// Enforcement results: a request whose object returns kCancelled proceeds (fail-open);
// kRejected proceeds too unless FsOptions::reject_as_busy, then the I/O returns
// IOStatus::Busy. Data transformations are not applied (RocksDB owns the file layout).
//
// Thread safety: StageFileSystem and ContextListener are safe from any number of threads
// (RocksDB's contract for FileSystem and EventListener). The file objects follow
// RocksDB's own contracts (one writer per FSWritableFile). The Stage must outlive the
// file system and every file it opened.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/listener.h>
#include <rocksdb/options.h>

#include "sluice/context.h"
#include "sluice/stage.h"
#include "sluice/status.h"

namespace sluice::rocksdb_binding {

enum class TenantMode : std::uint8_t {
  kDbInstance,    // every I/O carries db_tenant
  kColumnFamily,  // flush/compaction and table-file I/O carry their column family's tenant
};

// Maps a column family (name, id) to a tenant id.
struct TenantConfig {
  TenantMode mode = TenantMode::kDbInstance;
  std::uint32_t db_tenant = 0;  // default 0
  // kColumnFamily: tenant by column family name; names not listed get
  // cf_id_tenant_base + cf id. Default: empty map, base 0 (tenant = cf id).
  std::map<std::string, std::uint32_t, std::less<>> cf_tenants;
  std::uint32_t cf_id_tenant_base = 0;

  std::uint32_t tenant_of(std::string_view cf_name, std::uint32_t cf_id) const;
};

struct FsOptions {
  TenantConfig tenants;
  // Classify table-file I/O on RocksDB background threads that no listener scope covers
  // (rule 3 above). Default on. Off: such bytes carry origin "unknown".
  bool infer_background = true;
  // Return IOStatus::Busy when an enforcement object rejects a request (default: proceed).
  bool reject_as_busy = false;
  // Test/diagnostic: count table-file bytes on background threads outside any scope, and
  // compute the inferred origin of scoped table I/O to count how many bytes the inference
  // (what the db_bench plugin relies on) gets right. Costs a shared relaxed atomic add
  // per table-file read/write; default off.
  bool audit_inference = false;
  // The node level: a second stage every I/O is enforced on after the file system's own
  // stage, with the same Context; shared by the partitions of one process (e.g. one
  // `prio-bucket` at the device's bandwidth, foreground before flush before compaction).
  // Null (default): one level. Must outlive the file system and its files.
  Stage* node_stage = nullptr;
};

// Diagnostic counters (monotonic, bytes of read/write data ops on table files).
struct FsCounters {
  // All zero unless FsOptions::audit_inference.
  std::uint64_t unscoped_background_bytes = 0;  // background thread, no scope
  std::uint64_t recovered_from_file_bytes = 0;  // of those, given the file's creation context
  std::uint64_t audit_agree_bytes = 0;          // scoped table I/O: inference == scope
  std::uint64_t audit_disagree_bytes = 0;
};

// The origin id used for compaction I/O whose levels are not known ("compaction").
OriginId compaction_unknown_level_origin();

class StageFileSystem : public ::rocksdb::FileSystemWrapper {
 public:
  static const char* kClassName() { return "SluiceFileSystem"; }

  // `stage` must outlive this object and all files it opens.
  StageFileSystem(const std::shared_ptr<::rocksdb::FileSystem>& base, Stage& stage,
                  FsOptions options = {});
  ~StageFileSystem() override;

  const char* Name() const override { return kClassName(); }
  Stage& stage() const noexcept { return *stage_; }
  const FsOptions& options() const noexcept { return options_; }
  FsCounters counters() const noexcept;

  ::rocksdb::IOStatus NewSequentialFile(const std::string& fname,
                                        const ::rocksdb::FileOptions& file_opts,
                                        std::unique_ptr<::rocksdb::FSSequentialFile>* result,
                                        ::rocksdb::IODebugContext* dbg) override;
  ::rocksdb::IOStatus NewRandomAccessFile(const std::string& fname,
                                          const ::rocksdb::FileOptions& file_opts,
                                          std::unique_ptr<::rocksdb::FSRandomAccessFile>* result,
                                          ::rocksdb::IODebugContext* dbg) override;
  ::rocksdb::IOStatus NewWritableFile(const std::string& fname,
                                      const ::rocksdb::FileOptions& file_opts,
                                      std::unique_ptr<::rocksdb::FSWritableFile>* result,
                                      ::rocksdb::IODebugContext* dbg) override;
  ::rocksdb::IOStatus ReopenWritableFile(const std::string& fname,
                                         const ::rocksdb::FileOptions& file_opts,
                                         std::unique_ptr<::rocksdb::FSWritableFile>* result,
                                         ::rocksdb::IODebugContext* dbg) override;
  ::rocksdb::IOStatus ReuseWritableFile(const std::string& fname, const std::string& old_fname,
                                        const ::rocksdb::FileOptions& file_opts,
                                        std::unique_ptr<::rocksdb::FSWritableFile>* result,
                                        ::rocksdb::IODebugContext* dbg) override;
  ::rocksdb::IOStatus NewRandomRWFile(const std::string& fname,
                                      const ::rocksdb::FileOptions& file_opts,
                                      std::unique_ptr<::rocksdb::FSRandomRWFile>* result,
                                      ::rocksdb::IODebugContext* dbg) override;
  // Goes through FileSystem::NewLogger, i.e. through this wrapper's NewWritableFile, so the
  // info LOG is seen (FileSystemWrapper would forward it to the base file system).
  ::rocksdb::IOStatus NewLogger(const std::string& fname, const ::rocksdb::IOOptions& io_opts,
                                std::shared_ptr<::rocksdb::Logger>* result,
                                ::rocksdb::IODebugContext* dbg) override;
  ::rocksdb::IOStatus DeleteFile(const std::string& fname, const ::rocksdb::IOOptions& options,
                                 ::rocksdb::IODebugContext* dbg) override;

  // Records the tenant (by TenantConfig, from the column family) and level of every live
  // table file of the given column families (empty: the default one), so that I/O
  // outside any scope on files that existed before this process opened the DB
  // (foreground reads, mostly) carries them too; files created later are tagged as they
  // are created. Call after DB::Open; applies to files already open as well. Returns the
  // number of files learnt. Thread-safe.
  std::size_t LearnLiveFiles(::rocksdb::DB& db,
                             const std::vector<::rocksdb::ColumnFamilyHandle*>& cfs = {});

  struct FileTag;  // what is fixed about a file at open (defined in the .cc)
  struct Shared;   // counters and the creation-context table

 private:
  FileTag tag_for(const std::string& fname, bool creating) const;

  Stage* stage_;
  FsOptions options_;
  std::shared_ptr<Shared> shared_;
};

// Sets the propagated context on the job's own thread for flushes, compactions and
// subcompactions. Holds no reference to any stage: it only talks to sluice's
// thread-local propagation, so one listener serves any number of file systems.
class ContextListener : public ::rocksdb::EventListener {
 public:
  static const char* kClassName() { return "SluiceContextListener"; }
  explicit ContextListener(TenantConfig tenants = {}) : tenants_(std::move(tenants)) {}
  const char* Name() const override { return kClassName(); }

  void OnFlushBegin(::rocksdb::DB* db, const ::rocksdb::FlushJobInfo& info) override;
  void OnFlushCompleted(::rocksdb::DB* db, const ::rocksdb::FlushJobInfo& info) override;
  void OnCompactionBegin(::rocksdb::DB* db, const ::rocksdb::CompactionJobInfo& info) override;
  void OnCompactionCompleted(::rocksdb::DB* db, const ::rocksdb::CompactionJobInfo& info) override;
  void OnSubcompactionBegin(const ::rocksdb::SubcompactionJobInfo& info) override;
  void OnSubcompactionCompleted(const ::rocksdb::SubcompactionJobInfo& info) override;

  // The origin of a compaction from base input level to output level:
  // 0->0 compaction_L0_L0, 0->n compaction_L0_L1, otherwise compaction_LN.
  static OriginId compaction_origin(int base_input_level, int output_level) noexcept;

 private:
  TenantConfig tenants_;
};

struct AttachOptions {
  TenantConfig tenants;
  bool infer_background = true;  // see FsOptions
  bool reject_as_busy = false;   // see FsOptions
  bool audit_inference = false;  // see FsOptions
  Stage* node_stage = nullptr;   // see FsOptions; must not be `stage` itself
  // The file system to wrap. Null (default): the one behind options.env at attach time.
  std::shared_ptr<::rocksdb::FileSystem> base;
};

// What Attach created. Keep it alive for as long as the DB is open (the options hold a
// raw Env pointer into it).
struct Binding {
  std::shared_ptr<StageFileSystem> fs;
  std::shared_ptr<::rocksdb::Env> env;  // NewCompositeEnv(fs)
  std::shared_ptr<ContextListener> listener;
};

// Wires the binding into `options` (DBOptions or Options): options.env becomes a
// composite Env over a StageFileSystem wrapping `options.env`'s file system (or
// attach.base) and a ContextListener is appended to options.listeners. `stage` (and
// attach.node_stage) must outlive the DB. Not thread-safe with respect to other users of
// `options`.
StatusOr<Binding> Attach(::rocksdb::DBOptions& options, Stage& stage, AttachOptions attach = {});

}  // namespace sluice::rocksdb_binding
