// Helpers for the fq object's tests: requests by flow, a flow's entry in
// collect(), threads that wait in the queue on a ManualClock, and a driver
// that keeps flows backlogged and moves the clock only when every thread
// waits, so that the order of service is the queue's alone (deterministic).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "sluice/clock.h"
#include "sluice/objects/fq.h"
#include "test_util.h"

namespace fqtest {

using nlohmann::json;
using sluice::Fq;
using sluice::ManualClock;
using sluice::Op;
using sluice::Verdict;

using sluice::testing::kMs;
using sluice::testing::kSecond;

inline sluice::Context request(std::uint32_t tenant, Op op = Op::kSync, std::uint64_t size = 0) {
  sluice::Context ctx;
  ctx.tenant = tenant;
  ctx.op = op;
  ctx.size = size;
  return ctx;
}

// The flow's entry in `stats` (collect()), or null.
inline json flow_of(const json& stats, const json& id) {
  for (const json& f : stats["flows"]) {
    if (f["flow"] == id) return f;
  }
  return json();
}

inline std::uint64_t served_ops(const Fq& fq, std::uint64_t id) {
  const json f = flow_of(fq.collect(), id);
  return f.is_null() ? 0 : f["served_ops"].get<std::uint64_t>();
}

inline std::uint64_t queued(const Fq& fq) {
  return fq.collect()["queued"].get<std::uint64_t>();
}

using sluice::testing::eventually;

// Threads that each make one request and record the order of their returns.
struct Crowd {
  explicit Crowd(Fq& f) : fq(f) {}
  ~Crowd() {
    for (auto& t : threads) t.join();
  }
  // Starts `ctx` and returns once it waits in the queue.
  void add(const sluice::Context& ctx) {
    const int id = static_cast<int>(threads.size());
    const std::uint64_t before = queued(fq);
    threads.emplace_back([this, id, ctx] {
      const Verdict r = fq.enforce_context(ctx);
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(id);
      results.push_back(r);
    });
    eventually([&] { return queued(fq) == before + 1; });
  }
  std::size_t done() {
    std::lock_guard<std::mutex> lock(mu);
    return order.size();
  }

  Fq& fq;
  std::vector<std::thread> threads;
  std::mutex mu;
  std::vector<int> order;
  std::vector<Verdict> results;
};

// Flows kept backlogged on a ManualClock, one thread each, making request
// after request. step() moves the clock only once every running thread waits
// in the queue and the head sleeps on the clock: at that instant each flow
// has exactly one waiter, and what is served next is the queue's choice
// alone, whatever the threads' scheduling. With a step no longer than the
// cheapest request, a step serves at most one request.
class Backlog {
 public:
  Backlog(Fq& fq, ManualClock& clock) : fq_(fq), clock_(clock) {}
  ~Backlog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    fq_.shutdown();  // cancels the waiters
    for (auto& t : threads_) t.join();
  }

  // A thread making requests `ctx` from now on.
  void add(const sluice::Context& ctx) {
    auto state = std::make_unique<Thread>();
    Thread* t = state.get();
    {
      std::lock_guard<std::mutex> lock(mu_);
      states_.push_back(std::move(state));
    }
    threads_.emplace_back([this, t, ctx] { run(*t, ctx); });
  }
  // Thread i stops after the request it is making (resume() restarts it).
  void pause(std::size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    states_.at(i)->paused = true;
  }
  void resume(std::size_t i) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      states_.at(i)->paused = false;
    }
    cv_.notify_all();
  }

  // Waits until every running thread waits in the queue (and paused ones
  // have stopped), with the head asleep on the clock.
  void settle() {
    eventually([&] { return quiet(); });
  }
  // settle(), then the clock moves by `ns`.
  void step(std::int64_t ns) {
    settle();
    clock_.advance(ns);
  }
  // Steps of `ns` until the clock has moved by `total`, then settles.
  void run(std::int64_t total, std::int64_t ns) {
    for (std::int64_t moved = 0; moved < total; moved += ns) step(ns);
    settle();
  }

 private:
  struct Thread {
    // 0: between requests, 1: in enforce(), 2: stopped (paused).
    std::atomic<int> where{0};
    bool paused = false;  // under mu_
  };

  void run(Thread& t, const sluice::Context& ctx) {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (t.paused) {
          t.where = 2;
          cv_.wait(lock, [&] { return stop_ || !t.paused; });
        }
        if (stop_) return;
        t.where = 1;
      }
      const Verdict r = fq_.enforce_context(ctx);
      t.where = 0;
      if (!r.ok()) return;  // cancelled: the queue shut down
    }
  }

  bool quiet() {
    std::uint64_t waiting = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& t : states_) {
        const int where = t->where.load();
        if (where == 0 || (where == 2 && !t->paused)) return false;
        if (where == 1) ++waiting;
      }
    }
    if (clock_.waiters() != (waiting != 0 ? 1 : 0)) return false;
    return queued(fq_) == waiting && clock_.waiters() == (waiting != 0 ? 1 : 0);
  }

  Fq& fq_;
  ManualClock& clock_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::unique_ptr<Thread>> states_;
  std::vector<std::thread> threads_;
};

}  // namespace fqtest
