#!/usr/bin/env bash
# FairDB's Delta Fair Sharing experiments scaled to one small machine, on unmodified
# RocksDB (one database, tenants as column families). Three experiments:
#   buffer       §7.2.1, Table 4's write-buffer row (run.py, analyze.py; below)
#   cache        §7.2.2, Table 4's read-cache row and Table 6: 32 readers share one block
#                cache; one goes offline and returns with a MultiGet of its working set
#                (run_cache.py, analyze_cache.py; README.md)
#   composition  §7.3, Table 5: the returning reader reads its working set back and
#                writes part of it through the write-buffer pool, over the 3x3 grid of
#                (δ_buffer, δ_cache)
#
# Experiment `buffer`: 16 tenants as column families (12 steady writers, 2 aggressive
# ones, 2 that are idle until the ramp and then write a batch of their fair share at
# once), flush I/O through a fair queue at the scaled device's bandwidth. Every run
# executes six configurations in the same invocation:
#   delta-0 .. delta-inf  the tenant gate and the write-buffer pool, its reservation set
#                         by `sluice serve` running the delta-fair policy at δ = 0, 200,
#                         350, 500 ms and inf (0: static quotas for the ramp-ups; inf:
#                         instantaneous fair sharing)
#   plain                 RocksDB as is: one WriteBufferManager of the same capacity
#                         with allow_stall, no gate
# run.py plans the run and drives sluice-delta-fair-node (delta_fair_node.cc);
# analyze.py writes summary.json, summary.md and the figures. See README.md.
#
# usage: examples/delta-fair/run.sh --experiment buffer|cache|composition [--build DIR]
#          [--out DIR]
#          [--quick | --smoke] [--reps N] [--setups "..."] [--scale F]
#          [--aggressive-factor X] [--rounding nearest|strict] [--no-daemon] [--dir DIR]
#          [--sluice PATH]
#
# --build DIR: the build tree holding control-plane/sluice and
# examples/delta-fair/sluice-delta-fair-node (default: build/ at the top of the
# repository, or $SLUICE_BUILD). --out DIR: where params.json, summary.*, the figures and
# raw/ go (default: results/<experiment>, results-quick/<experiment> or
# results-smoke/<experiment> here; docs/benchmarks.md, "Results"). --quick: every configuration once, the ramp at 8 s of 14 s
# (under 5 minutes on a 2-vCPU VM). --smoke: the pipeline at a tiny scale (smoke.sh).
# --setups: the configurations to run (default: all of the experiment's; `cache` in
# --quick runs k = 2, 4, 6 of the k sweep). --dir: where the DB lives
# (default /dev/shm: tmpfs, so that the fair queue, not the disk, is the device).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
harness_parse --experiments "buffer cache composition" --values "--reps --setups --configs --scale
  --aggressive-factor --rounding --dir --interval-ms --sluice" --flags --no-daemon -- "$@"
if [ "$experiment" = buffer ]; then
  harness_drive run.py analyze.py
else
  harness_drive run_cache.py analyze_cache.py --experiment "$experiment"
fi
