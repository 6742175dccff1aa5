// FlowTable<Flow>: flow id -> Flow*, open-addressed, for objects that find a
// request's flow on a path that takes no lock (fq, buffer-pool). Entries are
// only added (under the owner's lock), each published by a release store of
// its flow after its key, so find() reads it without a lock. A table is never
// replaced in place: the owner makes a bigger one (copy_from the last),
// publishes it, and keeps the old ones until it goes, since a reader may
// still be probing one.
//
// Thread safety: find() from any thread, concurrently with insert(); insert(),
// copy_from() and `aliases` under the owner's lock.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>

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

}  // namespace sluice::detail
