#!/usr/bin/env bash
# The CI smoke run of examples/silk (ctest -L smoke, under a minute): the whole pipeline at
# a tiny scale -- load, the four setups (Sluice+SILK with `sluice serve` and the silk
# policy), the summary and the plots -- then smoke_check.py checks the files, the JSON and
# that the daemon's rules reached the stage. It checks the pipeline, not the numbers.
#
# usage: smoke.sh BUILD_DIR WORK_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1
work=$2
mkdir -p "$work"
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
sluice=${SLUICE_SMOKE_SLUICE:-$build/control-plane/sluice}
# Skip (ctest SKIP_RETURN_CODE 77) while the daemon has no "silk" policy to run.
if ! smoke_daemon_takes "$sluice" "$here/policy.json" "$work/probe.log" 2 &&
  grep -q "unknown policy" "$work/probe.log"; then
  echo "smoke.sh: SKIP: this sluice has no silk policy: $(head -c 300 "$work/probe.log")"
  exit 77
fi
rm -rf "$work/out"
mkdir -p "$work/out" "$work/data"
throttle=()
if [ ! -w /sys/fs/cgroup/blkio ]; then
  echo "smoke.sh: no writable cgroup v1 blkio: running without the KVS_B throttle" >&2
  throttle=(--no-throttle)
fi
"$here/run.sh" --smoke --reload --reps 1 --workloads mixture --build "$build" \
  --sluice "$sluice" --out "$work/out" --data "$work/data" "${throttle[@]}" > "$work/out/run.log"
"$(example_python)" "$here/smoke_check.py" "$work/out"
