// Debug-build invariant checks for Sluice's own data structures.
//
//   SLUICE_DCHECK(waiters_ == queue_.size(), "waiter count matches the queue");
//
// In a build without NDEBUG (Debug, which the sanitizer builds use) a false
// condition prints "file:line: invariant broken: <message> (<condition>)" to
// stderr and aborts. With NDEBUG (Release, RelWithDebInfo) the condition is
// not evaluated and costs nothing, so checks may sit on hot paths and may
// walk a structure. Conditions must have no side effects. For states an input
// or the system can cause, return a Status instead: a DCHECK states what the
// code itself guarantees.
//
// Thread safety: the condition runs on the calling thread; a condition that
// reads shared state needs whatever lock guards it (as any code does).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace sluice::detail {

[[noreturn]] inline void dcheck_failed(const char* file, int line, const char* message,
                                       const char* condition) noexcept {
  std::fprintf(stderr, "%s:%d: invariant broken: %s (%s)\n", file, line, message, condition);
  std::fflush(stderr);
  std::abort();
}

}  // namespace sluice::detail

#ifdef NDEBUG
// Still compiled (so it cannot rot), never evaluated.
#define SLUICE_DCHECK(cond, message) static_cast<void>(false && static_cast<bool>(cond))
#else
#define SLUICE_DCHECK(cond, message)              \
  (static_cast<bool>(cond) ? static_cast<void>(0) \
                           : ::sluice::detail::dcheck_failed(__FILE__, __LINE__, message, #cond))
#endif
