// Objects that hold capacity, through the stage: Stage::acquire routes like
// any request and counts the acquire as one, a capacity-holding object grants
// into a Hold, and the Hold gives back to the object that granted, from any
// thread, whatever the rules became. Per-request objects give a Hold that
// holds nothing but carries their verdict.
#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "sluice/hold.h"
#include "sluice/objects/builtin.h"
#include "sluice/stage.h"
#include "sluice/thread_annotations.h"
#include "test_util.h"

using namespace sluice;
using nlohmann::json;

namespace {

// What a test sees of one tank after the stage let it go.
struct TankLog {
  std::atomic<std::uint64_t> acquired{0};
  std::atomic<std::uint64_t> released{0};
  std::atomic<int> releases{0};
  std::atomic<bool> destroyed{false};
  std::atomic<bool> shut_down{false};
};

// A capacity-holding object, as small as it gets: `capacity` units shared by
// every flow (usage kept per tenant); an acquire that does not fit waits
// until releases make room, or returns kWouldWait under kNoWait; shutdown
// wakes waiters (kCancelled). Every tank made shares the test's log.
class Tank final : public EnforcementObject {
 public:
  explicit Tank(std::shared_ptr<TankLog> log) : log_(std::move(log)) {}
  ~Tank() override { log_->destroyed = true; }
  std::string_view type() const noexcept override { return "tank"; }
  Status validate(const json& c) const override {
    return c.contains("capacity") && c["capacity"].is_number_unsigned()
               ? Status{}
               : Status::invalid("capacity: required");
  }
  Status configure(const json& c) override {
    SLUICE_RETURN_IF_ERROR(validate(c));
    MutexLock lock(mu_);
    capacity_ = c["capacity"].get<std::uint64_t>();
    return {};
  }
  Verdict enforce_context(const Context&) noexcept override { return {}; }
  bool holds_capacity() const noexcept override { return true; }
  bool same_flow(const Context& a, const Context& b) const noexcept override {
    return a.tenant == b.tenant;
  }
  Verdict acquire(const Context& ctx, std::uint64_t amount) noexcept override {
    MutexLock lock(mu_);
    bool waited = false;
    while (used_ + amount > capacity_) {
      if (shut_down_) return {Outcome::kCancelled, 0};
      if ((ctx.flags & context_flag::kNoWait) != 0) return {Outcome::kWouldWait, 0};
      waited = true;
      ++waiters_;
      lock.wait(cv_);
      --waiters_;
    }
    if (shut_down_) return {Outcome::kCancelled, 0};
    used_ += amount;
    usage_[ctx.tenant] += amount;
    log_->acquired += amount;
    errno = EIO;  // the stage must hide what an object does to errno
    return {Outcome::kOk, waited ? 7u : 0u};
  }
  void release(const Context& ctx, std::uint64_t amount) noexcept override {
    MutexLock lock(mu_);
    used_ -= amount;
    usage_[ctx.tenant] -= amount;
    log_->released += amount;
    ++log_->releases;
    cv_.notify_all();
  }
  json collect() const override {
    MutexLock lock(mu_);
    json usage = json::object();
    for (const auto& [tenant, n] : usage_) usage[std::to_string(tenant)] = n;
    return {{"used", used_}, {"waiters", waiters_}, {"usage", usage}};
  }
  void shutdown() noexcept override {
    MutexLock lock(mu_);
    shut_down_ = true;
    log_->shut_down = true;
    cv_.notify_all();
  }

 private:
  std::shared_ptr<TankLog> log_;
  mutable Mutex mu_;
  std::condition_variable cv_;
  std::uint64_t capacity_ SLUICE_GUARDED_BY(mu_) = 0;
  std::uint64_t used_ SLUICE_GUARDED_BY(mu_) = 0;
  int waiters_ SLUICE_GUARDED_BY(mu_) = 0;
  bool shut_down_ SLUICE_GUARDED_BY(mu_) = false;
  std::map<std::uint32_t, std::uint64_t> usage_ SLUICE_GUARDED_BY(mu_);
};

std::shared_ptr<TankLog>& current_log() {
  static std::shared_ptr<TankLog> log;
  return log;
}

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    (void)objects::register_builtin(*reg);
    (void)reg->add({"tank", "holds capacity",
                    [](const ObjectEnv&) { return std::make_unique<Tank>(current_log()); }});
    return reg;
  }();
  return *r;
}

// Tenant 1 to tank "a", tenant 2 to tank "b" (4096 units each), tenant 3 to a
// drl, anything else to the channel's default, the tank "a".
std::unique_ptr<Stage> make_stage(Clock* clock) {
  StageOptions o;
  o.clock = clock;
  o.registry = &registry();
  auto stage = Stage::create(o).value();
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "create_channel", "channel": "buffers", "default": true,
     "classifiers": ["tenant"]},
    {"rule": "create_object", "channel": "buffers", "object": "a", "type": "tank",
     "config": {"capacity": 4096}, "match": {"tenant": 1}, "default": true},
    {"rule": "create_object", "channel": "buffers", "object": "b", "type": "tank",
     "config": {"capacity": 4096}, "match": {"tenant": 2}},
    {"rule": "create_object", "channel": "buffers", "object": "limit", "type": "drl",
     "config": {"rate": 1000000, "burst": 1000}, "match": {"tenant": 3}}
  ])"))
              .is_ok());
  return stage;
}

