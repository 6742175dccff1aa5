#!/usr/bin/env bash
# PAIO §9.2 scaled down: runs setup x workload x repetition of silk_bench (run.py), then
# draws the plots and the summary (analyze.py). See README.md for the parameters and their
# scaling.
#
# usage: examples/silk/run.sh [--build DIR] [--out DIR] [--quick | --smoke] [--data DIR]
#          [--reps N] [--setups "plain auto static sluice bound"]
#          [--workloads "mixture read-heavy write-heavy"]
#          [--kvs-mib M] [--silk combined|per-direction] [--silk-headroom PCT]
#          [--silk-share equal|reclaim] [--no-throttle] [--reload]
#          [--sluice PATH] [-- extra silk_bench options]
#
# --build DIR: the build tree holding examples/silk/silk_bench and control-plane/sluice
# (default: build/ at the top of the repository, or $SLUICE_BUILD). --out DIR: where the
# summary, figures, params.json, policy.json and raw/ go (default: results/, results-quick/
# or results-smoke/ here; docs/benchmarks.md, "Results"). --data DIR: where the template
# store, the runs' store and the daemon's socket live (default /var/tmp/sluice-silk).
# --quick: the mixture, every setup of the full run, one repetition, a 250k-key store and
# a 22 s timeline (8 s initial valley, two 5 s peaks with 2 s valleys), in under 5
# minutes on a 2-vCPU VM; --smoke: the same pipeline at a tiny scale (smoke.sh).
# --reps and --workloads given explicitly win over either.
#
# KVS_B is enforced by the kernel for every setup: silk_bench runs in its own cgroup v1
# blkio group whose throttle.read_bps_device and throttle.write_bps_device are KVS_B for
# the device holding --data (direct I/O makes the throttle see all of RocksDB's data I/O).
# The Sluice+SILK setup starts `sluice serve --policy policy.json` (outside the cgroup: the
# daemon does no disk I/O), which logs the policy's decisions after every step.
# --silk picks SILK's model of the device: `combined` (PAIO's Algorithm 1, one KVS_B for reads
# and writes together: layout.json, policy.json) or `per-direction` (a KVS_B per direction,
# as the blkio throttle has: layout-directional.json, policy-directional.json). README.md,
# "SILK per direction", says which is the default and why. --silk-headroom PCT gives SILK a
# KVS_B PCT% below the throttle's (default 0: the same), leaving the device that much room.
# --silk-share sets the policy's `share` (docs/policies.md): how line 5 splits left_B between
# a flush and an L0 compaction, `reclaim` (the default here: what one leaves unused goes to the
# other) or `equal` (the paper's halves; README.md, "Line 5's split", says why not).
# --reload loads the template store again even if one of the same parameters exists.
# Exit 1 if a run failed (the analysis still draws the others).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
harness_parse --values "--data --reps --setups --workloads --kvs-mib --silk --silk-headroom
  --silk-share --sluice" --flags "--no-throttle --reload" -- "$@"
harness_drive run.py analyze.py
