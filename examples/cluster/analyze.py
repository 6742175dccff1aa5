#!/usr/bin/env python3
"""Summarises an examples/cluster results directory (run.sh calls it after run.py).

usage: analyze.py RESULTS_DIR

The cluster run, from the stages' bins (served bytes and the drl rate in force, per
stage, every 250 ms, on wall-clock bins shared by every node), the replicas' report
logs and etcd's history of the cluster's keys:

- global_rate_error_pct: the tenant's served rate over 1 s windows (every node's
  served bytes in the window) against its limit, mean absolute error in % of the
  limit, over every whole window from the end of the settle window to the end of the
  run: the demand move, the leader's failover and the node's loss included. Also the
  same without the windows of the node-loss transient (from the loss until one lease
  and two intervals later, when the lost node's budget is back in use), the error of
  the run's total (global_rate_run_error_pct: what was served over the scored windows
  against the limit times their length), and the budget nodes held but did not use
  (what keeps the served rate under the limit when nodes want less than their budget).
- follow: after the demand move, the leader's steps until the budget of the node the
  demand left is down to within 10% of where it settles, and that of the node it went
  to up to within 10% of where it settles (their mean over the last 5 steps before the
  next event: the stop); the step that first shows both counts. follow_intervals: the time
  from the move to that step, in control intervals.
- failover_s: from the kill -9 of the leader to its successor's first fenced write
  (as etcd's watch delivered it): the state it writes every step, in the same
  transaction as any decision that changed beyond the hysteresis (a successor that
  finds the stored decisions still right writes none); failover_decision_s: to its
  first changed decision; failover_step_s: to its first step in its report log.
- lease_s: the TTL etcd granted the replicas' and nodes' leases.
- fencing: every decision etcd took, in revision order, has a term no lower and a
  sequence number higher than the one before (across nodes); none of the killed
  leader's after its successor's first; the decisions the report logs say were written
  all arrived (none lost).
- stages_kept_rules: from the kill to the successor's first fenced write (the gap),
  every live node enforced the budget of the last decision it had before the kill
  (the sum of its stages' drl rates within 2% of it: each stage's rule moves only
  beyond the node's 1% hysteresis), and in the 1 s windows the gap overlaps no node
  served more than the rate in force + 5%, the tenant no more than its limit + 5%, and
  no stage had fallen back to the unthrottled rate it starts with. Over the whole
  scored run, the windows above the limit + 5% and the largest excess are reported
  apart (windows_over_limit, max_over_limit_pct).
  stage_rule_changes counts the rules messages the stages took in the gap, and in a
  window as long just before the kill: a node keeps re-splitting its budget among its
  stages by their demands every step, decision or not.

The scale run: the leader's CPU (utime + stime from /proc over the bench's run, in %
of one core), etcd's key writes per second over it (etcd_mvcc_put_total from etcd's
/metrics; proposals too), the nodes' puts per second and latency, and the write
ceiling (the same member, puts of the same 3 KB summaries back to back from four
threads).

Writes summary.json, summary.md and cluster.png.
"""
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import analysis as ha  # noqa: E402

MIB = 1024 * 1024
TOL = 0.05         # a 1 s window over budget by more than this is a leak
FOLLOW_TOL = 0.10  # "followed": within 10% of where the budget settles
KEPT_TOL = 0.02    # a node's stages sum to its budget within 2 x the 1% hysteresis
GIB = 1073741824   # the stages' rate before any decision
CHUNK = 16384      # the stages' request size


def jsonl(path):
    return ha.read_jsonl(path, missing_ok=True)


def tenant_nodes(step, tenant):
    """A report-log step's {node: {"demand", "budget"}} for `tenant`."""
    return step["report"].get("tenants", {}).get(tenant, {}).get("nodes", {})


def node_windows(bins, start, end):
    """Per whole second k in [start, end): served bytes, and the enforced budget
    (mean over the bins), from the node's 250 ms bins; None where a bin is missing."""
    by_k = {}
    for b in bins:
        by_k.setdefault(int(math.floor(b["t"] + 1e-6)), []).append(b)
    per = round(1.0 / bins[0]["bin_s"]) if bins else 4
    out = {}
    for k in range(start, end):
        bs = by_k.get(k, [])
        if len(bs) != per:
            out[k] = None
            continue
        out[k] = {"served": sum(b["served_bytes"] for b in bs),
                  "budget": statistics.mean(sum(s["rate"] for s in b["stages"]) for b in bs),
                  "offered": statistics.mean(b["offered_per_s"] for b in bs)}
    return out


