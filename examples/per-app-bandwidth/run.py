#!/usr/bin/env python3
"""The driver of examples/per-app-bandwidth (run.sh calls it, then analyze.py): writes one
data set per instance, probes the device's direct-read limit, then runs every setup and
repetition: `sluice serve` (with the maxmin policy in its setup), sample.py recording
/proc/PID/io and the stages' statistics, and the fio instances under `sluice run`,
started --stagger s apart, in blkio groups where the setup has them. run.sh's header and
README.md say what the options mean.

usage: run.py --build DIR --out DIR [--mode full|quick|smoke] [options]
Exit: 0; 1 a run failed; 2 a bad option or a missing program.
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import (BLKIO, blkio_group, block_device_of, driver_parser,  # noqa: E402
                          in_cgroup, log, run_scope, wait_for_socket, write_json)

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1048576
PAPER_GOALS = [150, 200, 300, 350]   # MiB/s under PAIO's MaxB of 1 GiB/s
# Per mode, what an option not given is: repetitions, MaxB (MiB/s; auto: 85% of the
# probed direct-read limit of the readers), the data set per instance (MiB; one epoch is
# one pass over it), the epochs per instance (PAIO: I1..I4 run 6, 5, 5, 4 training
# epochs), the seconds between instance starts and the probe's length.
MODES = {
    "full": {"reps": 1, "maxb": "auto", "dataset_mib": 1536, "epochs": "6 5 5 4",
             "stagger": "6", "probe_s": 5},
    "quick": {"reps": 1, "maxb": "auto", "dataset_mib": 512, "epochs": "6 5 5 4",
              "stagger": "3", "probe_s": 3},
    "smoke": {"reps": 1, "maxb": "32", "dataset_mib": 32, "epochs": "3 2",
              "stagger": "2", "probe_s": 1},
}


def usage_error(msg):
    print(f"run.sh: {msg}", file=sys.stderr)
    sys.exit(2)


def parse(argv):
    ap = driver_parser(MODES, __doc__, plan_only=False)
    ap.add_argument("--data", default="/var/tmp/sluice-per-app-bw")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--setups", default="baseline blkio static maxmin")
    ap.add_argument("--maxb", default=None)
    ap.add_argument("--device-mib", type=int, default=0)
    ap.add_argument("--dataset-mib", type=int, default=None)
    ap.add_argument("--epochs", default=None)
    ap.add_argument("--stagger", default=None)
    ap.add_argument("--bs", default="2M")
    ap.add_argument("--interval-ms", type=int, default=1000)
    ap.add_argument("--keep-data", action="store_true")
    ap.add_argument("--sluice", default=None)
    args = ap.parse_args(argv)
    m = MODES[args.mode]
    for k in ("reps", "maxb", "dataset_mib", "epochs", "stagger"):
        if getattr(args, k) is None:
            setattr(args, k, m[k])
    args.probe_s = m["probe_s"]
    args.setups = args.setups.split()
    args.ep = [int(x) for x in args.epochs.split()]
    if not 1 <= len(args.ep) <= 4:
        usage_error("--epochs takes 1 to 4 numbers")
    return args


def fio_read_mib(path):
    """The MiB/s that fio's JSON output reports its jobs read together."""
    with open(path) as f:
        j = json.load(f)
    return int(sum(x["read"]["bw"] for x in j["jobs"]) / 1024)


def layout(obj, rate=None):
    """The stage's rules: reads go through channel "app" and its object "limit" (a DRL, or
    a counting noop); other calls (fio's output file, opens, closes) pass through."""
    o = {"rule": "create_object", "channel": "app", "object": "limit", "type": obj}
    if obj == "drl":
        o["config"] = {"rate": rate}
    return {"version": 1, "rules": [
        {"rule": "differentiate", "classifiers": ["operation"]},
        {"rule": "create_channel", "channel": "app", "match": {"operation": "read"}}, o]}


def policy(args, n, maxb, goals, weights):
    # startup_grace_ms 0: the daemon starts here before any instance, so no stage of an
    # earlier daemon is still reconnecting with a rate the policy should keep.
    return {"policy": "maxmin", "interval_ms": args.interval_ms, "config": {
        "max_bandwidth": maxb * MIB, "channel": "app", "object": "limit",
        "stages": [{"name": f"I{k + 1}", "goal": goals[k], "weight": weights[k]}
                   for k in range(n)],
        "startup_grace_ms": 0, "calibration": {"enabled": True, "io": "read"}}}


