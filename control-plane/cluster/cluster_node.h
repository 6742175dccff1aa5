// The node role of `sluice serve --cluster FILE` (docs/cluster.md).
// ClusterNodePolicy wraps the local policy (DaemonOptions::wrap_policy, so
// reloads keep it): each step it summarises the stages per tenant and
// channel, runs the local policy, and adds what the controller decided for
// this node, sending only what changed. ClusterNode, the agent, publishes the
// summary under a lease and watches the node's decisions, each on a thread of
// its own. Fail-static: without etcd the last decision stays in force (a
// deleted decision key too) and both threads retry with backoff.
//
// Thread safety: ClusterLink is shared by the daemon's loop thread (the
// policy) and the agent's threads, under its mutex. ClusterNodePolicy is a
// Policy (one thread at a time). ClusterNode::start and stop from one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster_policy.h"
#include "etcd_client.h"
#include "sluice/clock.h"
#include "sluice/policy.h"
#include "sluice/status.h"
#include "sluice/thread_annotations.h"

namespace sluice::control {
struct DaemonOptions;
}

namespace sluice::cluster {

struct ClusterNodeConfig {
  std::vector<std::string> etcd;  // endpoints, at least one
  std::string cluster = "default";
  std::string node;  // required: unique in the cluster
  int interval_ms = 1000;
  int lease_s = 3;  // the summary's lease: a node silent this long is gone
  int timeout_ms = 1000;
  std::string tenant_label = "tenant";
  // Demand: a channel held back (it waited at least throttle_wait seconds
  // per second and served at least 90% of its rate) wants probe x what it
  // got or had; any other, what it got x (1 + headroom).
  double headroom = 0.1;
  double probe = 1.5;
  double throttle_wait = 0.02;
  double min_rate = 65536;   // the least share of a budget a stage gets
  double hysteresis = 0.01;  // a value moving less than this fraction is not resent
  // Budgets as leases that end with the node's own (docs/cluster.md, "Partitions").
  // false: a budget stays in force while the node is cut off (the global limit then
  // holds only while every node reaches etcd).
  bool budget_leases = true;
};

// Errors name the field; unknown fields are errors.
StatusOr<ClusterNodeConfig> parse_cluster_node_config(const nlohmann::json& j);
StatusOr<ClusterNodeConfig> load_cluster_node_config(const std::string& path);

// "a,b,c" -> {"a", "b", "c"} (empty parts dropped): endpoints as flags give them.
std::vector<std::string> split_endpoints(const std::string& list);

// The etcd keys of a cluster (docs/cluster.md).
std::string cluster_prefix(const std::string& cluster);
std::string node_key(const std::string& cluster, const std::string& node);
std::string decision_key(const std::string& cluster, const std::string& node);

// What the policy and the agent share.
class ClusterLink {
 public:
  void publish(NodeSummary summary) SLUICE_EXCLUDES(mu_);
  std::optional<NodeSummary> summary() const SLUICE_EXCLUDES(mu_);
  void set_decision(NodeDecision d) SLUICE_EXCLUDES(mu_);
  std::shared_ptr<const NodeDecision> decision() const SLUICE_EXCLUDES(mu_);
  void set_reachable(bool reachable) { reachable_.store(reachable, std::memory_order_relaxed); }
  bool reachable() const { return reachable_.load(std::memory_order_relaxed); }
  // Until when the node's lease in etcd is sure to be alive, in clock() ns: when the
  // renewal etcd last confirmed was sent, plus the TTL etcd gave it (0: none). The
  // node's budgets are leases that end then (docs/cluster.md, "Partitions").
  void set_lease_until_ns(std::int64_t ns) { lease_until_ns_.store(ns, std::memory_order_relaxed); }
  std::int64_t lease_until_ns() const { return lease_until_ns_.load(std::memory_order_relaxed); }
  // The clock leases are timed on: system_clock() (steady), or a test's.
  explicit ClusterLink(sluice::Clock& clock = system_clock()) : clock_(&clock) {}
  sluice::Clock& clock() const { return *clock_; }

