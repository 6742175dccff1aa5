// Memory for the daemon's per-connection objects (a Session and its queues),
// kept apart from the heap so that it goes back to the system when the
// connections close.
//
// Why: each connection also leaves a small object of Asio's on the heap for
// good (its reactor keeps them for reuse). With the sessions' memory between
// those, every page a burst of connections had touched stayed pinned after
// they closed (malloc_trim found no whole page to return). Here blocks come
// from slabs of 64 KiB mapped from the system, each slab holding blocks of
// one size (multiples of 64 bytes, up to 4 KiB; larger requests go to
// operator new), and a slab is unmapped when its last block is freed. One
// empty slab per size is kept, so a connection coming and going does not map
// and unmap.
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
