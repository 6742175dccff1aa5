// TenantCache (sluice/rocksdb_cache.h): the shards (hash table and TenantLru
// under a mutex), the per-tenant rocksdb::Cache views, and the report to the
// cache-reserve object.
#include "sluice/rocksdb_cache.h"

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/dcheck.h"
#include "sluice/objects/cache_reserve.h"
#include "sluice/thread_annotations.h"

namespace sluice::rocksdb_binding {
namespace {

using DeleterFn = rocksdb::Cache::DeleterFn;

// One cached block. Allocated with its key behind it; the TenantLru node
// first, so that a node is its entry.
struct Entry {
  TenantLru::Node node;  // node.charge: charge plus metadata
  Entry* next_hash = nullptr;
  void* value = nullptr;
  DeleterFn deleter = nullptr;
  std::uint64_t hash = 0;
  std::size_t charge = 0;  // as given to Insert
  std::uint32_t refs = 0;  // handles given out
  std::uint32_t key_size = 0;
  bool in_cache = false;  // in the table (not erased or replaced)

  char* key_data() noexcept { return reinterpret_cast<char*>(this + 1); }
  rocksdb::Slice key() noexcept { return {key_data(), key_size}; }
  static Entry* of(TenantLru::Node* n) noexcept { return reinterpret_cast<Entry*>(n); }
  static Entry* of(rocksdb::Cache::Handle* h) noexcept { return reinterpret_cast<Entry*>(h); }
  rocksdb::Cache::Handle* handle() noexcept {
    return reinterpret_cast<rocksdb::Cache::Handle*>(this);
  }
};
static_assert(std::is_standard_layout_v<Entry> && offsetof(Entry, node) == 0);

// The entry's bytes, which its charge includes (as NewLRUCache's default,
// kFullChargeCacheMetadata).
std::size_t metadata_of(std::size_t key_size) noexcept {
  return sizeof(Entry) + key_size;
}

// A 64-bit hash of the owner and the key: the top bits pick the shard, the
// low bits the bucket.
std::uint64_t hash_key(TenantLru::OwnerId owner, const char* p, std::size_t n) noexcept {
  std::uint64_t h = (owner + 1) * 0x9E3779B97F4A7C15ULL ^ n;
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
    h ^= h >> 32;
  }
  if (n != 0) {
    std::uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
  }
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDULL;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ULL;
  return h ^ (h >> 33);
}

// A shard's chained hash table of entries (intrusive: Entry::next_hash),
// doubling when it holds more entries than buckets.
class Table {
 public:
  Table() { resize(4); }

  Entry* find(std::uint64_t hash, TenantLru::OwnerId owner, const rocksdb::Slice& key) noexcept {
    return *slot(hash, owner, key);
  }
  // Inserts `e`; returns the entry of the same owner and key it replaced
  // (taken out), or null.
  Entry* insert(Entry* e) {
    Entry** s = slot(e->hash, e->node.owner, e->key());
    Entry* old = *s;
    e->next_hash = old != nullptr ? old->next_hash : nullptr;
    *s = e;
    if (old == nullptr && ++count_ > (std::size_t{1} << bits_)) resize(bits_ + 1);
    return old;
  }
  Entry* remove(std::uint64_t hash, TenantLru::OwnerId owner, const rocksdb::Slice& key) noexcept {
    Entry** s = slot(hash, owner, key);
    Entry* e = *s;
    if (e != nullptr) {
      *s = e->next_hash;
      --count_;
    }
    return e;
  }
  void remove(Entry* e) noexcept {
    Entry* removed = remove(e->hash, e->node.owner, e->key());
    SLUICE_DCHECK(removed == e, "an entry in the cache is in its table");
    (void)removed;
  }
  // Calls f(entry) for every entry; f may remove the entry it is given.
  template <typename F>
  void for_each(F f) {
    for (std::size_t b = 0; b < (std::size_t{1} << bits_); ++b) {
      for (Entry* e = buckets_[b]; e != nullptr;) {
        Entry* next = e->next_hash;
        f(e);
        e = next;
      }
    }
  }
  // Takes every entry for which pred(entry) holds out of the table; returns
  // them linked through next_hash.
  template <typename Pred>
  Entry* extract_if(Pred pred) {
    Entry* out = nullptr;
    for (std::size_t b = 0; b < (std::size_t{1} << bits_); ++b) {
      for (Entry** s = &buckets_[b]; *s != nullptr;) {
        Entry* e = *s;
        if (!pred(e)) {
          s = &e->next_hash;
          continue;
        }
        *s = e->next_hash;
        --count_;
        e->next_hash = out;
        out = e;
      }
    }
    return out;
  }
  std::size_t size() const noexcept { return count_; }

