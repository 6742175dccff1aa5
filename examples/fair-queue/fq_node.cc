// sluice-fq-node: one node of the fair-queue experiment (examples/fair-queue): a stage
// in its own process, shared by several tenants' paced readers.
//
//   sluice-fq-node --rules FILE --plan FILE --node K --out FILE
//                  [--socket PATH] [--stage NAME] [--dir DIR] [--start-at UNIX_S]
//                  [--ready-timeout-ms MS]
//
// The stage comes from --rules (the experiment chooses its configuration by rules: one
// drl for all, a drl per tenant, a fair queue), and with --socket it connects to
// `sluice serve` under --stage (default fq-node-K) and waits until the daemon sent its
// first rules. The plan (JSON, shared by every node of a run) says which tenants read
// at this node and at what rate in each phase:
//
//   {"duration_s": 24, "bin_ms": 100, "per_thread_rate": 64,
//    "phases": [{"name": "base", "start_s": 0}, {"name": "double", "start_s": 10}, ...],
//    "flows": [{"tenant": 3, "node": 0, "size": 32768, "rates": [412.5, 825, ...]}, ...]}
//
// A flow (tenant, node) offers rates[p] requests per second in phase p (phases run from
// their start_s to the next one's, the last to duration_s). Its rate is spread over
// ceil(rate / per_thread_rate) threads, each paced at an equal part of it: a thread keeps
// at most one request outstanding, so a flow's concurrency follows its demand, as an open
// loop of clients with a bounded window would. A thread that fell behind (its request
// waited) catches up by at most one request: it does not burst its backlog. Each request
// runs under OriginScope{foreground, tenant}: enforced through the stage
// (Stage::enforce of a read of `size` bytes), then a real pread of `size` bytes from a
// file this program writes in --dir (default /dev/shm: tmpfs, so every read is served
// from memory and the stage, not the device, is the bottleneck).
//
// Output (--out, JSON lines): a config line; one line per bin (bin_ms) with, per tenant
// of this node in the config line's order, requests served (completed), bytes served,
// requests issued (entering the stage) and the total time they waited in the stage; an
// end line with totals, the process's CPU time over the run, the hypervisor's steal,
// the control client's counters and every object's state at the end. Times are seconds
// from the run's start (--start-at, CLOCK_REALTIME, the same for every node of a run).
//
// Exit status: 0, 1 on a runtime error (stage, rules, daemon not ready, a failed read),
// 2 on bad arguments or a bad plan (the message names the field).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "host_steal.h"
#include "sluice/config_reader.h"
#include "sluice/control_client.h"
#include "sluice/json_text.h"
#include "sluice/objects/builtin.h"
#include "sluice/stage.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kFileBytes = std::uint64_t{16} << 20;  // the data file read
constexpr std::uint64_t kMaxSize = std::uint64_t{1} << 20;     // largest request

struct Args {
  std::string rules;
  std::string plan;
  std::string out;
  std::string socket;
  std::string stage;
  std::string dir = "/dev/shm";
  int node = -1;
  double start_at = 0;  // CLOCK_REALTIME seconds; 0: now + 0.2 s
  int ready_timeout_ms = 10000;
};

struct Phase {
  std::string name;
  double start_s = 0;
};

struct Flow {
  std::uint32_t tenant = 0;
  std::uint64_t size = 0;
  std::vector<double> rates;  // requests/s per phase
};

struct Plan {
  double duration_s = 0;
  double bin_s = 0.1;
  double per_thread_rate = 64;
  std::vector<Phase> phases;
  std::vector<Flow> flows;  // this node's
};

// One bin of one flow: written by the flow's threads, read after they stopped.
struct Bin {
  std::atomic<std::uint64_t> served{0};
  std::atomic<std::uint64_t> bytes{0};
  std::atomic<std::uint64_t> issued{0};
  std::atomic<std::uint64_t> wait_ns{0};
};

