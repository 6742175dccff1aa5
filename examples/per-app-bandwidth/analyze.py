#!/usr/bin/env python3
"""Per-second bandwidth, the Fig. 10-style plot and the table of one run.sh output dir.

Reads OUT/params.json and OUT/raw/<setup>-r<rep>/{events,samples}.jsonl, writes
OUT/fig-r<rep>.png (one panel per setup), OUT/fig.png (the median repetition),
OUT/summary.json and OUT/summary.md.

Windows and criteria (README.md, "What is measured"):
  - window i is [t0 + i, t0 + i + 1) s, t0 the run's start; an instance's bandwidth
    in a window comes from its /proc/PID/io read_bytes (sampled every 0.5 s,
    interpolated linearly at the window edges); the stage's own statistics give
    a second series (bytes through its limiter per collect).
  - an instance is active in a window when it ran for the whole window.
  - below goal: bandwidth < 95% of the goal.
  - eligible window (what the goal criterion counts): active, and no phase change
    (an instance starting or finishing) in (start - 2 intervals, end) of the window.
  - goal criterion: at or above 95% of the goal in >= 95% of eligible windows.
The acceptance criteria (summary.json's "criteria", summary.md's last line): under
max-min every instance meets the goal criterion and finishes no later than under each
static limit (blkio, Sluice DRL), and the makespan is earlier; the baseline misses goals.
usage: analyze.py OUT
"""
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import analysis as ha  # noqa: E402

MIB = 1048576.0
TOL = 0.95      # a window counts as meeting the goal at >= TOL * goal
ACCEPT = 0.95   # ... in at least this fraction of eligible windows
SETUP_TITLES = {
    "baseline": "Baseline (no control)",
    "blkio": "Static limits: cgroup v1 blkio throttle at the goals",
    "static": "Static limits: Sluice DRL at the goals",
    "maxmin": "Sluice max-min (maxmin policy)",
}



def interp(points, t):
    """Cumulative bytes at time t from sorted (t, bytes) points."""
    if not points or t <= points[0][0]:
        return points[0][1] if points else 0.0
    if t >= points[-1][0]:
        return points[-1][1]
    lo, hi = 0, len(points) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if points[mid][0] <= t:
            lo = mid
        else:
            hi = mid
    (t0, b0), (t1, b1) = points[lo], points[hi]
    return b0 + (b1 - b0) * (t - t0) / (t1 - t0) if t1 > t0 else b1


