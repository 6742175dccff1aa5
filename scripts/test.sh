#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what it needs, checks the
# clang-format style and the rooms' dependency order (scripts/check-layout.py),
# builds with g++ and warnings as errors, runs every ctest label (unit,
# integration, e2e) and the benchmarks' smoke runs, then rebuilds the unit and
# integration tests with clang under ASan+UBSan and under TSan and runs them.
# The locking contracts (clang's thread-safety analysis) are checked as clang
# compiles, and by scripts/check-thread-safety.sh for the sources it did not.
# Each sanitized build runs at low priority beside the test run before it.
#   scripts/test.sh            everything
#   SLUICE_SANITIZERS=0 ...    skip the sanitizer builds (quicker local runs)
#   SLUICE_FUZZ_SECONDS=N ...  also fuzz each target N s with clang and libFuzzer
#                              (scripts/fuzz.sh, a fixed seed); the smoke label
#                              already replays them briefly in the plain build
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
JOBS=${SLUICE_JOBS:-$(nproc)}
BUILD=${SLUICE_BUILD_DIR:-build}

run_ctest() {  # <build dir> <label regex>
  ctest --test-dir "$1" --output-on-failure -j "$JOBS" -L "$2" --timeout 600
}

# The sanitized builds: clang, which compiles this tree under a sanitizer two
# to three times faster than g++ and runs the thread-safety analysis as it
# compiles (CMakeLists.txt). A Debug build, so that the code's own invariants
# are checked (SLUICE_DCHECK), at -O0, which compiles in three quarters of
# -O1's time; the cases -O1 sped up are tagged [heavy] and left to the plain
# build (tests/CMakeLists.txt). Line tables (-g1): all a report needs.
configure_sanitized() {  # <build dir> <sanitizers>
  CC=clang CXX=clang++ cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_C_FLAGS_DEBUG="-g1" -DCMAKE_CXX_FLAGS_DEBUG="-g1" -DSLUICE_WERROR=ON \
    -DSLUICE_SANITIZE="$2" -DSLUICE_BUILD_BENCH=OFF >/dev/null
}
# A build in the background, at the lowest priority, while tests (which mostly
# wait on timers, daemons and fixed-length runs) use what they need of the
# cores; its output is shown when it is waited for.
start_build() {  # <build dir>
  nice -n 19 cmake --build "$1" -j "$JOBS" >"$1.log" 2>&1 &
  build_pid=$!
}
# A failed test run does not leave its neighbour building.
stop_build() {
  if [ -n "${build_pid:-}" ]; then
    pkill -TERM -P "$build_pid" 2>/dev/null || true
    kill "$build_pid" 2>/dev/null || true
  fi
}
trap stop_build EXIT
wait_build() {  # <build dir>
  local status=0
  wait "$build_pid" || status=$?
  build_pid=
  if [ "$status" != 0 ]; then
    cat "$1.log" >&2
    echo "build of $1 failed" >&2
    exit "$status"
  fi
}
SAN_ENV=(TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp"
         ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1")
SANITIZE=${SLUICE_SANITIZERS:-1}

echo "== format"
scripts/check-format.sh
# No debug information in this build: a failing test names its file and line
# itself, and a crash is reproduced outside CI; line tables would cost about a
# sixth more compile time. The sanitized builds keep them for their reports.
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLUICE_WERROR=ON \
  -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG"
echo "== layout (the rooms' dependency order, docs/design.md)"
python3 scripts/check-layout.py "$BUILD"
echo "== build (warnings are errors)"
cmake --build "$BUILD" -j "$JOBS"
if [ "$SANITIZE" != 0 ]; then
  configure_sanitized "$BUILD-address" address,undefined
  echo "== building under -fsanitize=address,undefined (clang), alongside the tests"
  start_build "$BUILD-address"
fi
echo "== tests"
run_ctest "$BUILD" 'unit|integration|e2e|smoke'

if [ "$SANITIZE" != 0 ]; then
  wait_build "$BUILD-address"
  configure_sanitized "$BUILD-thread" thread
  echo "== building under -fsanitize=thread (clang), alongside the tests"
  start_build "$BUILD-thread"
  echo "== tests under -fsanitize=address,undefined"
  (export "${SAN_ENV[@]}" && run_ctest "$BUILD-address" 'unit|integration')
  wait_build "$BUILD-thread"
  echo "== thread-safety analysis (clang) of what the sanitized builds did not compile"
  SLUICE_ANALYSED_BY="$BUILD-address" SLUICE_JOBS="$JOBS" scripts/check-thread-safety.sh "$BUILD"
  echo "== tests under -fsanitize=thread"
  (export "${SAN_ENV[@]}" && run_ctest "$BUILD-thread" 'unit|integration')
else
  echo "== thread-safety analysis (clang, syntax only)"
  SLUICE_JOBS="$JOBS" scripts/check-thread-safety.sh "$BUILD"
fi
if [ "${SLUICE_FUZZ_SECONDS:-0}" != 0 ]; then
  echo "== fuzzing, ${SLUICE_FUZZ_SECONDS}s per target"
  scripts/fuzz.sh "$SLUICE_FUZZ_SECONDS" "$BUILD-fuzz" 1
fi
echo "== all tests passed"
