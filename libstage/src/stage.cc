// The stage: routing snapshots, the per-thread snapshot cache, sharded
// statistics, and the control operations (apply, collect, info).
//
// How the hot path stays free of locks, allocation and syscalls:
//  - Routing state is an immutable Snapshot, reference counted. The stage's
//    `version` is one atomic read per request; a thread keeps the snapshot it
//    used last (with one reference) in a small initial-exec TLS cache and only
//    takes `snap_mu` (a pointer swap's worth of critical section) when the
//    version moved. Old snapshots die when the last thread lets go of them.
//  - Channel and object selection are open-addressing hash lookups over the
//    masked classifiers (MurmurHash3), with a per-thread memo of the last
//    decision, so a thread that keeps sending the same kind of request does
//    not hash at all.
//  - Statistics go to cache-line-aligned shards per object. A thread leases
//    one of kExclusiveShards for its lifetime and, as its only writer, updates
//    it with plain relaxed load+store; threads beyond that many share the
//    kSharedShards with relaxed fetch_add. The two kinds never mix: an atomic
//    add racing a plain load+store on one counter would lose updates.
#include "sluice/stage.h"

#include <fcntl.h>
#include <murmurhash.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <sstream>

#include "board_stage.h"
#include "rules.h"
#include "sluice/wire.h"
#include "tls.h"

namespace sluice {
namespace detail {

namespace {

constexpr int kExclusiveShards = 32;
constexpr int kSharedShards = 8;
constexpr int kShards = kExclusiveShards + kSharedShards;
constexpr std::size_t kMaxKeysPerMatch = 65536;
// Channels plus objects a stage holds at most. Each has a block of counters
// (kShards shards of 768 bytes, ~30 KB), allocated in the application's
// process: without a limit, a runaway batch of 60,000 create_channel rules
// would take 1.9 GB and many seconds to apply.
constexpr std::size_t kMaxEntries = 1024;
constexpr std::uint32_t kHashSeed = 0x5111CEu;  // any fixed seed

// ---------------------------------------------------------------------------
// Statistics.

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
  std::mutex mu;
  std::vector<unsigned> free_list;
  unsigned next = 0;
  unsigned shared_next = 0;
  // Shards [extent, kShards) have never been leased, so no block has counted
  // anything in them: folds stop there. Grows only (under mu): the exclusive
  // shards handed out so far, or every shard once a shared one was. A fold
  // that reads it just before a thread's first lease misses nothing that
  // thread counted before the fold; later folds see it.
  std::atomic<unsigned> extent{0};
};
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
  Folded fold() const {
    Folded f;
    const unsigned extent = shard_allocator().extent.load(std::memory_order_acquire);
    for (unsigned k = 0; k < extent; ++k) {
      const Shard& s = shards_[k];
      for (std::size_t i = 0; i < s.origin.size(); ++i) {
        f.origin[i].ops += s.origin[i].ops.load(std::memory_order_relaxed);
        f.origin[i].bytes += s.origin[i].bytes.load(std::memory_order_relaxed);
      }
      for (std::size_t b = 0; b < s.wait.size(); ++b) {
        f.wait.buckets[b] += s.wait[b].load(std::memory_order_relaxed);
      }
      f.wait.total_ns += s.wait_total_ns.load(std::memory_order_relaxed);
      f.cancelled += s.cancelled.load(std::memory_order_relaxed);
      f.rejected += s.rejected.load(std::memory_order_relaxed);
    }
    return f;
  }

  // What happened since the previous call. Callers serialise (stage control mutex).
  Folded take_delta() {
    Folded now = fold();
    Folded d = now.minus(last_);
    last_ = now;
    return d;
  }

  // How many routing snapshots hold the block (ChannelRoute::hold). Once a
  // removed block's count is 0 no thread can count into it any more: every
  // count goes through a snapshot the thread holds. The release decrement
  // (when the snapshot dies) pairs with the acquire load in last_reference() (stage.cc).
  std::atomic<std::int64_t> snapshots{0};

