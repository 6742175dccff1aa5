// Context: what a stage knows about one request (a 32-byte trivially copyable
// struct built on the caller's stack), and how a layer that knows more (a
// RocksDB listener, an application) propagates it to the stage. Its fields
// are the classifiers rules select on: workflow (thread id, or a propagated
// id), operation (Op), size_class (bit_width(size)), origin (why the request
// exists, an interned id), tenant, and level (the LSM level, 0 when unknown).
// `size` is charged by objects but selected on through size_class.
//
// Thread safety: intern_origin and origin_name are safe from any thread. The
// propagation scope (OriginScope) is per thread by design.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace sluice {

struct BoardSlot;  // sluice/board.h

enum class Op : std::uint8_t {
  kNone = 0,
  kRead,
  kWrite,
  kOpen,
  kClose,
  kSync,  // fsync, fdatasync, sync_file_range
  kPut,
  kGet,
  kDelete,
  kScan,
  kMerge,
  kOther,
  // A transaction's begin, commit and abort (sluice/txn.h): a key-value layer
  // routes a begin to the object that schedules transactions, and counts the
  // ends, with the transaction's id as the workflow.
  kBegin,
  kCommit,
  kAbort,
};
inline constexpr int kOpCount = 15;

std::string_view op_name(Op op) noexcept;
std::optional<Op> parse_op(std::string_view name) noexcept;

// Origins are small interned ids. The first ones are fixed so that bindings and
// policies agree on them without a lookup; more can be interned at run time.
using OriginId = std::uint16_t;
namespace origin {
inline constexpr OriginId kUnknown = 0;
inline constexpr OriginId kForeground = 1;
inline constexpr OriginId kWal = 2;
inline constexpr OriginId kFlush = 3;
inline constexpr OriginId kCompactionL0L1 = 4;
inline constexpr OriginId kCompactionL0L0 = 5;
inline constexpr OriginId kCompactionLN = 6;
inline constexpr OriginId kManifest = 7;
inline constexpr OriginId kInfoLog = 8;
inline constexpr OriginId kOther = 9;
inline constexpr OriginId kFirstDynamic = 10;
// At most this many distinct origins exist in one process.
inline constexpr OriginId kMaxOrigins = 1024;
}  // namespace origin

// Returns the id for `name`, interning it if new. Names are 1-63 characters of
// [A-Za-z0-9_.:-]. Returns nullopt for an invalid name or a full table.
std::optional<OriginId> intern_origin(std::string_view name);
// Looks a name up without interning it.
std::optional<OriginId> find_origin(std::string_view name);
// "unknown" for ids never interned.
std::string_view origin_name(OriginId id) noexcept;

// How a layer asks for one request to be enforced: Context::flags, a set of
// these bits (0, the default: enforce before the call, waiting as long as
// the object says, charging the whole `size`). Flags select nothing: no
// classifier reads them.
namespace context_flag {
// The request must not wait (a call made with RWF_NOWAIT). When the object
// it is routed to would make it wait, enforcing it does nothing (it is
// neither charged nor counted) and returns Outcome::kWouldWait; the layer
// then fails the call (EAGAIN) without making it. An object that cannot
// tell whether it would wait says it would (EnforcementObject).
inline constexpr std::uint8_t kNoWait = 1u << 0;
// The layer calls Stage::settle() after the call with the bytes it moved.
// The object is charged min(size, kMaxPreCharge) before the call, and
// settle() charges the rest of what the call actually moved (that charge
// may wait) or gives back what it did not move. For a request whose size
// says little about what it will move: read(fd, buf, 1 GiB) near the end
// of a file, or a size the kernel will refuse.
inline constexpr std::uint8_t kBounded = 1u << 1;
}  // namespace context_flag

// What a request enforced with context_flag::kBounded is charged before its
// call at most: 1 MiB, at least the largest request common programs make
// per call (dd bs=1M, cp and cat 128 KiB, fio's usual block sizes), so that
// those are charged whole before the call, exactly as without the flag; and
// small enough to bound what a request that moves nothing costs before
// settle() gives it back (20 ms of a 50 MiB/s token bucket).
inline constexpr std::uint64_t kMaxPreCharge = std::uint64_t{1} << 20;

struct Context {
  std::uint64_t workflow = 0;
  std::uint64_t size = 0;
  std::uint32_t tenant = 0;
  OriginId origin = origin::kUnknown;
  Op op = Op::kNone;
  std::uint8_t level = 0;
  std::uint8_t level_in = 0;  // input level of a compaction (informational)
  std::uint8_t flags = 0;     // context_flag bits
  std::uint8_t reserved[6] = {};
};
static_assert(std::is_trivially_copyable_v<Context>);
static_assert(sizeof(Context) == 32);
static_assert(offsetof(Context, tenant) == 16 && offsetof(Context, origin) == 20 &&
              offsetof(Context, op) == 22 && offsetof(Context, level) == 23);

// What an object enforcing `ctx` charges before the call (see
// context_flag::kBounded).
inline constexpr std::uint64_t pre_charge_of(const Context& ctx) noexcept {
  return (ctx.flags & context_flag::kBounded) != 0 && ctx.size > kMaxPreCharge ? kMaxPreCharge
                                                                               : ctx.size;
}

inline constexpr std::uint8_t size_class_of(std::uint64_t size) noexcept {
  return static_cast<std::uint8_t>(std::bit_width(size));
}

// The calling thread's id (gettid), cached per thread and refreshed across
// fork. No syscall after the first call on a thread.
std::uint64_t current_thread_id() noexcept;

