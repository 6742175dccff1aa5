#!/usr/bin/env python3
"""Summarises a run of examples/delta-fair's `cache` or `composition` experiment (run.sh
calls it): summary.json, summary.md and the figures, from OUT/params.json and
OUT/raw/<config>-r<rep>/node.jsonl.

usage: analyze_cache.py OUT

Per run (README.md, "What is measured"):
- ramp_extra_p99_ms: the p99 over the ramp-up readers of the time their return's
  MultiGet (their whole working set, due at the ramp) took; with nothing to refill, the
  time to read it from the cache.
- usage_at_ramp: what the ramp-up readers held in the cache just before the ramp.
- throughput: bytes every tenant read over the run, per second; throughput_vs_fair: over
  that of δ = inf (instantaneous fair sharing) in the same repetition.
- composition, p99_ms: the p99 over the ramp-up reader's write-backs of the time from
  the ramp to each write's completion (every write follows the whole MultiGet: the
  read-modify-write's end-to-end delay); read_ms: the MultiGet's part.
Repetitions are averaged (each repetition's figure is kept).
"""
import glob
import math
import os
import sys

from analyze import fmt, ha, mean, p99

MIB = 1024 * 1024
CLASSES = ["steady", "aggressive", "ramp"]
COLOURS = {"steady": "0.55", "aggressive": "tab:red", "ramp": "tab:blue"}


def run_metrics(lines):
    cfg = next(x for x in lines if x["type"] == "config")
    end = next(x for x in lines if x["type"] == "end")
    bins = [x for x in lines if x["type"] == "bin"]
    ramps = [x for x in lines if x["type"] == "ramp"]
    ids = [t["id"] for t in cfg["tenants"] if t["class"] == "ramp"]
    dur = cfg["duration_s"]
    before = max(0, int(round(cfg["ramp_at_s"] * 1e3 / cfg["bin_ms"])) - 1)
    writes = [us / 1e3 for r in ramps for us in r["write_lat_us"]]
    by_class = {c: [t for t in end["tenants"] if t["class"] == c] for c in CLASSES}
    m = {
        "ramp_extra_p99_ms": p99([r["multiget_us"] / 1e3 for r in ramps]),
        "usage_at_ramp": mean([bins[before]["cache_usage"][i - 1] for i in ids]) if bins else None,
        "throughput_mib_s": sum(t["bytes"] for t in end["tenants"]) / MIB / dur,
        "class_mib_s": {c: sum(t["bytes"] for t in ts) / MIB / dur for c, ts in by_class.items()},
        "steady_p99_ms": max((t.get("p99_ms", 0) for t in by_class["steady"]), default=None),
        "errors": end["errors"],
        "evictions_below_reserved": sum(t.get("cache", {}).get("evictions_below_reserved", 0)
                                        for t in end["tenants"]),
        "host_steal_pct": end.get("host_steal_pct"),
        "block_charge": cfg["block_charge"],
    }
    if writes:
        m["p99_ms"] = p99(writes)
        m["read_ms"] = m["ramp_extra_p99_ms"]
    # AMP as measured: bytes the device read per byte the cache inserted.
    dev = end.get("device") or {}
    read = sum(f.get("served_read_bytes", 0) for f in dev.get("flows", []))
    inserted = sum(t.get("cache", {}).get("inserted_bytes", 0) for t in end["tenants"])
    if read and inserted:
        m["measured_amp"] = read / inserted
    if end.get("control"):
        m["control"] = end["control"]
    return cfg, bins, m


def load(out, params):
    runs = {}
    for config, lines in ha.complete_runs(out, params["configs"], "analyze_cache.py"):
        runs.setdefault(config, []).append(run_metrics(lines))
    return runs


