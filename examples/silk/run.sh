#!/usr/bin/env bash
# PAIO §9.2 scaled down: runs setup x workload x repetition of silk_bench, then draws the
# plots and the summary (analyze.py). See README.md for the parameters and their scaling.
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
# summary, figures, params.json, policy.json and raw/ go (default: examples/silk/results
# for the full run, results-quick or results-smoke next to it for --quick and --smoke,
# which .gitignore leaves out).
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
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
build=$(default_build)
out=""
data=/var/tmp/sluice-silk
reps=""
kvs_mib=24
setups="plain auto static sluice"
workloads=""
silk_mode=combined
headroom=0
share=reclaim
mode=full
throttle=1
reload=0
extra=()
command=$(printf '%q ' "$0" "$@")
while [ $# -gt 0 ]; do
  if common_option "$@"; then shift "$nargs"; continue; fi
  case $1 in
    --kvs-mib) kvs_mib=$2; shift 2 ;;
    --silk) silk_mode=$2; shift 2 ;;
    --silk-headroom) headroom=$2; shift 2 ;;
    --silk-share) share=$2; shift 2 ;;
    --workloads) workloads=$2; shift 2 ;;
    --no-throttle) throttle=0; shift ;;
    --reload) reload=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

case $mode in
  full) : "${out:=$here/results}" "${reps:=3}" "${workloads:=mixture read-heavy write-heavy}" ;;
  *) : "${out:=$here/results-$mode}" "${reps:=1}" "${workloads:=mixture}" ;;
esac

python=$(example_python)
bench=$build/examples/silk/silk_bench
sluice=${sluice_bin:-$build/control-plane/sluice}
for b in "$bench" "$sluice"; do
  [ -x "$b" ] || { echo "run.sh: $b not built (ninja -C $build silk_bench sluice)" >&2; exit 2; }
done

# The scaled experiment (README.md: "Parameters"). KVS_B in MiB/s: the blkio throttle in
# each direction, SILK's kvs_bandwidth (min_bandwidth 5% of it) and twice the static
# limiter's rate.
case $kvs_mib in ''|*[!0-9]*|0) echo "run.sh: --kvs-mib must be a positive integer" >&2; exit 2 ;; esac
case $headroom in ''|*[!0-9]*) echo "run.sh: --silk-headroom must be 0-90 (percent)" >&2; exit 2 ;; esac
[ "$headroom" -le 90 ] || { echo "run.sh: --silk-headroom must be 0-90 (percent)" >&2; exit 2; }
case $share in equal|reclaim) ;; *) echo "run.sh: --silk-share must be equal or reclaim" >&2; exit 2 ;; esac
static_mib=$((kvs_mib / 2))
# Per mode: the keys, the clients' load, the store's shape (the same for loading and for
# every run: the template DB is loaded once) and the backlog loading settles down to.
if [ $mode = smoke ]; then
  keys=20000 settle_mib=4
  clients=(--clients 2 --valley-ops 400 --peak-ops 1600 --initial-valley-s 2 --peak-s 2
           --valley-s 1 --duration-s 5)
  store=(--memtable-mib 0.25 --level-base-mib 1 --target-file-mib 0.25 --block-cache-mib 1)
elif [ $mode = quick ]; then
  # The full run's rates, store shape and KVS_B; a quarter of its keys and a third of its
  # timeline (two peaks instead of four).
  keys=250000 settle_mib=64
  clients=(--clients 4 --valley-ops 1250 --peak-ops 5000 --initial-valley-s 8 --peak-s 5
           --valley-s 2 --duration-s 22)
  store=(--memtable-mib 4 --level-base-mib 16 --target-file-mib 4 --block-cache-mib 8)
else
  keys=1000000 settle_mib=256
  clients=(--clients 4 --valley-ops 1250 --peak-ops 5000 --initial-valley-s 20 --peak-s 10
           --valley-s 2 --duration-s 68)
  store=(--memtable-mib 4 --level-base-mib 16 --target-file-mib 4 --block-cache-mib 8)
fi
scale=(--keys $keys "${clients[@]}" "${store[@]}" --kvs-mib $kvs_mib --static-mib $static_mib)
load_scale=(--keys $keys "${store[@]}" --settle-pending-mib $settle_mib)

mkdir -p "$out/raw" "$data"
# The daemon's policy and the stage's layout for --silk, with SILK's KVS_B and min_B (5%) for
# this --kvs-mib (per direction: the same in each, as the throttle).
case $silk_mode in
  combined) policy_template=$here/policy.json; layout=$here/layout.json ;;
  per-direction) policy_template=$here/policy-directional.json
                 layout=$here/layout-directional.json ;;
  *) echo "run.sh: --silk must be combined or per-direction" >&2; exit 2 ;;
esac
policy=$out/policy.json
"$python" - "$policy_template" "$policy" "$kvs_mib" "$headroom" "$share" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
b = int(sys.argv[3]) * 1048576 * (100 - int(sys.argv[4])) // 100
for c in [p["config"]] + list(p["config"].get("directions", {}).values()):
    c["kvs_bandwidth"] = b
    c["min_bandwidth"] = b // 20
p["config"]["share"] = sys.argv[5]
json.dump(p, open(sys.argv[2], "w"), indent=1)
EOF

