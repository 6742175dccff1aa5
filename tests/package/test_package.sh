#!/usr/bin/env bash
# Installs Sluice from the build tree into a temporary prefix, checks that its
# headers include only installed ones, then builds and runs a separate project against it,
# once with find_package(sluice) and once with pkg-config.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
# Every installed header finds the sluice headers it includes in the prefix:
# none needs one the package does not install (the build's internal/ folders).
headers=$(cd "$tmp/prefix/include" && find sluice -name '*.h' | sort)
[ -n "$headers" ] || { echo "package: no headers installed" >&2; exit 1; }
for h in $headers; do
  for inc in $(sed -n 's|^#include ["<]\(sluice/[^">]*\)[">].*|\1|p' "$tmp/prefix/include/$h"); do
    [ -f "$tmp/prefix/include/$inc" ] \
      || { echo "package: $h includes $inc, which is not installed" >&2; exit 1; }
  done
done
cmake -S "$src/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/configure.log" \
  || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/consumer" > "$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
"$tmp/consumer/consumer"
pcdir=$(dirname "$(find "$tmp/prefix" -name sluice.pc | head -1)")
flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs --static sluice)
# shellcheck disable=SC2086
c++ -std=c++20 "$src/consumer/main.cc" -o "$tmp/consumer-pc" $flags
"$tmp/consumer-pc"
echo "package: $(echo "$headers" | wc -l) headers; find_package and pkg-config consumers built and ran"
