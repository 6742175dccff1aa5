#!/usr/bin/env bash
# The main job's demonstration (scripts/demo.sh runs it after building): about a minute of
# PAIO §8.2 on this machine. `sluice serve` runs the maxmin policy; three unmodified fio
# readers (psync, direct I/O, each on its own file) start 5 s apart under `sluice run`, with
# goals in the ratio 150:200:300 and weights in the same ratio for what is left of MaxB.
# It prints, every control step, each instance's bandwidth (/proc/PID/io) next to the
# allocation it had, and checks that instances follow their allocations and that the
# leftover moves to the others when one finishes (demo_watch.py).
#
# usage: demo.sh BUILD_DIR
# exit: 0 the demo behaved; 1 it did not (the reasons are printed); 3 it cannot run here
# (no fio, or no direct I/O under /var/tmp), so that scripts/demo.sh can fall back.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1
sluice=$build/control-plane/sluice
# shellcheck source=../harness/harness.sh
. "$here/../harness/harness.sh"
python=$(example_python)
command -v fio > /dev/null || { echo "demo: fio is not installed" >&2; exit 3; }

# Direct I/O needs a disk-backed file system: /var/tmp rather than /tmp (often tmpfs).
work=$(mktemp -d /var/tmp/sluice-demo.XXXXXX)
sock=$work/sluice.sock
daemon_pid="" watch_pid=""
pids=()
cleanup() {
  set +e
  for p in "${pids[@]}" $watch_pid $daemon_pid; do kill "$p" 2> /dev/null; done
  wait 2> /dev/null
  rm -rf "$work"
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== Sluice demo: max-min fair bandwidth for three unmodified readers (PAIO §8.2) =="
echo "-- writing three 128 MiB data sets in $work"
for k in 1 2 3; do
  if ! fio --name="mk$k" --filename="$work/I$k.dat" --rw=write --bs=4M --size=128M \
      --direct=1 --ioengine=psync --output-format=terse > /dev/null 2> "$work/fio.err"; then
    echo "demo: cannot write with direct I/O under /var/tmp: $(head -c 300 "$work/fio.err")" >&2
    exit 3
  fi
done

# MaxB: 40% of what three direct readers get together here, so that the device (shared
# with whatever else runs) can always deliver it; goals 15%, 20%, 30% of MaxB.
fio --thread --direct=1 --ioengine=psync --rw=read --bs=2M --time_based --runtime=2 \
  --output-format=json --name=p1 --filename="$work/I1.dat" --name=p2 \
  --filename="$work/I2.dat" --name=p3 --filename="$work/I3.dat" > "$work/probe.json"
probe=$(fio_read_mib "$python" "$work/probe.json")
maxb=$((probe * 40 / 100 / 10 * 10))
((maxb > 300)) && maxb=300
((maxb < 20)) && { echo "demo: the disk reads only $probe MiB/s with direct I/O" >&2; exit 3; }
mib=1048576
goals=($((maxb * mib * 15 / 100)) $((maxb * mib * 20 / 100)) $((maxb * mib * 30 / 100)))
# What each reads, in seconds at MaxB: I3 (largest allocation, latest start) finishes
# first, then I2, then I1 alone takes all of MaxB.
amounts=($((maxb * 20)) $((maxb * 13)) $((maxb * 7)))   # MiB
echo "-- the disk read $probe MiB/s with three direct readers; MaxB = $maxb MiB/s"
echo "-- goals: I1 $((goals[0] / mib)), I2 $((goals[1] / mib)), I3 $((goals[2] / mib)) MiB/s;" \
  "weights 150:200:300 share the rest; reading ${amounts[0]}, ${amounts[1]}, ${amounts[2]} MiB"

# startup_grace_ms 0: a fresh daemon, no earlier stages to wait for.
cat > "$work/policy.json" <<EOF
{"policy": "maxmin", "interval_ms": 1000, "config": {
  "max_bandwidth": $((maxb * mib)), "startup_grace_ms": 0,
  "stages": [{"name": "I1", "goal": ${goals[0]}, "weight": 150},
             {"name": "I2", "goal": ${goals[1]}, "weight": 200},
             {"name": "I3", "goal": ${goals[2]}, "weight": 300}],
  "calibration": {"io": "read"}}}
EOF
# Each stage: reads through channel "app", object "limit" (a DRL the policy steers).
for k in 1 2 3; do
  cat > "$work/rules-I$k.json" <<EOF
{"version": 1, "rules": [
  {"rule": "differentiate", "classifiers": ["operation"]},
  {"rule": "create_channel", "channel": "app", "match": {"operation": "read"}},
  {"rule": "create_object", "channel": "app", "object": "limit", "type": "drl",
   "config": {"rate": ${goals[k - 1]}}}]}
EOF
done

"$sluice" serve --socket "$sock" --policy "$work/policy.json" --max-missed 5 \
  --log-level warn > "$work/daemon.log" 2>&1 &
daemon_pid=$!
wait_for_socket "$sock" || { cat "$work/daemon.log" >&2; echo "demo: sluice serve did not start" >&2; exit 1; }
echo "-- sluice serve --policy maxmin (1 s steps); readers start 5 s apart:"
echo "   sluice run --name I<k> -- fio --thread --rw=read --direct=1 --ioengine=psync --bs=2M ..."
echo
"$python" "$here/demo_watch.py" "$sluice" "$sock" $((maxb * mib)) "$work/done" &
watch_pid=$!

for k in 1 2 3; do
  ((k > 1)) && sleep 5
  "$sluice" --socket "$sock" run --name "I$k" --rules "$work/rules-I$k.json" -- \
    fio --name="I$k" --thread --filename="$work/I$k.dat" --size=128M \
    --io_size="${amounts[k - 1]}M" --rw=read --bs=2M --direct=1 --ioengine=psync \
    --output-format=terse > /dev/null &
  pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
pids=()
touch "$work/done"
rc=0
wait "$watch_pid" || rc=$?
watch_pid=""
if [ $failed = 1 ]; then
  echo "DEMO FAILED: a reader exited with an error" >&2
  exit 1
fi
exit $rc