 private:
  Entry** slot(std::uint64_t hash, TenantLru::OwnerId owner, const rocksdb::Slice& key) noexcept {
    Entry** s = &buckets_[hash & ((std::size_t{1} << bits_) - 1)];
    while (*s != nullptr) {
      Entry* e = *s;
      if (e->hash == hash && e->node.owner == owner && e->key_size == key.size() &&
          std::memcmp(e->key_data(), key.data(), key.size()) == 0) {
        break;
      }
      s = &e->next_hash;
    }
    return s;
  }
  void resize(unsigned bits) {
    auto b = std::make_unique<Entry*[]>(std::size_t{1} << bits);
    if (buckets_) {
      for (std::size_t i = 0; i < (std::size_t{1} << bits_); ++i) {
        for (Entry* e = buckets_[i]; e != nullptr;) {
          Entry* next = e->next_hash;
          Entry*& head = b[e->hash & ((std::size_t{1} << bits) - 1)];
          e->next_hash = head;
          head = e;
          e = next;
        }
      }
    }
    buckets_ = std::move(b);
    bits_ = bits;
  }

  std::unique_ptr<Entry*[]> buckets_;
  unsigned bits_ = 0;
  std::size_t count_ = 0;
};

// Entries to delete once the shard's mutex is released (linked through
// next_hash, which an entry out of the table no longer uses).
class FreeList {
 public:
  FreeList() = default;
  FreeList(const FreeList&) = delete;
  FreeList& operator=(const FreeList&) = delete;
  ~FreeList() {
    while (head_ != nullptr) {
      Entry* e = head_;
      head_ = e->next_hash;
      if (e->deleter != nullptr) e->deleter(e->key(), e->value);
      std::free(e);
    }
  }
  void add(Entry* e) noexcept {
    e->next_hash = head_;
    head_ = e;
  }

 private:
  Entry* head_ = nullptr;
};

int default_shard_bits(std::uint64_t capacity) noexcept {
  // As RocksDB's GetDefaultCacheShardBits: one shard per 512 KiB, up to 64.
  int bits = 0;
  std::uint64_t shards = capacity / (std::uint64_t{512} << 10);
  while ((shards >>= 1) != 0) {
    if (++bits >= 6) return bits;
  }
  return bits;
}

}  // namespace

struct alignas(64) Shard {
  Shard(const std::atomic<std::uint64_t>* epoch, unsigned shift) : lru(epoch, shift) {}
  Mutex mu;
  Table table SLUICE_GUARDED_BY(mu);
  TenantLru lru SLUICE_GUARDED_BY(mu);
};

class TenantCache::Core final : public CacheReporter {
 public:
  Core(std::shared_ptr<CacheReserve> reserve, unsigned bits, bool strict)
      : reserve_(std::move(reserve)), bits_(bits), strict_(strict) {
    for (unsigned i = 0; i < (1U << bits); ++i) {
      shards_.push_back(std::make_unique<Shard>(&reserve_->epoch_word(), bits));
    }
    reserve_->attach(this);
  }
  ~Core() {
    reserve_->detach(this);
    for (auto& s : shards_) {
      FreeList dead;
      MutexLock lock(s->mu);
      s->table.for_each([&](Entry* e) {
        SLUICE_DCHECK(e->refs == 0, "no handle outlives the cache");
        dead.add(e);
      });
    }
  }
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // The owner of `tenant`, made on its first view: in every shard, in the
  // same order, so that one id names the tenant everywhere.
  TenantLru::OwnerId owner_of(std::uint64_t tenant) SLUICE_EXCLUDES(views_mu_) {
    // Before views_mu_: collect() holds the object's mutex, then views_mu_.
    const std::atomic<std::uint64_t>* word = reserve_->reserved_word(tenant);
    MutexLock lock(views_mu_);
    for (std::size_t i = 0; i < tenants_.size(); ++i) {
      if (tenants_[i] == tenant) return static_cast<TenantLru::OwnerId>(i);
    }
    for (auto& s : shards_) {
      MutexLock shard_lock(s->mu);
      s->lru.add_owner(word);
    }
    tenants_.push_back(tenant);
    return static_cast<TenantLru::OwnerId>(tenants_.size() - 1);
  }

