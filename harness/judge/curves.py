"""
HARNESS: learning curves and the early-cancel rule, the one place that rule exists. A run's curve is read from the
progress lines train.py prints while it trains (program.md's contract: `step N (P%) | loss: L | lrm: M | ... |
tok/s: T`), kept beside its log as <log stem>.curve.json, and compared with the curves of the best it was built on
(or the baseline's: which curves are evidence, below): a candidate whose loss at the same point of the same schedule
is clearly behind is stopped early (a discard).

The rule (issue 23; the pruning idea of Optuna's MedianPruner and PatientPruner, held to the same progress fraction
because the learning-rate schedule is a function of the budget's progress, so curves cross and a cut run is not a
prefix of a full one): from WARMUP of the budget on, at checkpoints every STEP of progress, the candidate's loss at
progress p is compared with the best's run at the same seed (the same init and data order: the paired verdict's
pairing; threshold K x sd x sqrt(2)), or without one with the mean of the best's m runs at p (K x sd x sqrt(1 +
1/m)); it is cancelled when it is worse by more than that at CONSECUTIVE checkpoints in a row. The noise sd at p is
the sd of the baseline's runs at p (different seeds), never below their sd pooled over all checkpoints. Never cancelled:
the baseline, further runs of a candidate, re-runs of the best, a tag with fewer than MIN_BASELINE baseline curves,
a candidate that changes the schedule (a constant named like SCHEDULE differs from the best's, or its printed lrm
differs from the best's at the same progress) or what its printed loss measures (a line mentioning the loss,
dropout or smoothing differs: exempt), a run whose speed probe differs from the best's, a train.py that prints no
progress lines.

Which curves are evidence (issue 35; `yardstick`): a printed curve is what train.py chose to print, so one is compared
only where the human's code printed it. A train.py is trusted when its source differs from experiment 0's (the tag's
original, human-written train.py) in nothing but lines that assign an UPPER_CASE constant a plain literal (numbers and
arithmetic on them like `2**19` or `-1e-3`, strings (not f-strings), True/False/None, tuples and lists of those; no name
on the right: `X = DEPTH * 2` is code), comments and blank lines aside, as Python's tokenizer reads it (a comment inside
a string is string): with only literal constants changed, what the printed loss measures is what the human's code
prints. A kept train.py with code of its own could print its loss minus an offset for as long as the constants a
successor would change keep their values, or its successors' plus one, and so have every successor cancelled however
good (a lock-in). So: nothing is watched unless this hardware epoch's baseline is trusted (its curves give the noise); a
trusted best's curves are the yardstick (the rule as above); when the best is not trusted its code is inherited by the
candidate, which is then watched only when its own train.py is trusted (it dropped that code), against the baseline's
curves (its run at the candidate's seed, or their mean). A candidate's own changes print only its own curve: `exempt`
keeps them from a comparison that would not be like with like.
"""

import dataclasses
import io
import itertools
import json
import math
import re
import statistics
import tokenize
import typing
from pathlib import Path

from harness import files

WARMUP = 0.7                # share of the budget before the first checkpoint (issue 23 proposed 0.5; at 0.5 the
#                             benchmark's replay cancelled a near-miss: docs/benchmarks.md#early-cancellation)
K = 3.0                     # noise sds behind the best's mean that count as behind (issue 23's default)
CONSECUTIVE = 2             # checkpoints in a row behind before a cancel
STEP = 0.05                 # a checkpoint every 5 % of the budget from WARMUP on
MIN_BASELINE = 3            # baseline curves needed to know the noise at all (agent.py's default --baseline-runs)
LRM_TOLERANCE = 0.02        # printed lrm differing by more than this at the same progress: another schedule
MAX_POINTS = 4096           # a curve longer than this drops every other point (a flood of lines)
MAX_READ = 1 << 20          # bytes of a growing log read per look; a flood beyond it is skipped
MAX_LINE = 1000             # a longer line is not a progress line
MAX_LOSS = 1e4              # a printed loss beyond this, or an lrm outside 0..MAX_LRM, is not believed (ignored)
MAX_LRM = 100.0
SCHEDULE = re.compile(r"WARMUP|WARMDOWN|COOLDOWN|FINAL_LR|LR_FRAC|SCHEDULE|TIME_BUDGET|DECAY_STEPS")
LINE = re.compile(r"step\s+(\d+)\s+\(\s*([-+\d.eE]+|nan|inf)\s*%\)\s*\|\s*loss:?\s*([-+\d.eEnaif]+)(.*)",
                  re.IGNORECASE)
