"""
HARNESS: the search's memory. What a proposal changes (its moves: `DEPTH up`, `code: GPT.forward`; its families:
each constant, `code: attention`, ...), the tabu that refuses a repeat of a recent discard or crash (and a
near-duplicate of a measured diff, and a family the outer loop froze), and the UCB1 bandit over families that says
which family the next proposal should come from. Everything is computed from the tag's history and git, so a resume
restores it exactly. Pure reads: never proposes, never runs anything, never writes git or the ledger.

    change = change_of(best_train_py, proposed_train_py)   # Change(moves=("DEPTH up",), families=("DEPTH",), ...)
    refusal = refused(s, change)                           # None, or Refusal(words=..., repeats=n, rule="tabu")
    explore(s, k)                                          # k families for the next proposals (the bandit's picks)
"""

import ast
import dataclasses
import difflib
import math
import re

from harness import gitops
from harness.ledger import has_metric, is_baseline
from harness.run.runner import Kind


TENURE = 10                     # --tabu default: a discard's or crash's change is refused for the next 10 such
NEAR_DUPLICATE = 0.95           # difflib ratio of two normalised diffs at or above which one repeats the other
SHOWN = 8                       # families named in the prompt as the least explored
# Code families: the first whose keywords occur in the names of the functions/classes a changed line sits in (then in
# the line itself); a line outside every function is the training script's main loop.
CODE_FAMILIES = (
    ("attention", ("attn", "attention", "rotary", "rope", "apply_rotary", "qk", "kv", "window", "causal", "head")),
    ("optimizer", ("optim", "muon", "adam", "momentum", "weight_decay", "lr", "schedule", "grad", "step")),
    ("mlp", ("mlp", "ffn", "feedforward", "relu", "gelu", "swiglu", "activation")),
    ("norm", ("norm",)),
    ("embedding", ("embed", "wte", "lm_head", "vocab", "logit", "softcap", "value_embed")),
    ("init", ("init",)),
    ("data", ("loader", "batch", "token", "data")),
)
CODE_MAIN = "main loop"         # changed lines outside every function, matching no keyword
CONSTANT = re.compile(r"^\s*([A-Z][A-Z0-9_]*)\s*(?::[^=]*)?=(?!=)\s*(.*?)\s*(?:#.*)?$")
DEF = re.compile(r"^(\s*)(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)")


@dataclasses.dataclass(frozen=True)
class Change:
    """What an edit of train.py changes. moves: each constant with its direction (`LR up`, `LR down`, `WINDOW_PATTERN
    = 'SSLL'`, `DEPTH added`), each function or class whose code changed (`code: GPT.forward`) and each changed line
    outside them (`code: main loop: loss.backward()`: train.py's loop is module-level code); families: the
    constants and the code families (`code: attention`) the moves belong to; code: the changed lines, normalised
    (comments and spacing dropped), which near-duplicates are compared on."""
    moves: tuple = ()
    families: tuple = ()
    code: str = ""

    def words(self):
        """'LR up, code: GPT.forward' (or 'nothing' for an edit that changes no line)."""
        return ", ".join(self.moves) or "nothing"


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a proposal is refused before any run: words (what the proposer and `try` are told), the experiment it
    repeats (None for a frozen family), the rule (tabu | near-duplicate | frozen | mechanism <id>)."""
    words: str
    repeats: int | None
    rule: str


def value_of(text):
    """A constant's value as a number when it is one (literals, + - * / // ** of literals: `2**19`, `8 * 1024`),
    else None (strings, names, calls). Exponents beyond 64 are not computed (None)."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None

    def number(n):
        if isinstance(n, ast.Constant) and type(n.value) in (int, float, bool):
            return float(n.value)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
            v = number(n.operand)
            return None if v is None else -v if isinstance(n.op, ast.USub) else v
        if isinstance(n, ast.BinOp):
            a, b = number(n.left), number(n.right)
            if a is None or b is None:
                return None
            op = type(n.op)
            if op is ast.Pow:
                return a ** b if abs(b) <= 64 and abs(a) < 1e6 else None
            return {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                    ast.Div: lambda: a / b if b else None, ast.FloorDiv: lambda: a // b if b else None}.get(
                        op, lambda: None)()
        return None
    return number(node)


