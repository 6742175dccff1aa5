// The etcd client against a real etcd (etcd_server.h): keys, transactions
// and their compares, leases, the election and its fencing, watches,
// failover across endpoints, and errors that name the endpoint and the call.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include "etcd_client.h"
#include "etcd_server.h"

using namespace sluice::cluster;
using sluice::Code;
using std::chrono::milliseconds;

namespace {
// One etcd for the whole program, stopped at exit.
sluice::test::EtcdServer& server() {
  static sluice::test::EtcdServer s;
  return s;
}
}  // namespace

TEST_CASE("base64 round trip and refusal", "[etcd]") {
  for (const std::string& s :
       std::vector<std::string>{"", "a", "ab", "abc", "abcd", std::string("\0\xff\x10", 3)}) {
    CHECK(base64_decode(base64_encode(s)) == s);
  }
  CHECK(base64_encode("hello") == "aGVsbG8=");
  CHECK_FALSE(base64_decode("aGVsbG8"));
  CHECK_FALSE(base64_decode("a=GV"));
  CHECK_FALSE(base64_decode("a*bc"));
}

TEST_CASE("endpoints are checked", "[etcd]") {
  CHECK(EtcdClient::create({{}, milliseconds(100)}).status().code() == Code::kInvalidArgument);
  auto bad = EtcdClient::create({{"http://127.0.0.1"}, milliseconds(100)});
  REQUIRE_FALSE(bad);
  CHECK(bad.status().message().find("http://127.0.0.1") != std::string::npos);
  CHECK_FALSE(EtcdClient::create({{"https://127.0.0.1:1"}, milliseconds(100)}));
  CHECK_FALSE(EtcdClient::create({{"127.0.0.1:99999"}, milliseconds(100)}));
  CHECK(EtcdClient::create({{"127.0.0.1:2379"}, milliseconds(100)}));
  CHECK(EtcdClient::prefix_end("/a/") == "/a0");
  CHECK(EtcdClient::prefix_end(std::string("a\xff")) == "b");
}

TEST_CASE("put, range, prefix and delete", "[etcd]") {
  auto c = server().client();
  auto rev = c->put("/t/kv/a", "1");
  REQUIRE(rev);
  REQUIRE(c->put("/t/kv/b", std::string("\0two", 4)));
  REQUIRE(c->put("/t/kw", "other"));
  auto one = c->range("/t/kv/a");
  REQUIRE(one);
  REQUIRE(one->kvs.size() == 1);
  CHECK(one->kvs[0].value == "1");
  CHECK(one->kvs[0].create_revision == *rev);
  CHECK(one->revision >= *rev);
  auto all = c->range_prefix("/t/kv/");
  REQUIRE(all);
  REQUIRE(all->kvs.size() == 2);
  CHECK(all->kvs[1].value == std::string("\0two", 4));
  auto gone = c->delete_range("/t/kv/", EtcdClient::prefix_end("/t/kv/"));
  REQUIRE(gone);
  CHECK(*gone == 2);
  auto none = c->range("/t/kv/a");
  REQUIRE(none);
  CHECK(none->kvs.empty());
}

TEST_CASE("txn compares on create revision, mod revision and value", "[etcd]") {
  auto c = server().client();
  auto rev = c->put("/t/txn", "v1");
  REQUIRE(rev);
  auto ok = c->txn({Compare::create_revision("/t/txn", *rev)}, {TxnOp::put("/t/txn", "v2")},
                   {TxnOp::get("/t/txn")});
  REQUIRE(ok);
  CHECK(ok->succeeded);
  auto stale = c->txn({Compare::mod_revision("/t/txn", *rev)}, {TxnOp::put("/t/txn", "v3")},
                      {TxnOp::get("/t/txn")});
  REQUIRE(stale);
  CHECK_FALSE(stale->succeeded);
  REQUIRE(stale->ranges.size() == 1);
  CHECK(stale->ranges[0].kvs.at(0).value == "v2");
  auto by_value = c->txn({Compare::value_is("/t/txn", "v2")}, {TxnOp::del("/t/txn")});
  REQUIRE(by_value);
  CHECK(by_value->succeeded);
  // A key that does not exist has create revision 0.
  auto absent = c->txn({Compare::create_revision("/t/txn", 0)}, {TxnOp::put("/t/txn", "new")});
  REQUIRE(absent);
  CHECK(absent->succeeded);
}

TEST_CASE("leases: keys go with them", "[etcd]") {
  auto c = server().client();
  auto l = c->lease_grant(5);
  REQUIRE(l);
  CHECK(l->ttl_s == 5);
  REQUIRE(c->put("/t/lease/k", "v", l->id));
  auto ttl = c->lease_keepalive(l->id);
  REQUIRE(ttl);
  CHECK(*ttl == 5);
  REQUIRE(c->lease_revoke(l->id).is_ok());
  auto r = c->range("/t/lease/k");
  REQUIRE(r);
  CHECK(r->kvs.empty());
  auto again = c->lease_keepalive(l->id);
  REQUIRE_FALSE(again);
  CHECK(again.status().code() == Code::kFailedPrecondition);
  CHECK(c->lease_revoke(l->id).code() == Code::kFailedPrecondition);
  CHECK(c->lease_grant(0).status().code() == Code::kInvalidArgument);
  // A put under a lease etcd does not have.
  auto put = c->put("/t/lease/k", "v", l->id);
  REQUIRE_FALSE(put);
  CHECK(put.status().code() == Code::kFailedPrecondition);
  CHECK(put.status().message().find(server().url()) != std::string::npos);
  CHECK(put.status().message().find("kv/put") != std::string::npos);
}

