// The preload's life cycle: initialisation from the environment, the stage and
// its control connection, fork and exit handling, logging, counters and the
// SLUICE_STATS_FILE hook. Everything here is off the hot path except the
// small out-of-line helpers enforce(), after_open() and before_close().
#include "runtime.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "sluice/control_client.h"
#include "sluice/objects/builtin.h"
#include "sluice/reserved_fd.h"
#include "sluice/stats.h"
#include "sluice/thread_annotations.h"

namespace sluice::preload {

std::atomic<void*> g_real[kSymCount];
constinit thread_local ThreadState t_state __attribute__((tls_model("initial-exec")));
constinit FdTable<kFdTableSize> g_fds;
std::atomic<Stage*> g_stage{nullptr};
bool g_has_defaults = false;
OriginId g_origin = origin::kUnknown;
bool g_has_tenant = false;
std::uint32_t g_tenant = 0;
bool g_tally = false;
constinit PthreadMutex g_shards_mu;

namespace {

const char* const kSymNames[kSymCount] = {
#define SLUICE_SYM_NAME(name) #name,
    SLUICE_PRELOAD_SYMBOLS(SLUICE_SYM_NAME)
#undef SLUICE_SYM_NAME
};

enum State : int {
  kBoot = 0,       // not initialised yet: everything passes through
  kRunning,        // g_stage is set
  kDisabled,       // invalid configuration, or a passthrough fork child
  kChildPending,   // a fresh fork child that has not made its stage yet
  kInitializing,   // a fork child making its stage right now
  kExited,         // exit handlers ran
  kAwaitingReady,  // g_ready_stage exists; published once its first rules came, or on time
  kPublishing,     // a thread is publishing g_ready_stage (two stores)
};
std::atomic<int> g_state{kBoot};

std::atomic<int> g_log_level{static_cast<int>(LogLevel::kWarn)};
const Config* g_config = nullptr;  // immutable once set (inherited by fork children)
FdPolicy* g_policy = nullptr;
// The live process's own connection. Stopped at exit but never freed: a
// thread may still be in its wait_ready().
std::atomic<ControlClient*> g_client{nullptr};
// The stage made while waiting for the control plane's first rules: it is
// published (g_stage) on the first enforced call once ready or on time.
Stage* g_ready_stage = nullptr;  // written before g_state becomes kAwaitingReady
// When the first enforced call stops waiting (CLOCK_MONOTONIC ns; 0: no
// call waited yet), shared by every thread that arrives before readiness.
std::atomic<std::int64_t> g_ready_deadline_ns{0};
// Objects deliberately never freed, kept reachable (for LeakSanitizer): the
// stage after exit unpublished it, and in a fork child the parent's stage and
// control client (whose locks and thread belong to the parent).
Stage* volatile g_exited_stage = nullptr;
Stage* volatile g_parent_stage = nullptr;
ControlClient* volatile g_parent_client = nullptr;
bool g_stage_existed = false;  // this process had a stage (so it has stats to write)
std::string* g_stage_name = nullptr;

// Counter registry: live threads' shards plus what exited threads left. A
// ThreadState's links (prev, next) are under g_shards_mu too (runtime.h), and
// a linked ThreadState stays alive while it is held.
ThreadState* g_shards SLUICE_GUARDED_BY(g_shards_mu) = nullptr;
std::atomic<std::uint64_t> g_retired[kCountedOps][3];
pthread_key_t g_thread_key;
bool g_thread_key_ok = false;

// RAII: marks this thread as inside Sluice (its own I/O passes through). The
// same per-thread depth as InternalIoScope, so the hot path tests one word.
class Busy {
 public:
  Busy() noexcept { ++sluice::detail::t_thread_context.internal_depth; }
  ~Busy() { --sluice::detail::t_thread_context.internal_depth; }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;
};

void log_line(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void log_line(LogLevel level, const char* fmt, ...) {
  if (static_cast<int>(level) > g_log_level.load(std::memory_order_relaxed)) return;
  char buf[1024];
  int n = std::snprintf(buf, sizeof buf, "sluice: ");
  va_list ap;
  va_start(ap, fmt);
  int m = std::vsnprintf(buf + n, sizeof buf - static_cast<std::size_t>(n) - 1, fmt, ap);
  va_end(ap);
  std::size_t len = static_cast<std::size_t>(n) +
                    std::min<std::size_t>(m < 0 ? 0 : static_cast<std::size_t>(m),
                                          sizeof buf - static_cast<std::size_t>(n) - 2);
  buf[len++] = '\n';
  int saved = errno;
  // The raw syscall: never enforced, works before and after everything.
  (void)::syscall(SYS_write, 2, buf, len);
  errno = saved;
}

void fold_locked(const ThreadState& ts, PreloadTotals& out) SLUICE_REQUIRES(g_shards_mu) {
  for (int i = 0; i < kCountedOps; ++i) {
    out[i].calls += ts.ops[i].calls.load(std::memory_order_relaxed);
    out[i].bytes += ts.ops[i].bytes.load(std::memory_order_relaxed);
    out[i].errors += ts.ops[i].errors.load(std::memory_order_relaxed);
  }
}

void retire_locked(ThreadState& ts) SLUICE_REQUIRES(g_shards_mu) {
  for (int i = 0; i < kCountedOps; ++i) {
    g_retired[i][0].fetch_add(ts.ops[i].calls.load(std::memory_order_relaxed),
                              std::memory_order_relaxed);
    g_retired[i][1].fetch_add(ts.ops[i].bytes.load(std::memory_order_relaxed),
                              std::memory_order_relaxed);
    g_retired[i][2].fetch_add(ts.ops[i].errors.load(std::memory_order_relaxed),
                              std::memory_order_relaxed);
  }
}

// pthread key destructor: the thread is exiting; fold its shard into the
// globals and unlink it before its TLS block goes away.
void on_thread_exit(void* p) {
  auto* ts = static_cast<ThreadState*>(p);
  PthreadMutexLock lock(g_shards_mu);
  if (ts->registered) {
    retire_locked(*ts);
    if (ts->prev != nullptr)
      ts->prev->next = ts->next;
    else
      g_shards = ts->next;
    if (ts->next != nullptr) ts->next->prev = ts->prev;
    ts->registered = false;
  }
  ts->exiting = true;
}

const char* op_key(int i) {
  static const char* const kNames[kCountedOps] = {"read", "write", "open", "close", "sync"};
  return kNames[i];
}

// Creates the stage (and its control connection) named `name` and publishes
// it. On a configuration error: one line on stderr, and the process runs
// unenforced.
void start_stage(const std::string& name) noexcept {
  Busy busy;
  InternalIoScope internal;
  try {
    const Config& cfg = *g_config;
    StageOptions options;
    options.name = name;
    options.labels["binding"] = "preload";
    options.labels["pid"] = std::to_string(::getpid());
    options.labels["comm"] = program_invocation_short_name;
    sluice::objects::register_builtin();
    StatusOr<std::unique_ptr<Stage>> stage =
        cfg.rules_path.empty() ? Stage::create(std::move(options))
                               : Stage::from_rules_file(cfg.rules_path, std::move(options));
    if (!stage.is_ok()) {
      if (cfg.rules_path.empty()) {
        log_line(LogLevel::kError, "cannot create stage '%s': %s; running unenforced", name.c_str(),
                 stage.status().message().c_str());
      } else {
        // The stage's message names the file already; say it once.
        std::string why = stage.status().message();
        std::string named = cfg.rules_path + ": ";
        if (why.rfind(named, 0) == 0) why.erase(0, named.size());
        log_line(LogLevel::kError, "SLUICE_RULES=%s: %s; running unenforced",
                 cfg.rules_path.c_str(), why.c_str());
      }
      g_state.store(kDisabled, std::memory_order_release);
      return;
    }
    if (!cfg.socket_path.empty()) {
      ControlClientOptions copts;
      copts.socket_path = cfg.socket_path;
      auto client = ControlClient::start(**stage, std::move(copts));
      if (!client.is_ok()) {
        log_line(LogLevel::kError, "SLUICE_SOCKET=%s: %s; running unenforced",
                 cfg.socket_path.c_str(), client.status().message().c_str());
        g_state.store(kDisabled, std::memory_order_release);
        return;
      }
      g_client.store(client->release(), std::memory_order_release);
    }
    delete g_stage_name;
    g_stage_name = new std::string(name);
    g_stage_existed = true;
    Stage* st = stage->release();
    if (!cfg.socket_path.empty() && cfg.ready_ms > 0) {
      // Published by the first enforced call, once the control plane's first
      // rules came (or SLUICE_READY_MS passed): see await_ready().
      g_ready_stage = st;
      g_ready_deadline_ns.store(0, std::memory_order_relaxed);
      g_state.store(kAwaitingReady, std::memory_order_release);
    } else {
      g_stage.store(st, std::memory_order_release);
      g_state.store(kRunning, std::memory_order_release);
    }
    log_line(LogLevel::kInfo, "stage '%s' running (rules: %s, control plane: %s)", name.c_str(),
             cfg.rules_path.empty() ? "none" : cfg.rules_path.c_str(),
             cfg.socket_path.empty() ? "none" : cfg.socket_path.c_str());
  } catch (const std::exception& e) {
    log_line(LogLevel::kError, "cannot start stage '%s': %s; running unenforced", name.c_str(),
             e.what());
    g_state.store(kDisabled, std::memory_order_release);
  } catch (...) {
    g_state.store(kDisabled, std::memory_order_release);
  }
}

std::string stats_path(const std::string& pattern) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      out += std::to_string(::getpid());
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

void write_stats_file(Stage* stage) {
  const Config& cfg = *g_config;
  nlohmann::json j;
  j["pid"] = ::getpid();
  j["stage"] = g_stage_name != nullptr ? *g_stage_name : "";
  nlohmann::json pre = nlohmann::json::object();
  PreloadTotals totals = collect_totals();
  for (int i = 0; i < kCountedOps; ++i) {
    pre[op_key(i)] = {
        {"calls", totals[i].calls}, {"bytes", totals[i].bytes}, {"errors", totals[i].errors}};
  }
  j["preload"] = std::move(pre);
  if (stage != nullptr) j["stats"] = stage->collect();
  std::string text = j.dump() + "\n";
  std::string path = stats_path(cfg.stats_file);
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  std::size_t off = 0;
  while (ok && off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) off += static_cast<std::size_t>(n);
  }
  if (fd >= 0) ok = (::close(fd) == 0) && ok;
  if (ok) ok = ::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    log_line(LogLevel::kWarn, "SLUICE_STATS_FILE=%s: cannot write %s: %s", cfg.stats_file.c_str(),
             path.c_str(), std::strerror(errno));
  }
}

void on_process_exit() {
  Busy busy;
  InternalIoScope internal;
  int saved = errno;
  // Nothing is published after this (a thread publishing the stage that
  // waited for its first rules finishes first: two stores).
  int state = g_state.load(std::memory_order_acquire);
  for (;;) {
    if (state == kPublishing) {
      sched_yield();
      state = g_state.load(std::memory_order_acquire);
    } else if (g_state.compare_exchange_weak(state, kExited, std::memory_order_acq_rel)) {
      break;
    }
  }
  Stage* st = g_stage.exchange(nullptr, std::memory_order_acq_rel);
  if (st == nullptr && state == kAwaitingReady) st = g_ready_stage;
  g_exited_stage = st;  // never freed (a thread may still be inside it); kept reachable
  if (ControlClient* c = g_client.load(std::memory_order_acquire)) {
    c->stop();  // closes the connection, joins its thread; never freed (see g_client)
  }
  if (g_stage_existed && g_config != nullptr && !g_config->stats_file.empty()) {
    try {
      write_stats_file(st);
    } catch (const std::exception& e) {
      log_line(LogLevel::kWarn, "SLUICE_STATS_FILE: %s", e.what());
    }
  }
  if (st != nullptr) st->shutdown();  // wakes any thread still waiting in an object
  errno = saved;
}

// The registry's lock is held across fork: taken in prepare, given back in
// the parent and in the child (whose only thread is the forking one).
// pthread_atfork pairs the handlers; the analysis checks each against its
// contract, so the child's resets of the registry count as under the lock.
void atfork_prepare() SLUICE_ACQUIRE(g_shards_mu) {
  g_shards_mu.lock();
}
void atfork_parent() SLUICE_RELEASE(g_shards_mu) {
  g_shards_mu.unlock();
}
void atfork_child() SLUICE_RELEASE(g_shards_mu) {
  // Only this thread exists now. The parent's stage and connection belong to
  // the parent: forget them (never touch their locks or threads).
  g_shards = nullptr;
  for (auto& op : g_retired) {
    for (auto& v : op) v.store(0, std::memory_order_relaxed);
  }
  ThreadState& ts = t_state;
  ts.registered = false;
  ts.next = ts.prev = nullptr;
  for (auto& op : ts.ops) {
    op.calls.store(0, std::memory_order_relaxed);
    op.bytes.store(0, std::memory_order_relaxed);
    op.errors.store(0, std::memory_order_relaxed);
  }
  g_shards_mu.unlock();
  // The parent's; its thread does not exist here.
  g_parent_client = g_client.exchange(nullptr, std::memory_order_relaxed);
  // The parent's connection and board, copied into this process, are never
  // used here: closed, so the daemon sees the parent's connection end with
  // the parent, and their numbers are the child's again.
  close_reserved_fds_in_child();
  g_stage_existed = false;
  g_ready_deadline_ns.store(0, std::memory_order_relaxed);
  int state = g_state.load(std::memory_order_acquire);
  if (state == kRunning || state == kInitializing || state == kChildPending ||
      state == kAwaitingReady || state == kPublishing) {
    g_parent_stage = g_stage.exchange(nullptr, std::memory_order_acq_rel);
    if (g_parent_stage == nullptr) g_parent_stage = g_ready_stage;
    bool fresh = g_config != nullptr && g_config->fork_mode == ForkMode::kFresh;
    g_state.store(fresh ? kChildPending : kDisabled, std::memory_order_release);
  }
}

}  // namespace

