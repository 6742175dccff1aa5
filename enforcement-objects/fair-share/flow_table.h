// FlowTable<Flow>: flow id -> Flow*, open-addressed, for objects that find a
// request's flow on a path that takes no lock (fq, buffer-pool); FlowIndex<T>,
// a FlowTable that grows by itself, for objects that need nothing more
// (cache-reserve). Entries are
// only added (under the owner's lock), each published by a release store of
// its flow after its key, so find() reads it without a lock. A table is never
// replaced in place: the owner makes a bigger one (copy_from the last),
// publishes it, and keeps the old ones until it goes, since a reader may
// still be probing one.
//
// Thread safety: find() from any thread, concurrently with insert()/add();
// insert(), copy_from(), add(), reserve() and `aliases` under the owner's lock
// (one writer at a time).
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace sluice::detail {

template <typename Flow>
struct FlowTable {
  struct Entry {
    std::atomic<std::uint64_t> key{0};
    std::atomic<Flow*> flow{nullptr};
  };

  // `capacity`: a power of two >= 16.
  explicit FlowTable(std::uint32_t capacity)
      : mask(capacity - 1),
        shift(64 - static_cast<unsigned>(std::countr_zero(capacity))),
        entries(std::make_unique<Entry[]>(capacity)) {}

  std::size_t slot(std::uint64_t id) const noexcept {
    return static_cast<std::size_t>((id * 0x9E3779B97F4A7C15ULL) >> shift);
  }
  // Never full (at most 3/4 used), so a probe ends at an empty entry.
  Flow* find(std::uint64_t id) const noexcept {
    for (std::size_t i = slot(id);; i = (i + 1) & mask) {
      Flow* f = entries[i].flow.load(std::memory_order_acquire);
      if (f == nullptr) return nullptr;
      if (entries[i].key.load(std::memory_order_relaxed) == id) return f;
    }
  }
  void insert(std::uint64_t id, Flow* f) noexcept {
    std::size_t i = slot(id);
    while (entries[i].flow.load(std::memory_order_relaxed) != nullptr) i = (i + 1) & mask;
    entries[i].key.store(id, std::memory_order_relaxed);
    entries[i].flow.store(f, std::memory_order_release);
  }
  // Every entry of `old` (a smaller table, not yet published) and its count of aliases.
  void copy_from(const FlowTable& old) noexcept {
    for (std::uint32_t i = 0; i < old.capacity(); ++i) {
      if (Flow* f = old.entries[i].flow.load(std::memory_order_relaxed)) {
        insert(old.entries[i].key.load(std::memory_order_relaxed), f);
      }
    }
    aliases = old.aliases;
  }
  std::uint32_t capacity() const noexcept { return mask + 1; }

  const std::uint32_t mask;
  const unsigned shift;
  const std::unique_ptr<Entry[]> entries;
  // Under the owner's lock. Flows' own entries take at most half the table,
  // ids mapped to "other" at most a quarter.
  std::uint32_t aliases = 0;
};

// Makes the newest of `tables` roomy enough for `flows` flows (at most half
// full, at least 16 entries): if it is not, a table of twice as many entries
// (a power of two) is made from it and published in `current`. The old ones
// stay in `tables`, since a reader may still be probing one. Under the
// owner's lock.
template <typename Table>
void ensure_room(std::vector<std::unique_ptr<Table>>& tables, std::atomic<const Table*>& current,
                 std::size_t flows) {
  const std::size_t want = std::bit_ceil(std::max<std::size_t>(16, 2 * flows));
  if (!tables.empty() && tables.back()->capacity() >= want) return;
  auto table = std::make_unique<Table>(static_cast<std::uint32_t>(want));
  if (!tables.empty()) table->copy_from(*tables.back());
  current.store(table.get(), std::memory_order_release);
  tables.push_back(std::move(table));
}

// Flow id -> T*, found without a lock; at most half full, so a probe ends at
// an empty entry. Entries are only added. A table that would pass half full
// is replaced by one twice its size; the old tables stay until the index
// goes, since a reader may still be probing one. Never owns the Ts.
template <typename T>
class FlowIndex {
 public:
  FlowIndex() { ensure_room(tables_, current_, 0); }

  // The value added for `id`, or null.
  T* find(std::uint64_t id) const noexcept {
    return current_.load(std::memory_order_acquire)->find(id);
  }
  // Adds `id` -> `v` (`v` not null, `id` not added yet). Allocates when the
  // table grows.
  void add(std::uint64_t id, T* v) {
    ensure_room(tables_, current_, size_ + 1);
    tables_.back()->insert(id, v);
    ++size_;
  }
  // Room for `n` ids without growing.
  void reserve(std::size_t n) { ensure_room(tables_, current_, n); }
  std::size_t size() const noexcept { return size_; }

 private:
  std::atomic<const FlowTable<T>*> current_{nullptr};
  std::size_t size_ = 0;
  std::vector<std::unique_ptr<FlowTable<T>>> tables_;  // every table; the last is current_
};

}  // namespace sluice::detail
