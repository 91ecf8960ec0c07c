"""
HARNESS: the numeric search. The search space over train.py's UPPER_CASE constants (derived from their values at the
tag's start in the `if PROFILE == ...` branch that runs, or program.md's `## Search space`), one Optuna study per tag
in <harness dir>/study.db told of every recorded experiment whoever proposed it, and a sampler's point (TPE, CMA-ES,
random) written as a train.py edit of those constants only. events.jsonl is the source of truth: a study that is
missing, unreadable or disagrees with it is rebuilt from it. It never trains, judges or commits.
"""

import ast
import dataclasses
import json
import math
import random
import re
import time
import warnings

from harness import console, ledger
from harness.propose.edits import answer_for
from harness.errors import SetupError, Stop
from harness.gitops import GitError, file_at
from harness.propose.perturb import active_statements
from harness.run.runner import Kind
from harness.schema import Event

SAMPLERS = ("tpe", "cmaes", "random")   # --proposer values that are an Optuna sampler (grid: perturb.py's sweep)
SPACE_HEADING = "## Search space"
STUDY_DB = "study.db"
LOG_SPAN = 3.0                  # a rate or coefficient v: log-uniform on [v / 3, 3 v]
INT_SPAN = 2.0                  # an int v: [ceil(v / 2), 2 v], integer steps
POW2_STEPS = 1                  # a power of two 2**k: 2**(k - 1) .. 2**(k + 1) (a model's width, a head's size) ...
BATCH_STEPS = 2                 # ... a *BATCH* size: 2**(k - 2) .. 2**(k + 2)
POW2_MIN = 16                   # an int power of two from 16 up is searched as one (DEPTH = 4 takes integer steps)
SHARE_HIGH = 0.5                # a *_RATIO / *_FRAC at 0: [0, 0.5]; at v > 0: [0, min(1, 2 v)]
PATTERNS = ("L", "SL", "SSL", "SSSL", "SSLL")   # choices of a string of S and L (a window pattern)
SKIPPED = re.compile(r"EVAL|SEED|THREADS|PROFILE|DEVICE")  # evaluation, plumbing and per-device memory constants
TPE_STARTUP = 4                 # finished trials (the baseline's included) before TPE models: Optuna's default 10
#                                 random ones would be a night's first hour at 5 minutes a run
EXHAUSTED = 20                  # points in a row already measured or running: the space is used up
DESCRIBED = 4                   # changes a sampler's row description names (the largest; the diff has them all)
LITERAL_DIGITS = 4              # significant digits of a float written into train.py (the point told is unrounded)


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched constant. kind: float | int | pow2 (the study holds the exponent k of 2**k) | choice.
    low/high bound float/int/pow2 (inclusive; pow2 in exponents), log a log-uniform float, choices a choice's values."""
    name: str
    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple = ()

    def distribution(self):
        """The Optuna distribution of this parameter."""
        import optuna.distributions as d
        if self.kind == "choice":
            return d.CategoricalDistribution(self.choices)
        if self.kind in ("int", "pow2"):
            return d.IntDistribution(int(self.low), int(self.high))
        return d.FloatDistribution(self.low, self.high, log=self.log)

    def internal(self, value):
        """train.py's value as the study holds it (pow2: its exponent), or None when it is outside this range or of
        another type (a bool is never a number here, a string never one, an int no float beyond a float's range)."""
        if self.kind == "choice":
            return next((c for c in self.choices if type(c) is type(value) and c == value), None)
        if type(value) not in (int, float) or self.kind in ("int", "pow2") and type(value) is not int:
            return None
        if self.kind == "pow2":
            if not (value > 0 and value & (value - 1) == 0):
                return None
            value = value.bit_length() - 1
        elif self.kind == "float":
            try:
                value = float(value)
            except OverflowError:
                return None
        return value if math.isfinite(value) and self.low <= value <= self.high else None

    def external(self, x):
        """The study's value as train.py holds it."""
        return 2 ** int(x) if self.kind == "pow2" else int(x) if self.kind == "int" else x

    def words(self):
        """How program.md's `## Search space` would write this parameter (the prompt and docs show it)."""
        if self.kind == "choice":
            return f"{self.name}: choices={','.join(map(str, self.choices))}"
        if self.kind == "pow2":
            return f"{self.name}: low=2**{int(self.low)} high=2**{int(self.high)}"
        return f"{self.name}: low={self.low:g} high={self.high:g}{' log' if self.log else ''}"


