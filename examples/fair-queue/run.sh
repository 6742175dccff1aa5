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
# (default: examples/fair-queue/results for the full run, results-quick or results-smoke
# next to it for --quick and --smoke, which .gitignore leaves out).
# --quick: the four cases and the four configurations, one repetition, 5 s phases (the
# idle tenant only in `equal`), a 500 ms policy interval: under 5 minutes on a 2-vCPU VM.
# --smoke: the pipeline at a tiny scale on 2 nodes (smoke.sh). Options given explicitly
# win over either. --dir: where each node writes the file it reads (default /dev/shm).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../common.sh
. "$here/../common.sh"
build=$(default_build)
out=""
reps=""
mode=full
extra=()
command=$(printf '%q ' "$0" "$@")
while [ $# -gt 0 ]; do
  if common_option "$@"; then shift "$nargs"; continue; fi
  case $1 in
    --nodes | --capacity-mib | --cases | --configs | --interval-ms | --method | --max-swaps | --dir)
      [ $# -ge 2 ] || { echo "run.sh: $1 needs a value" >&2; exit 2; }
      extra+=("$1" "$2"); shift 2 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $mode in
  full) : "${out:=$here/results}" ;;
  *) : "${out:=$here/results-$mode}" ;;
esac
[ -n "$reps" ] && extra+=(--reps "$reps")
[ -n "${setups:-}" ] && extra+=(--configs "$setups")  # --setups: the common name of --configs
[ -n "${sluice_bin:-}" ] && extra+=(--sluice "$sluice_bin")

python=$(example_python)
mkdir -p "$out"
start=$(date +%s)
"$python" "$here/run.py" --build "$build" --out "$out" --mode "$mode" \
  --command "${command% }" "${extra[@]}"
"$python" "$here/analyze.py" "$out"
log "done in $(($(date +%s) - start)) s: $out/summary.md"
