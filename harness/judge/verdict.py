"""
HARNESS: the verdict rule, the one place it exists. Keep, discard or crash for a candidate's measured runs: a Rule
(the goal, the margin, the number of confirmation runs, which verdict rule) and the verdict rules registered in RULES
by name (--verdict): Margin (judge(): the mean against the margin) and Paired (judge_paired(): the sequential paired
test). A rule asks for further runs and the best's (Best) through callables and never changes an Outcome; it states
itself in words for the LLM's system prompt, the `try` verdict block and report.py, so none of them can say it
otherwise, and says which of its settings the tag records. Pure: no git, no files, no processes.
"""

import dataclasses
import math
import statistics
from typing import Callable

from harness.judge import stats
from harness.run import conditions
from harness.errors import SetupError

MARGIN_SDS = 2              # the margin rule's default margin: this many noise sds (the baseline's runs' spread)
DEFAULT_CONFIRM = 1         # the margin rule: confirmation runs of a likely win, unless --confirm says otherwise
PAIRED_CONFIRM = 3          # the paired rule: up to this many runs after the first (a cap of 4), unless --confirm
FALSE_KEEP = 0.02           # the paired rule's false-keep rate: at most 1 kept no-op per 50 (--false-keep-rate)
# Runs of one candidate with other seeds that agree within this share of the noise sd repeat one draw: train.py
# ignores AUTORESEARCH_SEED, so no run confirms another. Two honest runs (difference ~ N(0, 2 sd^2)) land this close
# 0.56 % of the time; a seed-ignoring run on a GPU differs only by kernel nondeterminism, far less than 1 % of an sd.
SAME_DRAW_SDS = 0.01
STILL_SHARE = 0.1           # ... or that spread less than this share of the best's runs at the same seeds
# A further run the environment failed (runner.Kind.measured false: over the wall-time allowance on a busy machine, a
# lost Ray worker or node) runs this many more times at its seed: the same seed draws the same run, so a retry is no
# fresh draw for a train.py that stalls when its run goes badly, only another chance for the machine. One: a second
# failure in a row says the machine (or the train.py) cannot give this run now, and a third would cost another budget.
ENV_RETRIES = 1


