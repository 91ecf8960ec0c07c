"""
HARNESS: the overnight research loop. Start it, go to bed, read `git log autoresearch/<tag>` and results.tsv
in the morning.

    uv run agent.py --tag nov30                        # LLM proposer (ANTHROPIC_API_KEY or OPENAI_API_KEY)
    uv run agent.py --tag nov30 --proposer random      # no API key: random hyperparameter perturbations
    uv run agent.py --tag nov30 --target grpo          # another target: a dir with program.md, prepare.py, train.py
    uv run agent.py --help                             # every flag

research_loop() is program.md's LOOP FOREVER:
    propose (an LLM answer -> search/replace edits to train.py, checked, repaired at most twice)
    -> commit on autoresearch/<tag> (commit_candidate: where an answer becomes a commit)
    -> run train.py with a hard timeout -> parse the summary -> keep, or reset to the best commit -> log.
results.tsv (one row per experiment) and events.jsonl (everything else) are untracked files in the target dir.
Every tried candidate stays reachable as refs/autoresearch/<tag>/<n>-<sha>. agent.py owns git and results.tsv;
it never imports prepare.py or train.py: the frozen constants are read with ast.
"""

import argparse
import ast
import collections
import dataclasses
import datetime
import fcntl
import hashlib
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import git
import openai

# ---------------------------------------------------------------------------
# Settings (the rules of the loop)
# ---------------------------------------------------------------------------

RESULTS, EVENTS, RUN_LOG = "results.tsv", "events.jsonl", "run.log"
FROZEN = ("prepare.py",)        # hashed before and after every run; train.py may not change them
MAX_REPAIRS = 2                 # a rejected answer goes back with the exact error at most this often
MAX_FIXES = 2                   # a crashed candidate goes back with the log tail for this many amended fixes
BREAKER = (6, 8)                # stop when 6 of the last 8 iterations failed (crash or unusable answer)
KILL_GRACE_S = 5.0              # SIGTERM -> SIGKILL grace for the training process group
RETRY_CAP_S = 60.0              # longest sleep between LLM retries
MAX_OUTPUT_TOKENS = 16384
LOG_TAIL_LINES = 60             # lines of run.log sent back to the LLM and kept in the event after a crash
HISTORY_ROWS = 60               # newer rows shown in full; older ones are summarised
DEFAULT_MODELS = {"anthropic": "claude-sonnet-5-5", "openai": "gpt-5.5"}
# USD per million tokens: (input, output, cached input read, cache write). Published list prices, Nov 2026.
# An unknown model costs 0 (its tokens are still counted).
PRICES = {
    "claude-sonnet-5-5": (2.0, 10.0, 0.20, 2.50),
    "claude-sonnet-5": (2.0, 10.0, 0.20, 2.50),
    "claude-sonnet-4-5": (3.0, 15.0, 0.30, 3.75),
    "claude-haiku-4-5": (1.0, 5.0, 0.10, 1.25),
    "claude-opus-4-5": (5.0, 25.0, 0.50, 6.25),
    "gpt-5.5": (5.0, 30.0, 0.50, 0.0),
    "gpt-5.4": (2.5, 15.0, 0.25, 0.0),
    "gpt-5.4-mini": (0.75, 4.5, 0.075, 0.0),
}

# ---------------------------------------------------------------------------
# Prompts (every word the LLM reads comes from these templates)
# ---------------------------------------------------------------------------

SYSTEM_PROMPT = """\
You are an autonomous ML researcher. You improve a training script, train.py, one experiment at a time.
Each experiment trains for a fixed time budget of {budget:g} seconds and is judged by {metric}
({goal} is better), computed by the frozen evaluation in prepare.py. An edit is kept only if it strictly
improves {metric}; otherwise it is reverted. Only train.py may change: prepare.py and its evaluation are
read-only, and train.py must not write to any file but its own outputs.

Answer with exactly one idea, in this plain-text format and nothing else:

DESCRIPTION: <one short line saying what you changed, e.g. "raise matrix LR to 0.05">
<<<<<<< SEARCH
<lines copied exactly from the current train.py>
=======
<the lines that replace them>
>>>>>>> REPLACE

Use one or more SEARCH/REPLACE blocks. Each SEARCH must match the current train.py exactly once,
including indentation; copy a few surrounding lines when a line alone is not unique.

The frozen files, for reference (read-only):
{frozen}"""

PROPOSE_PROMPT = """\
# program.md (the human's research directions)
{program}

# Experiment history ({metric}, {goal} is better; the best kept version is the current train.py)
{history}

# Current train.py
```python
{train}
```

Propose the next experiment: one idea, as a DESCRIPTION line and SEARCH/REPLACE blocks against this train.py."""

FIX_PROMPT = """\
The experiment "{description}" crashed ({reason}). The last lines of its run.log:
```
{tail}
```

This is the train.py that crashed:
```python
{train}
```

If the bug is simple to fix (a typo, a shape mismatch, a missing import), answer with a fix that keeps the
idea, in the same format (DESCRIPTION line, then SEARCH/REPLACE blocks against this train.py)."""

REPAIR_PROMPT = """\
Your answer was rejected: {error}
Answer again in the exact format (a DESCRIPTION line, then SEARCH/REPLACE blocks against the same train.py)."""

# ---------------------------------------------------------------------------
# Small records
# ---------------------------------------------------------------------------


class SetupError(Exception):
    """Bad input or state before the loop starts: the message names the problem and the fix."""


class Stop(Exception):
    """The loop must end now (auth error, blocking hook, circuit breaker ...); the message says why."""


class EditError(Exception):
    """An answer that cannot be applied to train.py; the message goes back to the LLM verbatim."""


@dataclasses.dataclass
class Reply:
    """One proposer answer with its accounting (tokens, USD, seconds including retries)."""
    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0


@dataclasses.dataclass
class Proposal:
    """A checked answer: the description and the complete new train.py."""
    description: str
    source: str
    repairs: int


@dataclasses.dataclass
class Outcome:
    """One training run of a candidate commit. metric is None when the run crashed (reason says why)."""
    commit: str
    metric: float | None
    memory_gb: float
    seconds: float
    reason: str = ""
    log_tail: str = ""


@dataclasses.dataclass
class Session:
    """Everything the loop needs; rebuilt from git and events.jsonl on every start (see open_session)."""
    args: argparse.Namespace
    target: Path
    repo: git.Repo
    branch: str
    train_rel: str                      # paths relative to the repository root
    frozen_rels: list
    metric: str
    goal: str                           # "min" or "max"
    budget: float                       # effective TIME_BUDGET in seconds
    timeout: float
    best_commit: str                    # full sha of the best kept commit (the branch tip between experiments)
    best_metric: float | None
    baseline_metric: float | None
    history: list                       # this tag's "experiment" events, in order
    candidate_blobs: set                # git blob shas of every train.py this tag wrote
    llm: object = None                  # (system, messages) -> Reply, or None for random/grid
    system_prompt: str = ""
    profile: str | None = None          # device class reported by `prepare.py --check`, if any
    cost_usd: float = 0.0               # the tag's LLM spend and tokens so far (resume sums "propose" events)
    input_tokens: int = 0
    output_tokens: int = 0
    llm_seconds: float = 0.0            # time spent waiting on the proposer in this invocation
    started: float = dataclasses.field(default_factory=time.monotonic)
    recent_failures: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=BREAKER[1]))
    last: str = "-"

    @property
    def next_n(self):
        """The number of the next experiment."""
        return len(self.history)       # the baseline is experiment 0


