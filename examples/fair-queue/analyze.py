#!/usr/bin/env python3
"""Summary and figures of examples/fair-queue runs (Pisces OSDI '12 §6 on Sluice).

usage: analyze.py RESULTS_DIR [--no-plots]

Reads RESULTS_DIR/params.json, RESULTS_DIR/raw/<case>/plan.json and every run's
node<K>.jsonl (sluice-fq-node's bins: per tenant, bytes served per 100 ms); writes
RESULTS_DIR/summary.json, summary.md, fig-mmr.png (MMR over time, one panel per case, a
line per configuration) and fig-tenants-<case>.png (each tenant's throughput over its
fair share, over time, with and without weight allocation).

Per run and measured phase (the last 40% of `base`, `double`, `idle`, the `under` phase
after its first 0.5 s; README.md, "Metrics"):
  throughput x_t   tenant t's bytes served at every node in the window / its length
  fair share f_t   weighted max-min (water-filling) of the window's total served over
                   the tenants' offered demands and global weights: the share of what
                   the nodes served that the tenant should have had
                   (max_error_vs_capacity_pct: the same against the nodes' capacity,
                   which also counts capacity left unused)
  mmr              min/max of x_t / weight_t over the tenants whose demand exceeds their
                   fair share (in base and double: all of them)
  max_share_error_pct  max over tenants of |x_t - f_t| / f_t, in %
  utilisation      total served / (nodes x capacity)
A case's figure is the worse of its base and double phases, the median over repetitions.
overhead_pct: the total served without control minus with pisces, over the former, in %,
in the `under` phase (offered load 80% of capacity: both should carry all of it);
overhead.saturated_pct the same over base and double (both at capacity).
idle_return: the idle tenant's throughput in the first second of `back` over its fair
share then.
"""
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import analysis as ha  # noqa: E402
from harness.analysis import median, read_jsonl, spread  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fairness  # noqa: E402

CASES = ["equal", "weighted-1-2-3-4", "weighted-100-10-1", "tenants-100"]
CONFIGS = ["no-control", "static-drl", "fq-static-weights", "pisces"]
CONFIG_NAMES = {
    "no-control": "no control (one FIFO token bucket)",
    "static-drl": "static drl per tenant",
    "fq-static-weights": "fq, local = global weights",
    "pisces": "fq + pisces (Sluice)",
}
MAIN_PHASES = ("base", "double")
# Pisces's figures (OSDI '12 §6.2, §6.3, §6.5) and the targets, per case.
PAPER = {
    "equal": {"pisces": "0.99 MMR (WA+FQ+RS); 0.95 with PP, no RS", "baseline":
              "0.57 MMR Membase, no queuing", "setup": "8 tenants x 8 servers, equal weights",
              "target_mmr": 0.99},
    "weighted-1-2-3-4": {"pisces": "> 0.9 MMR (4:4:3:3:2:2:1:1)", "baseline": "-",
                         "setup": "8 tenants x 8 servers", "target_error_pct": 2.0},
    "weighted-100-10-1": {"pisces": "0.56 MMR across classes (> 0.91 within)", "baseline": "-",
                          "setup": "64 tenants (4x100, 20x10, 40x1), each on 4 of 8 servers",
                          "target_mmr": 0.95},
    "tenants-100": {"pisces": "0.46 MMR across classes", "baseline": "-",
                    "setup": "100 tenants, each on 6 of 20 servers", "target_mmr": 0.95},
}



