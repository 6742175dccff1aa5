// The cluster policies as tables (summaries in, decisions out), their state
// handed to a successor, the JSON forms nodes and controllers exchange, and
// the node's policy wrapper (summaries of its stages, budgets split among
// them, only changes sent, nothing without a decision).
#include <catch2/catch.hpp>

#include <chrono>
#include <numeric>

#include "cluster_node.h"
#include "cluster_policy.h"
#include "sluice/policy.h"

using namespace sluice::cluster;
using json = nlohmann::json;

namespace {

NodeSummary node(const std::string& name, std::vector<std::pair<std::string, double>> demands) {
  NodeSummary s;
  s.node = name;
  s.interval_s = 1;
  for (auto& [tenant, d] : demands) {
    TenantLoad l;
    l.tenant = tenant;
    l.channel = "app";
    l.stages = 1;
    l.demand = d;
    l.service = d;
    s.loads.push_back(l);
  }
  return s;
}

double budget(const ClusterOutput& out, const std::string& n, const std::string& tenant) {
  for (const Budget& b : out.decisions.at(n).budgets) {
    if (b.tenant == tenant) return b.value;
  }
  return -1;
}

std::unique_ptr<ClusterPolicy> policy_of(const std::string& name, const json& config) {
  auto p = make_cluster_policy(name, config);
  REQUIRE(p);
  return std::move(*p);
}

const json kGlobal = {{"tenants", {{"A", {{"limit", 1000}}}}}, {"min_rate", 10}};

}  // namespace

TEST_CASE("split_by_demand: by demand, surplus to demand, floors, sums to total", "[cluster]") {
  struct Row {
    double total;
    std::vector<double> demands;
    double floor;
    std::vector<double> want;
  };
  const std::vector<Row> rows = {
      {100, {100, 10}, 0, {90, 10}},  // the small demand is met, the rest to the big
      {100, {30, 10}, 0, {75, 25}},   // surplus shared in proportion to demand
      {100, {0, 0}, 0, {50, 50}},     // nobody wants anything: equal parts
      {100, {200, 0}, 5, {95, 5}},    // a floor for the idle one
      {100, {50, 50, 50, 50}, 0, {25, 25, 25, 25}},
      {0, {10, 10}, 5, {0, 0}},
  };
  for (const Row& r : rows) {
    auto got = split_by_demand(r.total, r.demands, r.floor);
    REQUIRE(got.size() == r.want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(r.want[i]).margin(1e-9));
    CHECK(std::accumulate(got.begin(), got.end(), 0.0) == Approx(r.total).margin(1e-9));
  }
  CHECK(split_by_demand(10, {}, 1).empty());
}

TEST_CASE("split_by_demand: what nobody demands goes to the backlogged, if any", "[cluster]") {
  struct Row {
    double total;
    std::vector<double> demands;
    double floor;
    std::vector<bool> backlogged;
    std::vector<double> want;
  };
  const std::vector<Row> rows = {
      {100, {30, 10}, 0, {true, false}, {90, 10}},  // the one held back takes the surplus
      {100, {30, 10, 20}, 0, {true, false, true}, {54, 10, 36}},  // among them by demand
      {100, {0, 10}, 0, {true, false}, {90, 10}},    // held back but no demand shown: equally
      {100, {0, 10}, 5, {false, true}, {5, 95}},     // the idle one keeps its floor only
      {100, {30, 10}, 0, {false, false}, {75, 25}},  // none backlogged: by demand, as without
      {100, {30, 10}, 0, {true, true}, {75, 25}},    // all backlogged: the same
      {100, {30, 10}, 0, {}, {75, 25}},              // not given: the same
      {10, {30, 10}, 0, {false, true}, {5, 5}},      // no surplus: the water-fill alone
  };
  for (const Row& r : rows) {
    auto got = split_by_demand(r.total, r.demands, r.floor, r.backlogged);
    REQUIRE(got.size() == r.want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(r.want[i]).margin(1e-9));
    CHECK(std::accumulate(got.begin(), got.end(), 0.0) == Approx(r.total).margin(1e-9));
  }
}