# ---------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------


def research_loop(s):
    """LOOP FOREVER (until a --max-* limit or the breaker): one experiment per turn, as in program.md."""
    if s.next_n == 0:
        run_baseline(s)
    while (reason := stop_reason(s)) is None:
        n, t0, spent0 = s.next_n, time.monotonic(), spent(s)
        proposal = propose(s, n)                                 # 1. ask for one idea (repaired at most twice)
        if proposal is None:                                     #    unusable answer: skipped, no training run
            s.recent_failures.append(True)
            continue
        commit = commit_candidate(s, n, proposal.source, proposal.description)  # 2. the answer becomes a commit
        outcome, fixes = run_with_fixes(s, n, proposal, commit)  # 3-4. train, parse; a crash may get fixes
        status = judge(s, outcome)                               # keep / discard / crash
        record(s, n, outcome, status, proposal.description, t0, spent0, proposal.repairs, fixes)  # 5. event, row
        if status == "keep":
            s.best_commit, s.best_metric = outcome.commit, outcome.metric
        else:
            reset_to_best(s)                                     # the branch goes back to the best commit
        s.recent_failures.append(status == "crash")
    return reason


def run_baseline(s):
    """Experiment 0: the unmodified train.py at the branch start, measured on this machine."""
    t0, spent0, commit = time.monotonic(), spent(s), s.best_commit
    make_candidate_ref(s, 0, commit)
    outcome = train_candidate(s, 0, 0, commit)
    if outcome.metric is None:
        raise Stop(f"the baseline run crashed ({outcome.reason}); nothing to improve on. Fix train.py, commit it "
                   f"(on {s.branch} is fine), and rerun the same command. Last lines of {RUN_LOG}:\n{outcome.log_tail}")
    record(s, 0, outcome, "keep", "baseline", t0, spent0, repairs=0, fixes=0)
    s.best_metric = s.baseline_metric = outcome.metric


def stop_reason(s):
    """Why the loop should end before the next experiment, or None to go on."""
    a = s.args
    if a.max_experiments is not None and s.next_n - 1 >= a.max_experiments:
        return f"--max-experiments {a.max_experiments} reached"
    if a.hours is not None and time.monotonic() - s.started >= a.hours * 3600:
        return f"--hours {a.hours:g} reached"
    if a.max_cost_usd is not None and s.cost_usd >= a.max_cost_usd:
        return f"--max-cost-usd {a.max_cost_usd:g} reached (spent ${s.cost_usd:.2f})"
    if sum(s.recent_failures) >= BREAKER[0]:
        raise Stop(f"circuit breaker: {BREAKER[0]} of the last {BREAKER[1]} iterations failed (crash or unusable "
                   f"answer). Read the errors in {EVENTS} and {RUN_LOG}, fix program.md, train.py or the model, "
                   "then rerun the same command to resume.")
    return None


def judge(s, outcome):
    """keep if the metric is strictly better than the best kept one, crash if there is none, else discard."""
    if outcome.metric is None:
        return "crash"
    better = outcome.metric < s.best_metric if s.goal == "min" else outcome.metric > s.best_metric
    return "keep" if better else "discard"


# ---------------------------------------------------------------------------
# Propose: ask for an edit until it applies (or give up after MAX_REPAIRS)
# ---------------------------------------------------------------------------


def propose(s, n):
    """Ask the proposer for the next idea against the current (best) train.py; None if it could not be repaired."""
    train_src = read_text(s.target / "train.py")
    prompt = PROPOSE_PROMPT.format(program=read_text(s.target / "program.md"), metric=s.metric, goal=goal_word(s),
                                   history=format_history(s), train=train_src)
    show_status(s, n, "proposing")
    proposal = ask_for_edit(s, n, [{"role": "user", "content": prompt}], train_src)
    if proposal is None:
        log_event(s, "skipped", n=n, reason=f"no usable answer after {MAX_REPAIRS} repairs")
        say(s, f"#{n:<4} skipped  no usable answer after {MAX_REPAIRS} repairs (see {EVENTS})")
    return proposal


def ask_for_edit(s, n, messages, train_src):
    """One conversation with the proposer: each rejected answer goes back with the exact error, at most
    MAX_REPAIRS times. Returns a Proposal or None."""
    for attempt in range(MAX_REPAIRS + 1):
        if s.llm is None:
            reply = Reply(perturb(train_src, s.args.proposer, n, s.args.seed, s.args.tag, s.profile))
        else:
            reply = call_with_retries(s, s.system_prompt, messages)
        s.cost_usd += reply.cost_usd
        s.input_tokens += reply.input_tokens
        s.output_tokens += reply.output_tokens
        log_event(s, "propose", n=n, attempt=attempt, proposer=s.args.proposer, model=s.args.model,
                  input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
                  cost_usd=round(reply.cost_usd, 6), llm_seconds=round(reply.seconds, 3))
        try:
            description, source = apply_answer(reply.text, train_src)
            return Proposal(description, source, repairs=attempt)
        except EditError as e:
            log_event(s, "repair", n=n, attempt=attempt, error=str(e), answer=reply.text[-4000:])
            messages = messages + [{"role": "assistant", "content": reply.text},
                                   {"role": "user", "content": REPAIR_PROMPT.format(error=e)}]
    return None


def spent(s):
    """(input tokens, output tokens, USD, LLM seconds) so far; record() logs the difference per experiment."""
    return s.input_tokens, s.output_tokens, s.cost_usd, s.llm_seconds


# ---------------------------------------------------------------------------
# Edits: DESCRIPTION + SEARCH/REPLACE blocks, the one path every proposer's answer takes
# ---------------------------------------------------------------------------

BLOCK_RE = re.compile(r"^<{7} SEARCH[ \t]*\n(.*?)^={7}[ \t]*\n(.*?)^>{7} REPLACE[ \t]*$", re.S | re.M)