LRM = re.compile(r"\|\s*lrm:?\s*([-+\d.eE]+)")
TOKENS = re.compile(r"\|\s*tok(?:ens)?/s(?:ec)?:?\s*([\d,]+(?:\.\d+)?)")
LOSS_LINE = re.compile(r"loss|dropout|smooth", re.IGNORECASE)   # a changed line with these: another printed loss
ASSIGN = re.compile(r"\s*([A-Z][A-Z0-9_]*)\s*(?::[^=]*)?=(?!=)(.*)")
CONSTANT_NAME = re.compile(r"[A-Z][A-Z0-9_]*")     # an UPPER_CASE constant (an annotation after it is code)
LITERAL_OPS = {"(", ")", "[", "]", ",", "+", "-", "*", "/", "//", "**", "%"}     # what a plain literal may hold
CODING = re.compile(r"[ \t\f]*#.*?coding[:=]")   # PEP 263's encoding cookie: utf-7 hides code in comments
ROW = re.compile(r"\(cancelled at (\d+)%\)$")      # how a results.tsv row of a cancelled run ends


@dataclasses.dataclass
class Point:
    """One progress line: progress (0..1 of the budget), the loss train.py printed (the real one prints a debiased
    EMA of the train loss), the learning-rate multiplier (None: not printed) and tokens/s (None: not printed)."""
    progress: float
    loss: float
    lrm: float | None = None
    tokens_per_sec: float | None = None


class Curve:
    """A run's curve, fed the log's text as it grows (feed); points only move forward: a line whose progress is not
    above the last point's, outside 0..100 %, or whose loss is not finite is ignored."""

    def __init__(self, points=()):
        self.points, self.rest = [], ""
        for q in points:
            self.add(q)

    def feed(self, text):
        """Read the complete lines of text (the part of a line still being written waits for the next call)."""
        lines = (self.rest + text).split("\n")
        self.rest = lines.pop()[-MAX_LINE:]
        for line in lines:
            if len(line) <= MAX_LINE:
                self.add_line(line.replace("\r", ""))

    def add_line(self, line):
        found = LINE.search(line)
        if not found:
            return
        try:
            progress, loss = float(found[2]) / 100, float(found[3])
        except (ValueError, OverflowError):
            return
        lrm, tokens = LRM.search(found[4]), TOKENS.search(found[4])
        self.add(Point(progress, loss, number(lrm[1]) if lrm else None,
                       number(tokens[1].replace(",", "")) if tokens else None))

    def add(self, q):
        """Append point q unless it is not believable: progress not above the last point's or outside 0..1, a loss
        not finite or beyond MAX_LOSS, an lrm outside 0..MAX_LRM (dropped: not printed)."""
        if not (math.isfinite(q.progress) and 0.0 <= q.progress <= 1.0 and math.isfinite(q.loss)
                and abs(q.loss) <= MAX_LOSS):
            return
        if self.points and q.progress <= self.points[-1].progress:
            return
        if q.lrm is not None and not 0.0 <= q.lrm <= MAX_LRM:
            q = dataclasses.replace(q, lrm=None)
        self.points.append(q)
        if len(self.points) > MAX_POINTS:
            self.points = self.points[::2]

    def at(self, p, field="loss"):
        """The value of field at progress p, linear between the points around it; None beyond the last point, before
        the first, or where the field was not printed."""
        for a, b in zip(self.points, self.points[1:]):
            if a.progress <= p <= b.progress:
                va, vb = getattr(a, field), getattr(b, field)
                if va is None or vb is None:
                    return None
                return va + (vb - va) * (p - a.progress) / (b.progress - a.progress)
        if len(self.points) == 1 and self.points[0].progress == p:
            return getattr(self.points[0], field)
        return None

    def until(self, p):
        """[[progress, loss], ...] up to progress p (for the cancel event)."""
        return [[round(q.progress, 4), round(q.loss, 5)] for q in self.points if q.progress <= p]

    def to_json(self):
        return json.dumps({"points": [[q.progress, q.loss, q.lrm, q.tokens_per_sec] for q in self.points]})


