// Slabs for the daemon's per-connection objects (session_arena.h).
#include "session_arena.h"

#include <sys/mman.h>

#include <cstdint>
#include <new>

#include "sluice/dcheck.h"
#include "sluice/thread_annotations.h"

#if defined(__SANITIZE_ADDRESS__)  // g++
#define SLUICE_ASAN 1
#elif defined(__has_feature)  // clang
#if __has_feature(address_sanitizer)
#define SLUICE_ASAN 1
#endif
#endif

#if defined(SLUICE_ASAN)
#include <sanitizer/asan_interface.h>
// Free blocks are poisoned, so that AddressSanitizer still reports a use of
// a session's memory after it was freed.
#define SLUICE_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define SLUICE_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define SLUICE_POISON(p, n) ((void)(p), (void)(n))
#define SLUICE_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace sluice::control {
namespace {

constexpr std::size_t kGranule = 64;  // block sizes are multiples; the header takes one
constexpr std::size_t kClasses = SessionArena::kMaxBlock / kGranule;

// At the start of every slab.
struct Slab {
  Slab* prev = nullptr;  // in its class's list of slabs with room
  Slab* next = nullptr;
  void* free = nullptr;  // blocks given back, linked through their first word
  std::size_t block = 0;
  std::size_t used = 0;    // blocks handed out
  std::size_t carved = 0;  // bytes after the header handed out at least once
  bool listed = false;
};
static_assert(sizeof(Slab) <= kGranule);

constexpr std::size_t capacity(std::size_t block) {
  return (SessionArena::kSlabBytes - kGranule) / block;
}

// Its mutex also guards every slab's header.
struct Arena {
  Mutex mu;
  Slab* room[kClasses] SLUICE_GUARDED_BY(mu) = {};   // slabs with free blocks
  Slab* spare[kClasses] SLUICE_GUARDED_BY(mu) = {};  // one empty slab kept per class
  std::size_t mapped SLUICE_GUARDED_BY(mu) = 0;

  void link_locked(std::size_t cls, Slab* s) SLUICE_REQUIRES(mu) {
    s->prev = nullptr;
    s->next = room[cls];
    if (room[cls] != nullptr) room[cls]->prev = s;
    room[cls] = s;
    s->listed = true;
  }
  void unlink_locked(std::size_t cls, Slab* s) SLUICE_REQUIRES(mu) {
    if (!s->listed) return;
    if (s->prev != nullptr) s->prev->next = s->next;
    if (s->next != nullptr) s->next->prev = s->prev;
    if (room[cls] == s) room[cls] = s->next;
    s->prev = s->next = nullptr;
    s->listed = false;
  }
  // A fresh slab aligned to its size (so a block finds its slab by masking).
  Slab* map_locked(std::size_t block) SLUICE_REQUIRES(mu) {
    const std::size_t size = SessionArena::kSlabBytes;
    void* p = ::mmap(nullptr, 2 * size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    const auto raw = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t start = (raw + size - 1) & ~(std::uintptr_t{size} - 1);
    if (start > raw) ::munmap(p, start - raw);
    if (start + size < raw + 2 * size) {
      ::munmap(reinterpret_cast<void*>(start + size), raw + 2 * size - start - size);
    }
    mapped += size;
    auto* s = new (reinterpret_cast<void*>(start)) Slab;
    s->block = block;
    return s;
  }
  void unmap_locked(Slab* s) SLUICE_REQUIRES(mu) {
    SLUICE_UNPOISON(s, SessionArena::kSlabBytes);
    mapped -= SessionArena::kSlabBytes;
    ::munmap(s, SessionArena::kSlabBytes);
  }
};

Arena& arena() {
  static Arena* a = new Arena;  // never destroyed: sessions may outlive static destructors
  return *a;
}

}  // namespace

void* SessionArena::allocate(std::size_t bytes) {
  if (bytes > kMaxBlock) return ::operator new(bytes);
  const std::size_t cls = bytes == 0 ? 0 : (bytes - 1) / kGranule;
  const std::size_t block = (cls + 1) * kGranule;
  Arena& a = arena();
  MutexLock lock(a.mu);
  Slab* s = a.room[cls];
  if (s == nullptr) {
    s = a.spare[cls];
    a.spare[cls] = nullptr;
    if (s == nullptr) s = a.map_locked(block);
    a.link_locked(cls, s);
  }
  SLUICE_DCHECK(s->block == block && s->used < capacity(block),
                "a slab listed with room holds its class's blocks and has one free");
  void* p;
  if (s->free != nullptr) {
    p = s->free;
    SLUICE_UNPOISON(p, block);
    s->free = *static_cast<void**>(p);
  } else {
    p = reinterpret_cast<char*>(s) + kGranule + s->carved;
    s->carved += block;
  }
  if (++s->used == capacity(block)) a.unlink_locked(cls, s);
  return p;
}

void SessionArena::deallocate(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes > kMaxBlock) {
    ::operator delete(p);
    return;
  }
  const std::size_t cls = bytes == 0 ? 0 : (bytes - 1) / kGranule;
  auto* s = reinterpret_cast<Slab*>(reinterpret_cast<std::uintptr_t>(p) & ~(kSlabBytes - 1));
  Arena& a = arena();
  MutexLock lock(a.mu);
  SLUICE_DCHECK(s->block == (cls + 1) * kGranule && s->used > 0,
                "a block is freed once, with the size it was allocated with");
  *static_cast<void**>(p) = s->free;
  s->free = p;
  SLUICE_POISON(p, s->block);
  if (s->used-- == capacity(s->block)) a.link_locked(cls, s);
  if (s->used > 0) return;
  a.unlink_locked(cls, s);
  if (a.spare[cls] == nullptr) {
    SLUICE_UNPOISON(reinterpret_cast<char*>(s) + kGranule, kSlabBytes - kGranule);
    s->free = nullptr;
    s->carved = 0;
    a.spare[cls] = s;
  } else {
    a.unmap_locked(s);
  }
}

std::size_t SessionArena::mapped_bytes() noexcept {
  Arena& a = arena();
  MutexLock lock(a.mu);
  return a.mapped;
}

}  // namespace sluice::control
