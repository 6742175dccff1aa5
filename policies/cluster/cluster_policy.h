// Cluster policies: pure step functions from the nodes' summaries to what
// each node should enforce, shaped like sluice::Policy (no socket, thread or
// clock). What a policy remembers it hands out as state() and takes back with
// restore(), kept in etcd so that a new leader resumes from it. The JSON
// forms of summaries and decisions below are what nodes and the controller
// write to etcd. Built in: "global-rate", "maxmin" and "pisces"
// (docs/cluster.md, "Cluster policies").
//
// Thread safety: a ClusterPolicy instance is used by one thread at a time;
// the free functions are safe from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/status.h"

namespace sluice::cluster {

// One tenant's stages of one channel class on one node, over the node's last
// interval (rates per second).
struct TenantLoad {
  std::string tenant;
  std::string channel;
  int stages = 0;
  double demand = 0;   // bytes/s the node estimates the tenant wants there
  double service = 0;  // bytes/s served
  double ops = 0;      // requests/s served
  double wait = 0;     // seconds waited per second, over all its requests
  double budget = 0;   // bytes/s the node enforces for it now (0: none)
  // A stage of it waited at least the node's throttle_wait: held back by its
  // budget, it would take more than `demand` says.
  bool backlogged = false;
};

struct NodeSummary {
  std::string node;
  std::uint64_t seq = 0;  // the node's publication count
  double interval_s = 0;  // the interval the rates cover
  std::vector<TenantLoad> loads;
};

// A rate for a tenant on a node, split by the node among the tenant's stages
// there by their demand: `field` (default "rate") of object `object` in
// channel `channel` of each.
// A budget is a lease (docs/cluster.md, "Partitions"): a node that cannot renew its
// own lease in etcd falls back to `fallback` (split among the tenant's stages there),
// which the controller keeps reserved for it once its lease is gone; absent, the node
// falls back to its min_rate per stage.
struct Budget {
  std::string tenant;
  std::string channel;
  std::string object;
  std::string field = "rate";
  double value = 0;
  std::optional<double> fallback;
};

// A value set as is on every stage of a tenant on a node (a weight).
struct Setting {
  std::string tenant;
  std::string channel;
  std::string object;
  std::string field;
  double value = 0;
};

// The largest rate, demand, budget or setting a summary or a decision may
// carry (per second): 10^15 keeps a sum over any number of nodes finite and a
// budget's rounding to a stage's integer rate exact. A value above it is
// refused where it is read, with the field named.
inline constexpr double kMaxClusterValue = 1e15;

// What the controller decided for one node.
struct NodeDecision {
  std::uint64_t seq = 0;  // grows with every decision the cluster writes
  std::int64_t term = 0;  // the deciding leader's election revision
  std::string leader;     // the deciding controller replica
  std::vector<Budget> budgets;
  std::vector<Setting> settings;
  // A rules batch (docs/rules.md) per tenant, applied as is to every stage
  // of that tenant on the node when the decision changes.
  std::map<std::string, nlohmann::json> rules;
};

nlohmann::json to_json(const NodeSummary& s);
StatusOr<NodeSummary> summary_from_json(const nlohmann::json& j);
nlohmann::json to_json(const NodeDecision& d);
StatusOr<NodeDecision> decision_from_json(const nlohmann::json& j);
// The same decision but for seq, term and leader (what tells a change).
bool same_content(const NodeDecision& a, const NodeDecision& b, double tolerance);

struct ClusterInput {
  std::int64_t now_ns = 0;
  std::int64_t interval_ns = 0;
  std::vector<NodeSummary> nodes;  // the nodes whose leases are alive, by name
};

struct ClusterOutput {
  // Decisions by node; a node absent keeps what it was last told.
  std::map<std::string, NodeDecision> decisions;
  nlohmann::json report = nlohmann::json::object();
};

class ClusterPolicy {
 public:
  virtual ~ClusterPolicy() = default;
  virtual std::string_view name() const noexcept = 0;
  // Errors name the field.
  virtual Status configure(const nlohmann::json& config) = 0;
  virtual ClusterOutput step(const ClusterInput& input) = 0;
  // What the policy remembers, as JSON, and taking it back (a new leader's
  // first act). restore() of what state() returned resumes exactly; bad
  // state is an error and changes nothing.
  virtual nlohmann::json state() const = 0;
  virtual Status restore(const nlohmann::json& state) = 0;
  virtual nlohmann::json describe() const = 0;
};

// A configured cluster policy; an unknown name is an error listing the known.
StatusOr<std::unique_ptr<ClusterPolicy>> make_cluster_policy(std::string_view name,
                                                             const nlohmann::json& config);
std::vector<std::string> cluster_policy_names();
// The "pisces" policy, unconfigured (make_cluster_policy configures it).
std::unique_ptr<ClusterPolicy> make_pisces_cluster_policy();

// Splits `total` among claimants by their demands: each gets at least
// min(floor, total / n), nobody more than its demand while others want more
// (water_fill), and what nobody demands is shared in proportion to demand
// among the claimants `backlogged` marks (those held back, who will use it),
// or among all when none is marked or `backlogged` is empty (equally when no
// one demands anything), so the parts always sum to total. Used by the
// cluster policies across nodes and by a node across its stages.
std::vector<double> split_by_demand(double total, const std::vector<double>& demands, double floor,
                                    const std::vector<bool>& backlogged = {});

}  // namespace sluice::cluster