def aggregate(runs):
    agg = {}
    for c, rs in runs.items():
        ms = [m for _, _, m in rs]
        a = {k: mean([m.get(k) for m in ms]) for k in (
            "ramp_extra_p99_ms", "usage_at_ramp", "throughput_mib_s", "steady_p99_ms",
            "p99_ms", "read_ms", "measured_amp", "host_steal_pct")}
        a["reps"] = len(ms)
        a["ramp_extra_p99_ms_reps"] = [m["ramp_extra_p99_ms"] for m in ms]
        a["p99_ms_reps"] = [m.get("p99_ms") for m in ms]
        a["class_mib_s"] = {cl: mean([m["class_mib_s"][cl] for m in ms]) for cl in CLASSES}
        a["errors"] = sum(m["errors"] for m in ms)
        a["evictions_below_reserved"] = sum(m["evictions_below_reserved"] for m in ms)
        if "delta-inf" in runs and len(runs["delta-inf"]) == len(ms):
            a["throughput_vs_fair"] = mean([m["throughput_mib_s"] / f["throughput_mib_s"]
                                            for m, (_, _, f) in zip(ms, runs["delta-inf"])])
        agg[c] = a
    return agg


def kind_of(config):
    if config.startswith("delta-"):
        return config.split("-", 1)[1], 1
    if config.startswith("k"):
        return "750", int(config[1:])
    return None, 1


def cache_rows(params, agg):
    s, paper = params["scaled"], params["paper"]
    rows = []
    for c in params["configs"]:
        if c not in agg:
            continue
        d, k = kind_of(c)
        a = agg[c]
        res = params["reservations"].get(c, {}).get("cache")
        if res:
            pct = round(100 * res["reserved_fraction"], 3)
        else:
            pct = 100.0 if c == "static" else 0.0  # static: every tenant's share its own
        delta = None if d is None else (d if d == "inf" else int(d))
        rows.append({
            "config": c, "paper_delta_ms": delta, "delta_ms": delta, "k": k,
            "reserved_pct": pct,
            "reserved_bytes": res["reserved_bytes"] if res else None,
            "predicted_ms": res.get("refill_time_reserved_ms") if res else None,
            "ramp_extra_p99_ms": a["ramp_extra_p99_ms"],
            "ramp_extra_p99_ms_reps": a["ramp_extra_p99_ms_reps"],
            "usage_at_ramp_mib": a["usage_at_ramp"] / MIB if a["usage_at_ramp"] else 0.0,
            "throughput_vs_fair": a.get("throughput_vs_fair"),
            "throughput_mib_s": a["throughput_mib_s"],
            "aggressive_mib_s": a["class_mib_s"]["aggressive"],
            "steady_p99_ms": a["steady_p99_ms"],
            "measured_amp": a["measured_amp"],
            "evictions_below_reserved": a["evictions_below_reserved"],
            "paper_extra_p99_ms": (paper["table4"][d][0] if k == 1 and d in paper["table4"]
                                   else paper["table6"][str(k)][1] if d == "750" else None),
        })
    return rows


def composition_rows(params, agg):
    rows = []
    for c in params["configs"]:
        if c not in agg:
            continue
        b, cc = (int(x) for x in c[1:].split("-c"))
        a = agg[c]
        res = params["reservations"][c]
        rows.append({
            "config": c, "delta_buffer_ms": b, "delta_cache_ms": cc, "bound_ms": b + cc,
            "p99_ms": a["p99_ms"], "p99_ms_reps": a["p99_ms_reps"], "read_ms": a["read_ms"],
            "write_ms": (a["p99_ms"] - a["read_ms"]) if a["p99_ms"] is not None else None,
            "cache_reserved_pct": round(100 * res["cache"]["reserved_fraction"], 3),
            "buffer_reserved_bytes": res["write_buffer"]["reserved_bytes"],
            "predicted_read_ms": res["cache"].get("refill_time_reserved_ms"),
            "predicted_write_ms": res["write_buffer"].get("flush_time_ms"),
            "paper_p99_ms": params["paper"]["table5"].get(f"{b}/{cc}"),
            "throughput_mib_s": a["throughput_mib_s"]})
    return rows


