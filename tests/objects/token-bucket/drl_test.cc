// The drl object: configuration, long-run accuracy and burst bounds with a
// simulated clock, FIFO order, reconfiguration and shutdown with waiting
// threads on a manual clock.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "drl_test_util.h"
#include "sluice/clock.h"
#include "sluice/objects/builtin.h"
#include "sluice/objects/drl.h"
#include "sluice/stage.h"
#include "test_util.h"

namespace {

constexpr double kKiB = 1024.0;
constexpr double kMiB = 1024.0 * kKiB;
constexpr double kGiB = 1024.0 * kMiB;

// Requests issued one after another on a SimClock; records when each was
// admitted (the clock when enforce returned).
struct Grant {
  std::int64_t at;
  double cost;
};

// Checks the token-bucket bound over every window [t_i, t_j] of `grants`
// (sorted by time): admitted <= cap + rate * (t_j - t_i), give or take one
// nanosecond of accrual (grants are reported at whole nanoseconds). O(n): the
// excess of window (i, j) is (P_j - rate t_j) + (rate t_i - P_{i-1}), where P
// is the prefix sum of costs.
void check_windows(const std::vector<Grant>& grants, double rate, double cap) {
  long double prefix = 0;  // P_{j-1}
  long double best_start = -1e300L;
  long double worst = -1e300L;
  for (const Grant& g : grants) {
    const long double t = static_cast<long double>(g.at - grants.front().at) / 1e9L;
    best_start = std::max(best_start, rate * t - prefix);
    prefix += g.cost;
    worst = std::max(worst, prefix - rate * t + best_start - cap);
  }
  CHECK(static_cast<double>(worst) <= rate * 1e-9 + 1e-6 * cap);
}

}  // namespace

