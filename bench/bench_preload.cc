// sluice-bench-preload: what libsluice_preload.so costs per call.
//
// ns per call of pread and pwrite of 0 B, 4 KiB and 128 KiB on a page-cached
// file, in four modes:
//   native       no preload
//   passthrough  LD_PRELOAD, no rules (the stage counts every call)
//   noop         LD_PRELOAD, one default channel with a Noop object
//   drl          LD_PRELOAD, one default channel with a DRL at an unreachable rate
// The driver re-executes itself once per (round, mode) with the mode's
// environment; the modes' order rotates every round so that native and
// preloaded runs interleave. Each configuration reports min/median/max over the
// rounds, as one JSON line, then a table with the overhead of each mode's
// median against native's median.
//
// Two processes differ by more than a few ns per call for reasons that have
// nothing to do with the preload: the physical pages behind the buffer and the
// file, hence their cache placement, change with every process. So every child
// also measures the overhead in-process, paired: it alternates ~1 ms blocks of
// calls through the interposed symbol (::pread, which the preload replaces)
// with blocks through libc's own pread (dlsym on libc.so.6), on the same
// buffer and file, and reports both. "paired_overhead" is interposed minus
// libc within each child, min/median/max over the rounds: the figure the
// targets are checked against. In native mode it is the floor of the method
// (a PLT call against a pointer call: about 0).
//
//   sluice-bench-preload [--quick] [--rounds N] [--ms-per-config M]
//                        [--preload PATH] [--dir DIR] [--clock cpu|wall] [--json-only]
// Times are the child thread's CPU time by default (--clock wall for the
// monotonic clock): on a shared, loaded machine that removes the time the
// process waits for a CPU, which would otherwise swamp a few-ns difference.
#include <dlfcn.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "support/cli.h"
#include "support/percentile.h"

extern char** environ;

namespace {

using sluice::bench::Spread;
using sluice::bench::spread;

constexpr std::size_t kFileSize = 4 << 20;
constexpr const char* kModes[] = {"native", "passthrough", "noop", "drl"};
constexpr const char* kCalls[] = {"pread", "pwrite"};
constexpr std::size_t kSizes[] = {0, 4096, 131072};

const char* kNoopRules = R"([
 {"rule": "differentiate", "classifiers": []},
 {"rule": "create_channel", "channel": "all", "default": true},
 {"rule": "create_object", "channel": "all", "object": "count", "type": "noop", "default": true}
])";
const char* kDrlRules = R"([
 {"rule": "differentiate", "classifiers": []},
 {"rule": "create_channel", "channel": "all", "default": true},
 {"rule": "create_object", "channel": "all", "object": "limit", "type": "drl",
  "config": {"rate": 1e15}, "default": true}
])";

// The clock a child measures with: the thread's CPU time (default; immune to
// the time a loaded machine keeps the process off the CPU, and a page-cached
// pread/pwrite never sleeps) or the monotonic wall clock.
clockid_t g_clock = CLOCK_THREAD_CPUTIME_ID;