 private:
  std::array<Shard, kShards> shards_{};
  Folded last_;
};

ShardAllocator& shard_allocator() {
  static auto* a = new ShardAllocator();  // never destroyed: threads may exit after main
  return *a;
}

SLUICE_TLS thread_local unsigned t_shard = ~0u;

struct ShardLease {
  ~ShardLease() {
    t_thread_context.fast = {};  // points into the shard given up here
    if (t_shard < static_cast<unsigned>(kExclusiveShards)) {
      ShardAllocator& a = shard_allocator();
      std::lock_guard lock(a.mu);
      a.free_list.push_back(t_shard);
    }
    t_shard = ~0u;
  }
};
thread_local ShardLease t_lease;

[[gnu::noinline]] unsigned lease_shard() noexcept {
  ShardAllocator& a = shard_allocator();
  unsigned s;
  {
    std::lock_guard lock(a.mu);
    if (!a.free_list.empty()) {
      s = a.free_list.back();
      a.free_list.pop_back();
    } else if (a.next < static_cast<unsigned>(kExclusiveShards)) {
      s = a.next++;
      a.extent.store(a.next, std::memory_order_release);
    } else {
      s = static_cast<unsigned>(kExclusiveShards) +
          (a.shared_next++ % static_cast<unsigned>(kSharedShards));
      a.extent.store(static_cast<unsigned>(kShards), std::memory_order_release);
    }
  }
  t_shard = s;
  (void)&t_lease;  // registers the lease's destructor for this thread
  return s;
}

inline unsigned my_shard() noexcept {
  unsigned s = t_shard;
  if (s == ~0u) [[unlikely]]
    s = lease_shard();
  return s;
}

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
constexpr std::uint64_t kOriginBits = 0xFFFFull << 32;

KeyMask mask_of(ClassifierSet set) {
  KeyMask m;
  auto has = [&](Classifier c) { return (set & (1u << static_cast<unsigned>(c))) != 0; };
  if (has(Classifier::kWorkflow)) m.w[0] = ~std::uint64_t{0};
  if (has(Classifier::kTenant)) m.w[1] |= 0xFFFF'FFFFull;
  if (has(Classifier::kOrigin)) m.w[1] |= kOriginBits;
  if (has(Classifier::kOperation)) m.w[1] |= 0xFFull << 48;
  if (has(Classifier::kLevel)) m.w[1] |= 0xFFull << 56;
  if (has(Classifier::kSizeClass)) m.w[2] = 0xFF;
  return m;
}

Key pack(std::uint64_t workflow, std::uint64_t tenant, std::uint64_t origin, std::uint64_t op,
         std::uint64_t size_class, std::uint64_t level) {
  Key k;
  k.w[0] = workflow;
  k.w[1] = tenant | (origin << 32) | (op << 48) | (level << 56);
  k.w[2] = size_class;
  return k;
}

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

// Every key a match denotes (the product of its value lists), in `set`'s layout.
StatusOr<std::vector<Key>> expand(const MatchSpec& m, ClassifierSet set, const std::string& owner,
                                  const std::string& selector) {
  // A classifier the match names but the rule does not select is the likelier
  // mistake (a stale match), so it is reported first.
  for (int i = 0; i < kClassifierCount; ++i) {
    unsigned bit = 1u << i;
    if (!(set & bit) && (m.given & bit)) {
      return Status::invalid(owner + ": match " + wire::echo(m.source) + " names classifier '" +
                             std::string(classifier_name(static_cast<Classifier>(i))) +
                             "', which " + selector + " does not select");
    }
  }
  for (int i = 0; i < kClassifierCount; ++i) {
    unsigned bit = 1u << i;
    if ((set & bit) && !(m.given & bit)) {
      return Status::invalid(owner + ": match " + wire::echo(m.source) +
                             " does not name classifier '" +
                             std::string(classifier_name(static_cast<Classifier>(i))) +
                             "', which " + selector + " selects");
    }
  }
  std::array<std::vector<std::uint64_t>, kClassifierCount> v = m.values;
  for (auto& list : v) {
    if (list.empty()) list.push_back(0);
  }
  std::size_t total = 1;
  for (const auto& list : v) {
    total *= list.size();
    if (total > kMaxKeysPerMatch) {
      return Status::invalid(owner + ": match " + wire::echo(m.source) + " expands to more than " +
                             std::to_string(kMaxKeysPerMatch) + " combinations");
    }
  }
  std::vector<Key> keys;
  keys.reserve(total);
  auto at = [&](Classifier c, std::size_t i) { return v[static_cast<std::size_t>(c)][i]; };
  auto n = [&](Classifier c) { return v[static_cast<std::size_t>(c)].size(); };
  for (std::size_t a = 0; a < n(Classifier::kWorkflow); ++a)
    for (std::size_t b = 0; b < n(Classifier::kOperation); ++b)
      for (std::size_t c = 0; c < n(Classifier::kSizeClass); ++c)
        for (std::size_t d = 0; d < n(Classifier::kOrigin); ++d)
          for (std::size_t e = 0; e < n(Classifier::kTenant); ++e)
            for (std::size_t f = 0; f < n(Classifier::kLevel); ++f)
              keys.push_back(pack(at(Classifier::kWorkflow, a), at(Classifier::kTenant, e),
                                  at(Classifier::kOrigin, d), at(Classifier::kOperation, b),
                                  at(Classifier::kSizeClass, c), at(Classifier::kLevel, f)));
  return keys;
}

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

