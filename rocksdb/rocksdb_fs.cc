// StageFileSystem: routes every file I/O RocksDB issues through a sluice::Stage.
// See include/sluice/rocksdb.h for the classification rules and contracts.
#include <sys/prctl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string_view>
#include <unordered_map>

#include "sluice/rocksdb.h"
#include "sluice/stage_fast.h"
#include "sluice/thread_annotations.h"

namespace sluice::rocksdb_binding {

namespace rdb = ::rocksdb;

namespace {

enum class FileKind : std::uint8_t { kTable, kWal, kManifest, kInfoLog, kOther };

std::string_view basename_of(std::string_view path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

FileKind kind_of(std::string_view path) {
  const std::string_view base = basename_of(path);
  if (ends_with(base, ".sst") || ends_with(base, ".ldb") || ends_with(base, ".blob")) {
    return FileKind::kTable;
  }
  if (ends_with(base, ".log")) return FileKind::kWal;
  if (base.starts_with("MANIFEST-")) return FileKind::kManifest;
  // "LOG", "LOG.old.<time>", and db_log_dir's "<db path>_LOG" variants.
  if (base == "LOG" || base.starts_with("LOG.old") || ends_with(base, "_LOG") ||
      base.find("_LOG.old") != std::string_view::npos) {
    return FileKind::kInfoLog;
  }
  return FileKind::kOther;
}

OriginId fixed_origin_of(FileKind kind) {
  switch (kind) {
    case FileKind::kWal:
      return origin::kWal;
    case FileKind::kManifest:
      return origin::kManifest;
    case FileKind::kInfoLog:
      return origin::kInfoLog;
    case FileKind::kOther:
      return origin::kOther;
    case FileKind::kTable:
      break;
  }
  return origin::kUnknown;
}

// Which RocksDB thread pool (if any) the calling thread belongs to, from the name the
// pool gives its threads ("rocksdb:high", "rocksdb:low", "rocksdb:bottom"); threads a
// pool thread spawns (subcompactions, output verification) inherit the name. Computed
// once per thread (one prctl), then a thread-local load.
enum class ThreadKind : std::uint8_t { kUnset = 0, kUser, kHigh, kLow, kBottom };

__attribute__((tls_model("initial-exec"))) thread_local ThreadKind t_kind = ThreadKind::kUnset;

ThreadKind thread_kind() noexcept {
  if (t_kind != ThreadKind::kUnset) [[likely]] {
    return t_kind;
  }
  char name[32] = {};
  ThreadKind k = ThreadKind::kUser;
  if (prctl(PR_GET_NAME, name, 0, 0, 0) == 0) {
    const std::string_view n(name);
    if (n.starts_with("rocksdb:high")) {
      k = ThreadKind::kHigh;
    } else if (n.starts_with("rocksdb:low")) {
      k = ThreadKind::kLow;
    } else if (n.starts_with("rocksdb:bottom")) {
      k = ThreadKind::kBottom;
    }
  }
  t_kind = k;
  return k;
}

bool is_compaction(OriginId o) noexcept {
  return o == origin::kCompactionL0L1 || o == origin::kCompactionL0L0 ||
         o == origin::kCompactionLN || o == compaction_unknown_level_origin();
}

// What the db_bench plugin can tell without a listener: the thread's pool and, for
// writes, the file's IO priority (flush outputs IO_HIGH, compaction outputs IO_LOW;
// both become IO_USER under a write stall, hence the pool as the tie breaker).
OriginId infer_background(ThreadKind tk, bool is_write, rdb::Env::IOPriority pri) noexcept {
  if (is_write) {
    if (pri == rdb::Env::IO_HIGH) return origin::kFlush;
    if (pri == rdb::Env::IO_LOW) return compaction_unknown_level_origin();
  }
  switch (tk) {
    case ThreadKind::kHigh:
      return origin::kFlush;
    case ThreadKind::kLow:
    case ThreadKind::kBottom:
      return compaction_unknown_level_origin();
    case ThreadKind::kUser:
    case ThreadKind::kUnset:
      break;
  }
  return is_write ? origin::kOther : origin::kForeground;
}

}  // namespace

OriginId compaction_unknown_level_origin() {
  static const OriginId id = intern_origin("compaction").value_or(origin::kUnknown);
  return id;
}

std::uint32_t TenantConfig::tenant_of(std::string_view cf_name, std::uint32_t cf_id) const {
  if (mode == TenantMode::kDbInstance) return db_tenant;
  if (auto it = cf_tenants.find(cf_name); it != cf_tenants.end()) return it->second;
  return cf_id_tenant_base + cf_id;
}

namespace {
// What LearnLiveFiles found out about a table file after it was opened: tenant in the
// low 32 bits, level in bits 32-39, kLearnt set once valid. Shared by the map entry and
// every open file of that path; read with one relaxed load per unscoped I/O.
using LearntSlot = std::atomic<std::uint64_t>;
constexpr std::uint64_t kLearnt = std::uint64_t{1} << 63;
}  // namespace

struct StageFileSystem::FileTag {
  FileKind kind = FileKind::kOther;
  OriginId fixed_origin = origin::kUnknown;  // non-table files
  Propagated created;                        // table files created under a scope
  std::uint32_t tenant = 0;                  // for I/O outside any scope
  std::uint8_t level = 0;                    // level the table file was created at
  std::shared_ptr<LearntSlot> learnt;        // table files
};

struct StageFileSystem::Shared {
  struct Entry {
    Propagated created;  // origin kUnknown: not created under a scope by this process
    std::shared_ptr<LearntSlot> learnt = std::make_shared<LearntSlot>(0);
  };
  Mutex mu;
  // Table file path -> what is known about it (kept until DeleteFile).
  std::unordered_map<std::string, Entry> created SLUICE_GUARDED_BY(mu);
  std::atomic<std::uint64_t> unscoped_background{0};
  std::atomic<std::uint64_t> recovered{0};
  std::atomic<std::uint64_t> agree{0};
  std::atomic<std::uint64_t> disagree{0};
};

namespace {

// Builds the Context of one I/O on one file and enforces it. Copied into each file
// object at open; all fields fixed from then on.
class Enforcer {
 public:
  Enforcer(Stage* stage, const StageFileSystem::FileTag& tag, StageFileSystem::Shared* shared,
           const FsOptions& options)
      : stage_(stage),
        node_(options.node_stage),
        tag_(tag),
        shared_(shared),
        infer_(options.infer_background),
        busy_(options.reject_as_busy),
        audit_(options.audit_inference) {}

