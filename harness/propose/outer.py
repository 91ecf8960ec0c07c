"""
HARNESS: the outer loop and the gate every proposal passes. The gate (screen): a proposal is refused before any run
when the tabu refuses it (harness.propose.memory), when it is in a family the outer loop froze, or when an active search
mechanism's review refuses it; each refusal is a "refused" event and goes back to the proposer as a repair. The
prompt's exploration section (section): the memory's families and bandit picks, the freezes, the guidance. The outer
loop (--outer-every K, step): every K experiments it freezes families tried >= FREEZE_AFTER times with no keep and
asks the LLM for guidance (the paper's Level 1.5); every second step it also asks, in four rounds (explore,
critique, specify, generate), for a search mechanism (Level 2), which is committed under
refs/autoresearch/<tag>/mechanisms/<id>, validated on the recorded trace and only then activated
(harness.propose.mechanisms). A mechanism that fails is deactivated with an event and a line, never silently. Its state
is rebuilt from the events on every start. Never trains, never judges, never moves a branch.
"""

import dataclasses
import difflib
import re

from harness import console, gitops, ledger
from harness.propose import mechanisms, memory
from harness.propose.edits import EditError
from harness.propose.prompts import MECHANISM_ROUNDS, OUTER_GUIDANCE, format_history
from harness.schema import Event

FREEZE_AFTER = 3                # a family tried this often in the last 2K experiments with no keep is frozen
MAX_ACTIVE = 2                  # active mechanisms at once: a new one retires the oldest


@dataclasses.dataclass
class Mechanism:
    """An active search mechanism: its id (m1, m2, ...), its module's text, the ref it is committed under, the
    functions it defines, and how many proposals it refused in a row (MAX_REPAIRS + 1 in a row: deactivated)."""
    id: str
    source: str
    ref: str
    functions: list
    refusals_in_a_row: int = 0


@dataclasses.dataclass
class State:
    """The outer loop's state, rebuilt from the events: the outer steps done, the families frozen now ({family:
    words}), the last usable guidance and its step, the active mechanisms, the mechanisms designed so far, the tabu
    tenure in force."""
    steps: int = 0
    frozen: dict = dataclasses.field(default_factory=dict)
    guidance: str = ""
    guidance_step: int = 0
    active: list = dataclasses.field(default_factory=list)
    designed: int = 0
    tenure: int = memory.TENURE
    refused: dict = dataclasses.field(default_factory=dict)    # experiment n -> families refused for it (this run)
    idle_said: bool = False             # the line saying the mechanisms are skipped (no sandbox) was printed


def state(s):
    """The session's outer State, rebuilt from this tag's events the first time (a resume restores the freezes, the
    guidance, the active mechanisms and the tenure; --tabu given now wins over the recorded one). The loop records
    a "memory" event with the settings it runs with when they differ from the last recorded (`try` uses the tag's)."""
    if s.outer is not None:
        return s.outer
    st, last = State(), {}
    events = [e for e in ledger.read_events(s.tag.target / ledger.EVENTS) if e.get("tag") == s.settings.tag]
    for e in events:
        if e.get("event") == Event.MEMORY:
            last = e
            st.tenure = e.get("tabu", st.tenure)
        elif e.get("event") == Event.OUTER:
            st.steps, st.frozen = e["step"], e.get("frozen") or {}
            if e.get("guidance"):
                st.guidance, st.guidance_step = e["guidance"], e["step"]
        elif e.get("event") == Event.MECHANISM:
            act = e.get("action")
            if act == "proposed":
                st.designed += 1
            elif act == "activated":
                source = committed_source(s, e.get("ref", ""))
                if source is not None:
                    st.active.append(Mechanism(e["id"], source, e["ref"], mechanisms.functions(source)))
            elif act in ("deactivated", "retired"):
                st.active = [m for m in st.active if m.id != e["id"]]
    s.outer = st
    a = s.settings
    if a.tabu is not None:
        st.tenure = a.tabu
    now = dict(tabu=st.tenure, explore=a.explore, outer_every=a.outer_every)
    if a.command == "loop" and any(last.get(k) != v for k, v in now.items()):     # what this invocation runs with
        s.log(Event.MEMORY, **now)
    return st


