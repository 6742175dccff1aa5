"""Experiment `bosr` of examples/flex (FlexEngine §5.3.2, Fig. 7 and 10): run.py's entry
for it (plan and run), imported by run.py.

Every partition (a RocksDB instance) writes continuously; the node's bandwidth B (the
node stage's bucket, the "device" of every setup) is set so that the background
over-subscription ratio

    BOSR = total background demand / (B - foreground reservation)

is 1.5, 2, 2.5 and 3 (the paper's definition, from Fig. 10's caption and §5.4: 32 x
60 MB/s = 1920 MB/s of background demand over 640 MB/s of device bandwidth less the
foreground reservation at BOSR 3), with each partition's background demand its ingest
times LSM-BA (Equation 3: 3 MB/s x 20 = 60 MB/s in the paper). At the end of the window
the bandwidth returns (the node bucket goes to `after_mib`, and a daemon's policy is
replaced by the same one at that bandwidth); the writes go on for `after_s`.

Setups, one after the other for each BOSR in the same invocation:
  rocksdb      the node bucket alone, one class (requests in arrival order): the device's
               cap and nothing else
  node         + node-level control: partition stages (fg and bg buckets, Equations 2
               and 3) and a node bucket with priorities (foreground, then flush and
               compaction 10:1), rates set by `sluice serve --policy` (flex)
  first-stage  + compaction deferral's first stage: the node setup's buckets at the
               rates the flex policy sets for this load (from the rules: one daemon runs
               one policy), a `deferral-gate` per partition, the RocksDB actuator, and
               `sluice serve --policy` (compaction-deferral, second_stage false)
  sluice       the same with the second stage (intra-L0 compactions)
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import log, start_daemon, wait_or_kill, write_json  # noqa: E402

MIB = 1024 * 1024
SETUPS = ["rocksdb", "node", "first-stage", "sluice"]
BOSRS = [1.5, 2.0, 2.5, 3.0]

# FlexEngine §5.3.2 and Fig. 7, 10 (MB as the paper writes them).
PAPER = {
    "partitions": 32, "preload_items": 10_000_000, "item_bytes": 1024,
    "wcu_per_s": 3000, "ingest_mb_s": 3, "lsm_ba": 20, "bg_demand_mb_s": 60,
    "total_bg_demand_mb_s": 1920, "bosr": BOSRS, "window_s": 200, "fig7_window_s": 400,
    "memtable_mb": 16, "max_write_buffers": 4, "l0_compaction_trigger": 4,
    "l0_slowdown_trigger": 20, "l0_stop_trigger": 32, "l0_fraction": 0.6,
    "intra_l0_min_files": 4,
    # Fig. 10a: the share of WCUs not normally served, average over the partitions.
    "unserved_avg_pct": {
        "rocksdb": {"1.5": 2.2, "3.0": 26.9},
        "node": {"1.5": 0.0, "2.0": 1.1, "3.0": 15.8},
        "first-stage": {"3.0": 7.1},
        "sluice": {"1.5": 0.0, "2.0": 0.0, "2.5": 0.0, "3.0": 0.0}},
    "unserved_max_pct": {"rocksdb": {"1.5": 11.0}, "node": {"2.0": 9.9}},
    # Fig. 10b: FlexEngine against RocksDB (and against first-stage at BOSR 3).
    "latency_reduction_vs_rocksdb_pct": {
        "1.5": {"avg": 83.3, "p99": 98.2, "p999": 97.7},
        "3.0": {"avg": 97.3, "p99": 99.4, "p999": 97.4}},
    "latency_reduction_vs_first_stage_pct": {"3.0": {"avg": 88.1, "p99": 99.3, "p999": 97.0}},
    "sluice_latency_us": "< 100 (avg, p99, p99.9)",
}

# Per mode: preloaded items per partition, the window and after it (s), the memtable.
MODES = {
    "full": {"items": 32768, "window_s": 90, "after_s": 30, "memtable_kib": 256,
             "write_mib": 0.5, "bosrs": BOSRS, "bin_ms": 1000, "reps": 1},
    "quick": {"items": 8192, "window_s": 9, "after_s": 4, "memtable_kib": 128,
              "write_mib": 0.5, "bosrs": BOSRS, "bin_ms": 500, "reps": 1},
    "smoke": {"items": 2048, "window_s": 5, "after_s": 3, "memtable_kib": 128,
              "write_mib": 0.5, "bosrs": [3.0], "bin_ms": 500, "reps": 1},
}


def scaled(mode):
    m = MODES[mode]
    s = {
        "partitions": 8, "items": m["items"], "value_size": 1024, "key_size": 16,
        "write_mib": m["write_mib"], "window_s": m["window_s"], "after_s": m["after_s"],
        "memtable_kib": m["memtable_kib"], "l0_trigger": 4, "l0_slowdown": 20, "l0_stop": 36,
        "bin_ms": m["bin_ms"], "bosrs": m["bosrs"], "block_cache_mib": 2.0,
        # Equation 3's LSM-BA: measured by a calibration run (below) unless --lsm-ba
        # gives it; the paper's measured 20 until then.
        "background_amplification": PAPER["lsm_ba"], "lsm_ba_source": "paper",
        "ingest_window_s": 1, "interval_ms": 250,
        "deferral": {"high_watermark": 0.8, "low_watermark": 0.6, "low_steps": 3,
                     "l0_fraction": 0.6, "hold_ms": 3000},
        "node_burst_fraction": 0.005,
        # The bandwidth that returns at the end of the window: twice Equation 3 in each
        # partition's bg bucket (room for the deferred work as well as the new), and at
        # the node the foreground reservation and 8 x the background demand, so that the
        # partitions' buckets together use at most a quarter of it, below the low
        # watermark (with less, the recovery's own compactions fill the node and
        # compaction-deferral, which reads the node's use, defers again).
        "after_demand_factor": 2.0, "after_node_factor": 8.0,
        # A served put completes within this long of its due time.
        "served_ms": 100,
    }
    put = s["key_size"] + s["value_size"]
    s["puts_per_s"] = s["write_mib"] * MIB / put
    # Equation 2 (WCU/s x WCU size), the WCU size 10% above key + value: a put's WAL
    # record carries about 23 bytes of framing, and a bucket at exactly the load queues.
    s["wcu_size"] = int(put * 1.1)
    s["fg_partition"] = s["puts_per_s"] * s["wcu_size"]
    s["fg_sum"] = s["partitions"] * s["fg_partition"]
    derive(s, s["background_amplification"], s["lsm_ba_source"])
    return s


def derive(s, lsm_ba, source):
    """Equation 3 and the node bandwidths from LSM-BA: B = fg + demand / BOSR."""
    s["background_amplification"] = lsm_ba
    s["lsm_ba_source"] = source
    s["bg_partition"] = s["write_mib"] * MIB * lsm_ba  # Equation 3
    s["bg_total"] = s["partitions"] * s["bg_partition"]
    s["node_bandwidth"] = {str(b): s["fg_sum"] + s["bg_total"] / b for b in s["bosrs"]}
    s["after_bandwidth"] = s["fg_sum"] + s["after_node_factor"] * s["bg_total"]


def partition_rules(s, setup):
    """A partition's stage: channels fg (user reads, WAL), bg (flush, compaction) and
    rest. rocksdb: noop objects (counted, not limited); otherwise a prio-bucket each at
    Equations 2 and 3, and in the deferral setups the gate in bg."""
    bg_origins = ["flush", "compaction", "compaction_L0_L1", "compaction_L0_L0", "compaction_LN"]
    if setup == "rocksdb":
        fg = {"rule": "create_object", "channel": "fg", "object": "fg", "type": "noop"}
        bg = {"rule": "create_object", "channel": "bg", "object": "bg", "type": "noop"}
    else:
        fg = {"rule": "create_object", "channel": "fg", "object": "fg", "type": "prio-bucket",
              "config": {"rate": int(s["fg_partition"]), "classes": [
                  {"name": "foreground", "origins": ["foreground", "wal"], "priority": 0}]}}
        bg = {"rule": "create_object", "channel": "bg", "object": "bg", "type": "prio-bucket",
              "config": {"rate": int(s["bg_partition"]), "classes": [
                  {"name": "flush", "origins": ["flush"], "priority": 0, "weight": 10},
                  {"name": "compaction", "origins": ["compaction*"], "priority": 0,
                   "weight": 1}], "default_class": "compaction"}}
    rules = [
        {"rule": "differentiate", "classifiers": ["origin"]},
        {"rule": "create_channel", "channel": "fg", "match": {"origin": ["foreground", "wal"]}},
        fg,
        {"rule": "create_channel", "channel": "bg", "match": {"origin": bg_origins}},
        bg]
    if setup in ("first-stage", "sluice"):
        rules.append({"rule": "create_object", "channel": "bg", "object": "deferral",
                      "type": "deferral-gate",
                      "config": {"hold_ms": s["deferral"]["hold_ms"]}})
    rules += [{"rule": "create_channel", "channel": "rest", "default": True},
              {"rule": "create_object", "channel": "rest", "object": "rest", "type": "noop"}]
    return {"version": 1, "rules": rules}


def node_rules(s, setup, bandwidth):
    """The node stage: every I/O of every partition through one bucket at the node's
    bandwidth. rocksdb: one class (arrival order, as a device serves); otherwise
    foreground first, then flush and compaction 10:1."""
    rate = int(bandwidth)
    burst = int(rate * s["node_burst_fraction"])
    if setup == "rocksdb":
        classes = [{"name": "all", "origins": ["foreground"], "priority": 0}]
        default = "all"
    else:
        classes = [
            {"name": "foreground", "origins": ["foreground", "wal"], "priority": 0},
            {"name": "flush", "origins": ["flush", "manifest", "info_log", "other"],
             "priority": 1, "weight": 10},
            {"name": "compaction", "origins": ["compaction*"], "priority": 1, "weight": 1}]
        default = "compaction"
    return {"version": 1, "rules": [
        {"rule": "create_channel", "channel": "node", "default": True},
        {"rule": "create_object", "channel": "node", "object": "node", "type": "prio-bucket",
         "config": {"rate": rate, "burst": burst, "classes": classes,
                    "default_class": default}}]}


def policy(s, setup, bandwidth, prefix, after=False):
    """The daemon's policy document for a setup (None: no daemon); `after`: once the
    bandwidth returned (Equation 3 with after_demand_factor x LSM-BA, as the buckets)."""
    if setup == "node":
        amp = s["background_amplification"] * (s["after_demand_factor"] if after else 1)
        parts = [{"name": f"p{i}", "stage": f"{prefix}-p{i}", "rcu_max_per_s": 0,
                  "wcu_max_per_s": s["puts_per_s"],
                  "wcu_max_size": s["wcu_size"],
                  "background_amplification": amp,
                  "ingest_window_s": s["ingest_window_s"], "min_background": MIB}
                 for i in range(s["partitions"])]
        return {"policy": "flex", "interval_ms": s["interval_ms"], "config": {
            "node": {"bandwidth": int(bandwidth), "channel": "node", "object": "node"},
            "partitions": parts,
            "foreground": {"channel": "fg", "object": "fg"},
            "background": {"channel": "bg", "object": "bg"}}}
    if setup in ("first-stage", "sluice"):
        d = s["deferral"]
        return {"policy": "compaction-deferral", "interval_ms": s["interval_ms"], "config": {
            "bandwidth": int(bandwidth), "measure_channels": ["node"],
            "high_watermark": d["high_watermark"], "low_watermark": d["low_watermark"],
            "low_steps": d["low_steps"], "l0_fraction": d["l0_fraction"],
            "hold_ms": d["hold_ms"], "second_stage": setup == "sluice"}}
    return None


def policy_check(sluice, path):
    p = subprocess.run([sluice, "policy", "check", path, "--json"], capture_output=True,
                       text=True)
    return p.returncode == 0, (p.stderr or p.stdout).strip()[:500]


def run_dir_of(args, bosr, setup, rep):
    return os.path.join(args.out, "raw", f"bosr{bosr:g}-{setup}-r{rep}")


def plan(args, params):
    s = scaled(args.mode)
    if args.lsm_ba is not None:
        derive(s, args.lsm_ba, "--lsm-ba")
    params["scaled"] = s
    params["paper"] = PAPER
    params["bosrs"] = s["bosrs"]
    write_plan(args, s, check=False)


def write_plan(args, s, check):
    """Every run's rules and policies (and `sluice policy check` of the policies)."""
    for bosr in s["bosrs"]:
        bw = s["node_bandwidth"][str(bosr)]
        for setup in args.setups:
            d = os.path.join(args.out, "raw", f"bosr{bosr:g}-{setup}")
            os.makedirs(d, exist_ok=True)
            write_json(os.path.join(d, "partition-rules.json"), partition_rules(s, setup))
            write_json(os.path.join(d, "node-rules.json"), node_rules(s, setup, bw))
            pol = policy(s, setup, bw, args.stage_prefix)
            if pol is None:
                continue
            write_json(os.path.join(d, "policy.json"), pol)
            write_json(os.path.join(d, "policy-after.json"),
                       policy(s, setup, s["after_bandwidth"], args.stage_prefix, after=True))
            if check:
                for f in ("policy.json", "policy-after.json"):
                    ok, why = policy_check(args.sluice, os.path.join(d, f))
                    if not ok:
                        raise SystemExit(f"run.py: sluice policy check {d}/{f}: {why}")


