// libsluice_rocksdb_plugin.so: puts an unmodified db_bench (or any RocksDB program that
// takes a FileSystem URI) on a stage:
//
//   LD_PRELOAD=libsluice_rocksdb_plugin.so db_bench --fs_uri=sluice ...
//
// It registers FileSystem "sluice" and EventListener "sluice" in RocksDB's object
// library; the stage is made on first use from SLUICE_STAGE, SLUICE_RULES,
// SLUICE_SOCKET, SLUICE_TENANT and SLUICE_REPORT (docs/rocksdb.md, "db_bench"). In a
// program named db_bench, or with SLUICE_VERBOSE set, it says so when loaded and
// complains at exit when "sluice" was never asked for; other programs that merely
// inherit LD_PRELOAD stay silent.
#include <errno.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <rocksdb/utilities/object_registry.h>

#include "sluice/control_client.h"
#include "sluice/objects/builtin.h"
#include "sluice/rocksdb.h"
#include "sluice/thread_annotations.h"

namespace {

namespace rdb = ::rocksdb;
using sluice::rocksdb_binding::ContextListener;
using sluice::rocksdb_binding::FsOptions;
using sluice::rocksdb_binding::StageFileSystem;

// secure_getenv: in a setuid or otherwise secure-execution program (a db_bench
// installed setuid, an /etc/ld.so.preload install) the caller's environment does not
// choose files for it to open or write.
std::string env_or(const char* name, const char* fallback) {
  const char* v = ::secure_getenv(name);
  return (v != nullptr && *v != '\0') ? std::string(v) : std::string(fallback);
}

bool env_flag(const char* name) {
  const char* v = ::secure_getenv(name);
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

bool verbose() {
  return env_flag("SLUICE_VERBOSE") ||
         std::string(program_invocation_short_name).find("db_bench") != std::string::npos;
}

// Process-wide state. Deliberately leaked: db_bench may still do I/O from static
// destructors, so the stage must never be destroyed before the process ends.
struct PluginState {
  sluice::Mutex mu;
  sluice::Stage* stage SLUICE_GUARDED_BY(mu) = nullptr;  // set once, never freed
  std::unique_ptr<sluice::ControlClient> client SLUICE_GUARDED_BY(mu);
  bool used SLUICE_GUARDED_BY(mu) = false;
  std::uint32_t tenant SLUICE_GUARDED_BY(mu) = 0;
};

PluginState& state() {
  static auto* s = new PluginState();
  return *s;
}

// Creates the stage on first use. Returns null (with *err set) on a configuration error.
sluice::Stage* ensure_stage(std::string* err) {
  PluginState& st = state();
  sluice::MutexLock lock(st.mu);
  if (st.stage != nullptr) return st.stage;
  sluice::StageOptions so;
  so.name = env_or("SLUICE_STAGE", "db_bench");
  so.labels["app"] = "rocksdb";
  so.labels["binding"] = "db_bench-plugin";
  const std::string rules = env_or("SLUICE_RULES", "");
  sluice::objects::register_builtin();
  const std::string socket = env_or("SLUICE_SOCKET", "");
  st.tenant =
      static_cast<std::uint32_t>(std::strtoul(env_or("SLUICE_TENANT", "0").c_str(), nullptr, 10));
  auto created =
      rules.empty() ? sluice::Stage::create(so) : sluice::Stage::from_rules_file(rules, so);
  if (!created.is_ok()) {
    *err = "sluice plugin: " + created.status().to_string();
    return nullptr;
  }
  std::unique_ptr<sluice::Stage> stage = std::move(created).value();
  std::string source = rules.empty() ? "no rules (pass-through)" : "rules file " + rules;
  if (!socket.empty()) {
    sluice::ControlClientOptions co;
    co.socket_path = socket;
    auto client = sluice::ControlClient::start(*stage, co);
    if (!client.is_ok()) {
      *err = "sluice plugin: control client: " + client.status().to_string();
      return nullptr;
    }
    st.client = std::move(client).value();
    source += ", control plane at " + socket;
  }
  st.stage = stage.release();
  std::fprintf(stderr, "sluice: db_bench plugin: file system 'sluice' on stage '%s' (%s)\n",
               st.stage->name().c_str(), source.c_str());
  return st.stage;
}

rdb::FileSystem* make_fs(const std::string& /*uri*/, std::unique_ptr<rdb::FileSystem>* guard,
                         std::string* errmsg) {
  std::string err;
  sluice::Stage* stage = ensure_stage(&err);
  if (stage == nullptr) {
    std::fprintf(stderr, "%s\n", err.c_str());
    if (errmsg != nullptr) *errmsg = err;
    return nullptr;
  }
  PluginState& st = state();
  FsOptions fo;
  fo.infer_background = true;
  {
    sluice::MutexLock lock(st.mu);
    fo.tenants.db_tenant = st.tenant;
  }
  guard->reset(new StageFileSystem(rdb::FileSystem::Default(), *stage, fo));
  sluice::MutexLock lock(st.mu);
  st.used = true;
  return guard->get();
}

rdb::EventListener* make_listener(const std::string& /*uri*/,
                                  std::unique_ptr<rdb::EventListener>* guard,
                                  std::string* /*errmsg*/) {
  PluginState& st = state();
  sluice::rocksdb_binding::TenantConfig tc;
  {
    sluice::MutexLock lock(st.mu);
    tc.db_tenant = st.tenant;
  }
  guard->reset(new ContextListener(tc));
  std::fprintf(stderr, "sluice: db_bench plugin: context listener attached\n");
  return guard->get();
}

void report_at_exit() {
  PluginState& st = state();
  bool used = false;
  sluice::Stage* stage = nullptr;
  {
    sluice::MutexLock lock(st.mu);
    used = st.used;
    stage = st.stage;
  }
  // A leading newline: db_bench's progress lines end in a carriage return.
  if (!used) {
    if (!verbose()) return;
    std::fprintf(stderr,
                 "\nsluice: db_bench plugin was loaded but file system 'sluice' was never "
                 "created: nothing went through a stage (check --fs_uri=sluice)\n");
    return;
  }
  if (env_flag("SLUICE_REPORT") && stage != nullptr) {
    nlohmann::json j = stage->collect();
    std::fprintf(stderr, "\nsluice: stats %s\n", j.dump().c_str());
  }
}

[[maybe_unused]] const int kRegistered = [] {
  auto lib = rdb::ObjectLibrary::Default();
  lib->AddFactory<rdb::FileSystem>("sluice", make_fs);
  lib->AddFactory<rdb::EventListener>("sluice", make_listener);
  std::atexit(report_at_exit);
  if (verbose()) std::fprintf(stderr, "sluice: db_bench plugin loaded (use --fs_uri=sluice)\n");
  return 1;
}();

}  // namespace
