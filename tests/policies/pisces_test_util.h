// What the Pisces tests share: a fluid model of fair-queued stages that
// runs the policy step by step and checks its invariants, and readers of
// the batches it sends.
#pragma once

#include "pisces/pisces.h"
#include "pisces/pisces_swap.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "water_fill.h"

namespace sluice {
namespace {

using nlohmann::json;

using sluice::testing::kInf;
using sluice::testing::kSecond;

// ---------------------------------------------------------------------------
// A fluid model of stages, each with one fq object (channel "app", object
// "fq") serving 1 s of work per second by weighted max-min over its flows'
// demands (shares of its capacity per second; kInf: as much as it gets).
// Each step serves one second, advances the fq's cumulative counters as the
// object's collect() reports them, runs the policy and applies its rules.

struct Flow {
  double demand = 0;
  double weight = 1;  // what the fq holds (its default until told otherwise)
  double served_ns = 0, arrived_ns = 0, backlogged_ns = 0;
  double last_served = 0;  // share served in the last second
  bool last_backlogged = false;
};

struct FqStage {
  std::map<std::uint64_t, Flow> flows;
  std::int64_t connected_at = 1;
  bool absent = false;  // misses the next step's collect
};

inline json flow_json(std::uint64_t id, const Flow& f) {
  return {{"flow", id},
          {"weight", f.weight},
          {"served_ops", 0},
          {"served_read_bytes", 0},
          {"served_write_bytes", 0},
          {"served_work_ns", std::llround(f.served_ns)},
          {"arrived_work_ns", std::llround(f.arrived_ns)},
          {"queued", f.last_backlogged ? 1 : 0},
          {"waited_ns", 0},
          {"backlogged_ns", std::llround(f.backlogged_ns)}};
}

// A stage's view with an fq object whose collect() lists `flows`.
StageView fq_view(const std::string& name, const json& flows, std::int64_t collected_at,
                  std::int64_t connected_at = 1, const std::string& channel = "app",
                  const std::string& object = "fq") {
  StageView st;
  st.name = name;
  st.connected_at_ns = connected_at;
  st.stats.stage = name;
  st.stats.interval_ns = kSecond;
  st.stats.collected_at_ns = collected_at;
  ChannelStats c;
  c.name = channel;
  ObjectStats o;
  o.name = object;
  o.type = "fq";
  o.state = {{"capacity", {{"ops", 1000}}},
             {"burst_us", 2000},
             {"flow_by", "tenant"},
             {"default_weight", 1},
             {"virtual_time", 0},
             {"queued", 0},
             {"flows", flows}};
  c.objects.push_back(o);
  st.stats.channels.push_back(c);
  return st;
}

class Cluster {
 public:
  // The swap methods' tests name no method: "mbf" unless one is given.
  explicit Cluster(json config) {
    if (!config.contains("method")) config["method"] = "mbf";
    const Status s = policy_.configure(config);
    INFO(s.to_string());
    REQUIRE(s.is_ok());
    global_ = parse_pisces_config(config).value();
  }
  PiscesPolicy& policy() { return policy_; }
  const PiscesConfig& config() const { return global_; }

  void add_stage(const std::string& name, const std::map<std::uint64_t, double>& demands) {
    FqStage& s = stages_[name];
    for (const auto& [id, d] : demands) s.flows[id].demand = d;
  }
  void remove_stage(const std::string& name) {
    stages_.erase(name);
    departed_.push_back(name);
  }
  FqStage& stage(const std::string& name) { return stages_.at(name); }
  void set_demand(const std::string& stage, std::uint64_t tenant, double d) {
    stages_.at(stage).flows.at(tenant).demand = d;
  }

  // Serves one second at every stage, then runs a policy step.
  PolicyOutput step() {
    ++now_;
    PolicyInput in;
    in.now_ns = now_ * kSecond;
    in.interval_ns = kSecond;
    in.departed = std::move(departed_);
    departed_.clear();
    for (auto& [name, s] : stages_) {
      std::vector<Claim> claims;
      for (const auto& [id, f] : s.flows) claims.push_back({f.demand, f.weight, 0});
      const std::vector<double> served = water_fill(1.0, claims);
      std::size_t i = 0;
      json flows = json::array();
      for (auto& [id, f] : s.flows) {
        const double got = served[i++];
        f.last_served = got;
        f.last_backlogged = got < f.demand - 1e-9;
        f.served_ns += got * 1e9;
        f.arrived_ns += (std::isfinite(f.demand) ? f.demand : got) * 1e9;
        f.backlogged_ns += f.last_backlogged ? 1e9 : 0;
        flows.push_back(flow_json(id, f));
      }
      if (s.absent) continue;
      in.stages.push_back(fq_view(name, flows, now_ * kSecond, s.connected_at));
    }
    PolicyOutput out = policy_.step(in);
    for (const auto& [name, batch] : out.rules) apply(name, batch);
    return out;
  }