@dataclasses.dataclass(frozen=True)
class Rule:
    """The tag's verdict rule. goal: "min" or "max"; confirm: further runs a likely win gets (0: the first run
    decides, karpathy's strict ratchet); margin_flag: --margin in metric units (None: MARGIN_SDS x noise_sd when
    confirming, else 0); noise_sd: the spread of the baseline's runs (None: not measured, one run); noise_runs: how
    many baseline runs measure it (before the baseline is measured: how many will); verdict: the name of its verdict
    rule in RULES ("paired": judged on the differences to the best's runs at the same seeds, confirm then the most
    runs after the first; "margin": the mean against the margin); false_keep: the paired rule's false-keep rate for a
    no-op."""
    goal: str
    confirm: int = 1
    margin_flag: float | None = None
    noise_sd: float | None = None
    noise_runs: int = 1
    sd_floor: float = 0.0       # the least noise sd assumed (see sd_floor()): identical baseline runs give sd 0
    floor_source: str = ""      # where sd_floor comes from, in words
    verdict: str = "margin"     # its verdict rule: a name in RULES
    false_keep: float = FALSE_KEEP

    @property
    def kind(self):
        """Its verdict rule (RULES[verdict]): what judges, states and records it; with --confirm 0 the strict ratchet
        (STRICT: the first run decides) whatever the name."""
        return RULES[self.verdict] if self.confirm > 0 else STRICT

    @property
    def paired(self):
        """Whether its verdict rule runs a candidate at the best's seeds (common random numbers)."""
        return RULES[self.verdict].pairs_seeds

    @property
    def is_paired(self):
        """Whether the candidate's runs pair with the best's: a pairing rule with confirmation runs (the strict
        ratchet never pairs)."""
        return self.paired and self.confirm > 0

    @property
    def name(self):
        """The rule's name, as the config event shows it: its verdict's, or "strict" (--confirm 0)."""
        return self.verdict if self.confirm > 0 else "strict"

    def judge(self, first, run_again, best):
        """The Verdict of its verdict rule on a candidate whose first run is `first` (a runner Outcome); run_again(run)
        -> Outcome runs it again (run 1..confirm); best: the Best it was built on."""
        return self.kind.judge(self, first, run_again, best)

    def recorded(self):
        """The settings a tag records with its start and its baseline and reads back (recorded_of): confirm, --margin,
        the verdict rule's name and the registered rules' own settings (VerdictRule.own; None: not this rule's)."""
        return dict(confirm=self.confirm, margin=self.margin_flag, verdict=self.verdict) | \
            {key: None for key in own_flags()} | RULES[self.verdict].own(self)

    @property
    def sd(self):
        """The noise sd the margin is made of: the measured one, at least sd_floor (None: not measured)."""
        if self.noise_sd is None and self.noise_runs <= 1:
            return None
        return max(self.noise_sd or 0.0, self.sd_floor)

    @property
    def margin(self):
        """How much a candidate must beat the best by, in metric units (0.0: strictly better). The paired rule
        judges differences, not a margin: this is then what the prompt calls a near miss."""
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

    def band(self):
        """(width in metric units, legend words) of the band progress.png draws on the better side of the running
        best (its verdict rule's); (0.0, "") when the rule has no margin (strict)."""
        return self.kind.band(self) if self.margin else (0.0, "")

    def gain(self, metric, best):
        """How much metric is better than best (positive: better), whatever the goal."""
        return best - metric if self.goal == "min" else metric - best

    def beats(self, metric, best):
        """Whether metric beats best by more than the margin (strictly better with margin 0)."""
        return self.gain(metric, best) > self.margin

    def why(self, judged):
        """Why a keep or a discard with no reason of its own (judged: its Verdict) was decided so, for `try`'s
        reason: line (its verdict rule's words)."""
        return self.kind.why(self, judged)

    def near_miss(self, metric, base):
        """A discard within the margin of the best it was judged against: an idea worth combining with another."""
        return self.margin > 0 and abs(metric - base) <= self.margin

    def words(self, metric="the metric"):
        """The rule in one paragraph, as the system prompt, `agent.py try` and report.py state it (--confirm 0: the
        strict ratchet, whatever the verdict rule)."""
        return self.kind.words(self, metric)


def rule_of(goal, confirm, margin, baseline=None, runs=1, verdict="margin", **own):
    """The Rule of a tag judged with --confirm `confirm`, --margin `margin`, the verdict rule `verdict` and its own
    settings (Rule fields: the tag's from settings_of), whose baseline's "experiment" event is `baseline` (its noise_sd,
    runs and sd_floor; None: not measured yet, `runs` baseline runs will). agent.py and report.py build it here."""
    if baseline is None:
        return Rule(goal, confirm, margin, None, runs, verdict=verdict, **own)
    return Rule(goal, confirm, margin, baseline.get("noise_sd"), len(baseline.get("runs") or [0]),
                baseline.get("sd_floor") or 0.0, baseline.get("floor_source") or "", verdict, **own)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What judge() or judge_paired() decided. status: keep | discard | crash; runs: the metrics of every run that
    counted, first run first; metric: their mean (None: a crash); reason: why it crashed when its first run had a
    metric (a further run crashed), why it was not judged (a further run failed by the environment: failed_further),
    or why it was not kept although it looked better, else ""; failed: the further run's Outcome that ended it (its
    log tail and kind), else None; best: the best's metric at each run's seed (paired), or the best's re-measured
    metric it was judged against (one value), else (); remeasured: how many of those the harness measured anew (the
    conditions differed); t: the paired mean difference over its standard error (None: unpaired); retried: how many
    further runs ran again because the environment failed them (ENV_RETRIES each at most)."""
    status: str
    runs: tuple = ()
    metric: float | None = None
    reason: str = ""
    failed: object = None
    best: tuple = ()
    remeasured: int = 0
    t: float | None = None
    gain: float | None = None   # the paired mean difference (positive: better than the best at the same seeds)
    retried: int = 0

    def runs_words(self, metric):
        """What its runs were, for `try`'s runs: line and the row's note."""
        again = (f"; the best re-run for {self.remeasured} of them, the machine's speed had changed"
                 if self.remeasured else "")
        if self.gain is not None:
            t = f", t {self.t:.1f}" if self.t is not None else ""
            return (f"paired with the best's runs at the same seeds, mean gain {self.gain:+.6f}{t}{again}; {metric} "
                    "is the mean of its runs")
        if self.remeasured:
            return f"judged against the best re-run now ({self.best[0]:.6f}), the machine's speed had changed"
        return f"seeds differ; {metric} is their mean" if len(self.runs) > 1 else "one run: it decides"


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
    """The training throughput train.py's summary states (`tokens_per_sec:`), or None (information only)."""
    try:
        return float(outcome.summary["tokens_per_sec"])
    except (KeyError, ValueError):
        return None


