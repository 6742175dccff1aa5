#!/usr/bin/env bash
# The preload's correctness suite: real programs run natively and under
# libsluice_preload.so in three modes, (a) no rules, (b) a Noop channel,
# (c) a DRL at a low rate, and must produce byte-identical outputs and the same
# exit status. Where the bytes a program moves are known (file sizes, fio's own
# report), the preload's statistics (SLUICE_STATS_FILE) must agree exactly.
#
#   tests/preload/e2e.sh /path/to/libsluice_preload.so [CASE...]
#
# Exit status: 0 all passed, 1 a failure, 77 skipped (no preload library).
# A program that is not installed is reported and skipped (scripts/install-deps.sh
# installs them all).
set -u
SO=${1:?usage: e2e.sh /path/to/libsluice_preload.so [CASE...]}
shift
[[ -r $SO ]] || { echo "e2e: $SO not found"; exit 77; }
SO=$(realpath "$SO")
ONLY=("$@")

WORK=$(mktemp -d /tmp/sluice-preload-e2e-XXXXXX)
[[ -n ${KEEP:-} ]] || trap 'rm -rf "$WORK"' EXIT
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
DRL_RATE=$((16 * 1024 * 1024))  # bytes/s: slow enough to wait, fast enough for the suite

cat > "$WORK/noop.json" <<'EOF'
[{"rule": "differentiate", "classifiers": []},
 {"rule": "create_channel", "channel": "all", "default": true},
 {"rule": "create_object", "channel": "all", "object": "count", "type": "noop", "default": true}]
EOF
cat > "$WORK/drl.json" <<EOF
[{"rule": "differentiate", "classifiers": []},
 {"rule": "create_channel", "channel": "all", "default": true},
 {"rule": "create_object", "channel": "all", "object": "limit", "type": "drl",
  "config": {"rate": $DRL_RATE}, "default": true}]
EOF

