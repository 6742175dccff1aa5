#!/usr/bin/env bash
# PAIO §8.2/§9.3 (Fig. 10) scaled down: per-application bandwidth guarantees for four
# unmodified readers (fio, psync, direct I/O) sharing one disk, in four setups:
#   baseline  no control (each fio under `sluice run` with a counting-only stage)
#   blkio     static limits: each instance in its own cgroup v1 blkio group whose
#             throttle.read_bps_device is its goal (needs root)
#   static    static limits in Sluice: each stage's DRL at its goal (local rules file)
#   maxmin    `sluice serve` with the maxmin policy (goals, weights, calibration)
# Every setup runs the daemon, so each instance's stage statistics are collected the same
# way; sample.py records them with /proc/PID/io, analyze.py draws the figure and the table.
# See README.md for the parameters and how they scale the paper's.
#
# usage: examples/per-app-bandwidth/run.sh [--build DIR] [--out DIR] [--quick | --smoke]
#          [--data DIR] [--reps N] [--setups "baseline blkio static maxmin"]
#          [--maxb MIB|auto] [--dataset-mib N] [--epochs "6 5 5 4"] [--stagger S]
#          [--bs SIZE] [--interval-ms N] [--device-mib N] [--keep-data]
#
# --build DIR: the build tree holding control-plane/sluice and the preload (default: build/
# at the top of the repository, or $SLUICE_BUILD). --out DIR: where params.json,
# policy.json, the summary, the figures and raw/ go (default:
# examples/per-app-bandwidth/results for the full run, results-quick or results-smoke next
# to it for --quick and --smoke, which .gitignore leaves out).
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
build=$(default_build)
# Empty: set by the mode (full, --quick, --smoke) after the options, unless given.
out=""
data=/var/tmp/sluice-per-app-bw
reps=""            # full: 1
setups="baseline blkio static maxmin"
maxb=""            # MiB/s; full: auto, 85% of the probed direct-read limit of the readers
device_mib=0       # MiB/s; > 0: every setup's instances share a blkio group at this rate
dataset_mib=""     # full: 1536; one epoch = one pass over the instance's own file
epochs=""          # full: "6 5 5 4" (PAIO: I1..I4 run 6, 5, 5, 4 training epochs)
stagger=""         # full: 6 s between instance starts
bs=2M
interval_ms=1000
keep_data=0
mode=full
command=$(printf '%q ' "$0" "$@")
while [ $# -gt 0 ]; do
  if common_option "$@"; then shift "$nargs"; continue; fi
  case $1 in
    --maxb) maxb=$2; shift 2 ;;
    --device-mib) device_mib=$2; shift 2 ;;
    --dataset-mib) dataset_mib=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --stagger) stagger=$2; shift 2 ;;
    --bs) bs=$2; shift 2 ;;
    --interval-ms) interval_ms=$2; shift 2 ;;
    --keep-data) keep_data=1; shift ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $mode in
  full) : "${out:=$here/results}" "${reps:=1}" "${maxb:=auto}" "${dataset_mib:=1536}" \
          "${epochs:=6 5 5 4}" "${stagger:=6}"; probe_s=5 ;;
  quick) : "${out:=$here/results-quick}" "${reps:=1}" "${maxb:=auto}" "${dataset_mib:=512}" \
           "${epochs:=6 5 5 4}" "${stagger:=3}"; probe_s=3 ;;
  smoke) : "${out:=$here/results-smoke}" "${reps:=1}" "${maxb:=32}" "${dataset_mib:=32}" \
           "${epochs:=3 2}" "${stagger:=2}"; probe_s=1 ;;
esac

