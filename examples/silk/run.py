#!/usr/bin/env python3
"""The driver of examples/silk (run.sh calls it, then analyze.py): loads the template
store once, then runs setup x workload x repetition of silk_bench, the Sluice+SILK setup
under `sluice serve --policy`, every run in a cgroup v1 blkio group throttled at KVS_B.
run.sh's header and README.md say what the options mean.

usage: run.py --build DIR --out DIR [--mode full|quick|smoke] [options] [-- extra
       silk_bench options]
Exit: 0; 2 a bad option or a missing program; 3 some runs failed (the rest are in raw/).
"""
import hashlib
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import (BLKIO, blkio_group, block_device_of, driver_parser,  # noqa: E402
                          in_cgroup, log, run_scope, wait_for_socket, write_json)

HERE = os.path.dirname(os.path.abspath(__file__))

# Per mode: the keys, the clients' load, the store's shape (the same for loading and for
# every run: the template DB is loaded once) and the backlog loading settles down to.
STORE = ["--memtable-mib", "4", "--level-base-mib", "16", "--target-file-mib", "4",
         "--block-cache-mib", "8"]
SCALE = {
    "smoke": {"keys": 20000, "settle_mib": 4,
              "clients": ["--clients", "2", "--valley-ops", "400", "--peak-ops", "1600",
                          "--initial-valley-s", "2", "--peak-s", "2", "--valley-s", "1",
                          "--duration-s", "5"],
              "store": ["--memtable-mib", "0.25", "--level-base-mib", "1",
                        "--target-file-mib", "0.25", "--block-cache-mib", "1"]},
    # The full run's rates, store shape and KVS_B; a quarter of its keys and a third of
    # its timeline (two peaks instead of four).
    "quick": {"keys": 250000, "settle_mib": 64,
              "clients": ["--clients", "4", "--valley-ops", "1250", "--peak-ops", "5000",
                          "--initial-valley-s", "8", "--peak-s", "5", "--valley-s", "2",
                          "--duration-s", "22"],
              "store": STORE},
    "full": {"keys": 1000000, "settle_mib": 256,
             "clients": ["--clients", "4", "--valley-ops", "1250", "--peak-ops", "5000",
                         "--initial-valley-s", "20", "--peak-s", "10", "--valley-s", "2",
                         "--duration-s", "68"],
             "store": STORE},
}
# --silk: the policy template and the stage's layout.
MODELS = {"combined": ("policy.json", "layout.json"),
          "per-direction": ("policy-directional.json", "layout-directional.json")}


def usage_error(msg):
    print(f"run.sh: {msg}", file=sys.stderr)
    sys.exit(2)


def options(words):
    return {k.lstrip("-").replace("-", "_"): float(v) if "." in v else int(v)
            for k, v in zip(words[::2], words[1::2])}


def write_policy(template, path, kvs_mib, headroom, share):
    """The daemon's policy for --silk, with SILK's KVS_B and min_B (5%) for this --kvs-mib
    (per direction: the same in each, as the throttle)."""
    with open(template) as f:
        p = json.load(f)
    b = kvs_mib * 1048576 * (100 - headroom) // 100
    for c in [p["config"]] + list(p["config"].get("directions", {}).values()):
        c["kvs_bandwidth"] = b
        c["min_bandwidth"] = b // 20
    p["config"]["share"] = share
    with open(path, "w") as f:
        json.dump(p, f, indent=1)


def parse(argv):
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = driver_parser(SCALE, __doc__, plan_only=False)
    ap.add_argument("--data", default="/var/tmp/sluice-silk")
    ap.add_argument("--reps", default=None)
    ap.add_argument("--setups", default="plain auto static sluice")
    ap.add_argument("--workloads", default=None)
    ap.add_argument("--kvs-mib", default="24")
    ap.add_argument("--silk", default="combined")
    ap.add_argument("--silk-headroom", default="0")
    ap.add_argument("--silk-share", default="reclaim")
    ap.add_argument("--no-throttle", action="store_true")
    ap.add_argument("--reload", action="store_true")
    ap.add_argument("--sluice", default=None)
    args = ap.parse_args(argv)
    args.extra = extra
    full = args.mode == "full"
    if args.reps is None:
        args.reps = "3" if full else "1"
    if args.workloads is None:
        args.workloads = "mixture read-heavy write-heavy" if full else "mixture"
    if not args.kvs_mib.isdigit() or int(args.kvs_mib) == 0:
        usage_error("--kvs-mib must be a positive integer")
    if not args.silk_headroom.isdigit() or int(args.silk_headroom) > 90:
        usage_error("--silk-headroom must be 0-90 (percent)")
    if args.silk_share not in ("equal", "reclaim"):
        usage_error("--silk-share must be equal or reclaim")
    if args.silk not in MODELS:
        usage_error("--silk must be combined or per-direction")
    if not args.reps.isdigit():
        usage_error("--reps must be a number")
    return args