def committed_source(s, ref):
    """The mechanism.py committed under ref, or None (logged) when git cannot read it."""
    try:
        with s.lock:
            return gitops.file_at(s.repo, ref, "mechanism.py")
    except (gitops.GitError, ValueError, KeyError) as e:
        s.log(Event.WARNING, reason=f"cannot read the mechanism at {ref}: {e}"[:300])
        return None

# ---------------------------------------------------------------------------
# The gate and the prompt's section
# ---------------------------------------------------------------------------


def screen(s, n, description, before, after, by="loop", review=True):
    """Refuse a proposal (train.py `before` -> `after`) before any run: raises EditError with the words for the
    proposer (a "refused" event is logged) when the tabu, a freeze or (review) an active mechanism refuses it.
    Returns its memory.Change. A mechanism that fails while reviewing is deactivated and the proposal goes on."""
    st = state(s)
    change = memory.change_of(before, after)
    refusal = memory.refused(s, change, st.tenure, st.frozen)
    if refusal is None and review:
        refusal = reviewed(s, n, description, change, before, after)
    if refusal is not None:
        st.refused.setdefault(n, set()).update(change.families)
        s.log(Event.REFUSED, n=n, rule=refusal.rule, repeats=refusal.repeats, moves=list(change.moves),
              families=list(change.families), by=by, reason=refusal.words)
        raise EditError(refusal.words)
    return change


def reviewed(s, n, description, change, before, after):
    """The first refusal of the active mechanisms that review (a memory.Refusal), or None."""
    diff = "\n".join(difflib.unified_diff(before.splitlines(), after.splitlines(), "train.py", "train.py",
                                          lineterm="", n=1))
    for m in [m for m in state(s).active if "review" in m.functions and not idle(s)]:
        key = f"p{n}"
        try:
            ok, reason = mechanisms.check_review(mechanisms.run(s, m.source, [("review", [
                mechanisms.proposal_json(key, n, description, change, diff), mechanisms.history_json(s)])])[0], key)
        except mechanisms.Failed as e:
            deactivate(s, m, str(e))
            continue
        if not ok:
            m.refusals_in_a_row += 1
            if m.refusals_in_a_row > mechanisms.MAX_IN_A_ROW:
                deactivate(s, m, f"it refused {m.refusals_in_a_row} proposals in a row")
                continue
            return memory.Refusal(f"the search mechanism {m.id} refused it: {reason or 'no reason given'}", None,
                                  f"mechanism {m.id}")
        m.refusals_in_a_row = 0
    return None


def idle(s):
    """True when the active mechanisms cannot run now (--sandbox off, or no working sandbox on this machine): they
    are skipped, not deactivated (a resume where the sandbox works uses them again); said once per invocation."""
    st, why = state(s), mechanisms.unavailable(s)
    if why is not None and st.active and not st.idle_said:
        st.idle_said = True
        s.log(Event.WARNING, reason=f"the active search mechanisms are skipped: {why}")
        console.say(f"warning: the active search mechanisms are skipped: {why}")
    return why is not None


def deactivate(s, m, reason):
    """Take mechanism m out of the search, with an event and a line: the search goes on without it."""
    st, reason = state(s), " ".join(str(reason).split())[:300]     # its words: one line
    st.active = [x for x in st.active if x.id != m.id]
    s.log(Event.MECHANISM, id=m.id, action="deactivated", reason=reason, ref=m.ref, after=len(s.history) - 1)
    console.say(f"      search mechanism {m.id} deactivated: {reason}; the search goes on without it")


