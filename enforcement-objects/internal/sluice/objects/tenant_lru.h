// TenantLru: the eviction core of a cache shared by tenants that each keep a
// reserved threshold (Delta Fair Sharing's read-cache reservations): the
// victim is the least recently used unpinned entry among the owners above
// their thresholds; only when none is above does an owner at or below lose
// one (counted in `evictions_below_reserved`). The cache allocates entries
// and embeds a Node in each; pinned entries are never evicted. Every
// operation is O(1) in entries (O(log owners) when an owner changes place in
// its heaps); steps() counts the work for tests. Thresholds are set directly
// or read from a configuration's atomic word, shifted by share_shift, and
// re-read when the epoch word moves. Knows nothing of RocksDB.
//
// Thread safety: none of its own; used under the cache's (shard's) lock. The
// threshold and epoch words may change concurrently from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "sluice/objects/types.h"

namespace sluice {

class TenantLru {
 public:
  using OwnerId = std::uint32_t;

  // The links an entry of the cache embeds. The core sets every field.
  struct Node {
    Node* prev = nullptr;  // in the owner's list while linked
    Node* next = nullptr;
    std::uint64_t tick = 0;    // when it was linked (last use)
    std::uint64_t charge = 0;  // what it counts against the capacity
    OwnerId owner = 0;
    bool linked = false;  // on its owner's list (evictable)
  };

  // `epoch`: the word whose change means "read the thresholds again" (null:
  // thresholds are only set with set_threshold()). `share_shift`: the
  // thresholds read from words are divided by 2^share_shift (rounded up).
  explicit TenantLru(const std::atomic<std::uint64_t>* epoch = nullptr,
                     unsigned share_shift = 0) noexcept;
  ~TenantLru();
  TenantLru(const TenantLru&) = delete;
  TenantLru& operator=(const TenantLru&) = delete;

  // A new owner (ids are 0, 1, 2, ... in order). `reserved`: the word its
  // threshold is read from, for the core's life; null: 0 until
  // set_threshold(). Allocates; not for a hot path.
  OwnerId add_owner(const std::atomic<std::uint64_t>* reserved = nullptr);
  std::uint32_t owners() const noexcept { return static_cast<std::uint32_t>(owners_.size()); }
  // Sets an owner's threshold (bytes of this core); an owner read from a
  // word goes back to the word's value at the next epoch change.
  void set_threshold(OwnerId o, std::uint64_t bytes) noexcept;
  std::uint64_t threshold(OwnerId o) const noexcept { return owners_[o]->threshold; }

  // Accounts a new entry of `owner` with `charge`; linked at the head of
  // the owner's list unless `pinned`.
  void insert(Node& n, OwnerId owner, std::uint64_t charge, bool pinned) noexcept {
    n.owner = owner;
    n.charge = charge;
    n.linked = false;
    Owner& o = *owners_[owner];
    o.usage += charge;
    ++o.entries;
    ++o.inserts;
    o.inserted_bytes += charge;
    usage_ += charge;
    if (!pinned) link(n, o);
    fix(o);  // its usage grew, and its list may have been empty
  }
  // The entry is referenced now: off its list, not evictable. No-op if it
  // is not linked.
  void pin(Node& n) noexcept {
    if (!n.linked) return;
    Owner& o = *owners_[n.owner];
    const bool tail = o.head.prev == &n;
    unlink(n, o);
    if (tail) fix(o);
  }
  // Nobody references the entry any more: at the head of its list (most
  // recently used).
  void unpin(Node& n) noexcept {
    if (n.linked) return;
    Owner& o = *owners_[n.owner];
    // A new head changes the tail only when the list was empty.
    if (link(n, o)) fix(o);
  }
  // Removes an entry (erased from the cache, replaced, or freed).
  void erase(Node& n) noexcept {
    Owner& o = *owners_[n.owner];
    if (n.linked) unlink(n, o);
    unaccount(n, o);
    fix(o);
  }
  // Chooses a victim to make room for `incoming` bytes of `inserting`
  // (see the top), removes it and returns it; null when every entry is
  // pinned.
  Node* evict(OwnerId inserting, std::uint64_t incoming) noexcept;

  void hit(OwnerId o) noexcept { ++owners_[o]->hits; }
  void miss(OwnerId o) noexcept { ++owners_[o]->misses; }