PreloadTotals collect_totals() {
  PreloadTotals t{};
  PthreadMutexLock lock(g_shards_mu);
  for (int i = 0; i < kCountedOps; ++i) {
    t[i].calls += g_retired[i][0].load(std::memory_order_relaxed);
    t[i].bytes += g_retired[i][1].load(std::memory_order_relaxed);
    t[i].errors += g_retired[i][2].load(std::memory_order_relaxed);
  }
  for (ThreadState* ts = g_shards; ts != nullptr; ts = ts->next) fold_locked(*ts, t);
  return t;
}

void* resolve_real(Sym s) noexcept {
  ThreadState& ts = t_state;
  if (ts.resolving) return nullptr;
  ts.resolving = true;
  int saved = errno;
  void* p = ::dlsym(RTLD_NEXT, kSymNames[s]);
  errno = saved;
  ts.resolving = false;
  if (p != nullptr) g_real[s].store(p, std::memory_order_relaxed);
  return p;
}

void resolve_all_real() noexcept {
  for (int s = 0; s < kSymCount; ++s) {
    if (g_real[s].load(std::memory_order_relaxed) == nullptr) resolve_real(static_cast<Sym>(s));
  }
}

void register_thread() noexcept {
  ThreadState& ts = t_state;
  Busy busy;  // pthread_setspecific may allocate
  {
    PthreadMutexLock lock(g_shards_mu);
    ts.prev = nullptr;
    ts.next = g_shards;
    if (g_shards != nullptr) g_shards->prev = &ts;
    g_shards = &ts;
    ts.registered = true;
  }
  if (g_thread_key_ok) pthread_setspecific(g_thread_key, &ts);
}