TEST_CASE("drl config: defaults and partial updates", "[drl]") {
  auto c = sluice::parse_drl_config(json{{"rate", 1000}}, nullptr);
  REQUIRE(c.is_ok());
  CHECK(c->rate == 1000);
  CHECK(c->unit == DrlConfig::kBytes);
  CHECK(c->refill_period_us == 100'000);
  CHECK(c->burst == Approx(100));
  CHECK_FALSE(c->burst_set);

  auto d = sluice::parse_drl_config(
      json{{"rate", 1e6}, {"refill_period_us", 1000}, {"unit", "ops"}}, nullptr);
  REQUIRE(d.is_ok());
  CHECK(d->unit == DrlConfig::kOps);
  CHECK(d->burst == Approx(1000));

  // A derived burst follows the rate; an explicit one stays.
  auto e = sluice::parse_drl_config(json{{"rate", 2e6}}, &*d);
  REQUIRE(e.is_ok());
  CHECK(e->unit == DrlConfig::kOps);
  CHECK(e->burst == Approx(2000));
  auto f = sluice::parse_drl_config(json{{"burst", 5}}, &*e);
  REQUIRE(f.is_ok());
  CHECK(f->burst == 5);
  CHECK(f->rate == 2e6);
  auto g = sluice::parse_drl_config(json{{"rate", 4e6}}, &*f);
  REQUIRE(g.is_ok());
  CHECK(g->burst == 5);
  CHECK(sluice::parse_drl_config(json::object(), &*g).is_ok());
}

TEST_CASE("drl config: every error names its field", "[drl]") {
  struct Case {
    json config;
    std::string message;
  };
  const std::vector<Case> cases = {
      {json::object(), "rate: required"},
      {{{"unit", "ops"}}, "rate: required"},
      {{{"rate", -5}}, "rate: must be a positive number, got -5"},
      {{{"rate", 0}}, "rate: must be a positive number, got 0"},
      {{{"rate", "fast"}}, "rate: must be a positive number, got \"fast\""},
      {{{"rate", true}}, "rate: must be a positive number, got true"},
      {{{"rate", nullptr}}, "rate: must be a positive number, got null"},
      {{{"rate", 1}, {"unit", "x"}}, "unit: must be \"bytes\" or \"ops\", got \"x\""},
      {{{"rate", 1}, {"unit", 3}}, "unit: must be \"bytes\" or \"ops\", got 3"},
      {{{"rate", 1}, {"burst", 0}}, "burst: must be a positive number, got 0"},
      {{{"rate", 1}, {"burst", -1.5}}, "burst: must be a positive number, got -1.5"},
      {{{"rate", 1}, {"burst", "big"}}, "burst: must be a positive number, got \"big\""},
      {{{"rate", 1}, {"refill_period_us", 0}}, "refill_period_us: must be an integer >= 1, got 0"},
      {{{"rate", 1}, {"refill_period_us", -3}},
       "refill_period_us: must be an integer >= 1, got -3"},
      {{{"rate", 1}, {"refill_period_us", 1.5}},
       "refill_period_us: must be an integer >= 1, got 1.5"},
      {{{"rate", 1}, {"refill_period_us", "100"}},
       "refill_period_us: must be an integer >= 1, got \"100\""},
      {{{"rate", 1}, {"refill_period_us", 18446744073709551615ULL}},
       "refill_period_us: must be an integer >= 1, got 18446744073709551615"},
      {{{"rate", 1}, {"foo", 2}}, "unknown field 'foo'"},
      {{{"rate", -1}, {"foo", 2}}, "unknown field 'foo'"},
      {json::array(), "config: must be an object"},
      {json(5), "config: must be an object"},
  };
  for (const Case& c : cases) {
    INFO(c.config.dump());
    auto parsed = sluice::parse_drl_config(c.config, nullptr);
    REQUIRE_FALSE(parsed.is_ok());
    CHECK(parsed.status().code() == sluice::Code::kInvalidArgument);
    CHECK(parsed.status().message() == c.message);

    Drl drl(nullptr);
    CHECK(drl.validate(c.config).message() == c.message);
    CHECK(drl.configure(c.config).message() == c.message);
  }
}

TEST_CASE("drl: rates below 1 token/s and bursts below 1 token are refused", "[drl]") {
  // Such a rate once made a 4 KiB request wait past the end of time.
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"rate", 5e-324}},
       "rate: must be at least 1 token (byte or request) per second, got 5e-324"},
      {{{"rate", 0.5}, {"unit", "ops"}},
       "rate: must be at least 1 token (byte or request) per second, got 0.5"},
      {{{"rate", 1}, {"burst", 0.5}}, "burst: must be at least 1 token (byte or request), got 0.5"},
      {{{"rate", 1}, {"burst", 1e-300}},
       "burst: must be at least 1 token (byte or request), got 1e-300"},
  };
  for (const auto& [config, message] : cases) {
    INFO(config.dump());
    Drl drl(nullptr);
    CHECK(drl.validate(config).message() == message);
    CHECK(drl.configure(config).message() == message);
  }
  // The floors themselves are accepted, and a derived burst is at least 1.
  auto c = sluice::parse_drl_config(json{{"rate", 1}}, nullptr);
  REQUIRE(c.is_ok());
  CHECK(c->rate == 1);
  CHECK(c->burst == 1);  // not 0.1: one refill period of 1 token/s
  CHECK(sluice::parse_drl_config(json{{"rate", 1}, {"burst", 1}}, nullptr).is_ok());

  // set_tunables (the board's way in) applies the same floors.
  ManualClock clock;
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}}).is_ok());
  std::array<double, sluice::kMaxTunables> v{};
  v[0] = 5e-324;
  CHECK(drl.set_tunables(0b01, v).message() ==
        "rate: must be at least 1 token (byte or request) per second, got 4.9406564584124654e-324");
  v[1] = 0.25;
  CHECK(drl.set_tunables(0b10, v).message() ==
        "burst: must be at least 1 token (byte or request), got 0.25");
  CHECK(drl.collect()["rate"] == 1000.0);
  v[0] = 1;
  REQUIRE(drl.set_tunables(0b01, v).is_ok());
  CHECK(drl.collect()["rate"] == 1.0);
  CHECK(drl.collect()["burst"] == 1.0);
}

TEST_CASE("drl: validate and configure use the current config as base; errors change nothing",
          "[drl]") {
  ManualClock clock;
  Drl drl(&clock);
  CHECK(drl.type() == "drl");
  CHECK(drl.validate(json{{"burst", 5}}).message() == "rate: required");
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 300}}).is_ok());
  CHECK(drl.validate(json{{"burst", 5}}).is_ok());
  CHECK(drl.validate(json{{"unit", "ops"}}).is_ok());

  const json before = drl.collect();
  CHECK(drl.configure(json{{"rate", 5}, {"burst", -1}}).message() ==
        "burst: must be a positive number, got -1");
  CHECK(drl.collect() == before);
  CHECK(before["rate"] == 1000.0);
  CHECK(before["burst"] == 300.0);
  CHECK(before["unit"] == "bytes");
  CHECK(before["tokens"] == 300.0);  // the bucket starts full
  CHECK(before["waiters"] == 0);
  CHECK(before["granted_ops"] == 0);
  CHECK(before["granted_tokens"] == 0.0);
}

