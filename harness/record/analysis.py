"""
HARNESS: the analysis of a run, read-only: a results.tsv and its events loaded (load_run -> Run), the summary and its
text, the kept table, what the events say (spend, proposers, cancels, memory, throughput), the noise, the verdict's
rule, the holdout, the hardware epochs. report.py prints it, analysis.ipynb and the dashboard read it,
harness.record.plots draws it. Measures nothing, logs nothing, writes nothing.
"""

import collections
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import git

from harness import schema
from harness.judge import curves
from harness.run import hardware, phases
from harness.judge.curves import ROW as CANCELLED_ROW
from harness.errors import SetupError
from harness.gitops import harness_dir
from harness.judge.holdout import holdout_summary, pinned_env
from harness.ledger import (SMOKE_LABEL, STATUSES, archive_path, baseline_of, epoch_of_row, experiment_events,
                            hardware_events, is_baseline, load_results, read_events, rows_by_tag, select_tag)
from harness.tag.tagview import tag_state
from harness.schema import Event
from harness.run.target import read_literals
from harness.judge.verdict import rule_of as verdict_rule, settings_of

# ---------------------------------------------------------------------------
# Loading (tolerant: the agent may be appending while we read)
# ---------------------------------------------------------------------------

def load_events(path):
    """Every event of an events.jsonl (harness.ledger.read_events: a cut last line is skipped). Raises
    FileNotFoundError naming the fix when the file is missing."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such events file. The agent writes events.jsonl next to "
                                f"results.tsv; pass its path with --events")
    return read_events(path)

# ---------------------------------------------------------------------------
# Direction of the metric
# ---------------------------------------------------------------------------

def read_goal(target_dir):
    """METRIC_GOAL ("min" or "max") from target_dir/prepare.py, read with ast (harness.run.target.read_literals); None
    when there is no prepare.py or it declares no METRIC_GOAL. Raises ValueError on any other value."""
    path = Path(target_dir) / "prepare.py"
    if not path.is_file():
        return None
    goal = read_literals(path).get("METRIC_GOAL")
    if goal is not None and goal not in ("min", "max"):
        raise ValueError(f"{path}: METRIC_GOAL must be 'min' or 'max', got {goal!r}")
    return goal


def infer_goal(metric_name):
    """Guess "min" or "max" from a metric's name (val_bpb, loss -> min; pass@1, accuracy -> max).
    Raises ValueError naming --goal when the name says nothing."""
    name = metric_name.lower()
    if any(k in name for k in ("bpb", "bpc", "loss", "nll", "perplexity", "ppl", "error")):
        return "min"
    if any(k in name for k in ("pass@", "acc", "reward", "score", "f1", "exact", "win")):
        return "max"
    raise ValueError(f"cannot tell whether a higher or lower {metric_name!r} is better; pass --goal min or --goal max")


def better(a, b, goal):
    """True when metric a is strictly better than b in the goal's direction."""
    return a < b if goal == "min" else a > b

# ---------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------

def has_metric(row):
    """A row whose metric means something: not a crash, and a finite number (load_run makes the 0.0 of a run
    cancelled early nan)."""
    return row.status != "crash" and math.isfinite(row.metric)


def without_cancelled(rows, events):
    """rows with the 0.0 placeholder of each run cancelled early (harness.judge.curves) made nan: the experiments whose
    event has `cancelled` when there are events, else the rows whose description ends `(cancelled at N%)`."""
    if events is not None:
        gone = {e["commit"] for e in events if e.get("event") == Event.EXPERIMENT and e.get("cancelled")}
    else:
        gone = {r.commit for r in rows if r.status == "discard" and CANCELLED_ROW.search(r.description)}
    return [dataclasses.replace(r, metric=math.nan) if r.commit in gone else r for r in rows]


def running_best(rows, goal):
    """Best kept metric up to and including each row (None before the first kept row); same length as rows."""
    best, out = None, []
    for row in rows:
        if row.status == "keep" and has_metric(row) and (best is None or better(row.metric, best, goal)):
            best = row.metric
        out.append(best)
    return out