  Shard& shard(std::uint64_t hash) noexcept {
    return *shards_[bits_ == 0 ? 0 : static_cast<std::size_t>(hash >> (64 - bits_))];
  }
  std::uint64_t shard_capacity() const noexcept {
    const std::uint64_t cap = reserve_->capacity_word().load(std::memory_order_relaxed);
    return (cap >> bits_) + ((cap & ((std::uint64_t{1} << bits_) - 1)) != 0);
  }

  rocksdb::Status insert(TenantLru::OwnerId owner, const rocksdb::Slice& key, void* value,
                         std::size_t charge, DeleterFn deleter, rocksdb::Cache::Handle** handle) {
    const std::size_t meta = metadata_of(key.size());
    auto* e = static_cast<Entry*>(std::malloc(meta));
    if (e == nullptr) {
      if (handle == nullptr && deleter != nullptr) deleter(key, value);
      return rocksdb::Status::MemoryLimit("out of memory for a cache entry");
    }
    new (e) Entry();
    std::memcpy(e->key_data(), key.data(), key.size());
    e->key_size = static_cast<std::uint32_t>(key.size());
    e->value = value;
    e->deleter = deleter;
    e->charge = charge;
    e->hash = hash_key(owner, key.data(), key.size());
    // The table finds an entry by its owner too: set it before the entry
    // meets the table (TenantLru::insert sets it again).
    e->node.owner = owner;
    const std::uint64_t total = charge + meta;
    Shard& s = shard(e->hash);
    FreeList dead;
    rocksdb::Status st;
    MutexLock lock(s.mu);
    const std::uint64_t cap = shard_capacity();
    while (s.lru.usage() + total > cap) {
      TenantLru::Node* v = s.lru.evict(owner, total);
      if (v == nullptr) break;  // everything left is pinned
      Entry* ve = Entry::of(v);
      s.table.remove(ve);
      ve->in_cache = false;
      dead.add(ve);
    }
    if (s.lru.usage() + total > cap &&
        (handle == nullptr || strict_.load(std::memory_order_relaxed))) {
      if (handle == nullptr) {
        dead.add(e);  // as if inserted and evicted at once: the value is deleted
      } else {
        std::free(e);  // the caller keeps the value
        *handle = nullptr;
        st = rocksdb::Status::MemoryLimit(
            "Insert failed: the tenant cache is full of pinned entries");
      }
      return st;
    }
    e->in_cache = true;
    e->refs = handle != nullptr ? 1 : 0;
    Entry* old = s.table.insert(e);
    s.lru.insert(e->node, owner, total, /*pinned=*/handle != nullptr);
    if (old != nullptr) {
      old->in_cache = false;
      if (old->refs == 0) {
        s.lru.erase(old->node);
        dead.add(old);
      }
    }
    if (handle != nullptr) *handle = e->handle();
    return st;
  }

  rocksdb::Cache::Handle* lookup(TenantLru::OwnerId owner, const rocksdb::Slice& key) {
    const std::uint64_t hash = hash_key(owner, key.data(), key.size());
    Shard& s = shard(hash);
    MutexLock lock(s.mu);
    Entry* e = s.table.find(hash, owner, key);
    if (e == nullptr) {
      s.lru.miss(owner);
      return nullptr;
    }
    if (e->refs++ == 0) s.lru.pin(e->node);
    s.lru.hit(owner);
    return e->handle();
  }