  // Enforces one I/O; false when it must fail (rejected, with reject_as_busy): the
  // caller then returns busy(). A bool rather than an IOStatus so that the per-I/O path
  // constructs, tests and destroys no IOStatus.
  bool admit(Op op, std::uint64_t size, bool is_write = false,
             rdb::Env::IOPriority pri = rdb::Env::IO_TOTAL) const noexcept {
    Context c = make_context(op, size);
    classify(c, is_write, pri);
    const Verdict r = fast::enforce(*stage_, c);
    if (r.outcome == Outcome::kRejected && busy_) [[unlikely]]
      return false;
    if (node_ == nullptr) return true;
    const Verdict n = fast::enforce(*node_, c);  // the node level, same Context
    return n.outcome != Outcome::kRejected || !busy_;
  }
  [[gnu::cold, gnu::noinline]] static rdb::IOStatus busy() {
    return rdb::IOStatus::Busy("sluice: request rejected by the stage");
  }
  rdb::IOStatus enforce(Op op, std::uint64_t size, bool is_write = false,
                        rdb::Env::IOPriority pri = rdb::Env::IO_TOTAL) const noexcept {
    return admit(op, size, is_write, pri) ? rdb::IOStatus::OK() : busy();
  }
  // One I/O of a wrapped file: admitted, then made by `call` (the wrapped file's own
  // method); busy() instead when it must fail.
  template <typename Call>
  rdb::IOStatus gated(Call&& call, Op op, std::uint64_t size, bool is_write = false,
                      rdb::Env::IOPriority pri = rdb::Env::IO_TOTAL) const {
    if (!admit(op, size, is_write, pri)) [[unlikely]]
      return busy();
    return call();
  }

