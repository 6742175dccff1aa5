// sluice::Mutex and MutexLock (sluice/thread_annotations.h): they exclude as
// std::mutex does, MutexLock's unlock()/lock() really give the mutex up and
// take it back, and its native() lock serves condition-variable and Clock
// waits on the very same mutex.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "sluice/clock.h"
#include "sluice/thread_annotations.h"
#include "test_util.h"

namespace {

using sluice::testing::eventually;

// Whether another thread can take `mu` right now (and gives it back).
bool free_elsewhere(sluice::Mutex& mu) {
  bool took = false;
  std::thread([&] {
    if (mu.try_lock()) {
      took = true;
      mu.unlock();
    }
  }).join();
  return took;
}

struct Counter {
  sluice::Mutex mu;
  long value SLUICE_GUARDED_BY(mu) = 0;
  void add() {
    sluice::MutexLock lock(mu);
    value = value + 1;  // a read and a write: lost updates if two threads overlap
  }
  long get() {
    sluice::MutexLock lock(mu);
    return value;
  }
};

}  // namespace

TEST_CASE("MutexLock excludes other threads for its scope", "[mutex]") {
  Counter c;
  constexpr int kThreads = 4;
  constexpr int kAdds = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&c] {
      for (int i = 0; i < kAdds; ++i) c.add();
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(c.get() == long{kThreads} * kAdds);
}

TEST_CASE("MutexLock holds the mutex until it is destroyed or unlocked", "[mutex]") {
  sluice::Mutex mu;
  REQUIRE(free_elsewhere(mu));
  {
    sluice::MutexLock lock(mu);
    CHECK_FALSE(free_elsewhere(mu));
    lock.unlock();
    CHECK(free_elsewhere(mu));
    lock.lock();
    CHECK_FALSE(free_elsewhere(mu));
  }
  CHECK(free_elsewhere(mu));
  // Unlocked when the scope ends: the destructor does not unlock twice.
  {
    sluice::MutexLock lock(mu);
    lock.unlock();
  }
  CHECK(free_elsewhere(mu));
}

TEST_CASE("MutexLock::wait gives the mutex up while it blocks", "[mutex]") {
  sluice::Mutex mu;
  std::condition_variable cv;
  bool ready = false;  // under mu
  std::atomic<bool> waiting{false};
  std::thread waiter([&] {
    sluice::MutexLock lock(mu);
    waiting.store(true);
    while (!ready) lock.wait(cv);
  });
  eventually([&] { return waiting.load(); });
  {
    sluice::MutexLock lock(mu);  // only possible once the waiter is blocked in wait()
    ready = true;
  }
  cv.notify_all();
  waiter.join();
  CHECK(free_elsewhere(mu));
}

TEST_CASE("MutexLock::native() serves a Clock's wait on the same mutex", "[mutex]") {
  sluice::ManualClock clock;
  sluice::Mutex mu;
  std::condition_variable cv;
  const std::int64_t deadline = clock.now_ns() + 1000;
  std::atomic<bool> woke{false};
  std::atomic<bool> held_on_return{false};
  std::thread waiter([&] {
    sluice::MutexLock lock(mu);
    while (clock.now_ns() < deadline) clock.wait_until(lock.native(), cv, deadline);
    held_on_return.store(lock.native().owns_lock());
    woke.store(true);
  });
  eventually([&] { return clock.waiters() == 1; });
  CHECK(free_elsewhere(mu));  // parked: the mutex is free meanwhile
  CHECK_FALSE(woke.load());
  clock.advance(1000);  // wakes the waiter through the mutex it parked with
  waiter.join();
  CHECK(woke.load());
  CHECK(held_on_return.load());
  CHECK(free_elsewhere(mu));
}
