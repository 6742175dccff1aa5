#!/bin/bash
# Overhead of the RocksDB binding with a pass-through stage, against plain RocksDB.
#
# Runs Debian's unmodified db_bench (rocksdb-tools 7.8.3) in the same script:
#   plain     db_bench ...
#   sluice    LD_PRELOAD=libsluice_rocksdb_plugin.so db_bench --fs_uri=sluice ...
#             on a stage whose rules route every origin to its own channel of noop
#             objects (classification and counting, no enforcement): every file I/O
#             goes through StageFileSystem and Stage::enforce.
# for fillrandom, readrandom and readwhilewriting, --repetitions times each, the
# variants interleaved (plain, sluice, plain, sluice, ...) so that drift in the
# machine's load hits both alike. Reports ops/s and p99 (db_bench --histogram)
# min/median/max per variant, the ratio of the medians, and the paired ratios
# (sluice/plain within each repetition, min/median/max), as JSON lines
# (results.jsonl) and a table. --out on a tmpfs (/dev/shm/...) takes the
# shared disk's noise out and leaves the CPU cost, where an overhead shows most.
#
# Usage: bench/rocksdb_overhead.sh --plugin PATH [--out DIR] [--duration S]
#                                  [--repetitions N] [--num N] [--benchmarks LIST]
# Or: ninja bench_rocksdb_overhead (bench/rocksdb.cmake).
set -euo pipefail

plugin=""
out="${TMPDIR:-/tmp}/sluice-rocksdb-overhead"
duration=12
reps=3
num=1000000
benchmarks="fillrandom,readrandom,readwhilewriting"
while [ $# -gt 0 ]; do
  case "$1" in
    --plugin) plugin="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --repetitions) reps="$2"; shift 2 ;;
    --num) num="$2"; shift 2 ;;
    --benchmarks) benchmarks="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ -n "$plugin" ] && [ -f "$plugin" ] || { echo "--plugin PATH to libsluice_rocksdb_plugin.so required" >&2; exit 2; }
command -v db_bench >/dev/null || { echo "db_bench not found (apt-get install rocksdb-tools)" >&2; exit 2; }
plugin="$(readlink -f "$plugin")"
mkdir -p "$out"
out="$(readlink -f "$out")"
results="$out/results.jsonl"
: > "$results"

# Pass-through rules: one channel per origin, a noop object in each.
rules="$out/passthrough.rules.json"
python3 - "$rules" <<'EOF'
import json, sys
origins = ["foreground", "wal", "flush", "compaction", "compaction_L0_L1", "compaction_L0_L0",
           "compaction_LN", "manifest", "info_log", "other"]
rules = [{"rule": "differentiate", "classifiers": ["origin"]}]
for o in origins:
    rules.append({"rule": "create_channel", "channel": o, "match": {"origin": o}})
    rules.append({"rule": "create_object", "channel": o, "object": "count", "type": "noop"})
rules.append({"rule": "create_channel", "channel": "rest", "default": True})
rules.append({"rule": "create_object", "channel": "rest", "object": "count", "type": "noop"})
json.dump({"version": 1, "rules": rules}, open(sys.argv[1], "w"), indent=1)
EOF

common=(--histogram=1 --compression_type=none --value_size=100 --key_size=16
        --statistics=0 --threads=1 --seed=42 --num="$num")

base_db="$out/base-db"
echo "# machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); db_bench $(db_bench --version 2>&1 | head -1)"
echo "# building the read benchmarks' base DB ($num keys, fillseq, plain RocksDB)"
rm -rf "$base_db"
db_bench --benchmarks=fillseq "${common[@]}" --db="$base_db" > "$out/fillseq.log" 2>&1

run_one() {  # variant benchmark rep
  local variant="$1" bench="$2" rep="$3" db log extra=()
  log="$out/$bench-$variant-$rep.log"
  case "$bench" in
    fillrandom) db="$out/scratch-db"; rm -rf "$db" ;;
    readrandom) db="$base_db"; extra=(--use_existing_db=1) ;;
    readwhilewriting)
      db="$out/scratch-db"; rm -rf "$db"; cp -r "$base_db" "$db"; extra=(--use_existing_db=1) ;;
  esac
  if [ "$variant" = plain ]; then
    db_bench --benchmarks="$bench" "${common[@]}" "${extra[@]}" --duration="$duration" \
      --db="$db" > "$log" 2>&1
  else
    SLUICE_STAGE="db_bench-$bench" SLUICE_RULES="$rules" LD_PRELOAD="$plugin" \
      db_bench --fs_uri=sluice --benchmarks="$bench" "${common[@]}" "${extra[@]}" \
      --duration="$duration" --db="$db" > "$log" 2>&1
    grep -aq "file system 'sluice' on stage" "$log" || { echo "plugin did not announce itself: $log" >&2; exit 1; }
  fi
  python3 - "$log" "$variant" "$bench" "$rep" >> "$results" <<'EOF'
