"""
Research yield: how much real improvement each search and verdict finds per device-hour, on the lab profile.

    uv run bench/bench_yield.py                        # the replay: every arm, 16 campaigns of 2 device-hours each
    uv run bench/bench_yield.py --campaigns 8 --hours 1 --arms tpe,random,plain
    uv run bench/bench_yield.py --surrogate            # only the surrogate's fit and its held-out check
    uv run bench/bench_yield.py --remeasure /tmp/live/tpe1 --tag live-tpe1    # a live campaign's best, fresh seeds

The replay runs simulated campaigns against bench/lab_table.jsonl (the lab profile's recorded runs) with the
harness's own code for everything that decides: the Optuna samplers of --proposer tpe/cmaes/random
(search.sampler_for, the points written into train.py by searchspace.write_point), the grid's and karpathy's perturbations
(perturb.grid), the paired and the strict verdicts (verdict.judge_paired, verdict.judge with a verdict.Rule) and early
cancel (curves.decide, curves.exempt). Only the runs are simulated:

- a point and seed the table recorded: that run, exactly (its val_bpb, learning curve and wall time);
- anything else: the surrogate's mean at the point plus the seed noise, a normal draw with the table's pooled
  within-point seed sd (the table shows no seed effect shared between points: see docs/benchmarks.md, so draws at the
  same seed are independent). The surrogate is additive over the 7 constants, piecewise linear between each one's
  three recorded levels (on a log scale for rates and the batch), fitted to the table's point means by weighted least
  squares; `--surrogate` prints how well it predicts the recorded multi-constant points it was not fitted to. It
  refuses a point outside the table's range (OutsideTable) instead of extrapolating: the samplers' space is the
  table's range, and a grid or perturbation step beyond it is refused before it runs and counted.
  A drawn run's learning curve is a recorded base curve shifted to its val_bpb (DLOSS_PER_BPB).

With --oom-above N the world also has an infeasible region, as a smaller device's memory makes one: a point whose
DEPTH x TOTAL_BATCH_SIZE exceeds N runs out of memory at start-up (no metric, Kind.CRASH; its cost: the table's mean
start-up, wall minus training seconds, plus the harness's overhead). The samplers are told of it as the harness
tells them (search.failure_of, search.finish: an infeasible trial); the -blind arms as before, a failed trial.

A campaign's score is the true gain of its final best: the surrogate's mean at the baseline's point minus at the
best's (never the value it was kept with), after a fixed device time, each run costing its recorded wall time plus
the harness's own overhead per run (AGENT_OVERHEAD_S). Every arm plays the same campaign seeds (the same baseline
seeds, the same noise draws for the same point and seed), so arms are compared pairwise, campaign by campaign.
"""

import argparse
import dataclasses
import hashlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import lab_table  # noqa: E402
from lab_table import ROOT, SPACE, TableError, key  # noqa: E402

from harness.judge import curves, stats, verdict  # noqa: E402
from harness.propose import edits, memory, perturb, search, searchspace  # noqa: E402
from harness.run.runner import Kind, Outcome  # noqa: E402

PROFILE = "lab"
AGENT_OVERHEAD_S = 25.0     # a run through agent.py beyond plain train.py's wall: 91.9-98.3 s (mean 95.5) from its
#                             "run" event to its "run_end" in a live lab campaign, against 70.6 s (docs/benchmarks.md,
#                             the lab profile: the sandbox's start-up, probes, export, the separate evaluation)
DLOSS_PER_BPB = 1.5         # the printed train loss's change per val_bpb change at a run's end, fitted on the table
#                             (slope 1.498, correlation 0.90 over its rows)
CAMPAIGNS = 16
HOURS = 2.0
BASELINE_RUNS = 3           # agent.py's default --baseline-runs
EXHAUSTED = search.EXHAUSTED
Z95 = 1.96


class OutsideTable(ValueError):
    """A point outside the range the table recorded: the surrogate does not extrapolate."""


