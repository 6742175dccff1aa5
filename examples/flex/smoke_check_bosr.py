#!/usr/bin/env python3
"""Checks a `run.sh --experiment bosr --smoke` results directory: the pipeline, not the
numbers.

usage: smoke_check_bosr.py RESULTS_DIR

- every run left node.jsonl with a config line, its samples (as many as the run's bins)
  and an end line; every partition wrote in the window, nothing failed;
- the daemon's setups: every stage joined and no rule was rejected, the policy reported
  steps (policy.jsonl), the policy was replaced when the bandwidth returned; the
  deferral setups: the gates changed state (gate_transitions > 0: the mechanism engaged);
- summary.json has one row per (BOSR, setup) with served_pct_avg/max/min in [0, 100],
  avg_us, p99_us and p999_us > 0, recovery_s null or in [0, after_s]; summary.md and
  both figures exist and are not empty.
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import check_files, fail, jsonl, node_runs, number, smoke_main  # noqa: E402


def check_runs(results, params):
    s = params["scaled"]
    for bosr in params["bosrs"]:
        runs = node_runs(results, params["setups"], params["reps"], prefix=f"bosr{bosr:g}-")
        for setup, d, lines in runs:
            bins = [x for x in lines if x["type"] == "bin"]
            want = math.ceil((s["window_s"] + s["after_s"]) * 1000 / s["bin_ms"] - 1e-9)
            if len(bins) != want:
                fail(f"{d}/node.jsonl: {len(bins)} samples, expected {want}")
            end = lines[-1]
            if end["errors"] != 0:
                fail(f"{d}: {end['errors']} operations failed: {end.get('first_error')}")
            for p in end["partitions"]:
                if p["window"]["puts"] == 0:
                    fail(f"{d}: partition {p['partition']} wrote nothing in the window")
            if sum(b["node_bytes"] for b in bins) <= 0:
                fail(f"{d}: the node bucket counted no bytes")
            if setup == "rocksdb":
                continue
            ctl = end.get("control")
            if not ctl:
                fail(f"{d}: a daemon setup without control counters")
            for c in ctl["partitions"] + [ctl["node"]]:
                if c["rules_rejected"] != 0:
                    fail(f"{d}: a stage rejected the daemon's rules: {ctl}")
            if not jsonl(os.path.join(d, "policy.jsonl")):
                fail(f"{d}/policy.jsonl: no policy step reported")
            if not os.path.exists(os.path.join(d, "policy-set.log")):
                fail(f"{d}: the policy was not replaced when the bandwidth returned")
            if setup in ("first-stage", "sluice") and end["gate_transitions"] <= 0:
                fail(f"{d}: the deferral gates never changed state (the mechanism did "
                     f"not engage)")


def check_summary(results, params):
    with open(os.path.join(results, "summary.json")) as f:
        summary = json.load(f)
    rows = {(r["bosr"], r["setup"]): r for r in summary.get("rows", [])}
    want = sorted((b, x) for b in params["bosrs"] for x in params["setups"])
    if sorted(rows) != want:
        fail(f"summary.json: rows {sorted(rows)}, expected {want}")
    after = params["scaled"]["after_s"]
    for (b, x), r in rows.items():
        name = f"rows[{b:g}/{x}]"
        for k in ("served_pct_avg", "served_pct_max", "served_pct_min"):
            number(r[k], f"{name}.{k}", 0, 100)
        if not r["served_pct_min"] <= r["served_pct_avg"] <= r["served_pct_max"]:
            fail(f"{name}: served min/avg/max out of order")
        for k in ("avg_us", "p99_us", "p999_us"):
            number(r[k], f"{name}.{k}", 0)
            if r[k] <= 0:
                fail(f"{name}.{k}: {r[k]} is not > 0")
        if "recovery_s" not in r:
            fail(f"{name}: no recovery_s")
        if r["recovery_s"] is not None:
            number(r["recovery_s"], f"{name}.recovery_s", 0, after)
        if x in ("first-stage", "sluice"):
            number(r["gate_transitions"], f"{name}.gate_transitions", 1)
    check_files(results, ["summary.md", "bosr-fig7.png", "bosr-fig10.png"])


if __name__ == "__main__":
    smoke_main([check_runs, check_summary],
               lambda params: f"smoke_check_bosr: OK ({', '.join(params['setups'])})")
