// sluice-cluster-stage: one node's application stages for the cluster example.
// K stages in one process, each labelled with the tenant, each with a channel
// "app" holding a drl "limit" (the object a cluster budget sets), connected to
// the node's `sluice serve` over its socket. Each stage's thread offers load
// in 16 KiB requests at the node's scheduled rate divided by K, and passes
// every request through Stage::enforce, which waits as the drl says: what it
// counts as served is what the enforcement let through, not what a budget
// says. A stage that is held back keeps at most 100 ms of backlog, so that a
// budget raised later is not met with a burst of old demand.
//
// Every --bin-ms, on wall-clock bins aligned to --start-unix (so that the
// bins of every node's process line up), it writes one JSON line per bin to
// --out: the node's served bytes per second over the bin and its offered
// rate, and per stage its served bytes, the drl's rate in force, its rules
// version and the board writes it applied (the last two show whether the
// daemon changed its rules). Runs until --duration seconds after the start,
// or until killed.
//
//   sluice-cluster-stage --socket PATH --node NAME --tenant T --stages K
//       --demand "T0:RATE,T1:RATE,..." --start-unix S --duration D --out FILE
//       [--bin-ms MS]
// The demand schedule: from second Ti after the start, the node offers RATE
// bytes/s (the last entry holds to the end; before the first, nothing).
//
// Thread safety: one load thread per stage; the main thread writes the bins
// and reads the stages' counters (atomics) and objects (thread-safe by
// Stage's contract).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/control_client.h"
#include "sluice/enforcement_object.h"
#include "sluice/objects/builtin.h"
#include "sluice/stage.h"

namespace {

using json = nlohmann::json;
using SysClock = std::chrono::system_clock;

constexpr std::uint64_t kChunk = 16384;
constexpr double kMaxBacklogS = 0.1;

struct Options {
  std::string socket, node, tenant, out;
  int stages = 2;
  std::vector<std::pair<double, double>> demand;  // (seconds after start, node bytes/s)
  double start_unix = 0;
  double duration = 60;
  int bin_ms = 250;
};

double now_unix() {
  return std::chrono::duration<double>(SysClock::now().time_since_epoch()).count();
}

void sleep_until_unix(double t) {
  std::this_thread::sleep_until(SysClock::time_point(
      std::chrono::duration_cast<SysClock::duration>(std::chrono::duration<double>(t))));
}

// The node's offered rate `t` seconds after the start.
double offered_at(const Options& o, double t) {
  double r = 0;
  for (const auto& [from, rate] : o.demand) {
    if (t >= from) r = rate;
  }
  return r;
}

bool parse_demand(const std::string& text, Options& o) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(pos, comma - pos);
    const std::size_t colon = item.find(':');
    if (colon == std::string::npos) return false;
    char* end = nullptr;
    const double t = std::strtod(item.c_str(), &end);
    if (end != item.c_str() + colon || t < 0) return false;
    const double r = std::strtod(item.c_str() + colon + 1, &end);
    if (*end != '\0' || r < 0) return false;
    if (!o.demand.empty() && t <= o.demand.back().first) return false;
    o.demand.emplace_back(t, r);
    pos = comma + 1;
  }
  return !o.demand.empty();
}

int usage(const char* why) {
  std::fprintf(stderr,
               "sluice-cluster-stage: %s\nusage: sluice-cluster-stage --socket PATH --node NAME "
               "--tenant T --stages K --demand \"T0:RATE,...\" --start-unix S --duration D "
               "--out FILE [--bin-ms MS]\n",
               why);
  return 2;
}

struct Sim {
  std::unique_ptr<sluice::Stage> stage;
  std::unique_ptr<sluice::ControlClient> client;
  std::atomic<std::uint64_t> served{0};
};

void load(const Options& o, Sim& s, const std::atomic<bool>& stop) {
  double due = now_unix();
  while (!stop.load(std::memory_order_relaxed)) {
    const double now = now_unix();
    const double rate = offered_at(o, now - o.start_unix) / o.stages;
    if (rate <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      due = now_unix();
      continue;
    }
    if (due < now - kMaxBacklogS) due = now - kMaxBacklogS;
    if (due > now) sleep_until_unix(due);
    // Served is what the stage let through: ok, or cancelled (the layer then
    // proceeds unenforced); a refused request is not served.
    const sluice::Outcome out = s.stage->enforce(sluice::Op::kWrite, kChunk).outcome;
    if (out == sluice::Outcome::kOk || out == sluice::Outcome::kCancelled) {
      s.served.fetch_add(kChunk, std::memory_order_relaxed);
    }
    due += static_cast<double>(kChunk) / rate;
  }
}