class Run:
    """One (case, config, rep): per tenant, bytes served per bin, summed over nodes."""

    def __init__(self, plan, run_dir):
        self.plan = plan
        self.dir = run_dir
        self.bin_s = plan["bin_ms"] / 1000.0
        nbins = int(round(plan["duration_s"] / self.bin_s))
        ids = [t["id"] for t in plan["tenants"]]
        self.bytes = {t: [0] * nbins for t in ids}
        self.ops = {t: [0] * nbins for t in ids}
        self.cpu_s = 0.0
        self.served_ops = 0
        self.steal = []
        self.ends = []
        for k in range(plan["nodes"]):
            lines = read_jsonl(os.path.join(run_dir, f"node{k}.jsonl"))
            cfg = next(l for l in lines if l["type"] == "config")
            end = next((l for l in lines if l["type"] == "end"), None)
            if end is None:
                raise SystemExit(f"{run_dir}/node{k}.jsonl: no end line")
            self.ends.append(end)
            self.cpu_s += end["cpu_s"]
            self.served_ops += end["served"]
            if end.get("host_steal_pct", -1) >= 0:
                self.steal.append(end["host_steal_pct"])
            for l in lines:
                if l["type"] != "bin" or l["i"] >= nbins:
                    continue
                for j, t in enumerate(cfg["tenants"]):
                    self.bytes[t][l["i"]] += l["bytes"][j]
                    self.ops[t][l["i"]] += l["served"][j]

    def rates(self, a, b):
        """{tenant: bytes/s} over [a, b) seconds."""
        i, j = int(round(a / self.bin_s)), int(round(b / self.bin_s))
        secs = (j - i) * self.bin_s
        return {t: sum(v[i:j]) / secs for t, v in self.bytes.items()}

    def window_metrics(self, phase, a, b):
        x = self.rates(a, b)
        w = {t["id"]: t["weight"] for t in self.plan["tenants"]}
        demand = {int(t): v for t, v in phase["demand"].items()}
        total = sum(x.values())
        cap = self.plan["capacity"]["read_bytes"] * self.plan["nodes"]
        fair = fairness.waterfill(demand, w, total)
        sat = [t for t in phase["saturated"] if t in x]
        return {"mmr": fairness.mmr(x, w, sat) if sat else None,
                "max_share_error_pct": fairness.max_error_pct(x, fair),
                "max_error_vs_capacity_pct": fairness.max_error_pct(
                    x, fairness.waterfill(demand, w, cap)),
                "utilisation": total / cap, "served_bytes_per_s": total,
                "ratios": {t: (x[t] / fair[t] if fair[t] > 0 else None) for t in x}}

    def phase_metrics(self):
        out = {}
        for ph in self.plan["phases"]:
            a, b = ph["measure"]
            if ph["name"] == "under":
                a = min(b - self.bin_s, ph["start_s"] + 0.5)
            m = self.window_metrics(ph, a, b)
            m.pop("ratios")
            out[ph["name"]] = m
        return out

    def series(self, window_s, step_s=0.1):
        """[(t, mmr, {tenant: x/fair})] over sliding windows ending at t. The fair
        shares are those of the phase at t; the MMR counts the tenants saturated in every
        phase the window overlaps."""
        out = []
        t = window_s
        while t <= self.plan["duration_s"] + 1e-9:
            ph = dict(phase_at(self.plan, t - 1e-6))
            for other in self.plan["phases"]:
                if other["start_s"] < t and other["end_s"] > t - window_s:
                    ph["saturated"] = [u for u in ph["saturated"] if u in other["saturated"]]
            m = self.window_metrics(ph, t - window_s, t)
            out.append((t, m["mmr"], m["ratios"]))
            t = round(t + step_s, 6)
        return out


def phase_at(plan, t):
    for ph in plan["phases"]:
        if ph["start_s"] <= t < ph["end_s"]:
            return ph
    return plan["phases"][-1]



def load_runs(results, plans, configs):
    runs = {}
    for case, plan in plans.items():
        for config in configs:
            dirs = sorted(glob.glob(os.path.join(results, "raw", case, f"{config}-r*")))
            rs = [Run(plan, d) for d in dirs if os.path.isdir(d)]
            if rs:
                runs[(case, config)] = rs
    return runs


def case_figures(rs):
    """The case's figures of one configuration: per rep, the worse of base and double;
    the median over reps."""
    per_rep = [r.phase_metrics() for r in rs]
    mmrs = [min(p[n]["mmr"] for n in MAIN_PHASES if n in p) for p in per_rep]
    errs = [max(p[n]["max_share_error_pct"] for n in MAIN_PHASES if n in p) for p in per_rep]
    cap_errs = [max(p[n]["max_error_vs_capacity_pct"] for n in MAIN_PHASES if n in p)
                for p in per_rep]
    util = [statistics.mean(p[n]["utilisation"] for n in MAIN_PHASES if n in p) for p in per_rep]
    phases = {}
    for name in per_rep[0]:
        phases[name] = {k: median([p[name][k] for p in per_rep])
                        for k in ("mmr", "max_share_error_pct", "max_error_vs_capacity_pct",
                                  "utilisation")}
    cpu = [r.cpu_s / r.served_ops * 1e6 for r in rs if r.served_ops]
    return {"mmr": median(mmrs), "max_share_error_pct": median(errs),
            "max_error_vs_capacity_pct": median(cap_errs),
            "utilisation": median(util), "cpu_us_per_request": median(cpu),
            "reps": len(rs), "mmr_spread": spread(mmrs), "error_spread": spread(errs),
            "phases": phases}


