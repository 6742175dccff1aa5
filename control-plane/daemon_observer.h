// What the daemon's control loop tells an observer (benchmarks and tools that
// time it): each event as it happens, on the loop thread, with no time or CPU
// measured by the daemon; without an observer each event costs a null test.
// A step's events come in this order: step_decided, board_written per stage
// whose board took the tunables, rules_writing and rules_written around each
// stage's rules frame, step_sent; later, step_answered once every stage sent
// rules has answered.
//
// Thread safety: every call is on the daemon's loop thread, one at a time. A
// callback must be quick (it delays the stages' rules) and must not call the
// daemon.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace sluice::control {

class DaemonObserver {
 public:
  virtual ~DaemonObserver() = default;

  // A collect round closed: every stage answered, or its time ran out.
  // `started_ns`: when its collects went out (steady clock, ns).
  virtual void round_finished(std::int64_t /*started_ns*/) {}
  // The policy's step returned: `decided_ns` is the decision's time (steady
  // clock), which the step's rules frames carry as decided_ns.
  virtual void step_decided(std::int64_t /*decided_ns*/) {}
  // `stage`'s board holds the tunables decided at `decided_ns` (a step's, or
  // a new stage's first rules): the change is in effect there from now on.
  virtual void board_written(std::string_view /*stage*/, std::int64_t /*decided_ns*/) {}
  // Right before and right after a step's rules frame for `stage` is handed
  // to its socket (a new stage's first rules are not a step's).
  virtual void rules_writing(std::string_view /*stage*/, std::int64_t /*decided_ns*/) {}
  virtual void rules_written(std::string_view /*stage*/, std::int64_t /*decided_ns*/) {}
  // The step's frames are all written, `frames` of them (0: it sent none).
  virtual void step_sent(std::int64_t /*decided_ns*/, std::size_t /*frames*/) {}
  // Every stage the step sent rules to has answered them (applied or
  // refused). Not called for a step some stage never answers.
  virtual void step_answered(std::int64_t /*decided_ns*/) {}
};

}  // namespace sluice::control