TEST_CASE("drl: accuracy with a simulated clock, bytes", "[drl][accuracy]") {
  for (double rate : {kKiB, kMiB, kGiB, 10 * kGiB}) {
    for (std::uint64_t size : {1ULL, 4096ULL, 65536ULL, 1ULL << 20}) {
      for (std::int64_t refill_us : {1, 100'000}) {
        const double burst = rate * static_cast<double>(refill_us) / 1e6;
        if (burst / static_cast<double>(size) > 2e6) continue;  // too long to drain here
        INFO("rate " << rate << " size " << size << " refill_period_us " << refill_us);
        SimClock clock;
        Drl drl(&clock);
        REQUIRE(drl.configure(json{{"rate", rate}, {"refill_period_us", refill_us}}).is_ok());
        const std::int64_t t0 = clock.now_ns();
        // Past the initial bucket, for >= 2000 requests and >= 20 simulated
        // microseconds, ending on a request that waited (bucket empty).
        const double min_requests = burst / static_cast<double>(size) + 2000;
        double admitted = 0;
        std::uint64_t waited_ns = 0;
        std::uint64_t n = 0;
        bool last_waited = false;
        while (n < min_requests || clock.now_ns() - t0 < 20'000 || !last_waited) {
          const Verdict r = enforce(drl, size);
          if (!r.ok()) FAIL("request " << n << " was not admitted");
          admitted += static_cast<double>(size);
          waited_ns += r.wait_ns;
          last_waited = r.wait_ns > 0;
          ++n;
        }
        const double elapsed_s = static_cast<double>(clock.now_ns() - t0) / 1e9;
        const double achieved = (admitted - std::max(burst, 0.0)) / elapsed_s;
        CHECK(std::abs(achieved / rate - 1) < 1e-3);
        // Single-threaded, all simulated time passes inside waits.
        CHECK(waited_ns == static_cast<std::uint64_t>(clock.now_ns() - t0));
        CHECK(drl.collect()["granted_ops"] == n);
      }
    }
  }
}

TEST_CASE("drl: accuracy with a simulated clock, ops", "[drl][accuracy]") {
  for (double rate : {1.0, 1000.0, 1e6, 1e8}) {
    INFO("rate " << rate << " ops/s");
    SimClock clock;
    Drl drl(&clock);
    REQUIRE(drl.configure(json{{"rate", rate}, {"unit", "ops"}, {"burst", 10}}).is_ok());
    const std::int64_t t0 = clock.now_ns();
    std::uint64_t n = 0;
    bool last_waited = false;
    while (n < 3000 || !last_waited) {
      const Verdict r = enforce(drl, 4096 * (n % 7));  // the size does not matter
      if (!r.ok()) FAIL("request " << n << " was not admitted");
      last_waited = r.wait_ns > 0;
      ++n;
    }
    const double achieved =
        static_cast<double>(n - 10) * 1e9 / static_cast<double>(clock.now_ns() - t0);
    CHECK(std::abs(achieved / rate - 1) < 1e-3);
    CHECK(drl.collect()["granted_tokens"] == static_cast<double>(n));
  }
}

TEST_CASE("drl: burst is respected after idle and over every window", "[drl][burst]") {
  struct Case {
    double rate;
    double burst;
    std::uint64_t size;
    int at_once;  // requests admitted at the same instant from a full bucket
  };
  for (const Case& c : {Case{kMiB, 64 * kKiB, 4096, 16}, Case{kMiB, 10'000, 4096, 2},
                        Case{1000, 1000, 4096, 1}, Case{10 * kGiB, 64 * kKiB, 1, 1 << 16}}) {
    INFO("rate " << c.rate << " burst " << c.burst << " size " << c.size);
    SimClock clock;
    Drl drl(&clock);
    REQUIRE(drl.configure(json{{"rate", c.rate}, {"burst", c.burst}}).is_ok());
    std::vector<Grant> grants;
    const int per_phase = std::max(c.at_once, 50) + 50;
    for (int phase = 0; phase < 3; ++phase) {
      const std::int64_t start = clock.now_ns();
      int same_instant = 0;
      for (int i = 0; i < per_phase; ++i) {
        if (!enforce(drl, c.size).ok()) FAIL("request " << i << " was not admitted");
        grants.push_back({clock.now_ns(), static_cast<double>(c.size)});
        if (clock.now_ns() == start) ++same_instant;
      }
      CHECK(same_instant == (c.size > c.burst ? 0 : c.at_once));
      clock.advance(100 * kSecond);  // idle: the bucket fills up to burst, no more
    }
    check_windows(grants, c.rate, std::max(c.burst, static_cast<double>(c.size)));
  }
}

TEST_CASE("drl: a request larger than the bucket waits for its whole cost", "[drl][burst]") {
  SimClock clock;
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 1000}}).is_ok());
  clock.advance(100 * kSecond);
  CHECK(enforce(drl, 4096).wait_ns == 3'096'000'000);  // 1000 were in the bucket
  CHECK(enforce(drl, 4096).wait_ns == 4'096'000'000);
  CHECK(enforce(drl, 0).wait_ns == 0);
}

namespace {

// Threads that enforce on one Drl under a ManualClock and record the order
// and results of their grants.
struct DrlCrowd {
  explicit DrlCrowd(Drl& d) : drl(d) {}
  ~DrlCrowd() {
    for (auto& t : threads) t.join();
  }

  // Starts a request of `size` and returns once it is queued.
  void add(std::uint64_t size) {
    const int id = static_cast<int>(threads.size());
    const std::uint64_t queued = waiters(drl);
    threads.emplace_back([this, id, size] {
      const Verdict r = drl.enforce_context(sized(size));
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(id);
      results.push_back(r);
    });
    eventually([&] { return waiters(drl) == queued + 1; });
  }
  std::size_t done() {
    std::lock_guard<std::mutex> lock(mu);
    return order.size();
  }

  Drl& drl;
  std::vector<std::thread> threads;
  std::mutex mu;
  std::vector<int> order;
  std::vector<Verdict> results;
};

}  // namespace

TEST_CASE("drl: waiters are granted in FIFO order at their exact times", "[drl][fifo]") {
  const std::int64_t t0 = kSecond;
  ManualClock clock(t0);
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 1000}}).is_ok());
  REQUIRE(enforce(drl, 1000).wait_ns == 0);  // empties the bucket
  DrlCrowd crowd(drl);
  const std::vector<std::uint64_t> sizes = {300, 100, 500, 200, 400};
  for (std::uint64_t size : sizes) crowd.add(size);
  CHECK(clock.waiters() == 1);  // only the head sleeps on the clock

  std::int64_t due = t0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    due += static_cast<std::int64_t>(sizes[i]) * kSecond / 1000;
    clock.set(due - 1);
    eventually([&] { return clock.waiters() == 1; });
    CHECK(crowd.done() == i);
    clock.set(due);
    eventually([&] { return crowd.done() == i + 1; });
    if (i + 1 < sizes.size()) eventually([&] { return clock.waiters() == 1; });
    std::lock_guard<std::mutex> lock(crowd.mu);
    CHECK(crowd.order.back() == static_cast<int>(i));
    CHECK(crowd.results.back().ok());
    CHECK(crowd.results.back().wait_ns == static_cast<std::uint64_t>(due - t0));
  }
  CHECK(waiters(drl) == 0);
}

