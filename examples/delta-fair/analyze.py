#!/usr/bin/env python3
"""Summarises a run of examples/delta-fair (run.sh calls it): summary.json, summary.md
and the figures, from OUT/params.json and OUT/raw/<config>-r<rep>/node.jsonl.

usage: analyze.py OUT

Per run (README.md, "What is measured"):
- ramp_extra_p99_ms: p99 latency of the ramp-up tenants' batch puts (their fair share,
  all due at the ramp), from the ramp: how long reclaiming the fair share took (with
  nothing to wait for, the time to write it); batch_done_ms: when the last completed.
  followon_p99_ms: p99 of their puts due in the second after the ramp, after the batch;
  baseline_p99_ms: their p99 once settled (puts due from 2 s after the ramp to 0.5 s
  before the end).
- throughput: bytes every tenant wrote over the run, per second; throughput_vs_fair: over
  that of δ = inf (instantaneous fair sharing) in the same repetition.
- innocent_stall_s: over the steady tenants, the time each had a put waiting longer than
  the stall threshold (50 ms; 10 and 200 ms too), summed (tenant-seconds).
Repetitions are averaged (their spread is kept).
"""
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import analysis as ha  # noqa: E402
from harness.analysis import mean  # noqa: E402

MIB = 1024 * 1024
CLASSES = ["steady", "aggressive", "ramp"]
COLOURS = {"steady": "0.55", "aggressive": "tab:red", "ramp": "tab:blue"}
STALL_MS = 50
RAMP_WINDOW_S = 1.0
SETTLE_S = 2.0


def p99(values):
    return ha.percentile(values, 0.99)


def run_metrics(lines, params):
    cfg = next(x for x in lines if x["type"] == "config")
    end = next(x for x in lines if x["type"] == "end")
    bins = [x for x in lines if x["type"] == "bin"]
    t_ramp, dur = cfg["ramp_at_s"], cfg["duration_s"]
    followon, settled, batch_lat = [], [], []
    ramp_due_us = int(t_ramp * 1e6)
    for r in (x for x in lines if x["type"] == "ramp"):
        for due_us, lat_us in zip(r["due_us"], r["lat_us"]):
            due = due_us / 1e6
            if abs(due_us - ramp_due_us) <= 1:
                batch_lat.append(lat_us / 1e3)
            elif t_ramp <= due < t_ramp + RAMP_WINDOW_S:
                followon.append(lat_us / 1e3)
            elif t_ramp + SETTLE_S <= due < dur - 0.5:
                settled.append(lat_us / 1e3)
    batch_p99, followon_p99, base_p99 = p99(batch_lat), p99(followon), p99(settled)
    k = cfg["stall_thresholds_ms"].index(STALL_MS)
    by_class = {c: [t for t in end["tenants"] if t["class"] == c] for c in CLASSES}
    total = sum(t["bytes"] for t in end["tenants"])
    m = {
        "ramp_extra_p99_ms": batch_p99, "followon_p99_ms": followon_p99,
        "baseline_p99_ms": base_p99,
        "batch_done_ms": max(batch_lat) if batch_lat else None,
        "throughput_mib_s": total / MIB / dur,
        "class_mib_s": {c: sum(t["bytes"] for t in ts) / MIB / dur for c, ts in by_class.items()},
        "class_p99_ms": {c: max((t.get("p99_ms", 0) for t in ts), default=None)
                         for c, ts in by_class.items()},
        "innocent_stall_s": sum(t["stall_s"][k] for t in by_class["steady"]),
        "innocent_stall_s_by_threshold": {
            str(ms): sum(t["stall_s"][i] for t in by_class["steady"])
            for i, ms in enumerate(cfg["stall_thresholds_ms"])},
        "errors": end["errors"],
        "host_steal_pct": end.get("host_steal_pct"),
        "rocksdb_stall_s": end["rocksdb"]["stall_micros"] / 1e6,
    }
    if end.get("control"):
        m["control"] = end["control"]
    if isinstance(end.get("pool"), dict):
        m["pool_end"] = {k2: v for k2, v in end["pool"].items() if k2 != "flows"}
        m["pool_stalls"] = {c: sum(f.get("stalls", 0) for f in end["pool"].get("flows", [])
                                   if f.get("flow") in {t["id"] for t in by_class[c]})
                            for c in CLASSES}
    return cfg, bins, m


