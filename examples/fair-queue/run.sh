#!/usr/bin/env bash
# Pisces (OSDI '12) §6.2, §6.3 and §6.5 scaled to one machine: N stage processes
# ("nodes"), each with one fair queue (`fq`) at a fixed capacity; tenants with equal and
# unequal global weights whose demand is skewed across the nodes; half of them double
# their demand mid-run, one goes idle for 10 s and comes back. Every case runs four
# configurations in the same invocation:
#   no-control         one token bucket (drl) at the node's capacity, shared in FIFO order
#   static-drl         a drl per tenant at its static share of the node (not work-conserving)
#   fq-static-weights  the fq with local weights = global weights, no policy
#   pisces             the fq, and `sluice serve` running the pisces policy (weight allocation)
# run.py plans the cases and runs sluice-fq-node (fq_node.cc) under `sluice serve`;
# analyze.py writes summary.json, summary.md and the figures. See README.md.
#
# usage: examples/fair-queue/run.sh [--build DIR] [--out DIR] [--quick | --smoke]
#          [--reps N] [--nodes N] [--capacity-mib M] [--cases "..."] [--configs "..."]
#          [--interval-ms MS] [--method maxmin|mbf|reciprocal] [--max-swaps N] [--dir DIR]
#          [--sluice PATH]
#
# --build DIR: the build tree holding control-plane/sluice and
# examples/fair-queue/sluice-fq-node (default: build/ at the top of the repository, or
# $SLUICE_BUILD). --out DIR: where params.json, summary.*, the figures and raw/ go
# (default: results/, results-quick/ or results-smoke/ here; docs/benchmarks.md, "Results").
# --setups is another name for --configs.
# --quick: the four cases and the four configurations, one repetition, 5 s phases (the
# idle tenant only in `equal`), a 500 ms policy interval: under 5 minutes on a 2-vCPU VM.
# --smoke: the pipeline at a tiny scale on 2 nodes (smoke.sh). Options given explicitly
# win over either. --dir: where each node writes the file it reads (default /dev/shm).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
harness_parse --values "--reps --setups --configs --nodes --capacity-mib --cases --interval-ms
  --method --max-swaps --dir --sluice" -- "$@"
harness_drive run.py analyze.py