  Target route(const Context& c) const noexcept {
    int ch = table.find(masked(c, mask));
    if (ch < 0) ch = fallback;
    if (ch < 0) return unclassified;
    const ChannelRoute& r = routes[static_cast<std::size_t>(ch)];
    int o = r.table.find(masked(c, r.mask));
    return o >= 0 ? r.objects[static_cast<std::size_t>(o)] : r.fallback;
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

StatusOr<Snapshot*> build_snapshot(const Model& m, std::uint64_t version,
                                   const std::shared_ptr<StatsBlock>& unclassified) {
  auto s = std::make_unique<Snapshot>();
  s->version = version;
  s->mask = mask_of(m.classifiers);
  s->memo_mask = s->mask;
  s->unclassified = {nullptr, unclassified.get()};
  std::size_t objects = 0;
  for (const ChannelEntry& c : m.channels) objects += c.objects.size();
  s->routes.reserve(m.channels.size());
  s->owned.reserve(1 + m.channels.size() + objects);
  s->owned.push_back(unclassified);
  for (std::size_t ci = 0; ci < m.channels.size(); ++ci) {
    const ChannelEntry& c = m.channels[ci];
    // Error messages only: built when there is a match to check.
    auto owner = [&c] { return "channel '" + c.name + "'"; };
    if (c.is_default) {
      if (s->fallback >= 0) {
        return Status::invalid("channels '" +
                               m.channels[static_cast<std::size_t>(s->fallback)].name + "' and '" +
                               c.name + "' are both marked default");
      }
      s->fallback = static_cast<int>(ci);
    }
    for (const MatchSpec& match : c.matches) {
      auto keys = expand(match, m.classifiers, owner(), "the stage's differentiate rule");
      if (!keys.is_ok()) return keys.status();
      for (const Key& k : keys.value()) {
        int prev = s->table.insert(k, static_cast<int>(ci));
        if (prev >= 0 && prev != static_cast<int>(ci)) {
          return Status::invalid(owner() + ": match " + wire::echo(match.source) +
                                 " overlaps a match of channel '" +
                                 m.channels[static_cast<std::size_t>(prev)].name + "'");
        }
      }
    }
    ChannelRoute r;
    r.own = c.stats.get();
    r.mask = mask_of(c.classifiers);
    r.objects.reserve(c.objects.size());
    for (std::size_t w = 0; w < 3; ++w) s->memo_mask.w[w] |= r.mask.w[w];
    s->owned.push_back(c.stats);
    r.fallback = {nullptr, c.stats.get()};
    int default_object = -1;
    for (std::size_t oi = 0; oi < c.objects.size(); ++oi) {
      const ObjectEntry& o = c.objects[oi];
      EnforcementObject* obj = o.mech->object.get();
      if (obj->passes_through()) {
        r.objects.push_back({nullptr, o.mech->stats.get(), nullptr});
      } else {
        r.objects.push_back(
            {obj, o.mech->stats.get(), obj->tunables().empty() ? nullptr : &o.mech->feed});
      }
      s->owned.push_back(o.mech);
      auto oowner = [&c, &o] { return "object '" + c.name + "/" + o.name + "'"; };
      if (o.is_default) {
        if (default_object >= 0) {
          return Status::invalid(owner() + ": objects '" +
                                 c.objects[static_cast<std::size_t>(default_object)].name +
                                 "' and '" + o.name + "' are both marked default");
        }
        default_object = static_cast<int>(oi);
      }
      for (const MatchSpec& match : o.matches) {
        auto keys = expand(match, c.classifiers, oowner(), "the channel's differentiate rule");
        if (!keys.is_ok()) return keys.status();
        for (const Key& k : keys.value()) {
          int prev = r.table.insert(k, static_cast<int>(oi));
          if (prev >= 0 && prev != static_cast<int>(oi)) {
            return Status::invalid(oowner() + ": match " + wire::echo(match.source) +
                                   " overlaps a match of object '" +
                                   c.objects[static_cast<std::size_t>(prev)].name + "'");
          }
        }
      }
    }
    if (!r.objects.empty())
      r.fallback = r.objects[default_object >= 0 ? static_cast<std::size_t>(default_object) : 0];
    s->routes.push_back(std::move(r));
    s->routes.back().hold();
  }
  return s.release();
}

// ---------------------------------------------------------------------------
// The per-thread snapshot cache.

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

// The memo missed: route through the snapshot's tables and remember it.
// The key is recomputed here rather than passed, so the hot path compares it
// in registers and never spills it for this (cold) call.
[[gnu::noinline]] Target route_and_memo(CacheEntry& e, const Context& ctx) noexcept {
  Target t = e.snap->route(ctx);
  e.memo_key = masked(ctx, e.memo_mask);
  e.memo = t;
  e.memo_plain = t.object == nullptr ? t.stats : nullptr;
  return t;
}
// Where `ctx` goes in the snapshot `e` holds: the memo when it matches.
[[gnu::always_inline]] inline Target route_in(CacheEntry& e, const Context& ctx) noexcept {
  return (e.memo.stats != nullptr && masked(ctx, e.memo_mask) == e.memo_key)
             ? e.memo
             : route_and_memo(e, ctx);
}
// Counts one enforced request in this thread's shard of the target's block;
// nothing for one that would have waited and must not (it did not happen).
[[gnu::always_inline]] inline void record(const Target& t, const Context& ctx, Verdict v) noexcept {
  if (v.outcome == Outcome::kWouldWait) [[unlikely]]
    return;
  const unsigned shard = my_shard();
  t.stats->record(shard, shard < static_cast<unsigned>(kExclusiveShards), ctx.origin, ctx.size, v);
}

// The object's part of enforcing `ctx`, with its flags (sluice/context.h):
// a bounded pre-charge is the size the object sees; a request that must not
// wait is only tried. Such a request is never transformed.
[[gnu::noinline]] Verdict enforce_flagged(EnforcementObject& o, const Context& ctx) noexcept {
  Context c = ctx;
  c.size = pre_charge_of(ctx);
  return (ctx.flags & context_flag::kNoWait) != 0 ? o.try_enforce_context(c) : o.enforce_context(c);
}
inline Verdict enforce_object(EnforcementObject& o, const Context& ctx) noexcept {
  // A bounded request no larger than the bound is charged whole: as unflagged.
  if ((ctx.flags & context_flag::kNoWait) == 0 && pre_charge_of(ctx) == ctx.size) [[likely]]
    return o.enforce_context(ctx);
  return enforce_flagged(o, ctx);
}
inline Result enforce_object(EnforcementObject& o, const Context& ctx, const Request& request) {
  if (ctx.flags == 0) [[likely]]
    return o.enforce(ctx, request);
  if ((ctx.flags & context_flag::kNoWait) == 0) {
    Context c = ctx;
    c.size = pre_charge_of(ctx);
    return o.enforce(c, request);
  }
  const Verdict v = enforce_flagged(o, ctx);
  return {v.outcome, v.wait_ns, nullptr};
}

constexpr int kCacheEntries = 4;
SLUICE_TLS thread_local std::array<CacheEntry, kCacheEntries> t_cache{};

struct CacheReleaser {
  ~CacheReleaser() {
    t_thread_context.fast = {};  // points into a snapshot released here
    for (CacheEntry& e : t_cache) {
      if (e.snap != nullptr) e.snap->unref();
      e = CacheEntry{};
    }
  }
};
thread_local CacheReleaser t_releaser;

std::atomic<std::uint64_t> g_next_uid{1};
// Snapshot versions are unique across all stages of the process, so that one
// compare tells a thread that its cached snapshot is this stage's current one.
std::atomic<std::uint64_t> g_next_version{1};
inline std::uint64_t next_version() noexcept {
  return g_next_version.fetch_add(1);
}

}  // namespace
}  // namespace detail

using detail::CacheEntry;
using detail::Snapshot;

struct Stage::Impl {
  // Read on every request: keep together.
  std::atomic<std::uint64_t> version{0};
  const std::uint64_t uid = detail::g_next_uid.fetch_add(1);

  // The board, once made (Stage::board): declared before anything holding
  // objects, so that it is unmapped after them. Set under control_mu.
  std::unique_ptr<detail::StageBoard> board;
  std::atomic<std::uint64_t> board_taken{0};  // board writes objects took

  std::string name;
  std::map<std::string, std::string> labels;
  Clock* clock = nullptr;
  const Registry* registry = nullptr;
  std::int64_t pid = 0;

  std::mutex snap_mu;  // guards `current` (the pointer, not the snapshot)
  Snapshot* current = nullptr;

  mutable std::mutex control_mu;  // serialises apply, collect, info, shutdown
  detail::Model model;
  // Channels plus objects in `model` (see kMaxEntries), kept by apply so that
  // a batch that can create need not count them in the cold model.
  std::size_t entries = 0;
  std::shared_ptr<detail::StatsBlock> unclassified = std::make_shared<detail::StatsBlock>();
  // Counters of removed channels and objects not collected yet (detail::Retired).
  std::vector<detail::Retired> retired;
  std::uint64_t rules_version = 0;
  std::int64_t created_ns = 0;
  std::int64_t last_collect_ns = 0;
  bool shut_down = false;

  ~Impl() {
    if (current != nullptr) current->unref();
  }

  // A slot on the board for `m`'s object, when it has tunables (control_mu
  // held, board made).
  void give_slot(detail::Mechanism& m) {
    if (!m.object->tunables().empty()) m.feed.assign(*board, &board_taken);
  }

  // Publishes `s` (which carries one reference for the stage).
  void publish(Snapshot* s) {
    Snapshot* old;
    {
      std::lock_guard lock(snap_mu);
      old = current;
      current = s;
      version.store(s->version, std::memory_order_release);
    }
    if (old != nullptr) old->unref();
  }

  // Where `ctx` goes: this thread's cached snapshot and memo, refreshed when
  // the stage's version moved.
  [[gnu::always_inline]] detail::Target route(const Context& ctx) noexcept {
    CacheEntry* e = &detail::t_cache[0];
    if (e->uid != uid || e->version != version.load(std::memory_order_acquire)) [[unlikely]] {
      e = refresh();
    }
    return detail::route_in(*e, ctx);
  }

