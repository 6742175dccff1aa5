#!/usr/bin/env python3
"""Plots and summary of examples/silk runs (PAIO FAST'22 §9.2, Figs. 5-7 style).

usage: analyze.py RESULTS_DIR [--no-plots]

Reads RESULTS_DIR/raw/<workload>/<setup>-r<rep>.jsonl (silk_bench run output), the
Sluice+SILK policy logs next to them (the daemon's --report-log) and RESULTS_DIR/params.json
(run.sh's parameters, repeated in summary.json); writes RESULTS_DIR/summary.md,
summary.json and fig-<workload>.png (throughput and p99 per second, one row per setup) and
fig-<workload>-silk.png (the rates the SILK policy gave each flow).

Metrics per run (min/median/max over repetitions in the summary):
  mean_kops        operations completed / run length (kops/s)
  peak_p99_ms      p99 over all operations issued during peaks
  valley_p99_ms    p99 over all operations issued during the short valleys
  initial_p99_ms   p99 over all operations issued during the initial valley
  peak_p99_sec_ms  mean of the per-second p99 over peak seconds
  max_p99_ms       largest per-second p99
  variability_ms   PAIO's variability (footnote 2): the mean absolute deviation of the
                   per-second p99 from its mean, over the whole run
  stall_s          RocksDB write-stall time (STALL_MICROS), summed
  pending_end_mib  RocksDB's estimate of pending compaction bytes at the end (the
                   backlog a setup leaves behind: what throttling compactions costs)
  host_steal_pct   the share of the machine's CPU time the hypervisor gave to other
                   guests during the run (silk_bench reads /proc/stat): a tail that
                   moves with it is the host's
  peak_steal_pct   the same, mean over peak seconds
  peak_p99_sec_quiet_ms  mean per-second p99 over the peak seconds in which the host
                   stole under QUIET_STEAL_PCT of the CPU (PAIO's measure, with the
                   seconds the hypervisor decided left out; quiet_peak_s counts them)

Acceptance criteria (summary.md's last table, summary.json's "criteria"): what Sluice+SILK
has to show against RocksDB and the auto-tuned limiter (tail latency in peaks,
throughput), checked on medians; criteria() lists them.
"""
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import analysis as ha  # noqa: E402
from harness.analysis import read_jsonl  # noqa: E402

SETUP_ORDER = ["plain", "bound", "auto", "static", "sluice"]
SETUP_NAMES = {
    "plain": "RocksDB",
    "bound": "RocksDB + stage, no policy",
    "auto": "RocksDB, auto-tuned limiter",
    "static": "RocksDB, static limiter",
    "sluice": "Sluice+SILK",
}
WORKLOAD_ORDER = ["mixture", "read-heavy", "write-heavy"]
METRICS = [
    ("mean_kops", "mean kops/s"),
    ("peak_p99_ms", "p99 peaks (ms)"),
    ("valley_p99_ms", "p99 valleys (ms)"),
    ("initial_p99_ms", "p99 initial valley (ms)"),
    ("peak_p99_sec_ms", "mean per-s p99 in peaks (ms)"),
    ("max_p99_ms", "max per-s p99 (ms)"),
    ("variability_ms", "variability (ms)"),
    ("stall_s", "write stall (s)"),
    ("pending_end_mib", "backlog at end (MiB)"),
    ("host_steal_pct", "host steal (%)"),
    ("peak_steal_pct", "host steal in peaks (%)"),
    ("peak_p99_sec_quiet_ms", "per-s p99 in peaks, steal < 5% (ms)"),
    ("quiet_peak_s", "peak seconds, steal < 5%"),
]
# A peak second in which the host stole less than this share of the CPU counts as quiet.
QUIET_STEAL_PCT = 5.0



