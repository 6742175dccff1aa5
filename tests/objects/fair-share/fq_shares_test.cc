// The fq object's shares with backlogged flows on a manual clock (Backlog:
// the clock moves only when every flow waits, so service follows the queue's
// tags alone and the counts are exact): weights 1:2:3:4 and 100:10:1, DRF
// between a bytes-bound and an ops-bound flow, work conservation, no credit
// for a flow back from idle, weight changes, tags moved back when V grows;
// and real threads on the system clock, whose totals must add up.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "fq_test_util.h"
#include "sluice/clock.h"
#include "sluice/objects/fq.h"

using namespace fqtest;

namespace {

std::vector<std::uint64_t> ops_of(const Fq& fq, const std::vector<std::uint64_t>& ids) {
  std::vector<std::uint64_t> out;
  for (std::uint64_t id : ids) out.push_back(served_ops(fq, id));
  return out;
}

std::vector<std::uint64_t> minus(const std::vector<std::uint64_t>& a,
                                 const std::vector<std::uint64_t>& b) {
  std::vector<std::uint64_t> out;
  for (std::size_t i = 0; i < a.size(); ++i) out.push_back(a[i] - b[i]);
  return out;
}

// Backlogged flows `ids` with `weights`, 1 ms a request: what each is served
// over `seconds` of the clock once all are backlogged.
std::vector<std::uint64_t> shares(const std::vector<std::uint64_t>& ids,
                                  const std::vector<double>& weights, std::int64_t duration) {
  ManualClock clock;
  Fq fq(&clock);
  json w = json::object();
  for (std::size_t i = 0; i < ids.size(); ++i) w[std::to_string(ids[i])] = weights[i];
  REQUIRE(fq.configure(json{{"capacity", {{"ops", 1000}}}, {"weights", w}}).is_ok());
  Backlog backlog(fq, clock);
  for (std::uint64_t id : ids) backlog.add(request(static_cast<std::uint32_t>(id)));
  backlog.settle();
  const auto before = ops_of(fq, ids);
  backlog.run(duration, kMs);
  return minus(ops_of(fq, ids), before);
}

}  // namespace

TEST_CASE("fq: weights 1:2:3:4 give shares within 2%", "[fq][shares]") {
  const std::vector<double> weights = {1, 2, 3, 4};
  const auto got = shares({1, 2, 3, 4}, weights, kSecond);
  const double total = static_cast<double>(got[0] + got[1] + got[2] + got[3]);
  CHECK(total == 1000);  // work-conserving: 1 s of 1 ms requests
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("flow " << i + 1 << " served " << got[i]);
    CHECK(static_cast<double>(got[i]) / total == Approx(weights[i] / 10).epsilon(0.02));
  }
}

