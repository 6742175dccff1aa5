#!/usr/bin/env bash
# Installs every Debian 12 package Sluice's build, tests, benchmarks and
# examples use. Idempotent: packages already present are not downloaded again.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config git
  libboost-dev libboost-system-dev libspdlog-dev libfmt-dev nlohmann-json3-dev catch2
  libmurmurhash-dev librocksdb-dev rocksdb-tools libcli11-dev liburing-dev
  clang clang-format libclang-rt-14-dev
  python3 python3-matplotlib fio sqlite3 gzip tar coreutils procps
  etcd-server
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
