// The drl's leases: per-thread grants that read no clock, what they may hold
// against the bucket, how waiting requests and reconfiguration take them
// back, and exact counts with many threads.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "drl_test_util.h"
#include "sluice/objects/builtin.h"
#include "sluice/stage.h"
#include "test_util.h"

namespace {

// A ManualClock that counts how often the bucket reads it.
class DrlCountingClock final : public sluice::Clock {
 public:
  std::int64_t now_ns() const noexcept override {
    reads.fetch_add(1, std::memory_order_relaxed);
    return manual.now_ns();
  }
  void wait_until(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                  std::int64_t deadline_ns) override {
    manual.wait_until(lock, cv, deadline_ns);
  }

  ManualClock manual;
  mutable std::atomic<std::uint64_t> reads{0};
};

// One thread, hence one lease slot, that runs the requests given to it in
// turn and records their results.
class Worker {
 public:
  explicit Worker(Drl& drl) : drl_(drl), thread_([this] { run(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void submit(std::uint64_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    todo_.push_back(size);
    cv_.notify_all();
  }
  std::size_t done() {
    std::lock_guard<std::mutex> lock(mu_);
    return results_.size();
  }
  // Submits one request and waits for its result (it must not wait on a
  // clock that nobody moves).
  Verdict run_one(std::uint64_t size) {
    const std::size_t before = done();
    submit(size);
    eventually([&] { return done() == before + 1; });
    return result(before);
  }
  Verdict result(std::size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return results_.at(i);
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return quit_ || !todo_.empty(); });
      if (todo_.empty()) return;
      const std::uint64_t size = todo_.front();
      todo_.erase(todo_.begin());
      lock.unlock();
      const Verdict r = enforce(drl_, size);
      lock.lock();
      results_.push_back(r);
    }
  }

  Drl& drl_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::uint64_t> todo_;
  std::vector<Verdict> results_;
  bool quit_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

double tokens(const Drl& drl) {
  return drl.collect()["tokens"].get<double>();
}

}  // namespace

TEST_CASE("drl: a grant from a lease reads no clock", "[drl][lease]") {
  DrlCountingClock clock;
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 1'000'000}}).is_ok());
  REQUIRE(enforce(drl, 100).wait_ns == 0);  // from the bucket: draws a lease
  const std::uint64_t reads = clock.reads.load();
  for (int i = 0; i < 100; ++i) REQUIRE(enforce(drl, 100).wait_ns == 0);
  CHECK(clock.reads.load() == reads);
  const json stats = drl.collect();
  CHECK(stats["granted_ops"] == 101);
  CHECK(stats["granted_tokens"] == 10'100.0);
  CHECK(stats["tokens"] == 1'000'000.0 - 10'100);
  CHECK(stats["waiters"] == 0);
}

TEST_CASE("drl: the fast grant pays from this thread's lease, and only from it", "[drl][lease]") {
  DrlCountingClock clock;
  Drl drl(&clock);
  const FastGrant g = drl.fast_grant();
  REQUIRE(g);
  CHECK_FALSE(g.grant(g.state, 100));  // not configured: the full path passes it
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 32'000}}).is_ok());
  CHECK_FALSE(g.grant(g.state, 100));       // no lease yet
  REQUIRE(enforce(drl, 100).wait_ns == 0);  // from the bucket: draws a lease of 1000
  const std::uint64_t reads = clock.reads.load();
  for (int i = 0; i < 10; ++i) CHECK(g.grant(g.state, 100));
  CHECK_FALSE(g.grant(g.state, 100));  // the lease is spent
  CHECK(clock.reads.load() == reads);
  json stats = drl.collect();
  CHECK(stats["granted_ops"] == 11);
  CHECK(stats["granted_tokens"] == 1100.0);
  CHECK(stats["tokens"] == 32'000.0 - 1100);

  // A request that waits takes the leases back; so does shutdown.
  REQUIRE(enforce(drl, 100).wait_ns == 0);  // a new lease
  REQUIRE(drl.configure(json{{"rate", 1000}}).is_ok());
  CHECK_FALSE(g.grant(g.state, 100));
  REQUIRE(enforce(drl, 100).wait_ns == 0);
  drl.shutdown();
  CHECK_FALSE(g.grant(g.state, 100));
  stats = drl.collect();
  CHECK(stats["granted_ops"] == 13);
  CHECK(stats["granted_tokens"] == 1300.0);
}

TEST_CASE("drl: in ops, the fast grant charges one token a request", "[drl][lease]") {
  DrlCountingClock clock;
  Drl drl(&clock);
  const FastGrant g = drl.fast_grant();
  REQUIRE(drl.configure(json{{"rate", 1000}, {"unit", "ops"}, {"burst", 320}}).is_ok());
  REQUIRE(enforce(drl, 1 << 20).wait_ns == 0);  // draws a lease of 10
  for (int i = 0; i < 10; ++i) CHECK(g.grant(g.state, std::uint64_t{1} << 30));
  CHECK_FALSE(g.grant(g.state, 1));
  const json stats = drl.collect();
  CHECK(stats["granted_ops"] == 11);
  CHECK(stats["granted_tokens"] == 11.0);
}

TEST_CASE("drl: with a grant observer every grant takes the lock and is observed", "[drl][lease]") {
  DrlCountingClock clock;
  Drl drl(&clock);
  std::uint64_t observed = 0;
  drl.set_grant_observer([&](std::int64_t, double) { ++observed; });
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 1'000'000}}).is_ok());
  const std::uint64_t reads = clock.reads.load();
  for (int i = 0; i < 100; ++i) REQUIRE(enforce(drl, 100).wait_ns == 0);
  CHECK(observed == 100);
  const FastGrant g = drl.fast_grant();
  CHECK_FALSE(g.grant(g.state, 100));  // no lease to pay from
  CHECK(observed == 100);
  CHECK(clock.reads.load() >= reads + 100);
}