 private:
  // `c` arrives with the propagated scope's origin/tenant/levels (all zero outside one).
  void classify(Context& c, bool is_write, rdb::Env::IOPriority pri) const noexcept {
    if (tag_.kind != FileKind::kTable) {
      c.origin = tag_.fixed_origin;
      c.tenant = tag_.tenant;
      c.level = 0;
      c.level_in = 0;
      return;
    }
    const bool data = c.op == Op::kRead || c.op == Op::kWrite;
    if (c.origin != origin::kUnknown) {  // a listener (or application) scope
      if (audit_ && data) [[unlikely]] {
        const OriginId guess = infer_background(thread_kind(), is_write, pri);
        const bool ok = guess == c.origin ||
                        (guess == compaction_unknown_level_origin() && is_compaction(c.origin));
        (ok ? shared_->agree : shared_->disagree).fetch_add(c.size, std::memory_order_relaxed);
      }
      return;
    }
    c.tenant = tag_.tenant;
    c.level = tag_.level;
    c.level_in = 0;
    if (const std::uint64_t l = tag_.learnt->load(std::memory_order_relaxed); l & kLearnt) {
      c.tenant = static_cast<std::uint32_t>(l);
      c.level = static_cast<std::uint8_t>(l >> 32);
    }
    const ThreadKind tk = thread_kind();
    if (tk != ThreadKind::kUser) {  // a RocksDB background thread outside any scope
      if (audit_ && data) [[unlikely]] {
        shared_->unscoped_background.fetch_add(c.size, std::memory_order_relaxed);
      }
      if (tag_.created.origin != origin::kUnknown) {
        c.origin = tag_.created.origin;
        c.tenant = tag_.created.tenant;
        c.level = tag_.created.level;
        c.level_in = tag_.created.level_in;
        if (audit_ && data) [[unlikely]] {
          shared_->recovered.fetch_add(c.size, std::memory_order_relaxed);
        }
      } else if (infer_) {
        c.origin = infer_background(tk, is_write, pri);
        if (c.origin != origin::kFlush) c.level = 0;
      }
      return;
    }
    c.origin = infer_background(tk, is_write, pri);
  }

  Stage* stage_;
  Stage* node_;  // null: one level
  StageFileSystem::FileTag tag_;
  StageFileSystem::Shared* shared_;
  bool infer_;
  bool busy_;
  bool audit_;
};

class WritableFile final : public rdb::FSWritableFileOwnerWrapper {
 public:
  WritableFile(std::unique_ptr<rdb::FSWritableFile>&& f, const Enforcer& e)
      : FSWritableFileOwnerWrapper(std::move(f)), e_(e) {}

  rdb::IOStatus Append(const rdb::Slice& data, const rdb::IOOptions& options,
                       rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->Append(data, options, dbg); }, Op::kWrite, data.size(),
                    true, pri_);
  }
  rdb::IOStatus Append(const rdb::Slice& data, const rdb::IOOptions& options,
                       const rdb::DataVerificationInfo& info, rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->Append(data, options, info, dbg); }, Op::kWrite,
                    data.size(), true, pri_);
  }
  rdb::IOStatus PositionedAppend(const rdb::Slice& data, std::uint64_t offset,
                                 const rdb::IOOptions& options, rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->PositionedAppend(data, offset, options, dbg); },
                    Op::kWrite, data.size(), true, pri_);
  }
  rdb::IOStatus PositionedAppend(const rdb::Slice& data, std::uint64_t offset,
                                 const rdb::IOOptions& options,
                                 const rdb::DataVerificationInfo& info,
                                 rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->PositionedAppend(data, offset, options, info, dbg); },
                    Op::kWrite, data.size(), true, pri_);
  }
  rdb::IOStatus Truncate(std::uint64_t size, const rdb::IOOptions& options,
                         rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->Truncate(size, options, dbg); }, Op::kOther, 0, true,
                    pri_);
  }
  rdb::IOStatus Close(const rdb::IOOptions& options, rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->Close(options, dbg); }, Op::kClose, 0, true, pri_);
  }
  rdb::IOStatus Flush(const rdb::IOOptions& options, rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->Flush(options, dbg); }, Op::kOther, 0, true, pri_);
  }
  rdb::IOStatus Sync(const rdb::IOOptions& options, rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->Sync(options, dbg); }, Op::kSync, 0, true, pri_);
  }
  rdb::IOStatus Fsync(const rdb::IOOptions& options, rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->Fsync(options, dbg); }, Op::kSync, 0, true, pri_);
  }
  rdb::IOStatus RangeSync(std::uint64_t offset, std::uint64_t nbytes, const rdb::IOOptions& options,
                          rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->RangeSync(offset, nbytes, options, dbg); }, Op::kSync, 0,
                    true, pri_);
  }
  // FSWritableFileWrapper does not forward these (facts file): do it, and remember the
  // priority for classification.
  void SetIOPriority(rdb::Env::IOPriority pri) override {
    pri_ = pri;
    target()->SetIOPriority(pri);
  }
  rdb::Env::IOPriority GetIOPriority() override { return pri_; }

 private:
  Enforcer e_;
  rdb::Env::IOPriority pri_ = rdb::Env::IO_TOTAL;
};

