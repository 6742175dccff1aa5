// `sluice`: see cli.h.
#include "cli.h"
#include "sluice/objects/builtin.h"

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
  return sluice::control::run_cli(argc, argv);
}
