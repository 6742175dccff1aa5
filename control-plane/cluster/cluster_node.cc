// The node role (cluster_node.h): its configuration, the policy wrapper that
// summarises the stages and applies the controller's decisions, and the
// agent that publishes summaries and watches decisions in etcd.
#include "cluster_node.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <spdlog/spdlog.h>

#include "condition_log.h"
#include "daemon.h"
#include "policy_doc.h"
#include "sluice/json_text.h"

namespace sluice::cluster {

using json = nlohmann::json;

// ---------------------------------------------------------------------------
// Configuration and keys.

StatusOr<ClusterNodeConfig> parse_cluster_node_config(const json& j) {
  if (!j.is_object()) return Status::invalid("cluster config: must be a JSON object");
  static const std::set<std::string> kKnown{
      "etcd",       "cluster",      "node",         "interval_ms", "lease_s",
      "timeout_ms", "tenant_label", "headroom",     "probe",       "throttle_wait",
      "min_rate",   "hysteresis",   "budget_leases"};
  for (const auto& [k, v] : j.items()) {
    if (!kKnown.count(k)) return Status::invalid("cluster config: unknown field '" + k + "'");
  }
  ClusterNodeConfig c;
  if (auto e = j.find("etcd"); e != j.end()) {
    if (e->is_string()) {
      c.etcd = {e->get<std::string>()};
    } else if (e->is_array() && !e->empty() &&
               std::all_of(e->begin(), e->end(), [](const json& x) { return x.is_string(); })) {
      c.etcd = e->get<std::vector<std::string>>();
    } else {
      return Status::invalid("etcd: an endpoint URL or an array of them");
    }
  }
  auto str = [&](const char* key, std::string& out) -> Status {
    auto it = j.find(key);
    if (it == j.end()) return Status::ok();
    if (!it->is_string() || it->get_ref<const std::string&>().empty() ||
        it->get_ref<const std::string&>().find('/') != std::string::npos) {
      return Status::invalid(std::string(key) + ": a non-empty string without '/'");
    }
    out = it->get<std::string>();
    return Status::ok();
  };
  auto integer = [&](const char* key, int& out, int lo, int hi) -> Status {
    auto it = j.find(key);
    if (it == j.end()) return Status::ok();
    if (!it->is_number_integer() || it->get<long long>() < lo || it->get<long long>() > hi) {
      return Status::invalid(std::string(key) + ": an integer in " + std::to_string(lo) + ".." +
                             std::to_string(hi));
    }
    out = it->get<int>();
    return Status::ok();
  };
  auto number = [&](const char* key, double& out, double lo, double hi) -> Status {
    auto it = j.find(key);
    if (it == j.end()) return Status::ok();
    if (!it->is_number() || !(it->get<double>() >= lo) || !(it->get<double>() <= hi)) {
      return Status::invalid(std::string(key) + ": a number in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "]");
    }
    out = it->get<double>();
    return Status::ok();
  };
  SLUICE_RETURN_IF_ERROR(str("cluster", c.cluster));
  SLUICE_RETURN_IF_ERROR(str("node", c.node));
  SLUICE_RETURN_IF_ERROR(str("tenant_label", c.tenant_label));
  SLUICE_RETURN_IF_ERROR(integer("interval_ms", c.interval_ms, 10, control::kMaxIntervalMs));
  SLUICE_RETURN_IF_ERROR(integer("lease_s", c.lease_s, 1, 3600));
  SLUICE_RETURN_IF_ERROR(integer("timeout_ms", c.timeout_ms, 1, control::kMaxTimeoutMs));
  SLUICE_RETURN_IF_ERROR(number("headroom", c.headroom, 0, 100));
  SLUICE_RETURN_IF_ERROR(number("probe", c.probe, 1, 100));
  SLUICE_RETURN_IF_ERROR(number("throttle_wait", c.throttle_wait, 0, 1e6));
  SLUICE_RETURN_IF_ERROR(number("min_rate", c.min_rate, 0, 1e18));
  SLUICE_RETURN_IF_ERROR(number("hysteresis", c.hysteresis, 0, 1));
  if (auto b = j.find("budget_leases"); b != j.end()) {
    if (!b->is_boolean()) return Status::invalid("budget_leases: true or false");
    c.budget_leases = b->get<bool>();
  }
  if (c.etcd.empty()) return Status::invalid("etcd: required, an endpoint URL or an array");
  if (c.node.empty()) return Status::invalid("node: required, the node's name in the cluster");
  if (std::int64_t{c.lease_s} * 1000 < 2 * std::int64_t{c.interval_ms}) {
    return Status::invalid("lease_s: must cover at least two intervals (interval_ms)");
  }
  return c;
}

StatusOr<ClusterNodeConfig> load_cluster_node_config(const std::string& path) {
  auto j = control::read_json_file(path);
  if (!j) return j.status();
  auto c = parse_cluster_node_config(*j);
  if (!c) return c.status().with_prefix(path + ": ");
  return c;
}

std::vector<std::string> split_endpoints(const std::string& list) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    if (comma > start) out.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

std::string cluster_prefix(const std::string& cluster) {
  return "/sluice/" + cluster + "/";
}
std::string node_key(const std::string& cluster, const std::string& node) {
  return cluster_prefix(cluster) + "nodes/" + node;
}
std::string decision_key(const std::string& cluster, const std::string& node) {
  return cluster_prefix(cluster) + "decisions/" + node;
}

// ---------------------------------------------------------------------------
// The link.

void ClusterLink::publish(NodeSummary summary) {
  MutexLock lock(mu_);
  summary_ = std::move(summary);
}

std::optional<NodeSummary> ClusterLink::summary() const {
  MutexLock lock(mu_);
  return summary_;
}

void ClusterLink::set_decision(NodeDecision d) {
  auto p = std::make_shared<const NodeDecision>(std::move(d));
  MutexLock lock(mu_);
  decision_ = std::move(p);
}

std::shared_ptr<const NodeDecision> ClusterLink::decision() const {
  MutexLock lock(mu_);
  return decision_;
}

// ---------------------------------------------------------------------------
// The policy wrapper.

namespace {

std::string value_key(const std::string& channel, const std::string& object,
                      const std::string& field) {
  return channel + "/" + object + "/" + field;
}

bool has_object(const StageView& st, const std::string& channel, const std::string& object) {
  for (const ChannelInfo& c : st.info.channels) {
    if (c.name != channel) continue;
    for (const ObjectInfo& o : c.objects) {
      if (o.name == object) return true;
    }
  }
  return false;
}

std::string tenant_of(const StageView& st, const std::string& label) {
  auto it = st.labels.find(label);
  return it == st.labels.end() ? std::string() : it->second;
}

// `extra` rules appended to `batch` (either form), or alone.
json merged(const RulesBatch* batch, json extra) {
  json rules = json::array();
  if (batch != nullptr && !batch->value().is_null()) {
    const json& b = batch->value();
    const json& r = b.is_object() ? b.value("rules", json::array()) : b;
    for (const json& x : r) rules.push_back(x);
  }
  for (json& x : extra) rules.push_back(std::move(x));
  return json{{"version", 1}, {"rules", std::move(rules)}};
}

}  // namespace

ClusterNodePolicy::ClusterNodePolicy(std::unique_ptr<Policy> inner,
                                     std::shared_ptr<ClusterLink> link, ClusterNodeConfig config)
    : inner_(std::move(inner)), link_(std::move(link)), cfg_(std::move(config)) {}

ClusterNodePolicy::StageMemory& ClusterNodePolicy::memory_of(const StageView& st) {
  StageMemory& m = stages_[st.name];
  if (m.connected_at_ns != st.connected_at_ns) {
    m = StageMemory{st.connected_at_ns, {}, 0, {}, {}, st.rules_refused, 0};
  }
  if (m.lease_end_ns != 0 && link_->clock().now_ns() >= m.lease_end_ns) {
    // Its lease ran out (this daemon was stopped, or could not renew): the stage holds
    // the fallback values now, not what was sent. Send every value again.
    m.lease_end_ns = 0;
    m.sent.clear();
  }
  if (m.refused != st.rules_refused) {
    // It refused a batch since: what it enforces is not what was sent. Forget
    // what was sent, so that the next rules carry every value again.
    m.refused = st.rules_refused;
    m.sent.clear();
    m.rules_seq = 0;
  }
  return m;
}

namespace {

// One configure rule per object of `fields` ("channel/object/field" -> value), a rate
// rounded to a whole number of at least 1.
json configure_rules(const std::map<std::string, double>& fields) {
  std::map<std::pair<std::string, std::string>, json> configs;
  for (const auto& [key, v] : fields) {
    const auto a = key.find('/');
    const auto b = key.find('/', a + 1);
    const std::string field = key.substr(b + 1);
    configs[{key.substr(0, a), key.substr(a + 1, b - a - 1)}][field] =
        field == "rate" ? json(std::llround(std::max(v, 1.0))) : json(v);
  }
  json rules = json::array();
  for (auto& [co, config] : configs) {
    rules.push_back({{"rule", "configure"},
                     {"channel", co.first},
                     {"object", co.second},
                     {"config", std::move(config)}});
  }
  return rules;
}

}  // namespace

double ClusterNodePolicy::fallback_part(const Budget& b, std::size_t stages) const {
  if (stages == 0) return 0;
  return b.fallback ? *b.fallback / static_cast<double>(stages) : cfg_.min_rate;
}

std::optional<std::chrono::milliseconds> ClusterNodePolicy::lease_left() const {
  if (!cfg_.budget_leases) return std::chrono::milliseconds(kMaxLeaseMs);  // never ends
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::nanoseconds(link_->lease_until_ns() - link_->clock().now_ns()) - kLeaseMargin);
  if (left < std::chrono::milliseconds(1)) return std::nullopt;
  return std::min(left, std::chrono::milliseconds(kMaxLeaseMs));
}

