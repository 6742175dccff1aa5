// ManualClock, SimClock and the system clock: the time sources that waiting
// objects and their tests rely on.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "sluice/clock.h"
#include "test_util.h"

namespace {

using sluice::ManualClock;
using sluice::SimClock;
using sluice::testing::eventually;

// Waits on `clock` until its time reaches `deadline` (re-checking, as every
// caller of wait_until must).
void sleep_until(sluice::Clock& clock, std::int64_t deadline) {
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  while (clock.now_ns() < deadline) clock.wait_until(lock, cv, deadline);
}

}  // namespace

TEST_CASE("ManualClock: time moves only on advance and set", "[clock]") {
  ManualClock clock;
  CHECK(clock.now_ns() == 1'000'000'000);
  CHECK(clock.now_ns() == 1'000'000'000);
  clock.advance(5);
  CHECK(clock.now_ns() == 1'000'000'005);
  clock.set(42);
  CHECK(clock.now_ns() == 42);
  CHECK(ManualClock(7).now_ns() == 7);
  CHECK(clock.waiters() == 0);
}

TEST_CASE("ManualClock: a reached deadline returns at once", "[clock]") {
  ManualClock clock(100);
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  clock.wait_until(lock, cv, 100);
  clock.wait_until(lock, cv, 50);
  CHECK(lock.owns_lock());
  CHECK(clock.waiters() == 0);
}

TEST_CASE("ManualClock: a sleeper wakes when time reaches its deadline", "[clock]") {
  ManualClock clock(0);
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    sleep_until(clock, 100);
    woke = true;
  });
  eventually([&] { return clock.waiters() == 1; });
  clock.advance(99);
  CHECK(clock.waiters() == 1);
  CHECK_FALSE(woke);
  clock.advance(1);
  sleeper.join();
  CHECK(woke);
  CHECK(clock.waiters() == 0);
}

TEST_CASE("ManualClock: only due sleepers wake, set() wakes too", "[clock]") {
  ManualClock clock(0);
  std::atomic<int> woke{0};
  std::vector<std::thread> sleepers;
  for (std::int64_t deadline : {10, 20, 30}) {
    sleepers.emplace_back([&clock, &woke, deadline] {
      sleep_until(clock, deadline);
      ++woke;
    });
  }
  eventually([&] { return clock.waiters() == 3; });
  clock.set(20);
  eventually([&] { return woke == 2; });
  CHECK(clock.waiters() == 1);
  clock.set(30);
  for (auto& t : sleepers) t.join();
  CHECK(woke == 3);
  CHECK(clock.waiters() == 0);
}

TEST_CASE("ManualClock: the caller's own notify wakes a sleeper early", "[clock]") {
  ManualClock clock(0);
  std::mutex mu;
  std::condition_variable cv;
  bool flag = false;
  std::thread sleeper([&] {
    std::unique_lock<std::mutex> lock(mu);
    while (!flag) clock.wait_until(lock, cv, 1'000'000);
  });
  eventually([&] { return clock.waiters() == 1; });
  {
    std::lock_guard<std::mutex> lock(mu);
    flag = true;
  }
  cv.notify_one();
  sleeper.join();
  CHECK(clock.now_ns() == 0);
  CHECK(clock.waiters() == 0);
}

TEST_CASE("ManualClock: no lost wakeups under concurrent advance", "[clock]") {
  // Sleepers re-arm with short deadlines while two threads advance time; a
  // lost wakeup would hang a sleeper (and the test would time out).
  ManualClock clock(0);
  constexpr int kSleepers = 4;
  constexpr int kRounds = 300;
  std::atomic<int> finished{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kSleepers; ++i) {
    threads.emplace_back([&clock, &finished, i] {
      std::mutex mu;
      std::condition_variable cv;
      for (int r = 0; r < kRounds; ++r) {
        std::unique_lock<std::mutex> lock(mu);
        const std::int64_t deadline = clock.now_ns() + 1 + (r + i) % 3;
        while (clock.now_ns() < deadline) clock.wait_until(lock, cv, deadline);
      }
      ++finished;
    });
  }
  std::vector<std::thread> advancers;
  for (int i = 0; i < 2; ++i) {
    advancers.emplace_back([&] {
      while (finished < kSleepers) {
        clock.advance(1);
        std::this_thread::yield();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& t : advancers) t.join();
  CHECK(clock.waiters() == 0);
}

TEST_CASE("SimClock: waiting jumps time to the deadline, never back", "[clock]") {
  SimClock clock;
  CHECK(clock.now_ns() == 1'000'000'000);
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  clock.wait_until(lock, cv, 5'000'000'000);
  CHECK(clock.now_ns() == 5'000'000'000);
  CHECK(lock.owns_lock());
  clock.wait_until(lock, cv, 2'000'000'000);
  CHECK(clock.now_ns() == 5'000'000'000);
  clock.advance(7);
  CHECK(clock.now_ns() == 5'000'000'007);
  CHECK(SimClock(3).now_ns() == 3);
}

TEST_CASE("system_clock: monotonic, and waits reach their deadline", "[clock]") {
  sluice::Clock& clock = sluice::system_clock();
  CHECK(&clock == &sluice::system_clock());
  const std::int64_t a = clock.now_ns();
  const std::int64_t b = clock.now_ns();
  CHECK(b >= a);
  const std::int64_t deadline = b + 1'000'000;  // 1 ms
  sleep_until(clock, deadline);
  CHECK(clock.now_ns() >= deadline);
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  clock.wait_until(lock, cv, a);  // already past: returns without blocking
  CHECK(lock.owns_lock());
}
