// The stage's side of the control plane: connects a Stage to `sluice serve`
// over a UNIX socket, says hello, applies the rules it is sent and answers
// collect requests (docs/protocol.md).
//
// With its hello the client hands the daemon the stage's board
// (Stage::board()), through which the daemon sets the objects' tunables
// without a message; a stage whose system offers no memfd goes without.
//
// Fail-static: the connection lives on one background thread; enforce() never
// waits for it. When the daemon goes away the stage keeps enforcing its last
// rules and the client reconnects with exponential backoff (100 ms doubling to
// 5 s, with jitter). All of the client's own socket I/O runs under an
// InternalIoScope, so a preloaded stage never enforces it.
//
// Thread safety: start() from any thread; the returned client may be
// destroyed from any thread other than its own callbacks; connected() and
// counters() are safe from any thread.
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
  std::uint64_t connects = 0;
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
  ~ControlClient();  // closes the connection and joins the thread
  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;

  bool connected() const noexcept;
  ControlClientCounters counters() const noexcept;

  struct Impl;

 private:
  explicit ControlClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