@dataclasses.dataclass(frozen=True)
class Const:
    """An UPPER_CASE constant of train.py written as one literal on one line: its 0-based line, the literal's UTF-8
    byte span in that line, its value (for `2**k`: 2**k), and written ("pow2" for `2**k`, else the literal's type)."""
    name: str
    line: int
    span: tuple
    value: object
    written: str


def constants(source, profile):
    """{name: Const} of the `NAME = <literal>` lines of train.py that run for profile (module level, or the branch of
    an `if PROFILE == ...` chain that runs; perturb.active_statements). Literals: int, float, str, and `2**k`; bools
    and computed values are left out. Raises SyntaxError when source does not parse."""
    found = {}
    for node in active_statements(ast.parse(source).body, profile):
        target, value = (node.target, node.value) if isinstance(node, ast.AnnAssign) else \
            (node.targets[0], node.value) if isinstance(node, ast.Assign) and len(node.targets) == 1 else (None, None)
        if not (isinstance(target, ast.Name) and re.fullmatch(r"[A-Z][A-Z0-9_]*", target.id) and value is not None
                and node.lineno == node.end_lineno):
            continue
        if isinstance(value, ast.Constant) and type(value.value) in (int, float, str):
            number, written = value.value, type(value.value).__name__
        elif (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Pow) and value.left.__class__ is ast.Constant
              and value.left.value == 2 and isinstance(value.right, ast.Constant) and type(value.right.value) is int
              and 0 <= value.right.value < 63):
            number, written = 2 ** value.right.value, "pow2"
        else:
            continue
        found[target.id] = Const(target.id, node.lineno - 1, (value.col_offset, value.end_col_offset), number, written)
    return found


def parses(source):
    """Whether a train.py parses as Python (one that does not crashes at its run, which says why)."""
    try:
        ast.parse(source)
        return True
    except SyntaxError:
        return False


def default_param(c):
    """The range derived from a constant's value (the table in docs/search.md), or None when it is not searched (a
    name in SKIPPED, zero or a negative number outside a *_RATIO / *_FRAC, a string that is not an S/L pattern)."""
    v = c.value
    if SKIPPED.search(c.name) or isinstance(v, (int, float)) and v < 0:
        return None
    if isinstance(v, str):
        return Param(c.name, "choice", choices=tuple(dict.fromkeys((v, *PATTERNS)))) if re.fullmatch(r"[SL]+", v) \
            else None
    if re.search(r"(RATIO|FRAC)$", c.name) and isinstance(v, float) and v <= 1:
        return Param(c.name, "float", 0.0, min(1.0, 2 * v) if v > 0 else SHARE_HIGH)
    if v == 0:
        return None
    if isinstance(v, int) and (c.written == "pow2" or v >= POW2_MIN and v & (v - 1) == 0):
        k, steps = v.bit_length() - 1, BATCH_STEPS if "BATCH" in c.name else POW2_STEPS
        return Param(c.name, "pow2", max(0, k - steps), k + steps)
    if isinstance(v, int):
        return Param(c.name, "int", max(1, math.ceil(v / INT_SPAN)), max(2, round(v * INT_SPAN)))
    if re.search(r"BETA|MOMENTUM", c.name) and 0.5 < v < 1:   # its distance to 1 matters: linear, below 1
        return Param(c.name, "float", 1 - min(1.0, (1 - v) * LOG_SPAN), 1 - (1 - v) / LOG_SPAN)
    return Param(c.name, "float", v / LOG_SPAN, v * LOG_SPAN, log=True)