json ClusterNodePolicy::rules_for(const StageView& st, const NodeDecision& d, const StageValues& v,
                                  std::optional<std::chrono::milliseconds> lease, bool all) {
  StageMemory& m = memory_of(st);
  // Every field that changed.
  std::map<std::string, double> changed;
  for (const auto& [key, x] : v.values) {
    auto it = m.sent.find(key);
    if (all || it == m.sent.end() ||
        std::fabs(it->second - x) > cfg_.hysteresis * std::max(it->second, x)) {
      changed[key] = x;
      m.sent[key] = x;
    }
  }
  json rules = configure_rules(changed);
  // The budgets' values hold until the node's own lease would run out, renewed at
  // every step; a stage the daemon cannot reach in time falls back by itself.
  if (cfg_.budget_leases && lease && !v.fallback.empty()) {
    rules.push_back(
        {{"rule", "lease"}, {"ms", lease->count()}, {"fallback", configure_rules(v.fallback)}});
    m.lease_end_ns = link_->clock().now_ns() +
                     std::chrono::duration_cast<std::chrono::nanoseconds>(*lease).count();
  }
  const std::string tenant = tenant_of(st, cfg_.tenant_label);
  if (auto r = d.rules.find(tenant); r != d.rules.end() && (all || m.rules_seq != d.seq)) {
    const json& b = r->second;
    const json& list = b.is_object() ? b.value("rules", json::array()) : b;
    for (const json& x : list) rules.push_back(x);
  }
  m.rules_seq = d.seq;
  return rules;
}

