#!/usr/bin/env bash
# Installs Sluice from the build tree into a temporary prefix, then builds and
# runs a separate project against it, once with find_package(sluice) and once
# with pkg-config.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
cmake -S "$src/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/configure.log" \
  || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/consumer" > "$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
"$tmp/consumer/consumer"
pcdir=$(dirname "$(find "$tmp/prefix" -name sluice.pc | head -1)")
flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs --static sluice)
# shellcheck disable=SC2086
c++ -std=c++20 "$src/consumer/main.cc" -o "$tmp/consumer-pc" $flags
"$tmp/consumer-pc"
echo "package: find_package and pkg-config consumers built and ran"
