#!/usr/bin/env python3
"""Checks a `run.sh --experiment sudden-load --smoke` results directory: the pipeline,
not the numbers.

usage: smoke_check.py RESULTS_DIR

- every run of every setup left node.jsonl with a config line, its bins (as many as the
  run's seconds) and an end line; reads were served, every writer wrote, nothing failed;
- the limiter setups: the limiters counted bytes; the sluice setup: its stages joined the
  daemon (rules applied, none rejected), the policy reported steps (policy.jsonl), the
  node bucket counted bytes, and p1's background bucket has a rate;
- summary.json has one row per setup with served_fraction_first_s in [0, 1.5],
  seconds_to_full_rate null or in [0, load], p99_ms > 0; summary.md and the figure
  exist and are not empty.
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import check_files, fail, jsonl, node_runs, number, smoke_main  # noqa: E402


def check_runs(results, params):
    s = params["scaled"]
    for setup, d, lines in node_runs(results, params["setups"], params["reps"]):
        bins = [x for x in lines if x["type"] == "bin"]
        want = math.ceil((s["idle_s"] + s["load_s"]) * 1000 / s["bin_ms"] - 1e-9)
        if len(bins) != want:
            fail(f"{d}/node.jsonl: {len(bins)} bins, expected {want}")
        end = lines[-1]
        if end["errors"] != 0:
            fail(f"{d}: {end['errors']} operations failed: {end.get('first_error')}")
        if sum(b["served"] for b in bins) == 0:
            fail(f"{d}: no read served")
        for w in end["writers"]:
            if w["puts"] == 0:
                fail(f"{d}: writer {w['partition']} wrote nothing")
        if sum(b["node_bytes"] for b in bins) <= 0:
            fail(f"{d}: the node bucket / the limiters counted no bytes")
        if setup == "sluice":
            cfg = lines[0]
            if params["daemon"]:
                ctl = end.get("control")
                if not ctl:
                    fail(f"{d}: the sluice run has no control counters")
                for c in ctl["partitions"] + [ctl["node"]]:
                    if c["rules_rejected"] != 0:
                        fail(f"{d}: the stage rejected the daemon's rules: {ctl}")
                steps = jsonl(os.path.join(d, "policy.jsonl"))
                if not steps:
                    fail(f"{d}/policy.jsonl: no policy step reported")
            if cfg["rates_at_start"]["bg"][1] <= 0:
                fail(f"{d}: p1's background bucket has no rate")


def check_summary(results, params):
    with open(os.path.join(results, "summary.json")) as f:
        summary = json.load(f)
    rows = {r["name"]: r for r in summary.get("setups", [])}
    if sorted(rows) != sorted(params["setups"]):
        fail(f"summary.json: setups {sorted(rows)}, expected {sorted(params['setups'])}")
    load = params["scaled"]["load_s"]
    for name, r in rows.items():
        number(r["served_fraction_first_s"], f"{name}.served_fraction_first_s", 0, 1.5)
        if r["seconds_to_full_rate"] is not None:
            number(r["seconds_to_full_rate"], f"{name}.seconds_to_full_rate", 0, load)
        number(r["p99_ms"], f"{name}.p99_ms", 0)
        number(r["node_max_over_device"], f"{name}.node_max_over_device", 0)
    check_files(results, ["summary.md", "sudden-load.png"])


if __name__ == "__main__":
    smoke_main([check_runs, check_summary],
               lambda params: f"smoke_check: OK ({', '.join(params['setups'])})")
