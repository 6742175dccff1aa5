#!/usr/bin/env python3
"""Summarises an examples/flex results directory (run.sh calls it after run.py).

usage: analyze.py RESULTS_DIR

Experiment `sudden-load` (FlexEngine §5.3.1, Fig. 9): per setup (median over the
repetitions), the served fraction of the sudden-load partition's reads in the first
second of load, the seconds until it is served at >= 95% of its rate for good, read
latency (avg, p99, p99.9 over the load, from the due time; a read still unserved when
the run ended counts with the wait it had then, a lower bound); the background rate's following of a change of
write load (p1's ingest triples mid-run: seconds until its background rate reaches 90%
of Equation 3 at the new ingest); the node bucket's largest per-second sum over the
device's bandwidth (sluice; for the RocksDB setups the sum of every limiter's bytes).
Writes summary.json, summary.md and sudden-load.png (Fig. 9's panels plus the
background rate).

Experiment `bosr` (§5.3.2, Fig. 7 and 10): bosr_analyze.py.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import analysis as ha  # noqa: E402
from harness.analysis import median  # noqa: E402

MIB = 1024 * 1024
FULL = 0.95      # "served": at least 95% of the requested rate in a second
FOLLOW = 0.90    # "followed": the background rate at 90% of its new target



def load_bins(lines, cfg):
    bins = [x for x in lines if x["type"] == "bin"]
    start = cfg["idle_s"]
    end = cfg["idle_s"] + cfg["load_s"]
    return [b for b in bins if start - 1e-9 <= b["t"] < end - 1e-9], bins


def served_series(load):
    return [b["served"] / b["requested"] if b["requested"] > 0 else None for b in load]


def seconds_to_full(fracs, bin_s):
    """Seconds from the start of load until every later second is served at >= FULL;
    None when the last second is not."""
    k = len(fracs)
    while k > 0 and fracs[k - 1] is not None and fracs[k - 1] >= FULL:
        k -= 1
    return None if k == len(fracs) else k * bin_s


def bg_follow(bins, cfg, s, setup, path):
    """p1's background rate after its write load changed: the target is Equation 3 at
    the new ingest (the median bytes/s p1 wrote after the change), capped at the
    limiter's ceiling for auto-tuned; seconds from the change to the first sample at
    FOLLOW of it (None: not within the run)."""
    change = cfg["change_at_s"]
    bin_s = cfg["bin_ms"] / 1e3
    after = [b for b in bins if b["t"] >= change + bin_s]
    if change < 0 or not after or setup == "static":
        return None
    ingest = median([b["write_bytes"][1] / b["elapsed_s"] for b in after])
    before = [b for b in bins if b["t"] + bin_s <= change and b["t"] >= bin_s]
    ingest_before = median([b["write_bytes"][1] / b["elapsed_s"] for b in before])
    target = ingest * s["background_amplification"]
    if setup == "auto-tuned":
        target = min(target, s["auto_tuned_ceiling_mib"] * MIB)
    seconds = None
    for b in bins:
        t_sample = b["t"] + bin_s
        if t_sample > change and b["bg_rate"][1] >= FOLLOW * target:
            seconds = t_sample - change
            break
    # The daemon's own steps (sluice): when each step set p1's background rate, on the
    # wall clock, finer than the per-second samples.
    step_seconds = None
    steps_path = os.path.join(os.path.dirname(path), "policy.jsonl")
    if setup == "sluice" and "t0_unix_s" in cfg and os.path.exists(steps_path):
        change_unix = cfg["t0_unix_s"] + change
        for st in ha.read_jsonl(steps_path):
            p1 = st.get("report", {}).get("partitions", {}).get("p1", {})
            t = st.get("unix_time", 0)
            if t > change_unix and p1.get("background_rate", 0) >= FOLLOW * target:
                step_seconds = t - change_unix
                break
    return {"ingest_before_mib_s": ingest_before / MIB if ingest_before else None,
            "seconds_to_follow_by_policy_steps": step_seconds,
            "ingest_after_mib_s": ingest / MIB, "target_mib_s": target / MIB,
            "seconds_to_follow": seconds,
            "rate_mib_s": [round(b["bg_rate"][1] / MIB, 3) for b in bins]}


def p1_ingest(bins, cfg):
    """What p1 managed to write per second after its load tripled (MiB/s)."""
    after = [b for b in bins if b["t"] >= cfg["change_at_s"] + cfg["bin_ms"] / 1e3]
    if cfg["change_at_s"] < 0 or not after:
        return None
    return median([b["write_bytes"][1] / b["elapsed_s"] for b in after]) / MIB


def node_over(bins, s):
    device = s["device_mib"] * MIB
    xs = [b["node_bytes"] / b["elapsed_s"] / device for b in bins if b["elapsed_s"] > 0]
    return max(xs) if xs else None


def one_run(path, s, setup):
    lines = ha.read_jsonl(path)
    cfg = lines[0]
    end = lines[-1]
    load, bins = load_bins(lines, cfg)
    bin_s = cfg["bin_ms"] / 1e3
    fracs = served_series(load)
    reads = end["reads"]
    r = {"served_fraction_first_s": fracs[0] if fracs else None,
         "seconds_to_full_rate": seconds_to_full(fracs, bin_s),
         "served_fraction_mean": (sum(b["served"] for b in load) /
                                  max(1e-9, sum(b["requested"] for b in load))),
         "unserved_reads": sum(b.get("unserved", 0) for b in load),
         "avg_ms": reads.get("avg_ms"), "p99_ms": reads.get("p99_ms"),
         "p999_ms": reads.get("p999_ms"),
         "node_max_over_device": node_over(bins, s),
         "bg_follow": bg_follow(bins, cfg, s, setup, path),
         "p1_ingest_after_change_mib_s": p1_ingest(bins, cfg),
         "p1_put_p99_ms": next((w.get("p99_ms") for w in end["writers"]
                                if w["partition"] == "p1"), None),
         "served_series": fracs,
         "t_series": [b["t"] - cfg["idle_s"] for b in load],
         "p99_series": [b["latency"].get("p99_ms") for b in load],
         "avg_series": [b["latency"].get("avg_ms") for b in load],
         "p0_read_mib_s": [b["p0_fg_bytes"] / b["elapsed_s"] / MIB for b in load],
         "host_steal_pct": end.get("host_steal_pct"),
         "node_state": end.get("node_state")}
    return r


def summarize_sudden_load(results, params):
    s = params["scaled"]
    setups = []
    runs = {}
    for setup in params["setups"]:
        rs = []
        for rep in range(1, params["reps"] + 1):
            p = os.path.join(results, "raw", f"{setup}-r{rep}", "node.jsonl")
            if os.path.exists(p):
                rs.append(one_run(p, s, setup))
        if not rs:
            continue
        runs[setup] = rs
        row = {"name": setup, "reps": len(rs)}
        for k in ("served_fraction_first_s", "seconds_to_full_rate", "served_fraction_mean",
                  "unserved_reads", "p1_ingest_after_change_mib_s", "p1_put_p99_ms",
                  "avg_ms", "p99_ms", "p999_ms", "node_max_over_device", "host_steal_pct"):
            vals = [r[k] for r in rs]
            if k == "seconds_to_full_rate" and any(v is None for v in vals):
                # Not reached in some repetition: report "not within the run".
                row[k] = None
                row["full_rate_reached_in_reps"] = sum(v is not None for v in vals)
            else:
                row[k] = median(vals)
        follows = [r["bg_follow"] for r in rs if r["bg_follow"]]
        if follows:
            secs = [f["seconds_to_follow"] for f in follows]
            row["bg_follow_seconds"] = None if None in secs else median(secs)
            steps = [f.get("seconds_to_follow_by_policy_steps") for f in follows]
            if any(x is not None for x in steps):
                row["bg_follow_seconds_by_policy_steps"] = (None if None in steps
                                                             else median(steps))
            row["bg_follow_target_mib_s"] = median([f["target_mib_s"] for f in follows])
        setups.append(row)
    by = {r["name"]: r for r in setups}
    targets = {}
    if "sluice" in by:
        sl = by["sluice"]
        targets["sluice_served_first_s_ge_95pct"] = (
            sl["served_fraction_first_s"] is not None and sl["served_fraction_first_s"] >= FULL)
        # By the policy's own steps when the daemon reported them, else by the
        # per-second samples (which see a step up to one sample period late).
        by_steps = sl.get("bg_follow_seconds_by_policy_steps")
        targets["bg_follow_seconds"] = (by_steps if by_steps is not None
                                        else sl.get("bg_follow_seconds"))
        slack = 0 if by_steps is not None else s["bin_ms"] / 1e3
        targets["bg_follows_within_one_interval"] = (
            targets["bg_follow_seconds"] is not None and
            targets["bg_follow_seconds"] <= s["interval_ms"] / 1e3 + slack + 1e-6)
        targets["node_sum_within_1pct"] = (sl["node_max_over_device"] is not None and
                                           sl["node_max_over_device"] <= 1.01)
        ns = runs["sluice"][0]["node_state"] or {}
        classes = ns.get("classes") if isinstance(ns, dict) else None
        if classes:
            targets["node_classes"] = [
                {k: c.get(k) for k in ("name", "priority", "requests", "bytes", "waits",
                                       "wait_us_max", "queued")} for c in classes]
    if "auto-tuned" in by:
        at = by["auto-tuned"]
        targets["auto_tuned_needs_tens_of_seconds"] = (
            at["seconds_to_full_rate"] is None or at["seconds_to_full_rate"] >= 10)
    return {"experiment": "sudden-load", "mode": params["mode"], "object": params["object"],
            "object_note": params.get("object_note"), "daemon": params["daemon"],
            "repetitions": f"every figure is the median of {params['reps']} run(s); each "
                           "setup's host steal is in summary.json",
            "setups": setups, "targets": targets, "paper": params["paper"], "scaled": s,
            "series": {k: {"t": v[0]["t_series"], "served": v[0]["served_series"],
                           "p99_ms": v[0]["p99_series"], "avg_ms": v[0]["avg_series"],
                           "p0_read_mib_s": v[0]["p0_read_mib_s"],
                           "bg_follow": v[0]["bg_follow"]} for k, v in runs.items()}}


def fmt(v, spec="{:.3f}", none="not within the run"):
    return none if v is None else spec.format(v)


def write_md(results, summary):
    s = summary["scaled"]
    p = summary["paper"]
    out = ["# examples/flex: sudden-load (FlexEngine §5.3.1, Fig. 9)", "",
           f"Mode {summary['mode']}; buckets: `{summary['object']}`"
           + (f" ({summary['object_note']})" if summary.get("object_note") else "")
           + f"; daemon: {summary['daemon']}. Repetitions: {summary['repetitions']}.", "",
           "| setup | served, 1st s | s to full rate | mean served | avg ms | p99 ms | "
           "p99.9 ms | bg follows (s) | node max/device | p1 writes after x3 (MiB/s) | "
           "p1 put p99 ms |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["setups"]:
        out.append(f"| {r['name']} | {fmt(r['served_fraction_first_s'])} | "
                   f"{fmt(r['seconds_to_full_rate'], '{:g}')} | "
                   f"{fmt(r['served_fraction_mean'])} | {fmt(r['avg_ms'], '{:.2f}')} | "
                   f"{fmt(r['p99_ms'], '{:.2f}')} | {fmt(r['p999_ms'], '{:.2f}')} | "
                   f"{fmt(r.get('bg_follow_seconds'), '{:g}', 'n/a' if r['name'] == 'static' else 'not within the run')} | "
                   f"{fmt(r['node_max_over_device'])} | "
                   f"{fmt(r.get('p1_ingest_after_change_mib_s'), '{:.2f}', '-')} | "
                   f"{fmt(r.get('p1_put_p99_ms'), '{:.2f}', '-')} |")
    out += ["", "Targets: " + json.dumps({k: v for k, v in summary["targets"].items()
                                          if k != "node_classes"}), ""]
    if "node_classes" in summary["targets"]:
        out += ["Node bucket classes (sluice, end of run): "
                + json.dumps(summary["targets"]["node_classes"]), ""]
    out += ["## The paper's setup and the scaled one", "",
            "| | paper | here |", "|---|---|---|",
            f"| sudden-load partition | {p['items']:,} items of {p['item_bytes']} B | "
            f"{s['items']:,} items of {s['value_size']} B |",
            f"| idle, then load | {p['idle_s']} s, then {p['load_s']} s | "
            f"{s['idle_s']:g} s, then {s['load_s']:g} s |",
            f"| reads | {p['rcu_per_s']} Zipfian RCUs/s | {s['rcu_per_s']:g} Zipfian Gets/s "
            f"(theta {s['zipf_theta']}), {s['readers']} reader threads, open loop |",
            f"| co-located partitions | background write load | {s['partitions'] - 1} "
            f"writers at {s['write_mib']:g} MiB/s (p1 x{s['change_factor']:g} at "
            f"{s['change_at_s']:g} s) |",
            f"| memtable, L0/L1 trigger | {p['memtable_mb']} MB x{p['max_write_buffers']}, "
            f"{p['l0_l1_compaction_trigger_mb']} MB | {s['memtable_mib']:g} MiB x4, "
            f"{4 * s['memtable_mib']:g} MiB |",
            f"| device | ESSD | tmpfs; its bandwidth {s['device_mib']:g} MiB/s is the node "
            f"bucket (sluice) or the limiters' rates (RocksDB) |",
            f"| block cache | (not stated) | {s['block_cache_mib']:g} MiB per DB, so reads "
            "reach the device |",
            f"| auto-tuned | ceiling = partition max, refill {p['auto_tuned_refill_ms']} ms | "
            f"ceiling {s['auto_tuned_ceiling_mib']:g} MiB/s (the device), refill "
            f"{s['refill_ms']} ms: a ±5% step per 10 s |",
            f"| static | - | {s['static_mib']:g} MiB/s per DB (the device split evenly) |",
            f"| Equation 2 (p0) | RCU x 4 KB x RAF (<= 4) | {s['rcu_per_s']:g} x "
            f"{s['rcu_max_size']} B x {s['read_amplification']:g} = "
            f"{s['fg_p0'] / MIB:.1f} MiB/s |",
            f"| Equation 3 | ingest (1-min avg) x LSM-BA ({p['lsm_ba_measured']} measured) | "
            f"ingest ({s['ingest_window_s']} s window) x {s['background_amplification']} |",
            "", f"Paper (Fig. 9a): auto-tuned served {100 * p['auto_tuned_served_first_s']:.1f}% "
            f"in the first second and full rate after {p['auto_tuned_seconds_to_full_rate']} s; "
            "FlexEngine all from the first second.", ""]
    ha.write_summary(results, summary, out)


def plot(results, summary):
    plt = ha.pyplot("analyze.py")
    if plt is None:
        return
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    colors = {"auto-tuned": "tab:red", "static": "tab:orange", "sluice": "tab:blue"}
    rate = summary["scaled"]["rcu_per_s"]
    for name, ser in summary["series"].items():
        c = colors.get(name)
        served = [(x or 0) * rate for x in ser["served"]]
        ax[0][0].plot(ser["t"], served, label=name, color=c, marker=".")
        ax[0][1].plot(ser["t"], [x or None for x in ser["p99_ms"]], label=f"{name} p99",
                      color=c, marker=".")
        ax[0][1].plot(ser["t"], [x or None for x in ser["avg_ms"]], label=f"{name} avg",
                      color=c, linestyle=":")
        bf = ser.get("bg_follow")
        if bf:
            ax[1][1].plot(range(1, len(bf["rate_mib_s"]) + 1), bf["rate_mib_s"],
                          label=f"{name} p1 bg rate", color=c)
            ax[1][1].axhline(bf["target_mib_s"], color=c, linestyle=":", linewidth=0.8)
    ax[0][0].axhline(rate, color="gray", linestyle="--", label="requested")
    ax[0][0].set(title="(a) served reads per second", xlabel="s since the load began",
                 ylabel="reads/s")
    ax[0][1].set(title="(b) read latency per second", xlabel="s since the load began",
                 ylabel="ms", yscale="log")
    names = [r["name"] for r in summary["setups"]]
    width = 0.25
    for i, k in enumerate(("avg_ms", "p99_ms", "p999_ms")):
        ax[1][0].bar([j + i * width for j in range(len(names))],
                     [r[k] or 0 for r in summary["setups"]], width, label=k[:-3])
    ax[1][0].set_xticks([j + width for j in range(len(names))], names)
    ax[1][0].set(title="(c) read latency over the load", ylabel="ms", yscale="log")
    ch = summary["scaled"]["change_at_s"]
    ax[1][1].axvline(ch, color="gray", linestyle="--", label="p1's load x3")
    ax[1][1].set(title="(d) p1's background rate (dotted: Eq. 3 at the new ingest)",
                 xlabel="s since the start", ylabel="MiB/s")
    for a in ax.flat:
        a.legend(fontsize=7)
    ha.save_figure(fig, os.path.join(results, "sudden-load.png"), dpi=110)


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: analyze.py RESULTS_DIR")
    results = sys.argv[1]
    params = ha.read_params(results)
    if params["experiment"] == "bosr":
        import bosr_analyze
        bosr_analyze.main(results, params)
        return
    if params["experiment"] != "sudden-load":
        raise SystemExit(f"analyze.py: unknown experiment {params['experiment']!r}")
    summary = summarize_sudden_load(results, params)
    write_md(results, summary)
    plot(results, summary)
    for r in summary["setups"]:
        print(f"{r['name']:>10}: served 1st s {fmt(r['served_fraction_first_s'])}, "
              f"full rate after {fmt(r['seconds_to_full_rate'], '{:g}')} s, "
              f"p99 {fmt(r['p99_ms'], '{:.2f}')} ms, bg follows "
              f"{fmt(r.get('bg_follow_seconds'), '{:g}', 'n/a')} s, node max/device "
              f"{fmt(r['node_max_over_device'])}")


if __name__ == "__main__":
    main()