PolicyOutput ClusterNodePolicy::step(const PolicyInput& in) {
  const std::shared_ptr<const NodeDecision> d = link_->decision();
  // Per stage and channel: what it got, waited and wants.
  struct Load {
    double service = 0, ops = 0, wait = 0, demand = 0;
  };
  std::map<std::pair<std::string, std::string>, TenantLoad> loads;  // (tenant, channel)
  std::map<std::string, std::map<std::string, Load>> per_stage;     // stage -> channel
  for (const StageView& st : in.stages) {
    const std::string tenant = tenant_of(st, cfg_.tenant_label);
    if (tenant.empty()) continue;
    StageMemory& m = memory_of(st);
    const double secs =
        static_cast<double>(st.stats.interval_ns > 0 ? st.stats.interval_ns : in.interval_ns) / 1e9;
    if (secs <= 0) continue;
    for (const ChannelStats& ch : st.stats.channels) {
      Load l;
      l.service = static_cast<double>(ch.total.bytes) / secs;
      l.ops = static_cast<double>(ch.total.ops) / secs;
      l.wait = static_cast<double>(ch.wait.total_ns) / 1e9 / secs;
      double had = 0;  // the largest rate it enforces in this channel
      for (const auto& [key, v] : m.sent) {
        if (key.rfind(ch.name + "/", 0) == 0 && key.size() > 5 &&
            key.compare(key.size() - 5, 5, "/rate") == 0) {
          had = std::max(had, v);
        }
      }
      // Held back: it waited, and served about its rate (within 10% and one
      // request), which held over the whole interval (the rate changes only at
      // these steps). A stage that waited but served well under its rate waited
      // only for a while (a burst, the tail of a demand gone): not held back.
      const double one_request = l.ops > 0 ? l.service / l.ops / secs : 0;
      const bool held =
          l.wait >= cfg_.throttle_wait && (had <= 0 || l.service + one_request >= 0.9 * had);
      l.demand = held ? std::max(l.service, had) * cfg_.probe : l.service * (1 + cfg_.headroom);
      m.demand[ch.name] = l.demand;
      m.held[ch.name] = held;
      per_stage[st.name][ch.name] = l;
      TenantLoad& t = loads[{tenant, ch.name}];
      t.tenant = tenant;
      t.channel = ch.name;
      ++t.stages;
      t.service += l.service;
      t.ops += l.ops;
      t.wait += l.wait;
      t.demand += l.demand;
      t.backlogged = t.backlogged || held;
    }
  }
  // The values each stage should hold under the decision. While the node's lease is
  // alive, a budget's parts hold under a lease, falling back by themselves to equal parts
  // of the budget's fallback; once it is gone, the node enforces the fallback itself.
  const std::optional<std::chrono::milliseconds> lease = lease_left();
  std::map<std::string, StageValues> values;  // by stage
  if (d) {
    for (const Budget& b : d->budgets) {
      std::vector<const StageView*> sts;
      std::vector<double> dm;
      std::vector<bool> held;
      for (const StageView& st : in.stages) {
        if (tenant_of(st, cfg_.tenant_label) != b.tenant || !has_object(st, b.channel, b.object)) {
          continue;
        }
        sts.push_back(&st);
        const StageMemory& m = memory_of(st);
        auto it = m.demand.find(b.channel);
        dm.push_back(it == m.demand.end() ? 0.0 : it->second);
        auto h = m.held.find(b.channel);
        held.push_back(h != m.held.end() && h->second);
      }
      const std::vector<double> parts = split_by_demand(b.value, dm, cfg_.min_rate, held);
      const double fallback = fallback_part(b, sts.size());
      const std::string key = value_key(b.channel, b.object, b.field);
      for (std::size_t i = 0; i < sts.size(); ++i) {
        StageValues& v = values[sts[i]->name];
        v.values[key] = lease ? parts[i] : fallback;
        v.fallback[key] = fallback;
      }
      if (b.field == "rate") {
        if (auto it = loads.find({b.tenant, b.channel}); it != loads.end()) {
          it->second.budget = lease ? b.value : fallback * static_cast<double>(sts.size());
        }
      }
    }
    for (const Setting& s : d->settings) {
      for (const StageView& st : in.stages) {
        if (tenant_of(st, cfg_.tenant_label) == s.tenant && has_object(st, s.channel, s.object)) {
          values[st.name].values[value_key(s.channel, s.object, s.field)] = s.value;
        }
      }
    }
  }
  NodeSummary summary;
  summary.node = cfg_.node;
  summary.seq = ++seq_;
  summary.interval_s = static_cast<double>(in.interval_ns) / 1e9;
  for (auto& [k, l] : loads) summary.loads.push_back(std::move(l));
  link_->publish(std::move(summary));

  PolicyOutput out = inner_->step(in);
  json budgets = json::array();
  if (d) {
    for (const StageView& st : in.stages) {
      if (tenant_of(st, cfg_.tenant_label).empty()) continue;
      auto v = values.find(st.name);
      json extra = rules_for(st, *d, v == values.end() ? StageValues{} : v->second, lease,
                             /*all=*/false);
      if (extra.empty()) continue;
      auto it = out.rules.find(st.name);
      const RulesBatch* inner = it == out.rules.end() ? nullptr : &it->second;
      // The local policy's rules first: the cluster's last, so that they win.
      out.rules[st.name] = merged(inner, std::move(extra));
    }
    budgets = to_json(*d)["budgets"];
  }
  for (const std::string& gone : in.departed) stages_.erase(gone);
  json cluster{
      {"node", cfg_.node},
      {"etcd_reachable", link_->reachable()},
      {"lease_left_ms", lease && cfg_.budget_leases ? json(lease->count()) : json(nullptr)},
      {"fallen_back", d != nullptr && !d->budgets.empty() && !lease},
      {"decision_seq", d ? d->seq : 0},
      {"decision_term", d ? d->term : 0},
      {"budgets", budgets}};
  if (!out.report.is_object()) out.report = json{{"policy", out.report}};
  out.report["cluster"] = std::move(cluster);
  return out;
}

