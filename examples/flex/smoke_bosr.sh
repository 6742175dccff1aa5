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
for b in "$build/control-plane/sluice" "$build/examples/flex/sluice-flex-bosr"; do
  [ -x "$b" ] || { echo "smoke_bosr.sh: $b is not built" >&2; exit 1; }
done
rm -rf "$work"
mkdir -p "$work"
# shellcheck source=../common.sh
. "$here/../common.sh"
python=$(example_python)
"$here/run.sh" --experiment bosr --smoke --build "$build" --out "$work/out" \
  --setups "rocksdb sluice" > "$work/run.log" 2>&1 || { tail -n 40 "$work/run.log"; exit 1; }
"$python" "$here/smoke_check_bosr.py" "$work/out"
