"""
HARNESS: the figures of a run (matplotlib's object API: no pyplot backend, safe headless and in Jupyter):
progress.png (plot_progress) and the learning curves (plot_curves), from harness.record.analysis's numbers.
"""

import math
import warnings
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from harness.record.analysis import curves_of, has_metric, kept_table, plain, running_best, summarize

# ---------------------------------------------------------------------------
# Plot
# ---------------------------------------------------------------------------

PLOTTABLE = 1e30       # a metric this far from 0 (a legacy target's own number, gone wild) sets no axis limit


def plottable(row):
    """A row whose metric may set the y axis: has_metric and within +-PLOTTABLE (a limit computed from 1e308
    overflows)."""
    return has_metric(row) and abs(row.metric) < PLOTTABLE


def _y_limits(rows, goal):
    """Axis limits from the rows with a plottable metric. Crashes (0.0) never count. A discard far on the bad side
    (a diverged run) would flatten the kept curve, so the bad side is capped one kept span away."""
    values = [r.metric for r in rows if plottable(r)]
    kept = [r.metric for r in rows if r.status == "keep" and plottable(r)]
    lo, hi = min(values), max(values)
    if kept:
        room = max(max(kept) - min(kept), 0.01 * abs(max(kept)), 1e-6)
        if goal == "min":
            hi = min(hi, max(kept) + room)
        else:
            lo = max(lo, min(kept) - room)
    pad = 0.06 * (hi - lo) or 0.01 * abs(hi) or 0.01
    return lo - pad, hi + pad


def save_figure(fig, png):
    """Save a Figure as a PNG at png (a path or a binary file object), labels inside the image; a glyph the font
    lacks (a description in another script) is drawn as a box without a warning on the loop's console. Returns png
    (a path as a Path)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        fig.savefig(png if hasattr(png, "write") else Path(png), bbox_inches="tight", pad_inches=0.15)
    return png if hasattr(png, "write") else Path(png)


LABELS = 40                     # kept rows labelled with their description in progress.png: the latest ones


def plot_progress(rows, metric_name, goal, png, title="results.tsv", rule=None):
    """Draw the run and save it as a PNG at `png` (a path, or a binary file object); returns what it was given
    (a path as a Path).

    x: experiment number (0 = the baseline, drawn as a black diamond: a measurement, not a keep). The running best
    as a step line, with the band the verdict uses on its better side when the rule is known (rule: a
    harness.judge.verdict.Rule, its band() says what the band is, in the legend): a discard inside it was better than
    the best by less than a keep needs. Kept rows as green dots (the LABELS latest labelled with their description),
    discards faint grey, crashes as red crosses on the bad edge of the axes (their 0.0 is not a metric), discards beyond
    the axis as grey triangles on that edge.
    """
    fig = Figure(figsize=(11, 5.5), dpi=110)
    ax = fig.subplots()
    s = summarize(rows, metric_name, goal)
    c = s.experiment_counts
    headline = (f"{title}: baseline + {max(len(rows) - 1, 0)} experiments, {c['keep']} kept, "
                f"{c['discard']} discarded, {c['crash']} crashed")
    if s.best is not None and s.improvement_pct is not None:
        headline += f"\nbest {s.best:.6f} ({s.improvement_pct:+.2f}% vs baseline {s.baseline:.6f})"
    ax.set_title(plain(headline))
    ax.set_xlabel("experiment (0 = baseline)")
    ax.set_ylabel(plain(f"{metric_name} ({'lower' if goal == 'min' else 'higher'} is better)"))
    ax.grid(alpha=0.3)
    ax.set_xlim(-0.5, max(len(rows) - 0.5, 0.5))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    edge = 0.97 if goal == "min" else 0.03   # the bad side of the y axis, in axes coordinates
    on_edge = ax.get_xaxis_transform()       # x in data, y in axes coordinates
    band, band_words = rule.band() if rule is not None else (0.0, "")
    band = band if math.isfinite(band) and 0 <= band < PLOTTABLE else 0.0

    if any(plottable(r) for r in rows):
        lo, hi = _y_limits(rows, goal)
        lo, hi = (lo - band, hi) if goal == "min" else (lo, hi + band)      # room for the band
        ax.set_ylim(lo, hi)
        inside = [(i, r.metric) for i, r in enumerate(rows)
                  if i and r.status == "discard" and has_metric(r) and lo <= r.metric <= hi]
        outside = [i for i, r in enumerate(rows)
                   if i and r.status == "discard" and has_metric(r) and not lo <= r.metric <= hi]
        if inside:
            ax.scatter(*zip(*inside), s=16, color="0.55", alpha=0.4, label="discard", zorder=2)
        if outside:
            ax.scatter(outside, [edge] * len(outside), transform=on_edge, marker="^" if goal == "min" else "v",
                       s=22, color="0.55", alpha=0.6, label="discard, off scale", zorder=2, clip_on=False)
        draw_best(ax, rows, goal, band, band_words)
    else:
        ax.set_yticks([])
        ax.text(0.5, 0.5, "no experiments yet" if not rows else "no metric yet: every run crashed",
                transform=ax.transAxes, ha="center", va="center", fontsize=13, color="0.3")
    crashes = [i for i, r in enumerate(rows) if r.status == "crash"]
    if crashes:
        ax.scatter(crashes, [edge] * len(crashes), transform=on_edge, marker="x", s=40, color="tab:red",
                   label="crash (no metric)", zorder=5, clip_on=False)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left" if goal == "max" else "lower left", fontsize=8)  # the corner the curve leaves empty
    return save_figure(fig, png)


def draw_best(ax, rows, goal, band, band_words):
    """plot_progress's running best (a step line, with the verdict's band on its better side: band, in metric units,
    and its legend words), the baseline's diamond and the kept rows (the LABELS latest labelled)."""
    best = running_best(rows, goal)
    steps = [(i, b) for i, b in enumerate(best) if b is not None]
    if steps:
        ax.step(*zip(*steps), where="post", color="tab:green", linewidth=1.8, label="running best", zorder=3)
    if steps and band:
        xs, ys = [*(x for x, _ in steps), steps[-1][0] + 0.5], [*(y for _, y in steps), steps[-1][1]]
        sign = -1 if goal == "min" else 1
        ax.fill_between(xs, ys, [y + sign * band for y in ys], step="post", color="tab:green", alpha=0.15,
                        label=band_words, zorder=1)
    if rows and has_metric(rows[0]):
        ax.scatter([0], [rows[0].metric], s=60, marker="D", color="black", label="baseline", zorder=4)
    kept = [(i, r) for i, r in enumerate(rows) if i and r.status == "keep" and has_metric(r)]
    if kept:
        ax.scatter([i for i, _ in kept], [r.metric for _, r in kept], s=46, color="tab:green", edgecolor="black",
                   linewidth=0.6, label="keep", zorder=4)
    right = max(len(rows) - 1, 1)
    for i, r in kept[-LABELS:]:   # labels lean inward near the right edge, so that none is cut off
        lean = i > 0.75 * right
        ax.annotate(plain(r.description[:32]), (i, r.metric), xytext=(-4 if lean else 4, 5),
                    textcoords="offset points",
                    fontsize=7, rotation=20, color="darkgreen", ha="right" if lean else "left",
                    annotation_clip=True)