def of_log(log):
    """The curve in a whole log (the part of it the log-size cap kept); an empty Curve when it cannot be read."""
    curve = Curve()
    try:
        curve.feed(Path(log).read_bytes().decode("utf-8", "replace") + "\n")
    except OSError:
        pass
    return curve


@dataclasses.dataclass
class Watcher:
    """What a candidate's first run is held to while it trains: the yardstick's curves (the best's, or the
    baseline's: see yardstick), the baseline's, k and warmup (see decide). Plain data: it travels to a Ray worker in
    the payload, and the rule runs where the log is."""
    best: list
    baseline: list
    k: float = K
    warmup: float = WARMUP
    probe_s: float | None = None        # the yardstick's speed probe (harness.run.conditions): a run probed otherwise is
    #                                     not watched (its steps per share of the budget differ)
    paired: object = None               # the yardstick's Curve at the candidate's seed, when it has run there
    yardstick: str = "best"             # whose curves `best` and `paired` are: "best" or "baseline" (see yardstick)
    rule: str = "behind"                # the name of the CancelRule in RULES that decides (looked up where it runs)

    def live(self, log):
        """A look at log as it grows: call it about once a second; it returns a Cancel once the rule says so (never
        raises: a curve the rule cannot judge, or a rule this process lacks, stops being watched)."""
        curve, offset, broken = Curve(), 0, self.rule not in RULES

        def look():
            nonlocal offset, broken
            before, offset = len(curve.points), read_log(log, curve, offset)
            if broken or len(curve.points) == before:
                return None
            try:
                return RULES[self.rule].decide(curve, self)
            except Exception:  # noqa: BLE001  (inf and nan in a kept curve break statistics in several ways)
                broken = True
                return None
        return look


IDLE_POINTS = 3        # a curve says a run did not train only from this many progress points on


def idle(curve):
    """Words when a run's curve says it did not train, else "": its learning-rate multiplier 0 at every point (the
    schedule, not the model, took the budget), or its loss never moved (to 1e-6 of its size). Needs IDLE_POINTS."""
    points = curve.points if curve is not None else []
    if len(points) < IDLE_POINTS:
        return ""
    if all(q.lrm == 0 for q in points):
        return "did not train: its learning-rate multiplier was 0 throughout"
    losses = [q.loss for q in points]
    if max(losses) - min(losses) <= 1e-6 * max(1.0, abs(losses[0])):
        return f"did not train: its loss stayed at {losses[0]:g} throughout"
    return ""


def number(text):
    """float(text), None when it is not a finite number."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def path_of(log):
    """Where a run's curve is kept: beside its log, `0007-0.log` -> `0007-0.curve.json`."""
    return Path(log).with_suffix(".curve.json")


def save(curve, log):
    """Write curve beside log (nothing for a run that printed no progress line); a link planted at its name is
    replaced, never written through (files.write_atomic)."""
    if curve.points:
        files.write_atomic(path_of(log), curve.to_json())


def load(log):
    """The curve kept beside log; None when there is none or it cannot be read."""
    try:
        points = json.loads(path_of(log).read_text())["points"]
        return Curve(Point(*map(float_or_none, q)) for q in points)
    except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError):
        return None


