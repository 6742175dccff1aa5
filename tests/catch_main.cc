// The tests' main: registers the built-in object types, as every Sluice
// program does before it makes a stage, then runs Catch2.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "sluice/objects/builtin.h"

int main(int argc, char* argv[]) {
  sluice::objects::register_builtin();
  return Catch::Session().run(argc, argv);
}