Context tenant_ctx(std::uint32_t tenant, std::uint8_t flags = 0) {
  Context c = make_context(Op::kWrite, 0);
  c.tenant = tenant;
  c.flags = flags;
  return c;
}

const ObjectStats& object_stats(const StageStats& s, const std::string& name) {
  for (const ObjectStats& o : s.channels.at(0).objects) {
    if (o.name == name) return o;
  }
  FAIL("no object " << name);
  return s.channels.at(0).objects.at(0);
}

}  // namespace

TEST_CASE("acquire routes by tenant to different pools and counts one request each") {
  current_log() = std::make_shared<TankLog>();
  SimClock clock;
  auto stage = make_stage(&clock);
  errno = 1234;
  Hold h1 = stage->acquire(tenant_ctx(1), 1000);
  CHECK(errno == 1234);
  Hold h2 = stage->acquire(tenant_ctx(2), 3000);
  Hold h9 = stage->acquire(tenant_ctx(9), 24);  // the default object: "a"
  CHECK(h1.verdict().ok());
  CHECK(h1.amount() == 1000);
  CHECK(h1.holds());
  CHECK(h2.amount() == 3000);
  CHECK_FALSE(h1.same_place(h2));
  CHECK_FALSE(h1.same_place(h9));  // same object, another flow

  const StageStats s = stage->collect();
  const ObjectStats& a = object_stats(s, "a");
  const ObjectStats& b = object_stats(s, "b");
  CHECK(a.total.ops == 2);
  CHECK(a.total.bytes == 1024);
  CHECK(b.total.ops == 1);
  CHECK(b.total.bytes == 3000);
  CHECK(a.state["usage"] == json{{"1", 1000}, {"9", 24}});
  CHECK(b.state["usage"] == json{{"2", 3000}});

  h2.release(1000);
  CHECK(h2.amount() == 2000);
  h2.release(5000);  // no more than it holds
  CHECK(h2.amount() == 0);
  CHECK_FALSE(h2.holds());
  CHECK(stage->totals().channels.at(0).objects.at(1).state["used"] == 0);
  CHECK(current_log()->released == 3000);
}

TEST_CASE("an acquire that waits is counted with its wait, and a release wakes it") {
  current_log() = std::make_shared<TankLog>();
  SimClock clock;
  auto stage = make_stage(&clock);
  Hold full = stage->acquire(tenant_ctx(1), 4096);
  REQUIRE(full.amount() == 4096);

  // Must not wait: nothing taken, nothing counted.
  Hold no = stage->acquire(tenant_ctx(1, context_flag::kNoWait), 1);
  CHECK(no.verdict().outcome == Outcome::kWouldWait);
  CHECK_FALSE(no.holds());

  Hold waited;
  std::thread t([&] { waited = stage->acquire(tenant_ctx(1), 96); });
  REQUIRE(testing::wait_for(
      [&] { return stage->totals().channels.at(0).objects.at(0).state["waiters"] == 1; },
      std::chrono::seconds(10)));
  full.release(100);  // from this thread: wakes the waiter
  t.join();
  CHECK(waited.verdict().ok());
  CHECK(waited.verdict().wait_ns == 7);
  CHECK(waited.amount() == 96);

  const StageStats stats = stage->collect();
  const ObjectStats& a = object_stats(stats, "a");
  CHECK(a.total.ops == 2);  // the one that would have waited is not counted
  CHECK(a.total.bytes == 4096 + 96);
  CHECK(a.wait.total_ns == 7);
}

TEST_CASE("a Hold releases to the object that granted after the rules removed it") {
  current_log() = std::make_shared<TankLog>();
  const std::shared_ptr<TankLog> log = current_log();
  SimClock clock;
  auto stage = make_stage(&clock);
  Hold h = stage->acquire(tenant_ctx(2), 500);
  REQUIRE(h.holds());
  REQUIRE(stage
              ->apply(json::parse(R"([{"rule": "remove_object", "channel": "buffers",
                                       "object": "b"}])"))
              .is_ok());
  CHECK(log->shut_down);
  // This thread lets go of the old snapshot on its next request.
  (void)stage->enforce(tenant_ctx(1));
  CHECK_FALSE(log->destroyed);  // the Hold keeps it alive
  h.release(200);
  CHECK(log->released == 200);
  CHECK_FALSE(log->destroyed);
  h.release_all();
  CHECK(log->released == 500);
  CHECK(log->destroyed);  // the last holder let go

  // Tenant 2 now goes to the default object.
  Hold again = stage->acquire(tenant_ctx(2), 10);
  CHECK(again.amount() == 10);
  CHECK(stage->totals().channels.at(0).objects.at(0).state["usage"]["2"] == 10);
}