TEST_CASE("drl: leases in many slots never hold more than the bucket had", "[drl][lease]") {
  // At a standstill, 64 requests of 1000 fit in the bucket, spread over more
  // threads than there are slots; the 65th waits for the next 1000 to accrue.
  const std::int64_t t0 = kSecond;
  ManualClock clock(t0);
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 64'000}}).is_ok());
  constexpr int kThreads = 2 * Drl::kSlots;
  std::atomic<int> failures{0};
  std::atomic<bool> stop{false};
  std::thread watcher([&] {  // the bucket plus its leases, as collect reports them
    while (!stop) {
      const json s = drl.collect();
      if (s["tokens"].get<double>() + s["granted_tokens"].get<double>() != 64'000) ++failures;
    }
  });
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 2; ++i) {
          if (enforce(drl, 1000).wait_ns != 0) ++failures;
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  stop = true;
  watcher.join();
  CHECK(failures == 0);
  CHECK(tokens(drl) == 0.0);
  CHECK(drl.collect()["granted_ops"] == 2 * kThreads);
  DrlCrowd crowd(drl);
  crowd.add(1000);
  clock.set(t0 + kSecond - 1);
  eventually([&] { return clock.waiters() == 1; });
  CHECK(crowd.done() == 0);
  clock.set(t0 + kSecond);
  eventually([&] { return crowd.done() == 1; });
}

TEST_CASE("drl: a lease spent just before the bucket looks again counts against the burst",
          "[drl][lease][burst]") {
  // The bucket cannot tell when a lease was spent. After an idle stretch it
  // counts what its leases paid as paid just now, so a lease spent at the end
  // of the stretch and a full bucket never add up to more than the burst.
  ManualClock clock;
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 10'000}}).is_ok());
  REQUIRE(enforce(drl, 100).wait_ns == 0);  // draws a lease
  clock.advance(100 * kSecond);             // idle: the bucket fills up
  double at_once = 0;
  while (tokens(drl) >= 100) {  // the first ones come from the lease
    REQUIRE(enforce(drl, 100).wait_ns == 0);
    at_once += 100;
  }
  CHECK(at_once <= 10'000);
  // Short of the burst by what the lease paid since the bucket last looked.
  CHECK(at_once >= 10'000 - 10'000 / (2 * Drl::kSlots) - 100);
}

TEST_CASE("drl: a request that must wait takes the leases back; later ones queue behind it",
          "[drl][lease][fifo]") {
  const std::int64_t t0 = kSecond;
  ManualClock clock(t0);
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 32'000}}).is_ok());
  Worker early(drl);
  REQUIRE(early.run_one(100).wait_ns == 0);  // draws a lease of 1000 into its slot
  REQUIRE(early.run_one(100).wait_ns == 0);  // from the lease: 800 left there
  // Empty the bucket (but for the lease) from another thread, then ask for
  // more than the lease holds: it takes the lease back and still waits.
  REQUIRE(enforce(drl, 32'000 - 1000).wait_ns == 0);
  CHECK(tokens(drl) == 800.0);
  DrlCrowd crowd(drl);
  crowd.add(2000);  // due when 1200 more have accrued: t0 + 1.2 s
  CHECK(tokens(drl) == 800.0);
  // The early thread's lease is gone: it queues behind instead of paying
  // from it at once.
  early.submit(100);
  eventually([&] { return waiters(drl) == 2; });
  clock.set(t0 + 1200 * 1'000'000 - 1);
  eventually([&] { return clock.waiters() == 1; });
  CHECK(crowd.done() == 0);
  CHECK(early.done() == 2);
  clock.set(t0 + 1200 * 1'000'000);
  eventually([&] { return crowd.done() == 1; });
  clock.set(t0 + 1300 * 1'000'000);
  eventually([&] { return early.done() == 3; });
  CHECK(early.result(2).wait_ns == 1300 * 1'000'000);
  CHECK(crowd.results[0].wait_ns == 1200 * 1'000'000);
  CHECK(drl.collect()["granted_ops"] == 5);
}

TEST_CASE("drl: a request that costs nothing queues behind a waiter too", "[drl][lease][fifo]") {
  const std::int64_t t0 = kSecond;
  ManualClock clock(t0);
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 32'000}}).is_ok());
  Worker early(drl);
  REQUIRE(early.run_one(100).wait_ns == 0);  // a lease in its slot
  REQUIRE(enforce(drl, 32'000 - 1100).wait_ns == 0);
  DrlCrowd crowd(drl);
  crowd.add(2000);  // takes the lease back, waits for 1000 more
  early.submit(0);
  eventually([&] { return waiters(drl) == 2; });
  clock.set(t0 + kSecond - 1);
  eventually([&] { return clock.waiters() == 1; });
  CHECK(early.done() == 1);
  clock.set(t0 + kSecond);
  eventually([&] { return crowd.done() == 1 && early.done() == 2; });
  CHECK(early.result(1).wait_ns == static_cast<std::uint64_t>(kSecond));
}

TEST_CASE("drl: reconfiguration takes the leases back: a cut holds at once", "[drl][lease]") {
  const std::int64_t t0 = kSecond;
  ManualClock clock(t0);
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 32'000}}).is_ok());
  Worker worker(drl);
  REQUIRE(worker.run_one(100).wait_ns == 0);  // a lease of 1000 in its slot
  REQUIRE(drl.configure(json{{"rate", 10}, {"burst", 300}}).is_ok());
  CHECK(tokens(drl) == 300.0);
  // 500 is more than the bucket holds now: it waits for 200 at 10/s, lease or not.
  worker.submit(500);
  eventually([&] { return waiters(drl) == 1; });
  clock.set(t0 + 20 * kSecond - 1);
  eventually([&] { return clock.waiters() == 1; });
  CHECK(worker.done() == 1);
  clock.set(t0 + 20 * kSecond);
  eventually([&] { return worker.done() == 2; });
  CHECK(worker.result(1).wait_ns == static_cast<std::uint64_t>(20 * kSecond));
  // Through set_tunables as well.
  clock.set(t0 + 100 * kSecond);  // full again: 300
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 32'000}}).is_ok());
  clock.set(t0 + 200 * kSecond);              // full: 32000
  REQUIRE(worker.run_one(100).wait_ns == 0);  // draws a lease
  std::array<double, sluice::kMaxTunables> values{};
  values[1] = 50;
  REQUIRE(drl.set_tunables(2, values).is_ok());  // burst 50
  CHECK(tokens(drl) == 50.0);
  worker.submit(100);
  eventually([&] { return waiters(drl) == 1; });
  clock.set(t0 + 200 * kSecond + 50'000'000);  // 50 more at 1000/s
  eventually([&] { return worker.done() == 4; });
}

TEST_CASE("drl: shutdown with leases out wakes waiters and passes later requests",
          "[drl][lease][shutdown]") {
  ManualClock clock;
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 32'000}}).is_ok());
  Worker worker(drl);
  REQUIRE(worker.run_one(100).wait_ns == 0);  // a lease in its slot
  DrlCrowd crowd(drl);
  crowd.add(64'000);
  drl.shutdown();
  eventually([&] { return crowd.done() == 1; });
  CHECK(crowd.results[0].outcome == Outcome::kCancelled);
  const Verdict later = worker.run_one(100);
  CHECK(later.outcome == Outcome::kOk);
  CHECK(later.wait_ns == 0);
  CHECK(drl.collect()["granted_ops"] == 1);  // what came after shutdown passed unenforced
}

TEST_CASE("drl: threads sharing a bucket are granted exactly what accrued", "[drl][lease]") {
  // Mostly small requests, which leases pay, and now and then one larger
  // than the bucket, which takes every lease back and waits (the simulated
  // clock then jumps). No token is made or lost: everything that accrued is
  // granted, still in the bucket, or counted as lost to a full bucket.
  SimClock clock;
  Drl drl(&clock);
  constexpr double kRate = 1e6;
  constexpr double kBurst = 1e5;
  REQUIRE(drl.configure(json{{"rate", kRate}, {"burst", kBurst}}).is_ok());
  const std::int64_t t0 = clock.now_ns();
  constexpr int kThreads = 4;
  constexpr int kRequests = 5000;
  std::atomic<std::uint64_t> asked{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRequests; ++i) {
        const std::uint64_t size = i % 500 == 499 ? 200'000 : 64 + 8 * ((i + t) % 16);
        if (!enforce(drl, size).ok()) ++failures;
        asked += size;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  const json s = drl.collect();
  const double elapsed = static_cast<double>(clock.now_ns() - t0) / 1e9;
  CHECK(s["granted_ops"] == kThreads * kRequests);
  CHECK(s["granted_tokens"] == static_cast<double>(asked.load()));
  CHECK(static_cast<double>(asked.load()) <= kBurst + kRate * elapsed + 1e-6 * kBurst);
  const double accounted = s["granted_tokens"].get<double>() + s["tokens"].get<double>() +
                           s["overflow_tokens"].get<double>() +
                           s["late_forfeited_tokens"].get<double>();
  CHECK(accounted == Approx(kBurst + kRate * elapsed).epsilon(1e-9));
}

TEST_CASE("drl: grant counts stay exact past what a lease's counter holds", "[drl][lease]") {
  ManualClock clock;
  Drl drl(&clock);
  // Leases of 2^21 requests, more than a slot counts before it is folded.
  REQUIRE(drl.configure(json{{"rate", 1}, {"unit", "ops"}, {"burst", 1 << 26}}).is_ok());
  constexpr std::uint64_t kN = (1u << 20) + (1u << 19);
  for (std::uint64_t i = 0; i < kN; ++i) {
    if (enforce(drl, 4096).wait_ns != 0) FAIL("request " << i << " waited");
  }
  const json s = drl.collect();
  CHECK(s["granted_ops"] == kN);
  CHECK(s["granted_tokens"] == static_cast<double>(kN));
  CHECK(s["tokens"] == static_cast<double>((1 << 26) - kN));
}

TEST_CASE("drl: concurrent grants from leases, reconfiguration and collect (system clock)",
          "[drl][lease][concurrency]") {
  // For the sanitizers: a rate the threads cannot reach, so that most grants
  // come from leases, while the bucket is reconfigured and collected.
  Drl drl(nullptr);
  REQUIRE(drl.configure(json{{"rate", 1e15}, {"burst", 1e9}}).is_ok());
  constexpr int kThreads = 4;
  constexpr int kRequests = 200'000;
  std::atomic<int> failures{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRequests; ++i) {
        if (!enforce(drl, 4096).ok()) ++failures;
      }
    });
  }
  std::thread tuner([&] {
    for (int i = 0; !stop; ++i) {
      if (!drl.configure(json{{"burst", i % 2 ? 1e9 : 1e8}}).is_ok()) ++failures;
      const json s = drl.collect();
      if (s["tokens"].get<double>() > s["burst"].get<double>()) ++failures;
      std::this_thread::yield();
    }
  });
  for (auto& t : threads) t.join();
  stop = true;
  tuner.join();
  CHECK(failures == 0);
  const json stats = drl.collect();
  CHECK(stats["granted_ops"] == kThreads * kRequests);
  CHECK(stats["granted_tokens"] == 4096.0 * kThreads * kRequests);
  CHECK(stats["waiters"] == 0);
}
