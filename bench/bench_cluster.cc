// sluice-bench-cluster: what a cluster of many nodes costs, without etcd.
//
//   node side   one node's ClusterNodePolicy step over S simulated stages
//               (T tenants, 2 channel classes each): the summary it builds
//               and its encoded size, the time per step.
//   controller  one leader step over N such summaries: decoding them from
//               JSON, the cluster policy's step (--policy: global-rate, the
//               default, with a limit per tenant; maxmin with a capacity;
//               pisces with global weights 1..3 and measured node
//               capacities), encoding every node's decision; the time per
//               step and per node, and the bytes written per step.
//
// The stages are views as the daemon hands them to its policy (no sockets):
// this is the cost of the cluster's own work, on top of the daemon's loop.
//
// With --etcd URL it also plays the N nodes against a real etcd for
// --seconds D: one lease for all, every node's summary put once per
// --interval-ms from four threads (what N node daemons write), and reports
// the puts per second etcd took, their latency, and the intervals that ran
// late. A `sluice cluster` leader pointed at the same etcd and cluster
// (--cluster, default "sim") then steps over N live nodes: what the scale
// run of the cluster example measures. With an interval shorter than the puts
// take (--interval-ms 1) the threads put back to back until --seconds are
// up: what one etcd member sustains (the example's write ceiling). Prints one
// JSON object.
//
//   sluice-bench-cluster [--nodes N] [--stages S] [--tenants T] [--steps K] [--quick]
//                        [--policy global-rate|maxmin|pisces]
//                        [--etcd URL --seconds D --interval-ms MS --cluster NAME]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "cluster_node.h"
#include "cluster_policy.h"
#include "etcd_client.h"
#include "sluice/policy.h"

using namespace sluice::cluster;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

class Idle final : public sluice::Policy {
 public:
  std::string_view name() const noexcept override { return "idle"; }
  sluice::Status configure(const json&) override { return sluice::Status::ok(); }
  sluice::PolicyOutput step(const sluice::PolicyInput&) override { return {}; }
  json describe() const override { return json::object(); }
};

sluice::StageView make_stage(int i, int tenants, std::mt19937& rng) {
  sluice::StageView v;
  v.name = "stage-" + std::to_string(i);
  v.connected_at_ns = 1;
  v.labels["tenant"] = "t" + std::to_string(i % tenants);
  v.stats.interval_ns = 1'000'000'000;
  for (const char* ch : {"app", "bg"}) {
    sluice::ChannelInfo ci;
    ci.name = ch;
    sluice::ObjectInfo o;
    o.name = "limit";
    o.type = "drl";
    ci.objects.push_back(o);
    v.info.channels.push_back(ci);
    sluice::ChannelStats cs;
    cs.name = ch;
    cs.total.bytes = std::uniform_int_distribution<std::uint64_t>(0, 200u << 20)(rng);
    cs.total.ops = cs.total.bytes / 4096;
    cs.wait.total_ns = std::uniform_int_distribution<std::uint64_t>(0, 50'000'000)(rng);
    v.stats.channels.push_back(cs);
  }
  return v;
}

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// The nodes' summaries put to etcd every interval for `seconds`.
json play_nodes(const std::string& url, const std::string& cluster,
                const std::vector<std::string>& texts, int seconds, int interval_ms) {
  EtcdOptions o;
  o.endpoints = {url};
  o.timeout = std::chrono::milliseconds(2000);
  auto c = EtcdClient::create(o);
  if (!c) return {{"error", c.status().message()}};
  auto lease = (*c)->lease_grant(std::max(3, 3 * interval_ms / 1000));
  if (!lease) return {{"error", lease.status().message()}};
  constexpr int kThreads = 4;
  std::vector<std::vector<double>> lat(kThreads);
  std::atomic<std::uint64_t> errors{0}, late{0};
  const auto start = Clock::now();
  const auto end = start + std::chrono::seconds(seconds);
  const auto interval = std::chrono::milliseconds(interval_ms);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (auto tick = start; tick < end && Clock::now() < end; tick += interval) {
        std::this_thread::sleep_until(tick);
        for (std::size_t n = static_cast<std::size_t>(t); n < texts.size(); n += kThreads) {
          const auto t0 = Clock::now();
          auto r = (*c)->put(node_key(cluster, "node-" + std::to_string(n)), texts[n], lease->id);
          lat[static_cast<std::size_t>(t)].push_back(us_since(t0));
          if (!r) errors.fetch_add(1);
        }
        if (Clock::now() > tick + interval) late.fetch_add(1);
        if (t == 0) (void)(*c)->lease_keepalive(lease->id);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double q) {
    return all.empty() ? 0.0
                       : all[static_cast<std::size_t>(q * static_cast<double>(all.size() - 1))];
  };
  (void)(*c)->lease_revoke(lease->id);
  return {{"seconds", secs},
          {"puts", all.size()},
          {"puts_per_s", static_cast<double>(all.size()) / secs},
          {"put_p50_us", pct(0.5)},
          {"put_p99_us", pct(0.99)},
          {"errors", errors.load()},
          {"late_intervals", late.load()}};
}

}  // namespace