TEST_CASE("drl: a grant that is noticed late costs no rate", "[drl][fifo]") {
  const std::int64_t t0 = kSecond;
  const std::int64_t ms = 1'000'000;
  ManualClock clock(t0);
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 200}}).is_ok());
  REQUIRE(enforce(drl, 200).ok());
  DrlCrowd crowd(drl);
  crowd.add(100);                                 // due at t0 + 100 ms
  crowd.add(100);                                 // due at t0 + 200 ms
  clock.set(t0 + 250 * ms);                       // both are due; the late wakeup loses nothing
  eventually([&] { return crowd.done() == 2; });  // granted together: either may return first
  // Accounted as of t0 + 200 ms: 50 tokens have accrued since.
  CHECK(drl.collect()["tokens"].get<double>() == Approx(50));
  CHECK(enforce(drl, 50).wait_ns == 0);
  CHECK(drl.collect()["tokens"].get<double>() == Approx(0).margin(1e-9));
}

TEST_CASE("drl: the grant observer sees each grant once, in order, when it is decided",
          "[drl][fifo]") {
  const std::int64_t t0 = kSecond;
  const std::int64_t ms = 1'000'000;
  ManualClock clock(t0);
  Drl drl(&clock);
  std::mutex mu;
  std::vector<Grant> seen;
  drl.set_grant_observer([&](std::int64_t at, double cost) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back({at, cost});
  });
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 1000}}).is_ok());
  REQUIRE(enforce(drl, 1000).wait_ns == 0);  // at once, from a full bucket
  DrlCrowd crowd(drl);
  crowd.add(300);  // due at t0 + 300 ms
  crowd.add(100);  // due at t0 + 400 ms
  clock.set(t0 + 250 * ms);
  eventually([&] { return clock.waiters() == 1; });
  CHECK(crowd.done() == 0);
  clock.set(t0 + 450 * ms);  // both due: decided now, whichever thread runs first
  eventually([&] { return crowd.done() == 2; });
  std::lock_guard<std::mutex> lock(mu);
  REQUIRE(seen.size() == 3);
  CHECK(seen[0].at == t0);
  CHECK(seen[0].cost == 1000);
  CHECK(seen[1].at == t0 + 450 * ms);
  CHECK(seen[1].cost == 300);
  CHECK(seen[2].at == t0 + 450 * ms);
  CHECK(seen[2].cost == 100);
}

