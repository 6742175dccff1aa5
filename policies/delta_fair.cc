// Delta Fair Sharing for write buffers; see delta_fair.h. The arithmetic is
// in delta_fair_math.cc.
#include "delta_fair.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "config_reader.h"
#include "stage_view.h"

namespace sluice {
namespace {

using nlohmann::json;
using namespace policy_config;  // NOLINT(google-build-using-namespace)

constexpr std::size_t kMaxTenants = 65536;
constexpr int kMaxK = 65536;

// j[key] as a whole number of bytes >= min into *out; `required` when absent
// is an error.
Status get_bytes(const json& j, const std::string& path, std::string_view key, std::uint64_t* out,
                 std::uint64_t min, bool required) {
  auto it = j.find(key);
  const std::string f = join_path(path, key);
  if (it == j.end()) return required ? Status::invalid(f + ": required") : Status::ok();
  const bool whole =
      it->is_number_unsigned() || (it->is_number_integer() && it->get<std::int64_t>() >= 0);
  if (!whole || it->get<std::uint64_t>() < min) {
    return Status::invalid(f + ": must be an integer number of bytes >= " + std::to_string(min) +
                           ", got " + it->dump());
  }
  *out = it->get<std::uint64_t>();
  return Status::ok();
}

Status parse_tenants(const json& j, std::vector<DeltaFairTenant>* out) {
  auto it = j.find("tenants");
  if (it == j.end()) return Status::invalid("tenants: required (a list of {name, weight, id})");
  if (!it->is_array() || it->empty() || it->size() > kMaxTenants) {
    return Status::invalid("tenants: must be a list of 1.." + std::to_string(kMaxTenants) +
                           " tenants {\"name\", \"weight\", \"id\"}, got " + it->dump());
  }
  std::set<std::string> names;
  std::set<std::uint64_t> ids;
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const std::string path = "tenants[" + std::to_string(i) + "]";
    SLUICE_RETURN_IF_ERROR(check_keys(t, path, {"name", "weight", "id"}));
    DeltaFairTenant tenant;
    tenant.id = i + 1;
    auto name = t.find("name");
    if (name == t.end()) return Status::invalid(path + ".name: required");
    SLUICE_RETURN_IF_ERROR(get_name(*name, path + ".name", &tenant.name));
    SLUICE_RETURN_IF_ERROR(get_number(t, path, "weight", &tenant.weight,
                                      DeltaFairPolicy::kMinWeight, true,
                                      DeltaFairPolicy::kMaxWeight));
    if (auto id = t.find("id"); id != t.end()) {
      const bool whole =
          id->is_number_unsigned() || (id->is_number_integer() && id->get<std::int64_t>() >= 0);
      if (!whole || id->get<std::uint64_t>() > DeltaFairPolicy::kMaxTenantId) {
        return Status::invalid(
            path + ".id: must be a tenant id, an integer in 0..4294967295, got " + id->dump());
      }
      tenant.id = id->get<std::uint64_t>();
    }
    if (!names.insert(tenant.name).second) {
      return Status::invalid(path + ".name: '" + tenant.name + "' names another tenant too");
    }
    if (!ids.insert(tenant.id).second) {
      return Status::invalid(path + ".id: " + std::to_string(tenant.id) +
                             " is another tenant's id too (an absent id is the position + 1)");
    }
    out->push_back(std::move(tenant));
  }
  return Status::ok();
}

Status parse_buffer(const json& j, DeltaFairBuffer* b) {
  auto it = j.find("write_buffer");
  if (it == j.end()) {
    return Status::invalid(
        "write_buffer: required ({\"capacity\", \"segment\", \"flush_bandwidth\", \"delta_ms\"})");
  }
  const json& w = *it;
  const std::string p = "write_buffer";
  SLUICE_RETURN_IF_ERROR(
      check_keys(w, p,
                 {"capacity", "segment", "flush_bandwidth", "flush_bandwidth_initial",
                  "flush_smoothing", "flush_origin", "delta_ms", "object", "rounding"}));
  SLUICE_RETURN_IF_ERROR(get_bytes(w, p, "capacity", &b->capacity, 1, true));
  SLUICE_RETURN_IF_ERROR(get_bytes(w, p, "segment", &b->segment, 1, true));
  if (b->segment > b->capacity) {
    return Status::invalid("write_buffer.segment: must be <= capacity (" +
                           std::to_string(b->capacity) + "), got " + std::to_string(b->segment));
  }
  auto bw = w.find("flush_bandwidth");
  if (bw == w.end()) {
    return Status::invalid(
        "write_buffer.flush_bandwidth: required (bytes per second, or \"measured\")");
  }
  if (bw->is_string() && bw->get_ref<const std::string&>() == "measured") {
    b->measured = true;
    SLUICE_RETURN_IF_ERROR(
        get_number(w, p, "flush_bandwidth_initial", &b->flush_bandwidth, 0, false));
  } else {
    if (!bw->is_number()) {
      return Status::invalid(
          "write_buffer.flush_bandwidth: must be bytes per second (> 0) or \"measured\", got " +
          bw->dump());
    }
    SLUICE_RETURN_IF_ERROR(get_number(w, p, "flush_bandwidth", &b->flush_bandwidth, 0, false));
    if (w.contains("flush_bandwidth_initial")) {
      return Status::invalid(
          "write_buffer.flush_bandwidth_initial: only with \"flush_bandwidth\": \"measured\"");
    }
  }
  SLUICE_RETURN_IF_ERROR(get_number(w, p, "flush_smoothing", &b->smoothing, 0, false, 1));
  SLUICE_RETURN_IF_ERROR(get_string(w, p, "flush_origin", &b->flush_origin));
  auto delta = w.find("delta_ms");
  if (delta == w.end()) return Status::invalid("write_buffer.delta_ms: required (ms, or \"inf\")");
  if (delta->is_string() && delta->get_ref<const std::string&>() == "inf") {
    b->delta_ms = std::numeric_limits<double>::infinity();
  } else if (!delta->is_number()) {
    return Status::invalid("write_buffer.delta_ms: must be a number of ms >= 0 or \"inf\", got " +
                           delta->dump());
  } else {
    SLUICE_RETURN_IF_ERROR(get_number(w, p, "delta_ms", &b->delta_ms, 0, true));
  }
  SLUICE_RETURN_IF_ERROR(get_string(w, p, "object", &b->object));
  SLUICE_RETURN_IF_ERROR(get_choice<delta_fair::Rounding>(
      w, p, "rounding",
      {{"strict", delta_fair::Rounding::kStrict}, {"nearest", delta_fair::Rounding::kNearest}},
      &b->rounding));
  return Status::ok();
}

json ms_json(double ms) {
  return std::isfinite(ms) ? json(ms) : json(nullptr);
}

// A flow entry's id: a non-negative integer, or decimal digits.
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

// The pool objects a stage holds: by channel, with their statistics when
// the stage reported them (its description alone names the others).
struct Pool {
  std::string channel;
  std::string type;
  const ObjectStats* stats = nullptr;
};

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

json configure_batch(const std::string& object, const std::vector<std::string>& channels,
                     const json& config) {
  json rules = json::array();
  for (const auto& c : channels) {
    rules.push_back(
        {{"rule", "configure"}, {"channel", c}, {"object", object}, {"config", config}});
  }
  return {{"version", 1}, {"rules", std::move(rules)}};
}

}  // namespace