def replace_policy_at_window_end(args, s, node_out, sock, after, log_path, stop):
    """Waits for the node's config line (its start on the wall clock), then at the end of
    the window replaces the daemon's policy with the one at the returned bandwidth."""
    t0 = None
    while t0 is None and not stop.is_set():
        try:
            with open(node_out) as f:
                first = f.readline()
            if first.endswith("\n"):
                t0 = json.loads(first)["t0_unix_s"]
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    if t0 is None:
        return
    delay = t0 + s["window_s"] - time.time()
    if delay > 0 and stop.wait(delay):
        return
    with open(log_path, "w") as f:
        f.write(f"at {time.time() - t0:.3f} s\n")
        f.flush()
        subprocess.run([args.sluice, "--socket", sock, "policy", "set", after], stdout=f,
                       stderr=f)


def run_one(args, params, bosr, setup, rep, tmp, procs, calibrate=False):
    """One run; `calibrate`: the calibration run instead (rocksdb's rules at a bandwidth
    no run reaches, the window only)."""
    s = params["scaled"]
    run_dir = (os.path.join(args.out, "raw", "calibration") if calibrate
               else run_dir_of(args, bosr, setup, rep))
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    rules = os.path.join(args.out, "raw", "calibration-rules" if calibrate
                         else f"bosr{bosr:g}-{setup}")
    work = os.path.join(tmp, "work")
    os.makedirs(work, exist_ok=True)
    node_out = os.path.join(run_dir, "node.jsonl")
    cmd = [args.bosr_bin, "--setup", setup, "--data", os.path.join(tmp, "preload"),
           "--work", work, "--out", node_out, "--tag", f"bosr{bosr:g}-{setup}-r{rep}",
           "--stage-prefix", args.stage_prefix,
           "--partition-rules", os.path.join(rules, "partition-rules.json"),
           "--node-rules", os.path.join(rules, "node-rules.json"),
           "--partitions", str(s["partitions"]), "--items", str(s["items"]),
           "--value-size", str(s["value_size"]), "--write-mib", repr(s["write_mib"]),
           "--window-s", repr(s["window_s"]),
           "--after-s", repr(0 if calibrate else s["after_s"]),
           "--after-mib", repr(s["after_bandwidth"] / MIB),
           "--memtable-kib", repr(s["memtable_kib"]), "--l0-trigger", str(s["l0_trigger"]),
           "--l0-slowdown", str(s["l0_slowdown"]), "--l0-stop", str(s["l0_stop"]),
           "--block-cache-mib", repr(s["block_cache_mib"]), "--bin-ms", str(s["bin_ms"]),
           "--served-ms", repr(s["served_ms"]),
           "--seed", str(rep)]
    if setup in ("first-stage", "sluice"):
        cmd.append("--deferral")
    if setup != "rocksdb" and not calibrate:
        cmd += ["--after-bg-mib", repr(s["after_demand_factor"] * s["bg_partition"] / MIB)]
    sock = os.path.join(tmp, "sluice.sock")
    stop = threading.Event()
    changer = None
    if setup != "rocksdb":
        start_daemon(procs, args.sluice, sock, run_dir, s["interval_ms"], 20,
                     policy=os.path.join(rules, "policy.json"))
        cmd += ["--socket", sock]
        changer = threading.Thread(target=replace_policy_at_window_end, args=(
            args, s, node_out, sock, os.path.join(rules, "policy-after.json"),
            os.path.join(run_dir, "policy-set.log"), stop))
        changer.start()
    try:
        with open(os.path.join(run_dir, "node.log"), "w") as nlog:
            node = procs.start(cmd, subprocess.DEVNULL, nlog)
        rc = wait_or_kill(node, s["window_s"] + s["after_s"] + 120)
    finally:
        stop.set()
        if changer is not None:
            changer.join()
        procs.kill_all()
    if rc != 0:
        with open(os.path.join(run_dir, "node.log")) as f:
            sys.stderr.write(f"--- node.log ---\n{f.read()[-2000:]}")
        raise SystemExit(f"run.py: bosr {bosr:g} {setup} r{rep}: the node failed (exit {rc}; "
                         f"see {run_dir})")


