"""
HARNESS: the hybrid proposer (Centaur-style: a sampler whose state an LLM reads). The sampler proposes each point; the
LLM, shown the sampler's state, accepts it or overrides some of its values (on at most --llm-share of the
experiments), or writes a code edit once the numeric search has stalled (--stall experiments without a keep or a
code edit). An unusable answer goes back with the exact error, then the sampler's point runs. Every override and
code edit carries the LLM's reason; the study is told of every point run, whoever chose it (harness.propose.search).
"""

import json
import re

from harness.propose import ideas, search, searchspace
from harness.propose.edits import MARKERS, EditError, apply_answer
from harness.propose.providers import Spend
from harness.propose.prompts import HYBRID_CODE, HYBRID_OVERRIDE, HYBRID_PROMPT, HYBRID_REPAIR, format_history, goal_word, \
    program_brief
from harness.tag.session import touched_by
from harness.tag.settings import MAX_REPAIRS
from harness.run.target import FROZEN, read_text
from harness.schema import Event

OVERRIDE, CODE = "llm override", "llm code"     # an experiment's `by` when the LLM chose it


def propose(s, backlog, n, train_src, running, k):
    """k ideas for experiments n, n+1, ...: each the sampler's next point, shown to the LLM when it may override
    (the share allows) or write code (stalled). Returns the usable Ideas."""
    found = []
    for i in range(k):
        idea = one(s, backlog, n + i, train_src, [*running], found)
        if idea is not None:
            found.append(idea)
    return found


def one(s, backlog, n, train_src, running, found):
    """One idea: the sampler's point (a new one when it repeats a measured train.py, at most MAX_REPAIRS times),
    then the LLM's decision on it when one is open; None when the sampler has nothing new."""
    a, sampler = s.settings, s.settings.sampler
    for attempt in range(MAX_REPAIRS + 1):
        answer, point = search.suggest(s, sampler, train_src, n, attempt)
        try:
            description, source = apply_answer(answer, train_src, FROZEN)
            ideas.check_new(s, source, [*ideas.in_flight(backlog, running), *found])
            break
        except EditError as e:
            s.log(Event.REPAIR, n=n, repair=attempt, error=str(e), answer=answer[-4000:])
    else:
        return None
    mine = ideas.Idea(description, source, answer, s.best_commit, 0, Spend(), backlog.wave, by=sampler)
    may_override, stalled = override_open(s, backlog, running, found), since_change(s) >= a.stall
    if not (may_override or stalled):
        return mine                     # the LLM is not asked: nothing it may change
    prompt = HYBRID_PROMPT.format(
        program=program_brief(read_text(s.tag.target / "program.md"), s.tag.budget), sampler=sampler,
        metric=s.tag.metric,        goal=goal_word(s.tag.goal), state=search.state_words(s, s.tag.metric), n=n,
        point=search.shown(search.of(s).space, point), override=HYBRID_OVERRIDE if may_override else "",
        code=HYBRID_CODE.format(stall=since_change(s), train=train_src, history=format_history(
            s.history, s.tag.metric, s.rule.margin, touched_by(s))) if stalled else "")
    read = lambda text: decide(s, text, train_src, point, mine, may_override, stalled)   # noqa: E731
    chosen = ideas.ask_for_edit(s, backlog, n, [{"role": "user", "content": prompt}], train_src, running, read=read,
                                again=HYBRID_REPAIR.replace("{code}", " (or a code edit)" if stalled else ""))
    if not chosen:
        s.log(Event.HYBRID, n=n, decision="sampler", reason="no usable answer: the sampler's point runs")
        return mine
    if chosen[0].by != sampler:
        search.drop(s, n)               # the sampler's point did not run: its trial is closed
    s.log(Event.HYBRID, n=n, decision=chosen[0].by, reason=chosen[0].why)
    return chosen[0]


def decide(s, text, train_src, point, mine, may_override, stalled):
    """The LLM's answer as [(description, source, answer, by, why)]: the sampler's idea (accepted), an override of
    some of its values, or a code edit. Raises EditError with the exact problem (sent back as the repair)."""
    if MARKERS[0] in text:
        if not stalled:
            raise EditError("a code edit is not open now (the numeric search has not stalled): answer with the JSON "
                            "object")
        description, source = apply_answer(text, train_src, FROZEN)
        why = re.search(r"(?m)^[ \t]*REASON:(.*)$", text)
        return [(description, source, text, CODE, (why.group(1).strip() if why else "")[:500])]
    answer = json_object(text)
    decision, reason = answer.get("decision"), str(answer.get("reason", ""))[:500]
    if decision == "accept":
        return [(mine.description, mine.source, mine.answer, mine.by, reason)]
    if decision != "override" or not may_override:
        opened = '"accept"' + (' or "override"' if may_override else "")
        raise EditError(f'"decision" is {decision!r}: it must be {opened}')
    space = search.of(s).space
    values = answer.get("values")
    if not isinstance(values, dict) or not values:
        raise EditError('an override needs "values": an object of NAME: value, e.g. {"MATRIX_LR": 0.05}')
    unknown = sorted(set(values) - set(point))
    if unknown:
        raise EditError(f"unknown parameter(s) {', '.join(unknown)}: the search has {', '.join(point)}")
    changed = dict(point)
    for name, value in values.items():
        p = space[name]
        if (x := p.internal(value)) is None:        # a string, a bool, null or a number out of range
            raise EditError(f"{name} = {json.dumps(value)[:100]} is not a value of it ({p.words()})")
        changed[name] = x
    answer_text, _ = searchspace.write_point(train_src, s.tag.profile, space, changed, OVERRIDE)
    description, source = apply_answer(answer_text, train_src, FROZEN)
    return [(description, source, answer_text, OVERRIDE, reason)]


def json_object(text):
    """The one JSON object of an answer (bare, or in a ```json fence). Raises EditError saying what is wrong."""
    body = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.S)
    body = fenced.group(1) if fenced else body
    try:
        answer = json.loads(body)
    except json.JSONDecodeError as e:
        raise EditError(f"the answer is not valid JSON ({e}): answer with one JSON object, e.g. "
                        '{"decision": "accept", "reason": "..."}') from None
    if not isinstance(answer, dict):
        raise EditError(f"the answer is JSON but a {type(answer).__name__}, not an object")
    return answer


def override_open(s, backlog, running, found):
    """Whether one more override keeps the LLM's overrides within --llm-share of the experiments after the baseline
    (those recorded, running, waiting and this one)."""
    pending = [*ideas.in_flight(backlog, running), *found]
    overrides = sum(e.get("by") == OVERRIDE for e in s.history) + sum(i.by == OVERRIDE for i in pending)
    total = max(0, len(s.history) - 1) + len(pending) + 1
    return overrides + 1 <= s.settings.llm_share * total


def since_change(s):
    """Experiments recorded since the last keep or the last code edit by the LLM (whichever is later)."""
    last = max([0] + [e["n"] for e in s.history if e["status"] == "keep" or e.get("by") == CODE])
    return max(0, len(s.history) - 1 - last)
