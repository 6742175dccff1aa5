#!/usr/bin/env python3
"""Checks a smoke run's output (smoke.sh): the pipeline, not the numbers. usage: OUT"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import jsonl  # noqa: E402

out = sys.argv[1]
errors = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        errors.append(what)


params = json.load(open(os.path.join(out, "params.json")))
names = params["instances"]
for f in ("summary.json", "summary.md", "fig.png", "fig-r1.png", "policy.json"):
    p = os.path.join(out, f)
    check(os.path.exists(p) and os.path.getsize(p) > 100, f"{f} written")
summary = json.load(open(os.path.join(out, "summary.json")))
runs = {r["setup"]: r for r in summary["runs"]}
for setup in params["setups"]:
    check(setup in runs, f"{setup}: analysed")
    d = os.path.join(out, "raw", f"{setup}-r1")
    log = open(os.path.join(d, "daemon.log")).read()
    check("serving on" in log, f"{setup}: the daemon served")
    samples = jsonl(os.path.join(d, "samples.jsonl"))
    for n in names:
        i = runs[setup]["instances"][n]
        expect = params["dataset_mib"] * 1048576 * params["epochs"][names.index(n)]
        check(i["rc"] == 0 and i["bytes"] == expect, f"{setup} {n}: fio read {i['bytes']} of {expect} bytes")
        check(f"stage '{n}' connected" in log, f"{setup} {n}: preloaded stage said hello")
        # A baseline reader may finish within half a second, between two of the
        # sampler's ticks (0.5 s apart, and further when a busy machine delays it):
        # only a reader that ran for several ticks must have been seen.
        if i["duration_s"] and i["duration_s"] >= 2.5:
            check(any(s["kind"] == "stage" and s["inst"] == n for s in samples),
                  f"{setup} {n}: stage statistics collected")
            check(any(s["kind"] == "proc" and s["inst"] == n for s in samples),
                  f"{setup} {n}: /proc/PID/io sampled")
mm = os.path.join(out, "raw", "maxmin-r1", "samples.jsonl")
if os.path.exists(mm):
    samples = jsonl(mm)
    sent = {}  # stage -> DRL rates the policy reported sending
    for s in samples:
        if s["kind"] == "policy":
            for n, v in s["report"].get("stages", {}).items():
                if v.get("rate"):
                    sent.setdefault(n, set()).add(int(v["rate"]))
    for n in names:
        applied = [s for s in samples if s["kind"] == "stage" and s["inst"] == n
                   and (s.get("rules_version") or 0) >= 2 and s.get("drl_rate")]
        check(bool(sent.get(n)), f"maxmin {n}: the policy sent DRL rates {sorted(sent.get(n, []))[:4]}")
        check(any(int(s["drl_rate"]) in sent.get(n, set()) for s in applied),
              f"maxmin {n}: the stage applied one (rules_version >= 2, DRL rate as sent)")
sys.exit(1 if errors else 0)