  bool ref(rocksdb::Cache::Handle* h) {
    Entry* e = Entry::of(h);
    Shard& s = shard(e->hash);
    MutexLock lock(s.mu);
    SLUICE_DCHECK(e->refs > 0, "Ref takes a handle that is held");
    ++e->refs;
    return true;
  }

  bool release(rocksdb::Cache::Handle* h, bool erase_if_last_ref) {
    if (h == nullptr) return false;
    Entry* e = Entry::of(h);
    Shard& s = shard(e->hash);
    FreeList dead;
    MutexLock lock(s.mu);
    SLUICE_DCHECK(e->refs > 0, "a handle is released once");
    if (--e->refs != 0) return false;
    if (e->in_cache) {
      if (!erase_if_last_ref && s.lru.usage() <= shard_capacity()) {
        s.lru.unpin(e->node);
        return false;
      }
      s.table.remove(e);
      e->in_cache = false;
    }
    s.lru.erase(e->node);
    dead.add(e);
    return true;
  }

  void erase(TenantLru::OwnerId owner, const rocksdb::Slice& key) {
    const std::uint64_t hash = hash_key(owner, key.data(), key.size());
    Shard& s = shard(hash);
    FreeList dead;
    MutexLock lock(s.mu);
    Entry* e = s.table.remove(hash, owner, key);
    if (e == nullptr) return;
    e->in_cache = false;
    if (e->refs == 0) {
      s.lru.erase(e->node);
      dead.add(e);
    }
  }

  // Evicts unpinned entries until each shard is within its capacity.
  void shrink() {
    for (auto& s : shards_) {
      FreeList dead;
      MutexLock lock(s->mu);
      const std::uint64_t cap = shard_capacity();
      while (s->lru.usage() > cap) {
        TenantLru::Node* v = s->lru.evict(0, 0);
        if (v == nullptr) break;
        Entry* e = Entry::of(v);
        s->table.remove(e);
        e->in_cache = false;
        dead.add(e);
      }
    }
  }

  void apply(TenantLru::OwnerId owner,
             const std::function<void(const rocksdb::Slice&, void*, std::size_t, DeleterFn)>& f) {
    for (auto& s : shards_) {
      MutexLock lock(s->mu);
      s->table.for_each([&](Entry* e) {
        if (e->node.owner == owner) f(e->key(), e->value, e->charge, e->deleter);
      });
    }
  }

  void erase_unreferenced(TenantLru::OwnerId owner) {
    for (auto& s : shards_) {
      FreeList dead;
      MutexLock lock(s->mu);
      Entry* gone = s->table.extract_if(
          [owner](const Entry* e) { return e->node.owner == owner && e->refs == 0; });
      while (gone != nullptr) {
        Entry* e = gone;
        gone = e->next_hash;
        e->in_cache = false;
        s->lru.erase(e->node);
        dead.add(e);
      }
    }
  }

  // One owner's counters over the shards (every owner's when `owner` is
  // kEveryone).
  static constexpr TenantLru::OwnerId kEveryone = ~TenantLru::OwnerId{0};
  TenantLruStats stats(TenantLru::OwnerId owner) const {
    TenantLruStats sum;
    for (const auto& s : shards_) {
      MutexLock lock(s->mu);
      if (owner != kEveryone) {
        if (owner < s->lru.owners()) sum += s->lru.stats(owner);
        continue;
      }
      for (TenantLru::OwnerId o = 0; o < s->lru.owners(); ++o) sum += s->lru.stats(o);
    }
    return sum;
  }
  std::uint64_t steps() const {
    std::uint64_t n = 0;
    for (const auto& s : shards_) {
      MutexLock lock(s->mu);
      n += s->lru.steps();
    }
    return n;
  }
  // The owner of `tenant`, or kEveryone if it has no view.
  TenantLru::OwnerId find_owner(std::uint64_t tenant) const SLUICE_EXCLUDES(views_mu_) {
    MutexLock lock(views_mu_);
    for (std::size_t i = 0; i < tenants_.size(); ++i) {
      if (tenants_[i] == tenant) return static_cast<TenantLru::OwnerId>(i);
    }
    return kEveryone;
  }

