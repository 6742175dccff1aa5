#!/usr/bin/env bash
# Builds Sluice's libFuzzer targets with clang (ASan+UBSan, fuzzer coverage on
# every library) and runs each for a bounded time.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET=60] [BUILD_DIR=build-fuzz] [SEED]
#
# SEED fixes libFuzzer's random seed (-seed=N), for runs that must repeat (CI);
# without it each run explores differently. The ordinary build runs the same
# targets briefly on every `ctest -L smoke` (a replay driver, no clang needed:
# tests/control-plane/CMakeLists.txt).
#
# Corpora grow in BUILD_DIR/corpus/<target> (seeded from
# control-plane/fuzz/seeds/); crashes land in BUILD_DIR/crashes/<target>/.
# Exit status: 0 when every target ran its time without a finding.
set -euo pipefail
SECONDS_PER_TARGET=${1:-60}
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${2:-$SRC/build-fuzz}
SEED_ARGS=()
if [ -n "${3:-}" ]; then SEED_ARGS=(-seed="$3"); fi
TARGETS=(fuzz_frames fuzz_messages fuzz_rules fuzz_cluster fuzz_policy)
declare -A SEEDS=([fuzz_frames]=frames [fuzz_messages]=messages [fuzz_rules]=rules
                 [fuzz_cluster]=cluster [fuzz_policy]=policy)

SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
CC=clang CXX=clang++ cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSLUICE_FUZZ=ON -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCH=OFF -DSLUICE_ROCKSDB=OFF \
  -DCMAKE_C_FLAGS="$SAN" -DCMAKE_CXX_FLAGS="$SAN" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
ninja -C "$BUILD" "${TARGETS[@]}"

status=0
for t in "${TARGETS[@]}"; do
  corpus="$BUILD/corpus/$t"
  crashes="$BUILD/crashes/$t"
  mkdir -p "$corpus" "$crashes"
  cp -n "$SRC/control-plane/fuzz/seeds/${SEEDS[$t]}"/* "$corpus"/ 2>/dev/null || true
  echo "== $t: ${SECONDS_PER_TARGET}s"
  if ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
     "$BUILD/control-plane/fuzz/$t" "$corpus" -max_total_time="$SECONDS_PER_TARGET" \
       -max_len=65536 -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$crashes/" \
       -print_final_stats=1 "${SEED_ARGS[@]}" 2>"$BUILD/$t.log"; then
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|cov:" "$BUILD/$t.log" | tail -3
  else
    status=1
    echo "!! $t found a problem; see $BUILD/$t.log and $crashes/"
    tail -40 "$BUILD/$t.log"
  fi
done
exit $status
