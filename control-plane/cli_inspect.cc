// `sluice stages`, `stats` and `top`: what the daemon and its stages report.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cli_commands.h"
#include "cli_format.h"

namespace sluice::control::cli {

int cmd_stages(const Global& g, bool as_json) {
  auto r = call(g, wire::Type::kListStages);
  if (!r) return fail(r.status());
  const json& stages = (*r)["stages"];
  if (as_json) {
    std::printf("%s\n", stages.dump(2).c_str());
    return kExitOk;
  }
  std::printf("%-24s %8s %6s %9s %6s %4s %5s  %s\n", "NAME", "PID", "UID", "UPTIME", "RULES",
              "CHAN", "BOARD", "LABELS");
  for (const auto& s : stages) {
    std::string labels;
    // Named: a range-for over items() of value()'s temporary would iterate a
    // destroyed object (C++20 extends only the proxy's life), which crashed
    // `sluice stages` as soon as a stage was connected.
    const json label_map = s.value("labels", json::object());
    for (auto& [k, v] : label_map.items()) {
      // Labels are strings by protocol, but a listing must not abort on a peer that bends it.
      labels +=
          (labels.empty() ? "" : ",") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
    }
    // A daemon from before boards does not say: "-".
    const auto board = s.find("board");
    const char* has_board = board == s.end() || !board->is_boolean() ? "-"
                            : board->get<bool>()                     ? "yes"
                                                                     : "no";
    std::printf("%-24.24s %8lld %6llu %9s %6llu %4llu %5s  %s\n",
                s.value("name", std::string()).c_str(),
                static_cast<long long>(s.value("pid", std::int64_t{0})),
                static_cast<unsigned long long>(s.value("uid", std::uint64_t{0})),
                human_duration(s.value("uptime_s", 0.0)).c_str(),
                static_cast<unsigned long long>(s.value("rules_version", std::uint64_t{0})),
                static_cast<unsigned long long>(s.value("channels", std::uint64_t{0})), has_board,
                labels.c_str());
  }
  return kExitOk;
}

int cmd_stats(const Global& g, bool as_json, const std::string& stage) {
  json fields = json::object();
  if (!stage.empty()) fields["stage"] = stage;
  auto r = call(g, wire::Type::kGetStats, fields);
  if (!r) return fail(r.status());
  if (as_json) {
    std::printf("%s\n", (*r)["stages"].dump(2).c_str());
    return kExitOk;
  }
  print_header(stdout);
  for (const Row& row : stats_rows(*r, true)) print_row(row, stdout);
  print_deferral(*r, stdout);
  return kExitOk;
}

int cmd_top(const Global& g, int refresh_ms, const std::string& sort, bool once, int iterations) {
  static const std::vector<std::string> keys = {"name", "ops", "bytes", "wait"};
  if (std::find(keys.begin(), keys.end(), sort) == keys.end()) {
    std::fprintf(stderr, "sluice top: --sort must be one of name, ops, bytes, wait\n");
    return kExitUsage;
  }
  auto conn = Connection::open(g.socket, g.timeout_ms);
  if (!conn) return fail(conn.status());
  for (int i = 0; once ? i < 1 : (iterations <= 0 || i < iterations); ++i) {
    auto r = (*conn)->request(wire::Type::kGetStats, json::object(), g.timeout_ms);
    if (!r && (*conn)->peer_closed()) {
      // The daemon closes connections idle longer than its idle timeout
      // (a long --refresh): connect again.
      conn = Connection::open(g.socket, g.timeout_ms);
      if (!conn) return fail(conn.status());
      r = (*conn)->request(wire::Type::kGetStats, json::object(), g.timeout_ms);
    }
    if (!r) return fail(r.status());
    auto rows = stats_rows(*r, false);
    std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
      if (sort == "name") return std::tie(a.stage, a.channel) < std::tie(b.stage, b.channel);
      if (sort == "ops") return a.ops_s > b.ops_s;
      if (sort == "bytes") return a.bytes_s > b.bytes_s;
      return a.p99 > b.p99;
    });
    std::string frame;
    if (!once) frame += "\x1b[H\x1b[2J";
    char head[256];
    auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char when[64];
    std::strftime(when, sizeof(when), "%H:%M:%S", std::localtime(&now));
    std::snprintf(
        head, sizeof(head),
        "\x1b[1msluice top\x1b[0m  %s  socket %s  stages %zu  interval %d ms  sort %s\n\n", when,
        g.socket.c_str(), r->value("stages", json::array()).size(), r->value("interval_ms", 0),
        sort.c_str());
    frame += head;
    std::fputs(frame.c_str(), stdout);
    std::fputs("\x1b[7m", stdout);
    print_header(stdout);
    std::fputs("\x1b[0m", stdout);
    for (const Row& row : rows) print_row(row, stdout);
    print_deferral(*r, stdout);
    std::fflush(stdout);
    if (once || (iterations > 0 && i + 1 >= iterations)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(refresh_ms));
  }
  return kExitOk;
}

}  // namespace sluice::control::cli