  // The common case, inline and free of calls so that it needs no stack frame:
  // this thread's cached snapshot is current, its memo matches `ctx`, the
  // target calls no object, and the thread owns an exclusive shard. Counts the
  // request and returns true, or returns false having done nothing.
  [[gnu::always_inline]] bool try_fast(const Context& ctx) noexcept {
    // Versions are unique across stages: no need to compare the uid too.
    const CacheEntry& e = detail::t_cache[0];
    if (e.version != version.load(std::memory_order_acquire) || e.memo_plain == nullptr ||
        !(detail::masked(ctx, e.memo_mask) == e.memo_key)) {
      return false;
    }
    const unsigned shard = detail::t_shard;
    if (shard >= static_cast<unsigned>(detail::kExclusiveShards)) return false;
    e.memo_plain->record_exclusive_ok(shard, ctx.origin, ctx.size);
    return true;
  }

  // Everything else: refresh, route, take the board's new values for the
  // object, call it (it may wait), count. Keeps the enforce contract of
  // stage.h: errno as found, own I/O internal.
  template <typename Call>
  [[gnu::noinline]] auto full(const Context& ctx, Call&& call) noexcept {
    return full_inline(ctx, call);
  }
  template <typename Call>
  [[gnu::always_inline]] auto full_inline(const Context& ctx, Call&& call) noexcept {
    const int saved_errno = errno;
    InternalIoScope internal;
    const detail::Target t = route(ctx);
    if (t.feed != nullptr) t.feed->poll(*t.object);
    auto r = call(t);
    detail::record(t, ctx, verdict_of(r));
    errno = saved_errno;
    return r;
  }
  // Points this thread's shortcut (detail::FastTarget) at this stage for
  // requests of `origin` when its front cache entry (this stage's, after
  // try_fast or full, whose memo is the route of a request of `origin`)
  // selects by nothing but the origin, that route calls no object or one
  // that offers a grant (EnforcementObject::fast_grant), and the thread owns
  // an exclusive shard. The entry's reference keeps the statistics, the
  // object and its feed alive while it is set.
  [[gnu::noinline]] void arm_fast_target(OriginId origin) noexcept {
    const CacheEntry& e = detail::t_cache[0];
    const unsigned shard = detail::t_shard;
    if (!e.by_origin_only || e.uid != uid || e.memo.stats == nullptr ||
        shard >= static_cast<unsigned>(detail::kExclusiveShards)) {
      return;
    }
    detail::FastTarget f;
    f.version = e.version;
    f.slot = e.memo.stats->slot(shard, origin);
    f.key = origin;
    if (e.memo.object != nullptr) {
      const FastGrant g = e.memo.object->fast_grant();
      if (!g) return;  // the last shortcut armed stays
      f.key |= detail::kFastGrantKey;
      f.grant = g.grant;
      f.grant_state = g.state;
      // Stage::board() and apply publish a new version when they give a slot.
      f.board =
          e.memo.feed != nullptr ? e.memo.feed->slot.load(std::memory_order_acquire) : nullptr;
    }
    detail::t_thread_context.fast = f;
  }
  // enforce_context()'s out-of-line rest, then the shortcut for later calls:
  // one call deep before the object's own, the way every request to an
  // object that the shortcut does not cover goes.
  [[gnu::noinline]] Verdict full_and_arm(const Context& ctx) noexcept {
    const Verdict v = full_inline(ctx, [&](const detail::Target& t) {
      return t.object != nullptr ? detail::enforce_object(*t.object, ctx) : Verdict{};
    });
    const CacheEntry& e = detail::t_cache[0];
    if (e.by_origin_only) {
      // Not again for a shortcut already armed here (a grant that refused).
      const detail::FastTarget& f = detail::t_thread_context.fast;
      if (f.version != e.version || static_cast<OriginId>(f.key) != ctx.origin)
        arm_fast_target(ctx.origin);
    }
    return v;
  }
  static Verdict verdict_of(const Verdict& v) noexcept { return v; }
  static Verdict verdict_of(const Result& r) noexcept { return r.verdict(); }

  [[gnu::noinline]] CacheEntry* refresh() noexcept {
    auto& cache = detail::t_cache;
    // The shortcut may point into a snapshot this refresh releases.
    detail::t_thread_context.fast = {};
    (void)&detail::t_releaser;  // registers the release of cached snapshots at thread exit
    std::size_t i = 0;
    while (i < cache.size() && cache[i].uid != uid) ++i;
    if (i == cache.size()) i = cache.size() - 1;  // evict the last entry
    CacheEntry e = cache[i];
    for (std::size_t j = i; j > 0; --j) cache[j] = cache[j - 1];  // move to front
    if (e.uid != uid || e.version != version.load(std::memory_order_acquire)) {
      if (e.snap != nullptr) e.snap->unref();
      Snapshot* s;
      {
        std::lock_guard lock(snap_mu);
        s = current;
        s->ref();
      }
      e = CacheEntry{};
      e.uid = uid;
      e.snap = s;
      e.version = s->version;
      e.memo_mask = s->memo_mask;
      e.by_origin_only = detail::by_origin_only(s->memo_mask);
    }
    cache[0] = e;
    return &cache[0];
  }
};

namespace {

std::int64_t now_of(const Stage::Impl& s) {
  return s.clock->now_ns();
}

// Applies one parsed rule to the model copy.
struct Pending {
  std::vector<std::shared_ptr<detail::Mechanism>> removed;
  std::vector<std::shared_ptr<detail::Mechanism>> created;
  // The configs live in the parsed rules, which outlive the Pending.
  std::vector<std::pair<EnforcementObject*, const nlohmann::json*>> configures;
  // Counters of the channels and objects this batch removed, by name
  // (`object` empty for a channel's own), for the ones it creates again under
  // the same name.
  struct Freed {
    std::string channel;
    std::string object;
    std::shared_ptr<detail::StatsBlock> block;
    std::string type;  // the object's
  };
  std::vector<Freed> freed;
  // Channels plus objects in the model being built (see kMaxEntries).
  std::size_t entries = 0;

