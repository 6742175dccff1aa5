#!/usr/bin/env bash
# The CI smoke run of examples/drft (ctest -L smoke, well under a minute): every case at
# a tiny scale (1 s runs, one (workload, database) pair each, both workloads and both
# database kinds covered) with the three setups, then smoke_check.py checks the pipeline
# -- every run ended without a failed transaction, the drft object admitted and counted
# transactions for every tenant, summary.json has every field with sane values, the
# figures exist -- not the numbers.
#
# usage: smoke.sh BUILD_DIR WORK_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1
work=$2
node=$build/examples/drft/sluice-drft-node
[ -x "$node" ] || { echo "smoke.sh: $node is not built" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
# shellcheck source=../common.sh
. "$here/../common.sh"
python=$(example_python)
"$here/run.sh" --smoke --build "$build" --out "$work/out" > "$work/run.log" 2>&1 ||
  { tail -n 40 "$work/run.log"; exit 1; }
"$python" "$here/smoke_check.py" "$work/out"