def load_run(path):
    lines = read_jsonl(path)
    config = next((l for l in lines if l.get("type") == "config"), None)
    seconds = [l for l in lines if l.get("type") == "second"]
    end = next((l for l in lines if l.get("type") == "end"), None)
    if config is None or end is None or not seconds:
        return None
    policy = []
    plog = path[: -len(".jsonl")] + ".policy.jsonl"
    if os.path.exists(plog):
        for rec in read_jsonl(plog):
            stages = rec.get("report", {}).get("stages", {})
            for name, rep in stages.items():
                policy.append({"t": rec["unix_time"] - end["t0_unix"], "stage": name, **rep})
    return {"config": config, "seconds": seconds, "end": end, "policy": policy, "path": path}


def mad(values):
    if not values:
        return 0.0
    m = sum(values) / len(values)
    return sum(abs(v - m) for v in values) / len(values)


def metrics(run):
    end = run["end"]
    phases = end.get("phases", {})
    secs = [s for s in run["seconds"] if s["ops"] > 0]
    p99 = [s["p99_us"] / 1e3 for s in secs]
    peak = [s["p99_us"] / 1e3 for s in secs if s["phase"] == "peak"]
    peak_steal = [s["host_steal_pct"] for s in secs
                  if s["phase"] == "peak" and s.get("host_steal_pct", -1) >= 0]
    quiet = [s["p99_us"] / 1e3 for s in secs if s["phase"] == "peak"
             and 0 <= s.get("host_steal_pct", -1) < QUIET_STEAL_PCT]

    def phase_p99(name):
        ph = phases.get(name)
        return ph["p99_us"] / 1e3 if ph and ph["ops"] > 0 else None

    return {
        "mean_kops": end["ops"] / end["seconds"] / 1e3,
        "peak_p99_ms": phase_p99("peak"),
        "valley_p99_ms": phase_p99("valley"),
        "initial_p99_ms": phase_p99("initial"),
        "peak_p99_sec_ms": sum(peak) / len(peak) if peak else None,
        "max_p99_ms": max(p99) if p99 else None,
        "variability_ms": mad(p99),
        "stall_s": sum(s.get("stall_ms", 0) for s in run["seconds"]) / 1e3,
        "pending_end_mib": run["seconds"][-1].get("pending_compaction_mib"),
        "host_steal_pct": end.get("host_steal_pct"),
        "peak_steal_pct": sum(peak_steal) / len(peak_steal) if peak_steal else None,
        "peak_p99_sec_quiet_ms": sum(quiet) / len(quiet) if quiet else None,
        "quiet_peak_s": len(quiet) if peak_steal else None,
        "errors": end.get("errors", 0),
    }


def spread(values):
    return ha.spread(values, count=True)


def fmt(s, digits=2):
    return ha.fmt_spread(s, digits, none="n/a")


def collect(results):
    runs = {}
    for path in sorted(glob.glob(os.path.join(results, "raw", "*", "*-r*.jsonl"))):
        if path.endswith(".policy.jsonl"):
            continue
        run = load_run(path)
        if run is None:
            print(f"analyze.py: skipping incomplete run {path}", file=sys.stderr)
            continue
        key = (run["config"]["workload"], run["config"]["setup"])
        runs.setdefault(key, []).append(run)
    return runs


def summarize(runs):
    summary = {}
    for (workload, setup), rs in runs.items():
        ms = [metrics(r) for r in rs]
        entry = {name: spread([m[name] for m in ms]) for name, _ in METRICS}
        entry["runs"] = [{"file": os.path.relpath(r["path"]), **m} for r, m in zip(rs, ms)]
        summary.setdefault(workload, {})[setup] = entry
    # Against plain RocksDB and the auto-tuned limiter (ratios of medians).
    for workload, by_setup in summary.items():
        for setup, e in by_setup.items():
            for ref in ("plain", "auto"):
                r = by_setup.get(ref)
                if r is None or setup == ref:
                    continue
                cmp = {}

                def med(entry, name):
                    return entry[name]["median"] if entry.get(name) else None

                if med(e, "peak_p99_ms") and med(r, "peak_p99_ms"):
                    cmp["peak_p99_reduction"] = med(r, "peak_p99_ms") / med(e, "peak_p99_ms")
                if med(e, "mean_kops") and med(r, "mean_kops"):
                    cmp["throughput_ratio"] = med(e, "mean_kops") / med(r, "mean_kops")
                if med(e, "variability_ms") and med(r, "variability_ms"):
                    cmp["variability_reduction"] = (med(r, "variability_ms") /
                                                    med(e, "variability_ms"))
                e[f"vs_{ref}"] = cmp
    return summary


