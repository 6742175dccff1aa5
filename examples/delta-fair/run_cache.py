#!/usr/bin/env python3
"""The driver of examples/delta-fair's read-cache experiments (run.sh calls it):
`cache` (FairDB §7.2.2, Table 4's cache row, Table 6) and `composition` (§7.3, Table 5),
scaled by --scale. Plans the runs, writes each configuration's stage rules and delta-fair
policy document, asks `sluice policy check --json` what the policy reserves, and runs
sluice-delta-fair-cache-node once per (configuration, repetition), the tenant-cache ones
under `sluice serve --policy` (the daemon sets the cache's thresholds, and the buffer
pool's reservation in `composition`).

usage: run_cache.py --experiment cache|composition --build DIR --out DIR
                    [--mode full|quick|smoke] [--scale F] [--reps R] [--configs "..."]
                    [--interval-ms MS] [--dir DIR] [--sluice PATH] [--node-bin PATH]
                    [--no-daemon] [--plan-only]

Writes OUT/params.json and, per configuration, OUT/raw/<config>/rules.json, policy.json
and check.json, and per run OUT/raw/<config>-r<rep>/node.jsonl, node.log, daemon.log
and policy.jsonl. README.md explains the scaling.
"""
import json
import os
import shutil
import subprocess
import sys
import time

from run import check_policy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import driver_parser, log, run_scope, start_daemon, write_json  # noqa: E402

MIB = 1024 * 1024
PROG = "run_cache.py"

# FairDB §7.2.2, §7.3 and Tables 4-6 (MB as the paper writes them; scaled as MiB).
PAPER = {
    "cache_mb": 10240, "tenants": 32, "steady": 30, "aggressive": 2, "ramp": 1,
    "fair_share_mb": 320, "steady_mb_s": 50, "aggressive_mb_s": 1400,
    "aggressive_ws_factor": 4, "device_read_mb_s": 1280, "refill_mb_s": 320, "record_kb": 4,
    "offline_at_s": 10, "ramp_at_s": 20, "refill_time_ms": 1000,
    # Table 4, read cache: δ -> (additional p99 ms, system throughput GB/s).
    "table4": {"0": ["<1", 3.10], "250": [236, 3.36], "500": [484, 3.64], "750": [729, 3.82],
               "inf": [977, 3.92]},
    # Table 6 (δ = 750 ms): k -> (reserved % of f, p99 ms, throughput GB/s).
    "table6": {"1": [25, 729, 3.82], "2": [62.5, 739, 3.53], "3": [75, 741, 3.41],
               "4": [81.25, 726, 3.29], "5": [85, 734, 3.18], "6": [87.5, 732, 3.10]},
    # §7.3: the write buffer beside the cache; Table 5: (δ_buffer, δ_cache) -> p99 ms.
    "buffer_mb": 4096, "buffer_fair_share_mb": 128, "aggressive_write_mb_s": 192,
    "table5": {"200/250": 425, "200/500": 684, "200/750": 925, "350/250": 582,
               "350/500": 831, "350/750": 1040, "500/250": 741, "500/500": 983,
               "500/750": 1154},
}

CACHE_DELTAS = ["0", "250", "500", "750", "inf"]
CACHE_CONFIGS = ([f"delta-{d}" for d in CACHE_DELTAS] + ["static", "lru"]
                 + [f"k{k}" for k in range(2, 7)])
GRID = [(b, c) for b in (200, 350, 500) for c in (250, 500, 750)]
COMPOSITION_CONFIGS = [f"b{b}-c{c}" for b, c in GRID]
DEFAULT_CONFIGS = {
    "cache": {"full": CACHE_CONFIGS,
              "quick": [f"delta-{d}" for d in CACHE_DELTAS] + ["static", "lru", "k2", "k4",
                                                                "k6"],
              "smoke": ["delta-250", "delta-inf", "lru"]},
    "composition": {"full": COMPOSITION_CONFIGS, "quick": COMPOSITION_CONFIGS,
                    "smoke": ["b350-c250"]},
}

# (offline at, ramp at, duration) in s per experiment and mode.
TIMES = {"cache": {"full": (10.0, 20.0, 30.0), "quick": (1.5, 6.0, 9.0),
                   "smoke": (0.5, 2.0, 3.0)},
         "composition": {"full": (10.0, 20.0, 30.0), "quick": (1.5, 9.0, 12.0),
                         "smoke": (0.5, 2.5, 3.5)}}


