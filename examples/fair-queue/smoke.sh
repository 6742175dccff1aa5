#!/usr/bin/env bash
# The CI smoke run of examples/fair-queue (ctest -L smoke, well under a minute): the four
# cases on 2 nodes with tiny phases, without control, with fair queues and with fair
# queues under the pisces policy, then smoke_check.py checks the pipeline -- every node
# ran and served, the daemon's policy sent rules the stages applied, summary.json has
# every field with sane values, the figures exist -- not the numbers.
#
# usage: smoke.sh BUILD_DIR WORK_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1
work=$2
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
smoke_begin "$build" "$work" control-plane/sluice examples/fair-queue/sluice-fq-node
sluice=$build/control-plane/sluice
node=$build/examples/fair-queue/sluice-fq-node
# Skip (ctest SKIP_RETURN_CODE 77) while this build has no fq object or no pisces policy.
"$python" "$here/run.py" --build "$build" --out "$work/probe" --mode smoke --cases equal \
  --plan-only 2> /dev/null
echo '{"duration_s": 0.1, "phases": [{"name": "p", "start_s": 0}],
  "flows": [{"tenant": 1, "node": 0, "size": 4096, "rates": [10]}]}' > "$work/probe/plan.json"
if ! "$node" --rules "$work/probe/raw/equal/pisces/rules-node0.json" --node 0 \
     --plan "$work/probe/plan.json" --out /dev/null 2> "$work/probe-node.log"; then
  if grep -q "unknown object type 'fq'" "$work/probe-node.log"; then
    echo "smoke.sh: SKIP: this build has no fq object type"
    exit 77
  fi
  cat "$work/probe-node.log" >&2
  exit 1
fi
if ! smoke_daemon_takes "$sluice" "$work/probe/raw/equal/policy.json" "$work/probe.log" &&
  grep -q "unknown policy" "$work/probe.log"; then
  echo "smoke.sh: SKIP: this sluice has no pisces policy: $(head -c 300 "$work/probe.log")"
  exit 77
fi
smoke_run "$work/run.log" "$here/run.sh" --smoke --build "$build" --out "$work/out" \
  --configs "no-control fq-static-weights pisces"
"$python" "$here/smoke_check.py" "$work/out"
