// The control bench's observer of the daemon (sluice-bench-control): clocks, and the logs
// the daemon's process notes its events in (memory shared with the forked daemon), so that
// the bench can split a rule change's latency into the daemon's part and the stages' part.
// See bench_control.cc for what each figure means.
//
// Thread safety: each log has one writer, the daemon's process (its loop thread); the
// bench reads them after acquire loads of their counts. StepTimer runs on the daemon's
// loop thread only.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <string_view>
#include <vector>

#include "daemon_observer.h"

namespace sluice::bench {

using SteadyClock = std::chrono::steady_clock;

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch())
      .count();
}

// CPU time the calling thread has used (ns).
inline std::int64_t thread_cpu_now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// The daemon's side, written by the bench's observer of the daemon into
// memory shared with the (forked) daemon: when each stage's frame left the
// daemon, or its board was written.
struct Written {
  std::int32_t index;
  std::int64_t decided;
  std::int64_t written;
};
struct WrittenLog {
  static constexpr std::uint32_t kCapacity = 1u << 16;
  std::atomic<std::uint32_t> count{0};
  Written entries[kCapacity];

  // Notes that the frame of `stage` ("sim-<index>") for the decision
  // `decided` left at `written`. By the one writer, the daemon's process.
  void add(std::string_view stage, std::int64_t decided, std::int64_t written) {
    int index = -1;  // parsed in place: this runs on the daemon's send path
    if (stage.substr(0, 4) == "sim-" &&
        std::from_chars(stage.data() + 4, stage.data() + stage.size(), index).ec != std::errc()) {
      index = -1;
    }
    const std::uint32_t i = count.load(std::memory_order_relaxed);
    if (index < 0 || i >= kCapacity) return;
    entries[i] = Written{index, decided, written};
    count.store(i + 1, std::memory_order_release);
  }
};

// Durations (us) the daemon's observer notes, one per round or step, in
// memory shared with the (forked) daemon.
struct SampleLog {
  static constexpr std::uint32_t kCapacity = 1u << 14;
  std::atomic<std::uint32_t> count{0};
  double values[kCapacity];

  // By the one writer, the daemon's process.
  void add(double v) {
    const std::uint32_t i = count.load(std::memory_order_relaxed);
    if (i >= kCapacity) return;
    values[i] = v;
    count.store(i + 1, std::memory_order_release);
  }
  // The first `n` noted (all of them by default).
  std::vector<double> first(std::uint32_t n = kCapacity) const {
    n = std::min(n, count.load(std::memory_order_acquire));
    return std::vector<double>(values, values + n);
  }
};

// The daemon's logs, in one mapping shared with the (forked) daemon: when
// each stage's rules frame left, when its board was written, how long each
// collect round took, and each step's send, as the daemon_send_us fields name
// them.
struct Logs {
  WrittenLog rules;
  WrittenLog board;
  SampleLog rounds;
  SampleLog build, write, send, preemptions, cpu, boards;
};

// The daemon's observer (sluice/daemon_observer.h), in the daemon's process:
// it reads the clocks and the loop thread's CPU time and context switches
// itself, at the events the daemon tells it of, and notes them in `logs`.
class StepTimer final : public sluice::control::DaemonObserver {
 public:
  explicit StepTimer(Logs* logs) : logs_(logs) {}

  void round_finished(std::int64_t started_ns) override {
    logs_->rounds.add(static_cast<double>(now_ns() - started_ns) / 1e3);
  }
  void step_decided(std::int64_t decided_ns) override {
    decided_ = decided_ns;
    cpu0_ = thread_cpu_now_ns();
    write_ns_ = 0;
    last_board_ = 0;
    first_write_ = true;
  }
  void board_written(std::string_view stage, std::int64_t decided_ns) override {
    const std::int64_t t = now_ns();
    logs_->board.add(stage, decided_ns, t);
    if (decided_ns == decided_) last_board_ = t;
  }
  void rules_writing(std::string_view, std::int64_t) override {
    if (first_write_) {  // preemptions are counted over the writes alone
      first_write_ = false;
      ::getrusage(RUSAGE_THREAD, &ru0_);
    }
    write_start_ = now_ns();
  }
  void rules_written(std::string_view stage, std::int64_t decided_ns) override {
    const std::int64_t t = now_ns();
    write_ns_ += t - write_start_;
    logs_->rules.add(stage, decided_ns, t);
  }
  void step_sent(std::int64_t decided_ns, std::size_t frames) override {
    const std::int64_t t = now_ns();
    if (last_board_ != 0) logs_->boards.add(static_cast<double>(last_board_ - decided_ns) / 1e3);
    if (frames == 0) return;
    rusage ru1{};
    ::getrusage(RUSAGE_THREAD, &ru1);
    const std::int64_t total = t - decided_ns;
    logs_->send.add(static_cast<double>(total) / 1e3);
    logs_->write.add(static_cast<double>(write_ns_) / 1e3);
    logs_->build.add(static_cast<double>(total - write_ns_) / 1e3);
    logs_->preemptions.add(static_cast<double>(ru1.ru_nivcsw - ru0_.ru_nivcsw));
  }
  void step_answered(std::int64_t decided_ns) override {
    if (decided_ns == decided_) {
      logs_->cpu.add(static_cast<double>(thread_cpu_now_ns() - cpu0_) / 1e3);
    }
  }

 private:
  Logs* logs_;
  std::int64_t decided_ = 0, cpu0_ = 0, write_start_ = 0, write_ns_ = 0, last_board_ = 0;
  bool first_write_ = true;
  rusage ru0_{};
};

// The probe (--probe-us US, configure runs only): an application thread of
// the stages' process. From the first policy change on, it sweeps every stage
// with a one-byte request (which the drl's rate never delays) and notes, per
// stage, when a request found a board write the stage had not taken yet and
// took it: the first request enforced under the new values, an upper bound
// on when the change was in effect there (by up to a sweep, ~10 us for 100
// stages). With --probe-us 0 it sweeps without pause, a thread that is always
// running; US > 0 sleeps that long between sweeps, an application issuing a
// request that often. Off by default, because on a machine with fewer CPUs
// than it, the daemon and the stages' threads need, it changes what it
// measures: spinning, it holds a CPU, and the daemon, sharing the other with
// the stages' threads, decided and then waited 1-4 ms to run in 3 of 60
// changes (sluice-bench-control --records on 2 vCPUs; none in 60 without

}  // namespace sluice::bench