TEST_CASE("drl: a very late wakeup admits at most burst plus one cost at once", "[drl][burst]") {
  const std::int64_t t0 = kSecond;
  const std::int64_t ms = 1'000'000;
  ManualClock clock(t0);
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 100}}).is_ok());
  REQUIRE(enforce(drl, 100).ok());
  DrlCrowd crowd(drl);
  crowd.add(100);  // due at t0 + 100 ms
  crowd.add(100);  // due at t0 + 200 ms
  crowd.add(100);  // due at t0 + 300 ms
  // Nobody notices for a second: the 200 tokens due by t0 + 1 s (the head's
  // cost plus one bucket) are granted, the rest was forfeited like a full
  // bucket's, and the third waiter is due one cost later.
  clock.set(t0 + 1000 * ms);
  eventually([&] { return crowd.done() == 2 && clock.waiters() == 1; });
  CHECK(drl.collect()["tokens"].get<double>() == Approx(0).margin(1e-9));
  // 900 ms late, one bucket (100 ms) absorbed: 800 tokens lost to lateness.
  CHECK(drl.collect()["late_forfeited_tokens"].get<double>() == Approx(800));
  clock.set(t0 + 1100 * ms - 1);
  eventually([&] { return clock.waiters() == 1; });
  CHECK(crowd.done() == 2);
  clock.set(t0 + 1100 * ms);
  eventually([&] { return crowd.done() == 3; });
  CHECK(crowd.order.back() == 2);
}

TEST_CASE("drl: reconfiguration re-times waiters, drops and starves none", "[drl][configure]") {
  const std::int64_t t0 = kSecond;
  const std::int64_t ms = 1'000'000;
  ManualClock clock(t0);
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 1000}}).is_ok());
  REQUIRE(enforce(drl, 1000).wait_ns == 0);
  DrlCrowd crowd(drl);
  for (int i = 0; i < 3; ++i) crowd.add(1000);  // due at t0 + 1 s, 2 s, 3 s at 1000 B/s

  auto check_grant_at = [&](std::int64_t when, std::size_t count) {
    clock.set(when - 1);
    eventually([&] { return clock.waiters() == 1; });
    CHECK(crowd.done() == count - 1);
    clock.set(when);
    eventually([&] { return crowd.done() == count; });
    if (count < 3) eventually([&] { return clock.waiters() == 1; });
  };

  clock.set(t0 + 500 * ms);  // the head has 500 of its 1000
  REQUIRE(drl.configure(json{{"rate", 2000}}).is_ok());
  CHECK(waiters(drl) == 3);
  eventually([&] { return clock.waiters() == 1; });
  check_grant_at(t0 + 750 * ms, 1);  // 500 more at 2000/s
  // The second has 500 at t0 + 1 s; halve the rate to 500 B/s: 1 s more.
  clock.set(t0 + 1000 * ms);
  eventually([&] { return clock.waiters() == 1; });
  REQUIRE(drl.configure(json{{"rate", 500}}).is_ok());
  CHECK(waiters(drl) == 2);
  check_grant_at(t0 + 2000 * ms, 2);
  check_grant_at(t0 + 4000 * ms, 3);
  CHECK(crowd.order == std::vector<int>{0, 1, 2});
  for (const Verdict& r : crowd.results) CHECK(r.ok());
  CHECK(drl.collect()["rate"] == 500.0);
}