def section(s, source, k):
    """(the prompt's exploration section, the bandit's k picks, who shaped it) for k proposals on train.py `source`:
    the memory's families and tabu, the freezes, the outer loop's guidance and the active mechanisms' guidance
    (a mechanism that fails here is deactivated). The bandit does not pick a family whose proposals were refused for
    an experiment not recorded yet (asked again, it would name the same one). shaped: ["outer 2", "m1"], what the
    proposals were shaped by."""
    st = state(s)
    avoid = {f for n, families in st.refused.items() if n >= len(s.history) for f in families}   # refused just now
    picks = memory.explore(s, source, k, {**dict.fromkeys(avoid, ""), **st.frozen}) if s.settings.explore == "on" \
        else []
    parts, shaped = [memory.prompt_words(s, source, picks, st.tenure, st.frozen)], []
    if st.guidance:
        parts.append(f"Guidance (the outer loop, step {st.guidance_step}):\n{st.guidance}")
        shaped.append(f"outer {st.guidance_step}")
    for m in [m for m in st.active if "guidance" in m.functions and not idle(s)]:
        try:
            words = mechanisms.check_guidance(mechanisms.run(s, m.source, [("guidance", [
                mechanisms.history_json(s)])])[0])
        except mechanisms.Failed as e:
            deactivate(s, m, str(e))
            continue
        if words:
            parts.append(f"Guidance (search mechanism {m.id}):\n{words}")
    shaped += [m.id for m in st.active]
    return "\n".join(parts), picks, shaped

# ---------------------------------------------------------------------------
# The outer loop
# ---------------------------------------------------------------------------


def due(s):
    """True when an outer step is due: --outer-every K is set and K more experiments were recorded since the last."""
    k = s.settings.outer_every
    return bool(k) and len(s.history) - 1 >= k * (state(s).steps + 1)


def step(s, backlog, n):
    """One outer step before proposing experiment n: the freezes, the guidance (Level 1.5), and on every second step
    a new search mechanism (Level 2). An unusable LLM answer is logged; the loop goes on with what it has."""
    st = state(s)
    i, k = st.steps + 1, s.settings.outer_every
    window = [e for e in s.history[1:]][-2 * k:]
    tries = {}
    for e in window:
        for family in memory.change_at(s, e).families:
            tries.setdefault(family, []).append(e)
    frozen = {f: f"{len(es)} tries in #{es[0]['n']}-#{es[-1]['n']}, none kept; frozen at outer step {i}"
              for f, es in tries.items() if len(es) >= FREEZE_AFTER and all(e["status"] != "keep" for e in es)}
    trace = trace_words(s)
    reply = ask(s, backlog, n, i, "guidance", [{"role": "user", "content": OUTER_GUIDANCE.format(
        trace=trace, k=k, frozen=", ".join(frozen) or "none")}])
    guidance = reply.strip()[:mechanisms.GUIDANCE_CHARS]
    st.steps, st.frozen = i, frozen
    if guidance:
        st.guidance, st.guidance_step = guidance, i
    s.log(Event.OUTER, step=i, after=len(s.history) - 1, frozen=frozen, guidance=guidance or None,
          error=None if guidance else "the LLM's guidance was empty: the previous guidance stays")
    console.say(f"      outer step {i}: {len(frozen)} families frozen ({', '.join(frozen) or 'none'}), guidance "
                + (f"{len(guidance)} characters" if guidance else "unusable (empty): the previous stays"))
    if i % 2 == 0:
        design(s, backlog, n, i, trace)


def ask(s, backlog, n, i, what, messages):
    """One outer-loop question to the proposer's LLM (its spend counted as a proposal's); the answer's text."""
    reply = backlog.proposer.ask(backlog.system, messages, "", n)
    s.paid(reply.spend)
    s.log(Event.PROPOSE, n=n, outer=i, round=what, proposer=s.settings.proposer, model=s.settings.model,
          input_tokens=reply.input_tokens, output_tokens=reply.output_tokens, cost_usd=round(reply.cost_usd, 6),
          llm_seconds=round(reply.seconds, 3), wave=backlog.wave)
    return reply.text or ""


