"""eval_pvrbench.py's pictures, drawn with matplotlib from results.json's figures (never from anything else):

  subtypes.png            clean, each subtype grouped by its category, and Avg.: one bar per series (a run; a sweep's
                          intensities; --compare's models)
  robustness_curves.png   a sweep (--etas): one panel per category and one for Avg., one line per subtype over the
                          intensities (error bars: the clustered SE by video), clean as a dashed line
  compare_curves.png      --compare of sweeps: the same panels, one line per model, its clean as a dashed line

The stage gives the categories ({category: [subtypes]}) and the figures; nothing here knows the protocol.
"""
from __future__ import annotations

from pathlib import Path

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    _pyplot().close(fig)
    return str(path)


def _columns(categories):
    """The bars' layout: (columns, their x positions, (category, first x, last x) per category); clean first,
    Avg. last, a gap between groups."""
    groups = [("", ["clean"]), *categories.items(), ("", ["avg"])]
    cols, xs, spans, x = [], [], [], 0.0
    for cat, members in groups:
        spans.append((cat, x, x + len(members) - 1))
        cols += members
        xs += [x + k for k in range(len(members))]
        x += len(members) + 0.6
    return cols, xs, [span for span in spans if span[0]]


def subtype_bars(path, categories, series, title):
    """Grouped bars: clean, then each category's subtypes (the category named above them), then Avg.; one bar per
    (label, {column: accuracy or None}) of `series`. A missing value leaves its bar out."""
    cols, xs, spans = _columns(categories)
    width = 0.8 / max(len(series), 1)
    fig, ax = _pyplot().subplots(figsize=(max(7.0, 0.55 * len(xs) * max(1, len(series)) ** 0.5 + 2), 4.2), dpi=110)
    for k, (label, values) in enumerate(series):
        bars = [(x + (k - (len(series) - 1) / 2) * width, values.get(c)) for x, c in zip(xs, cols)]
        bars = [(x, y) for x, y in bars if y is not None]
        ax.bar([x for x, _ in bars], [y for _, y in bars], width * 0.95, label=label, color=COLOURS[k % len(COLOURS)])
    ax.set_xticks(xs, ["Avg." if c == "avg" else c for c in cols], rotation=45, ha="right", fontsize=8)
    for cat, a, b in spans:
        ax.annotate(cat, ((a + b) / 2, 1.0), xycoords=("data", "axes fraction"), ha="center", va="bottom",
                    fontsize=8, color="#444")
        ax.axvspan(a - 0.5, b + 0.5, color="#f2f2f2", zorder=0)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy")
    ax.set_title(title, fontsize=10, pad=16)
    if len(series) > 1:
        ax.legend(fontsize=8, ncol=min(len(series), 6), loc="upper right", bbox_to_anchor=(1.0, -0.22), frameon=False)
    fig.tight_layout()
    return _save(fig, path)


def _panels(categories):
    plt = _pyplot()
    names = [c for c, subs in categories.items() if subs] + ["avg"]
    fig, axes = plt.subplots(1, len(names), figsize=(3.1 * len(names), 4.0), dpi=110, sharey=True, squeeze=False)
    return fig, dict(zip(names, axes[0]))


def _line(ax, etas, points, label, colour, shift=0.0):
    """One curve ({eta: point}) with its clustered-SE error bars, drawn `shift` to the side (lines of equal values
    stay apart); points without a value are left out."""
    kept = [(e, points[f"{e:g}"]) for e in etas if (points.get(f"{e:g}") or {}).get("accuracy") is not None]
    ax.errorbar([e + shift for e, _ in kept], [p["accuracy"] for _, p in kept], yerr=[p["se"] or 0.0 for _, p in kept],
                label=label, color=colour, marker="o", markersize=3, capsize=2, linewidth=1.2)


def _shift(k, n, etas):
    return (k - (n - 1) / 2) * 0.012 * (etas[-1] - etas[0])


def _clean(ax, clean, colour, label="clean"):
    if clean.get("accuracy") is not None:
        ax.axhline(clean["accuracy"], color=colour, linestyle="--", linewidth=1, label=label)


def _finish(fig, axes, etas, title):
    for name, ax in axes.items():
        ax.set_title("Avg." if name == "avg" else name, fontsize=9)
        ax.set_xlabel("η (intensity)", fontsize=8)
        ax.set_xticks(etas, [f"{e:g}" for e in etas], fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
    next(iter(axes.values())).set_ylabel("accuracy")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()


def robustness_curves(path, categories, curves, etas, title):
    """A sweep's curves (results.json `curves`): a panel per category with one line per subtype, and Avg.'s panel;
    clean (answered once) dashed in every panel."""
    fig, axes = _panels(categories)
    for name, ax in axes.items():
        lines = ["avg"] if name == "avg" else [s for s in categories[name] if s in curves]
        for k, line in enumerate(lines):
            _line(ax, etas, curves[line], "Avg." if line == "avg" else line, COLOURS[k % len(COLOURS)],
                  _shift(k, len(lines), etas))
        _clean(ax, curves["clean"], "#555")
    _finish(fig, axes, etas, title)
    return _save(fig, path)


def compare_curves(path, categories, models, etas, title):
    """--compare of sweeps: `models` [(label, curves)]; a panel per category (its curve) and Avg., one colour per
    model, its clean dashed in the same colour."""
    fig, axes = _panels(categories)
    for name, ax in axes.items():
        for k, (label, curves) in enumerate(models):
            if name in curves:
                _line(ax, etas, curves[name], label, COLOURS[k % len(COLOURS)], _shift(k, len(models), etas))
            _clean(ax, curves["clean"], COLOURS[k % len(COLOURS)], f"{label} clean")
    _finish(fig, axes, etas, title)
    return _save(fig, path)