def space_section(program):
    """The lines of program.md's `## Search space` section (its bullets), or None when it has none."""
    m = re.search(rf"(?m)^{re.escape(SPACE_HEADING)}[ \t]*\n(.*?)(?=^#{{1,2}} |\Z)", program, re.S)
    if m is None:
        return None
    return [line.split(" #")[0].strip()[1:].strip() for line in m.group(1).splitlines()
            if line.strip().startswith(("-", "*"))]     # ` # a comment` after an entry is dropped


def literal(text):
    """A number or string from program.md (`2**k`, ints, floats, bare words)."""
    if m := re.fullmatch(r"2\s*\*\*\s*(\d+)", text):
        return 2 ** int(m.group(1))
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_entry(entry, consts):
    """One `- NAME: low=.. high=.. [log]` or `- NAME: choices=a,b,c` bullet as a Param checked against train.py's
    constants. Raises SetupError naming the entry and the fix."""
    fix = (f"fix the entry in program.md's {SPACE_HEADING} section, written `- NAME: low=0.01 high=0.2 log`, "
           "`- NAME: low=2 high=8` or `- NAME: choices=L,SSSL`")
    m = re.fullmatch(r"([A-Z][A-Z0-9_]*)\s*:\s*(.*)", entry)
    if not m:
        raise SetupError(f"search space entry {entry!r}: not `NAME: ...`; {fix}")
    name, fields = m.group(1), {}
    for word in m.group(2).split():
        key, _, value = word.partition("=")
        if key not in ("low", "high", "log", "choices") or (key == "log") != (value == ""):
            raise SetupError(f"search space entry {entry!r}: unknown setting {word!r}; {fix}")
        if key in fields:
            raise SetupError(f"search space entry {entry!r}: {key} is given twice; keep one; {fix}")
        fields[key] = value
    if name not in consts:
        raise SetupError(f"search space entry {entry!r}: train.py defines no constant {name} (one literal on one "
                         f"line, in the branch that runs); searchable: {', '.join(sorted(consts)) or 'none'}")
    current = consts[name].value
    if "choices" in fields:
        kind = (int, float) if type(current) is float else (type(current),)
        choices = [literal(v) for v in fields["choices"].split(",") if v]
        wrong = [c for c in choices if type(c) not in kind or type(c) is float and not math.isfinite(c)]
        if wrong:
            raise SetupError(f"search space entry {entry!r}: {name} is a {type(current).__name__} in train.py, so "
                             f"its choices must be too, not {', '.join(map(repr, wrong))}; {fix}")
        choices = tuple(dict.fromkeys(float(c) if type(current) is float else c for c in choices))
        if len(choices) < 2 or set(fields) != {"choices"}:
            raise SetupError(f"search space entry {entry!r}: choices need at least two values and no low/high; {fix}")
        param = Param(name, "choice", choices=choices)
    else:
        low, high = literal(fields.get("low", "")), literal(fields.get("high", ""))
        if not all(type(x) in (int, float) and math.isfinite(x) for x in (low, high)):
            raise SetupError(f"search space entry {entry!r}: low and high must be finite numbers; {fix}")
        if isinstance(current, str):
            raise SetupError(f"search space entry {entry!r}: {name} is a string in train.py: give it choices=; {fix}")
        if not low < high or "log" in fields and low <= 0:
            raise SetupError(f"search space entry {entry!r}: the range is empty or not positive for log (low "
                             f"{low!r}, high {high!r}); {fix}")
        if isinstance(current, int) and not all(isinstance(x, int) for x in (low, high)):
            raise SetupError(f"search space entry {entry!r}: {name} is an int ({current}) in train.py, so low and "
                             f"high must be ints; {fix}")
        pow2 = all(re.fullmatch(r"2\s*\*\*\s*\d+", fields[k]) for k in ("low", "high"))   # written 2**k: powers of two
        if consts[name].written == "pow2" and not pow2:
            raise SetupError(f"search space entry {entry!r}: train.py writes {name} as 2**k, so give its bounds as "
                             f"powers of two, e.g. low=2**10 high=2**14 (or write it as a plain int in train.py)")
        param = Param(name, "pow2", low.bit_length() - 1, high.bit_length() - 1) if pow2 else \
            Param(name, "int" if isinstance(current, int) else "float", low, high, "log" in fields)
    if param.internal(current) is None:
        widen = f"add {current!r} to its choices" if param.kind == "choice" else "widen the range"
        raise SetupError(f"search space entry {entry!r}: train.py's {name} = {current!r} is outside it (or of "
                         f"another type): {widen}, or change and commit train.py")
    return param