struct FlowState {
  const Flow* flow = nullptr;
  std::unique_ptr<Bin[]> bins;
  std::atomic<std::uint64_t> read_errors{0};
};

void usage() {
  std::fprintf(stderr,
               "usage: sluice-fq-node --rules FILE --plan FILE --node K --out FILE\n"
               "         [--socket PATH] [--stage NAME] [--dir DIR] [--start-at UNIX_S]\n"
               "         [--ready-timeout-ms MS]\n");
}

bool parse_args(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "sluice-fq-node: %s needs a value\n", k.c_str());
      return false;
    }
    const std::string v = argv[++i];
    char* end = nullptr;
    if (k == "--rules") {
      a->rules = v;
    } else if (k == "--plan") {
      a->plan = v;
    } else if (k == "--out") {
      a->out = v;
    } else if (k == "--socket") {
      a->socket = v;
    } else if (k == "--stage") {
      a->stage = v;
    } else if (k == "--dir") {
      a->dir = v;
    } else if (k == "--node") {
      a->node = static_cast<int>(std::strtol(v.c_str(), &end, 10));
      if (*end != '\0' || a->node < 0) {
        std::fprintf(stderr, "sluice-fq-node: --node must be an integer >= 0, got '%s'\n",
                     v.c_str());
        return false;
      }
    } else if (k == "--start-at") {
      a->start_at = std::strtod(v.c_str(), &end);
      if (*end != '\0' || !(a->start_at > 0)) {
        std::fprintf(stderr, "sluice-fq-node: --start-at must be a positive time, got '%s'\n",
                     v.c_str());
        return false;
      }
    } else if (k == "--ready-timeout-ms") {
      a->ready_timeout_ms = static_cast<int>(std::strtol(v.c_str(), &end, 10));
      if (*end != '\0' || a->ready_timeout_ms < 1) {
        std::fprintf(stderr, "sluice-fq-node: --ready-timeout-ms must be >= 1, got '%s'\n",
                     v.c_str());
        return false;
      }
    } else {
      std::fprintf(stderr, "sluice-fq-node: unknown option %s\n", k.c_str());
      return false;
    }
  }
  for (const auto& [name, value] :
       {std::pair<const char*, const std::string*>{"--rules", &a->rules},
        {"--plan", &a->plan},
        {"--out", &a->out}}) {
    if (value->empty()) {
      std::fprintf(stderr, "sluice-fq-node: %s is required\n", name);
      return false;
    }
  }
  if (a->node < 0) {
    std::fprintf(stderr, "sluice-fq-node: --node is required\n");
    return false;
  }
  if (a->stage.empty()) a->stage = "fq-node-" + std::to_string(a->node);
  return true;
}

