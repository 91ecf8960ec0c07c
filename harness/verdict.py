"""
HARNESS: the verdict rule, the one place it exists. Keep, discard or crash for a candidate's measured runs: a Rule
(the goal, the margin, the number of confirmation runs) and judge(), which asks for further runs through a callable
and never changes an Outcome. Rule.words() states the rule for the LLM's system prompt, the `try` verdict block and
report.py, so none of them can say it otherwise. Pure: no git, no files, no processes.
"""

import dataclasses
import math
import statistics

THROUGHPUT_SHARE = 0.25     # a first run whose tokens/s is this far from the best's is run again before judging
MARGIN_SDS = 2              # the default margin: this many noise sds (the baseline's runs' spread)
DEFAULT_CONFIRM = 1         # confirmation runs of a likely win, unless --confirm says otherwise
# Runs of one candidate with other seeds that agree within this share of the noise sd repeat one draw: train.py
# ignores AUTORESEARCH_SEED, so no run confirms another. Two honest runs (difference ~ N(0, 2 sd^2)) land this close
# 0.56 % of the time; a seed-ignoring run on a GPU differs only by kernel nondeterminism, far less than 1 % of an sd.
SAME_DRAW_SDS = 0.01


@dataclasses.dataclass(frozen=True)
class Rule:
    """The tag's verdict rule. goal: "min" or "max"; confirm: further runs (other seeds) a likely win gets before it
    is kept (0: the first run decides, karpathy's strict ratchet); margin_flag: --margin in metric units (None:
    MARGIN_SDS x noise_sd when confirming, else 0); noise_sd: the spread of the baseline's runs (None: not measured,
    one run); noise_runs: how many baseline runs measure it (before the baseline is measured: how many will)."""
    goal: str
    confirm: int = 1
    margin_flag: float | None = None
    noise_sd: float | None = None
    noise_runs: int = 1
    sd_floor: float = 0.0       # the least noise sd assumed (see sd_floor()): identical baseline runs give sd 0
    floor_source: str = ""      # where sd_floor comes from, in words

    @property
    def sd(self):
        """The noise sd the margin is made of: the measured one, at least sd_floor (None: not measured)."""
        if self.noise_sd is None and self.noise_runs <= 1:
            return None
        return max(self.noise_sd or 0.0, self.sd_floor)

    @property
    def margin(self):
        """How much a candidate must beat the best by, in metric units (0.0: strictly better)."""
        if self.margin_flag is not None:
            return self.margin_flag
        return MARGIN_SDS * self.sd if self.sd and self.confirm > 0 else 0.0

    @property
    def noise_aware(self):
        """Whether the margin is the measured noise's (no --margin, confirmation on, a noise floor measured)."""
        return self.margin_flag is None and self.confirm > 0 and bool(self.noise_sd or self.noise_runs > 1)

    @property
    def source(self):
        """How the margin was set, in words."""
        if self.margin_flag is not None:
            return "--margin"
        if not self.noise_aware:
            return "strict: --confirm 0 or one baseline run"
        if self.noise_sd is not None and self.sd_floor > self.noise_sd:
            return f"{MARGIN_SDS} x the noise floor, {self.floor_source}: the baseline's runs spread less"
        return f"{MARGIN_SDS} x noise sd"

    def gain(self, metric, best):
        """How much metric is better than best (positive: better), whatever the goal."""
        return best - metric if self.goal == "min" else metric - best

    def beats(self, metric, best):
        """Whether metric beats best by more than the margin (strictly better with margin 0)."""
        return self.gain(metric, best) > self.margin

    def near_miss(self, metric, base):
        """A discard within the margin of the best it was judged against: an idea worth combining with another."""
        return self.margin > 0 and abs(metric - base) <= self.margin

    def words(self, metric="the metric"):
        """The rule in one paragraph, as the system prompt, `agent.py try` and report.py state it."""
        if self.margin_flag is not None:
            margin = f"a margin of {self.margin_flag:g} (--margin)"
        elif self.noise_aware:
            margin = f"a noise margin ({MARGIN_SDS} x the sd of the baseline's runs with different seeds)"
        else:
            margin = None
        better = f"beats the best {metric} by more than {margin}" if margin else f"beats the best {metric}"
        if self.confirm == 0:
            return (f"An edit is kept if its single run {better}; otherwise it is reverted. There is no confirmation "
                    "run: the first run decides.")
        runs = "a second run with another seed" if self.confirm == 1 else f"{self.confirm} more runs with other seeds"
        return (f"Results carry noise (the seed of init and data order changes from run to run): an edit is kept "
                f"only if its run {better}, confirmed by {runs} (the mean of all its runs must still beat it); "
                f"otherwise it is reverted. A first run whose tokens/s is more than {THROUGHPUT_SHARE:.0%} off the "
                "best's is run again before it is judged, and both runs count. An edit whose runs with other seeds "
                "repeat one result ignores AUTORESEARCH_SEED and is not kept.")


