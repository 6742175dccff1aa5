// Fuzzes what the cluster roles read from etcd: a value is a node's summary,
// a node's decision, or the leader's stored state, read as they read it
// (parse_json_text, then summary_from_json, decision_from_json, a policy's
// restore()). Nothing may throw or crash; what is taken is within the bounds
// the readers promise (every number finite, at most kMaxClusterValue); a
// refused restore changes nothing; a policy stepped on what was taken yields
// finite budgets.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "cluster_policy.h"
#include "sluice/json_text.h"

using nlohmann::json;
namespace cl = sluice::cluster;

namespace {

bool bounded(double v) {
  return std::isfinite(v) && v >= 0 && v <= cl::kMaxClusterValue;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = sluice::parse_json_text(text);
  if (!parsed) return 0;
  const json& j = *parsed;
  cl::ClusterInput in;
  in.interval_ns = 1'000'000'000;
  if (auto s = cl::summary_from_json(j)) {
    for (const cl::TenantLoad& l : s->loads) {
      if (!bounded(l.demand) || !bounded(l.service) || !bounded(l.budget) || !bounded(l.ops) ||
          !bounded(l.wait)) {
        __builtin_trap();
      }
    }
    s->node = "n1";
    in.nodes.push_back(*s);
    s->node = "n2";
    in.nodes.push_back(*s);
  }
  if (auto d = cl::decision_from_json(j)) {
    for (const cl::Budget& b : d->budgets) {
      if (!bounded(b.value)) __builtin_trap();
    }
    for (const cl::Setting& s : d->settings) {
      if (!bounded(s.value)) __builtin_trap();
    }
  }
  const json configs[] = {
      json{{"tenants", {{"A", {{"limit", 1e6}}}, {"B", {{"limit", 5e5}}}}}},
      json{{"capacity", 1e6}},
      json{{"capacity", 1e6}, {"tenants", {{"A", {{"weight", 2}}}}}},
  };
  const char* names[] = {"global-rate", "maxmin", "pisces"};
  for (int i = 0; i < 3; ++i) {
    auto p = cl::make_cluster_policy(names[i], configs[i]);
    if (!p) __builtin_trap();
    const json before = (*p)->state();
    if (!(*p)->restore(j).is_ok() && (*p)->state() != before) __builtin_trap();
    const cl::ClusterOutput out = (*p)->step(in);
    for (const auto& [node, d] : out.decisions) {
      for (const cl::Budget& b : d.budgets) {
        if (!std::isfinite(b.value) || b.value < 0) __builtin_trap();
      }
    }
  }
  return 0;
}