// The plan's parts for node `node`; the error names the field ("flows[3].rates[1]: ...").
sluice::Status parse_plan(const json& j, int node, Plan* p) {
  namespace cfg = sluice::config;
  if (!j.is_object()) return sluice::Status::invalid("the plan must be a JSON object");
  for (const char* key : {"duration_s", "phases", "flows"}) {
    SLUICE_RETURN_IF_ERROR(cfg::require(j, "", key));
  }
  SLUICE_RETURN_IF_ERROR(cfg::get_number(j, "", "duration_s", &p->duration_s, 0.1, true, 86400));
  double bin_ms = 100;
  SLUICE_RETURN_IF_ERROR(cfg::get_number(j, "", "bin_ms", &bin_ms, 1, true, 10000));
  p->bin_s = bin_ms / 1000;
  SLUICE_RETURN_IF_ERROR(
      cfg::get_number(j, "", "per_thread_rate", &p->per_thread_rate, 1, true, 100000));
  const json& phases = j["phases"];
  if (!phases.is_array() || phases.empty()) {
    return sluice::Status::invalid("phases: must be a non-empty array");
  }
  for (std::size_t i = 0; i < phases.size(); ++i) {
    const json& ph = phases[i];
    const std::string at = "phases[" + std::to_string(i) + "]";
    if (!ph.is_object()) return sluice::Status::invalid(at + ": must be an object");
    for (const char* key : {"name", "start_s"}) SLUICE_RETURN_IF_ERROR(cfg::require(ph, at, key));
    Phase phase;
    SLUICE_RETURN_IF_ERROR(cfg::get_string(ph, at, "name", &phase.name));
    SLUICE_RETURN_IF_ERROR(
        cfg::get_number(ph, at, "start_s", &phase.start_s, 0, true, p->duration_s));
    if (i == 0 && phase.start_s != 0) {
      return sluice::Status::invalid(at + ".start_s: the first phase starts at 0, got " +
                                     ph["start_s"].dump());
    }
    if (i > 0 && phase.start_s <= p->phases.back().start_s) {
      return sluice::Status::invalid(at + ".start_s: must be after the previous phase's start");
    }
    p->phases.push_back(phase);
  }
  const json& flows = j["flows"];
  if (!flows.is_array()) return sluice::Status::invalid("flows: must be an array");
  for (std::size_t i = 0; i < flows.size(); ++i) {
    const json& f = flows[i];
    const std::string at = "flows[" + std::to_string(i) + "]";
    if (!f.is_object()) return sluice::Status::invalid(at + ": must be an object");
    for (const char* key : {"node", "tenant", "size", "rates"}) {
      SLUICE_RETURN_IF_ERROR(cfg::require(f, at, key));
    }
    int fnode = 0;
    Flow flow;
    SLUICE_RETURN_IF_ERROR(cfg::get_integer(f, at, "node", &fnode, 0, 65535));
    SLUICE_RETURN_IF_ERROR(
        cfg::get_integer<std::uint32_t>(f, at, "tenant", &flow.tenant, 1, UINT32_MAX));
    SLUICE_RETURN_IF_ERROR(cfg::get_integer<std::uint64_t>(f, at, "size", &flow.size, 1, kMaxSize));
    const json& rates = f["rates"];
    if (!rates.is_array() || rates.size() != p->phases.size()) {
      return sluice::Status::invalid(at + ".rates: must be one rate (requests/s) per phase (" +
                                     std::to_string(p->phases.size()) + ")");
    }
    for (std::size_t r = 0; r < rates.size(); ++r) {
      double rate = 0;
      SLUICE_RETURN_IF_ERROR(cfg::read_number(rates[r], at + ".rates[" + std::to_string(r) + "]",
                                              &rate, 0, true, 1e6));
      flow.rates.push_back(rate);
    }
    if (fnode != node) continue;
    for (const Flow& other : p->flows) {
      if (other.tenant == flow.tenant) {
        return sluice::Status::invalid(at + ".tenant: tenant " + std::to_string(flow.tenant) +
                                       " has two flows at node " + std::to_string(node));
      }
    }
    p->flows.push_back(std::move(flow));
  }
  return sluice::Status::ok();
}

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// The shared run: what every reader thread reads.
struct Run {
  const Plan* plan = nullptr;
  sluice::Stage* stage = nullptr;
  int fd = -1;
  Clock::time_point t0;
  std::size_t bins = 0;

