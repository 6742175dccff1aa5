#!/usr/bin/env bash
# The main job: installs what it needs, builds, and runs the demonstration.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
BUILD=${SLUICE_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD" -j "$(nproc)" --target sluice-stage-demo
"$BUILD/examples/stage-demo/sluice-stage-demo" "${1:-6}"