def analyze_run(run_dir, params):
    events = ha.read_jsonl(os.path.join(run_dir, "events.jsonl"), missing_ok=True)
    samples = ha.read_jsonl(os.path.join(run_dir, "samples.jsonl"), missing_ok=True)
    run = next(e for e in events if e["kind"] == "run")
    t0 = run["t"]
    interval = params["interval_ms"] / 1000.0
    names = params["instances"]
    goal = {n: params["goals"][i] / MIB for i, n in enumerate(names)}
    inst = {n: {"start": None, "end": None, "rc": None} for n in names}
    for e in events:
        if e["kind"] in ("start", "end"):
            inst[e["inst"]][e["kind"]] = e["t"] - t0
            if e["kind"] == "end":
                inst[e["inst"]]["rc"] = e["rc"]
    for n in names:
        fio_path = os.path.join(run_dir, n + ".fio.json")
        total = 0
        try:
            with open(fio_path) as f:
                text = f.read()
            j = json.loads(text[text.index("{"):])  # fio may print notes first
            total = sum(job["read"]["io_bytes"] for job in j["jobs"])
        except (OSError, ValueError, KeyError):
            pass
        inst[n]["fio_bytes"] = total

    # /proc/PID/io series: cumulative read_bytes, anchored at start (0) and end (total).
    proc = {n: [] for n in names}
    stage = {n: [] for n in names}
    policy = []
    for s in samples:
        if s["kind"] == "proc" and s["inst"] in proc:
            proc[s["inst"]].append((s["t"] - t0, float(s["read_bytes"])))
        elif s["kind"] == "stage" and s["inst"] in stage:
            stage[s["inst"]].append(s)
        elif s["kind"] == "policy":
            policy.append(s)
    for n in names:
        pts = sorted(proc[n])
        st, en = inst[n]["start"], inst[n]["end"]
        if st is not None:
            pts = [(st, 0.0)] + [p for p in pts if p[0] > st]
        if en is not None:
            last = pts[-1][1] if pts else 0.0
            pts = [p for p in pts if p[0] < en] + [(en, max(last, float(inst[n]["fio_bytes"])))]
        proc[n] = pts

    ends = [inst[n]["end"] for n in names if inst[n]["end"] is not None]
    makespan = max(ends) if ends else 0.0
    nwin = int(math.ceil(makespan))
    changes = sorted(v for n in names for v in (inst[n]["start"], inst[n]["end"]) if v is not None)

    def eligible(a):
        return not any(a - 2 * interval < p < a + 1 for p in changes)

    series = {}
    per = {}
    total_eligible = []  # windows where every active instance's window is eligible
    for n in names:
        st, en = inst[n]["start"], inst[n]["end"]
        rates = []
        for i in range(nwin):
            a = float(i)
            r = (interp(proc[n], a + 1) - interp(proc[n], a)) / MIB
            rates.append(r)
        # stage series: bytes through the limiter per collect, at the collect's midpoint
        srates = [((s["t"] - t0) - s["interval_s"] / 2, s["bytes"] / s["interval_s"] / MIB)
                  for s in stage[n] if s["interval_s"] > 0]
        series[n] = {"proc": rates, "stage": srates}
        active = [st is not None and en is not None and st <= i and en >= i + 1
                  for i in range(nwin)]
        below = [act and r < TOL * goal[n] for act, r in zip(active, rates)]
        below_strict = [act and r < goal[n] for act, r in zip(active, rates)]
        elig = [act and eligible(float(i)) for i, act in enumerate(active)]
        elig_ok = [e and not b for e, b in zip(elig, below)]
        # the same from the stage's own statistics (a collect's midpoint picks the window)
        sw = {}
        for tm, r in srates:
            i = int(math.floor(tm))
            if 0 <= i < nwin:
                sw.setdefault(i, []).append(r)
        s_below = sum(1 for i in range(nwin)
                      if active[i] and i in sw and statistics.mean(sw[i]) < TOL * goal[n])
        per[n] = {
            "goal_mib": goal[n],
            "start_s": st, "completion_s": en,
            "duration_s": (en - st) if st is not None and en is not None else None,
            "rc": inst[n]["rc"], "bytes": inst[n]["fio_bytes"],
            "active_windows": sum(active),
            "below_goal_s": sum(below),
            "below_goal_strict_s": sum(below_strict),
            "below_goal_stage_s": s_below,
            "eligible_windows": sum(elig),
            "eligible_ok": sum(elig_ok),
            "eligible_fraction": (sum(elig_ok) / sum(elig)) if sum(elig) else None,
            "mean_mib_s": (inst[n]["fio_bytes"] / MIB / (en - st)) if en and st is not None and en > st else None,
        }
    # Leftover: in windows where every active instance is eligible, the total against MaxB.
    maxb = params["max_bandwidth_mib"]
    totals = [sum(series[n]["proc"][i] for n in names) for i in range(nwin)]
    for i in range(nwin):
        act = [n for n in names if inst[n]["start"] is not None and inst[n]["start"] <= i
               and inst[n]["end"] is not None and inst[n]["end"] >= i + 1]
        if act and eligible(float(i)):
            total_eligible.append(totals[i])
    # Settling after each phase change: first window from the change on where every active
    # instance meets 95% of its goal and the total reaches 90% of MaxB.
    settle = []
    for p in changes[1:-1]:
        found = None
        for i in range(int(math.ceil(p)), nwin):
            act = [n for n in names if inst[n]["start"] <= i and inst[n]["end"] >= i + 1]
            if any(c for c in changes if p < c < i + 1):
                break  # the next phase began first
            if act and all(series[n]["proc"][i] >= TOL * goal[n] for n in act) \
                    and totals[i] >= 0.9 * maxb:
                found = i + 1 - p
                break
        settle.append({"at_s": p, "settled_after_s": found})
    rules_applied = {n: sorted({s["rules_version"] for s in stage[n] if s.get("rules_version")})
                     for n in names}
    drl_rates = {n: sorted({s["drl_rate"] for s in stage[n] if s.get("drl_rate")}) for n in names}
    return {
        "setup": run["setup"], "rep": run["rep"], "makespan_s": makespan,
        "instances": per, "series": series, "totals": totals,
        "phase_changes_s": changes,
        "leftover": {
            "eligible_windows": len(total_eligible),
            "total_ge_90pct_maxb": sum(1 for v in total_eligible if v >= 0.9 * maxb),
            "mean_total_mib_s": statistics.mean(total_eligible) if total_eligible else None,
        },
        "settle": settle,
        "stage_records": {n: len(stage[n]) for n in names},
        "rules_versions": rules_applied,
        "drl_rates_distinct": {n: len(v) for n, v in drl_rates.items()},
        "policy_reports": len(policy),
    }


