# The experiments' shell harness (examples/*/run.sh, smoke.sh, demo.sh): the option parser
# and driver entry every run.sh uses (harness_parse, harness_drive), the smoke runs' checks
# (smoke_*) and a few helpers. Sourced, not run:  . "$here/../harness/harness.sh"
# (`here`: the example's folder, which harness_drive runs the driver and analysis from).
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
  top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  echo "${SLUICE_BUILD:-$top/build}"
}

# A progress line on stderr, with the UTC time.
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

# The options of a run.sh. harness_parse [--values "OPTS"] [--flags "OPTS"]
# [--experiments "NAMES"] -- "$@" reads a run.sh's arguments:
#   --build DIR, --out DIR, --quick, --smoke   every run.sh's own (build, out, mode)
#   --experiment NAME                          with --experiments: which one (experiment)
#   each of --values (an option and its value) and --flags (a word), and after a `--`
#   everything: kept in the array `pass`, handed to the driver as given
# It sets build (default: default_build), out (empty unless given), mode (full, quick or
# smoke), experiment, pass and command (the invocation, quoted, for params.json); an
# unknown option, a missing value or a missing or unknown experiment exits 2.
# shellcheck disable=SC2034  # the caller's variables
harness_parse() {
  local values="" flags="" experiments=""
  while [ $# -gt 0 ]; do
    case $1 in
      --values) values=${2//$'\n'/ }; shift 2 ;;
      --flags) flags=${2//$'\n'/ }; shift 2 ;;
      --experiments) experiments=$2; shift 2 ;;
      --) shift; break ;;
      *) echo "harness_parse: unknown setting $1" >&2; exit 2 ;;
    esac
  done
  build=$(default_build)
  out=""
  mode=full
  experiment=""
  pass=()
  command=$(printf '%q ' "$0" "$@")
  command=${command% }
  while [ $# -gt 0 ]; do
    case $1 in
      --quick) mode=quick; shift; continue ;;
      --smoke) mode=smoke; shift; continue ;;
      --) pass+=("$@"); break ;;
    esac
    if [[ " --build --out $values ${experiments:+--experiment} " == *" $1 "* ]]; then
      [ $# -ge 2 ] || { echo "run.sh: $1 needs a value" >&2; exit 2; }
      case $1 in
        --build) build=$2 ;;
        --out) out=$2 ;;
        --experiment) experiment=$2 ;;
        *) pass+=("$1" "$2") ;;
      esac
      shift 2
    elif [[ " $flags " == *" $1 "* ]]; then
      pass+=("$1"); shift
    else
      echo "run.sh: unknown argument $1" >&2; exit 2
    fi
  done
  if [ -n "$experiments" ]; then
    local names=${experiments// /, }
    [ -n "$experiment" ] || { echo "run.sh: --experiment is required (${names})" >&2; exit 2; }
    [[ " $experiments " == *" $experiment "* ]] ||
      { echo "run.sh: --experiment: unknown experiment '$experiment' (expected ${names})" >&2; exit 2; }
  fi
}

# The folder a run writes unless given --out (docs/benchmarks.md, "Results"): results/ for a
# full run, results-quick/ or results-smoke/ for the others, in the example's folder HERE;
# an example with several experiments keeps each in a subfolder named after it.
results_dir() {  # HERE [EXPERIMENT]
  local dir=$1/results
  [ "$mode" = full ] || dir=$dir-$mode
  echo "$dir${2:+/$2}"
}

# The driver entry of a run.sh (after harness_parse): runs the example's DRIVER (a Python
# file next to the run.sh) with --build, --out, --mode, --command, ARGS and what
# harness_parse passed on, then its ANALYSIS on the results folder. A driver that exits 3
# ran but lost some runs: the analysis still draws the rest, and run.sh exits 1.
harness_drive() {  # DRIVER ANALYSIS [ARGS...]
  local driver=$1 analysis=$2 python start rc=0
  shift 2
  : "${out:=$(results_dir "$here" "$experiment")}"
  python=$(example_python)
  mkdir -p "$out"
  start=$(date +%s)
  "$python" "$here/$driver" --build "$build" --out "$out" --mode "$mode" --command "$command" \
    "$@" "${pass[@]}" || rc=$?
  if [ $rc != 0 ] && [ $rc != 3 ]; then exit $rc; fi
  "$python" "$here/$analysis" "$out"
  log "done in $(($(date +%s) - start)) s: $out/summary.md"
  [ $rc = 0 ] || exit 1
}

# --- the smoke runs (examples/*/smoke.sh BUILD_DIR WORK_DIR) --------------------------
# Starts a smoke run: exits 1 unless every PROGRAM (a path below the build tree BUILD) is
# built, then empties WORK. Sets python.
smoke_begin() {  # BUILD WORK PROGRAM...
  local b=$1 w=$2 p
  shift 2
  for p in "$@"; do
    [ -x "$b/$p" ] || { echo "$(basename "$0"): $b/$p is not built" >&2; exit 1; }
  done
  rm -rf "$w"
  mkdir -p "$w"
  python=$(example_python)
}

# Whether `sluice serve` (SLUICE) takes the policy document POLICY: it must still be
# running after SECONDS (default 1). False otherwise, with the daemon's words in LOG.
smoke_daemon_takes() {  # SLUICE POLICY LOG [SECONDS]
  local sock rc=0
  sock=$(mktemp -u /tmp/sluice-smoke-probe.XXXXXX)
  timeout "${4:-1}" "$1" serve --socket "$sock" --policy "$2" > /dev/null 2> "$3" || rc=$?
  rm -f "$sock"
  [ $rc = 124 ]
}

# Runs CMD... with its output in LOG; if it fails, shows the end of LOG and exits 1.
smoke_run() {  # LOG CMD...
  local l=$1
  shift
  "$@" > "$l" 2>&1 || { tail -n 40 "$l"; exit 1; }
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