def apply_answer(answer, train_src):
    """Parse an answer and apply its edits to train_src.

    Returns (description, new_source). Raises EditError (message meant for the LLM) when the DESCRIPTION line or
    the blocks are missing, a block names a file other than train.py, a SEARCH does not match exactly once, the
    result is unchanged, or the result does not parse as Python."""
    answer = answer.replace("\r\n", "\n")
    m = re.search(r"^\s*DESCRIPTION:[ \t]*(.*\S)", answer, re.M)
    if not m:
        raise EditError('the answer has no "DESCRIPTION: ..." line')
    description = clean_description(m.group(1))
    for name in re.findall(r"^\s*FILE:[ \t]*(\S+)", answer, re.M):
        if Path(name).name != "train.py":
            raise EditError(f"the answer edits {name}, but only train.py may change ({', '.join(FROZEN)} and "
                            "every other file are read-only)")
    blocks = BLOCK_RE.findall(answer)
    if not blocks:
        raise EditError("the answer has no <<<<<<< SEARCH / ======= / >>>>>>> REPLACE block")
    if len(blocks) != answer.count("<<<<<<< SEARCH"):
        raise EditError("a block is malformed: every <<<<<<< SEARCH line needs a ======= line and a "
                        ">>>>>>> REPLACE line")
    source = train_src
    for i, (search, replace) in enumerate(blocks, 1):
        if not search.strip():
            raise EditError(f"edit {i}: the SEARCH section is empty")
        count = source.count(search)
        if count != 1:
            first = search.strip().splitlines()[0]
            if count == 0:
                raise EditError(f"edit {i}: the SEARCH text starting {first!r} does not occur in train.py; copy the "
                                "lines exactly, including indentation")
            raise EditError(f"edit {i}: the SEARCH text starting {first!r} occurs {count} times in train.py; "
                            "add surrounding lines so that it matches exactly once")
        source = source.replace(search, replace, 1)
    if source == train_src:
        raise EditError("the edits leave train.py unchanged")
    try:
        ast.parse(source)
    except SyntaxError as e:
        raise EditError(f"the edited train.py does not parse: {e.msg} (line {e.lineno})") from None
    return description, source


def clean_description(text):
    """One line, no tabs, at most 200 characters: safe for a results.tsv cell and a commit subject."""
    return " ".join(text.split())[:200]


# ---------------------------------------------------------------------------
# Proposers without an LLM: perturb the UPPER_CASE numeric constants of train.py
# ---------------------------------------------------------------------------


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


def moves(number, kind, wide):
    """New literal texts for one constant: powers of two stay powers of two, ints stay ints (>= 1), floats are
    scaled (values in (0.5, 1) scale their distance to 1, so betas and ratios stay below 1). wide=False gives the
    grid's two single steps (down, up); wide=True the random proposer's broader choice."""
    if kind == "pow2":
        return [f"2**{k}" for k in (number - 1, number + 1) if k >= 0]
    if kind == "int":
        if number & (number - 1) == 0:
            candidates = [number // 2, number * 2] + ([number // 4, number * 4] if wide else [])
        else:
            factors = (0.5, 0.75, 1.25, 1.5, 2.0) if wide else (0.75, 1.25)
            candidates = [max(1, round(number * f)) for f in factors]
        return list(dict.fromkeys(str(c) for c in candidates if c >= 1 and c != number))
    factors = (0.5, 0.7, 1.4, 2.0) if wide else (0.5, 2.0)
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


def perturb(train_src, proposer, n, seed, tag, profile=None):
    """The random/grid proposer: an answer in the LLM's format changing one UPPER_CASE constant.

    random: a seeded choice per experiment n (reproducible on resume); grid: the (n-1)-th single step of a sweep
    over every constant, down then up. profile selects the `if PROFILE == ...` branch (see numeric_constants).
    Raises Stop when train.py has no constant to perturb."""
    options = [(name, line, span, new) for name, line, span, number, kind in numeric_constants(train_src, profile)
               for new in moves(number, kind, wide=proposer == "random")]
    if not options:
        raise Stop("train.py has no module-level UPPER_CASE numeric constants (e.g. `LR = 0.04`) for "
                   f"--proposer {proposer} to perturb; use an LLM proposer")
    if proposer == "random":
        rng = random.Random(f"{seed}:{tag}:{n}")
        name = rng.choice(sorted({o[0] for o in options}))
        name, line, (start, end), new = rng.choice([o for o in options if o[0] == name])
    else:
        name, line, (start, end), new = options[(n - 1) % len(options)]
    context, last = line[:line.rstrip("\n").rfind("\n") + 1], line[line.rstrip("\n").rfind("\n") + 1:]
    raw = last.encode()
    old, replaced = raw[start:end].decode(), context + (raw[:start] + new.encode() + raw[end:]).decode()
    return (f"DESCRIPTION: {proposer}: {name} {old} -> {new}\n"
            f"<<<<<<< SEARCH\n{line}=======\n{replaced}>>>>>>> REPLACE\n")


# ---------------------------------------------------------------------------
# LLM providers: two small functions with one signature, (client, model, system, messages) -> Reply
# ---------------------------------------------------------------------------


def ask_anthropic(client, model, system, messages):
    """Anthropic Messages API. The system prompt (instructions + frozen files) is the stable prefix, marked for
    prompt caching; input_tokens counts uncached + cache-read + cache-write tokens."""
    r = client.messages.create(model=model, max_tokens=MAX_OUTPUT_TOKENS, messages=messages,
                               system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}])
    u = r.usage
    read, write = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
    text = "".join(block.text for block in r.content if block.type == "text")
    return Reply(text, u.input_tokens + read + write, u.output_tokens,
                 price(model, u.input_tokens, u.output_tokens, read, write))


def ask_openai(client, model, system, messages):
    """OpenAI Chat Completions (also vLLM, ollama, DeepSeek, OpenRouter through --base-url). OpenAI caches long
    prefixes by itself; cached tokens are priced as such."""
    r = client.chat.completions.create(model=model, max_completion_tokens=MAX_OUTPUT_TOKENS,
                                       messages=[{"role": "system", "content": system}, *messages])
    u = r.usage
    prompt, completion = (u.prompt_tokens, u.completion_tokens) if u else (0, 0)
    details = getattr(u, "prompt_tokens_details", None)
    cached = (details.cached_tokens or 0) if details else 0
    return Reply(r.choices[0].message.content or "", prompt, completion, price(model, prompt - cached, completion,
                                                                             cached, 0))


def price(model, uncached_in, out, cache_read, cache_write):
    """USD for one call from PRICES (dated ids like claude-haiku-4-5-20251001 use their base entry); 0 if unknown."""
    key = max((k for k in PRICES if model == k or model.startswith(k + "-")), key=len, default=None)
    if key is None:
        return 0.0
    p_in, p_out, p_read, p_write = PRICES[key]
    return (uncached_in * p_in + out * p_out + cache_read * p_read + cache_write * p_write) / 1e6


def make_llm(args):
    """The proposer function (system, messages) -> Reply for --proposer anthropic/openai, None for random/grid.

    The SDKs' own retries are off (max_retries=0): call_with_retries owns them. Raises SetupError without a key."""
    if args.proposer in ("random", "grid"):
        return None
    env = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}[args.proposer]
    key = os.environ.get(env) or ("unused" if args.base_url else None)   # local servers take any key
    if not key:
        raise SetupError(f"--proposer {args.proposer} needs {env} in the environment (or --base-url for a local "
                         "server); without a key use --proposer random")
    if args.proposer == "anthropic":
        client = anthropic.Anthropic(api_key=key, base_url=args.base_url, max_retries=0, timeout=600)
        return lambda system, messages: ask_anthropic(client, args.model, system, messages)
    client = openai.OpenAI(api_key=key, base_url=args.base_url, max_retries=0, timeout=600)
    return lambda system, messages: ask_openai(client, args.model, system, messages)


