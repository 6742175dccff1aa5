// Delta Fair Sharing for a read cache: the delta-fair policy's `cache` member
// (delta_fair.h). Equation 2 is in delta_fair_math.cc; this file estimates
// R_read and AMP, configures the stages' `cache-reserve` objects and reports
// their counters.
#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "delta_fair.h"
#include "delta_fair_internal.h"
#include "stage_view.h"

namespace sluice {
namespace {

using nlohmann::json;
using namespace delta_fair_detail;  // NOLINT(google-build-using-namespace)

// The per-flow counters of a cache object's collect the report sums.
constexpr const char* kFlowCounters[] = {
    "usage", "pinned", "hits", "misses", "inserts", "evictions", "evictions_below_reserved"};

bool differs(double a, double b) {
  return std::abs(a - b) > 1e-9 * std::max(std::abs(a), std::abs(b));
}

// Whether a cache object's collect disagrees with the configuration it was
// sent: another capacity, or another reservation or weight for a configured
// flow.
bool cache_differs(const ObjectStats* o, const json& sent) {
  if (o == nullptr || !o->state.is_object() || !sent.is_object()) return false;
  const json& s = o->state;
  if (auto it = s.find("capacity");
      it != s.end() && it->is_number() && *it != sent.at("capacity")) {
    return true;
  }
  auto flows = s.find("flows");
  if (flows == s.end() || !flows->is_array()) return false;
  const json& reserved = sent.at("reserved");
  const json& weights = sent.at("weights");
  for (const json& f : *flows) {
    std::uint64_t id = 0;
    if (!f.is_object() || !flow_id(f, &id)) continue;
    const std::string key = std::to_string(id);
    for (const auto& [field, want] : {std::pair{"reserved", &reserved}, {"weight", &weights}}) {
      auto w = want->find(key);
      auto have = f.find(field);
      if (w == want->end() || have == f.end() || !have->is_number()) continue;
      if (differs(w->get<double>(), have->get<double>())) return true;
    }
  }
  return false;
}

}  // namespace

const char* DeltaFairPolicy::Estimate::source() const noexcept {
  if (!measured) return "configured";
  if (measured_once) return "measured";
  return known ? "initial" : "none";
}

void DeltaFairPolicy::Estimate::update(double sample, double smoothing) noexcept {
  value = known ? value + smoothing * (sample - value) : sample;
  known = true;
  measured_once = true;
}

// ---------------------------------------------------------------------------
// The thresholds.

delta_fair::CacheModel DeltaFairPolicy::cache_model() const {
  const DeltaFairCache& c = *config_.cache;
  delta_fair::CacheModel m;
  m.capacity = c.capacity;
  // Without both estimates the refill rate is unknown: taken as 0 (ρ_i = f_i).
  m.refill_bandwidth = refill_.known && amplification_.known ? refill_.value : 0;
  m.read_amplification = amplification_.known ? std::max(1.0, amplification_.value) : 1;
  m.delta_ms = c.delta_ms;
  m.k = config_.k;
  return m;
}

delta_fair::CacheReservation DeltaFairPolicy::cache_reservation() const {
  if (!config_.cache) return {};
  std::vector<double> weights;
  weights.reserve(config_.tenants.size());
  for (const auto& t : config_.tenants) weights.push_back(t.weight);
  return delta_fair::reserve_cache(cache_model(), weights);
}

json DeltaFairPolicy::cache_config(const delta_fair::CacheReservation& r) const {
  json reserved = json::object();
  json weights = json::object();
  for (std::size_t i = 0; i < config_.tenants.size(); ++i) {
    const std::string id = std::to_string(config_.tenants[i].id);
    reserved[id] = r.per_tenant[i];
    weights[id] = config_.tenants[i].weight;
  }
  return {{"capacity", config_.cache->capacity},
          {"reserved", std::move(reserved)},
          {"weights", std::move(weights)}};
}

json DeltaFairPolicy::explain_cache() const {
  const delta_fair::CacheReservation r = cache_reservation();
  const DeltaFairCache& c = *config_.cache;
  json per_tenant = json::object();
  json shares = json::object();
  for (std::size_t i = 0; i < config_.tenants.size(); ++i) {
    per_tenant[config_.tenants[i].name] = r.per_tenant[i];
    shares[config_.tenants[i].name] = r.fair_share[i];
  }
  const delta_fair::CacheModel m = cache_model();
  return {{"reserved_bytes", r.reserved},
          {"reserved_fraction", r.reserved_fraction},
          {"per_tenant_bytes", std::move(per_tenant)},
          {"refill_time_ms", ms_json(r.refill_time_ms)},
          {"refill_time_reserved_ms", ms_json(r.refill_time_reserved_ms)},
          {"fair_share_bytes", std::move(shares)},
          {"refill_budget_bytes", std::isfinite(r.refill_budget) ? json(r.refill_budget) : json()},
          {"refill_rate", r.refill_rate},
          {"capacity", c.capacity},
          {"k", config_.k},
          {"ramp_ups", r.ramp_ups},
          {"delta_ms", delta_json(c.delta_ms)},
          {"refill_bandwidth", m.refill_bandwidth},
          {"refill_bandwidth_source", refill_.source()},
          {"read_amplification", m.read_amplification},
          {"read_amplification_source", amplification_.source()}};
}

// ---------------------------------------------------------------------------
// R_read and AMP.

void DeltaFairPolicy::measure_cache(const PolicyInput& input, json& refill, json& amplification) {
  const DeltaFairCache& c = *config_.cache;
  if (!refill_.measured && !amplification_.measured) return;
  // The fair shares the policy sent, for flows whose object does not say.
  std::map<std::uint64_t, double> share;
  const delta_fair::CacheReservation cr = cache_reservation();
  for (std::size_t i = 0; i < config_.tenants.size(); ++i) {
    share[config_.tenants[i].id] = static_cast<double>(cr.fair_share[i]);
  }
  double rate = 0, amp_read = 0, amp_inserted = 0;
  bool measured = false, backlogged = false, reported = false;
  for (const StageView& st : input.stages) {
    auto found = stages_.find(st.name);
    const StageMemory* mem =
        found != stages_.end() && found->second.connected_at_ns == st.connected_at_ns
            ? &found->second
            : nullptr;
    bool has_cache = false, inserted_known = false;
    double inserted = 0;
    for (const ChannelStats& ch : st.stats.channels) {
      const ObjectStats* o = stage_view::find_object(&ch, c.object);
      if (o == nullptr || o->type != kCacheType) continue;
      has_cache = true;
      auto flows = o->state.is_object() ? o->state.find("flows") : o->state.end();
      if (!o->state.is_object() || flows == o->state.end() || !flows->is_array()) continue;
      const PoolMemory* pm = nullptr;
      if (mem != nullptr) {
        if (auto it = mem->caches.find(ch.name); it != mem->caches.end()) pm = &it->second;
      }
      for (const json& f : *flows) {
        std::uint64_t id = 0;
        if (!f.is_object() || !flow_id(f, &id)) continue;
        const bool has_inserted = f.contains("inserted_bytes");
        reported = reported || has_inserted;
        if (pm == nullptr) continue;
        auto last = pm->last.find(id);
        if (last == pm->last.end()) continue;  // no earlier count to take a difference
        // A tenant below its fair share that missed in the interval: its
        // refills wait for the disk.
        const double fair = f.contains("fair_share") && number_of(f, "fair_share") > 0
                                ? number_of(f, "fair_share")
                                : (share.count(id) ? share[id] : 0);
        if (number_of(f, "misses") > last->second.misses && number_of(f, "usage") < fair) {
          backlogged = true;
        }
        const double now = number_of(f, "inserted_bytes");
        if (has_inserted && last->second.inserted_bytes >= 0 &&
            now >= last->second.inserted_bytes) {
          inserted += now - last->second.inserted_bytes;
          inserted_known = true;
        }
      }
    }
    if (!has_cache) continue;
    std::uint64_t bytes = 0;
    for (const ChannelStats& ch : st.stats.channels) {
      if (auto it = ch.by_origin.find(c.read_origin); it != ch.by_origin.end()) {
        bytes += it->second.bytes;
      }
    }
    if (inserted_known) {
      amp_read += static_cast<double>(bytes);
      amp_inserted += inserted;
    }
    const std::int64_t dt = stage_view::interval_ns(st, input);
    if (dt <= 0) continue;
    rate += static_cast<double>(bytes) * 1e9 / static_cast<double>(dt);
    measured = true;
  }
  if (refill_.measured) {
    refill = {{"backlogged", backlogged}};
    if (measured) refill["rate"] = rate;
    // Without a tenant waiting for refills the reads are what the tenants
    // ask for, not what the disk can give.
    if (measured && backlogged) {
      refill_.update(rate, c.smoothing);
      refill["used"] = true;
    }
  }
  if (amplification_.measured) {
    amplification = {{"inserted_bytes_reported", reported},
                     {"read_bytes", amp_read},
                     {"inserted_bytes", amp_inserted}};
    if (amp_read > 0 && amp_inserted > 0) {
      // At least 1: a cached byte is taken to cost at least the byte read.
      const double sample = std::max(1.0, amp_read / amp_inserted);
      amplification["sample"] = sample;
      amplification_.update(sample, c.smoothing);
      amplification["used"] = true;
    }
  }
}

// ---------------------------------------------------------------------------
// The stages' cache objects and the report.

void DeltaFairPolicy::step_cache_stage(const StageView& st, StageMemory& mem, const json& desired,
                                       json* rules, json* report, json* flows, std::string* error) {
  const DeltaFairCache& c = *config_.cache;
  std::vector<std::string> send;
  json rep = {{"channels", json::array()}};
  for (const Pool& p : pools_of(st, c.object)) {
    if (p.type != kCacheType) {
      *error = wrong_type(c.object, p, kCacheType);
      continue;
    }
    rep["channels"].push_back(p.channel);
    PoolMemory& pm = mem.caches[p.channel];
    if (pm.sent != desired || cache_differs(p.stats, pm.sent)) {
      send.push_back(p.channel);
      pm.sent = desired;
    }
    if (p.stats == nullptr || !p.stats->state.is_object()) continue;
    const json& s = p.stats->state;
    for (const char* field : {"capacity", "used"}) {
      rep[field] = rep.value(field, 0.0) + number_of(s, field);
    }
    auto fl = s.find("flows");
    if (fl == s.end() || !fl->is_array()) continue;
    pm.last.clear();
    for (const json& f : *fl) {
      std::uint64_t id = 0;
      if (!f.is_object() || !flow_id(f, &id)) continue;
      const bool has_inserted = f.contains("inserted_bytes");
      pm.last[id] = {number_of(f, "misses"), has_inserted ? number_of(f, "inserted_bytes") : -1};
      json& sum = (*flows)[std::to_string(id)];
      if (!sum.is_object()) sum = json::object();
      for (const char* field : kFlowCounters) {
        sum[field] = sum.value(field, 0.0) + number_of(f, field);
      }
      if (has_inserted) {
        sum["inserted_bytes"] = sum.value("inserted_bytes", 0.0) + number_of(f, "inserted_bytes");
      }
    }
  }
  rep["sent"] = !send.empty();
  *report = std::move(rep);
  append_configure(rules, c.object, send, desired);
}

json DeltaFairPolicy::cache_report(const delta_fair::CacheReservation& r, json flows, json stages,
                                   json refill, json amplification) const {
  json tenants = json::object();
  for (std::size_t i = 0; i < config_.tenants.size(); ++i) {
    const DeltaFairTenant& t = config_.tenants[i];
    json e = {{"id", t.id}, {"fair_share", r.fair_share[i]}, {"reserved", r.per_tenant[i]}};
    const std::string id = std::to_string(t.id);
    if (auto f = flows.find(id); f != flows.end()) {
      e.update(*f);
      flows.erase(f);
    }
    tenants[t.name] = std::move(e);
  }
  json rb = {{"in_use", refill_.value}, {"source", refill_.source()}};
  if (refill_.measured) rb["estimate"] = std::move(refill);
  json amp = {{"in_use", amplification_.value}, {"source", amplification_.source()}};
  if (amplification_.measured) amp["estimate"] = std::move(amplification);
  json out = {{"refill_bandwidth", std::move(rb)},
              {"read_amplification", std::move(amp)},
              {"tenants", std::move(tenants)},
              {"stages", std::move(stages)}};
  if (!flows.empty()) out["other_flows"] = std::move(flows);
  return out;
}

}  // namespace sluice