def fmt(x, digits=0):
    return "-" if x is None else f"{x:.{digits}f}"


def load(out, params):
    runs = {}
    for config, lines in ha.complete_runs(out, params["configs"], "analyze.py"):
        runs.setdefault(config, []).append(run_metrics(lines, params))
    return runs


def figures(out, params, runs):
    plt = ha.pyplot("analyze.py")
    if plt is None:
        return []
    configs = [c for c in params["configs"] if c in runs]
    t_ramp = params["ramp_at_s"]
    made = []

    def title(c):
        return "plain RocksDB" if c == "plain" else f"δ = {c.split('-', 1)[1]}" + (
            "" if c.endswith("inf") else " ms")

    # p99 per class over time (Fig. 7, top).
    fig, axes = ha.panel_grid(plt, len(configs), 3.4, sharey=True)
    for ax, c in zip(axes.flat, configs):
        _, bins, _ = runs[c][0]
        for cls in CLASSES:
            pts = [(b["t"], b["classes"][cls].get("p99_ms")) for b in bins]
            pts = [(t, v) for t, v in pts if v]
            if pts:
                ax.plot(*zip(*pts), color=COLOURS[cls], label=cls, lw=1.2)
        ax.axvline(t_ramp, color="k", ls="--", lw=0.8)
        if c.startswith("delta-") and not c.endswith("inf") and c != "delta-0":
            ax.axhline(float(c.split("-")[1]), color="tab:blue", ls=":", lw=0.8)
        ha.time_panel(ax, title(c), "log")
    ha.label_grid(axes, "p99 put latency (ms)")
    made.append(ha.save_figure(fig, os.path.join(out, "fig-p99.png"), dpi=110))

    # Buffer held per class (Fig. 7, bottom): memtable bytes, RocksDB's view.
    fig, axes = ha.panel_grid(plt, len(configs), 3.2, sharey=True)
    for ax, c in zip(axes.flat, configs):
        cfg, bins, _ = runs[c][0]
        ids = {cls: [i for i, t in enumerate(cfg["tenants"]) if t["class"] == cls]
               for cls in CLASSES}
        ts = [b["t"] for b in bins]
        for cls in CLASSES:
            ax.plot(ts, [sum(b["memtable_bytes"][i] for i in ids[cls]) / MIB for b in bins],
                    color=COLOURS[cls], label=cls, lw=1.2)
        ax.axhline(params["scaled"]["capacity"] / MIB, color="k", ls=":", lw=0.8)
        ax.axvline(t_ramp, color="k", ls="--", lw=0.8)
        ha.time_panel(ax, title(c))
    ha.label_grid(axes, "memtables per class (MiB)")
    made.append(ha.save_figure(fig, os.path.join(out, "fig-buffer.png"), dpi=110))

    # The ramp-up, zoomed: how fast the ramp-up tenants got their fair share back (the
    # share of their batch puts completed, by time after the ramp), with δ marked.
    fig, ax = plt.subplots(figsize=(7, 4))
    for c in configs:
        path = sorted(glob.glob(os.path.join(out, "raw", f"{c}-r*", "node.jsonl")))[0]
        done = []
        for r in (x for x in ha.read_jsonl(path) if x["type"] == "ramp"):
            done += [lat / 1e6 for d, lat in zip(r["due_us"], r["lat_us"])
                     if abs(d - int(t_ramp * 1e6)) <= 1]
        done.sort()
        if done:
            line, = ax.step([0.0] + done, [0.0] + [(i + 1) / len(done) for i in
                                                   range(len(done))], where="post",
                            label=title(c), lw=1.4)
            if c.startswith("delta-") and not c.endswith("inf"):
                ax.axvline(float(c.split("-")[1]) / 1e3, color=line.get_color(), ls=":",
                           lw=0.8)
    ax.set_xlabel("s after the ramp (dotted: δ)")
    ax.set_ylabel("ramp-up batches completed (share)")
    ax.set_xlim(0, 2.0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    made.append(ha.save_figure(fig, os.path.join(out, "fig-ramp.png"), dpi=110))
    return made


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out = sys.argv[1]
    params = ha.read_params(out)
    runs = load(out, params)
    if not runs:
        raise SystemExit(f"analyze.py: no runs under {out}/raw")
    s, paper = params["scaled"], params["paper"]
    agg = {}
    for c, rs in runs.items():
        ms = [m for _, _, m in rs]
        a = {k: mean([m[k] for m in ms]) for k in (
            "followon_p99_ms", "baseline_p99_ms", "ramp_extra_p99_ms", "batch_done_ms",
            "throughput_mib_s", "innocent_stall_s", "rocksdb_stall_s")}
        a["reps"] = len(ms)
        a["ramp_extra_p99_ms_reps"] = [m["ramp_extra_p99_ms"] for m in ms]
        a["class_mib_s"] = {cl: mean([m["class_mib_s"][cl] for m in ms]) for cl in CLASSES}
        a["class_p99_ms"] = {cl: mean([m["class_p99_ms"][cl] for m in ms]) for cl in CLASSES}
        a["innocent_stall_s_by_threshold"] = {
            t: mean([m["innocent_stall_s_by_threshold"][t] for m in ms])
            for t in ms[0]["innocent_stall_s_by_threshold"]}
        a["errors"] = sum(m["errors"] for m in ms)
        for key in ("control", "pool_end", "pool_stalls"):
            if key in ms[-1]:
                a[key] = ms[-1][key]
        # Throughput against δ = inf of the same repetition.
        if "delta-inf" in runs and len(runs["delta-inf"]) == len(ms):
            a["throughput_vs_fair"] = mean([m["throughput_mib_s"] / f["throughput_mib_s"]
                                            for m, (_, _, f) in zip(ms, runs["delta-inf"])])
        agg[c] = a
    rows = []
    for c in params["configs"]:
        if not c.startswith("delta-") or c not in agg:
            continue
        d = c.split("-", 1)[1]
        wb = params["reservations"][c]
        a = agg[c]
        rows.append({
            "paper_delta_ms": d if d == "inf" else int(d), "delta_ms": d if d == "inf" else int(d),
            "reserved_pct": round(100 * wb["reserved_fraction"], 2),
            "reserved_bytes": wb["reserved_bytes"],
            "reservation_source": wb.get("source"),
            # What is left to flush once the reservation is used, at R_write.
            "predicted_delay_ms": wb.get("flush_time_ms"),
            "ramp_extra_p99_ms": a["ramp_extra_p99_ms"],
            "followon_p99_ms": a["followon_p99_ms"], "baseline_p99_ms": a["baseline_p99_ms"],
            "batch_done_ms": a["batch_done_ms"],
            "throughput_vs_fair": a.get("throughput_vs_fair"),
            "throughput_mib_s": a["throughput_mib_s"],
            "innocent_stall_s": a["innocent_stall_s"],
            "paper_reserved_pct": paper["table4"][d][0],
            "paper_extra_p99_ms": paper["table4"][d][1],
            "detail": a})
    summary = {"experiment": "buffer", "params": params, "rows": rows}
    if "plain" in agg:
        summary["plain_rocksdb"] = dict(agg["plain"], stall_threshold_ms=STALL_MS)
    summary["targets"] = targets(rows, agg, s)
    summary["figures"] = figures(out, params, runs)
    ha.write_summary(out, summary, markdown(summary, agg), prog="analyze.py")


def targets(rows, agg, s):
    t = []
    by = {str(r["paper_delta_ms"]): r for r in rows}
    flush_ms = s["flush_time_ms"]
    for d, r in by.items():
        x = r["ramp_extra_p99_ms"]
        if x is None:
            continue
        if d == "0":
            t.append({"target": "δ = 0: no spike (extra p99 under 10% of the flush time, "
                                f"{0.1 * flush_ms:.0f} ms)", "value": x,
                      "ok": x <= 0.1 * flush_ms})
        elif d == "inf":
            t.append({"target": f"δ = inf: extra p99 about the full flush time ({flush_ms:.0f} "
                                "ms, within 0.5x..1.5x)", "value": x,
                      "ok": 0.5 * flush_ms <= x <= 1.5 * flush_ms})
        else:
            t.append({"target": f"δ = {d} ms: extra p99 at or below δ", "value": x,
                      "ok": x <= float(d)})
    if "350" in by and "inf" in by and by["350"]["throughput_vs_fair"] is not None:
        v = by["350"]["throughput_vs_fair"]
        t.append({"target": "δ = 350 ms: throughput within 5% of δ = inf", "value": v,
                  "ok": v >= 0.95})
    if "350" in by and "0" in by:
        a, b = by["350"]["throughput_mib_s"], by["0"]["throughput_mib_s"]
        t.append({"target": "δ = 350 ms: throughput above δ = 0", "value": a / b, "ok": a > b})
    if "plain" in agg and by:
        worst = max(r["innocent_stall_s"] for r in rows)
        p = agg["plain"]["innocent_stall_s"]
        t.append({"target": "plain RocksDB: steady tenants stalled (innocent_stall_s > 0, above "
                            "every gated configuration's)", "value": p,
                  "ok": p > 0 and p > worst})
    return t


def markdown(summary, agg):
    p, s = summary["params"]["paper"], summary["params"]["scaled"]
    pr = summary["params"]
    L = ["# Delta Fair Sharing for the write buffer: FairDB §7.2.1 on Sluice", "",
         f"Mode `{pr['mode']}`, {pr['reps']} repetition(s), ramp at {pr['ramp_at_s']:g} s of "
         f"{pr['duration_s']:g} s; command: `{pr['command']}`", "",
         "## Setup: the paper's and the scaled one", "",
         "| | FairDB §7.2.1 | here |", "|---|---|---|",
         f"| scale | 1 | 1/{s['scale']:g} of every byte and bandwidth (times kept) |",
         f"| write buffer C | {p['buffer_mb']} MB | {s['capacity'] / MIB:g} MiB |",
         f"| tenants | {p['tenants']} ({p['steady']} steady, {p['aggressive']} aggressive, "
         f"{p['ramp']} ramp-up) | the same, as column families of one DB |",
         f"| fair share f = C/16 | {p['fair_share_mb']} MB | {s['fair_share'] / MIB:g} MiB |",
         f"| segment B (flush unit) | {p['segment_mb']} MB | {s['segment'] / MIB:g} MiB "
         "(the column family's write_buffer_size) |",
         f"| device write bandwidth | {p['device_mb_s']} MB/s | "
         f"{s['device_bytes_s'] / MIB:.3f} MiB/s (a fair queue by tenant on flush writes) |",
         f"| steady writers | 12 x {p['steady_mb_s']} MB/s | 12 x {s['steady_mib_s']:.4g} MiB/s |",
         f"| aggressive writers | 2 x {p['aggressive_mb_s']} MB/s | 2 x "
         f"{s['aggressive_mib_s']:.4g} MiB/s ({s['aggressive_factor']:g}x the paper's, see "
         "README) |",
         f"| R_write (flush bandwidth left to the aggressive ones) | {p['flush_bandwidth_mb_s']} "
         f"MB/s | {s['flush_bandwidth'] / MIB:.4g} MiB/s |",
         f"| flush time of k·f, k = {p['k']} | {p['flush_time_ms']} ms | "
         f"{s['flush_time_ms']:.0f} ms |",
         f"| puts | {p['put_kb']} KB, open loop | 4 KiB values, 16 B keys, open loop, no WAL |",
         f"| ramp-up | batch of f at {p['ramp_at_s']} s, then 50 MB/s | batch of f at "
         f"{pr['ramp_at_s']:g} s (1024 puts due at once), then {s['steady_mib_s']:.4g} MiB/s |",
         "| compaction | 30% of the bandwidth dedicated | off (L0 grows; the run is short) |",
         f"| reservation rounding | the paper's (nearest segment) | `{pr['rounding']}` |",
         "", "## Table 4 (write buffer), the paper's numbers beside ours", "",
         "| δ (ms) | reserved, paper | reserved, here | extra p99, paper (ms) | extra p99, here "
         "(ms) | predicted (ms) | batch done (ms) | next 1 s p99 (ms) | throughput vs δ = inf "
         f"| steady stall > {STALL_MS} ms (tenant-s) |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        L.append(f"| {r['paper_delta_ms']} | {r['paper_reserved_pct']}% | "
                 f"{r['reserved_pct']:.1f}% ({r['reserved_bytes'] / MIB:g} MiB) | "
                 f"{r['paper_extra_p99_ms']} | {fmt(r['ramp_extra_p99_ms'])} | "
                 f"{fmt(r['predicted_delay_ms'])} | {fmt(r['batch_done_ms'])} | "
                 f"{fmt(r['followon_p99_ms'])} | {fmt(r['throughput_vs_fair'], 3)} | "
                 f"{fmt(r['innocent_stall_s'], 2)} |")
    if "plain_rocksdb" in summary:
        pl = summary["plain_rocksdb"]
        L += ["", "## Plain RocksDB (one WriteBufferManager of C, allow_stall, no gate)", "",
              f"- steady tenants stalled (a put waiting > {STALL_MS} ms): "
              f"{pl['innocent_stall_s']:.2f} tenant-s over {pr['duration_s']:g} s "
              f"({pl['innocent_stall_s'] / s['steady']:.2f} s per tenant); by threshold: "
              + ", ".join(f"> {k} ms {v:.2f}" for k, v in
                          pl["innocent_stall_s_by_threshold"].items()),
              f"- ramp-up batch p99 {fmt(pl['ramp_extra_p99_ms'])} ms, batch done "
              f"{fmt(pl['batch_done_ms'])} ms; throughput {pl['throughput_mib_s']:.2f} MiB/s"
              + (f" ({pl['throughput_vs_fair']:.3f} of δ = inf)" if pl.get("throughput_vs_fair")
                 else ""),
              "- p99 per class (max over its tenants, ms): " + ", ".join(
                  f"{c} {fmt(v)}" for c, v in pl["class_p99_ms"].items())]
    L += ["", "## Per configuration", "",
          "| configuration | MiB/s steady | aggressive | ramp-up | all | p99 steady (ms) | "
          "p99 aggressive (ms) | ramp-up p99: batch / next 1 s / settled (ms) |",
          "|---|---|---|---|---|---|---|---|"]
    for c, a in agg.items():
        cm, cp = a["class_mib_s"], a["class_p99_ms"]
        L.append(f"| {c} | {cm['steady']:.2f} | {cm['aggressive']:.2f} | {cm['ramp']:.2f} | "
                 f"{a['throughput_mib_s']:.2f} | {fmt(cp['steady'], 1)} | "
                 f"{fmt(cp['aggressive'])} | {fmt(a['ramp_extra_p99_ms'])} / "
                 f"{fmt(a['followon_p99_ms'])} / {fmt(a['baseline_p99_ms'], 1)} |")
    L += ["", "## Targets", ""]
    for t in summary["targets"]:
        v = t["value"]
        L.append(f"- {'met' if t['ok'] else 'NOT met'}: {t['target']}: "
                 f"{v:.3f}" if isinstance(v, float) and v < 10 else
                 f"- {'met' if t['ok'] else 'NOT met'}: {t['target']}: {fmt(v)}")
    L += ["", "## Figures", ""] + [f"![{f}]({f})" for f in summary["figures"]] + [""]
    return "\n".join(L)


if __name__ == "__main__":
    main()