def replay_space():
    """{name: searchspace.Param} over the table's range of each constant (lab_table.SPACE): rates log-uniform, the batch a
    power of two, the depth an int, the decay and warmdown shares linear; what the samplers search in the replay."""
    space = {}
    for name, values in SPACE.items():
        lo, hi = min(values), max(values)
        if "BATCH" in name:
            space[name] = searchspace.Param(name, "pow2", lo.bit_length() - 1, hi.bit_length() - 1)
        elif isinstance(values[0], int):
            space[name] = searchspace.Param(name, "int", lo, hi)
        else:
            space[name] = searchspace.Param(name, "float", lo, hi, log=name.endswith("_LR"))
    return space


SEARCH_SPACE = replay_space()


def space_section():
    """program.md's `## Search space` (docs/search.md) of the replay's space: a live campaign searches what the
    replay's campaigns search."""
    return "\n".join([searchspace.SPACE_HEADING, *(f"- {p.words()}" for p in SEARCH_SPACE.values())]) + "\n"


def scaled(name, value):
    """A constant's coordinate in the surrogate: log2 for rates and the batch, else the value."""
    return math.log2(value) if name.endswith("_LR") or "BATCH" in name else float(value)


class Surrogate:
    """val_bpb's mean at a point: intercept + per constant a hinge below and above its base level (two slopes between
    its three recorded levels, on the scaled() axis), fitted to the point means (weighted by their runs) of `rows`."""

    def __init__(self, rows):
        import numpy as np
        groups = {}
        for r in rows:
            if r["val_bpb"] is not None:
                groups.setdefault(key(r["point"]), (r["point"], []))[1].append(r["val_bpb"])
        if () not in groups:
            raise TableError("the table has no run of the base point at its budget: collect --design base")
        self.points = list(groups.values())
        x = np.array([self.features(p) for p, _ in self.points])
        y = np.array([statistics.fmean(v) for _, v in self.points])
        w = np.sqrt(np.array([len(v) for _, v in self.points], dtype=float))
        self.coef = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)[0]

    @staticmethod
    def features(point):
        row = [1.0]
        for name, values in SPACE.items():
            v = point[name]
            lo, base, hi = (scaled(name, u) for u in (min(values), values[0], max(values)))
            x = scaled(name, v)
            if not lo - 1e-9 <= x <= hi + 1e-9:
                raise OutsideTable(f"{name} = {v} is outside the table's range {min(values)}..{max(values)}: the "
                                   "surrogate does not extrapolate (collect runs there first)")
            row += [max(0.0, base - x) / (base - lo), max(0.0, x - base) / (hi - base)]
        return row

    def predict(self, point):
        """The mean val_bpb at point ({name: value} for every constant of SPACE). Raises OutsideTable."""
        return float(sum(c * f for c, f in zip(self.coef, self.features(point))))


def expected():
    """What a table must have been recorded with to be replayed here (lab_table.COMPARED): this checkout's prepare.py,
    the lab profile on the shipped sample at the lab's own budget. Read from the files; no data needed."""
    sys.path.insert(0, str(ROOT))
    import prepare
    return dict(prepare_sha=lab_table.sha(ROOT / "prepare.py"), profile=PROFILE, dataset="sample",
                budget=float(prepare.PROFILE_BUDGETS[PROFILE]))


def full_rows(rows, budget):
    return [r for r in rows if r["budget"] == budget and r["val_bpb"] is not None]


def seed_sd(rows):
    """The pooled within-point sd of val_bpb over the points with 2+ runs: sqrt(sum (n-1) var / sum (n-1))."""
    groups = {}
    for r in rows:
        groups.setdefault(key(r["point"]), []).append(r["val_bpb"])
    ss = sum((len(v) - 1) * statistics.variance(v) for v in groups.values() if len(v) > 1)
    df = sum(len(v) - 1 for v in groups.values() if len(v) > 1)
    return math.sqrt(ss / df), df