def pooled_of(rule, verdicts):
    """(sum of squared deviations, degrees of freedom) of paired differences over earlier verdicts, each (runs, best)
    of the same metric: what stats.paired_sd pools (a verdict of one run adds nothing)."""
    squares, df = 0.0, 0
    for runs, best in verdicts:
        diffs = [rule.gain(m, b) for m, b in zip(runs or (), best or ())]
        if len(diffs) > 1:
            squares, df = squares + (len(diffs) - 1) * statistics.variance(diffs), df + len(diffs) - 1
    return squares, df


def seed_ignored(rule, runs, best=()):
    """Why runs of one candidate with different seeds are one draw (train.py ignores AUTORESEARCH_SEED, or swaps it
    for one of its own), or "": all its later runs within SAME_DRAW_SDS noise sd of its first while the baseline's
    seeds spread (for a score over N problems, where two honest runs often score the same: three runs); or, paired
    with the best's runs (best: the best's at the same seeds) from the 3rd run on, its runs'
    sd under STILL_SHARE of the best's while the best's spread at least half a noise sd (an honest candidate's runs
    move with the seed, as the best's do: an unpaired one's that still 1 % of the time, a paired one's never)."""
    quantised = rule.floor_source.startswith("the binomial")      # a score over N problems: equal scores happen
    if len(runs) > 1 + quantised and rule.noise_sd and \
            all(abs(m - runs[0]) <= SAME_DRAW_SDS * rule.noise_sd for m in runs[1:]):
        return ("its runs with other seeds repeat one result: train.py ignores AUTORESEARCH_SEED, so they are one "
                "draw, unpaired and unconfirmed (use the seed)")
    if len(runs) > 2 and len(best) == len(runs) and rule.noise_sd and statistics.stdev(best) >= rule.noise_sd / 2 \
            and statistics.stdev(runs) < STILL_SHARE * statistics.stdev(best):
        return ("its runs with other seeds barely move while the best's at the same seeds do: train.py does not use "
                "AUTORESEARCH_SEED as given (use the seed)")
    return ""


def no_metric(first):
    """The verdict on a first run with no metric: a discard when it was cancelled early (its curve was behind the
    best's: harness.judge.curves), else a crash."""
    return Verdict("discard") if getattr(first.kind, "value", None) == "cancelled" else Verdict("crash")


def further(run_again, run):
    """Further run `run` of a candidate (run_again(run)), run again at its seed up to ENV_RETRIES times while the
    environment fails it (an Outcome with no metric whose kind is not measured). Returns (the last Outcome, how many
    times it ran again)."""
    outcome, again = run_again(run), 0
    while outcome.metric is None and not outcome.kind.measured and again < ENV_RETRIES:
        outcome, again = run_again(run), again + 1
    return outcome, again


def failed_further(name, outcome, runs, **fields):
    """The verdict on a candidate whose further run `name` ("confirmation run 2", "run 3") ended with no metric after
    its runs `runs`: a crash when the run itself failed (its kind measured: a bug, a timeout, a rejection); when the
    environment failed it again at its retry, not judged: a discard of the runs so far, its reason "not judged: ..." and
    `failed` the environment's run, so that its kind (Result.kind) is the environment's and nothing counts it as
    measured (the tabu, the study, the same train.py proposed again: session.measured_as). fields: the paired rule's
    best, remeasured, retried."""
    if outcome.kind.measured:
        return Verdict("crash", tuple(runs), None, f"{name} crashed: {outcome.reason}", outcome, **fields)
    return Verdict("discard", tuple(runs), statistics.fmean(runs),
                   f"not judged: {name} failed {1 + ENV_RETRIES} times for the environment ({outcome.reason})",
                   outcome, **fields)


