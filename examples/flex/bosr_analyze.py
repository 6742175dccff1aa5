"""Summarises an examples/flex `bosr` results directory (analyze.py calls it).

Per (BOSR, setup), over the window (the bandwidth short), mean over the repetitions:
- served_pct_avg / max / min: the share of puts served without a stall, per partition,
  then the average, the largest and the smallest over the partitions. Served is
  FlexEngine's "normally served" WCU: RocksDB's write controller did not throttle the put
  (no write delay in its PerfContext and its partition in no stall condition, delayed
  or stopped, when it was issued or completed; a partition stalls from its slowdown
  trigger on), and it completed within served_ms (100 ms) of its due time;
  unthrottled_pct_avg / min: the first condition alone;
- avg_us, p99_us, p999_us: put latency from its due time (open loop), per partition,
  averaged over the partitions (as Fig. 10b);
- l0_max, stalled_s_avg, stall_micros (RocksDB's statistics), mem_peak_mib (the
  memtables and the bytes in L0 and L1 of every partition: what FlexEngine keeps in
  memory while it defers, Fig. 7b), bg_amplification (background bytes over the bytes
  written: the LSM-BA the run really had), node_use (the node bucket's bytes per second
  over its bandwidth);
- recovery_s: seconds from the end of the window until every partition's deferral state
  is normal (its options all restored), it is in no stall condition and its L0 is below
  the slowdown trigger (null: not within the run);
- gate_transitions, intra_l0 (the deferral setups).
Writes summary.json, summary.md, bosr-fig7.png and bosr-fig10.png.
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import analysis as ha  # noqa: E402
from harness.analysis import mean  # noqa: E402

MIB = 1024 * 1024
SETUP_LABEL = {"rocksdb": "RocksDB", "node": "RocksDB+Node",
               "first-stage": "RocksDB+Node+FirstStage", "sluice": "Sluice (full)"}



def one_run(path, s, bw):
    lines = ha.read_jsonl(path)
    cfg = lines[0]
    end = lines[-1]
    bins = [x for x in lines if x["type"] == "bin"]
    window = [b for b in bins if b["t"] <= cfg["window_s"] + 1e-9]
    served, unthrottled, avg, p99, p999 = [], [], [], [], []
    for p in end["partitions"]:
        w = p["window"]
        served.append(100.0 * w["served"] / w["puts"] if w["puts"] else None)
        unthrottled.append(100.0 * w["unthrottled"] / w["puts"] if w["puts"] else None)
        if w["puts"]:
            avg.append(w["avg_ms"] * 1e3)
            p99.append(w["p99_ms"] * 1e3)
            p999.append(w["p999_ms"] * 1e3)
    served_ok = [x for x in served if x is not None]
    written = sum(p["window"]["bytes"] for p in end["partitions"])
    bg = sum(sum(b["bg_bytes"]) for b in window)
    span = window[-1]["t"] if window else cfg["window_s"]
    mem = [sum(b["mem_bytes"]) + sum(b["l0_bytes"]) + sum(b["l1_bytes"]) for b in bins]
    row = {
        "served_pct_avg": mean(served_ok), "served_pct_max": max(served_ok, default=None),
        "served_pct_min": min(served_ok, default=None),
        "unthrottled_pct_avg": mean(unthrottled),
        "unthrottled_pct_min": min((x for x in unthrottled if x is not None), default=None),
        "avg_us": mean(avg), "p99_us": mean(p99), "p999_us": mean(p999),
        "puts": sum(p["window"]["puts"] for p in end["partitions"]),
        "l0_max": max((max(b["l0"]) for b in window), default=0),
        "stalled_s_avg": mean([p["stalled_s"] for p in end["partitions"]]),
        "stall_micros": sum(p["stall_micros"] for p in end["partitions"]),
        "mem_peak_mib": max(mem, default=0) / MIB,
        "mem_start_mib": (mem[0] if mem else 0) / MIB,
        "bg_amplification": bg / written if written else None,
        "node_use": sum(b["node_bytes"] for b in window) / span / bw if span > 0 else None,
        "recovery_s": end.get("recovery_s"),
        "errors": end["errors"],
    }
    if cfg.get("deferral"):
        row["gate_transitions"] = end.get("gate_transitions", 0)
        row["intra_l0"] = sum(p.get("actuator", {}).get("intra_l0", 0) for p in end["partitions"])
        row["deferred_partitions"] = sum(
            1 for p in end["partitions"] if p.get("gate", {}).get("deferrals", 0) > 0)
    series = {"t": [b["t"] for b in bins],
              "l0_mean": [statistics.fmean(b["l0"]) for b in bins],
              "l0_max": [max(b["l0"]) for b in bins],
              "mem_mib": [m / MIB for m in mem],
              "unserved": [sum(b["unserved"]) for b in bins],
              "puts": [sum(b["puts"]) for b in bins]}
    return row, series


def summarize(results, params):
    s = params["scaled"]
    rows, series = [], {}
    for bosr in params["bosrs"]:
        bw = s["node_bandwidth"][str(bosr)]
        for setup in params["setups"]:
            runs = []
            for rep in range(1, params["reps"] + 1):
                p = os.path.join(results, "raw", f"bosr{bosr:g}-{setup}-r{rep}", "node.jsonl")
                runs.append(one_run(p, s, bw))
            row = {"bosr": bosr, "setup": setup, "node_bandwidth_mib": bw / MIB}
            for k in runs[0][0]:
                vals = [r[0][k] for r in runs]
                row[k] = mean(vals) if all(isinstance(v, (int, float)) or v is None
                                           for v in vals) else vals[0]
            if any(r[0]["recovery_s"] is None for r in runs):
                row["recovery_s"] = None  # not recovered within one of the runs
            rows.append(row)
            series[f"{bosr:g}/{setup}"] = runs[0][1]
    return {"experiment": "bosr", "mode": params["mode"], "command": params.get("command"),
            "rows": rows, "targets": targets(rows), "paper": params["paper"], "scaled": s,
            "series": series}


def targets(rows):
    by = {(r["bosr"], r["setup"]): r for r in rows}
    t = {}
    full = [r for r in rows if r["setup"] == "sluice"]
    if full:
        t["sluice_serves_every_write"] = all(r["served_pct_min"] == 100.0 for r in full)
    short = [r for r in rows if r["setup"] == "rocksdb" and (r["served_pct_min"] or 0) < 100]
    t["rocksdb_not_all_served_at"] = [r["bosr"] for r in short]
    order = ["rocksdb", "node", "first-stage", "sluice"]
    mono = True
    for b in {r["bosr"] for r in rows}:
        have = [by[(b, x)]["served_pct_avg"] for x in order if (b, x) in by]
        mono = mono and all(x <= y + 1e-9 for x, y in zip(have, have[1:]))
    t["ablation_no_worse_each_step"] = mono
    top = max((r["bosr"] for r in rows), default=None)
    if (top, "rocksdb") in by and (top, "sluice") in by and by[(top, "sluice")]["p99_us"]:
        t["p99_rocksdb_over_sluice_at_top_bosr"] = (by[(top, "rocksdb")]["p99_us"] /
                                                    by[(top, "sluice")]["p99_us"])
    rec = [r["recovery_s"] for r in full]
    t["sluice_recovery_s_max"] = None if any(x is None for x in rec) or not rec else max(rec)
    return t


def fmt(v, spec="{:.1f}", none="-"):
    return none if v is None else spec.format(v)


def paper_served(paper, setup, bosr):
    u = paper["unserved_avg_pct"].get(setup, {}).get(f"{bosr:.1f}")
    return None if u is None else 100.0 - u


def write_md(results, summary):
    s, paper = summary["scaled"], summary["paper"]
    out = ["# examples/flex: compaction deferral under background over-subscription "
           "(FlexEngine §5.3.2)", "",
           f"Mode `{summary['mode']}`: {s['partitions']} partitions writing "
           f"{s['write_mib']:g} MiB/s each, a {s['window_s']:g} s window of short bandwidth "
           f"then {s['after_s']:g} s after it returns "
           f"({s['after_bandwidth'] / MIB:.1f} MiB/s). BOSR = background demand "
           f"({s['bg_total'] / MIB:.0f} MiB/s: ingest x LSM-BA {s['background_amplification']}) "
           f"over the node bandwidth less the foreground reservation "
           f"({s['fg_sum'] / MIB:.1f} MiB/s).", "",
           "Served: puts RocksDB's write controller did not throttle (no write delay, no "
           f"stall condition) and that completed within {s['served_ms']} ms of their due time, "
           "per partition over the window (unthrottled: the first condition alone). "
           "Latency from the put's due time, "
           "averaged over the partitions. Paper: Fig. 10a's average share served "
           "(100% less the unserved share it states; - where the text gives no number).", "",
           "| BOSR | setup | node MiB/s | served avg % (paper) | max % | min % | "
           "unthrottled avg % | avg us | "
           "p99 us | p99.9 us | L0 max | stalled s/partition | mem peak MiB | LSM-BA measured "
           "| node use | recovery s | gate transitions |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        ps = paper_served(paper, r["setup"], r["bosr"])
        out.append(
            f"| {r['bosr']:g} | {r['setup']} | {r['node_bandwidth_mib']:.1f} | "
            f"{fmt(r['served_pct_avg'], '{:.2f}')} ({fmt(ps)}) | "
            f"{fmt(r['served_pct_max'], '{:.2f}')} | {fmt(r['served_pct_min'], '{:.2f}')} | "
            f"{fmt(r['unthrottled_pct_avg'], '{:.2f}')} | "
            f"{fmt(r['avg_us'], '{:.0f}')} | {fmt(r['p99_us'], '{:.0f}')} | "
            f"{fmt(r['p999_us'], '{:.0f}')} | {r['l0_max']:.0f} | "
            f"{fmt(r['stalled_s_avg'], '{:.2f}')} | {fmt(r['mem_peak_mib'])} | "
            f"{fmt(r['bg_amplification'])} | {fmt(r['node_use'], '{:.2f}')} | "
            f"{fmt(r['recovery_s'], '{:.1f}', 'not within the run')} | "
            f"{r.get('gate_transitions', '-')} |")
    out += ["", "Targets (paper: Sluice 100% served at BOSR 1.5-3, each ablation step no worse, "
            "p99 -99.4% against RocksDB at BOSR 3):", ""]
    for k, v in summary["targets"].items():
        out.append(f"- {k}: {v}")
    out += ["", "Figures: bosr-fig7.png (L0 files and memory over time at the highest BOSR), "
            "bosr-fig10.png (served share and latency per BOSR and setup).", ""]
    ha.write_summary(results, summary, out)


def plot(results, summary):
    plt = ha.pyplot("analyze.py")
    if plt is None:
        return
    s, rows = summary["scaled"], summary["rows"]
    setups = [x for x in ["rocksdb", "node", "first-stage", "sluice"]
              if any(r["setup"] == x for r in rows)]
    bosrs = sorted({r["bosr"] for r in rows})
    top = bosrs[-1]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for setup in setups:
        ser = summary["series"].get(f"{top:g}/{setup}")
        if not ser:
            continue
        ax[0].plot(ser["t"], ser["l0_max"], label=f"{SETUP_LABEL[setup]} (max)")
        ax[1].plot(ser["t"], ser["mem_mib"], label=SETUP_LABEL[setup])
    for a in ax:
        a.axvline(s["window_s"], color="grey", ls="--", lw=0.8)
        a.set_xlabel("time (s); dashed: the bandwidth returns")
    ax[0].axhline(s["l0_slowdown"], color="red", ls=":", lw=0.8)
    ax[0].set_ylabel("L0 files (largest partition); dotted: slowdown trigger")
    ax[1].set_ylabel("memtables + L0 + L1, all partitions (MiB)")
    ax[0].legend(fontsize=7)
    fig.suptitle(f"Fig. 7 analogue: BOSR {top:g}")
    ha.save_figure(fig, os.path.join(results, "bosr-fig7.png"), dpi=110)

    fig, ax = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / max(1, len(setups))
    by = {(r["bosr"], r["setup"]): r for r in rows}
    for i, setup in enumerate(setups):
        xs, ys, lo, hi, p99 = [], [], [], [], []
        for j, b in enumerate(bosrs):
            r = by.get((b, setup))
            if not r or r["served_pct_avg"] is None:
                continue
            xs.append(j + i * width)
            ys.append(r["served_pct_avg"])
            lo.append(r["served_pct_avg"] - r["served_pct_min"])
            hi.append(r["served_pct_max"] - r["served_pct_avg"])
            p99.append(r["p99_us"])
        ax[0].bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=SETUP_LABEL[setup])
        ax[1].bar(xs, p99, width, label=SETUP_LABEL[setup])
    for a in ax:
        a.set_xticks([j + width * (len(setups) - 1) / 2 for j in range(len(bosrs))])
        a.set_xticklabels([f"BOSR {b:g}" for b in bosrs])
    ax[0].set_ylabel(f"writes served (%): no stall, <= {s['served_ms']} ms; bars min..max")
    ax[1].set_ylabel("write p99 (us, log)")
    ax[1].set_yscale("log")
    ax[0].legend(fontsize=7)
    fig.suptitle("Fig. 10 analogue")
    ha.save_figure(fig, os.path.join(results, "bosr-fig10.png"), dpi=110)


def main(results, params):
    summary = summarize(results, params)
    write_md(results, summary)
    plot(results, summary)
    print(f"analyze.py: {os.path.join(results, 'summary.md')}")
