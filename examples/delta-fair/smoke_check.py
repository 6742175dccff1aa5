#!/usr/bin/env python3
"""Checks a `run.sh --experiment buffer|cache --smoke` results directory: the pipeline,
not the numbers.

usage: smoke_check.py RESULTS_DIR

- every run of every configuration left node.jsonl with a config line, its bins, one
  ramp line per ramp-up tenant and an end line; every tenant wrote and no put failed;
- gated runs under the daemon: the stage applied the daemon's rules (none rejected), the
  policy reported steps of delta-fair (policy.jsonl), and the pool ended with the
  capacity of the scaled buffer and the reservation `sluice policy check` derived;
- summary.json has the fields scripts read, with sane values: one row per δ run with
  paper_delta_ms, delta_ms, reserved_pct in [0, 100], ramp_extra_p99_ms >= 0 and
  throughput_vs_fair > 0 (when δ = inf ran); plain_rocksdb.innocent_stall_s >= 0 when
  plain ran;
- summary.md and the figures exist and are not empty.
Experiment `cache` (params.json's "experiment"): every run left its config, bins, one
ramp line per ramp-up reader and its end line with no failed read; tenant-cache runs
under the daemon: the stage applied its rules, the policy reported delta-fair steps and
the cache-reserve object ended with the capacity and the per-tenant thresholds `sluice
policy check` derived; summary.json rows carry config, paper_delta_ms, delta_ms, k,
reserved_pct in [0, 100], ramp_extra_p99_ms >= 0 and throughput_vs_fair > 0.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import check_files, fail, jsonl, node_runs, number, smoke_main  # noqa: E402


def check_runs(results, params):
    s = params["scaled"]
    for config, d, lines in node_runs(results, params["configs"], params["reps"], need_bins=True):
        types = [x["type"] for x in lines]
        if types.count("ramp") != s["ramp"]:
            fail(f"{d}/node.jsonl: {types.count('ramp')} ramp lines, expected {s['ramp']}")
        end = lines[-1]
        if end["errors"] != 0:
            fail(f"{d}: {end['errors']} puts failed")
        for t in end["tenants"]:
            if t["puts"] <= 0:
                fail(f"{d}: tenant {t['id']} ({t['class']}) wrote nothing")
        if config != "plain":
            pool = end.get("pool")
            if not isinstance(pool, dict):
                fail(f"{d}: no write_buffer pool state at the end")
            want = params["reservations"][config]["reserved_bytes"]
            if pool.get("capacity") != s["capacity"] or pool.get("reserved") != want:
                fail(f"{d}: the pool ended with capacity {pool.get('capacity')} and "
                     f"reserved {pool.get('reserved')}, expected {s['capacity']} and {want}")
            if params["daemon"]:
                c = end.get("control", {})
                if c.get("rules_applied", 0) < 1 or c.get("rules_rejected", 1) != 0:
                    fail(f"{d}: the stage applied {c.get('rules_applied')} rule batches "
                         f"from the daemon, rejected {c.get('rules_rejected')}")
                steps = jsonl(os.path.join(d, "policy.jsonl"))
                if not steps or any(x.get("policy") != "delta-fair" for x in steps):
                    fail(f"{d}/policy.jsonl: no step, or a step of another policy")
        print(f"smoke_check: ok {os.path.relpath(d, results)}")


def check_summary(results, params):
    with open(os.path.join(results, "summary.json")) as f:
        s = json.load(f)
    deltas = [c.split("-", 1)[1] for c in params["configs"] if c.startswith("delta-")]
    rows = s.get("rows")
    if not isinstance(rows, list) or len(rows) != len(deltas):
        fail(f"summary.json rows: {len(rows or [])}, expected one per δ run ({deltas})")
    for r, d in zip(rows, deltas):
        want = d if d == "inf" else int(d)
        if r.get("paper_delta_ms") != want or r.get("delta_ms") != want:
            fail(f"rows[{d}]: paper_delta_ms {r.get('paper_delta_ms')!r}, delta_ms "
                 f"{r.get('delta_ms')!r}, expected {want!r}")
        number(r.get("reserved_pct"), f"rows[{d}].reserved_pct", 0, 100)
        number(r.get("ramp_extra_p99_ms"), f"rows[{d}].ramp_extra_p99_ms", 0)
        if "inf" in deltas:
            number(r.get("throughput_vs_fair"), f"rows[{d}].throughput_vs_fair", 1e-6)
    if "plain" in params["configs"]:
        number(s.get("plain_rocksdb", {}).get("innocent_stall_s"),
               "plain_rocksdb.innocent_stall_s", 0)
    if not isinstance(s.get("targets"), list):
        fail("summary.json: no targets")
    check_files(results, ["summary.md"])
    check_files(results, ["fig-p99.png", "fig-buffer.png", "fig-ramp.png"], 1000)


def check_cache_runs(results, params):
    s = params["scaled"]
    for config, d, lines in node_runs(results, params["configs"], params["reps"], need_bins=True):
        types = [x["type"] for x in lines]
        want = sum(1 for t in lines[0]["tenants"] if t["class"] == "ramp")
        if want < 1 or types.count("ramp") != want:
            fail(f"{d}/node.jsonl: {types.count('ramp')} ramp lines, expected {want} (>= 1)")
        end = lines[-1]
        if end["errors"] != 0:
            fail(f"{d}: {end['errors']} reads or writes failed")
        for t in end["tenants"]:
            if t["reads"] <= 0:
                fail(f"{d}: tenant {t['id']} ({t['class']}) read nothing")
        res = params["reservations"].get(config)
        if res is not None and params["daemon"]:
            c = end.get("control", {})
            if c.get("rules_applied", 0) < 1 or c.get("rules_rejected", 1) != 0:
                fail(f"{d}: the stage applied {c.get('rules_applied')} rule batches from the "
                     f"daemon, rejected {c.get('rules_rejected')}")
            steps = jsonl(os.path.join(d, "policy.jsonl"))
            if not steps or any(x.get("policy") != "delta-fair" for x in steps):
                fail(f"{d}/policy.jsonl: no step, or a step of another policy")
            reserve = end.get("reserve")
            if not isinstance(reserve, dict) or reserve.get("capacity") != s["capacity"]:
                fail(f"{d}: the cache-reserve object ended with capacity "
                     f"{(reserve or {}).get('capacity')}, expected {s['capacity']}")
            got = {f["flow"]: f["reserved"] for f in reserve.get("flows", [])}
            for i, (name, b) in enumerate(res["cache"]["per_tenant_bytes"].items(), 1):
                if got.get(i) != b:
                    fail(f"{d}: tenant {name} (flow {i}) ended with threshold {got.get(i)}, "
                         f"expected {b} (sluice policy check)")
        print(f"smoke_check: ok {os.path.relpath(d, results)}")


def check_cache_summary(results, params):
    with open(os.path.join(results, "summary.json")) as f:
        s = json.load(f)
    rows = s.get("rows")
    if not isinstance(rows, list) or len(rows) != len(params["configs"]):
        fail(f"summary.json rows: {len(rows or [])}, expected one per configuration")
    for r, c in zip(rows, params["configs"]):
        if r.get("config") != c:
            fail(f"rows: {r.get('config')!r} where {c!r} was expected")
        for key in ("paper_delta_ms", "delta_ms", "k"):
            if key not in r:
                fail(f"rows[{c}]: no {key}")
        number(r.get("reserved_pct"), f"rows[{c}].reserved_pct", 0, 100)
        number(r.get("ramp_extra_p99_ms"), f"rows[{c}].ramp_extra_p99_ms", 0)
        if "delta-inf" in params["configs"]:
            number(r.get("throughput_vs_fair"), f"rows[{c}].throughput_vs_fair", 1e-6)
    if not isinstance(s.get("targets"), list) or not s["targets"]:
        fail("summary.json: no targets")
    check_files(results, ["summary.md"])
    check_files(results, s.get("figures", []) + ["fig-p99.png"], 1000)


def check(results, params):
    if params.get("experiment") == "cache":
        check_cache_runs(results, params)
        check_cache_summary(results, params)
    else:
        check_runs(results, params)
        check_summary(results, params)


if __name__ == "__main__":
    smoke_main([check], "smoke_check: pipeline ok")
