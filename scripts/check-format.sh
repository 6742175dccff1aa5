#!/usr/bin/env bash
# Fails (and lists the files) when a tracked C++ file differs from what
# clang-format makes of it with the repository's .clang-format.
#   scripts/check-format.sh          check
#   scripts/check-format.sh --fix    reformat in place
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "clang-format not found (scripts/install-deps.sh)" >&2; exit 2; }
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cpp' '*.hpp')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "not formatted with .clang-format (fix: scripts/check-format.sh --fix):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "format: ${#files[@]} files clean"