def paired(summary, workload, setup, ref, name):
    """Ratios ref/setup of metric `name`, pairing runs by repetition tag (run.sh runs a
    repetition's setups back to back), as min/median/max; None without pairs."""
    by_setup = summary.get(workload, {})
    if setup not in by_setup or ref not in by_setup:
        return None

    def by_tag(entry):
        return {os.path.basename(r["file"]).rsplit("-", 1)[1]: r[name] for r in entry["runs"]}

    mine, theirs = by_tag(by_setup[setup]), by_tag(by_setup[ref])
    return spread([theirs[t] / mine[t] for t in sorted(mine)
                   if t in theirs and mine[t] and theirs[t] is not None])


def criteria(summary):
    """The experiment's acceptance criteria for Sluice+SILK, evaluated on medians (and, for
    the headline, also on ratios paired by repetition)."""
    out = []
    mix = summary.get("mixture", {})
    s = mix.get("sluice", {})
    if "vs_plain" in s:
        thr = s["vs_plain"].get("throughput_ratio")
        # The headline on two measures of "p99 during peaks": the p99 over every
        # operation of the peaks (the stricter one), and PAIO's own (Fig. 5 and §9.2's
        # "peaks that range between 3-20 ms ... a 4x decrease"): the per-second p99
        # curve during peaks, here its mean over peak seconds.
        for name, label in (("peak_p99_ms", "p99 over peak operations"),
                            ("peak_p99_sec_ms", "per-second p99 in peaks (PAIO's measure)")):
            mine, base = s.get(name), mix.get("plain", {}).get(name)
            if not (mine and base and mine["median"]):
                continue
            r = base["median"] / mine["median"]
            pr = paired(summary, "mixture", "sluice", "plain", name)
            text = f"{r:.2f}x"
            if pr and pr["n"] > 1:
                text += (f" (paired by repetition {pr['min']:.2f}/{pr['median']:.2f}/"
                         f"{pr['max']:.2f}x)")
            out.append((f"mixture: peak p99 at least 4x lower than RocksDB, {label}", text,
                        r >= 4 and (pr is None or pr["median"] >= 4)))
        if thr is not None:
            out.append(("mixture: mean throughput within 10% of RocksDB", f"{thr:.3f}",
                        thr >= 0.9))
    for workload in WORKLOAD_ORDER:
        s = summary.get(workload, {}).get("sluice", {})
        cmp = s.get("vs_auto")
        if not cmp:
            continue
        red = cmp.get("peak_p99_reduction")
        thr = cmp.get("throughput_ratio")
        if red is not None and thr is not None:
            out.append((f"{workload}: no worse than the auto-tuned limiter "
                        "(peak p99, throughput)", f"p99 {red:.2f}x lower, throughput {thr:.3f}",
                        red >= 1 and thr >= 0.99))
        # The same on PAIO's per-second measure, and on it over the peak seconds the host
        # left alone (where steal was recorded).
        auto = summary.get(workload, {}).get("auto", {})
        for name, label in (("peak_p99_sec_ms", "per-second p99 in peaks"),
                            ("peak_p99_sec_quiet_ms",
                             f"per-second p99 in peak seconds with steal < {QUIET_STEAL_PCT:g}%")):
            mine, base = s.get(name), auto.get(name)
            if mine and base and mine["median"]:
                r = base["median"] / mine["median"]
                out.append((f"{workload}: no worse than the auto-tuned limiter ({label})",
                            f"{r:.2f}x lower ({mine['median']:.2f} vs {base['median']:.2f} ms)",
                            r >= 1))
    return out