  // Takes note of a channel the batch removes: its objects are shut down
  // once the batch is in, and its counters may go to one created again
  // under its name.
  void remove_channel(const detail::ChannelEntry& c) {
    for (const auto& o : c.objects) remove_object(c.name, o);
    freed.push_back({c.name, {}, c.stats, {}});
    --entries;
  }
  void remove_object(const std::string& channel, const detail::ObjectEntry& o) {
    removed.push_back(o.mech);
    freed.push_back({channel, o.name, o.mech->stats, o.type});
    --entries;
  }
  // The counters a channel or object created as `channel`/`object` (empty
  // for a channel) starts with: those of the one of that name this batch
  // removed, else new ones. Reusing them keeps collect's deltas whole across
  // the swap (a static policy with `replace` swaps every channel on each
  // update), counts what threads still holding the old snapshot record, and
  // spares the stage allocating and zeroing a block (kShards shards of 768
  // bytes, ~30 KB) per channel and object, which made a swap ~3x the cost of
  // the rest of the batch.
  std::shared_ptr<detail::StatsBlock> stats_for(std::string_view channel,
                                                std::string_view object = {}) {
    for (auto it = freed.begin(); it != freed.end(); ++it) {
      if (it->channel == channel && it->object == object) {
        auto block = std::move(it->block);
        freed.erase(it);
        return block;
      }
    }
    return std::make_shared<detail::StatsBlock>();
  }
};

Status too_many_entries() {
  return Status::invalid("a stage holds at most " + std::to_string(detail::kMaxEntries) +
                         " channels and objects together");
}

Status apply_rule(Stage::Impl& s, detail::Model& m, const detail::Rule& r, Pending& p) {
  using K = detail::Rule::Kind;
  auto channel = [&]() -> StatusOr<detail::ChannelEntry*> {
    detail::ChannelEntry* c = m.find(r.channel);
    if (c == nullptr) return Status::not_found("channel '" + r.channel + "' does not exist");
    return c;
  };
  switch (r.kind) {
    case K::kCreateChannel: {
      if (m.find(r.channel) != nullptr) {
        return Status::exists("channel '" + r.channel + "' already exists");
      }
      if (p.entries >= detail::kMaxEntries) return too_many_entries();
      detail::ChannelEntry c;
      c.name = r.channel;
      c.stats = p.stats_for(r.channel);
      c.classifiers = r.classifiers;
      c.is_default = r.is_default;
      if (r.match) c.matches.push_back(*r.match);
      m.channels.push_back(std::move(c));
      ++p.entries;
      return {};
    }
    case K::kRemoveChannel: {
      auto it = std::find_if(m.channels.begin(), m.channels.end(),
                             [&](const auto& c) { return c.name == r.channel; });
      if (it == m.channels.end())
        return Status::not_found("channel '" + r.channel + "' does not exist");
      p.remove_channel(*it);
      m.channels.erase(it);
      return {};
    }
    case K::kCreateObject: {
      auto c = channel();
      if (!c.is_ok()) return c.status();
      if ((*c)->find(r.object) != nullptr) {
        return Status::exists("object '" + r.object + "' already exists in channel '" + r.channel +
                              "'");
      }
      if (p.entries >= detail::kMaxEntries) return too_many_entries();
      if (!s.registry->contains(r.type)) {
        return Status::invalid("type: " + s.registry->unknown_type(r.type));
      }
      auto obj = s.registry->create(r.type, r.config, ObjectEnv{s.clock});
      if (!obj.is_ok()) return obj.status().with_prefix("config.");
      detail::ObjectEntry e;
      e.name = r.object;
      e.type = r.type;
      e.mech = std::make_shared<detail::Mechanism>();
      e.mech->object = std::move(obj).value();
      e.mech->stats = p.stats_for(r.channel, r.object);
      e.is_default = r.is_default;
      if (r.match) e.matches.push_back(*r.match);
      p.created.push_back(e.mech);
      (*c)->objects.push_back(std::move(e));
      ++p.entries;
      return {};
    }
    case K::kRemoveObject: {
      auto c = channel();
      if (!c.is_ok()) return c.status();
      auto& objs = (*c)->objects;
      auto it =
          std::find_if(objs.begin(), objs.end(), [&](const auto& o) { return o.name == r.object; });
      if (it == objs.end()) {
        return Status::not_found("object '" + r.object + "' does not exist in channel '" +
                                 r.channel + "'");
      }
      p.remove_object(r.channel, *it);
      objs.erase(it);
      return {};
    }
    case K::kDifferentiate: {
      if (r.channel.empty()) {
        m.classifiers = r.classifiers;
        return {};
      }
      auto c = channel();
      if (!c.is_ok()) return c.status();
      (*c)->classifiers = r.classifiers;
      return {};
    }
    case K::kRoute: {
      auto c = channel();
      if (!c.is_ok()) return c.status();
      if (r.object.empty()) {
        (*c)->matches.push_back(*r.match);
        return {};
      }
      detail::ObjectEntry* o = (*c)->find(r.object);
      if (o == nullptr) {
        return Status::not_found("object '" + r.object + "' does not exist in channel '" +
                                 r.channel + "'");
      }
      o->matches.push_back(*r.match);
      return {};
    }
    case K::kConfigure: {
      auto c = channel();
      if (!c.is_ok()) return c.status();
      detail::ObjectEntry* o = (*c)->find(r.object);
      if (o == nullptr) {
        return Status::not_found("object '" + r.object + "' does not exist in channel '" +
                                 r.channel + "'");
      }
      Status v = o->mech->object->validate(r.config);
      if (!v.is_ok()) return v.with_prefix("config.");
      p.configures.emplace_back(o->mech->object.get(), &r.config);
      return {};
    }
  }
  return Status::internal("unhandled rule");
}

}  // namespace

Stage::Stage(std::unique_ptr<Impl> impl) : impl_(std::move(impl)), version_(&impl_->version) {}
Stage::~Stage() = default;

StatusOr<std::unique_ptr<Stage>> Stage::create(StageOptions options) {
  if (!valid_stage_name(options.name)) {
    return Status::invalid("stage name must be " + std::string(kStageNameRule) + ", got '" +
                           options.name + "'");
  }
  auto impl = std::make_unique<Impl>();
  impl->name = std::move(options.name);
  impl->labels = std::move(options.labels);
  impl->clock = options.clock != nullptr ? options.clock : &system_clock();
  impl->registry = options.registry != nullptr ? options.registry : &Registry::global();
  impl->pid = ::getpid();
  impl->created_ns = impl->clock->now_ns();
  impl->last_collect_ns = impl->created_ns;
  auto snap = detail::build_snapshot(impl->model, detail::next_version(), impl->unclassified);
  if (!snap.is_ok()) return snap.status();
  impl->publish(snap.value());
  return std::unique_ptr<Stage>(new Stage(std::move(impl)));
}

StatusOr<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::io_error(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::io_error(path + ": read failed: " + std::strerror(errno));
  return ss.str();
}