RulesBatch ClusterNodePolicy::admit(const PolicyInput& in) {
  RulesBatch base = inner_->admit(in);
  const std::shared_ptr<const NodeDecision> d = link_->decision();
  if (!d || in.stages.empty()) return base;
  const StageView& st = in.stages.front();
  const std::string tenant = tenant_of(st, cfg_.tenant_label);
  if (tenant.empty()) return base;
  // Until the next step splits by demand: an equal part of each budget with
  // the tenant's other stages here.
  const std::optional<std::chrono::milliseconds> lease = lease_left();
  StageValues v;
  for (const Budget& b : d->budgets) {
    if (b.tenant != tenant || !has_object(st, b.channel, b.object)) continue;
    std::size_t peers = 1;
    for (const auto& [name, m] : stages_) {
      if (name != st.name && m.demand.count(b.channel)) ++peers;
    }
    const std::string key = value_key(b.channel, b.object, b.field);
    v.fallback[key] = fallback_part(b, peers);
    v.values[key] = lease ? b.value / static_cast<double>(peers) : v.fallback[key];
  }
  for (const Setting& s : d->settings) {
    if (s.tenant == tenant && has_object(st, s.channel, s.object)) {
      v.values[value_key(s.channel, s.object, s.field)] = s.value;
    }
  }
  json extra = rules_for(st, *d, v, lease, /*all=*/true);
  if (extra.empty()) return base;
  return merged(base.value().is_null() ? nullptr : &base, std::move(extra));
}

