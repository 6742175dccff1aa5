// Reserved descriptors: those Sluice keeps open inside a host program (a
// control client's socket and eventfd, a board's memfd), moved at once to a
// high free number, close-on-exec, and listed in a process-wide table that the
// preload's close, dup*, close_range, closefrom and fcntl consult: the host
// can neither close nor receive one, and a host dup2() onto one first moves
// it elsewhere (docs/preload.md). A number can therefore change: read it
// (ReservedFd::get) and make a non-blocking call under a ReservedFdLock; block
// only through ReservedPoller::poll, which drops the lock meanwhile.
//
// Thread safety: is_reserved_fd() is lock-free and async-signal-safe.
// Everything else takes detail::reserved_fd_mutex; objects are used by one
// thread at a time. Lock order: a stage's locks, then this one; a thread
// holding a ReservedFdLock takes no other and calls into no Stage.
#pragma once

#include <poll.h>

#include <cstdint>

#include "sluice/thread_annotations.h"

namespace sluice {

namespace detail {
// The table's lock, as the analysis names it. Defined and used inside
// reserved_fd.cc only; everyone else holds it through a ReservedFdLock.
class SLUICE_CAPABILITY("mutex") ReservedFdMutex;
extern ReservedFdMutex reserved_fd_mutex;
}  // namespace detail

// How many descriptors the table lists. A descriptor made when it is full is
// still moved high and close-on-exec, but the host's calls do not protect it.
inline constexpr int kMaxReservedFds = 64;

// Holds the table's lock: while it is held no reserved descriptor moves,
// none is made, none is closed, and the host's close_range/closefrom waits.
class SLUICE_SCOPED_CAPABILITY ReservedFdLock {
 public:
  ReservedFdLock() noexcept SLUICE_ACQUIRE(detail::reserved_fd_mutex);
  ~ReservedFdLock() SLUICE_RELEASE();
  ReservedFdLock(const ReservedFdLock&) = delete;
  ReservedFdLock& operator=(const ReservedFdLock&) = delete;
  // Moves so far (see reserved_fd_generation()).
  std::uint64_t generation() const noexcept;
};

// One reserved descriptor, owned.
class ReservedFd {
 public:
  ReservedFd() noexcept = default;
  // Takes `fd`, a descriptor the caller made while holding `lock` (so that no
  // host close_range or dup2 can act on it before it is moved): moves it high,
  // sets close-on-exec and lists it. Empty (and `fd` closed) when fd < 0 or
  // when the only free numbers are 0-2.
  static ReservedFd adopt(const ReservedFdLock& lock, int fd) noexcept
      SLUICE_REQUIRES(detail::reserved_fd_mutex);
  ~ReservedFd();
  ReservedFd(ReservedFd&& o) noexcept;
  // Closes what this held first (taking the lock when it held anything).
  ReservedFd& operator=(ReservedFd&& o) noexcept;
  ReservedFd(const ReservedFd&) = delete;
  ReservedFd& operator=(const ReservedFd&) = delete;

  // The descriptor's number now; -1 when empty, or when it was lost (the
  // host took its number when no other number was free to move it to). Read
  // it under a ReservedFdLock to use it.
  int get() const noexcept;
  // Whether this holds a descriptor (even a lost one: close() frees its entry).
  bool held() const noexcept { return slot_ >= 0 || own_ >= 0; }
  // Closes the descriptor and unlists it.
  void close() noexcept SLUICE_EXCLUDES(detail::reserved_fd_mutex);
  void close(const ReservedFdLock& lock) noexcept SLUICE_REQUIRES(detail::reserved_fd_mutex);

 private:
  int slot_ = -1;             // the table entry, or -1
  std::uint32_t serial_ = 0;  // the entry's serial when it was taken
  int own_ = -1;              // the number, when the table was full
};

// A thread that blocks in poll() on reserved descriptors registers one of
// these, so that a move wakes it and waits until it polls the new numbers.
// `wake` is called with the table's lock held, from the thread moving a
// descriptor: it must wake the poll without blocking and without taking the
// lock (e.g. write to a non-blocking eventfd that is among the polled fds).
class ReservedPoller {
 public:
  using WakeFn = void (*)(void* ctx) noexcept;
  ReservedPoller(WakeFn wake, void* ctx) noexcept;
  ~ReservedPoller();
  ReservedPoller(const ReservedPoller&) = delete;
  ReservedPoller& operator=(const ReservedPoller&) = delete;

  // poll(fds, n, timeout_ms) with `lock` released during the call and held
  // again on return. `fds` holds numbers read under `lock`. Returns poll's
  // result; *moved is set when a reserved descriptor moved during the call
  // (the revents then mean nothing: read the numbers again and retry).
  int poll(ReservedFdLock& lock, pollfd* fds, nfds_t n, int timeout_ms, bool* moved) noexcept
      SLUICE_REQUIRES(detail::reserved_fd_mutex);

  struct Entry;  // internal

 private:
  Entry* entry_;
};

// Lock-free and async-signal-safe: whether `fd` is a listed descriptor now.
bool is_reserved_fd(int fd) noexcept;

// Moves so far: a number read from a ReservedFd (or Stage::board()) without
// the lock is still that descriptor's when this is unchanged, read before it
// and again under a ReservedFdLock.
std::uint64_t reserved_fd_generation() noexcept;

// The host is about to dup2/dup3 onto `fd`. When `fd` is reserved, the
// descriptor moves to another number (or is given up when none is free),
// the threads polling reserved descriptors are woken and waited for (at most
// a second: they are Sluice's own and never wait for the host), and true is
// returned: `fd` then still holds Sluice's former descriptor, which the
// host's call replaces; if that call fails, the caller closes `fd`. False
// when `fd` is not reserved. Sets *busy, doing nothing, when this thread is
// already inside the table's lock (a signal handler interrupted it there):
// the caller fails the call with EBUSY, as Linux does for a dup2 that races
// an open. Preserves errno.
bool vacate_reserved_fd(int fd, bool* busy) noexcept;

// Runs `fn(first, last)` for each part of [first, last] that holds no
// reserved descriptor, in order, holding the lock throughout (no reserved
// descriptor moves into a part meanwhile); stops at the first call that
// returns nonzero and returns that. For the host's close_range/closefrom.
int for_unreserved_ranges(unsigned first, unsigned last, int (*fn)(unsigned, unsigned, void*),
                          void* ctx) noexcept;

// In a fork child (from an atfork child handler, after libstage's own, which
// resets the lock): closes every listed descriptor (the parent's, useless
// here) and empties the table. The parent's objects that held them must never
// be used in the child.
void close_reserved_fds_in_child() noexcept;

}  // namespace sluice