# The parameters of this invocation (analyze.py repeats them in summary.json's "params").
"$python" - "$out/params.json" "$mode" "$command" "$setups" "$workloads" "$reps" "$kvs_mib" \
  "$silk_mode" "$share" "$headroom" "$throttle" "$data" "${#scale[@]}" "${scale[@]}" \
  "${load_scale[@]}" -- "${extra[@]}" <<'EOF'
import json, sys
(path, mode, command, setups, workloads, reps, kvs, silk, share, headroom, throttle,
 data, n) = sys.argv[1:14]
rest = sys.argv[14:]
split = rest.index("--")
scale, load, extra = rest[:int(n)], rest[int(n):split], rest[split + 1:]


def options(words):
    return {k.lstrip("-").replace("-", "_"): float(v) if "." in v else int(v)
            for k, v in zip(words[::2], words[1::2])}


json.dump({"mode": mode, "command": command.strip(),
           "run_sh": {"setups": setups.split(), "workloads": workloads.split(),
                      "reps": int(reps), "kvs_mib": int(kvs), "silk": silk,
                      "silk_share": share, "silk_headroom": int(headroom),
                      "throttle": throttle == "1", "data": data, "extra": extra},
           "silk_bench": options(scale), "load": options(load),
           "policy": "policy.json (the daemon's policy document for the sluice setup)"},
          open(path, "w"), indent=1)
EOF

# --- the blkio cgroup ----------------------------------------------------------------
cg=""
cleanup() {
  if [ -n "${daemon_pid:-}" ]; then kill "$daemon_pid" 2>/dev/null || true; fi
  if [ -n "$cg" ] && [ -d "$cg" ]; then rmdir "$cg" 2>/dev/null || true; fi
}
trap cleanup EXIT
if [ $throttle = 1 ]; then
  blkio=/sys/fs/cgroup/blkio
  if [ ! -w "$blkio" ]; then
    echo "run.sh: $blkio is not writable (need root and cgroup v1 blkio); --no-throttle" \
         "runs without KVS_B (smoke only)" >&2
    exit 2
  fi
  devno=$(block_device_of "$data")
  cg=$blkio/sluice-silk-$$
  mkdir -p "$cg"
  bps=$((kvs_mib * 1024 * 1024))
  echo "$devno $bps" > "$cg/blkio.throttle.read_bps_device"
  echo "$devno $bps" > "$cg/blkio.throttle.write_bps_device"
  log "blkio throttle: device $devno, read and write $kvs_mib MiB/s each ($cg)"
fi

# Runs a command inside the cgroup (or as is without throttling).
in_cgroup() {
  if [ -n "$cg" ]; then
    (cgroup_exec "$cg" "$@")
  else
    "$@"
  fi
}

# --- the preloaded DB (the same for every workload: PAIO preloads one data set) --------
# Named after its parameters, so that a change of the load reloads.
templ=$data/template-$(echo " ${load_scale[*]}" | md5sum | cut -c1-10)
if [ $reload = 1 ] || [ ! -f "$templ/.loaded" ]; then
  log "loading $templ"
  "$bench" load --db "$templ" "${load_scale[@]}" > "$out/raw/load.jsonl" 2> "$out/raw/load.log"
  touch "$templ/.loaded"
  log "loaded: $(cat "$out/raw/load.jsonl")"
fi

# --- the daemon (Sluice+SILK) -----------------------------------------------------------
daemon_pid=""
sock=$data/sluice-silk.sock
start_daemon() {  # $1: policy log file
  rm -f "$sock"
  # The policy's decisions (fg, active flows, rates, Algorithm 1 line) after every step,
  # written by the daemon itself: polling it from another process would spawn processes
  # on the runs' CPUs in this setup only.
  "$sluice" serve --socket "$sock" --policy "$policy" --log-level warn --report-log "$1" \
    2> "${1%.jsonl}.daemon.log" &
  daemon_pid=$!
  wait_for_socket "$sock" || { echo "run.sh: sluice serve did not start" >&2; exit 1; }
}
stop_daemon() {
  if [ -n "$daemon_pid" ]; then kill "$daemon_pid" 2>/dev/null || true; fi
  wait 2>/dev/null || true
  daemon_pid=""
  return 0
}

# --- the runs -------------------------------------------------------------------------
# Repetition-major and setups interleaved, so that slow drifts of a shared machine spread
# over all setups instead of biasing one.
failed=0
for rep in $(seq 1 "$reps"); do
  for workload in $workloads; do
    mkdir -p "$out/raw/$workload"
    for setup in $setups; do
      f=$out/raw/$workload/$setup-r$rep.jsonl
      args=(run --template "$templ" --db "$data/run" --setup "$setup" --workload "$workload"
            --tag "r$rep" --seed "$rep" "${scale[@]}" "${extra[@]}")
      if [ "$setup" = sluice ]; then
        start_daemon "$out/raw/$workload/$setup-r$rep.policy.jsonl"
        args+=(--socket "$sock" --layout "$layout")
      elif [ "$setup" = bound ]; then
        args+=(--layout "$layout")  # the stage, its layout's fixed rates, no daemon
      fi
      log "$workload $setup r$rep"
      if ! in_cgroup "$bench" "${args[@]}" > "$f" 2> "${f%.jsonl}.log"; then
        log "FAILED: $workload $setup r$rep (see ${f%.jsonl}.log)"
        failed=1
      fi
      [ "$setup" = sluice ] && stop_daemon
      tail -n 1 "$f" | cut -c1-200 >&2 || true
    done
  done
done

"$python" "$here/analyze.py" "$out"
exit $failed