@dataclass
class Summary:
    metric_name: str
    goal: str
    total: int                 # rows, baseline included
    counts: dict               # status -> rows, every status present
    baseline: float | None     # metric of the first row; None when there is none or it crashed
    best: float | None         # best metric among kept rows
    best_commit: str | None
    improvement: float | None  # baseline -> best in the goal's direction: positive means better
    improvement_pct: float | None  # improvement as % of |baseline|; None when the baseline is 0
    kept_experiments: int      # kept rows after the baseline
    experiment_counts: dict    # status -> rows after the baseline (what the experiments came to), every status present
    success_rate: float | None # kept_experiments / experiments after the baseline; None when there are none


def summarize(rows, metric_name, goal):
    """Counts, baseline (first row), best kept row, improvement and success rate of a list of Rows."""
    counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
    baseline = rows[0].metric if rows and has_metric(rows[0]) else None
    best_row = None
    for row in rows:
        if row.status == "keep" and has_metric(row) and (best_row is None or better(row.metric, best_row.metric, goal)):
            best_row = row
    best = best_row.metric if best_row else None
    improvement = pct = None
    if baseline is not None and best is not None:
        improvement = baseline - best if goal == "min" else best - baseline
        pct = 100 * improvement / abs(baseline) if baseline != 0 else None
    kept_experiments = sum(r.status == "keep" for r in rows[1:])
    experiments = len(rows) - 1
    return Summary(metric_name=metric_name, goal=goal, total=len(rows), counts=counts, baseline=baseline, best=best,
                   best_commit=best_row.commit if best_row else None, improvement=improvement, improvement_pct=pct,
                   kept_experiments=kept_experiments,
                   experiment_counts={s: sum(r.status == s for r in rows[1:]) for s in STATUSES},
                   success_rate=kept_experiments / experiments if experiments > 0 else None)


def kept_table(rows, goal):
    """One dict per kept row: commit, metric, gain over the best before it (positive = better; None for the
    first kept row) and description."""
    table, best = [], None
    for row, best_after in zip(rows, running_best(rows, goal)):
        if row.status == "keep" and has_metric(row):
            gain = None if best is None else (best - row.metric if goal == "min" else row.metric - best)
            table.append({"commit": row.commit, "metric": row.metric, "gain": gain, "description": row.description})
        best = best_after
    return table


@dataclass
class EventStats:
    experiments: int           # experiment events counted
    wall_seconds: float        # whole iterations: propose + train + bookkeeping
    train_seconds: float       # the training subprocesses
    llm_seconds: float
    input_tokens: int
    output_tokens: int
    cost_usd: float


def event_stats(events, tag=None):
    """Totals over the experiment events (of one tag when given); a field an event lacks counts as 0."""
    exps = experiment_events(events, tag)
    def total(key):             # a hand-edited event's string, nan or list counts as 0 too
        return sum(v for e in exps if isinstance(v := e.get(key), (int, float)) and math.isfinite(v))
    return EventStats(experiments=len(exps), wall_seconds=total("wall_seconds"), train_seconds=total("train_seconds"),
                      llm_seconds=total("llm_seconds"), input_tokens=int(total("input_tokens")),
                      output_tokens=int(total("output_tokens")), cost_usd=total("cost_usd"))

# ---------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------

def _signed(x):
    return "-" if x is None else f"{x:+.6f}"


