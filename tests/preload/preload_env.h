// What LD_PRELOAD names for a program the preload's tests run under the
// preload: the library, after the sanitizer's runtime where one must lead
// (tests/preload/CMakeLists.txt defines both paths).
#pragma once

#include <string>

#include "test_util.h"

namespace sluice::testing {

inline std::string preload_value() {
  return preload_list(SLUICE_PRELOAD_SO, SLUICE_SANITIZER_RUNTIME);
}

}  // namespace sluice::testing
