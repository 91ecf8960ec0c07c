"""
HARNESS: review a run. Reads a target's results.tsv (and its events.jsonl when present), prints a summary
(counts by status, baseline, best, improvement, success rate, the kept commits, time and cost) and writes
progress.png. The analysis is harness/record/analysis.py and the figures harness/record/plots.py; this file is their
command line and re-exports them, so analysis.ipynb (`import report`) and the terminal always agree.

Usage:
    uv run report.py                        # the target in this folder: ./results.tsv, ./events.jsonl
    uv run report.py grpo                   # a target folder (the goal comes from grpo/prepare.py)
    uv run report.py results.tsv.example    # any results file
    uv run report.py --tag nov30            # only the experiments of run `nov30` (needs events.jsonl)
    options: --events PATH  --png PATH  --goal min|max

Direction of the metric: --goal wins; else METRIC_GOAL from prepare.py next to results.tsv (read with ast,
never imported, by the same reader as agent.py); else guessed from the metric's name in the header (val_bpb -> min,
pass@1 -> max).
"""

import argparse
import sys

from harness.record import dashboard
from harness.errors import SetupError
# the analysis, the figures and the ledger's one reader, re-exported for analysis.ipynb and older callers
from harness.record.analysis import (Epoch, EventStats, Run, Summary, _duration, _signed, better, cancelled_of,  # noqa: F401
                              curve_logs, curves_of, epoch_lines, epochs_of, event_stats, format_events, format_kept,
                              format_summary, has_metric, holdout_of, infer_goal, is_smoke, kept_table, load_events,
                              load_run, memory_of, noise_of, plain, proposers_of, read_goal, rule_of, running_best,
                              summarize, throughput_of, without_cancelled)
from harness.ledger import (SMOKE_LABEL, STATUSES, Results, Row, archive_path, baseline_of,  # noqa: F401
                            epoch_of_row, experiment_events, hardware_events, is_baseline, load_results, read_events,
                            rows_by_tag, select_tag)
from harness.tag.tagview import tag_state  # noqa: F401
from harness.record.plots import LABELS, PLOTTABLE, _y_limits, plot_curves, plot_progress, plottable, save_figure  # noqa: F401


def main(argv=None):
    """Print the report of a run and write progress.png. Returns the exit status (0 ok, 2 bad input)."""
    parser = argparse.ArgumentParser(description="Summarise a run: counts, best, kept commits, progress.png")
    parser.add_argument("results", nargs="?", default=".", help="results.tsv, or a target folder holding one (default: .)")
    parser.add_argument("--events", help="events.jsonl (default: the one next to results.tsv, if any)")
    parser.add_argument("--tag", help="only the experiments of this run tag (needs the events file)")
    parser.add_argument("--png", help="where to write the plot (default: progress.png next to results.tsv)")
    parser.add_argument("--holdout", action="store_true", help="also re-score the baseline and the best on the hidden "
                        "holdout split (their saved model artifacts, the tag's pristine prepare.py): the gain on data "
                        "the search never saw, beside the one it reported")
    parser.add_argument("--html", nargs="?", const="", metavar="PATH", help="also write the dashboard: one "
                        "self-contained page (table, diffs, learning curves; opens from disk, offline), default "
                        f"{dashboard.PAGE} next to results.tsv. The loop rewrites that one after every verdict")
    parser.add_argument("--goal", choices=("min", "max"), help="is a lower or higher metric better (default: "
                        "METRIC_GOAL in prepare.py next to results.tsv, else guessed from the metric name)")
    args = parser.parse_args(argv)
    try:
        run = load_run(args.results, args.events, args.tag, args.goal)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in run.skipped:
        print(f"warning: skipped a malformed line (a partial last line is normal while a run is going): {line[:80]!r}",
              file=sys.stderr)

    for note in run.notes:
        print(f"note: {note}", file=sys.stderr)

    print(f"report of {run.title}")
    smoke = [row for row in run.rows if is_smoke(row)]
    rows = [row for row in run.rows if not is_smoke(row)] or smoke
    if smoke and rows is smoke:
        print(f"smoke run: every row has a shortened budget ({smoke[0].description.split(']')[0]}]), "
              f"not comparable to full runs")
    apart, epochs = smoke and rows is not smoke, epochs_of(run, rows)
    rows = epochs[-1].rows              # one hardware's numbers: earlier epochs get a line each
    print(format_summary(summarize(rows, run.metric_name, run.goal)))
    for line in epoch_lines(epochs, run.goal):
        print(line)
    if apart:
        print(f"smoke rows   {len(smoke)} with a shortened budget, apart from the numbers above: "
              + ", ".join(f"{row.commit} {row.status}" for row in smoke[:10]) + (" ..." if len(smoke) > 10 else ""))
    print()
    runs = {e["commit"]: e.get("runs") for e in experiment_events(run.events or [], run.tag)}
    who, line = proposers_of(run.events or [], run.tag)
    print(format_kept(kept_table(rows, run.goal), run.metric_name, runs, who if len(set(who.values())) > 1 else None))
    for line in (line, cancelled_of(run.events or [], run.tag), *memory_of(run.events or [], run.tag, run.goal)):
        if line:
            print(line)
    noise_sd, runs = noise_of(run)
    if noise_sd:
        print(f"noise floor  sd {noise_sd:.6f} over {runs} baseline runs (seeds)")
    if (rule := rule_of(run)) is not None:
        margin = "" if rule.is_paired else f" Margin {rule.margin:.6f} ({rule.source})."
        print(f"verdict      {rule.words(run.metric_name)}{margin}")
    if run.events is not None:
        drawn = curves_of(run)
        print(f"curves       learning curves of {sum(r.commit in drawn for r in rows)} of {len(rows)} experiments "
              f"(beside each run's log; report.py --html draws them)")
        print()
        print(format_events(event_stats(run.events, run.tag)))
        for line in throughput_of(run):
            print(f"throughput   {line}")
    if args.holdout:
        print()
        try:
            print(holdout_of(run))
        except (SetupError, ValueError) as e:
            print(f"error: --holdout: {e}", file=sys.stderr)
            return 2
    title = run.title + (f" (hardware {epochs[-1].number})" if len(epochs) > 1 else "")
    png = plot_progress(rows, run.metric_name, run.goal, args.png or run.path.parent / "progress.png", title=title,
                        rule=rule)
    print(f"\nwrote {png}")
    if args.html is not None:
        try:
            print(f"wrote {dashboard.write(run, args.html or run.path.parent / dashboard.PAGE)}")
        except OSError as e:
            print(f"error: --html: cannot write the page ({e.strerror or e}: {e.filename}); pass another PATH",
                  file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