  void apply(const std::string& name, const RulesBatch& batch) {
    for (const json& r : batch["rules"]) {
      REQUIRE(r["rule"] == "configure");
      REQUIRE(r["channel"] == "app");
      REQUIRE(r["object"] == "fq");
      for (const auto& [k, v] : r["config"].items()) {
        REQUIRE(k.rfind("weight_", 0) == 0);
        const double w = v.get<double>();
        REQUIRE(w >= PiscesPolicy::kMinWeight);
        REQUIRE(w <= PiscesPolicy::kMaxWeight);
        stages_.at(name).flows[std::stoull(k.substr(7))].weight = w;
      }
    }
  }

  // What a tenant was served in the last second, over all stages.
  double service(std::uint64_t tenant) const {
    double sum = 0;
    for (const auto& [name, s] : stages_) {
      if (auto it = s.flows.find(tenant); it != s.flows.end()) sum += it->second.last_served;
    }
    return sum;
  }
  std::set<std::uint64_t> tenants() const {
    std::set<std::uint64_t> out;
    for (const auto& [name, s] : stages_) {
      for (const auto& [id, f] : s.flows) out.insert(id);
    }
    return out;
  }
  // Min-max ratio of the tenants' service over their global weights.
  double mmr() const {
    double lo = kInf, hi = 0;
    for (std::uint64_t t : tenants()) {
      const double n = service(t) / global_.global_weight(t);
      lo = std::min(lo, n);
      hi = std::max(hi, n);
    }
    return hi > 0 ? lo / hi : 0;
  }
  double weight(const std::string& stage, std::uint64_t tenant) const {
    return stages_.at(stage).flows.at(tenant).weight;
  }

  // The invariant of method "maxmin": every tenant's sum over its stages is
  // its global weight times their number, every weight within the fq's
  // bounds and at least the tenant's floor (stage totals may change).
  void check_tenant_sums() const {
    std::map<std::uint64_t, double> sum;
    std::map<std::uint64_t, int> count;
    for (const auto& [stage, weights] : policy_.local_weights()) {
      for (const auto& [id, w] : weights) {
        const double g = global_.global_weight(id);
        CHECK(w >= std::max(PiscesPolicy::kMinWeight, global_.floor * g) * (1 - 1e-9));
        CHECK(w <= PiscesPolicy::kMaxWeight);
        sum[id] += w;
        ++count[id];
      }
    }
    for (const auto& [id, s] : sum) {
      INFO("tenant " << id);
      CHECK(s == Approx(global_.global_weight(id) * count[id]).epsilon(1e-9));
    }
  }

  // The invariants the policy keeps over the weights it holds: every
  // tenant's sum over its stages is its global weight times their number,
  // every stage's total is the sum of its tenants' global weights, and every
  // weight is within the fq's bounds and at least the tenant's floor.
  void check_invariants() const {
    const auto local = policy_.local_weights();
    std::map<std::uint64_t, double> sum;
    std::map<std::uint64_t, int> count;
    for (const auto& [stage, weights] : local) {
      double total = 0, due = 0;
      for (const auto& [id, w] : weights) {
        const double g = global_.global_weight(id);
        CHECK(w >= std::max(PiscesPolicy::kMinWeight, global_.floor * g) * (1 - 1e-9));
        CHECK(w <= PiscesPolicy::kMaxWeight);
        total += w;
        due += g;
        sum[id] += w;
        ++count[id];
      }
      INFO("stage " << stage);
      CHECK(total == Approx(due).epsilon(1e-9));
    }
    for (const auto& [id, s] : sum) {
      INFO("tenant " << id);
      CHECK(s == Approx(global_.global_weight(id) * count[id]).epsilon(1e-9));
    }
  }

 private:
  PiscesPolicy policy_;
  PiscesConfig global_;
  std::map<std::string, FqStage> stages_;
  std::vector<std::string> departed_;
  std::int64_t now_ = 0;
};

// The weights a batch sets, by tenant.
inline std::map<std::uint64_t, double> weights_in(const RulesBatch& b) {
  std::map<std::uint64_t, double> out;
  for (const json& r : b["rules"]) {
    for (const auto& [k, v] : r["config"].items()) out[std::stoull(k.substr(7))] = v;
  }
  return out;
}

}  // namespace
}  // namespace sluice
