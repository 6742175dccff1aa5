// The `sluice` command's tables and units: sizes, durations and latencies for
// people, and the rows of `stats` and `top`.
//
// Thread safety: pure functions but for the printers, which write to `out`.
#pragma once

// GCC 12 reports false positives inside libstdc++'s and nlohmann's headers
// after inlining; they are not in our code. The `sluice` command's files
// include this header (cli_commands.h first of all).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wnull-dereference"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sluice::control::cli {

std::string human_bytes(double b);       // "1.5 MiB"
std::string human_ns(std::uint64_t ns);  // "12.3us"
std::string human_duration(double s);    // "3m05s"
// A number of milliseconds, or "-" for none (an unbounded time).
std::string human_ms(const nlohmann::json& v);

// One row of `stats` / `top`: a stage, a channel or an object.
struct Row {
  std::string stage, channel, object;
  double ops_s = 0, bytes_s = 0;
  std::uint64_t ops = 0, bytes = 0, p50 = 0, p99 = 0;
};

// The rows of a get_stats reply: each stage, its channels and (with
// `objects`) their objects.
std::vector<Row> stats_rows(const nlohmann::json& reply, bool objects);
void print_header(std::FILE* out);
void print_row(const Row& r, std::FILE* out);
// The deferral gates' partitions in a get_stats reply, one line each (nothing
// when no stage has a deferral-gate object).
void print_deferral(const nlohmann::json& reply, std::FILE* out);

}  // namespace sluice::control::cli
