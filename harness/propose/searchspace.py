"""
HARNESS: the search space over train.py's UPPER_CASE constants: derived from their values at the tag's start in the
`if PROFILE == ...` branch that runs (a rate log-uniform around its value, a power of two by doublings, a share on
[0, 1], ...), or read from program.md's `## Search space`; a point's values read from a train.py and written into one
as an edit of those constants only. Pure text in, text out: the study that samples it is harness.propose.search.
"""

import ast
import dataclasses
import json
import math
import re

from harness.errors import SetupError
from harness.propose.edits import answer_for
from harness.propose.perturb import active_statements

SPACE_HEADING = "## Search space"
LOG_SPAN = 3.0                  # a rate or coefficient v: log-uniform on [v / 3, 3 v]
INT_SPAN = 2.0                  # an int v: [ceil(v / 2), 2 v], integer steps
POW2_STEPS = 1                  # a power of two 2**k: 2**(k - 1) .. 2**(k + 1) (a model's width, a head's size) ...
BATCH_STEPS = 2                 # ... a *BATCH* size: 2**(k - 2) .. 2**(k + 2)
POW2_MIN = 16                   # an int power of two from 16 up is searched as one (DEPTH = 4 takes integer steps)
SHARE_HIGH = 0.5                # a *_RATIO / *_FRAC at 0: [0, 0.5]; at v > 0: [0, min(1, 2 v)]
PATTERNS = ("L", "SL", "SSL", "SSSL", "SSLL")   # choices of a string of S and L (a window pattern)
SKIPPED = re.compile(r"EVAL|SEED|THREADS|PROFILE|DEVICE")  # evaluation, plumbing and per-device memory constants
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
