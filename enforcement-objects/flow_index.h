// FlowIndex<T>: flow id -> T*, found without a lock. For objects that keep
// per-flow state (a reservation's atomics) and must find a request's flow on
// a path that takes no lock.
//
// Open addressing over a power-of-two array of atomic entries, at most half
// full, so that a probe always ends at an empty entry. Entries are only ever
// added, never removed or changed: an add writes the key, then publishes the
// value with a release store, and a find reads the value with an acquire
// load before the key. A table that would become more than half full is
// replaced by one twice its size; the old tables stay until the index goes,
// since a reader may still be probing one. The index never owns the Ts.
//
// Thread safety: find() from any thread, concurrently with add(); add() and
// reserve() under the owner's lock (one writer at a time).
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <memory>
#include <vector>

namespace sluice::detail {

template <typename T>
class FlowIndex {
 public:
  FlowIndex() { grow(16); }

  // The value added for `id`, or null.
  T* find(std::uint64_t id) const noexcept {
    const Table* t = current_.load(std::memory_order_acquire);
    for (std::size_t i = t->slot(id);; i = (i + 1) & t->mask) {
      T* v = t->entries[i].value.load(std::memory_order_acquire);
      if (v == nullptr) return nullptr;
      if (t->entries[i].key.load(std::memory_order_relaxed) == id) return v;
    }
  }
  // Adds `id` -> `v` (`v` not null, `id` not added yet). Allocates when the
  // table grows.
  void add(std::uint64_t id, T* v) {
    if (2 * (size_ + 1) > current_.load(std::memory_order_relaxed)->capacity()) {
      grow(2 * current_.load(std::memory_order_relaxed)->capacity());
    }
    put(*tables_.back(), id, v);
    ++size_;
  }
  // Room for `n` ids without growing.
  void reserve(std::size_t n) {
    const std::size_t want = std::bit_ceil(std::max<std::size_t>(16, 2 * n));
    if (want > current_.load(std::memory_order_relaxed)->capacity()) grow(want);
  }
  std::size_t size() const noexcept { return size_; }

 private:
  struct Entry {
    std::atomic<std::uint64_t> key{0};
    std::atomic<T*> value{nullptr};
  };
  struct Table {
    explicit Table(std::size_t capacity)
        : mask(capacity - 1),
          shift(64 - static_cast<unsigned>(std::countr_zero(capacity))),
          entries(std::make_unique<Entry[]>(capacity)) {}
    std::size_t slot(std::uint64_t id) const noexcept {
      return static_cast<std::size_t>((id * 0x9E3779B97F4A7C15ULL) >> shift);
    }
    std::size_t capacity() const noexcept { return mask + 1; }
    const std::size_t mask;
    const unsigned shift;
    const std::unique_ptr<Entry[]> entries;
  };

  static void put(Table& t, std::uint64_t id, T* v) noexcept {
    std::size_t i = t.slot(id);
    while (t.entries[i].value.load(std::memory_order_relaxed) != nullptr) i = (i + 1) & t.mask;
    t.entries[i].key.store(id, std::memory_order_relaxed);
    t.entries[i].value.store(v, std::memory_order_release);
  }
  void grow(std::size_t capacity) {
    auto t = std::make_unique<Table>(capacity);
    if (!tables_.empty()) {
      const Table& old = *tables_.back();
      for (std::size_t i = 0; i < old.capacity(); ++i) {
        if (T* v = old.entries[i].value.load(std::memory_order_relaxed)) {
          put(*t, old.entries[i].key.load(std::memory_order_relaxed), v);
        }
      }
    }
    current_.store(t.get(), std::memory_order_release);
    tables_.push_back(std::move(t));
  }

  std::atomic<const Table*> current_{nullptr};
  std::size_t size_ = 0;
  std::vector<std::unique_ptr<Table>> tables_;  // every table made; the last is current_
};

}  // namespace sluice::detail
