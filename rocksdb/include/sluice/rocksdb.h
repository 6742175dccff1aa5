// The RocksDB binding: every file I/O RocksDB issues goes through a Stage with its
// Context (origin by file kind and job, tenant, level), with no change to RocksDB's
// source. Attach() installs two pieces: StageFileSystem, a FileSystemWrapper that tags
// each file once at open and enforces each I/O before forwarding it, and
// ContextListener, an EventListener that opens the propagated scope of each flush and
// compaction on the thread that does its I/O. docs/rocksdb.md has the rules that decide
// an I/O's origin and tenant, and the node stage (FsOptions::node_stage) every I/O is
// enforced on after the partition's. Per I/O: one thread-local read, a Context on the
// stack, one enforce; no lock, no allocation. kCancelled proceeds (fail-open), and so
// does kRejected unless reject_as_busy (then IOStatus::Busy).
//
// Thread safety: StageFileSystem and ContextListener are safe from any number of threads
// (RocksDB's contract); file objects follow RocksDB's own (one writer per
// FSWritableFile). The Stage must outlive the file system and every file it opened.
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