TEST_CASE("global-rate and maxmin: the unclaimed part of a limit goes to backlogged nodes",
          "[cluster]") {
  for (const char* name : {"global-rate", "maxmin"}) {
    INFO(name);
    auto p = policy_of(
        name, std::string(name) == "maxmin" ? json{{"capacity", 1000}, {"min_rate", 10}} : kGlobal);
    ClusterInput in;
    in.nodes = {node("n1", {{"A", 110}}), node("n2", {{"A", 300}}), node("n3", {{"A", 90}})};
    in.nodes[1].loads[0].backlogged = true;  // n2 is held back: it would take more
    ClusterOutput out = p->step(in);
    CHECK(budget(out, "n1", "A") == Approx(110));
    CHECK(budget(out, "n2", "A") == Approx(800));
    CHECK(budget(out, "n3", "A") == Approx(90));
    CHECK(out.report["tenants"]["A"]["nodes"]["n2"]["backlogged"] == true);
    CHECK(out.report["tenants"]["A"]["nodes"]["n1"]["backlogged"] == false);
    // Nobody held back: the surplus by demand, as before.
    in.nodes[1].loads[0].backlogged = false;
    out = p->step(in);
    CHECK(budget(out, "n1", "A") == Approx(220));
    CHECK(budget(out, "n2", "A") == Approx(600));
    CHECK(budget(out, "n3", "A") == Approx(180));
    // Demand above the limit: the water-fill alone, the flag changes nothing. (n3 has
    // left: its fallback, 10, stays reserved.)
    in.nodes = {node("n1", {{"A", 100}}), node("n2", {{"A", 2000}})};
    in.nodes[1].loads[0].backlogged = true;
    out = p->step(in);
    CHECK(budget(out, "n1", "A") == Approx(100));
    CHECK(budget(out, "n2", "A") == Approx(890));
  }
}

TEST_CASE("global-rate: a backlogged node keeps at least its last budget; others follow demand",
          "[cluster]") {
  auto p = policy_of("global-rate", kGlobal);
  ClusterInput in;
  in.nodes = {node("n1", {{"A", 600}}), node("n2", {{"A", 600}})};
  in.nodes[0].loads[0].backlogged = true;
  in.nodes[1].loads[0].backlogged = true;
  ClusterOutput out = p->step(in);
  CHECK(budget(out, "n1", "A") == Approx(500));
  // n1's summary still covers an interval under an older, smaller budget: held
  // back, it shows little; it keeps its 500 rather than swinging down.
  in.nodes[0].loads[0].demand = 100;
  in.nodes[1].loads[0].demand = 900;
  out = p->step(in);
  CHECK(budget(out, "n1", "A") == Approx(500));
  CHECK(budget(out, "n2", "A") == Approx(500));
  // Not held back, its demand is taken as it is: the rest goes to n2.
  in.nodes[0].loads[0].backlogged = false;
  out = p->step(in);
  CHECK(budget(out, "n1", "A") == Approx(100));
  CHECK(budget(out, "n2", "A") == Approx(900));
}

TEST_CASE("global-rate: a tenant's limit split across nodes by demand, not equally", "[cluster]") {
  auto p = policy_of("global-rate", kGlobal);
  ClusterInput in;
  in.nodes = {node("n1", {{"A", 900}}), node("n2", {{"A", 100}}), node("n3", {{"B", 500}})};
  ClusterOutput out = p->step(in);
  CHECK(budget(out, "n1", "A") == Approx(900));
  CHECK(budget(out, "n2", "A") == Approx(100));
  CHECK(out.decisions.at("n3").budgets.empty());  // hosts no limited tenant: told so
  // Demand moves: the budgets follow it in one step (gain 1).
  in.nodes = {node("n1", {{"A", 100}}), node("n2", {{"A", 2000}})};
  out = p->step(in);
  CHECK(budget(out, "n1", "A") == Approx(100));
  CHECK(budget(out, "n2", "A") == Approx(900));
  // Unused share goes to those with demand; the sum is always the limit.
  in.nodes = {node("n1", {{"A", 100}}), node("n2", {{"A", 300}})};
  out = p->step(in);
  CHECK(budget(out, "n1", "A") + budget(out, "n2", "A") == Approx(1000));
  CHECK(budget(out, "n2", "A") == Approx(750));
  CHECK(out.decisions.at("n1").budgets.at(0).channel == "app");
  CHECK(out.decisions.at("n1").budgets.at(0).object == "limit");
  CHECK(out.decisions.at("n1").budgets.at(0).field == "rate");
}