def float_or_none(value):
    return None if value is None else float(value)


def read_log(log, curve, offset):
    """Feed curve what log gained since byte offset; returns the new offset. At most MAX_READ bytes: a flood beyond
    it is skipped (its partial first line dropped)."""
    try:
        with open(log, "rb") as f:
            size = f.seek(0, 2)
            if size - offset > MAX_READ:
                offset, curve.rest = size - MAX_READ, ""
                f.seek(offset)
                f.readline()
            else:
                f.seek(offset)
            data = f.read(MAX_READ)
            curve.feed(data.decode("utf-8", "replace"))
            return f.tell()
    except OSError:
        return offset


def checkpoints(warmup=WARMUP):
    """The progress fractions the rule looks at: warmup, warmup + STEP, ... up to 1."""
    return [round(warmup + i * STEP, 6) for i in range(int(round((1.0 - warmup) / STEP)) + 1)]


@dataclasses.dataclass
class Cancel:
    """A cancel decision: at progress `at`, the candidate's loss, the yardstick's loss there (`best`: the name events
    have always used; the baseline's when yardstick says so), the noise sd and k used."""
    at: float
    loss: float
    best: float
    sd: float
    k: float
    yardstick: str = "best"             # events before issue 35 have none: the best's
    rule: str = "behind"                # the CancelRule that decided (events before the registry have none: behind)

    @property
    def percent(self):
        return round(100 * self.at)

    def words(self):
        """What the LLM's history and the console say: the deciding rule's why (a rule this version lacks: the
        numbers alone)."""
        head = f"cancelled at {self.percent}%: loss {self.loss:.4f} vs the {self.yardstick}'s {self.best:.4f}"
        rule = RULES.get(self.rule)
        return f"{head} at the same point ({rule.why(self)})" if rule else f"{head} (rule {self.rule})"

    def fields(self):
        found = {"at": self.at, "loss": round(self.loss, 6), "best": round(self.best, 6), "sd": round(self.sd, 6),
                 "k": self.k, "yardstick": self.yardstick}
        return found if self.rule == DEFAULT else found | {"rule": self.rule}


def noise(baseline, ps):
    """{p: sd of the baseline's curves at p} where at least MIN_BASELINE have a value, and their pooled sd (root mean
    square of those; None when there is none)."""
    sds = {}
    for p in ps:
        values = [v for c in baseline if (v := c.at(p)) is not None]
        if len(values) >= MIN_BASELINE:
            sds[p] = statistics.stdev(values)
    pooled = math.sqrt(statistics.fmean(v * v for v in sds.values())) if sds else None
    return sds, pooled


def decide(candidate, best, baseline, k=K, warmup=WARMUP, paired=None, yardstick="best"):
    """The rule on what is known of a candidate's curve: the first CONSECUTIVE checkpoints in a row where its loss is
    more than k noise sds above the best's (see the module's text). candidate: a Curve; best, baseline: lists of
    Curves (the best's measured runs; the baseline's); paired: the best's run at the candidate's seed (the same init
    and data order), when there is one: then the reference at p is that run's loss and the threshold k x sd x
    sqrt(2) (two single runs, their correlation not counted on), else the mean of best and k x sd x sqrt(1 + 1/m).
    Returns a Cancel, or None (not behind, not yet known, or exempt: fewer than MIN_BASELINE baseline curves, no best
    curve, another lrm at the same progress, no noise measured). yardstick: whose curves best and paired are (the
    Cancel's words name it). The same answer live and replayed on a recorded curve up to the same point."""
    if len(baseline) < MIN_BASELINE or not best:
        return None
    ps = checkpoints(warmup)
    sds, pooled = noise(baseline, ps)
    streak = 0
    for p in ps:
        loss = candidate.at(p)
        if loss is None:
            return None
        bests = [v for c in best if (v := c.at(p)) is not None]
        if other_schedule(candidate, best, p):
            return None
        if not bests or p not in sds:
            streak = 0
            continue
        same = paired.at(p) if paired is not None else None
        reference = same if same is not None else statistics.fmean(bests)
        sd = max(sds[p], pooled) * math.sqrt(2 if same is not None else 1 + 1 / len(bests))
        if sd > 0 and loss > reference + k * sd:
            streak += 1
            if streak >= CONSECUTIVE:
                return Cancel(p, loss, reference, sd, k, yardstick)
        else:
            streak = 0
    return None