def space_of(train_src, profile, program):
    """{name: Param}: program.md's `## Search space` when it has one (only the constants it names), else every
    constant of the branch that runs with a range derived from its value (default_param). Raises SetupError on a bad
    entry; {} when train.py does not parse."""
    try:
        consts = constants(train_src, profile)
    except SyntaxError:
        return {}
    entries = space_section(program)
    if entries is None:
        return {c.name: p for c in consts.values() if (p := default_param(c)) is not None}
    if not entries:
        raise SetupError(f"program.md's {SPACE_HEADING} section names no parameter: add `- NAME: low=.. high=..` "
                         "bullets, or remove the heading to search every constant")
    space = {}
    for entry in entries:
        param = parse_entry(entry, consts)
        if param.name in space:
            raise SetupError(f"search space entry {entry!r}: {param.name} is named twice; keep one")
        space[param.name] = param
    return space


def values_of(space, source, profile):
    """{name: the study's value} of the space's constants in a train.py (those missing or outside their range are
    left out); {} when it does not parse."""
    try:
        consts = constants(source, profile)
    except SyntaxError:
        return {}
    found = {}
    for name, param in space.items():
        if name in consts and (x := param.internal(consts[name].value)) is not None:
            found[name] = x
    return found


def write_point(source, profile, space, point, label):
    """(answer, written values): the answer in the LLM's format that sets train.py's constants to point's values
    (floats written to LITERAL_DIGITS significant digits), one constant per changed line, described as
    `<label>: NAME old -> new, ...` (the DESCRIBED largest changes, then `+N more`: a row's description is short and
    the commit's diff has them all); written holds the study's values of what train.py then says. Constants the
    source lacks are skipped."""
    consts, lines = constants(source, profile), source.splitlines(keepends=True)
    changes = []
    for name, x in point.items():
        if name not in consts:
            continue
        c, value = consts[name], space[name].external(x)
        text = format_literal(value, c)
        raw = lines[c.line].encode()
        old = raw[c.span[0]:c.span[1]].decode()
        if text != old:
            lines[c.line] = (raw[:c.span[0]] + text.encode() + raw[c.span[1]:]).decode()
            changes.append((-shift(space[name], consts[name].value, x), f"{name} {old} -> {text}"))
    new = "".join(lines)
    shown = [words for _, words in sorted(changes, key=lambda c: c[0])[:DESCRIBED]]
    more = f", +{len(changes) - DESCRIBED} more" if len(changes) > DESCRIBED else ""
    description = f"{label}: " + (", ".join(shown) + more if shown else "no change")
    return answer_for(description, source, new), values_of(space, new, profile)


def shift(param, old, x):
    """How far a point moves a constant, as a share of its range (on the range's own scale; a choice: 1)."""
    if param.kind == "choice" or (was := param.internal(old)) is None:
        return 1.0
    if param.log:
        return abs(math.log(x / was)) / math.log(param.high / param.low)
    return abs(x - was) / (param.high - param.low)


def format_literal(value, c):
    """A value as train.py writes it: `2**k` where the constant was written so, a quoted string, an int, or a float
    with LITERAL_DIGITS significant digits (always with a `.` or an exponent)."""
    if isinstance(value, str):
        return json.dumps(value)
    if c.written == "pow2" and value > 0 and value & (value - 1) == 0:
        return f"2**{value.bit_length() - 1}"
    if isinstance(value, int):
        return str(value)
    text = f"{value:.{LITERAL_DIGITS}g}"
    return text if any(ch in text for ch in ".en") else text + ".0"


