// SLUICE_DCHECK with NDEBUG (Release, RelWithDebInfo): the condition is not
// evaluated, and a false one neither aborts nor prints.
#ifndef NDEBUG
#define NDEBUG
#endif

#include <catch2/catch.hpp>

#include "sluice/dcheck.h"

TEST_CASE("With NDEBUG a check evaluates nothing and never aborts", "[dcheck]") {
  int evaluated = 0;
  auto broken = [&evaluated] {
    ++evaluated;
    return false;
  };
  SLUICE_DCHECK(broken(), "never evaluated");
  SLUICE_DCHECK(false, "never aborts");
  CHECK(evaluated == 0);
}