class CancelRule(typing.Protocol):
    """A rule that stops a candidate's first run early (Optuna's pruner: one method). It runs where the log is (a Ray
    worker, a node), so it is found there by its name in RULES and reads only the Watcher (plain data)."""

    def decide(self, candidate, watcher):
        """candidate: the Curve seen so far; watcher: the Watcher (the yardstick's curves, the baseline's, k, warmup,
        paired). Returns a Cancel (its rule: this rule's name) or None; the same answer live and replayed on a
        recorded curve up to the same point. May raise on a curve it cannot judge: the run is then not watched."""

    def why(self, cancel):
        """The reason in a cancel's words (the LLM's history, the console), in the brackets after "at the same
        point"."""

    def words(self):
        """The rule in one sentence: --cancel's help and docs."""


class Behind:
    """The rule in the module's text (issue 23): behind by more than k noise sds at CONSECUTIVE checkpoints."""

    def decide(self, candidate, w):
        return decide(candidate, w.best, w.baseline, w.k, w.warmup, w.paired, w.yardstick)

    def why(self, cancel):
        return f"more than {cancel.k:g} x the noise sd {cancel.sd:.4f} behind at {CONSECUTIVE} checkpoints in a row"

    def words(self):
        return (f"stop a candidate's first run early, a discard, when its loss at the same progress is more than "
                f"{K:g} noise sds behind the best's at {CONSECUTIVE} checkpoints in a row from {100 * WARMUP:g} % of "
                "the budget")


RULES = {"behind": Behind()}    # name -> CancelRule (--cancel's choices besides on and off)
DEFAULT = "behind"              # what --cancel on means


def rule_name(setting):
    """The CancelRule's name for a --cancel setting: "on" is DEFAULT, "off" None, a name in RULES itself."""
    return None if setting == "off" else DEFAULT if setting == "on" else setting


def other_schedule(candidate, best, p):
    """Whether the candidate's printed lrm differs from the best's mean by more than LRM_TOLERANCE at any STEP of
    progress up to p (a warmup that changed shows before the first checkpoint); where neither printed it: the same,
    as far as can be measured."""
    for q in [round(i * STEP, 6) for i in range(1, int(p / STEP + 1e-9) + 1)] + [p]:
        mine = candidate.at(q, "lrm")
        theirs = [v for c in best if (v := c.at(q, "lrm")) is not None]
        if mine is not None and theirs and abs(mine - statistics.fmean(theirs)) > LRM_TOLERANCE:
            return True
    return False


def exempt(candidate, best):
    """Why a candidate's train.py (source text) may not be compared with the best's by its curve, or None: a constant
    of the schedule (SCHEDULE) assigned differently, or a line that computes or prints the loss (LOSS_LINE) changed.
    Lines compared as written, comments aside, in any profile's branch: a regex, safe in the device threads, where
    CPython 3.11's ast is not."""
    if changed := schedule_changed(candidate, best):
        return f"it changes the schedule ({', '.join(changed)})"
    if loss_lines(candidate) != loss_lines(best):
        return "it changes a line that computes or prints the loss"
    return None


def loss_lines(source):
    return [line.split("#")[0].strip() for line in source.splitlines() if LOSS_LINE.search(line.split("#")[0])]