def calibrate(args, params, tmp, procs):
    """Measures LSM-BA: the rocksdb setup with the node bucket at 8 GiB/s (no run comes
    near) for one window; background bytes over the bytes written."""
    s = params["scaled"]
    r = os.path.join(args.out, "raw", "calibration-rules")
    os.makedirs(r, exist_ok=True)
    write_json(os.path.join(r, "partition-rules.json"), partition_rules(s, "rocksdb"))
    write_json(os.path.join(r, "node-rules.json"), node_rules(s, "rocksdb", 8 * 1024 * MIB))
    d = os.path.join(args.out, "raw", "calibration")
    log(f"calibration: LSM-BA over a {s['window_s']:g} s window without a bandwidth limit")
    run_one(args, params, 0, "rocksdb", 1, tmp, procs, calibrate=True)
    with open(os.path.join(d, "node.jsonl")) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    bg = sum(sum(b["bg_bytes"]) for b in lines if b["type"] == "bin")
    written = sum(p["window"]["bytes"] for p in lines[-1]["partitions"])
    if written <= 0 or bg <= 0:
        raise SystemExit(f"run.py: the calibration run measured no LSM-BA (see {d})")
    derive(s, round(bg / written, 2), "measured")
    log(f"LSM-BA {s['background_amplification']:g}: background demand "
        f"{s['bg_total'] / MIB:.1f} MiB/s")