def _duration(seconds):
    seconds = round(seconds)
    h, m, s = seconds // 3600, seconds % 3600 // 60, seconds % 60
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def format_summary(s):
    """The summary as a few aligned lines of text."""
    c = s.experiment_counts             # the baseline's own row (a keep) is not an experiment's verdict
    direction = "lower" if s.goal == "min" else "higher"
    lines = [f"metric       {s.metric_name} ({direction} is better)",
             f"experiments  {s.total} rows = baseline + {max(s.total - 1, 0)}: "
             f"{c['keep']} keep, {c['discard']} discard, {c['crash']} crash"]
    if s.total == 0:
        return "\n".join(lines + ["no experiments yet"])
    lines.append(f"baseline     {s.baseline:.6f}" if s.baseline is not None else "baseline     crashed (no metric)")
    if s.best is None:
        lines.append("best         none: no kept row with a metric")
    else:
        pct = f" ({s.improvement_pct:+.2f}%)" if s.improvement_pct is not None else ""
        gain = f", improvement {_signed(s.improvement)}{pct}" if s.improvement is not None else ""
        lines.append(f"best         {s.best:.6f} at {s.best_commit}{gain}")
    if s.success_rate is not None:
        lines.append(f"success rate {s.kept_experiments}/{s.total - 1} = {100 * s.success_rate:.1f}% of experiments kept")
    return "\n".join(lines)


def format_kept(table, metric_name, runs=None, by=None):
    """The kept commits as a plain text table; runs: {commit: [metric of each run]} (from the events) adds, for a
    commit measured more than once, its runs under it (the metric column is their mean); by: {commit: who proposed
    it} adds that column."""
    if not table:
        return "kept commits: none"
    width, who = max(len(metric_name), 9), max([len(v) for v in (by or {}).values()] + [2]) if by else 0
    lines = [f"{'commit':<8} {metric_name:>{width}} {'gain':>10}  " + (f"{'by':<{who}}  " if by else "")
             + "description"]
    for t in table:
        shown = f"{by.get(t['commit'], '-'):<{who}}  " if by else ""
        lines.append(f"{t['commit']:<8} {t['metric']:>{width}.6f} {_signed(t['gain']):>10}  {shown}{t['description']}")
        if len((runs or {}).get(t["commit"]) or []) > 1:
            lines.append(f"{'':<8} {'':>{width}} {'':>10}    runs: {', '.join(f'{m:.6f}' for m in runs[t['commit']])}")
    return "\n".join(lines)


def proposers_of(events, tag=None):
    """({commit: who proposed it}, the line counting experiments and keeps per proposer) from the experiment events:
    an event's `by` (the hybrid's sampler, "llm override", "llm code"), else its proposer ("external": `try`)."""
    exps = [e for e in experiment_events(events, tag) if e.get("n") and not is_baseline(e)]   # a baseline: no one's
    who = {e["commit"]: e.get("by") or e.get("proposer") or "?" for e in exps}
    counts = collections.Counter(who[e["commit"]] for e in exps)
    keeps = collections.Counter(who[e["commit"]] for e in exps if e["status"] == "keep")
    line = "proposed by  " + ", ".join(f"{name} {k} ({keeps[name]} kept)" for name, k in counts.most_common())
    return who, line if exps else ""


def cancelled_of(events, tag=None):
    """The line on the runs cancelled early (their curve behind the best's: harness.judge.curves), counted apart from
    the other discards, with the device-seconds they did not train (budget x the share left at the cancel); "" when none
    was."""
    done = [e for e in experiment_events(events, tag) if e.get("cancelled")]
    if not done:
        return ""
    saved = sum(e["budget_s"] * (1 - e["cancelled"]["at"]) for e in done if e.get("budget_s"))
    at = sorted(round(100 * e["cancelled"]["at"]) for e in done)
    where = f"{at[0]}%" if at[0] == at[-1] else f"{at[0]}-{at[-1]}%"
    return (f"cancelled    {len(done)} discard{'s' if len(done) > 1 else ''} stopped early (at {where} of the "
            f"budget), {saved:.0f} device-seconds of training saved")