def main():
    args = parse(sys.argv[1:])
    sluice = args.sluice or os.path.join(args.build, "control-plane/sluice")
    if not os.access(sluice, os.X_OK):
        usage_error(f"{sluice} not built (ninja -C {args.build} sluice sluice_preload)")
    if shutil.which("fio") is None:
        usage_error("fio not installed (scripts/install-deps.sh)")
    if (("blkio" in args.setups or args.device_mib > 0)
            and not os.access(BLKIO, os.W_OK)):
        usage_error(f"blkio needs root and cgroup v1 blkio ({BLKIO}); drop it from --setups")
    try:
        with run_scope("sluice-ppb.", "/tmp") as (procs, tmp):
            run(args, sluice, procs, tmp)
    finally:
        if not args.keep_data:
            for k in range(1, 5):
                p = os.path.join(args.data, f"I{k}.dat")
                if os.path.exists(p):
                    os.unlink(p)
            try:
                os.rmdir(args.data)
            except OSError:
                pass


def run(args, sluice, procs, tmp):
    n = len(args.ep)
    raw = os.path.join(args.out, "raw")
    os.makedirs(args.data, exist_ok=True)
    os.makedirs(raw, exist_ok=True)
    # --- data sets: one file per instance, written once with fio -------------------------
    for k in range(1, n + 1):
        f = os.path.join(args.data, f"I{k}.dat")
        if not os.path.exists(f) or os.path.getsize(f) != args.dataset_mib * MIB:
            log(f"writing {f} ({args.dataset_mib} MiB)")
            subprocess.run(["fio", f"--name=mk{k}", f"--filename={f}", "--rw=write", "--bs=4M",
                            f"--size={args.dataset_mib}M", "--direct=1", "--ioengine=psync",
                            "--output-format=terse"], stdout=subprocess.DEVNULL, check=True)

    # --- probe: the device's direct-read limit with the same readers, no control -------
    probe = ["fio", "--thread", "--direct=1", "--ioengine=psync", "--rw=read",
             f"--bs={args.bs}", "--time_based", f"--runtime={args.probe_s}",
             "--output-format=json"]
    for k in range(1, n + 1):
        probe += [f"--name=p{k}", f"--filename={os.path.join(args.data, f'I{k}.dat')}"]
    with open(os.path.join(tmp, "probe.json"), "w") as out:
        subprocess.run(probe, stdout=out, check=True)
    probe_mib = fio_read_mib(os.path.join(tmp, "probe.json"))
    maxb = args.maxb
    if maxb == "auto" and args.device_mib > 0:
        maxb = args.device_mib
    if maxb == "auto":
        maxb = probe_mib * 85 // 100 // 10 * 10
    maxb = int(maxb)
    log(f"probe: {n} direct readers (bs {args.bs}) read {probe_mib} MiB/s together; "
        f"MaxB = {maxb} MiB/s")
    if args.device_mib > 0:
        log(f"device: every setup's instances share a blkio group at {args.device_mib} MiB/s")
        if args.device_mib * 100 > probe_mib * 95:
            log("warning: --device-mib is above 95% of what the device delivered in the probe")
    if maxb * 100 > probe_mib * 95:
        log("warning: MaxB is above 95% of what the device delivered in the probe")

    # Goals keep PAIO's ratio 150:200:300:350 and its share of MaxB (1000 of 1024 MiB/s);
    # weights (the share of the leftover) are proportional to the goals, as in PAIO.
    goals = [PAPER_GOALS[k] * maxb * MIB // 1024 for k in range(n)]   # bytes/s
    weights = [float(PAPER_GOALS[k]) for k in range(n)]
    write_json(os.path.join(args.out, "params.json"), {
        "mode": args.mode, "command": args.command.strip(), "max_bandwidth_mib": maxb,
        "probe_mib": probe_mib, "dataset_mib": args.dataset_mib,
        "device_mib": args.device_mib, "stagger_s": float(args.stagger), "bs": args.bs,
        "interval_ms": args.interval_ms, "epochs": args.ep, "goals": goals,
        "weights": weights, "setups": args.setups, "reps": args.reps,
        "instances": [f"I{k + 1}" for k in range(n)]})
    write_json(os.path.join(args.out, "policy.json"), policy(args, n, maxb, goals, weights))
    devno = block_device_of(os.path.join(args.data, "I1.dat"))  # the disk (for blkio)

    # Repetition-major, so that a slow drift of a shared machine spreads over all setups.
    for rep in range(1, args.reps + 1):
        for setup in args.setups:
            run_setup(args, sluice, procs, tmp, setup, rep, goals, devno)


def run_setup(args, sluice, procs, tmp, setup, rep, goals, devno):
    n = len(args.ep)
    d = os.path.join(args.out, "raw", f"{setup}-r{rep}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    pids = os.path.join(tmp, "pids")
    os.makedirs(pids, exist_ok=True)
    sock = os.path.join(tmp, "sluice.sock")
    groups = []
    if setup == "blkio":
        groups = [blkio_group(f"sluice-ppb-{os.getpid()}-I{k + 1}", devno, read_bps=goals[k])
                  for k in range(n)]
    elif args.device_mib > 0:
        groups = [blkio_group(f"sluice-ppb-{os.getpid()}-device", devno,
                              read_bps=args.device_mib * MIB)]
    try:
        pol = ["--policy", os.path.join(args.out, "policy.json")] if setup == "maxmin" else []
        with open(os.path.join(d, "daemon.log"), "w") as dlog:
            daemon = procs.start([sluice, "serve", "--socket", sock] + pol
                                 + ["--interval", str(args.interval_ms), "--max-missed", "5",
                                    "--log-level", "info"], dlog, subprocess.STDOUT)
        if not wait_for_socket(sock, daemon):
            print(f"run.sh: sluice serve did not start (see {d}/daemon.log)", file=sys.stderr)
            sys.exit(1)
        procs.start([sys.executable, os.path.join(HERE, "sample.py"), sluice, sock, pids,
                     os.path.join(d, "samples.jsonl"), "0.5"], None, None)
        events = Events(os.path.join(d, "events.jsonl"))
        events.write({"kind": "run", "setup": setup, "rep": rep, "t": time.time()})
        log(f"{setup} r{rep}: {n} instances")
        rcs = [None] * n
        threads = [threading.Thread(target=instance, daemon=True, args=(
            args, sluice, procs, sock, setup, k, d, goals, groups, pids, events, rcs))
            for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(1)   # one more collect after the last instance left
        procs.kill_all()
    finally:
        for g in groups:
            try:
                os.rmdir(g)
            except OSError:
                pass
        if os.path.exists(sock):
            os.unlink(sock)
    if any(rc != 0 for rc in rcs):
        print(f"run.sh: an instance failed in {setup} r{rep} (see {d})", file=sys.stderr)
        sys.exit(1)


class Events:
    """The run's events.jsonl, written by the instances' threads."""

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        open(path, "w").close()

    def write(self, event):
        with self.lock, open(self.path, "a") as f:
            f.write(json.dumps(event) + "\n")


def instance(args, sluice, procs, sock, setup, k, d, goals, groups, pids, events, rcs):
    """Instance I<k+1>: starts k x --stagger s after the run, reads its file --epochs
    times with fio under `sluice run`, in its blkio group (its own in the blkio setup, the
    device's with --device-mib); its pid (the same down to fio) in PIDS for sample.py."""
    name = f"I{k + 1}"
    time.sleep(k * float(args.stagger))
    rules = os.path.join(d, f"rules-{name}.json")
    # maxmin starts at the goal
    write_json(rules, layout("drl", goals[k]) if setup in ("static", "maxmin")
               else layout("noop"))
    cmd = [sluice, "--socket", sock, "run", "--name", name, "--rules", rules, "--",
           "fio", f"--name={name}", "--thread",
           f"--filename={os.path.join(args.data, name + '.dat')}", "--rw=read",
           f"--bs={args.bs}", "--direct=1", "--ioengine=psync", f"--loops={args.ep[k]}",
           "--output-format=json", f"--output={os.path.join(d, name + '.fio.json')}"]
    group = (groups[k] if setup == "blkio" else groups[0]) if groups else None
    p = procs.start(in_cgroup(group, cmd), subprocess.DEVNULL, None)
    pid_file = os.path.join(pids, f"{name}.pid")
    with open(pid_file, "w") as f:
        f.write(f"{p.pid}\n")
    events.write({"kind": "start", "inst": name, "t": time.time(), "pid": p.pid})
    rcs[k] = p.wait()
    events.write({"kind": "end", "inst": name, "t": time.time(), "rc": rcs[k]})
    os.unlink(pid_file)


if __name__ == "__main__":
    main()
