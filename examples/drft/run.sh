#!/usr/bin/env bash
# DRFT's fair transaction scheduling on Sluice, scaled to one small machine: tenants run
# SmallBank-like and hot-item YCSB-like transactions on RocksDB's TransactionDB
# (pessimistic) and OptimisticTransactionDB through the scheduled-transaction wrapper,
# whose begins a stage's drft object admits. Setups in the same invocation:
#   fifo        the drft object with policy fifo (admission in order of arrival)
#   drft-0      DRFT, Δ = 0 (memoryless: always the least virtual time)
#   drft-delta  DRFT, Δ = 10 ms of item usage (the throughput picker chooses within it)
# Cases: isolation (16 tenants, half sending twice the transactions; also 64 tenants),
# weighted (2:1), bursty (tenants joining late), strategy-proof (a tenant inflating its
# transactions or items), utilisation (a tenant leaving), overhead (low and high
# contention). run.py plans and drives sluice-drft-node (drft_node.cc); analyze.py writes
# summary.json, summary.md and the figures. See README.md.
#
# usage: examples/drft/run.sh [--build DIR] [--out DIR] [--quick | --smoke]
#          [--setups "..."] [--cases "..."] [--dir DIR]
#
# --build DIR: the build tree holding examples/drft/sluice-drft-node (default: build/ at
# the top of the repository, or $SLUICE_BUILD). --out DIR: where params.json, summary.*,
# the figures and raw/ go (default: results/, results-quick/ or results-smoke/ here;
# docs/benchmarks.md, "Results"). --quick: every case once per setup on one (workload, database) pair,
# isolation on two, 6 s runs (under 5 minutes). --smoke: the pipeline at a tiny scale
# (smoke.sh). --dir: where the databases live (default /dev/shm).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
harness_parse --values "--setups --cases --dir" -- "$@"
harness_drive run.py analyze.py
