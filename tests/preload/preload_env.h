// What LD_PRELOAD names for a program the preload's tests run under the
// preload: the library, after the sanitizer's runtime where one must lead
// (tests/preload/CMakeLists.txt defines both paths); and whether a program
// not built here can load the preload at all.
#pragma once

#include <string>

#include "test_util.h"

namespace sluice::testing {

inline std::string preload_value() {
  return preload_list(SLUICE_PRELOAD_SO, SLUICE_SANITIZER_RUNTIME);
}

// Whether a program not built here (bash, /bin/true) can load the preload as
// these tests built it: always unsanitized; sanitized, only with the
// sanitizer's runtime as a shared object to load first, which clang's TSan
// build lacks (its runtime is linked into each program).
inline bool foreign_programs_load_preload() {
  return !(SLUICE_TEST_ASAN || SLUICE_TEST_TSAN) || SLUICE_SANITIZER_RUNTIME[0] != '\0';
}

}  // namespace sluice::testing
