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
sluice=$build/control-plane/sluice
node=$build/examples/delta-fair/sluice-delta-fair-cache-node
for b in "$sluice" "$node"; do
  [ -x "$b" ] || { echo "smoke_cache.sh: $b is not built" >&2; exit 1; }
done
rm -rf "$work"
mkdir -p "$work"
# shellcheck source=../common.sh
. "$here/../common.sh"
python=$(example_python)
missing=""
if ! "$python" "$here/run_cache.py" --experiment cache --build "$build" --out "$work/probe" \
  --mode smoke --configs delta-250 --plan-only > "$work/plan.log" 2>&1; then
  missing="the plan failed: $(tail -c 300 "$work/plan.log")"
elif ! "$node" --probe --rules "$work/probe/raw/delta-250/rules.json" > "$work/probe.log" 2>&1; then
  missing=$(tr '\n' ' ' < "$work/probe.log")
else
  rc=0
  timeout 1 "$sluice" serve --socket "$work/probe.sock" \
    --policy "$work/probe/raw/delta-250/policy.json" > /dev/null 2> "$work/probe-daemon.log" || rc=$?
  if [ $rc != 124 ]; then
    missing="the daemon refused the delta-fair policy: $(head -c 300 "$work/probe-daemon.log")"
  fi
fi
setups="delta-250 delta-inf lru"
[ -z "$missing" ] || setups=lru
"$here/run.sh" --experiment cache --smoke --build "$build" --out "$work/out" \
  --setups "$setups" > "$work/run.log" 2>&1 || { tail -n 40 "$work/run.log"; exit 1; }
"$python" "$here/smoke_check.py" "$work/out"
if [ -n "$missing" ]; then
  echo "smoke_cache.sh: SKIP: the tenant cache cannot run under the policy in this build: $missing"
  exit 77
fi