def call_with_retries(s, system, messages):
    """Call the LLM until it answers: transient errors (429, 5xx, overloaded, timeouts, dropped connections)
    are retried forever with exponential backoff and jitter (base --retry-base-delay, cap RETRY_CAP_S).
    Authentication errors, unknown models and other rejected requests raise Stop at once."""
    t0 = time.monotonic()
    try:
        for attempt in itertools.count():
            try:
                reply = s.llm(system, messages)
                reply.seconds = time.monotonic() - t0
                return reply
            except (anthropic.APIConnectionError, openai.APIConnectionError) as e:
                problem = f"{type(e).__name__}: {e}"
            except (anthropic.APIStatusError, openai.APIStatusError) as e:
                if e.status_code not in (408, 409, 425, 429) and e.status_code < 500:
                    raise Stop(fatal_llm_message(s.args, e)) from None
                problem = f"HTTP {e.status_code}: {e.message}"
            delay = min(RETRY_CAP_S, s.args.retry_base_delay * 2 ** attempt) * random.uniform(0.5, 1.0)
            log_event(s, "error", where="llm", attempt=attempt, error=problem[:500], retry_in_s=round(delay, 3))
            show_status(s, s.next_n, f"LLM error ({problem[:60]}), retry {attempt + 1} in {delay:.0f}s")
            time.sleep(delay)
    finally:
        s.llm_seconds += time.monotonic() - t0


def fatal_llm_message(args, e):
    """A clear message for an LLM error that retrying cannot fix."""
    env = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}[args.proposer]
    where = args.base_url or f"the {args.proposer} API"
    if e.status_code in (401, 403):
        return f"{where} refused the key (HTTP {e.status_code}): check {env}. {e.message}"
    if e.status_code == 404:
        return (f"{where} does not know model {args.model!r} or the endpoint (HTTP 404): pass a valid --model "
                f"(and --base-url). {e.message}")
    return f"{where} rejected the request (HTTP {e.status_code}): {e.message}"


# ---------------------------------------------------------------------------
# Commit, run, parse
# ---------------------------------------------------------------------------


def commit_candidate(s, n, source, message, attempt=0):
    """Write train.py and commit it on the branch with this message (attempt > 0: amend the crashed candidate
    with a fix).

    Only train.py is committed (`git commit --only -- train.py`), so nothing else can enter the commit. Hooks run;
    a blocking hook raises Stop with its output (the agent never passes --no-verify). Returns the full sha."""
    blob = git_blob_sha(source.encode())
    s.candidate_blobs.add(blob)
    log_event(s, "candidate", n=n, attempt=attempt, parent=s.best_commit, blob=blob, message=message)
    (s.target / "train.py").write_text(source)
    argv = ["-q", "--no-edit", "--amend"] if attempt else ["-q"]
    try:
        s.repo.git.commit(*argv, "-m", message, "--only", "--", s.train_rel)
    except git.GitCommandError as e:
        reset_to_best(s)
        raise Stop(f"git commit of the candidate failed (a pre-commit or commit-msg hook, or git config); the agent "
                   f"does not bypass hooks. Fix it and rerun the same command to resume.\n{e.stderr.strip()}")
    commit = s.repo.head.commit.hexsha
    make_candidate_ref(s, n, commit)
    log_event(s, "commit", n=n, attempt=attempt, full_commit=commit)
    return commit


def make_candidate_ref(s, n, commit):
    """refs/autoresearch/<tag>/<n>-<sha7>: keeps every tried candidate reachable after a discard."""
    s.repo.git.update_ref(f"refs/autoresearch/{s.args.tag}/{n:04d}-{commit[:7]}", commit)


def run_with_fixes(s, n, proposal, commit):
    """Train the candidate; after a crash (not a timeout or a rejected run) ask the LLM for a fix, at most
    MAX_FIXES amended candidates. Returns (the last Outcome, number of fixes tried)."""
    outcome = train_candidate(s, n, 0, commit)
    for fix in range(1, MAX_FIXES + 1):
        if outcome.metric is not None or s.llm is None or outcome.reason.startswith(("timeout", "rejected")):
            return outcome, fix - 1
        crashed_src = read_text(s.target / "train.py")
        prompt = FIX_PROMPT.format(description=proposal.description, reason=outcome.reason, tail=outcome.log_tail,
                                   train=crashed_src)
        show_status(s, n, f"asking for fix {fix}")
        fixed = ask_for_edit(s, n, [{"role": "user", "content": prompt}], crashed_src)
        if fixed is None:
            return outcome, fix - 1
        message = f"{proposal.description}\n\nfix {fix}: {fixed.description}"
        commit = commit_candidate(s, n, fixed.source, message, attempt=fix)
        outcome = train_candidate(s, n, fix, commit)
    return outcome, MAX_FIXES


def train_candidate(s, n, attempt, commit):
    """Run train.py at HEAD (= commit), check the frozen files, parse the summary. Returns an Outcome."""
    frozen_before = [file_hash(s.target / f) for f in FROZEN]
    try:
        rc, seconds, timed_out = run_training(s, n, attempt, commit)
    finally:                                # also on Ctrl-C: a frozen file changed by the run is restored
        tampered = [rel for f, rel, h in zip(FROZEN, s.frozen_rels, frozen_before) if file_hash(s.target / f) != h]
        if tampered:
            s.repo.git.checkout("HEAD", "--", *tampered)
    text = read_log(s.target / RUN_LOG)
    tail = "\n".join(text.replace("\r", "\n").splitlines()[-LOG_TAIL_LINES:])
    metric, memory_gb, reason = None, 0.0, ""
    if tampered:
        reason = f"rejected: train.py modified {', '.join(tampered)} (restored)"
    elif timed_out:
        reason = f"timeout after {s.timeout:.0f}s"
    elif rc != 0:
        reason = f"exit code {rc}"
    else:
        metric, memory_gb, reason = read_metric(parse_summary(text), s.metric)
    log_event(s, "run_end", n=n, attempt=attempt, commit=commit[:7], returncode=rc, timed_out=timed_out,
              train_seconds=round(seconds, 3), reason=reason, metric=metric, frozen_tampered=tampered,
              log_tail=tail if metric is None else "")
    return Outcome(commit, metric, memory_gb, seconds, reason, tail)