class RandomAccessFile final : public rdb::FSRandomAccessFileOwnerWrapper {
 public:
  RandomAccessFile(std::unique_ptr<rdb::FSRandomAccessFile>&& f, const Enforcer& e)
      : FSRandomAccessFileOwnerWrapper(std::move(f)),
        e_(e),
        direct_io_(target()->use_direct_io()) {}

  // Fixed when the file is opened; RocksDB asks twice per read, and the stock wrapper
  // forwards each time (a virtual call into the wrapped file).
  bool use_direct_io() const override { return direct_io_; }

  rdb::IOStatus Read(std::uint64_t offset, std::size_t n, const rdb::IOOptions& options,
                     rdb::Slice* result, char* scratch, rdb::IODebugContext* dbg) const override {
    return e_.gated([&] { return target()->Read(offset, n, options, result, scratch, dbg); },
                    Op::kRead, n);
  }
  rdb::IOStatus MultiRead(rdb::FSReadRequest* reqs, std::size_t num_reqs,
                          const rdb::IOOptions& options, rdb::IODebugContext* dbg) override {
    for (std::size_t i = 0; i < num_reqs; ++i) {
      if (!e_.admit(Op::kRead, reqs[i].len)) [[unlikely]]
        return Enforcer::busy();
    }
    return target()->MultiRead(reqs, num_reqs, options, dbg);
  }
  // Readahead: device reads without bytes returned; counted as "other" with its size so
  // that read-byte totals stay comparable with RocksDB's own counters.
  rdb::IOStatus Prefetch(std::uint64_t offset, std::size_t n, const rdb::IOOptions& options,
                         rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->Prefetch(offset, n, options, dbg); }, Op::kOther, n);
  }
  rdb::IOStatus ReadAsync(rdb::FSReadRequest& req, const rdb::IOOptions& opts,
                          std::function<void(const rdb::FSReadRequest&, void*)> cb, void* cb_arg,
                          void** io_handle, rdb::IOHandleDeleter* del_fn,
                          rdb::IODebugContext* dbg) override {
    return e_.gated(
        [&] {
          return target()->ReadAsync(req, opts, std::move(cb), cb_arg, io_handle, del_fn, dbg);
        },
        Op::kRead, req.len);
  }

 private:
  Enforcer e_;
  bool direct_io_;
};

class SequentialFile final : public rdb::FSSequentialFileOwnerWrapper {
 public:
  SequentialFile(std::unique_ptr<rdb::FSSequentialFile>&& f, const Enforcer& e)
      : FSSequentialFileOwnerWrapper(std::move(f)), e_(e) {}

  // Sequential files (WAL and MANIFEST replay, CURRENT, OPTIONS) are read in large
  // fixed-size requests that mostly come back short at the end of the file: charged
  // after the read, with the bytes actually read (a rejection cannot undo a read that
  // moved the file position, so it is ignored here).
  rdb::IOStatus Read(std::size_t n, const rdb::IOOptions& options, rdb::Slice* result,
                     char* scratch, rdb::IODebugContext* dbg) override {
    auto s = target()->Read(n, options, result, scratch, dbg);
    (void)e_.admit(Op::kRead, s.ok() ? result->size() : 0);
    return s;
  }
  rdb::IOStatus PositionedRead(std::uint64_t offset, std::size_t n, const rdb::IOOptions& options,
                               rdb::Slice* result, char* scratch,
                               rdb::IODebugContext* dbg) override {
    auto s = target()->PositionedRead(offset, n, options, result, scratch, dbg);
    (void)e_.admit(Op::kRead, s.ok() ? result->size() : 0);
    return s;
  }

 private:
  Enforcer e_;
};

class RandomRWFile final : public rdb::FSRandomRWFileOwnerWrapper {
 public:
  RandomRWFile(std::unique_ptr<rdb::FSRandomRWFile>&& f, const Enforcer& e)
      : FSRandomRWFileOwnerWrapper(std::move(f)), e_(e) {}