def change_of(before, after):
    """The Change from train.py `before` to `after` (text; either may be syntax-broken: only lines are read)."""
    removed, added, code, code_lines = {}, {}, [], []
    for sign, lines, i in changed_lines(before, after):
        text = normalised(lines[i])
        if text:
            code.append(sign + text)
        if (m := CONSTANT.match(lines[i])) and not enclosing(lines, i):     # a constant, not a local
            (removed if sign == "-" else added).setdefault(m.group(1), m.group(2))
        elif text:
            code_lines.append((lines, i, text))
    moves, families = [], []
    for name, (old, new) in changed_values(removed, added).items():
        a, b = (None, None) if old is None or new is None else (value_of(old), value_of(new))
        if old is None or new is None:
            moves.append(f"{name} {'added' if old is None else 'removed'}")
        elif a is not None and b is not None:
            moves.append(f"{name} {'up' if b > a else 'down'}")
        else:
            moves.append(f"{name} = {new.strip()[:40]}")
        families.append(name)
    for lines, i, text in code_lines:
        names = enclosing(lines, i) + ([m.group(2)] if (m := DEF.match(lines[i])) else [])   # a def: its own name
        moves.append(f"code: {'.'.join(names)}" if names else f"code: {CODE_MAIN}: {text[:60]}")   # outside: the line
        families.append(f"code: {code_family(names, text)}")
    return Change(tuple(dict.fromkeys(moves)), tuple(dict.fromkeys(families)), "\n".join(code)[:4000])