def run_training(s, n, attempt, commit):
    """Run [python, train.py] in the target dir in its own process group, stdout+stderr -> run.log.

    API keys are removed from its environment. On timeout and on Ctrl-C the whole group is killed; so are stray
    children of a run that exited. Returns (returncode or None on timeout, seconds, timed_out)."""
    env = {k: v for k, v in os.environ.items() if not is_secret_name(k)}
    t0 = time.monotonic()
    with open(s.target / RUN_LOG, "wb") as log:
        proc = subprocess.Popen([sys.executable, "train.py"], cwd=s.target, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            log_event(s, "run", n=n, attempt=attempt, commit=commit[:7], pgid=proc.pid, timeout_s=s.timeout)
            while True:
                elapsed = time.monotonic() - t0
                if elapsed >= s.timeout:
                    kill_group(proc.pid, proc)
                    return None, time.monotonic() - t0, True
                show_status(s, n, f"training {fmt_duration(elapsed)}/{fmt_duration(s.budget)}")
                try:
                    rc = proc.wait(timeout=min(1.0, s.timeout - elapsed))
                    break
                except subprocess.TimeoutExpired:
                    pass
        except BaseException:
            kill_group(proc.pid, proc)
            raise
    seconds = time.monotonic() - t0
    kill_group(proc.pid, proc)
    return rc, seconds, False


def kill_group(pgid, proc=None):
    """SIGTERM the process group, SIGKILL it after KILL_GRACE_S, and wait (up to the grace) until it is gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + KILL_GRACE_S
        while time.monotonic() < deadline:
            if proc is not None:
                proc.poll()                  # reap the leader, else it stays a zombie member of the group
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)


def read_metric(summary, name):
    """(metric, memory_gb, "") from a parsed summary, or (None, 0.0, reason) when the metric is missing, not a
    number, NaN or infinite. memory_gb = peak_vram_mb / 1024, 0.0 when absent."""
    try:
        metric = float(summary[name])
    except KeyError:
        return None, 0.0, f"no {name} in the summary"
    except ValueError:
        return None, 0.0, f"{name} is not a number: {summary[name]!r}"
    if not math.isfinite(metric):
        return None, 0.0, f"{name} is {summary[name]}"
    try:
        return metric, float(summary.get("peak_vram_mb", 0.0)) / 1024, ""
    except ValueError:
        return metric, 0.0, ""


def parse_summary(text):
    """The last `---` block of run.log as {key: value} strings (lines that are not `key: value` are ignored)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == "---"]
    if not starts:
        return {}
    summary = {}
    for line in lines[starts[-1] + 1:]:
        key, sep, value = line.partition(":")
        if sep and key.strip() and " " not in key.strip():
            summary[key.strip()] = value.strip()
    return summary


def reset_to_best(s):
    """Move the branch back to the best commit and restore train.py from it: `git reset --soft best` then
    `git checkout best -- train.py`. This is `git reset --hard` for the only file a candidate changes; other
    uncommitted edits (a human redirecting program.md), results.tsv and run.log are left alone."""
    if s.repo.head.commit.hexsha != s.best_commit:
        s.repo.git.reset("-q", "--soft", s.best_commit)
    s.repo.git.checkout(s.best_commit, "--", s.train_rel)


# ---------------------------------------------------------------------------
# Records: events.jsonl (the source of truth) and results.tsv (derived, one row per experiment)
# ---------------------------------------------------------------------------
# Order of operations for experiment n, and what a restart after SIGKILL at each point finds and does:
#   1. "candidate" event (with the blob sha of the new train.py), write train.py
#        -> train.py dirty with a blob we wrote: restored from the best commit
#   2. git commit on the branch, candidate ref, "commit" event
#        -> branch tip is a known candidate, no "experiment" event for n: branch reset to the best commit
#   3. "run" event (with the process group id), train, "run_end" event
#        -> same, plus: a training group still alive is killed, a frozen file it changed is restored
#   4. "experiment" event  (the experiment happened: from here on it counts)
#   5. results.tsv row     -> if the kill hit between 4 and 5, the row is appended on restart (missing_row)
#   6. discard/crash: reset to the best commit -> the tip is still the candidate: reset on restart
# n is the number of this tag's "experiment" events, so an interrupted experiment is simply redone (its commit
# stays reachable under refs/autoresearch/<tag>/), and no row is ever duplicated or lost.


def record(s, n, outcome, status, description, t0, spent0, repairs, fixes):
    """Log the "experiment" event (tokens, $ and LLM seconds since spent0), then append the results.tsv row
    derived from it, then print one line."""
    if outcome.reason:
        description = clean_description(f"{description} ({outcome.reason})")
    tokens_in, tokens_out, cost, llm = (now - before for now, before in zip(spent(s), spent0))
    event = log_event(s, "experiment", n=n, commit=outcome.commit[:7], full_commit=outcome.commit, status=status,
                      metric=outcome.metric or 0.0, memory_gb=round(outcome.memory_gb, 1), description=description,
                      wall_seconds=round(time.monotonic() - t0, 3), train_seconds=round(outcome.seconds, 3),
                      llm_seconds=round(llm, 3), input_tokens=tokens_in, output_tokens=tokens_out,
                      cost_usd=round(cost, 6), proposer=s.args.proposer, repairs=repairs, fixes=fixes)
    append_line(s.target / RESULTS, results_row(event))
    s.history.append(event)
    s.last = f"{status} {outcome.metric:.6f}" if outcome.metric is not None else status
    best = outcome.metric if status == "keep" else s.best_metric
    shown = f"{outcome.metric:.6f}" if outcome.metric is not None else "-"
    say(s, f"#{n:<4} {status:<7} {s.metric} {shown:<10} best {best:.6f}  {outcome.seconds:5.0f}s  {description}")


def results_row(event):
    """karpathy's 5 columns: 7-char commit, metric (6 decimals), memory_gb (1 decimal), status, description."""
    return (f"{event['commit']}\t{event['metric']:.6f}\t{event['memory_gb']:.1f}\t{event['status']}\t"
            f"{event['description']}")


def missing_row(results_path, all_events, event):
    """True if `event`'s row is missing from results.tsv. Events are written before rows, so each row text
    occurs at most as often as events (of any tag) that produce it; fewer means the last append was lost."""
    row = results_row(event)
    rows = read_text(results_path).splitlines() if results_path.exists() else []
    made = sum(1 for e in all_events if e.get("event") == "experiment" and results_row(e) == row)
    return rows.count(row) < made


def log_event(s, event, **fields):
    """Append one JSON line to events.jsonl (ts, event, tag, fields), flushed and fsynced. Secrets are redacted."""
    record = {"ts": datetime.datetime.now(datetime.timezone.utc).isoformat(), "event": event, "tag": s.args.tag,
              **fields}
    append_line(s.target / EVENTS, redact(json.dumps(record)))
    return record