def plot(runs, params, path):
    plt = ha.pyplot("analyze.py")
    if plt is None:
        return
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    names = params["instances"]
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.6 * len(runs)), sharex=True,
                             squeeze=False)
    xmax = max(r["makespan_s"] for r in runs) + 1
    ymax = max([max(r["totals"] or [0]) for r in runs] + [params["max_bandwidth_mib"]]) * 1.05
    for ax, r in zip(axes[:, 0], runs):
        for k, n in enumerate(names):
            rates = r["series"][n]["proc"]
            d = r["instances"][n]
            xs = [i + 0.5 for i in range(len(rates)) if d["start_s"] is not None
                  and d["start_s"] <= i + 1 and d["completion_s"] >= i]
            ax.plot(xs, [rates[int(x)] for x in xs], color=colors[k], lw=1.4,
                    label=f"{n} (goal {d['goal_mib']:.0f})")
            st = r["series"][n]["stage"]
            ax.plot([p[0] for p in st], [p[1] for p in st], color=colors[k], lw=0, marker=".",
                    ms=2.5, alpha=0.6)
            if d["start_s"] is not None:
                ax.hlines(d["goal_mib"], d["start_s"], d["completion_s"], colors=colors[k],
                          linestyles="dashed", lw=0.9)
        ax.plot([i + 0.5 for i in range(len(r["totals"]))], r["totals"], color="0.6", lw=0.8,
                label="total")
        ax.axhline(params["max_bandwidth_mib"], color="k", ls=":", lw=0.8, label="MaxB")
        ax.set_title(f"{SETUP_TITLES.get(r['setup'], r['setup'])}: makespan "
                     f"{r['makespan_s']:.0f} s", fontsize=9, loc="left")
        ax.set_ylabel("MiB/s")
        ax.set_xlim(0, xmax)
        ax.set_ylim(0, ymax)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7, ncol=6, loc="upper right")
    axes[-1, 0].set_xlabel("time (s); lines: /proc/PID/io per second, dots: stage statistics "
                           "per collect, dashed: goals")
    ha.save_figure(fig, path, dpi=110)


mmm = ha.spread


def fmt(m, digits=0):
    return ha.fmt_spread(m, digits)