def write_markdown(results, summary, runs, params):
    lines = ["# examples/silk results", ""]
    mode = params.get("mode", "full")
    if mode != "full":
        lines += [f"**A `run.sh --{mode}` run**: scaled down from the full experiment "
                  "(params.json); not the published figures.", ""]
    any_run = next(iter(runs.values()))[0]
    cfg = any_run["config"]
    lines.append("Parameters: " + ", ".join(
        f"{k}={cfg[k]}" for k in cfg if k not in ("type", "setup", "workload", "tag")))
    lines.append("")
    lines.append("Medians over repetitions, (min-max) when there are several.")
    lines.append("")
    for workload in WORKLOAD_ORDER + sorted(set(summary) - set(WORKLOAD_ORDER)):
        by_setup = summary.get(workload)
        if not by_setup:
            continue
        lines.append(f"## {workload}")
        lines.append("")
        head = "| setup | runs | " + " | ".join(label for _, label in METRICS) + \
               " | peak p99 vs RocksDB | throughput vs RocksDB |"
        lines.append(head)
        lines.append("|" + "---|" * (len(METRICS) + 4))
        for setup in SETUP_ORDER + sorted(set(by_setup) - set(SETUP_ORDER)):
            e = by_setup.get(setup)
            if not e:
                continue
            n = len(e["runs"])
            cells = [fmt(e[name], 3 if name == "mean_kops" else
                         0 if name in ("pending_end_mib", "quiet_peak_s") else
                         1 if name.endswith("steal_pct") else 2) for name, _ in METRICS]
            vs = e.get("vs_plain", {})
            red = vs.get("peak_p99_reduction")
            thr = vs.get("throughput_ratio")
            lines.append(f"| {SETUP_NAMES.get(setup, setup)} | {n} | " + " | ".join(cells) +
                         f" | {'%.2fx lower' % red if red else '-'} | "
                         f"{'%.3f' % thr if thr else '-'} |")
        lines.append("")
    t = criteria(summary)
    if t:
        lines.append("## Acceptance criteria (Sluice+SILK, medians)")
        lines.append("")
        lines.append("| criterion | measured | met |")
        lines.append("|---|---|---|")
        for name, value, ok in t:
            lines.append(f"| {name} | {value} | {'yes' if ok else 'no'} |")
        lines.append("")
    ha.write_summary(results, {"params": params, "summary": summary, "criteria": [
        {"criterion": n, "measured": v, "met": ok} for n, v, ok in t]}, lines, sort_keys=True)