def analyze_partitions(ev, p, series, bins):
    """The stopped node and the cut-off node: the 1 s windows from the event until one
    lease and two intervals after it ended (the node back in the split), and when the
    node's stages fell to their fallback."""
    t0, limit = ev["start_unix"], p["limit"]
    recover = p["lease_s"] + 2 * p["interval_ms"] / 1000
    out = {}
    for name, node, a_key, b_key in (("stop", p["stopped_node"], "stop_unix", "cont_unix"),
                                     ("cut", p["cut_node"], "cut_unix", "restore_unix")):
        if a_key not in ev:
            continue
        a, b = ev[a_key] - t0, ev[b_key] - t0
        ws = [s for s in series if math.floor(a) <= s["t"] < math.ceil(b + recover) and
              s["complete"]]
        fell = next((x["t"] + x["bin_s"] for x in bins[node] if x["t"] >= a and
                     sum(st["rate"] for st in x["stages"]) <= p["fallback_total"] * 1.05), None)
        back = next((s["t"] for s in ws if s["t"] > a and
                     s["served"] >= limit * (1 - TOL)), None)
        out[name] = {
            "node": node, "from_s": a, "to_s": b, "windows": [w["t"] for w in ws],
            "served_pct_of_limit": [round(w["served"] / limit * 100, 2) for w in ws],
            "max_over_limit_pct": max(((w["served"] / limit - 1) * 100 for w in ws),
                                      default=None),
            "windows_over_limit": [w["t"] for w in ws if w["served"] > limit * (1 + TOL)],
            "min_pct_of_limit": min((w["served"] / limit * 100 for w in ws), default=None),
            "mean_abs_error_pct": statistics.mean(abs(w["served"] - limit) / limit * 100
                                                  for w in ws) if ws else None,
            "fell_back_after_s": fell - a if fell is not None else None,
            "at_limit_again_after_s": back + 1 - a if back is not None else None,
        }
    over = [e["max_over_limit_pct"] for e in out.values() if e["max_over_limit_pct"] is not None]
    return out, (max(over) if over else None), sum(len(e["windows_over_limit"])
                                                   for e in out.values())