TEST_CASE("drl: a smaller burst clamps the tokens, a waiting head keeps its cost",
          "[drl][configure]") {
  const std::int64_t t0 = kSecond;
  ManualClock clock(t0);
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 1000}}).is_ok());
  REQUIRE(drl.configure(json{{"burst", 10}}).is_ok());
  CHECK(drl.collect()["tokens"] == 10.0);
  DrlCrowd crowd(drl);
  crowd.add(500);  // larger than the bucket: waits for all 500 (490 more)
  clock.set(t0 + 489'000'000);
  eventually([&] { return clock.waiters() == 1; });
  CHECK(crowd.done() == 0);
  clock.set(t0 + 490'000'000);
  eventually([&] { return crowd.done() == 1; });
}

TEST_CASE("drl: shutdown wakes every waiter with kCancelled", "[drl][shutdown]") {
  ManualClock clock;
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 1000}}).is_ok());
  REQUIRE(enforce(drl, 1000).ok());
  {
    DrlCrowd crowd(drl);
    for (int i = 0; i < 4; ++i) crowd.add(1000);
    drl.shutdown();
    eventually([&] { return crowd.done() == 4; });
    for (const Verdict& r : crowd.results) CHECK(r.outcome == Outcome::kCancelled);
  }
  CHECK(waiters(drl) == 0);
  const Verdict later = enforce(drl, 1ULL << 40);
  CHECK(later.outcome == Outcome::kOk);
  CHECK(later.wait_ns == 0);
}

TEST_CASE("drl: before its first configuration a drl passes requests through", "[drl]") {
  ManualClock clock;
  Drl drl(&clock);
  CHECK(enforce(drl, 1ULL << 30).ok());
  auto made = sluice::make_drl(sluice::ObjectEnv{&clock});
  REQUIRE(made);
  CHECK(made->type() == "drl");
}

TEST_CASE("drl: the registry creates configured drl objects by name", "[drl]") {
  ManualClock clock;
  const sluice::ObjectEnv env{&clock};
  auto made = sluice::Registry::global().create("drl", json{{"rate", 1000}, {"unit", "ops"}}, env);
  REQUIRE(made.is_ok());
  CHECK((*made)->type() == "drl");
  CHECK((*made)->collect()["unit"] == "ops");
  auto bad = sluice::Registry::global().create("drl", json{{"rate", -5}}, env);
  REQUIRE_FALSE(bad.is_ok());
  CHECK_THAT(bad.status().message(),
             Catch::Matchers::EndsWith("rate: must be a positive number, got -5"));
}

// The stage library knows no object type: the objects library adds the
// built-in ones where a program asks it to.
TEST_CASE("the built-in types come from the objects library, once, into any registry",
          "[registry]") {
  sluice::Registry empty;
  CHECK_FALSE(empty.contains("drl"));
  auto made = empty.create("drl", json{{"rate", 1000}}, {});
  REQUIRE_FALSE(made.is_ok());
  CHECK(made.status().code() == sluice::Code::kNotFound);
  CHECK_THAT(made.status().message(),
             Catch::Matchers::Contains("sluice::objects::register_builtin()"));
  // A stage with that registry says where the types come from.
  sluice::StageOptions o;
  o.registry = &empty;
  auto stage = sluice::Stage::create(o).value();
  const sluice::Status s = stage->apply(json::parse(R"([
    {"rule": "create_channel", "channel": "all", "default": true},
    {"rule": "create_object", "channel": "all", "object": "limit", "type": "drl",
     "config": {"rate": 1000}}])"));
  CHECK_THAT(s.message(), Catch::Matchers::Contains("rules[1]: type: unknown object type 'drl'"));
  CHECK_THAT(s.message(), Catch::Matchers::Contains("register_builtin()"));

  sluice::Registry mine;
  REQUIRE(sluice::objects::register_builtin(mine).is_ok());
  CHECK(mine.names() == std::vector<std::string>{"buffer-pool", "cache-reserve", "deferral-gate",
                                                 "drft", "drl", "fq", "noop", "prio-bucket"});
  CHECK(sluice::objects::register_builtin(mine).code() == sluice::Code::kAlreadyExists);
  auto other = mine.create("nope", json::object(), {});
  REQUIRE_FALSE(other.is_ok());
  CHECK(other.status().message() ==
        "unknown object type 'nope' (registered: buffer-pool, cache-reserve, deferral-gate, drft, "
        "drl, "
        "fq, noop, prio-bucket)");

  // The global registry: the tests' main registered them; again is a no-op.
  sluice::objects::register_builtin();
  sluice::objects::register_builtin();
  CHECK(sluice::Registry::global().contains("drl"));
  CHECK(sluice::Registry::global().contains("noop"));
}