namespace {

const char* file_kind(mode_t mode) {
  switch (mode & S_IFMT) {
    case S_IFDIR:
      return "a directory";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFIFO:
      return "a FIFO";
    case S_IFSOCK:
      return "a socket";
    default:
      return "not a regular file";
  }
}

Status not_regular(const std::string& path, mode_t mode) {
  return Status::invalid(path + ": " + file_kind(mode) + "; a rules file must be a regular file");
}

Status too_large(const std::string& path) {
  return Status::invalid(path + ": larger than " + std::to_string(kMaxRulesFileBytes >> 20) +
                         " MiB, the most a rules file may hold");
}

// A JSON parser's message without the input it quotes ("...; last read:
// 'xyz'"): the file may be one the caller could not read itself.
std::string without_input(std::string m) {
  const std::string key = "; last read: '";
  const std::size_t from = m.find(key);
  if (from == std::string::npos) return m;
  // The quoted token runs to the quote before the parser's own "; expected
  // ..." (which names token kinds, not input), or to the message's end.
  const std::size_t expected = m.rfind("'; expected ");
  const std::size_t to =
      expected != std::string::npos && expected >= from + key.size() ? expected + 1 : m.size();
  m.erase(from, to - from);
  return m;
}

}  // namespace

StatusOr<std::string> read_rules_file(const std::string& path) {
  // Refuse what is not a regular file before opening it (opening a device
  // can do things), and again on the open file (the path may have changed
  // in between). O_NONBLOCK: opening a FIFO does not wait for a writer.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return Status::io_error(path + ": cannot open: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return not_regular(path, st.st_mode);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return Status::io_error(path + ": cannot open: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &st) != 0) return Status::io_error(path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return not_regular(path, st.st_mode);
  if (st.st_size > static_cast<off_t>(kMaxRulesFileBytes)) return too_large(path);
  // Read at most one byte past the limit: the file may be growing.
  std::string text(static_cast<std::size_t>(st.st_size) + 1, '\0');
  std::size_t got = 0;
  while (true) {
    if (got == text.size()) {
      if (text.size() > kMaxRulesFileBytes) return too_large(path);
      text.resize(std::min(text.size() * 2, kMaxRulesFileBytes + 1));
    }
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::io_error(path + ": read failed: " + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  text.resize(got);
  return text;
}

StatusOr<std::unique_ptr<Stage>> Stage::from_rules_file(const std::string& path,
                                                        StageOptions options) {
  auto text = read_rules_file(path);
  if (!text.is_ok()) return text.status();
  nlohmann::json rules;
  try {
    rules = nlohmann::json::parse(text.value());
  } catch (const nlohmann::json::parse_error& e) {
    return Status::invalid(path + ": invalid JSON: " + without_input(e.what()));
  } catch (const nlohmann::json::exception&) {  // a number out of range
    return Status::invalid(path + ": invalid JSON: a number is out of range");
  }
  auto stage = create(std::move(options));
  if (!stage.is_ok()) return stage.status();
  Status s = stage.value()->apply(rules);
  if (!s.is_ok()) return s.with_prefix(path + ": ");
  return stage;
}

Result Stage::enforce(const Context& ctx, const Request& request) noexcept {
  Impl& s = *impl_;
  if (s.try_fast(ctx)) [[likely]]
    return {};
  return s.full(ctx, [&](const detail::Target& t) {
    return t.object != nullptr ? detail::enforce_object(*t.object, ctx, request) : Result{};
  });
}

Verdict Stage::enforce_context_slow(const Context& ctx) noexcept {
  // The shortcut of a place whose object grants (it covers the request's
  // flags: a grant never waits, and a request it takes is charged whole).
  if (try_enforce_fast_grant(ctx.origin, ctx.size)) return {};
  Impl& s = *impl_;
  // The memo's inline common case stays free of calls and a stack frame: a
  // stage whose entry selects on something besides the origin (the only kind
  // that gets here every time) pays one flag test for the shortcut. One that
  // selects by origin gets here when a thread changes origin, or after a
  // request its shortcut could not take (an object that waits).
  if (s.try_fast(ctx)) [[likely]] {
    if (detail::t_cache[0].by_origin_only) [[unlikely]]
      s.arm_fast_target(ctx.origin);
    return {};
  }
  return s.full_and_arm(ctx);
}

void Stage::settle(const Context& ctx, std::uint64_t actual_bytes) noexcept {
  const std::uint64_t charged = pre_charge_of(ctx);
  if (actual_bytes == ctx.size && charged == ctx.size) return;
  Impl& s = *impl_;
  // Correct only within the snapshot that counted the request. This thread's
  // front cache entry is that snapshot unless the rules changed since enforce()
  // (or the thread enforced on other stages in between): then the correction
  // is dropped, because applied to a block that never counted the request it
  // could take that block's bytes below zero.
  CacheEntry& e = detail::t_cache[0];
  if (e.uid != s.uid || e.version != s.version.load(std::memory_order_acquire)) return;
  const detail::Target t = detail::route_in(e, ctx);
  const unsigned shard = detail::my_shard();
  const bool exclusive = shard < static_cast<unsigned>(detail::kExclusiveShards);
  if (actual_bytes != ctx.size) {
    t.stats->adjust(shard, exclusive, ctx.origin, ctx.size, actual_bytes);
  }
  if (t.object != nullptr && actual_bytes != charged) {
    // The object's share, which may wait: as full() does, with errno kept
    // and any I/O the wait makes internal. This thread's cache entry keeps
    // the snapshot, hence the object and its counters, alive meanwhile.
    const int saved_errno = errno;
    InternalIoScope internal;
    Context c = ctx;
    c.size = charged;
    const Verdict v = t.object->settle(c, actual_bytes);
    t.stats->record_settle_wait(shard, exclusive, v);
    errno = saved_errno;
  }
}

Status Stage::check_rules(const nlohmann::json& batch) {
  return detail::parse_rules(batch).status();
}

namespace {

// Whether no snapshot holds the removed `block` any more: then no thread can
// count into it, and a fold now is its last (the acquire pairs with the
// release of the last snapshot that held it: the fold sees every count made
// through it).
bool last_reference(const std::shared_ptr<detail::StatsBlock>& block) {
  return block->snapshots.load(std::memory_order_acquire) == 0;
}

// Keeps the counters a batch removed, and did not hand to a channel or object
// it created again under the same name, for the next collect
// (detail::Retired). Blocks no snapshot holds any more are folded into a
// small remainder and freed, one remainder per name, so that a stage nobody
// collects does not keep a block per removal.
void retire(Stage::Impl& s, Pending& p) {
  for (auto& f : p.freed) {
    s.retired.push_back(
        {std::move(f.channel), std::move(f.object), std::move(f.type), std::move(f.block), {}});
  }
  p.freed.clear();
  for (std::size_t i = 0; i < s.retired.size();) {
    detail::Retired& r = s.retired[i];
    if (r.block != nullptr && last_reference(r.block)) {
      r.rest.add(r.block->take_delta());
      r.block.reset();
    }
    if (r.block == nullptr) {
      auto same = std::find_if(s.retired.begin(), s.retired.begin() + static_cast<long>(i),
                               [&](const detail::Retired& o) {
                                 return o.block == nullptr && o.channel == r.channel &&
                                        o.object == r.object;
                               });
      if (same != s.retired.begin() + static_cast<long>(i)) {
        same->rest.add(r.rest);
        s.retired.erase(s.retired.begin() + static_cast<long>(i));
        continue;
      }
    }
    ++i;
  }
}

// Applies a parsed batch to the stage (see Stage::apply).
Status apply_parsed(Stage::Impl& s, const std::vector<detail::Rule>& list) {
  std::lock_guard lock(s.control_mu);
  if (s.shut_down) return Status::precondition("stage '" + s.name + "' is shut down");
  // A batch of configure rules only (what control loops send every cycle)
  // leaves routing alone: the rules are checked against the current model,
  // the objects reconfigured in place, and no snapshot is built or published,
  // so threads keep their cached snapshots and memos. Any other batch works
  // on a copy: descriptions are copied, mechanisms shared, and a failing
  // batch leaves the published model untouched.
  const bool configure_only = std::all_of(list.begin(), list.end(), [](const detail::Rule& r) {
    return r.kind == detail::Rule::Kind::kConfigure;
  });
  detail::Model copy;
  Pending p;
  std::size_t i = 0;
  if (!configure_only) {
    p.entries = s.entries;
    // A replacing batch (the static policy's) starts by removing channels:
    // those removals are applied while copying, and the channels they remove
    // are never copied (copying them, cold, was a fifth of such a batch's
    // apply with 100 stages: perf). A removal that would fail stops this; the
    // loop below then reports it as it reports any rule.
    std::vector<bool> drop(s.model.channels.size());
    for (; i < list.size() && list[i].kind == detail::Rule::Kind::kRemoveChannel; ++i) {
      std::size_t c = 0;
      while (c < drop.size() && (drop[c] || s.model.channels[c].name != list[i].channel)) ++c;
      if (c == drop.size()) break;
      drop[c] = true;
      p.remove_channel(s.model.channels[c]);
    }
    copy.classifiers = s.model.classifiers;
    copy.channels.reserve(s.model.channels.size());
    for (std::size_t c = 0; c < drop.size(); ++c) {
      if (drop[c]) continue;
      copy.channels.push_back(s.model.channels[c]);
    }
  }
  detail::Model& m = configure_only ? s.model : copy;  // configure changes no description
  for (; i < list.size(); ++i) {
    Status st = apply_rule(s, m, list[i], p);
    if (!st.is_ok()) return st.with_prefix("rules[" + std::to_string(i) + "]: ");
  }
  Snapshot* snap = nullptr;
  if (!configure_only) {
    auto built = detail::build_snapshot(m, detail::next_version(), s.unclassified);
    if (!built.is_ok()) return built.status();
    snap = built.value();
  }
  for (auto& [object, config] : p.configures) {
    Status st = object->configure(*config);
    if (!st.is_ok()) {
      if (snap != nullptr) snap->unref();
      return st.with_prefix("config.");
    }
  }
  ++s.rules_version;
  if (snap != nullptr) {
    // New objects get their board slots before the snapshot that routes to
    // them is published (a thread's shortcut reads an object's slot once,
    // when it arms), and before removed objects free theirs: one created and
    // removed in the batch frees its own.
    if (s.board) {
      for (auto& mech : p.created) s.give_slot(*mech);
    }
    s.model = std::move(copy);
    s.entries = p.entries;
    s.publish(snap);
    retire(s, p);
  }
  if (s.board) {
    for (auto& mech : p.removed) mech->feed.unassign(*s.board);
  }
  for (auto& mech : p.removed) mech->object->shutdown();
  return {};
}

}  // namespace

Status Stage::apply(const nlohmann::json& rules) {
  auto parsed = detail::parse_rules(rules);
  if (!parsed.is_ok()) return parsed.status();
  return apply_parsed(*impl_, parsed.value());
}

Status Stage::apply_text(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // syntax, or a number out of range
    return Status::invalid(std::string("invalid JSON: ") + e.what());
  }
  return apply(j);
}

namespace {

void to_stats(const detail::Folded& d, Counters& total, std::map<std::string, Counters>& by_origin,
              WaitStats& wait) {
  total = {};
  for (int i = 0; i < detail::kOriginSlots; ++i) {
    const Counters& c = d.origin[static_cast<std::size_t>(i)];
    if (c.ops == 0 && c.bytes == 0) continue;
    total.add(c);
    std::string name = i < detail::kOriginSlots - 1
                           ? std::string(origin_name(static_cast<OriginId>(i)))
                           : std::string("more");
    by_origin[name].add(c);
  }
  wait = d.wait;
  std::uint64_t waited = 0;
  for (std::size_t b = 1; b < wait.buckets.size(); ++b) waited += wait.buckets[b];
  wait.buckets[0] = total.ops >= waited ? total.ops - waited : 0;
}

// Adds to `out` what the counters of removed channels and objects counted
// since the previous collect, under their names: to the channel (and object)
// of that name when the stage has one again, else to an entry of their own
// (an object's without state). Frees the ones nothing can count into any
// more (control_mu held).
void add_retired(Stage::Impl& s, StageStats& out) {
  for (auto it = s.retired.begin(); it != s.retired.end();) {
    detail::Retired& r = *it;
    const bool last = r.block != nullptr && last_reference(r.block);
    detail::Folded d = r.rest;
    r.rest = {};
    if (r.block != nullptr) d.add(r.block->take_delta());
    if (last) r.block.reset();
    if (!d.empty()) {
      auto ch = std::find_if(out.channels.begin(), out.channels.end(),
                             [&](const ChannelStats& c) { return c.name == r.channel; });
      if (ch == out.channels.end()) {
        out.channels.emplace_back();
        ch = std::prev(out.channels.end());
        ch->name = r.channel;
      }
      Counters total;
      std::map<std::string, Counters> by_origin;
      WaitStats wait;
      to_stats(d, total, by_origin, wait);
      if (!r.object.empty()) {
        auto obj = std::find_if(ch->objects.begin(), ch->objects.end(),
                                [&](const ObjectStats& o) { return o.name == r.object; });
        if (obj == ch->objects.end()) {
          ch->objects.emplace_back();
          obj = std::prev(ch->objects.end());
          obj->name = r.object;
          obj->type = r.type;
        }
        obj->total.add(total);
        for (const auto& [n, v] : by_origin) obj->by_origin[n].add(v);
        obj->wait.add(wait);
        obj->cancelled += d.cancelled;
        obj->rejected += d.rejected;
      }
      ch->total.add(total);
      for (const auto& [n, v] : by_origin) ch->by_origin[n].add(v);
      ch->wait.add(wait);
      out.total.add(total);
    }
    it = r.block == nullptr ? s.retired.erase(it) : std::next(it);
  }
}

// Folds every block of the stage: deltas since the previous collect (which
// then start over), or totals since creation (which change nothing).
StageStats gather(Stage::Impl& s, bool deltas) {
  std::lock_guard lock(s.control_mu);
  auto take = [deltas](detail::StatsBlock& b) { return deltas ? b.take_delta() : b.fold(); };
  StageStats out;
  out.stage = s.name;
  out.collected_at_ns = now_of(s);
  out.interval_ns = out.collected_at_ns - (deltas ? s.last_collect_ns : s.created_ns);
  if (deltas) s.last_collect_ns = out.collected_at_ns;
  {
    std::map<std::string, Counters> ignored;
    WaitStats w;
    to_stats(take(*s.unclassified), out.unclassified, ignored, w);
  }
  out.total = out.unclassified;
  for (const auto& c : s.model.channels) {
    ChannelStats cs;
    cs.name = c.name;
    to_stats(take(*c.stats), cs.total, cs.by_origin, cs.wait);
    for (const auto& o : c.objects) {
      ObjectStats os;
      os.name = o.name;
      os.type = o.type;
      detail::Folded d = take(*o.mech->stats);
      to_stats(d, os.total, os.by_origin, os.wait);
      os.cancelled = d.cancelled;
      os.rejected = d.rejected;
      // Values the board brought since the object's last request are its
      // state too.
      detail::Feed& feed = o.mech->feed;
      feed.poll(*o.mech->object);
      os.state = o.mech->object->collect();
      if (feed.index >= 0 && os.state.is_object()) {
        os.state["board"] = {{"slot", feed.index},
                             {"taken", feed.taken.load(std::memory_order_relaxed)},
                             {"rejected", feed.rejected.load(std::memory_order_relaxed)}};
      }
      cs.total.add(os.total);
      for (const auto& [n, v] : os.by_origin) cs.by_origin[n].add(v);
      cs.wait.add(os.wait);
      cs.objects.push_back(std::move(os));
    }
    out.total.add(cs.total);
    out.channels.push_back(std::move(cs));
  }
  if (deltas) add_retired(s, out);
  for (ChannelStats& cs : out.channels) {
    std::uint64_t waited = 0;
    for (std::size_t b = 1; b < cs.wait.buckets.size(); ++b) waited += cs.wait.buckets[b];
    cs.wait.buckets[0] = cs.total.ops >= waited ? cs.total.ops - waited : 0;
  }
  return out;
}

}  // namespace

StageStats Stage::collect() {
  return gather(*impl_, /*deltas=*/true);
}
StageStats Stage::totals() const {
  return gather(*impl_, /*deltas=*/false);
}

StageInfo Stage::info() const {
  const Impl& s = *impl_;
  std::lock_guard lock(s.control_mu);
  StageInfo info;
  info.name = s.name;
  info.pid = s.pid;
  info.labels = s.labels;
  info.classifiers = detail::classifier_names(s.model.classifiers);
  info.rules_version = s.rules_version;
  for (const auto& c : s.model.channels) {
    ChannelInfo ci;
    ci.name = c.name;
    ci.classifiers = detail::classifier_names(c.classifiers);
    ci.match = nlohmann::json::array();
    for (const auto& m : c.matches) ci.match.push_back(m.source);
    ci.is_default = c.is_default;
    for (const auto& o : c.objects) {
      ObjectInfo oi;
      oi.name = o.name;
      oi.type = o.type;
      oi.match = nlohmann::json::array();
      for (const auto& m : o.matches) oi.match.push_back(m.source);
      oi.is_default = o.is_default;
      if (o.mech->feed.index >= 0) {
        oi.board_slot = o.mech->feed.index;
        oi.board_tag = o.mech->feed.tag;
        for (std::string_view t : o.mech->object->tunables()) oi.tunables.emplace_back(t);
      }
      ci.objects.push_back(std::move(oi));
    }
    info.channels.push_back(std::move(ci));
  }
  return info;
}

StatusOr<int> Stage::board() {
  Impl& s = *impl_;
  std::lock_guard lock(s.control_mu);
  if (!s.board) {
    auto b = detail::StageBoard::create();
    if (!b.is_ok()) return b.status();
    s.board = std::move(b).value();
    for (auto& c : s.model.channels) {
      for (auto& o : c.objects) s.give_slot(*o.mech);
    }
    // The same layout under a new version: threads' shortcuts, which read an
    // object's slot when they arm, arm again with it. (It builds: the layout
    // is the one in force.)
    if (!s.shut_down) {
      auto snap = detail::build_snapshot(s.model, detail::next_version(), s.unclassified);
      if (snap.is_ok()) s.publish(snap.value());
    }
  }
  return s.board->fd();
}

std::uint64_t Stage::board_updates() const noexcept {
  return impl_->board_taken.load(std::memory_order_relaxed);
}

std::uint64_t Stage::rules_version() const {
  std::lock_guard lock(impl_->control_mu);
  return impl_->rules_version;
}

const std::string& Stage::name() const noexcept {
  return impl_->name;
}
Clock& Stage::clock() const noexcept {
  return *impl_->clock;
}

void Stage::shutdown() noexcept {
  Impl& s = *impl_;
  std::lock_guard lock(s.control_mu);
  if (s.shut_down) return;
  s.shut_down = true;
  detail::Model empty;
  auto snap = detail::build_snapshot(empty, detail::next_version(), s.unclassified);
  if (snap.is_ok()) s.publish(snap.value());
  for (auto& c : s.model.channels) {
    for (auto& o : c.objects) o.mech->object->shutdown();
  }
}

}  // namespace sluice