TEST_CASE(
    "global-rate: a node whose lease expired gets nothing; its share goes to the rest "
    "but its fallback, reserved while it may still run",
    "[cluster]") {
  json cfg = kGlobal;
  cfg["departed_hold_s"] = 3;
  auto p = policy_of("global-rate", cfg);
  ClusterInput in;
  in.interval_ns = 1'000'000'000;
  in.nodes = {node("n1", {{"A", 600}}), node("n2", {{"A", 600}})};
  ClusterOutput out = p->step(in);
  CHECK(budget(out, "n1", "A") == Approx(500));
  // Every budget carries what its node falls back to without its lease: the floor.
  CHECK(out.decisions.at("n2").budgets.at(0).fallback == Approx(10));
  in.nodes = {node("n1", {{"A", 600}})};  // n2's summary is gone with its lease
  out = p->step(in);
  CHECK(out.decisions.count("n2") == 0);
  // n2 may be cut off from etcd and running at its fallback: that stays out of the split.
  CHECK(budget(out, "n1", "A") == Approx(990));
  CHECK(out.report["tenants"]["A"]["departed"] ==
        json::array({json{{"node", "n2"}, {"reserve", 10.0}}}));
  CHECK(out.report["tenants"]["A"]["reserved"] == 10.0);
  // A successor keeps the reservation.
  auto successor = policy_of("global-rate", cfg);
  REQUIRE(successor->restore(json::parse(p->state().dump())).is_ok());
  CHECK(budget(successor->step(in), "n1", "A") == Approx(990));
  // For departed_hold_s (3 steps of 1 s from the one that found it gone), then it is free.
  CHECK(budget(p->step(in), "n1", "A") == Approx(990));
  CHECK(budget(p->step(in), "n1", "A") == Approx(990));
  CHECK(budget(p->step(in), "n1", "A") == Approx(1000));
  CHECK(out.decisions.at("n1").budgets.at(0).fallback == Approx(10));
  // A node that comes back takes part again, with nothing reserved for it.
  cfg["departed_hold_s"] = 300;
  auto q = policy_of("global-rate", cfg);
  in.nodes = {node("n1", {{"A", 600}}), node("n2", {{"A", 600}})};
  q->step(in);
  in.nodes = {node("n1", {{"A", 600}})};
  CHECK(budget(q->step(in), "n1", "A") == Approx(990));
  in.nodes = {node("n1", {{"A", 600}}), node("n2", {{"A", 600}})};
  out = q->step(in);
  CHECK(budget(out, "n1", "A") + budget(out, "n2", "A") == Approx(1000));
  CHECK(out.report["tenants"]["A"]["departed"].empty());
}

TEST_CASE("cluster policies resume from their stored state", "[cluster]") {
  json cfg = kGlobal;
  cfg["gain"] = 0.5;
  auto a = policy_of("global-rate", cfg);
  ClusterInput in;
  in.nodes = {node("n1", {{"A", 1000}}), node("n2", {{"A", 1}})};
  a->step(in);
  in.nodes = {node("n1", {{"A", 1}}), node("n2", {{"A", 1000}})};
  a->step(in);
  const json stored = json::parse(a->state().dump());
  // The leader dies; its successor takes the state and steps as it would have.
  auto b = policy_of("global-rate", cfg);
  REQUIRE(b->restore(stored).is_ok());
  ClusterOutput from_a = a->step(in);
  ClusterOutput from_b = b->step(in);
  CHECK(budget(from_a, "n1", "A") == Approx(budget(from_b, "n1", "A")));
  CHECK(budget(from_a, "n2", "A") == Approx(budget(from_b, "n2", "A")));
  CHECK(a->state() == b->state());
  // From zero it would not.
  auto fresh = policy_of("global-rate", cfg);
  CHECK(budget(fresh->step(in), "n1", "A") != Approx(budget(from_a, "n1", "A")));
  // Bad state is refused and changes nothing.
  const json before = b->state();
  CHECK(b->restore(json{{"steps", 1}, {"alloc", {{"A", {{"n1", -5}}}}}}).code() ==
        sluice::Code::kInvalidArgument);
  CHECK_FALSE(b->restore(json::array()).is_ok());
  // An allocation no sum survives (every later budget would be NaN).
  CHECK(b->restore(json{{"steps", 1u}, {"alloc", {{"A", {{"n1", 1e308}}}}}}).message() ==
        "state.alloc.A.n1: must be >= 0 and <= 1e+15, got 1e+308");
  CHECK(
      b->restore(
           json{{"steps", 1u}, {"alloc", json::object()}, {"left", {{"A", {{"n2", {1u, 1e308}}}}}}})
          .message() == "state.left.A.n2[1]: must be >= 0 and <= 1e+15, got 1e+308");
  CHECK(b->restore(json{{"steps", 1u}, {"alloc", json::object()}, {"left", {{"A", {{"n2", 5}}}}}})
            .message() == "state.left.A.n2: must be [step, reserve]");
  CHECK(b->state() == before);
}

