// Delta Fair Sharing: the policy and its write buffer; see delta_fair.h. The
// read cache's part is in delta_fair_cache.cc, the configuration in
// delta_fair_config.cc, the arithmetic in delta_fair_math.cc.
#include "delta_fair.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "delta_fair_internal.h"
#include "stage_view.h"

namespace sluice {

namespace delta_fair_detail {

using nlohmann::json;

bool flow_id(const json& flow, std::uint64_t* out) {
  auto it = flow.find("flow");
  if (it == flow.end()) return false;
  if (it->is_number_unsigned() || (it->is_number_integer() && it->get<std::int64_t>() >= 0)) {
    *out = it->get<std::uint64_t>();
    return true;
  }
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    if (s.empty() || s.size() > 19 ||
        !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return false;
    *out = std::stoull(s);
    return true;
  }
  return false;
}

double number_of(const json& j, const char* field) {
  if (!j.is_object()) return 0;
  auto it = j.find(field);
  return it != j.end() && it->is_number() ? it->get<double>() : 0;
}

std::vector<Pool> pools_of(const StageView& st, const std::string& object) {
  std::vector<Pool> pools;
  for (const ChannelStats& c : st.stats.channels) {
    if (const ObjectStats* o = stage_view::find_object(&c, object)) {
      pools.push_back({c.name, o->type, o});
    }
  }
  for (const ChannelInfo& c : st.info.channels) {
    for (const ObjectInfo& o : c.objects) {
      if (o.name != object) continue;
      const bool known = std::any_of(pools.begin(), pools.end(),
                                     [&](const Pool& p) { return p.channel == c.name; });
      if (!known) pools.push_back({c.name, o.type, nullptr});
    }
  }
  return pools;
}

void append_configure(json* rules, const std::string& object,
                      const std::vector<std::string>& channels, const json& config) {
  for (const auto& c : channels) {
    rules->push_back(
        {{"rule", "configure"}, {"channel", c}, {"object", object}, {"config", config}});
  }
}

std::string wrong_type(const std::string& object, const Pool& p, std::string_view want) {
  return "object '" + object + "' in channel '" + p.channel + "' is a '" + p.type + "', not a '" +
         std::string(want) + "': not configured";
}

}  // namespace delta_fair_detail

namespace {

using nlohmann::json;
using namespace delta_fair_detail;  // NOLINT(google-build-using-namespace)

// Whether a pool's collect disagrees with the configuration it was sent:
// another capacity or reservation, or another weight for a configured flow.
bool pool_differs(const ObjectStats* o, const json& sent) {
  if (o == nullptr || !o->state.is_object() || !sent.is_object()) return false;
  const json& s = o->state;
  for (const char* field : {"capacity", "reserved"}) {
    auto it = s.find(field);
    if (it != s.end() && it->is_number() && *it != sent.at(field)) return true;
  }
  auto flows = s.find("flows");
  if (flows == s.end() || !flows->is_array()) return false;
  const json& weights = sent.at("weights");
  for (const json& f : *flows) {
    std::uint64_t id = 0;
    if (!f.is_object() || !flow_id(f, &id)) continue;
    auto want = weights.find(std::to_string(id));
    auto have = f.find("weight");
    if (want == weights.end() || have == f.end() || !have->is_number()) continue;
    const double a = want->get<double>(), b = have->get<double>();
    if (std::abs(a - b) > 1e-9 * std::max(std::abs(a), std::abs(b))) return true;
  }
  return false;
}

}  // namespace

Status DeltaFairPolicy::configure(const json& config) {
  auto parsed = parse_delta_fair_config(config);
  if (!parsed.is_ok()) return parsed.status();
  config_ = std::move(parsed).value();
  const DeltaFairBuffer* b = config_.write_buffer ? &*config_.write_buffer : nullptr;
  bandwidth_ = b != nullptr ? b->flush_bandwidth : 0;
  bandwidth_known_ = b != nullptr && (!b->measured || bandwidth_ > 0);
  measured_once_ = false;
  refill_ = Estimate{};
  amplification_ = Estimate{};
  if (const auto& c = config_.cache) {
    refill_.value = c->refill_bandwidth;
    refill_.measured = c->refill_measured;
    refill_.known = !c->refill_measured || c->refill_bandwidth > 0;
    amplification_.value = c->read_amplification;
    amplification_.measured = c->amplification_measured;
    amplification_.known = !c->amplification_measured || c->read_amplification > 0;
  }
  stages_.clear();  // every stage is configured again
  return Status::ok();
}

json DeltaFairPolicy::describe() const {
  return delta_fair_config_to_json(config_);
}

std::unique_ptr<Policy> make_delta_fair_policy() {
  return std::make_unique<DeltaFairPolicy>();
}

// ---------------------------------------------------------------------------
// The write buffer's reservation.

delta_fair::BufferModel DeltaFairPolicy::model() const {
  const DeltaFairBuffer& b = *config_.write_buffer;
  delta_fair::BufferModel m;
  m.capacity = b.capacity;
  m.segment = b.segment;
  m.flush_bandwidth = bandwidth_;
  m.delta_ms = b.delta_ms;
  m.k = config_.k;
  m.rounding = b.rounding;
  return m;
}

delta_fair::Reservation DeltaFairPolicy::reservation() const {
  if (!config_.write_buffer) return {};
  std::vector<double> weights;
  weights.reserve(config_.tenants.size());
  for (const auto& t : config_.tenants) weights.push_back(t.weight);
  return delta_fair::reserve(model(), weights);
}

json DeltaFairPolicy::pool_config(const delta_fair::Reservation& r) const {
  json weights = json::object();
  for (const auto& t : config_.tenants) weights[std::to_string(t.id)] = t.weight;
  return {{"capacity", config_.write_buffer->capacity},
          {"reserved", r.reserved},
          {"weights", std::move(weights)}};
}

namespace {

const char* bandwidth_source(const DeltaFairBuffer& b, bool known, bool measured_once) {
  if (!b.measured) return "configured";
  if (measured_once) return "measured";
  return known ? "initial" : "none";
}

}  // namespace

json DeltaFairPolicy::explain_buffer() const {
  const delta_fair::Reservation r = reservation();
  const DeltaFairBuffer& b = *config_.write_buffer;
  json per_tenant = json::object();
  json shares = json::object();
  for (std::size_t i = 0; i < config_.tenants.size(); ++i) {
    per_tenant[config_.tenants[i].name] = r.per_tenant[i];
    shares[config_.tenants[i].name] = r.fair_share[i];
  }
  return {{"reserved_bytes", r.reserved},
          {"reserved_fraction", r.reserved_fraction},
          {"per_tenant_bytes", std::move(per_tenant)},
          {"flush_time_ms", ms_json(r.flush_time_ms)},
          {"worst_case_delay_ms", ms_json(r.worst_case_delay_ms)},
          {"fair_share_bytes", std::move(shares)},
          {"ramp_demand_bytes", r.ramp_demand},
          {"flushable_segments", r.flushable_segments},
          {"reserved_segments", r.reserved / b.segment + (r.reserved % b.segment ? 1 : 0)},
          {"capacity", b.capacity},
          {"segment", b.segment},
          {"k", config_.k},
          {"delta_ms", delta_json(b.delta_ms)},
          {"rounding", delta_fair::rounding_name(b.rounding)},
          {"flush_bandwidth", bandwidth_},
          {"flush_bandwidth_source", bandwidth_source(b, bandwidth_known_, measured_once_)}};
}

json DeltaFairPolicy::explain() const {
  json res = json::object();
  if (config_.write_buffer) res["write_buffer"] = explain_buffer();
  if (config_.cache) res["cache"] = explain_cache();
  return {{"config", describe()}, {"reservations", std::move(res)}};
}

// ---------------------------------------------------------------------------
// The step.

void DeltaFairPolicy::measure_bandwidth(const PolicyInput& input, json& estimate) {
  const DeltaFairBuffer& b = *config_.write_buffer;
  double rate = 0;
  bool measured = false, backlogged = false;
  for (const StageView& st : input.stages) {
    bool has_pool = false;
    for (const ChannelStats& c : st.stats.channels) {
      const ObjectStats* o = stage_view::find_object(&c, b.object);
      if (o == nullptr) continue;
      has_pool = true;
      // Acquires that waited in this interval (bucket 0 counts those that
      // did not), or writers waiting when the pool was collected.
      const bool waited = o->wait.count() > o->wait.buckets[0];
      backlogged = backlogged || waited || stage_view::state_number(o, "queued") > 0;
    }
    if (!has_pool) continue;
    std::uint64_t bytes = 0;
    for (const ChannelStats& c : st.stats.channels) {
      if (auto it = c.by_origin.find(b.flush_origin); it != c.by_origin.end()) {
        bytes += it->second.bytes;
      }
    }
    const std::int64_t dt = stage_view::interval_ns(st, input);
    if (dt <= 0) continue;
    rate += static_cast<double>(bytes) * 1e9 / static_cast<double>(dt);
    measured = true;
  }
  estimate = {{"backlogged", backlogged}};
  if (!measured) return;
  estimate["rate"] = rate;
  if (!backlogged) return;  // flushing then gets what it needs, not what it can
  bandwidth_ = bandwidth_known_ ? bandwidth_ + b.smoothing * (rate - bandwidth_) : rate;
  bandwidth_known_ = true;
  measured_once_ = true;
  estimate["used"] = true;
}

RulesBatch DeltaFairPolicy::admit(const PolicyInput& input) {
  if (input.stages.size() != 1) return {};
  const StageView& st = input.stages.front();
  json rules = json::array();
  StageMemory mem;
  mem.connected_at_ns = st.connected_at_ns;
  if (const auto& b = config_.write_buffer) {
    const json desired = pool_config(reservation());
    std::vector<std::string> channels;
    for (const Pool& p : pools_of(st, b->object)) {
      if (p.type != kPoolType) continue;
      channels.push_back(p.channel);
      mem.pools[p.channel].sent = desired;
    }
    append_configure(&rules, b->object, channels, desired);
  }
  if (const auto& c = config_.cache) {
    const json desired = cache_config(cache_reservation());
    std::vector<std::string> channels;
    for (const Pool& p : pools_of(st, c->object)) {
      if (p.type != kCacheType) continue;
      channels.push_back(p.channel);
      mem.caches[p.channel].sent = desired;
    }
    append_configure(&rules, c->object, channels, desired);
  }
  if (rules.empty()) return {};
  stages_[st.name] = std::move(mem);
  return rules_batch(std::move(rules));
}

PolicyOutput DeltaFairPolicy::step(const PolicyInput& input) {
  PolicyOutput out;
  const DeltaFairBuffer* b = config_.write_buffer ? &*config_.write_buffer : nullptr;
  json estimate;
  if (b != nullptr && b->measured) measure_bandwidth(input, estimate);
  json refill_estimate, amplification_estimate;
  if (config_.cache) measure_cache(input, refill_estimate, amplification_estimate);
  const delta_fair::Reservation r = reservation();
  const json desired = b != nullptr ? pool_config(r) : json();
  const delta_fair::CacheReservation cr = cache_reservation();
  const json cache_desired = config_.cache ? cache_config(cr) : json();

  json departed = json::array();
  for (const auto& name : input.departed) {
    if (stages_.erase(name)) departed.push_back(name);
  }
  std::set<std::string> seen;
  json errors = json::object();
  json stages = json::object();
  json cache_stages = json::object();
  json cache_flows = json::object();  // per flow id, the caches' counters summed
  // Per tenant id: the pools' counters summed over the stages.
  struct Usage {
    double usage = 0, stalls = 0, stall_ns = 0, queued = 0, max_stall_ns = 0, granted = 0;
    bool seen = false;
  };
  std::map<std::uint64_t, Usage> usage;
  for (const StageView& st : input.stages) {
    const std::vector<Pool> pools = b != nullptr ? pools_of(st, b->object) : std::vector<Pool>{};
    const bool has_cache = config_.cache && !pools_of(st, config_.cache->object).empty();
    if (pools.empty() && !has_cache) continue;
    StageMemory& mem = stages_[st.name];
    if (mem.connected_at_ns != st.connected_at_ns) {  // a new connection
      mem.pools.clear();
      mem.caches.clear();
    }
    mem.connected_at_ns = st.connected_at_ns;
    mem.absent_steps = 0;
    seen.insert(st.name);
    json rules = json::array();
    std::string error;
    if (!pools.empty()) {
      std::vector<std::string> send;
      json rep = {{"channels", json::array()}};
      for (const Pool& p : pools) {
        if (p.type != kPoolType) {
          error = wrong_type(b->object, p, kPoolType);
          continue;
        }
        rep["channels"].push_back(p.channel);
        PoolMemory& pm = mem.pools[p.channel];
        if (pm.sent != desired || pool_differs(p.stats, pm.sent)) {
          send.push_back(p.channel);
          pm.sent = desired;
        }
        if (p.stats == nullptr || !p.stats->state.is_object()) continue;
        const json& s = p.stats->state;
        for (const char* field : {"capacity", "reserved", "used", "queued"}) {
          rep[field] = rep.value(field, 0.0) + number_of(s, field);
        }
        auto flows = s.find("flows");
        if (flows == s.end() || !flows->is_array()) continue;
        for (const json& f : *flows) {
          std::uint64_t id = 0;
          if (!f.is_object() || !flow_id(f, &id)) continue;
          Usage& u = usage[id];
          u.seen = true;
          u.usage += number_of(f, "usage");
          u.stalls += number_of(f, "stalls");
          u.stall_ns += number_of(f, "stall_ns");
          u.queued += number_of(f, "queued");
          u.granted += number_of(f, "granted_bytes");
          u.max_stall_ns = std::max(u.max_stall_ns, number_of(f, "max_stall_ns"));
        }
      }
      rep["sent"] = !send.empty();
      stages[st.name] = std::move(rep);
      append_configure(&rules, b->object, send, desired);
    }
    if (has_cache) {
      json rep;
      std::string cache_error;
      step_cache_stage(st, mem, cache_desired, &rules, &rep, &cache_flows, &cache_error);
      cache_stages[st.name] = std::move(rep);
      if (!cache_error.empty()) error += (error.empty() ? "" : "; ") + cache_error;
    }
    if (!error.empty()) errors[st.name] = error;
    if (!rules.empty()) out.rules[st.name] = rules_batch(std::move(rules));
  }
  for (auto it = stages_.begin(); it != stages_.end();) {
    if (seen.count(it->first) || ++it->second.absent_steps <= kForgetAfterAbsentSteps) {
      ++it;
    } else {
      departed.push_back(it->first);
      it = stages_.erase(it);
    }
  }

  json tenants = json::object();
  for (std::size_t i = 0; i < config_.tenants.size(); ++i) {
    const DeltaFairTenant& t = config_.tenants[i];
    json e = {{"id", t.id}, {"weight", t.weight}};
    if (b != nullptr) {
      e["fair_share"] = r.fair_share[i];
      e["reserved"] = r.per_tenant[i];
    }
    if (auto u = usage.find(t.id); u != usage.end()) {
      e["usage"] = u->second.usage;
      e["granted_bytes"] = u->second.granted;
      e["stalls"] = u->second.stalls;
      e["stall_ns"] = u->second.stall_ns;
      e["max_stall_ns"] = u->second.max_stall_ns;
      e["queued"] = u->second.queued;
      usage.erase(u);
    }
    tenants[t.name] = std::move(e);
  }
  json others = json::object();  // flows the pools hold that no tenant names
  for (const auto& [id, u] : usage) {
    others[std::to_string(id)] = {
        {"usage", u.usage}, {"stalls", u.stalls}, {"stall_ns", u.stall_ns}};
  }

  out.report = {{"policy", "delta-fair"},
                {"reservations", explain().at("reservations")},
                {"tenants", std::move(tenants)}};
  if (b != nullptr) {
    json bandwidth = {{"in_use", bandwidth_},
                      {"source", bandwidth_source(*b, bandwidth_known_, measured_once_)}};
    if (b->measured) bandwidth["estimate"] = std::move(estimate);
    out.report["flush_bandwidth"] = std::move(bandwidth);
    out.report["stages"] = std::move(stages);
  }
  if (config_.cache) {
    out.report["cache"] =
        cache_report(cr, std::move(cache_flows), std::move(cache_stages),
                     std::move(refill_estimate), std::move(amplification_estimate));
  }
  if (!others.empty()) out.report["other_flows"] = std::move(others);
  if (!departed.empty()) out.report["departed"] = std::move(departed);
  if (!errors.empty()) out.report["errors"] = std::move(errors);
  return out;
}

}  // namespace sluice