def held_out(rows):
    """[(point key, runs, observed mean, predicted)] for each recorded point moving 2+ constants, the surrogate
    fitted without that point's runs."""
    found = []
    for k in {key(r["point"]) for r in rows if len(key(r["point"])) >= 2}:
        mine = [r for r in rows if key(r["point"]) == k]
        fit = Surrogate([r for r in rows if key(r["point"]) != k])
        found.append((k, len(mine), statistics.fmean(r["val_bpb"] for r in mine), fit.predict(mine[0]["point"])))
    return sorted(found)


class World:
    """The runs a campaign gets: recorded ones where the table has the point and seed, else drawn (module text).
    Draws are a function of (campaign, point, seed, how many times asked), so arms share them."""

    def __init__(self, rows, budget, campaign, oom_above=None):
        self.budget, self.campaign, self.oom_above = budget, campaign, oom_above
        self.startup = statistics.fmean(r["wall_s"] - r["train_s"] for r in rows if r["train_s"] is not None)
        self.rows = {(key(r["point"]), r["seed"]): r for r in rows}
        self.surrogate = Surrogate(rows)
        self.sd, _ = seed_sd(rows)
        self.templates = [r for r in rows if key(r["point"]) == () and r["curve"]]
        self.wall = statistics.fmean(r["wall_s"] for r in rows)
        self.asked = {}

    def truth(self, point):
        return self.surrogate.predict(point)

    def run(self, point, seed):
        """(val_bpb, curves.Curve, wall seconds) of one run of point at seed through agent.py; (None, None, its
        start-up) for a point that runs out of memory (oom_above)."""
        if self.oom_above is not None and point["DEPTH"] * point["TOTAL_BATCH_SIZE"] > self.oom_above:
            return None, None, self.startup + AGENT_OVERHEAD_S
        k = key(point)
        row = self.rows.get((k, seed))
        if row is not None:
            curve = curves.Curve(curves.Point(p, loss) for p, loss in row["curve"])
            return row["val_bpb"], curve, row["wall_s"] + AGENT_OVERHEAD_S
        mean = self.truth(point)
        n = self.asked[k, seed] = self.asked.get((k, seed), 0) + 1
        digest = hashlib.sha256(f"{self.campaign}:{sorted(point.items())}:{seed}:{n}".encode()).digest()
        draw = random.Random(digest)
        value = mean + self.sd * draw.gauss(0.0, 1.0)
        template = draw.choice(self.templates)
        shift = (value - template["val_bpb"]) * DLOSS_PER_BPB
        curve = curves.Curve(curves.Point(p, loss + shift) for p, loss in template["curve"])
        return value, curve, self.wall + AGENT_OVERHEAD_S


@dataclasses.dataclass(frozen=True)
class Arm:
    """One way to search: proposer (plain: karpathy's ratchet, one run, strict keep, a random single step of one
    constant; grid; or an Optuna sampler: random, tpe, cmaes), the paired rule or the strict one, early cancel, and
    the settings bench_yield decides the defaults of."""
    name: str
    proposer: str
    paired: bool = True
    cancel: bool = True
    false_keep: float = verdict.FALSE_KEEP
    warmup: float = curves.WARMUP
    startup: int = search.TPE_STARTUP
    names: tuple = tuple(SPACE)         # the constants searched (the others stay at train.py's values)
    dedupe: bool = True                 # refuse a point already measured (the harness does; karpathy's loop does not)
    feasible: bool = True               # a failure of the point is told as an infeasible trial (the harness's
    #                                     search.failure_of); False: a failed trial, which the samplers ignore


