#!/usr/bin/env bash
# The CI smoke run of examples/flex's experiment `bosr` (ctest -L smoke, under a minute):
# BOSR 3 at a tiny scale (2048 items per partition, a 5 s window, 3 s after it) with the
# setups rocksdb and sluice, then smoke_check_bosr.py checks the pipeline -- every run
# wrote its samples and its end line with no failed operation, the sluice run's stages
# joined the daemon and its gates changed state (the mechanism engaged), summary.json has
# every field with sane values, the figures exist -- not the numbers.
#
# usage: smoke_bosr.sh BUILD_DIR WORK_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1
work=$2
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
smoke_begin "$build" "$work" control-plane/sluice examples/flex/sluice-flex-bosr
smoke_run "$work/run.log" "$here/run.sh" --experiment bosr --smoke --build "$build" \
  --out "$work/out" --setups "rocksdb sluice"
"$python" "$here/smoke_check_bosr.py" "$work/out"
