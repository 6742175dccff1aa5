// Who may do what (control-plane/access.h) and the rate limits on the
// daemon's messages about peers (control-plane/log_limiter.h).
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "access.h"
#include "log_limiter.h"
#include "session_arena.h"

using sluice::Code;
using sluice::control::AccessRules;
using sluice::control::Action;
using sluice::control::authorize;
using sluice::control::LogLimiter;
using sluice::control::SessionAllocator;
using sluice::control::SessionArena;

namespace {

constexpr std::int64_t kSecond = 1'000'000'000;

AccessRules rules() {
  AccessRules r;
  r.daemon_uid = 1000;
  r.admin_uids = {2000};
  r.allow_uids = {3000, 3001};
  return r;
}

}  // namespace

TEST_CASE("reads are for every admitted uid; nobody else gets in", "[access]") {
  const AccessRules r = rules();
  for (std::uint32_t uid : {0u, 1000u, 2000u, 3000u, 3001u}) {
    INFO(uid);
    CHECK(authorize(r, uid, Action::kConnect).is_ok());
    CHECK(authorize(r, uid, Action::kRead).is_ok());
    CHECK(authorize(r, uid, Action::kHello).is_ok());
  }
  for (Action a :
       {Action::kConnect, Action::kRead, Action::kHello, Action::kApplyRules, Action::kSetPolicy}) {
    auto s = authorize(r, 4000, a, "db", 4000);  // even its "own" stage
    REQUIRE_FALSE(s.is_ok());
    CHECK(s.code() == Code::kPermissionDenied);
    CHECK_THAT(s.message(),
               Catch::StartsWith("permission denied: uid 4000 may not use this daemon"));
  }
}

TEST_CASE("rules for a stage only by its owner or an administrator", "[access]") {
  const AccessRules r = rules();
  CHECK(authorize(r, 3000, Action::kApplyRules, "mine", 3000).is_ok());
  for (std::uint32_t admin : {0u, 1000u, 2000u}) {
    INFO(admin);
    CHECK(authorize(r, admin, Action::kApplyRules, "theirs", 3000).is_ok());
    CHECK(authorize(r, admin, Action::kApplyRules, "roots", 0).is_ok());
  }
  auto other = authorize(r, 3001, Action::kApplyRules, "theirs", 3000);
  REQUIRE_FALSE(other.is_ok());
  CHECK(other.code() == Code::kPermissionDenied);
  CHECK(other.message() ==
        "permission denied: uid 3001 may not apply rules to stage 'theirs', which uid 3000 owns "
        "(only a stage's owner or an administrator may: root, the daemon's uid 1000 or an "
        "--admin-uid)");
  auto roots = authorize(r, 3000, Action::kApplyRules, "db", 0);
  REQUIRE_FALSE(roots.is_ok());
  CHECK_THAT(roots.message(), Catch::Contains("uid 3000 may not apply rules to stage 'db'"));
}

TEST_CASE("the policy only by an administrator", "[access]") {
  const AccessRules r = rules();
  for (std::uint32_t admin : {0u, 1000u, 2000u})
    CHECK(authorize(r, admin, Action::kSetPolicy).is_ok());
  auto s = authorize(r, 3000, Action::kSetPolicy);
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.code() == Code::kPermissionDenied);
  CHECK_THAT(s.message(), Catch::StartsWith("permission denied: uid 3000 may not set the policy"));
  CHECK(r.is_admin(0));
  CHECK(r.is_admin(1000));
  CHECK(r.is_admin(2000));
  CHECK_FALSE(r.is_admin(3000));
}

