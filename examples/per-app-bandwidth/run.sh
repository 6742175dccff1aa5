#!/usr/bin/env bash
# PAIO §8.2/§9.3 (Fig. 10) scaled down: per-application bandwidth guarantees for four
# unmodified readers (fio, psync, direct I/O) sharing one disk, in four setups:
#   baseline  no control (each fio under `sluice run` with a counting-only stage)
#   blkio     static limits: each instance in its own cgroup v1 blkio group whose
#             throttle.read_bps_device is its goal (needs root)
#   static    static limits in Sluice: each stage's DRL at its goal (local rules file)
#   maxmin    `sluice serve` with the maxmin policy (goals, weights, calibration)
# Every setup runs the daemon, so each instance's stage statistics are collected the same
# way; run.py drives the runs, sample.py records them with /proc/PID/io, analyze.py draws
# the figure and the table. See README.md for the parameters and how they scale the paper's.
#
# usage: examples/per-app-bandwidth/run.sh [--build DIR] [--out DIR] [--quick | --smoke]
#          [--data DIR] [--reps N] [--setups "baseline blkio static maxmin"]
#          [--maxb MIB|auto] [--dataset-mib N] [--epochs "6 5 5 4"] [--stagger S]
#          [--bs SIZE] [--interval-ms N] [--device-mib N] [--keep-data]
#
# --build DIR: the build tree holding control-plane/sluice and the preload (default: build/
# at the top of the repository, or $SLUICE_BUILD). --out DIR: where params.json,
# policy.json, the summary, the figures and raw/ go (default: results/, results-quick/ or
# results-smoke/ here; docs/benchmarks.md, "Results"). --data DIR: where the instances'
# files are written (default /var/tmp/sluice-per-app-bw; removed after the run unless
# --keep-data).
# --quick: the four instances and every setup of the full run, one repetition, 512 MiB
# datasets 3 s apart and a 3 s probe, in under 5 minutes on a 2-vCPU VM; --smoke: the
# pipeline at a tiny scale (smoke.sh): two instances, 32 MiB datasets, MaxB 32 MiB/s.
# Options given explicitly win over either.
#
# --device-mib N makes the disk a steady N MiB/s device, as PAIO's was (limited to
# 1 GiB/s): the instances of the baseline, static and maxmin setups share one blkio group
# throttled at N (needs root); blkio's per-instance limits sum to less than N already.
# MaxB auto then becomes N. Without it, the setups share the raw device.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
harness_parse --values "--data --reps --setups --maxb --device-mib --dataset-mib --epochs
  --stagger --bs --interval-ms --sluice" --flags --keep-data -- "$@"
harness_drive run.py analyze.py
