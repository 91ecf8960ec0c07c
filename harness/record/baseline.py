"""
HARNESS: what a tag is measured against: its baseline at the start (the unmodified train.py, --baseline-runs seeds:
the first best, the noise floor, the conditions the wall-time allowance scales from; again on new hardware), and at
the stop the holdout re-score of the baseline and the best on the split no run ever saw.
"""

import math
import statistics
import time

from harness import console, ledger
from harness.judge import holdout, verdict
from harness.record import dashboard
from harness.run import hardware, sandbox
from harness.errors import SetupError, Stop
from harness.run.runner import EVAL_TIMEOUT, Kind
from harness.tag.session import RUN_LOG, best_source
from harness.schema import Event
from harness.record.experiment import Result, commit, keep, make_candidate_ref, max_wall, record


def baseline_commit(s):
    """(n, commit) of the baseline to measure now (Session.baseline_due): experiment 0 is the branch start itself; a
    re-baseline on new hardware (--new-hardware) commits the best's train.py unchanged as the next experiment, its own
    commit, so that the new hardware's runs (what candidates pair with, their curves) never mix with the old best's."""
    if s.next_n == 0:
        make_candidate_ref(s, 0, s.best_commit)
        return 0, s.best_commit
    n = s.next_n
    return n, commit(s, n, best_source(s), f"baseline on new hardware ({hardware.words(s.hardware)})", same=True)


def record_baseline(s, outcomes, t0, spend0):
    """The baseline from its runs (the unmodified train.py, --baseline-runs seeds; baseline_commit's experiment):
    their mean is the best, their sd the noise floor (s.rule's), the mean of their speed probes the conditions the
    wall-time allowance is scaled from. A re-baseline on new hardware (n > 0, `rebaseline` in its event) is a keep:
    the branch moves to its commit, and the tag's rule settings stay the first baseline's. Raises Stop when a run
    crashed (nothing to improve on) or the cluster could not run it."""
    for outcome in outcomes:
        if outcome.kind in (Kind.LOST, Kind.NODE):              # the cluster, not train.py
            raise Stop(f"the baseline could not run on the Ray cluster ({outcome.reason}); fix the cluster or its "
                       f"data (docs/parallel.md), then rerun the same command. Last lines of {RUN_LOG}:\n"
                       f"{outcome.log_tail}")
        if outcome.kind is Kind.TIMEOUT:    # the train.py the tag starts from and the pristine evaluator: the machine
            what = "separate evaluation" if outcome.reason.startswith(EVAL_TIMEOUT) else "training"
            raise Stop(f"the baseline's {what} ran out of time ({outcome.reason}): this machine is too slow or too "
                       f"busy for this budget, which is not train.py's fault (do not change it). Rerun the same "
                       f"command with a longer limit, --timeout {baseline_timeout_hint(outcome)}, quiet the machine, or "
                       f"prepare the smaller lab profile (`uv run prepare.py --profile lab --force`)")
        if outcome.metric is None:
            raise Stop(f"the baseline run crashed ({outcome.reason}); nothing to improve on. Fix train.py, commit "
                       f"it (on {s.tag.branch} is fine), and rerun the same command. Last lines of {RUN_LOG}:\n"
                       f"{outcome.log_tail}")
    runs = tuple(outcome.metric for outcome in outcomes)
    noise_sd = statistics.stdev(runs) if len(runs) > 1 else None
    floor, floor_source = verdict.sd_floor(s.tag.metric, runs, outcomes[-1].eval_summary, s.tag.sd_floor_declared)
    probes = [outcome.probe_s for outcome in outcomes if outcome.probe_s]
    judged = verdict.Verdict("keep", runs, statistics.fmean(runs))
    rule, n = s.rule, s.next_n
    again = dict(rebaseline=True) if n else {}     # built on the best; no base_metric: another machine measured it
    record(s, Result(n, outcomes[-1], judged, "baseline on new hardware" if n else "baseline", time.monotonic() - t0,
                     s.spend - spend0, noise_sd=noise_sd, base=s.best_commit if n else None,
                     fields=dict(**rule.recorded(), seed_base=s.tag.seed_base,         # the tag's rule from now on
                                 sd_floor=floor, floor_source=floor_source,
                                 base_probe_s=statistics.fmean(probes) if probes else None, timeout_s=s.tag.timeout,
                                 **again)))
    if n:
        keep(s, s.history[-1])
    s.rule = verdict.rule_of(rule.goal, baseline=s.history[-1], **verdict.settings_of(rule.recorded()))
    if noise_sd is not None:
        console.say(f"noise floor: {s.tag.metric} sd {noise_sd:.6f} over {len(runs)} seeds; " + (
            f"candidates are paired with these seeds (false-keep rate {s.rule.false_keep:g})" if s.rule.is_paired
            else f"a candidate must beat the best by {s.rule.margin:.6f} ({s.rule.source})"))
    console.say(max_wall(s).words())


def baseline_timeout_hint(outcome):
    """A --timeout for a baseline whose run hit its limit: twice what it ran, in whole minutes (seconds)."""
    return 60 * math.ceil(2 * max(outcome.seconds + outcome.eval_seconds, 60) / 60)


def holdout_wrap(s):
    """The holdout evaluator's sandbox, the separate evaluator's (its pristine copy, the artifact read-only; bwrap's
    --die-with-parent: a kill -9 of the harness takes it along), on the first device's GPU; None without a sandbox."""
    if s.sandbox is None:
        return None
    gpu = sandbox.run_gpu(s.pool.devices[0].env if s.pool else {})
    return lambda argv, artifact: s.sandbox.evaluate(argv, s.tag.home / "frozen", artifact, gpu)


def holdout_line(s):
    """The end-of-run holdout line (harness.judge.holdout.holdout_summary), or why it was not measured. Announced first,
    with the time two evaluations took in this tag (it can take minutes, after the stop line)."""
    took = [e.get("eval_seconds") for e in (ledger.baseline_of(s.history), s.best_event)]
    console.say("holdout: re-scoring the baseline and the best on the hidden holdout split" +
                (f" (about {sum(took):.0f}s)" if None not in took else "") + " ...")
    try:
        tag = s.tag
        line = holdout.holdout_summary(tag.home, s.history, tag.metric, tag.goal, tag.evaluation["env"],
                                       wrap=holdout_wrap(s))
    except SetupError as e:
        line = f"holdout: not measured ({str(e).splitlines()[-1]})"
    s.log(Event.HOLDOUT, line=line)
    dashboard.refresh(s, live=False)
    return line
