#!/usr/bin/env python3
"""The driver of examples/flex (run.sh calls it): FlexEngine's experiments on Sluice,
scaled to one small machine. Experiment `sudden-load` (§5.3.1, Fig. 9): plans the run,
writes the stages' rules and the flex policy document, preloads the sudden-load
partition once, and runs sluice-flex-node once per (setup, repetition) -- the RocksDB
limiter setups as they are, the sluice setup under `sluice serve --policy` (the flex
policy sets the buckets' rates).

usage: run.py --experiment sudden-load|bosr --build DIR --out DIR [--mode full|quick|smoke]
              [--reps R] [--setups "..."] [--device-mib M] [--dir DIR] [--sluice PATH]
              [--node-bin PATH] [--no-daemon] [--plan-only]

Writes OUT/params.json (the paper's setup, the scaled one, every derived figure),
OUT/raw/<setup>/ (rules, policy, `sluice policy check` output) and per run
OUT/raw/<setup>-r<rep>/node.jsonl, node.log, daemon.log and policy.jsonl. README.md
explains the scaling. Experiment `bosr` (§5.3.2, compaction deferral) lives in bosr.py;
each experiment is an entry of EXPERIMENTS with its own plan and run functions.
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import (driver_parser, log, run_scope, start_daemon,  # noqa: E402
                          wait_or_kill, write_json)
import bosr  # noqa: E402

MIB = 1024 * 1024
SETUPS = ["auto-tuned", "static", "sluice"]

# FlexEngine §5.3.1 and §5.1 (MB as the paper writes them).
PAPER = {
    "items": 10_000_000, "item_bytes": 1024, "idle_s": 10, "load_s": 30,
    "rcu_per_s": 3000, "distribution": "zipfian", "rcu_max_size": 4096,
    "raf_upper_bound": 4, "lsm_ba_levels_l0_l3": 46, "lsm_ba_measured": 20,
    "wcu_per_s_per_partition": 3000, "memtable_mb": 16, "max_write_buffers": 4,
    "l0_l1_compaction_trigger_mb": 64, "auto_tuned_refill_ms": 100,
    # Fig. 9a: auto-tuned serves 29.2% of the RCUs in the first second of load and all of
    # them only from the 38th second (28 s after the load starts); FlexEngine all from the
    # first second. Fig. 9b: average, p99, p99.9 latency 96.6%, 99.5%, 99.5% lower.
    "auto_tuned_served_first_s": 0.292, "auto_tuned_seconds_to_full_rate": 28,
    "flex_served_first_s": 1.0,
}

# Per mode: items preloaded, idle and load seconds, reads per second, writers' MiB/s.
MODES = {
    "full": {"items": 1_000_000, "idle_s": 10, "load_s": 30, "rcu_per_s": 3000},
    "quick": {"items": 200_000, "idle_s": 10, "load_s": 20, "rcu_per_s": 3000},
    "smoke": {"items": 20_000, "idle_s": 1.5, "load_s": 2.5, "rcu_per_s": 500},
}


def sudden_load_setup(mode, device_mib):
    """The scaled setup of `sudden-load` and everything derived from it."""
    m = MODES[mode]
    partitions = 4  # p0 (idle, then reads) and three writers
    s = {
        "partitions": partitions,
        "items": m["items"], "value_size": 1024, "idle_s": m["idle_s"],
        "load_s": m["load_s"], "rcu_per_s": m["rcu_per_s"], "zipf_theta": 0.99,
        "readers": 4, "write_mib": 1.0, "change_factor": 3.0,
        # p1's write load triples halfway through the load.
        "change_at_s": m["idle_s"] + m["load_s"] / 2,
        "memtable_mib": 4.0, "block_cache_mib": 2.0, "bin_ms": 1000,
        "device_mib": device_mib,
        # RocksDB baselines: auto-tuned, every DB may climb to the whole device (the
        # over-subscription the tuner is meant to make safe); static, the device split
        # evenly (sums to the device, no over-subscription).
        "auto_tuned_ceiling_mib": device_mib, "static_mib": device_mib / partitions,
        "refill_ms": 100,
        # Equation 2: p0 is provisioned for the read rate it will get; a Get of a 1 KiB
        # item reads at most one 4 KiB data block (index and filter blocks stay in
        # memory), so RAF = 1 here (the paper's upper bound is 4 with two SSTs read per
        # RCU). The writers: WCUs up to their peak (3 MiB/s after the change).
        "rcu_max_size": 4096, "read_amplification": 1.0,
        "wcu_max_per_s": 3072, "wcu_max_size": 1024,
        # Equation 3: LSM-BA as the paper measured it in §5.3.2; the ingest window is one
        # control interval, so that the background rate follows a change of load at the
        # next step.
        "background_amplification": 20, "ingest_window_s": 1, "min_background_mib": 1.0,
        "interval_ms": 1000,
        # The node bucket's burst: 0.5% of a second's bandwidth, so that a second sees at
        # most 0.5% over the device's bandwidth, plus at most one request larger than the
        # burst (RocksDB's 512 KiB tail prefetch when it opens a new table file), which
        # the bucket saves up for while it waits.
        "node_burst_fraction": 0.005,
    }
    s["fg_p0"] = s["rcu_per_s"] * s["rcu_max_size"] * s["read_amplification"]
    s["fg_writer"] = s["wcu_max_per_s"] * s["wcu_max_size"]
    s["bg_writer_at_start"] = s["write_mib"] * MIB * s["background_amplification"]
    s["fg_sum"] = s["fg_p0"] + (partitions - 1) * s["fg_writer"]
    return s


def partition_rules(s, objtype):
    """A partition's stage: foreground (user reads, WAL) and background (flush and
    compaction) each through a bucket of its own; the rest (MANIFEST, LOG, other)
    counted. `objtype` prio-bucket, or drl in a build without it."""
    fg_rate = int(s["fg_p0"])  # the policy sets each partition's own rates at its first step
    bg_rate = int(s["bg_writer_at_start"])
    bg_origins = ["flush", "compaction", "compaction_L0_L1", "compaction_L0_L0", "compaction_LN"]
    if objtype == "prio-bucket":
        fg_cfg = {"rate": fg_rate, "classes": [
            {"name": "foreground", "origins": ["foreground", "wal"], "priority": 0}]}
        bg_cfg = {"rate": bg_rate, "classes": [
            {"name": "flush", "origins": ["flush"], "priority": 0, "weight": 10},
            {"name": "compaction", "origins": ["compaction*"], "priority": 0, "weight": 1}],
            "default_class": "compaction"}
    else:
        fg_cfg, bg_cfg = {"rate": fg_rate}, {"rate": bg_rate}
    return {"version": 1, "rules": [
        {"rule": "differentiate", "classifiers": ["origin"]},
        {"rule": "create_channel", "channel": "fg", "match": {"origin": ["foreground", "wal"]}},
        {"rule": "create_object", "channel": "fg", "object": "fg", "type": objtype,
         "config": fg_cfg},
        {"rule": "create_channel", "channel": "bg", "match": {"origin": bg_origins}},
        {"rule": "create_object", "channel": "bg", "object": "bg", "type": objtype,
         "config": bg_cfg},
        {"rule": "create_channel", "channel": "rest", "default": True},
        {"rule": "create_object", "channel": "rest", "object": "rest", "type": "noop"}]}


def node_rules(s, objtype):
    """The node stage: every I/O of every partition through one bucket at the device's
    bandwidth; foreground first, then flush and compaction 10:1 (MANIFEST, LOG and
    other files with flush)."""
    rate = int(s["device_mib"] * MIB)
    burst = int(rate * s["node_burst_fraction"])
    if objtype == "prio-bucket":
        cfg = {"rate": rate, "burst": burst, "classes": [
            {"name": "foreground", "origins": ["foreground", "wal"], "priority": 0},
            {"name": "flush", "origins": ["flush", "manifest", "info_log", "other"],
             "priority": 1, "weight": 10},
            {"name": "compaction", "origins": ["compaction*"], "priority": 1, "weight": 1}],
            "default_class": "compaction"}
    else:
        cfg = {"rate": rate, "burst": burst}
    return {"version": 1, "rules": [
        {"rule": "create_channel", "channel": "node", "default": True},
        {"rule": "create_object", "channel": "node", "object": "node", "type": objtype,
         "config": cfg}]}


def flex_policy(s, prefix):
    parts = []
    for i in range(s["partitions"]):
        reader = i == 0
        parts.append({
            "name": f"p{i}", "stage": f"{prefix}-p{i}",
            "rcu_max_per_s": s["rcu_per_s"] if reader else 0,
            "rcu_max_size": s["rcu_max_size"], "read_amplification": s["read_amplification"],
            "wcu_max_per_s": 0 if reader else s["wcu_max_per_s"],
            "wcu_max_size": s["wcu_max_size"],
            "background_amplification": s["background_amplification"],
            "ingest_window_s": s["ingest_window_s"],
            "min_background": int(s["min_background_mib"] * MIB)})
    return {"policy": "flex", "interval_ms": s["interval_ms"], "config": {
        # The policy sets the rate of object "node" in channel "node" of every stage
        # that has one: here the process's node stage.
        "node": {"bandwidth": int(s["device_mib"] * MIB), "channel": "node", "object": "node"},
        "partitions": parts,
        "foreground": {"channel": "fg", "object": "fg"},
        "background": {"channel": "bg", "object": "bg"}}}


def has_object(node_bin, rules_dir):
    """Whether this build's stages take the prio-bucket rules (else drl stands in)."""
    p = subprocess.run([node_bin, "--probe", "--partition-rules",
                        os.path.join(rules_dir, "partition-rules.json"),
                        "--node-rules", os.path.join(rules_dir, "node-rules.json")],
                       capture_output=True, text=True)
    return p.returncode == 0, p.stdout.strip()