import json, re, sys
log, variant, bench, rep = sys.argv[1:5]
text = open(log, errors="replace").read().replace("\r", "\n")
m = re.search(r"^%s\s*:\s*([\d.]+) micros/op (\d+) ops/sec" % bench, text, re.M)
p = re.search(r"^Percentiles: P50: ([\d.]+) P75: ([\d.]+) P99: ([\d.]+) P99.9: ([\d.]+)", text, re.M)
if not m or not p:
    sys.exit("cannot parse %s" % log)
print(json.dumps({"bench": bench, "variant": variant, "rep": int(rep),
                  "ops_per_sec": int(m.group(2)), "micros_per_op": float(m.group(1)),
                  "p50_us": float(p.group(1)), "p99_us": float(p.group(3)),
                  "p999_us": float(p.group(4))}))
EOF
  tail -1 "$results"
}

IFS=',' read -ra benches <<< "$benchmarks"
for bench in "${benches[@]}"; do
  for rep in $(seq 1 "$reps"); do
    # Alternate which variant goes first, so neither always runs on a warmer machine.
    if [ $((rep % 2)) -eq 1 ]; then order="plain sluice"; else order="sluice plain"; fi
    for variant in $order; do run_one "$variant" "$bench" "$rep"; done
  done
done
rm -rf "$out/scratch-db"

python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print()
print("%-17s %-7s %31s %34s" % ("benchmark", "variant", "ops/s min / median / max", "p99 us min / median / max"))
summary = []
for bench in dict.fromkeys(r["bench"] for r in rows):
    med = {}
    for variant in ("plain", "sluice"):
        rs = [r for r in rows if r["bench"] == bench and r["variant"] == variant]
        ops = sorted(r["ops_per_sec"] for r in rs)
        p99 = sorted(r["p99_us"] for r in rs)
        med[variant] = (statistics.median(ops), statistics.median(p99))
        print("%-17s %-7s %9d / %9d / %9d %10.2f / %10.2f / %10.2f" %
              (bench, variant, ops[0], statistics.median(ops), ops[-1], p99[0],
               statistics.median(p99), p99[-1]))
    tput = med["sluice"][0] / med["plain"][0]
    lat = med["sluice"][1] / med["plain"][1]
    print("%-17s ratio   throughput %.3f (target >= 0.97), p99 %.3f (target <= 1.05)" % (bench, tput, lat))
    # Paired: the two runs of one repetition ran back to back, so their ratio
    # cancels the drift between repetitions that dominates the spread above.
    by_rep = {}
    for r in rows:
        if r["bench"] == bench:
            by_rep.setdefault(r["rep"], {})[r["variant"]] = r
    pairs = [v for v in by_rep.values() if "plain" in v and "sluice" in v]
    pt = sorted(v["sluice"]["ops_per_sec"] / v["plain"]["ops_per_sec"] for v in pairs)
    pl = sorted(v["sluice"]["p99_us"] / v["plain"]["p99_us"] for v in pairs)
    print("%-17s paired  throughput %.3f / %.3f / %.3f, p99 %.3f / %.3f / %.3f (min / median / max of %d per-repetition ratios)" %
          (bench, pt[0], statistics.median(pt), pt[-1], pl[0], statistics.median(pl), pl[-1], len(pairs)))
    summary.append({"bench": bench, "summary": True, "throughput_ratio": round(tput, 4),
                    "p99_ratio": round(lat, 4),
                    "paired_throughput_ratio": {"min": round(pt[0], 4), "median": round(statistics.median(pt), 4), "max": round(pt[-1], 4)},
                    "paired_p99_ratio": {"min": round(pl[0], 4), "median": round(statistics.median(pl), 4), "max": round(pl[-1], 4)},
                    "pairs": len(pairs)})
with open(sys.argv[1], "a") as f:
    for s in summary:
        f.write(json.dumps(s) + "\n")
EOF
echo "# results: $results"
