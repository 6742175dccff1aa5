#include "sluice/objects/builtin.h"

#include <vector>

#include "sluice/objects/buffer_pool.h"
#include "sluice/objects/cache_reserve.h"
#include "sluice/objects/drl.h"
#include "sluice/objects/fq.h"
#include "sluice/objects/noop.h"
#include "sluice/objects/prio_bucket.h"

namespace sluice::objects {
namespace {

std::vector<ObjectType> builtin_types() {
  return {
      {"noop", "pass-through; counts only", make_noop},
      {"drl", "token bucket in bytes/s or ops/s (dynamic rate limiter)", make_drl},
      {"fq", "weighted fair queue with dominant resource fairness (start-time fair queuing)",
       make_fq},
      {"prio-bucket",
       "token bucket shared by classes of requests: strict priorities, weights within a "
       "priority (start-time fair queuing), FIFO within a class",
       make_prio_bucket},
      {"buffer-pool",
       "capacity held between acquire and release, with a reserved pool for flows below their "
       "fair share (Delta Fair Sharing's write buffer)",
       make_buffer_pool},
      {"cache-reserve",
       "a read cache's capacity and per-tenant reserved thresholds (Delta Fair Sharing)",
       make_cache_reserve},
  };
}

}  // namespace

Status register_builtin(Registry& registry) {
  for (ObjectType& type : builtin_types()) SLUICE_RETURN_IF_ERROR(registry.add(std::move(type)));
  return {};
}

void register_builtin() {
  // Once per process, from any thread: a function-local static's initialisation.
  static const bool done = [] {
    for (ObjectType& type : builtin_types()) (void)Registry::global().add(std::move(type));
    return true;
  }();
  (void)done;
}

}  // namespace sluice::objects