NO_SCHEDULE = tuple(n for n in SPACE if not curves.SCHEDULE.search(n))     # a space early cancel can act on
ARMS = {a.name: a for a in (
    Arm("tpe", "tpe"),                                   # the no-key default loop
    Arm("tpe-nocancel", "tpe", cancel=False),
    Arm("random", "random"),
    Arm("random-nocancel", "random", cancel=False),
    Arm("grid", "grid"),
    Arm("cmaes", "cmaes"),
    Arm("tpe-blind", "tpe", feasible=False),
    Arm("grid-nocancel", "grid", cancel=False),
    Arm("grid-warm50", "grid", warmup=0.5),
    Arm("plain", "plain", paired=False, cancel=False, dedupe=False),
    Arm("tpe6", "tpe", names=NO_SCHEDULE),
    Arm("tpe6-nocancel", "tpe", cancel=False, names=NO_SCHEDULE),
    Arm("tpe6-warm50", "tpe", warmup=0.5, names=NO_SCHEDULE),
    Arm("tpe-fk10", "tpe", false_keep=0.10),
    Arm("tpe-warm50", "tpe", warmup=0.5),
    Arm("tpe-start10", "tpe", startup=10),
)}
DEFAULT_ARMS = ("tpe", "random", "cmaes", "grid", "grid-nocancel", "plain", "tpe6", "tpe6-nocancel")


def arm_sampler(arm, seed, infeasible=False):
    """search.sampler_for(arm.proposer, seed, infeasible) with TPE's start-up at arm.startup."""
    old, search.TPE_STARTUP = search.TPE_STARTUP, arm.startup
    try:
        return search.sampler_for(arm.proposer, seed, infeasible)
    finally:
        search.TPE_STARTUP = old


_SOURCES = {}


def source_of(point):
    """train.py with point's values written as the harness writes a sampler's point (searchspace.write_point)."""
    k = tuple(sorted(point.items()))
    if k not in _SOURCES:
        base = (ROOT / "train.py").read_text()
        answer, _ = searchspace.write_point(base, PROFILE, SEARCH_SPACE,
                                       {n: SEARCH_SPACE[n].internal(v) for n, v in point.items()}, "replay")
        _SOURCES[k] = base if "no change" in answer.splitlines()[0] else edits.apply_answer(answer, base)[1]
    return _SOURCES[k]


def written(point):
    """The point as train.py then holds it (floats at searchspace.LITERAL_DIGITS significant digits)."""
    consts = searchspace.constants(source_of(point), PROFILE)
    return {n: consts[n].value for n in SPACE}


def step_of(point, n, attempt, names=tuple(SPACE)):
    """The grid's n-th single step (perturb.grid) from point, as a point; raises OutsideTable beyond the table."""
    source = source_of(point)
    answer = perturb.grid(source, n, PROFILE, attempt, names=set(names))
    new = edits.apply_answer(answer, source)[1]
    consts = searchspace.constants(new, PROFILE)
    moved = {name: consts[name].value for name in SPACE}
    for name, v in moved.items():
        if not min(SPACE[name]) <= v <= max(SPACE[name]):
            raise OutsideTable(f"{name} = {v}")
    return moved


def outcome(value, kind=Kind.OK, cancel=None):
    return Outcome("replay", value, 0.0, 0.0, kind=kind, cancel=cancel)


