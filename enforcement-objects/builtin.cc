// The built-in object types, registered into Registry::global() on first use.
#include "sluice/enforcement_object.h"
#include "sluice/objects/drl.h"
#include "sluice/objects/noop.h"

namespace sluice {

void register_builtin_objects(Registry& registry) {
  (void)registry.add({"noop", "pass-through; counts only", make_noop});
  (void)registry.add({"drl", "token bucket in bytes/s or ops/s (dynamic rate limiter)", make_drl});
}

}  // namespace sluice
