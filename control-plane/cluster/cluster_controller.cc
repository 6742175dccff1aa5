// The cluster controller (cluster_controller.h): election, the leader's
// fenced steps, the policy's state in etcd, and `sluice cluster`.
#include "cluster_controller.h"

#include <unistd.h>

#include <pthread.h>
#include <signal.h>

#include <csignal>
#include <cstdio>
#include <thread>

#include <spdlog/spdlog.h>

#include "cluster_node.h"
#include "daemon.h"
#include "policy_doc.h"
#include "sluice/config_reader.h"
#include "sluice/json_text.h"

namespace sluice::cluster {

using json = nlohmann::json;
using std::chrono::milliseconds;

namespace {

std::string election_name(const std::string& cluster) {
  return cluster_prefix(cluster) + "election";
}
std::string state_key(const std::string& cluster) {
  return cluster_prefix(cluster) + "state";
}

}  // namespace

Status read_controller_doc(const json& doc, ControllerOptions& o) {
  if (!doc.is_object()) return Status::invalid("cluster policy: must be a JSON object");
  for (const auto& [k, v] : doc.items()) {
    if (k != "policy" && k != "interval_ms" && k != "lease_s" && k != "hysteresis" &&
        k != "config") {
      return Status::invalid("cluster policy: unknown field '" + k + "'");
    }
  }
  ControllerOptions n = o;
  auto p = doc.find("policy");
  if (p == doc.end() || !p->is_string()) return Status::invalid("policy: required, a name");
  n.policy = p->get<std::string>();
  if (auto c = doc.find("config"); c != doc.end()) n.config = *c;
  if (auto i = doc.find("interval_ms"); i != doc.end()) {
    if (!i->is_number_integer() || i->get<long long>() < 10 ||
        i->get<long long>() > control::kMaxIntervalMs) {
      return Status::invalid("interval_ms: an integer in 10.." +
                             std::to_string(control::kMaxIntervalMs));
    }
    n.interval_ms = i->get<int>();
  }
  if (auto l = doc.find("lease_s"); l != doc.end()) {
    if (!l->is_number_integer() || l->get<long long>() < 1 || l->get<long long>() > 3600) {
      return Status::invalid("lease_s: an integer in 1..3600");
    }
    n.lease_s = l->get<int>();
  }
  if (auto h = doc.find("hysteresis"); h != doc.end()) {
    if (!h->is_number() || !(h->get<double>() >= 0) || !(h->get<double>() < 1)) {
      return Status::invalid("hysteresis: a number in [0, 1)");
    }
    n.hysteresis = h->get<double>();
  }
  auto policy = make_cluster_policy(n.policy, n.config);
  if (!policy) return policy.status();
  o = std::move(n);
  return Status::ok();
}

ClusterController::ClusterController(ControllerOptions options, std::unique_ptr<EtcdClient> etcd)
    : opt_(std::move(options)),
      etcd_(std::move(etcd)),
      read_log_("cluster '" + opt_.cluster + "': reading node summaries"),
      ignored_log_("cluster '" + opt_.cluster + "': node summaries ignored"),
      write_log_("cluster '" + opt_.cluster + "': writing decisions") {}

ClusterController::~ClusterController() = default;

StatusOr<std::unique_ptr<ClusterController>> ClusterController::create(ControllerOptions o) {
  if (o.cluster.empty() || o.cluster.find('/') != std::string::npos) {
    return Status::invalid("cluster: a non-empty name without '/'");
  }
  if (o.lease_s < 1) return Status::invalid("lease_s: must be >= 1");
  if (o.interval_ms < 10) return Status::invalid("interval_ms: must be >= 10");
  if (o.max_txn_ops < 2) return Status::invalid("max_txn_ops: must be >= 2");
  auto policy = make_cluster_policy(o.policy, o.config);
  if (!policy) return policy.status();
  if (o.id.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    o.id = std::string(host) + "-" + std::to_string(::getpid());
  }
  EtcdOptions eo;
  eo.endpoints = o.etcd;
  eo.timeout = milliseconds(o.timeout_ms);
  auto etcd = EtcdClient::create(eo);
  if (!etcd) return etcd.status();
  return std::unique_ptr<ClusterController>(new ClusterController(std::move(o), std::move(*etcd)));
}

ControllerCounters ClusterController::counters() const {
  MutexLock lock(mu_);
  return counters_;
}

void ClusterController::stop() {
  stop_.store(true);
  MutexLock lock(mu_);
  cv_.notify_all();
}

void ClusterController::pause(milliseconds d) {
  MutexLock lock(mu_);
  cv_.wait_for(lock.native(), d, [this] { return stop_.load(); });
}

void ClusterController::keepalive_loop() {
  const milliseconds period(std::max(100, opt_.lease_s * 1000 / 3));
  while (!stop_.load()) {
    const std::int64_t lease = lease_.load();
    if (lease != 0 && !lease_lost_.load()) {
      auto ka = etcd_->lease_keepalive(lease);
      if (!ka && ka.status().code() == Code::kFailedPrecondition) {
        spdlog::warn("cluster '{}': replica '{}' lost its lease", opt_.cluster, opt_.id);
        lease_lost_.store(true);
      }
    }
    pause(period);
  }
}

Status ClusterController::run() {
  std::thread keepalive([this] { keepalive_loop(); });
  const std::string election = election_name(opt_.cluster);
  milliseconds backoff(100);
  bool said_unreachable = false;
  while (!stop_.load()) {
    if (lease_.load() == 0 || lease_lost_.load()) {
      auto l = etcd_->lease_grant(opt_.lease_s);
      if (!l) {
        if (!said_unreachable) {
          spdlog::warn("cluster '{}': replica '{}': {}; retrying", opt_.cluster, opt_.id,
                       l.status().message());
          said_unreachable = true;
        }
        pause(backoff);
        backoff = std::min(backoff * 2, milliseconds(2000));
        continue;
      }
      if (l->ttl_s != opt_.lease_s) {
        spdlog::info("cluster '{}': etcd granted a lease of {} s (asked {} s)", opt_.cluster,
                     l->ttl_s, opt_.lease_s);
      }
      lease_.store(l->id);
      lease_lost_.store(false);
    }
    auto key = etcd_->campaign(election, opt_.id, lease_.load(),
                               milliseconds(std::max(1000, opt_.lease_s * 1000)), &stop_);
    if (!key) {
      if (key.status().code() == Code::kFailedPrecondition) {
        lease_.store(0);  // the lease went while it waited: a new one
      } else if (key.status().code() != Code::kUnavailable) {
        spdlog::warn("cluster '{}': replica '{}' campaign: {}", opt_.cluster, opt_.id,
                     key.status().message());
        pause(backoff);
        backoff = std::min(backoff * 2, milliseconds(2000));
      }
      continue;
    }
    said_unreachable = false;
    backoff = milliseconds(100);
    if (stop_.load()) {
      (void)etcd_->resign(*key);
      break;
    }
    lead(*key);
  }
  if (const std::int64_t lease = lease_.exchange(0); lease != 0) (void)etcd_->lease_revoke(lease);
  keepalive.join();
  return Status::ok();
}

void ClusterController::lead(const LeaderKey& key) {
  {
    MutexLock lock(mu_);
    ++counters_.elected;
    counters_.leading = true;
    counters_.term = key.rev;
  }
  spdlog::info("cluster '{}': replica '{}' leads (term {})", opt_.cluster, opt_.id, key.rev);
  auto leave = [&](const char* why) {
    spdlog::info("cluster '{}': replica '{}' stops leading: {}", opt_.cluster, opt_.id, why);
    MutexLock lock(mu_);
    counters_.leading = false;
  };
  auto made = make_cluster_policy(opt_.policy, opt_.config);
  if (!made) {
    leave("policy refused its configuration");
    return;
  }
  std::unique_ptr<ClusterPolicy> policy = std::move(*made);
  // Resume: the policy's state and the decision sequence, and the decisions
  // in force (rewritten only when they change).
  std::uint64_t seq = 0;
  std::map<std::string, NodeDecision> written;
  for (;;) {
    if (stop_.load() || lease_lost_.load()) {
      leave(stop_.load() ? "stopping" : "lease lost");
      if (stop_.load()) (void)etcd_->resign(key);
      return;
    }
    auto st = etcd_->range(state_key(opt_.cluster));
    auto ds = st ? etcd_->range_prefix(cluster_prefix(opt_.cluster) + "decisions/") : st;
    if (!st || !ds) {
      spdlog::warn("cluster '{}': reading the stored state: {}; retrying", opt_.cluster,
                   (!st ? st.status() : ds.status()).message());
      pause(milliseconds(opt_.interval_ms));
      continue;
    }
    if (!st->kvs.empty()) {
      auto stored = parse_json_text(st->kvs.front().value);
      const json s = stored ? std::move(stored).value() : json();
      std::uint64_t stored_seq = 0;
      Status valid = !stored         ? stored.status()
                     : s.is_object() ? config::get_integer<std::uint64_t>(
                                           s, "state", "seq", &stored_seq, 0, UINT64_MAX)
                                     : Status::invalid("state: must be an object");
      if (!valid.is_ok()) {
        spdlog::warn("cluster '{}': stored state not taken ({}); starting afresh", opt_.cluster,
                     valid.message());
      } else {
        seq = stored_seq;
        auto p = s.find("policy");
        if (p != s.end() && p->is_string() && p->get_ref<const std::string&>() == policy->name()) {
          Status r = policy->restore(s.value("state", json()));
          if (!r.is_ok()) {
            spdlog::warn("cluster '{}': stored policy state not taken ({}); starting afresh",
                         opt_.cluster, r.message());
          }
        }
      }
    }
    const std::string dprefix = cluster_prefix(opt_.cluster) + "decisions/";
    for (const KeyValue& kv : ds->kvs) {
      auto j = parse_json_text(kv.value);
      if (!j) continue;
      auto d = decision_from_json(*j);
      if (d) {
        seq = std::max(seq, d->seq);
        written[kv.key.substr(dprefix.size())] = std::move(*d);
      }
    }
    break;
  }
  spdlog::info("cluster '{}': replica '{}' resumes at decision {}", opt_.cluster, opt_.id, seq);
  auto next = std::chrono::steady_clock::now();
  while (!stop_.load()) {
    if (lease_lost_.load()) {
      leave("lease lost");
      return;
    }
    if (!step_once(key, *policy, seq, written)) {
      leave("deposed: another replica leads");
      MutexLock lock(mu_);
      ++counters_.fenced;
      return;
    }
    next += milliseconds(opt_.interval_ms);
    const auto now = std::chrono::steady_clock::now();
    if (next < now) next = now;
    pause(std::chrono::duration_cast<milliseconds>(next - now));
  }
  (void)etcd_->resign(key);
  leave("stopping");
}

bool ClusterController::step_once(const LeaderKey& key, ClusterPolicy& policy, std::uint64_t& seq,
                                  std::map<std::string, NodeDecision>& written) {
  const std::string nprefix = cluster_prefix(opt_.cluster) + "nodes/";
  auto nodes = etcd_->range_prefix(nprefix);
  if (!nodes) {
    read_log_.fail(nodes.status().message());
    return true;  // no step: the nodes keep what they have
  }
  read_log_.ok();
  ClusterInput in;
  in.now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now().time_since_epoch())
                  .count();
  in.interval_ns = std::int64_t{opt_.interval_ms} * 1'000'000;
  std::string first_ignored;
  std::size_t ignored = 0;
  for (const KeyValue& kv : nodes->kvs) {
    auto j = parse_json_text(kv.value);
    auto s = j ? summary_from_json(*j) : StatusOr<NodeSummary>(j.status());
    if (!s) {
      if (ignored++ == 0) first_ignored = kv.key + ": " + s.status().message();
      continue;
    }
    s->node = kv.key.substr(nprefix.size());
    in.nodes.push_back(std::move(*s));
  }
  if (ignored > 0) {
    ignored_log_.fail(std::to_string(ignored) + " of " + std::to_string(nodes->kvs.size()) + "; " +
                      first_ignored);
  } else {
    ignored_log_.ok();
  }
  ClusterOutput out = policy.step(in);
  std::vector<TxnOp> ops;
  std::vector<std::pair<std::string, NodeDecision>> changed;
  for (auto& [node, d] : out.decisions) {
    auto it = written.find(node);
    if (it != written.end() && same_content(it->second, d, opt_.hysteresis)) continue;
    d.seq = ++seq;
    d.term = key.rev;
    d.leader = opt_.id;
    ops.push_back(
        TxnOp::put(cluster_prefix(opt_.cluster) + "decisions/" + node, to_json(d).dump()));
    changed.emplace_back(node, d);
  }
  const json state{{"policy", policy.name()},
                   {"seq", seq},
                   {"leader", opt_.id},
                   {"term", key.rev},
                   {"state", policy.state()}};
  ops.push_back(TxnOp::put(state_key(opt_.cluster), state.dump()));
  const std::vector<Compare> fence{Compare::create_revision(key.key, key.rev)};
  const std::size_t per = opt_.max_txn_ops;
  std::size_t done = 0;
  for (std::size_t i = 0; i < ops.size(); i += per) {
    const std::vector<TxnOp> chunk(
        ops.begin() + static_cast<std::ptrdiff_t>(i),
        ops.begin() + static_cast<std::ptrdiff_t>(std::min(ops.size(), i + per)));
    auto r = etcd_->txn(fence, chunk);
    if (!r) {
      write_log_.fail(r.status().message());
      break;  // what was not written is tried again next step
    }
    write_log_.ok();
    if (!r->succeeded) return false;
    done = std::min(ops.size(), i + per);
  }
  std::size_t n = 0;
  for (auto& [node, d] : changed) {
    if (n++ >= done) break;
    written[node] = std::move(d);
  }
  if (!opt_.report_log.empty()) {
    const double unix_time =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    const json line{{"unix_time", unix_time},
                    {"leader", opt_.id},
                    {"term", key.rev},
                    {"nodes", in.nodes.size()},
                    {"written", std::min(changed.size(), done)},
                    {"report", out.report}};
    if (std::FILE* f = std::fopen(opt_.report_log.c_str(), "ae")) {
      std::fputs((line.dump() + "\n").c_str(), f);
      std::fclose(f);
    } else {
      spdlog::warn("report log {}: cannot be opened", opt_.report_log);
    }
  }
  MutexLock lock(mu_);
  ++counters_.steps;
  counters_.decisions_written += std::min(changed.size(), done);
  return true;
}