TEST_CASE("maxmin across nodes: tenants share capacity max-min, each split by demand",
          "[cluster]") {
  auto p = policy_of("maxmin", json{{"capacity", 1000}, {"min_rate", 0}});
  ClusterInput in;
  in.nodes = {node("n1", {{"A", 800}, {"B", 100}}), node("n2", {{"A", 400}})};
  ClusterOutput out = p->step(in);
  // B wants 100 < its fair half: it gets 100; A gets the other 900, split max-min
  // across its nodes: n2 wants 400 < 450, n1 takes the rest.
  CHECK(budget(out, "n1", "B") == Approx(100));
  CHECK(budget(out, "n1", "A") == Approx(500));
  CHECK(budget(out, "n2", "A") == Approx(400));
  // Weights.
  auto w = policy_of(
      "maxmin", json{{"capacity", 900}, {"min_rate", 0}, {"tenants", {{"A", {{"weight", 2}}}}}});
  in.nodes = {node("n1", {{"A", 5000}}), node("n2", {{"B", 5000}})};
  out = w->step(in);
  CHECK(budget(out, "n1", "A") == Approx(600));
  CHECK(budget(out, "n2", "B") == Approx(300));
}

TEST_CASE("cluster policy configuration errors name the field", "[cluster]") {
  auto unknown = make_cluster_policy("pisces-x", json::object());
  REQUIRE_FALSE(unknown);
  CHECK(unknown.status().message().find("global-rate") != std::string::npos);
  auto no_tenants = make_cluster_policy("global-rate", json::object());
  REQUIRE_FALSE(no_tenants);
  CHECK(no_tenants.status().message().find("tenants") != std::string::npos);
  auto bad_limit = make_cluster_policy("global-rate", json{{"tenants", {{"A", {{"limit", -1}}}}}});
  REQUIRE_FALSE(bad_limit);
  CHECK(bad_limit.status().message().find("tenants.A.limit") != std::string::npos);
  auto bad_gain =
      make_cluster_policy("global-rate", json{{"tenants", {{"A", {{"limit", 1}}}}}, {"gain", 2}});
  REQUIRE_FALSE(bad_gain);
  CHECK(bad_gain.status().message().find("gain") != std::string::npos);
  // Fields of the wrong type: refused by name, never thrown.
  for (const char* key : {"channel", "object", "field"}) {
    auto typed = make_cluster_policy(
        "global-rate", json{{"tenants", {{"A", {{"limit", 1}, {key, json::array({1})}}}}}});
    REQUIRE_FALSE(typed);
    CHECK(typed.status().message() == std::string("cluster policy 'global-rate': tenants.A.") +
                                          key + ": must be a string, got [1]");
  }
  auto typed = make_cluster_policy("global-rate",
                                   json{{"tenants", {{"A", {{"limit", 1}}}}}, {"channel", 5}});
  REQUIRE_FALSE(typed);
  CHECK(typed.status().message() ==
        "cluster policy 'global-rate': channel: must be a string, got 5");
  auto no_capacity = make_cluster_policy("maxmin", json::object());
  REQUIRE_FALSE(no_capacity);
  CHECK(no_capacity.status().message().find("capacity") != std::string::npos);
}

TEST_CASE("summaries and decisions round-trip through JSON; bad ones name the field", "[cluster]") {
  NodeSummary s = node("n1", {{"A", 5}});
  s.seq = 7;
  auto back = summary_from_json(to_json(s));
  REQUIRE(back);
  CHECK(back->node == "n1");
  CHECK(back->seq == 7);
  REQUIRE(back->loads.size() == 1);
  CHECK(back->loads[0].demand == 5);
  CHECK_FALSE(back->loads[0].backlogged);
  s.loads[0].backlogged = true;
  back = summary_from_json(to_json(s));
  REQUIRE(back);
  CHECK(back->loads[0].backlogged);
  json old_form = to_json(s);
  old_form["loads"][0].erase("backlogged");  // a summary without the flag: not backlogged
  back = summary_from_json(old_form);
  REQUIRE(back);
  CHECK_FALSE(back->loads[0].backlogged);
  json not_bool = to_json(s);
  not_bool["loads"][0]["backlogged"] = 1;
  auto refused_flag = summary_from_json(not_bool);
  REQUIRE_FALSE(refused_flag);
  CHECK(refused_flag.status().message().find("summary.loads[0].backlogged") != std::string::npos);
  json bad = to_json(s);
  bad["loads"][0]["demand"] = "lots";
  auto refused = summary_from_json(bad);
  REQUIRE_FALSE(refused);
  CHECK(refused.status().message().find("summary.loads[0].demand") != std::string::npos);

  NodeDecision d;
  d.seq = 3;
  d.term = 9;
  d.leader = "r1";
  d.budgets.push_back({"A", "app", "limit", "rate", 1000, std::nullopt});
  d.settings.push_back({"A", "app", "fq", "weight", 2});
  d.rules["A"] = json::array({json{{"rule", "configure"}}});
  auto dback = decision_from_json(to_json(d));
  REQUIRE(dback);
  CHECK(dback->seq == 3);
  CHECK(dback->term == 9);
  CHECK(same_content(*dback, d, 0));
  NodeDecision moved = d;
  moved.budgets[0].value = 1005;
  CHECK(same_content(moved, d, 0.01));
  CHECK_FALSE(same_content(moved, d, 0.001));
  moved.budgets[0].fallback = 64;  // a new fallback is a change
  CHECK_FALSE(same_content(moved, d, 0.01));
  dback = decision_from_json(to_json(moved));
  REQUIRE(dback);
  CHECK(dback->budgets[0].fallback == 64);
  json dbad = to_json(d);
  dbad["budgets"][0].erase("object");
  auto drefused = decision_from_json(dbad);
  REQUIRE_FALSE(drefused);
  CHECK(drefused.status().message().find("decision.budgets[0].object") != std::string::npos);
}