int main(int argc, char** argv) {
  int nodes = 1000;
  int stages = 100;
  int tenants = 10;
  int steps = 5;
  std::string etcd_url;
  std::string cluster = "sim";
  int seconds = 10;
  int interval_ms = 1000;
  std::string policy_name = "global-rate";
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> int {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: needs a value\n", argv[i]);
        std::exit(2);
      }
      return std::atoi(argv[++i]);
    };
    if (!std::strcmp(argv[i], "--nodes")) {
      nodes = next();
    } else if (!std::strcmp(argv[i], "--stages")) {
      stages = next();
    } else if (!std::strcmp(argv[i], "--tenants")) {
      tenants = next();
    } else if (!std::strcmp(argv[i], "--steps")) {
      steps = next();
    } else if (!std::strcmp(argv[i], "--etcd") && i + 1 < argc) {
      etcd_url = argv[++i];
    } else if (!std::strcmp(argv[i], "--policy") && i + 1 < argc) {
      policy_name = argv[++i];
    } else if (!std::strcmp(argv[i], "--cluster") && i + 1 < argc) {
      cluster = argv[++i];
    } else if (!std::strcmp(argv[i], "--seconds")) {
      seconds = next();
    } else if (!std::strcmp(argv[i], "--interval-ms")) {
      interval_ms = next();
    } else if (!std::strcmp(argv[i], "--quick")) {
      nodes = 50;
      stages = 20;
      steps = 2;
    } else {
      std::fprintf(stderr,
                   "usage: sluice-bench-cluster [--nodes N] [--stages S] [--tenants T] "
                   "[--steps K] [--quick] [--policy global-rate|maxmin|pisces]\n");
      return 2;
    }
  }
  if (nodes < 1 || stages < 1 || tenants < 1 || steps < 1 || seconds < 1 || interval_ms < 1) {
    std::fprintf(stderr,
                 "--nodes, --stages, --tenants, --steps, --seconds, --interval-ms: must be >= 1\n");
    return 2;
  }
  std::mt19937 rng(1);

  // Node side: one node's policy step over its stages.
  auto link = std::make_shared<ClusterLink>();
  ClusterNodeConfig cfg;
  cfg.node = "n0";
  ClusterNodePolicy node(std::make_unique<Idle>(), link, cfg);
  NodeDecision nd;
  nd.seq = 1;
  for (int t = 0; t < tenants; ++t) {
    nd.budgets.push_back({"t" + std::to_string(t), "app", "limit", "rate", 100e6, 65536.0});
  }
  link->set_decision(nd);
  sluice::PolicyInput in;
  in.interval_ns = 1'000'000'000;
  for (int i = 0; i < stages; ++i) in.stages.push_back(make_stage(i, tenants, rng));
  (void)node.step(in);  // the first step sends everything
  auto t0 = Clock::now();
  for (int k = 0; k < steps; ++k) (void)node.step(in);
  const double node_step_us = us_since(t0) / steps;
  const NodeSummary summary = *link->summary();
  const std::string summary_text = to_json(summary).dump();

  // Controller side: N summaries like that one (demands varied), one policy.
  std::vector<std::string> texts;
  for (int n = 0; n < nodes; ++n) {
    NodeSummary s = summary;
    s.node = "node-" + std::to_string(n);
    for (TenantLoad& l : s.loads) {
      l.demand *= std::uniform_real_distribution<double>(0.1, 2.0)(rng);
    }
    texts.push_back(to_json(s).dump());
  }
  json tcfg = json::object();
  json pcfg;
  if (policy_name == "pisces") {
    for (int t = 0; t < tenants; ++t) tcfg["t" + std::to_string(t)] = {{"weight", 1 + t % 3}};
    pcfg = {{"capacity", "measured"}, {"tenants", tcfg}};
  } else if (policy_name == "maxmin") {
    pcfg = {{"capacity", 1e9 * nodes}};
  } else {
    for (int t = 0; t < tenants; ++t) tcfg["t" + std::to_string(t)] = {{"limit", 1e9}};
    pcfg = {{"tenants", tcfg}};
  }
  auto policy = make_cluster_policy(policy_name, pcfg);
  if (!policy) {
    std::fprintf(stderr, "%s\n", policy.status().message().c_str());
    return 1;
  }
  double decode_us = 0, step_us = 0, encode_us = 0, state_us = 0;
  std::size_t decision_bytes = 0, state_bytes = 0;
  for (int k = 0; k < steps; ++k) {
    ClusterInput cin;
    cin.interval_ns = 1'000'000'000;
    t0 = Clock::now();
    for (const std::string& t : texts) {
      auto s = summary_from_json(json::parse(t));
      if (!s) return 1;
      cin.nodes.push_back(std::move(*s));
    }
    decode_us += us_since(t0);
    t0 = Clock::now();
    ClusterOutput out = (*policy)->step(cin);
    step_us += us_since(t0);
    t0 = Clock::now();
    decision_bytes = 0;
    for (auto& [n, d] : out.decisions) decision_bytes += to_json(d).dump().size();
    encode_us += us_since(t0);
    t0 = Clock::now();
    state_bytes = (*policy)->state().dump().size();
    state_us += us_since(t0);
  }
  const double total_us = (decode_us + step_us + encode_us + state_us) / steps;
  json report{{"policy", policy_name},
              {"nodes", nodes},
              {"stages_per_node", stages},
              {"tenants", tenants},
              {"node",
               {{"step_us", node_step_us},
                {"summary_bytes", summary_text.size()},
                {"loads", summary.loads.size()}}},
              {"controller",
               {{"step_us", total_us},
                {"per_node_us", total_us / nodes},
                {"decode_us", decode_us / steps},
                {"policy_us", step_us / steps},
                {"encode_us", encode_us / steps},
                {"state_us", state_us / steps},
                {"decision_bytes_per_step", decision_bytes},
                {"state_bytes", state_bytes},
                {"cpu_pct_at_1hz", total_us / 1e4}}}};
  if (!etcd_url.empty()) {
    report["etcd"] = play_nodes(etcd_url, cluster, texts, seconds, interval_ms);
    if (report["etcd"].contains("error")) {
      std::fprintf(stderr, "%s\n", report["etcd"]["error"].get<std::string>().c_str());
      return 1;
    }
  }
  std::printf("%s\n", report.dump(2).c_str());
  return 0;
}
