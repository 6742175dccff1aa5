#!/usr/bin/env python3
"""The driver of examples/delta-fair (run.sh calls it): experiment `buffer`, FairDB
§7.2.1 scaled by --scale. Plans the run, writes each configuration's stage rules and the
delta-fair policy document per δ, asks `sluice policy check --json` what the policy
reserves (a sluice without it is an error), and runs sluice-delta-fair-node once per (configuration, repetition), the
gated ones under `sluice serve --policy` (the daemon sets the pool's reservation).

usage: run.py --build DIR --out DIR [--mode full|quick|smoke] [--scale F] [--reps R]
              [--configs "..."] [--aggressive-factor X] [--rounding nearest|strict]
              [--interval-ms MS] [--dir DIR] [--sluice PATH] [--node-bin PATH] [--plan-only]

Writes OUT/params.json (the paper's setup, the scaled one and every derived figure),
OUT/raw/<config>/rules.json, OUT/raw/<config>/policy.json and check.json (gated), and per
run OUT/raw/<config>-r<rep>/node.jsonl (the node's output), node.log, daemon.log and
policy.jsonl (the policy's report after every step). README.md explains the scaling.
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import (driver_parser, log, run_scope, start_daemon,  # noqa: E402
                          wait_or_kill, write_json)

MIB = 1024 * 1024
DELTAS = ["0", "200", "350", "500", "inf"]
CONFIGS = [f"delta-{d}" for d in DELTAS] + ["plain"]

# FairDB §7.2.1 (MB as the paper writes them; scaled as MiB).
PAPER = {
    "buffer_mb": 2048, "tenants": 16, "steady": 12, "aggressive": 2, "ramp": 2,
    "fair_share_mb": 128, "segment_mb": 64, "device_mb_s": 980, "steady_mb_s": 50,
    "aggressive_mb_s": 192, "flush_bandwidth_mb_s": 380, "k": 2, "put_kb": 4,
    "ramp_at_s": 20, "flush_time_ms": 673,
    # Table 4, write buffer: δ -> (reserved %, additional p99 ms; "<1" for δ = 0).
    "table4": {"0": [12.5, "<1"], "200": [9.4, 161], "350": [6.3, 332], "500": [3.1, 494],
               "inf": [0.0, 596]},
}

# Times per mode: when the ramp-up tenants come back and how long a run lasts (s).
TIMES = {"full": (20.0, 35.0), "quick": (8.0, 14.0), "smoke": (2.5, 4.0)}


def scaled_setup(scale, aggressive_factor):
    """The paper's setup divided by `scale`: bytes and bandwidths shrink alike, so every
    time (flush time, δ) stays the paper's."""
    p = PAPER
    s = {
        "scale": scale,
        "capacity": int(p["buffer_mb"] * MIB / scale),
        "segment": int(p["segment_mb"] * MIB / scale),
        "fair_share": int(p["fair_share_mb"] * MIB / scale),
        "device_bytes_s": p["device_mb_s"] * MIB / scale,
        "steady_mib_s": p["steady_mb_s"] / scale,
        "aggressive_mib_s": p["aggressive_mb_s"] / scale * aggressive_factor,
        "aggressive_factor": aggressive_factor,
        "flush_bandwidth": int(round(p["flush_bandwidth_mb_s"] * MIB / scale)),
        "k": p["k"], "tenants": p["tenants"], "steady": p["steady"],
        "aggressive": p["aggressive"], "ramp": p["ramp"], "value_size": 4096,
    }
    # The worst case: the k ramp-up tenants' fair shares, flushed by what the steady
    # writers leave of the device.
    d = s["k"] * s["fair_share"]
    s["flush_time_ms"] = 1e3 * d / s["flush_bandwidth"]
    return s


def tenants(s):
    return [{"name": f"t{i:02d}", "weight": 1, "id": i} for i in range(1, s["tenants"] + 1)]


def policy(s, delta, interval_ms, rounding):
    return {"policy": "delta-fair", "interval_ms": interval_ms,
            "config": {"k": s["k"], "tenants": tenants(s),
                       "write_buffer": {"capacity": s["capacity"], "segment": s["segment"],
                                        "flush_bandwidth": s["flush_bandwidth"],
                                        "delta_ms": delta if delta == "inf" else int(delta),
                                        "object": "write_buffer", "rounding": rounding}}}


