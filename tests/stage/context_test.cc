#include <catch2/catch.hpp>

#include <thread>

#include "sluice/context.h"

using namespace sluice;

TEST_CASE("fixed origins have fixed ids and names") {
  CHECK(origin_name(origin::kFlush) == "flush");
  CHECK(origin_name(origin::kCompactionL0L1) == "compaction_L0_L1");
  CHECK(find_origin("compaction_LN") == origin::kCompactionLN);
  CHECK(origin_name(9999) == "unknown");
}

TEST_CASE("interning is idempotent and validates names") {
  auto a = intern_origin("tenant-7");
  REQUIRE(a.has_value());
  CHECK(*a >= origin::kFirstDynamic);
  CHECK(intern_origin("tenant-7") == a);
  CHECK(origin_name(*a) == "tenant-7");
  CHECK_FALSE(intern_origin("").has_value());
  CHECK_FALSE(intern_origin("has space").has_value());
  CHECK_FALSE(intern_origin(std::string(64, 'x')).has_value());
  CHECK(intern_origin(std::string(63, 'x')).has_value());
  CHECK_FALSE(find_origin("never-interned-origin").has_value());
}

TEST_CASE("interning from many threads gives one id per name") {
  std::vector<std::thread> threads;
  std::vector<OriginId> ids(8);
  for (std::size_t t = 0; t < ids.size(); ++t) {
    threads.emplace_back([&ids, t] { ids[t] = *intern_origin("raced-origin"); });
  }
  for (auto& th : threads) th.join();
  for (auto id : ids) CHECK(id == ids[0]);
}

TEST_CASE("operations round-trip by name") {
  for (int i = 0; i < kOpCount; ++i) {
    auto op = static_cast<Op>(i);
    CHECK(parse_op(op_name(op)) == op);
  }
  CHECK_FALSE(parse_op("wirte").has_value());
}

TEST_CASE("size classes are bit widths") {
  CHECK(size_class_of(0) == 0);
  CHECK(size_class_of(1) == 1);
  CHECK(size_class_of(4095) == 12);
  CHECK(size_class_of(4096) == 13);
  CHECK(size_class_of(8191) == 13);
  CHECK(size_class_of(~0ull) == 64);
}

TEST_CASE("origin scopes nest and restore") {
  CHECK(current_propagated().origin == origin::kUnknown);
  {
    OriginScope outer(origin::kFlush, 3);
    Context c = make_context(Op::kWrite, 100);
    CHECK(c.origin == origin::kFlush);
    CHECK(c.tenant == 3);
    CHECK(c.size == 100);
    CHECK(c.op == Op::kWrite);
    CHECK(c.workflow == current_thread_id());
    {
      OriginScope inner(Propagated{origin::kCompactionLN, 4, 2, 1, 77});
      Context d = make_context(Op::kRead, 1);
      CHECK(d.origin == origin::kCompactionLN);
      CHECK(d.tenant == 4);
      CHECK(d.level == 2);
      CHECK(d.level_in == 1);
      CHECK(d.workflow == 77);
    }
    CHECK(make_context(Op::kRead, 1).origin == origin::kFlush);
    CHECK(make_context(Op::kRead, 1).tenant == 3);
  }
  CHECK(make_context(Op::kRead, 1).origin == origin::kUnknown);
}

TEST_CASE("make_context keeps every field apart at its extreme values") {
  OriginScope scope(Propagated{0xFFFF, 0xFFFFFFFFu, 0xFF, 0xFE, 5});
  const Context c = make_context(Op::kOther, ~0ull);
  CHECK(c.workflow == 5);
  CHECK(c.size == ~0ull);
  CHECK(c.tenant == 0xFFFFFFFFu);
  CHECK(c.origin == 0xFFFF);
  CHECK(c.op == Op::kOther);
  CHECK(c.level == 0xFF);
  CHECK(c.level_in == 0xFE);
  for (std::uint8_t b : c.reserved) CHECK(b == 0);
  {
    OriginScope zero(Propagated{origin::kUnknown, 0, 0, 0, 0});
    const Context d = make_context(Op::kNone, 0);
    CHECK(d.tenant == 0);
    CHECK(d.origin == origin::kUnknown);
    CHECK(d.op == Op::kNone);
    CHECK(d.level == 0);
    CHECK(d.level_in == 0);
  }
}

TEST_CASE("set/restore propagation for callbacks that are not one scope") {
  Propagated prev = set_propagated(Propagated{origin::kFlush, 1, 0, 0, 0});
  CHECK(current_propagated().origin == origin::kFlush);
  restore_propagated(prev);
  CHECK(current_propagated().origin == origin::kUnknown);
}

TEST_CASE("propagation and thread ids are per thread") {
  OriginScope here(origin::kWal);
  std::uint64_t other_tid = 0;
  OriginId other_origin = 1234;
  std::thread t([&] {
    other_tid = current_thread_id();
    other_origin = make_context(Op::kRead, 0).origin;
  });
  t.join();
  CHECK(other_tid != current_thread_id());
  CHECK(other_tid != 0);
  CHECK(other_origin == origin::kUnknown);
}

TEST_CASE("internal I/O scopes nest") {
  CHECK_FALSE(internal_io_active());
  {
    InternalIoScope a;
    CHECK(internal_io_active());
    {
      InternalIoScope b;
      CHECK(internal_io_active());
    }
    CHECK(internal_io_active());
  }
  CHECK_FALSE(internal_io_active());
}
