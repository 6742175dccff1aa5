// The preload's process-wide state and the inline hot path shared by the
// interposed functions. See preload.h for the design and thread-safety
// contract.
#pragma once

#include <pthread.h>
#include <sys/uio.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>

#include "preload.h"
#include "sluice/context.h"
#include "sluice/stage.h"
#include "sluice/stage_fast.h"
#include "sluice/thread_annotations.h"

namespace sluice::preload {

// Everything declared here is defined in this shared object: hidden, so that
// the globals the hot path reads are addressed directly, not through the GOT.
#pragma GCC visibility push(hidden)

// ---------------------------------------------------------------------------
// The next definitions of the interposed symbols (libc's, or another
// preloaded library's), resolved with dlsym(RTLD_NEXT).
// (clang-format 14 does not settle on one layout for this list.)
// clang-format off
#define SLUICE_PRELOAD_SYMBOLS(X) \
  X(read) X(write) X(pread) X(pwrite) X(pread64) X(pwrite64) X(readv) X(writev)                   \
  X(preadv) X(pwritev) X(preadv64) X(pwritev64) X(preadv2) X(pwritev2) X(preadv64v2)              \
  X(pwritev64v2) X(fread) X(fwrite) X(fread_unlocked) X(fwrite_unlocked) X(open)                  \
  X(open64) X(openat) X(openat64) X(creat) X(creat64) X(close) X(fsync) X(fdatasync)              \
  X(sync_file_range) X(__read_chk) X(__pread_chk) X(__pread64_chk) X(__open_2)                    \
  X(__open64_2) X(__openat_2) X(__openat64_2) X(__fread_chk) X(__fread_unlocked_chk)              \
  X(fopen) X(fopen64) X(freopen) X(freopen64) X(fclose) X(dup2) X(dup3) X(close_range)            \
  X(closefrom) X(copy_file_range) X(sendfile) X(sendfile64) X(dup) X(fcntl) X(fcntl64)
// clang-format on

enum Sym : int {
#define SLUICE_SYM_ENUM(name) kSym_##name,
  SLUICE_PRELOAD_SYMBOLS(SLUICE_SYM_ENUM)
#undef SLUICE_SYM_ENUM
      kSymCount
};

extern std::atomic<void*> g_real[kSymCount];
// Resolves one symbol; null while this thread is already inside dlsym (the
// caller then uses a raw syscall) or when the symbol does not exist.
void* resolve_real(Sym s) noexcept;
void resolve_all_real() noexcept;

template <typename F>
inline F real(Sym s) noexcept {
  void* p = g_real[s].load(std::memory_order_relaxed);
  if (__builtin_expect(p == nullptr, 0)) p = resolve_real(s);
  return reinterpret_cast<F>(p);
}

// ---------------------------------------------------------------------------
// Per-thread state: initial-exec TLS, trivially initialised (no TLS wrapper,
// no __tls_get_addr on the hot path).
struct OpShard {
  std::atomic<std::uint64_t> calls{0};
  std::atomic<std::uint64_t> bytes{0};
  std::atomic<std::uint64_t> errors{0};
};

// A pthread mutex as a capability the analysis tracks: constant-initialised
// (usable before any constructor runs, as an interposed call may be) and
// lockable in pthread_atfork handlers, which std::mutex does not promise.
class SLUICE_CAPABILITY("mutex") PthreadMutex {
 public:
  void lock() SLUICE_ACQUIRE() { pthread_mutex_lock(&mu_); }
  void unlock() SLUICE_RELEASE() { pthread_mutex_unlock(&mu_); }

 private:
  pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
};
class SLUICE_SCOPED_CAPABILITY PthreadMutexLock {
 public:
  explicit PthreadMutexLock(PthreadMutex& mu) SLUICE_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~PthreadMutexLock() SLUICE_RELEASE() { mu_.unlock(); }
  PthreadMutexLock(const PthreadMutexLock&) = delete;
  PthreadMutexLock& operator=(const PthreadMutexLock&) = delete;

