// Memory for the daemon's per-connection objects (a Session and its queues),
// kept apart from the heap so that it goes back to the system when the
// connections close: Asio keeps small objects on the heap for good, and
// sessions between them would pin every page a burst of connections touched.
// Blocks come from 64 KiB slabs of one block size each (multiples of 64
// bytes up to 4 KiB; larger ones from operator new); a slab is unmapped when
// its last block goes, one empty slab per size kept.
//
// Thread safety: allocate and deallocate from any thread (one mutex).
#pragma once

#include <cstddef>

namespace sluice::control {

class SessionArena {
 public:
  static constexpr std::size_t kSlabBytes = 64 * 1024;
  static constexpr std::size_t kMaxBlock = 4096;

  // Never null (std::bad_alloc when the system has no memory to map).
  static void* allocate(std::size_t bytes);
  // `bytes` as given to allocate().
  static void deallocate(void* p, std::size_t bytes) noexcept;
  // Bytes of slabs mapped now (for tests and metrics).
  static std::size_t mapped_bytes() noexcept;
};

// A std allocator over SessionArena.
template <typename T>
struct SessionAllocator {
  using value_type = T;
  SessionAllocator() noexcept = default;
  template <typename U>
  SessionAllocator(const SessionAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)
  T* allocate(std::size_t n) { return static_cast<T*>(SessionArena::allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { SessionArena::deallocate(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const SessionAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace sluice::control
