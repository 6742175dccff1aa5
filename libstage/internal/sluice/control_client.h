// The stage's side of the control plane: connects a Stage to `sluice serve`
// over a UNIX socket, hands over its board, applies the rules it is sent and
// answers collects (docs/protocol.md).
//
// Fail-static: the connection lives on one background thread that enforce()
// never waits for; without a daemon the stage keeps its last rules and the
// client reconnects with jittered, doubling backoff. Its own socket I/O runs
// in an InternalIoScope, its thread blocks every signal, its descriptors are
// reserved (sluice/reserved_fd.h). Ready: the first rules message is handled.
//
// Thread safety: start() from any thread; stop() and the destructor from any
// thread but the client's own (the destructor after every other call
// returned); connected(), ready(), wait_ready() and counters() from any
// thread, any number at once, until the client is destroyed.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "sluice/stage.h"
#include "sluice/status.h"

namespace sluice {

struct ControlClientOptions {
  std::string socket_path;  // required
  std::chrono::milliseconds backoff_initial{100};
  std::chrono::milliseconds backoff_max{5000};
};

struct ControlClientCounters {
  std::uint64_t attempts = 0;  // connection attempts, successful or not
  std::uint64_t connects = 0;  // sessions whose hello the daemon acknowledged
  std::uint64_t rules_applied = 0;
  std::uint64_t rules_rejected = 0;
  std::uint64_t collects = 0;
  // The daemon of the current session maps the stage's board (sluice/board.h)
  // and sets objects' tunables through it.
  bool board = false;
};

class ControlClient {
 public:
  // Starts the background thread; returns at once (it does not wait for the
  // daemon). Fails only on invalid options. `stage` must outlive the client.
  static StatusOr<std::unique_ptr<ControlClient>> start(Stage& stage, ControlClientOptions options);
  ~ControlClient();  // stop()
  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;

  // Closes the connection, joins the thread and closes its descriptors; wakes
  // every wait_ready() caller. Idempotent. The stage keeps its rules.
  void stop() noexcept;

  bool connected() const noexcept;
  // Whether the stage is ready (see above); once true, true for good.
  bool ready() const noexcept;
  // Waits, without spinning (a condition variable), until the stage is ready,
  // `timeout` passed, stop() was called, or no session is under way (the last
  // attempt failed to connect, or its session ended before the first rules:
  // no daemon would send any soon). Returns ready().
  bool wait_ready(std::chrono::milliseconds timeout) const;
  ControlClientCounters counters() const noexcept;

  struct Impl;

 private:
  explicit ControlClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