def campaign(arm, world, c, hours=HOURS, max_experiments=None):
    """One simulated campaign of arm against world, campaign seed c, until `hours` device-hours are spent (or
    max_experiments after the baseline). Returns a dict: trace [(device-hours, true val_bpb of the best, n)], keeps,
    false keeps (a keep whose true mean is not below the best's it replaced), experiments, runs, cancelled, refused
    (steps outside the table), base and best points."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rng = random.Random(f"campaign:{c}")
    seeds = rng.sample(range(1, 9), 1 + verdict.PAIRED_CONFIRM)        # the table's base seeds, shuffled
    budget_s = hours * 3600
    spent = [0.0]
    stats = dict(keeps=0, false_keeps=0, experiments=0, runs=0, cancelled=0, refused=0, crashed=0)

    def run(point, seed):
        value, curve, wall = world.run(point, seed)
        spent[0] += wall
        stats["runs"] += 1
        return value, curve, wall

    base = {name: values[0] for name, values in SPACE.items()}
    k_base = BASELINE_RUNS if arm.paired else 1
    best = dict(point=base, runs={}, curves={})
    for s in seeds[:k_base]:
        value, curve, _ = run(base, s)
        best["runs"][s], best["curves"][s] = value, curve
    baseline_curves = list(best["curves"].values())
    values = list(best["runs"].values())
    if arm.paired:
        rule = verdict.Rule("min", verdict.PAIRED_CONFIRM, None, statistics.stdev(values), k_base, verdict="paired",
                            false_keep=arm.false_keep)
    else:
        rule = verdict.Rule("min", 0)
    best["metric"] = statistics.fmean(values)
    study = None
    if arm.proposer in search.SAMPLERS:
        study = optuna.create_study(direction="minimize", sampler=arm_sampler(arm, c))
        dist = {n: SEARCH_SPACE[n].distribution() for n in arm.names}
        study.add_trial(optuna.trial.create_trial(
            params={n: SEARCH_SPACE[n].internal(base[n]) for n in arm.names}, distributions=dist,
            value=best["metric"]))
    measured = {key(base): best["metric"]}
    pooled = []
    trace = [(spent[0] / 3600, world.truth(base), 0)]
    n = 0
    while spent[0] < budget_s and (max_experiments is None or n < max_experiments):
        n += 1
        point, trial = None, None
        for attempt in range(EXHAUSTED):
            try:
                if study is not None:
                    trial = study.ask(dist)
                    point = written({**base, **{name: SEARCH_SPACE[name].external(x)
                                                for name, x in trial.params.items()}})
                elif arm.proposer == "grid":
                    point = step_of(best["point"], n, attempt, arm.names)
                else:
                    point = step_of(best["point"], rng.randrange(1, 10**6), 0, arm.names)
            except OutsideTable:
                stats["refused"] += 1
                continue
            if arm.dedupe and key(point) in measured:   # the harness refuses a point already measured before it runs
                if trial is not None:
                    if measured[key(point)] == "crash":    # the harness's ask(): a failed trial, drawn again
                        study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    elif measured[key(point)] is None:
                        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    else:
                        study.tell(trial, measured[key(point)])
                point = None
                continue
            break
        if point is None:
            break
        stats["experiments"] += 1
        seed0 = seeds[0] if arm.paired else 100 + n         # the strict rule: a fresh seed per run
        value, curve, wall = run(point, seed0)
        first = outcome(value) if value is not None else outcome(None, Kind.CRASH)
        if value is not None and arm.cancel and not curves.exempt(source_of(point), source_of(best["point"])):
            cut = curves.decide(curve, list(best["curves"].values()), baseline_curves, warmup=arm.warmup,
                                paired=best["curves"].get(seed0))
            if cut is not None:
                spent[0] -= (1 - cut.at) * world.budget          # stopped there: the rest of the budget not spent
                first = outcome(None, Kind.CANCELLED, cut)
                stats["cancelled"] += 1
        runs_at = {seed0: (value, curve)}

        def run_again(r):
            v, cv, _ = run(point, seeds[r])
            runs_at[seeds[r]] = (v, cv)
            return outcome(v)

        def best_at(r, _outcome):
            s = seeds[r]
            if s not in best["runs"]:
                best["runs"][s], best["curves"][s], _ = run(best["point"], s)
            return best["runs"][s], False, ""

        if arm.paired:
            v = verdict.judge_paired(first, run_again, rule, best_at, verdict.pooled_of(rule, pooled))
            if v.best:
                pooled.append((v.runs, v.best))
        else:
            v = verdict.judge(first, run_again, rule, best["metric"])
        event = dict(n=n, status=v.status, metric=v.metric, kind=first.kind.value,
                     cancelled=first.kind is Kind.CANCELLED or None)
        failure = search.failure_of(event, memory.Change(families=tuple(arm.names))) if arm.feasible else None
        if trial is not None:
            wide = search.holds_infeasible(study.get_trials(deepcopy=False))
            search.finish(study, trial, *search.outcome_of(event, failure), failure)
            if arm.proposer == "tpe" and not wide and search.holds_infeasible([trial]):
                # the harness's ask(): TPE draws wider from the first infeasible trial on (a sampler seeded afresh,
                # not with campaign c's first draws)
                study.sampler = arm_sampler(arm, random.Random(f"{c}:{n}").randrange(2**31), True)
        stats["crashed"] += v.status == "crash"
        measured[key(point)] = "crash" if v.status == "crash" else v.metric   # None: cancelled (a discard, measured)
        if v.status == "keep":
            stats["keeps"] += 1
            stats["false_keeps"] += world.truth(point) >= world.truth(best["point"])
            best = dict(point=point, metric=v.metric, runs={s: rv for s, (rv, _) in runs_at.items()},
                        curves={s: cv for s, (_, cv) in runs_at.items()})
        trace.append((spent[0] / 3600, world.truth(best["point"]), n))
    return dict(trace=trace, base=base, best=best["point"], hours=spent[0] / 3600, **stats)


def gain_at(result, hours):
    """The true gain (baseline's mean minus the best's; positive: better) of a campaign's best after `hours`."""
    base = result["trace"][0][1]
    last = [truth for h, truth, _ in result["trace"] if h <= hours]
    return base - (last[-1] if last else base)