double drl_rate(const sluice::Stage& stage) {
  auto obj = stage.object("app", "limit");
  if (!obj) return 0;
  const json st = obj->collect();
  return st.value("rate", 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage((a + ": needs a value").c_str());
    const std::string v = argv[++i];
    if (a == "--socket") {
      o.socket = v;
    } else if (a == "--node") {
      o.node = v;
    } else if (a == "--tenant") {
      o.tenant = v;
    } else if (a == "--out") {
      o.out = v;
    } else if (a == "--stages") {
      o.stages = std::atoi(v.c_str());
    } else if (a == "--demand") {
      if (!parse_demand(v, o)) {
        return usage("--demand: expected SECONDS:BYTES_PER_S,... with seconds increasing");
      }
    } else if (a == "--start-unix") {
      o.start_unix = std::atof(v.c_str());
    } else if (a == "--duration") {
      o.duration = std::atof(v.c_str());
    } else if (a == "--bin-ms") {
      o.bin_ms = std::atoi(v.c_str());
    } else {
      return usage(("unknown argument " + a).c_str());
    }
  }
  if (o.socket.empty() || o.node.empty() || o.tenant.empty() || o.out.empty()) {
    return usage("--socket, --node, --tenant and --out are required");
  }
  if (o.stages < 1 || o.stages > 64) return usage("--stages: must be 1..64");
  if (o.bin_ms < 10) return usage("--bin-ms: must be at least 10");
  if (o.duration <= 0) return usage("--duration: must be positive");
  if (o.demand.empty()) return usage("--demand: required");
  if (o.start_unix <= 0) o.start_unix = now_unix();
  std::FILE* out = std::fopen(o.out.c_str(), "we");
  if (out == nullptr) {
    std::fprintf(stderr, "sluice-cluster-stage: %s: cannot be written\n", o.out.c_str());
    return 1;
  }

  // Until the cluster decides, far more than any demand here: the budget a
  // node has before its first decision (a run's settling time).
  const json rules = json::parse(R"([
    {"rule": "create_channel", "channel": "app", "default": true},
    {"rule": "create_object", "channel": "app", "object": "limit", "type": "drl",
     "config": {"rate": 1073741824}}])");
  std::vector<std::unique_ptr<Sim>> sims;
  for (int k = 0; k < o.stages; ++k) {
    auto s = std::make_unique<Sim>();
    sluice::StageOptions so;
    so.name = o.node + "-s" + std::to_string(k);
    so.labels["tenant"] = o.tenant;
    auto stage = sluice::Stage::create(so);
    if (!stage) {
      std::fprintf(stderr, "stage %s: %s\n", so.name.c_str(), stage.status().message().c_str());
      return 1;
    }
    s->stage = std::move(*stage);
    if (auto st = s->stage->apply(rules); !st.is_ok()) {
      std::fprintf(stderr, "stage %s: rules: %s\n", so.name.c_str(), st.message().c_str());
      return 1;
    }
    sluice::ControlClientOptions co;
    co.socket_path = o.socket;
    co.backoff_initial = std::chrono::milliseconds(20);
    co.backoff_max = std::chrono::milliseconds(200);
    auto client = sluice::ControlClient::start(*s->stage, co);
    if (!client) {
      std::fprintf(stderr, "stage %s: %s\n", so.name.c_str(), client.status().message().c_str());
      return 1;
    }
    s->client = std::move(*client);
    sims.push_back(std::move(s));
  }
  // The load starts once every stage has its first rules from the daemon.
  for (auto& s : sims) (void)s->client->wait_ready(std::chrono::seconds(10));

  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (auto& s : sims) threads.emplace_back([&o, &s, &stop] { load(o, *s, stop); });

  const double bin_s = o.bin_ms / 1000.0;
  const double end = o.start_unix + o.duration;
  auto k = static_cast<long>((now_unix() - o.start_unix) / bin_s) + 1;
  std::vector<std::uint64_t> last(sims.size());
  for (std::size_t i = 0; i < sims.size(); ++i) last[i] = sims[i]->served.load();
  double t_last = now_unix();
  for (;; ++k) {
    const double edge = o.start_unix + static_cast<double>(k) * bin_s;
    if (edge > end + 1e-9) break;
    sleep_until_unix(edge);
    const double t = now_unix();
    const double elapsed = t - t_last;
    t_last = t;
    json stages = json::array();
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < sims.size(); ++i) {
      const std::uint64_t now_served = sims[i]->served.load();
      const std::uint64_t d = now_served - last[i];
      last[i] = now_served;
      bytes += d;
      stages.push_back({{"stage", sims[i]->stage->name()},
                        {"served_bytes", d},
                        {"rate", drl_rate(*sims[i]->stage)},
                        {"rules_version", sims[i]->stage->rules_version()},
                        {"board_updates", sims[i]->stage->board_updates()},
                        {"connected", sims[i]->client->connected()}});
    }
    const double from = edge - bin_s - o.start_unix;
    const json line{{"node", o.node},
                    {"t", from},
                    {"bin_s", bin_s},
                    {"elapsed_s", elapsed},
                    {"unix", t},
                    {"served_bytes", bytes},
                    {"served_per_s", static_cast<double>(bytes) / bin_s},
                    {"offered_per_s", offered_at(o, from)},
                    {"stages", stages}};
    std::fputs((line.dump() + "\n").c_str(), out);
    std::fflush(out);
  }
  stop = true;
  for (auto& s : sims) s->stage->shutdown();
  for (std::thread& th : threads) th.join();
  for (auto& s : sims) s->client->stop();
  std::fclose(out);
  return 0;
}
