#include "sluice/context.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "sluice/thread_annotations.h"
#include "tls.h"

namespace sluice {
namespace {

constexpr std::array<std::string_view, kOpCount> kOpNames = {
    "none",   "read", "write", "open",  "close", "sync",   "put",  "get",
    "delete", "scan", "merge", "other", "begin", "commit", "abort"};

// Interned origin names. Slots are written once (by append_locked, under the
// mutex) before the id is published, and never change, so readers need no
// lock: `count` and `names` are atomics read lock-free and written under `mu`.
struct OriginTable {
  Mutex mu;
  std::atomic<std::uint32_t> count{0};
  std::array<std::atomic<const std::string*>, origin::kMaxOrigins> names{};

  OriginTable() {
    static constexpr std::array<std::string_view, origin::kFirstDynamic> kFixed = {
        "unknown",          "foreground",    "wal",      "flush",    "compaction_L0_L1",
        "compaction_L0_L0", "compaction_LN", "manifest", "info_log", "other"};
    for (std::size_t i = 0; i < kFixed.size(); ++i) {
      names[i].store(new std::string(kFixed[i]), std::memory_order_relaxed);
    }
    count.store(origin::kFirstDynamic, std::memory_order_release);
  }
};

OriginTable& origins() {
  static OriginTable* table = new OriginTable();  // never destroyed: used until exit
  return *table;
}

bool valid_origin_name(std::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::optional<OriginId> find_lock_free(OriginTable& t, std::string_view name) {
  std::uint32_t n = t.count.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::string* s = t.names[i].load(std::memory_order_acquire);
    if (s != nullptr && *s == name) return static_cast<OriginId>(i);
  }
  return std::nullopt;
}

// The one writer of a table's slots (interning is serialised by `t.mu`).
std::optional<OriginId> append_locked(OriginTable& t, std::string_view name) SLUICE_REQUIRES(t.mu) {
  std::uint32_t n = t.count.load(std::memory_order_relaxed);
  if (n >= origin::kMaxOrigins) return std::nullopt;
  t.names[n].store(new std::string(name), std::memory_order_release);
  t.count.store(n + 1, std::memory_order_release);
  return static_cast<OriginId>(n);
}

void reset_tid_after_fork() {
  detail::t_thread_context.tid = 0;
}

}  // namespace

namespace detail {
constinit SLUICE_TLS thread_local ThreadContext t_thread_context;

std::uint64_t init_thread_id() noexcept {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, reset_tid_after_fork); });
  auto tid = static_cast<std::uint64_t>(::syscall(SYS_gettid));
  t_thread_context.tid = tid;
  return tid;
}
}  // namespace detail

std::string_view op_name(Op op) noexcept {
  auto i = static_cast<std::size_t>(op);
  return i < kOpNames.size() ? kOpNames[i] : std::string_view("invalid");
}

std::optional<Op> parse_op(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kOpNames.size(); ++i) {
    if (kOpNames[i] == name) return static_cast<Op>(i);
  }
  return std::nullopt;
}

std::optional<OriginId> find_origin(std::string_view name) {
  return find_lock_free(origins(), name);
}

std::optional<OriginId> intern_origin(std::string_view name) {
  if (!valid_origin_name(name)) return std::nullopt;
  OriginTable& t = origins();
  if (auto id = find_lock_free(t, name)) return id;
  MutexLock lock(t.mu);
  if (auto id = find_lock_free(t, name)) return id;
  return append_locked(t, name);
}

std::string_view origin_name(OriginId id) noexcept {
  OriginTable& t = origins();
  if (id >= t.count.load(std::memory_order_acquire)) return "unknown";
  const std::string* s = t.names[id].load(std::memory_order_acquire);
  return s != nullptr ? std::string_view(*s) : std::string_view("unknown");
}

std::uint64_t current_thread_id() noexcept {
  std::uint64_t tid = detail::t_thread_context.tid;
  return tid != 0 ? tid : detail::init_thread_id();
}

Propagated current_propagated() noexcept {
  return detail::t_thread_context.propagated;
}

Propagated set_propagated(const Propagated& values) noexcept {
  Propagated previous = detail::t_thread_context.propagated;
  detail::t_thread_context.propagated = values;
  return previous;
}

void restore_propagated(const Propagated& previous) noexcept {
  detail::t_thread_context.propagated = previous;
}

OriginScope::OriginScope(const Propagated& values) noexcept : saved_(set_propagated(values)) {}
OriginScope::~OriginScope() {
  restore_propagated(saved_);
}

bool internal_io_active() noexcept {
  return detail::t_thread_context.internal_depth != 0;
}

}  // namespace sluice
