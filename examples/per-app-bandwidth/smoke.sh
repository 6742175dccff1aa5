#!/usr/bin/env bash
# The CI smoke run of examples/per-app-bandwidth (ctest -L smoke, well under a minute): two
# fio readers under `sluice run`, baseline and Sluice max-min, at a tiny scale, then
# smoke_check.py checks the pipeline -- daemon up, both instances preloaded and collected,
# maxmin's rules applied by the stages, plot and table written -- not the numbers.
#
# usage: smoke.sh BUILD_DIR WORK_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1
work=$2
sluice=$build/control-plane/sluice
if ! command -v fio > /dev/null; then
  echo "smoke.sh: SKIP: fio is not installed (scripts/install-deps.sh installs it)"
  exit 77
fi
[ -x "$sluice" ] || { echo "smoke.sh: $sluice is not built" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work/data"' EXIT
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
smoke_run "$work/run.log" "$here/run.sh" --smoke --setups "baseline maxmin" --build "$build" \
  --out "$work/out" --data "$work/data"
"$(example_python)" "$here/smoke_check.py" "$work/out"
