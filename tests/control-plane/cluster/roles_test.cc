// The node's agent and the controller against a real etcd: the summary
// published under a lease and withdrawn on stop, decisions watched (bad or
// older ones ignored), the last decision kept when etcd goes (fail-static),
// and a new controller resuming the decision sequence and the policy's state.
#include <catch2/catch.hpp>

#include <fstream>
#include <functional>
#include <thread>

#include "cluster_controller.h"
#include "cluster_node.h"
#include "etcd_server.h"
#include "test_util.h"

using namespace sluice::cluster;
using json = nlohmann::json;
using std::chrono::milliseconds;

namespace {

// Sized for etcd and the roles' threads on a loaded machine; polled, so only
// a failure waits that long.
bool settles(const std::function<bool()>& f) {
  return sluice::testing::wait_for(f, milliseconds(20000), milliseconds(20));
}

ClusterNodeConfig node_config(const std::string& url, const std::string& cluster) {
  ClusterNodeConfig c;
  c.etcd = {url};
  c.cluster = cluster;
  c.node = "n1";
  c.interval_ms = 100;
  c.lease_s = 2;
  c.timeout_ms = 300;
  return c;
}

std::string decision_text(std::uint64_t seq, std::int64_t term, double rate) {
  NodeDecision d;
  d.seq = seq;
  d.term = term;
  d.budgets.push_back({"A", "app", "limit", "rate", rate, std::nullopt});
  return to_json(d).dump();
}

}  // namespace

TEST_CASE("node agent: summary under a lease, decisions watched, fail-static", "[cluster]") {
  sluice::test::EtcdServer etcd;
  auto c = etcd.client();
  auto node = ClusterNode::start(node_config(etcd.url(), "roles"));
  REQUIRE(node);
  auto& link = (*node)->link();
  NodeSummary s;
  s.node = "n1";
  s.seq = 42;
  s.loads.push_back({"A", "app", 1, 10, 9, 1, 0, 0});
  link->publish(s);
  REQUIRE(settles([&] {
    auto r = c->range(node_key("roles", "n1"));
    return r && !r->kvs.empty() && r->kvs[0].lease != 0 &&
           json::parse(r->kvs[0].value)["seq"] == 42;
  }));
  CHECK(settles([&] { return link->reachable(); }));

  REQUIRE(c->put(decision_key("roles", "n1"), decision_text(1, 5, 1000)));
  REQUIRE(settles([&] { return link->decision() && link->decision()->seq == 1; }));
  CHECK(link->decision()->budgets.at(0).value == 1000);
  // Not a decision, or an older one: the last stays.
  REQUIRE(c->put(decision_key("roles", "n1"), "{not json"));
  REQUIRE(c->put(decision_key("roles", "n1"), decision_text(9, 4, 7)));
  REQUIRE(c->put(decision_key("roles", "n1"), decision_text(2, 5, 2000)));
  REQUIRE(settles([&] { return link->decision()->seq == 2; }));
  CHECK(link->decision()->budgets.at(0).value == 2000);
  // Deleted: the last stays.
  REQUIRE(c->delete_range(decision_key("roles", "n1")));
  std::this_thread::sleep_for(milliseconds(200));
  CHECK(link->decision()->seq == 2);

  // etcd goes: the node keeps its decision and says it cannot reach etcd.
  etcd.kill();
  REQUIRE(settles([&] { return !link->reachable(); }));
  REQUIRE(link->decision());
  CHECK(link->decision()->seq == 2);
  (*node)->stop();
}

TEST_CASE("node agent: stop withdraws the summary at once", "[cluster]") {
  sluice::test::EtcdServer etcd;
  auto c = etcd.client();
  auto node = ClusterNode::start(node_config(etcd.url(), "bye"));
  REQUIRE(node);
  REQUIRE(settles([&] {
    auto r = c->range(node_key("bye", "n1"));
    return r && !r->kvs.empty();
  }));
  (*node)->stop();
  auto r = c->range(node_key("bye", "n1"));
  REQUIRE(r);
  CHECK(r->kvs.empty());
}

