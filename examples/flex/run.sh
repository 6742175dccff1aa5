#!/usr/bin/env bash
# FlexEngine's two-level I/O admission control on Sluice, scaled to one small machine.
# Experiments (--experiment):
#   sudden-load  §5.3.1, Fig. 9: co-located RocksDB instances in one process on tmpfs,
#                three writing, one idle for 10 s and then reading 3K Zipfian Gets/s;
#                setups in the same invocation:
#                  auto-tuned  RocksDB's GenericRateLimiter per DB, auto-tuned
#                  static      the same limiter at a fixed share of the device
#                  sluice      a partition stage per DB (foreground and background
#                              buckets) over one node stage (a bucket at the device's
#                              bandwidth), rates set by `sluice serve --policy` (flex)
#   bosr         §5.3.2, Fig. 7 and 10: eight co-located RocksDB instances writing
#                continuously while the node's bandwidth is short of their background
#                demand (BOSR 1.5, 2, 2.5, 3), then after it returns; setups in the same
#                invocation:
#                  rocksdb      the device's cap alone (one bucket, arrival order)
#                  node         + node-level control (partition and node buckets, flex)
#                  first-stage  + compaction deferral's first stage (compaction-deferral)
#                  sluice       + its second stage (intra-L0 compactions)
# run.py plans and drives sluice-flex-node (flex_node.cc) or, for bosr, sluice-flex-bosr
# (bosr_node.cc, driven by bosr.py); analyze.py writes summary.json, summary.md and the
# figures. See README.md.
#
# usage: examples/flex/run.sh --experiment sudden-load|bosr [--build DIR] [--out DIR]
#          [--quick | --smoke] [--reps N] [--setups "..."] [--device-mib M] [--dir DIR]
#          [--no-daemon] [--sluice PATH] [--lsm-ba X]
#
# --build DIR: the build tree holding control-plane/sluice and
# examples/flex/sluice-flex-node (default: build/ at the top of the repository, or
# $SLUICE_BUILD). --out DIR: where params.json, summary.*, the figure and raw/ go
# (default: results/<experiment>, results-quick/<experiment> or results-smoke/<experiment>
# here; docs/benchmarks.md, "Results"). --quick: every setup once, 200K items, 20 s of load (under
# 5 minutes); for bosr every BOSR and setup once, a 9 s window and 4 s after it. --smoke: the pipeline at a tiny scale (smoke.sh). --dir: where the DBs live
# (default /dev/shm: tmpfs, so that the buckets, not the disk, are the device).
# --lsm-ba X (bosr): the LSM-BA the background demand is computed with, instead of the
# one a calibration run measures first.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
harness_parse --experiments "sudden-load bosr" --values "--reps --setups --device-mib --dir
  --lsm-ba --sluice" --flags --no-daemon -- "$@"
harness_drive run.py analyze.py --experiment "$experiment"
