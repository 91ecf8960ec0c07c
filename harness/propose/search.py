"""
HARNESS: the numeric search. The search space over train.py's UPPER_CASE constants (harness.propose.searchspace: derived
from their values at the tag's start, or program.md's `## Search space`), one Optuna study per tag
in <harness dir>/study.db told of every recorded experiment whoever proposed it, and a sampler's point (TPE, CMA-ES,
random) written as a train.py edit of those constants only. events.jsonl is the source of truth: a study that is
missing, unreadable or disagrees with it is rebuilt from it. It never trains, judges or commits.
"""

import dataclasses
import json
import math
import random
import time
import warnings

from harness import console, files
from harness.errors import SetupError, Stop
from harness.gitops import GitError, file_at
from harness.propose import memory
from harness.propose.searchspace import SPACE_HEADING, constants, parses, space_of, space_section, values_of, write_point
from harness.run.runner import Kind
from harness.schema import Event

SAMPLERS = ("tpe", "cmaes", "random")   # --proposer values that are an Optuna sampler (grid: perturb.py's sweep)
STUDY_DB = "study.db"
TPE_STARTUP = 4                 # finished trials (the baseline's included) before TPE models: Optuna's default 10
#                                 random ones would be a night's first hour at 5 minutes a run
EXHAUSTED = 20                  # points in a row already measured or running: the space is used up
# A failure the point is to blame for tells the sampler where not to go (failure_of): a crash (running out of memory
# among them), a timeout, a rejection (training past the budget) or a run over the wall-time allowance, of an edit
# that changed the space's constants only. Such a trial is pruned (no value) and marked infeasible (Optuna's
# constraint CONSTRAINT > 0 and the user attribute INFEASIBLE): TPE puts infeasible trials among its bad ones, and
# CMA-ES, which models no pruned trial, is told nothing (bench_yield: a penalty value from the measured trials did
# not pay for it, docs/benchmarks.md).
POINT_FAILURES = (Kind.CRASH, Kind.TIMEOUT, Kind.REJECTED, Kind.OVERTIME)
CONSTRAINT = "point"
INFEASIBLE = "infeasible"
# Once the study holds an infeasible trial, TPE draws this many candidates from its model of the good trials, l(x),
# and keeps the one where l(x) / g(x) is highest, g its model of the bad ones (the infeasible among them). With
# Optuna's default of 24 it drew a point in the failing region about twice as often: bench_yield --oom-above 8192, 32
# campaigns, crashes 9.2 % of experiments told blind, 6.5 % told as infeasible, 3.7 % with the wider draw, the gain
# unchanged within its interval (docs/benchmarks.md). Without an infeasible trial, the default: a wider draw made a
# plain search greedier, no better.
TPE_CANDIDATES, TPE_CANDIDATES_INFEASIBLE = 24, 256


def sampler_for(name, seed, infeasible=False):
    """The Optuna sampler of --proposer name (tpe | cmaes | random), seeded. TPE: multivariate, with the constant
    liar for points still running, modelling from TPE_STARTUP finished trials on, drawing TPE_CANDIDATES_INFEASIBLE
    candidates once the study holds an infeasible trial (infeasible). CMA-ES: its mean starts at the centre of the
    space (for a derived space, on a log scale: the tag's start values), its categorical parameters drawn by a seeded
    random sampler."""
    import optuna
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # an infeasible trial is pruned, which CMA-ES ignores: its warning that it reads no constraint says nothing new
    warnings.filterwarnings("ignore", message="Constraints have been set, but CmaEsSampler")
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                          n_startup_trials=TPE_STARTUP, n_ei_candidates=TPE_CANDIDATES_INFEASIBLE
                                          if infeasible else TPE_CANDIDATES)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False,
                                            independent_sampler=optuna.samplers.RandomSampler(seed=seed))
    return optuna.samplers.RandomSampler(seed=seed)


@dataclasses.dataclass
class Search:
    """A tag's study: the space, the Optuna study (None while it cannot be used), the points asked and not recorded
    yet (their written values -> the Trial), and the constants that code edits removed (said once)."""
    space: dict
    study: object
    pending: list = dataclasses.field(default_factory=list)    # [(written values, optuna Trial)]
    gone: set = dataclasses.field(default_factory=set)
    asked: dict = dataclasses.field(default_factory=dict)       # experiment n -> the Trial last asked for it
    in_memory: bool = False                                     # study.db failed: a study in memory for this run