  void report(const std::function<void(std::uint64_t, const TenantLruStats&)>& each) const override
      SLUICE_EXCLUDES(views_mu_) {
    std::vector<std::uint64_t> tenants;
    {
      MutexLock lock(views_mu_);
      tenants = tenants_;
    }
    for (std::size_t i = 0; i < tenants.size(); ++i) {
      each(tenants[i], stats(static_cast<TenantLru::OwnerId>(i)));
    }
  }

  std::uint64_t next_id() noexcept { return next_id_.fetch_add(1, std::memory_order_relaxed) + 1; }

  const std::shared_ptr<CacheReserve> reserve_;
  const unsigned bits_;
  std::atomic<bool> strict_;

 private:
  std::vector<std::unique_ptr<Shard>> shards_;  // fixed after construction
  std::atomic<std::uint64_t> next_id_{0};
  mutable Mutex views_mu_;
  std::vector<std::uint64_t> tenants_ SLUICE_GUARDED_BY(views_mu_);  // owner id -> tenant
};

namespace {

// A tenant's rocksdb::Cache.
class View final : public rocksdb::Cache {
 public:
  View(std::shared_ptr<TenantCache::Core> core, std::uint64_t tenant, TenantLru::OwnerId owner)
      : core_(std::move(core)), tenant_(tenant), owner_(owner) {}

  using rocksdb::Cache::GetUsage;
  using rocksdb::Cache::Insert;
  using rocksdb::Cache::Lookup;
  using rocksdb::Cache::Release;

  const char* Name() const override { return "TenantCache"; }
  rocksdb::Status Insert(const rocksdb::Slice& key, void* value, size_t charge, DeleterFn deleter,
                         Handle** handle, Priority /*priority*/) override {
    return core_->insert(owner_, key, value, charge, deleter, handle);
  }
  Handle* Lookup(const rocksdb::Slice& key, rocksdb::Statistics* /*stats*/) override {
    return core_->lookup(owner_, key);
  }
  bool Ref(Handle* handle) override { return core_->ref(handle); }
  bool Release(Handle* handle, bool erase_if_last_ref) override {
    return core_->release(handle, erase_if_last_ref);
  }
  void* Value(Handle* handle) override { return Entry::of(handle)->value; }
  void Erase(const rocksdb::Slice& key) override { core_->erase(owner_, key); }
  uint64_t NewId() override { return core_->next_id(); }
  void SetCapacity(size_t capacity) override {
    // A capacity below the reservations' sum is refused by the object: the
    // capacity then stays (this call returns no status).
    if (core_->reserve_->set_capacity(capacity).is_ok()) core_->shrink();
  }
  void SetStrictCapacityLimit(bool strict) override {
    core_->strict_.store(strict, std::memory_order_relaxed);
  }
  bool HasStrictCapacityLimit() const override {
    return core_->strict_.load(std::memory_order_relaxed);
  }
  size_t GetCapacity() const override { return core_->reserve_->capacity(); }
  size_t GetUsage() const override { return core_->stats(owner_).usage; }
  size_t GetUsage(Handle* handle) const override { return Entry::of(handle)->node.charge; }
  size_t GetPinnedUsage() const override { return core_->stats(owner_).pinned; }
  size_t GetCharge(Handle* handle) const override { return Entry::of(handle)->charge; }
  DeleterFn GetDeleter(Handle* handle) const override { return Entry::of(handle)->deleter; }
  void ApplyToAllEntries(
      const std::function<void(const rocksdb::Slice&, void*, size_t, DeleterFn)>& callback,
      const ApplyToAllEntriesOptions& /*opts*/) override {
    core_->apply(owner_, callback);
  }
  void EraseUnRefEntries() override { core_->erase_unreferenced(owner_); }
  std::string GetPrintableOptions() const override {
    return "    tenant: " + std::to_string(tenant_) +
           "\n    capacity: " + std::to_string(GetCapacity()) +
           "\n    num_shard_bits: " + std::to_string(core_->bits_) +
           "\n    strict_capacity_limit: " + (HasStrictCapacityLimit() ? "1" : "0") + "\n";
  }

