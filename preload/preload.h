// libsluice_preload.so: a Sluice stage under an unmodified, dynamically linked program
// (PAIO §6.2). Internal header of the preload room; nothing here is installed.
// docs/preload.md has what is interposed, what a call is charged, the configuration,
// the first rules, the reserved descriptors, fork and exit.
//
// A call: the fd's table entry (one relaxed byte load) says whether it is selected;
// if not, or no stage runs, or the thread is inside Sluice, only the real call runs.
// Else it is enforced (inline through the stage's shortcut when it covers the call,
// else with a Context and a bounded pre-charge), made, and settled for what it moved.
// Fail-open: a refusal or cancellation never fails the call.
//
// Thread safety: every interposed function may be called from any thread, any number
// at once, and from signal handlers. The hot path takes no lock, allocates nothing and
// makes no system call of its own; counter shards are written only by their thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/context.h"
#include "sluice/status.h"

namespace sluice::preload {

// ---------------------------------------------------------------------------
// Configuration (config.cc)

enum class LogLevel : std::uint8_t { kOff = 0, kError, kWarn, kInfo, kDebug };
enum class ForkMode : std::uint8_t { kFresh = 0, kPassthrough };

enum class FileKind : std::uint8_t {
  kUnknown = 0,
  kRegular = 1,
  kDir = 2,
  kSocket = 3,
  kPipe = 4,
  kTty = 5,
  kOther = 6,  // block and character devices that are not ttys, anon inodes
};
std::string_view kind_name(FileKind kind) noexcept;
inline constexpr std::uint8_t kind_bit(FileKind kind) noexcept {
  return static_cast<std::uint8_t>(1u << static_cast<unsigned>(kind));
}

inline constexpr std::uint32_t kDefaultReadyMs = 200;
inline constexpr std::uint32_t kMaxReadyMs = 60000;

struct Config {
  std::string socket_path;                            // SLUICE_SOCKET; empty: no control plane
  std::string stage_name;                             // SLUICE_STAGE, default "<comm>-<pid>"
  std::string rules_path;                             // SLUICE_RULES; empty: no local rules
  std::vector<std::string> paths;                     // SLUICE_PATHS, normalised; empty: all
  std::uint8_t kinds = kind_bit(FileKind::kRegular);  // SLUICE_KINDS
  LogLevel log_level = LogLevel::kWarn;               // SLUICE_LOG_LEVEL
  ForkMode fork_mode = ForkMode::kFresh;              // SLUICE_FORK
  std::optional<std::uint32_t> tenant;                // SLUICE_TENANT
  std::string origin;                                 // SLUICE_ORIGIN (an origin name)
  std::string stats_file;                             // SLUICE_STATS_FILE ("%p": the pid)
  // SLUICE_READY_MS: how long the first enforced call waits for the control
  // plane's first rules (with SLUICE_SOCKET); 0: it does not wait.
  std::uint32_t ready_ms = kDefaultReadyMs;
};

// Looks an environment variable up; null when unset.
using EnvFn = const char* (*)(const char* name);

// The log level alone, so that a later configuration error is reported (or
// silenced) at the right level. An invalid value is an error.
StatusOr<LogLevel> parse_log_level(const char* value);

// Parses every SLUICE_* variable. `comm` and `pid` make the default stage
// name. The error message has the form "SLUICE_X=value: what is wrong".
// `secure`: the process runs with privileges its caller does not have
// (AT_SECURE: setuid, setgid, file capabilities); every SLUICE_* variable is
// then ignored, as secure_getenv() does, so that the caller's environment
// chooses no file the program opens (rules, stats) and no socket it talks to.
StatusOr<Config> parse_config(EnvFn env, std::string_view comm, long pid, bool secure = false);

// True when `path` is `prefix` or below it (prefix has no trailing slash,
// except "/" itself).
bool path_under(std::string_view path, std::string_view prefix) noexcept;

// ---------------------------------------------------------------------------
// The fd table (fd_table.cc)

// What an fd table entry says, packed in one byte.
inline constexpr std::uint8_t kEntryKnown = 0x80;
inline constexpr std::uint8_t kEntrySelected = 0x40;
inline constexpr std::uint8_t kEntryKindMask = 0x07;
inline FileKind entry_kind(std::uint8_t e) noexcept {
  return static_cast<FileKind>(e & kEntryKindMask);
}

// Which fds are enforced: immutable once published.
struct FdPolicy {
  std::uint8_t kinds = kind_bit(FileKind::kRegular);
  std::vector<std::string> paths;  // empty: every path
};

// Classifies an open fd: fstat (+ isatty for character devices, + readlink of
// /proc/self/fd/N when the policy has paths). Returns 0 when fd is not open.
// Preserves errno. Async-signal-safe apart from the policy's vector reads.
std::uint8_t classify_fd(int fd, const FdPolicy& policy) noexcept;

// A fixed-size table of per-fd entries, indexed by fd. Entries of fds outside
// [0, N) are never known: such fds pass through.
template <int N>
class FdTable {
 public:
  static constexpr int kSize = N;