def ci(values):
    """(mean, half-width of its 95 % interval: Student t over the values, normal beyond 30)."""
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, float("nan")
    df = len(values) - 1
    t = stats.t_quantile(0.975, df) if df < 30 else Z95
    return m, t * statistics.stdev(values) / math.sqrt(len(values))


def one(args):
    name, rows, budget, c, hours, max_experiments, oom_above = args
    return campaign(ARMS[name], World(rows, budget, c, oom_above), c, hours, max_experiments)


def replay(table, arms, n_campaigns, hours, first_campaign=0, max_experiments=None, jobs=1, oom_above=None):
    """{arm name: [campaign result]} over campaign seeds first_campaign.. + n_campaigns, every arm the same seeds;
    jobs: processes replaying at once (each campaign is deterministic: the same results whatever jobs is);
    oom_above: World's infeasible region (None: none)."""
    header, rows, skipped = table
    budget = header["provenance"]["budget"]
    rows = full_rows(rows, budget)
    tasks = [(name, rows, budget, c, hours, max_experiments, oom_above) for name in arms
             for c in range(first_campaign, first_campaign + n_campaigns)]
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(jobs) as pool:
            done = list(pool.map(one, tasks))
    else:
        done = [one(t) for t in tasks]
    results = {}
    for (name, *_), result in zip(tasks, done):
        results.setdefault(name, []).append(result)
    return results