def memory_of(events, tag=None, goal="min"):
    """The lines on the search's memory (harness/propose/memory.py, harness/propose/outer.py): the proposals refused
    before a run, by rule, and each search mechanism the outer loop designed: activated or rejected, what it refused,
    the experiments it shaped (proposed while it was active) with their keeps and best gain, where it is committed. []
    when none."""
    mine = [e for e in events if tag is None or e.get("tag") == tag]
    refused = schema.of(mine, Event.REFUSED)
    lines = []
    if refused:
        rules = collections.Counter(e.get("rule", "?") for e in refused)
        forced = len(schema.of(mine, Event.FORCED))
        lines.append(f"refused      {len(refused)} proposal{'s' if len(refused) > 1 else ''} before a run ("
                     + ", ".join(f"{rule} {k}" for rule, k in rules.most_common()) + ")"
                     + (f"; {forced} run anyway by `try --force`" if forced else ""))
    exps = experiment_events(events, tag)
    for mid in dict.fromkeys(e["id"] for e in schema.of(mine, Event.MECHANISM)):
        acts = {e["action"]: e for e in mine if e.get("event") == Event.MECHANISM and e["id"] == mid}
        if "activated" not in acts:
            why = acts.get("rejected", {}).get("reason", "not validated yet")
            lines.append(f"mechanism {mid:<4} rejected: {why}")
            continue
        shaped = [e for e in exps if mid in (e.get("shaped_by") or [])]
        gains = [(e["base_metric"] - e["metric"]) * (1 if goal == "min" else -1) for e in shaped
                 if e["status"] != "crash" and not e.get("cancelled") and e.get("base_metric") is not None]
        end = acts.get("deactivated") or acts.get("retired")
        lines.append(
            f"mechanism {mid:<4} activated after #{acts['activated'].get('after', '?')}"
            + (f", {end['action']} after #{end.get('after', '?')}: {end.get('reason', '')}" if end else "")
            + f"; refused {sum(e.get('rule') == f'mechanism {mid}' for e in refused)}, shaped {len(shaped)} "
            f"experiments ({sum(e['status'] == 'keep' for e in shaped)} kept"
            + (f", best gain {max(gains):+.6f}" if gains else "") + f"); git show {acts['activated'].get('ref')}"
            ":mechanism.py")
    return lines


def format_events(st):
    """Time per experiment and token / cost totals as text."""
    if st.experiments == 0:
        return "events: no experiment events"
    n = st.experiments
    return "\n".join([
        f"time         {n} experiments in {_duration(st.wall_seconds)}: per experiment {st.wall_seconds / n:.1f} s "
        f"(train {st.train_seconds / n:.1f} s, llm {st.llm_seconds / n:.1f} s)",
        f"tokens       {st.input_tokens:,} in, {st.output_tokens:,} out, cost ${st.cost_usd:.2f}",
    ])


def plain(text):
    """text as a matplotlib label shows it: its dollar signs literal (matplotlib reads "$...$" as math, and a
    description such as "lr $\\foo$" would make it raise)."""
    return str(text).replace("$", "\\$")


# ---------------------------------------------------------------------------
# Entry points: analysis.ipynb calls load_run, the command line calls main
# ---------------------------------------------------------------------------

@dataclass
class Run:
    path: Path                 # the results.tsv read
    title: str                 # file name, plus the tag when one was selected
    metric_name: str
    goal: str                  # "min" or "max"
    rows: list                 # list[Row]: the whole file, or the tag's rows
    skipped: list              # malformed lines left out of the file
    events: list | None        # every event of the events file; None when there is none or it does not match the rows
    tag: str | None            # the tag asked for, or the latest one when the file holds several
    notes: list = None         # what load_run decided for the reader (events ignored, latest tag picked)