def run(args, params, tmp, procs):
    s = params["scaled"]
    log(f"preload: {s['partitions']} partitions x {s['items']} items of {s['value_size']} B")
    with open(os.path.join(args.out, "raw", "preload.log"), "w") as plog:
        p = procs.start([args.bosr_bin, "--preload", os.path.join(tmp, "preload"),
                         "--partitions", str(s["partitions"]), "--items", str(s["items"]),
                         "--value-size", str(s["value_size"]),
                         "--memtable-kib", repr(s["memtable_kib"]),
                         "--l0-trigger", str(s["l0_trigger"]),
                         "--l0-slowdown", str(s["l0_slowdown"]), "--l0-stop", str(s["l0_stop"])],
                        plog, plog)
        if p.wait() != 0:
            raise SystemExit(f"run.py: preload failed (see {args.out}/raw/preload.log)")
    procs.procs = []
    if args.lsm_ba is None:
        calibrate(args, params, tmp, procs)
    write_plan(args, s, check=True)
    write_json(os.path.join(args.out, "params.json"), params)
    for rep in range(1, args.reps + 1):
        for bosr in s["bosrs"]:
            for setup in args.setups:
                log(f"BOSR {bosr:g} {setup} r{rep} ({s['window_s'] + s['after_s']:g} s)")
                run_one(args, params, bosr, setup, rep, tmp, procs)
