"""What the experiments' Python drivers and smoke checks share: writing JSON, logging,
the processes a run starts and its scratch directory (both gone on the way out), waiting
for a daemon's socket, and the smoke checks' entry, failure, JSON-lines reader, number and
file checks. The analyses' helpers are in analysis.py.

A driver in examples/<name>/ imports it with the examples folder on sys.path:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from harness.util import Procs, log, wait_for_socket, write_json
"""
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .analysis import read_jsonl


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=1)
        f.write("\n")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}] {msg}", file=sys.stderr, flush=True)


class Procs:
    """The processes a run started, stopped (by their own pids) on the way out."""

    def __init__(self):
        self.procs = []

    def start(self, cmd, out, err):
        p = subprocess.Popen(cmd, stdout=out, stderr=err)
        self.procs.append(p)
        return p

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


@contextlib.contextmanager
def run_scope(prefix, dir=None):
    """A run's processes (a Procs) and a scratch directory (made with `prefix` in `dir`):
    on the way out, and on SIGTERM or SIGINT, the processes are stopped and the directory
    is removed. Yields (procs, directory)."""
    procs = Procs()
    tmp = tempfile.mkdtemp(prefix=prefix, dir=dir)

    def on_signal(signum, _frame):
        procs.kill_all()
        shutil.rmtree(tmp, ignore_errors=True)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        yield procs, tmp
    finally:
        procs.kill_all()
        shutil.rmtree(tmp, ignore_errors=True)


def wait_for_socket(path, proc, timeout=5.0):
    """True once `path` exists; False if `proc` exits first or the time runs out."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return os.path.exists(path)


def start_daemon(procs, sluice, sock, run_dir, interval_ms, max_missed, policy=None,
                 log_level="warn", prog="run.py"):
    """Starts `sluice serve` on `sock` (an old socket file is removed first), its output
    in run_dir/daemon.log and, with a `policy` file, its report in run_dir/policy.jsonl;
    returns the process once the socket exists, or exits naming the log."""
    if os.path.exists(sock):
        os.unlink(sock)
    serve = [sluice, "serve", "--socket", sock, "--log-level", log_level,
             "--interval", str(interval_ms), "--max-missed", str(max_missed)]
    if policy is not None:
        serve += ["--policy", policy, "--report-log", os.path.join(run_dir, "policy.jsonl")]
    with open(os.path.join(run_dir, "daemon.log"), "w") as dlog:
        daemon = procs.start(serve, dlog, dlog)
    if not wait_for_socket(sock, daemon):
        raise SystemExit(f"{prog}: sluice serve did not start (see {run_dir}/daemon.log)")
    return daemon


def fail(msg):
    """A smoke check's failure: says what is wrong and exits 1."""
    print(f"smoke_check: FAIL: {msg}")
    sys.exit(1)


def jsonl(path):
    """A smoke check's JSON-lines reader: a line that is not JSON fails the check."""
    return read_jsonl(path, bad=fail)


def number(v, what, lo=-math.inf, hi=math.inf):
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        fail(f"{what}: not a finite number: {v!r}")
    if not lo <= v <= hi:
        fail(f"{what}: {v} outside [{lo}, {hi}]")


def node_runs(results, names, reps, need_bins=False, prefix=""):
    """A smoke check's walk over a driver's runs: for each of `names` and each repetition,
    the name, the run's folder (raw/<prefix><name>-r<rep>) and the JSON lines of its
    node.jsonl, which must open with a config line and close with an end line (and hold
    bin lines: need_bins)."""
    for name in names:
        for rep in range(1, reps + 1):
            d = os.path.join(results, "raw", f"{prefix}{name}-r{rep}")
            lines = jsonl(os.path.join(d, "node.jsonl"))
            types = [x["type"] for x in lines]
            if (not types or types[0] != "config" or types[-1] != "end"
                    or (need_bins and "bin" not in types)):
                want = "config, bins, end" if need_bins else "config ... end"
                fail(f"{d}/node.jsonl: expected {want}; got {sorted(set(types))}")
            yield name, d, lines


def check_files(folder, names, min_bytes=1):
    """A smoke check: fails unless each file of `names` in `folder` holds at least
    `min_bytes` (a figure: 1000)."""
    for name in names:
        p = os.path.join(folder, name)
        if not os.path.exists(p) or os.path.getsize(p) < min_bytes:
            fail(f"{p}: missing or empty")


def smoke_main(checks, done):
    """A smoke check's entry: RESULTS_DIR its one argument; runs each check(results,
    params) (params: RESULTS_DIR/params.json) in turn, then prints `done` (a string, or a
    function of params giving one)."""
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {os.path.basename(sys.argv[0])} RESULTS_DIR")
    results = sys.argv[1]
    with open(os.path.join(results, "params.json")) as f:
        params = json.load(f)
    for check in checks:
        check(results, params)
    print(done if isinstance(done, str) else done(params))


BLKIO = "/sys/fs/cgroup/blkio"


def block_device_of(path):
    """The block device (MAJ:MIN) holding `path`, the whole disk for a partition: what a
    blkio throttle names."""
    dev = os.stat(path).st_dev
    devno = f"{os.major(dev)}:{os.minor(dev)}"
    if os.path.exists(f"/sys/dev/block/{devno}/partition"):
        with open(f"/sys/dev/block/{devno}/../dev") as f:
            devno = f.read().strip()
    return devno


def blkio_group(name, devno, read_bps=None, write_bps=None):
    """Makes the cgroup v1 blkio group BLKIO/name throttling the device `devno` to the
    given bytes/s in each direction; returns its path (remove it with os.rmdir)."""
    path = os.path.join(BLKIO, name)
    os.makedirs(path, exist_ok=True)
    for what, bps in (("read", read_bps), ("write", write_bps)):
        if bps is not None:
            with open(os.path.join(path, f"blkio.throttle.{what}_bps_device"), "w") as f:
                f.write(f"{devno} {int(bps)}\n")
    return path


def in_cgroup(group, cmd):
    """The command that runs `cmd` in the cgroup `group` (a shell that joins it, then execs
    `cmd`, so that `cmd` keeps the pid the caller sees); `cmd` itself for no group."""
    if group is None:
        return cmd
    return ["sh", "-c", 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"', "_", group] + cmd


def driver_parser(modes, doc=None, plan_only=True):
    """A driver's (run.py's) argument parser with the options harness_drive hands every
    driver: --build, --out, --mode (one of `modes`), --command (the run.sh invocation, for
    params.json) and, with `plan_only`, --plan-only (write the plan, run nothing)."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.split("\n")[0] if doc else None)
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=sorted(modes), default="full")
    ap.add_argument("--command", default="", help=argparse.SUPPRESS)
    if plan_only:
        ap.add_argument("--plan-only", action="store_true")
    return ap


def wait_or_kill(proc, timeout):
    """The exit code of `proc`, killed if it has not exited within `timeout` s."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