def load_run(results=".", events=None, tag=None, goal=None):
    """Everything the report needs, as the command line and the notebook both ask for it.

    results: a results.tsv or a target folder holding one. events: an events.jsonl; None means the one next
    to results.tsv if it exists, used only when its experiments account for the rows. tag: keep only that run's
    rows (needs the events file; read from results.<tag>.tsv when its rows were moved there); None: the latest
    tag when the events name several. goal: "min"/"max";
    None means METRIC_GOAL of prepare.py next to results.tsv, else guessed from the metric name.
    Raises FileNotFoundError / ValueError with a message naming the fix.
    """
    path = Path(results)
    path = path / "results.tsv" if path.is_dir() else path
    events_path = Path(events) if events else path.parent / "events.jsonl"
    if tag and path.name == "results.tsv" and archive_path(path, tag).is_file():
        path = archive_path(path, tag)      # the tag's rows were moved aside when another tag started
    event_list = load_events(events_path) if events or events_path.is_file() else None
    loaded = load_results(path)
    if tag and event_list is None:
        raise ValueError(f"--tag needs the events file to know which rows belong to a run, and {events_path} "
                         f"does not exist; pass it with --events")
    notes = []
    by_tag, strays = rows_by_tag(path, event_list) if event_list is not None and not tag else ({}, [])
    if strays:
        # an events.jsonl that did not write these rows (another run's, or rows written by hand): its times and
        # tokens would be someone else's
        notes.append(f"{events_path.name} does not account for {len(strays)} row(s) of {path.name} (another run's "
                     f"events?): ignored; pass the right one with --events")
        event_list = None
    elif by_tag:
        tag = list(by_tag)[-1]  # one run per report: a second tag's baseline is not an experiment of the first
        if len(by_tag) > 1:
            notes.append(f"{path.name} holds the tags {', '.join(by_tag)}: reporting the latest, {tag} (--tag to choose)")
    rows = without_cancelled(select_tag(loaded.rows, event_list, tag) if tag else loaded.rows, event_list)
    goal = goal or read_goal(path.parent) or infer_goal(loaded.metric_name)
    return Run(path=path, title=path.name + (f" tag {tag}" if tag else ""), metric_name=loaded.metric_name,
               goal=goal, rows=rows, skipped=loaded.skipped, events=event_list, tag=tag, notes=notes)


def noise_of(run):
    """(noise sd, number of baseline runs) measured by the run's tag's current baseline (its first, or its latest
    hardware epoch's: ledger.baseline_of), or (None, 0) (one baseline run, or no events)."""
    baseline = baseline_of(experiment_events(run.events or [], run.tag)) or {}
    return baseline.get("noise_sd"), len(baseline.get("runs") or [])


def curve_logs(run, commits=None):
    """{commit (7 hex): [the log of each of its runs]} from the run's "run_end" events (commits: only these; None:
    all); each run's learning curve is kept beside its log (harness.judge.curves.path_of). {} without events."""
    found = {}
    for e in run.events or []:
        if e.get("event") != Event.RUN_END or not e.get("log") or (run.tag is not None and e.get("tag") != run.tag):
            continue
        if commits is None or e.get("commit") in commits:
            found.setdefault(e["commit"], []).append(e["log"])
    return found


def curves_of(run, commits=None):
    """{commit (7 hex): [harness.judge.curves.Curve of each of its runs]}: the curve kept beside each run's log
    (progress 0..1 of the budget, the smoothed train loss, tokens/s, as train.py printed them). commits: only these
    (None: all). A run without a kept curve (no progress line printed, a log deleted) is left out; {} without events."""
    found = {}
    for commit, logs in curve_logs(run, commits).items():
        for log in logs:
            if (curve := curves.load(log)) is not None and curve.points:
                found.setdefault(commit, []).append(curve)
    return found


def rule_of(run, baseline=None):
    """The verdict rule the run's tag was judged by (harness.judge.verdict.Rule): paired or margin, its flags fixed with
    its baseline (tagview.tag_state), its noise and floor from its current baseline (baseline: that of another of its
    baselines' "experiment" event: an earlier hardware epoch's); None without events or from before they were logged."""
    tag = run.tag or (schema.last(run.events or [], Event.EXPERIMENT) or {}).get("tag")
    state = tag_state(run.events or [], tag)
    if state.rule is None:
        return None
    try:
        settings = settings_of(state.rule)
    except SetupError:                  # a verdict rule this version lacks: the report goes on without it
        return None
    return verdict_rule(run.goal, baseline=baseline or baseline_of(state.history), **settings)


