#include "cli_format.h"

#include <cmath>

#include "sluice/stats.h"

namespace sluice::control::cli {

using nlohmann::json;

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

std::string human_ns(std::uint64_t ns) {
  char buf[32];
  if (ns == 0) return "0";
  if (ns < 1000)
    std::snprintf(buf, sizeof(buf), "%lluns", static_cast<unsigned long long>(ns));
  else if (ns < 1000000)
    std::snprintf(buf, sizeof(buf), "%.1fus", static_cast<double>(ns) / 1e3);
  else if (ns < 1000000000)
    std::snprintf(buf, sizeof(buf), "%.1fms", static_cast<double>(ns) / 1e6);
  else
    std::snprintf(buf, sizeof(buf), "%.2fs", static_cast<double>(ns) / 1e9);
  return buf;
}

std::string human_duration(double s) {
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof(buf), "%.0fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof(buf), "%.0fm%02.0fs", s / 60 - 0.5, std::fmod(s, 60));
  else
    std::snprintf(buf, sizeof(buf), "%.1fh", s / 3600);
  return buf;
}

std::string human_ms(const json& v) {
  if (!v.is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f ms", v.get<double>());
  return buf;
}

std::vector<Row> stats_rows(const json& reply, bool objects) {
  std::vector<Row> rows;
  for (const auto& e : reply.value("stages", json::array())) {
    std::string name = e.value("name", std::string());
    const json& js = e.contains("stats") ? e["stats"] : json();
    if (js.is_null()) {
      rows.push_back({name, "-", "", 0, 0, 0, 0, 0, 0});
      continue;
    }
    auto st = stage_stats_from_json(js);
    if (!st) continue;
    double secs = st->interval_ns > 0 ? static_cast<double>(st->interval_ns) / 1e9 : 1.0;
    auto rate = [&](std::uint64_t v) { return static_cast<double>(v) / secs; };
    rows.push_back({name, "*", "", rate(st->total.ops), rate(st->total.bytes), st->total.ops,
                    st->total.bytes, 0, 0});
    for (const auto& ch : st->channels) {
      rows.push_back({name, ch.name, "", rate(ch.total.ops), rate(ch.total.bytes), ch.total.ops,
                      ch.total.bytes, ch.wait.quantile_ns(0.5), ch.wait.quantile_ns(0.99)});
      if (!objects) continue;
      for (const auto& o : ch.objects) {
        rows.push_back({name, ch.name, o.name, rate(o.total.ops), rate(o.total.bytes), o.total.ops,
                        o.total.bytes, o.wait.quantile_ns(0.5), o.wait.quantile_ns(0.99)});
      }
    }
  }
  return rows;
}

void print_header(std::FILE* out) {
  std::fprintf(out, "%-24s %-16s %-16s %12s %12s %10s %10s\n", "STAGE", "CHANNEL", "OBJECT",
               "OPS/S", "BYTES/S", "WAIT-P50", "WAIT-P99");
}

void print_row(const Row& r, std::FILE* out) {
  std::fprintf(out, "%-24.24s %-16.16s %-16.16s %12.1f %12s %10s %10s\n", r.stage.c_str(),
               r.channel.c_str(), r.object.c_str(), r.ops_s, human_bytes(r.bytes_s).c_str(),
               human_ns(r.p50).c_str(), human_ns(r.p99).c_str());
}

void print_deferral(const json& reply, std::FILE* out) {
  bool header = false;
  for (const auto& e : reply.value("stages", json::array())) {
    if (!e.contains("stats") || e["stats"].is_null()) continue;
    auto st = stage_stats_from_json(e["stats"]);
    if (!st) continue;
    for (const auto& ch : st->channels) {
      for (const auto& o : ch.objects) {
        if (o.type != "deferral-gate" || !o.state.is_object()) continue;
        for (const auto& p : o.state.value("partitions", json::array())) {
          if (!header) {
            std::fprintf(out, "\n%-24s %-16s %-12s %-12s %-12s %8s %7s %9s %9s %10s\n", "STAGE",
                         "GATE", "PARTITION", "STATE", "DECISION", "LEFT", "L0/TRIG", "HELD-1ST",
                         "HELD-2ND", "GROWTH");
            header = true;
          }
          const json held = p.value("held_ms", json::object());
          const std::string l0 = std::to_string(p.value("l0_files", 0ULL)) + "/" +
                                 std::to_string(p.value("l0_slowdown_trigger", 0ULL));
          auto ms = [](double v) { return human_ns(static_cast<std::uint64_t>(v * 1e6)); };
          std::fprintf(out, "%-24.24s %-16.16s %-12.12s %-12.12s %-12.12s %8s %7s %9s %9s %10s\n",
                       st->stage.c_str(), (ch.name + "/" + o.name).c_str(),
                       p.value("partition", std::string()).c_str(),
                       p.value("state", std::string()).c_str(),
                       p.value("decision", std::string()).c_str(),
                       ms(p.value("decision_left_ms", 0.0)).c_str(), l0.c_str(),
                       ms(held.value("first_stage", 0.0)).c_str(),
                       ms(held.value("second_stage", 0.0)).c_str(),
                       human_bytes(p.value("growth_bytes", 0.0)).c_str());
        }
      }
    }
  }
}

}  // namespace sluice::control::cli