def trace_words(s):
    """The trace the outer loop reads: the history table, each family's tries and best gain, the refusals so far."""
    stats = memory.family_stats(s)
    refusals = [e for e in ledger.read_events(s.tag.target / ledger.EVENTS)
                if e.get("tag") == s.settings.tag and e.get("event") == Event.REFUSED]
    families = ", ".join(f"{f}: {t} tries, best gain {b:+.6f}" if b is not None else f"{f}: {t} tries"
                         for f, (t, _, b) in sorted(stats.items(), key=lambda item: -item[1][0]))
    return (f"{format_history(s.history, s.tag.metric, s.rule.margin)}\n\nFamilies tried: {families or 'none'}\n"
            f"Proposals refused before running: {len(refusals)} (" + ", ".join(
                f"{r}: {sum(e.get('rule') == r for e in refusals)}" for r in sorted({e.get('rule') for e in refusals}))
            + ")")


def design(s, backlog, n, i, trace):
    """Level 2: the four-round dialogue, then the module committed, validated and activated (or rejected, with the
    reason in an event and a line)."""
    st = state(s)
    messages, answers = [], []
    for what, prompt in MECHANISM_ROUNDS:
        messages.append({"role": "user", "content": prompt.format(trace=trace, interface=mechanisms.INTERFACE)})
        answers.append(ask(s, backlog, n, i, what, messages))
        messages.append({"role": "assistant", "content": answers[-1] or "(no answer)"})
    code = re.findall(r"```(?:python|py)?[ \t]*\n(.*?)```", answers[-1], re.S)
    st.designed += 1
    mid = f"m{st.designed}"
    if not code:
        s.log(Event.MECHANISM, id=mid, action="proposed", step=i, ref=None)
        reject(s, mid, None, "the answer holds no ```python block")
        return
    source = code[-1]
    ref = commit(s, mid, i, source, answers)
    s.log(Event.MECHANISM, id=mid, action="proposed", step=i, ref=ref)
    problem = mechanisms.unavailable(s) or mechanisms.validate(s, source)
    if problem is not None:
        reject(s, mid, ref, problem)
        return
    while len(st.active) >= MAX_ACTIVE:
        old = st.active.pop(0)
        s.log(Event.MECHANISM, id=old.id, action="retired", reason=f"replaced by {mid}", ref=old.ref,
              after=len(s.history) - 1)
    st.active.append(Mechanism(mid, source, ref, mechanisms.functions(source)))
    s.log(Event.MECHANISM, id=mid, action="activated", step=i, ref=ref, functions=mechanisms.functions(source),
          after=len(s.history) - 1)
    console.say(f"      search mechanism {mid} activated ({', '.join(mechanisms.functions(source))}; committed as "
                f"{ref})")


def reject(s, mid, ref, reason):
    """A designed mechanism not activated: the event and the line."""
    reason = " ".join(str(reason).split())[:300]
    s.log(Event.MECHANISM, id=mid, action="rejected", reason=reason, ref=ref)
    console.say(f"      search mechanism {mid} rejected: {reason}")


def commit(s, mid, i, source, answers):
    """Commit the module (mechanism.py) and the dialogue that made it (dialogue.md) for review, as a parentless commit
    under refs/autoresearch/<tag>/mechanisms/<id>. Returns the ref."""
    from harness.redact import redact
    rounds = "\n\n".join(f"## {what}\n\n{redact(text)}" for (what, _), text in zip(MECHANISM_ROUNDS, answers))
    ref = f"refs/autoresearch/{s.settings.tag}/mechanisms/{mid}"
    with s.lock:
        sha = gitops.commit_files(s.repo, {"mechanism.py": source, "dialogue.md": rounds},
                                  f"search mechanism {mid} (tag {s.settings.tag}, outer step {i})")
        s.repo.git.update_ref(ref, sha)
        s.expect_ref(ref)
    return ref