TEST_CASE("drl: concurrent enforce, configure and collect (system clock)", "[drl][concurrency]") {
  // A smoke test for the sanitizers: behaviour is asserted through counters,
  // never through elapsed time.
  Drl drl(nullptr);
  REQUIRE(drl.configure(json{{"rate", 256 * kMiB}, {"refill_period_us", 1000}}).is_ok());
  constexpr int kThreads = 4;
  constexpr int kRequests = 1000;
  std::atomic<int> failures{0};  // Catch2 assertions are not thread-safe
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&drl, &failures] {
      for (int i = 0; i < kRequests; ++i) {
        if (!enforce(drl, 4096).ok()) ++failures;
      }
    });
  }
  std::thread tuner([&] {
    for (int i = 0; !stop; ++i) {
      if (!drl.configure(json{{"rate", (i % 2 ? 128 : 512) * kMiB}}).is_ok()) ++failures;
      if (drl.collect()["waiters"].get<int>() > kThreads) ++failures;
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

TEST_CASE("drl: tokens lost to an idle full bucket and to late wakeups are counted apart",
          "[drl]") {
  SimClock clock;
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 100}}).is_ok());
  clock.advance(kSecond);  // idle with a full bucket: 1000 tokens overflow
  REQUIRE(enforce(drl, 100).wait_ns == 0);
  REQUIRE(enforce(drl, 100).wait_ns == 100'000'000);  // punctual: nothing lost
  const json stats = drl.collect();
  CHECK(stats["overflow_tokens"].get<double>() == Approx(1000));
  CHECK(stats["late_forfeited_tokens"].get<double>() == 0.0);
}

namespace {

// A SimClock that records how the drl waits: timed waits (their targets) and
// waits without a timer (their deadlines). Timed waits wake `late_ns` after
// their target, as a loaded system's timers do.
class RecordingClock final : public sluice::Clock {
 public:
  std::int64_t now_ns() const noexcept override { return sim.now_ns(); }
  void wait_until(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                  std::int64_t deadline_ns) override {
    timed.push_back(deadline_ns);
    sim.wait_until(lock, cv, deadline_ns + late_ns);
  }
  void wait_briefly(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                    std::int64_t deadline_ns) override {
    brief.push_back(deadline_ns);
    sim.wait_until(lock, cv, deadline_ns);
  }

  SimClock sim;
  std::int64_t late_ns = 0;
  std::vector<std::int64_t> timed, brief;
};

}  // namespace

TEST_CASE("drl: a bucket shorter than the timers' lateness waits its last stretch without a timer",
          "[drl][wait]") {
  RecordingClock clock;
  Drl drl(&clock);
  // 1 byte/ns, a 4096 ns bucket: far shorter than the 100 us a timed wait is
  // first assumed to be late by.
  REQUIRE(drl.configure(json{{"rate", 1e9}, {"burst", 4096}}).is_ok());
  const std::int64_t t0 = clock.now_ns();
  REQUIRE(enforce(drl, 4096).wait_ns == 0);
  // Grants stay exact: each 1e6-byte request is due 1 ms after the last.
  REQUIRE(enforce(drl, 1'000'000).wait_ns == 1'000'000);
  REQUIRE(clock.timed.size() == 1);
  REQUIRE(clock.brief.size() == 1);
  CHECK(clock.brief[0] == t0 + 1'000'000);  // waited briefly up to its deadline,
  const std::int64_t stretch = clock.brief[0] - clock.timed[0];
  CHECK(stretch == 100'000 - 4096);  // from the assumed lateness beyond one bucket
  // Punctual timers: the estimate falls and brief waits stop once it is below
  // one bucket; every grant is still exact.
  for (int i = 0; i < 400; ++i) REQUIRE(enforce(drl, 1'000'000).wait_ns == 1'000'000);
  CHECK(drl.collect()["wake_late_ns"].get<std::int64_t>() < 4096);
  const std::size_t brief = clock.brief.size();
  REQUIRE(enforce(drl, 1'000'000).wait_ns == 1'000'000);
  CHECK(clock.brief.size() == brief);
  CHECK(clock.timed.back() == clock.now_ns());  // a timed wait right to the deadline
  CHECK(drl.collect()["late_forfeited_tokens"].get<double>() == 0.0);
}

TEST_CASE("drl: timers late by more than a bucket are met early enough to lose nothing",
          "[drl][wait]") {
  RecordingClock clock;
  clock.late_ns = 150'000;  // every timed wait wakes 150 us late
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1e9}, {"burst", 4096}}).is_ok());
  REQUIRE(enforce(drl, 4096).wait_ns == 0);
  // The first waits lose what the 100 us first guess does not cover; then the
  // estimate reaches 150 us and the timer is set that much early.
  for (int i = 0; i < 50; ++i) REQUIRE(enforce(drl, 1'000'000).ok());
  const double lost = drl.collect()["late_forfeited_tokens"].get<double>();
  CHECK(lost > 0);
  for (int i = 0; i < 100; ++i) REQUIRE(enforce(drl, 1'000'000).wait_ns <= 1'000'000);
  CHECK(drl.collect()["late_forfeited_tokens"].get<double>() == lost);
  CHECK(drl.collect()["wake_late_ns"].get<std::int64_t>() >= 150'000 - 4096);
}