def policy_check(sluice, path):
    p = subprocess.run([sluice, "policy", "check", path, "--json"], capture_output=True,
                       text=True)
    if p.returncode != 0:
        return None, (p.stderr or p.stdout).strip()[:500]
    try:
        return json.loads(p.stdout), ""
    except ValueError as e:
        return None, f"unexpected output ({e})"


def plan_sudden_load(args, params):
    s = sudden_load_setup(args.mode, args.device_mib)
    params["scaled"] = s
    raw = os.path.join(args.out, "raw")
    for objtype in ("prio-bucket", "drl"):
        d = os.path.join(raw, "rules-" + objtype)
        os.makedirs(d, exist_ok=True)
        write_json(os.path.join(d, "partition-rules.json"), partition_rules(s, objtype))
        write_json(os.path.join(d, "node-rules.json"), node_rules(s, objtype))
    ppath = os.path.join(raw, "policy.json")
    write_json(ppath, flex_policy(s, args.stage_prefix))
    params["object"] = "prio-bucket"
    params["policy_check"] = None
    if args.plan_only:
        return
    ok, why = has_object(args.node_bin, os.path.join(raw, "rules-prio-bucket"))
    if not ok:
        params["object"] = "drl"
        params["object_note"] = f"prio-bucket not in this build ({why}); drl stands in"
        log(params["object_note"])
    if "sluice" in args.setups and not args.no_daemon:
        check, err = policy_check(args.sluice, ppath)
        params["policy_check"] = check if check is not None else {"error": err}
        if check is None:
            log(f"sluice policy check {ppath}: {err}")


