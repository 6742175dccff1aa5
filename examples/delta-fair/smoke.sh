#!/usr/bin/env bash
# The CI smoke run of examples/delta-fair (ctest -L smoke, well under a minute): the
# experiment `buffer` at a tiny scale (the ramp at 2.5 s of 4 s) with δ = 350 ms, δ = inf
# and plain RocksDB, then smoke_check.py checks the pipeline -- every run wrote its bins
# and its end line with no failed put, the daemon's delta-fair policy configured the pool
# with the reservation `sluice policy check` derived, summary.json has every field with
# sane values, the figures exist -- not the numbers.
#
# usage: smoke.sh BUILD_DIR WORK_DIR
# Exit 77 (skipped) when this build cannot run the gated setup (no buffer-pool object,
# no tenant gate or no delta-fair policy), after checking the plain RocksDB run alone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1
work=$2
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
smoke_begin "$build" "$work" control-plane/sluice examples/delta-fair/sluice-delta-fair-node
sluice=$build/control-plane/sluice
node=$build/examples/delta-fair/sluice-delta-fair-node
"$python" "$here/run.py" --build "$build" --out "$work/probe" --mode smoke \
  --configs delta-350 --plan-only 2> /dev/null
missing=""
if ! "$node" --probe --rules "$work/probe/raw/delta-350/rules.json" > "$work/probe.log" 2>&1; then
  missing=$(tr '\n' ' ' < "$work/probe.log")
fi
if ! smoke_daemon_takes "$sluice" "$work/probe/raw/delta-350/policy.json" "$work/probe-daemon.log"; then
  missing="$missing the daemon refused the delta-fair policy: $(head -c 300 "$work/probe-daemon.log")"
fi
setups="delta-350 delta-inf plain"
[ -z "$missing" ] || setups=plain
smoke_run "$work/run.log" "$here/run.sh" --experiment buffer --smoke --build "$build" \
  --out "$work/out" --setups "$setups"
"$python" "$here/smoke_check.py" "$work/out"
if [ -n "$missing" ]; then
  echo "smoke.sh: SKIP: the gated setup cannot run in this build: $missing"
  exit 77
fi
