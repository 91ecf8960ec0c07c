"""
HARNESS: the dashboard's data: a tag as one JSON-able dict (gather), what report.py prints, each row with its event's
figures, and for the latest experiments (and every keep) the diff against its base and its runs' learning curves; the
baseline band and the best's mean curve. Every text made safe to show (text: control and reordering characters
out) and every number finite or None. Nothing here raises on a missing or torn input. harness.record.dashboard
renders it.
"""

import math
import os
import subprocess
import time
import datetime
from pathlib import Path

import numpy

from harness import gitops
from harness.judge import curves
from harness.record import analysis
from harness.schema import Event

RELOAD_S = 30               # how often a live page reloads itself
DETAILED = 1000             # experiments whose diff and curves the page carries: the latest, plus the baseline and
#                             every keep (a 10,000-experiment tag would otherwise weigh ~100 MB); the others name
#                             the `git diff` that shows theirs
MAX_DIFF = 20_000           # characters of one diff carried (a whole rewritten train.py is ~25 KB)
CURVE_POINTS = 120          # points of one curve carried (a run prints a progress line every step)
GRID = [round(0.01 * i, 2) for i in range(1, 101)]   # progress points of a mean curve and the baseline band


BIDI = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")   # reorder what is shown


def text(value):
    """value as text the page may carry: str() of it with control characters other than newline and tab replaced
    by their Unicode control pictures (ESC -> U+241B), so that a log's escape codes show instead of vanishing; the
    bidirectional controls that reorder what a line shows ("Trojan Source") as <U+202E>; a lone surrogate as U+FFFD
    (it cannot be written as UTF-8)."""
    value = "" if value is None else str(value)
    value = value.encode("utf-8", "replace").decode("utf-8") if any("\ud800" <= c <= "\udfff" for c in value) \
        else value
    return "".join(chr(0x2400 + ord(c)) if ord(c) < 32 and c not in "\n\t" else "\u2421" if c == "\x7f"
                   else f"<U+{ord(c):04X}>" if c in BIDI else c for c in value)


def number(value, digits=6):
    """A finite number rounded to `digits` decimals, else None (nan, inf, a string, a bool or a value too big for a
    float have no place in the page's JSON)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return round(value, digits) if math.isfinite(value) else None


# ---------------------------------------------------------------------------
# Gathering: what the page shows, from an analysis.Run
# ---------------------------------------------------------------------------


def thin(points, most=CURVE_POINTS):
    """Every k-th of points so that at most `most` remain, the last one always kept."""
    if len(points) <= most:
        return list(points)
    k = math.ceil(len(points) / most)
    return list(points[::k]) + ([points[-1]] if (len(points) - 1) % k else [])


_thinned = {}       # log -> ((mtime_ns, size) of its curve file, its points thinned): the loop's process rewrites
#                     the page after every verdict and reads each curve file once


def curve_points(log):
    """[[progress, loss], ...] of the curve kept beside a run's log, thinned to CURVE_POINTS and rounded; [] when
    there is none. Cached by the curve file's mtime and size."""
    path = curves.path_of(log)
    try:
        stat = path.stat()
    except OSError:
        return []
    key = (stat.st_mtime_ns, stat.st_size)
    if _thinned.get(log, (None,))[0] != key:
        curve = curves.load(log)
        points = thin([q for q in curve.points if number(q.loss) is not None]) if curve else []
        _thinned[log] = key, [[round(q.progress, 4), number(q.loss, 5)] for q in points]
    return _thinned[log][1]


def mean_band(runs):
    """[[progress, mean, sd], ...] of several curves ([[progress, loss], ...], linear between their points as
    Curve.at is) on GRID where every one has a value (sd 0 with one)."""
    grid, rows = numpy.array(GRID), []
    for points in runs:
        p, loss = numpy.array(points, dtype=float).T
        rows.append(numpy.interp(grid, p, loss, left=numpy.nan, right=numpy.nan))
    values = numpy.array(rows)
    out = []
    for k, p in enumerate(GRID):
        column = values[:, k]
        if numpy.isfinite(column).all():                # where every run has a value: no step where one ends
            sd = float(column.std(ddof=1)) if column.size > 1 else 0.0
            out.append([p, round(float(column.mean()), 5), round(sd, 5)])
    return out