def cache_targets(rows, s):
    t = []
    by = {r["config"]: r for r in rows}
    refill = s["refill_time_ms"]
    for r in rows:
        x, d = r["ramp_extra_p99_ms"], r["delta_ms"]
        if x is None or d is None:
            continue
        if d == 0:
            t.append({"target": f"δ = 0: no spike (extra p99 under 10% of the refill time, "
                                f"{0.1 * refill:.0f} ms)", "value": x, "ok": x <= 0.1 * refill})
        elif d == "inf":
            t.append({"target": f"δ = inf: extra p99 about the full refill time ({refill:.0f} ms, "
                                "within 0.5x..1.5x)", "value": x,
                      "ok": 0.5 * refill <= x <= 1.5 * refill})
        else:
            t.append({"target": f"{r['config']} (δ = {d} ms, k = {r['k']}): extra p99 at or "
                                "below δ", "value": x, "ok": x <= d})
    if "delta-750" in by and by["delta-750"]["throughput_vs_fair"] is not None:
        v = by["delta-750"]["throughput_vs_fair"]
        t.append({"target": "δ = 750 ms: throughput within 5% of δ = inf", "value": v,
                  "ok": v >= 0.95})
    seq = [by[c]["throughput_mib_s"] for c in ("delta-0", "delta-250", "delta-500",
                                               "delta-750", "delta-inf") if c in by]
    if len(seq) >= 2:
        t.append({"target": "throughput rises with δ (0, 250, 500, 750 ms, inf)",
                  "value": seq[-1] / seq[0],
                  "ok": all(b >= a for a, b in zip(seq, seq[1:]))})
    if "delta-750" in by and "static" in by:
        v = by["delta-750"]["throughput_mib_s"] / by["static"]["throughput_mib_s"]
        t.append({"target": "δ = 750 ms: throughput above static quotas", "value": v,
                  "ok": v > 1})
    for r in rows:
        if r["config"].startswith("k") or r["config"] == "delta-750":
            want = s["table6_pct"].get(str(r["k"]))
            if want is not None:
                t.append({"target": f"Table 6, k = {r['k']}: reserved {want}% of f",
                          "value": r["reserved_pct"], "ok": abs(r["reserved_pct"] - want) < 0.01})
    return t


def composition_targets(rows):
    return [{"target": f"δ_buffer = {r['delta_buffer_ms']}, δ_cache = {r['delta_cache_ms']}: "
                       f"read-modify-write p99 at or below {r['bound_ms']} ms",
             "value": r["p99_ms"], "ok": r["p99_ms"] is not None and r["p99_ms"] <= r["bound_ms"]}
            for r in rows]


