// The built-in enforcement-object types (library sluice::objects): noop, drl,
// fq, prio-bucket, buffer-pool and cache-reserve, registered by name so that rules can create them.
//
// The stage library (sluice::stage) knows no object type: a program that
// makes stages whose rules name a built-in type links sluice::objects and
// calls, once before it makes them,
//   sluice::objects::register_builtin();
// Every Sluice program does (the preload, the RocksDB plugin, the daemon and
// CLI, the benchmarks and examples).
//
// Thread safety: register_builtin() from any thread, any number of times;
// register_builtin(Registry&) as Registry::add.
#pragma once

#include "sluice/registry.h"
#include "sluice/status.h"

namespace sluice::objects {

// Adds the built-in types to `registry`. Fails with kAlreadyExists when one
// of their names is taken there (the types before it were added).
Status register_builtin(Registry& registry);

// Adds the built-in types to Registry::global(), the registry stages use by
// default, the first time it is called; later calls do nothing. A name a
// program registered there first keeps its type.
void register_builtin();

}  // namespace sluice::objects