def overhead(runs, plans, phase_names):
    """(no-control total - pisces total) / no-control total in %, over the windows of
    `phase_names`, per case and rep (paired by rep), then the mean."""
    vals = []
    for case in plans:
        a, b = runs.get((case, "no-control"), []), runs.get((case, "pisces"), [])
        for ra, rb in zip(a, b):
            pa, pb = ra.phase_metrics(), rb.phase_metrics()
            for n in phase_names:
                if n in pa and n in pb:
                    x, y = pa[n]["served_bytes_per_s"], pb[n]["served_bytes_per_s"]
                    vals.append(100.0 * (x - y) / x)
    return statistics.mean(vals) if vals else None


def idle_return(runs, plans, configs):
    for case, plan in plans.items():
        tid = plan.get("idle_tenant")
        back = next((p for p in plan["phases"] if p["name"] == "back"), None)
        idle = next((p for p in plan["phases"] if p["name"] == "idle"), None)
        if tid is None or back is None or idle is None:
            continue
        out = {"case": case, "tenant": tid, "idle_s": idle["end_s"] - idle["start_s"],
               "window_s": back["measure"][1] - back["measure"][0]}
        per = {}
        for config in configs:
            rs = runs.get((case, config), [])
            if not rs:
                continue
            first = [r.window_metrics(back, *back["measure"])["ratios"][tid] for r in rs]
            rest = None
            if back["end_s"] - back["measure"][1] >= 0.5:
                rest = median([r.window_metrics(back, back["measure"][1], back["end_s"])
                               ["ratios"][tid] for r in rs])
            per[config] = {"share_ratio": median(first), "share_ratio_after": rest}
        if "pisces" in per:
            out.update(per.pop("pisces"))
        out["baselines"] = per
        return out
    return None


def fmt(x, d=3):
    return "-" if x is None else f"{x:.{d}f}"