def rules(s, reserved):
    """The stage: flush writes through a fair queue by tenant at the scaled device's
    bandwidth (the device stand-in, in every configuration); with `reserved` not None,
    the tenants' puts (the gate's foreground writes) through the write-buffer pool."""
    r = [{"rule": "differentiate", "classifiers": ["origin", "operation"]},
         {"rule": "create_channel", "channel": "device",
          "match": {"origin": "flush", "operation": "write"}},
         {"rule": "create_object", "channel": "device", "object": "device", "type": "fq",
          "config": {"capacity": {"write_bytes": int(s["device_bytes_s"])}, "burst_us": 5000,
                     "flow_by": "tenant"}}]
    if reserved is not None:
        r += [{"rule": "create_channel", "channel": "buffer",
               "match": {"origin": "foreground", "operation": "write"}},
              {"rule": "create_object", "channel": "buffer", "object": "write_buffer",
               "type": "buffer-pool",
               "config": {"capacity": s["capacity"], "reserved": reserved, "flow_by": "tenant",
                          "weights": {str(t["id"]): 1 for t in tenants(s)}}}]
    return {"version": 1, "rules": r}


def check_policy(sluice, path, member="write_buffer", prog="run.py"):
    """`sluice policy check --json` on the document: its reservation for `member`
    ("write_buffer" or "cache"). The policy is the single source of the arithmetic: a
    sluice without `policy check` is an error."""
    if not os.access(sluice, os.X_OK):
        raise SystemExit(f"{prog}: {sluice} not built (ninja -C BUILD sluice): the "
                         "reservations come from `sluice policy check`")
    has_check = any(line.split()[:1] == ["check"] for line in subprocess.run(
        [sluice, "policy", "--help"], capture_output=True, text=True).stdout.splitlines())
    if not has_check:
        raise SystemExit(f"{prog}: {sluice} has no `policy check` command: build a sluice "
                         "with the delta-fair policy (the reservations come from it)")
    p = subprocess.run([sluice, "policy", "check", path, "--json"], capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise SystemExit(f"{prog}: sluice policy check {path}: {p.stderr.strip()}")
    try:
        res = json.loads(p.stdout)["reservations"][member]
    except (ValueError, KeyError) as e:
        raise SystemExit(f"{prog}: sluice policy check {path}: no reservations.{member} in its "
                         f"output ({e}): this sluice's delta-fair policy lacks it")
    res["source"] = "sluice policy check"
    return res


def run_one(args, params, config, rep, tmp, procs):
    s = params["scaled"]
    cdir = os.path.join(args.out, "raw", config)
    run_dir = os.path.join(args.out, "raw", f"{config}-r{rep}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    gated = config != "plain"
    cmd = [args.node_bin, "--db", os.path.join(tmp, "db"), "--setup",
           "gated" if gated else "plain", "--rules", os.path.join(cdir, "rules.json"),
           "--out", os.path.join(run_dir, "node.jsonl"), "--tag", f"{config}-r{rep}",
           "--stage", f"delta-fair-{config}",
           "--steady", str(s["steady"]), "--aggressive", str(s["aggressive"]),
           "--ramp", str(s["ramp"]), "--steady-mib", repr(s["steady_mib_s"]),
           "--aggressive-mib", repr(s["aggressive_mib_s"]),
           "--ramp-at-s", repr(params["ramp_at_s"]),
           "--ramp-batch-mib", repr(s["fair_share"] / MIB),
           "--duration-s", repr(params["duration_s"]), "--value-size", str(s["value_size"]),
           "--buffer-mib", repr(s["capacity"] / MIB), "--memtable-mib", repr(s["segment"] / MIB),
           "--bin-ms", str(params["bin_ms"]), "--seed", str(rep)]
    sock = os.path.join(tmp, "sluice.sock")
    if gated and not args.no_daemon:
        start_daemon(procs, args.sluice, sock, run_dir, args.interval_ms, 5,
                     policy=os.path.join(cdir, "policy.json"))
        cmd += ["--socket", sock]
    with open(os.path.join(run_dir, "node.log"), "w") as nlog:
        node = procs.start(cmd, subprocess.DEVNULL, nlog)
    rc = wait_or_kill(node, params["duration_s"] + 120)
    procs.kill_all()
    shutil.rmtree(os.path.join(tmp, "db"), ignore_errors=True)
    if rc != 0:
        with open(os.path.join(run_dir, "node.log")) as f:
            sys.stderr.write(f"--- node.log ---\n{f.read()[-2000:]}")
        raise SystemExit(f"run.py: {config} r{rep}: the node failed (exit {rc}; see {run_dir})")


def main():
    ap = driver_parser(["full", "quick", "smoke"], __doc__)
    ap.add_argument("--scale", type=float, default=32)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--configs", "--setups", dest="configs", default=" ".join(CONFIGS))
    ap.add_argument("--aggressive-factor", type=float, default=2.0,
                    help="the aggressive writers' demand as a multiple of the paper's")
    ap.add_argument("--rounding", choices=["nearest", "strict"], default="nearest")
    ap.add_argument("--interval-ms", type=int, default=250)
    ap.add_argument("--bin-ms", type=int, default=250)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    ap.add_argument("--sluice", default=None)
    ap.add_argument("--node-bin", default=None)
    ap.add_argument("--no-daemon", action="store_true",
                    help="gated runs without `sluice serve`: the pool keeps the reservation "
                         "`sluice policy check` derived (rules.json)")
    args = ap.parse_args()
    configs = args.configs.split()
    for c in configs:
        if c not in CONFIGS:
            raise SystemExit(f"run.py: --configs: unknown configuration {c!r} "
                             f"(expected {', '.join(CONFIGS)})")
    if not 1 <= args.scale <= 1024:
        raise SystemExit(f"run.py: --scale must be 1..1024, got {args.scale}")
    if not 0.5 <= args.aggressive_factor <= 16:
        raise SystemExit(f"run.py: --aggressive-factor must be 0.5..16, got "
                         f"{args.aggressive_factor}")
    if args.reps is None:
        args.reps = {"full": 3, "quick": 2}.get(args.mode, 1)
    if args.reps < 1:
        raise SystemExit(f"run.py: --reps must be >= 1, got {args.reps}")
    args.sluice = args.sluice or os.path.join(args.build, "control-plane", "sluice")
    args.node_bin = args.node_bin or os.path.join(args.build, "examples", "delta-fair",
                                                  "sluice-delta-fair-node")
    if not args.plan_only:
        for b in (args.node_bin,) + ((args.sluice,) if not args.no_daemon else ()):
            if not os.access(b, os.X_OK):
                raise SystemExit(f"run.py: {b} not built (ninja -C {args.build} sluice "
                                 f"sluice-delta-fair-node)")
    s = scaled_setup(args.scale, args.aggressive_factor)
    ramp_at, duration = TIMES[args.mode]
    params = {"mode": args.mode, "command": args.command, "configs": configs,
              "reps": args.reps, "paper": PAPER, "scaled": s, "ramp_at_s": ramp_at,
              "duration_s": duration, "bin_ms": args.bin_ms, "rounding": args.rounding,
              "interval_ms": args.interval_ms, "daemon": not args.no_daemon,
              "reservations": {}}
    raw = os.path.join(args.out, "raw")
    os.makedirs(raw, exist_ok=True)
    for config in configs:
        cdir = os.path.join(raw, config)
        os.makedirs(cdir, exist_ok=True)
        if config == "plain":
            write_json(os.path.join(cdir, "rules.json"), rules(s, None))
            continue
        delta = config.split("-", 1)[1]
        ppath = os.path.join(cdir, "policy.json")
        write_json(ppath, policy(s, delta, args.interval_ms, args.rounding))
        wb = check_policy(args.sluice, ppath)
        write_json(os.path.join(cdir, "check.json"), wb)
        params["reservations"][config] = wb
        write_json(os.path.join(cdir, "rules.json"), rules(s, int(wb["reserved_bytes"])))
        log(f"{config}: reserved {wb['reserved_bytes'] / MIB:.1f} MiB "
            f"({100 * wb['reserved_fraction']:.1f}% of {s['capacity'] / MIB:.0f} MiB; "
            f"{wb['source']})")
    write_json(os.path.join(args.out, "params.json"), params)
    if args.plan_only:
        return
    with run_scope(prefix="sluice-df.", dir=args.dir) as (procs, tmp):
        # Repetition-major, so that a slow drift of a shared machine spreads over every
        # configuration.
        for rep in range(1, args.reps + 1):
            for config in configs:
                log(f"{config} r{rep} ({duration:g} s)")
                run_one(args, params, config, rep, tmp, procs)


if __name__ == "__main__":
    main()