TEST_CASE("fq: weights 100:10:1 give shares within 2%", "[fq][shares]") {
  const std::vector<double> weights = {100, 10, 1};
  const auto got = shares({1, 2, 3}, weights, 11'100 * kMs);
  const double total = static_cast<double>(got[0] + got[1] + got[2]);
  CHECK(total == 11'100);
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("flow " << i + 1 << " served " << got[i]);
    CHECK(static_cast<double>(got[i]) / total == Approx(weights[i] / 111).epsilon(0.02));
  }
}

TEST_CASE(
    "fq: DRF gives a bytes-bound and an ops-bound flow equal shares of their dominant "
    "resource",
    "[fq][shares][drf]") {
  ManualClock clock;
  Fq fq(&clock);
  // Reads of 64 KiB take 1 ms of the read bandwidth (0.5 ms of ops); reads of
  // 512 B take 0.5 ms of ops (8 us of bandwidth).
  const double read_bytes = 65'536'000;
  const double ops = 2000;
  REQUIRE(fq.configure(json{{"capacity", {{"read_bytes", read_bytes}, {"ops", ops}}}}).is_ok());
  Backlog backlog(fq, clock);
  backlog.add(request(1, Op::kRead, 65'536));
  backlog.add(request(2, Op::kRead, 512));
  backlog.settle();
  const json a0 = flow_of(fq.collect(), 1);
  const json b0 = flow_of(fq.collect(), 2);
  const std::int64_t duration = 2 * kSecond;
  backlog.run(duration, kMs / 2);
  const json a = flow_of(fq.collect(), 1);
  const json b = flow_of(fq.collect(), 2);
  const double seconds = static_cast<double>(duration) / 1e9;
  // The dominant share of each: flow 1's of the read bandwidth, flow 2's of ops.
  const double a_share = static_cast<double>(a["served_read_bytes"].get<std::uint64_t>() -
                                             a0["served_read_bytes"].get<std::uint64_t>()) /
                         (read_bytes * seconds);
  const double b_share = static_cast<double>(b["served_ops"].get<std::uint64_t>() -
                                             b0["served_ops"].get<std::uint64_t>()) /
                         (ops * seconds);
  CHECK(a_share == Approx(0.5).epsilon(0.02));
  CHECK(b_share == Approx(0.5).epsilon(0.02));
  // Equal work, too: the queue counts in server time.
  const auto a_work =
      a["served_work_ns"].get<std::int64_t>() - a0["served_work_ns"].get<std::int64_t>();
  const auto b_work =
      b["served_work_ns"].get<std::int64_t>() - b0["served_work_ns"].get<std::int64_t>();
  CHECK(static_cast<double>(a_work) == Approx(static_cast<double>(b_work)).epsilon(0.02));
  CHECK(a_work + b_work == duration);
}

TEST_CASE("fq: a flow alone gets the whole capacity, whatever its weight", "[fq][shares]") {
  for (double weight : {1.0, 0.001}) {
    INFO("weight " << weight);
    ManualClock clock;
    Fq fq(&clock);
    // Flows 2 and 3 have large weights but ask for nothing.
    REQUIRE(fq.configure(json{{"capacity", {{"ops", 100}}},
                              {"weights", {{"1", weight}, {"2", 1000}, {"3", 1000}}}})
                .is_ok());
    Backlog backlog(fq, clock);
    backlog.add(request(1));
    backlog.settle();
    const std::uint64_t before = served_ops(fq, 1);
    backlog.run(kSecond, 10 * kMs);
    CHECK(served_ops(fq, 1) - before == 100);  // 1 s of 10 ms requests
    CHECK(served_ops(fq, 2) == 0);
  }
}

TEST_CASE("fq: a flow back from 10 s idle gets its share, not its absence", "[fq][shares][idle]") {
  ManualClock clock;
  Fq fq(&clock);
  // 10 ms a request: 100 a second.
  REQUIRE(fq.configure(json{{"capacity", {{"ops", 100}}}}).is_ok());
  Backlog backlog(fq, clock);
  backlog.add(request(1));
  backlog.add(request(2));
  backlog.run(kSecond, 10 * kMs);  // both backlogged
  backlog.pause(1);
  backlog.run(10 * kSecond, 10 * kMs);  // flow 2 idle: flow 1 gets it all
  backlog.resume(1);
  backlog.settle();
  const auto before = ops_of(fq, {1, 2});
  backlog.run(kSecond, 10 * kMs);
  const auto got = minus(ops_of(fq, {1, 2}), before);
  INFO("flow 1 served " << got[0] << ", flow 2 " << got[1]);
  CHECK(got[0] + got[1] == 100);
  CHECK(got[1] <= 50 + 1);  // no more than its share, plus one request
  CHECK(got[1] >= 50 - 1);  // and not less
}

TEST_CASE("fq: a flow that used idle capacity owes nothing when others return", "[fq][shares]") {
  ManualClock clock;
  Fq fq(&clock);
  REQUIRE(fq.configure(json{{"capacity", {{"ops", 100}}}}).is_ok());
  Backlog backlog(fq, clock);
  backlog.add(request(1));
  backlog.add(request(2));
  backlog.pause(1);
  backlog.run(5 * kSecond, 10 * kMs);  // flow 1 alone, 500 requests
  backlog.resume(1);
  backlog.settle();
  const auto before = ops_of(fq, {1, 2});
  backlog.run(kSecond, 10 * kMs);
  const auto got = minus(ops_of(fq, {1, 2}), before);
  INFO("flow 1 served " << got[0] << ", flow 2 " << got[1]);
  CHECK(got[0] >= 50 - 1);
  CHECK(got[1] <= 50 + 1);
}

TEST_CASE("fq: a weight applies to the tags computed after it changes", "[fq][shares]") {
  ManualClock clock;
  Fq fq(&clock);
  REQUIRE(fq.configure(json{{"capacity", {{"ops", 1000}}}}).is_ok());
  Backlog backlog(fq, clock);
  backlog.add(request(1));
  backlog.add(request(2));
  backlog.run(100 * kMs, kMs);
  auto before = ops_of(fq, {1, 2});
  backlog.run(400 * kMs, kMs);
  auto got = minus(ops_of(fq, {1, 2}), before);
  CHECK(got[0] == Approx(200).margin(1));
  CHECK(got[1] == Approx(200).margin(1));
  // Through the board's way in: flow 1 weighs 3 from now on.
  std::array<double, sluice::kMaxTunables> v{};
  v[0] = 3;
  REQUIRE(fq.set_tunables(1, v).is_ok());
  backlog.run(10 * kMs, kMs);  // the tags computed before it are served
  before = ops_of(fq, {1, 2});
  backlog.run(400 * kMs, kMs);
  got = minus(ops_of(fq, {1, 2}), before);
  CHECK(got[0] == Approx(300).margin(1));
  CHECK(got[1] == Approx(100).margin(1));
}

TEST_CASE("fq: shares hold while virtual time is moved back", "[fq][shares]") {
  ManualClock clock;
  Fq fq(&clock);
  // 1 s a request at weight 0.001: V grows by 1e12 a request of flow 1, and
  // is moved back (at 2^40) nearly every time.
  REQUIRE(fq.configure(json{{"capacity", {{"ops", 1}}}, {"weights", {{"1", 0.001}, {"2", 0.002}}}})
              .is_ok());
  Backlog backlog(fq, clock);
  backlog.add(request(1));
  backlog.add(request(2));
  backlog.settle();
  const auto before = ops_of(fq, {1, 2});
  std::vector<double> vt = {fq.collect()["virtual_time"].get<double>()};
  for (int i = 0; i < 3; ++i) {
    backlog.run(20 * kSecond, kSecond);
    vt.push_back(fq.collect()["virtual_time"].get<double>());
  }
  const auto got = minus(ops_of(fq, {1, 2}), before);
  CHECK(got[0] == Approx(20).margin(1));
  CHECK(got[1] == Approx(40).margin(1));
  // What it reports keeps growing, by flow 1's service over its weight.
  CHECK(std::is_sorted(vt.begin(), vt.end()));
  CHECK(vt[3] - vt[0] == Approx(2e13).margin(1e12));
}

TEST_CASE("fq: concurrent enforce, configure and collect (system clock)", "[fq][concurrency]") {
  // For the sanitizers: behaviour is asserted through counters, never
  // through elapsed time.
  Fq fq(nullptr);
  REQUIRE(
      fq.configure(json{{"capacity", {{"ops", 200'000}, {"write_bytes", 1e9}}}, {"burst_us", 200}})
          .is_ok());
  constexpr int kThreads = 4;
  constexpr int kRequests = 2000;
  std::atomic<int> failures{0};                        // Catch2's assertions are not thread-safe
  std::array<std::atomic<std::uint64_t>, 3> served{};  // by tenant
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&fq, &failures, &served, t] {
      const auto tenant = static_cast<std::uint32_t>(t % 3);  // threads 0 and 3 share a flow
      const sluice::Context ctx = request(tenant, Op::kWrite, 4096);
      for (int i = 0; i < kRequests; ++i) {
        if (i % 7 == 0) {  // some must not wait
          const sluice::Outcome o = fq.try_enforce_context(ctx).outcome;
          if (o == sluice::Outcome::kOk) ++served[tenant];
          if (o != sluice::Outcome::kOk && o != sluice::Outcome::kWouldWait) ++failures;
        } else if (fq.enforce_context(ctx).ok()) {
          ++served[tenant];
        } else {
          ++failures;
        }
      }
    });
  }
  std::thread tuner([&] {
    for (int i = 0; !stop; ++i) {
      const json c = {{"weights", {{"0", 1 + i % 3}, {"1", 2}}},
                      {"capacity", {{"ops", i % 2 ? 100'000 : 400'000}}}};
      if (!fq.configure(c).is_ok()) ++failures;
      std::array<double, sluice::kMaxTunables> v{};
      v[1] = 1 + i % 5;
      if (!fq.set_tunables(0b10, v).is_ok()) ++failures;
      if (fq.collect()["queued"].get<int>() > kThreads) ++failures;
      std::this_thread::yield();
    }
  });
  for (auto& t : threads) t.join();
  stop = true;
  tuner.join();
  CHECK(failures == 0);
  const json s = fq.collect();
  CHECK(s["queued"] == 0);
  std::uint64_t total = 0;
  for (std::uint64_t tenant = 0; tenant < 3; ++tenant) {
    const json f = flow_of(s, tenant);
    INFO("tenant " << tenant);
    CHECK(f["served_ops"] == served[tenant].load());
    CHECK(f["served_write_bytes"] == 4096 * served[tenant].load());
    CHECK(f["served_work_ns"] == f["arrived_work_ns"]);  // nothing cancelled
    CHECK(f["queued"] == 0);
    CHECK(f["backlogged_ns"] <= f["waited_ns"]);
    total += served[tenant].load();
  }
  CHECK(total >= kThreads * kRequests * 6 / 7);  // every enforce() at least
}