def plot_curves(run, png, commits=None):
    """Draw the learning curves (train loss as train.py printed it against the share of the time budget) of the
    kept experiments (commits: these instead), one colour per experiment and one line per run, and save them as a
    PNG at png (a path or a binary file object). Returns png (a path as a Path), or None when none of them has a
    curve (a run from before curves were kept, a train.py that prints no progress line, no events)."""
    commits = commits or [k["commit"] for k in kept_table(run.rows, run.goal)]
    found = curves_of(run, set(commits))
    if not found:
        return None
    fig = Figure(figsize=(10, 5), dpi=110)
    ax = fig.subplots()
    words = {r.commit: r.description for r in run.rows}
    for k, commit in enumerate(c for c in commits if c in found):
        for j, curve in enumerate(found[commit]):
            ax.plot([q.progress for q in curve.points], [q.loss for q in curve.points], color=f"C{k % 10}",
                    linewidth=1.2, alpha=0.8,
                    label=plain(f"{commit} {words.get(commit, '')[:40]}") if j == 0 else None)
    losses = sorted(q.loss for runs in found.values() for c in runs for q in c.points if q.progress >= 0.1)
    if losses:                          # the first steps' loss would flatten everything after them
        lo, hi = losses[0], losses[-1]
        ax.set_ylim(lo - 0.05 * (hi - lo or 1), hi + 0.05 * (hi - lo or 1))
    ax.set_xlabel("progress of the time budget")
    ax.set_ylabel("train loss (smoothed, as train.py prints it)")
    ax.set_title(plain(f"{run.title}: learning curves of {len(found)} experiment{'s' * (len(found) > 1)}"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    return save_figure(fig, png)