def scaled_setup(scale):
    """The paper's setup divided by `scale` (bytes and bandwidths alike: every time stays
    the paper's), with the deviations README.md explains."""
    p = PAPER
    s = {
        "scale": scale, "tenants": p["tenants"], "aggressive": p["aggressive"],
        "capacity": int(p["cache_mb"] * MIB / scale),
        "fair_share": int(p["fair_share_mb"] * MIB / scale),
        "steady_mib_s": p["steady_mb_s"] / scale,
        "aggressive_mib_s": p["aggressive_mb_s"] / scale,
        # Uniform reads over 16x (not 4x) the fair share: with 4x an aggressive reader's
        # whole working set fits once LRU has taken the steady readers' cold blocks, and
        # the device would no longer be saturated (see README.md).
        "aggressive_ws_factor": 16,
        # The device is a fair queue by tenant at the paper's read bandwidth. R_read / AMP
        # is what one returning reader refills at, the paper's 320 MB/s: a third of the
        # device while both aggressive readers are backlogged, less what the steady
        # readers' misses take. AMP is 1 here (a record is a block of its own; index
        # blocks stay in the table readers).
        "device_read_bps": int(round(p["device_read_mb_s"] * MIB / scale)),
        "refill_bandwidth": int(round(p["refill_mb_s"] * MIB / scale)),
        "read_amplification": 1,
        "value_size": 4000,
        "buffer_capacity": int(p["buffer_mb"] * MIB / scale),
        "buffer_fair_share": int(p["buffer_fair_share_mb"] * MIB / scale),
        # 8 segments per fair share (the paper's 64 MB pages would give 2, too coarse for
        # three δ_buffer values to differ).
        "segment": int(p["buffer_fair_share_mb"] * MIB / scale / 8),
        # The flush bandwidth the aggressive writers' memtables drain at: the buffer fair
        # share in 673 ms, §7.2.1's worst case.
        "flush_bandwidth": int(round(p["buffer_fair_share_mb"] * MIB / scale / 0.673)),
        # 2x the paper's 192 MB/s each (as in experiment `buffer`), so that the buffer is
        # full by the ramp.
        "aggressive_write_mib_s": 2 * p["aggressive_write_mb_s"] / scale,
    }
    s["refill_time_ms"] = 1e3 * s["fair_share"] / s["refill_bandwidth"]
    s["flush_time_ms"] = 1e3 * s["buffer_fair_share"] / s["flush_bandwidth"]
    return s


def tenants(s):
    return [{"name": f"t{i:02d}", "weight": 1, "id": i} for i in range(1, s["tenants"] + 1)]


def config_kind(config):
    """(kind, δ_cache, k, δ_buffer) of a configuration's name."""
    if config.startswith("delta-"):
        return "delta", config.split("-", 1)[1], 1, None
    if config.startswith("k"):
        return "delta", "750", int(config[1:]), None
    if config.startswith("b"):
        b, c = config[1:].split("-c")
        return "delta", c, 1, b
    return config, None, 1, None


def ms(d):
    return d if d == "inf" else int(d)


def policy(s, delta, k, delta_buffer, interval_ms):
    cfg = {"k": k, "tenants": tenants(s),
           "cache": {"capacity": s["capacity"], "refill_bandwidth": s["refill_bandwidth"],
                     "read_amplification": s["read_amplification"], "delta_ms": ms(delta),
                     "object": "read_cache"}}
    if delta_buffer is not None:
        cfg["write_buffer"] = {"capacity": s["buffer_capacity"], "segment": s["segment"],
                               "flush_bandwidth": s["flush_bandwidth"],
                               "delta_ms": ms(delta_buffer), "object": "write_buffer",
                               "rounding": "strict"}
    return {"policy": "delta-fair", "interval_ms": interval_ms, "config": cfg}


def rules(s, reserved, buffer_reserved, gated):
    """The stage: foreground reads (the misses) through a fair queue by tenant (the
    device); a channel holding the cache-reserve object the tenant cache consults; gated,
    flush writes through a fair queue and the tenants' puts through the write-buffer
    pool."""
    r = [{"rule": "differentiate", "classifiers": ["origin", "operation"]},
         {"rule": "create_channel", "channel": "device",
          "match": {"origin": "foreground", "operation": "read"}},
         {"rule": "create_object", "channel": "device", "object": "device", "type": "fq",
          "config": {"capacity": {"read_bytes": s["device_read_bps"]}, "burst_us": 5000,
                     "flow_by": "tenant"}},
         {"rule": "create_channel", "channel": "cache"},
         {"rule": "create_object", "channel": "cache", "object": "read_cache",
          "type": "cache-reserve",
          "config": {"capacity": s["capacity"], "reserved": reserved or {},
                     "weights": {str(t["id"]): 1 for t in tenants(s)}}}]
    if gated:
        r += [{"rule": "create_channel", "channel": "flush",
               "match": {"origin": "flush", "operation": "write"}},
              {"rule": "create_object", "channel": "flush", "object": "flush_device",
               "type": "fq", "config": {"capacity": {"write_bytes": s["flush_bandwidth"]},
                                        "burst_us": 5000, "flow_by": "tenant"}},
              {"rule": "create_channel", "channel": "buffer",
               "match": {"origin": "foreground", "operation": "write"}},
              {"rule": "create_object", "channel": "buffer", "object": "write_buffer",
               "type": "buffer-pool",
               "config": {"capacity": s["buffer_capacity"], "reserved": buffer_reserved,
                          "flow_by": "tenant",
                          "weights": {str(t["id"]): 1 for t in tenants(s)}}}]
    return {"version": 1, "rules": r}


