#!/usr/bin/env python3
"""Checks a `run.sh --smoke` results directory: the pipeline, not the numbers.

usage: smoke_check.py RESULTS_DIR [SETUP ...]

- every setup produced a run file per workload that parses as JSON lines, with a config
  line, one line per second and an end line without errors, and operations were served;
- the summary (summary.md, summary.json) and the PNG figures exist and are not empty;
- Sluice+SILK: the daemon's silk policy sent rules that the stage applied (the stage's
  control client applied at least two batches and rejected none, its rules version moved
  past the local layout's), and the rates the policy gave the DRL objects changed over
  the run (the policy log, the report the daemon writes after every step, holds more
  than one value for at least one flow).
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import check_files, fail, jsonl  # noqa: E402


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    results = sys.argv[1]
    setups = sys.argv[2:] or ["plain", "auto", "static", "sluice"]
    workloads = sorted(os.path.basename(d) for d in glob.glob(os.path.join(results, "raw", "*"))
                       if os.path.isdir(d))
    if not workloads:
        fail(f"no workload directories under {results}/raw")
    for w in workloads:
        for s in setups:
            runs = sorted(glob.glob(os.path.join(results, "raw", w, f"{s}-r*.jsonl")))
            runs = [r for r in runs if not r.endswith(".policy.jsonl")]
            if not runs:
                fail(f"{w}/{s}: no run file")
            for path in runs:
                lines = jsonl(path)
                types = [l.get("type") for l in lines]
                if types.count("config") != 1 or types.count("end") != 1:
                    fail(f"{path}: expected one config and one end line, got {types}")
                secs = [l for l in lines if l.get("type") == "second"]
                end = lines[-1]
                if end.get("type") != "end":
                    fail(f"{path}: the last line is not the end line")
                if len(secs) < int(end["seconds"]):
                    fail(f"{path}: {len(secs)} per-second lines for {end['seconds']} s")
                for l in secs:
                    for k in ("t", "phase", "ops", "p99_us", "target_ops"):
                        if k not in l:
                            fail(f"{path}: second {l.get('t')} lacks {k}")
                if end["ops"] <= 0 or end["errors"] != 0:
                    fail(f"{path}: ops {end['ops']}, errors {end['errors']}")
                if {l["phase"] for l in secs} != {"initial", "peak", "valley"}:
                    fail(f"{path}: phases {sorted({l['phase'] for l in secs})}")
                if s == "sluice":
                    check_sluice(path, end)
                print(f"smoke_check: ok {os.path.relpath(path, results)}: {end['ops']} ops")
    check_files(results, ["summary.md", "summary.json"])
    with open(os.path.join(results, "summary.json")) as f:
        summary = json.load(f)["summary"]
    for w in workloads:
        for s in setups:
            if s not in summary.get(w, {}):
                fail(f"summary.json lacks {w}/{s}")
        check_files(results, [f"fig-{w}.png"], 1000)
        if "sluice" in setups and not os.path.exists(os.path.join(results, f"fig-{w}-silk.png")):
            fail(f"fig-{w}-silk.png missing")
    print("smoke_check: pipeline ok")


def check_sluice(path, end):
    applied = end.get("rules_applied", 0)
    if applied < 2 or end.get("rules_rejected", 1) != 0:
        fail(f"{path}: the stage applied {applied} rule batches from the daemon, rejected "
             f"{end.get('rules_rejected')} (want >= 2 applied, 0 rejected)")
    # The local layout is one batch (rules_version 1); every batch from the daemon bumps it.
    if end.get("rules_version", 0) < 1 + applied:
        fail(f"{path}: rules_version {end.get('rules_version')} after {applied} batches")
    plog = path[: -len(".jsonl")] + ".policy.jsonl"
    if not os.path.exists(plog):
        fail(f"{plog} missing")
    rates = {"flush": set(), "l0": set(), "ln": set()}
    lines = 0
    for rec in jsonl(plog):
        if rec.get("policy") != "silk":
            fail(f"{plog}: the daemon runs policy {rec.get('policy')!r}, not silk")
        for rep in rec.get("report", {}).get("stages", {}).values():
            lines += 1
            for k in rates:
                rates[k].add(round(rep["rates"][k]))
    if lines == 0:
        fail(f"{plog}: no policy decisions for any stage")
    if all(len(v) < 2 for v in rates.values()):
        fail(f"{plog}: the SILK rates never changed: {rates}")


if __name__ == "__main__":
    main()