// ---------------------------------------------------------------------------
// The node's side.

namespace {

// A local policy that sends every stage one fixed rule each step.
class Marker final : public sluice::Policy {
 public:
  std::string_view name() const noexcept override { return "marker"; }
  sluice::Status configure(const json&) override { return sluice::Status::ok(); }
  sluice::PolicyOutput step(const sluice::PolicyInput& in) override {
    sluice::PolicyOutput out;
    for (const auto& st : in.stages) {
      out.rules[st.name] =
          json{{"version", 1},
               {"rules",
                json::array({json{{"rule", "differentiate"}, {"classifiers", json::array()}}})}};
    }
    return out;
  }
  json describe() const override { return json::object(); }
};

sluice::StageView stage(const std::string& name, const std::string& tenant, double bytes,
                        double wait_s) {
  sluice::StageView v;
  v.name = name;
  v.connected_at_ns = 1;
  if (!tenant.empty()) v.labels["tenant"] = tenant;
  sluice::ChannelInfo ch;
  ch.name = "app";
  sluice::ObjectInfo o;
  o.name = "limit";
  o.type = "drl";
  ch.objects.push_back(o);
  v.info.channels.push_back(ch);
  v.stats.interval_ns = 1'000'000'000;
  sluice::ChannelStats cs;
  cs.name = "app";
  cs.total.bytes = static_cast<std::uint64_t>(bytes);
  cs.total.ops = 10;
  cs.wait.total_ns = static_cast<std::uint64_t>(wait_s * 1e9);
  v.stats.channels.push_back(cs);
  return v;
}

// The configure rules for "app"/"limit" in a batch, as rate by stage.
double rate_in(const sluice::PolicyOutput& out, const std::string& st) {
  auto it = out.rules.find(st);
  if (it == out.rules.end()) return -1;
  for (const json& r : it->second.value()["rules"]) {
    if (r.value("rule", "") == "configure") return r["config"]["rate"].get<double>();
  }
  return -1;
}

// The lease rule `st` was sent, or null.
json lease_in(const sluice::PolicyOutput& out, const std::string& st) {
  auto it = out.rules.find(st);
  if (it == out.rules.end()) return nullptr;
  for (const json& r : it->second.value()["rules"]) {
    if (r.value("rule", "") == "lease") return r;
  }
  return nullptr;
}

// Node n1's configuration, with `min_rate` (0: stages' parts are the split's alone).
ClusterNodeConfig node_n1(double min_rate = 0) {
  ClusterNodeConfig c;
  c.node = "n1";
  c.min_rate = min_rate;
  return c;
}

// A step's input over an interval of one second (its stages to be filled in).
sluice::PolicyInput one_second() {
  sluice::PolicyInput in;
  in.interval_ns = 1'000'000'000;
  return in;
}

// A node, timed on `clock`, whose lease in etcd is alive for `left` more.
std::shared_ptr<ClusterLink> leased_link(sluice::Clock& clock,
                                         std::chrono::milliseconds left = std::chrono::hours(1)) {
  auto link = std::make_shared<ClusterLink>(clock);
  link->set_lease_until_ns(clock.now_ns() +
                           std::chrono::duration_cast<std::chrono::nanoseconds>(left).count());
  return link;
}

}  // namespace