 private:
  PthreadMutex& mu_;
};

// The lock of the registry of threads' shards (runtime.cc), which the
// ThreadStates' links below make.
extern constinit PthreadMutex g_shards_mu;

struct ThreadState {
  bool resolving = false;   // inside dlsym
  bool registered = false;  // shard linked into the registry (written under g_shards_mu
                            // by this thread, which alone reads it without)
  bool exiting = false;     // thread-exit fold done; count into the globals directly
  OpShard ops[kCountedOps];
  ThreadState* next SLUICE_GUARDED_BY(g_shards_mu) = nullptr;
  ThreadState* prev SLUICE_GUARDED_BY(g_shards_mu) = nullptr;
};
extern constinit thread_local ThreadState t_state __attribute__((tls_model("initial-exec")));

void register_thread() noexcept;                              // cold
void count_unregistered(CountedOp op, long long n) noexcept;  // cold (thread exiting)

inline void bump(std::atomic<std::uint64_t>& a, std::uint64_t d) noexcept {
  // Only this thread writes its shard: a plain load+store, no locked instruction.
  a.store(a.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
}

// Whether this process keeps the per-call tally above: only when something
// will read it (SLUICE_STATS_FILE). The stage counts every enforced call
// either way; the tally is the stats file's independent record of what the
// calls moved, so without a stats file the hot path does not pay for it.
// Set once by init_process(), before any stage is published.
extern bool g_tally;

// Counts one call that moved `n` bytes (n < 0: it failed), when g_tally.
inline void count(CountedOp op, long long n) noexcept {
  if (!g_tally) return;
  ThreadState& ts = t_state;
  if (__builtin_expect(!ts.registered, 0)) {
    if (ts.exiting) return count_unregistered(op, n);
    register_thread();
  }
  OpShard& s = ts.ops[static_cast<int>(op)];
  bump(s.calls, 1);
  if (n >= 0) {
    bump(s.bytes, static_cast<std::uint64_t>(n));
  } else {
    bump(s.errors, 1);
  }
}

// ---------------------------------------------------------------------------
// Process state.

inline constexpr int kFdTableSize = 1 << 20;  // fs.nr_open's usual maximum
extern constinit FdTable<kFdTableSize> g_fds;

// The running stage; null before initialisation, when unenforced, in a fork
// child until its fresh stage exists, and after exit began. Never freed.
extern std::atomic<Stage*> g_stage;

// Slow path when g_stage is null: creates a forked child's fresh stage on its
// first interposed call. Returns null when there is no stage to use.
Stage* stage_slow() noexcept;

// Context defaults from SLUICE_ORIGIN / SLUICE_TENANT (set once at init).
// g_has_defaults is true when either is set, so the common case tests one flag.
extern bool g_has_defaults;
extern OriginId g_origin;
extern bool g_has_tenant;
extern std::uint32_t g_tenant;

// The Context of a call: make_context's, with SLUICE_ORIGIN / SLUICE_TENANT
// filling in what nothing propagated. A call enforced before it is made is
// charged a bounded pre-charge (context_flag::kBounded: at most
// kMaxPreCharge) that settle() completes with what it moved.
[[gnu::always_inline]] inline Context context_for(
    Op op, std::uint64_t size, std::uint8_t flags = context_flag::kBounded) noexcept {
  Context ctx = make_context(op, size);
  ctx.flags = flags;
  if (__builtin_expect(g_has_defaults, 0)) {
    if (ctx.origin == origin::kUnknown) ctx.origin = g_origin;
    if (g_has_tenant && ctx.tenant == 0) ctx.tenant = g_tenant;
  }
  return ctx;
}
// Enforces `op` of `size` bytes on `stage` and returns the context it
// enforced (for settle()). errno is left alone and re-entry is guarded by the
// stage itself (see the enforce contract in sluice/stage.h), so nothing is
// saved here.
[[gnu::always_inline]] inline Context enforce(Stage* stage, Op op, std::uint64_t size) noexcept {
  const Context ctx = context_for(op, size);
  (void)fast::enforce(*stage, ctx);  // fail-open: a rejected or cancelled request proceeds
  return ctx;
}

// A call the preload charges after it returned (the vector calls, whose
// iovec array only the kernel may read first) moved `r` bytes (or failed,
// r < 0): charges and counts it now. A call that moved something pays for
// it, waiting if the stage says so; a failed one is counted only if that
// needs no wait (context_flag::kNoWait), since it moved nothing.
[[gnu::noinline]] void charge_after(Stage* stage, Op op, long long r) noexcept;

// The bytes an iovec array asks for, read through the kernel
// (process_vm_readv of this process), never by dereferencing it, so that an
// invalid array is an error here, not a crash: for a call that must be
// checked before it is made (RWF_NOWAIT). Returns false when the kernel will
// refuse the array (unreadable: EFAULT; a length above SSIZE_MAX: EINVAL);
// otherwise true with the sum (saturated at SSIZE_MAX), or SSIZE_MAX when
// the array cannot be read this way here (a seccomp filter): as large as a
// call can ask, so that every object that might make it wait says it would.
// Cold: one or more syscalls. Preserves errno.
bool iov_size(const struct iovec* iov, int cnt, std::uint64_t* size) noexcept;

// The origin enforce() gives a call on this thread: the propagated one, else
// SLUICE_ORIGIN's (g_origin is origin::kUnknown when that is unset).
inline OriginId current_origin() noexcept {
  const OriginId o = sluice::detail::t_thread_context.propagated.origin;
  const OriginId fallback = g_origin;  // read either way: a select, not a branch
  return o != origin::kUnknown ? o : fallback;
}

// enforce() without the Context when the stage's shortcut covers the call
// (fast::try_count inline, else fast::try_grant out of line: the context's
// other classifiers decide nothing there), else enforce()
// out of line. Either way the request is counted once by the stage, and
// charged, exactly as enforce() would.
[[gnu::noinline]] void enforce_slow(Stage* stage, Op op, std::uint64_t size) noexcept;
[[gnu::always_inline]] inline void enforce_fast(Stage* stage, Op op, std::uint64_t size) noexcept {
  if (__builtin_expect(!fast::try_count(*stage, current_origin(), size), 0)) {
    enforce_slow(stage, op, size);
  }
}

// settle() for a call enforced with enforce_fast(stage, op, size): rebuilds
// the same Context (nothing it depends on changes during the call) only when
// the call moved another amount than requested.
[[gnu::noinline]] void settle_slow(Stage* stage, Op op, std::uint64_t size,
                                   std::uint64_t moved) noexcept;
inline void settle(Stage* stage, Op op, std::uint64_t size, long long r) noexcept {
  const std::uint64_t moved = r > 0 ? static_cast<std::uint64_t>(r) : 0;
  if (__builtin_expect(moved == size && size <= kMaxPreCharge, 1)) return;
  settle_slow(stage, op, size, moved);
}

// The call enforced with `ctx` returned `r` (bytes moved, or < 0 on failure):
// when that differs from what was requested, or from what was pre-charged,
// the stage settles it (Stage::settle): its byte counters are corrected so
// its statistics report bytes transferred, and its objects give back what
// was charged and not moved, or charge what was moved beyond the pre-charge
// (which may wait). Stage::settle touches no errno and its own I/O is
// internal, so this is safe between the call and its return.
inline void settle(Stage* stage, const Context& ctx, long long r) noexcept {
  const std::uint64_t moved = r > 0 ? static_cast<std::uint64_t>(r) : 0;
  if (__builtin_expect(moved == ctx.size && pre_charge_of(ctx) == ctx.size, 1)) return;
  stage->settle(ctx, moved);
}

// The stage to enforce a call on an fd whose table entry is `entry`, or null
// for a pass-through.
inline Stage* stage_for_entry(std::uint8_t entry) noexcept {
  if ((entry & kEntrySelected) == 0) return nullptr;
  Stage* st = g_stage.load(std::memory_order_acquire);
  if (__builtin_expect(st == nullptr, 0)) {
    st = stage_slow();
    if (st == nullptr) return nullptr;
  }
  // internal_io_active(), read inline: the initial-exec TLS word libstage keeps
  // for InternalIoScope (sluice/context.h) and the preload's Busy, without a call.
  if (sluice::detail::t_thread_context.internal_depth != 0) return nullptr;
  return st;
}
inline Stage* stage_for(int fd) noexcept {
  return stage_for_entry(g_fds.lookup(fd));
}

// A data call on `fd` of size() bytes: enforce (a bounded pre-charge), make
// the call, count and settle what it moved. A size the kernel refuses
// (above SSIZE_MAX) passes through, never made to wait. `call` returns
// ssize_t (-1 and errno on failure).
template <typename SizeFn, typename Call>
inline auto data_call(CountedOp cop, Op op, int fd, SizeFn&& size, Call&& call) {
  Stage* st = stage_for(fd);
  if (st == nullptr) return call();
  const std::uint64_t n = size();
  if (n > static_cast<std::uint64_t>(SSIZE_MAX)) return call();
  enforce_fast(st, op, n);
  auto r = call();
  count(cop, r);
  settle(st, op, n, r);
  return r;
}

// The inline common case of a data call that requests `size` bytes: it calls nothing,
// so the interposed function needs no stack frame. `path` says what the caller does:
//   kCounted: the stage's shortcut counted the call (fast::try_count): make
//             the call through `real` and pass its result to finish().
//   kEnforce: selected, but the shortcut does not cover it: nothing was done;
//             enforce out of line (interpose.cc), then make the call.
//   kPass:    `fd` is known and not selected, or this thread is inside Sluice: make
//             the real call, nothing else.
//   kFull:    anything else (an unknown fd, no stage yet, an unresolved symbol):
//             nothing was done; take the full path (data_call).
enum class Path : std::uint8_t { kCounted, kEnforce, kPass, kFull };
template <typename F>
struct Route {
  F real;
  Path path;
};
template <typename F>
[[gnu::always_inline]] inline Route<F> route_inline(Sym s, int fd, std::uint64_t size) noexcept {
  const auto real = reinterpret_cast<F>(g_real[s].load(std::memory_order_relaxed));
  const std::uint8_t e = g_fds.peek(fd);
  if ((e & kEntrySelected) == 0) {
    return {real, e != 0 && real != nullptr ? Path::kPass : Path::kFull};
  }
  Stage* st = g_stage.load(std::memory_order_acquire);
  if (st == nullptr || real == nullptr) return {real, Path::kFull};
  if (sluice::detail::t_thread_context.internal_depth != 0) return {real, Path::kPass};
  if (!fast::try_count(*st, current_origin(), size)) return {real, Path::kEnforce};
  return {real, Path::kCounted};
}

// After a call route_inline() counted returned `r` (bytes moved, or < 0):
// when it moved another amount than `size`, corrects the stage's bytes, and
// tallies it when g_tally. Returns r. Inline only the common case (the whole
// transfer, no tally), so that nothing but `size` need survive the real call
// in a register; the rest is finish_slow, a tail call.
long finish_slow(CountedOp cop, Op op, std::uint64_t size, long r) noexcept;
[[gnu::always_inline]] inline long finish(CountedOp cop, Op op, std::uint64_t size,
                                          long r) noexcept {
  if (__builtin_expect(r < 0 || static_cast<std::uint64_t>(r) != size || g_tally, 0)) {
    return finish_slow(cop, op, size, r);
  }
  return r;
}

// Everything counted so far in this process (all threads, live and exited).
PreloadTotals collect_totals();
// Reads the configuration and starts the stage; once per process image.
void init_process() noexcept;

// An fd that open/openat/creat/fopen/... just returned: classify it, then
// enforce and count an Op::kOpen when it is selected. Preserves errno.
void after_open(int fd) noexcept;
// Before close/fclose: enforce and count an Op::kClose when selected.
void before_close(int fd) noexcept;

#pragma GCC visibility pop

}  // namespace sluice::preload
