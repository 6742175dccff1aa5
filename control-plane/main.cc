// `sluice`: see cli.h.
#include "cli.h"

int main(int argc, char** argv) {
  return sluice::control::run_cli(argc, argv);
}