def throughput_of(run):
    """Lines on how busy the devices were, one per invocation of agent.py's loop on the run's tag (its last
    "throughput" or "stop" event): experiments per hour, each device's busy share, the proposal wait, where the wall
    time went (the training share first: harness.run.phases; no label: the report prints "throughput", the page its
    own). [] without events or such figures (runs from before they were
    logged, `agent.py try`)."""
    lines, last = [], None
    for e in run.events or []:
        if run.tag is not None and e.get("tag") != run.tag:
            continue
        if e.get("event") == Event.START and last is not None:
            lines.append(last)
            last = None
        elif e.get("event") in (Event.THROUGHPUT, Event.STOP) and isinstance(e.get("busy"), dict):
            last = e
    lines += [last] if last is not None else []
    return [f"{e['experiments_per_hour']:.1f} experiments/hour over {_duration(e['wall_s'])}; device busy "
            + ", ".join(f"{name} {share:.0%}" for name, share in e["busy"].items())
            + f"; proposal wait {e['proposal_wait_s']:.0f} device-seconds"
            + (f"; wall time: {phases.words(e['phases'])}" if isinstance(e.get("phases"), dict) else "")
            for e in lines]


def holdout_of(run):
    """report.py --holdout: the holdout line of the run's tag (harness.judge.holdout.holdout_summary), found through the
    git repository holding results.tsv. ValueError when the run has no events (no tag to find its artifacts)."""
    if run.events is None or run.tag is None:
        raise ValueError("needs the run's events.jsonl (its tag names the saved artifacts)")
    repo = git.Repo(run.path.parent, search_parent_directories=True)
    history = experiment_events(run.events, run.tag)
    return holdout_summary(harness_dir(repo, run.tag), history, run.metric_name, run.goal,
                           pinned_env(run.events, run.tag))


@dataclass
class Epoch:
    """The rows of one hardware epoch of a tag (harness.run.hardware: `--new-hardware` opens the next): numbers of
    different epochs were measured on different hardware or software and are never compared."""
    number: int                # 1: where the tag started; k: its k-th hardware (rows labelled [hwk])
    rows: list                 # list[Row], its baseline first
    words: str | None          # its fingerprint in words (hardware.words), None without its "hardware" event


def epochs_of(run, rows=None):
    """The run's rows (or `rows`, a subset of them) split by hardware epoch, in order: [Epoch], one for a tag that
    stayed on one machine (or rows without events). A row's epoch is its [hwN] label (ledger.epoch_of_row), its
    words the tag's latest "hardware" event of that epoch. report.py and the dashboard summarise the last one."""
    rows = run.rows if rows is None else rows
    tag = run.tag or (schema.last(run.events or [], Event.EXPERIMENT) or {}).get("tag")
    words = {e.get("epoch", 1): hardware.words(e) for e in hardware_events(run.events or [], tag)}
    found = {}
    for row in rows:
        found.setdefault(epoch_of_row(row.description), []).append(row)
    return [Epoch(k, found[k], words.get(k)) for k in sorted(found)] or [Epoch(1, [], words.get(1))]


def epoch_lines(epochs, goal):
    """One line per epoch before the last (its rows, its best, what it was measured on), and one naming the last's
    hardware when there are several: report.py prints them under the summary, which is the last epoch's."""
    if len(epochs) < 2:
        return []
    lines = []
    for e in epochs[:-1]:
        best = kept_table(e.rows, goal)
        shown = f"best {best[-1]['metric']:.6f} ({best[-1]['commit']})" if best else "no kept row with a metric"
        lines.append(f"hardware {e.number:<3} {len(e.rows)} rows, {shown}; not comparable: measured on "
                     f"{e.words or 'another machine'}")
    return lines + [f"hardware {epochs[-1].number:<3} the figures above: measured on {epochs[-1].words or '?'}"]


def is_smoke(row):
    """A row of a run with a shortened budget: its description starts with the harness's smoke label."""
    return SMOKE_LABEL.match(row.description) is not None
