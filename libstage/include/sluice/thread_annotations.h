// Locking contracts the compiler checks: clang's Thread Safety Analysis
// attributes under SLUICE_ names (nothing under other compilers), and the
// annotated mutex Sluice's own code locks. scripts/check-thread-safety.sh
// fails on any warning. Conventions: a function that needs a mutex held says
// SLUICE_REQUIRES and is named `..._locked()`; a guarded field carries
// SLUICE_GUARDED_BY; lambdas see no lock held, so code under a lock waits in
// explicit loops rather than with predicates.
//
//   sluice::Mutex mu_;
//   int total_ SLUICE_GUARDED_BY(mu_) = 0;
//   void add_locked(int n) SLUICE_REQUIRES(mu_) { total_ += n; }
//
// Thread safety: Mutex and MutexLock are std::mutex and std::unique_lock.
#pragma once

#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define SLUICE_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define SLUICE_THREAD_ANNOTATION(x)
#endif

// On a type: its objects are locks (the name appears in diagnostics).
#define SLUICE_CAPABILITY(name) SLUICE_THREAD_ANNOTATION(capability(name))
// On a type: an object that holds a lock for its lifetime (RAII).
#define SLUICE_SCOPED_CAPABILITY SLUICE_THREAD_ANNOTATION(scoped_lockable)
// On a field: read or written only with `mu` held.
#define SLUICE_GUARDED_BY(mu) SLUICE_THREAD_ANNOTATION(guarded_by(mu))
// On a pointer field: what it points to is read or written only with `mu` held.
#define SLUICE_PT_GUARDED_BY(mu) SLUICE_THREAD_ANNOTATION(pt_guarded_by(mu))
// On a mutex: the lock order (this one before / after the ones named).
#define SLUICE_ACQUIRED_BEFORE(...) SLUICE_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define SLUICE_ACQUIRED_AFTER(...) SLUICE_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
// On a function: called with the mutexes held (and returns with them held).
#define SLUICE_REQUIRES(...) SLUICE_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// On a function: called without the mutexes held (it takes them itself).
#define SLUICE_EXCLUDES(...) SLUICE_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// On a function: takes / gives up the mutexes (no argument: `this`).
#define SLUICE_ACQUIRE(...) SLUICE_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define SLUICE_RELEASE(...) SLUICE_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
// On a function returning bool: holds the mutexes when it returns `result`.
#define SLUICE_TRY_ACQUIRE(...) SLUICE_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// On a function: from its return on, the caller is known to hold `mu`.
#define SLUICE_ASSERT_CAPABILITY(mu) SLUICE_THREAD_ANNOTATION(assert_capability(mu))
// On a function: it returns (a reference to) `mu`.
#define SLUICE_RETURN_CAPABILITY(mu) SLUICE_THREAD_ANNOTATION(lock_returned(mu))
// On a function: not analysed. Only for what the analysis cannot express (a
// lock taken on one path only, a lock handed between functions), with a
// comment that says why the locking is right.
#define SLUICE_NO_THREAD_SAFETY_ANALYSIS SLUICE_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace sluice {

// std::mutex, as a capability the analysis tracks. Lock it with MutexLock.
class SLUICE_CAPABILITY("mutex") Mutex {
 public:
  constexpr Mutex() noexcept = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() SLUICE_ACQUIRE() { mu_.lock(); }
  void unlock() SLUICE_RELEASE() { mu_.unlock(); }
  bool try_lock() SLUICE_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex from construction to destruction (or between unlock() and
// lock(), which it allows). native() is the std::unique_lock underneath, for
// std::condition_variable and Clock waits: they give the mutex up while they
// block and hold it again when they return, so the analysis, which sees it
// held throughout, is right wherever the waiting code runs. Never unlock()
// through native(): use this object's unlock(), which the analysis sees.
class SLUICE_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) SLUICE_ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() SLUICE_RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void unlock() SLUICE_RELEASE() { lock_.unlock(); }
  void lock() SLUICE_ACQUIRE() { lock_.lock(); }

  std::unique_lock<std::mutex>& native() noexcept { return lock_; }
  // cv.wait(native()): blocks until notified, or spuriously.
  void wait(std::condition_variable& cv) { cv.wait(lock_); }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace sluice