TEST_CASE("a kind's messages pass as a burst, then one a second, with counts", "[log]") {
  LogLimiter logs;  // 10 at once, then 1 a second
  std::uint64_t suppressed = 99;
  int passed = 0;
  for (int i = 0; i < 100; ++i) {
    if (logs.admit("bad_frame", 0, &suppressed)) {
      ++passed;
      CHECK(suppressed == 0);
    }
  }
  CHECK(passed == 10);
  // Other kinds have buckets of their own.
  CHECK(logs.admit("refused_uid", 0));
  // Half a second brings half a token: still nothing.
  CHECK_FALSE(logs.admit("bad_frame", kSecond / 2));
  // A second brings one, and the line says what it stands for.
  REQUIRE(logs.admit("bad_frame", kSecond, &suppressed));
  CHECK(suppressed == 91);
  CHECK_FALSE(logs.admit("bad_frame", kSecond));
  CHECK(logs.suppressed_total() == 92);
  auto counts = logs.counts();
  CHECK(counts["bad_frame"]["logged"] == 11);
  CHECK(counts["bad_frame"]["suppressed"] == 92);
  CHECK(counts["refused_uid"]["logged"] == 1);
  CHECK(counts["refused_uid"]["suppressed"] == 0);
  // An hour of one message a millisecond: about an hour's worth of lines.
  int hour = 0;
  for (std::int64_t t = 2 * kSecond; t < 3602 * kSecond; t += kSecond / 1000) {
    if (logs.admit("bad_frame", t)) ++hour;
  }
  CHECK(hour >= 3599);
  CHECK(hour <= 3601);
}

TEST_CASE("suppressed messages are summarised once there is room", "[log]") {
  LogLimiter logs(LogLimiter::Limit{1.0, 2.0});
  logs.set_limit("lifecycle", {10.0, 5.0});
  for (int i = 0; i < 7; ++i) (void)logs.admit("timeout", 0);
  for (int i = 0; i < 7; ++i) (void)logs.admit("lifecycle", 0);
  // No token yet: nothing to say.
  CHECK(logs.take_summaries(0).empty());
  auto later = logs.take_summaries(kSecond);
  REQUIRE(later.size() == 2);
  CHECK(later[0].first == "lifecycle");
  CHECK(later[0].second == 2);
  CHECK(later[1].first == "timeout");
  CHECK(later[1].second == 5);
  // Reported once: the next line admitted does not count them again.
  CHECK(logs.take_summaries(10 * kSecond).empty());
  std::uint64_t suppressed = 7;
  REQUIRE(logs.admit("timeout", 10 * kSecond, &suppressed));
  CHECK(suppressed == 0);
}

TEST_CASE("the sessions' memory goes back to the system once they are gone", "[arena]") {
  struct Fake {
    char bytes[1000];
    std::deque<int, SessionAllocator<int>> queue;
  };
  const std::size_t before = SessionArena::mapped_bytes();
  {
    std::vector<std::shared_ptr<Fake>> many;
    for (int i = 0; i < 5000; ++i) {
      many.push_back(std::allocate_shared<Fake>(SessionAllocator<Fake>()));
      many.back()->queue.push_back(i);
      std::memset(many.back()->bytes, 0x5a, sizeof(many.back()->bytes));
    }
    // 5000 blocks of about 1 KiB, and the queues' blocks: several megabytes.
    CHECK(SessionArena::mapped_bytes() >= before + 5000 * 1000);
    for (std::size_t i = 0; i < many.size(); ++i) {
      REQUIRE(many[i]->queue.front() == static_cast<int>(i));
      REQUIRE((reinterpret_cast<std::uintptr_t>(many[i].get()) % alignof(Fake)) == 0);
    }
    // Freed in another order than allocated.
    for (std::size_t i = 0; i < many.size(); i += 2) many[i].reset();
    for (std::size_t i = 1; i < many.size(); i += 2) many[i].reset();
  }
  // At most one empty slab is kept per block size (three sizes here).
  CHECK(SessionArena::mapped_bytes() <= before + 3 * SessionArena::kSlabBytes);
  // Blocks larger than a slab's go to operator new.
  SessionAllocator<char> big;
  char* p = big.allocate(1 << 20);
  p[(1 << 20) - 1] = 1;
  big.deallocate(p, 1 << 20);
}
