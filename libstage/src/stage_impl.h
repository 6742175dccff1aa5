// Stage::Impl: a stage's state, shared by the files that implement Stage:
// stage.cc (the per-thread snapshot cache and the hot path), stage_apply.cc
// (rules) and stage_report.cc (statistics and info).
//
// Thread safety: as Stage (sluice/stage.h). `version` and the published
// snapshot are read by any thread; `current` is guarded by snap_mu, the rest
// (the model, the board and its slots, the retired counters) by control_mu,
// which the stage's control calls hold throughout (apply, board, collect,
// totals, info, rules_version, shutdown; create while it sets the stage up).
// The annotations say which (sluice/thread_annotations.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "board_stage.h"
#include "sluice/stage.h"
#include "sluice/thread_annotations.h"
#include "snapshot.h"
#include "stage_stats.h"

namespace sluice {
namespace detail {

// One entry of a thread's snapshot cache (stage.cc): a stage's snapshot, with
// one reference, and the memo of the last routing decision made through it.
struct CacheEntry {
  std::uint64_t uid = 0;
  std::uint64_t version = 0;
  Snapshot* snap = nullptr;
  KeyMask memo_mask;  // copied from the snapshot: one indirection less per request
  Key memo_key;
  Target memo;  // valid when memo.stats != nullptr
  // memo.stats when the memo calls no object (the inline common case), else null.
  StatsBlock* memo_plain = nullptr;
  // memo_mask selects nothing but the origin (or nothing): every request of
  // the memo's origin goes where the memo says (FastTarget).
  bool by_origin_only = false;
};

// A stage's id, unique in the process (a thread's cache entries are keyed by it).
std::uint64_t next_uid() noexcept;

struct Rule;  // rules.h

}  // namespace detail

struct Stage::Impl {
  // Read on every request: keep together.
  std::atomic<std::uint64_t> version{0};
  const std::uint64_t uid = detail::next_uid();

  // The board, once made (Stage::board): declared before anything holding
  // objects, so that it is unmapped after them.
  std::unique_ptr<detail::StageBoard> board SLUICE_GUARDED_BY(control_mu);
  std::atomic<std::uint64_t> board_taken{0};  // board writes objects took

  std::string name;
  std::map<std::string, std::string> labels;
  Clock* clock = nullptr;
  const Registry* registry = nullptr;
  std::int64_t pid = 0;

  Mutex snap_mu;  // guards `current` (the pointer, not the snapshot)
  detail::Snapshot* current SLUICE_GUARDED_BY(snap_mu) = nullptr;

  // Serialises apply, collect, info, shutdown and board; taken before snap_mu.
  mutable Mutex control_mu SLUICE_ACQUIRED_BEFORE(snap_mu);
  detail::Model model SLUICE_GUARDED_BY(control_mu);
  // Channels plus objects in `model` (see kMaxEntries), kept by apply so that
  // a batch that can create need not count them in the cold model.
  std::size_t entries SLUICE_GUARDED_BY(control_mu) = 0;
  std::shared_ptr<detail::StatsBlock> unclassified SLUICE_GUARDED_BY(control_mu) =
      std::make_shared<detail::StatsBlock>();
  // Counters of removed channels and objects not collected yet (detail::Retired).
  std::vector<detail::Retired> retired SLUICE_GUARDED_BY(control_mu);
  std::uint64_t rules_version SLUICE_GUARDED_BY(control_mu) = 0;
  std::int64_t created_ns SLUICE_GUARDED_BY(control_mu) = 0;
  std::int64_t last_collect_ns SLUICE_GUARDED_BY(control_mu) = 0;
  bool shut_down SLUICE_GUARDED_BY(control_mu) = false;
  // The rules' lease (a `lease` rule, docs/rules.md): when it runs out by `clock` (0:
  // no lease) and the configure rules it then applies.
  std::int64_t lease_deadline_ns SLUICE_GUARDED_BY(control_mu) = 0;
  std::shared_ptr<const std::vector<detail::Rule>> lease_fallback SLUICE_GUARDED_BY(control_mu);
  std::uint64_t leases_expired SLUICE_GUARDED_BY(control_mu) = 0;

  // Destruction is single-threaded: no other reference to the stage is left.
  ~Impl() SLUICE_NO_THREAD_SAFETY_ANALYSIS {
    if (current != nullptr) current->unref();
  }

  // A slot on the board for `m`'s object, when it has tunables (board made).
  void give_slot_locked(detail::Mechanism& m) SLUICE_REQUIRES(control_mu) {
    if (!m.object->tunables().empty()) m.feed.assign(*board, &board_taken);
  }

  // Publishes `s` (which carries one reference for the stage). Under
  // control_mu, so that snapshots are published in the order their versions
  // were taken.
  void publish_locked(detail::Snapshot* s) SLUICE_REQUIRES(control_mu) SLUICE_EXCLUDES(snap_mu) {
    detail::Snapshot* old;
    {
      MutexLock lock(snap_mu);
      old = current;
      current = s;
      version.store(s->version, std::memory_order_release);
    }
    if (old != nullptr) old->unref();
  }

  // The hot path and the per-thread snapshot cache (stage.cc, the only file
  // that calls them).

  // Where `ctx` goes: this thread's cached snapshot and memo, refreshed when
  // the stage's version moved.
  [[gnu::always_inline]] inline detail::Target route(const Context& ctx) noexcept;
  // The common case, inline and free of calls so that it needs no stack frame:
  // this thread's cached snapshot is current, its memo matches `ctx`, the
  // target calls no object, and the thread owns an exclusive shard. Counts the
  // request and returns true, or returns false having done nothing.
  [[gnu::always_inline]] inline bool try_fast(const Context& ctx) noexcept;
  // Everything else: refresh, route, take the board's new values for the
  // object, call it (it may wait), count. Keeps the enforce contract of
  // stage.h: errno as found, own I/O internal.
  template <typename Call>
  [[gnu::noinline]] Verdict full(const Context& ctx, Call&& call) noexcept;
  template <typename Call>
  [[gnu::always_inline]] inline Verdict full_inline(const Context& ctx, Call&& call) noexcept;
  // Points this thread's shortcut (detail::FastTarget) at this stage for
  // requests of `origin` when its front cache entry (this stage's, after
  // try_fast or full, whose memo is the route of a request of `origin`)
  // selects by nothing but the origin, that route calls no object or one
  // that offers a grant (EnforcementObject::fast_grant), and the thread owns
  // an exclusive shard. The entry's reference keeps the statistics, the
  // object and its feed alive while it is set.
  [[gnu::noinline]] void arm_fast_target(OriginId origin) noexcept;
  // enforce()'s out-of-line rest, then the shortcut for later calls:
  // one call deep before the object's own, the way every request to an
  // object that the shortcut does not cover goes.
  [[gnu::noinline]] Verdict full_and_arm(const Context& ctx) noexcept;
  // This thread's cache entry for the stage, made current and moved to the
  // front.
  [[gnu::noinline]] detail::CacheEntry* refresh() noexcept SLUICE_EXCLUDES(snap_mu);
};

inline std::int64_t now_of(const Stage::Impl& s) {
  return s.clock->now_ns();
}

}  // namespace sluice
