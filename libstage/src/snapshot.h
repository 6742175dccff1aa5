// Routing: the classifiers a rule selects packed into keys, the hash tables
// that map keys to channels and objects, the model rules build (copied on
// write by apply) and the immutable, reference-counted snapshot of it that
// the hot path reads. snapshot.cc builds snapshots.
//
// Thread safety: a Snapshot is immutable once built; any number of threads
// read it while they hold a reference (ref/unref from any thread). Models are
// the stage's, under its control mutex.
#pragma once

#include <murmurhash.h>

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "board_stage.h"
#include "rules.h"
#include "sluice/dcheck.h"
#include "sluice/stage.h"
#include "stage_stats.h"

namespace sluice::detail {

// Channels plus objects a stage holds at most. Each has a block of counters
// (kShards shards of 768 bytes, ~30 KB), allocated in the application's
// process: without a limit, a runaway batch of 60,000 create_channel rules
// would take 1.9 GB and many seconds to apply.
inline constexpr std::size_t kMaxEntries = 1024;
inline constexpr std::uint32_t kHashSeed = 0x5111CEu;  // any fixed seed

// ---------------------------------------------------------------------------
// Keys: the classifiers a rule selects, packed into three words.

struct Key {
  std::array<std::uint64_t, 3> w{};
  // Spelled out: the defaulted comparison compiles to a memcmp call.
  bool operator==(const Key& o) const noexcept {
    return ((w[0] ^ o.w[0]) | (w[1] ^ o.w[1]) | (w[2] ^ o.w[2])) == 0;
  }
};
using KeyMask = Key;

// The key's middle word is the Context's bytes 16..23 as they lie in memory
// (tenant, origin, op, level: one load), the last word the size class, which
// is derived from the size.
static_assert(offsetof(Context, tenant) == 16 && offsetof(Context, origin) == 20 &&
              offsetof(Context, op) == 22 && offsetof(Context, level) == 23);
static_assert(std::endian::native == std::endian::little);

// The origin's bits in the key's middle word.
inline constexpr std::uint64_t kOriginBits = 0xFFFFull << 32;

// The mask of the classifiers in `set`.
KeyMask mask_of(ClassifierSet set);

// Whether a mask selects nothing but the origin (or nothing at all).
constexpr bool by_origin_only(const KeyMask& m) noexcept {
  return m.w[0] == 0 && (m.w[1] & ~kOriginBits) == 0 && m.w[2] == 0;
}

inline Key masked(const Context& c, const KeyMask& m) noexcept {
  Key k;
  std::uint64_t mid;
  std::memcpy(&mid, &c.tenant, sizeof(mid));
  k.w[0] = c.workflow & m.w[0];
  k.w[1] = mid & m.w[1];
  k.w[2] = std::uint64_t{size_class_of(c.size)} & m.w[2];
  return k;
}

inline std::uint32_t hash_key(const Key& k) noexcept {
  std::uint32_t out[1];
  lmmh_x86_32(k.w.data(), sizeof(k.w), kHashSeed, out);
  return out[0];
}

// Open addressing, linear probing, load factor <= 1/2, exact key compare
// (a 32-bit token alone could collide).
class FlatTable {
 public:
  // Returns the target already holding `key`, or -1 after inserting it.
  int insert(const Key& key, int target) {
    if ((count_ + 1) * 2 > slots_.size()) grow();
    std::uint32_t h = hash_key(key);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.target < 0) {
        s = {key, h, target};
        ++count_;
        return -1;
      }
      if (s.hash == h && s.key == key) return s.target;
    }
  }
  int find(const Key& key) const noexcept {
    if (count_ == 0) return -1;
    std::uint32_t h = hash_key(key);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.target < 0) return -1;
      if (s.hash == h && s.key == key) return s.target;
    }
  }
  std::size_t size() const noexcept { return count_; }
  // For debug checks: every target is in [0, n), the count matches the
  // occupied slots and the load factor is at most 1/2.
  bool well_formed(std::size_t n) const noexcept {
    std::size_t occupied = 0;
    for (const Slot& s : slots_) {
      if (s.target < 0) continue;
      if (static_cast<std::size_t>(s.target) >= n || s.hash != hash_key(s.key)) return false;
      ++occupied;
    }
    return occupied == count_ && count_ * 2 <= slots_.size();
  }

 private:
  struct Slot {
    Key key;
    std::uint32_t hash = 0;
    int target = -1;
  };
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    std::size_t cap = old.empty() ? 8 : old.size() * 2;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    count_ = 0;
    for (const Slot& s : old) {
      if (s.target >= 0) insert(s.key, s.target);
    }
  }
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::size_t count_ = 0;
};

// ---------------------------------------------------------------------------
// The model (what rules built; copied on write by apply) and the snapshot
// (what the hot path reads).

// The mechanism and its counters: shared by every model and snapshot that
// contains the object, so that rule batches copy descriptions, never objects.
// The counters are held apart from the object so that a batch that removes
// and recreates an object under the same name keeps them (see apply_rule).
struct Mechanism {
  std::unique_ptr<EnforcementObject> object;
  std::shared_ptr<StatsBlock> stats;
  Feed feed;  // its board slot, when the stage has a board and it has tunables
};

struct ObjectEntry {
  std::string name;
  std::string type;
  std::shared_ptr<Mechanism> mech;
  std::vector<MatchSpec> matches;
  bool is_default = false;
};

struct ChannelEntry {
  std::string name;
  ClassifierSet classifiers = 0;
  std::vector<MatchSpec> matches;
  bool is_default = false;
  std::vector<ObjectEntry> objects;
  std::shared_ptr<StatsBlock> stats;  // requests taken by no object; never null