def main():
    out = sys.argv[1]
    params = ha.read_params(out)
    names = params["instances"]
    runs = []
    raw = os.path.join(out, "raw")
    for setup in params["setups"]:
        for rep in range(1, params["reps"] + 1):
            d = os.path.join(raw, f"{setup}-r{rep}")
            if os.path.exists(os.path.join(d, "events.jsonl")):
                runs.append(analyze_run(d, params))
    if not runs:
        sys.exit("analyze.py: no runs under " + raw)
    reps = sorted({r["rep"] for r in runs})
    for rep in reps:
        plot([r for r in runs if r["rep"] == rep], params, os.path.join(out, f"fig-r{rep}.png"))
    # fig.png: the repetition whose maxmin makespan is the median
    mm = sorted((r["makespan_s"], r["rep"]) for r in runs if r["setup"] == "maxmin")
    med_rep = mm[len(mm) // 2][1] if mm else reps[0]
    plot([r for r in runs if r["rep"] == med_rep], params, os.path.join(out, "fig.png"))

    summary = {"params": params, "criterion": {
        "window_s": 1, "below_goal": f"bandwidth < {TOL} * goal (from /proc/PID/io)",
        "eligible": "active for the whole window and no instance started or finished "
                    "in (window start - 2 control intervals, window end)",
        "acceptance": f">= {ACCEPT} of eligible windows at >= {TOL} * goal"},
        "median_rep": med_rep, "setups": {}, "runs": []}
    for r in runs:
        summary["runs"].append({k: v for k, v in r.items() if k not in ("series", "totals")})
    for setup in params["setups"]:
        rs = [r for r in runs if r["setup"] == setup]
        if not rs:
            continue
        s = {"reps": len(rs), "makespan_s": mmm([r["makespan_s"] for r in rs]), "instances": {}}
        for n in names:
            s["instances"][n] = {
                key: mmm([r["instances"][n][key] for r in rs])
                for key in ("completion_s", "duration_s", "below_goal_s", "below_goal_stage_s",
                            "eligible_fraction", "eligible_windows", "mean_mib_s")}
        s["leftover_fraction"] = mmm([
            r["leftover"]["total_ge_90pct_maxb"] / r["leftover"]["eligible_windows"]
            for r in rs if r["leftover"]["eligible_windows"]])
        s["settled_after_s_max"] = mmm([
            max((x["settled_after_s"] for x in r["settle"] if x["settled_after_s"] is not None),
                default=None) for r in rs])
        s["settle_missing"] = sum(1 for r in rs for x in r["settle"] if x["settled_after_s"] is None)
        summary["setups"][setup] = s

    # The experiment's acceptance criteria.
    t = {}
    S = summary["setups"]
    if "maxmin" in S:
        t["maxmin_goal_windows"] = all(
            r["instances"][n]["eligible_fraction"] is None
            or r["instances"][n]["eligible_fraction"] >= ACCEPT
            for r in runs if r["setup"] == "maxmin" for n in names)
        for ref in ("blkio", "static"):
            if ref in S:
                t[f"maxmin_each_finishes_no_later_than_{ref}"] = all(
                    S["maxmin"]["instances"][n]["completion_s"]["median"]
                    <= S[ref]["instances"][n]["completion_s"]["median"] + 0.5 for n in names)
                t[f"maxmin_makespan_earlier_than_{ref}"] = (
                    S["maxmin"]["makespan_s"]["median"] < S[ref]["makespan_s"]["median"])
    if "baseline" in S:
        t["baseline_misses_goals"] = any(
            S["baseline"]["instances"][n]["below_goal_s"]["median"] > 0 for n in names)
    summary["criteria"] = t

    p = params
    mode = p.get("mode", "full")
    lines = [
        "# Per-application bandwidth (PAIO Fig. 10, scaled)", ""] + ([
        f"**A `run.sh --{mode}` run**: scaled down from the full experiment (params.json); "
        "not the published figures.", ""] if mode != "full" else []) + [
        f"MaxB {p['max_bandwidth_mib']} MiB/s (probe: {p['probe_mib']} MiB/s with "
        f"{len(names)} direct readers"
        + (f"; the setups' readers share a device throttled to {p['device_mib']} MiB/s"
           if p.get("device_mib") else "")
        + "), goals "
        + ", ".join(f"{n} {g / MIB:.0f}" for n, g in zip(names, p["goals"]))
        + f" MiB/s, epochs {p['epochs']} of {p['dataset_mib']} MiB, bs {p['bs']}, "
        f"starts {p['stagger_s']:g} s apart, control interval {p['interval_ms']} ms, "
        f"{p['reps']} repetition(s): median (min-max).", "",
        f"Below goal: a full 1-s window of activity under {TOL:.0%} of the goal "
        "(/proc/PID/io; stage statistics in brackets). Eligible: the window starts at least "
        "two control intervals after the last phase change and contains none. "
        f"Criterion: >= {ACCEPT:.0%} of eligible windows at >= {TOL:.0%} of the goal.", "",
        "| setup | instance | goal MiB/s | s below goal [stage] | eligible windows ok | "
        "completion s | mean MiB/s |",
        "|---|---|---|---|---|---|---|"]
    for setup, s in S.items():
        for n in names:
            d = s["instances"][n]
            ef = d["eligible_fraction"]
            lines.append(
                f"| {setup} | {n} | {p['goals'][names.index(n)] / MIB:.0f} | "
                f"{fmt(d['below_goal_s'])} [{fmt(d['below_goal_stage_s'])}] | "
                f"{fmt(ef, 2) if ef else '-'} of {fmt(d['eligible_windows'])} | "
                f"{fmt(d['completion_s'], 1)} | {fmt(d['mean_mib_s'])} |")
        lines.append(f"| {setup} | makespan | | | | {fmt(s['makespan_s'], 1)} | |")
    lines += ["", "| setup | eligible windows with total >= 90% MaxB | slowest settling after a "
              "phase change (s) | phase changes that never settled |", "|---|---|---|---|"]
    for setup, s in S.items():
        lines.append(f"| {setup} | {fmt(s['leftover_fraction'], 2)} | "
                     f"{fmt(s['settled_after_s_max'], 1)} | {s['settle_missing']} |")
    lines += ["", "Criteria: " + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in t.items()),
              "", f"Figure: fig.png (repetition {med_rep}); fig-r<N>.png per repetition."]
    ha.write_summary(out, summary, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
