// The preload's process-image constructor. This file is built into a separate
// static library that the shared object links *after* libstage, so that its
// .init_array entry follows every libstage static initialiser: the stage is
// created only once everything it uses is constructed. (Interposed calls made
// earlier, e.g. by other libraries' constructors, pass through.)
#include "runtime.h"

namespace sluice::preload {

// Referenced from interpose.cc so that the linker pulls this member in.
extern "C" int sluice_preload_init_anchor;
int sluice_preload_init_anchor = 0;

namespace {
__attribute__((constructor)) void sluice_preload_constructor() {
  init_process();
}
}  // namespace

}  // namespace sluice::preload