  ObjectEntry* find(const std::string& object) {
    for (auto& o : objects) {
      if (o.name == object) return &o;
    }
    return nullptr;
  }
};

struct Model {
  ClassifierSet classifiers = 0;
  std::vector<ChannelEntry> channels;

  ChannelEntry* find(const std::string& channel) {
    for (auto& c : channels) {
      if (c.name == channel) return &c;
    }
    return nullptr;
  }
};

// The counters of a channel or object that a batch removed (and did not
// create again under its name in the same batch). What they counted since the
// last collect, and what threads still holding a snapshot with them count
// after the removal (a request that was waiting in a removed object, say),
// goes to the next collects under the same names (Stage::collect), so that no
// counted request is lost. Once no snapshot holds the block (this list holds
// the last reference), nothing can count into it any more: its last delta is
// kept in `rest` and the block is freed.
struct Retired {
  std::string channel;
  std::string object;                 // empty: the channel's own counters
  std::string type;                   // the object's type
  std::shared_ptr<StatsBlock> block;  // null once only `rest` is left
  Folded rest;                        // counted, not collected yet
};

struct Target {
  // Null when there is nothing to call: no object, or one that passes every
  // request through (EnforcementObject::passes_through()).
  EnforcementObject* object = nullptr;
  StatsBlock* stats = nullptr;
  // The object's link to the board when it has tunables, else null.
  Feed* feed = nullptr;
};

struct ChannelRoute {
  KeyMask mask;
  FlatTable table;
  std::vector<Target> objects;
  Target fallback;            // default object, first object, or the channel itself
  StatsBlock* own = nullptr;  // the channel's own counters

  // Counts the snapshot among the holders of the route's blocks, or stops.
  void hold() noexcept {
    own->snapshots.fetch_add(1, std::memory_order_relaxed);
    for (const Target& t : objects) t.stats->snapshots.fetch_add(1, std::memory_order_relaxed);
  }
  void release() noexcept {
    own->snapshots.fetch_sub(1, std::memory_order_release);
    for (const Target& t : objects) t.stats->snapshots.fetch_sub(1, std::memory_order_release);
  }
};

struct Snapshot {
  std::atomic<std::int64_t> refs{1};
  std::uint64_t version = 0;
  KeyMask mask;
  KeyMask memo_mask;  // every classifier any decision depends on
  FlatTable table;
  std::vector<ChannelRoute> routes;
  int fallback = -1;
  Target unclassified;
  // Ownership: the mechanisms and blocks the raw pointers above point into,
  // in one vector (one allocation fewer to meet cold when the snapshot dies).
  std::vector<std::shared_ptr<const void>> owned;
  // The mechanisms whose objects hold capacity (also in `owned`), for the
  // Holds that Stage::acquire hands out: they keep a mechanism alive.
  std::vector<std::shared_ptr<Mechanism>> holders;

  // A reference to `object`'s mechanism, as the object, when it holds
  // capacity and this snapshot routes to it; else null.
  std::shared_ptr<EnforcementObject> holder_of(const EnforcementObject* object) const noexcept {
    for (const auto& m : holders) {
      if (m->object.get() == object) return {m, m->object.get()};
    }
    return nullptr;
  }

  Target route(const Context& c) const noexcept {
    int ch = table.find(masked(c, mask));
    if (ch < 0) ch = fallback;
    if (ch < 0) return unclassified;
    SLUICE_DCHECK(static_cast<std::size_t>(ch) < routes.size(), "a route's channel exists");
    const ChannelRoute& r = routes[static_cast<std::size_t>(ch)];
    int o = r.table.find(masked(c, r.mask));
    SLUICE_DCHECK(o < 0 || static_cast<std::size_t>(o) < r.objects.size(),
                  "a route's object exists");
    return o >= 0 ? r.objects[static_cast<std::size_t>(o)] : r.fallback;
  }

  // For debug checks: what route() relies on. Every table target names a
  // channel or object that exists, every target counts somewhere, and the
  // memo's mask covers every classifier a decision reads.
  bool well_formed() const noexcept {
    if (!table.well_formed(routes.size())) return false;
    if (fallback >= 0 && static_cast<std::size_t>(fallback) >= routes.size()) return false;
    if (unclassified.stats == nullptr) return false;
    for (std::size_t w = 0; w < 3; ++w) {
      if ((mask.w[w] & ~memo_mask.w[w]) != 0) return false;
    }
    for (const ChannelRoute& r : routes) {
      if (r.own == nullptr || r.fallback.stats == nullptr) return false;
      if (!r.table.well_formed(r.objects.size())) return false;
      for (std::size_t w = 0; w < 3; ++w) {
        if ((r.mask.w[w] & ~memo_mask.w[w]) != 0) return false;
      }
      for (const Target& t : r.objects) {
        if (t.stats == nullptr) return false;
        if (t.object != nullptr && t.object->passes_through()) return false;
      }
    }
    return true;
  }

  void ref() noexcept { refs.fetch_add(1, std::memory_order_relaxed); }
  void unref() noexcept {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  Snapshot() = default;
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;
  // The last reference went after every thread that held one was done
  // counting through it (acq_rel above): releasing the blocks passes that on.
  ~Snapshot() {
    for (ChannelRoute& r : routes) r.release();
  }
};

// A snapshot of `m` (with one reference, for the caller) at `version`, or the
// first rule of `m` that does not hold (overlapping matches, two defaults).
StatusOr<Snapshot*> build_snapshot(const Model& m, std::uint64_t version,
                                   const std::shared_ptr<StatsBlock>& unclassified);

// A snapshot version: unique across all stages of the process, so that one
// compare tells a thread that its cached snapshot is a stage's current one.
std::uint64_t next_version() noexcept;

}  // namespace sluice::detail
