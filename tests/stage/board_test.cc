// The board (sluice/board.h): what a control plane's writer accepts as a
// board, the sequence lock and mask accumulation, and a stage's objects taking
// tunables from it on their next request, with no rules message applied.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "sluice/board.h"
#include "sluice/clock.h"
#include "sluice/stage.h"

using namespace sluice;
using nlohmann::json;

namespace {

const json kLimited = json::parse(R"({"version": 1, "rules": [
  {"rule": "create_channel", "channel": "all", "default": true},
  {"rule": "create_object", "channel": "all", "object": "limit", "type": "drl",
   "config": {"rate": 1000}},
  {"rule": "create_object", "channel": "all", "object": "count", "type": "noop"}]})");

std::array<double, kMaxTunables> tunables(double rate, double burst = 0) {
  std::array<double, kMaxTunables> v{};
  v[0] = rate;
  v[1] = burst;
  return v;
}

const ObjectInfo& object_info(const StageInfo& info, const std::string& channel,
                              const std::string& object) {
  for (const auto& c : info.channels) {
    if (c.name != channel) continue;
    for (const auto& o : c.objects) {
      if (o.name == object) return o;
    }
  }
  FAIL("no object " << channel << "/" << object);
  throw 0;  // not reached
}

json object_state(Stage& s, const std::string& object) {
  for (const auto& c : s.totals().channels) {
    for (const auto& o : c.objects) {
      if (o.name == object) return o.state;
    }
  }
  return json();
}

struct Fd {
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int fd;
};

// A memfd of `bytes`, sealed with `seals`.
int memfd(std::size_t bytes, int seals) {
  const int fd = ::memfd_create("test-board", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(bytes)) == 0);
  if (seals != 0) REQUIRE(::fcntl(fd, F_ADD_SEALS, seals) == 0);
  return fd;
}

std::string refusal(int fd) {
  auto w = BoardWriter::map(fd);
  REQUIRE_FALSE(w.is_ok());
  return w.status().message();
}

}  // namespace

TEST_CASE("a control plane maps only a sealed memfd of the board's size", "[board]") {
  auto stage = Stage::create().value();
  auto fd = stage->board();
  REQUIRE(fd.is_ok());
  CHECK(stage->board().value() == *fd);  // made once
  auto w = BoardWriter::map(*fd);
  REQUIRE(w.is_ok());
  CHECK(w->mapped());
  CHECK(::fcntl(*fd, F_GETFD) & FD_CLOEXEC);

  int p[2];
  REQUIRE(::pipe(p) == 0);
  Fd r(p[0]), wr(p[1]);
  CHECK(refusal(p[0]) == "board: not a memory file");

  char tmpl[] = "/tmp/sluice-board-XXXXXX";
  Fd file(::mkstemp(tmpl));
  REQUIRE(file.fd >= 0);
  ::unlink(tmpl);
  REQUIRE(::ftruncate(file.fd, static_cast<off_t>(kBoardBytes)) == 0);
  CHECK(refusal(file.fd) == "board: not a sealable memory file (memfd)");

  // Unsealed, a stage could shrink it under the daemon's writes (SIGBUS).
  Fd open_ended(memfd(kBoardBytes, 0));
  CHECK(refusal(open_ended.fd) == "board: not sealed against shrinking");
  Fd growable(memfd(kBoardBytes, F_SEAL_SHRINK));
  CHECK(refusal(growable.fd) == "board: not sealed against growing");
  Fd small(memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW));
  CHECK(refusal(small.fd) == "board: 4096 bytes, expected " + std::to_string(kBoardBytes));
  // Sealed against writing: no writable shared mapping exists.
  Fd frozen(memfd(kBoardBytes, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE));
  CHECK(refusal(frozen.fd).rfind("board: mmap: ", 0) == 0);
}