json ClusterNodePolicy::describe() const {
  json j = inner_->describe();
  json c{{"node", cfg_.node},       {"cluster", cfg_.cluster},
         {"etcd", cfg_.etcd},       {"interval_ms", cfg_.interval_ms},
         {"lease_s", cfg_.lease_s}, {"tenant_label", cfg_.tenant_label}};
  if (j.is_object()) {
    j["cluster"] = std::move(c);
    return j;
  }
  return json{{"policy", std::move(j)}, {"cluster", std::move(c)}};
}

// ---------------------------------------------------------------------------
// The agent.

ClusterNode::ClusterNode(ClusterNodeConfig config, std::unique_ptr<EtcdClient> etcd)
    : cfg_(std::move(config)), etcd_(std::move(etcd)), link_(std::make_shared<ClusterLink>()) {}

StatusOr<std::unique_ptr<ClusterNode>> ClusterNode::start(ClusterNodeConfig config) {
  EtcdOptions eo;
  eo.endpoints = config.etcd;
  eo.timeout = std::chrono::milliseconds(config.timeout_ms);
  auto etcd = EtcdClient::create(eo);
  if (!etcd) return etcd.status();
  std::unique_ptr<ClusterNode> n(new ClusterNode(std::move(config), std::move(*etcd)));
  n->publisher_ = std::thread([p = n.get()] { p->publish_loop(); });
  n->watcher_ = std::thread([p = n.get()] { p->watch_loop(); });
  spdlog::info("cluster '{}': node '{}' on etcd {}", n->cfg_.cluster, n->cfg_.node,
               fmt::join(n->cfg_.etcd, ","));
  return n;
}

ClusterNode::~ClusterNode() {
  stop();
}

void ClusterNode::attach(control::DaemonOptions& options) const {
  options.wrap_policy = [link = link_, cfg = cfg_](std::unique_ptr<Policy> inner) {
    return std::unique_ptr<Policy>(new ClusterNodePolicy(std::move(inner), link, cfg));
  };
}

void ClusterNode::stop() {
  if (stop_.exchange(true)) return;
  {
    MutexLock lock(mu_);
    cv_.notify_all();
  }
  if (publisher_.joinable()) publisher_.join();
  if (watcher_.joinable()) watcher_.join();
  if (const std::int64_t lease = lease_.exchange(0); lease != 0) (void)etcd_->lease_revoke(lease);
}

void ClusterNode::pause(std::chrono::milliseconds d) {
  MutexLock lock(mu_);
  cv_.wait_for(lock.native(), d, [this] { return stop_.load(); });
}

void ClusterNode::note(bool ok, const Status& why) {
  link_->set_reachable(ok);
  MutexLock lock(mu_);
  const int now = ok ? 1 : -1;
  if (state_ == now) return;
  state_ = now;
  if (ok) {
    spdlog::info("cluster '{}': node '{}' reaches etcd", cfg_.cluster, cfg_.node);
  } else {
    spdlog::warn(
        "cluster '{}': node '{}' cannot reach etcd ({}); keeping the last decision, retrying",
        cfg_.cluster, cfg_.node, why.message());
  }
}

