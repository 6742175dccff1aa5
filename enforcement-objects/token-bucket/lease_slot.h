// What the token buckets share (drl, prio-bucket): their units, and the slot a
// thread takes its token leases from: a thread is given one round robin at its
// first request to any of them, so that the first kLeaseSlots threads of a
// process never share one, and keeps it. Not installed.
//
// Thread safety: lease_slot() reads and, once per thread, writes this
// thread's own slot; the round robin is an atomic counter.
#pragma once

#include <cstdint>
#include <limits>

namespace sluice::detail {

inline constexpr unsigned kLeaseSlots = 16;

// The token buckets' units: nanoseconds a second, and a deadline never reached.
inline constexpr long double kNsPerSecond = 1e9L;
inline constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

// This thread's slot plus one (0: none yet). Initial-exec: the stage runs
// inside preloaded shared objects, where the default model costs a call per
// access; constinit: no dynamic initialisation, so no TLS wrapper call.
extern constinit thread_local unsigned t_lease_slot __attribute__((tls_model("initial-exec")));

// Gives this thread its slot (lease_slot.cc); kept out of line.
unsigned assign_lease_slot() noexcept;

// This thread's slot, in [0, kLeaseSlots).
inline unsigned lease_slot() noexcept {
  unsigned s = t_lease_slot;
  if (s == 0) [[unlikely]]
    s = assign_lease_slot();
  return s - 1;
}

}  // namespace sluice::detail
