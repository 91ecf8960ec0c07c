"""
HARNESS: every word the LLM reads. The prompt templates (system prompt, proposal, crash fix, repair) and the
history table they carry. Pure text: never touches files, git or the network.
"""

import collections
import re

from harness.judge.curves import Cancel
from harness.ledger import has_metric, results_row

HISTORY_ROWS = 60               # newer rows shown in full; older ones are summarised
NEAR_MISSES = 10                # the newest discards within the noise margin, listed apart as ideas to combine

SYSTEM_PROMPT = """\
You are an autonomous ML researcher. You improve a training script, train.py, one experiment at a time.
Each experiment trains for a fixed time budget of {budget:g} seconds and is judged by {metric}
({goal} is better), computed by the frozen evaluation in prepare.py. {rule} A train.py identical to one
already measured is refused. Only train.py may change: prepare.py and its evaluation are
read-only, and train.py must not write to any file but its own outputs.

Answer with exactly one idea (unless the request asks for several), in this plain-text format and nothing else:

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
# program.md (the human's instructions: the goal, the rules, the research directions)
{program}

# Experiment history ({metric}, {goal} is better; the best kept version is the current train.py)
{history}

{pending}
{explore}
# Current train.py
```python
{train}
```

Propose the next experiment: one idea, as a DESCRIPTION line and SEARCH/REPLACE blocks against this train.py. Do
not repeat an idea the history shows; end the DESCRIPTION with the earlier experiments the idea builds on, e.g.
"(builds on #4, #9)", or "(new)"."""

WAVE_PROMPT = """

This time propose {k} experiments: they run at the same time, one per device, each against this same train.py.
Make them {k} genuinely different ideas (not {k} variants of one), each a DESCRIPTION line followed by its own
SEARCH/REPLACE blocks, one after the other."""

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

HYBRID_PROMPT = """\
# program.md (the human's instructions: the goal, the rules, the research directions)
{program}

# The numeric search
A {sampler} sampler (Optuna) sets train.py's UPPER_CASE constants; every experiment, whoever chose it, is told to it.
{metric}: {goal} is better. Its state:
{state}

Its next point, experiment #{n}: {point}

Answer with exactly one of these, and nothing else:
- {{"decision": "accept", "reason": "<why>"}} to run the sampler's point as it is;
{override}{code}"""

HYBRID_OVERRIDE = """\
- {"decision": "override", "values": {"NAME": value, ...}, "reason": "<why>"} to replace some of its values (the
  others stay the sampler's; each within the range above; at most a share of the experiments may be overridden, so
  override only when the history shows the point is a poor bet);
"""

HYBRID_CODE = """\
- or, since the numeric search has gone {stall} experiments without a keep, a code edit instead of a point: not
  JSON but the usual format (a DESCRIPTION line, then SEARCH/REPLACE blocks against the train.py below), with a
  line `REASON: <why>`.

# Experiment history
{history}

# Current train.py
```python
{train}
```
"""

HYBRID_REPAIR = """\
Your answer was rejected: {error}
Answer again with one JSON object as described{code}."""

OUTER_GUIDANCE = """\
You oversee an automated search that edits train.py one experiment at a time (an LLM proposes, a fixed-budget run
measures, a keep or discard follows). Its trace so far:

{trace}

Families tried at least 3 times in the last experiments without a keep are now frozen (refused) until the next
review: {frozen}.

Write guidance for the proposer's next {k} experiments, at most 8 short lines of plain text: which directions look
promising and why, which look exhausted, what was never tried and deserves a try (including reversing a direction
that failed). Answer with the guidance only."""

# The outer loop's four rounds (Bilevel Autoresearch, Qu & Lu 2026: explore, critique, specify, generate), one
# conversation; the last answer holds the module.
MECHANISM_ROUNDS = (
    ("explore", """\
You oversee an automated search that edits train.py one experiment at a time. Its trace so far:

{trace}

Round 1 of 4 (explore): where does this search repeat itself, get stuck, or leave whole directions untried? Name the
patterns with experiment numbers."""),
    ("critique", """\
Round 2 of 4 (critique): a search mechanism is a small Python module the harness consults: it can review every
proposal before it runs (refuse it, with a reason the proposer reads) and write guidance into the proposer's prompt.
Which of the patterns could one break, and what could go wrong (refusing good ideas, steering into a dead end)?"""),
    ("specify", """\
Round 3 of 4 (specify): specify one mechanism against this interface, exactly: what review() refuses and when, what
guidance() says. Keep it simple and deterministic.

{interface}"""),
    ("generate", """\
Round 4 of 4 (generate): write the module. Answer with one ```python block holding the whole module (the standard
library only) and nothing else."""),
)

