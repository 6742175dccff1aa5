// Thread-local storage model for Sluice's own per-thread state. The stage is
// linked into preloaded shared objects, where the default global-dynamic model
// costs a __tls_get_addr call per access; initial-exec is one %fs-relative
// load. Sluice keeps its TLS small (well inside glibc's static TLS surplus) so
// that this is safe for libraries loaded at start-up or by LD_PRELOAD.
#pragma once

#define SLUICE_TLS __attribute__((tls_model("initial-exec")))
