"""What the experiments' analyses (examples/*/analyze*.py) share: reading a results folder
(params.json, JSON-lines files), the statistics the summaries report (mean, median,
percentiles, median/min/max spreads), number formatting for summary.md, writing
summary.json and summary.md, and the matplotlib setup of the figures.

An analysis in examples/<name>/ imports it with the examples folder on sys.path:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from harness import analysis as ha
"""
import glob
import json
import math
import os
import statistics
import sys


# --- reading --------------------------------------------------------------------------

def read_jsonl(path, missing_ok=False, bad=None):
    """The JSON values of the non-empty lines of `path`; [] for a missing file if
    `missing_ok`. A line that is not JSON exits, naming the file and line (through
    `bad(message)` if given)."""
    if missing_ok and not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for n, text in enumerate(f, 1):
            if text.strip():
                try:
                    out.append(json.loads(text))
                except json.JSONDecodeError as e:
                    if bad:
                        bad(f"{path}:{n}: not JSON ({e})")
                    raise SystemExit(f"{path}:{n}: not JSON: {e}")
    return out


def complete_runs(out, configs, prog, name="node.jsonl"):
    """(config, lines) of every run OUT/raw/<config>-r<rep>/NAME, in order, whose lines
    hold a "config" line and end with an "end" line (by their "type"); the others are
    named on stderr and left out."""
    for config in configs:
        for d in sorted(glob.glob(os.path.join(out, "raw", f"{config}-r*"))):
            path = os.path.join(d, name)
            lines = read_jsonl(path, missing_ok=True)
            if any(x["type"] == "config" for x in lines) and lines[-1]["type"] == "end":
                yield config, lines
            else:
                print(f"{prog}: {path}: incomplete run, left out", file=sys.stderr)


def read_params(out):
    """The run's parameters: OUT/params.json (written by its driver)."""
    with open(os.path.join(out, "params.json")) as f:
        return json.load(f)


# --- statistics -----------------------------------------------------------------------

def present(xs):
    """The values of `xs` that are not None."""
    return [x for x in xs if x is not None]


def mean(xs):
    xs = present(xs)
    return statistics.fmean(xs) if xs else None


def median(xs):
    xs = present(xs)
    return statistics.median(xs) if xs else None


def percentile(values, q):
    """The nearest-rank q-quantile (0 < q <= 1) of `values`; None for none."""
    v = sorted(present(values))
    if not v:
        return None
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


def spread(xs, count=False):
    """{"median", "min", "max"} of the values that are not None (with "n", their number,
    if `count`); None for none."""
    xs = present(xs)
    if not xs:
        return None
    s = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
    if count:
        s["n"] = len(xs)
    return s


# --- formatting -----------------------------------------------------------------------

def fmt(x, digits=2, none="-"):
    """A number with `digits` decimals (an int or a string as is); `none` for None."""
    if x is None:
        return none
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def fmt_spread(s, digits=2, none="-"):
    """A spread as `median (min-max)`, the median alone when min and max agree."""
    if s is None:
        return none
    if s["min"] == s["max"]:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


# --- writing --------------------------------------------------------------------------

def write_summary(out, summary, markdown, prog=None, sort_keys=False):
    """Writes OUT/summary.json (`summary`) and OUT/summary.md (`markdown`: a string or a
    list of lines); with `prog`, says so on stdout."""
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=sort_keys)
        f.write("\n")
    if not isinstance(markdown, str):
        markdown = "\n".join(markdown) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(markdown)
    if prog:
        figures = summary.get("figures") if isinstance(summary, dict) else None
        extra = f", {', '.join(figures)}" if figures else ""
        print(f"{prog}: wrote {out}/summary.json, summary.md{extra}")


# --- figures --------------------------------------------------------------------------

def pyplot(prog):
    """matplotlib.pyplot drawing to files (the Agg backend), or None with a line on stderr
    when matplotlib is not installed (python3-matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{prog}: no matplotlib: figures skipped", file=sys.stderr)
        return None
    return plt


def panel_grid(plt, n, height, width=5, max_cols=3, **kw):
    """A figure of `n` panels of width x height inches, in rows of at most `max_cols`:
    (figure, 2-D array of axes), the cells past the n-th hidden."""
    cols = min(max_cols, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows),
                             squeeze=False, **kw)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    return fig, axes


def time_panel(ax, title, yscale=None, **yscale_kw):
    """A panel over time: its title, the time axis label, a light grid, a y scale."""
    if yscale:
        ax.set_yscale(yscale, **yscale_kw)
    ax.set_title(title)
    ax.set_xlabel("time (s)")
    ax.grid(alpha=0.3)


def label_grid(axes, ylabel, legend_size=8):
    """The y label of a panel grid's first column and the legend of its first panel."""
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    axes.flat[0].legend(fontsize=legend_size)


def save_figure(fig, path, dpi=100, tight=True):
    """Writes `fig` to `path` (laid out tightly) and closes it; returns the file's name."""
    import matplotlib.pyplot as plt
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return os.path.basename(path)
