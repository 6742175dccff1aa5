// sluice-stage-demo: a stage in one process, no control plane. Two threads
// write real data to a file: one as a "flush" (its I/O carries that origin
// through an OriginScope), one as foreground. A rules file limits flushes to
// 20 MiB/s; half-way through an enforcement rule raises the limit to 40 MiB/s.
// Every second the demo collects the stage's statistics and prints the rate
// of each channel next to its limit, then checks that the flush rate followed
// the limit (exit status 1 if it did not).
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "sluice/objects/builtin.h"
#include "sluice/stage.h"

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

const char* kRules = R"({"version": 1, "rules": [
  {"rule": "differentiate", "classifiers": ["origin"]},
  {"rule": "create_channel", "channel": "flush", "match": {"origin": "flush"}},
  {"rule": "create_object", "channel": "flush", "object": "limit", "type": "drl",
   "config": {"rate": 20971520, "burst": 1048576}},
  {"rule": "create_channel", "channel": "foreground", "default": true},
  {"rule": "create_object", "channel": "foreground", "object": "watch", "type": "noop"}
]})";

void writer(sluice::Stage& stage, int fd, sluice::OriginId origin, std::atomic<bool>& stop,
            std::atomic<std::uint64_t>& errors) {
  sluice::OriginScope scope(origin);
  std::vector<char> block(64 * 1024, 'x');
  off_t off = 0;
  while (!stop.load()) {
    stage.enforce(sluice::Op::kWrite, block.size());
    if (::pwrite(fd, block.data(), block.size(), off) < 0) errors.fetch_add(1);
    off = (off + static_cast<off_t>(block.size())) % (64 << 20);  // keep the file at 64 MiB
    if (origin != sluice::origin::kFlush) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
  int seconds = argc > 1 ? std::atoi(argv[1]) : 6;
  if (seconds < 2) seconds = 2;
  auto stage = sluice::Stage::create({.name = "demo", .labels = {{"example", "stage-demo"}}});
  if (!stage.is_ok()) return std::fprintf(stderr, "%s\n", stage.status().to_string().c_str()), 1;
  sluice::Status s = stage.value()->apply_text(kRules);
  if (!s.is_ok()) return std::fprintf(stderr, "rules: %s\n", s.to_string().c_str()), 1;

  std::string path = "/tmp/sluice-stage-demo-" + std::to_string(::getpid());
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  if (fd < 0) return std::perror(path.c_str()), 1;
  ::unlink(path.c_str());

  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> errors{0};
  std::thread flush(writer, std::ref(*stage.value()), fd, sluice::origin::kFlush, std::ref(stop),
                    std::ref(errors));
  std::thread fg(writer, std::ref(*stage.value()), fd, sluice::origin::kForeground, std::ref(stop),
                 std::ref(errors));

  std::printf("sluice stage demo: flushes limited to 20 MiB/s, raised to 40 MiB/s at t=%ds\n",
              seconds / 2);
  std::printf("%4s %14s %12s %16s %12s\n", "t(s)", "flush MiB/s", "limit", "foreground MiB/s",
              "flush waits");
  (void)stage.value()->collect();
  double limit = 20, worst_error = 0;
  for (int t = 1; t <= seconds; ++t) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    auto st = stage.value()->collect();
    double secs = static_cast<double>(st.interval_ns) / 1e9;
    const auto* f = st.channel("flush");
    const auto* g = st.channel("foreground");
    double frate = static_cast<double>(f->total.bytes) / kMiB / secs;
    std::printf("%4d %14.1f %12.0f %16.1f %12llu\n", t, frate, limit,
                static_cast<double>(g->total.bytes) / kMiB / secs,
                static_cast<unsigned long long>(f->wait.count() - f->wait.buckets[0]));
    // The second after a change is a transition; judge the settled seconds.
    if (t != seconds / 2 + 1) {
      double err = std::abs(frate - limit) / limit;
      if (err > worst_error) worst_error = err;
    }
    if (t == seconds / 2) {
      limit = 40;
      s = stage.value()->apply_text(
          R"([{"rule": "configure", "channel": "flush", "object": "limit", "config": {"rate": 41943040}}])");
      if (!s.is_ok()) std::fprintf(stderr, "configure: %s\n", s.to_string().c_str());
    }
  }
  stop = true;
  flush.join();
  fg.join();
  ::close(fd);
  std::printf("worst deviation of the flush rate from its limit: %.1f%% (write errors: %llu)\n",
              worst_error * 100, static_cast<unsigned long long>(errors.load()));
  return worst_error < 0.10 && errors.load() == 0 ? 0 : 1;
}
