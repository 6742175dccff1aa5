// The flex policy: FlexEngine's two-level I/O admission control, and RocksDB's
// auto-tuned limiter as its baseline; see flex.h.
#include "flex.h"

#include <cmath>
#include <utility>

#include "stage_view.h"

namespace sluice {
namespace {

using nlohmann::json;

std::string key_of(const FlexObjectRef& r) {
  return r.channel + "/" + r.object;
}

json batch(json rules) {
  return {{"version", 1}, {"rules", std::move(rules)}};
}

std::uint64_t origin_bytes(const StageStats& stats, const char* origin) {
  std::uint64_t bytes = 0;
  for (const ChannelStats& c : stats.channels) {
    if (auto it = c.by_origin.find(origin); it != c.by_origin.end()) bytes += it->second.bytes;
  }
  return bytes;
}

}  // namespace

Status FlexPolicy::configure(const json& config) {
  auto parsed = parse_flex_config(config);
  if (!parsed.is_ok()) return parsed.status();
  config_ = std::move(parsed).value();
  state_.clear();
  state_.resize(config_.partitions.size());
  for (std::size_t i = 0; i < state_.size(); ++i) {
    const FlexPartition& p = config_.partitions[i];
    state_[i].window = flex::IngestWindow(std::llround(p.ingest_window_s * 1e9));
    double max_rate = p.max_rate;
    if (max_rate <= 0) {  // sized for the partition's limits: Equation 2 plus 3 at full writes
      max_rate = foreground_rate(i) + p.wcu_max_per_s * p.wcu_max_size * lsm_ba(i);
    }
    state_[i].tuner = flex::AutoTuner(std::max<std::int64_t>(20, std::llround(max_rate)));
  }
  stages_.clear();  // every stage is configured again
  return Status::ok();
}

json FlexPolicy::describe() const {
  return flex_config_to_json(config_);
}

double FlexPolicy::foreground_rate(std::size_t i) const {
  const FlexPartition& p = config_.partitions[i];
  return flex::foreground_rate(p.rcu_max_per_s, p.rcu_max_size, p.read_amplification,
                               p.wcu_max_per_s, p.wcu_max_size);
}

double FlexPolicy::lsm_ba(std::size_t i) const {
  const FlexPartition& p = config_.partitions[i];
  return p.amplification_from_levels ? flex::lsm_amplification(p.levels).total
                                     : p.background_amplification;
}

double FlexPolicy::background_rate(std::size_t i) const {
  return flex::background_rate(state_[i].window.average(), lsm_ba(i),
                               config_.partitions[i].min_background);
}

double FlexPolicy::auto_tuned_rate(std::size_t i) const {
  return static_cast<double>(state_[i].tuner.rate());
}

json FlexPolicy::explain() const {
  json parts = json::object();
  for (std::size_t i = 0; i < config_.partitions.size(); ++i) {
    const FlexPartition& p = config_.partitions[i];
    const flex::LsmAmplification a = flex::lsm_amplification(p.levels);
    json e = {{"stage", p.stage},
              {"foreground_rate", foreground_rate(i)},
              {"background_rate", background_rate(i)},
              {"lsm_ba", lsm_ba(i)},
              {"lsm_ba_source", p.amplification_from_levels ? "levels" : "configured"},
              {"ingest_bytes_per_s", state_[i].window.average()},
              {"ingest_window_s", p.ingest_window_s},
              {"min_background", p.min_background}};
    if (p.amplification_from_levels) {
      e["levels"] = p.levels;
      e["lsm_write_amplification"] = a.write;
      e["lsm_read_amplification"] = a.read;
    }
    if (config_.method == FlexConfig::kAutoTuned) {
      e["auto_tuned_rate"] = auto_tuned_rate(i);
      e["max_rate"] = static_cast<double>(state_[i].tuner.max_rate());
      e["tunes"] = state_[i].tuner.tunes();
    }
    parts[p.name] = std::move(e);
  }
  json out = {{"config", describe()}, {"partitions", std::move(parts)}};
  out["node_rate"] = config_.node_bandwidth > 0 ? json(config_.node_bandwidth) : json();
  return out;
}

void FlexPolicy::measure(const PolicyInput& input, json* report) {
  const auto refill_ns = static_cast<std::int64_t>(config_.refill_period_ms * 1e6);
  for (std::size_t i = 0; i < config_.partitions.size(); ++i) {
    const FlexPartition& p = config_.partitions[i];
    PartitionState& s = state_[i];
    const StageView* st = nullptr;
    for (const StageView& v : input.stages) {
      if (v.name == p.stage) st = &v;
    }
    json r = {{"stage", p.stage}, {"present", st != nullptr}};
    if (st != nullptr) {
      const std::int64_t dt = stage_view::interval_ns(*st, input);
      const std::uint64_t wal = origin_bytes(st->stats, "wal");
      const std::uint64_t flush = origin_bytes(st->stats, "flush");
      s.wal_seen = s.wal_seen || wal > 0;
      const std::uint64_t ingest = s.wal_seen ? wal : flush;
      s.window.add(dt, static_cast<double>(ingest));
      r["ingest_bytes"] = ingest;
      r["ingest_origin"] = s.wal_seen ? "wal" : "flush";
      if (config_.method == FlexConfig::kAutoTuned && refill_ns > 0) {
        const ObjectStats* o = stage_view::find_object(st->stats, config_.auto_tuned.channel,
                                                       config_.auto_tuned.object);
        const std::int64_t periods = (dt + refill_ns / 2) / refill_ns;
        const std::uint64_t waited = o != nullptr ? o->wait.count() - o->wait.buckets[0] : 0;
        const auto drains = static_cast<std::int64_t>(std::min<std::uint64_t>(
            waited, static_cast<std::uint64_t>(std::max<std::int64_t>(0, periods))));
        s.tuner.advance(periods, drains);
        r["refill_periods"] = periods;
        r["drains"] = drains;
      }
    }
    r["ingest_bytes_per_s"] = s.window.average();
    r["lsm_ba"] = lsm_ba(i);
    if (config_.method == FlexConfig::kFlex) {
      r["foreground_rate"] = foreground_rate(i);
      r["background_rate"] = background_rate(i);
    } else {
      r["auto_tuned_rate"] = auto_tuned_rate(i);
    }
    (*report)[p.name] = std::move(r);
  }
}

json FlexPolicy::rules_for(const StageView& st, StageMemory& mem, json* report) const {
  std::vector<std::pair<const FlexObjectRef*, double>> want;
  for (std::size_t i = 0; i < config_.partitions.size(); ++i) {
    if (config_.partitions[i].stage != st.name) continue;
    if (config_.method == FlexConfig::kFlex) {
      want.emplace_back(&config_.foreground, foreground_rate(i));
      want.emplace_back(&config_.background, background_rate(i));
    } else {
      want.emplace_back(&config_.auto_tuned, auto_tuned_rate(i));
    }
  }
  if (config_.node_bandwidth > 0) want.emplace_back(&config_.node, config_.node_bandwidth);
  json rules = json::array();
  for (const auto& [ref, rate] : want) {
    if (!stage_view::has_object(st.info, ref->channel, ref->object)) continue;
    const json config = {{"rate", stage_view::to_rate(rate)}};
    json& sent = mem.sent[key_of(*ref)];
    if (report != nullptr) (*report)[key_of(*ref)] = config["rate"];
    if (sent == config) continue;
    rules.push_back({{"rule", "configure"},
                     {"channel", ref->channel},
                     {"object", ref->object},
                     {"config", config}});
    sent = config;
  }
  return rules;
}

RulesBatch FlexPolicy::admit(const PolicyInput& input) {
  if (input.stages.size() != 1) return {};
  const StageView& st = input.stages.front();
  StageMemory mem;
  mem.connected_at_ns = st.connected_at_ns;
  json rules = rules_for(st, mem, nullptr);
  if (rules.empty()) return {};
  stages_[st.name] = std::move(mem);
  return batch(std::move(rules));
}

PolicyOutput FlexPolicy::step(const PolicyInput& input) {
  PolicyOutput out;
  for (const auto& name : input.departed) stages_.erase(name);
  json partitions = json::object();
  measure(input, &partitions);
  json stages = json::object();
  for (const StageView& st : input.stages) {
    StageMemory& mem = stages_[st.name];
    if (mem.connected_at_ns != st.connected_at_ns) {  // a new connection: send everything
      mem = StageMemory{};
      mem.connected_at_ns = st.connected_at_ns;
    }
    json sent = json::object();
    json rules = rules_for(st, mem, &sent);
    if (!sent.empty()) stages[st.name] = std::move(sent);
    if (!rules.empty()) out.rules[st.name] = batch(std::move(rules));
  }
  out.report = {{"method", config_.method == FlexConfig::kFlex ? "flex" : "auto-tuned"},
                {"partitions", std::move(partitions)},
                {"rates", std::move(stages)}};
  out.report["node_rate"] = config_.node_bandwidth > 0 ? json(config_.node_bandwidth) : json();
  return out;
}

std::unique_ptr<Policy> make_flex_policy() {
  return std::make_unique<FlexPolicy>();
}

}  // namespace sluice