// ---------------------------------------------------------------------------
// Context propagation.
//
// The layer that knows why I/O happens opens a scope on the thread that does
// it; every Context the stage builds on that thread until the scope closes
// carries the scope's origin/tenant/level/workflow. Scopes nest: closing an
// inner scope restores the outer values. A scope must be closed on the thread
// that opened it (it is a stack object).
struct Propagated {
  OriginId origin = origin::kUnknown;
  std::uint32_t tenant = 0;
  std::uint8_t level = 0;
  std::uint8_t level_in = 0;
  std::uint64_t workflow = 0;  // 0: use the thread id
};

// The values in force on this thread (all zero outside any scope).
Propagated current_propagated() noexcept;

class OriginScope {
 public:
  explicit OriginScope(const Propagated& values) noexcept;
  OriginScope(OriginId origin, std::uint32_t tenant = 0) noexcept
      : OriginScope(Propagated{origin, tenant, 0, 0, 0}) {}
  ~OriginScope();
  OriginScope(const OriginScope&) = delete;
  OriginScope& operator=(const OriginScope&) = delete;

 private:
  Propagated saved_;
};

// For layers whose begin/end callbacks are not one C++ scope (a listener's
// OnFlushBegin/OnFlushCompleted): set and restore explicitly. set_propagated
// returns the previous values, to be handed back to restore_propagated.
Propagated set_propagated(const Propagated& values) noexcept;
void restore_propagated(const Propagated& previous) noexcept;

namespace detail {
// Per-thread state behind make_context and the scopes. Initial-exec and
// constant-initialised so that reading it inline costs one %fs-relative load
// and no TLS wrapper call (see libstage/src/tls.h).
struct OpsBytes;  // sluice/stage_fast.h
// FastTarget::key of a shortcut whose object must grant each request.
inline constexpr std::uint32_t kFastGrantKey = std::uint32_t{1} << 16;
// The stage's per-thread shortcut; see sluice/stage_fast.h. Kept in
// ThreadContext, which the same inline paths read, so that they locate one
// thread-local block, not two.
struct FastTarget {
  std::uint64_t version = 0;
  OpsBytes* slot = nullptr;  // the counters of the origin
  // The origin it covers, plus kFastGrantKey when the place's object must
  // grant each request (`grant`): fast::try_count's one compare then
  // refuses it, and fast::try_grant takes it.
  std::uint32_t key = 0;
  // The object's grant (EnforcementObject::fast_grant), when kFastGrantKey.
  bool (*grant)(void* state, std::uint64_t size) noexcept = nullptr;
  void* grant_state = nullptr;
  // The object's slot on the stage's board, when it has one.
  const BoardSlot* board = nullptr;
};
// The first cache line holds what the inline paths read: the propagated
// values and the thread id (make_context), the depth of InternalIoScope, and
// the shortcut's compare and count (fast::try_count). The grant's fields,
// which only fast::try_grant reads, spill into the second line.
struct alignas(64) ThreadContext {
  Propagated propagated;
  std::uint64_t tid = 0;
  std::uint32_t internal_depth = 0;
  FastTarget fast;
};
static_assert(offsetof(ThreadContext, fast) + offsetof(FastTarget, key) + sizeof(std::uint32_t) <=
              64);
extern constinit thread_local ThreadContext t_thread_context
    __attribute__((tls_model("initial-exec")));
std::uint64_t init_thread_id() noexcept;
}  // namespace detail

// A Context for `op` of `size` bytes on this thread, with the propagated
// origin, tenant and level, and the workflow set to the propagated workflow or
// the thread id.
inline Context make_context(Op op, std::uint64_t size) noexcept {
  const detail::ThreadContext& t = detail::t_thread_context;
  Context ctx;
  ctx.workflow = t.propagated.workflow != 0 ? t.propagated.workflow
                 : t.tid != 0               ? t.tid
                                            : detail::init_thread_id();
  ctx.size = size;
  if constexpr (std::endian::native == std::endian::little) {
    // tenant, origin, op and level (bytes 16..23), which the stage reads as
    // one word, stored as one word: that read then forwards from the store,
    // where four narrow stores would make it wait for them to reach the cache.
    const std::uint64_t mid = std::uint64_t{t.propagated.tenant} |
                              std::uint64_t{t.propagated.origin} << 32 |
                              std::uint64_t{static_cast<std::uint8_t>(op)} << 48 |
                              std::uint64_t{t.propagated.level} << 56;
    std::memcpy(reinterpret_cast<unsigned char*>(&ctx) + offsetof(Context, tenant), &mid,
                sizeof(mid));
  } else {
    ctx.tenant = t.propagated.tenant;
    ctx.origin = t.propagated.origin;
    ctx.op = op;
    ctx.level = t.propagated.level;
  }
  ctx.level_in = t.propagated.level_in;
  return ctx;
}

// Marks the calling thread as doing Sluice's own I/O (control-plane traffic,
// its log): a preloaded stage passes such I/O through, unenforced and
// uncounted. Nests.
class InternalIoScope {
 public:
  // Inline: the stage opens one around every call of an object.
  InternalIoScope() noexcept { ++detail::t_thread_context.internal_depth; }
  ~InternalIoScope() { --detail::t_thread_context.internal_depth; }
  InternalIoScope(const InternalIoScope&) = delete;
  InternalIoScope& operator=(const InternalIoScope&) = delete;
};
bool internal_io_active() noexcept;

}  // namespace sluice
