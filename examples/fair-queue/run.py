#!/usr/bin/env python3
"""The driver of examples/fair-queue (run.sh calls it): plans every case, writes each
configuration's rules and the pisces policy document, and runs N sluice-fq-node
processes per (case, configuration, repetition) with `sluice serve`.

usage: run.py --build DIR --out DIR [--mode full|quick|smoke] [--nodes N]
              [--capacity-mib M] [--cases "..."] [--configs "..."] [--reps R]
              [--interval-ms MS] [--method maxmin|mbf|reciprocal] [--max-swaps N] [--dir DIR]
              [--sluice PATH] [--node-bin PATH] [--plan-only]

Writes OUT/params.json, OUT/raw/<case>/plan.json (the tenants, their weights, the
phases, every flow's offered rate per phase, the fair shares and the models' figures),
OUT/raw/<case>/<config>/rules-node<K>.json, OUT/raw/<case>/policy.json and per run
OUT/raw/<case>/<config>-r<rep>/node<K>.jsonl (sluice-fq-node's output), node<K>.log,
daemon.log and, for pisces, policy.jsonl (the policy's report after every step).
README.md explains the cases, the configurations and the phases.
"""
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fairness  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import driver_parser, log, run_scope, start_daemon, write_json  # noqa: E402

CASES = ["equal", "weighted-1-2-3-4", "weighted-100-10-1", "tenants-100"]
CONFIGS = ["no-control", "static-drl", "fq-static-weights", "pisces"]
KIB = 1024
MIB = 1024 * 1024

# Tenants of each case: (weight, count) per class, and on how many nodes each tenant
# reads (None: all). Pisces §6.2 (8 tenants, equal weights), §6.3 (4:4:3:3:2:2:1:1;
# 4 x 100, 20 x 10, 40 x 1 on 4 of 8 nodes; 100 tenants on 6 of 20 nodes), scaled.
CASE_CLASSES = {
    "equal": [(1, 8)],
    "weighted-1-2-3-4": [(4, 2), (3, 2), (2, 2), (1, 2)],
    "weighted-100-10-1": [(100, 2), (10, 10), (1, 20)],
    "tenants-100": [(100, 6), (10, 31), (1, 63)],
}
# Zipf exponent of a "hot" tenant's demand over its nodes (a "flat" one spreads evenly).
HOT_SKEW = 2.0
# Offered demand as a multiple of a tenant's fair share: base, and a doubled tenant.
BASE_ALPHA = 1.5
DOUBLE_ALPHA = 3.0
# The `under` phase keeps every node's offered load at or below this share of its capacity.
UNDER_LOAD = 0.8

# Phases per mode: (name, seconds). `under`: every tenant below its share (both fair
# queuing and no control must carry all of it: the overhead); `base`: every tenant at
# 1.5x its fair share; `double`: half of them at 3x; `idle`: one of the doubled tenants
# stops; `back`: it returns.
TIMELINES = {
    "full": {"all": [("under", 5), ("base", 15), ("double", 15), ("idle", 10), ("back", 5)]},
    "quick": {"equal": [("under", 2), ("base", 5), ("double", 5), ("idle", 10), ("back", 3)],
              "other": [("base", 5), ("double", 5)]},
    "smoke": {"equal": [("under", 0.6), ("base", 1), ("double", 1), ("idle", 0.6), ("back", 0.6)],
              "other": [("base", 1), ("double", 1)]},
}
# The share of a phase, at its end, over which it is measured (the policy converged).
MEASURE_TAIL = 0.4


def timeline(mode, case):
    t = TIMELINES[mode]
    return t.get("all") or t.get(case) or t["other"]


def request_size(case, weight):
    """Bytes per request: 32 KiB, or by weight class where weights span 100:1 (so that
    the lightest tenants still make enough requests to be measured)."""
    if case in ("weighted-100-10-1", "tenants-100"):
        return 64 * KIB if weight >= 100 else 32 * KIB if weight >= 10 else 16 * KIB
    return 32 * KIB