def analyze_run(res, p, raw=None):
    raw = raw or os.path.join(res, "raw")
    ev = json.load(open(os.path.join(raw, "events.json")))
    t0 = ev["start_unix"]
    limit = p["limit"]
    bins = {n: jsonl(os.path.join(raw, "nodes", f"{n}.jsonl")) for n in p["nodes"]}
    lost = p["lost_node"]
    loss_t = ev["loss_unix"] - t0
    kill_t = ev["kill_unix"] - t0
    end = p["end_s"]
    win = {n: node_windows(b, 0, end) for n, b in bins.items()}

    # The global rate per 1 s window: every node alive in it (the lost node until the
    # window of its loss, whose partial bins are gone with it).
    series = []
    for k in range(0, end):
        served, budget, offered, complete = 0, 0, 0, True
        for n in p["nodes"]:
            w = win[n][k]
            if n == lost and k >= math.floor(loss_t):
                continue
            if w is None:
                complete = False
                continue
            served += w["served"]
            budget += w["budget"]
            offered += w["offered"]
        series.append({"t": k, "served": served, "budget": budget, "offered": offered,
                       "complete": complete,
                       "unused": sum(max(0.0, win[n][k]["budget"] - win[n][k]["served"])
                                     for n in p["nodes"] if win[n][k] is not None and
                                     not (n == lost and k >= math.floor(loss_t)))})
    scored = [s for s in series if s["t"] >= p["settle_s"] and
              (s["complete"] or s["t"] == math.floor(loss_t))]
    err = [abs(s["served"] - limit) / limit * 100 for s in scored]
    transient_end = loss_t + p["lease_s"] + 2 * p["interval_ms"] / 1000
    steady = [abs(s["served"] - limit) / limit * 100 for s in scored
              if not (math.floor(loss_t) <= s["t"] < transient_end)]
    partitions, part_over, part_over_n = analyze_partitions(ev, p, series, bins)
    in_partition = {k for e in partitions.values() for k in e["windows"]}
    calm = [abs(s["served"] - limit) / limit * 100 for s in scored
            if not (math.floor(loss_t) <= s["t"] < transient_end) and s["t"] not in in_partition]
    total_err = (abs(sum(s["served"] for s in scored) - limit * len(scored)) /
                 (limit * len(scored)) * 100) if scored else None
    unused = statistics.mean(min(s["unused"], limit) / limit * 100 for s in scored) \
        if scored else None

    # Report logs: every replica's steps, in time order.
    steps = []
    for rid in p["replicas"]:
        steps += jsonl(os.path.join(raw, f"report-{rid}.jsonl"))
    steps.sort(key=lambda s: s["unix_time"])
    tenant = p["tenant"]

    def budgets(s):
        return {n: v["budget"] for n, v in tenant_nodes(s, tenant).items()}

    move_unix = t0 + p["move_s"]
    # Until the next event (the stop, in runs that have one; else the leader's kill).
    follow_end = ev.get("stop_unix", ev["kill_unix"])
    after = [s for s in steps if move_unix < s["unix_time"] < follow_end]
    follow = {"steps": None, "seconds": None}
    if len(after) >= 6:
        settled = {n: statistics.mean(budgets(s).get(n, 0) for s in after[-5:])
                   for n in (p["moved_from"], p["moved_to"])}
        frm, to = p["moved_from"], p["moved_to"]
        for i, s in enumerate(after):
            b = budgets(s)
            if (b.get(frm, 0) <= (1 + FOLLOW_TOL) * settled[frm] and
                    b.get(to, 0) >= (1 - FOLLOW_TOL) * settled[to]):
                follow = {"steps": i + 1, "seconds": s["unix_time"] - move_unix,
                          "settled": settled}
                break

    # History: etcd's writes in revision order.
    hist = jsonl(os.path.join(raw, "history.jsonl"))
    hist.sort(key=lambda h: h["mod_revision"])
    decisions = [h for h in hist if h["key"].startswith("decisions/") and
                 h["type"] != "DELETE" and isinstance(h.get("value"), dict)]
    state_writes = [h for h in hist if h["key"] == "state" and isinstance(h.get("value"), dict)]
    killed = ev["killed_leader"]
    succ_steps = [s for s in steps if s["unix_time"] > ev["kill_unix"] and s["leader"] != killed]
    successor = succ_steps[0]["leader"] if succ_steps else None
    first_dec = next((h for h in decisions if h["value"].get("leader") == successor and
                      h["unix"] > ev["kill_unix"]), None)
    first_state = next((h for h in state_writes if h["value"].get("leader") == successor and
                        h["unix"] > ev["kill_unix"]), None)
    firsts = [h for h in (first_dec, first_state) if h is not None]
    first = min(firsts, key=lambda h: h["mod_revision"]) if firsts else None
    failover_s = first["unix"] - ev["kill_unix"] if first else None
    failover_decision_s = first_dec["unix"] - ev["kill_unix"] if first_dec else None
    failover_step_s = succ_steps[0]["unix_time"] - ev["kill_unix"] if succ_steps else None
    problems = []
    for a, b in zip(decisions, decisions[1:]):
        if b["value"]["term"] < a["value"]["term"]:
            problems.append(f"term went back at revision {b['mod_revision']}")
        if b["value"]["seq"] <= a["value"]["seq"]:
            problems.append(f"seq did not grow at revision {b['mod_revision']}")
    if first_dec is not None:
        late = [h for h in decisions if h["mod_revision"] > first_dec["mod_revision"] and
                h["value"].get("leader") == killed]
        if late:
            problems.append(f"{len(late)} decisions of the killed leader after its successor's")
    written = sum(s["written"] for s in steps)
    lost_decisions = written - len(decisions)
    if lost_decisions != 0:
        problems.append(f"report logs say {written} decisions written, etcd has {len(decisions)}")

    # Fail-static through the gap: every live node enforces the budget of the last
    # decision it had before the kill.
    gap_end = first["unix"] if first else ev["kill_unix"]
    gap = gap_end - ev["kill_unix"]
    kept, notes = True, []
    rule_changes = {"in_gap": 0, "before_kill": 0}

    def changes(bs):
        return sum(1 for a, b in zip(bs, bs[1:]) for x, y in zip(a["stages"], b["stages"])
                   if (x["rules_version"], x["board_updates"]) !=
                   (y["rules_version"], y["board_updates"]))

    for n in p["nodes"]:
        if n == lost:
            continue
        held = [h for h in decisions if h["key"] == f"decisions/{n}" and
                h["unix"] < ev["kill_unix"]]
        budget = next((b["value"] for b in (held[-1]["value"].get("budgets", []) if held else [])
                       if b["tenant"] == tenant), None)
        before = [b for b in bins[n] if b["unix"] <= ev["kill_unix"]]
        during = [b for b in bins[n] if ev["kill_unix"] < b["unix"] <= gap_end]
        if budget is None or not before:
            kept = False
            notes.append(f"{n}: no decision in force at the kill")
            continue
        for b in during:
            enforced = sum(s["rate"] for s in b["stages"])
            if abs(enforced - budget) > KEPT_TOL * budget:
                kept = False
                notes.append(f"{n}: enforced {enforced:.0f} B/s at {b['t']:.2f} s in the gap, "
                             f"its decision {budget:.0f}")
        rule_changes["in_gap"] += changes(before[-1:] + during)
        ref = [b for b in before if b["unix"] > ev["kill_unix"] - gap]
        rule_changes["before_kill"] += changes(before[-len(ref) - 1:])
    # The 1 s windows the gap overlaps: no node above the rate in force, the tenant not
    # above its limit, no stage unthrottled.
    gap_windows = range(math.floor(kill_t), math.ceil(gap_end - t0))
    leaks = []
    for n in p["nodes"]:
        for k, w in win[n].items():
            if w is None or k not in gap_windows or (n == lost and k >= math.floor(loss_t)):
                continue
            # The most the drl let through in the window: the highest rate in force
            # in it (the one at its start, and at each bin's end), one request per
            # stage more.
            rates = [sum(s["rate"] for s in b["stages"]) for b in bins[n]
                     if k - b["bin_s"] - 1e-6 <= b["t"] < k + 1 - 1e-6]
            allowed = max(rates) * (1 + TOL) + p["stages_per_node"] * CHUNK
            if w["served"] > allowed:
                leaks.append(f"{n} at {k} s: {w['served']:.0f} B over {allowed:.0f} allowed")
    for s in scored:
        if s["t"] in gap_windows and s["served"] > limit * (1 + TOL):
            leaks.append(f"global at {s['t']} s: {s['served']:.0f} B/s")
    unthrottled = [f"{n} at {b['t']:.2f} s" for n in p["nodes"] for b in bins[n]
                   if math.floor(kill_t) - b["bin_s"] <= b["t"] < gap_end - t0 and
                   any(s["rate"] >= GIB for s in b["stages"])]
    # Over the whole scored run (not only the gap): the windows above the limit.
    over = [s for s in scored if s["served"] > limit * (1 + TOL)]
    max_over = max((s["served"] / limit - 1) * 100 for s in scored) if scored else None
    if leaks or unthrottled:
        kept = False
        notes += leaks[:5] + [f"unthrottled: {x}" for x in unthrottled[:5]]

    lease_ttls = sorted({x["granted_ttl"] for x in ev.get("leases", [])})
    return {
        "global_rate_error_pct": statistics.mean(err) if err else None,
        "global_rate_error_pct_without_loss_transient": statistics.mean(steady) if steady
        else None,
        "global_rate_error_pct_without_transients": statistics.mean(calm) if calm else None,
        "partition": partitions,
        "partition_max_over_limit_pct": part_over,
        "partition_windows_over_limit": part_over_n,
        "global_rate_total_error_pct": total_err,
        "global_rate_run_error_pct": total_err,
        "unused_budget_pct": unused,
        "scored_windows": [scored[0]["t"], scored[-1]["t"] + 1] if scored else None,
        "failover_s": failover_s,
        "failover_step_s": failover_step_s,
        "failover_decision_s": failover_decision_s,
        "killed_leader": killed, "successor": successor,
        "lease_s": lease_ttls[0] if len(lease_ttls) == 1 else (lease_ttls or None),
        "stages_kept_rules": kept, "kept_rules_notes": notes,
        "stage_rule_changes": rule_changes,
        "gap_windows": [gap_windows.start, gap_windows.stop],
        "windows_over_limit": [s["t"] for s in over],
        "max_over_limit_pct": max_over,
        "gap_s": gap_end - ev["kill_unix"],
        "fencing_ok": not problems, "fencing_problems": problems[:10],
        "decisions": len(decisions), "decisions_written_per_report_logs": written,
        "follow_steps": follow["steps"], "follow_s": follow["seconds"],
        "follow_intervals": (follow["seconds"] / (p["interval_ms"] / 1000)
                             if follow["seconds"] is not None else None),
        "follow_settled": follow.get("settled"),
        "loss_t": loss_t, "kill_t": kill_t,
        "stop_t": ev["stop_unix"] - t0 if "stop_unix" in ev else None,
        "cont_t": ev["cont_unix"] - t0 if "cont_unix" in ev else None,
        "cut_t": ev["cut_unix"] - t0 if "cut_unix" in ev else None,
        "restore_t": ev["restore_unix"] - t0 if "restore_unix" in ev else None,
    }, series, steps, bins


