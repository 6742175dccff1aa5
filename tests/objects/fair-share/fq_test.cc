// The fq object: its configuration (errors, partial updates, tunables), the
// DRF cost of a request, what collect() reports, the no-wait path, waiting
// and no overtaking, settling, shutdown, and the object through a stage and
// its board.
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "fq_test_util.h"
#include "sluice/board.h"
#include "sluice/clock.h"
#include "sluice/objects/builtin.h"
#include "sluice/objects/fq.h"
#include "sluice/stage.h"

using namespace fqtest;
using sluice::FqConfig;
using sluice::Outcome;
using sluice::Verdict;

namespace {

// 1000 ops/s: 1 ms of work a request.
const json kOps = {{"capacity", {{"ops", 1000}}}};

json weights_of(const json& stats) {
  json out = json::object();
  for (const json& f : stats["flows"]) out[f["flow"].dump()] = f["weight"];
  return out;
}

// A clock that counts its reads.
struct CountingClock final : sluice::Clock {
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

}  // namespace

TEST_CASE("fq config: defaults, and partial updates merge", "[fq][config]") {
  auto c = sluice::parse_fq_config(json{{"capacity", {{"read_bytes", 1e9}}}}, nullptr);
  REQUIRE(c.is_ok());
  CHECK(c->read_bytes == 1e9);
  CHECK(c->write_bytes == 0);
  CHECK(c->ops == 0);
  CHECK(c->burst_us == 2000);
  CHECK(c->flow_by == FqConfig::kTenant);
  CHECK(c->default_weight == 1);
  CHECK(c->max_flows == 1024);
  CHECK(c->weights.empty());

  // capacity and weights merge key by key; flat weight_<id> fields too.
  auto d = sluice::parse_fq_config(
      json{{"capacity", {{"ops", 5000}}}, {"weights", {{"3", 2.5}, {"7", 4}}}, {"weight_9", 0.5}},
      &*c);
  REQUIRE(d.is_ok());
  CHECK(d->read_bytes == 1e9);
  CHECK(d->ops == 5000);
  CHECK(d->weights == std::map<std::uint64_t, double>{{3, 2.5}, {7, 4}, {9, 0.5}});
  auto e = sluice::parse_fq_config(
      json{{"weight_3", 1}, {"capacity", {{"read_bytes", 0}}}, {"default_weight", 2}}, &*d);
  REQUIRE(e.is_ok());
  CHECK(e->read_bytes == 0);  // no longer counted
  CHECK(e->ops == 5000);
  CHECK(e->default_weight == 2);
  CHECK(e->weights == std::map<std::uint64_t, double>{{3, 1}, {7, 4}, {9, 0.5}});
  CHECK(sluice::parse_fq_config(json::object(), &*e).is_ok());
  // The same flow_by again is no change.
  CHECK(sluice::parse_fq_config(json{{"flow_by", "tenant"}}, &*e).is_ok());
  auto f = sluice::parse_fq_config(json{{"capacity", {{"ops", 1}}},
                                        {"flow_by", "workflow"},
                                        {"weight_18446744073709551615", 3},
                                        {"max_flows", 65536},
                                        {"burst_us", 1'000'000'000}},
                                   nullptr);
  REQUIRE(f.is_ok());
  CHECK(f->flow_by == FqConfig::kWorkflow);
  CHECK(f->weights.at(18446744073709551615ULL) == 3);
}

TEST_CASE("fq config: every error names its field and changes nothing", "[fq][config]") {
  struct Case {
    json config;
    std::string message;
  };
  const std::string weight_range = "must be a number between 0.001 and 1000000, got ";
  const std::vector<Case> cases = {
      {json::object(), "capacity: required (read_bytes, write_bytes and/or ops per second)"},
      {{{"burst_us", 10}}, "capacity: required (read_bytes, write_bytes and/or ops per second)"},
      {{{"capacity", 5}}, "capacity: must be an object, got 5"},
      {{{"capacity", json::object()}},
       "capacity: at least one of read_bytes, write_bytes and ops must be > 0"},
      {{{"capacity", {{"ops", 0}}}},
       "capacity: at least one of read_bytes, write_bytes and ops must be > 0"},
      {{{"capacity", {{"ops", 0.5}}}},
       "capacity.ops: must be a number >= 1, or 0 (not counted), got 0.5"},
      {{{"capacity", {{"read_bytes", -1}}}},
       "capacity.read_bytes: must be a number >= 1, or 0 (not counted), got -1"},
      {{{"capacity", {{"write_bytes", "fast"}}}},
       "capacity.write_bytes: must be a number >= 1, or 0 (not counted), got \"fast\""},
      {{{"capacity", {{"iops", 5}}}},
       "capacity: unknown field 'iops' (expected read_bytes, write_bytes, ops)"},
      {{{"capacity", {{"ops", 10}}}, {"burst_us", 0}},
       "burst_us: must be an integer from 1 to 1000000000, got 0"},
      {{{"capacity", {{"ops", 10}}}, {"burst_us", 1.5}},
       "burst_us: must be an integer from 1 to 1000000000, got 1.5"},
      {{{"capacity", {{"ops", 10}}}, {"burst_us", 1'000'000'001}},
       "burst_us: must be an integer from 1 to 1000000000, got 1000000001"},
      {{{"capacity", {{"ops", 10}}}, {"flow_by", "user"}},
       "flow_by: must be \"tenant\", \"origin\", \"workflow\", \"op\" or \"level\", got \"user\""},
      {{{"capacity", {{"ops", 10}}}, {"max_flows", 0}},
       "max_flows: must be an integer from 1 to 65536, got 0"},
      {{{"capacity", {{"ops", 10}}}, {"max_flows", 65537}},
       "max_flows: must be an integer from 1 to 65536, got 65537"},
      {{{"capacity", {{"ops", 10}}}, {"default_weight", 0}},
       "default_weight: " + weight_range + "0"},
      {{{"capacity", {{"ops", 10}}}, {"weights", {{"3", 0}}}}, "weights.3: " + weight_range + "0"},
      {{{"capacity", {{"ops", 10}}}, {"weights", {{"3", 2e6}}}},
       "weights.3: " + weight_range + "2000000.0"},
      {{{"capacity", {{"ops", 10}}}, {"weights", {{"3", "x"}}}},
       "weights.3: " + weight_range + "\"x\""},
      {{{"capacity", {{"ops", 10}}}, {"weights", {{"-3", 1}}}},
       "weights: a flow id is a decimal integer from 0 to 18446744073709551615 without leading "
       "zeros, got '-3'"},
      {{{"capacity", {{"ops", 10}}}, {"weights", {{"03", 1}}}},
       "weights: a flow id is a decimal integer from 0 to 18446744073709551615 without leading "
       "zeros, got '03'"},
      {{{"capacity", {{"ops", 10}}}, {"weights", 3}},
       "weights: must be an object of flow id to weight, got 3"},
      {{{"capacity", {{"ops", 10}}}, {"weight_3", -1}}, "weight_3: " + weight_range + "-1"},
      {{{"capacity", {{"ops", 10}}}, {"weight_3", 0.0005}}, "weight_3: " + weight_range + "0.0005"},
      {{{"capacity", {{"ops", 10}}}, {"weight_x", 1}},
       "weight_x: a flow id is a decimal integer from 0 to 18446744073709551615 without leading "
       "zeros, got 'x'"},
      {{{"capacity", {{"ops", 10}}}, {"weight_18446744073709551616", 1}},
       "weight_18446744073709551616: a flow id is a decimal integer from 0 to "
       "18446744073709551615 without leading zeros, got '18446744073709551616'"},
      {{{"capacity", {{"ops", 10}}}, {"weight", 1}}, "unknown field 'weight'"},
      {{{"capacity", {{"ops", 10}}}, {"rate", 1}}, "unknown field 'rate'"},
      {json::array(), "config: must be an object"},
  };
  ManualClock clock;
  for (const Case& c : cases) {
    INFO(c.config.dump());
    auto parsed = sluice::parse_fq_config(c.config, nullptr);
    REQUIRE_FALSE(parsed.is_ok());
    CHECK(parsed.status().code() == sluice::Code::kInvalidArgument);
    CHECK(parsed.status().message() == c.message);
    Fq fq(&clock);
    CHECK(fq.validate(c.config).message() == c.message);
    CHECK(fq.configure(c.config).message() == c.message);
  }

  // On a configured object: a bad field anywhere in an update changes nothing.
  Fq fq(&clock);
  REQUIRE(fq.configure(json{{"capacity", {{"ops", 1000}}}, {"weights", {{"1", 2}}}}).is_ok());
  const json before = fq.collect();
  for (const json& bad : {json{{"weights", {{"1", 5}}}, {"capacity", {{"ops", 0.1}}}},
                          json{{"weight_1", 5}, {"burst_us", -1}}, json{{"capacity", {{"ops", 0}}}},
                          json{{"default_weight", 3}, {"nope", 1}}, json{{"flow_by", "origin"}}}) {
    INFO(bad.dump());
    CHECK_FALSE(fq.validate(bad).is_ok());
    CHECK_FALSE(fq.configure(bad).is_ok());
    CHECK(fq.collect() == before);
  }
  CHECK(fq.configure(json{{"flow_by", "origin"}}).message() ==
        "flow_by: cannot change once configured (it is \"tenant\"); create a new object instead");
}

TEST_CASE("fq: configure merges into the object; weights reach flows seen and configured",
          "[fq][config]") {
  ManualClock clock;
  Fq fq(&clock);
  REQUIRE(fq.configure(
                json{{"capacity", {{"ops", 1000}, {"read_bytes", 1e6}}}, {"weights", {{"2", 3}}}})
              .is_ok());
  REQUIRE(fq.enforce_context(request(5)).ok());  // flow 5, default weight
  json s = fq.collect();
  CHECK(s["capacity"] == json{{"ops", 1000.0}, {"read_bytes", 1e6}});
  CHECK(weights_of(s) == json{{"2", 3.0}, {"5", 1.0}});  // configured flows are listed too

  REQUIRE(fq.configure(json{{"default_weight", 2}, {"weight_7", 0.5}, {"burst_us", 500}}).is_ok());
  s = fq.collect();
  CHECK(s["capacity"] == json{{"ops", 1000.0}, {"read_bytes", 1e6}});
  CHECK(s["burst_us"] == 500);
  CHECK(s["default_weight"] == 2.0);
  CHECK(weights_of(s) == json{{"2", 3.0}, {"5", 2.0}, {"7", 0.5}});
  REQUIRE(fq.configure(json{{"weights", {{"2", 1}, {"5", 4}}}}).is_ok());
  CHECK(weights_of(fq.collect()) == json{{"2", 1.0}, {"5", 4.0}, {"7", 0.5}});
}

TEST_CASE("fq: a collect reports at most 4096 flows, the busiest, and counts the rest",
          "[fq][config]") {
  // Listing every one of 30,000 weighted flows would make a collect answer larger
  // than a frame, and the daemon would never see the stage's statistics.
  ManualClock clock;
  Fq fq(&clock);
  json weights = json::object();
  for (int i = 1; i <= 6000; ++i) weights[std::to_string(i)] = 2;
  REQUIRE(
      fq.configure(json{{"capacity", {{"ops", 1e6}}}, {"max_flows", 8192}, {"weights", weights}})
          .is_ok());
  for (std::uint32_t t : {5000u, 5999u, 6000u}) REQUIRE(fq.enforce_context(request(t)).ok());
  const json s = fq.collect();
  REQUIRE(s["flows"].size() == sluice::kFqMaxReportedFlows);
  CHECK(s["flows_total"] == 6000);
  CHECK(s["flows_omitted"] == 6000 - sluice::kFqMaxReportedFlows);
  // The flows that did work are among those reported.
  for (int id : {5000, 5999, 6000}) CHECK_FALSE(flow_of(s, id).is_null());
  CHECK(s.dump().size() < (std::size_t{2} << 20));
}

TEST_CASE("fq: the weights of flows 1..12 are its tunables", "[fq][tunables]") {
  ManualClock clock;
  Fq fq(&clock);
  const auto names = fq.tunables();
  REQUIRE(names.size() == 12);
  for (std::size_t i = 0; i < names.size(); ++i)
    CHECK(names[i] == "weight_" + std::to_string(i + 1));
  std::array<double, sluice::kMaxTunables> v{};
  CHECK(fq.set_tunables(1, v).code() == sluice::Code::kFailedPrecondition);
  REQUIRE(fq.configure(kOps).is_ok());
  v[0] = 2;     // weight_1
  v[2] = 0.25;  // weight_3
  v[11] = 7;    // weight_12
  REQUIRE(fq.set_tunables(0b1000'0000'0101, v).is_ok());
  CHECK(weights_of(fq.collect()) == json{{"1", 2.0}, {"3", 0.25}, {"12", 7.0}});

  // Checked as configure checks them; nothing changes on an error.
  const json before = fq.collect();
  v[1] = 0;
  CHECK(fq.set_tunables(0b011, v).message() ==
        "weight_2: must be a number between 0.001 and 1000000, got 0");
  v[1] = std::numeric_limits<double>::quiet_NaN();
  CHECK(fq.set_tunables(0b010, v).message() ==
        "weight_2: must be a number between 0.001 and 1000000, got nan");
  v[1] = 1e7;
  CHECK(fq.set_tunables(0b010, v).message() ==
        "weight_2: must be a number between 0.001 and 1000000, got 10000000");
  CHECK(fq.set_tunables(std::uint64_t{1} << 12, v).message() ==
        "fq has tunables weight_1 .. weight_12 only");
  CHECK(fq.collect() == before);
}

TEST_CASE("fq: a request costs the work of its dominant resource", "[fq][cost]") {
  // 1 MB/s read (1 us a byte), 2 MB/s write, 1000 ops/s (1 ms an op).
  ManualClock clock;
  Fq fq(&clock);
  REQUIRE(
      fq.configure(json{{"capacity", {{"read_bytes", 1e6}, {"write_bytes", 2e6}, {"ops", 1000}}},
                        {"burst_us", 1'000'000}})
          .is_ok());
  struct Case {
    Op op;
    std::uint64_t size;
    std::int64_t work_ns;
  };
  const std::vector<Case> cases = {
      {Op::kRead, 4000, 4'000'000},     // read bytes dominate
      {Op::kRead, 500, 1'000'000},      // the op dominates
      {Op::kWrite, 4000, 2'000'000},    // write bytes dominate
      {Op::kWrite, 1000, 1'000'000},    // a tie
      {Op::kSync, 1 << 20, 1'000'000},  // not a read or a write: the op alone
      {Op::kPut, 1 << 20, 1'000'000},
  };
  std::uint32_t tenant = 100;
  for (const Case& c : cases) {
    INFO(static_cast<int>(c.op) << " " << c.size);
    REQUIRE(fq.enforce_context(request(tenant, c.op, c.size)).wait_ns == 0);
    const json f = flow_of(fq.collect(), tenant);
    CHECK(f["served_work_ns"] == c.work_ns);
    CHECK(f["arrived_work_ns"] == c.work_ns);
    ++tenant;
  }
  // A resource that is not counted costs nothing: without ops, a sync is free.
  Fq bytes_only(&clock);
  REQUIRE(bytes_only.configure(json{{"capacity", {{"read_bytes", 1e6}}}}).is_ok());
  REQUIRE(bytes_only.enforce_context(request(1, Op::kSync, 4096)).ok());
  REQUIRE(bytes_only.enforce_context(request(1, Op::kWrite, 4096)).ok());
  REQUIRE(bytes_only.enforce_context(request(1, Op::kRead, 1000)).ok());
  const json f = flow_of(bytes_only.collect(), 1);
  CHECK(f["served_work_ns"] == 1'000'000);
  CHECK(f["served_ops"] == 3);
  CHECK(f["served_read_bytes"] == 1000);
  CHECK(f["served_write_bytes"] == 4096);
}

TEST_CASE("fq: collect reports every field, with exact counts", "[fq][collect]") {
  const std::int64_t t0 = kSecond;
  ManualClock clock(t0);
  Fq fq(&clock);
  const json before = fq.collect();
  CHECK(before["flows"] == json::array());
  CHECK(before["queued"] == 0);
  REQUIRE(
      fq.configure(json{{"capacity", {{"read_bytes", 1e6}, {"write_bytes", 2e6}, {"ops", 1000}}},
                        {"burst_us", 1000}})
          .is_ok());
  // 1 ms of work: the whole bucket, at once.
  REQUIRE(fq.enforce_context(request(7, Op::kWrite, 1000)).wait_ns == 0);
  Crowd crowd(fq);
  crowd.add(request(7, Op::kRead, 4000));  // 4 ms: due at t0 + 4 ms
  crowd.add(request(9, Op::kSync));        // 1 ms: after it, at t0 + 5 ms
  clock.set(t0 + kMs);
  json s = fq.collect();
  CHECK(s["queued"] == 2);
  json f7 = flow_of(s, 7);
  CHECK(f7["queued"] == 1);
  CHECK(f7["waited_ns"] == kMs);
  CHECK(f7["backlogged_ns"] == kMs);
  CHECK(f7["arrived_work_ns"] == 5 * kMs);
  CHECK(f7["served_work_ns"] == kMs);

  clock.set(t0 + 4 * kMs - 1);
  eventually([&] { return clock.waiters() == 1; });
  CHECK(crowd.done() == 0);
  clock.set(t0 + 4 * kMs);
  eventually([&] { return crowd.done() == 1 && clock.waiters() == 1; });
  clock.set(t0 + 5 * kMs);
  eventually([&] { return crowd.done() == 2; });
  CHECK(crowd.order == std::vector<int>{0, 1});
  clock.set(t0 + 6 * kMs);
  s = fq.collect();
  CHECK(s["capacity"] == json{{"read_bytes", 1e6}, {"write_bytes", 2e6}, {"ops", 1000.0}});
  CHECK(s["burst_us"] == 1000);
  CHECK(s["flow_by"] == "tenant");
  CHECK(s["default_weight"] == 1.0);
  CHECK(s["max_flows"] == 1024);
  CHECK(s["queued"] == 0);
  CHECK(s["virtual_time"] == 0.0);  // both started at V = 0
  REQUIRE(s["flows"].size() == 2);
  CHECK(s["flows"][0] == json{{"flow", 7},
                              {"weight", 1.0},
                              {"served_ops", 2},
                              {"served_read_bytes", 4000},
                              {"served_write_bytes", 1000},
                              {"served_work_ns", 5 * kMs},
                              {"arrived_work_ns", 5 * kMs},
                              {"queued", 0},
                              {"waited_ns", 4 * kMs},
                              {"backlogged_ns", 4 * kMs}});
  CHECK(s["flows"][1] == json{{"flow", 9},
                              {"weight", 1.0},
                              {"served_ops", 1},
                              {"served_read_bytes", 0},
                              {"served_write_bytes", 0},
                              {"served_work_ns", kMs},
                              {"arrived_work_ns", kMs},
                              {"queued", 0},
                              {"waited_ns", 5 * kMs},
                              {"backlogged_ns", 5 * kMs}});
}

TEST_CASE("fq: flows by another classifier, and the flows beyond max_flows share one",
          "[fq][flows]") {
  ManualClock clock;
  Fq by_origin(&clock);
  REQUIRE(by_origin.configure(json{{"capacity", {{"ops", 1e6}}}, {"flow_by", "origin"}}).is_ok());
  sluice::Context ctx = request(1);
  ctx.origin = sluice::origin::kFlush;
  REQUIRE(by_origin.enforce_context(ctx).ok());
  ctx.tenant = 2;  // the tenant does not matter
  REQUIRE(by_origin.enforce_context(ctx).ok());
  CHECK(served_ops(by_origin, sluice::origin::kFlush) == 2);
  CHECK(by_origin.collect()["flow_by"] == "origin");

  Fq few(&clock);
  REQUIRE(
      few.configure(json{{"capacity", {{"ops", 1e6}}}, {"max_flows", 2}, {"weight_9", 3}}).is_ok());
  for (std::uint32_t t : {1u, 2u, 3u, 4u, 3u}) REQUIRE(few.enforce_context(request(t)).ok());
  const json s = few.collect();
  REQUIRE(s["flows"].size() == 3);
  CHECK(s["flows"][0]["flow"] == 9);  // configured first, within max_flows
  CHECK(s["flows"][0]["served_ops"] == 0);
  CHECK(s["flows"][1]["flow"] == 1);
  CHECK(s["flows"][1]["served_ops"] == 1);
  CHECK(s["flows"][2]["flow"] == "other");
  CHECK(s["flows"][2]["served_ops"] == 4);
  CHECK(s["flows"][2]["weight"] == 1.0);
  // A larger max_flows: new flows get their own from then on.
  REQUIRE(few.configure(json{{"max_flows", 3}}).is_ok());
  REQUIRE(few.enforce_context(request(5)).ok());
  CHECK(served_ops(few, 5) == 1);
}

TEST_CASE("fq: a grant from a lease reads no clock", "[fq][fast]") {
  CountingClock clock;
  Fq fq(&clock);
  REQUIRE(fq.configure(json{{"capacity", {{"write_bytes", 1e9}}}, {"burst_us", 10'000}}).is_ok());
  REQUIRE(fq.enforce_context(request(1, Op::kWrite, 100)).wait_ns == 0);  // draws a lease
  const std::uint64_t reads = clock.reads.load();
  for (int i = 0; i < 100; ++i)
    REQUIRE(fq.enforce_context(request(1, Op::kWrite, 100)).wait_ns == 0);
  CHECK(clock.reads.load() == reads);
  const json f = flow_of(fq.collect(), 1);
  CHECK(f["served_ops"] == 101);
  CHECK(f["served_write_bytes"] == 10'100);
  CHECK(f["served_work_ns"] == 10'100);  // 1 ns a byte
  CHECK(f["arrived_work_ns"] == 10'100);
  // A new flow takes the lock once, then has a lease of its own.
  REQUIRE(fq.enforce_context(request(2, Op::kWrite, 100)).ok());
  const std::uint64_t reads2 = clock.reads.load();
  REQUIRE(fq.enforce_context(request(2, Op::kWrite, 100)).ok());
  CHECK(clock.reads.load() == reads2);
}

TEST_CASE("fq: threads of one flow, each with a lease of its own, share exactly the bucket",
          "[fq][fast]") {
  ManualClock clock;  // never moves: a request that waited would never return
  Fq fq(&clock);
  // 1 ns a byte, 1 ms of burst: a thousand requests of 1000 bytes, no more.
  REQUIRE(fq.configure(json{{"capacity", {{"write_bytes", 1e9}}}, {"burst_us", 1000}}).is_ok());
  constexpr int kThreads = 8;  // more than the stripes: some share one
  constexpr int kEach = 125;
  std::atomic<int> served{0};
  std::atomic<int> waited{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        const Verdict r = fq.enforce_context(request(1, Op::kWrite, 1000));
        if (r.ok() && r.wait_ns == 0) {
          ++served;
        } else {
          ++waited;
        }
      }
    });
  }
  eventually([&] { return served + waited == kThreads * kEach || queued(fq) != 0; });
  const bool none_waited = queued(fq) == 0;
  fq.shutdown();  // releases any that waited, so that the threads end
  for (auto& t : threads) t.join();
  CHECK(none_waited);
  CHECK(waited == 0);
  const json f = flow_of(fq.collect(), 1);
  CHECK(f["served_ops"] == kThreads * kEach);
  CHECK(f["served_write_bytes"] == 1000 * kThreads * kEach);
  CHECK(f["served_work_ns"] == 1000 * kThreads * kEach);
  CHECK(f["arrived_work_ns"] == 1000 * kThreads * kEach);
}

TEST_CASE("fq: requests that must not wait take the leases back, to the last nanosecond",
          "[fq][fast]") {
  ManualClock clock;
  Fq fq(&clock);
  REQUIRE(fq.configure(json{{"capacity", {{"write_bytes", 1e9}}}, {"burst_us", 1000}}).is_ok());
  // Leases drawn by enforce() on several stripes, then what is left taken by
  // requests that must not wait: all of it, and exactly.
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) (void)fq.enforce_context(request(1, Op::kWrite, 1000));
      for (int i = 0; i < 150; ++i) {
        if (!fq.try_enforce_context(request(1, Op::kWrite, 1000)).ok()) ++refused;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(refused == 0);
  CHECK(fq.try_enforce_context(request(1, Op::kWrite, 1000)).outcome == Outcome::kWouldWait);
  CHECK(fq.try_enforce_context(request(2, Op::kWrite, 1)).outcome == Outcome::kWouldWait);
  CHECK(served_ops(fq, 1) == 1000);
}

TEST_CASE("fq: grant counts stay exact past what a lease's counter holds", "[fq][fast]") {
  ManualClock clock;
  Fq fq(&clock);
  // Requests that cost nothing (ops are not counted): only the counter fills.
  REQUIRE(fq.configure(json{{"capacity", {{"read_bytes", 1e6}}}}).is_ok());
  constexpr std::uint64_t kN = (1u << 20) + 5;
  for (std::uint64_t i = 0; i < kN; ++i) REQUIRE(fq.enforce_context(request(1)).ok());
  CHECK(served_ops(fq, 1) == kN);
}

TEST_CASE("fq: a request that must wait takes the leases back; later ones queue behind it",
          "[fq][wait]") {
  const std::int64_t t0 = kSecond;
  ManualClock clock(t0);
  Fq fq(&clock);
  // 2 ms of burst; 1 ms an op, 1 us a read byte. Flow 5 is made first: it
  // wins ties of start tags.
  REQUIRE(fq.configure(json{{"capacity", {{"ops", 1000}, {"read_bytes", 1e6}}}, {"weight_5", 1}})
              .is_ok());
  REQUIRE(fq.enforce_context(request(1)).wait_ns == 0);  // flow 1 leases the other 1 ms
  Crowd crowd(fq);
  crowd.add(request(5, Op::kRead, 2000));  // 2 ms: the lease comes back, 1 ms short
  crowd.add(request(1));                   // its lease is gone: it queues too
  CHECK(queued(fq) == 2);
  CHECK(fq.try_enforce_context(request(3)).outcome == Outcome::kWouldWait);
  CHECK(fq.try_enforce_context(request(1)).outcome == Outcome::kWouldWait);
  clock.set(t0 + kMs);
  eventually([&] { return crowd.done() == 1 && clock.waiters() == 1; });
  clock.set(t0 + 2 * kMs);
  eventually([&] { return crowd.done() == 2; });
  CHECK(crowd.order == std::vector<int>{0, 1});
  // Nothing was counted for the requests refused.
  CHECK(flow_of(fq.collect(), 3)["arrived_work_ns"] == 0);
  CHECK(served_ops(fq, 1) == 2);
}

TEST_CASE("fq: try_enforce_context grants only what it can at once", "[fq][nowait]") {
  const std::int64_t t0 = kSecond;
  ManualClock clock(t0);
  Fq fq(&clock);
  REQUIRE(fq.configure(json{{"capacity", {{"ops", 1000}}}, {"burst_us", 3000}}).is_ok());
  // 3 ms of burst: three at once, then nothing without waiting.
  for (int i = 0; i < 3; ++i) CHECK(fq.try_enforce_context(request(1)).outcome == Outcome::kOk);
  const Verdict v = fq.try_enforce_context(request(1));
  CHECK(v.outcome == Outcome::kWouldWait);
  CHECK(v.wait_ns == 0);
  json f = flow_of(fq.collect(), 1);
  CHECK(f["served_ops"] == 3);
  CHECK(f["arrived_work_ns"] == 3 * kMs);
  clock.set(t0 + kMs);
  CHECK(fq.try_enforce_context(request(2)).outcome == Outcome::kOk);
  CHECK(fq.try_enforce_context(request(2)).outcome == Outcome::kWouldWait);
}

TEST_CASE("fq: a head waits for its whole cost, and capacity changes re-time it", "[fq][wait]") {
  const std::int64_t t0 = kSecond;
  ManualClock clock(t0);
  Fq fq(&clock);
  REQUIRE(fq.configure(json{{"capacity", {{"ops", 100}}}, {"burst_us", 1000}}).is_ok());
  REQUIRE(fq.try_enforce_context(request(1)).outcome == Outcome::kWouldWait);  // 10 ms > 1 ms
  Crowd crowd(fq);
  crowd.add(request(1));  // 10 ms: 9 ms more than the bucket holds
  clock.set(t0 + 2 * kMs);
  eventually([&] { return clock.waiters() == 1; });
  CHECK(crowd.done() == 0);
  // Ten times the capacity: it now costs 1 ms, which has accrued.
  REQUIRE(fq.configure(json{{"capacity", {{"ops", 1000}}}}).is_ok());
  eventually([&] { return crowd.done() == 1; });
  const json f = flow_of(fq.collect(), 1);
  CHECK(f["served_work_ns"] == kMs);
  CHECK(f["arrived_work_ns"] == kMs);

  // A smaller capacity: a later head.
  crowd.add(request(1));  // 1 ms from an empty bucket: due at t0 + 3 ms
  REQUIRE(fq.configure(json{{"capacity", {{"ops", 500}}}}).is_ok());  // now 2 ms: t0 + 4 ms
  clock.set(t0 + 4 * kMs - 1);
  eventually([&] { return clock.waiters() == 1; });
  CHECK(crowd.done() == 1);
  clock.set(t0 + 4 * kMs);
  eventually([&] { return crowd.done() == 2; });
}

TEST_CASE("fq: a grant noticed late is served as of its due time", "[fq][wait]") {
  const std::int64_t t0 = kSecond;
  ManualClock clock(t0);
  Fq fq(&clock);
  REQUIRE(fq.configure(json{{"capacity", {{"ops", 1000}}}, {"burst_us", 5000}}).is_ok());
  for (int i = 0; i < 5; ++i) REQUIRE(fq.enforce_context(request(1)).wait_ns == 0);
  Crowd crowd(fq);
  crowd.add(request(1));    // due at t0 + 1 ms
  crowd.add(request(2));    // due at t0 + 2 ms
  clock.set(t0 + 3 * kMs);  // both due: served together, 1 ms of work left over
  eventually([&] { return crowd.done() == 2; });
  CHECK(fq.try_enforce_context(request(3)).outcome == Outcome::kOk);
  CHECK(fq.try_enforce_context(request(3)).outcome == Outcome::kWouldWait);
}

TEST_CASE("fq: settling gives back unused work and charges extra work", "[fq][settle]") {
  const std::int64_t t0 = kSecond;
  ManualClock clock(t0);
  Fq fq(&clock);
  // 1 us a read byte, 1 ms an op; 10 ms of burst.
  REQUIRE(
      fq.configure(json{{"capacity", {{"read_bytes", 1e6}, {"ops", 1000}}}, {"burst_us", 10'000}})
          .is_ok());
  sluice::Context ctx = request(1, Op::kRead, 8000);  // 8 ms
  REQUIRE(fq.enforce_context(ctx).wait_ns == 0);
  REQUIRE(fq.settle(ctx, 3000).ok());  // moved 3000: 3 ms, 5 ms back
  json f = flow_of(fq.collect(), 1);
  CHECK(f["served_read_bytes"] == 3000);
  CHECK(f["served_work_ns"] == 3 * kMs);
  CHECK(f["served_ops"] == 1);
  // 7 ms are in the bucket again: a 7 ms read passes at once, an 8th ms would not.
  CHECK(fq.try_enforce_context(request(2, Op::kRead, 7000)).outcome == Outcome::kOk);
  CHECK(fq.try_enforce_context(request(2)).outcome == Outcome::kWouldWait);

  // Moved more: the extra work is paid, waiting like a request (no extra op).
  ctx = request(1, Op::kRead, 1000);  // 1 ms (bytes and op alike)
  clock.set(t0 + 10 * kMs);           // a full bucket
  REQUIRE(fq.enforce_context(ctx).wait_ns == 0);
  Verdict v;
  std::thread settler([&] { v = fq.settle(ctx, 12000); });  // 12 ms: 11 ms more, 9 in the bucket
  eventually([&] { return queued(fq) == 1; });
  clock.set(t0 + 12 * kMs);
  settler.join();
  CHECK(v.ok());
  CHECK(v.wait_ns == 2 * kMs);
  f = flow_of(fq.collect(), 1);
  CHECK(f["served_ops"] == 2);
  CHECK(f["served_read_bytes"] == 15000);
  CHECK(f["served_work_ns"] == 15 * kMs);
  CHECK(f["arrived_work_ns"] == 15 * kMs);

  // Under kNoWait the extra is taken on credit: later requests wait for it.
  clock.set(t0 + 22 * kMs);  // full again (10 ms)
  ctx = request(1, Op::kRead, 1000);
  ctx.flags = sluice::context_flag::kNoWait;
  REQUIRE(fq.try_enforce_context(ctx).ok());
  REQUIRE(fq.settle(ctx, 15000).ok());  // 14 ms more than the 9 left: 5 ms owed
  CHECK(fq.try_enforce_context(request(1)).outcome == Outcome::kWouldWait);
  clock.set(t0 + 28 * kMs);  // 5 ms repaid, 1 ms accrued
  CHECK(fq.try_enforce_context(request(1)).outcome == Outcome::kOk);
  // Operations whose cost does not depend on their size settle nothing.
  const sluice::Context sync = request(1, Op::kSync, 100);
  REQUIRE(fq.settle(sync, 1 << 30).ok());
}

TEST_CASE("fq: shutdown wakes every waiter with kCancelled", "[fq][shutdown]") {
  ManualClock clock;
  Fq fq(&clock);
  REQUIRE(fq.configure(json{{"capacity", {{"ops", 10}}}, {"burst_us", 1}}).is_ok());
  {
    Crowd crowd(fq);
    for (std::uint32_t t : {1u, 2u, 1u, 3u}) crowd.add(request(t));
    fq.shutdown();
    eventually([&] { return crowd.done() == 4; });
    for (const Verdict& r : crowd.results) CHECK(r.outcome == Outcome::kCancelled);
  }
  const json s = fq.collect();
  CHECK(s["queued"] == 0);
  CHECK(flow_of(s, 1)["arrived_work_ns"] == 200 * kMs);  // arrived, never served
  CHECK(flow_of(s, 1)["served_work_ns"] == 0);
  const Verdict later = fq.enforce_context(request(1));
  CHECK(later.outcome == Outcome::kOk);
  CHECK(later.wait_ns == 0);
}

TEST_CASE("fq: before its first configuration it passes requests through", "[fq]") {
  ManualClock clock;
  Fq fq(&clock);
  CHECK(fq.enforce_context(request(1, Op::kRead, 1ULL << 30)).ok());
  CHECK(fq.try_enforce_context(request(1)).ok());
  CHECK_FALSE(fq.fast_grant());  // needs the Context: offers no grant on the size alone
  auto made = sluice::make_fq(sluice::ObjectEnv{&clock});
  REQUIRE(made);
  CHECK(made->type() == "fq");
}

TEST_CASE("fq through a stage: created by rules, configured with flat weights, on the board",
          "[fq][stage]") {
  ManualClock clock;
  sluice::StageOptions o;
  o.clock = &clock;
  auto stage = sluice::Stage::create(o).value();
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "create_channel", "channel": "all", "default": true},
    {"rule": "create_object", "channel": "all", "object": "fq", "type": "fq",
     "config": {"capacity": {"ops": 1000000}, "weights": {"2": 3}}}])"))
              .is_ok());
  auto state = [&] {
    for (const auto& c : stage->totals().channels) {
      for (const auto& ob : c.objects) {
        if (ob.name == "fq") return ob.state;
      }
    }
    return json();
  };
  sluice::Context ctx = request(4, Op::kWrite, 4096);
  for (int i = 0; i < 10; ++i) REQUIRE(stage->enforce(ctx).ok());
  CHECK(flow_of(state(), 4)["served_ops"] == 10);
  CHECK(flow_of(state(), 4)["served_write_bytes"] == 40960);
  REQUIRE(stage
              ->apply(json::parse(R"([{"rule": "configure", "channel": "all", "object": "fq",
    "config": {"weight_4": 2.5}}])"))
              .is_ok());
  CHECK(flow_of(state(), 4)["weight"] == 2.5);
  const sluice::Status bad = stage->apply(json::parse(R"([{"rule": "configure", "channel": "all",
    "object": "fq", "config": {"weight_4": 0}}])"));
  CHECK(bad.message() ==
        "rules[0]: config.weight_4: must be a number between 0.001 and 1000000, got 0");

  // The board: weight_2 set without a message.
  auto w = sluice::BoardWriter::map(stage->board().value()).value();
  const sluice::StageInfo info = stage->info();
  const sluice::ObjectInfo& fq_info = info.channels.at(0).objects.at(0);
  REQUIRE(fq_info.board_slot >= 0);
  CHECK(fq_info.tunables.size() == 12);
  std::array<double, sluice::kMaxTunables> v{};
  v[1] = 6;
  REQUIRE(w.write(static_cast<std::size_t>(fq_info.board_slot), fq_info.board_tag, 0b10, v));
  REQUIRE(stage->enforce(ctx).ok());
  CHECK(flow_of(state(), 2)["weight"] == 6.0);
}

TEST_CASE("fq: the registry creates configured fq objects by name", "[fq]") {
  ManualClock clock;
  const sluice::ObjectEnv env{&clock};
  auto made = sluice::Registry::global().create("fq", kOps, env);
  REQUIRE(made.is_ok());
  CHECK((*made)->type() == "fq");
  auto bad = sluice::Registry::global().create("fq", json{{"capacity", {{"ops", -5}}}}, env);
  REQUIRE_FALSE(bad.is_ok());
  CHECK_THAT(
      bad.status().message(),
      Catch::Matchers::EndsWith("capacity.ops: must be a number >= 1, or 0 (not counted), got -5"));
}
