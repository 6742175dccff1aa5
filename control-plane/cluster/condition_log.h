// One condition's log lines (etcd unreachable, a summary refused, a decision
// ignored): its first failure and every change of its message are logged,
// repeats of the same message are only counted, and its end is logged once
// with how many repeats went unlogged. A control loop that fails every
// interval while etcd is down then writes two lines, not one a step.
//
// Thread safety: none; each loop keeps its own.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <spdlog/spdlog.h>

namespace sluice::cluster {

class ConditionLog {
 public:
  // `what` opens every line ("cluster 'c': reading node summaries").
  explicit ConditionLog(std::string what) : what_(std::move(what)) {}

  // The condition holds, saying `message`: a warning when it is new or says
  // something else than last time; else counted.
  void fail(const std::string& message) {
    if (failing_ && message == message_) {
      ++repeats_;
      return;
    }
    if (failing_ && repeats_ > 0) {
      spdlog::warn("{}: {} (after {} more of: {})", what_, message, repeats_, message_);
    } else {
      spdlog::warn("{}: {}", what_, message);
    }
    failing_ = true;
    message_ = message;
    repeats_ = 0;
  }
  // The condition is over: one line when it held.
  void ok() {
    if (!failing_) return;
    spdlog::info("{}: recovered ({} repeats not logged)", what_, repeats_);
    failing_ = false;
    message_.clear();
    repeats_ = 0;
  }
  bool failing() const noexcept { return failing_; }
  std::uint64_t repeats() const noexcept { return repeats_; }

 private:
  std::string what_;
  std::string message_;
  bool failing_ = false;
  std::uint64_t repeats_ = 0;
};

}  // namespace sluice::cluster