def main():
    args = parse(sys.argv[1:])
    kvs_mib, headroom = int(args.kvs_mib), int(args.silk_headroom)
    bench = os.path.join(args.build, "examples/silk/silk_bench")
    sluice = args.sluice or os.path.join(args.build, "control-plane/sluice")
    for b in (bench, sluice):
        if not os.access(b, os.X_OK):
            usage_error(f"{b} not built (ninja -C {args.build} silk_bench sluice)")

    # The scaled experiment (README.md: "Parameters"). KVS_B in MiB/s: the blkio throttle
    # in each direction, SILK's kvs_bandwidth (min_bandwidth 5% of it) and twice the
    # static limiter's rate.
    m = SCALE[args.mode]
    scale = (["--keys", str(m["keys"])] + m["clients"] + m["store"]
             + ["--kvs-mib", str(kvs_mib), "--static-mib", str(kvs_mib // 2)])
    load_scale = (["--keys", str(m["keys"])] + m["store"]
                  + ["--settle-pending-mib", str(m["settle_mib"])])

    raw = os.path.join(args.out, "raw")
    os.makedirs(raw, exist_ok=True)
    os.makedirs(args.data, exist_ok=True)
    template, layout = (os.path.join(HERE, f) for f in MODELS[args.silk])
    policy = os.path.join(args.out, "policy.json")
    write_policy(template, policy, kvs_mib, headroom, args.silk_share)

    # The parameters of this invocation (analyze.py repeats them in summary.json's "params").
    setups, workloads = args.setups.split(), args.workloads.split()
    write_json(os.path.join(args.out, "params.json"), {
        "mode": args.mode, "command": args.command.strip(),
        "run_sh": {"setups": setups, "workloads": workloads, "reps": int(args.reps),
                   "kvs_mib": kvs_mib, "silk": args.silk, "silk_share": args.silk_share,
                   "silk_headroom": headroom, "throttle": not args.no_throttle,
                   "data": args.data, "extra": args.extra},
        "silk_bench": options(scale), "load": options(load_scale),
        "policy": "policy.json (the daemon's policy document for the sluice setup)"})

    # --- the blkio cgroup -----------------------------------------------------------
    group = None
    if not args.no_throttle:
        if not os.access(BLKIO, os.W_OK):
            usage_error(f"{BLKIO} is not writable (need root and cgroup v1 blkio); "
                        "--no-throttle runs without KVS_B (smoke only)")
        devno = block_device_of(args.data)
        bps = kvs_mib * 1024 * 1024
        group = blkio_group(f"sluice-silk-{os.getpid()}", devno, bps, bps)
        log(f"blkio throttle: device {devno}, read and write {kvs_mib} MiB/s each ({group})")
    try:
        with run_scope("sluice-silk.") as (procs, _tmp):
            failed = run_all(args, procs, bench, sluice, policy, layout, scale, load_scale,
                             group, setups, workloads)
    finally:
        if group and os.path.isdir(group):
            try:
                os.rmdir(group)
            except OSError:
                pass
    sys.exit(3 if failed else 0)


def run_all(args, procs, bench, sluice, policy, layout, scale, load_scale, group, setups,
            workloads):
    raw = os.path.join(args.out, "raw")
    # --- the preloaded DB (the same for every workload: PAIO preloads one data set) ----
    # Named after its parameters, so that a change of the load reloads.
    digest = hashlib.md5((" " + " ".join(load_scale) + "\n").encode()).hexdigest()[:10]
    templ = os.path.join(args.data, f"template-{digest}")
    if args.reload or not os.path.isfile(os.path.join(templ, ".loaded")):
        log(f"loading {templ}")
        with open(os.path.join(raw, "load.jsonl"), "w") as out, \
                open(os.path.join(raw, "load.log"), "w") as err:
            subprocess.run([bench, "load", "--db", templ] + load_scale, stdout=out,
                           stderr=err, check=True)
        open(os.path.join(templ, ".loaded"), "w").close()
        with open(os.path.join(raw, "load.jsonl")) as f:
            log(f"loaded: {f.read().strip()}")

    # --- the runs -----------------------------------------------------------------------
    # Repetition-major and setups interleaved, so that slow drifts of a shared machine
    # spread over all setups instead of biasing one.
    sock = os.path.join(args.data, "sluice-silk.sock")
    failed = False
    for rep in range(1, int(args.reps) + 1):
        for workload in workloads:
            os.makedirs(os.path.join(raw, workload), exist_ok=True)
            for setup in setups:
                f = os.path.join(raw, workload, f"{setup}-r{rep}.jsonl")
                cmd = [bench, "run", "--template", templ, "--db",
                       os.path.join(args.data, "run"), "--setup", setup, "--workload",
                       workload, "--tag", f"r{rep}", "--seed", str(rep)] + scale + args.extra
                daemon = None
                if setup == "sluice":
                    daemon = start_daemon(procs, sluice, sock, policy, f[:-len(".jsonl")])
                    cmd += ["--socket", sock, "--layout", layout]
                elif setup == "bound":
                    cmd += ["--layout", layout]  # the stage, its layout's fixed rates, no daemon
                log(f"{workload} {setup} r{rep}")
                with open(f, "w") as out, open(f[:-len(".jsonl")] + ".log", "w") as err:
                    rc = subprocess.run(in_cgroup(group, cmd), stdout=out,
                                        stderr=err).returncode
                if rc != 0:
                    log(f"FAILED: {workload} {setup} r{rep} (see {f[:-len('.jsonl')]}.log)")
                    failed = True
                if daemon is not None:
                    procs.kill_all()
                with open(f) as runs:
                    last = runs.read().splitlines()[-1:]
                if last:
                    print(last[0][:200], file=sys.stderr)
    return failed


def start_daemon(procs, sluice, sock, policy, base):
    """`sluice serve` with the silk policy; it logs the policy's decisions (fg, active
    flows, rates, Algorithm 1 line) after every step to BASE.policy.jsonl itself: polling
    it from another process would spawn processes on the runs' CPUs in this setup only."""
    if os.path.exists(sock):
        os.unlink(sock)
    with open(base + ".policy.daemon.log", "w") as err:
        daemon = procs.start([sluice, "serve", "--socket", sock, "--policy", policy,
                              "--log-level", "warn", "--report-log", base + ".policy.jsonl"],
                             None, err)
    if not wait_for_socket(sock, daemon):
        print("run.sh: sluice serve did not start", file=sys.stderr)
        sys.exit(1)
    return daemon


if __name__ == "__main__":
    main()