def judge(first, run_again, rule, best_metric):
    """The margin rule's verdict on a candidate whose first run is `first` (a runner Outcome), against best_metric
    (the mean of the best's runs, or the best re-run under the candidate's conditions: harness.record.experiment).

    - no metric: crash (a discard when it was cancelled early: no_metric).
    - discard when the first run does not beat the best by the margin; otherwise rule.confirm more runs with other
      seeds, kept only if the mean of all its runs still beats it. A confirmation that crashes makes a crash; one the
      environment fails runs again at its seed, and failed twice leaves the candidate not judged (failed_further).
    - discard when its confirmations repeat its first run (seed_ignored): a lucky draw would pass for a confirmed one.

    run_again(run) -> Outcome: run the candidate once more (run: the confirmation's index, 1..confirm). Returns a
    Verdict."""
    if first.metric is None:
        return no_metric(first)
    runs, retried = [first.metric], 0
    if not rule.beats(first.metric, best_metric):
        return Verdict("discard", tuple(runs), first.metric)
    for run in range(1, rule.confirm + 1):
        confirmation, again = further(run_again, run)
        retried += again
        if confirmation.metric is None:
            return failed_further(f"confirmation run {run + 1}", confirmation, runs, retried=retried)
        runs.append(confirmation.metric)
    mean = statistics.fmean(runs)
    if why := seed_ignored(rule, runs):
        return Verdict("discard", tuple(runs), mean, why, retried=retried)
    return Verdict("keep" if rule.beats(mean, best_metric) else "discard", tuple(runs), mean, retried=retried)


def judge_paired(first, run_again, rule, best_at, pooled=(0.0, 0)):
    """The paired rule's verdict on a candidate whose first run is `first` (a runner Outcome): run r of it uses the
    seed of the best's run r (common random numbers: the same init and data order, so most of the noise cancels in
    the difference), and Rule.step decides after each run on the differences (sequential, 1 + rule.confirm runs at
    most). A run that crashes makes a crash, one the environment fails twice at its seed leaves the candidate not
    judged (further, failed_further); runs that repeat one draw (seed_ignored) are discarded.

    run_again(run) -> Outcome: the candidate's run `run` (1..confirm). best_at(run, outcome) -> (metric | None,
    remeasured, reason): the best's metric at run's seed under the conditions of the candidate's `outcome` (its
    recorded run, or run anew when the conditions differ); None (why in reason) when the best could not be run:
    judged on the pairs so far. pooled: (sum of squared deviations, degrees of freedom) of this tag's earlier paired
    verdicts (pooled_of), which sharpen the paired sd. Returns a Verdict (t: the last t statistic)."""
    if first.metric is None:
        return no_metric(first)
    runs, best, remeasured, retried, outcome, decision, why = [], [], 0, 0, first, None, ""
    for run in range(1 + rule.confirm):
        if run:
            outcome, again = further(run_again, run)
            retried += again
            if outcome.metric is None:
                return failed_further(f"run {run + 1}", outcome, runs, best=tuple(best), remeasured=remeasured,
                                      retried=retried)
        value, fresh, why = best_at(run, outcome)
        if value is None:
            break
        runs.append(outcome.metric)
        best.append(value)
        remeasured += bool(fresh)
        decision = stats.step(rule, [rule.gain(m, b) for m, b in zip(runs, best)], pooled)
        if decision or seed_ignored(rule, runs, best):
            break
    if not runs:
        return Verdict("discard", (first.metric,), first.metric, why)
    diffs = [rule.gain(m, b) for m, b in zip(runs, best)]
    sd, _ = stats.paired_sd(rule, diffs, pooled)
    t = statistics.fmean(diffs) / (sd / math.sqrt(len(diffs))) if sd else None
    mean, paired = statistics.fmean(runs), dict(best=tuple(best), remeasured=remeasured, t=t,
                                                gain=statistics.fmean(diffs), retried=retried)
    if seed_why := seed_ignored(rule, runs, best):
        return Verdict("discard", tuple(runs), mean, seed_why, **paired)
    return Verdict(decision or "discard", tuple(runs), mean, "" if decision else why, **paired)