 private:
  sluice::Clock* const clock_;
  mutable Mutex mu_;
  std::optional<NodeSummary> summary_ SLUICE_GUARDED_BY(mu_);
  std::shared_ptr<const NodeDecision> decision_ SLUICE_GUARDED_BY(mu_);
  std::atomic<bool> reachable_{false};
  std::atomic<std::int64_t> lease_until_ns_{0};
};

class ClusterNodePolicy final : public Policy {
 public:
  ClusterNodePolicy(std::unique_ptr<Policy> inner, std::shared_ptr<ClusterLink> link,
                    ClusterNodeConfig config);
  std::string_view name() const noexcept override { return inner_->name(); }
  Status configure(const nlohmann::json& config) override { return inner_->configure(config); }
  PolicyOutput step(const PolicyInput& input) override;
  RulesBatch admit(const PolicyInput& input) override;
  nlohmann::json describe() const override;
  nlohmann::json explain() const override { return inner_->explain(); }

 private:
  struct StageMemory {
    std::int64_t connected_at_ns = 0;
    std::map<std::string, double> sent;    // "channel/object/field" -> value
    std::uint64_t rules_seq = 0;           // the decision whose rules batch it got
    std::map<std::string, double> demand;  // by channel, last step
    std::map<std::string, bool> held;      // by channel: held back last step
    std::uint64_t refused = 0;             // StageView::rules_refused when last seen
    std::int64_t lease_end_ns = 0;         // when the lease it was last sent runs out (0: none)
  };
  // What one stage is to hold: its values by key, and what its budgets' values fall
  // back to when their lease runs out.
  struct StageValues {
    std::map<std::string, double> values;
    std::map<std::string, double> fallback;
  };
  StageMemory& memory_of(const StageView& st);
  // The rules (configure rules, a lease over the budgets' values, then rules batches'
  // rules) `st` needs under decision `d`, given what was computed for it; updates its
  // memory. `all`: send everything, changed or not. `lease`: how long the budgets hold
  // (none: the node's lease is gone, and `v.values` are already the fallback).
  nlohmann::json rules_for(const StageView& st, const NodeDecision& d, const StageValues& v,
                           std::optional<std::chrono::milliseconds> lease, bool all);
  // How long a lease sent now may last: until the node's lease, less kLeaseMargin; none
  // when that is under 1 ms.
  std::optional<std::chrono::milliseconds> lease_left() const;
  // One stage's part of what budget `b` falls back to, shared by `stages` stages: an
  // equal part of b.fallback, else min_rate.
  double fallback_part(const Budget& b, std::size_t stages) const;

  // What a stage's lease is short of the node's: the time a rules message may take to
  // reach the stage and be applied.
  static constexpr std::chrono::milliseconds kLeaseMargin{100};
  // The longest lease a rule may carry (docs/rules.md).
  static constexpr std::int64_t kMaxLeaseMs = 86'400'000;

  std::unique_ptr<Policy> inner_;
  std::shared_ptr<ClusterLink> link_;
  ClusterNodeConfig cfg_;
  std::uint64_t seq_ = 0;
  std::map<std::string, StageMemory> stages_;
};

class ClusterNode {
 public:
  // Checks the configuration and starts the agent's threads.
  static StatusOr<std::unique_ptr<ClusterNode>> start(ClusterNodeConfig config);
  ~ClusterNode();  // stops
  ClusterNode(const ClusterNode&) = delete;
  ClusterNode& operator=(const ClusterNode&) = delete;

  // Makes the daemon wrap every policy it installs in a ClusterNodePolicy.
  void attach(control::DaemonOptions& options) const;
  // Withdraws from the cluster: stops the threads, revokes the lease (the
  // node's summary goes at once rather than when the lease runs out).
  void stop();
  const std::shared_ptr<ClusterLink>& link() const { return link_; }

 private:
  explicit ClusterNode(ClusterNodeConfig config, std::unique_ptr<EtcdClient> etcd);
  void publish_loop();
  void watch_loop();
  // Sleeps `d` or until stop().
  void pause(std::chrono::milliseconds d);
  // Logs when reachability changes (once per change).
  void note(bool ok, const Status& why);

  ClusterNodeConfig cfg_;
  std::unique_ptr<EtcdClient> etcd_;
  std::shared_ptr<ClusterLink> link_;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> lease_{0};
  Mutex mu_;
  std::condition_variable cv_;
  int state_ SLUICE_GUARDED_BY(mu_) = 0;  // 0: unknown, 1: reachable, -1: not
  std::thread publisher_;
  std::thread watcher_;
};

}  // namespace sluice::cluster
