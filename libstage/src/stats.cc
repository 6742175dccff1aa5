#include "sluice/stats.h"

#include <bit>

namespace sluice {

std::uint64_t WaitStats::count() const noexcept {
  std::uint64_t n = 0;
  for (auto b : buckets) n += b;
  return n;
}

int WaitStats::bucket_of(std::uint64_t wait_ns) noexcept {
  if (wait_ns == 0) return 0;
  std::uint64_t us = wait_ns / 1000;
  int b = static_cast<int>(std::bit_width(us)) + 1;  // [0,1us) -> 1, [1,2us) -> 2, ...
  return b < kWaitBuckets ? b : kWaitBuckets - 1;
}

std::uint64_t WaitStats::quantile_ns(double q) const noexcept {
  std::uint64_t n = count();
  if (n == 0) return 0;
  if (q < 0) q = 0;
  if (q > 1) q = 1;
  auto rank = static_cast<std::uint64_t>(q * static_cast<double>(n - 1)) + 1;
  std::uint64_t seen = 0;
  for (int b = 0; b < kWaitBuckets; ++b) {
    seen += buckets[static_cast<std::size_t>(b)];
    if (seen >= rank) return b == 0 ? 0 : (std::uint64_t{1} << (b - 1)) * 1000;
  }
  return (std::uint64_t{1} << (kWaitBuckets - 2)) * 1000;
}

void WaitStats::add(const WaitStats& o) noexcept {
  for (std::size_t i = 0; i < buckets.size(); ++i) buckets[i] += o.buckets[i];
  total_ns += o.total_ns;
}

const ChannelStats* StageStats::channel(std::string_view name) const noexcept {
  for (const auto& c : channels) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

void to_json(nlohmann::json& j, const WaitStats& s) {
  j = {{"count", s.count()},
       {"total_ns", s.total_ns},
       {"p50_ns", s.quantile_ns(0.50)},
       {"p99_ns", s.quantile_ns(0.99)},
       {"buckets", s.buckets}};
}

void to_json(nlohmann::json& j, const Counters& s) {
  j = {{"ops", s.ops}, {"bytes", s.bytes}};
}

void to_json(nlohmann::json& j, const ObjectStats& s) {
  j = {{"name", s.name},           {"type", s.type},         {"ops", s.total.ops},
       {"bytes", s.total.bytes},   {"origins", s.by_origin}, {"wait", s.wait},
       {"cancelled", s.cancelled}, {"rejected", s.rejected}, {"state", s.state}};
}

void to_json(nlohmann::json& j, const ChannelStats& s) {
  j = {{"name", s.name},         {"ops", s.total.ops}, {"bytes", s.total.bytes},
       {"origins", s.by_origin}, {"wait", s.wait},     {"objects", s.objects}};
}

void to_json(nlohmann::json& j, const StageStats& s) {
  j = {{"stage", s.stage},
       {"interval_ns", s.interval_ns},
       {"collected_at_ns", s.collected_at_ns},
       {"ops", s.total.ops},
       {"bytes", s.total.bytes},
       {"unclassified", s.unclassified},
       {"channels", s.channels}};
}

namespace {

// A small reader that records the path of the field it is reading, so that
// every error names it ("channels[1].objects[0].ops: must be an unsigned integer").
struct Reader {
  Status error;

  const nlohmann::json* field(const nlohmann::json& obj, const std::string& path, const char* key) {
    if (!error.is_ok()) return nullptr;
    if (!obj.is_object()) {
      error = Status::invalid(path + ": must be an object");
      return nullptr;
    }
    auto it = obj.find(key);
    if (it == obj.end()) {
      error = Status::invalid(path + "." + key + ": missing");
      return nullptr;
    }
    return &*it;
  }
  std::uint64_t u64(const nlohmann::json& obj, const std::string& path, const char* key) {
    const nlohmann::json* v = field(obj, path, key);
    if (v == nullptr) return 0;
    if (!v->is_number_unsigned() && !(v->is_number_integer() && v->get<std::int64_t>() >= 0)) {
      error = Status::invalid(path + "." + key + ": must be an unsigned integer");
      return 0;
    }
    return v->get<std::uint64_t>();
  }
  std::int64_t i64(const nlohmann::json& obj, const std::string& path, const char* key) {
    const nlohmann::json* v = field(obj, path, key);
    if (v == nullptr) return 0;
    if (!v->is_number_integer()) {
      error = Status::invalid(path + "." + key + ": must be an integer");
      return 0;
    }
    return v->get<std::int64_t>();
  }
  std::string str(const nlohmann::json& obj, const std::string& path, const char* key) {
    const nlohmann::json* v = field(obj, path, key);
    if (v == nullptr) return {};
    if (!v->is_string()) {
      error = Status::invalid(path + "." + key + ": must be a string");
      return {};
    }
    return v->get<std::string>();
  }
  const nlohmann::json* array(const nlohmann::json& obj, const std::string& path, const char* key) {
    const nlohmann::json* v = field(obj, path, key);
    if (v != nullptr && !v->is_array()) {
      error = Status::invalid(path + "." + key + ": must be an array");
      return nullptr;
    }
    return v;
  }
  Counters counters(const nlohmann::json& obj, const std::string& path) {
    return {u64(obj, path, "ops"), u64(obj, path, "bytes")};
  }
  std::map<std::string, Counters> origins(const nlohmann::json& obj, const std::string& path) {
    std::map<std::string, Counters> out;
    const nlohmann::json* v = field(obj, path, "origins");
    if (v == nullptr) return out;
    if (!v->is_object()) {
      error = Status::invalid(path + ".origins: must be an object");
      return out;
    }
    for (const auto& [name, c] : v->items()) out[name] = counters(c, path + ".origins." + name);
    return out;
  }
  WaitStats wait(const nlohmann::json& obj, const std::string& path) {
    WaitStats w;
    const nlohmann::json* v = field(obj, path, "wait");
    if (v == nullptr) return w;
    std::string p = path + ".wait";
    w.total_ns = u64(*v, p, "total_ns");
    const nlohmann::json* b = array(*v, p, "buckets");
    if (b == nullptr) return w;
    if (b->size() != w.buckets.size()) {
      error =
          Status::invalid(p + ".buckets: must have " + std::to_string(kWaitBuckets) + " entries");
      return w;
    }
    for (std::size_t i = 0; i < w.buckets.size(); ++i) {
      if (!(*b)[i].is_number_unsigned() && !(*b)[i].is_number_integer()) {
        error = Status::invalid(p + ".buckets[" + std::to_string(i) + "]: must be an integer");
        return w;
      }
      w.buckets[i] = (*b)[i].get<std::uint64_t>();
    }
    return w;
  }
};

}  // namespace

StatusOr<StageStats> stage_stats_from_json(const nlohmann::json& j) {
  Reader r;
  StageStats s;
  const std::string root = "stats";
  s.stage = r.str(j, root, "stage");
  s.interval_ns = r.i64(j, root, "interval_ns");
  s.collected_at_ns = r.i64(j, root, "collected_at_ns");
  s.total = Counters{r.u64(j, root, "ops"), r.u64(j, root, "bytes")};
  if (const auto* u = r.field(j, root, "unclassified"))
    s.unclassified = r.counters(*u, root + ".unclassified");
  if (const auto* chans = r.array(j, root, "channels")) {
    for (std::size_t ci = 0; ci < chans->size() && r.error.is_ok(); ++ci) {
      const auto& cj = (*chans)[ci];
      std::string cp = root + ".channels[" + std::to_string(ci) + "]";
      ChannelStats c;
      c.name = r.str(cj, cp, "name");
      c.total = r.counters(cj, cp);
      c.by_origin = r.origins(cj, cp);
      c.wait = r.wait(cj, cp);
      if (const auto* objs = r.array(cj, cp, "objects")) {
        for (std::size_t oi = 0; oi < objs->size() && r.error.is_ok(); ++oi) {
          const auto& oj = (*objs)[oi];
          std::string op = cp + ".objects[" + std::to_string(oi) + "]";
          ObjectStats o;
          o.name = r.str(oj, op, "name");
          o.type = r.str(oj, op, "type");
          o.total = r.counters(oj, op);
          o.by_origin = r.origins(oj, op);
          o.wait = r.wait(oj, op);
          o.cancelled = r.u64(oj, op, "cancelled");
          o.rejected = r.u64(oj, op, "rejected");
          if (const auto* st = r.field(oj, op, "state")) o.state = *st;
          c.objects.push_back(std::move(o));
        }
      }
      s.channels.push_back(std::move(c));
    }
  }
  if (!r.error.is_ok()) return r.error;
  return s;
}

}  // namespace sluice
