// A stage in a process of its own for the cluster tests: labelled with its
// tenant, its channel "app" holding a drl "limit", it connects to a node's
// daemon and offers a steady load until killed.
//   cluster_test_stage SOCKET NAME TENANT BYTES_PER_S
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <nlohmann/json.hpp>

#include "sluice/control_client.h"
#include "sluice/objects/builtin.h"
#include "sluice/stage.h"

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
  if (argc < 5) {
    std::fprintf(stderr, "usage: cluster_test_stage SOCKET NAME TENANT BYTES_PER_S\n");
    return 2;
  }
  const double offered = std::atof(argv[4]);
  sluice::StageOptions so;
  so.name = argv[2];
  so.labels["tenant"] = argv[3];
  auto stage = sluice::Stage::create(so);
  if (!stage) return 1;
  // Until the cluster decides: far more than offered.
  const auto rules = nlohmann::json::parse(R"([
    {"rule": "create_channel", "channel": "app", "default": true},
    {"rule": "create_object", "channel": "app", "object": "limit", "type": "drl",
     "config": {"rate": 1073741824}}])");
  if (!(*stage)->apply(rules).is_ok()) return 1;
  sluice::ControlClientOptions co;
  co.socket_path = argv[1];
  co.backoff_initial = std::chrono::milliseconds(20);
  co.backoff_max = std::chrono::milliseconds(200);
  auto client = sluice::ControlClient::start(**stage, co);
  if (!client) return 1;
  constexpr std::uint64_t kChunk = 16384;
  const auto t0 = std::chrono::steady_clock::now();
  double sent = 0;
  for (;;) {
    (void)(*stage)->enforce(sluice::Op::kWrite, kChunk);
    sent += kChunk;
    const auto due = t0 + std::chrono::duration<double>(sent / offered);
    std::this_thread::sleep_until(due);
  }
}