TEST_CASE("summaries and decisions of the wrong type or out of range are refused, never thrown",
          "[cluster]") {
  // Each would abort the controller or the node (an uncaught JSON type error), or
  // poison every later step (NaN budgets from sums of huge demands).
  const NodeSummary s = node("n1", {{"A", 5}});
  const std::pair<json, std::string> summaries[] = {
      {json{{"seq", "7"}},
       "summary.seq: must be an integer from 0 to 18446744073709551615, got \"7\""},
      {json{{"seq", -1}}, "summary.seq: must be an integer"},
      {json{{"loads", {{{"stages", "2"}}}}}, "summary.loads[0].stages: must be an integer"},
      {json{{"loads", {{{"demand", 1e308}}}}},
       "summary.loads[0].demand: must be a number from 0 to 1e15"},
      {json{{"loads", {{{"budget", 1e19}}}}},
       "summary.loads[0].budget: must be a number from 0 to 1e15"},
  };
  for (const auto& [patch, says] : summaries) {
    json j = to_json(s);
    j.merge_patch(patch);
    if (patch.contains("loads")) {  // merge_patch replaces arrays: patch the one load instead
      j = to_json(s);
      j["loads"][0].merge_patch(patch["loads"][0]);
    }
    auto got = summary_from_json(j);
    INFO(j.dump());
    REQUIRE_FALSE(got);
    CHECK(got.status().message().rfind(says, 0) == 0);
  }
  NodeDecision d;
  d.budgets.push_back({"A", "app", "limit", "rate", 1000, std::nullopt});
  const std::pair<json, std::string> decisions[] = {
      {json{{"seq", "3"}}, "decision.seq: must be an integer"},
      {json{{"term", 1.5}}, "decision.term: must be an integer"},
      {json{{"leader", 7}}, "decision.leader: must be a string, got 7"},
      {json{{"budgets",
             {{{"tenant", "A"}, {"channel", "app"}, {"object", "limit"}, {"value", 1e19}}}}},
       "decision.budgets[0].value: must be a number from 0 to 1e15"},
      {json{{"budgets",
             {{{"tenant", "A"},
               {"channel", "app"},
               {"object", "limit"},
               {"field", 1},
               {"value", 1}}}}},
       "decision.budgets[0].field: must be a string"},
      {json{{"budgets",
             {{{"tenant", "A"},
               {"channel", "app"},
               {"object", "limit"},
               {"value", 1},
               {"fallback", -1}}}}},
       "decision.budgets[0].fallback: must be a number from 0 to 1e15"},
      {json{{"settings",
             {{{"tenant", "A"},
               {"channel", "app"},
               {"object", "fq"},
               {"field", "weight"},
               {"value", 1},
               {"fallback", 1}}}}},
       "decision.settings[0].fallback: only a budget has one"},
  };
  for (const auto& [patch, says] : decisions) {
    json j = to_json(d);
    for (const auto& [k, v] : patch.items()) j[k] = v;
    auto got = decision_from_json(j);
    INFO(j.dump());
    REQUIRE_FALSE(got);
    CHECK(got.status().message().rfind(says, 0) == 0);
  }
}