// ---------------------------------------------------------------------------
// Configuration.

StatusOr<DeltaFairConfig> parse_delta_fair_config(const json& j) {
  DeltaFairConfig c;
  if (j.is_object() && j.contains("cache")) {
    return Status::invalid(
        "cache: not supported yet (delta-fair sizes the write buffer's reservations only)");
  }
  SLUICE_RETURN_IF_ERROR(check_keys(j, "", {"k", "tenants", "write_buffer"}));
  if (auto it = j.find("k"); it != j.end()) {
    if (!it->is_number_integer() || it->get<std::int64_t>() < 1 ||
        it->get<std::int64_t>() > kMaxK) {
      return Status::invalid("k: must be an integer in 1.." + std::to_string(kMaxK) + ", got " +
                             it->dump());
    }
    c.k = it->get<int>();
  }
  SLUICE_RETURN_IF_ERROR(parse_tenants(j, &c.tenants));
  SLUICE_RETURN_IF_ERROR(parse_buffer(j, &c.write_buffer));
  return c;
}

json delta_fair_config_to_json(const DeltaFairConfig& c) {
  json tenants = json::array();
  for (const auto& t : c.tenants) {
    tenants.push_back({{"name", t.name}, {"id", t.id}, {"weight", t.weight}});
  }
  const DeltaFairBuffer& b = c.write_buffer;
  json wb = {{"capacity", b.capacity},
             {"segment", b.segment},
             {"delta_ms", std::isinf(b.delta_ms) ? json("inf") : json(b.delta_ms)},
             {"object", b.object},
             {"rounding", delta_fair::rounding_name(b.rounding)}};
  if (b.measured) {
    wb["flush_bandwidth"] = "measured";
    if (b.flush_bandwidth > 0) wb["flush_bandwidth_initial"] = b.flush_bandwidth;
    wb["flush_smoothing"] = b.smoothing;
    wb["flush_origin"] = b.flush_origin;
  } else {
    wb["flush_bandwidth"] = b.flush_bandwidth;
  }
  return {{"k", c.k}, {"tenants", std::move(tenants)}, {"write_buffer", std::move(wb)}};
}