  double elapsed(Clock::time_point t) const {
    return std::chrono::duration<double>(t - t0).count();
  }
  Clock::time_point at(double s) const {
    return t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
  std::size_t phase_at(double s) const {
    std::size_t p = 0;
    while (p + 1 < plan->phases.size() && plan->phases[p + 1].start_s <= s) ++p;
    return p;
  }
  double phase_end(std::size_t p) const {
    return p + 1 < plan->phases.size() ? plan->phases[p + 1].start_s : plan->duration_s;
  }
  // Threads a flow uses in phase p, and the rate of each.
  std::size_t threads_in(const Flow& f, std::size_t p) const {
    return static_cast<std::size_t>(std::ceil(f.rates[p] / plan->per_thread_rate - 1e-9));
  }
};

// Thread `index` of flow `fs`: paced reads while the phase gives it a part of the rate.
void reader(const Run& run, FlowState& fs, std::size_t index, double offset_frac) {
  const Flow& f = *fs.flow;
  sluice::OriginScope scope(sluice::origin::kForeground, f.tenant);
  std::vector<char> buf(f.size);
  std::mt19937_64 rng(f.tenant * 7919 + index * 104729 + 1);
  const std::uint64_t slots = kFileBytes / f.size;
  std::uniform_int_distribution<std::uint64_t> pick(0, slots - 1);
  double next = -1;  // < 0: not active in the previous round
  std::this_thread::sleep_until(run.t0);
  for (;;) {
    const double now = run.elapsed(Clock::now());
    if (now >= run.plan->duration_s) break;
    const std::size_t p = run.phase_at(now);
    const std::size_t k = run.threads_in(f, p);
    if (index >= k) {
      // Idle in this phase: sleep until the next one.
      next = -1;
      std::this_thread::sleep_until(run.at(run.phase_end(p)));
      continue;
    }
    const double period = static_cast<double>(k) / f.rates[p];
    // A thread (re)starting spreads its first request over the period, so that a
    // flow's threads and the flows of a node do not start in step.
    if (next < 0) next = now + offset_frac * period;
    // Bounded catch-up: at most one request of lag.
    if (next < now - period) next = now - period;
    if (next > now) {
      const double until = std::min(next, run.phase_end(p));
      std::this_thread::sleep_until(run.at(until));
      if (until < next) continue;  // the phase changed first: its rate may differ
    }
    const auto issued = Clock::now();
    const double t_issued = run.elapsed(issued);
    const auto b_issued = static_cast<std::size_t>(t_issued / run.plan->bin_s);
    if (b_issued < run.bins) fs.bins[b_issued].issued.fetch_add(1, std::memory_order_relaxed);
    (void)run.stage->enforce(sluice::make_context(sluice::Op::kRead, f.size));
    const auto granted = Clock::now();
    const auto off = static_cast<off_t>(pick(rng) * f.size);
    const ssize_t got = ::pread(run.fd, buf.data(), f.size, off);
    const double t_done = run.elapsed(Clock::now());
    const auto b = static_cast<std::size_t>(t_done / run.plan->bin_s);
    if (got != static_cast<ssize_t>(f.size)) {
      fs.read_errors.fetch_add(1, std::memory_order_relaxed);
    } else if (b < run.bins) {
      Bin& bin = fs.bins[b];
      bin.served.fetch_add(1, std::memory_order_relaxed);
      bin.bytes.fetch_add(f.size, std::memory_order_relaxed);
      bin.wait_ns.fetch_add(
          static_cast<std::uint64_t>(
              std::chrono::duration_cast<std::chrono::nanoseconds>(granted - issued).count()),
          std::memory_order_relaxed);
    }
    next += period;
  }
}

// The data file: kFileBytes of a pattern in `dir`, unlinked at once (the descriptor
// keeps it); -1 with a message on failure.
int make_data_file(const std::string& dir) {
  const std::string path = dir + "/sluice-fq-node-" + std::to_string(::getpid()) + ".dat";
  const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::fprintf(stderr, "sluice-fq-node: %s: %s\n", path.c_str(), std::strerror(errno));
    return -1;
  }
  ::unlink(path.c_str());
  std::vector<char> block(1 << 20);
  for (std::size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>(i * 131 + 7);
  for (std::uint64_t off = 0; off < kFileBytes; off += block.size()) {
    if (::pwrite(fd, block.data(), block.size(), static_cast<off_t>(off)) !=
        static_cast<ssize_t>(block.size())) {
      std::fprintf(stderr, "sluice-fq-node: writing %s: %s\n", path.c_str(), std::strerror(errno));
      ::close(fd);
      return -1;
    }
  }
  return fd;
}

int run_node(const Args& a, const Plan& plan) {
  sluice::StageOptions so;
  so.name = a.stage;
  so.labels["example"] = "fair-queue";
  so.labels["node"] = std::to_string(a.node);
  auto created = sluice::Stage::from_rules_file(a.rules, so);
  if (!created.is_ok()) {
    std::fprintf(stderr, "sluice-fq-node: %s\n", created.status().to_string().c_str());
    return 1;
  }
  std::unique_ptr<sluice::Stage> stage = std::move(created).value();
  std::unique_ptr<sluice::ControlClient> client;
  if (!a.socket.empty()) {
    sluice::ControlClientOptions co;
    co.socket_path = a.socket;
    auto c = sluice::ControlClient::start(*stage, co);
    if (!c.is_ok()) {
      std::fprintf(stderr, "sluice-fq-node: control client: %s\n", c.status().to_string().c_str());
      return 1;
    }
    client = std::move(c).value();
    if (!client->wait_ready(std::chrono::milliseconds(a.ready_timeout_ms))) {
      std::fprintf(stderr, "sluice-fq-node: no rules from the daemon at %s within %d ms\n",
                   a.socket.c_str(), a.ready_timeout_ms);
      return 1;
    }
  }
  const int fd = make_data_file(a.dir);
  if (fd < 0) return 1;

  std::FILE* out = std::fopen(a.out.c_str(), "w");
  if (out == nullptr) {
    std::fprintf(stderr, "sluice-fq-node: %s: %s\n", a.out.c_str(), std::strerror(errno));
    ::close(fd);
    return 1;
  }

  // The run's start on this machine's steady clock.
  const double now_unix =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const double start_unix = a.start_at > 0 ? a.start_at : now_unix + 0.2;
  Run run;
  run.plan = &plan;
  run.stage = stage.get();
  run.fd = fd;
  run.t0 = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(start_unix - now_unix));
  run.bins = static_cast<std::size_t>(std::ceil(plan.duration_s / plan.bin_s - 1e-9));