def write_markdown(results, summary, plans):
    p = summary["params"]
    lines = [f"# examples/fair-queue: summary ({p['mode']} run)", ""]
    if p["mode"] != "full":
        lines += [f"A `--{p['mode']}` run: shortened phases, {p['reps']} repetition(s). "
                  "It checks the experiment end to end; the published figures come from a "
                  "full run.", ""]
    lines += [f"{p['nodes']} nodes (stage processes), each an `fq` at "
              f"{p['capacity_mib']:g} MiB/s of reads; policy interval {p['interval_ms']} ms "
              f"({p['method']}); {p['reps']} repetition(s), medians. MMR: min/max of "
              "throughput/weight over the tenants; error: max over tenants of |throughput - "
              "weighted max-min fair share of what the nodes served| / fair share. Each is "
              "the worse of the `base` and `double` phases (last 40% of each).", ""]
    lines += ["| case | tenants | Pisces (paper) | no control | static drl | fq, static weights "
              "| **fq + pisces** | target |", "|---|---|---|---|---|---|---|---|"]
    for c in summary["cases"]:
        b = c["baselines"]

        def cell(d):
            if not d:
                return "-"
            return f"{fmt(d['mmr'])} / {fmt(d['max_share_error_pct'], 1)}%"
        paper = PAPER[c["name"]]
        target = (f"MMR >= {paper['target_mmr']}" if "target_mmr" in paper
                  else f"error <= {paper['target_error_pct']:g}%")
        own = cell(c) if c.get("mmr") is not None else "-"
        lines.append(f"| {c['name']} | {c['tenants']} | {paper['pisces']} | "
                     f"{cell(b.get('no-control'))} | {cell(b.get('static-drl'))} | "
                     f"{cell(b.get('fq-static-weights'))} | **{own}** | {target} |")
    lines += ["", "Cells: MMR / max share error. The paper's baseline (Membase without fair "
              "queuing): 0.57 MMR with equal weights.", "",
              "Utilisation (served / capacity) and max error against the capacity's fair "
              "shares (which also counts capacity left unused), `base` and `double`:", "",
              "| case | " + " | ".join(CONFIGS) + " |", "|---|" + "---|" * len(CONFIGS)]
    for c in summary["cases"]:
        row = []
        for config in CONFIGS:
            d = c.get("pisces") if config == "pisces" else c["baselines"].get(config)
            row.append("-" if not d else f"{fmt(d['utilisation'])} / "
                       f"{fmt(d['max_error_vs_capacity_pct'], 1)}%")
        lines.append(f"| {c['name']} | " + " | ".join(row) + " |")
    lines.append("")
    lines += ["## Per phase (pisces)", "",
              "| case | phase | MMR | max error | utilisation | model: fq static MMR |",
              "|---|---|---|---|---|---|"]
    for c in summary["cases"]:
        plan = plans[c["name"]]
        for name, m in c.get("phases", {}).items():
            model = next((ph["model"]["fq-static-weights"]["mmr"] for ph in plan["phases"]
                          if ph["name"] == name), None)
            lines.append(f"| {c['name']} | {name} | {fmt(m['mmr'])} | "
                         f"{fmt(m['max_share_error_pct'], 1)}% | {fmt(m['utilisation'])} | "
                         f"{fmt(model) if name in MAIN_PHASES or name == 'idle' else '-'} |")
    o = summary["overhead"]
    lines += ["", "## Overhead and idle return", "",
              f"- Throughput loss of fq + pisces against no control, offered load 80% of "
              f"capacity (`under`): **{fmt(summary['overhead_pct'], 2)}%** (Pisces: < 3%, "
              f"\u2265 96% of Membase); at saturation (`base`, `double`): "
              f"{fmt(o['saturated_pct'], 2)}%.",
              "- CPU per request served (all node processes, user + system), per "
              "configuration: " + ", ".join(f"{k} {fmt(v, 1)} \u00b5s"
                                            for k, v in o["cpu_us_per_request"].items()) + "."]
    ir = summary.get("idle_return")
    if ir:
        lines.append(f"- Idle return ({ir['case']}, tenant {ir['tenant']}, idle "
                     f"{ir['idle_s']:g} s, offered 3x its share on return): throughput over its "
                     f"fair share in the first {ir['window_s']:g} s back: **"
                     f"{fmt(ir.get('share_ratio'), 2)}** with fq + pisces (target <= 1); "
                     + ", ".join(f"{k} {fmt(v['share_ratio'], 2)}"
                                 for k, v in ir["baselines"].items()) + ".")
    if summary.get("host_steal_pct") is not None:
        lines.append(f"- Host steal during the runs: {summary['host_steal_pct']:.1f}% (mean).")
    lines.append("")
    ha.write_summary(results, summary, "\n".join(lines))


def plot(results, runs, plans, configs):
    plt = ha.pyplot("analyze.py")
    if plt is None:
        return
    colors = {"no-control": "tab:gray", "static-drl": "tab:orange",
              "fq-static-weights": "tab:blue", "pisces": "tab:green"}
    cases = [c for c in CASES if c in plans]
    fig, axes = plt.subplots(len(cases), 1, figsize=(10, 2.6 * len(cases)), squeeze=False)
    for ax, case in zip(axes[:, 0], cases):
        plan = plans[case]
        win = window_for(plan)
        for config in configs:
            rs = runs.get((case, config))
            if not rs:
                continue
            s = rs[0].series(win)
            ax.plot([t for t, _, _ in s], [m if m is not None else float("nan") for _, m, _ in s],
                    color=colors[config], label=CONFIG_NAMES[config], lw=1.4)
        shade_phases(ax, plan)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("MMR")
        ax.set_title(f"{case}: {len(plan['tenants'])} tenants, {plan['nodes']} nodes "
                     f"(MMR over {win:g} s windows)", fontsize=10)
    axes[-1, 0].set_xlabel("time (s)")
    axes[0, 0].legend(fontsize=8, loc="lower right")
    ha.save_figure(fig, os.path.join(results, "fig-mmr.png"))

    for case in cases:
        plan = plans[case]
        shown = [c for c in ("fq-static-weights", "pisces") if (case, c) in runs]
        if not shown:
            continue
        win = window_for(plan)
        weights = sorted({t["weight"] for t in plan["tenants"]}, reverse=True)
        cmap = plt.get_cmap("tab10")
        fig, axes = plt.subplots(len(shown), 1, figsize=(10, 3.2 * len(shown)), squeeze=False)
        for ax, config in zip(axes[:, 0], shown):
            s = runs[(case, config)][0].series(win)
            ts = [t for t, _, _ in s]
            many = len(plan["tenants"]) > 16
            for i, ten in enumerate(plan["tenants"]):
                ys = [r[ten["id"]] if r[ten["id"]] is not None else float("nan") for _, _, r in s]
                color = cmap(weights.index(ten["weight"]) if many else i % 10)
                label = (f"w={ten['weight']}" if many and ten == next(
                    u for u in plan["tenants"] if u["weight"] == ten["weight"])
                    else None if many else f"t{ten['id']} w={ten['weight']}")
                ax.plot(ts, ys, color=color, lw=0.6 if many else 1.2, alpha=0.6 if many else 1,
                        label=label)
            ax.axhline(1.0, color="k", lw=0.8, ls="--")
            shade_phases(ax, plan)
            ax.set_ylim(0, 2.0)
            ax.set_ylabel("throughput / fair share")
            ax.set_title(f"{case}: {CONFIG_NAMES[config]} ({win:g} s windows)", fontsize=10)
            ax.legend(fontsize=7, ncol=4, loc="upper right")
        axes[-1, 0].set_xlabel("time (s)")
        ha.save_figure(fig, os.path.join(results, f"fig-tenants-{case}.png"))