def append_line(path, line):
    """Append one line and fsync: a row or event is on disk before the next step starts."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_events(path):
    """All parseable events of events.jsonl (a line cut by a kill mid-write is skipped)."""
    events = []
    if path.exists():
        for line in read_text(path).splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return events


def is_secret_name(name):
    """Environment variables that hold API keys: never passed to train.py, redacted from every record."""
    return name.endswith("_API_KEY") or name in ("ANTHROPIC_AUTH_TOKEN", "OPENAI_ADMIN_KEY")


def redact(text):
    """Replace the value of every API-key variable in the environment by [redacted]."""
    for name, value in os.environ.items():
        if is_secret_name(name) and len(value) >= 8:
            text = text.replace(value, "[redacted]")
    return text


# ---------------------------------------------------------------------------
# Setup and resume
# ---------------------------------------------------------------------------


def read_frozen_constants(prepare_path):
    """METRIC_NAME, METRIC_GOAL, TIME_BUDGET, PREFLIGHT from prepare.py's module-level literals (via ast, never
    imported). Raises SetupError naming the missing or invalid constant."""
    values = {}
    for node in ast.parse(read_text(prepare_path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    for name in ("METRIC_NAME", "METRIC_GOAL", "TIME_BUDGET"):
        if name not in values:
            raise SetupError(f"{prepare_path} must declare {name} as a plain literal "
                             '(e.g. METRIC_NAME = "val_bpb", METRIC_GOAL = "min", TIME_BUDGET = 300)')
    if values["METRIC_GOAL"] not in ("min", "max"):
        raise SetupError(f'{prepare_path}: METRIC_GOAL must be "min" or "max", not {values["METRIC_GOAL"]!r}')
    values.setdefault("PREFLIGHT", False)
    return values


def effective_budget(time_budget):
    """TIME_BUDGET seconds, or AUTORESEARCH_TIME_BUDGET when set (smoke tests); SetupError if not positive."""
    raw = os.environ.get("AUTORESEARCH_TIME_BUDGET")
    try:
        budget = float(raw) if raw else float(time_budget)
    except ValueError:
        budget = -1.0
    if not (budget > 0 and math.isfinite(budget)):
        raise SetupError(f"AUTORESEARCH_TIME_BUDGET={raw!r} is not a positive, finite number of seconds; unset it or fix it")
    return budget


def default_timeout(budget):
    """2 x the budget (karpathy's 10 minutes for 5), but at least budget + 120 s so that start-up and the final
    evaluation fit even in a 10-second smoke budget."""
    return max(2 * budget, budget + 120)


def run_prepare(target, flag, timeout):
    """Run `python prepare.py <flag>` in the target dir and return its stdout; SetupError with its own message
    if it exits nonzero."""
    env = {k: v for k, v in os.environ.items() if not is_secret_name(k)}
    try:
        p = subprocess.run([sys.executable, "prepare.py", flag], cwd=target, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SetupError(f"prepare.py {flag} did not finish within {timeout:.0f}s") from None
    if p.returncode != 0:
        output = (p.stderr.strip() or p.stdout.strip() or f"exit code {p.returncode}")[-3000:]
        raise SetupError(f"prepare.py {flag} failed:\n{output}")
    return p.stdout


def check_target(target):
    """The target dir must hold program.md, prepare.py and train.py; SetupError otherwise."""
    if not target.is_dir():
        raise SetupError(f"--target {target} is not a directory")
    missing = [f for f in ("program.md", "prepare.py", "train.py") if not (target / f).is_file()]
    if missing:
        raise SetupError(f"{target} is not an autoresearch target: missing {', '.join(missing)} "
                         "(a target holds program.md, a frozen prepare.py and a mutable train.py)")


def open_repo(target):
    """The git repository holding the target, with a named branch checked out; SetupError otherwise."""
    try:
        repo = git.Repo(target, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise SetupError(f"{target} is not inside a git repository: run `git init && git add -A && "
                         "git commit -m init` there first") from None
    if repo.head.is_detached:
        raise SetupError("HEAD is detached: check out a branch first (e.g. `git switch main`)")
    tracked = set(repo.git.ls_files("-z", "--", *[str(target / f) for f in ("prepare.py", "train.py")]).split("\0"))
    for f in ("prepare.py", "train.py"):
        rel = (target / f).resolve().relative_to(Path(repo.working_tree_dir).resolve()).as_posix()
        if rel not in tracked:
            raise SetupError(f"{rel} is not committed: `git add {rel} && git commit` first")
    return repo


def changed_files(repo):
    """Tracked files that differ from HEAD (staged or not), relative to the repository root."""
    return [p for p in repo.git.diff("--name-only", "-z", "HEAD").split("\0") if p]


def ensure_ignored(repo, target):
    """results.tsv, events.jsonl and run.log must be untracked and ignored (the ratchet resets train.py, never
    these). Names the repo's .gitignore does not cover go to .git/info/exclude, which is never committed."""
    root = Path(repo.working_tree_dir).resolve()
    rels = [(target / name).resolve().relative_to(root).as_posix() for name in (RESULTS, EVENTS, RUN_LOG)]
    tracked = [p for p in repo.git.ls_files("-z", "--", *rels).split("\0") if p]
    if tracked:
        raise SetupError(f"{', '.join(tracked)} is tracked by git; untrack it (`git rm --cached {tracked[0]}` and "
                         "commit) so that resets never touch it")
    ignored = set(repo.ignored(*rels))
    missing = [r for r in rels if r not in ignored]
    if missing:
        exclude = Path(repo.git.rev_parse("--git-common-dir"))
        exclude = (exclude if exclude.is_absolute() else root / exclude) / "info" / "exclude"
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with open(exclude, "a") as f:
            f.write("".join(f"/{r}\n" for r in missing))


def ensure_results_header(path, metric):
    """Write karpathy's header to a missing or empty results.tsv; SetupError if an existing header differs."""
    header = f"commit\t{metric}\tmemory_gb\tstatus\tdescription"
    if not path.exists() or not read_text(path).strip():
        append_line(path, header)
        return
    text = read_text(path)
    if text.splitlines()[0] != header:
        raise SetupError(f"{path} starts with {text.splitlines()[0]!r}, not {header!r}: it belongs to another "
                         "metric; move it away or use the right --target")
    end_with_newline(path)


def end_with_newline(path):
    """A line cut by a power loss mid-write must not swallow the next one appended after it."""
    if path.exists() and path.stat().st_size and not read_text(path).endswith("\n"):
        append_line(path, "")


def lock_repo(repo):
    """An exclusive lock in the git dir: two agents on one working tree would wreck each other's experiments.
    The kernel drops it when the process dies, even on SIGKILL. Returns the open lock file (keep it open)."""
    common = Path(repo.git.rev_parse("--git-common-dir"))
    path = (common if common.is_absolute() else Path(repo.working_tree_dir) / common) / "autoresearch.lock"
    lock = open(path, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise SetupError(f"another agent.py is running in this repository (lock {path}); stop it first") from None
    return lock


def open_session(args):
    """Check everything, then create autoresearch/<tag> from HEAD or resume it.

    Resume rebuilds the best commit and the experiment count from this tag's events, kills a training run left
    by a killed agent, restores what an interrupted iteration left half-applied (only files the agent itself
    wrote, see the order of operations above record()), and appends a results.tsv row lost to a kill.
    Raises SetupError with the fix for anything it will not touch."""
    target = Path(args.target).resolve()
    check_target(target)
    constants = read_frozen_constants(target / "prepare.py")
    budget = effective_budget(constants["TIME_BUDGET"])
    repo = open_repo(target)
    root = Path(repo.working_tree_dir).resolve()
    branch = f"autoresearch/{args.tag}"
    events_path = target / EVENTS
    end_with_newline(events_path)
    all_events = read_events(events_path)
    mine = [e for e in all_events if e.get("tag") == args.tag]
    history = [e for e in mine if e.get("event") == "experiment"]
    kept = [e for e in history if e["status"] == "keep"]
    s = Session(args=args, target=target, repo=repo, branch=branch,
                train_rel=(target / "train.py").relative_to(root).as_posix(),
                frozen_rels=[(target / f).relative_to(root).as_posix() for f in FROZEN],
                metric=constants["METRIC_NAME"], goal=constants["METRIC_GOAL"], budget=budget,
                timeout=args.timeout or default_timeout(budget), best_commit="",
                best_metric=kept[-1]["metric"] if kept else None,
                baseline_metric=history[0]["metric"] if history else None, history=history,
                candidate_blobs={e["blob"] for e in mine if e.get("event") == "candidate"},
                cost_usd=sum(e.get("cost_usd", 0.0) for e in mine if e.get("event") == "propose"),
                input_tokens=sum(e.get("input_tokens", 0) for e in mine if e.get("event") == "propose"),
                output_tokens=sum(e.get("output_tokens", 0) for e in mine if e.get("event") == "propose"))
    # the tail of events after this tag's last experiment: an interrupted iteration, if any
    last_done = max((i for i, e in enumerate(mine) if e.get("event") in ("experiment", "cleaned", "stop")),
                    default=-1)
    pending = mine[last_done + 1:]
    runs = [e for e in pending if e.get("event") == "run"]
    run_in_flight = bool(runs) and not any(e.get("event") == "run_end" and e.get("n") == runs[-1]["n"]
                                           and e.get("attempt") == runs[-1]["attempt"] for e in pending)
    if run_in_flight:
        kill_stale_run(runs[-1]["pgid"], target)

    # 1. the working tree: clean, or dirty only with what an interrupted iteration of this tag wrote
    ours = set()
    for rel in changed_files(repo):
        path = root / rel
        if rel == s.train_rel and path.exists() and git_blob_sha(path.read_bytes()) in s.candidate_blobs:
            ours.add(rel)
        elif rel in s.frozen_rels and run_in_flight:
            ours.add(rel)
        else:
            dirty = ", ".join(changed_files(repo))
            raise SetupError(f"uncommitted changes to tracked files: {dirty}. agent.py never stashes, resets or "
                             "deletes your work: commit or stash them yourself, then rerun")
    if ours and repo.active_branch.name != branch:
        raise SetupError(f"{', '.join(sorted(ours))} changed, and {branch} is not checked out: "
                         f"`git switch {branch}` and rerun to let the agent restore them")

    # 2. the branch: create it, or find the best commit of a resumed one
    if branch not in repo.heads:
        if history:
            raise SetupError(f"{EVENTS} has experiments for tag {args.tag!r} but branch {branch} is gone; restore "
                             f"it with `git branch {branch} {kept[-1]['full_commit']}` or pick a new --tag")
        repo.create_head(branch, repo.head.commit)
        repo.heads[branch].checkout()
        s.best_commit = repo.head.commit.hexsha
        log_event(s, "start", new_branch=True, best=s.best_commit)
    else:
        # before the baseline is measured, whatever the branch holds is the baseline
        s.best_commit = kept[-1]["full_commit"] if kept else repo.heads[branch].commit.hexsha
        if repo.active_branch.name != branch:
            repo.heads[branch].checkout()
        tip = repo.head.commit.hexsha
        if tip != s.best_commit and not is_candidate(s, repo.head.commit):
            raise SetupError(f"{branch} points at {tip[:7]}, which the agent did not make on top of the best commit "
                             f"{s.best_commit[:7]}; move your commits elsewhere (e.g. `git branch -f {branch} "
                             f"{s.best_commit[:7]}` after saving them on another branch) and rerun")
        log_event(s, "start", new_branch=False, best=s.best_commit, experiments=len(history))
        if tip != s.best_commit or ours:
            if tip != s.best_commit:
                make_candidate_ref(s, s.next_n, tip)     # a kill may have come before its ref was made
            reset_to_best(s)
            if ours & set(s.frozen_rels):
                repo.git.checkout(s.best_commit, "--", *sorted(ours & set(s.frozen_rels)))
            log_event(s, "cleaned", n=s.next_n, tip=tip, restored=sorted(ours))

    # 3. outputs and a row lost to a kill between the "experiment" event and its row
    ensure_ignored(repo, target)
    ensure_results_header(target / RESULTS, s.metric)
    if history and missing_row(target / RESULTS, all_events, history[-1]):
        append_line(target / RESULTS, results_row(history[-1]))
        log_event(s, "row_restored", n=history[-1]["n"])
    return s, constants


def is_candidate(s, commit):
    """True if commit is a candidate this tag made on top of the best commit: its parent is the best commit and
    its train.py is one the agent wrote (checked by content, since a kill can precede the "commit" event)."""
    if len(commit.parents) != 1 or commit.parents[0].hexsha != s.best_commit:
        return False
    try:
        return (commit.tree / s.train_rel).hexsha in s.candidate_blobs
    except KeyError:
        return False


def kill_stale_run(pgid, target):
    """Kill the training process group a killed agent left running, if its leader is still train.py in this
    target (checked in /proc, so that a reused pid is never hit)."""
    try:
        cwd = os.readlink(f"/proc/{pgid}/cwd")
        cmdline = Path(f"/proc/{pgid}/cmdline").read_bytes().split(b"\0")
        ours = Path(cwd) == target and b"train.py" in cmdline and os.getpgid(pgid) == pgid
    except OSError:
        return
    if ours:
        kill_group(pgid)


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------


def read_text(path):
    """A file's text as UTF-8."""
    return Path(path).read_text(encoding="utf-8")


def read_log(path, limit=1 << 20):
    """The last `limit` bytes of run.log as text (a training log can be large; the summary is at the end)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def file_hash(path):
    """sha256 of a file's bytes, or None if it does not exist."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def git_blob_sha(data):
    """The sha git gives these bytes as a blob (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def goal_word(s):
    """"lower" or "higher": how the prompts say the metric's direction."""
    return "lower" if s.goal == "min" else "higher"


def format_history(s):
    """This tag's experiments as a table; beyond HISTORY_ROWS, older rows are summarised (their kept ones listed)."""
    if not s.history:
        return "(none yet)"
    old, new = s.history[:-HISTORY_ROWS], s.history[-HISTORY_ROWS:]
    lines = [f"n\tcommit\t{s.metric}\tmemory_gb\tstatus\tdescription"]
    if old:
        counts = collections.Counter(e["status"] for e in old)
        lines.append(f"({len(old)} older experiments: {counts['keep']} keep, {counts['discard']} discard, "
                     f"{counts['crash']} crash; their kept ones:)")
        new = [e for e in old if e["status"] == "keep"] + new
    lines += [f"{e['n']}\t{results_row(e)}" for e in new]
    return "\n".join(lines)


def fmt_duration(seconds):
    """Seconds as m:ss, or h:mm:ss from an hour on."""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


def show_status(s, n, phase):
    """The live status line (terminals only): experiment, phase, best and change vs baseline, last result,
    tokens and $ so far, elapsed."""
    if not sys.stdout.isatty():
        return
    best = "-"
    if s.best_metric is not None:
        best = f"{s.best_metric:.6f}"
        if s.baseline_metric:
            best += f" ({100 * (s.best_metric - s.baseline_metric) / abs(s.baseline_metric):+.2f}%)"
    line = (f"exp {n} | {phase} | best {best} | last {s.last} | {(s.input_tokens + s.output_tokens) / 1000:.1f}k tok "
            f"${s.cost_usd:.2f} | {fmt_duration(time.monotonic() - s.started)}")
    width = shutil.get_terminal_size((120, 20)).columns
    sys.stdout.write("\r\x1b[2K" + line[:width - 1])
    sys.stdout.flush()


def say(s, message):
    """Print a line (clearing the status line on a terminal)."""
    if sys.stdout.isatty():
        sys.stdout.write("\r\x1b[2K")
    print(redact(message), flush=True)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def parse_args(argv):
    """The command line (see --help); picks the default proposer and model. Exits 2 on bad flags."""
    p = argparse.ArgumentParser(
        prog="agent.py",
        description="The overnight research loop: propose an edit to train.py, commit it on autoresearch/<tag>, "
                    "train for the fixed budget, keep it if the metric improved, else reset; log to results.tsv and "
                    "events.jsonl. Rerun the same command to resume after a stop, Ctrl-C or crash.")
    p.add_argument("--tag", required=True, help="run name: work happens on branch autoresearch/<tag> (created from "
                   "HEAD, or resumed if it exists)")
    p.add_argument("--target", default=str(Path(__file__).resolve().parent),
                   help="directory holding program.md, the frozen prepare.py and train.py (default: the directory of "
                   "agent.py, the repository root; e.g. grpo for the RL target)")
    p.add_argument("--proposer", choices=("anthropic", "openai", "random", "grid"),
                   help="who proposes edits. Default: anthropic if ANTHROPIC_API_KEY is set, else openai if "
                   "OPENAI_API_KEY is set (or --base-url is given); random/grid perturb train.py's UPPER_CASE "
                   "constants and need no key")
    p.add_argument("--model", help=f"LLM model (default: {DEFAULT_MODELS['anthropic']} for anthropic, "
                   f"{DEFAULT_MODELS['openai']} for openai)")
    p.add_argument("--base-url", help="API endpoint, e.g. an OpenAI-compatible server (vLLM, ollama, DeepSeek, "
                   "OpenRouter: http://localhost:8000/v1)")
    p.add_argument("--max-experiments", type=int, help="stop once this many experiments after the baseline are done "
                   "(counted over the whole tag, so a resumed run adds only the difference)")
    p.add_argument("--hours", type=float, help="stop before starting an experiment once this invocation has run "
                   "this long")
    p.add_argument("--max-cost-usd", type=float, help="stop once the tag's LLM spend reaches this many dollars")
    p.add_argument("--timeout", type=float, help="hard limit per training run in seconds (default: 2 x TIME_BUDGET, "
                   "at least TIME_BUDGET + 120); the whole process group is killed")
    p.add_argument("--seed", type=int, default=0, help="seed of --proposer random (default 0)")
    p.add_argument("--retry-base-delay", type=float, default=2.0, help="first backoff in seconds after a "
                   f"transient LLM error (default 2); it doubles per retry up to {RETRY_CAP_S:.0f}s, retried forever")
    args = p.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.tag) or ".." in args.tag or args.tag.endswith(".lock"):
        p.error(f"--tag {args.tag!r}: use letters, digits, '.', '_' and '-' (e.g. nov30)")
    for name in ("max_experiments", "hours", "max_cost_usd", "timeout"):
        value = getattr(args, name)
        if value is not None and value < 0 or name == "timeout" and value == 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.proposer is None:
        if os.environ.get("ANTHROPIC_API_KEY"):
            args.proposer = "anthropic"
        elif os.environ.get("OPENAI_API_KEY") or args.base_url:
            args.proposer = "openai"
        else:
            p.error("no LLM key: set ANTHROPIC_API_KEY or OPENAI_API_KEY, or run without an LLM with "
                    "--proposer random (or grid)")
    if args.model is None and args.proposer in DEFAULT_MODELS:
        args.model = DEFAULT_MODELS[args.proposer]
    return args


def main(argv=None):
    """Entry point. Exit codes: 0 clean stop at a limit, 1 stopped by a problem (message on stderr), 2 bad
    input or state (nothing changed), 130 interrupted (training killed, branch at the best commit)."""
    args = parse_args(argv)
    previous_sigterm = signal.signal(signal.SIGTERM, raise_interrupt)  # `kill` cleans up like Ctrl-C
    s = None
    try:
        target = Path(args.target).resolve()
        check_target(target)
        llm = make_llm(args)
        with lock_repo(open_repo(target)):
            ready = run_prepare(target, "--check", timeout=600)
            s, constants = open_session(args)
            s.llm = llm
            # a `profile: <name>` line from --check picks train.py's `if PROFILE == ...` branch for random/grid
            s.profile = (re.findall(r"^profile:\s*(\S+)\s*$", ready, re.M) or [None])[-1]
            s.system_prompt = SYSTEM_PROMPT.format(
                budget=s.budget, metric=s.metric, goal=goal_word(s),
                frozen="\n\n".join(f"=== {f} ===\n{read_text(target / f)}" for f in FROZEN))
            if constants["PREFLIGHT"]:
                say(s, "preflight: prepare.py --preflight ...")
                run_prepare(target, "--preflight", timeout=s.timeout)
            log_event(s, "config", proposer=args.proposer, model=args.model, base_url=args.base_url,
                      metric=s.metric, goal=s.goal, budget_s=s.budget, timeout_s=s.timeout,
                      max_experiments=args.max_experiments, hours=args.hours, max_cost_usd=args.max_cost_usd)
            say(s, f"autoresearch: {s.branch} at {s.best_commit[:7]}, {len(s.history)} experiments so far, proposer "
                   f"{args.proposer}{' ' + args.model if s.llm else ''}, budget {s.budget:g}s, timeout {s.timeout:g}s")
            reason = research_loop(s)
            log_event(s, "stop", reason=reason)
            say(s, f"stopped: {reason}. Branch {s.branch} at best {s.best_commit[:7]} ({s.metric} "
                   f"{s.best_metric:.6f}); rows in {RESULTS}, details in {EVENTS}")
            return 0
    except SetupError as e:
        print(f"agent.py: error: {redact(str(e))}", file=sys.stderr)
        return 2
    except Stop as e:
        clean_stop(s, "error", str(e))
        print(f"agent.py: stopped: {redact(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        clean_stop(s, "interrupted", "interrupted")
        print(f"\nagent.py: interrupted; the tree is at the best commit. Rerun the same command to resume.",
              file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)


def clean_stop(s, event, reason):
    """Leave the branch and train.py at the best commit and log why the loop ended (the training group is already
    dead: run_training kills it on any exception)."""
    if s is None or not s.best_commit:
        return
    reset_to_best(s)
    log_event(s, "stop", reason=reason, status=event)


def raise_interrupt(signum, frame):
    """SIGTERM handler: clean up exactly as for Ctrl-C."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
