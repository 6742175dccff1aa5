#!/usr/bin/env bash
# The CI smoke run of examples/cluster (ctest -L smoke, about a minute): the cluster run
# at a short timeline (33 s: demand move, leader kill -9, node loss) and the scale run
# at 200 nodes x 100 stages for 5 s, then smoke_check.py checks the pipeline -- every
# node's bins, the replicas' report logs, etcd's history, summary.json with every field
# and sane values, the figure -- not the targets.
#
# usage: smoke.sh BUILD_DIR WORK_DIR
# Exit 77 (skipped) without etcd ($SLUICE_ETCD, else /usr/bin/etcd: Debian's
# etcd-server).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1
work=$2
etcd=${SLUICE_ETCD:-/usr/bin/etcd}
if [ ! -x "$etcd" ]; then
  echo "smoke.sh: SKIP: no etcd at $etcd (Debian's etcd-server)"
  exit 77
fi
for b in control-plane/sluice examples/cluster/sluice-cluster-stage bench/sluice-bench-cluster; do
  [ -x "$build/$b" ] || { echo "smoke.sh: $build/$b is not built" >&2; exit 1; }
done
rm -rf "$work"
mkdir -p "$work"
# shellcheck source=../common.sh
. "$here/../common.sh"
python=$(example_python)
"$here/run.sh" --smoke --build "$build" --out "$work/out" > "$work/run.log" 2>&1 ||
  { tail -n 40 "$work/run.log"; exit 1; }
"$python" "$here/smoke_check.py" "$work/out"