  json tenants = json::array();
  std::vector<FlowState> flows(plan.flows.size());
  std::size_t nthreads = 0;
  for (std::size_t i = 0; i < plan.flows.size(); ++i) {
    flows[i].flow = &plan.flows[i];
    flows[i].bins = std::make_unique<Bin[]>(run.bins);
    tenants.push_back(plan.flows[i].tenant);
  }
  json phases = json::array();
  for (const Phase& p : plan.phases) phases.push_back({{"name", p.name}, {"start_s", p.start_s}});
  std::vector<std::thread> threads;
  std::mt19937_64 rng(static_cast<std::uint64_t>(a.node) * 977 + 3);
  std::uniform_real_distribution<double> frac(0.0, 1.0);
  for (FlowState& fs : flows) {
    std::size_t kmax = 0;
    for (std::size_t p = 0; p < plan.phases.size(); ++p)
      kmax = std::max(kmax, run.threads_in(*fs.flow, p));
    const double base = frac(rng);
    for (std::size_t i = 0; i < kmax; ++i) {
      const double offset =
          std::fmod(base + static_cast<double>(i) / static_cast<double>(kmax), 1.0);
      threads.emplace_back(reader, std::cref(run), std::ref(fs), i, offset);
      ++nthreads;
    }
  }
  json config = {{"type", "config"},
                 {"node", a.node},
                 {"stage", a.stage},
                 {"rules", a.rules},
                 {"socket", a.socket},
                 {"t0_unix", start_unix},
                 {"duration_s", plan.duration_s},
                 {"bin_s", plan.bin_s},
                 {"per_thread_rate", plan.per_thread_rate},
                 {"phases", phases},
                 {"tenants", tenants},
                 {"threads", nthreads}};
  std::fprintf(out, "%s\n", config.dump().c_str());

