#!/usr/bin/env python3
"""The analysis of examples/drft: reads OUT/params.json and every run's run.jsonl, writes
OUT/summary.json, OUT/summary.md and one figure per case and (workload, db) pair
(throughput per tenant over time, a panel per setup, like the paper's Fig. 8-11).

usage: analyze.py OUT

Measures (over the run after its warm-up; item usage is the drft object's per-tenant
usage_us, which it counts the same way under fifo):
  usage_mmr       min/max over tenants of item usage / weight
  throughput_tps  transactions committed per second, all tenants
  isolation       heavy_over_light_usage: the heavy tenants' mean usage / the light ones'
  weighted        usage_ratio (tenant 1 / tenant 2; weights 2:1) and weight_error_pct
  bursty          time_to_share_s: per joining tenant, from its join to the first bin
                  from which its usage over the rest of the phase is at least 90% of an
                  equal share (null: never); usage_mmr over the last phase
  strategy-proof  usage_gain_pct and tps_gain_pct: the inflating tenant's usage and
                  committed throughput over the honest tenants' mean, minus 1, in %
  utilisation     tps_before, tps_after (the remaining tenant alone), after_over_before
  overhead        overhead_pct (top level): the low-contention throughput's drop from
                  fifo's, the larger of drft-0 and drft-delta; overhead_high_pct:
                  drft-delta's drop from fifo's at high contention (fifo is the unfair
                  order compared with)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import analysis as ha  # noqa: E402

SHARE = 0.9  # bursty: a joiner has its share at 90% of an equal one


def load(path):
    out = {"bins": [], "end": None}
    for j in ha.read_jsonl(path):
        if j["kind"] == "bin":
            out["bins"].append(j)
        elif j["kind"] in ("end", "start"):
            out[j["kind"]] = j
    return out


def cum(bins, t, tenant, key):
    """The cumulative counter `key` of `tenant` at the last bin ending by t (0 before)."""
    v = 0
    for b in bins:
        if b["t"] > t + 1e-9:
            break
        for x in b["tenants"]:
            if x["tenant"] == tenant:
                v = x[key]
    return v


def commits(bins, t0, t1, tenant):
    return sum(x["commits"] for b in bins if t0 + 1e-9 < b["t"] <= t1 + 1e-9
               for x in b["tenants"] if x["tenant"] == tenant)


def window_usage(bins, t0, t1, tenants):
    return {t: cum(bins, t1, t, "usage_us") - cum(bins, t0, t, "usage_us") for t in tenants}


def mmr(values):
    vals = [v for v in values if v is not None]
    if not vals or max(vals) <= 0:
        return None
    return min(vals) / max(vals)


def r4(x):
    return None if x is None else round(x, 4)


def measure(r, data):
    plan = r["plan"]
    bins = data["bins"]
    dur = plan["duration_s"]
    t_end = max((b["t"] for b in bins if b["t"] <= dur + 1e-9), default=dur)
    t0 = r["warmup_s"]
    ids = [t["id"] for t in plan["tenants"]]
    weights = {int(k): v for k, v in plan["scheduler"].get("weights", {}).items()}
    out = {"name": r["case"], "variant": r["variant"], "setup": r["setup"], "db": r["db"],
           "workload": r["workload"], "tenants": len(ids), "run": r["run"]}
    end = data["end"] or {}
    tot = end.get("totals", {})
    sched = end.get("sched", {})
    out["admitted"] = sum(t.get("admitted", 0) for t in sched.get("tenants", []))
    out["committed"] = tot.get("committed", 0)
    out["retries_per_commit"] = r4(sum(t["retries"] for t in end.get("tenants", [])) /
                                   max(1, tot.get("committed", 0)))
    out["policy"] = sched.get("policy")

    def tps(a, b, tenants=ids):
        return sum(commits(bins, a, b, t) for t in tenants) / max(1e-9, b - a)

    def usage_mmr(a, b, tenants):
        u = window_usage(bins, a, b, tenants)
        return mmr([u[t] / weights.get(t, 1.0) for t in tenants]), u

    case = r["case"]
    info = r["info"]
    if case == "bursty":
        joins = {int(k): v for k, v in info["joins"].items()}
        last = max(joins.values())
        out["usage_mmr"], _ = usage_mmr(last + t0, t_end, ids)
        out["throughput_tps"] = tps(last + t0, t_end)
        tts = {}
        phase_ends = sorted(joins.values()) + [t_end]
        for j, tj in joins.items():
            pend = min(x for x in phase_ends if x > tj)
            active = [t for t in ids if t == j or joins.get(t, 0) <= tj]
            found = None
            for b in bins:
                start = b["t"] - plan["bin_ms"] / 1000
                if start < tj - 1e-9 or pend - start < (pend - tj) / 2:
                    continue
                u = window_usage(bins, start, pend, active)
                total = sum(u.values())
                if total > 0 and u[j] >= SHARE * total / len(active):
                    found = round(start - tj, 3)
                    break
            tts[str(j)] = found
        out["time_to_share_s"] = tts
        out["time_to_share_max_s"] = (None if any(v is None for v in tts.values())
                                      else max(tts.values()))
    elif case == "utilisation":
        leave = info["leave_s"]
        out["usage_mmr"], _ = usage_mmr(t0, leave, ids)
        before = tps(t0, leave)
        after = tps(leave + t0, t_end)
        out["throughput_tps"] = tps(t0, t_end)
        out["tps_before"], out["tps_after"] = before, after
        out["after_over_before"] = r4(after / before) if before > 0 else None
        c1b, c1a = tps(t0, leave, [ids[0]]), tps(leave + t0, t_end, [ids[0]])
        out["remaining_tenant_after_over_before"] = r4(c1a / c1b) if c1b > 0 else None
    else:
        out["usage_mmr"], u = usage_mmr(t0, t_end, ids)
        out["throughput_tps"] = tps(t0, t_end)
        if case == "isolation":
            heavy = set(info["heavy"])
            hu = [u[t] for t in ids if t in heavy]
            lu = [u[t] for t in ids if t not in heavy]
            if lu and sum(lu) > 0:
                out["heavy_over_light_usage"] = r4((sum(hu) / len(hu)) / (sum(lu) / len(lu)))
        elif case == "weighted":
            out["usage_ratio"] = r4(u[1] / u[2]) if u[2] > 0 else None
            if out["usage_ratio"] is not None:
                out["weight_error_pct"] = r4(abs(out["usage_ratio"] / 2 - 1) * 100)
        elif case == "strategy-proof":
            inf = info["inflator"]
            others = [t for t in ids if t != inf]
            mu = sum(u[t] for t in others) / len(others)
            mt = sum(commits(bins, t0, t_end, t) for t in others) / len(others)
            out["usage_gain_pct"] = r4((u[inf] / mu - 1) * 100) if mu > 0 else None
            ct = commits(bins, t0, t_end, inf)
            out["tps_gain_pct"] = r4((ct / mt - 1) * 100) if mt > 0 else None
            out["inflates"] = info["inflates"]
    out["usage_mmr"] = r4(out["usage_mmr"])
    for k in ("throughput_tps", "tps_before", "tps_after"):
        if k in out:
            out[k] = round(out[k], 1)
    return out


def overheads(cases):
    def tps(variant, setup, wl_db):
        for c in cases:
            if (c["name"], c["variant"], c["setup"], (c["workload"], c["db"])) == \
                    ("overhead", variant, setup, wl_db):
                return c["throughput_tps"]
        return None
    low, high = [], []
    pairs = sorted({(c["workload"], c["db"]) for c in cases if c["name"] == "overhead"})
    for p in pairs:
        f = tps("low", "fifo", p)
        for s in ("drft-0", "drft-delta"):
            x = tps("low", s, p)
            if f and x is not None:
                low.append((f - x) / f * 100)
        f, x = tps("high", "fifo", p), tps("high", "drft-delta", p)
        if f and x is not None:
            high.append((f - x) / f * 100)
    return (round(max(low), 2) if low else None, round(max(high), 2) if high else None)


def figure(out_dir, key, runs, datas):
    plt = ha.pyplot("analyze.py")
    if plt is None:
        return None
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.6), sharey=True,
                             squeeze=False)
    for ax, r, data in zip(axes[0], runs, datas):
        bin_s = r["plan"]["bin_ms"] / 1000
        heavy = set(r["info"].get("heavy", []))
        ids = [t["id"] for t in r["plan"]["tenants"]]
        for t in ids:
            xs = [b["t"] for b in data["bins"]]
            ys = [sum(x["commits"] for x in b["tenants"] if x["tenant"] == t) / bin_s
                  for b in data["bins"]]
            style = "-" if (t in heavy or not heavy) else "--"
            ax.plot(xs, ys, style, lw=1, label=f"t{t}" if len(ids) <= 8 else None)
        ha.time_panel(ax, f"{r['setup']}")
    axes[0][0].set_ylabel("committed txn/s per tenant")
    if len(runs[0]["plan"]["tenants"]) <= 8:
        axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.suptitle(key + ("  (solid: heavy, dashed: light)" if runs[0]["info"].get("heavy")
                        else ""))
    return ha.save_figure(fig, os.path.join(out_dir, f"fig-{key}.png"), dpi=90)


def main():
    out_dir = sys.argv[1]
    params = ha.read_params(out_dir)
    cases, groups, datas = [], {}, {}
    for r in params["runs"]:
        path = os.path.join(out_dir, "raw", r["run"], "run.jsonl")
        if not os.path.exists(path):
            continue
        data = load(path)
        datas[r["run"]] = data
        cases.append(measure(r, data))
        key = "-".join(x for x in (r["case"], r["variant"], r["workload"], r["db"]) if x)
        groups.setdefault(key, []).append(r)
    figures = [f for f in (figure(out_dir, k, rs, [datas[r["run"]] for r in rs])
                           for k, rs in groups.items()) if f]
    low, high = overheads(cases)
    summary = {"mode": params["mode"], "cases": cases, "overhead_pct": low,
               "overhead_high_pct": high, "overhead_baseline": "fifo",
               "delta_us": params["scaled"]["delta_us"], "slots": params["scaled"]["slots"],
               "figures": figures}

    cols = ["name", "variant", "workload", "db", "setup", "tenants", "usage_mmr",
            "throughput_tps", "retries_per_commit"]
    extra = ["heavy_over_light_usage", "usage_ratio", "weight_error_pct", "time_to_share_max_s",
             "usage_gain_pct", "tps_gain_pct", "after_over_before"]
    lines = [f"# DRFT on Sluice ({params['mode']})", "",
             f"Δ of drft-delta: {params['scaled']['delta_us']} µs; slots "
             f"{params['scaled']['slots']}. overhead_pct (low contention, vs fifo): {low}; "
             f"overhead_high_pct (drft-delta vs fifo, high contention): {high}.", "",
             "| " + " | ".join(cols) + " | other |", "|" + "---|" * (len(cols) + 1)]
    for c in cases:
        other = ", ".join(f"{k} {c[k]}" for k in extra if k in c)
        lines.append("| " + " | ".join(str(c.get(k, "")) for k in cols) + f" | {other} |")
    lines += ["", "Figures: " + ", ".join(figures)]
    ha.write_summary(out_dir, summary, lines)


if __name__ == "__main__":
    main()