  rdb::IOStatus Write(std::uint64_t offset, const rdb::Slice& data, const rdb::IOOptions& options,
                      rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->Write(offset, data, options, dbg); }, Op::kWrite,
                    data.size(), true);
  }
  rdb::IOStatus Read(std::uint64_t offset, std::size_t n, const rdb::IOOptions& options,
                     rdb::Slice* result, char* scratch, rdb::IODebugContext* dbg) const override {
    return e_.gated([&] { return target()->Read(offset, n, options, result, scratch, dbg); },
                    Op::kRead, n);
  }
  rdb::IOStatus Flush(const rdb::IOOptions& options, rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->Flush(options, dbg); }, Op::kOther, 0, true);
  }
  rdb::IOStatus Sync(const rdb::IOOptions& options, rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->Sync(options, dbg); }, Op::kSync, 0, true);
  }
  rdb::IOStatus Fsync(const rdb::IOOptions& options, rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->Fsync(options, dbg); }, Op::kSync, 0, true);
  }
  rdb::IOStatus Close(const rdb::IOOptions& options, rdb::IODebugContext* dbg) override {
    return e_.gated([&] { return target()->Close(options, dbg); }, Op::kClose, 0, true);
  }

 private:
  Enforcer e_;
};

}  // namespace

StageFileSystem::StageFileSystem(const std::shared_ptr<rdb::FileSystem>& base, Stage& stage,
                                 FsOptions options)
    : FileSystemWrapper(base ? base : rdb::FileSystem::Default()),
      stage_(&stage),
      options_(std::move(options)),
      shared_(std::make_shared<Shared>()) {
  (void)compaction_unknown_level_origin();  // intern before the first I/O
}

StageFileSystem::~StageFileSystem() = default;

FsCounters StageFileSystem::counters() const noexcept {
  FsCounters c;
  c.unscoped_background_bytes = shared_->unscoped_background.load(std::memory_order_relaxed);
  c.recovered_from_file_bytes = shared_->recovered.load(std::memory_order_relaxed);
  c.audit_agree_bytes = shared_->agree.load(std::memory_order_relaxed);
  c.audit_disagree_bytes = shared_->disagree.load(std::memory_order_relaxed);
  return c;
}

StageFileSystem::FileTag StageFileSystem::tag_for(const std::string& fname, bool creating) const {
  FileTag tag;
  tag.kind = kind_of(fname);
  tag.fixed_origin = fixed_origin_of(tag.kind);
  tag.tenant = options_.tenants.db_tenant;
  if (tag.kind != FileKind::kTable) return tag;
  if (creating) {
    Shared::Entry e;  // a new file: forget whatever an earlier file of that name had
    e.created = current_propagated();
    tag.created = e.created;
    tag.learnt = e.learnt;
    MutexLock lock(shared_->mu);
    shared_->created.insert_or_assign(fname, std::move(e));
  } else {
    MutexLock lock(shared_->mu);
    const Shared::Entry& e = shared_->created[fname];
    tag.created = e.created;
    tag.learnt = e.learnt;
  }
  if (tag.created.origin != origin::kUnknown) {
    tag.tenant = tag.created.tenant;
    tag.level = tag.created.level;
  }
  return tag;
}

std::size_t StageFileSystem::LearnLiveFiles(rdb::DB& db,
                                            const std::vector<rdb::ColumnFamilyHandle*>& cfs) {
  std::vector<rdb::ColumnFamilyHandle*> handles = cfs;
  if (handles.empty()) handles.push_back(db.DefaultColumnFamily());
  std::size_t learnt = 0;
  for (rdb::ColumnFamilyHandle* h : handles) {
    if (h == nullptr) continue;
    rdb::ColumnFamilyMetaData meta;
    db.GetColumnFamilyMetaData(h, &meta);
    const std::uint64_t tenant = options_.tenants.tenant_of(h->GetName(), h->GetID());
    MutexLock lock(shared_->mu);
    for (const auto& level : meta.levels) {
      const auto lvl = static_cast<std::uint64_t>(std::clamp(level.level, 0, 255));
      for (const auto& f : level.files) {
        Shared::Entry& e = shared_->created[f.directory + "/" + f.relative_filename];
        if (e.created.origin != origin::kUnknown) continue;  // created here: knows better
        e.learnt->store(kLearnt | (lvl << 32) | tenant, std::memory_order_relaxed);
        ++learnt;
      }
    }
  }
  return learnt;
}