def figures(out, params, runs, rows):
    plt = ha.pyplot("analyze_cache.py")
    if plt is None:
        return []
    configs = [c for c in params["configs"] if c in runs]
    offline, ramp, _ = params["times"]
    made = []
    # p99 read latency per class over time (Fig. 8), one panel per configuration.
    fig, axes = ha.panel_grid(plt, len(configs), 3.3, sharey=True)
    for ax, c in zip(axes.flat, configs):
        _, bins, _ = runs[c][0]
        for cls in CLASSES:
            # Bins without reads (the returning readers while offline) stay gaps.
            ys = [b["classes"][cls].get("p99_ms") or math.nan for b in bins]
            if any(not math.isnan(y) for y in ys):
                ax.plot([b["t"] for b in bins], ys, color=COLOURS[cls], label=cls, lw=1.2)
        ax.axvline(offline, color="k", ls=":", lw=0.8)
        ax.axvline(ramp, color="k", ls="--", lw=0.8)
        ha.time_panel(ax, c, "log")
    ha.label_grid(axes, "p99 read latency (ms)")
    made.append(ha.save_figure(fig, os.path.join(out, "fig-p99.png")))
    # Cache held per class over time (the tenant cache and static quotas).
    shown = [c for c in configs if c != "lru"]
    if shown:
        fig, axes = ha.panel_grid(plt, len(shown), 3.1, sharey=True)
        for ax, c in zip(axes.flat, shown):
            cfg, bins, _ = runs[c][0]
            for cls in CLASSES:
                idx = [i for i, t in enumerate(cfg["tenants"]) if t["class"] == cls]
                ax.plot([b["t"] for b in bins],
                        [sum(b["cache_usage"][i] for i in idx) / MIB for b in bins],
                        color=COLOURS[cls], label=cls, lw=1.2)
            ax.axvline(ramp, color="k", ls="--", lw=0.8)
            ha.time_panel(ax, c, "symlog", linthresh=1)
        ha.label_grid(axes, "cache per class (MiB)")
        made.append(ha.save_figure(fig, os.path.join(out, "fig-cache.png")))
    if params["experiment"] == "composition" and rows:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [r["bound_ms"] for r in rows]
        ax.scatter(xs, [r["p99_ms"] or 0 for r in rows], label="read-modify-write p99 (here)")
        ax.scatter(xs, [r["paper_p99_ms"] for r in rows], marker="x", label="paper (Table 5)")
        lim = max(xs + [r["p99_ms"] or 0 for r in rows]) * 1.1
        ax.plot([0, lim], [0, lim], "k:", lw=0.8, label="δ_buffer + δ_cache")
        ax.set_xlabel("δ_buffer + δ_cache (ms)")
        ax.set_ylabel("p99 (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        made.append(ha.save_figure(fig, os.path.join(out, "fig-composition.png")))
    return made


def line(t):
    v = t["value"]
    shown = (f"{v:.3f}" if isinstance(v, float) and v < 10
             else f"{v:g}" if isinstance(v, float) and v != int(v) and v < 100 else fmt(v))
    return f"- {'met' if t['ok'] else 'NOT met'}: {t['target']}: {shown}"


def markdown(summary, agg):
    pr, p, s = summary["params"], summary["params"]["paper"], summary["params"]["scaled"]
    offline, ramp, dur = pr["times"]
    L = [f"# Delta Fair Sharing for the read cache: experiment `{summary['experiment']}`", "",
         f"Mode `{pr['mode']}`, {pr['reps']} repetition(s); offline at {offline:g} s, return at "
         f"{ramp:g} s, of {dur:g} s; command: `{pr['command']}`", "",
         "## Setup: the paper's and the scaled one", "",
         "| | FairDB §7.2.2 / §7.3 | here |", "|---|---|---|",
         f"| scale | 1 | 1/{s['scale']:g} of every byte and bandwidth (times kept) |",
         f"| cache C | {p['cache_mb']} MB | {s['capacity'] / MIB:g} MiB, one shard |",
         f"| tenants | 32: 30 steady (1 goes offline), 2 aggressive | the same, as column "
         "families of one DB |",
         f"| fair share f | {p['fair_share_mb']} MB | {s['fair_share'] / MIB:g} MiB (working set "
         "sized in cache charge) |",
         f"| steady reader | {p['steady_mb_s']} MB/s, Zipfian | {s['steady_mib_s']:.4g} MiB/s, "
         "Zipfian θ 0.99, open loop |",
         f"| aggressive reader | {p['aggressive_mb_s']} MB/s, working set 4 f | "
         f"{s['aggressive_mib_s']:.4g} MiB/s at most, uniform over {s['aggressive_ws_factor']} f |",
         f"| device reads | {p['device_read_mb_s']} MB/s | {s['device_read_bps'] / MIB:.4g} MiB/s "
         "(a fair queue by tenant on foreground reads) |",
         f"| R_read / AMP (refill) | {p['refill_mb_s']} MB/s | {s['refill_bandwidth'] / MIB:.4g} "
         f"MiB/s (AMP {s['read_amplification']}) |",
         f"| refill time of f | {p['refill_time_ms']} ms | {s['refill_time_ms']:.0f} ms |",
         f"| offline, return | {p['offline_at_s']} s, {p['ramp_at_s']} s | {offline:g} s, "
         f"{ramp:g} s |"]
    if summary["experiment"] == "composition":
        L += [f"| write buffer | {p['buffer_mb']} MB, f {p['buffer_fair_share_mb']} MB | "
              f"{s['buffer_capacity'] / MIB:g} MiB, f {s['buffer_fair_share'] / MIB:g} MiB, "
              f"segment {s['segment'] / 1024:g} KiB |",
              f"| flush bandwidth | (I/O fair shared) | {s['flush_bandwidth'] / MIB:.3g} MiB/s: f in "
              f"{s['flush_time_ms']:.0f} ms |",
              f"| aggressive writers | {p['aggressive_write_mb_s']} MB/s | "
              f"{s['aggressive_write_mib_s']:.3g} MiB/s |"]
    rows = summary["rows"]
    if summary["experiment"] == "cache":
        L += ["", "## Table 4 (read cache) and Table 6, the paper's numbers beside ours", "",
              "| config | δ (ms) | k | reserved | predicted (ms) | extra p99, paper (ms) | "
              "extra p99, here (ms) | ramp-up's cache at return (MiB) | throughput (MiB/s) | "
              "vs δ = inf | steady p99 (ms) | AMP measured |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            L.append(f"| {r['config']} | {fmt(r['delta_ms']) if r['delta_ms'] != 'inf' else 'inf'}"
                     f" | {r['k']} | {r['reserved_pct']:.2f}% | {fmt(r['predicted_ms'])} | "
                     f"{fmt(r['paper_extra_p99_ms']) if r['paper_extra_p99_ms'] != '<1' else '<1'}"
                     f" | {fmt(r['ramp_extra_p99_ms'])} | {r['usage_at_ramp_mib']:.2f} | "
                     f"{r['throughput_mib_s']:.2f} | {fmt(r['throughput_vs_fair'], 3)} | "
                     f"{fmt(r['steady_p99_ms'], 1)} | {fmt(r['measured_amp'], 2)} |")
        L += ["", "Paper's system throughput (GB/s), Table 4: " + ", ".join(
            f"δ {d}: {v[1]}" for d, v in p["table4"].items()) + "; Table 6: " + ", ".join(
            f"k {k}: {v[2]}" for k, v in p["table6"].items()) + "."]
    else:
        L += ["", "## Table 5: read-modify-write p99 against δ_buffer + δ_cache", "",
              "| δ_buffer (ms) | δ_cache (ms) | bound (ms) | paper p99 (ms) | p99 here (ms) | "
              "read part (ms) | write part (ms) | predicted read + write (ms) | cache reserved | "
              "buffer reserved (KiB) |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            pred = (r["predicted_read_ms"] or 0) + (r["predicted_write_ms"] or 0)
            L.append(f"| {r['delta_buffer_ms']} | {r['delta_cache_ms']} | {r['bound_ms']} | "
                     f"{r['paper_p99_ms']} | {fmt(r['p99_ms'])} | {fmt(r['read_ms'])} | "
                     f"{fmt(r['write_ms'])} | {pred:.0f} | {r['cache_reserved_pct']:.1f}% | "
                     f"{r['buffer_reserved_bytes'] / 1024:.0f} |")
    L += ["", "## Targets", ""] + [line(t) for t in summary["targets"]]
    if summary.get("shutdown_failed"):
        L += ["", "Runs whose results are whole but whose node failed to shut down (exit "
              "status after its end line; see raw/*/shutdown-failed): "
              + ", ".join(summary["shutdown_failed"]) + "."]
    steal = [a["host_steal_pct"] for a in agg.values() if a.get("host_steal_pct") is not None]
    if steal:
        L += ["", f"Host steal during the runs: up to {max(steal):.1f}% of CPU time."]
    L += ["", "## Figures", ""] + [f"![{f}]({f})" for f in summary["figures"]] + [""]
    return "\n".join(L)


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out = sys.argv[1]
    params = ha.read_params(out)
    runs = load(out, params)
    if not runs:
        raise SystemExit(f"analyze_cache.py: no runs under {out}/raw")
    agg = aggregate(runs)
    s = params["scaled"]
    s["table6_pct"] = {k: v[0] for k, v in params["paper"]["table6"].items()}
    if params["experiment"] == "cache":
        rows = cache_rows(params, agg)
        targets = cache_targets(rows, s)
    else:
        rows = composition_rows(params, agg)
        targets = composition_targets(rows)
    summary = {"experiment": params["experiment"], "params": params, "rows": rows,
               "targets": targets, "detail": agg}
    summary["shutdown_failed"] = sorted(
        os.path.basename(os.path.dirname(p))
        for p in glob.glob(os.path.join(out, "raw", "*", "shutdown-failed")))
    summary["figures"] = figures(out, params, runs, rows)
    ha.write_summary(out, summary, markdown(summary, agg), prog="analyze_cache.py")


if __name__ == "__main__":
    main()
