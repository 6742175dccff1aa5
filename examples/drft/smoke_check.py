#!/usr/bin/env python3
"""Checks a `run.sh --smoke` results directory of examples/drft: the pipeline, not the
numbers.

usage: smoke_check.py RESULTS_DIR

- every planned run left run.jsonl with a start line, its bins and an end line with no
  failed transaction; the drft object (policy as the setup says) admitted transactions
  and counted commits and item usage for every tenant that ran; the wrapper saw no
  fail-open begin;
- summary.json has a row per run with name, setup, db, workload, usage_mmr in [0, 1]
  and throughput_tps > 0, the five cases and the three setups, each case's own measure,
  and overhead_pct a number; summary.md and every figure exist and are not empty.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import check_files, fail, jsonl, number  # noqa: E402

CASES = {"isolation", "weighted", "bursty", "strategy-proof", "utilisation"}
SETUPS = {"fifo", "drft-0", "drft-delta"}
MEASURE = {"isolation": "heavy_over_light_usage", "weighted": "usage_ratio",
           "bursty": "time_to_share_s", "strategy-proof": "usage_gain_pct",
           "utilisation": "after_over_before"}


def check_run(results, r):
    d = os.path.join(results, "raw", r["run"])
    lines = jsonl(os.path.join(d, "run.jsonl"))
    kinds = [x["kind"] for x in lines]
    if not kinds or kinds[0] != "start" or kinds[-1] != "end":
        fail(f"{d}/run.jsonl: expected start ... end, got {sorted(set(kinds))}")
    if kinds.count("bin") < 3:
        fail(f"{d}/run.jsonl: {kinds.count('bin')} bins")
    end = lines[-1]
    if end["errors"] != 0:
        fail(f"{d}: {end['errors']} transactions failed: {end['first_error']}")
    sched = end["sched"]
    want_policy = "fifo" if r["setup"] == "fifo" else "drft"
    if sched.get("policy") != want_policy:
        fail(f"{d}: the object's policy is {sched.get('policy')}, expected {want_policy}")
    tot = end["totals"]
    if tot["unscheduled"] != 0:
        fail(f"{d}: {tot['unscheduled']} begins ran unscheduled (the object cancelled)")
    number(tot["committed"], f"{d}: committed", 1)
    by_id = {t["tenant"]: t for t in sched["tenants"]}
    for t in r["plan"]["tenants"]:
        if t.get("clients", 1) == 0:
            continue
        s = by_id.get(t["id"])
        if s is None:
            fail(f"{d}: the drft object has no state for tenant {t['id']}")
        number(s["admitted"], f"{d}: tenant {t['id']} admitted", 1)
        number(s["committed"], f"{d}: tenant {t['id']} committed", 1)
        number(s["usage_us"], f"{d}: tenant {t['id']} usage_us", 1e-9)


def main():
    results = sys.argv[1]
    with open(os.path.join(results, "params.json")) as f:
        params = json.load(f)
    for r in params["runs"]:
        check_run(results, r)
    with open(os.path.join(results, "summary.json")) as f:
        summary = json.load(f)
    cases = summary["cases"]
    if len(cases) != len(params["runs"]):
        fail(f"summary.json: {len(cases)} cases for {len(params['runs'])} runs")
    for c in cases:
        what = f"summary.json: {c.get('run')}"
        for k in ("name", "setup", "db", "workload", "usage_mmr", "throughput_tps"):
            if k not in c:
                fail(f"{what}: no {k}")
        number(c["usage_mmr"], f"{what}: usage_mmr", 0, 1)
        number(c["throughput_tps"], f"{what}: throughput_tps", 1e-9)
        m = MEASURE.get(c["name"])
        if m and c.get(m) is None:
            fail(f"{what}: no {m}")
    names = {c["name"] for c in cases}
    if not CASES <= names:
        fail(f"summary.json: cases {sorted(names)}, missing {sorted(CASES - names)}")
    setups = {c["setup"] for c in cases}
    if setups != SETUPS:
        fail(f"summary.json: setups {sorted(setups)}, expected {sorted(SETUPS)}")
    number(summary["overhead_pct"], "summary.json: overhead_pct", -1000, 100)
    number(summary["overhead_high_pct"], "summary.json: overhead_high_pct", -1000, 100)
    files = ["summary.md"] + summary["figures"]
    if len(summary["figures"]) < len(CASES):
        fail(f"summary.json: {len(summary['figures'])} figures")
    check_files(results, files)
    print(f"smoke_check: OK: {len(cases)} runs, cases {sorted(names)}")


if __name__ == "__main__":
    main()