def changed_lines(before, after):
    """The changed lines of the line diff from text `before` to `after`, in order, as (sign, lines, i): sign "-"
    (line i of before's lines) or "+" (line i of after's lines)."""
    old, new = before.splitlines(), after.splitlines()
    matcher = difflib.SequenceMatcher(None, [x.rstrip() for x in old], [x.rstrip() for x in new], autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op != "equal":
            yield from (("-", old, i) for i in range(i1, i2))
            yield from (("+", new, j) for j in range(j1, j2))


def changed_values(removed, added):
    """{name: (old value text, new value text)} of the constants an edit changed, from the first removed and added
    assignment of each name on a changed line (None: not there: added or removed), in order. A value written another
    way (4e-2 for 0.04, other spacing) is no change."""
    found = {}
    for name in dict.fromkeys([*removed, *added]):
        old, new = removed.get(name), added.get(name)
        if old is not None and new is not None:
            a, b = value_of(old), value_of(new)
            if a is not None and b is not None and a == b or (a is None or b is None) and old.strip() == new.strip():
                continue
        found[name] = (old, new)
    return found


def constants_changed(before, after):
    """{name: (old value text, new value text)} of the UPPER_CASE constants at module level (or in a module-level
    `if PROFILE` branch) that the edit from train.py `before` to `after` changed (None: added or removed), as
    change_of reads them: harness.record.tracking logs them as an experiment's params."""
    removed, added = {}, {}
    for sign, lines, i in changed_lines(before, after):
        if (m := CONSTANT.match(lines[i])) and not enclosing(lines, i):
            (removed if sign == "-" else added).setdefault(m.group(1), m.group(2).strip())
    return changed_values(removed, added)


def normalised(line):
    """A code line with its comment and spacing dropped ('' for a blank or comment-only line)."""
    text = re.sub(r"\s+", " ", re.sub(r"#[^'\"]*$", "", line)).strip()
    return "" if text.startswith(("#", '"""', "'''")) and len(text) <= 3 else text


def enclosing(lines, i):
    """The names of the functions and classes line i sits in, outermost first (by indentation; [] at module level and
    in a module-level `if`/`for` block)."""
    line = lines[i]
    indent = len(line) - len(line.lstrip()) if line.strip() else 10**9
    names = []
    for j in range(i - 1, -1, -1):
        text = lines[j]
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        here = len(text) - len(text.lstrip())
        if here < indent:
            if m := DEF.match(text):
                names.insert(0, m.group(2))
            indent = here
            if not indent:
                break
    return names


def code_family(names, text):
    """The code family of a changed line: the first CODE_FAMILIES entry whose keywords occur in the enclosing names
    (then in the line), else CODE_MAIN outside functions and 'other' inside one."""
    for haystack in (" ".join(names).lower(), text.lower()):
        for family, words in CODE_FAMILIES:
            if haystack and any(w in haystack for w in words):
                return family
    return "other" if names else CODE_MAIN


def families_of(source):
    """Every family a proposal on this train.py can come from: its UPPER_CASE constants set to a number or a string
    at module level or in an `if PROFILE` branch (in order), then the code families."""
    lines = source.splitlines()
    names = [m.group(1) for i, line in enumerate(lines) if (m := CONSTANT.match(line)) and not enclosing(lines, i)
             and (value_of(m.group(2)) is not None or re.fullmatch(r"[rbu]?(['\"]).*\1", m.group(2)))]
    return [*dict.fromkeys(names), *(f"code: {f}" for f, _ in CODE_FAMILIES), f"code: {CODE_MAIN}", "code: other"]


# ---------------------------------------------------------------------------
# The history's changes (cached per session: an experiment's change never changes)
# ---------------------------------------------------------------------------


def change_at(s, e):
    """The Change of experiment event e (its "moves"/"families" fields when recorded, else from git: its base's
    train.py to its commit's); an empty Change for a baseline (a new hardware's too) or when git cannot read it."""
    cache = s.cache.changes
    if e["n"] not in cache:
        if is_baseline(e) or not e.get("base") or not e.get("full_commit") or e["n"] in s.cache.unreadable:
            cache[e["n"]] = Change()
        else:
            try:
                with s.lock:
                    before = gitops.file_at(s.repo, e["base"], s.tag.train_rel)
                    after = gitops.file_at(s.repo, e["full_commit"], s.tag.train_rel)
                cache[e["n"]] = change_of(before, after)
            except (gitops.GitError, ValueError, KeyError):
                cache[e["n"]] = Change()
    return cache[e["n"]]


def gain(s, e):
    """How much experiment e beat the best it was measured against, in metric units (> 0: better; 0 for a crash)."""
    if not has_metric(e) or e.get("base_metric") is None:
        return 0.0
    return (e["base_metric"] - e["metric"]) if s.tag.goal == "min" else (e["metric"] - e["base_metric"])


def scale(s):
    """The gain that counts as a full reward (1): twice the noise sd (the margin's size), else 0.1 % of the best."""
    sd = s.rule.sd if s.rule.sd else 0.0
    return max(2 * sd, s.rule.margin or 0.0, 1e-3 * abs(s.best_metric or 1.0), 1e-12)


# ---------------------------------------------------------------------------
# The tabu
# ---------------------------------------------------------------------------


def tabu_list(s, tenure):
    """The last `tenure` (--tabu) discarded or crashed experiments, newest first, with their Changes. A run the
    environment may be to blame for (runner.Kind.measured false: over the wall-time allowance, a lost Ray worker)
    judged nothing: not counted."""
    bad = [e for e in reversed(s.history) if e["n"] > 0 and e["status"] in ("discard", "crash")
           and Kind.of(e).measured]      # the machine's doing (overtime, a lost node): not the idea's
    return [(e, change_at(s, e)) for e in bad[:tenure]] if tenure else []


def refused(s, change, tenure=TENURE, frozen=()):
    """The Refusal of a proposal whose Change is `change`, or None. Refused: the same moves as one of the tabu list's
    experiments (the opposite direction is another move, never tabu); a code edit whose changed lines are a
    near-duplicate (NEAR_DUPLICATE) of a measured experiment's; a family in `frozen` ({family: words}, the outer
    loop's)."""
    if not change.moves:
        return None
    for e, earlier in tabu_list(s, tenure):
        if set(earlier.moves) == set(change.moves):
            return Refusal(f"it repeats the change of experiment #{e['n']} ({e['status']}: {e['description']}): "
                           f"{change.words()}. That change is tabu for the next {tenure} discards and "
                           "crashes; try another change (the opposite direction is allowed)", e["n"], "tabu")
    if any(m.startswith("code: ") for m in change.moves):     # constants alone: the tabu's to judge
        for e in reversed(s.history[1:]):
            if not Kind.of(e).measured:     # judged nothing: may be tried again
                continue
            earlier = change_at(s, e)
            if earlier.code and (ratio := difflib.SequenceMatcher(None, change.code, earlier.code,
                                                                  autojunk=False).ratio()) >= NEAR_DUPLICATE:
                return Refusal(f"its code change is a near-duplicate ({100 * ratio:.0f} % alike) of experiment "
                               f"#{e['n']}'s ({e['status']}: {e['description']}), already measured: propose a "
                               "different idea", e["n"], "near-duplicate")
    for family in change.families:
        if family in frozen:
            return Refusal(f"the family {family} is frozen ({frozen[family]}): propose a change elsewhere", None,
                           "frozen")
    return None


# ---------------------------------------------------------------------------
# The bandit over families (UCB1: Auer, Cesa-Bianchi & Fischer, 2002, "Finite-time analysis of the multiarmed bandit
# problem", the index mean + sqrt(2 ln N / n_i))
# ---------------------------------------------------------------------------


def family_stats(s):
    """{family: (tries, mean reward, best gain)} over the tag's experiments after the baseline that judged their
    train.py (not those the environment may be to blame for, as in tabu_list). A try's reward is its gain over its
    base divided by scale(s), clipped to 0..1 (a crash or a loss: 0)."""
    stats, unit = {}, scale(s)
    for e in s.history[1:]:
        if not Kind.of(e).measured:
            continue
        reward, g = min(1.0, max(0.0, gain(s, e) / unit)), gain(s, e) if has_metric(e) else None
        for family in change_at(s, e).families:
            tries, total, best = stats.get(family, (0, 0.0, None))
            stats[family] = (tries + 1, total + reward, g if best is None or (g is not None and g > best) else best)
    return {f: (t, total / t, best) for f, (t, total, best) in stats.items()}


def explore(s, source, k=1, frozen=()):
    """The k families the next k proposals should come from (distinct when there are enough): the untried first (a
    constant and a code family in turn, the kind tried less so far first; constants in train.py's order), then the
    highest UCB1 index; frozen ones never (unless every family is)."""
    stats = family_stats(s)
    arms = [f for f in families_of(source) if f not in frozen] or families_of(source)
    untried = [f for f in arms if f not in stats]
    consts = [f for f in untried if not f.startswith("code: ")]
    codes = [f for f in untried if f.startswith("code: ")]
    tried_code = sum(t for f, (t, _, _) in stats.items() if f.startswith("code: "))
    first, second = (codes, consts) if tried_code < sum(t for t, _, _ in stats.values()) - tried_code else \
        (consts, codes)                 # the kind tried less so far comes first, then they take turns
    order = [f for pair in zip(first, second) for f in pair] + first[len(second):] + second[len(first):]
    total = sum(t for t, _, _ in stats.values()) or 1
    tried = sorted((f for f in arms if f in stats),
                   key=lambda f: -(stats[f][1] + math.sqrt(2 * math.log(total) / stats[f][0])))
    return (order + tried)[:k]


def prompt_words(s, source, picks, tenure=TENURE, frozen=()):
    """The prompt's exploration section: the least explored families with their tries and best gains, the tabu
    list, the frozen families, and the bandit's picks for the proposals asked for."""
    stats, arms = family_stats(s), families_of(source)
    least = sorted(arms, key=lambda f: (stats.get(f, (0,))[0], arms.index(f)))[:SHOWN]
    lines = ["# Exploration (the harness's memory of what was tried)",
             "Least explored families (experiments so far, best gain over its base; > 0 is better): " + ", ".join(
                 f"{f} ({stats[f][0]}, {stats[f][2]:+.6f})" if f in stats and stats[f][2] is not None
                 else f"{f} ({stats.get(f, (0,))[0]})" for f in least)]
    tabu = tabu_list(s, tenure)
    if tabu:
        lines.append(f"Tabu (refused: the changes of the last {len(tabu)} discards and crashes; the opposite direction "
                     "is allowed): " + "; ".join(f"{c.words()} (#{e['n']})" for e, c in tabu if c.moves))
    if frozen:
        lines.append("Frozen by the outer loop (refused until its next step): " + "; ".join(
            f"{f} ({why})" for f, why in frozen.items()))
    if len(picks) == 1:
        lines.append(f"Next: propose a change in the family {picks[0]} (a UCB1 bandit's pick over families: the least "
                     "tried and the best paying).")
    elif picks:
        lines.append("Next, one idea per family (a UCB1 bandit's picks over families: the least tried and the best "
                     "paying): " + "; ".join(f"idea {i + 1}: {f}" for i, f in enumerate(picks)) + ".")
    return "\n".join(lines)
