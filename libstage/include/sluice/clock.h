// The one monotonic clock a stage and its objects use, replaceable in tests.
//
// Objects never call std::chrono or sleep directly: they ask their Clock for
// the time and wait through it. SystemClock is std::chrono::steady_clock;
// ManualClock's time moves only when a test advances it (waiters block until
// then); SimClock's waits return at once with the time moved to their
// deadline, for single-threaded simulations of hours in microseconds.
//
// Thread safety: every Clock is safe to use from any number of threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "sluice/thread_annotations.h"

namespace sluice {

class Clock {
 public:
  virtual ~Clock() = default;
  // Nanoseconds on a monotonic scale with an arbitrary origin.
  virtual std::int64_t now_ns() const noexcept = 0;
  // Blocks on `cv` (whose mutex `lock` holds) until notified, until now_ns()
  // reaches `deadline_ns`, or spuriously; releases `lock` while blocked, like
  // std::condition_variable::wait_until. Callers re-check their condition.
  virtual void wait_until(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                          std::int64_t deadline_ns) = 0;
  // Blocks on `cv` until notified or spuriously (no deadline).
  virtual void wait(std::unique_lock<std::mutex>& lock, std::condition_variable& cv) {
    cv.wait(lock);
  }
  // For a deadline nearer than a timed wait's usual lateness: gives up the CPU
  // briefly without arming a timer and returns, as a spurious wakeup may, so
  // callers must re-check and loop like wait_until's. A notification on `cv`
  // may go unnoticed until it returns. Default: wait_until (exact for the test
  // clocks); the system clock yields once with `lock` released.
  virtual void wait_briefly(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                            std::int64_t deadline_ns) {
    wait_until(lock, cv, deadline_ns);
  }
};

// The process-wide steady clock.
Clock& system_clock() noexcept;

// Time stands still until advance()/set() moves it; a waiter whose deadline is
// reached by a move is woken. For multi-threaded tests of waiting objects.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(std::int64_t start_ns = 1'000'000'000) : now_(start_ns) {}
  std::int64_t now_ns() const noexcept override;
  void wait_until(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                  std::int64_t deadline_ns) override;
  void advance(std::int64_t delta_ns);
  void set(std::int64_t now_ns);
  // How many threads are blocked in wait_until right now (for tests that must
  // know a waiter has parked before they advance time).
  int waiters() const;

 private:
  // A thread in wait_until. `cv` is written under both `mu` (the waiter's
  // mutex) and mu_, so either is enough to read it.
  struct Sleeper {
    std::mutex* mu;
    std::condition_variable* cv;
    std::int64_t deadline;
  };
  // Takes mu_ and each due sleeper's mutex, never both in that order.
  void wake_due() SLUICE_EXCLUDES(mu_);
  mutable Mutex mu_;
  std::int64_t now_ SLUICE_GUARDED_BY(mu_);
  std::vector<Sleeper*> sleepers_ SLUICE_GUARDED_BY(mu_);
};

// Waiting jumps the time to the deadline and returns: a deterministic
// simulation for single-threaded tests (a token bucket's accuracy over hours).
class SimClock final : public Clock {
 public:
  explicit SimClock(std::int64_t start_ns = 1'000'000'000) : now_(start_ns) {}
  std::int64_t now_ns() const noexcept override;
  void wait_until(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                  std::int64_t deadline_ns) override;
  void advance(std::int64_t delta_ns);

 private:
  mutable Mutex mu_;
  std::int64_t now_ SLUICE_GUARDED_BY(mu_);
};

}  // namespace sluice