void ClusterNode::publish_loop() {
  using std::chrono::milliseconds;
  const auto interval = milliseconds(cfg_.interval_ms);
  // The lease is renewed every quarter of its TTL (at most every interval): the node's
  // budgets are leases that end with it, so each daemon step must find more than an
  // interval of it left. The summary is published every interval.
  const auto renew_every = std::min(interval, milliseconds(std::int64_t{cfg_.lease_s} * 250));
  const std::string key = node_key(cfg_.cluster, cfg_.node);
  milliseconds backoff{100};
  auto next_put = std::chrono::steady_clock::now();
  while (!stop_.load()) {
    const auto began = std::chrono::steady_clock::now();
    Status st;
    std::int64_t lease = lease_.load();
    // etcd counts a lease's TTL from when it takes the request, which is after it left:
    // the lease lives at least until then plus the TTL, whatever the reply's delay.
    sluice::Clock& clock = link_->clock();
    constexpr std::int64_t kNsPerS = 1'000'000'000;
    std::int64_t sent_ns = clock.now_ns();
    if (lease == 0) {
      auto l = etcd_->lease_grant(cfg_.lease_s);
      if (l) {
        lease = l->id;
        lease_.store(lease);
        link_->set_lease_until_ns(sent_ns + l->ttl_s * kNsPerS);
        next_put = began;  // a new lease: the summary under it at once
      } else {
        st = l.status();
      }
    }
    if (st.is_ok() && began >= next_put) {
      NodeSummary s = link_->summary().value_or(NodeSummary{cfg_.node, 0, 0, {}});
      auto put = etcd_->put(key, to_json(s).dump(), lease);
      if (put) {
        next_put = began + interval;
      } else {
        st = put.status();
      }
    }
    if (st.is_ok()) {
      sent_ns = clock.now_ns();
      auto ka = etcd_->lease_keepalive(lease);
      if (ka) {
        link_->set_lease_until_ns(sent_ns + *ka * kNsPerS);
      } else {
        st = ka.status();
      }
    }
    if (st.code() == Code::kFailedPrecondition) {  // the lease ran out: a new one at once
      link_->set_lease_until_ns(0);
      lease_.store(0);
      spdlog::info("cluster '{}': node '{}' lease expired; taking a new one", cfg_.cluster,
                   cfg_.node);
      continue;
    }
    note(st.is_ok(), st);
    if (!st.is_ok()) {
      pause(backoff);
      backoff = std::min(backoff * 2, std::max(interval, milliseconds(1000)));
      continue;
    }
    backoff = milliseconds(100);
    const auto spent =
        std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - began);
    if (spent < renew_every) pause(renew_every - spent);
  }
}

void ClusterNode::watch_loop() {
  const std::string key = decision_key(cfg_.cluster, cfg_.node);
  std::int64_t next = 0;
  std::chrono::milliseconds backoff{100};
  ConditionLog ignored("cluster '" + cfg_.cluster + "': decision for node '" + cfg_.node +
                       "' ignored");
  auto take = [&](const KeyValue& kv) {
    auto j = parse_json_text(kv.value);
    auto d = j ? decision_from_json(*j) : StatusOr<NodeDecision>(j.status());
    if (!d) {
      ignored.fail(d.status().message());
      return;
    }
    ignored.ok();
    auto last = link_->decision();
    if (last && (d->term < last->term || (d->term == last->term && d->seq < last->seq))) {
      return;  // older than the one in force (never expected: writes are fenced)
    }
    link_->set_decision(std::move(*d));
  };
  while (!stop_.load()) {
    if (next == 0) {
      auto r = etcd_->range(key);
      if (!r) {
        note(false, r.status());
        pause(backoff);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
        continue;
      }
      if (!r->kvs.empty()) take(r->kvs.front());
      next = r->revision + 1;
    }
    auto w = etcd_->watch(
        key, "", next, std::chrono::milliseconds(2000), &stop_, [&](const WatchEvent& ev) {
          if (ev.deleted) {
            spdlog::warn("cluster '{}': decision for node '{}' deleted; keeping the last",
                         cfg_.cluster, cfg_.node);
          } else {
            take(ev.kv);
          }
        });
    if (w) {
      next = *w;
      backoff = std::chrono::milliseconds(100);
      continue;
    }
    if (w.status().code() == Code::kFailedPrecondition) {
      next = 0;  // compacted: read the key afresh
      continue;
    }
    note(false, w.status());
    pause(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
}

}  // namespace sluice::cluster