double now_ns() {
  struct timespec ts;
  ::clock_gettime(g_clock, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

// Child: measures every (call, size) for `ms` milliseconds through the
// interposed symbols and as long through libc's own, alternating blocks, and
// prints "call size ns_interposed ns_libc" lines.
int child(const std::string& dir, int ms) {
  using PreadFn = ssize_t (*)(int, void*, size_t, off_t);
  using PwriteFn = ssize_t (*)(int, const void*, size_t, off_t);
  void* libc = ::dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  auto* libc_pread = libc ? reinterpret_cast<PreadFn>(::dlsym(libc, "pread")) : nullptr;
  auto* libc_pwrite = libc ? reinterpret_cast<PwriteFn>(::dlsym(libc, "pwrite")) : nullptr;
  if (libc_pread == nullptr || libc_pwrite == nullptr) {
    std::fprintf(stderr, "cannot find libc's pread/pwrite\n");
    return 1;
  }
  std::string path = dir + "/bench-" + std::to_string(::getpid()) + ".dat";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    std::perror("open");
    return 1;
  }
  ::unlink(path.c_str());
  std::vector<char> buf(kFileSize, 'x');
  if (::pwrite(fd, buf.data(), buf.size(), 0) != static_cast<ssize_t>(buf.size()) ||
      ::pread(fd, buf.data(), buf.size(), 0) != static_cast<ssize_t>(buf.size())) {
    std::perror("setup");
    return 1;
  }
  for (const char* call : kCalls) {
    bool is_read = std::strcmp(call, "pread") == 0;
    for (std::size_t size : kSizes) {
      std::size_t slots = size == 0 ? 1 : kFileSize / size;
      // Both paths walk the file the same way, each from its own cursor.
      auto batch = [&](bool interposed, int n, std::size_t& slot) {
        for (int i = 0; i < n; ++i) {
          off_t off = static_cast<off_t>(slot * size);
          ssize_t r;
          if (interposed) {
            r = is_read ? ::pread(fd, buf.data(), size, off) : ::pwrite(fd, buf.data(), size, off);
          } else {
            r = is_read ? libc_pread(fd, buf.data(), size, off)
                        : libc_pwrite(fd, buf.data(), size, off);
          }
          if (r != static_cast<ssize_t>(size)) std::abort();
          if (++slot == slots) slot = 0;
        }
      };
      std::size_t slot[2] = {0, 0};  // [libc, interposed]
      // Warm up both (and size a block to ~1 ms).
      batch(false, 200, slot[0]);
      double t0 = now_ns();
      batch(true, 200, slot[1]);
      double per = (now_ns() - t0) / 200;
      int n = std::max(100, static_cast<int>(1e6 / std::max(per, 1.0)));
      double budget = ms * 1e6;
      double spent[2] = {0, 0};
      long long calls = 0;
      for (int k = 0; spent[1] < budget; ++k) {
        for (int j = 0; j < 2; ++j) {
          const int which = (k + j) % 2;  // alternate which path goes first
          double s = now_ns();
          batch(which == 1, n, slot[which]);
          spent[which] += now_ns() - s;
        }
        calls += n;
      }
      std::printf("%s %zu %.3f %.3f\n", call, size, spent[1] / static_cast<double>(calls),
                  spent[0] / static_cast<double>(calls));
    }
  }
  ::close(fd);
  return 0;
}

struct Options {
  int rounds = 9;
  int ms = 150;
  std::string preload = SLUICE_PRELOAD_SO;
  std::string dir;
  bool json_only = false;
  std::string clock = "cpu";  // cpu (thread CPU time) or wall
};

// Per (call, size): ns per call through the interposed symbol, one entry per
// round, and the in-process paired overhead (interposed - libc) of each round.
struct Figures {
  std::vector<double> ns;
  std::vector<double> paired;
};
using ModeFigures = std::map<std::pair<std::string, std::size_t>, Figures>;

// Runs one child in `mode`; appends its figures to `out`.
bool run_child(const Options& o, const std::string& self, const std::string& mode,
               ModeFigures& out) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string s(*e);
    if (s.rfind("SLUICE_", 0) == 0 || s.rfind("LD_PRELOAD=", 0) == 0) continue;
    env.push_back(s);
  }
  if (mode != "native") {
    env.push_back("LD_PRELOAD=" + o.preload);
    env.push_back("SLUICE_LOG_LEVEL=error");
  }
  if (mode == "noop") env.push_back("SLUICE_RULES=" + o.dir + "/noop.json");
  if (mode == "drl") env.push_back("SLUICE_RULES=" + o.dir + "/drl.json");
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string ms = std::to_string(o.ms);
  const char* argv[] = {self.c_str(), "--child",       o.dir.c_str(),
                        ms.c_str(),   o.clock.c_str(), nullptr};
  int p[2];
  if (::pipe(p) != 0) return false;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(p[1], 1);
    ::close(p[0]);
    ::close(p[1]);
    ::execve(self.c_str(), const_cast<char**>(argv), envp.data());
    ::_exit(127);
  }
  ::close(p[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(p[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
  ::close(p[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "child in mode %s failed (status %d)\n", mode.c_str(), status);
    return false;
  }
  char call[16];
  std::size_t size;
  double ns, libc_ns;
  const char* s = text.c_str();
  int used = 0;
  while (std::sscanf(s, "%15s %zu %lf %lf\n%n", call, &size, &ns, &libc_ns, &used) == 4) {
    Figures& f = out[{call, size}];
    f.ns.push_back(ns);
    f.paired.push_back(ns - libc_ns);
    s += used;
  }
  return true;
}

void write_file(const std::string& path, const char* text) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return;
  std::fputs(text, f);
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 5 && std::strcmp(argv[1], "--child") == 0) {
    if (std::strcmp(argv[4], "wall") == 0) g_clock = CLOCK_MONOTONIC;
    return child(argv[2], std::atoi(argv[3]));
  }
  Options o;
  auto at_least_1 = [](const std::string& v) { return std::max(1, std::atoi(v.c_str())); };
  using sluice::bench::Option;
  const Option options[] = {
      Option::flag("--quick",
                   [&o] {
                     o.rounds = 5;
                     o.ms = 60;
                   }),
      {"--rounds", &o.rounds, at_least_1},
      {"--ms-per-config", &o.ms, at_least_1},
      {"--preload", &o.preload},
      {"--dir", &o.dir},
      Option::with_value("--clock",
                         [&o](const std::string& v) {
                           o.clock = v;
                           if (v == "cpu" || v == "wall") return true;
                           std::fprintf(stderr, "--clock is cpu or wall\n");
                           return false;
                         }),
      {"--json-only", &o.json_only, true},
  };
  const sluice::bench::ParseResult parsed = sluice::bench::parse_options(options, argc, argv);
  if (parsed.error == sluice::bench::ParseResult::Error::kUnknown) {
    std::fprintf(stderr,
                 "usage: %s [--quick] [--rounds N] [--ms-per-config M] [--preload PATH] "
                 "[--dir DIR] [--clock cpu|wall] [--json-only]\n",
                 argv[0]);
    return 2;
  }
  if (!parsed.ok()) {
    sluice::bench::print_parse_error(parsed);
    return 2;
  }
  if (::access(o.preload.c_str(), R_OK) != 0) {
    std::fprintf(stderr, "preload library %s not found (--preload PATH)\n", o.preload.c_str());
    return 1;
  }
  bool own_dir = o.dir.empty();
  if (own_dir) {
    char tmpl[] = "/tmp/sluice-bench-preload-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return 1;
    o.dir = tmpl;
  }
  write_file(o.dir + "/noop.json", kNoopRules);
  write_file(o.dir + "/drl.json", kDrlRules);
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 1;
  self[n] = '\0';

  // results[mode][(call, size)] -> per-round figures
  std::map<std::string, ModeFigures> res;
  constexpr int kModeCount = 4;
  for (int r = 0; r < o.rounds; ++r) {
    for (int k = 0; k < kModeCount; ++k) {
      const char* mode = kModes[(r + k) % kModeCount];
      if (!run_child(o, self, mode, res[mode])) return 1;
    }
  }

  std::vector<std::string> table;
  for (const char* call : kCalls) {
    for (std::size_t size : kSizes) {
      const double native = spread(res["native"][{call, size}].ns).median;
      for (const char* mode : kModes) {
        const Figures& f = res[mode][{call, size}];
        const Spread ns = spread(f.ns);
        double over_ns = ns.median - native;
        double over_pct = 100.0 * over_ns / native;
        // The paired figure, relative to the same children's libc calls.
        std::vector<double> base(f.ns.size());
        for (std::size_t i = 0; i < base.size(); ++i) base[i] = f.ns[i] - f.paired[i];
        const Spread paired = spread(f.paired);
        const double libc_ns = spread(base).median;
        double paired_pct = 100.0 * paired.median / libc_ns;
        std::printf(
            "{\"bench\": \"preload\", \"call\": \"%s\", \"size\": %zu, \"mode\": \"%s\", "
            "\"ns_per_call\": %.2f, \"min\": %.2f, \"median\": %.2f, \"max\": %.2f, "
            "\"rounds\": %d, \"clock\": \"%s\", \"overhead_ns\": %.2f, \"overhead_pct\": %.2f, "
            "\"libc_ns\": %.2f, \"paired_overhead_ns\": {\"min\": %.2f, \"median\": %.2f, "
            "\"max\": %.2f}, \"paired_overhead_pct\": %.2f}\n",
            call, size, mode, ns.median, ns.min, ns.median, ns.max, o.rounds, o.clock.c_str(),
            over_ns, over_pct, libc_ns, paired.min, paired.median, paired.max, paired_pct);
        char line[256];
        std::snprintf(line, sizeof line,
                      "%-7s %7zu  %-12s %9.1f %9.1f %9.1f %+9.1f %+8.2f%% | %+7.1f %+7.1f %+7.1f "
                      "%+7.2f%%",
                      call, size, mode, ns.min, ns.median, ns.max, over_ns, over_pct, paired.min,
                      paired.median, paired.max, paired_pct);
        table.push_back(line);
      }
    }
  }
  if (!o.json_only) {
    std::printf("\n%-7s %7s  %-12s %9s %9s %9s %9s %9s | %s\n", "call", "size", "mode", "min ns",
                "median", "max ns", "+ns", "vs native", "paired: min/median/max +ns, median %");
    for (const auto& l : table) std::printf("%s\n", l.c_str());
    std::printf(
        "(%d rounds, %d ms per configuration, %s clock, modes interleaved. \"vs native\": median "
        "against the native children's median. paired: interposed minus libc's own call in the "
        "same child, alternating blocks)\n",
        o.rounds, o.ms, o.clock == "cpu" ? "thread CPU" : "wall");
  }
  if (own_dir) {
    std::string cmd = "rm -rf '" + o.dir + "'";
    if (std::system(cmd.c_str()) != 0) return 1;
  }
  return 0;
}