TEST_CASE("board writes are sequence-locked and add up until the stage takes them", "[board]") {
  Fd fd(memfd(kBoardBytes, F_SEAL_SHRINK | F_SEAL_GROW));
  auto w = BoardWriter::map(fd.fd).value();
  BoardSlotValue v;
  REQUIRE(w.read(3, v));
  CHECK(v.seq == 0);
  CHECK(w.taken(3));  // nothing written, nothing to take

  REQUIRE(w.write(3, 7, 0b01, tunables(100)));
  REQUIRE(w.read(3, v));
  CHECK(v.seq == 2);
  CHECK(v.tag == 7);
  CHECK(v.mask == 0b01);
  CHECK(v.values[0] == 100);
  CHECK_FALSE(w.taken(3));

  // Not taken yet: a write of the burst keeps the rate it follows.
  REQUIRE(w.write(3, 7, 0b10, tunables(0, 50)));
  REQUIRE(w.read(3, v));
  CHECK(v.seq == 4);
  CHECK(v.mask == 0b11);
  CHECK(v.values[0] == 100);
  CHECK(v.values[1] == 50);

  // For another object (the slot changed hands): nothing carried over.
  REQUIRE(w.write(3, 8, 0b10, tunables(0, 60)));
  REQUIRE(w.read(3, v));
  CHECK(v.mask == 0b10);

  // A writer that died mid-write left seq odd: readers skip it, and the
  // next writer's seq is even again when it is done.
  void* raw = ::mmap(nullptr, kBoardBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  REQUIRE(raw != MAP_FAILED);
  BoardSlot* slot = board_slot(raw, 3);
  slot->seq.store(9);
  CHECK_FALSE(w.read(3, v));
  REQUIRE(w.write(3, 8, 0b01, tunables(5)));
  REQUIRE(w.read(3, v));
  CHECK(v.seq % 2 == 0);
  CHECK(v.seq > 9);
  // The stage takes it: the next write starts a fresh mask.
  slot->seen.store(v.seq);
  CHECK(w.taken(3));
  REQUIRE(w.write(3, 8, 0b10, tunables(0, 70)));
  REQUIRE(w.read(3, v));
  CHECK(v.mask == 0b10);
  ::munmap(raw, kBoardBytes);

  CHECK_FALSE(w.write(kBoardSlots, 1, 1, tunables(1)));
  CHECK_FALSE(w.write(0, 1, std::uint64_t{1} << kMaxTunables, tunables(1)));
  CHECK_FALSE(w.read(kBoardSlots, v));
}

TEST_CASE("a stage lists its objects' slots and takes their tunables from the board", "[board]") {
  SimClock clock;
  StageOptions o;
  o.clock = &clock;
  auto stage = Stage::create(o).value();
  REQUIRE(stage->apply(kLimited).is_ok());
  // Objects that existed before the board get slots when it is made.
  CHECK(object_info(stage->info(), "all", "limit").board_slot == -1);
  auto w = BoardWriter::map(stage->board().value()).value();
  const ObjectInfo limit = object_info(stage->info(), "all", "limit");
  REQUIRE(limit.board_slot >= 0);
  CHECK(limit.board_tag != 0);
  CHECK(limit.tunables == std::vector<std::string>{"rate", "burst"});
  CHECK(object_info(stage->info(), "all", "count").board_slot == -1);  // noop: no tunables
  json j;
  to_json(j, stage->info());
  CHECK(j["channels"][0]["objects"][0]["board"] == json{{"slot", limit.board_slot},
                                                        {"tag", limit.board_tag},
                                                        {"tunables", {"rate", "burst"}}});
  CHECK_FALSE(j["channels"][0]["objects"][1].contains("board"));

  // 1000 B/s, a bucket of 100 B: 1000 bytes drain it and more.
  Context ctx;
  ctx.size = 1000;
  CHECK(stage->enforce(ctx).wait_ns == 900'000'000);
  const std::uint64_t version = stage->rules_version();

  // A million bytes a second, through the board alone: the next request
  // waits a millisecond, not a second.
  REQUIRE(
      w.write(static_cast<std::size_t>(limit.board_slot), limit.board_tag, 0b01, tunables(1e6)));
  CHECK(stage->enforce(ctx).wait_ns == 1'000'000);
  CHECK(stage->board_updates() == 1);
  CHECK(w.taken(static_cast<std::size_t>(limit.board_slot)));
  CHECK(stage->rules_version() == version);  // no rules were applied
  json state = object_state(*stage, "limit");
  CHECK(state["rate"] == 1e6);
  CHECK(state["burst"] == 1e5);  // follows the rate: it was never set
  CHECK(state["board"] == json{{"slot", limit.board_slot}, {"taken", 1}, {"rejected", 0}});

  // Collect takes a write no request took yet: the state it reports is current.
  REQUIRE(w.write(static_cast<std::size_t>(limit.board_slot), limit.board_tag, 0b11,
                  tunables(2e6, 4e6)));
  state = object_state(*stage, "limit");
  CHECK(state["rate"] == 2e6);
  CHECK(state["burst"] == 4e6);
  CHECK(stage->board_updates() == 2);
}

TEST_CASE("values an object refuses, and writes for another object, change nothing", "[board]") {
  auto stage = Stage::create().value();
  REQUIRE(stage->apply(kLimited).is_ok());
  auto w = BoardWriter::map(stage->board().value()).value();
  const ObjectInfo limit = object_info(stage->info(), "all", "limit");
  const auto slot = static_cast<std::size_t>(limit.board_slot);
  Context ctx;
  ctx.size = 1;

  for (double bad : {-5.0, 0.0, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    REQUIRE(w.write(slot, limit.board_tag, 0b01, tunables(bad)));
    (void)stage->enforce(ctx);
    CHECK(w.taken(slot));  // seen, not retried on every request
  }
  json state = object_state(*stage, "limit");
  CHECK(state["rate"] == 1000);
  CHECK(state["board"]["rejected"] == 4);
  CHECK(state["board"]["taken"] == 0);

  // A tag that is not the object's: seen, ignored.
  REQUIRE(w.write(slot, limit.board_tag + 1000, 0b01, tunables(5e6)));
  (void)stage->enforce(ctx);
  CHECK(w.taken(slot));
  CHECK(object_state(*stage, "limit")["rate"] == 1000);
  CHECK(stage->board_updates() == 0);
}

TEST_CASE("rates and bursts below the drl's floor are refused on the board too", "[board]") {
  auto stage = Stage::create().value();
  REQUIRE(stage->apply(kLimited).is_ok());
  auto w = BoardWriter::map(stage->board().value()).value();
  const ObjectInfo limit = object_info(stage->info(), "all", "limit");
  const auto slot = static_cast<std::size_t>(limit.board_slot);
  // 5e-324 bytes/s once meant a wait that never ends. The stage takes what
  // the board holds on a collect as on a request (no request has to wait).
  for (double tiny : {5e-324, 1e-9, 0.999}) {
    REQUIRE(w.write(slot, limit.board_tag, 0b01, tunables(tiny)));
    (void)object_state(*stage, "limit");
    REQUIRE(w.write(slot, limit.board_tag, 0b10, tunables(0, tiny)));
    (void)object_state(*stage, "limit");
  }
  json state = object_state(*stage, "limit");
  CHECK(state["rate"] == 1000);
  CHECK(state["board"]["rejected"] == 6);
  CHECK(state["board"]["taken"] == 0);
  // The floor itself is accepted.
  REQUIRE(w.write(slot, limit.board_tag, 0b11, tunables(1, 1)));
  state = object_state(*stage, "limit");
  CHECK(state["rate"] == 1);
  CHECK(state["burst"] == 1);
  CHECK(state["board"]["taken"] == 1);
}

TEST_CASE("a removed object's slot goes to a new object with a new tag", "[board]") {
  auto stage = Stage::create().value();
  (void)stage->board().value();
  REQUIRE(stage->apply(kLimited).is_ok());  // created after the board: slot at once
  auto w = BoardWriter::map(stage->board().value()).value();
  const ObjectInfo old = object_info(stage->info(), "all", "limit");
  REQUIRE(old.board_slot >= 0);

  // Removed and created again under its name, in one batch: a new object.
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "remove_object", "channel": "all", "object": "limit"},
    {"rule": "create_object", "channel": "all", "object": "limit", "type": "drl",
     "config": {"rate": 2000}}])"))
              .is_ok());
  const ObjectInfo now = object_info(stage->info(), "all", "limit");
  REQUIRE(now.board_slot >= 0);
  CHECK(now.board_tag != old.board_tag);

  // A control plane that has not heard of the swap writes the old tag: the
  // new object keeps its configuration, whichever slot it has.
  REQUIRE(w.write(static_cast<std::size_t>(old.board_slot), old.board_tag, 0b01, tunables(9e6)));
  Context ctx;
  ctx.size = 1;
  (void)stage->enforce(ctx);
  CHECK(object_state(*stage, "limit")["rate"] == 2000);

  REQUIRE(w.write(static_cast<std::size_t>(now.board_slot), now.board_tag, 0b01, tunables(3e6)));
  (void)stage->enforce(ctx);
  CHECK(object_state(*stage, "limit")["rate"] == 3e6);

  // Created and removed in one batch: its slot is free again.
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "create_object", "channel": "all", "object": "brief", "type": "drl",
     "config": {"rate": 1}},
    {"rule": "remove_object", "channel": "all", "object": "brief"},
    {"rule": "create_object", "channel": "all", "object": "next", "type": "drl",
     "config": {"rate": 1}}])"))
              .is_ok());
  const ObjectInfo next = object_info(stage->info(), "all", "next");
  CHECK(next.board_slot >= 0);
  CHECK(next.board_slot != now.board_slot);
  // Freed slots are handed out again, the last freed first: "brief" had the
  // first object's, and the next object gets it.
  REQUIRE(stage
              ->apply(json::parse(R"([{"rule": "create_object", "channel": "all",
                 "object": "later", "type": "drl", "config": {"rate": 1}}])"))
              .is_ok());
  CHECK(object_info(stage->info(), "all", "later").board_slot == old.board_slot);
}

TEST_CASE("threads enforcing while the board is written end on the last value", "[board]") {
  auto stage = Stage::create().value();
  REQUIRE(stage->apply(kLimited).is_ok());
  auto w = BoardWriter::map(stage->board().value()).value();
  const ObjectInfo limit = object_info(stage->info(), "all", "limit");
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      Context ctx;
      ctx.size = 1;
      while (!stop.load(std::memory_order_relaxed)) (void)stage->enforce(ctx);
    });
  }
  for (int i = 1; i <= 2000; ++i) {
    REQUIRE(w.write(static_cast<std::size_t>(limit.board_slot), limit.board_tag, 0b01,
                    tunables(1e9 + i)));
  }
  stop.store(true);
  for (auto& t : threads) t.join();
  CHECK(object_state(*stage, "limit")["rate"] == 1e9 + 2000);
  CHECK(stage->board_updates() >= 1);
  CHECK(stage->board_updates() <= 2000);
}
