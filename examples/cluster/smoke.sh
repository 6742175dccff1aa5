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
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
smoke_begin "$build" "$work" control-plane/sluice examples/cluster/sluice-cluster-stage \
  bench/sluice-bench-cluster
smoke_run "$work/run.log" "$here/run.sh" --smoke --build "$build" --out "$work/out"
"$python" "$here/smoke_check.py" "$work/out"