// ---------------------------------------------------------------------------

int run_cluster_command(ControllerOptions o, const std::string& policy_file,
                        const std::string& log_level) {
  auto lvl = spdlog::level::from_str(log_level);
  if (lvl == spdlog::level::off && log_level != "off") {
    std::fprintf(stderr, "sluice cluster: unknown log level '%s'\n", log_level.c_str());
    return 2;
  }
  spdlog::set_level(lvl);
  auto doc = control::read_json_file(policy_file);
  if (!doc) {
    std::fprintf(stderr, "sluice cluster: %s\n", doc.status().message().c_str());
    return 2;
  }
  Status s = read_controller_doc(*doc, o);
  if (!s.is_ok()) {
    std::fprintf(stderr, "sluice cluster: %s: %s\n", policy_file.c_str(), s.message().c_str());
    return 2;
  }
  auto c = ClusterController::create(std::move(o));
  if (!c) {
    std::fprintf(stderr, "sluice cluster: %s\n", c.status().message().c_str());
    return 2;
  }
  std::signal(SIGPIPE, SIG_IGN);
  // SIGINT and SIGTERM are taken by a thread of their own (sigwait), never
  // by a handler: stopping takes a lock.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&set, &sig);
    if (!done.load()) spdlog::info("signal {}: stepping down", sig);
    (*c)->stop();
  });
  s = (*c)->run();
  done.store(true);
  ::kill(::getpid(), SIGTERM);  // ends the waiter when run() returned on its own
  waiter.join();
  if (!s.is_ok()) {
    std::fprintf(stderr, "sluice cluster: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace sluice::cluster