# ---------------------------------------------------------------------------
# The verdict rules, by name (--verdict): each judges, states itself and records its settings
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class Best:
    """What a verdict rule may ask of the best a candidate was built on. metric: the mean of its runs; at(run,
    outcome, then=None) -> (metric | None, remeasured, reason): its metric at run's seed under the conditions of the
    candidate's `outcome` (its recorded run, or run anew when the speed probes differ: harness.record.experiment; then:
    its probe when known); probe() -> its mean speed probe (None: not measured); pooled() -> (sum of squared deviations,
    degrees of freedom) of the tag's earlier paired verdicts (pooled_of)."""
    metric: float
    at: Callable
    probe: Callable = lambda: None
    pooled: Callable = lambda: (0.0, 0)


class VerdictRule:
    """The protocol of a verdict rule (a RULES entry). name: its --verdict value, recorded by the tag; pairs_seeds:
    whether a candidate's runs use the best's seeds (the harness then runs the best at a seed it lacks). judge(rule,
    first, run_again, best) -> Verdict; words(rule, metric): the rule in one paragraph; band(rule): (width, legend) of
    progress.png's band; why(rule, judged): a verdict's reason for `try` (the default reads the Verdict: a paired gain
    and t, or the margin); own_flags: {Rule field and Settings attribute: its flag} of the settings the tag records
    beside COMMON, own(rule) their values."""
    name = ""
    pairs_seeds = False
    own_flags = {}

    def own(self, rule):
        return {key: getattr(rule, key) for key in self.own_flags}

    def judge(self, rule, first, run_again, best):
        raise NotImplementedError

    def words(self, rule, metric):
        raise NotImplementedError

    def band(self, rule):
        return rule.margin, f"margin {rule.margin:.4g} ({rule.source}): a smaller gain is discarded"

    def why(self, rule, judged):
        n, gain = len(judged.runs), judged.gain
        if gain is None:
            margin = f"by more than the margin {rule.margin:.6f}" if rule.margin else ""
            return (f"kept: its {'mean' if n > 1 else 'run'} beat the best {margin}".rstrip() if judged.status == "keep"
                    else f"not kept: its {'mean' if n > 1 else 'run'} did not beat the best {margin}".rstrip())
        t = f", t {judged.t:.1f}" if judged.t is not None else ""
        runs = f"{n} run{'s' if n > 1 else ''}"
        if judged.status == "keep":
            return (f"kept: mean gain {gain:+.6f} over the best's runs at the same seeds ({runs}{t}), above the "
                    f"one-sided t-test's bar at a false-keep rate of {rule.false_keep:g}")
        if gain <= 0:
            return f"not kept: not better than the best's runs at the same seeds (mean gain {gain:+.6f}, {runs})"
        if n == 1:
            return (f"not kept: its first run beat the best's at the same seed by {gain:+.6f}, within "
                    f"{stats.FIRST_LOOK:g} paired sds: too close to be worth more runs")
        return (f"not kept: mean gain {gain:+.6f} over the best's runs at the same seeds ({runs}{t}) is not above "
                f"the one-sided t-test's bar at a false-keep rate of {rule.false_keep:g}: it may be noise")


def beats_words(rule, metric):
    """"beats the best <metric>" with the margin it must beat it by, in words."""
    if rule.margin_flag is not None:
        margin = f"a margin of {rule.margin_flag:g} (--margin)"
    elif rule.noise_aware:
        margin = f"a noise margin ({MARGIN_SDS} x the sd of the baseline's runs with different seeds)"
    else:
        margin = None
    return f"beats the best {metric} by more than {margin}" if margin else f"beats the best {metric}"


