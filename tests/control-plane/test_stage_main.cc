// A stage in a process of its own: connects to the daemon and enforces a
// steady trickle of requests until killed.
//   control_test_stage SOCKET NAME
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "sluice/control_client.h"
#include "sluice/objects/builtin.h"
#include "sluice/stage.h"

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
  if (argc < 3) {
    std::fprintf(stderr, "usage: control_test_stage SOCKET NAME\n");
    return 2;
  }
  sluice::StageOptions so;
  so.name = argv[2];
  so.labels["role"] = "test";
  auto stage = sluice::Stage::create(so);
  if (!stage) return 1;
  sluice::ControlClientOptions co;
  co.socket_path = argv[1];
  co.backoff_initial = std::chrono::milliseconds(20);
  co.backoff_max = std::chrono::milliseconds(200);
  auto client = sluice::ControlClient::start(**stage, co);
  if (!client) return 1;
  for (;;) {
    (void)(*stage)->enforce(sluice::Op::kWrite, 4096);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}