def representative(rs):
    """The repetition whose peak p99 is the median one (the one plotted)."""
    ranked = sorted(rs, key=lambda r: metrics(r)["peak_p99_ms"] or 0)
    return ranked[(len(ranked) - 1) // 2]


def shade_peaks(ax, cfg):
    t = cfg["initial_valley_s"]
    while t < cfg["duration_s"]:
        ax.axvspan(t, min(t + cfg["peak_s"], cfg["duration_s"]), color="0.92", lw=0)
        t += cfg["peak_s"] + cfg["valley_s"]


def plot(results, runs):
    plt = ha.pyplot("analyze.py")
    if plt is None:
        return

    for workload in sorted({w for w, _ in runs}):
        setups = [s for s in SETUP_ORDER if (workload, s) in runs]
        if not setups:
            continue
        fig, axes = plt.subplots(len(setups), 2, figsize=(12, 2.1 * len(setups) + 0.6),
                                 sharex=True, squeeze=False)
        ymax_thr = 0
        ymax_lat = 0
        chosen = {s: representative(runs[(workload, s)]) for s in setups}
        for s in setups:
            secs = chosen[s]["seconds"]
            ymax_thr = max(ymax_thr, max(x["target_ops"] for x in secs) / 1e3,
                           max(x["ops"] for x in secs) / 1e3)
            ymax_lat = max(ymax_lat, max(x["p99_us"] for x in secs) / 1e3)
        for row, s in enumerate(setups):
            run = chosen[s]
            cfg = run["config"]
            secs = run["seconds"]
            t = [x["t"] + 0.5 for x in secs]
            ax_t, ax_l = axes[row]
            for ax in (ax_t, ax_l):
                shade_peaks(ax, cfg)
                ax.grid(True, lw=0.3)
            ax_t.step([x["t"] for x in secs], [x["ops"] / 1e3 for x in secs], where="post",
                      color="tab:blue", lw=1.2)
            ax_t.step([x["t"] for x in secs], [x["target_ops"] / 1e3 for x in secs],
                      where="post", color="tab:red", ls="--", lw=0.9, label="client load")
            mean = run["end"]["ops"] / run["end"]["seconds"] / 1e3
            ax_t.axhline(mean, color="k", ls="--", lw=0.8, label=f"mean {mean:.2f}")
            ax_t.set_ylim(0, ymax_thr * 1.1)
            ax_t.set_ylabel(f"{SETUP_NAMES[s]}\nkops/s", fontsize=8)
            ax_t.legend(loc="upper left", fontsize=7, frameon=False)
            ax_l.plot(t, [x["p99_us"] / 1e3 for x in secs], color="tab:purple", lw=1.2)
            ax_l.set_ylim(0, ymax_lat * 1.05)
            ax_l.set_ylabel("p99 (ms)", fontsize=8)
            m = metrics(run)
            ax_l.set_title(f"{run['config']['tag']}: peak p99 {m['peak_p99_ms']:.1f} ms, "
                           f"max {m['max_p99_ms']:.1f} ms, variability "
                           f"{m['variability_ms']:.2f} ms", fontsize=8)
        axes[-1][0].set_xlabel("time (s)")
        axes[-1][1].set_xlabel("time (s)")
        fig.suptitle(f"{workload}: throughput and 99th percentile latency per second "
                     "(shaded: peaks; median repetition by peak p99)", fontsize=10)
        ha.save_figure(fig, os.path.join(results, f"fig-{workload}.png"), dpi=110)

        # What SILK did: the rates it gave each flow, and the foreground it measured.
        if (workload, "sluice") in runs:
            run = chosen["sluice"]
            pol = run["policy"]
            if pol:
                fig, ax = plt.subplots(figsize=(12, 3))
                t = [p["t"] for p in pol]
                mib = 1024 * 1024
                for key, color in (("flush", "tab:orange"), ("l0", "tab:green"),
                                   ("ln", "tab:gray")):
                    ax.plot(t, [p["rates"][key] / mib for p in pol], label=f"B_{key}",
                            color=color, lw=1)
                ax.plot(t, [p["fg"] / mib for p in pol], label="Fg (measured)",
                        color="tab:blue", lw=1, ls=":")
                shade_peaks(ax, run["config"])
                ax.set_xlim(0, run["config"]["duration_s"])
                ax.set_xlabel("time (s)")
                ax.set_ylabel("MiB/s")
                ax.legend(loc="upper right", fontsize=7, ncol=4)
                ax.grid(True, lw=0.3)
                ax.set_title(f"{workload}, Sluice+SILK ({run['config']['tag']}): rates set by "
                             "the silk policy (sampled twice a second)", fontsize=9)
                ha.save_figure(fig, os.path.join(results, f"fig-{workload}-silk.png"), dpi=110)


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    results = sys.argv[1]
    runs = collect(results)
    if not runs:
        raise SystemExit(f"analyze.py: no complete runs under {results}/raw")
    params = {}
    if os.path.exists(os.path.join(results, "params.json")):
        params = ha.read_params(results)
    summary = summarize(runs)
    write_markdown(results, summary, runs, params)
    if "--no-plots" not in sys.argv:
        plot(results, runs)
    with open(os.path.join(results, "summary.md")) as f:
        print(f.read())


if __name__ == "__main__":
    main()
