#!/bin/sh
# The db_bench plugin end to end: unmodified db_bench (rocksdb-tools) on a stage through
# LD_PRELOAD + --fs_uri=sluice. Checks that the plugin announces itself, that the run
# succeeds, and that the stage saw flush, compaction and WAL bytes (SLUICE_REPORT).
# Usage: plugin_db_bench.sh PLUGIN.so WORKDIR
set -eu
plugin="$1"
work="$2/plugin-db-bench-$$"
command -v db_bench >/dev/null 2>&1 || { echo "db_bench not installed: skipped"; exit 77; }
rm -rf "$work"; mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
cat > "$work/rules.json" <<'JSON'
{"version": 1, "rules": [
  {"rule": "differentiate", "classifiers": ["origin"]},
  {"rule": "create_channel", "channel": "all", "default": true},
  {"rule": "create_object", "channel": "all", "object": "count", "type": "noop"}]}
JSON
SLUICE_STAGE=plugin-test SLUICE_RULES="$work/rules.json" SLUICE_REPORT=1 LD_PRELOAD="$plugin" \
  db_bench --fs_uri=sluice --benchmarks=fillrandom --num=60000 --value_size=200 \
  --write_buffer_size=262144 --target_file_size_base=262144 \
  --max_bytes_for_level_base=1048576 --compression_type=none --db="$work/db" \
  > "$work/out" 2> "$work/err"
grep -q "file system 'sluice' on stage 'plugin-test' (rules file" "$work/err" || {
  echo "no announcement"; cat "$work/err"; exit 1; }
grep -ao 'sluice: stats .*' "$work/err" | sed 's/^sluice: stats //' > "$work/stats.json"
python3 - "$work/stats.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
origins = {}
for ch in s["channels"]:
    for name, c in ch["origins"].items():
        origins[name] = origins.get(name, 0) + c["bytes"]
print("bytes by origin:", origins)
for need in ("flush", "compaction", "wal", "manifest", "info_log"):
    assert origins.get(need, 0) > 0, "no %s bytes" % need
assert origins.get("unknown", 0) == 0, "unknown bytes"
PY
# Without --fs_uri the plugin must say that nothing went through a stage.
LD_PRELOAD="$plugin" db_bench --benchmarks=fillseq --num=1000 --db="$work/db2" \
  > /dev/null 2> "$work/err2"
grep -q "was never created" "$work/err2" || { echo "no warning without --fs_uri"; exit 1; }
echo "ok"