def analyze_scale(res, p):
    path = os.path.join(res, "raw", "scale.json")
    if not os.path.exists(path):
        return None
    sc = json.load(open(path))
    m0, m1, wall = sc["metrics_before"], sc["metrics_after"], sc["wall_s"]

    def rate(k):
        return (m1.get(k, 0) - m0.get(k, 0)) / wall if k in m1 else None

    steps = jsonl(os.path.join(res, "raw", "scale-ctl.jsonl"))
    nodes_seen = max((s["nodes"] for s in steps), default=0)
    et = sc["bench"]["etcd"]
    return {
        "nodes": sc["bench"]["nodes"], "stages_per_node": sc["bench"]["stages_per_node"],
        "tenants": sc["bench"]["tenants"], "seconds": wall,
        "controller_cpu_pct": sc["leader_cpu_s"] / wall * 100,
        "etcd_writes_per_s": rate("etcd_mvcc_put_total"),
        "etcd_txns_per_s": rate("etcd_mvcc_txn_total"),
        "etcd_proposals_per_s": rate("etcd_server_proposals_committed_total"),
        "etcd_write_ceiling_per_s": sc["ceiling"]["etcd"]["puts_per_s"],
        "ceiling_put_p50_us": sc["ceiling"]["etcd"]["put_p50_us"],
        "node_puts_per_s": et["puts_per_s"], "node_put_p99_us": et["put_p99_us"],
        "late_intervals": et["late_intervals"], "put_errors": et["errors"],
        "leader_steps": len(steps), "leader_nodes_seen": nodes_seen,
        "summary_bytes": sc["bench"]["node"]["summary_bytes"],
        "state_bytes": sc["bench"]["controller"]["state_bytes"],
    }