def rule_of(goal, confirm, margin, baseline=None, runs=1):
    """The Rule of a tag judged with --confirm `confirm` and --margin `margin` whose baseline's "experiment" event is
    `baseline` (its noise_sd, runs and sd_floor); None: not measured yet, `runs` baseline runs will measure it.
    agent.py and report.py build a tag's rule here."""
    if baseline is None:
        return Rule(goal, confirm, margin, None, runs)
    return Rule(goal, confirm, margin, baseline.get("noise_sd"), len(baseline.get("runs") or [0]),
                baseline.get("sd_floor") or 0.0, baseline.get("floor_source") or "")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What judge() decided. status: keep | discard | crash; runs: the metrics of every run that counted, first run
    first; metric: their mean (None: a crash); reason: why it crashed when its first run had a metric (a repeat or
    a confirmation crashed; or why a discard that beat the margin was not kept), else ""; failed: that run's Outcome
    (its log tail and kind), else None."""
    status: str
    runs: tuple = ()
    metric: float | None = None
    reason: str = ""
    failed: object = None
    repeated: bool = False      # runs[1] is runs[0] again with the same seed (its tokens/s was off), not a new seed

    def runs_words(self, metric):
        """What its runs were, for `try`'s runs: line and the row: "seeds differ" or the throughput re-run."""
        if not self.repeated:
            return f"seeds differ; {metric} is their mean"
        rest = "; the others: other seeds" if len(self.runs) > 2 else ""
        return f"run 2 re-ran run 1 with the same seed, its tokens/s was off{rest}; {metric} is their mean"


def sd_floor(metric, runs, eval_summary, declared=None):
    """The least noise sd a verdict assumes, and its source in words: baseline runs that agree exactly (a quantised
    score, or a train.py that ignores its seed) would otherwise make the margin 0, and float rounding a "gain".
    A score over N problems (the evaluator's summary has num_problems: pass@1) gets at least its binomial standard
    error sqrt(p (1 - p) / N), p the baseline's mean kept 1/N away from 0 and 1; otherwise the target's
    METRIC_SD_FLOOR (prepare.py), if it declares one. runs: the baseline's metrics. Returns (sd, words); (0.0, "")
    when neither applies."""
    try:
        n = int(eval_summary.get("num_problems", 0))
    except (TypeError, ValueError):
        n = 0
    if n > 1 and runs:
        p = min(max(statistics.fmean(runs), 1 / n), 1 - 1 / n)
        return math.sqrt(p * (1 - p) / n), f"the binomial standard error of {metric} over {n} problems"
    if isinstance(declared, (int, float)) and math.isfinite(declared) and declared > 0:
        return float(declared), f"METRIC_SD_FLOOR {declared:g} of prepare.py"
    return 0.0, ""


def tokens_per_sec(outcome):
    """The training throughput train.py's summary states (`tokens_per_sec:`), or None."""
    try:
        return float(outcome.summary["tokens_per_sec"])
    except (KeyError, ValueError):
        return None


def judge(first, run_again, rule, best_metric, best_tps=None):
    """The verdict on a candidate whose first run is `first` (a runner Outcome), against the best it was built on
    (best_metric, and its tokens/s best_tps).

    - no metric: crash.
    - With confirmation (rule.confirm > 0), a first run whose tokens/s is more than THROUGHPUT_SHARE away from the
      best's is run again first (a busy or throttled device, or a model of another speed), and both runs count:
      train.py prints its own tokens/s, so a repeat it asks for must never replace an unlucky first run.
    - discard when the mean does not beat the best by the margin; otherwise rule.confirm more runs with other seeds,
      kept only if the mean of all its runs still beats it. A repeat or confirmation that crashes makes a crash.
    - discard when its confirmations repeat its first run (within SAME_DRAW_SDS noise sd while the baseline's seeds
      spread): train.py ignores its seed, so a lucky draw would pass for a confirmed one.

    run_again(run, again) -> Outcome: run the candidate once more; run is the confirmation's index (1..confirm), or 0
    with again=True for the throughput repeat. Returns a Verdict."""
    if first.metric is None:
        return Verdict("crash")
    runs = [first.metric]
    tps = tokens_per_sec(first)
    if rule.confirm and tps and best_tps and abs(tps / best_tps - 1) > THROUGHPUT_SHARE:
        repeat = run_again(0, True)
        if repeat.metric is None:
            return Verdict("crash", (), None, f"its repeat crashed: {repeat.reason}", repeat)
        runs.append(repeat.metric)
    repeated = len(runs) > 1
    if not rule.beats(statistics.fmean(runs), best_metric):
        return Verdict("discard", tuple(runs), statistics.fmean(runs), repeated=repeated)
    for run in range(1, rule.confirm + 1):
        confirmation = run_again(run, False)
        if confirmation.metric is None:
            return Verdict("crash", tuple(runs), None, f"confirmation run {run + 1} crashed: {confirmation.reason}",
                           confirmation, repeated)
        runs.append(confirmation.metric)
    mean = statistics.fmean(runs)
    confirmations = runs[len(runs) - rule.confirm:]
    if rule.noise_sd and all(abs(m - first.metric) <= SAME_DRAW_SDS * rule.noise_sd for m in confirmations):
        return Verdict("discard", tuple(runs), mean, "its runs with other seeds repeat one result: train.py ignores "
                       "AUTORESEARCH_SEED, so no run can confirm another (use the seed)", repeated=repeated)
    return Verdict("keep" if rule.beats(mean, best_metric) else "discard", tuple(runs), mean, repeated=repeated)


def throughput_off(tps, best_tps):
    """The reason logged with a throughput repeat."""
    return (f"tokens/s {tps:.0f} differs from the best's {best_tps:.0f} by more than {THROUGHPUT_SHARE:.0%}: run "
            "again before it is judged")