  constexpr FdTable() = default;

  // The policy that classifies unknown entries; null: nothing is resolved.
  void set_policy(const FdPolicy* policy) noexcept {
    policy_.store(policy, std::memory_order_release);
  }
  const FdPolicy* policy() const noexcept { return policy_.load(std::memory_order_acquire); }

  // The entry for `fd`, resolving an unknown one. One relaxed load when known.
  std::uint8_t lookup(int fd) noexcept {
    if (static_cast<unsigned>(fd) >= static_cast<unsigned>(N)) return 0;
    std::uint8_t e = entries_[fd].load(std::memory_order_relaxed);
    if (__builtin_expect(e != 0, 1)) return e;
    return resolve(fd);
  }
  // The entry as stored (0: unknown), without resolving.
  std::uint8_t peek(int fd) const noexcept {
    if (static_cast<unsigned>(fd) >= static_cast<unsigned>(N)) return 0;
    return entries_[fd].load(std::memory_order_relaxed);
  }
  // (Re)classifies `fd` now, e.g. right after open returned it.
  std::uint8_t record(int fd) noexcept {
    if (static_cast<unsigned>(fd) >= static_cast<unsigned>(N)) return 0;
    forget(fd);
    return resolve(fd);
  }
  // `fd` was closed (or replaced): its entry becomes unknown.
  void forget(int fd) noexcept {
    if (static_cast<unsigned>(fd) >= static_cast<unsigned>(N)) return;
    entries_[fd].store(0, std::memory_order_relaxed);
  }
  // Every fd in [first, last] was closed.
  void forget_range(unsigned first, unsigned last) noexcept {
    unsigned hi = high_water_.load(std::memory_order_relaxed);
    if (last > hi) last = hi;
    for (unsigned fd = first; fd <= last && fd < static_cast<unsigned>(N); ++fd) {
      entries_[fd].store(0, std::memory_order_relaxed);
    }
  }
  // Forget everything (a new process image would start this way).
  void clear() noexcept { forget_range(0, static_cast<unsigned>(N) - 1); }

 private:
  __attribute__((noinline)) std::uint8_t resolve(int fd) noexcept {
    const FdPolicy* p = policy();
    if (p == nullptr) return 0;
    std::uint8_t e = classify_fd(fd, *p);
    if (e == 0) return 0;
    entries_[fd].store(e, std::memory_order_relaxed);
    unsigned hi = high_water_.load(std::memory_order_relaxed);
    while (static_cast<unsigned>(fd) > hi &&
           !high_water_.compare_exchange_weak(hi, static_cast<unsigned>(fd),
                                              std::memory_order_relaxed)) {
    }
    return e;
  }

  std::array<std::atomic<std::uint8_t>, N> entries_{};
  std::atomic<const FdPolicy*> policy_{nullptr};
  std::atomic<unsigned> high_water_{0};
};

// ---------------------------------------------------------------------------
// Counters: bytes actually moved, per operation (runtime.cc)

enum class CountedOp : std::uint8_t { kRead = 0, kWrite, kOpen, kClose, kSync };
inline constexpr int kCountedOps = 5;

struct OpTotals {
  std::uint64_t calls = 0;
  std::uint64_t bytes = 0;   // bytes the real calls returned as transferred
  std::uint64_t errors = 0;  // calls that returned -1 (or a short stdio count 0)
};
using PreloadTotals = std::array<OpTotals, kCountedOps>;

}  // namespace sluice::preload
