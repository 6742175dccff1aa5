// ContextListener and Attach: propagate RocksDB's job context onto the job's thread.
#include <array>

#include "sluice/rocksdb.h"

namespace sluice::rocksdb_binding {

namespace rdb = ::rocksdb;

namespace {

// The values each Begin replaced, restored by the matching Completed. A compaction's
// first subcompaction runs on the compaction's own thread, so scopes nest one deep;
// four levels leave room. A job-level Begin (flush or compaction) never legitimately
// nests inside another on one thread, so it first unwinds anything a failed job left
// open (RocksDB calls OnFlushCompleted only on success).
struct ScopeStack {
  std::array<Propagated, 4> saved{};
  int depth = 0;
};
thread_local ScopeStack t_stack;

void push(const Propagated& values) noexcept {
  ScopeStack& st = t_stack;
  if (st.depth < static_cast<int>(st.saved.size())) {
    st.saved[static_cast<std::size_t>(st.depth++)] = set_propagated(values);
  } else {
    set_propagated(values);  // too deep: overwrite, the outermost restore still works
  }
}

void pop() noexcept {
  ScopeStack& st = t_stack;
  if (st.depth > 0) restore_propagated(st.saved[static_cast<std::size_t>(--st.depth)]);
}

void unwind() noexcept {
  ScopeStack& st = t_stack;
  if (st.depth > 0) {
    restore_propagated(st.saved[0]);
    st.depth = 0;
  }
}

std::uint8_t level_byte(int level) noexcept {
  return level < 0 ? 0 : (level > 255 ? 255 : static_cast<std::uint8_t>(level));
}

}  // namespace

OriginId ContextListener::compaction_origin(int base_input_level, int output_level) noexcept {
  if (base_input_level == 0) {
    return output_level == 0 ? origin::kCompactionL0L0 : origin::kCompactionL0L1;
  }
  return origin::kCompactionLN;
}

void ContextListener::OnFlushBegin(rdb::DB* /*db*/, const rdb::FlushJobInfo& info) {
  unwind();
  push(Propagated{origin::kFlush, tenants_.tenant_of(info.cf_name, info.cf_id), 0, 0, 0});
}

void ContextListener::OnFlushCompleted(rdb::DB* /*db*/, const rdb::FlushJobInfo& /*info*/) {
  pop();
}

void ContextListener::OnCompactionBegin(rdb::DB* /*db*/, const rdb::CompactionJobInfo& info) {
  unwind();
  push(Propagated{compaction_origin(info.base_input_level, info.output_level),
                  tenants_.tenant_of(info.cf_name, info.cf_id), level_byte(info.output_level),
                  level_byte(info.base_input_level), 0});
}

void ContextListener::OnCompactionCompleted(rdb::DB* /*db*/,
                                            const rdb::CompactionJobInfo& /*info*/) {
  pop();
}

void ContextListener::OnSubcompactionBegin(const rdb::SubcompactionJobInfo& info) {
  push(Propagated{compaction_origin(info.base_input_level, info.output_level),
                  tenants_.tenant_of(info.cf_name, info.cf_id), level_byte(info.output_level),
                  level_byte(info.base_input_level), 0});
}

void ContextListener::OnSubcompactionCompleted(const rdb::SubcompactionJobInfo& /*info*/) {
  pop();
}

StatusOr<Binding> Attach(rdb::DBOptions& options, Stage& stage, AttachOptions attach) {
  std::shared_ptr<rdb::FileSystem> base = attach.base;
  if (!base) {
    rdb::Env* env = options.env != nullptr ? options.env : rdb::Env::Default();
    base = env->GetFileSystem();
  }
  if (!base) return Status::invalid("rocksdb attach: options.env has no file system");
  if (attach.node_stage == &stage) {
    return Status::invalid(
        "rocksdb attach: node_stage is the partition's own stage (each I/O would be enforced "
        "twice on it); give a separate node stage or none");
  }
  if (dynamic_cast<StageFileSystem*>(base.get()) != nullptr) {
    return Status::precondition("rocksdb attach: options are already attached to a stage");
  }
  FsOptions fs_options;
  fs_options.tenants = attach.tenants;
  fs_options.infer_background = attach.infer_background;
  fs_options.reject_as_busy = attach.reject_as_busy;
  fs_options.audit_inference = attach.audit_inference;
  fs_options.node_stage = attach.node_stage;

  Binding b;
  b.fs = std::make_shared<StageFileSystem>(base, stage, std::move(fs_options));
  b.env = rdb::NewCompositeEnv(b.fs);
  if (!b.env) return Status::internal("rocksdb attach: NewCompositeEnv failed");
  b.listener = std::make_shared<ContextListener>(attach.tenants);
  options.env = b.env.get();
  options.listeners.push_back(b.listener);
  return b;
}

}  // namespace sluice::rocksdb_binding