 private:
  const std::shared_ptr<TenantCache::Core> core_;
  const std::uint64_t tenant_;
  const TenantLru::OwnerId owner_;
};

}  // namespace

StatusOr<std::shared_ptr<TenantCache>> TenantCache::make(const TenantCacheOptions& options) {
  if (options.num_shard_bits < -1 || options.num_shard_bits > 19) {
    return Status::invalid("num_shard_bits: must be from -1 to 19, got " +
                           std::to_string(options.num_shard_bits));
  }
  std::shared_ptr<CacheReserve> reserve = options.reserve;
  if (reserve == nullptr) {
    reserve = std::make_shared<CacheReserve>();
    if (options.capacity < 1 || options.capacity > kCacheReserveMaxCapacity) {
      return Status::invalid("capacity: must be an integer number of bytes from 1 to 2^62, got " +
                             std::to_string(options.capacity));
    }
    SLUICE_RETURN_IF_ERROR(reserve->configure(nlohmann::json{{"capacity", options.capacity}}));
  } else if (reserve->capacity() == 0) {
    return Status::precondition("reserve: not configured (it has no capacity)");
  }
  const int bits = options.num_shard_bits >= 0 ? options.num_shard_bits
                                               : default_shard_bits(reserve->capacity());
  auto core = std::make_shared<Core>(std::move(reserve), static_cast<unsigned>(bits),
                                     options.strict_capacity_limit);
  return std::shared_ptr<TenantCache>(new TenantCache(std::move(core)));
}

StatusOr<std::shared_ptr<CacheReserve>> TenantCache::find_reserve(const Stage& stage,
                                                                  std::string_view channel,
                                                                  std::string_view object) {
  std::shared_ptr<EnforcementObject> o = stage.object(channel, object);
  if (o == nullptr) {
    return Status::not_found("stage '" + stage.name() + "' has no object '" + std::string(object) +
                             "' in channel '" + std::string(channel) + "'");
  }
  if (o->type() != "cache-reserve") {
    return Status::invalid("object '" + std::string(object) + "' in channel '" +
                           std::string(channel) + "' is a " + std::string(o->type()) +
                           ", not a cache-reserve");
  }
  return std::static_pointer_cast<CacheReserve>(std::move(o));
}

TenantCache::~TenantCache() = default;

std::shared_ptr<rocksdb::Cache> TenantCache::view(std::uint64_t tenant) {
  return std::make_shared<View>(core_, tenant, core_->owner_of(tenant));
}

std::uint64_t TenantCache::capacity() const noexcept {
  return core_->reserve_->capacity();
}
Status TenantCache::set_capacity(std::uint64_t bytes) {
  SLUICE_RETURN_IF_ERROR(core_->reserve_->set_capacity(bytes));
  core_->shrink();
  return {};
}
void TenantCache::set_strict_capacity_limit(bool strict) noexcept {
  core_->strict_.store(strict, std::memory_order_relaxed);
}
bool TenantCache::strict_capacity_limit() const noexcept {
  return core_->strict_.load(std::memory_order_relaxed);
}
int TenantCache::num_shard_bits() const noexcept {
  return static_cast<int>(core_->bits_);
}
CacheReserve& TenantCache::reserve() const noexcept {
  return *core_->reserve_;
}
std::uint64_t TenantCache::usage() const {
  return core_->stats(Core::kEveryone).usage;
}
std::uint64_t TenantCache::pinned_usage() const {
  return core_->stats(Core::kEveryone).pinned;
}
TenantLruStats TenantCache::stats(std::uint64_t tenant) const {
  const TenantLru::OwnerId o = core_->find_owner(tenant);
  return o == Core::kEveryone ? TenantLruStats{} : core_->stats(o);
}
std::uint64_t TenantCache::steps() const {
  return core_->steps();
}

}  // namespace sluice::rocksdb_binding