Status DeltaFairPolicy::configure(const json& config) {
  auto parsed = parse_delta_fair_config(config);
  if (!parsed.is_ok()) return parsed.status();
  config_ = std::move(parsed).value();
  bandwidth_ = config_.write_buffer.flush_bandwidth;
  bandwidth_known_ = !config_.write_buffer.measured || bandwidth_ > 0;
  measured_once_ = false;
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
// The reservation.

delta_fair::BufferModel DeltaFairPolicy::model() const {
  delta_fair::BufferModel m;
  m.capacity = config_.write_buffer.capacity;
  m.segment = config_.write_buffer.segment;
  m.flush_bandwidth = bandwidth_;
  m.delta_ms = config_.write_buffer.delta_ms;
  m.k = config_.k;
  m.rounding = config_.write_buffer.rounding;
  return m;
}

delta_fair::Reservation DeltaFairPolicy::reservation() const {
  std::vector<double> weights;
  weights.reserve(config_.tenants.size());
  for (const auto& t : config_.tenants) weights.push_back(t.weight);
  return delta_fair::reserve(model(), weights);
}

json DeltaFairPolicy::pool_config(const delta_fair::Reservation& r) const {
  json weights = json::object();
  for (const auto& t : config_.tenants) weights[std::to_string(t.id)] = t.weight;
  return {{"capacity", config_.write_buffer.capacity},
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

json DeltaFairPolicy::explain() const {
  const delta_fair::Reservation r = reservation();
  const DeltaFairBuffer& b = config_.write_buffer;
  json per_tenant = json::object();
  json shares = json::object();
  for (std::size_t i = 0; i < config_.tenants.size(); ++i) {
    per_tenant[config_.tenants[i].name] = r.per_tenant[i];
    shares[config_.tenants[i].name] = r.fair_share[i];
  }
  json wb = {{"reserved_bytes", r.reserved},
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
             {"delta_ms", std::isinf(b.delta_ms) ? json("inf") : json(b.delta_ms)},
             {"rounding", delta_fair::rounding_name(b.rounding)},
             {"flush_bandwidth", bandwidth_},
             {"flush_bandwidth_source", bandwidth_source(b, bandwidth_known_, measured_once_)}};
  return {{"config", describe()}, {"reservations", {{"write_buffer", std::move(wb)}}}};
}

// ---------------------------------------------------------------------------
// The step.

void DeltaFairPolicy::measure_bandwidth(const PolicyInput& input, json& estimate) {
  const DeltaFairBuffer& b = config_.write_buffer;
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
  const json desired = pool_config(reservation());
  std::vector<std::string> channels;
  StageMemory mem;
  mem.connected_at_ns = st.connected_at_ns;
  for (const Pool& p : pools_of(st, config_.write_buffer.object)) {
    if (p.type != kPoolType) continue;
    channels.push_back(p.channel);
    mem.pools[p.channel].sent = desired;
  }
  if (channels.empty()) return {};
  stages_[st.name] = std::move(mem);
  return configure_batch(config_.write_buffer.object, channels, desired);
}

PolicyOutput DeltaFairPolicy::step(const PolicyInput& input) {
  PolicyOutput out;
  const DeltaFairBuffer& b = config_.write_buffer;
  json estimate;
  if (b.measured) measure_bandwidth(input, estimate);
  const delta_fair::Reservation r = reservation();
  const json desired = pool_config(r);

  json departed = json::array();
  for (const auto& name : input.departed) {
    if (stages_.erase(name)) departed.push_back(name);
  }
  std::set<std::string> seen;
  json errors = json::object();
  json stages = json::object();
  // Per tenant id: the pools' counters summed over the stages.
  struct Usage {
    double usage = 0, stalls = 0, stall_ns = 0, queued = 0, max_stall_ns = 0, granted = 0;
    bool seen = false;
  };
  std::map<std::uint64_t, Usage> usage;
  for (const StageView& st : input.stages) {
    std::vector<Pool> pools = pools_of(st, b.object);
    if (pools.empty()) continue;
    StageMemory& mem = stages_[st.name];
    if (mem.connected_at_ns != st.connected_at_ns) mem.pools.clear();  // a new connection
    mem.connected_at_ns = st.connected_at_ns;
    mem.absent_steps = 0;
    seen.insert(st.name);
    std::vector<std::string> send;
    json rep = {{"channels", json::array()}};
    for (const Pool& p : pools) {
      if (p.type != kPoolType) {
        errors[st.name] = "object '" + b.object + "' in channel '" + p.channel + "' is a '" +
                          p.type + "', not a '" + std::string(kPoolType) + "': not configured";
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
    if (!send.empty()) out.rules[st.name] = configure_batch(b.object, send, desired);
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
    json e = {{"id", t.id},
              {"weight", t.weight},
              {"fair_share", r.fair_share[i]},
              {"reserved", r.per_tenant[i]}};
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

  json res = explain().at("reservations");
  json bandwidth = {{"in_use", bandwidth_},
                    {"source", bandwidth_source(b, bandwidth_known_, measured_once_)}};
  if (b.measured) bandwidth["estimate"] = std::move(estimate);
  out.report = {{"policy", "delta-fair"},
                {"reservations", std::move(res)},
                {"flush_bandwidth", bandwidth},
                {"tenants", std::move(tenants)},
                {"stages", std::move(stages)}};
  if (!others.empty()) out.report["other_flows"] = std::move(others);
  if (!departed.empty()) out.report["departed"] = std::move(departed);
  if (!errors.empty()) out.report["errors"] = std::move(errors);
  return out;
}

}  // namespace sluice
