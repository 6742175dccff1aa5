// How much CPU time the hypervisor took from this machine while a benchmark ran.
//
// On a virtual machine, "steal" is the time a vCPU wanted to run but the host ran
// something else (the 8th value of /proc/stat's "cpu" line). It shows up in every tail
// a benchmark measures (a waiter woken late, a frame read late) and no code in the
// guest can avoid it, so the benchmarks report it next to their figures: a tail that
// moves with steal is the host's, not ours.
//
// Header-only, for bench/ and examples/ programs. Thread-safe (reads a file).
#pragma once

#include <array>
#include <cstdint>
#include <fstream>
#include <string>

namespace sluice::bench {

struct CpuTicks {
  std::uint64_t total = 0;  // every state's ticks, summed over CPUs
  std::uint64_t steal = 0;
  bool valid = false;
};

// The aggregate "cpu" line of /proc/stat; invalid where there is none.
inline CpuTicks read_cpu_ticks() {
  CpuTicks t;
  std::ifstream f("/proc/stat");
  std::string label;
  if (!(f >> label) || label != "cpu") return t;
  // user nice system idle iowait irq softirq steal (guest and guest_nice are
  // already counted in user and nice).
  std::array<std::uint64_t, 8> v{};
  for (auto& x : v) {
    if (!(f >> x)) return t;
  }
  for (auto x : v) t.total += x;
  t.steal = v[7];
  t.valid = true;
  return t;
}

// Steal between two readings as % of all CPU time in between; -1 when unknown.
inline double steal_pct(const CpuTicks& before, const CpuTicks& after) {
  if (!before.valid || !after.valid || after.total <= before.total) return -1;
  return 100.0 * static_cast<double>(after.steal - before.steal) /
         static_cast<double>(after.total - before.total);
}

// --max-steal PCT --attempts K: a measurement the host stole more than PCT% of
// the CPU from is repeated, up to K attempts in all; each attempt is reported
// and the last one counts. The defaults measure once.
struct StealRetry {
  double max_steal_pct = 100;
  int attempts = 1;
  // An unknown steal (-1) counts as quiet: there is nothing to wait out.
  bool quiet(double steal) const { return steal <= max_steal_pct; }
  // Whether attempt number `attempt` (from 1), which ran at `steal`, is the one
  // that counts.
  bool last(int attempt, double steal) const { return quiet(steal) || attempt >= attempts; }
};

}  // namespace sluice::bench
