#!/usr/bin/env python3
"""Checks a `run.sh --smoke` results directory: the pipeline, not the numbers.

usage: smoke_check.py RESULTS_DIR

- every run of every case and configuration left one output per node, with a config
  line, its bins and an end line; every node served requests and no read failed;
- pisces runs: the daemon's policy sent rules that every stage applied (none rejected),
  and wrote its report (policy.jsonl) naming the pisces policy;
- summary.json has the fields scripts read, with sane values: the four cases by name,
  each with its weights (one per tenant), its tenant count, an MMR in [0, 1], a share
  error >= 0, utilisation in (0, 1.2], baselines for the other configurations run;
  overhead_pct a finite number; idle_return with a share ratio >= 0;
- summary.md and the figures exist and are not empty.
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import check_files, fail, jsonl, number, smoke_main  # noqa: E402

CASES = ["equal", "weighted-1-2-3-4", "weighted-100-10-1", "tenants-100"]


def check_runs(results, params):
    for case in params["cases"]:
        with open(os.path.join(results, "raw", case, "plan.json")) as f:
            plan = json.load(f)
        for config in params["configs"]:
            dirs = sorted(glob.glob(os.path.join(results, "raw", case, f"{config}-r*")))
            if len(dirs) != params["reps"]:
                fail(f"{case}/{config}: {len(dirs)} runs, expected {params['reps']}")
            for d in dirs:
                for k in range(plan["nodes"]):
                    lines = jsonl(os.path.join(d, f"node{k}.jsonl"))
                    types = [l["type"] for l in lines]
                    if types[0] != "config" or types[-1] != "end" or "bin" not in types:
                        fail(f"{d}/node{k}.jsonl: expected config, bins, end; got "
                             f"{sorted(set(types))}")
                    end = lines[-1]
                    if end["served"] <= 0 or end["read_errors"] != 0:
                        fail(f"{d}/node{k}: served {end['served']}, read errors "
                             f"{end['read_errors']}")
                    if config == "pisces":
                        c = end.get("control", {})
                        if c.get("rules_applied", 0) < 1 or c.get("rules_rejected", 1) != 0:
                            fail(f"{d}/node{k}: the stage applied {c.get('rules_applied')} "
                                 f"rule batches from the daemon, rejected "
                                 f"{c.get('rules_rejected')} (want >= 1 and 0)")
                if config == "pisces":
                    steps = jsonl(os.path.join(d, "policy.jsonl"))
                    if not steps:
                        fail(f"{d}/policy.jsonl: no policy step reported")
                    if any(s.get("policy") != "pisces" for s in steps):
                        fail(f"{d}/policy.jsonl: a step of another policy than pisces")
                print(f"smoke_check: ok {os.path.relpath(d, results)}")


def check_figures(entry, what):
    number(entry.get("mmr"), f"{what}.mmr", 0, 1)
    number(entry.get("max_share_error_pct"), f"{what}.max_share_error_pct", 0)
    number(entry.get("utilisation"), f"{what}.utilisation", 1e-6, 1.2)


def check_summary(results, params):
    with open(os.path.join(results, "summary.json")) as f:
        s = json.load(f)
    names = [c.get("name") for c in s.get("cases", [])]
    if sorted(names) != sorted(params["cases"]):
        fail(f"summary.json cases {names}, expected {params['cases']}")
    if sorted(params["cases"]) != sorted(CASES):
        fail(f"the smoke run must cover the four cases, ran {params['cases']}")
    for c in s["cases"]:
        what = f"cases[{c['name']}]"
        if not isinstance(c.get("tenants"), int) or c["tenants"] < 1:
            fail(f"{what}.tenants: {c.get('tenants')!r}")
        w = c.get("weights")
        if not isinstance(w, list) or len(w) != c["tenants"] or any(
                not isinstance(x, (int, float)) or x <= 0 for x in w):
            fail(f"{what}.weights: one positive weight per tenant expected, got {w!r}")
        if "pisces" in params["configs"]:
            check_figures(c, what)
        for config in params["configs"]:
            if config == "pisces":
                continue
            b = c.get("baselines", {}).get(config)
            if b is None:
                fail(f"{what}.baselines.{config}: missing")
            check_figures(b, f"{what}.baselines.{config}")
    if "no-control" in params["configs"] and "pisces" in params["configs"]:
        number(s.get("overhead_pct"), "overhead_pct", -100, 100)
    ir = s.get("idle_return")
    if not isinstance(ir, dict):
        fail(f"idle_return: {ir!r}")
    number(ir.get("share_ratio"), "idle_return.share_ratio", 0)
    number(ir.get("idle_s"), "idle_return.idle_s", 1e-3)
    check_files(results, ["summary.md"])
    figs = ["fig-mmr.png"] + [f"fig-tenants-{c}.png" for c in params["cases"]]
    check_files(results, figs, 1000)


if __name__ == "__main__":
    smoke_main([check_runs, check_summary], "smoke_check: pipeline ok")