TEST_CASE("a Hold outlives its stage and releases from another thread") {
  current_log() = std::make_shared<TankLog>();
  const std::shared_ptr<TankLog> log = current_log();
  SimClock clock;
  auto stage = make_stage(&clock);
  Hold h = stage->acquire(tenant_ctx(1), 300);
  stage->shutdown();
  stage.reset();
  std::thread t([held = std::move(h)]() mutable { held.release_all(); });
  t.join();
  CHECK(log->released == 300);
  CHECK(log->releases == 1);
}

TEST_CASE("Hold: move, absorb and the destructor release exactly once") {
  current_log() = std::make_shared<TankLog>();
  const std::shared_ptr<TankLog> log = current_log();
  SimClock clock;
  auto stage = make_stage(&clock);
  {
    Hold a = stage->acquire(tenant_ctx(1), 100);
    Hold b = stage->acquire(tenant_ctx(1), 50);
    Hold other_flow = stage->acquire(tenant_ctx(9), 5);
    Hold other_object = stage->acquire(tenant_ctx(2), 7);
    CHECK(a.same_place(b));

    CHECK(a.absorb(std::move(b)));
    CHECK(a.amount() == 150);
    CHECK_FALSE(b.holds());
    CHECK_FALSE(a.absorb(std::move(other_flow)));  // changes nothing
    CHECK(other_flow.amount() == 5);
    CHECK(a.amount() == 150);
    CHECK_FALSE(a.absorb(std::move(other_object)));
    CHECK(other_object.amount() == 7);
    CHECK_FALSE(a.absorb(std::move(a)));
    CHECK(a.amount() == 150);

    Hold empty;
    CHECK(empty.absorb(std::move(other_flow)));  // an empty hold takes it over
    CHECK(empty.amount() == 5);
    CHECK(empty.context().tenant == 9);
    CHECK(a.absorb(Hold()));  // nothing to add

    Hold moved(std::move(a));
    CHECK(moved.amount() == 150);
    CHECK_FALSE(a.holds());
    Hold assigned = stage->acquire(tenant_ctx(1), 1);
    assigned = std::move(moved);  // releases its own 1 first
    CHECK(log->released == 1);
    CHECK(assigned.amount() == 150);
    CHECK(log->releases == 1);
  }
  // The destructors gave back the rest, each unit once.
  CHECK(log->released == 1 + 150 + 5 + 7);
  CHECK(log->acquired == log->released);
  CHECK(stage->totals().channels.at(0).objects.at(0).state["used"] == 0);
}

TEST_CASE("a per-request object gives a Hold that holds nothing, with its verdict") {
  current_log() = std::make_shared<TankLog>();
  SimClock clock;
  auto stage = make_stage(&clock);
  // The drl's bucket holds 1000 bytes at 1 byte/us: 3000 waits 2 ms.
  Hold h = stage->acquire(tenant_ctx(3), 3000);
  CHECK(h.verdict().ok());
  CHECK(h.verdict().wait_ns == 2'000'000);
  CHECK_FALSE(h.holds());
  CHECK(h.amount() == 0);
  Hold no = stage->acquire(tenant_ctx(3, context_flag::kNoWait), 3000);
  CHECK(no.verdict().outcome == Outcome::kWouldWait);
  // A bounded request is charged whole: a Hold has no settle.
  Hold bounded = stage->acquire(tenant_ctx(3, context_flag::kBounded), 2 * kMaxPreCharge);
  CHECK(bounded.verdict().wait_ns == 2 * kMaxPreCharge * 1000);
  const StageStats stats = stage->collect();
  const ObjectStats& limit = object_stats(stats, "limit");
  CHECK(limit.total.ops == 2);
  CHECK(limit.total.bytes == 3000 + 2 * kMaxPreCharge);

  // Nothing routed to an object at all: counted, nothing held.
  auto bare = Stage::create().value();
  Hold plain = bare->acquire(tenant_ctx(1), 64);
  CHECK(plain.verdict().ok());
  CHECK_FALSE(plain.holds());
  CHECK(bare->collect().total.bytes == 64);
}

TEST_CASE("shutdown wakes an acquire that waits: it is cancelled and holds nothing") {
  current_log() = std::make_shared<TankLog>();
  SimClock clock;
  auto stage = make_stage(&clock);
  Hold full = stage->acquire(tenant_ctx(1), 4096);
  Hold other = stage->acquire(tenant_ctx(2), 1);  // another tank: granted
  CHECK(other.holds());
  Hold blocked;
  std::thread t([&] { blocked = stage->acquire(tenant_ctx(1), 1); });
  REQUIRE(testing::wait_for(
      [&] { return stage->totals().channels.at(0).objects.at(0).state["waiters"] == 1; },
      std::chrono::seconds(10)));
  stage->shutdown();
  t.join();
  CHECK(blocked.verdict().outcome == Outcome::kCancelled);
  CHECK_FALSE(blocked.holds());
  full.release_all();  // still reaches the shut-down object
  CHECK(current_log()->released == 4096);
}