def report(results, hours, reference="tpe"):
    """Print per arm the true gain after `hours` and at half of it (mean and 95 % CI over campaigns; the range of single
    campaigns, which a live campaign is compared with), the gain per device-hour, keeps and false keeps, runs per experiment, cancels; then each arm against `reference` on the same
    campaign seeds (mean paired difference and its CI, the ratio of mean gains)."""
    print(f"| arm | campaigns | gain at {hours / 2:g} h | gain at {hours:g} h (95 % CI) | one campaign (min-max) | "
          f"device-hours spent | gain per device-hour | experiments | keeps (false) | runs/exp | cancelled | crashed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, rs in results.items():
        gains = [gain_at(r, hours) for r in rs]
        g, hw = ci(gains)
        half, _ = ci([gain_at(r, hours / 2) for r in rs])
        exps = sum(r["experiments"] for r in rs)
        spent = statistics.fmean(min(hours, r["hours"]) for r in rs)
        print(f"| {name} | {len(rs)} | {half:.4f} | {g:.4f} +- {hw:.4f} | {min(gains):.4f} to {max(gains):.4f} | "
              f"{spent:.2f} | {g / spent:.4f} | "
              f"{exps / len(rs):.1f} | {sum(r['keeps'] for r in rs) / len(rs):.1f} "
              f"({sum(r['false_keeps'] for r in rs) / len(rs):.1f}) | {sum(r['runs'] for r in rs) / max(1, exps):.2f}"
              f" | {sum(r['cancelled'] for r in rs) / max(1, exps):.0%} | "
              f"{sum(r.get('crashed', 0) for r in rs) / max(1, exps):.0%} |")
    if reference not in results:
        return
    ref = [gain_at(r, hours) for r in results[reference]]
    print(f"\n| arm vs {reference} (same campaign seeds) | mean difference of gains (95 % CI) | ratio of mean gains "
          f"({reference} / arm) |")
    print("|---|---|---|")
    for name, rs in results.items():
        if name == reference:
            continue
        diffs = [a - gain_at(r, hours) for a, r in zip(ref, rs)]
        d, hw = ci(diffs)
        mine = statistics.fmean(gain_at(r, hours) for r in rs)
        ratio = f"{statistics.fmean(ref) / mine:.2f}" if mine > 0 else "inf (the arm gains nothing)"
        print(f"| {name} | {d:+.4f} +- {hw:.4f} | {ratio} |")


def surrogate_report(table):
    header, rows, skipped = table
    rows = full_rows(rows, header["provenance"]["budget"])
    sd, df = seed_sd(rows)
    print(f"{len(rows)} runs at the full budget ({skipped} torn rows skipped); pooled within-point seed sd "
          f"{sd:.4f} ({df} degrees of freedom)")
    found = held_out(rows)
    errors = [pred - obs for _, _, obs, pred in found]
    for k, n, obs, pred in found:
        print(f"  {', '.join(f'{a}={b}' for a, b in k)}: recorded {obs:.4f} (n={n}), predicted {pred:.4f}, "
              f"error {pred - obs:+.4f}")
    if errors:
        rmse = math.sqrt(statistics.fmean(e * e for e in errors))
        expect = sd / math.sqrt(statistics.fmean(n for _, n, _, _ in found))
        print(f"held out: {len(errors)} points, RMSE {rmse:.4f}, mean error {statistics.fmean(errors):+.4f}; a "
              f"recorded mean's own seed noise {expect:.4f}")


def remeasure(repo, tag, seeds, cache=None):
    """The final best of a live campaign (autoresearch/<tag> in repo) and the baseline (its first commit's parent,
    main's train.py) each run as plain train.py at `seeds` (fresh: not the campaign's). Prints both means and the
    gain, and the surrogate's prediction for the best's point. Returns (gain, point)."""
    branch = f"autoresearch/{tag}"
    best_src = subprocess.run(["git", "-C", str(repo), "show", f"{branch}:train.py"], capture_output=True, text=True,
                              check=True).stdout
    base_src = (ROOT / "train.py").read_text()
    consts = searchspace.constants(best_src, PROFILE)
    point = {n: consts[n].value for n in SPACE}
    header, rows, _ = lab_table.read_table()
    fit = Surrogate(full_rows(rows, header["provenance"]["budget"]))
    same = best_src == base_src
    print(f"{tag}: best {'= the baseline' if same else key(point)}")
    measured = {}
    for name, src in (("best", best_src),) + (() if same else (("base", base_src),)):
        values = [lab_table.run_one(point, s, header["provenance"]["budget"], cache, source=src)["val_bpb"]
                  for s in seeds]
        measured[name] = values
        print(f"  {name}: {[round(v, 4) for v in values]} mean {statistics.fmean(values):.4f}")
    gain = 0.0 if same else statistics.fmean(measured["base"]) - statistics.fmean(measured["best"])
    try:
        predicted = fit.predict(written(point)) if not same else fit.predict(point)
        print(f"  re-measured gain {gain:+.4f}; the surrogate's gain for this point "
              f"{fit.predict({n: v[0] for n, v in SPACE.items()}) - predicted:+.4f}")
    except OutsideTable as e:
        print(f"  re-measured gain {gain:+.4f}; the surrogate cannot say: {e}")
    return gain, point


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--table", default=str(lab_table.TABLE), help="the lab table (default: bench/lab_table.jsonl)")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                   help=f"comma-separated arms (default {','.join(DEFAULT_ARMS)}); all: {','.join(ARMS)}")
    p.add_argument("--campaigns", type=int, default=CAMPAIGNS, help=f"campaigns per arm (default {CAMPAIGNS})")
    p.add_argument("--hours", type=float, default=HOURS, help=f"device-hours per campaign (default {HOURS:g})")
    p.add_argument("--experiments", type=int, help="stop each campaign after this many experiments instead")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: this machine's cores)")
    p.add_argument("--save", help="write every campaign's result here (JSON) for later reading")
    p.add_argument("--reference", default="tpe", help="the arm the others are compared with (default tpe)")
    p.add_argument("--oom-above", type=int, metavar="N", help="an infeasible region: a point whose DEPTH x "
                   "TOTAL_BATCH_SIZE exceeds N runs out of memory at start-up (8192: 2 of the 9 depth-batch "
                   "pairs)")
    p.add_argument("--surrogate", action="store_true", help="only the surrogate's held-out check")
    p.add_argument("--space", action="store_true",
                   help="only print the replay's space as program.md's `## Search space` (for a live campaign)")
    p.add_argument("--remeasure", metavar="REPO", help="re-measure a live campaign's final best (with --tag)")
    p.add_argument("--tag", help="the live campaign's tag (--remeasure)")
    p.add_argument("--seeds", default="901,902,903", help="--remeasure's fresh seeds (default 901,902,903)")
    a = p.parse_args(argv)
    unknown = [n for n in a.arms.split(",") if n not in ARMS]
    if unknown:
        p.error(f"unknown arm(s) {', '.join(unknown)}: choose from {', '.join(ARMS)}")
    if a.campaigns < 2 or a.hours <= 0:
        p.error("--campaigns must be at least 2 (a confidence interval) and --hours above 0")
    if a.oom_above is not None and a.oom_above < SPACE["DEPTH"][0] * SPACE["TOTAL_BATCH_SIZE"][0]:
        p.error(f"--oom-above {a.oom_above} leaves no room for the baseline (DEPTH {SPACE['DEPTH'][0]} x "
                f"TOTAL_BATCH_SIZE {SPACE['TOTAL_BATCH_SIZE'][0]}): give at least their product")
    if a.space:
        print(space_section(), end="")
        return 0

    def body():
        if a.remeasure:
            if not a.tag:
                p.error("--remeasure needs --tag (the live campaign's tag)")
            remeasure(Path(a.remeasure), a.tag, [int(s) for s in a.seeds.split(",")])
            return 0
        table = lab_table.read_table(a.table, expect=expected())
        surrogate_report(table)
        for line in lab_table.rank_agreement(table[1], table[0]["provenance"]["budget"]) or [
                "\nmulti-fidelity screening: the table holds no shorter budget (bench/lab_table.py --design short)"]:
            print(line)
        if a.surrogate:
            return 0
        t0 = time.monotonic()
        results = replay(table, a.arms.split(","), a.campaigns, a.hours, max_experiments=a.experiments, jobs=a.jobs,
                         oom_above=a.oom_above)
        if a.save:
            Path(a.save).write_text(json.dumps(results))
        hours = a.hours if a.experiments is None else max(r["hours"] for rs in results.values() for r in rs)
        print(f"\nreplay: {a.campaigns} campaigns per arm, {a.hours:g} device-hours each"
              f"{f', out of memory above DEPTH x TOTAL_BATCH_SIZE {a.oom_above}' if a.oom_above else ''} "
              f"({time.monotonic() - t0:.0f} s to replay)\n")
        report(results, hours, a.reference)
        return 0
    return lab_table.refused(body, "bench_yield.py")


if __name__ == "__main__":
    sys.exit(main())