TEST_CASE("node policy: summarises per tenant, splits a budget by demand, sends changes only",
          "[cluster]") {
  sluice::ManualClock clock;
  auto link = leased_link(clock);
  ClusterNodePolicy p(std::make_unique<Marker>(), link, node_n1());
  sluice::PolicyInput in = one_second();
  in.stages = {stage("s1", "A", 300, 0), stage("s2", "A", 100, 0), stage("s3", "", 999, 0)};
  // No decision yet: the local policy's rules alone, and a summary.
  sluice::PolicyOutput out = p.step(in);
  CHECK(rate_in(out, "s1") == -1);
  CHECK(out.rules.at("s1").value()["rules"].size() == 1);
  auto s = link->summary();
  REQUIRE(s);
  REQUIRE(s->loads.size() == 1);  // s3 has no tenant
  CHECK(s->loads[0].tenant == "A");
  CHECK(s->loads[0].stages == 2);
  CHECK(s->loads[0].service == Approx(400));
  CHECK(s->loads[0].demand == Approx(440));  // headroom 0.1
  CHECK_FALSE(s->loads[0].backlogged);
  CHECK(out.report["cluster"]["decision_seq"] == 0);

  NodeDecision d;
  d.seq = 1;
  d.budgets.push_back({"A", "app", "limit", "rate", 4000, std::nullopt});
  link->set_decision(d);
  out = p.step(in);
  // Split 330:110 by demand, with the surplus in proportion: 3000 and 1000.
  CHECK(rate_in(out, "s1") == Approx(3000));
  CHECK(rate_in(out, "s2") == Approx(1000));
  CHECK(rate_in(out, "s3") == -1);
  // The local policy's rule is kept, first.
  CHECK(out.rules.at("s1").value()["rules"][0]["rule"] == "differentiate");
  REQUIRE(link->summary());
  CHECK(link->summary()->loads[0].budget == 4000);
  // Nothing changed: nothing more from the cluster.
  out = p.step(in);
  CHECK(rate_in(out, "s1") == -1);
  // A throttled stage (it waited) wants more than it got.
  in.stages = {stage("s1", "A", 3000, 0.5), stage("s2", "A", 100, 0)};
  out = p.step(in);
  CHECK(link->summary()->loads[0].demand == Approx(3000 * 1.5 + 110));
  CHECK(link->summary()->loads[0].backlogged);
  CHECK(rate_in(out, "s1") > 3000);
  // A budget above what both want: the part nobody claims goes to the stage
  // held back, not to the one that would leave it unused.
  d.seq = 2;
  d.budgets[0].value = 10000;
  link->set_decision(d);
  in.stages = {stage("s1", "A", 3890, 0.5), stage("s2", "A", 100, 0)};  // at its rate
  out = p.step(in);
  CHECK(rate_in(out, "s1") == Approx(10000 - 110));
  CHECK(rate_in(out, "s2") == -1);  // still 110, as under the last budget: not resent
  // A stage that waited but served well under its rate (9890) waited only for a
  // while, as when the tail of a demand gone drains: not held back.
  in.stages = {stage("s1", "A", 1000, 0.1), stage("s2", "A", 100, 0)};
  out = p.step(in);
  CHECK_FALSE(link->summary()->loads[0].backlogged);
  CHECK(link->summary()->loads[0].demand == Approx(1100 + 110));
}

TEST_CASE("node policy: a stage that refused a batch gets every value again", "[cluster]") {
  // A budget the stage refused is not in force: the node must not count it as sent,
  // or a later decision with the same budget is never sent and the stage keeps its
  // old rate while the cluster believes the budget in force.
  sluice::ManualClock clock;
  auto link = leased_link(clock);
  ClusterNodePolicy p(std::make_unique<Marker>(), link, node_n1());
  sluice::PolicyInput in = one_second();
  in.stages = {stage("s1", "A", 300, 0)};
  NodeDecision d;
  d.seq = 1;
  d.budgets.push_back({"A", "app", "limit", "rate", 4000, std::nullopt});
  link->set_decision(d);
  CHECK(rate_in(p.step(in), "s1") == Approx(4000));
  CHECK(rate_in(p.step(in), "s1") == -1);  // sent: not again
  in.stages[0].rules_refused = 1;          // the daemon saw it refuse that batch
  CHECK(rate_in(p.step(in), "s1") == Approx(4000));
  CHECK(rate_in(p.step(in), "s1") == -1);  // the count is the same: sent once more only
}

TEST_CASE("node policy: a new stage is admitted with its part of the budget", "[cluster]") {
  sluice::ManualClock clock;
  auto link = leased_link(clock);
  ClusterNodePolicy p(std::make_unique<Marker>(), link, node_n1(65536));
  sluice::PolicyInput in;
  in.stages = {stage("s1", "A", 0, 0)};
  CHECK(p.admit(in).value().is_null());  // no decision: nothing
  NodeDecision d;
  d.seq = 1;
  d.budgets.push_back({"A", "app", "limit", "rate", 5000, std::nullopt});
  link->set_decision(d);
  sluice::RulesBatch b = p.admit(in);
  REQUIRE_FALSE(b.value().is_null());
  CHECK(b.value()["rules"][0]["config"]["rate"] == 5000);
  in.stages = {stage("s9", "B", 0, 0)};
  CHECK(p.admit(in).value().is_null());  // another tenant: nothing
}

