// `sluice cluster`: the cluster controller (docs/cluster.md). Replicas
// campaign in an etcd election; the leader, every interval, reads the live
// nodes' summaries, runs the cluster policy and writes the changed decisions
// with the policy's state in transactions fenced by its election key, so a
// deposed leader writes nothing. A new leader restores the state and the
// decision sequence from etcd first. A replica whose lease is lost stops
// leading at once and campaigns anew; stop() resigns and revokes its lease.
//
// Thread safety: run() on one thread; stop() and counters() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster_policy.h"
#include "condition_log.h"
#include "etcd_client.h"
#include "sluice/status.h"
#include "sluice/thread_annotations.h"

namespace sluice::cluster {

struct ControllerOptions {
  std::vector<std::string> etcd;  // endpoints
  std::string cluster = "default";
  std::string id;  // this replica's name ("": host name and pid)
  std::string policy;
  nlohmann::json config = nlohmann::json::object();
  int interval_ms = 1000;
  int lease_s = 3;
  int timeout_ms = 1000;
  // A node's decision is rewritten only when a value moved more than this
  // fraction (or anything else changed).
  double hysteresis = 0.01;
  // Operations per transaction (etcd refuses more than its --max-txn-ops,
  // 128 by default): decisions beyond are written in several transactions,
  // each fenced.
  std::size_t max_txn_ops = 100;
  // "": none. Else a file the leader appends one JSON line to after every
  // step: {"unix_time", "leader", "term", "nodes", "written", "report"}
  // (the policy's report), for experiments that plot the decisions.
  std::string report_log;
};

// Reads the controller's policy document {"policy": NAME, "interval_ms": N,
// "lease_s": N, "hysteresis": X, "config": {...}} into `o` (fields absent
// keep o's); errors name the field, and the policy configures or it is one.
Status read_controller_doc(const nlohmann::json& doc, ControllerOptions& o);

struct ControllerCounters {
  std::uint64_t elected = 0;  // times this replica became leader
  std::uint64_t steps = 0;    // policy steps as leader
  std::uint64_t decisions_written = 0;
  std::uint64_t fenced = 0;  // transactions refused because it no longer led
  bool leading = false;
  std::int64_t term = 0;  // its election key's create revision while leading
};

class ClusterController {
 public:
  static StatusOr<std::unique_ptr<ClusterController>> create(ControllerOptions options);
  ~ClusterController();
  ClusterController(const ClusterController&) = delete;
  ClusterController& operator=(const ClusterController&) = delete;

  // Campaigns and leads until stop(); then resigns and revokes its lease.
  Status run();
  void stop();
  ControllerCounters counters() const SLUICE_EXCLUDES(mu_);

 private:
  explicit ClusterController(ControllerOptions options, std::unique_ptr<EtcdClient> etcd);
  // Leads until deposed or stopped.
  void lead(const LeaderKey& key);
  // One step as leader: false when the writes were fenced (deposed).
  bool step_once(const LeaderKey& key, ClusterPolicy& policy, std::uint64_t& seq,
                 std::map<std::string, NodeDecision>& written);
  void keepalive_loop();
  void pause(std::chrono::milliseconds d);

  ControllerOptions opt_;
  std::unique_ptr<EtcdClient> etcd_;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> lease_{0};
  std::atomic<bool> lease_lost_{false};
  mutable Mutex mu_;
  std::condition_variable cv_;
  ControllerCounters counters_ SLUICE_GUARDED_BY(mu_);
  // The leading loop's conditions, each logged when it starts, changes and
  // ends rather than every step (used by the loop's thread only).
  ConditionLog read_log_;
  ConditionLog ignored_log_;
  ConditionLog write_log_;
};

// `sluice cluster`: runs a replica until SIGINT or SIGTERM. Exit codes as the
// CLI's: 0, 1 runtime error, 2 usage error.
int run_cluster_command(ControllerOptions options, const std::string& policy_file,
                        const std::string& log_level);

}  // namespace sluice::cluster