def window_for(plan):
    """A window long enough for the lightest tenant to finish ~20 requests, 1-3 s."""
    low = min(t["fair_share"] / t["size"] for t in plan["tenants"])
    return min(3.0, max(1.0, round(20.0 / low)))


def shade_phases(ax, plan):
    for i, ph in enumerate(plan["phases"]):
        if i % 2:
            ax.axvspan(ph["start_s"], ph["end_s"], color="0.93", zorder=0)
        ax.text(ph["start_s"] + 0.1, 1.0, ph["name"], fontsize=7, va="top",
                transform=ax.get_xaxis_transform())


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    results = sys.argv[1]
    plots = "--no-plots" not in sys.argv[2:]
    params = ha.read_params(results)
    plans = {}
    for case in params["cases"]:
        with open(os.path.join(results, "raw", case, "plan.json")) as f:
            plans[case] = json.load(f)
    configs = params["configs"]
    runs = load_runs(results, plans, configs)
    cases = []
    for case, plan in plans.items():
        figs = {c: case_figures(runs[(case, c)]) for c in configs if (case, c) in runs}
        main_fig = figs.get("pisces", {})
        entry = {"name": case, "weights": [t["weight"] for t in plan["tenants"]],
                 "tenants": len(plan["tenants"]), "nodes": plan["nodes"],
                 "tenants_per_node_subset": plan["tenants_per_node"],
                 "mmr": main_fig.get("mmr"),
                 "max_share_error_pct": main_fig.get("max_share_error_pct"),
                 "utilisation": main_fig.get("utilisation"),
                 "phases": main_fig.get("phases", {}),
                 "baselines": {c: {k: v for k, v in figs[c].items()}
                               for c in configs if c != "pisces" and c in figs},
                 "model": {ph["name"]: ph["model"] for ph in plan["phases"]},
                 "feasible": min(ph["feasible"] for ph in plan["phases"]),
                 "paper": PAPER[case]["pisces"]}
        if main_fig:
            entry["pisces"] = main_fig
        cases.append(entry)
    cpu = {c: median([statistics.median([r.cpu_s / r.served_ops * 1e6 for r in runs[(k, c)]
                                         if r.served_ops])
                      for k in plans if (k, c) in runs]) for c in configs}
    steal = [s for rs in runs.values() for r in rs for s in r.steal]
    summary = {"params": params, "cases": cases,
               "overhead_pct": overhead(runs, plans, ["under"]),
               "overhead": {"under_capacity_pct": overhead(runs, plans, ["under"]),
                            "saturated_pct": overhead(runs, plans, list(MAIN_PHASES)),
                            "cpu_us_per_request": cpu},
               "idle_return": idle_return(runs, plans, configs),
               "host_steal_pct": statistics.mean(steal) if steal else None}
    write_markdown(results, summary, plans)
    if plots:
        plot(results, runs, plans, configs)
    print(open(os.path.join(results, "summary.md")).read())


if __name__ == "__main__":
    main()