def diffs_of(repo_dir, pairs, path):
    """{commit: the diff of `path` from base to commit} for (base, commit) full shas, in one `git diff-tree --stdin`
    (each commit's diff follows a line holding its sha). A pair git cannot diff (a pruned object) is left out; an
    identical pair gives "". Raises nothing: a failing git gives {}."""
    pairs = [(b, c) for b, c in pairs if b and c]
    if not pairs:
        return {}
    feed = "".join(f"{c} {b}\n" for b, c in pairs)          # "<commit> <parent>": the diff from the parent
    try:
        argv = ["git", "diff-tree", "-p", "--no-color", "--no-ext-diff", "--no-textconv", "--stdin", "--", path]
        done = subprocess.run(argv, cwd=repo_dir, input=feed.encode(), capture_output=True, timeout=120,
                              env={**os.environ, **gitops.HARDENED})
    except (OSError, subprocess.TimeoutExpired):
        return {}
    wanted, out, current = {c for _, c in pairs}, {c: "" for _, c in pairs}, None
    for line in done.stdout.decode("utf-8", "replace").splitlines(keepends=True):
        if line.rstrip("\n") in wanted:
            current = line.rstrip("\n")
        elif current is not None and len(out[current]) < MAX_DIFF:
            out[current] += line
    return {c: d if len(d) < MAX_DIFF else d[:MAX_DIFF] + "\n[... diff cut at 20,000 characters]\n"
            for c, d in out.items()}


def gather(run, live=False, stale_s=3600.0):
    """The page's data (a JSON-able dict) for an analysis.Run: what report.py prints, each row with its event's figures
    (delta against its base, runs, wall time, who proposed it), and for the DETAILED latest experiments (and every
    keep) the diff against its base and its runs' learning curves; the baseline band and the best's mean curve.
    Nothing here raises on a missing or torn input: a
    run without events shows its rows only."""
    events = run.events or []
    smoke = [r for r in run.rows if analysis.is_smoke(r)]
    rows = [r for r in run.rows if not analysis.is_smoke(r)] or smoke
    exps = {e["commit"]: e for e in analysis.experiment_events(events, run.tag)     # events as written; a hand-edited
            if isinstance(e.get("commit"), str) and isinstance(e.get("full_commit", ""), str)}  # one may be odd
    epochs = analysis.epochs_of(run, rows)
    summary = analysis.summarize(epochs[-1].rows, run.metric_name, run.goal)   # one hardware's numbers
    rule = analysis.rule_of(run) if events else None
    noise_sd, noise_runs = analysis.noise_of(run) if events else (None, 0)
    tails = {e.get("commit"): e["log_tail"] for e in events      # a crashed run's log tail (its last run's)
             if e.get("event") == Event.RUN_END and (run.tag is None or e.get("tag") == run.tag) and e.get("log_tail")}
    who, _ = analysis.proposers_of(events, run.tag)
    table = [row_data(i, row, exps.get(row.commit, {}), who, tails) for i, row in enumerate(run.rows)]
    detailed = {t["commit"] for t in table[-DETAILED:]} | {t["commit"] for t in table if t["status"] == "keep"}
    for t in table:
        t["detail"] = t["commit"] in detailed
    firsts = {k.number: k.rows[0].commit for k in epochs if k.rows}        # each hardware epoch's baseline
    bases = {t["base"] for t in table if t["detail"]} | set(firsts.values())
    margins = {k: number(r.margin) for k, c in firsts.items() if (r := analysis.rule_of(run, exps.get(c)) if events
                                                                  and exps.get(c) else None) is not None}
    curve_data = curves_data(run, detailed, bases)
    diffs = diffs_data(run, exps, detailed)
    holdout = next((e.get("line") for e in reversed(events) if e.get("event") == Event.HOLDOUT
                    and (run.tag is None or e.get("tag") == run.tag)), None)
    stats = analysis.event_stats(events, run.tag) if events else None
    lines = notes_of(run, events, epochs, len(smoke) if smoke and rows is not smoke else 0)
    best_row = next((t for t in table if t["commit"] == summary.best_commit), None)
    written = time.time()
    return {
        "title": text(run.title), "metric": text(run.metric_name), "goal": run.goal, "tag": text(run.tag),
        "written": written, "written_text": datetime.datetime.fromtimestamp(written).strftime("%Y-%m-%d %H:%M:%S"),
        "live": bool(live), "reload_s": RELOAD_S, "stale_s": stale_s,
        "summary": text(analysis.format_summary(summary)), "notes": [text(n) for n in run.notes],
        "noise": ({"sd": number(noise_sd), "runs": noise_runs} if noise_sd is not None else None),
        "confidence": (number(summary.improvement / noise_sd, 2) if noise_sd and summary.improvement is not None
                       else None),
        "rule": text(rule.words(run.metric_name)) if rule else None,
        "margins": margins,
        "throughput": [text(x) for x in analysis.throughput_of(run)],
        "spend": ({"input_tokens": stats.input_tokens, "output_tokens": stats.output_tokens,
                   "cost_usd": number(stats.cost_usd, 4),
                   "time": text(analysis.format_events(stats).splitlines()[0].removeprefix("time").strip())}
                  if stats else None),
        "holdout": text(holdout.removeprefix("holdout").lstrip(": ")) if holdout else None,
        "lines": [text(x) for x in lines],
        "kept": [{"commit": text(k["commit"]), "metric": number(k["metric"]), "gain": number(k["gain"]),
                  "description": text(k["description"])} for k in analysis.kept_table(epochs[-1].rows, run.goal)],
        "rows": table, "curves": curve_data, "diffs": diffs,
        "baselines": firsts,
        "best": best_row["commit"] if best_row else None,
        "skipped": len(run.skipped),
        "epochs": len(epochs),
    }


