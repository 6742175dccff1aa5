// A stage's statistics: a block of counters per channel and object, in
// cache-line-aligned shards. A thread leases one of kExclusiveShards for its
// lifetime and, as its only writer, updates it with plain relaxed load+store;
// threads beyond that many share the kSharedShards with relaxed fetch_add. The
// two kinds never mix: an atomic add racing a plain load+store on one counter
// would lose updates. stage.cc leases shards and counts (the hot path);
// stage_report.cc folds them for collect.
//
// Thread safety: StatsBlock's counting members from any thread, each into
// the shard it leased; fold() from any thread; take_delta() serialised by
// the caller (the stage's control mutex).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "sluice/stage_fast.h"
#include "sluice/thread_annotations.h"

namespace sluice::detail {

inline constexpr int kExclusiveShards = 32;
inline constexpr int kSharedShards = 8;
inline constexpr int kShards = kExclusiveShards + kSharedShards;

inline void bump(std::atomic<std::uint64_t>& a, std::uint64_t v, bool exclusive) noexcept {
  if (exclusive) {
    a.store(a.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  } else {
    a.fetch_add(v, std::memory_order_relaxed);
  }
}

// Shard leases: indices below kExclusiveShards are exclusive; a thread that
// finds none free gets one of the shared shards, round robin.
struct ShardAllocator {
  Mutex mu;
  std::vector<unsigned> free_list SLUICE_GUARDED_BY(mu);
  unsigned next SLUICE_GUARDED_BY(mu) = 0;
  unsigned shared_next SLUICE_GUARDED_BY(mu) = 0;
  // Shards [extent, kShards) have never been leased, so no block has counted
  // anything in them: folds stop there. Grows only (under mu): the exclusive
  // shards handed out so far, or every shard once a shared one was. A fold
  // that reads it just before a thread's first lease misses nothing that
  // thread counted before the fold; later folds see it.
  std::atomic<unsigned> extent{0};
};
// The process's allocator (never destroyed: threads may exit after main).
ShardAllocator& shard_allocator();

struct alignas(64) Shard {
  std::array<OpsBytes, kOriginSlots> origin{};
  std::array<std::atomic<std::uint64_t>, kWaitBuckets> wait{};
  std::atomic<std::uint64_t> wait_total_ns{0};
  std::atomic<std::uint64_t> cancelled{0};
  std::atomic<std::uint64_t> rejected{0};
};

struct Folded {
  std::array<Counters, kOriginSlots> origin{};
  WaitStats wait;  // bucket 0 is derived on output
  std::uint64_t cancelled = 0;
  std::uint64_t rejected = 0;

  void add(const Folded& o) {
    for (std::size_t i = 0; i < origin.size(); ++i) origin[i].add(o.origin[i]);
    wait.add(o.wait);
    cancelled += o.cancelled;
    rejected += o.rejected;
  }
  bool empty() const {
    for (const Counters& c : origin) {
      if (c.ops != 0 || c.bytes != 0) return false;
    }
    return wait.count() == 0 && wait.total_ns == 0 && cancelled == 0 && rejected == 0;
  }

  Folded minus(const Folded& o) const {
    Folded d;
    for (int i = 0; i < kOriginSlots; ++i) {
      auto u = static_cast<std::size_t>(i);
      d.origin[u] = {origin[u].ops - o.origin[u].ops, origin[u].bytes - o.origin[u].bytes};
    }
    for (std::size_t b = 0; b < d.wait.buckets.size(); ++b) {
      d.wait.buckets[b] = wait.buckets[b] - o.wait.buckets[b];
    }
    d.wait.total_ns = wait.total_ns - o.wait.total_ns;
    d.cancelled = cancelled - o.cancelled;
    d.rejected = rejected - o.rejected;
    return d;
  }
};

class StatsBlock {
 public:
  // Origins 0..kOriginSlots-2 are counted apart, the rest in the last slot.
  static std::size_t slot_of(OriginId origin) noexcept {
    return static_cast<std::size_t>(origin < kOriginSlots - 1 ? origin : kOriginSlots - 1);
  }

  void record(unsigned shard, bool exclusive, OriginId origin, std::uint64_t bytes,
              Verdict r) noexcept {
    Shard& s = shards_[shard];
    const std::size_t slot = slot_of(origin);
    bump(s.origin[slot].ops, 1, exclusive);
    bump(s.origin[slot].bytes, bytes, exclusive);
    if (r.wait_ns != 0 || r.outcome != Outcome::kOk) [[unlikely]] {
      if (r.wait_ns != 0) {
        bump(s.wait[static_cast<std::size_t>(WaitStats::bucket_of(r.wait_ns))], 1, exclusive);
        bump(s.wait_total_ns, r.wait_ns, exclusive);
      }
      if (r.outcome == Outcome::kCancelled) bump(s.cancelled, 1, exclusive);
      if (r.outcome == Outcome::kRejected) bump(s.rejected, 1, exclusive);
    }
  }

  // record() of a request that neither waited nor failed, in a shard this
  // thread owns.
  void record_exclusive_ok(unsigned shard, OriginId origin, std::uint64_t bytes) noexcept {
    Shard& s = shards_[shard];
    const std::size_t slot = slot_of(origin);
    bump(s.origin[slot].ops, 1, true);
    bump(s.origin[slot].bytes, bytes, true);
  }

  // Time a request waited after its call (Stage::settle charging what it
  // moved beyond its pre-charge): added to the wait total, in no bucket (the
  // request was put in one when it was enforced).
  void record_settle_wait(unsigned shard, bool exclusive, Verdict r) noexcept {
    Shard& s = shards_[shard];
    if (r.wait_ns != 0) bump(s.wait_total_ns, r.wait_ns, exclusive);
    if (r.outcome == Outcome::kCancelled) bump(s.cancelled, 1, exclusive);
  }

  // The counters of `origin` in a shard this thread owns, for its FastTarget.
  OpsBytes* slot(unsigned shard, OriginId origin) noexcept {
    return &shards_[shard].origin[slot_of(origin)];
  }

  // The request counted with `requested` bytes moved `actual`: unsigned
  // wrap-around makes the sum come out right whichever is larger.
  void adjust(unsigned shard, bool exclusive, OriginId origin, std::uint64_t requested,
              std::uint64_t actual) noexcept {
    Shard& s = shards_[shard];
    const std::size_t slot = slot_of(origin);
    bump(s.origin[slot].bytes, actual - requested, exclusive);
  }

  // Reads only the shards some thread leased: in a process with a few
  // threads, a few of the kShards (each fold of all of them read ~30 KB, and
  // a collect folds every channel and object).
  Folded fold() const;
  // What happened since the previous call. Callers serialise (stage control mutex).
  Folded take_delta();

  // How many routing snapshots hold the block (ChannelRoute::hold). Once a
  // removed block's count is 0 no thread can count into it any more: every
  // count goes through a snapshot the thread holds. The release decrement
  // (when the snapshot dies) pairs with the acquire load in last_reference().
  std::atomic<std::int64_t> snapshots{0};

 private:
  std::array<Shard, kShards> shards_{};
  Folded last_;
};

// Whether no snapshot holds the removed `block` any more: then no thread can
// count into it, and a fold now is its last (the acquire pairs with the
// release of the last snapshot that held it: the fold sees every count made
// through it).
inline bool last_reference(const std::shared_ptr<StatsBlock>& block) {
  return block->snapshots.load(std::memory_order_acquire) == 0;
}

}  // namespace sluice::detail
