#!/usr/bin/env bash
# The CI smoke run of examples/delta-fair's experiment `cache` (ctest -L smoke, well under
# a minute): the offline reader's return at a tiny scale (offline at 0.5 s, back at 2 s,
# of 3 s) with δ = 250 ms, δ = inf and RocksDB's shared LRU cache, then smoke_check.py
# checks the pipeline -- every run wrote its bins, its ramp line and its end line with no
# failed read, the daemon's delta-fair policy set the cache's thresholds to what `sluice
# policy check` derived, summary.json has every field with sane values, the figures
# exist -- not the numbers.
#
# usage: smoke_cache.sh BUILD_DIR WORK_DIR
# Exit 77 (skipped) when this build cannot run the tenant cache under the policy (no
# cache-reserve object, no `cache` member in the delta-fair policy or no `policy check`),
# after checking the shared-LRU run alone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1
work=$2
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
smoke_begin "$build" "$work" control-plane/sluice examples/delta-fair/sluice-delta-fair-cache-node
sluice=$build/control-plane/sluice
node=$build/examples/delta-fair/sluice-delta-fair-cache-node
missing=""
if ! "$python" "$here/run_cache.py" --experiment cache --build "$build" --out "$work/probe" \
  --mode smoke --configs delta-250 --plan-only > "$work/plan.log" 2>&1; then
  missing="the plan failed: $(tail -c 300 "$work/plan.log")"
elif ! "$node" --probe --rules "$work/probe/raw/delta-250/rules.json" > "$work/probe.log" 2>&1; then
  missing=$(tr '\n' ' ' < "$work/probe.log")
elif ! smoke_daemon_takes "$sluice" "$work/probe/raw/delta-250/policy.json" \
    "$work/probe-daemon.log"; then
  missing="the daemon refused the delta-fair policy: $(head -c 300 "$work/probe-daemon.log")"
fi
setups="delta-250 delta-inf lru"
[ -z "$missing" ] || setups=lru
smoke_run "$work/run.log" "$here/run.sh" --experiment cache --smoke --build "$build" \
  --out "$work/out" --setups "$setups"
"$python" "$here/smoke_check.py" "$work/out"
if [ -n "$missing" ]; then
  echo "smoke_cache.sh: SKIP: the tenant cache cannot run under the policy in this build: $missing"
  exit 77
fi
