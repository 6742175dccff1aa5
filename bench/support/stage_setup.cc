#include "support/stage_setup.h"

#include <thread>
#include <utility>

namespace sluice::bench {

Status apply_rules_file(Stage& stage, const std::string& path) {
  auto text = read_rules_file(path);
  if (!text.is_ok()) return text.status();
  return stage.apply_text(*text).with_prefix(path + ": ");
}

StatusOr<std::unique_ptr<ControlClient>> start_control_client(Stage& stage,
                                                              const std::string& socket,
                                                              std::chrono::seconds timeout) {
  ControlClientOptions options;
  options.socket_path = socket;
  auto started = ControlClient::start(stage, options);
  if (!started.is_ok()) {
    const Status& s = started.status();
    return Status(s.code(), "control client: " + s.to_string());
  }
  std::unique_ptr<ControlClient> client = std::move(started).value();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (client->counters().rules_applied == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (client->counters().rules_applied == 0) {
    return Status::unavailable("no rules from the control plane at " + socket + " within " +
                               std::to_string(timeout.count()) + " s");
  }
  return client;
}

}  // namespace sluice::bench
