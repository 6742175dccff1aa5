#!/usr/bin/env bash
# Control across machines on one machine (see README.md): one etcd on loopback, four node
# daemons (`sluice serve --cluster`) with two enforcing stages each, three controller
# replicas (`sluice cluster`, global-rate); a tenant with a global limit whose demand is
# spread unevenly over the nodes and moves between them mid-run; the leader killed -9
# and a node lost mid-run. Then the scale run by simulation: 1,000 nodes x 100 stages
# summarised at 1 Hz against the same kind of etcd, one leader stepping over them, and
# the etcd member's write ceiling. run.py drives it; analyze.py writes summary.json,
# summary.md and cluster.png.
#
# usage: examples/cluster/run.sh [--build DIR] [--out DIR] [--quick | --smoke]
#          [--sluice PATH] [--dir DIR]
#
# --build DIR: the build tree holding control-plane/sluice,
# examples/cluster/sluice-cluster-stage and bench/sluice-bench-cluster (default: build/
# at the top of the repository, or $SLUICE_BUILD). --out DIR: where params.json,
# summary.*, the figure and raw/ go (default: results/, results-quick/ or results-smoke/
# here; docs/benchmarks.md, "Results"). --quick: the cluster run in 66 s and the scale run
# for 20 s (under 3 minutes). --smoke: the pipeline at a tiny scale (smoke.sh). --dir:
# where etcd's data and the sockets go (default /tmp). etcd: $SLUICE_ETCD, else
# /usr/bin/etcd (Debian's etcd-server).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
harness_parse --values "--sluice --dir" -- "$@"
harness_drive run.py analyze.py