def run_sudden_load_one(args, params, setup, rep, tmp, procs):
    s = params["scaled"]
    run_dir = os.path.join(args.out, "raw", f"{setup}-r{rep}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    rules_dir = os.path.join(args.out, "raw", "rules-" + params["object"])
    work = os.path.join(tmp, "work")
    os.makedirs(work, exist_ok=True)
    cmd = [args.node_bin, "--setup", setup, "--data", os.path.join(tmp, "p0"),
           "--work", work, "--out", os.path.join(run_dir, "node.jsonl"),
           "--tag", f"{setup}-r{rep}", "--stage-prefix", args.stage_prefix,
           "--items", str(s["items"]), "--value-size", str(s["value_size"]),
           "--partitions", str(s["partitions"]), "--idle-s", repr(s["idle_s"]),
           "--load-s", repr(s["load_s"]), "--rcu-per-s", repr(s["rcu_per_s"]),
           "--zipf-theta", repr(s["zipf_theta"]), "--readers", str(s["readers"]),
           "--write-mib", repr(s["write_mib"]), "--change-at-s", repr(s["change_at_s"]),
           "--change-factor", repr(s["change_factor"]), "--refill-ms", str(s["refill_ms"]),
           "--block-cache-mib", repr(s["block_cache_mib"]),
           "--memtable-mib", repr(s["memtable_mib"]), "--bin-ms", str(s["bin_ms"]),
           "--seed", str(rep)]
    if setup == "auto-tuned":
        cmd += ["--limiter-mib", repr(s["auto_tuned_ceiling_mib"])]
    elif setup == "static":
        cmd += ["--limiter-mib", repr(s["static_mib"])]
    else:
        cmd += ["--partition-rules", os.path.join(rules_dir, "partition-rules.json"),
                "--node-rules", os.path.join(rules_dir, "node-rules.json")]
    sock = os.path.join(tmp, "sluice.sock")
    if setup == "sluice" and not args.no_daemon:
        start_daemon(procs, args.sluice, sock, run_dir, s["interval_ms"], 5,
                     policy=os.path.join(args.out, "raw", "policy.json"))
        cmd += ["--socket", sock]
    with open(os.path.join(run_dir, "node.log"), "w") as nlog:
        node = procs.start(cmd, subprocess.DEVNULL, nlog)
    rc = wait_or_kill(node, s["idle_s"] + s["load_s"] + 120)
    procs.kill_all()
    if rc != 0:
        with open(os.path.join(run_dir, "node.log")) as f:
            sys.stderr.write(f"--- node.log ---\n{f.read()[-2000:]}")
        raise SystemExit(f"run.py: {setup} r{rep}: the node failed (exit {rc}; see {run_dir})")


def run_sudden_load(args, params, tmp, procs):
    s = params["scaled"]
    log(f"preload: {s['items']} items of {s['value_size']} B")
    with open(os.path.join(args.out, "raw", "preload.log"), "w") as plog:
        p = procs.start([args.node_bin, "--preload", os.path.join(tmp, "p0"), "--items",
                         str(s["items"]), "--value-size", str(s["value_size"]),
                         "--memtable-mib", repr(s["memtable_mib"])], plog, plog)
        if p.wait() != 0:
            raise SystemExit(f"run.py: preload failed (see {args.out}/raw/preload.log)")
    procs.procs = []
    # Repetition-major, so that a slow drift of a shared machine spreads over the setups.
    for rep in range(1, args.reps + 1):
        for setup in args.setups:
            log(f"{setup} r{rep} ({s['idle_s'] + s['load_s']:g} s)")
            run_sudden_load_one(args, params, setup, rep, tmp, procs)


EXPERIMENTS = {"sudden-load": (plan_sudden_load, run_sudden_load),
               "bosr": (bosr.plan, bosr.run)}
# Each experiment's setups (the first list is also --setups' default).
EXPERIMENT_SETUPS = {"sudden-load": SETUPS, "bosr": bosr.SETUPS}


def main():
    ap = driver_parser(MODES, __doc__)
    ap.add_argument("--experiment", required=True, choices=sorted(EXPERIMENTS))
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--setups", default=None)
    ap.add_argument("--device-mib", type=float, default=24.0,
                    help="the scaled device's bandwidth, MiB/s (node bucket / limiters)")
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    ap.add_argument("--stage-prefix", default="flex")
    ap.add_argument("--sluice", default=None)
    ap.add_argument("--node-bin", default=None)
    ap.add_argument("--bosr-bin", default=None)
    ap.add_argument("--lsm-ba", type=float, default=None,
                    help="bosr: LSM-BA for the background demand (default: measured by a "
                         "calibration run)")
    ap.add_argument("--no-daemon", action="store_true",
                    help="the sluice setup without `sluice serve`: the buckets keep the "
                         "rates of the rules (Equations 2 and 3 at the starting load)")
    args = ap.parse_args()
    known = EXPERIMENT_SETUPS[args.experiment]
    args.setups = args.setups.split() if args.setups is not None else list(known)
    for x in args.setups:
        if x not in known:
            raise SystemExit(f"run.py: --setups: unknown setup {x!r} (expected "
                             f"{', '.join(known)})")
    if not 1 <= args.device_mib <= 4096:
        raise SystemExit(f"run.py: --device-mib must be 1..4096, got {args.device_mib}")
    if args.lsm_ba is not None and not 0 < args.lsm_ba <= 1000:
        raise SystemExit(f"run.py: --lsm-ba must be in (0, 1000], got {args.lsm_ba}")
    if args.reps is None and args.experiment == "bosr":
        args.reps = bosr.MODES[args.mode]["reps"]
    if args.reps is None:
        args.reps = {"full": 3}.get(args.mode, 1)
    if args.reps < 1:
        raise SystemExit(f"run.py: --reps must be >= 1, got {args.reps}")
    args.sluice = args.sluice or os.path.join(args.build, "control-plane", "sluice")
    args.node_bin = args.node_bin or os.path.join(args.build, "examples", "flex",
                                                  "sluice-flex-node")
    args.bosr_bin = args.bosr_bin or os.path.join(args.build, "examples", "flex",
                                                  "sluice-flex-bosr")
    if not args.plan_only and args.experiment == "bosr":
        need = [args.bosr_bin] + ([args.sluice] if args.setups != ["rocksdb"] else [])
        for b in need:
            if not os.access(b, os.X_OK):
                raise SystemExit(f"run.py: {b} not built (ninja -C {args.build} sluice "
                                 f"sluice-flex-bosr)")
    elif not args.plan_only:
        need = [args.node_bin] + ([args.sluice] if "sluice" in args.setups
                                  and not args.no_daemon else [])
        for b in need:
            if not os.access(b, os.X_OK):
                raise SystemExit(f"run.py: {b} not built (ninja -C {args.build} sluice "
                                 f"sluice-flex-node)")
    params = {"experiment": args.experiment, "mode": args.mode, "command": args.command,
              "setups": args.setups, "reps": args.reps, "paper": PAPER,
              "daemon": not args.no_daemon}
    os.makedirs(os.path.join(args.out, "raw"), exist_ok=True)
    plan, run = EXPERIMENTS[args.experiment]
    plan(args, params)
    write_json(os.path.join(args.out, "params.json"), params)
    if args.plan_only:
        return
    with run_scope(prefix="sluice-flex.", dir=args.dir) as (procs, tmp):
        run(args, params, tmp, procs)


if __name__ == "__main__":
    main()