# Inputs, shared by every case and mode (read-only).
IN=$WORK/in
mkdir -p "$IN/tree/sub"
head -c $((1024 * 1024)) /dev/urandom > "$IN/data.bin"
head -c $((64 * 1024)) /dev/urandom > "$IN/small.bin"
seq 1 20000 > "$IN/tree/numbers.txt"
head -c 300000 /dev/urandom > "$IN/tree/sub/blob.bin"
printf 'hello\n' > "$IN/tree/sub/hello.txt"
touch -d '2020-01-01 00:00:00' "$IN/tree" "$IN/tree/sub" "$IN"/tree/*.txt "$IN"/tree/sub/*
SIZE_DATA=$(stat -c %s "$IN/data.bin")
SIZE_SMALL=$(stat -c %s "$IN/small.bin")

MODES=(native passthrough noop drl)
FAILED=0
PASSED=0
SKIPPED=0

fail() {
  echo "FAIL: $*"
  FAILED=$((FAILED + 1))
}

# Runs "$@" in mode $MODE with cwd $DIR; stdout to $DIR/stdout, stderr to $DIR/stderr.
# The redirections are the suite's own (not preloaded) shell's.
run_in_mode() {
  local -a env=()
  case $MODE in
    native) ;;
    passthrough) env=(LD_PRELOAD="$SO") ;;
    noop) env=(LD_PRELOAD="$SO" SLUICE_RULES="$WORK/noop.json") ;;
    drl) env=(LD_PRELOAD="$SO" SLUICE_RULES="$WORK/drl.json") ;;
  esac
  if [[ $MODE != native ]]; then
    env+=(SLUICE_STATS_FILE="$DIR/stats/%p.json" SLUICE_LOG_LEVEL=warn)
    [[ -n ${PATHS:-} ]] && env+=(SLUICE_PATHS="$PATHS")
  fi
  (cd "$DIR" && env "${env[@]}" "$@" >> "$DIR/stdout" 2>> "$DIR/stderr")
}

# A digest of everything a case produced: every file under out/ (names and
# bytes) and its stdout.
digest() {
  if [[ -n ${NO_DIGEST:-} ]]; then
    echo "exit-status-only"
    return
  fi
  (cd "$DIR" && { find out -type f -print0 | sort -z | xargs -0 -r sha256sum; sha256sum stdout; } |
    sha256sum | cut -d' ' -f1)
}

# Sums the preload's counters over every process's stats file: prints
# "read_bytes write_bytes".
stats_sum() {
  "$PY" - "$DIR/stats" <<'EOF'
import glob, json, sys
r = w = 0
for f in glob.glob(sys.argv[1] + "/*.json"):
    s = json.load(open(f))
    r += s["preload"]["read"]["bytes"]
    w += s["preload"]["write"]["bytes"]
print(r, w)
EOF
}

want() {  # want CASE: true when the case is selected on the command line
  ((${#ONLY[@]} == 0)) && return 0
  local c
  for c in "${ONLY[@]}"; do [[ $c == "$1" ]] && return 0; done
  return 1
}

# check_case NAME EXPECT_READ EXPECT_WRITE BODY...
#   BODY is a function name run in every mode (cwd: the mode's directory, with
#   in -> the inputs, out/ for outputs). EXPECT_* are the bytes the preload must
#   count (summed over processes): a number, "stdout" (the size of what the
#   program wrote to its stdout, a regular file), "-" (more than zero) or "any".
#   A body that sets NO_DIGEST compares exit statuses only.
check_case() {
  local name=$1 exp_r=$2 exp_w=$3 body=$4
  want "$name" || return 0
  local native_digest="" native_rc="" mode t0 t1 rc d
  for MODE in "${MODES[@]}"; do
    DIR=$WORK/cases/$name/$MODE
    mkdir -p "$DIR/out" "$DIR/stats"
    ln -s "$IN" "$DIR/in"
    : > "$DIR/stdout"
    : > "$DIR/stderr"
    t0=$(date +%s.%N)
    NO_DIGEST=""
    "$body"
    rc=$?
    t1=$(date +%s.%N)
    d=$(digest)
    if [[ $MODE == native ]]; then
      native_digest=$d
      native_rc=$rc
      if ((rc != 0)); then
        fail "$name: exit status $rc natively: $(head -c 500 "$DIR/stderr")"
        return
      fi
    else
      [[ $rc == "$native_rc" ]] || fail "$name [$MODE]: exit status $rc, natively $native_rc"
      [[ $d == "$native_digest" ]] || fail "$name [$MODE]: outputs differ from native"
      if grep -q '^sluice:' "$DIR/stderr"; then
        fail "$name [$MODE]: the preload complained: $(grep '^sluice:' "$DIR/stderr" | head -3)"
      fi
      local sums r w
      sums=$(stats_sum)
      read -r r w <<< "$sums"
      check_bytes "$name [$MODE]" read "$r" "$exp_r"
      check_bytes "$name [$MODE]" write "$w" "$exp_w"
    fi
    printf '  %-22s %-12s rc=%-3s %6.2fs\n' "$name" "$MODE" "$rc" "$(echo "$t1 - $t0" | bc)"
  done
  PASSED=$((PASSED + 1))
}

check_bytes() {  # check_bytes LABEL read|write GOT EXPECTED
  local label=$1 what=$2 got=$3 exp=$4
  case $exp in
    any) ;;
    -) ((got > 0)) || fail "$label: counted $what bytes $got, expected some" ;;
    stdout)
      exp=$(stat -c %s "$DIR/stdout")
      ((got == exp)) || fail "$label: counted $what bytes $got, the program moved $exp"
      ;;
    *) ((got == exp)) || fail "$label: counted $what bytes $got, the program moved $exp" ;;
  esac
}

have() {
  if ! command -v "$1" > /dev/null 2>&1; then
    echo "  skip: $1 is not installed"
    SKIPPED=$((SKIPPED + 1))
    return 1
  fi
}

# ---------------------------------------------------------------------------
# Cases. Each runs with cwd = its directory.

c_cp() { run_in_mode cp in/data.bin out/copy.bin; }
c_cat() { run_in_mode cat in/data.bin in/small.bin; }  # to the case's stdout file
c_cat_to_file() { run_in_mode sh -c 'exec cat in/data.bin in/small.bin > out/cat.bin'; }
c_dd_1() { run_in_mode dd if=in/small.bin of=out/dd.bin bs=1 status=none; }
c_dd_4k() { run_in_mode dd if=in/data.bin of=out/dd.bin bs=4k status=none; }
c_dd_1m() { run_in_mode dd if=in/data.bin of=out/dd.bin bs=1M status=none; }
c_dd_direct() {
  run_in_mode dd if=in/data.bin of=out/dd.bin bs=64k iflag=direct oflag=direct status=none
}
c_dd_odd() { run_in_mode dd if=in/data.bin of=out/dd.bin bs=1000 count=777 status=none; }
c_tar() {
  run_in_mode tar -cf out/a.tar -C in tree &&
    mkdir -p "$DIR/out/x" && run_in_mode tar -xf out/a.tar -C out/x
}
c_tar_gz() {
  run_in_mode tar --mtime=2020-01-01 -czf out/a.tgz -C in tree &&
    mkdir -p "$DIR/out/x" && run_in_mode tar -xzf out/a.tgz -C out/x
}
c_gzip() {
  run_in_mode sh -c 'exec gzip -n -c in/data.bin > out/d.gz' &&
    run_in_mode sh -c 'exec gunzip -c out/d.gz > out/d.bin'
}
c_sha256sum() { run_in_mode sha256sum in/data.bin in/small.bin in/tree/numbers.txt; }
c_sqlite3() {
  run_in_mode sqlite3 out/t.db <<'EOF'
PRAGMA journal_mode=DELETE;
CREATE TABLE kv(k INTEGER PRIMARY KEY, v TEXT);
BEGIN;
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000)
INSERT INTO kv SELECT x, printf('value-%08d-%s', x, hex(x * 7919)) FROM c;
COMMIT;
BEGIN;
UPDATE kv SET v = v || '-updated' WHERE k % 7 = 0;
DELETE FROM kv WHERE k % 11 = 0;
COMMIT;
BEGIN;
INSERT INTO kv VALUES (100000, 'rolled back');
ROLLBACK;
CREATE INDEX kv_v ON kv(v);
SELECT count(*), sum(length(v)) FROM kv;
SELECT * FROM kv WHERE k IN (1, 7, 77, 2999);
EOF
  [[ $? == 0 ]] && run_in_mode sqlite3 out/t.db .dump | sha256sum > "$DIR/out/dump.sha256"
  run_in_mode sqlite3 out/t.db 'PRAGMA integrity_check;'
}
c_python() {
  run_in_mode "$PY" - <<'EOF'
import os, shutil, hashlib
data = open("in/data.bin", "rb").read()
with open("out/a.bin", "wb") as f:
    for i in range(0, len(data), 7000):
        f.write(data[i:i + 7000])
fd = os.open("out/b.bin", os.O_RDWR | os.O_CREAT, 0o644)
os.pwrite(fd, data[:100000], 0)
os.pwrite(fd, data[100000:200000], 100000)
os.writev(fd, [b"abc", b"defgh"])
assert os.pread(fd, 5000, 1000) == data[1000:6000]
os.lseek(fd, 0, os.SEEK_SET)
buf = bytearray(4096)
os.readv(fd, [buf])
os.fsync(fd)
os.close(fd)
shutil.copyfile("in/small.bin", "out/c.bin")  # sendfile / copy_file_range
with open("out/a.bin", "rb") as f:
    with open("out/d.bin", "wb") as g:
        while chunk := f.read(65536):
            g.write(chunk)
print(hashlib.sha256(open("out/d.bin", "rb").read()).hexdigest())
EOF
}
c_fio() {
  local engine rc=0
  for engine in psync sync pvsync2; do
    run_in_mode fio --thread --name="j-$engine" --directory=out --size=256k --bs=4k \
      --rw=randwrite --ioengine="$engine" --verify=crc32c --verify_state_save=0 \
      --output-format=json --output="fio-$engine.json" || rc=$?
  done
  return $rc
}
c_fio_forked() {
  # Jobs in forked processes (fio's default): each gets its own fresh stage.
  run_in_mode fio --name=f --directory=out --size=128k --bs=8k --rw=randrw --numjobs=2 \
    --ioengine=psync --verify=crc32c --verify_state_save=0 --output=/dev/null
}
# RocksDB's files hold its identity, timestamps and logs: the database lives
# outside out/ and what ldb prints (get, scan, dump) is compared.
c_ldb() {
  run_in_mode ldb --db=db --create_if_missing put k1 v1 &&
    run_in_mode ldb --db=db batchput k2 v2 k3 v3 k4 "value four" &&
    run_in_mode ldb --db=db delete k3 &&
    run_in_mode ldb --db=db get k1 &&
    run_in_mode ldb --db=db scan &&
    run_in_mode ldb --db=db compact &&
    run_in_mode ldb --db=db get k4 &&
    run_in_mode ldb --db=db dump
}

# fio's own report of the bytes it moved, summed over the engines.
fio_bytes() {  # fio_bytes read|write DIR
  "$PY" - "$1" "$2" <<'EOF'
import glob, json, sys
total = 0
for f in glob.glob(sys.argv[2] + "/fio-*.json"):
    for job in json.load(open(f))["jobs"]:
        total += job[sys.argv[1]]["io_bytes"]
print(total)
EOF
}

echo "e2e: preload $SO, work dir $WORK"
START=$(date +%s)

# Exact counts: the regular files each program read and wrote.
have cp && check_case cp "$SIZE_DATA" "$SIZE_DATA" c_cp
have cat && check_case cat_stdout $((SIZE_DATA + SIZE_SMALL)) stdout c_cat
have cat && check_case cat_to_file $((SIZE_DATA + SIZE_SMALL)) $((SIZE_DATA + SIZE_SMALL)) \
  c_cat_to_file
have dd && check_case dd_bs1 "$SIZE_SMALL" "$SIZE_SMALL" c_dd_1
have dd && check_case dd_bs4k "$SIZE_DATA" "$SIZE_DATA" c_dd_4k
have dd && check_case dd_bs1M "$SIZE_DATA" "$SIZE_DATA" c_dd_1m
have dd && check_case dd_bs1000_count777 777000 777000 c_dd_odd
if have dd; then
  probe=$WORK/direct-probe
  if dd if="$IN/data.bin" of="$probe" bs=64k iflag=direct oflag=direct status=none 2> /dev/null; then
    check_case dd_direct "$SIZE_DATA" "$SIZE_DATA" c_dd_direct
  else
    echo "  skip: O_DIRECT is not supported under $WORK"
  fi
fi
have tar && check_case tar - - c_tar
have tar && have gzip && check_case tar_gzip - - c_tar_gz
have gzip && check_case gzip_gunzip - - c_gzip
SUMS_IN=$((SIZE_DATA + SIZE_SMALL + $(stat -c %s "$IN/tree/numbers.txt")))
have sha256sum && check_case sha256sum "$SUMS_IN" any c_sha256sum  # stdout: printf, not seen
have sqlite3 && check_case sqlite3 - - c_sqlite3
check_case python3 - - c_python
have ldb && check_case rocksdb_ldb - - c_ldb

# fio: the counts must match fio's own report exactly. SLUICE_PATHS keeps fio's
# reads of /proc and its JSON reports out of the count; the reports (timings)
# and the data files (verify headers hold timestamps) are not compared
# byte-for-byte: fio's crc32c verification checks the data in every mode.
if have fio && want fio; then
  c_fio_paths() {
    NO_DIGEST=1
    PATHS="$DIR/out" c_fio
  }
  check_case fio any any c_fio_paths
  for mode in passthrough noop drl; do
    DIR=$WORK/cases/fio/$mode
    read -r r w <<< "$(stats_sum)"
    fr=$(fio_bytes read "$DIR")
    fw=$(fio_bytes write "$DIR")
    ((r == fr)) || fail "fio [$mode]: counted read bytes $r, fio reports $fr"
    ((w == fw)) || fail "fio [$mode]: counted write bytes $w, fio reports $fw"
    echo "  fio [$mode]: counted read $r write $w bytes; fio reports read $fr write $fw"
  done
  c_fio_forked_nd() {
    NO_DIGEST=1
    c_fio_forked
  }
  check_case fio_forked any any c_fio_forked_nd  # job processes _exit
fi

echo "e2e: $PASSED cases passed, $FAILED failures, $SKIPPED programs missing," \
  "$(($(date +%s) - START)) s"
((FAILED == 0)) || exit 1
exit 0