TEST_CASE("controller: decisions for live nodes; a successor resumes sequence and state",
          "[cluster]") {
  sluice::test::EtcdServer etcd;
  auto c = etcd.client();
  auto l = c->lease_grant(30);
  REQUIRE(l);
  NodeSummary n1{"n1", 1, 1, {{"A", "app", 1, 3000, 3000, 1, 0, 0}}};
  NodeSummary n2{"n2", 1, 1, {{"A", "app", 1, 1000, 1000, 1, 0, 0}}};
  REQUIRE(c->put(node_key("ctl", "n1"), to_json(n1).dump(), l->id));
  REQUIRE(c->put(node_key("ctl", "n2"), to_json(n2).dump(), l->id));
  ControllerOptions o;
  o.etcd = {etcd.url()};
  o.cluster = "ctl";
  o.id = "first";
  o.policy = "global-rate";
  o.config = json{{"tenants", {{"A", {{"limit", 8000}}}}}, {"gain", 0.5}, {"min_rate", 0}};
  o.interval_ms = 50;
  o.lease_s = 2;
  o.report_log = etcd.dir() + "/report.jsonl";
  auto run_until = [&](ControllerOptions opt, auto&& done) {
    auto ctl = ClusterController::create(opt);
    REQUIRE(ctl);
    std::thread t([&] { (void)(*ctl)->run(); });
    const bool ok = settles(done);
    (*ctl)->stop();
    t.join();
    CHECK(ok);
    CHECK_FALSE((*ctl)->counters().leading);
    return (*ctl)->counters();
  };
  auto budget = [&](const std::string& n) {
    auto r = c->range(decision_key("ctl", n));
    if (!r || r->kvs.empty()) return NodeDecision{};
    return *decision_from_json(json::parse(r->kvs[0].value));
  };
  ControllerCounters first =
      run_until(o, [&] { return budget("n1").seq >= 1 && budget("n2").seq >= 1; });
  CHECK(first.elected == 1);
  CHECK(budget("n1").budgets.at(0).value == Approx(6000));
  CHECK(budget("n2").budgets.at(0).value == Approx(2000));
  CHECK(budget("n1").leader == "first");
  {
    std::ifstream log(o.report_log);
    std::string line;
    REQUIRE(std::getline(log, line));
    const json first_line = json::parse(line);
    CHECK(first_line["leader"] == "first");
    CHECK(first_line["nodes"] == 2);
    CHECK(first_line["report"]["tenants"]["A"]["nodes"]["n1"]["budget"] == Approx(6000));
  }
  const std::int64_t first_term = budget("n1").term;
  // Demand moves to n2; a new leader takes over from the stored state.
  n1.loads[0].demand = 1000;
  n2.loads[0].demand = 7000;
  REQUIRE(c->put(node_key("ctl", "n1"), to_json(n1).dump(), l->id));
  REQUIRE(c->put(node_key("ctl", "n2"), to_json(n2).dump(), l->id));
  auto state = c->range("/sluice/ctl/state");
  REQUIRE(state);
  const json before = json::parse(state->kvs.at(0).value);
  const std::uint64_t last_seq = std::max(budget("n1").seq, budget("n2").seq);
  o.id = "second";
  run_until(o, [&] { return budget("n2").leader == "second"; });
  NodeDecision d2 = budget("n2");
  CHECK(d2.seq > last_seq);
  CHECK(d2.term > first_term);  // a new election, a later revision
  // gain 0.5 from the stored split (n2 had 2000), not from nothing:
  // 2000 + 0.5 * (7000 - 2000) = 4500 (and n1 6000 -> 3500: the sum is the limit).
  CHECK(d2.budgets.at(0).value == Approx(4500));
  state = c->range("/sluice/ctl/state");
  const json after = json::parse(state->kvs.at(0).value);
  CHECK(after["state"]["steps"].get<std::uint64_t>() >
        before["state"]["steps"].get<std::uint64_t>());
  // A node whose lease is gone gets no more decisions; the other gets it all.
  REQUIRE(c->lease_revoke(l->id).is_ok());
  auto l2 = c->lease_grant(30);
  REQUIRE(c->put(node_key("ctl", "n1"), to_json(n1).dump(), l2->id));
  o.id = "third";
  run_until(
      o, [&] { return budget("n1").leader == "third" && budget("n1").budgets.at(0).value > 7999; });
  CHECK(budget("n1").budgets.at(0).value == Approx(8000));
}