def plot(res, p, r, series, steps, bins):
    plt = ha.pyplot("analyze.py")
    if plt is None:
        return
    ev = json.load(open(os.path.join(res, "raw", "events.json")))
    t0 = ev["start_unix"]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 7.5), sharex=True)
    xs = [s["t"] + 0.5 for s in series]
    a1.plot(xs, [s["served"] / MIB for s in series], "k-", label="served (all nodes)")
    a1.plot(xs, [s["offered"] / MIB for s in series], "k:", label="offered")
    a1.axhline(p["limit"] / MIB, color="r", lw=0.8, label="global limit")
    a1.set_ylabel("tenant A, MiB/s (1 s windows)")
    a1.legend(loc="upper right", fontsize=8)
    colors = {n: c for n, c in zip(p["nodes"], ["C0", "C1", "C2", "C3", "C4", "C5"])}
    for n in p["nodes"]:
        pts = [(s["unix_time"] - t0, tenant_nodes(s, p["tenant"]).get(n)) for s in steps]
        pts = [(t, v) for t, v in pts if v is not None and 0 <= t <= p["end_s"] - 0.5]
        a2.plot([t for t, _ in pts], [v["budget"] / MIB for _, v in pts], "-", color=colors[n],
                label=f"{n} budget")
        a2.plot([b["t"] + b["bin_s"] for b in bins[n]],
                [b["offered_per_s"] / MIB for b in bins[n]], ":", color=colors[n],
                label=f"{n} demand")
    a2.set_ylabel("per node, MiB/s")
    a2.set_xlabel("seconds")
    a2.legend(loc="upper right", fontsize=7, ncol=2)
    for a in (a1, a2):
        a.axvline(p["move_s"], color="g", ls="--", lw=0.8)
        a.axvline(r["kill_t"], color="m", ls="--", lw=0.8)
        a.axvline(r["loss_t"], color="b", ls="--", lw=0.8)
        a.axvspan(0, p["settle_s"], color="0.9")
        if r["stop_t"] is not None:
            a.axvspan(r["stop_t"], r["cont_t"], color="C2", alpha=0.12)
        if r["cut_t"] is not None:
            a.axvspan(r["cut_t"], r["restore_t"], color="C4", alpha=0.12)
    ymax = a1.get_ylim()[1]
    marks = [(p["move_s"], "demand moves"), (r["kill_t"], "leader kill -9"),
             (r["loss_t"], f"{p['lost_node']} lost")]
    if r["stop_t"] is not None:
        marks += [(r["stop_t"], f"{p['stopped_node']} stopped"),
                  (r["cut_t"], f"{p['cut_node']} cut off")]
    for x, txt in marks:
        a1.text(x + 0.3, ymax * 0.95, txt, fontsize=8, va="top")
    a1.set_title("global-rate across nodes: served rate vs limit; budgets vs demand")
    ha.save_figure(fig, os.path.join(res, "cluster.png"), dpi=110)


