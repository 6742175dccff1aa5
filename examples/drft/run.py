#!/usr/bin/env python3
"""The driver of examples/drft (run.sh calls it): DRFT's fairness experiments (PVLDB 2025,
§7.3 and §7.5) on Sluice, scaled to one small machine. For every case it plans, it runs
sluice-drft-node once per setup (fifo, drft-0, drft-delta) and per (workload, database)
pair the mode gives the case.

usage: run.py --build DIR --out DIR [--mode full|quick|smoke] [--setups "..."]
              [--cases "..."] [--dir DIR] [--node-bin PATH] [--plan-only]

Writes OUT/params.json (the paper's setup, the scaled one, every run planned) and per run
OUT/raw/<run>/plan.json, run.jsonl and node.log. README.md explains the scaling.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import driver_parser, log, run_scope, write_json  # noqa: E402

SETUPS = ["fifo", "drft-0", "drft-delta"]
CASES = ["isolation", "weighted", "bursty", "strategy-proof", "utilisation", "overhead"]
PAIRS = [("ycsb", "pessimistic"), ("ycsb", "optimistic"),
         ("smallbank", "pessimistic"), ("smallbank", "optimistic")]

# DRFT §7.1 and §7.3 (the paper's numbers, for params.json and the README's table).
PAPER = {
    "machine": "c5ad.16xlarge, 64 vCPUs; clients on a separate instance",
    "rocksdb": "8.5", "runs": "3 x 90 s after 30 s warm-up", "delta_ms": 100,
    "smallbank_accounts": 1_000_000, "ycsb_objects": 1_000_000, "ycsb_ops_per_txn": 16,
    "zipf_theta": 0.9, "isolation_clients": 16, "weighted_clients": 2, "bursty_clients": 3,
    "bursty_joins_s": [15, 30], "utilisation_clients": 2, "utilisation_leave_s": 45,
}

# Per mode: run length (s), bin (ms), warm-up left out of the measures (s), and the
# (workload, db) pairs each case runs on. Quick keeps the whole run under 5 minutes on a
# 2-core machine: every case once per setup on one pair (isolation on two), each pair
# used by some case.
MODES = {
    "full": {"duration_s": 20, "bin_ms": 500, "warmup_s": 2, "keys": 100_000,
             "pairs": {c: PAIRS for c in CASES}, "isolation_64": PAIRS},
    "quick": {"duration_s": 6, "bin_ms": 250, "warmup_s": 1, "keys": 20_000,
              "pairs": {"isolation": [("ycsb", "pessimistic"), ("smallbank", "optimistic")],
                        "weighted": [("ycsb", "optimistic")],
                        "bursty": [("smallbank", "pessimistic")],
                        "strategy-proof": [("ycsb", "pessimistic")],
                        "utilisation": [("smallbank", "pessimistic")],
                        "overhead": [("ycsb", "pessimistic")]},
              "isolation_64": [("ycsb", "pessimistic")]},
    "smoke": {"duration_s": 1.0, "bin_ms": 100, "warmup_s": 0.2, "keys": 2_000,
              "pairs": {"isolation": [("ycsb", "pessimistic")],
                        "weighted": [("smallbank", "optimistic")],
                        "bursty": [("smallbank", "pessimistic")],
                        "strategy-proof": [("ycsb", "optimistic")],
                        "utilisation": [("ycsb", "pessimistic")],
                        "overhead": [("ycsb", "pessimistic")]},
              "isolation_64": []},
}

SLOTS = 4            # transactions admitted at once: the database's worker threads
OP_DELAY_US = 200    # a pause after every access, holding what it accessed
DELTA_US = 10_000    # drft-delta's Δ: 10 ms of item usage
HOT_KEYS = 4


def scheduler(setup, weights=None):
    cfg = {"slots": SLOTS}
    if setup == "fifo":
        cfg["policy"] = "fifo"
    else:
        cfg["policy"] = "drft"
        cfg["delta_us"] = 0 if setup == "drft-0" else DELTA_US
    if weights:
        cfg["weights"] = {str(k): v for k, v in weights.items()}
    return cfg


def workload(name, keys):
    if name == "ycsb":
        return {"workload": "ycsb", "keys": keys, "hot_keys": HOT_KEYS, "items_per_txn": 4,
                "hot_per_txn": 1, "write_frac": 0.2}
    return {"workload": "smallbank", "keys": keys, "hot_keys": HOT_KEYS, "hot_prob": 0.9}


def case_runs(case, m):
    """The case's variants: (variant, tenants, weights, duration, extra plan fields,
    what the analysis needs to know)."""
    d = m["duration_s"]
    if case == "isolation":
        # Half the tenants (odd ids) send twice the transactions: two clients each.
        def tenants(n):
            return [{"id": i, "clients": 2 if i % 2 else 1} for i in range(1, n + 1)]
        out = [("", tenants(16), None, d, {}, {"heavy": list(range(1, 17, 2))}, "pairs")]
        # 64 tenants: each has a quarter of the transactions, so the run is 1.5 times as
        # long for a comparable count.
        out.append(("64-tenants", tenants(64), None, d * 1.5, {},
                    {"heavy": list(range(1, 65, 2))}, "isolation_64"))
        return out
    if case == "weighted":
        return [("", [{"id": 1, "clients": 8}, {"id": 2, "clients": 8}], {1: 2}, d, {},
                 {"weights": {"1": 2, "2": 1}}, "pairs")]
    if case == "bursty":
        # C1 alone, then C2 and C3 join (each with half C1's clients, enough to keep
        # transactions waiting for admission when it has its share).
        dd = d * 1.5
        joins = [round(dd / 3, 3), round(2 * dd / 3, 3)]
        return [("", [{"id": 1, "clients": 8}, {"id": 2, "clients": 4, "start_s": joins[0]},
                      {"id": 3, "clients": 4, "start_s": joins[1]}], None, dd, {},
                 {"joins": {"2": joins[0], "3": joins[1]}}, "pairs")]
    if case == "strategy-proof":
        honest = [{"id": i, "clients": 3} for i in range(2, 5)]
        return [("txns", [{"id": 1, "clients": 6}] + honest, None, d, {},
                 {"inflator": 1, "inflates": "twice the transactions"}, "pairs"),
                ("items", [{"id": 1, "clients": 3, "extra_items": 1}] + honest, None, d, {},
                 {"inflator": 1, "inflates": "one extraneous hot item per transaction"},
                 "pairs")]
    if case == "utilisation":
        dd = d * 4 / 3
        leave = round(dd / 2, 3)
        return [("", [{"id": 1, "clients": 8}, {"id": 2, "clients": 8, "stop_s": leave}],
                 None, dd, {}, {"leave_s": leave}, "pairs")]
    if case == "overhead":
        equal = [{"id": i, "clients": 1} for i in range(1, 9)]
        # Low contention: no hot item, no pause (CPU-bound, the scheduler's own cost
        # shows); high: one hot item of two in every transaction.
        return [("low", equal, None, d, {"hot_per_txn": 0, "op_delay_us": 0}, {}, "pairs"),
                ("high", equal, None, d, {"hot_keys": 2}, {}, "pairs")]
    raise ValueError(case)


def plan(args, m):
    runs = []
    for case in args.cases:
        for variant, tenants, weights, dur, extra, info, pairs_key in case_runs(case, m):
            pairs = m["pairs"].get(case, []) if pairs_key == "pairs" else m[pairs_key]
            for wl, db in pairs:
                if case == "overhead" and wl != "ycsb":
                    continue
                for setup in args.setups:
                    name = "-".join(x for x in (case, variant, wl, db, setup) if x)
                    p = {"db": db, "duration_s": dur, "bin_ms": m["bin_ms"],
                         "op_delay_us": OP_DELAY_US, "lock_timeout_ms": 1000,
                         "value_bytes": 100, "seed": 1, "tenants": tenants,
                         "scheduler": scheduler(setup, weights)}
                    p.update(workload(wl, m["keys"]))
                    p.update(extra)
                    runs.append({"run": name, "case": case, "variant": variant,
                                 "workload": wl, "db": db, "setup": setup,
                                 "warmup_s": m["warmup_s"], "info": info, "plan": p})
    return runs


def main():
    ap = driver_parser(MODES, __doc__)
    ap.add_argument("--setups", default=" ".join(SETUPS))
    ap.add_argument("--cases", default=" ".join(CASES))
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    ap.add_argument("--node-bin", default=None)
    args = ap.parse_args()
    args.setups = args.setups.split()
    args.cases = args.cases.split()
    for s in args.setups:
        if s not in SETUPS:
            sys.exit(f"run.py: --setups: unknown setup '{s}' (expected {' '.join(SETUPS)})")
    for c in args.cases:
        if c not in CASES:
            sys.exit(f"run.py: --cases: unknown case '{c}' (expected {' '.join(CASES)})")
    node = args.node_bin or os.path.join(args.build, "examples", "drft", "sluice-drft-node")
    m = MODES[args.mode]
    runs = plan(args, m)
    params = {"mode": args.mode, "command": args.command, "paper": PAPER,
              "scaled": {"slots": SLOTS, "op_delay_us": OP_DELAY_US, "delta_us": DELTA_US,
                         "hot_keys": HOT_KEYS, "keys": m["keys"],
                         "duration_s": m["duration_s"], "bin_ms": m["bin_ms"],
                         "warmup_s": m["warmup_s"]},
              "setups": args.setups, "runs": runs}
    os.makedirs(os.path.join(args.out, "raw"), exist_ok=True)
    write_json(os.path.join(args.out, "params.json"), params)
    if args.plan_only:
        return
    if not os.access(node, os.X_OK):
        sys.exit(f"run.py: {node} is not built (ninja -C BUILD sluice-drft-node)")
    with run_scope("drft-", dir=args.dir) as (procs, tmp):
        for i, r in enumerate(runs, 1):
            raw = os.path.join(args.out, "raw", r["run"])
            os.makedirs(raw, exist_ok=True)
            p = dict(r["plan"], dir=os.path.join(tmp, "db"))
            write_json(os.path.join(raw, "plan.json"), p)
            log(f"[{i}/{len(runs)}] {r['run']} ({p['duration_s']} s)")
            with open(os.path.join(raw, "node.log"), "w") as err:
                proc = procs.start([node, "--plan", os.path.join(raw, "plan.json"),
                                    "--out", os.path.join(raw, "run.jsonl")],
                                   subprocess.DEVNULL, err)
                rc = proc.wait()
            if rc != 0:
                with open(os.path.join(raw, "node.log")) as f:
                    sys.exit(f"run.py: {r['run']} failed ({rc}): {f.read()[-2000:]}")


if __name__ == "__main__":
    main()
