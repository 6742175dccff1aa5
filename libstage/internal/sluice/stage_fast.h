// The stage's fast path, for the bindings that enforce on an interposed
// call's way (the preload, the RocksDB binding) and the benchmarks that
// measure them: Stage::enforce() with its common case inline, and the pieces
// of that case for a caller that builds its Context only when they refuse.
// Not installed: the layout below may change with any release.
//
// Each thread keeps one shortcut, detail::FastTarget (sluice/context.h; this
// thread's is t_thread_context.fast), into the snapshot it used last, for one
// origin. stage.cc sets it on the out-of-line path only when that snapshot
// selects by nothing but the origin, the origin's place calls no object or
// one that offers a grant (EnforcementObject::fast_grant), and the thread
// owns an exclusive statistics shard; it holds while the stage's version
// equals FastTarget::version (0: unset; versions are unique per process), and
// stage.cc clears it before the thread lets go of the snapshot or its shard.
// Only its thread uses it. No function here calls, locks or touches errno,
// but for the object's grant (one indirect call) and enforce_rest().
#pragma once

#include <atomic>
#include <cstdint>

#include "sluice/board.h"
#include "sluice/context.h"
#include "sluice/enforcement_object.h"
#include "sluice/stage.h"

namespace sluice {
namespace detail {

// Requests and bytes counted for one origin slot of one statistics shard.
struct OpsBytes {
  std::atomic<std::uint64_t> ops{0};
  std::atomic<std::uint64_t> bytes{0};
};
// Origins 0..kOriginSlots-2 are counted apart, the rest in the last slot.
inline constexpr int kOriginSlots = 32;

// What of a Stage its fast path reads.
struct StageAccess {
  static std::uint64_t version(const Stage& s) noexcept {
    return s.version_->load(std::memory_order_acquire);
  }
  static Verdict enforce_rest(Stage& s, const Context& ctx) noexcept { return s.enforce_rest(ctx); }
};

// The shard is its thread's alone: a plain load+store, no locked instruction.
[[gnu::always_inline]] inline void count_one(OpsBytes& c, std::uint64_t size) noexcept {
  c.ops.store(c.ops.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  c.bytes.store(c.bytes.load(std::memory_order_relaxed) + size, std::memory_order_relaxed);
}

}  // namespace detail

namespace fast {

// When this thread's shortcut covers `stage` and `origin` with no object to
// call (the context's other classifiers then decide nothing), counts one
// request of `origin` and `size` bytes and returns true; else returns false
// having done nothing, and the caller enforces the full Context with
// enforce_rest().
[[gnu::always_inline]] inline bool try_count(const Stage& stage, OriginId origin,
                                             std::uint64_t size) noexcept {
  const detail::FastTarget& f = detail::t_thread_context.fast;
  // A shortcut with a grant has kFastGrantKey in its key: refused here.
  if (f.version != detail::StageAccess::version(stage) || f.key != std::uint32_t{origin})
      [[unlikely]]
    return false;
  detail::count_one(*f.slot, size);
  return true;
}

// try_count() for a place whose object grants: when this thread's shortcut
// covers `stage` and `origin` with a grant, `size` is at most kMaxPreCharge,
// no board write for the object waits to be taken, and the object grants the
// request at once, counts it as try_count() does and returns true: the object
// was charged `size`, exactly as Stage::enforce() would have charged it. Else
// returns false having done nothing: the caller enforces the full Context
// with enforce_rest() (which takes the board's values first, and may wait).
// Stage::settle() applies to a request it counted as to any.
[[gnu::always_inline]] inline bool try_grant(const Stage& stage, OriginId origin,
                                             std::uint64_t size) noexcept {
  const detail::FastTarget& f = detail::t_thread_context.fast;
  if (f.version != detail::StageAccess::version(stage) ||
      f.key != (std::uint32_t{origin} | detail::kFastGrantKey) || size > kMaxPreCharge) [[unlikely]]
    return false;
  // As the full path's Feed::poll: a write not taken yet goes that way.
  if (const BoardSlot* b = f.board; b != nullptr && b->seq.load(std::memory_order_acquire) !=
                                                        b->seen.load(std::memory_order_relaxed))
    return false;
  if (!f.grant(f.grant_state, size)) return false;
  detail::count_one(*f.slot, size);
  return true;
}

// Stage::enforce() without its inline part, for a caller that has just seen
// try_count() refuse: the same routing, waiting and counting. Tries
// try_grant() when the thread's memo refuses, and sets the shortcut for the
// requests after.
inline Verdict enforce_rest(Stage& stage, const Context& ctx) noexcept {
  return detail::StageAccess::enforce_rest(stage, ctx);
}

// Stage::enforce(), its common case inline.
[[gnu::always_inline]] inline Verdict enforce(Stage& stage, const Context& ctx) noexcept {
  if (try_count(stage, ctx.origin, ctx.size)) [[likely]]
    return {};
  return enforce_rest(stage, ctx);
}

}  // namespace fast
}  // namespace sluice
