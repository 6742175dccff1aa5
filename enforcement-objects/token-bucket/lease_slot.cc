#include "lease_slot.h"

#include <atomic>

namespace sluice::detail {

constinit thread_local unsigned t_lease_slot __attribute__((tls_model("initial-exec"))) = 0;

namespace {
std::atomic<unsigned> g_next_slot{0};
}  // namespace

[[gnu::noinline]] unsigned assign_lease_slot() noexcept {
  t_lease_slot = g_next_slot.fetch_add(1, std::memory_order_relaxed) % kLeaseSlots + 1;
  return t_lease_slot;
}

}  // namespace sluice::detail
