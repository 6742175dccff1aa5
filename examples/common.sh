# Shell functions the experiments' scripts share (examples/*/run.sh, smoke.sh, demo.sh).
# Sourced, not run:  . "$here/../common.sh"
# shellcheck shell=bash

# The python to run the analysis with: $PYTHON, else Debian's python3 (python3-matplotlib
# is a Debian package; a pyenv shim on the PATH would hide it), else python3.
example_python() {
  local p=${PYTHON:-/usr/bin/python3}
  [ -x "$p" ] || p=python3
  echo "$p"
}

# The build tree a run.sh uses unless given --build: $SLUICE_BUILD, else build/ at the top
# of the repository.
default_build() {
  local top
  top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  echo "${SLUICE_BUILD:-$top/build}"
}

# A progress line on stderr, with the UTC time.
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

# The options every run.sh takes: --build DIR, --out DIR, --data DIR, --sluice PATH,
# --reps N, --setups "...", --quick, --smoke. Called with the remaining arguments; for
# one of these it sets build, out, data, sluice_bin, reps, setups or mode, and nargs to
# the number of words it took (shift "$nargs"); for any other it returns 1.
# shellcheck disable=SC2034  # the caller's variables
common_option() {
  nargs=2
  case $1 in
    --build) build=$2 ;;
    --out) out=$2 ;;
    --data) data=$2 ;;
    --sluice) sluice_bin=$2 ;;
    --reps) reps=$2 ;;
    --setups) setups=$2 ;;
    --quick) mode=quick; nargs=1 ;;
    --smoke) mode=smoke; nargs=1 ;;
    *) return 1 ;;
  esac
}

# The block device (MAJ:MIN) holding PATH, the whole disk for a partition: what a blkio
# throttle names.
block_device_of() {  # PATH
  local devno
  devno=$(stat -c '%Hd:%Ld' "$1")
  if [ -e "/sys/dev/block/$devno/partition" ]; then devno=$(cat "/sys/dev/block/$devno/../dev"); fi
  echo "$devno"
}

# Replaces the calling shell with CMD... in the cgroup v1 group GROUP (it joins, then
# execs, so that CMD keeps the shell's pid). Call it in a background job or a ( ) subshell.
cgroup_exec() {  # GROUP CMD...
  exec bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' _ "$@"
}

# Waits (5 s at most) for the daemon's socket SOCK to appear; false if it does not.
wait_for_socket() {  # SOCK
  for _ in $(seq 100); do
    [ -S "$1" ] && return 0
    sleep 0.05
  done
  [ -S "$1" ]
}

# The MiB/s that fio's JSON output FILE reports its jobs read together.
fio_read_mib() {  # PYTHON FILE
  "$1" -c 'import json,sys; j=json.load(open(sys.argv[1]));
print(int(sum(x["read"]["bw"] for x in j["jobs"]) / 1024))' "$2"
}
