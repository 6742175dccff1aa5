#!/usr/bin/env bash
# The main job: installs what it needs, builds, and runs the demonstration (about a
# minute): the control plane with the max-min policy and three unmodified, preloaded fio
# readers (examples/per-app-bandwidth/demo.sh). Exits 0 when the readers followed their
# allocations and the leftover moved when one finished, non-zero with the reason otherwise.
# Where that demo cannot run (no direct I/O under /var/tmp), the in-process stage demo
# (a flush thread's writes shaped by a token bucket) runs instead.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
BUILD=${SLUICE_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD" -j "$(nproc)" --target sluice sluice_preload
rc=0
examples/per-app-bandwidth/demo.sh "$BUILD" || rc=$?
if [ $rc = 3 ]; then
  echo "demo.sh: the bandwidth demo cannot run here; running the stage demo instead" >&2
  cmake --build "$BUILD" -j "$(nproc)" --target sluice-stage-demo
  exec "$BUILD/examples/stage-demo/sluice-stage-demo" 6
fi
exit $rc