TEST_CASE("election: one leads, the other waits; a deposed leader's fenced write fails", "[etcd]") {
  auto c = server().client();
  auto l1 = c->lease_grant(10);
  auto l2 = c->lease_grant(10);
  REQUIRE(l1);
  REQUIRE(l2);
  auto k1 = c->campaign("/t/el", "one", l1->id, milliseconds(2000));
  REQUIRE(k1);
  CHECK(k1->rev > 0);
  auto who = c->leader("/t/el");
  REQUIRE(who);
  REQUIRE(*who);
  CHECK((*who)->value == "one");
  // The second waits while the first leads.
  auto waiting = c->campaign("/t/el", "two", l2->id, milliseconds(300));
  REQUIRE_FALSE(waiting);
  CHECK(waiting.status().code() == Code::kUnavailable);
  REQUIRE(c->proclaim(*k1, "one'").is_ok());
  who = c->leader("/t/el");
  REQUIRE(*who);
  CHECK((*who)->value == "one'");
  // The first leader's lease goes (as when its process stalls past its TTL).
  std::atomic<bool> elected{false};
  LeaderKey k2;
  std::thread t([&] {
    auto k = c->campaign("/t/el", "two", l2->id, milliseconds(5000));
    if (k) {
      k2 = *k;
      elected = true;
    }
  });
  std::this_thread::sleep_for(milliseconds(200));
  CHECK_FALSE(elected.load());
  REQUIRE(c->lease_revoke(l1->id).is_ok());
  t.join();
  REQUIRE(elected.load());
  CHECK(k2.rev > k1->rev);
  auto fenced =
      c->txn({Compare::create_revision(k1->key, k1->rev)}, {TxnOp::put("/t/el-out", "x")});
  REQUIRE(fenced);
  CHECK_FALSE(fenced->succeeded);
  auto current = c->txn({Compare::create_revision(k2.key, k2.rev)}, {TxnOp::put("/t/el-out", "y")});
  REQUIRE(current);
  CHECK(current->succeeded);
  REQUIRE(c->resign(k2).is_ok());
  auto nobody = c->leader("/t/el");
  REQUIRE(nobody);
  CHECK_FALSE(*nobody);
  (void)c->lease_revoke(l2->id);
}

TEST_CASE("watch: changes in order from a revision, deletions, stop", "[etcd]") {
  auto c = server().client();
  auto r1 = c->put("/t/w/a", "1");
  REQUIRE(r1);
  REQUIRE(c->put("/t/w/b", "2"));
  REQUIRE(c->delete_range("/t/w/a"));
  // Each watch is stopped once it has seen what it waits for; its time is
  // sized for a loaded machine, never for the events to arrive within it.
  std::vector<WatchEvent> seen;
  std::atomic<bool> seen_all{false};
  auto collect = [&](std::size_t n) {
    return [&seen, &seen_all, n](const WatchEvent& e) {
      seen.push_back(e);
      if (seen.size() >= n) seen_all = true;
    };
  };
  auto next = c->watch("/t/w/", EtcdClient::prefix_end("/t/w/"), *r1, milliseconds(20000),
                       &seen_all, collect(3));
  REQUIRE(next);
  REQUIRE(seen.size() == 3);
  CHECK(seen[0].kv.key == "/t/w/a");
  CHECK(seen[1].kv.value == "2");
  CHECK(seen[2].deleted);
  CHECK(*next == seen[2].kv.mod_revision + 1);
  // From the next revision, a change made while watching.
  seen.clear();
  seen_all = false;
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds(100));
    (void)c->put("/t/w/c", "3");
  });
  auto again = c->watch("/t/w/", EtcdClient::prefix_end("/t/w/"), *next, milliseconds(20000),
                        &seen_all, collect(1));
  writer.join();
  REQUIRE(again);
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].kv.value == "3");
  CHECK(*again == seen[0].kv.mod_revision + 1);
  // stop ends a watch early.
  std::atomic<bool> stop{true};
  const auto t0 = std::chrono::steady_clock::now();
  auto stopped = c->watch("/t/w/", "", 0, milliseconds(20000), &stop, [](const WatchEvent&) {});
  CHECK(std::chrono::steady_clock::now() - t0 < milliseconds(10000));
  CHECK(stopped);
}

TEST_CASE("failover: a dead endpoint first, the live one answers", "[etcd]") {
  const std::string dead = "http://127.0.0.1:" + std::to_string(sluice::test::free_port());
  auto c = EtcdClient::create({{dead, server().url()}, milliseconds(10000)});
  REQUIRE(c);
  auto put = (*c)->put("/t/fo", "x");
  REQUIRE(put);
  auto only_dead = EtcdClient::create({{dead}, milliseconds(300)});
  REQUIRE(only_dead);
  auto r = (*only_dead)->range("/t/fo");
  REQUIRE_FALSE(r);
  CHECK(r.status().code() == Code::kUnavailable);
  CHECK(r.status().message().find(dead) != std::string::npos);
  CHECK(r.status().message().find("kv/range") != std::string::npos);
}