REPAIR_PROMPT = """\
Your answer was rejected: {error}
Answer again in the exact format (a DESCRIPTION line, then SEARCH/REPLACE blocks against the same train.py)."""



# Sections of program.md written for an external coding agent that runs the loop itself (shell commands, git, the
# results file): agent.py does all of that, so the proposer never reads them.
HARNESS_SECTIONS = ("setup", "output", "output format", "logging results", "the experiment loop",
                    "fallback: the manual loop")


def program_brief(program, budget):
    """What the proposer needs of program.md: every section except HARNESS_SECTIONS (## headings, any case), with
    the document's own "5 minutes" / "five-minute" budget wording replaced by this run's budget in seconds."""
    parts = re.split(r"(?m)^(?=## )", program)
    kept = [part for part in parts
            if not (part.startswith("## ") and part[3:].splitlines()[0].strip().lower() in HARNESS_SECTIONS)]
    text = "".join(kept).strip()
    text = re.sub(r"\b(?:5|five)[- ]minutes?\b(?= training)", f"{budget:g}-second", text, flags=re.I)
    return re.sub(r"\b(?:5|five) minutes\b", f"{budget:g} seconds", text, flags=re.I) + "\n"


def goal_word(goal):
    """"lower" or "higher": how the prompts say the metric's direction ("min" or "max")."""
    return "lower" if goal == "min" else "higher"


def format_history(history, metric, margin=0.0, touched=None):
    """A tag's "experiment" events as a table with each one's change vs the best it was measured against (delta);
    beyond HISTORY_ROWS, older rows are grouped by what they touched (touched: n -> the UPPER_CASE constants an
    experiment changed, or "code") with their counts and best and worst deltas, and their kept ones listed; then the
    near-misses: discards that came within the noise margin of their base, the newest NEAR_MISSES, as ideas to
    combine."""
    if not history:
        return "(none yet)"
    old, new = history[:-HISTORY_ROWS], history[-HISTORY_ROWS:]
    lines = [f"n\tdelta\tcommit\t{metric}\tmemory_gb\tstatus\tdescription"]
    if old:
        counts = collections.Counter(e["status"] for e in old)
        lines.append(f"({len(old)} older experiments: {counts['keep']} keep, {counts['discard']} discard, "
                     f"{counts['crash']} crash; by what they changed:)")
        groups = collections.defaultdict(list)
        for e in old[1:]:                       # the baseline changed nothing
            groups[(touched or {}).get(e["n"], "?")].append(e)
        for what, group in sorted(groups.items(), key=lambda item: -len(item[1])):
            deltas = sorted(e["metric"] - e["base_metric"] for e in group if delta(e) != "-")
            spread = f", deltas {deltas[0]:+.6f} .. {deltas[-1]:+.6f}" if deltas else ""
            status = collections.Counter(e["status"] for e in group)
            lines.append(f"  {what}: {len(group)} tried ({status['keep']} keep, {status['discard']} discard, "
                         f"{status['crash']} crash){spread}")
        lines.append("(their kept ones:)")
        new = [e for e in old if e["status"] == "keep"] + new
    lines += [f"{e['n']}\t{delta(e)}\t{results_row(e)}" + (f" [{Cancel(**e['cancelled']).words()}]"
                                                          if e.get("cancelled") else "") for e in new]
    near = [e for e in history if e["status"] == "discard" and delta(e) != "-"
            and abs(e["metric"] - e["base_metric"]) <= margin][-NEAR_MISSES:]
    if near:
        lines.append(f"\nNear-misses (discarded within the noise margin {margin:.6f} of their base: worth combining):")
        lines += [f"#{e['n']} ({delta(e)}): {e['description']}" for e in near]
    return "\n".join(lines)


def delta(e):
    """An experiment's metric minus that of the best it was measured against ("-" for the baseline and crashes)."""
    if e["n"] == 0 or not has_metric(e) or e.get("base_metric") is None:
        return "-"
    return f"{e['metric'] - e['base_metric']:+.6f}"
