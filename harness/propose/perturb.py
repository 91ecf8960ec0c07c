"""
HARNESS: the grid sweep, and the `if PROFILE == ...` branch of train.py that runs. `grid` moves one UPPER_CASE numeric
constant one step from the best, each in turn, and answers in the LLM's own format, so its answers take the same path
through edits.apply_answer (the samplers, harness.propose.search, read the same branch). Pure text in, text out: never
touches files, git or the ledger.
"""

import ast
import re

from harness.errors import Stop

def profile_branch(node, profile):
    """The statements of `if PROFILE == "a": ... elif PROFILE == "b": ... else: ...` that run for profile,
    or None when node is not such a chain (prepare.py --check reports the profile; see open_session)."""
    while True:
        test = node.test
        if not (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "PROFILE"
                and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
                and isinstance(test.comparators[0], ast.Constant) and isinstance(test.comparators[0].value, str)):
            return None
        if test.comparators[0].value == profile:
            return node.body
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
            node = node.orelse[0]
            continue
        return node.orelse


def active_statements(body, profile):
    """Module-level statements, with `if PROFILE == ...` chains replaced by the branch that runs for profile."""
    for node in body:
        branch = profile_branch(node, profile) if isinstance(node, ast.If) and profile else None
        yield from (active_statements(branch, profile) if branch is not None else [node])


def numeric_constants(source, profile=None):
    """`NAME = <number>` assignments of train.py that can be perturbed: at module level, or in the branch of an
    `if PROFILE == "<name>":` chain that runs for profile (the device class prepare.py prepared for).

    Returns a list of (name, snippet, (start, end), value, kind): snippet is the assignment's line, preceded by
    as many lines as make it unique in the file; start:end the UTF-8 byte span of the literal in its last line;
    kind one of "int", "pow2" (written as 2**k), "float". bools, strings, zeros, negative numbers and computed
    values are left alone."""
    lines = source.splitlines(keepends=True)
    found = []
    for node in active_statements(ast.parse(source).body, profile):
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if not (isinstance(target, ast.Name) and re.fullmatch(r"[A-Z][A-Z0-9_]*", target.id) and value is not None):
            continue
        if node.lineno != node.end_lineno:
            continue
        if isinstance(value, ast.Constant) and type(value.value) in (int, float) and value.value > 0:
            number, kind = value.value, type(value.value).__name__
        elif (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Pow)
              and all(isinstance(v, ast.Constant) and type(v.value) is int for v in (value.left, value.right))
              and value.left.value == 2 and value.right.value >= 0):
            number, kind = value.right.value, "pow2"
        else:
            continue
        first = node.lineno - 1  # widen upwards until the snippet occurs once (e.g. HEAD_DIM in two branches)
        while first > 0 and source.count("".join(lines[first:node.lineno])) != 1:
            first -= 1
        snippet = "".join(lines[first:node.lineno])
        if source.count(snippet) != 1:
            continue
        found.append((target.id, snippet, (value.col_offset, value.end_col_offset), number, kind))
    return found


def moves(number, kind):
    """The grid's two single steps (down, up) of one constant, as literal texts: powers of two stay powers of two,
    ints stay ints (>= 1), floats are halved and doubled (values in (0.5, 1) scale their distance to 1, so betas and
    ratios stay below 1)."""
    if kind == "pow2":
        return [f"2**{k}" for k in (number - 1, number + 1) if k >= 0]
    if kind == "int":
        candidates = [number // 2, number * 2] if number & (number - 1) == 0 else \
            [max(1, round(number * f)) for f in (0.75, 1.25)]
        return list(dict.fromkeys(str(c) for c in candidates if c >= 1 and c != number))
    factors = (0.5, 2.0)
    if 0.5 < number < 1:
        candidates = [1 - (1 - number) * f for f in factors]
    else:
        candidates = [number * f for f in factors]
    texts = []
    for c in candidates:
        text = f"{c:.4g}"
        text = text if any(ch in text for ch in ".e") else text + ".0"
        if float(text) != number and text not in texts:
            texts.append(text)
    return texts


def grid(train_src, n, profile=None, attempt=0, names=None):
    """The grid proposer: an answer in the LLM's format changing one UPPER_CASE constant: the (n-1)-th single step of
    a sweep over every constant, down then up. attempt > 0 (a repair: the first answer was refused, e.g. as a
    duplicate of an experiment already measured) takes the next step of the sweep. profile selects the
    `if PROFILE == ...` branch (see numeric_constants); names, when given, the constants it may move (program.md's
    `## Search space`). Raises Stop when train.py has no constant to move; returns ""
    (no idea) when it does not parse (its own run crashes and says why: the baseline's stops the loop)."""
    try:
        found = [c for c in numeric_constants(train_src, profile) if names is None or c[0] in names]
    except SyntaxError:
        return ""
    options = [(name, line, span, new) for name, line, span, number, kind in found for new in moves(number, kind)]
    if not options:
        raise Stop("train.py has no module-level UPPER_CASE numeric constants (e.g. `LR = 0.04`) for --proposer grid "
                   "to move; use an LLM proposer")
    name, line, (start, end), new = options[(n - 1 + attempt) % len(options)]
    context, last = line[:line.rstrip("\n").rfind("\n") + 1], line[line.rstrip("\n").rfind("\n") + 1:]
    raw = last.encode()
    old, replaced = raw[start:end].decode(), context + (raw[:start] + new.encode() + raw[end:]).decode()
    return (f"DESCRIPTION: grid: {name} {old} -> {new}\n"
            f"<<<<<<< SEARCH\n{line}=======\n{replaced}>>>>>>> REPLACE\n")