python=$(example_python)
sluice=${sluice_bin:-$build/control-plane/sluice}
[ -x "$sluice" ] || { echo "run.sh: $sluice not built (ninja -C $build sluice sluice_preload)" >&2; exit 2; }
command -v fio > /dev/null || { echo "run.sh: fio not installed (scripts/install-deps.sh)" >&2; exit 2; }
read -r -a ep <<< "$epochs"
n=${#ep[@]}
paper_goals=(150 200 300 350)   # MiB/s under PAIO's MaxB of 1 GiB/s
((n >= 1 && n <= 4)) || { echo "run.sh: --epochs takes 1 to 4 numbers" >&2; exit 2; }

# --- cleanup: instances, sampler, daemon, cgroups, temp files, data ---------------------
tmp=$(mktemp -d /tmp/sluice-ppb.XXXXXX)
sock=$tmp/sluice.sock
daemon_pid="" sampler_pid=""
cgroups=()
cleanup() {
  set +e
  local f
  for f in "$tmp"/pids/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
  [ -n "$sampler_pid" ] && kill "$sampler_pid" 2>/dev/null
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null
  wait 2>/dev/null
  for f in "${cgroups[@]}"; do [ -d "$f" ] && rmdir "$f" 2>/dev/null; done
  rm -rf "$tmp"
  if [ $keep_data = 0 ]; then rm -f "$data"/I[1-4].dat; rmdir "$data" 2>/dev/null; fi
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- datasets: one file per instance, written once with fio -----------------------------
mkdir -p "$data" "$out/raw"
for k in $(seq 1 "$n"); do
  f=$data/I$k.dat
  if [ "$(stat -c %s "$f" 2>/dev/null || echo 0)" != $((dataset_mib * 1048576)) ]; then
    log "writing $f ($dataset_mib MiB)"
    fio --name="mk$k" --filename="$f" --rw=write --bs=4M --size="${dataset_mib}M" --direct=1 \
      --ioengine=psync --output-format=terse > /dev/null
  fi
done

# --- probe: the device's direct-read limit with the same readers, no control -----------
probe_args=(--thread --direct=1 --ioengine=psync --rw=read --bs="$bs" --time_based
            --runtime=$probe_s --output-format=json)
for k in $(seq 1 "$n"); do probe_args+=(--name="p$k" --filename="$data/I$k.dat"); done
fio "${probe_args[@]}" > "$tmp/probe.json"
probe_mib=$(fio_read_mib "$python" "$tmp/probe.json")
if [ "$maxb" = auto ] && ((device_mib > 0)); then maxb=$device_mib; fi
if [ "$maxb" = auto ]; then maxb=$((probe_mib * 85 / 100 / 10 * 10)); fi
log "probe: $n direct readers (bs $bs) read $probe_mib MiB/s together; MaxB = $maxb MiB/s"
if ((device_mib > 0)); then
  log "device: every setup's instances share a blkio group at $device_mib MiB/s"
  if ((device_mib * 100 > probe_mib * 95)); then
    log "warning: --device-mib is above 95% of what the device delivered in the probe"
  fi
fi
if ((maxb * 100 > probe_mib * 95)); then
  log "warning: MaxB is above 95% of what the device delivered in the probe"
fi

# Goals keep PAIO's ratio 150:200:300:350 and its share of MaxB (1000 of 1024 MiB/s);
# weights (the share of the leftover) are proportional to the goals, as in PAIO.
goals=() weights=()
for k in $(seq 0 $((n - 1))); do
  goals+=($((paper_goals[k] * maxb * 1048576 / 1024)))   # bytes/s
  weights+=("${paper_goals[k]}")
done
"$python" - "$out/params.json" "$maxb" "$probe_mib" "$dataset_mib" "$stagger" "$bs" \
  "$interval_ms" "$epochs" "${goals[*]}" "${weights[*]}" "$setups" "$reps" "$device_mib" \
  "$mode" "$command" <<'PY'
import json, sys
(path, maxb, probe, ds, stagger, bs, interval, epochs, goals, weights, setups,
 reps, device, mode, command) = sys.argv[1:]
json.dump({"mode": mode, "command": command.strip(),
           "max_bandwidth_mib": int(maxb), "probe_mib": int(probe), "dataset_mib": int(ds),
           "device_mib": int(device),
           "stagger_s": float(stagger), "bs": bs, "interval_ms": int(interval),
           "epochs": [int(x) for x in epochs.split()],
           "goals": [int(x) for x in goals.split()],
           "weights": [float(x) for x in weights.split()],
           "setups": setups.split(), "reps": int(reps),
           "instances": ["I%d" % (i + 1) for i in range(len(epochs.split()))]},
          open(path, "w"), indent=1)
PY

# --- per-setup configuration ------------------------------------------------------------
# The stage's layout: reads go through channel "app" and its object "limit" (a DRL, or a
# counting noop); other calls (fio's output file, opens, closes) pass through.
layout() {  # $1: object type, $2: rate (bytes/s, drl only)
  local obj='"type": "noop"'
  [ "$1" = drl ] && obj='"type": "drl", "config": {"rate": '"$2"'}'
  cat <<EOF
{"version": 1, "rules": [
  {"rule": "differentiate", "classifiers": ["operation"]},
  {"rule": "create_channel", "channel": "app", "match": {"operation": "read"}},
  {"rule": "create_object", "channel": "app", "object": "limit", $obj}]}
EOF
}
# startup_grace_ms 0: the daemon starts here before any instance, so no stage
# of an earlier daemon is still reconnecting with a rate the policy should keep.
policy() {
  local k stages=""
  for k in $(seq 0 $((n - 1))); do
    stages+="${stages:+, }{\"name\": \"I$((k + 1))\", \"goal\": ${goals[k]}, \"weight\": ${weights[k]}}"
  done
  cat <<EOF
{"policy": "maxmin", "interval_ms": $interval_ms, "config": {
  "max_bandwidth": $((maxb * 1048576)), "channel": "app", "object": "limit",
  "stages": [$stages], "startup_grace_ms": 0,
  "calibration": {"enabled": true, "io": "read"}}}
EOF
}
policy > "$out/policy.json"

devno=$(block_device_of "$data/I1.dat")   # the disk holding the data (for blkio)

# --- one run ----------------------------------------------------------------------------
instance() {  # $1: setup, $2: k (1-based), $3: run dir
  local setup=$1 k=$2 dir=$3 i=$(($2 - 1)) rules cmd pid rc=0 t_start
  sleep "$(((k - 1) * stagger))"
  rules=$dir/rules-I$k.json
  case $setup in
    static | maxmin) layout drl "${goals[i]}" > "$rules" ;;  # maxmin starts at the goal
    *) layout noop > "$rules" ;;
  esac
  cmd=("$sluice" --socket "$sock" run --name "I$k" --rules "$rules" --
       fio --name="I$k" --thread --filename="$data/I$k.dat" --rw=read --bs="$bs"
       --direct=1 --ioengine=psync --loops="${ep[i]}" --output-format=json
       --output="$dir/I$k.fio.json")
  if ((${#cgroups[@]} > 0)); then
    # In the instance's cgroup (blkio: its own; otherwise the shared device group); the
    # pid stays the same down to fio.
    local group=${cgroups[0]}
    [ "$setup" = blkio ] && group=${cgroups[i]}
    cgroup_exec "$group" "${cmd[@]}" > /dev/null &
  else
    "${cmd[@]}" > /dev/null &
  fi
  pid=$!
  t_start=$EPOCHREALTIME
  echo "$pid" > "$tmp/pids/I$k.pid"
  echo "{\"kind\": \"start\", \"inst\": \"I$k\", \"t\": $t_start, \"pid\": $pid}" >> "$dir/events.jsonl"
  wait "$pid" || rc=$?
  echo "{\"kind\": \"end\", \"inst\": \"I$k\", \"t\": $EPOCHREALTIME, \"rc\": $rc}" >> "$dir/events.jsonl"
  rm -f "$tmp/pids/I$k.pid"
  return $rc
}

run_setup() {  # $1: setup, $2: repetition
  local setup=$1 rep=$2 dir=$out/raw/$1-r$2 k pids=() failed=0
  rm -rf "$dir"
  mkdir -p "$dir" "$tmp/pids"
  cgroups=()
  if [ "$setup" = blkio ]; then
    for k in $(seq 0 $((n - 1))); do
      cgroups+=("/sys/fs/cgroup/blkio/sluice-ppb-$$-I$((k + 1))")
      mkdir -p "${cgroups[k]}"
      echo "$devno ${goals[k]}" > "${cgroups[k]}/blkio.throttle.read_bps_device"
    done
  elif ((device_mib > 0)); then
    cgroups+=("/sys/fs/cgroup/blkio/sluice-ppb-$$-device")
    mkdir -p "${cgroups[0]}"
    echo "$devno $((device_mib * 1048576))" > "${cgroups[0]}/blkio.throttle.read_bps_device"
  fi
  local pol=()
  [ "$setup" = maxmin ] && pol=(--policy "$out/policy.json")
  "$sluice" serve --socket "$sock" "${pol[@]}" --interval "$interval_ms" --max-missed 5 \
    --log-level info > "$dir/daemon.log" 2>&1 &
  daemon_pid=$!
  wait_for_socket "$sock" || { echo "run.sh: sluice serve did not start (see $dir/daemon.log)" >&2; exit 1; }
  "$python" "$here/sample.py" "$sluice" "$sock" "$tmp/pids" "$dir/samples.jsonl" 0.5 &
  sampler_pid=$!
  echo "{\"kind\": \"run\", \"setup\": \"$setup\", \"rep\": $rep, \"t\": $EPOCHREALTIME}" > "$dir/events.jsonl"
  log "$setup r$rep: $n instances"
  for k in $(seq 1 "$n"); do
    instance "$setup" "$k" "$dir" &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k" || failed=1; done
  sleep 1   # one more collect after the last instance left
  kill "$sampler_pid" "$daemon_pid" 2>/dev/null || true
  wait "$sampler_pid" "$daemon_pid" 2>/dev/null || true
  sampler_pid="" daemon_pid=""
  for k in "${cgroups[@]}"; do rmdir "$k" 2>/dev/null || true; done
  cgroups=()
  rm -f "$sock"
  [ $failed = 0 ] || { echo "run.sh: an instance failed in $setup r$rep (see $dir)" >&2; exit 1; }
}

if { [[ " $setups " == *" blkio "* ]] || ((device_mib > 0)); } && [ ! -w /sys/fs/cgroup/blkio ]; then
  echo "run.sh: blkio needs root and cgroup v1 blkio (/sys/fs/cgroup/blkio); drop it from --setups" >&2
  exit 2
fi
# Repetition-major, so that a slow drift of a shared machine spreads over all setups.
for rep in $(seq 1 "$reps"); do
  for setup in $setups; do run_setup "$setup" "$rep"; done
done
"$python" "$here/analyze.py" "$out"