def run_one(args, params, config, rep, tmp, procs):
    s = params["scaled"]
    kind, _, k, delta_buffer = config_kind(config)
    gated = delta_buffer is not None
    cdir = os.path.join(args.out, "raw", config)
    run_dir = os.path.join(args.out, "raw", f"{config}-r{rep}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    offline, ramp, duration = params["times"]
    cmd = [args.node_bin, "--db", os.path.join(tmp, "db"),
           "--cache", "tenant" if kind == "delta" else kind,
           "--setup", "gated" if gated else "plain",
           "--rules", os.path.join(cdir, "rules.json"),
           "--out", os.path.join(run_dir, "node.jsonl"), "--tag", f"{config}-r{rep}",
           "--stage", f"delta-fair-{config}",
           "--steady", str(PAPER["steady"] - k), "--aggressive", str(s["aggressive"]),
           "--ramp", str(k), "--cache-mib", repr(s["capacity"] / MIB),
           "--ws-mib", repr(s["fair_share"] / MIB),
           "--agg-ws-factor", repr(s["aggressive_ws_factor"]),
           "--steady-mib", repr(s["steady_mib_s"]), "--agg-mib", repr(s["aggressive_mib_s"]),
           "--offline-at-s", repr(offline), "--ramp-at-s", repr(ramp),
           "--duration-s", repr(duration), "--device-read-bps", repr(s["device_read_bps"]),
           "--value-size", str(s["value_size"]), "--bin-ms", str(params["bin_ms"]),
           "--seed", str(rep)]
    if gated:
        cmd += ["--device-write-bps", repr(s["flush_bandwidth"]),
                "--memtable-mib", repr(s["segment"] / MIB),
                "--buffer-mib", repr(s["buffer_capacity"] / MIB),
                "--agg-write-mib", repr(s["aggressive_write_mib_s"]),
                "--ramp-write-mib", repr(s["buffer_fair_share"] / MIB)]
    sock = os.path.join(tmp, "sluice.sock")
    if kind == "delta" and not args.no_daemon:
        start_daemon(procs, args.sluice, sock, run_dir, args.interval_ms, 5,
                     policy=os.path.join(cdir, "policy.json"), prog=PROG)
        cmd += ["--socket", sock]
    with open(os.path.join(run_dir, "node.log"), "w") as nlog:
        node = procs.start(cmd, subprocess.DEVNULL, nlog)
    # The node's whole run, and at most 15 s of shutdown once it wrote its end line.
    deadline, ended = time.time() + duration + 120, None
    while True:
        try:
            rc = node.wait(timeout=1)
            break
        except subprocess.TimeoutExpired:
            if ended is None and finished(os.path.join(run_dir, "node.jsonl")):
                ended = time.time()
            if time.time() > deadline or (ended is not None and time.time() > ended + 15):
                node.kill()
                rc = node.wait()
                break
    procs.kill_all()
    shutil.rmtree(os.path.join(tmp, "db"), ignore_errors=True)
    if rc != 0 and finished(os.path.join(run_dir, "node.jsonl")):
        # The run's results are whole; its shutdown failed. Kept, and said in summary.md.
        with open(os.path.join(run_dir, "shutdown-failed"), "w") as f:
            f.write(f"exit {rc} after the end line\n")
        log(f"{config} r{rep}: the node wrote its results but its shutdown failed (exit {rc}); "
            "kept")
        return
    if rc != 0:
        with open(os.path.join(run_dir, "node.log")) as f:
            sys.stderr.write(f"--- node.log ---\n{f.read()[-2000:]}")
        raise SystemExit(f"{PROG}: {config} r{rep}: the node failed (exit {rc}; see {run_dir})")


def finished(path):
    """Whether the node's output ends with its end line."""
    try:
        with open(path) as f:
            last = [x for x in f if x.strip()][-1]
        return json.loads(last).get("type") == "end"
    except (OSError, IndexError, ValueError):
        return False


def plan(args, params, config):
    """Writes the configuration's policy document, asks `sluice policy check` for its
    reservations and writes the rules with them."""
    s = params["scaled"]
    kind, delta, k, delta_buffer = config_kind(config)
    cdir = os.path.join(args.out, "raw", config)
    os.makedirs(cdir, exist_ok=True)
    gated = delta_buffer is not None
    if kind != "delta":
        write_json(os.path.join(cdir, "rules.json"), rules(s, None, 0, gated))
        return
    ppath = os.path.join(cdir, "policy.json")
    write_json(ppath, policy(s, delta, k, delta_buffer, args.interval_ms))
    res = {"cache": check_policy(args.sluice, ppath, "cache", PROG)}
    if gated:
        res["write_buffer"] = check_policy(args.sluice, ppath, "write_buffer", PROG)
    write_json(os.path.join(cdir, "check.json"), res)
    params["reservations"][config] = res
    names = {t["name"]: t["id"] for t in tenants(s)}
    reserved = {str(names[n]): int(b) for n, b in res["cache"]["per_tenant_bytes"].items()}
    wb = int(res["write_buffer"]["reserved_bytes"]) if gated else 0
    write_json(os.path.join(cdir, "rules.json"), rules(s, reserved, wb, gated))
    c = res["cache"]
    log(f"{config}: cache reserved {c['reserved_bytes'] / MIB:.1f} MiB "
        f"({100 * c['reserved_fraction']:.2f}% of {s['capacity'] / MIB:.0f} MiB), k {k}"
        + (f"; buffer reserved {wb / MIB:.2f} MiB" if gated else ""))


def main():
    ap = driver_parser(["full", "quick", "smoke"], __doc__)
    ap.add_argument("--experiment", choices=["cache", "composition"], required=True)
    ap.add_argument("--scale", type=float, default=64)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--configs", "--setups", dest="configs", default=None)
    ap.add_argument("--interval-ms", type=int, default=250)
    ap.add_argument("--bin-ms", type=int, default=250)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    ap.add_argument("--sluice", default=None)
    ap.add_argument("--node-bin", default=None)
    ap.add_argument("--no-daemon", action="store_true",
                    help="tenant-cache runs without `sluice serve`: the cache keeps the "
                         "thresholds `sluice policy check` derived (rules.json)")
    args = ap.parse_args()
    known = CACHE_CONFIGS if args.experiment == "cache" else COMPOSITION_CONFIGS
    configs = (args.configs.split() if args.configs
               else DEFAULT_CONFIGS[args.experiment][args.mode])
    for c in configs:
        if c not in known:
            raise SystemExit(f"{PROG}: --configs: unknown configuration {c!r} for experiment "
                             f"{args.experiment} (expected {', '.join(known)})")
    if not 8 <= args.scale <= 1024:
        raise SystemExit(f"{PROG}: --scale must be 8..1024, got {args.scale}")
    if args.reps is None:
        args.reps = {"full": 2}.get(args.mode, 1)
    if args.reps < 1:
        raise SystemExit(f"{PROG}: --reps must be >= 1, got {args.reps}")
    args.sluice = args.sluice or os.path.join(args.build, "control-plane", "sluice")
    args.node_bin = args.node_bin or os.path.join(args.build, "examples", "delta-fair",
                                                  "sluice-delta-fair-cache-node")
    if not args.plan_only and not os.access(args.node_bin, os.X_OK):
        raise SystemExit(f"{PROG}: {args.node_bin} not built (ninja -C {args.build} sluice "
                         "sluice-delta-fair-cache-node)")
    s = scaled_setup(args.scale)
    params = {"experiment": args.experiment, "mode": args.mode, "command": args.command,
              "configs": configs, "reps": args.reps, "paper": PAPER, "scaled": s,
              "times": TIMES[args.experiment][args.mode], "bin_ms": args.bin_ms,
              "interval_ms": args.interval_ms, "daemon": not args.no_daemon,
              "reservations": {}}
    os.makedirs(os.path.join(args.out, "raw"), exist_ok=True)
    for config in configs:
        plan(args, params, config)
    write_json(os.path.join(args.out, "params.json"), params)
    if args.plan_only:
        return
    with run_scope(prefix="sluice-dfc.", dir=args.dir) as (procs, tmp):
        for rep in range(1, args.reps + 1):
            for config in configs:
                log(f"{config} r{rep} ({params['times'][2]:g} s)")
                run_one(args, params, config, rep, tmp, procs)


if __name__ == "__main__":
    main()
