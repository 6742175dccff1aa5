#!/usr/bin/env bash
# The CI smoke run of examples/flex (ctest -L smoke, well under a minute): experiment
# `sudden-load` at a tiny scale (20K items, 1.5 s idle, 2.5 s of load) with the three
# setups, then smoke_check.py checks the pipeline -- every run wrote its bins and its end
# line with no failed operation, the sluice run's stages joined the daemon and the node
# bucket counted bytes, summary.json has every field with sane values, the figure exists
# -- not the numbers.
#
# usage: smoke.sh BUILD_DIR WORK_DIR
# Exit 77 (skipped) when this build cannot run the sluice setup (no prio-bucket object or
# no flex policy), after checking the RocksDB limiter setups alone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1
work=$2
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
smoke_begin "$build" "$work" control-plane/sluice examples/flex/sluice-flex-node
sluice=$build/control-plane/sluice
node=$build/examples/flex/sluice-flex-node
"$python" "$here/run.py" --experiment sudden-load --build "$build" --out "$work/probe" \
  --mode smoke --plan-only 2> /dev/null
missing=""
rules=$work/probe/raw/rules-prio-bucket
if ! "$node" --probe --partition-rules "$rules/partition-rules.json" \
  --node-rules "$rules/node-rules.json" > "$work/probe.log" 2>&1; then
  missing="the prio-bucket object: $(tr '\n' ' ' < "$work/probe.log")"
fi
if ! smoke_daemon_takes "$sluice" "$work/probe/raw/policy.json" "$work/probe-daemon.log"; then
  missing="$missing the daemon refused the flex policy: $(head -c 300 "$work/probe-daemon.log")"
fi
setups="auto-tuned static sluice"
[ -z "$missing" ] || setups="auto-tuned static"
smoke_run "$work/run.log" "$here/run.sh" --experiment sudden-load --smoke --build "$build" \
  --out "$work/out" --setups "$setups"
"$python" "$here/smoke_check.py" "$work/out"
if [ -n "$missing" ]; then
  echo "smoke.sh: SKIP: the sluice setup cannot run in this build: $missing"
  exit 77
fi