def zipf(k, s):
    z = [1.0 / (r + 1) ** s for r in range(k)]
    total = sum(z)
    return [x / total for x in z]


def plan_case(case, nodes, capacity, mode):
    """The case's tenants, phases and flows (see README.md, "Cases")."""
    classes = CASE_CLASSES[case]
    per_tenant_nodes = nodes if case in ("equal", "weighted-1-2-3-4") else max(
        2, nodes // 2 if case == "weighted-100-10-1" else round(nodes * 0.3))
    per_tenant_nodes = min(per_tenant_nodes, nodes)
    tenants = []
    pos = 0
    for weight, count in classes:
        for i in range(count):
            tenants.append({"id": len(tenants) + 1, "weight": weight,
                            "size": request_size(case, weight),
                            "profile": "hot" if i % 2 == 0 else "flat",
                            "doubles": pos % 4 in (0, 3)})
            pos += 1
    total_w = sum(t["weight"] for t in tenants)
    cap_total = capacity * nodes
    for t in tenants:
        t["fair_share"] = t["weight"] / total_w * cap_total  # all saturated (bytes/s)
        t["z"] = (zipf(per_tenant_nodes, HOT_SKEW) if t["profile"] == "hot"
                  else [1.0 / per_tenant_nodes] * per_tenant_nodes)
    # Where each tenant reads: consecutive nodes from `first` (its hottest). The tenants
    # of each class and profile take turns over the nodes (hot and flat half a turn
    # apart), so that the nodes hold hot tenants of every class alike; then a local
    # search moves tenants of the classes that weigh most (a fifth of the total weight
    # or more) while that makes the fair shares feasible at 1.5x demand (a max flow) or,
    # feasible, lowers the most loaded node under the proportional allocation.
    classes_by_weight = sorted({t["weight"] for t in tenants})
    turn = {}
    for t in tenants:
        key = (t["weight"], t["profile"])
        k = turn.get(key, 0)
        turn[key] = k + 1
        shift = 0 if t["profile"] == "hot" else nodes // 2
        t["first"] = (k + shift + classes_by_weight.index(t["weight"])) % nodes
    caps = {n: float(capacity) for n in range(nodes)}
    weight = {t["id"]: t["weight"] for t in tenants}

    def max_load():
        out = [0.0] * nodes
        d_tn = {}
        for t in tenants:
            for j, z in enumerate(t["z"]):
                out[(t["first"] + j) % nodes] += t["fair_share"] * z
                d_tn[(t["id"], (t["first"] + j) % nodes)] = BASE_ALPHA * t["fair_share"] * z
        fair = {t["id"]: t["fair_share"] for t in tenants}
        return (-round(fairness.feasible(fair, d_tn, caps), 4), round(max(out) / capacity, 4))

    class_weight = {}
    for t in tenants:
        class_weight[t["weight"]] = class_weight.get(t["weight"], 0) + t["weight"]
    movable = [t for t in sorted(tenants, key=lambda t: -t["weight"])
               if class_weight[t["weight"]] >= total_w / 5]
    best = max_load()
    improved = True
    while improved:
        improved = False
        for t in movable:
            keep = t["first"]
            for s in range(nodes):
                t["first"] = s
                c = max_load()
                if c < best:
                    best, keep, improved = c, s, True
            t["first"] = keep
    for t in tenants:
        t["nodes"] = [(t["first"] + j) % nodes for j in range(per_tenant_nodes)]
        del t["first"]
    proportional_max = best[1]
    under_alpha = min(UNDER_LOAD, UNDER_LOAD / proportional_max)

    # The idle tenant: the lightest doubled one, the last of them.
    doubled = [t for t in tenants if t["doubles"]]
    idle = min(doubled, key=lambda t: (t["weight"], -t["id"]))["id"]

    def alpha(t, phase):
        if phase == "under":
            return under_alpha
        if phase == "base":
            return BASE_ALPHA
        if phase == "idle" and t["id"] == idle:
            return 0.0
        return DOUBLE_ALPHA if t["doubles"] else BASE_ALPHA

    phases = []
    start = 0.0
    for name, secs in timeline(mode, case):
        end = start + secs
        ph = {"name": name, "start_s": round(start, 3), "end_s": round(end, 3),
              "measure": [round(end - MEASURE_TAIL * secs, 3), round(end, 3)]}
        if name == "back":
            ph["measure"] = [round(start, 3), round(min(end, start + 1.0), 3)]
        phases.append(ph)
        start = end
    flows = []
    for t in tenants:
        for n, z in zip(t["nodes"], t["z"]):
            flows.append({"tenant": t["id"], "node": n, "size": t["size"],
                          "rates": [round(alpha(t, ph["name"]) * t["fair_share"] * z / t["size"], 3)
                                    for ph in phases]})
    # Per phase: offered demand, the fair shares, whether the nodes can carry them, and
    # what the two static baselines would give (their models).
    for i, ph in enumerate(phases):
        d_tn = {(f["tenant"], f["node"]): f["rates"][i] * f["size"] for f in flows}
        demand = {t["id"]: 0.0 for t in tenants}
        for (tid, _), v in d_tn.items():
            demand[tid] += v
        fair = fairness.waterfill(demand, weight, capacity * nodes)
        node_load = [sum(v for (_, n), v in d_tn.items() if n == m) / capacity for m in range(nodes)]
        ph["demand"] = {str(t): round(v, 1) for t, v in demand.items()}
        ph["fair"] = {str(t): round(v, 1) for t, v in fair.items()}
        ph["saturated"] = [t for t in demand if demand[t] > fair[t] * (1 + 1e-6)]
        ph["node_load"] = [round(x, 4) for x in node_load]
        ph["feasible"] = round(fairness.feasible(fair, d_tn, caps), 4)
        models = {}
        for name, fn in (("fq-static-weights", fairness.local_fq),
                         ("static-drl", fairness.local_drl)):
            x = fn(d_tn, weight, caps)
            models[name] = {"mmr": round(fairness.mmr(x, weight, ph["saturated"]), 4),
                            "max_share_error_pct": round(fairness.max_error_pct(x, fair), 2),
                            "utilisation": round(sum(x.values()) / (capacity * nodes), 4)}
        ph["model"] = models
    return {"case": case, "nodes": nodes, "capacity": {"read_bytes": capacity},
            "duration_s": phases[-1]["end_s"], "bin_ms": 100, "per_thread_rate": 64,
            "hot_skew": HOT_SKEW, "tenants_per_node": per_tenant_nodes,
            "idle_tenant": idle if any(p["name"] == "idle" for p in phases) else None,
            "tenants": tenants, "phases": phases, "flows": flows}


def node_tenants(plan, node):
    return [f for f in plan["flows"] if f["node"] == node]


def rules(plan, config, node):
    """The stage's rules for `config` at `node` (README.md, "Configurations")."""
    cap = plan["capacity"]["read_bytes"]
    flows = node_tenants(plan, node)
    weight = {t["id"]: t["weight"] for t in plan["tenants"]}
    biggest = max(f["size"] for f in flows)
    burst = lambda rate: max(biggest, int(rate * 0.002))  # 2 ms of the rate, >= a request
    r = [{"rule": "create_channel", "channel": "io", "default": True}]
    if config == "no-control":
        r.append({"rule": "create_object", "channel": "io", "object": "fifo", "type": "drl",
                  "config": {"rate": cap, "burst": burst(cap)}})
    elif config == "static-drl":
        total = sum(weight[f["tenant"]] for f in flows)
        r.append({"rule": "differentiate", "channel": "io", "classifiers": ["tenant"]})
        for f in flows:
            rate = max(1, int(weight[f["tenant"]] / total * cap))
            r.append({"rule": "create_object", "channel": "io", "object": f"t{f['tenant']}",
                      "type": "drl", "config": {"rate": rate, "burst": burst(rate)},
                      "match": {"tenant": f["tenant"]}})
    else:
        r.append({"rule": "create_object", "channel": "io", "object": "fq", "type": "fq",
                  "config": {"capacity": {"read_bytes": cap},
                             "weights": {str(f["tenant"]): weight[f["tenant"]] for f in flows}}})
    return {"version": 1, "rules": r}


def policy(plan, interval_ms, method, max_swaps):
    """The pisces policy document. max_swaps None: 8 (the policy's default) up to 16
    tenants, else one per two tenants (docs/policies.md: with many tenants, max_swaps
    bounds how far one step goes)."""
    n = len(plan["tenants"])
    swaps = max_swaps if max_swaps is not None else 8 if n <= 16 else (n + 1) // 2
    return {"policy": "pisces", "interval_ms": interval_ms,
            "config": {"object": "fq",
                       "global_weights": {str(t["id"]): t["weight"] for t in plan["tenants"]},
                       "default_weight": 1, "method": method, "max_swaps": swaps}}


def run_one(args, plan, case_dir, config, rep, sock_dir, procs):
    run_dir = os.path.join(case_dir, f"{config}-r{rep}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    sock = os.path.join(sock_dir, "sluice.sock")
    start_daemon(
        procs, args.sluice, sock, run_dir, args.interval_ms, 5,
        policy=os.path.join(case_dir, "policy.json") if config == "pisces" else None,
        log_level=args.daemon_log_level)
    start_at = time.time() + args.start_margin
    nodes = []
    for k in range(plan["nodes"]):
        cmd = [args.node_bin, "--rules", os.path.join(case_dir, config, f"rules-node{k}.json"),
               "--plan", os.path.join(case_dir, "plan.json"), "--node", str(k),
               "--out", os.path.join(run_dir, f"node{k}.jsonl"), "--socket", sock,
               "--stage", f"{plan['case']}-node{k}", "--dir", args.dir,
               "--start-at", f"{start_at:.6f}"]
        with open(os.path.join(run_dir, f"node{k}.log"), "w") as nlog:
            nodes.append(procs.start(cmd, subprocess.DEVNULL, nlog))
    failed = []
    deadline = start_at + plan["duration_s"] + 30
    for k, p in enumerate(nodes):
        try:
            rc = p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        if rc != 0:
            failed.append(k)
    procs.kill_all()
    if os.path.exists(sock):
        os.unlink(sock)
    if failed:
        for k in failed:
            with open(os.path.join(run_dir, f"node{k}.log")) as f:
                sys.stderr.write(f"--- node{k}.log ---\n{f.read()[-2000:]}")
        raise SystemExit(f"run.py: {plan['case']} {config} r{rep}: node(s) {failed} failed "
                         f"(see {run_dir})")


def main():
    ap = driver_parser(["full", "quick", "smoke"], __doc__)
    ap.add_argument("--nodes", type=int, default=None)
    ap.add_argument("--capacity-mib", type=float, default=64)
    ap.add_argument("--cases", default=" ".join(CASES))
    ap.add_argument("--configs", "--setups", dest="configs", default=" ".join(CONFIGS))
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--interval-ms", type=int, default=None)
    ap.add_argument("--method", choices=["maxmin", "mbf", "reciprocal"], default="maxmin")
    ap.add_argument("--max-swaps", type=int, default=None)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    ap.add_argument("--sluice", default=None)
    ap.add_argument("--node-bin", default=None)
    ap.add_argument("--start-margin", type=float, default=1.0,
                    help="seconds between starting the nodes and their common start")
    ap.add_argument("--daemon-log-level", default="warn",
                    help="sluice serve --log-level (its log: raw/<case>/<run>/daemon.log)")
    args = ap.parse_args()
    mode = args.mode
    if args.nodes is None:
        args.nodes = 2 if mode == "smoke" else 4
    if args.reps is None:
        args.reps = 2 if mode == "full" else 1
    if args.interval_ms is None:
        args.interval_ms = 1000 if mode == "full" else 500 if mode == "quick" else 250
    cases, configs = args.cases.split(), args.configs.split()
    for c in cases:
        if c not in CASES:
            raise SystemExit(f"run.py: --cases: unknown case {c!r} (expected {', '.join(CASES)})")
    for c in configs:
        if c not in CONFIGS:
            raise SystemExit(f"run.py: --configs: unknown configuration {c!r} "
                             f"(expected {', '.join(CONFIGS)})")
    if args.nodes < 2 or args.nodes > 64:
        raise SystemExit(f"run.py: --nodes must be 2..64, got {args.nodes}")
    if not (1 <= args.capacity_mib <= 4096):
        raise SystemExit(f"run.py: --capacity-mib must be 1..4096, got {args.capacity_mib}")
    if args.max_swaps is not None and args.max_swaps < 0:
        raise SystemExit(f"run.py: --max-swaps must be >= 0, got {args.max_swaps}")
    if args.reps < 1:
        raise SystemExit(f"run.py: --reps must be >= 1, got {args.reps}")
    capacity = int(args.capacity_mib * MIB)
    args.sluice = args.sluice or os.path.join(args.build, "control-plane", "sluice")
    args.node_bin = args.node_bin or os.path.join(args.build, "examples", "fair-queue",
                                                  "sluice-fq-node")
    if not args.plan_only:
        for b in (args.sluice, args.node_bin):
            if not os.access(b, os.X_OK):
                raise SystemExit(f"run.py: {b} not built (ninja -C {args.build} sluice "
                                 f"sluice-fq-node)")

    raw = os.path.join(args.out, "raw")
    os.makedirs(raw, exist_ok=True)
    write_json(os.path.join(args.out, "params.json"), {
        "mode": mode, "command": args.command, "nodes": args.nodes,
        "capacity_mib": args.capacity_mib, "cases": cases, "configs": configs,
        "reps": args.reps, "interval_ms": args.interval_ms, "method": args.method,
        "max_swaps": args.max_swaps,
        "hot_skew": HOT_SKEW, "base_alpha": BASE_ALPHA, "double_alpha": DOUBLE_ALPHA,
        "under_load": UNDER_LOAD, "measure_tail": MEASURE_TAIL, "dir": args.dir})
    plans = {}
    for case in cases:
        plan = plan_case(case, args.nodes, capacity, mode)
        plans[case] = plan
        case_dir = os.path.join(raw, case)
        os.makedirs(case_dir, exist_ok=True)
        write_json(os.path.join(case_dir, "plan.json"), plan)
        write_json(os.path.join(case_dir, "policy.json"),
                   policy(plan, args.interval_ms, args.method, args.max_swaps))
        for config in configs:
            os.makedirs(os.path.join(case_dir, config), exist_ok=True)
            for k in range(args.nodes):
                write_json(os.path.join(case_dir, config, f"rules-node{k}.json"),
                           rules(plan, config, k))
        for ph in plan["phases"]:
            if ph["feasible"] < 0.999:
                log(f"warning: {case}/{ph['name']}: the nodes can carry only "
                    f"{100 * ph['feasible']:.1f}% of the fair shares")
        log(f"{case}: {len(plan['tenants'])} tenants on {plan['tenants_per_node']} of "
            f"{args.nodes} nodes each, {plan['duration_s']} s, model fq-static-weights MMR "
            + ", ".join(f"{p['name']} {p['model']['fq-static-weights']['mmr']:.2f}"
                        for p in plan["phases"] if p["name"] in ("base", "double")))
    if args.plan_only:
        return
    with run_scope(prefix="sluice-fq.") as (procs, sock_dir):
        # Repetition-major, configurations interleaved per case, so that a slow drift of
        # a shared machine spreads over every configuration.
        for rep in range(1, args.reps + 1):
            for case in cases:
                for config in configs:
                    log(f"{case} {config} r{rep} ({plans[case]['duration_s']} s)")
                    run_one(args, plans[case], os.path.join(raw, case), config, rep, sock_dir,
                            procs)


if __name__ == "__main__":
    main()