void count_unregistered(CountedOp op, long long n) noexcept {
  auto& g = g_retired[static_cast<int>(op)];
  g[0].fetch_add(1, std::memory_order_relaxed);
  if (n >= 0) {
    g[1].fetch_add(static_cast<std::uint64_t>(n), std::memory_order_relaxed);
  } else {
    g[2].fetch_add(1, std::memory_order_relaxed);
  }
}

namespace {

std::int64_t monotonic_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// The first enforced call(s) while the stage awaits the control plane's first
// rules: wait for them up to SLUICE_READY_MS from the first such call (the
// client gives up at once when no daemon is there), then publish the stage
// either way (fail-open) so that no later call ever waits for this again.
Stage* await_ready() noexcept {
  const int saved = errno;
  const std::int64_t now = monotonic_ns();
  std::int64_t deadline = g_ready_deadline_ns.load(std::memory_order_acquire);
  if (deadline == 0) {
    const std::int64_t want = now + static_cast<std::int64_t>(g_config->ready_ms) * 1'000'000;
    deadline = g_ready_deadline_ns.compare_exchange_strong(deadline, want) ? want : deadline;
  }
  ControlClient* client = g_client.load(std::memory_order_acquire);
  if (client != nullptr && deadline > now) {
    try {
      (void)client->wait_ready(std::chrono::milliseconds((deadline - now + 999'999) / 1'000'000));
    } catch (...) {  // a failed wait only ends the wait
    }
  }
  int expected = kAwaitingReady;
  if (g_state.compare_exchange_strong(expected, kPublishing, std::memory_order_acq_rel)) {
    g_stage.store(g_ready_stage, std::memory_order_release);
    g_state.store(kRunning, std::memory_order_release);
    log_line(LogLevel::kDebug, "stage published (%s)",
             client != nullptr && client->ready() ? "control plane's first rules applied"
                                                  : "no rules from the control plane in time");
  }
  errno = saved;
  return g_stage.load(std::memory_order_acquire);
}

}  // namespace

Stage* stage_slow() noexcept {
  if (sluice::detail::t_thread_context.internal_depth != 0) return nullptr;
  int state = g_state.load(std::memory_order_acquire);
  if (state == kAwaitingReady) return await_ready();
  if (state != kChildPending) return nullptr;
  int expected = kChildPending;
  if (!g_state.compare_exchange_strong(expected, kInitializing, std::memory_order_acq_rel)) {
    return nullptr;
  }
  int saved = errno;
  {
    Busy busy;
    std::string base = g_stage_name != nullptr ? *g_stage_name : g_config->stage_name;
    std::string suffix = "-" + std::to_string(::getpid());
    if (base.size() + suffix.size() > kMaxStageNameLength) {
      base.resize(kMaxStageNameLength - suffix.size());
    }
    start_stage(base + suffix);
  }
  errno = saved;
  if (g_state.load(std::memory_order_acquire) == kAwaitingReady) return await_ready();
  return g_stage.load(std::memory_order_acquire);
}

void enforce_slow(Stage* stage, Op op, std::uint64_t size) noexcept {
  if (fast::try_grant(*stage, current_origin(), size)) return;
  (void)enforce(stage, op, size);
}

void settle_slow(Stage* stage, Op op, std::uint64_t size, std::uint64_t moved) noexcept {
  stage->settle(context_for(op, size), moved);
}

void charge_after(Stage* stage, Op op, long long r) noexcept {
  const std::uint64_t moved = r > 0 ? static_cast<std::uint64_t>(r) : 0;
  if (fast::try_count(*stage, current_origin(), moved)) return;
  (void)fast::enforce_rest(*stage, context_for(op, moved, r >= 0 ? 0 : context_flag::kNoWait));
}

bool iov_size(const struct iovec* iov, int cnt, std::uint64_t* size) noexcept {
  const int saved = errno;
  constexpr int kChunk = 64;  // 1 KiB of stack per syscall
  struct iovec copy[kChunk];
  const pid_t self = ::getpid();
  std::uint64_t total = 0;
  bool ok = true;
  for (int i = 0; ok && i < cnt; i += kChunk) {
    const int n = std::min(kChunk, cnt - i);
    const std::size_t want = static_cast<std::size_t>(n) * sizeof(struct iovec);
    struct iovec local = {copy, want};
    // Address arithmetic only: the array is read by the kernel.
    struct iovec remote = {
        reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(iov) +
                                static_cast<std::size_t>(i) * sizeof(struct iovec)),
        want};
    const ssize_t got = ::process_vm_readv(self, &local, 1, &remote, 1, 0);
    if (got != static_cast<ssize_t>(want)) {
      if (got < 0 && errno != EFAULT) {  // cannot be read this way here: assume the worst
        total = SSIZE_MAX;
        break;
      }
      ok = false;  // the kernel will refuse it too (EFAULT)
      break;
    }
    for (int k = 0; ok && k < n; ++k) {
      const std::uint64_t len = copy[k].iov_len;
      if (len > static_cast<std::uint64_t>(SSIZE_MAX)) {
        ok = false;  // EINVAL
      } else {
        total = std::min<std::uint64_t>(total + len, SSIZE_MAX);
      }
    }
  }
  errno = saved;
  *size = total;
  return ok;
}

// finish()'s uncommon cases. The stage is the one route_inline() counted on, or null once exit
// began (the correction is then moot). It is not kept across the call, so that the interposed
// function keeps no register for it: were g_stage ever another stage here, that stage's settle()
// would drop the correction (it only corrects within the snapshot this thread last enforced on).
[[gnu::noinline]] long finish_slow(CountedOp cop, Op op, std::uint64_t size, long r) noexcept {
  count(cop, r);
  const std::uint64_t moved = r > 0 ? static_cast<std::uint64_t>(r) : 0;
  if (moved != size) {
    Stage* st = g_stage.load(std::memory_order_acquire);
    if (st != nullptr) settle_slow(st, op, size, moved);
  }
  return r;
}

void after_open(int fd) noexcept {
  if (fd < 0) return;
  std::uint8_t e = g_fds.record(fd);
  if ((e & kEntrySelected) == 0) return;
  Stage* st = stage_for(fd);
  if (st == nullptr) return;
  enforce(st, Op::kOpen, 0);
  count(CountedOp::kOpen, 0);
}

void before_close(int fd) noexcept {
  // peek, not lookup: closing an fd never used through us costs no fstat.
  Stage* st = stage_for_entry(g_fds.peek(fd));
  if (st == nullptr) return;
  enforce(st, Op::kClose, 0);
  count(CountedOp::kClose, 0);
}

// Called once per process image, from a constructor that runs after libstage's
// static initialisers (init.cc).
void init_process() noexcept {
  static bool done = false;
  if (done) return;
  done = true;
  Busy busy;
  int saved = errno;
  resolve_all_real();
  // secure_getenv: nothing in a secure-execution (setuid, setgid,
  // capability) program, whose caller's environment must not steer it.
  const bool secure = ::getauxval(AT_SECURE) != 0;
  auto level = parse_log_level(secure ? nullptr : ::secure_getenv("SLUICE_LOG_LEVEL"));
  if (level.is_ok()) g_log_level.store(static_cast<int>(*level), std::memory_order_relaxed);
  try {
    auto cfg = parse_config([](const char* n) -> const char* { return ::secure_getenv(n); },
                            program_invocation_short_name, ::getpid(), secure);
    if (!cfg.is_ok()) {
      log_line(LogLevel::kError, "%s; running unenforced", cfg.status().message().c_str());
      g_state.store(kDisabled, std::memory_order_release);
      errno = saved;
      return;
    }
    g_config = new Config(std::move(*cfg));
    g_tally = !g_config->stats_file.empty();
    g_policy = new FdPolicy{g_config->kinds, g_config->paths};
    if (!g_config->origin.empty()) {
      if (auto id = intern_origin(g_config->origin)) g_origin = *id;
    }
    if (g_config->tenant) {
      g_has_tenant = true;
      g_tenant = *g_config->tenant;
    }
    g_has_defaults = g_origin != origin::kUnknown || g_has_tenant;
    g_thread_key_ok = pthread_key_create(&g_thread_key, on_thread_exit) == 0;
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    g_fds.set_policy(g_policy);
    start_stage(g_config->stage_name);
    std::atexit(on_process_exit);
  } catch (...) {
    log_line(LogLevel::kError, "out of memory while initialising; running unenforced");
    g_state.store(kDisabled, std::memory_order_release);
  }
  errno = saved;
}

}  // namespace sluice::preload