namespace {
// Every file a StageFileSystem opens: the open itself is enforced (Op::kOpen,
// size 0), then `open` asks the wrapped file system and the file it returns is
// wrapped so that its I/O carries the same Enforcer.
template <typename Wrapper, typename Inner, typename Open>
rdb::IOStatus open_wrapped(const Enforcer& e, bool is_write, std::unique_ptr<Inner>* result,
                           Open&& open) {
  auto s = e.enforce(Op::kOpen, 0, is_write);
  if (!s.ok()) return s;
  std::unique_ptr<Inner> inner;
  s = open(&inner);
  if (s.ok()) result->reset(new Wrapper(std::move(inner), e));
  return s;
}
}  // namespace

rdb::IOStatus StageFileSystem::NewSequentialFile(const std::string& fname,
                                                 const rdb::FileOptions& file_opts,
                                                 std::unique_ptr<rdb::FSSequentialFile>* result,
                                                 rdb::IODebugContext* dbg) {
  const Enforcer e(stage_, tag_for(fname, false), shared_.get(), options_);
  return open_wrapped<SequentialFile>(e, false, result, [&](auto* inner) {
    return target()->NewSequentialFile(fname, file_opts, inner, dbg);
  });
}

rdb::IOStatus StageFileSystem::NewRandomAccessFile(const std::string& fname,
                                                   const rdb::FileOptions& file_opts,
                                                   std::unique_ptr<rdb::FSRandomAccessFile>* result,
                                                   rdb::IODebugContext* dbg) {
  const Enforcer e(stage_, tag_for(fname, false), shared_.get(), options_);
  return open_wrapped<RandomAccessFile>(e, false, result, [&](auto* inner) {
    return target()->NewRandomAccessFile(fname, file_opts, inner, dbg);
  });
}

rdb::IOStatus StageFileSystem::NewWritableFile(const std::string& fname,
                                               const rdb::FileOptions& file_opts,
                                               std::unique_ptr<rdb::FSWritableFile>* result,
                                               rdb::IODebugContext* dbg) {
  const Enforcer e(stage_, tag_for(fname, true), shared_.get(), options_);
  return open_wrapped<WritableFile>(e, true, result, [&](auto* inner) {
    return target()->NewWritableFile(fname, file_opts, inner, dbg);
  });
}

rdb::IOStatus StageFileSystem::ReopenWritableFile(const std::string& fname,
                                                  const rdb::FileOptions& file_opts,
                                                  std::unique_ptr<rdb::FSWritableFile>* result,
                                                  rdb::IODebugContext* dbg) {
  const Enforcer e(stage_, tag_for(fname, false), shared_.get(), options_);
  return open_wrapped<WritableFile>(e, true, result, [&](auto* inner) {
    return target()->ReopenWritableFile(fname, file_opts, inner, dbg);
  });
}

rdb::IOStatus StageFileSystem::ReuseWritableFile(const std::string& fname,
                                                 const std::string& old_fname,
                                                 const rdb::FileOptions& file_opts,
                                                 std::unique_ptr<rdb::FSWritableFile>* result,
                                                 rdb::IODebugContext* dbg) {
  const Enforcer e(stage_, tag_for(fname, true), shared_.get(), options_);
  return open_wrapped<WritableFile>(e, true, result, [&](auto* inner) {
    return target()->ReuseWritableFile(fname, old_fname, file_opts, inner, dbg);
  });
}

rdb::IOStatus StageFileSystem::NewRandomRWFile(const std::string& fname,
                                               const rdb::FileOptions& file_opts,
                                               std::unique_ptr<rdb::FSRandomRWFile>* result,
                                               rdb::IODebugContext* dbg) {
  const Enforcer e(stage_, tag_for(fname, false), shared_.get(), options_);
  return open_wrapped<RandomRWFile>(e, true, result, [&](auto* inner) {
    return target()->NewRandomRWFile(fname, file_opts, inner, dbg);
  });
}

rdb::IOStatus StageFileSystem::NewLogger(const std::string& fname, const rdb::IOOptions& io_opts,
                                         std::shared_ptr<rdb::Logger>* result,
                                         rdb::IODebugContext* dbg) {
  return rdb::FileSystem::NewLogger(fname, io_opts, result, dbg);
}

rdb::IOStatus StageFileSystem::DeleteFile(const std::string& fname, const rdb::IOOptions& options,
                                          rdb::IODebugContext* dbg) {
  if (kind_of(fname) == FileKind::kTable) {
    MutexLock lock(shared_->mu);
    shared_->created.erase(fname);
  }
  return target()->DeleteFile(fname, options, dbg);
}

}  // namespace sluice::rocksdb_binding