  std::this_thread::sleep_until(run.t0);
  const double cpu0 = cpu_seconds();
  const sluice::bench::CpuTicks ticks0 = sluice::bench::read_cpu_ticks();
  std::this_thread::sleep_until(run.at(plan.duration_s));
  const double cpu1 = cpu_seconds();
  const sluice::bench::CpuTicks ticks1 = sluice::bench::read_cpu_ticks();
  // Objects' state at the end; then leave the control plane (a rules batch that came
  // after the shutdown would be refused), release whoever still waits, and stop.
  json objects = json::object();
  for (const auto& ch : stage->totals().channels) {
    for (const auto& ob : ch.objects) objects[ch.name + "/" + ob.name] = ob.state;
  }
  json control;
  if (client) {
    client->stop();
    const auto c = client->counters();
    control = {{"connects", c.connects},
               {"rules_applied", c.rules_applied},
               {"rules_rejected", c.rules_rejected},
               {"collects", c.collects},
               {"board", c.board}};
  }
  stage->shutdown();
  for (auto& t : threads) t.join();
  ::close(fd);

  std::uint64_t served = 0, bytes = 0, errors = 0;
  for (std::size_t b = 0; b < run.bins; ++b) {
    json s = json::array(), by = json::array(), is = json::array(), w = json::array();
    for (const FlowState& fs : flows) {
      const Bin& bin = fs.bins[b];
      s.push_back(bin.served.load());
      by.push_back(bin.bytes.load());
      is.push_back(bin.issued.load());
      w.push_back(bin.wait_ns.load());
      served += bin.served.load();
      bytes += bin.bytes.load();
    }
    json line = {{"type", "bin"},
                 {"i", b},
                 {"t", std::round(static_cast<double>(b) * plan.bin_s * 1e3) / 1e3},
                 {"served", s},
                 {"bytes", by},
                 {"issued", is},
                 {"wait_ns", w}};
    std::fprintf(out, "%s\n", line.dump().c_str());
  }
  for (const FlowState& fs : flows) errors += fs.read_errors.load();
  json end = {{"type", "end"},
              {"node", a.node},
              {"served", served},
              {"bytes", bytes},
              {"read_errors", errors},
              {"cpu_s", cpu1 - cpu0},
              {"host_steal_pct", sluice::bench::steal_pct(ticks0, ticks1)},
              {"objects", objects}};
  if (client) {
    end["control"] = control;
    end["rules_version"] = stage->rules_version();
  }
  std::fprintf(out, "%s\n", end.dump().c_str());
  const bool ok = std::fclose(out) == 0;
  client.reset();
  if (!ok) {
    std::fprintf(stderr, "sluice-fq-node: writing %s failed\n", a.out.c_str());
    return 1;
  }
  if (errors != 0) {
    std::fprintf(stderr, "sluice-fq-node: %llu reads failed\n",
                 static_cast<unsigned long long>(errors));
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
  Args a;
  if (!parse_args(argc, argv, &a)) {
    usage();
    return 2;
  }
  auto text = sluice::read_rules_file(a.plan);
  if (!text.is_ok()) {
    std::fprintf(stderr, "sluice-fq-node: %s\n", text.status().to_string().c_str());
    return 2;
  }
  auto read = sluice::parse_json_text(*text);
  if (!read.is_ok()) {
    std::fprintf(stderr, "sluice-fq-node: %s: %s\n", a.plan.c_str(),
                 read.status().message().c_str());
    return 2;
  }
  const json& j = *read;
  Plan plan;
  if (sluice::Status st = parse_plan(j, a.node, &plan); !st.is_ok()) {
    std::fprintf(stderr, "sluice-fq-node: %s: %s\n", a.plan.c_str(), st.message().c_str());
    return 2;
  }
  if (plan.flows.empty()) {
    std::fprintf(stderr, "sluice-fq-node: %s: no flow at node %d\n", a.plan.c_str(), a.node);
    return 2;
  }
  return run_node(a, plan);
}