TEST_CASE("node policy: budgets are leases that end with the node's own lease", "[cluster]") {
  sluice::ManualClock clock;
  auto link = leased_link(clock, std::chrono::seconds(10));
  ClusterNodeConfig cfg = node_n1();
  ClusterNodePolicy p(std::make_unique<Marker>(), link, cfg);
  sluice::PolicyInput in = one_second();
  in.stages = {stage("s1", "A", 300, 0), stage("s2", "A", 100, 0)};
  NodeDecision d;
  d.seq = 1;
  d.budgets.push_back({"A", "app", "limit", "rate", 4000, 1000});
  link->set_decision(d);
  sluice::PolicyOutput out = p.step(in);
  CHECK(rate_in(out, "s1") == Approx(3000));
  // Each stage's part holds until the node's lease would end (less the margin), then
  // falls back to an equal part of the budget's fallback.
  json lease = lease_in(out, "s1");
  REQUIRE(lease.is_object());
  CHECK(lease["ms"].get<int>() <= 10000 - 100);
  CHECK(lease["ms"].get<int>() > 9000);
  CHECK(lease["fallback"] == json::array({json{{"rule", "configure"},
                                               {"channel", "app"},
                                               {"object", "limit"},
                                               {"config", {{"rate", 500}}}}}));
  CHECK(out.report["cluster"]["fallen_back"] == false);
  // Nothing changed: the lease alone, renewed.
  out = p.step(in);
  CHECK(rate_in(out, "s1") == -1);
  CHECK(lease_in(out, "s1").is_object());
  // The node's lease is gone (etcd unreachable for a lease): the node enforces the
  // fallback itself, and says so.
  link->set_lease_until_ns(clock.now_ns() - 1'000'000'000);
  out = p.step(in);
  CHECK(rate_in(out, "s1") == Approx(500));
  CHECK(rate_in(out, "s2") == Approx(500));
  CHECK(lease_in(out, "s1").is_null());
  CHECK(link->summary()->loads[0].budget == Approx(1000));
  CHECK(out.report["cluster"]["fallen_back"] == true);
  CHECK(out.report["cluster"]["lease_left_ms"].is_null());
  // Back: the budget's parts again, under a lease.
  link->set_lease_until_ns(clock.now_ns() + 10'000'000'000);
  out = p.step(in);
  CHECK(rate_in(out, "s1") == Approx(3000));
  CHECK(lease_in(out, "s1").is_object());
  // A stage whose lease ran out between two steps (the daemon was stopped) holds the
  // fallback: every value is sent again, changed or not.
  link->set_lease_until_ns(clock.now_ns() + 150'000'000);
  out = p.step(in);
  REQUIRE(lease_in(out, "s1").is_object());
  CHECK(lease_in(out, "s1")["ms"].get<int>() == 50);
  clock.advance(50'000'000);  // the stages' lease runs out before the next step
  link->set_lease_until_ns(clock.now_ns() + 10'000'000'000);
  out = p.step(in);
  CHECK(rate_in(out, "s1") == Approx(3000));
  CHECK(rate_in(out, "s2") == Approx(1000));
  // A decision without fallbacks (an older controller's): min_rate per stage.
  d.seq = 2;
  d.budgets[0].fallback.reset();
  link->set_decision(d);
  cfg.min_rate = 700;
  ClusterNodePolicy q(std::make_unique<Marker>(), link, cfg);
  out = q.step(in);
  CHECK(lease_in(out, "s1")["fallback"][0]["config"]["rate"] == 700);
}

TEST_CASE("node configuration: defaults, errors name the field", "[cluster]") {
  auto c = parse_cluster_node_config(json{{"etcd", "http://127.0.0.1:2379"}, {"node", "n1"}});
  REQUIRE(c);
  CHECK(c->cluster == "default");
  CHECK(c->lease_s == 3);
  auto many = parse_cluster_node_config(
      json{{"etcd", {"http://a:1", "http://b:2"}}, {"node", "n1"}, {"cluster", "c"}});
  REQUIRE(many);
  CHECK(many->etcd.size() == 2);
  struct Bad {
    json doc;
    std::string field;
  };
  for (const Bad& b : std::vector<Bad>{
           {json{{"node", "n1"}}, "etcd"},
           {json{{"etcd", "x:1"}}, "node"},
           {json{{"etcd", "x:1"}, {"node", "a/b"}}, "node"},
           {json{{"etcd", "x:1"}, {"node", "n"}, {"lease_s", 0}}, "lease_s"},
           {json{{"etcd", "x:1"}, {"node", "n"}, {"lease_s", 1}, {"interval_ms", 1000}}, "lease_s"},
           {json{{"etcd", "x:1"}, {"node", "n"}, {"probe", 0.5}}, "probe"},
           {json{{"etcd", "x:1"}, {"node", "n"}, {"colour", 1}}, "colour"},
       }) {
    auto r = parse_cluster_node_config(b.doc);
    REQUIRE_FALSE(r);
    CHECK(r.status().message().find(b.field) != std::string::npos);
  }
  CHECK(split_endpoints("a:1,,b:2") == std::vector<std::string>{"a:1", "b:2"});
  CHECK(node_key("c", "n1") == "/sluice/c/nodes/n1");
  CHECK(decision_key("c", "n1") == "/sluice/c/decisions/n1");
}