class Margin(VerdictRule):
    """The margin rule (judge()): the first run must beat the best by the margin, confirm more runs with other seeds
    keep it only if their mean still does; the best is re-run at the candidate's seed first when the speed probes
    differ. With --confirm 0 it is the strict ratchet (STRICT)."""
    name = "margin"

    def judge(self, rule, first, run_again, best):
        if first.metric is not None and rule.confirm and conditions.differ(first.probe_s, then := best.probe()):
            value, _, why = best.at(0, first, then)
            if value is not None:
                return dataclasses.replace(judge(first, run_again, rule, value), best=(value,), remeasured=1)
        return judge(first, run_again, rule, best.metric)

    def words(self, rule, metric):
        better = beats_words(rule, metric)
        if rule.confirm == 0:
            return (f"An edit is kept if its single run {better}; otherwise it is reverted. There is no confirmation "
                    "run: the first run decides.")
        runs = "a second run with another seed" if rule.confirm == 1 else f"{rule.confirm} more runs with other seeds"
        return (f"Results carry noise (the seed of init and data order changes from run to run): an edit is kept "
                f"only if its run {better}, confirmed by {runs} (the mean of all its runs must still beat it); "
                f"otherwise it is reverted. The best is run again first when the harness's speed probe says the "
                f"machine's speed changed by more than {conditions.SHARE:.0%} since it was measured, and the edit "
                "is judged against that run. An edit whose runs with other seeds repeat one result ignores "
                "AUTORESEARCH_SEED and is not kept.")


class Paired(VerdictRule):
    """The paired sequential rule (judge_paired()): each run at the seed of a run of the best, judged on the
    differences by a one-sided t-test at the false-keep rate, after 2 to 1 + confirm runs."""
    name, pairs_seeds = "paired", True
    own_flags = {"false_keep": "--false-keep-rate"}

    def judge(self, rule, first, run_again, best):
        return judge_paired(first, run_again, rule, best.at, best.pooled())

    def words(self, rule, metric):
        return (f"Results carry noise (the seed of init and data order changes from run to run), so each run of "
                f"an edit uses the seed of a run of the best and the edit is judged on the differences: kept "
                f"when their mean beats 0 by more than a one-sided t-test at a false-keep rate of "
                f"{rule.false_keep:.0%} allows (after 2 to {1 + rule.confirm} runs; it stops after the first "
                f"run when that run is not clearly better than the best's at the same seed, and whenever the "
                f"mean difference is not better); otherwise it is reverted. The best is run again at a seed when "
                f"the harness's speed probe says the machine's speed changed by more than "
                f"{conditions.SHARE:.0%} since. An edit whose runs with other seeds repeat one result ignores "
                f"AUTORESEARCH_SEED and is not kept.")

    def band(self, rule):
        return rule.margin, (f"near miss: a gain under {rule.margin:.4g} ({MARGIN_SDS} noise sd) is rarely kept; "
                             "the paired test over 2-4 runs decides")


STRICT = Margin()                                   # --confirm 0, whatever the verdict rule: the first run decides
RULES = {r.name: r for r in (Paired(), Margin())}   # --verdict NAME -> its rule
DEFAULT = "paired"                                  # a new tag's, unless --verdict or --margin says otherwise


COMMON = {"confirm": "--confirm", "margin": "--margin", "verdict": "--verdict"}   # every tag's rule settings: flags
LEGACY = "margin"           # the verdict rule of tags recorded before the paired rule (their events name none)


def own_flags():
    """{setting: flag} of every registered verdict rule's own settings (VerdictRule.own_flags)."""
    return {key: flag for rule in RULES.values() for key, flag in rule.own_flags.items()}


def recorded_of(event):
    """A tag's rule as recorded (Rule.recorded()), read back from its event (the baseline, an older tag's first
    start): COMMON's settings, every registered rule's own (None: not recorded), the rule's name (else LEGACY)."""
    return {key: event.get(key) for key in (*COMMON, *own_flags())} | {"verdict": event.get("verdict") or LEGACY}


def settings_of(recorded):
    """rule_of's keyword arguments (confirm, margin, verdict, the rule's own recorded settings) from recorded_of's
    dict. Raises SetupError when the tag's rule is not registered here."""
    name = recorded["verdict"]
    if name not in RULES:
        raise SetupError(f"the tag was judged by the verdict rule {name!r}, which this version does not have "
                         f"({', '.join(RULES)}): use the version that made it, or start a new --tag")
    return dict(confirm=recorded["confirm"], margin=recorded.get("margin"), verdict=name) | {
        key: recorded[key] for key in RULES[name].own_flags if recorded.get(key) is not None}