def sampler_for(name, seed):
    """The Optuna sampler of --proposer name (tpe | cmaes | random), seeded. TPE: multivariate, with the constant
    liar for points still running, modelling from TPE_STARTUP finished trials on. CMA-ES: its mean starts
    at the centre of the space (for a derived space, on a log scale: the tag's start values), its categorical
    parameters drawn by a seeded random sampler."""
    import optuna
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                          n_startup_trials=TPE_STARTUP)
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
        base = file_at(s.repo, start, s.train_rel)
        space = space_of(base, s.profile, read(s))
        s.search = Search(space, None)
        open_study(s)
    return s.search


def open_study(s):
    """Load <harness dir>/study.db and bring it up to date with the recorded experiments; rebuild it (the old file
    kept as study.db.bad-<time>) when it cannot be read, its space changed or it disagrees with events.jsonl. A
    study that cannot be made at all leaves the search without one: a warning, never a crash."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ledger.route_library_logs()         # optuna's own terminal handler, put there by its import: off
    path, search = s.home / STUDY_DB, s.search
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
    say(s, f"the search's study {s.home / STUDY_DB} cannot be used ({root_words(e)}); this run goes on with a study in memory rebuilt from the {len(s.history)} recorded experiments, and "
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
                                direction="minimize" if s.goal == "min" else "maximize")
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
        state, value = outcome_of(e)
        if state != t.state or value is not None and not math.isclose(t.value, value, rel_tol=1e-9, abs_tol=1e-12):
            return f"disagrees with events.jsonl on experiment #{n}"
    return None


def catch_up(s):
    """Tell the study of the recorded experiments it lacks (a kill between the event and the tell, a rebuild, an
    older tag), and close the points an earlier invocation asked for and never ran (failed, marked abandoned)."""
    import optuna
    study = s.search.study
    told = {t.user_attrs.get("n") for t in study.get_trials(deepcopy=False)}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
    trials = [trial_of(s, e) for e in s.history if e["n"] not in told]
    study.add_trials([t for t in trials if t is not None])


def outcome_of(event):
    """(Optuna TrialState, value) of a recorded experiment: COMPLETE with its metric; FAIL for a crash and for one
    the environment left not judged (Kind.measured false: its point may be measured again); PRUNED for a run cancelled
    early (harness.judge.curves: its curve was behind the best's), with no value."""
    import optuna
    if event.get("cancelled"):
        return optuna.trial.TrialState.PRUNED, None
    if event["status"] == "crash" or not Kind.of(event).measured:
        return optuna.trial.TrialState.FAIL, None
    return optuna.trial.TrialState.COMPLETE, event["metric"]


def trial_of(s, event, values=None):
    """The finished Optuna trial of a recorded experiment: its constants' values (from its commit's train.py unless
    given), its metric, or failed for a crash; None when its train.py cannot be read."""
    import optuna
    if values is None:
        if event["n"] in s.unreadable:
            return None
        try:
            values = values_of(s.search.space, file_at(s.repo, event["full_commit"], s.train_rel), s.profile)
        except (GitError, SetupError, ValueError):
            return None
    state, value = outcome_of(event)
    return optuna.trial.create_trial(
        state=state, value=value, params=values,
        distributions={k: s.search.space[k].distribution() for k in values},
        user_attrs={"n": event["n"], "by": who(event)})


def suggest(s, name, source, n, attempt=0):
    """The sampler's next point for experiment n (attempt > 0: the last one was refused, e.g. already measured; that
    trial is closed as failed first), as (answer, point): an edit of best train.py `source` setting the constants of
    the space that it still has. Raises SetupError when the search has nothing to search (no constants, no study)."""
    import optuna
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
    present = constants(source, s.profile)
    for gone in sorted(set(search.space) - set(present) - search.gone):
        search.gone.add(gone)
        say(s, f"the search continues without {gone}: the best train.py no longer defines it (a code edit removed "
               "or renamed it)")
    now = values_of(search.space, source, s.profile)
    seen = [now] + [t.params for t in search.study.get_trials(deepcopy=False) if "n" in t.user_attrs] + \
        [w for w, _ in search.pending]
    for tries in range(EXHAUSTED):      # a point the best has, or one measured or waiting: the sampler asked again
        draw = f"{s.settings.seed}:{s.settings.tag}:{n}:{attempt}" + (f":{tries}" if tries else "")
        seed = random.Random(draw).randrange(2**31)
        search.study.sampler = sampler_for(name, seed)
        trial = search.study.ask({k: p.distribution() for k, p in search.space.items() if k in present})
        answer, written = write_point(source, s.profile, search.space, trial.params, name)
        if written not in seen:
            search.pending.append((written, trial))
            search.asked[n] = trial
            return answer, trial.params
        search.study.tell(trial, state=optuna.trial.TrialState.FAIL)
    raise Stop(f"the search space is exhausted: {name} drew {EXHAUSTED} points in a row that are already measured or "
               f"running. Widen the ranges in program.md's {SPACE_HEADING}, or use an LLM proposer")


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
    proposer.profile = s.profile
    if a.chosen:
        console.say(a.chosen)
    if a.proposer in SAMPLERS:
        proposer.suggest = lambda source, n, attempt: suggest(s, a.proposer, source, n, attempt)[0]
    if a.proposer not in (*SAMPLERS, "grid", "hybrid"):
        return
    search = of(s)
    if not search.space and a.proposer != "grid" and parses(file_at(s.repo, s.best_commit, s.train_rel)):
        raise SetupError(f"--proposer {a.proposer}: train.py has no UPPER_CASE constant to search in the branch that "
                         "runs (docs/search.md); use an LLM proposer, or name parameters in program.md's "
                         f"{SPACE_HEADING}")
    name = a.sampler if a.proposer == "hybrid" else a.proposer
    named = space_section(read(s)) is not None
    proposer.names = set(search.space) if named else None      # grid sweeps only what program.md names
    where = f"program.md's {SPACE_HEADING}" if named else "ranges from their values"
    console.say(f"search: {name} over {len(search.space)} constants of train.py ({where}; docs/search.md): "
                f"{', '.join(search.space)}; study {s.home / STUDY_DB}")


def tell(s, event):
    """Tell the study of a recorded experiment: the point asked for it when its train.py says exactly that point,
    else (an LLM's or a human's edit, an override, a point re-applied elsewhere) an added trial of what its train.py
    says. A study that fails here is dropped for this invocation with a warning (rebuilt on the next start)."""
    if s.search is None or s.search.study is None:
        return
    search = s.search
    try:
        values = values_of(search.space, file_at(s.repo, event["full_commit"], s.train_rel), s.profile)
        match = next((t for w, t in search.pending if w == values), None)
        if match is not None:
            search.pending = [(w, t) for w, t in search.pending if t is not match]
            match.set_user_attr("n", event["n"])
            match.set_user_attr("by", who(event))
            state, value = outcome_of(event)
            search.study.tell(match, value, state=state)
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
        best = min(done, key=lambda t: t.value) if s.goal == "min" else max(done, key=lambda t: t.value)
        lines.append(f"Best point so far (#{best.user_attrs['n']}, {metric} {best.value:.6f}): "
                     f"{shown(search.space, best.params)}")
    for t in trials[-limit:]:
        delta = f"{t.value:.6f} ({t.value - base:+.6f} vs baseline)" if t.value is not None and base is not None \
            else "cancelled early" if t.state.name == "PRUNED" else "crash"
        lines.append(f"#{t.user_attrs['n']} by {t.user_attrs.get('by', '?')}: {delta}: {shown(search.space, t.params)}")
    return "\n".join(lines)


def shown(space, params):
    """A point as train.py's values, `NAME=value` separated by commas."""
    return ", ".join(f"{k}={space[k].external(v) if k in space else v:.4g}" if isinstance(v, float) else
                     f"{k}={space[k].external(v) if k in space else v}" for k, v in params.items())


def read(s):
    """program.md's text as it is now (the human may edit it while the loop runs)."""
    return (s.target / "program.md").read_text(encoding="utf-8", errors="replace")


def say(s, text):
    """A search message: printed and logged as a warning event."""
    console.say(f"search: {text}")
    s.log(Event.WARNING, where="search", reason=text)