TEST_CASE("drl: configure re-times a head that is waiting without a timer", "[drl][wait]") {
  const std::int64_t t0 = kSecond;
  ManualClock clock(t0);
  Drl drl(&clock);
  // A 4096 ns bucket: the head's last ~96 us are waited without a timer.
  REQUIRE(drl.configure(json{{"rate", 1e9}, {"burst", 4096}}).is_ok());
  REQUIRE(enforce(drl, 4096).ok());
  DrlCrowd crowd(drl);
  crowd.add(1'000'000);  // due at t0 + 1 ms
  eventually([&] { return clock.waiters() == 1; });
  clock.set(t0 + 950'000);  // its timer has fired: it waits briefly from here
  eventually([&] { return clock.waiters() == 1; });
  // Half the rate: the 50'000 tokens still missing take 100 us more.
  REQUIRE(drl.configure(json{{"rate", 5e8}}).is_ok());
  clock.set(t0 + 1'000'000);
  eventually([&] { return clock.waiters() == 1; });
  CHECK(crowd.done() == 0);
  clock.set(t0 + 1'050'000 - 1);
  eventually([&] { return clock.waiters() == 1; });
  CHECK(crowd.done() == 0);
  clock.set(t0 + 1'050'000);
  eventually([&] { return crowd.done() == 1; });
  CHECK(crowd.results[0].wait_ns == 1'050'000);
}

TEST_CASE("drl: in ops, a request costs one token whatever it moved", "[drl][settle]") {
  SimClock clock;
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 10}, {"unit", "ops"}, {"burst", 2}}).is_ok());
  sluice::Context c = sized(1ULL << 30);
  c.flags = sluice::context_flag::kNoWait;
  CHECK(drl.try_enforce_context(c).outcome == Outcome::kOk);
  CHECK(drl.try_enforce_context(c).outcome == Outcome::kOk);
  CHECK(drl.try_enforce_context(c).outcome == Outcome::kWouldWait);
  CHECK(drl.settle(sized(1), 1ULL << 30).wait_ns == 0);  // more moved: nothing more to pay
  CHECK(drl.settle(sized(1ULL << 30), 0).wait_ns == 0);  // less moved: nothing to give back
  CHECK(drl.collect()["tokens"].get<double>() == 0);
  CHECK(drl.collect()["refunded_tokens"].get<double>() == 0);
  CHECK(enforce(drl, 0).wait_ns == 100'000'000);
}

TEST_CASE("drl: a refund may pay the waiting head at once", "[drl][settle]") {
  ManualClock clock;
  Drl drl(&clock);
  REQUIRE(drl.configure(json{{"rate", 1000}, {"burst", 1000}}).is_ok());
  REQUIRE(enforce(drl, 1000).ok());  // the bucket is empty
  DrlCrowd crowd(drl);
  crowd.add(500);  // would wait half a second
  // The request before it moved nothing: its 1000 come back, and pay the head
  // without the clock moving.
  CHECK(drl.settle(sized(1000), 0).wait_ns == 0);
  eventually([&] { return crowd.done() == 1; });
  CHECK(crowd.results[0].ok());
  CHECK(drl.collect()["refunded_tokens"].get<double>() == 1000);
  CHECK(drl.collect()["tokens"].get<double>() == Approx(500));
}

// Leases: the lock-free grant path.
