#!/usr/bin/env python3
"""Checks a `run.sh --smoke` results directory of examples/cluster: the pipeline, not
the targets.

usage: smoke_check.py RESULTS_DIR

- every node left its bins, the lost node until its loss and the others to the end;
  their stages served bytes and had a budget from the cluster (a drl rate below the
  unthrottled one they start with);
- the replicas' report logs have steps of at least two leaders (the killed one and its
  successor), each naming every live node's budget; etcd's history has decisions;
- summary.json has global_rate_error_pct, global_rate_run_error_pct, follow_intervals
  (null when the run is too short to say), failover_s, lease_s, stages_kept_rules and
  scale {nodes, stages_per_node, controller_cpu_pct, etcd_writes_per_s,
  etcd_write_ceiling_per_s} with sane values; the leader saw the scale run's nodes;
  summary.md and cluster.png exist and are not empty;
- the decisions in etcd's history are in term and sequence order, none lost, and
  another replica succeeded the killed leader.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import check_files, fail, jsonl, number, smoke_main  # noqa: E402

GIB = 1073741824


def check_raw(res, p):
    raw = os.path.join(res, "raw")
    for n in p["nodes"]:
        bins = jsonl(os.path.join(raw, "nodes", f"{n}.jsonl"))
        if len(bins) < 4 * p["settle_s"]:
            fail(f"{n}: {len(bins)} bins")
        last = bins[-1]["t"] + bins[-1]["bin_s"]
        want = p["loss_s"] if n == p["lost_node"] else p["end_s"]
        if abs(last - want) > 1.0:
            fail(f"{n}: bins end at {last} s, expected about {want} s")
        if sum(b["served_bytes"] for b in bins) <= 0:
            fail(f"{n}: its stages served nothing")
        if not any(0 < s["rate"] < GIB for b in bins for s in b["stages"]):
            fail(f"{n}: its stages never had a budget from the cluster")
    steps = []
    for rid in p["replicas"]:
        path = os.path.join(raw, f"report-{rid}.jsonl")
        if os.path.exists(path):  # a replica that never led writes none
            steps += jsonl(path)
    leaders = {s["leader"] for s in steps}
    if len(leaders) < 2:
        fail(f"report logs: leaders {sorted(leaders)}, expected the killed one and another")
    with open(os.path.join(raw, "events.json")) as f:
        start = json.load(f)["start_unix"]
    for s in steps:
        nodes = s["report"].get("tenants", {}).get(p["tenant"], {}).get("nodes", {})
        # From the settle window until the stages end (their daemons then summarise none).
        if start + p["settle_s"] < s["unix_time"] < start + p["end_s"] - 1 and not nodes:
            fail(f"report log step at {s['unix_time']}: no budget for tenant {p['tenant']}")
    hist = jsonl(os.path.join(raw, "history.jsonl"))
    if not any(h["key"].startswith("decisions/") for h in hist):
        fail("history.jsonl: no decision")


def check_summary(res, p):
    with open(os.path.join(res, "summary.json")) as f:
        s = json.load(f)
    for k in ("global_rate_error_pct", "global_rate_run_error_pct", "follow_intervals",
              "failover_s", "lease_s", "stages_kept_rules", "scale"):
        if k not in s:
            fail(f"summary.json: no {k}")
    number(s["global_rate_error_pct"], "global_rate_error_pct", 0, 100)
    number(s["global_rate_run_error_pct"], "global_rate_run_error_pct", 0, 100)
    if s["follow_intervals"] is not None:
        number(s["follow_intervals"], "follow_intervals", 0, 100)
    number(s["failover_s"], "failover_s", 0, 30)
    number(s["lease_s"], "lease_s", 1, 60)
    if not isinstance(s["stages_kept_rules"], bool):
        fail(f"stages_kept_rules: not a boolean: {s['stages_kept_rules']!r}")
    run = s["run"]
    # Fencing holds by construction (transactions on the election key's revision): a
    # decision out of order, or one lost, is a bug, whatever the machine's load.
    if not run["fencing_ok"]:
        fail(f"fencing: {run['fencing_problems']}")
    if run["successor"] in (None, run["killed_leader"]):
        fail(f"no successor to the killed leader {run['killed_leader']}")
    # A stopped or cut-off node's stages fall back by themselves once its lease is gone.
    for name in ("stop", "cut"):
        e = run["partition"].get(name)
        if e is None:
            fail(f"summary.json: run.partition has no {name}")
        if e["fell_back_after_s"] is None or e["fell_back_after_s"] > p["lease_s"] + 2:
            fail(f"{name} {e['node']}: its stages at their fallback after "
                 f"{e['fell_back_after_s']} s (lease {p['lease_s']} s)")
    if "partition_max_over_limit_pct" not in s:
        fail("summary.json: no partition_max_over_limit_pct")
    sc = s["scale"]
    if not isinstance(sc, dict):
        fail("summary.json: scale is not an object")
    number(sc["nodes"], "scale.nodes", p["scale_nodes"], p["scale_nodes"])
    number(sc["stages_per_node"], "scale.stages_per_node", 1)
    number(sc["controller_cpu_pct"], "scale.controller_cpu_pct", 0, 400)
    number(sc["etcd_writes_per_s"], "scale.etcd_writes_per_s", 1)
    number(sc["etcd_write_ceiling_per_s"], "scale.etcd_write_ceiling_per_s", 1)
    if sc["leader_nodes_seen"] < p["scale_nodes"] // 2:
        fail(f"scale: the leader saw at most {sc['leader_nodes_seen']} nodes")
    check_files(res, ["summary.md", "cluster.png"])


if __name__ == "__main__":
    smoke_main([lambda res, params: check_raw(res, params["scaled"]),
                lambda res, params: check_summary(res, params["scaled"])], "smoke_check: OK")