def fmt(v, nd=2):
    return ha.fmt(v, nd, none="n/a")


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: analyze.py RESULTS_DIR")
    res = sys.argv[1]
    params = ha.read_params(res)
    p = params["scaled"]
    r, series, steps, bins = analyze_run(res, p)
    scale = analyze_scale(res, p)
    summary = {k: r[k] for k in ("global_rate_error_pct", "global_rate_run_error_pct",
                                 "follow_intervals", "failover_s", "lease_s",
                                 "stages_kept_rules", "partition_max_over_limit_pct",
                                 "partition_windows_over_limit")}
    base = None
    if os.path.exists(os.path.join(res, "raw", "static", "events.json")):
        b, _, _, _ = analyze_run(res, p, os.path.join(res, "raw", "static"))
        base = {k: b[k] for k in ("partition", "partition_max_over_limit_pct",
                                  "partition_windows_over_limit", "global_rate_error_pct",
                                  "failover_s")}
    summary["baseline_static"] = base
    summary["scale"] = scale
    summary["mode"] = params["mode"]
    summary["run"] = r
    summary["series"] = [{k: s[k] for k in ("t", "served", "budget", "offered")}
                         for s in series]
    plot(res, p, r, series, steps, bins)
    lines = [
        f"# Cluster example ({params['mode']})", "",
        f"{len(p['nodes'])} node daemons x {p['stages_per_node']} stages, 3 controller "
        f"replicas, one etcd; tenant {p['tenant']} limited to {p['limit'] / MIB:g} MiB/s "
        f"over the cluster; demand moves {p['moved_from']} -> {p['moved_to']} at "
        f"{p['move_s']} s, leader killed -9 at {r['kill_t']:.1f} s, node {p['lost_node']} "
        f"lost at {r['loss_t']:.1f} s.", "",
        "| measure | value |", "|---|---|",
        f"| global rate error, mean abs over 1 s windows {r['scored_windows']} (% of limit) "
        f"| {fmt(r['global_rate_error_pct'])} |",
        f"| same, without the node-loss transient | "
        f"{fmt(r['global_rate_error_pct_without_loss_transient'])} |",
        f"| error of the run's total | {fmt(r['global_rate_total_error_pct'])} |",
        f"| budget held but unused (% of limit, mean) | {fmt(r['unused_budget_pct'])} |",
        f"| budgets follow the demand move: leader steps (s, intervals) | {fmt(r['follow_steps'])} "
        f"({fmt(r['follow_s'])}, {fmt(r['follow_intervals'])}) |",
        f"| failover: kill -9 to the successor's first fenced write (s) | "
        f"{fmt(r['failover_s'])} ({r['killed_leader']} -> {r['successor']}) |",
        f"| failover: to the successor's first changed decision (s) | "
        f"{fmt(r['failover_decision_s'])} |",
        f"| failover: to the successor's first step (s) | {fmt(r['failover_step_s'])} |",
        f"| lease (s, granted by etcd) | {fmt(r['lease_s'])} |",
        f"| stages kept their rules through the gap {r['gap_windows']}, no unthrottled second | "
        f"{r['stages_kept_rules']} |",
        f"| fencing: terms and seqs in order, nothing lost or overwritten | "
        f"{r['fencing_ok']} ({r['decisions']} decisions) |",
    ]
    lines.append(f"| 1 s windows above the limit + {TOL * 100:g}% (largest excess, %) | "
                 f"{len(r['windows_over_limit'])} ({fmt(r['max_over_limit_pct'])}) |")
    lines.append(f"| global rate error without the loss, stop and cut transients | "
                 f"{fmt(r['global_rate_error_pct_without_transients'])} |")
    if r["partition"]:
        lines += ["", "## A node stopped, a node cut off from etcd", "",
                  "Windows from the event until one lease and two intervals after it ended. "
                  "Budgets as leases (this run) beside budgets kept while cut off (the "
                  "baseline run, `budget_leases: false`).", "",
                  "| event | run | windows above limit + 5% | largest excess (%) | lowest (% of "
                  "limit) | mean abs error (%) | node at its fallback after (s) | at the "
                  "limit again after (s) |", "|---|---|---|---|---|---|---|---|"]
        runs = [("leases", r["partition"])]
        if base:
            runs.append(("static", base["partition"]))
        for name in r["partition"]:
            for label, part in runs:
                e = part.get(name)
                if e is None:
                    continue
                lines.append(
                    f"| {name} {e['node']} ({e['from_s']:.0f}-{e['to_s']:.0f} s) | {label} | "
                    f"{len(e['windows_over_limit'])} | {fmt(e['max_over_limit_pct'])} | "
                    f"{fmt(e['min_pct_of_limit'])} | {fmt(e['mean_abs_error_pct'])} | "
                    f"{fmt(e['fell_back_after_s'])} | {fmt(e['at_limit_again_after_s'])} |")
    lines.append(f"| stage rules messages in the gap ({r['gap_s']:.2f} s), in as long before "
                 f"the kill | {r['stage_rule_changes']['in_gap']}, "
                 f"{r['stage_rule_changes']['before_kill']} |")
    if r["kept_rules_notes"]:
        lines += ["", "Kept-rules notes: " + "; ".join(r["kept_rules_notes"])]
    if r["fencing_problems"]:
        lines += ["", "Fencing problems: " + "; ".join(r["fencing_problems"])]
    if scale:
        lines += [
            "", f"## Scale run ({scale['nodes']} nodes x {scale['stages_per_node']} stages, "
            f"{scale['tenants']} tenants, 1 Hz, {scale['seconds']:.0f} s)", "",
            "| measure | value |", "|---|---|",
            f"| leader CPU (% of one core) | {fmt(scale['controller_cpu_pct'])} |",
            f"| etcd key writes/s (txns/s, proposals/s) | {fmt(scale['etcd_writes_per_s'], 0)} "
            f"({fmt(scale['etcd_txns_per_s'], 0)}, {fmt(scale['etcd_proposals_per_s'], 0)}) |",
            f"| etcd write ceiling (puts/s, 4 writers, same summaries) | "
            f"{fmt(scale['etcd_write_ceiling_per_s'], 0)} |",
            f"| nodes' puts/s, p99 put latency (us), late intervals | "
            f"{fmt(scale['node_puts_per_s'], 0)}, {fmt(scale['node_put_p99_us'], 0)}, "
            f"{scale['late_intervals']} |",
            f"| leader steps, most nodes seen in a step | {scale['leader_steps']}, "
            f"{scale['leader_nodes_seen']} |",
        ]
    ha.write_summary(res, summary, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