def row_data(i, row, e, who, tails):
    """The page's row i: results.tsv's row with its "experiment" event's figures (e: {} when it has none), who
    proposed it (who: commit -> proposer) and a crashed run's log tail (tails: commit -> tail)."""
    metric = number(row.metric) if analysis.has_metric(row) else None
    base_metric = number(e.get("base_metric"))
    runs = e.get("runs") if isinstance(e.get("runs"), list) else []
    return {"i": i, "n": e["n"] if type(e.get("n")) is int else i, "commit": text(row.commit),
            "status": text(row.status),
            "metric": metric, "delta": number(metric - base_metric) if None not in (metric, base_metric)
            and i else None, "runs": [number(m) for m in runs],
            "wall": number(e.get("wall_seconds"), 1),
            "by": text(who.get(row.commit, e.get("proposer", ""))),
            "idea": text(row.description), "reason": text(e.get("reason")), "base": text(e.get("base"))[:7],
            "t": number(e.get("t"), 3), "memory_gb": number(e.get("memory_gb"), 1),
            "best_runs": [number(m) for m in e["best_runs"]] if isinstance(e.get("best_runs"), list)
            else [], "gain": number(e.get("gain")),
            "remeasured": e["remeasured"] if type(e.get("remeasured")) is int else 0,
            "tokens_per_sec": number(e.get("tokens_per_sec"), 0), "cost": number(e.get("cost_usd"), 4),
            "smoke": analysis.is_smoke(row), "cancelled": bool(e.get("cancelled")),
            "epoch": analysis.epoch_of_row(row.description),
            "tail": text(tails.get(row.commit))[-4000:]}


def curves_data(run, detailed, bases):
    """{commit: {"runs": [points of each run's curve], "mean": the mean band (bases only)}} of the detailed
    experiments and the bases they were judged against, from the curves kept beside their logs."""
    curve_data = {}
    for commit, logs in analysis.curve_logs(run, detailed | bases).items():
        if found := [points for log in logs if (points := curve_points(log))]:
            curve_data[commit] = {"runs": found, "mean": mean_band(found) if commit in bases else []}
    return curve_data


def diffs_data(run, exps, detailed):
    """{commit: the diff of its train.py against its base} for the detailed experiments, from the repository holding
    the run's results.tsv ({} outside one)."""
    diffs = {}
    if exps and run.path.parent.is_dir():
        pairs = [(e.get("base"), e.get("full_commit")) for e in exps.values() if e.get("commit") in detailed]
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=run.path.parent, capture_output=True,
                             text=True, env={**os.environ, **gitops.HARDENED}).stdout.strip()
        if top:
            path = os.path.relpath((run.path.parent / "train.py").resolve(), Path(top).resolve())
            full = diffs_of(top, pairs, path)
            diffs = {e["commit"]: text(full[e["full_commit"]]) for e in exps.values()
                     if e.get("full_commit") in full}
    return diffs


def notes_of(run, events, epochs, apart):
    """The page's lines under the summary, as report.py prints them: who proposed, the cancelled runs, the memory,
    the hardware epochs, and how many rows with a shortened budget are apart (apart: 0 when none is)."""
    lines = [line for line in (analysis.proposers_of(events, run.tag)[1], analysis.cancelled_of(events, run.tag),
                               *analysis.memory_of(events, run.tag, run.goal)) if line]
    lines += analysis.epoch_lines(epochs, run.goal)
    if apart:
        lines.append(f"{apart} rows with a shortened budget are apart from the figures above (marked smoke)")
    return lines