  std::uint64_t usage() const noexcept { return usage_; }
  std::uint64_t pinned_usage() const noexcept { return usage_ - linked_usage_; }
  std::uint64_t usage(OwnerId o) const noexcept { return owners_[o]->usage; }
  std::uint64_t pinned_usage(OwnerId o) const noexcept {
    return owners_[o]->usage - owners_[o]->linked_usage;
  }
  TenantLruStats stats(OwnerId o) const noexcept;
  // The owner's least recently used linked entry, or null.
  const Node* lru_of(OwnerId o) const noexcept {
    const Owner& w = *owners_[o];
    return w.head.prev == &w.head ? nullptr : w.head.prev;
  }
  // Entries looked at and heap levels moved, since creation (see the top).
  std::uint64_t steps() const noexcept { return steps_; }

  // Debug builds: the lists, usages and heaps agree. Walks every entry.
  void check_invariants() const;

 private:
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};

  struct Owner {
    Node head;  // sentinel: head.next is the most recently used, head.prev the least
    std::uint64_t usage = 0;
    std::uint64_t linked_usage = 0;
    std::uint64_t threshold = 0;
    std::uint64_t entries = 0;
    std::uint64_t hits = 0;
    std::uint64_t misses = 0;
    std::uint64_t inserts = 0;
    std::uint64_t inserted_bytes = 0;
    std::uint64_t evictions = 0;
    std::uint64_t evictions_below = 0;
    const std::atomic<std::uint64_t>* reserved = nullptr;
    std::uint32_t pos_all = kNone;   // in all_
    std::uint32_t pos_over = kNone;  // in over_
    OwnerId id = 0;

    bool empty() const noexcept { return head.next == &head; }
    std::uint64_t tail_tick() const noexcept { return head.prev->tick; }
  };

  // An indexed binary min-heap of owners by their tail's tick.
  struct Heap {
    std::vector<Owner*> v;
    std::uint32_t Owner::*pos;
  };

  // Links `n` at the head; returns whether the list was empty.
  bool link(Node& n, Owner& o) noexcept {
    const bool was_empty = o.empty();
    n.tick = ++tick_;
    n.prev = &o.head;
    n.next = o.head.next;
    o.head.next->prev = &n;
    o.head.next = &n;
    n.linked = true;
    o.linked_usage += n.charge;
    linked_usage_ += n.charge;
    return was_empty;
  }
  void unlink(Node& n, Owner& o) noexcept {
    n.prev->next = n.next;
    n.next->prev = n.prev;
    n.prev = n.next = nullptr;
    n.linked = false;
    o.linked_usage -= n.charge;
    linked_usage_ -= n.charge;
  }
  void unaccount(Node& n, Owner& o) noexcept {
    o.usage -= n.charge;
    --o.entries;
    usage_ -= n.charge;
  }
  // Re-places `o` in both heaps after its list, usage or threshold changed.
  void fix(Owner& o) noexcept {
    const bool any = !o.empty();
    place(all_, o, any);
    place(over_, o, any && o.usage > o.threshold);
  }
  void place(Heap& h, Owner& o, bool member) noexcept;
  void sift_up(Heap& h, std::uint32_t i) noexcept;
  void sift_down(Heap& h, std::uint32_t i) noexcept;
  void set(Heap& h, std::uint32_t i, Owner* o) noexcept {
    h.v[i] = o;
    o->*h.pos = i;
  }
  std::uint64_t share_of(std::uint64_t bytes) const noexcept {
    return share_shift_ == 0 ? bytes
                             : (bytes >> share_shift_) +
                                   ((bytes & ((std::uint64_t{1} << share_shift_) - 1)) != 0);
  }
  // Reads every word-backed threshold again.
  void reload_thresholds() noexcept;

  const std::atomic<std::uint64_t>* const epoch_;
  const unsigned share_shift_;
  std::uint64_t seen_epoch_ = 0;
  std::uint64_t tick_ = 0;
  std::uint64_t usage_ = 0;
  std::uint64_t linked_usage_ = 0;
  std::uint64_t steps_ = 0;
  std::vector<std::unique_ptr<Owner>> owners_;
  Heap all_{{}, &Owner::pos_all};    // owners with a linked entry
  Heap over_{{}, &Owner::pos_over};  // of those, the ones above their threshold
};

}  // namespace sluice
