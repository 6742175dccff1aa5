// `sluice rules` and `sluice policy`: steering the daemon, and checking a
// policy file before it is set.
#include <cstdio>
#include <string>

#include "cli_commands.h"
#include "cli_format.h"
#include "policy_doc.h"

namespace sluice::control::cli {

int cmd_rules_apply(const Global& g, const std::string& file, const std::string& stage) {
  auto rules = read_json_file(file);
  if (!rules) return fail(rules.status());
  auto r = call(g, wire::Type::kApplyRules, json{{"stage", stage}, {"rules", *rules}});
  if (!r) return fail(r.status());
  std::printf("applied to stage '%s' (rules_version %llu)\n", stage.c_str(),
              static_cast<unsigned long long>(r->value("rules_version", std::uint64_t{0})));
  return kExitOk;
}

int cmd_policy_show(const Global& g, bool as_json) {
  auto r = call(g, wire::Type::kPolicyShow);
  if (!r) return fail(r.status());
  json out = *r;
  for (const char* k : {"v", "type", "id"}) out.erase(k);
  if (as_json) {
    std::printf("%s\n", out.dump(2).c_str());
    return kExitOk;
  }
  std::printf("policy:   %s\nsource:   %s\ninterval: %d ms\nconfig:   %s\nreport:   %s\n",
              out.value("policy", std::string()).c_str(),
              out.value("source", std::string()).c_str(), out.value("interval_ms", 0),
              out.value("describe", json()).dump().c_str(),
              out.value("report", json()).dump().c_str());
  const json m = out.value("metrics", json::object());
  std::printf("metrics:  %s\n", m.dump().c_str());
  return kExitOk;
}

int cmd_policy_set(const Global& g, const std::string& file) {
  auto doc = read_json_file(file);
  if (!doc) return fail(doc.status());
  Status s = inline_rules_files(*doc, dir_of(file));
  if (!s.is_ok()) return fail(s);
  auto r = call(g, wire::Type::kPolicySet, json{{"policy", *doc}});
  if (!r) return fail(r.status());
  std::printf("policy '%s' in force (interval %d ms)\n", r->value("policy", std::string()).c_str(),
              r->value("interval_ms", 0));
  return kExitOk;
}

int cmd_policy_check(const std::string& file, bool as_json) {
  auto r = check_policy_file(file);
  if (!r) {
    std::fprintf(stderr, "sluice policy check: %s\n", r.status().message().c_str());
    return r.status().code() == Code::kInvalidArgument ? kExitUsage : kExitError;
  }
  const json& out = *r;
  if (as_json) {
    std::printf("%s\n", out.dump(2).c_str());
    return kExitOk;
  }
  const json& interval = out["interval_ms"];
  std::printf("policy:   %s\ninterval: %s\n", out.value("policy", std::string()).c_str(),
              interval.is_number() ? (interval.dump() + " ms").c_str() : "(the daemon's)");
  const json reservations = out.value("reservations", json::object());
  for (const auto& [resource, res] : reservations.items()) {
    if (!res.is_object()) continue;
    const json& delta = res.value("delta_ms", json());
    std::printf("%s: reserved %s of %s (%.2f%%), delta %s, k %s\n", resource.c_str(),
                human_bytes(res.value("reserved_bytes", 0.0)).c_str(),
                human_bytes(res.value("capacity", 0.0)).c_str(),
                100 * res.value("reserved_fraction", 0.0),
                delta.is_number() ? human_ms(delta).c_str() : delta.dump().c_str(),
                res.value("k", json()).dump().c_str());
    if (res.contains("refill_time_ms")) {  // a read cache
      std::printf(
          "  refill bandwidth %s/s (%s), read amplification %.2f (%s); refill time without "
          "reservations %s; with them %s\n",
          human_bytes(res.value("refill_bandwidth", 0.0)).c_str(),
          res.value("refill_bandwidth_source", std::string()).c_str(),
          res.value("read_amplification", 1.0),
          res.value("read_amplification_source", std::string()).c_str(),
          human_ms(res.value("refill_time_ms", json())).c_str(),
          human_ms(res.value("refill_time_reserved_ms", json())).c_str());
    } else {
      std::printf("  flush bandwidth %s/s (%s); worst case without reservations %s; with them %s\n",
                  human_bytes(res.value("flush_bandwidth", 0.0)).c_str(),
                  res.value("flush_bandwidth_source", std::string()).c_str(),
                  human_ms(res.value("worst_case_delay_ms", json())).c_str(),
                  human_ms(res.value("flush_time_ms", json())).c_str());
    }
    const json shares = res.value("fair_share_bytes", json::object());
    const json held = res.value("per_tenant_bytes", json::object());
    std::printf("  %-24s %14s %14s\n", "TENANT", "FAIR-SHARE", "RESERVED");
    for (const auto& [tenant, bytes] : held.items()) {
      const double share = shares.contains(tenant) ? shares[tenant].get<double>() : 0.0;
      std::printf("  %-24.24s %14s %14s\n", tenant.c_str(), human_bytes(share).c_str(),
                  human_bytes(bytes.is_number() ? bytes.get<double>() : 0.0).c_str());
    }
  }
  // flex: each partition's buckets, and the node's.
  const json partitions = out.value("partitions", json::object());
  if (out.contains("node_rate") && partitions.is_object()) {
    const json& node = out["node_rate"];
    std::printf("node:     %s\n",
                node.is_number() ? (human_bytes(node.get<double>()) + "/s").c_str() : "-");
    std::printf("  %-16s %-16s %14s %14s %8s\n", "PARTITION", "STAGE", "FOREGROUND/s",
                "BACKGROUND/s", "LSM-BA");
    for (const auto& [name, p] : partitions.items()) {
      std::printf("  %-16.16s %-16.16s %14s %14s %8.1f\n", name.c_str(),
                  p.value("stage", std::string()).c_str(),
                  human_bytes(p.value("foreground_rate", 0.0)).c_str(),
                  human_bytes(p.value("background_rate", 0.0)).c_str(), p.value("lsm_ba", 0.0));
    }
  }
  const json config = out.value("config", out.value("explain", json()));
  std::printf("config:   %s\n", config.dump().c_str());
  return kExitOk;
}

}  // namespace sluice::control::cli