def of(s):
    """The tag's Search, opened once per invocation (s.search): the space from the tag's start train.py and
    program.md, the study loaded and checked against events.jsonl, or rebuilt from it. Raises SetupError on a bad
    `## Search space`."""
    if s.search is None:
        start = s.history[0]["full_commit"] if s.history else s.best_commit
        base = file_at(s.repo, start, s.tag.train_rel)
        space = space_of(base, s.tag.profile, read(s))
        s.search = Search(space, None)
        open_study(s)
    return s.search


def open_study(s):
    """Load <harness dir>/study.db and bring it up to date with the recorded experiments; rebuild it (the old file
    kept as study.db.bad-<time>) when it cannot be read, its space changed or it disagrees with events.jsonl. A
    study that cannot be made at all leaves the search without one: a warning, never a crash."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    files.route_library_logs()         # optuna's own terminal handler, put there by its import: off
    path, search = s.tag.home / STUDY_DB, s.search
    problem = None
    if path.exists():
        try:
            search.study = load(s, path)
            problem = disagreement(s, search.study)
        except SpaceChanged as e:
            problem = str(e)
        except Exception as e:  # noqa: BLE001  (sqlite, alembic or a torn file: whatever it is, rebuild)
            if "database is locked" in root_words(e):   # another process holds it: nothing wrong with the file
                return in_memory(s, e)
            problem = f"cannot be read ({type(e).__name__}: {str(e)[:200]})"
        if problem:
            say(s, f"the search's study {path} {problem}: rebuilt from {len(s.history)} experiments in events.jsonl")
            search.study = None
            path.rename(path.with_name(f"{STUDY_DB}.bad-{time.strftime('%Y%m%d-%H%M%S')}"))
    try:
        if search.study is None:
            search.study = load(s, path)
        catch_up(s)
    except Exception as e:  # noqa: BLE001
        in_memory(s, e)


def root_words(e):
    """The innermost cause of an exception (Optuna's StorageInternalError wraps SQLAlchemy's, which wraps sqlite3's)
    as "Type: its first line"."""
    while (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def in_memory(s, e):
    """The study on disk failed (locked by another process past STUDY_LOCK_WAIT_S, a full disk, a broken file):
    said once as a warning, and this invocation goes on with a study in memory rebuilt from the recorded
    experiments (the file catches up at the next start). Raises what the in-memory study raises (a bug)."""
    search = s.search
    say(s, f"the search's study {s.tag.home / STUDY_DB} cannot be used ({root_words(e)}); this run goes on with a study in memory rebuilt from the {len(s.history)} recorded experiments, and "
           "the file catches up at the next start")
    search.study, search.pending, search.asked, search.in_memory = None, [], {}, True
    search.study = load(s, None)
    catch_up(s)


STUDY_LOCK_WAIT_S = 30.0     # how long a study operation waits for a lock another process holds on study.db


def load(s, path):
    """The tag's Optuna study on SQLite at path (created when missing; None: in memory), its space stored as a study
    attribute."""
    import optuna
    storage = None if path is None else optuna.storages.RDBStorage(
        f"sqlite:///{path}", engine_kwargs={"connect_args": {"timeout": STUDY_LOCK_WAIT_S}})
    study = optuna.create_study(storage=storage, study_name=s.settings.tag, load_if_exists=True,
                                direction="minimize" if s.tag.goal == "min" else "maximize")
    space = {name: dataclasses.asdict(p) for name, p in s.search.space.items()}
    stored = study.user_attrs.get("space")
    if stored is None:
        study.set_user_attr("space", json.loads(json.dumps(space)))
    elif stored != json.loads(json.dumps(space)):
        raise SpaceChanged("was made for another search space (program.md's section or the tag's train.py changed)")
    return study


class SpaceChanged(Exception):
    """The study on disk was made for another search space."""


def disagreement(s, study):
    """Why the study disagrees with the recorded experiments (a trial for an experiment not recorded, or with another
    result), or None."""
    recorded = {e["n"]: e for e in s.history}
    for t in study.get_trials(deepcopy=False):
        n = t.user_attrs.get("n")
        if n is None:
            continue
        e = recorded.get(n)
        if e is None:
            return f"has a trial for experiment #{n}, which events.jsonl does not record"
        state, value, failure = told(s, e)
        if state != t.state or value is not None and not math.isclose(t.value, value, rel_tol=1e-9, abs_tol=1e-12) \
                or t.user_attrs.get(INFEASIBLE) != failure:
            return f"disagrees with events.jsonl on experiment #{n}"
    return None


def catch_up(s):
    """Tell the study of the recorded experiments it lacks (a kill between the event and the tell, a rebuild, an
    older tag), and close the points an earlier invocation asked for and never ran (failed, marked abandoned)."""
    import optuna
    study = s.search.study
    known = {t.user_attrs.get("n") for t in study.get_trials(deepcopy=False)}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
    missing = [e for e in s.history if e["n"] not in known]
    study.add_trials([trial for e in missing if (trial := trial_of(s, e)) is not None])
    older = [e["n"] for e in missing if e["status"] == "crash" and "kind" not in e]
    if older:
        say(s, f"{len(older)} crash(es) recorded by an older version (#{', #'.join(map(str, older[:5]))}) tell the "
               "sampler nothing: their kind (the point's fault or the machine's) was not recorded")


def outcome_of(event, failure=None):
    """(Optuna TrialState, value) of a recorded experiment: COMPLETE with its metric; FAIL for a crash and for one the
    environment left not judged (Kind.measured false: its point may be measured again); PRUNED with no value for a
    run cancelled early (harness.judge.curves: its curve was behind the best's) and for a failure of its point
    (failure: failure_of's; the trial is then marked infeasible)."""
    import optuna
    if event.get("cancelled") or failure is not None:
        return optuna.trial.TrialState.PRUNED, None
    if event["status"] == "crash" or not Kind.of(event).measured:
        return optuna.trial.TrialState.FAIL, None
    return optuna.trial.TrialState.COMPLETE, event["metric"]


def failure_of(event, change):
    """Why experiment `event` failed because of its point: its kind's name ("crash", "timeout", "rejected",
    "overtime": POINT_FAILURES), or None when it did not fail, when the environment failed it (a lost Ray worker or
    node: the machine, not the point), when its edit changed code (change: its memory.Change; a code edit's crash says
    nothing of its constants, which may be the best's own; an empty Change: not known) and for a crash an older
    version recorded without its kind."""
    if event["status"] != "crash" or "kind" not in event:
        return None
    if Kind.of(event) not in POINT_FAILURES or not change.families or \
            any(f.startswith("code: ") for f in change.families):
        return None
    return Kind.of(event).value


def told(s, event):
    """(state, value, failure) the study is told of a recorded experiment: outcome_of with failure_of (None unless
    the trial is infeasible)."""
    # memory.change_at reads git: for a crash only (this runs over the whole history at each start)
    failure = failure_of(event, memory.change_at(s, event)) if event["status"] == "crash" else None
    return (*outcome_of(event, failure), failure)


def finish(study, trial, state, value, failure=None):
    """Tell the study how an asked trial ended; a failure of its point (failure_of) is marked infeasible first."""
    mark(trial, failure)
    study.tell(trial, value, state=state)


def mark(trial, failure):
    """Mark an Optuna trial (asked, or created to be added) infeasible when failure (failure_of's kind) is not None:
    the INFEASIBLE user attribute with the kind, Optuna's constraint CONSTRAINT at 1."""
    if failure is not None:
        trial.set_user_attr(INFEASIBLE, failure)
        trial.set_constraint(CONSTRAINT, 1.0)


def trial_of(s, event, values=None):
    """The finished Optuna trial of a recorded experiment: its constants' values (from its commit's train.py unless
    given) and how it ended (told); None when its train.py cannot be read."""
    if values is None:
        if event["n"] in s.cache.unreadable:
            return None
        try:
            values = values_of(s.search.space, file_at(s.repo, event["full_commit"], s.tag.train_rel), s.tag.profile)
        except (GitError, SetupError, ValueError):
            return None
    return added(*told(s, event), values, {k: s.search.space[k].distribution() for k in values},
                 {"n": event["n"], "by": who(event)})


def added(state, value, failure, params, distributions, attrs):
    """A finished Optuna trial to add to a study (study.add_trial): a point the sampler did not ask for (an LLM's or
    a human's edit, an override) or a rebuilt one; a failure of its point (failure_of) marked infeasible as finish
    marks it. A sampler that models only the points it asked (CMA-ES: its generations) ignores it."""
    import optuna
    trial = optuna.trial.create_trial(state=state, value=value, params=params, distributions=distributions,
                                      user_attrs=attrs)
    mark(trial, failure)
    return trial


def suggest(s, name, source, n, attempt=0):
    """The sampler's next point for experiment n (attempt > 0: the last one was refused, e.g. already measured; that
    trial is closed as failed first), as (answer, point): an edit of best train.py `source` setting the constants of
    the space that it still has. Raises SetupError when the search has nothing to search (no constants, no study)."""
    search = of(s)
    if not search.space:                # the tag's train.py does not parse (attach refused one with no constant):
        return "", {}                   # no idea; its baseline crashes and says why
    if search.study is None:
        raise Stop(f"--proposer {name} cannot go on: the search's study could not be used (the warning above says "
                   "why); rerun the same command to rebuild it from events.jsonl")
    try:
        return ask(s, name, source, n, attempt)
    except Stop:
        raise
    except Exception as e:  # noqa: BLE001  (the study on disk: locked, full, broken; in memory it is a bug)
        if search.in_memory:
            raise
        in_memory(s, e)
        return ask(s, name, source, n, attempt)


def ask(s, name, source, n, attempt):
    """suggest's work on the study as it is (its errors raised)."""
    import optuna
    search = s.search
    if attempt and (old := search.asked.pop(n, None)) is not None:
        search.pending = [(w, t) for w, t in search.pending if t is not old]
        search.study.tell(old, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
    present = constants(source, s.tag.profile)
    for gone in sorted(set(search.space) - set(present) - search.gone):
        search.gone.add(gone)
        say(s, f"the search continues without {gone}: the best train.py no longer defines it (a code edit removed "
               "or renamed it)")
    now = values_of(search.space, source, s.tag.profile)
    trials = search.study.get_trials(deepcopy=False)
    seen = [now] + [t.params for t in trials if "n" in t.user_attrs] + [w for w, _ in search.pending]
    infeasible = holds_infeasible(trials)
    for tries in range(EXHAUSTED):      # a point the best has, or one measured or waiting: the sampler asked again
        draw = f"{s.settings.seed}:{s.settings.tag}:{n}:{attempt}" + (f":{tries}" if tries else "")
        seed = random.Random(draw).randrange(2**31)
        search.study.sampler = sampler_for(name, seed, infeasible)
        trial = search.study.ask({k: p.distribution() for k, p in search.space.items() if k in present})
        answer, written = write_point(source, s.tag.profile, search.space, trial.params, name)
        if written not in seen:
            search.pending.append((written, trial))
            search.asked[n] = trial
            return answer, trial.params
        search.study.tell(trial, state=optuna.trial.TrialState.FAIL)
    raise Stop(f"the search space is exhausted: {name} drew {EXHAUSTED} points in a row that are already measured or "
               f"running. Widen the ranges in program.md's {SPACE_HEADING}, or use an LLM proposer")


def holds_infeasible(trials):
    """Whether any of these Optuna trials is infeasible (a failure of its point: failure_of, finish, added)."""
    return any(INFEASIBLE in t.user_attrs for t in trials)


def who(event):
    """Who proposed a recorded experiment: its `by` (the hybrid's), "baseline" for #0, else its proposer."""
    return event.get("by") or ("baseline" if event["n"] == 0 else event.get("proposer") or "?")


def close(s):
    """At the loop's end: the points asked for and never run (ideas speculated, waiting) are closed as failed."""
    import optuna
    search = s.search
    if search is not None and search.study is not None:
        try:
            for _, trial in search.pending:
                search.study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        except Exception as e:  # noqa: BLE001  (closed at the next start instead)
            say(s, f"the points never run stay open in the study until the next start ({type(e).__name__})")
        search.pending, search.asked = [], {}


def drop(s, n):
    """Close the point asked for experiment n as failed: it will not run (the hybrid's LLM chose another)."""
    import optuna
    search = s.search
    if search is not None and search.study is not None and (trial := search.asked.pop(n, None)) is not None:
        search.pending = [(w, t) for w, t in search.pending if t is not trial]
        search.study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)


def attach(s, proposer):
    """Set the loop's proposer up for this tag: the profile it edits, and for a sampler (SAMPLERS) its suggest; open
    the study for a search (samplers, grid, hybrid) and say what the search does. Raises SetupError on a bad
    `## Search space` or an empty space."""
    a = s.settings
    proposer.profile = s.tag.profile
    if a.chosen:
        console.say(a.chosen)
    if a.proposer in SAMPLERS:
        proposer.suggest = lambda source, n, attempt: suggest(s, a.proposer, source, n, attempt)[0]
    if a.proposer not in (*SAMPLERS, "grid", "hybrid"):
        return
    search = of(s)
    if not search.space and a.proposer != "grid" and parses(file_at(s.repo, s.best_commit, s.tag.train_rel)):
        raise SetupError(f"--proposer {a.proposer}: train.py has no UPPER_CASE constant to search in the branch that "
                         "runs (docs/search.md); use an LLM proposer, or name parameters in program.md's "
                         f"{SPACE_HEADING}")
    name = a.sampler if a.proposer == "hybrid" else a.proposer
    named = space_section(read(s)) is not None
    proposer.names = set(search.space) if named else None      # grid sweeps only what program.md names
    where = f"program.md's {SPACE_HEADING}" if named else "ranges from their values"
    console.say(f"search: {name} over {len(search.space)} constants of train.py ({where}; docs/search.md): "
                f"{', '.join(search.space)}; study {s.tag.home / STUDY_DB}")


def tell(s, event):
    """Tell the study of a recorded experiment: the point asked for it when its train.py says exactly that point,
    else (an LLM's or a human's edit, an override, a point re-applied elsewhere) an added trial of what its train.py
    says. A study that fails here is dropped for this invocation with a warning (rebuilt on the next start)."""
    if s.search is None or s.search.study is None:
        return
    search = s.search
    try:
        values = values_of(search.space, file_at(s.repo, event["full_commit"], s.tag.train_rel), s.tag.profile)
        match = next((t for w, t in search.pending if w == values), None)
        if match is not None:
            search.pending = [(w, t) for w, t in search.pending if t is not match]
            match.set_user_attr("n", event["n"])
            match.set_user_attr("by", who(event))
            finish(search.study, match, *told(s, event))
        elif (trial := trial_of(s, event, values)) is not None:
            search.study.add_trial(trial)
    except Exception as e:  # noqa: BLE001  (the experiment is recorded; the study is a cache of the events)
        if search.in_memory:
            raise
        in_memory(s, e)
        if not any(done["n"] == event["n"] for done in s.history):
            search.study.add_trials([t for t in [trial_of(s, event)] if t is not None])


def state_words(s, metric, limit=12):
    """The sampler's state for a prompt: the space, its best point so far and the last `limit` trials with their
    values and deltas against the baseline (the hybrid's LLM reads it)."""
    search = of(s)
    if search.study is None:
        return "(no study)"
    trials = [t for t in search.study.get_trials(deepcopy=False) if "n" in t.user_attrs]
    done = [t for t in trials if t.state.name == "COMPLETE"]
    base = next((t.value for t in done if t.user_attrs["n"] == 0), None)
    lines = ["Search space: " + "; ".join(p.words() for p in search.space.values())]
    if search.gone:
        lines.append("No longer in train.py (removed by a code edit): " + ", ".join(sorted(search.gone)))
    if done:
        best = min(done, key=lambda t: t.value) if s.tag.goal == "min" else max(done, key=lambda t: t.value)
        lines.append(f"Best point so far (#{best.user_attrs['n']}, {metric} {best.value:.6f}): "
                     f"{shown(search.space, best.params)}")
    for t in trials[-limit:]:
        delta = f"failed at its point ({t.user_attrs[INFEASIBLE]})" if INFEASIBLE in t.user_attrs else \
            f"{t.value:.6f} ({t.value - base:+.6f} vs baseline)" if t.value is not None and base is not None \
            else "cancelled early" if t.state.name == "PRUNED" else "crash"
        lines.append(f"#{t.user_attrs['n']} by {t.user_attrs.get('by', '?')}: {delta}: {shown(search.space, t.params)}")
    return "\n".join(lines)


def shown(space, params):
    """A point as train.py's values, `NAME=value` separated by commas."""
    return ", ".join(f"{k}={space[k].external(v) if k in space else v:.4g}" if isinstance(v, float) else
                     f"{k}={space[k].external(v) if k in space else v}" for k, v in params.items())


def read(s):
    """program.md's text as it is now (the human may edit it while the loop runs)."""
    return (s.tag.target / "program.md").read_text(encoding="utf-8", errors="replace")


def say(s, text):
    """A search message: printed and logged as a warning event."""
    console.say(f"search: {text}")
    s.log(Event.WARNING, where="search", reason=text)
