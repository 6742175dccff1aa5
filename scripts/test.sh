#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what it needs, checks the
# clang-format style, the rooms' dependency order (scripts/check-layout.py)
# and the locking contracts (clang's thread-safety analysis,
# scripts/check-thread-safety.sh), builds with warnings as errors,
# runs every ctest label (unit, integration, e2e) and the benchmarks' smoke
# runs, then rebuilds the unit and integration tests under ASan+UBSan and
# under TSan and runs them.
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

echo "== format"
scripts/check-format.sh
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_WERROR=ON
echo "== layout (the rooms' dependency order, docs/design.md)"
python3 scripts/check-layout.py "$BUILD"
echo "== thread-safety analysis (clang, syntax only)"
SLUICE_JOBS="$JOBS" scripts/check-thread-safety.sh "$BUILD"
echo "== build (warnings are errors)"
cmake --build "$BUILD" -j "$JOBS"
echo "== tests"
run_ctest "$BUILD" 'unit|integration|e2e|smoke'

if [ "${SLUICE_SANITIZERS:-1}" != 0 ]; then
  for san in address,undefined thread; do
    dir="$BUILD-${san%%,*}"
    echo "== tests under -fsanitize=$san"
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSLUICE_WERROR=ON \
      -DSLUICE_SANITIZE="$san" -DSLUICE_BUILD_BENCH=OFF
    cmake --build "$dir" -j "$JOBS"
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp" \
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
      run_ctest "$dir" 'unit|integration'
  done
fi
if [ "${SLUICE_FUZZ_SECONDS:-0}" != 0 ]; then
  echo "== fuzzing, ${SLUICE_FUZZ_SECONDS}s per target"
  scripts/fuzz.sh "$SLUICE_FUZZ_SECONDS" "$BUILD-fuzz" 1
fi
echo "== all tests passed"