def schedule_changed(candidate, best):
    """The names of the schedule's constants (SCHEDULE) assigned differently in two train.py sources (each line
    `NAME = ...` compared as written, comments aside); [] when none is."""
    def assigned(source):
        found = {}
        for line in source.splitlines():
            if (m := ASSIGN.match(line)) and SCHEDULE.search(m[1]):
                found.setdefault(m[1], []).append(m[2].split("#")[0].strip())
        return found
    mine, theirs = assigned(candidate), assigned(best)
    return sorted(n for n in {*mine, *theirs} if mine.get(n) != theirs.get(n))


def yardstick(candidate, best, baseline, original):
    """Whose printed curves a candidate's first run may be held to, from the train.py sources of the candidate, the
    best it was built on, this hardware epoch's baseline and experiment 0 (the original): ("best", why),
    ("baseline", why) or (None, why: it is not watched). The rule is the module's text."""
    if why := untrusted(baseline, original):
        return None, f"this hardware's baseline's train.py {why}: its curves, the noise, are not evidence"
    if not (why := untrusted(best, original)):
        return "best", "the best's train.py is the original's code with other constants"
    if untrusted(candidate, original):
        return None, f"the best's train.py {why}, and the candidate inherits that code: its curve is not evidence"
    return "baseline", f"the best's train.py {why}; the candidate's is the original's code with other constants"


def untrusted(source, original):
    """Why a train.py (source text) is not the original's code with other constants (see the module's text), or ""
    when it is. The first statement that differs is named by its first line."""
    mine, theirs = code_lines(source), code_lines(original)
    if mine is None:
        return "cannot be read as Python"
    for (n, line), (m, other) in itertools.zip_longest(mine, theirs or [], fillvalue=(None, None)):
        if line != other:
            return f"differs from experiment 0's in code ({f'its line {n}' if n else f'it lacks line {m}'})"
    return ""


def code_lines(source):
    """[(first line number, tokens)] of a train.py's statements as the trust test compares them, read by Python's own
    tokenizer (pure Python, safe in the device threads): what a regex over lines took for a comment can be inside a
    string, where a `# \"\"\"` closes a docstring and runs the code after it (a hostile review). Comments, blank lines
    and line breaks inside a statement are left out; a statement that assigns an UPPER_CASE constant a plain literal
    (literal) is reduced to its indentation and name; an encoding cookie (CODING: utf-7 hides code in comments) is
    compared as a statement. None when the tokenizer cannot read it."""
    found, tokens, first = [], [], None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT and tok.start[0] <= 2 and CODING.match(tok.line):
                found.append((tok.start[0], (("cookie", tok.string),)))
            if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENDMARKER):
                continue
            first = first or tok.start[0]
            if tok.type != tokenize.NEWLINE:
                tokens.append((tok.type, "" if tok.type in (tokenize.INDENT, tokenize.DEDENT) else tok.string))
                continue
            found.append((first, reduced(tokens)))
            tokens, first = [], None
    except (tokenize.TokenError, SyntaxError, ValueError):
        return None
    return found + ([(first, reduced(tokens))] if tokens else [])


def reduced(tokens):
    """A statement's tokens, `NAME = <plain literal>` reduced to its indentation and `NAME =` (literal)."""
    body = [t for t in tokens if t[0] not in (tokenize.INDENT, tokenize.DEDENT)]
    if len(body) > 2 and body[0][0] == tokenize.NAME and CONSTANT_NAME.fullmatch(body[0][1]) and body[1][1] == "=" \
            and literal(body[2:]):
        return tuple(tokens[:len(tokens) - len(body) + 2])
    return tuple(tokens)


def literal(tokens):
    """Whether the tokens after `NAME =` are a plain literal: numbers, strings (no f-string: it runs code), True,
    False, None, brackets, commas and arithmetic operators; no name."""
    for kind, text in tokens:
        if kind == tokenize.STRING and "f" not in text.split(text[-1])[0].lower() or kind == tokenize.NUMBER:
            continue
        if kind == tokenize.NAME and text in ("True", "False", "None") or kind == tokenize.OP and text in LITERAL_OPS:
            continue
        return False
    return True
