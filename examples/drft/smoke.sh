#!/usr/bin/env bash
# The CI smoke run of examples/drft (ctest -L smoke, well under a minute): every case at
# a tiny scale (1 s runs, one (workload, database) pair each, both workloads and both
# database kinds covered) with the three setups, then smoke_check.py checks the pipeline
# -- every run ended without a failed transaction, the drft object admitted and counted
# transactions for every tenant, summary.json has every field with sane values, the
# figures exist -- not the numbers; and that a bad plan is refused, naming the field.
#
# usage: smoke.sh BUILD_DIR WORK_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1
work=$2
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
smoke_begin "$build" "$work" examples/drft/sluice-drft-node
node=$build/examples/drft/sluice-drft-node
# A bad plan is refused with exit 2 and a message naming the field, before anything runs.
refuses() {  # FIELD-TEXT PLAN-JSON
  printf '%s' "$2" > "$work/bad.json"
  local rc=0
  "$node" --plan "$work/bad.json" --out "$work/bad.jsonl" 2> "$work/bad.log" || rc=$?
  if [ $rc != 2 ] || ! grep -q -- "$1" "$work/bad.log"; then
    echo "smoke.sh: a plan with a bad $1 gave exit $rc: $(cat "$work/bad.log")" >&2
    exit 1
  fi
}
good='"workload": "ycsb", "dir": "'$work'/db", "duration_s": 1, "tenants": [{"id": 1}]'
refuses "db: must be" '{"db": "mvcc", '"$good"', "scheduler": {}}'
refuses "slots:" '{"db": "optimistic", '"$good"', "scheduler": {"slots": 0}}'
refuses "tenants\[0\].clients" '{"db": "optimistic", "workload": "ycsb", "dir": "'"$work"'/db",
  "duration_s": 1, "scheduler": {}, "tenants": [{"id": 1, "clients": -1}]}'
[ ! -e "$work/db" ] || { echo "smoke.sh: a refused plan made $work/db" >&2; exit 1; }
smoke_run "$work/run.log" "$here/run.sh" --smoke --build "$build" --out "$work/out"
"$python" "$here/smoke_check.py" "$work/out"
