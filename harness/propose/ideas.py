"""
HARNESS: proposing. Asks the proposer for ideas against the best train.py (k different ones in one call: a wave), turns
each answer into a train.py through the SEARCH/REPLACE format, sends an unusable answer back with the exact error (at
most MAX_REPAIRS times), refuses a train.py already measured or in flight, passes an LLM's idea through the gate
(harness.propose.outer: the tabu, the outer loop's freezes, search mechanisms) and shows it the exploration section, and
asks for a crashed candidate's fix. The ideas wait in a Backlog until a device takes them. It never trains and never
judges.
"""

import collections
import dataclasses
import functools
import re
import time

from harness import console, ledger
from harness.propose import outer
from harness.record import experiment
from harness.propose.edits import INVISIBLE, EditError, answer_for, apply_answer, fingerprint
from harness.gitops import GitError, file_at
from harness.propose.prompts import FIX_PROMPT, PROPOSE_PROMPT, REPAIR_PROMPT, WAVE_PROMPT, format_history, goal_word, \
    program_brief
from harness.propose.providers import Spend
from harness.tag import session
from harness.tag.session import best_source, describe, measured_as, touched_by
from harness.tag.settings import MAX_REPAIRS
from harness.run.target import FROZEN, read_text
from harness.schema import Event


@dataclasses.dataclass(frozen=True)
class Idea:
    """A proposal not run yet: the answer (SEARCH/REPLACE blocks against train.py of commit `base`), the train.py it
    gives, the repairs it took, what asking for it cost, and the wave (proposal call) it came from."""
    description: str
    source: str
    answer: str
    base: str
    repairs: int
    cost: Spend
    wave: int
    rebased_from: int | None = None     # a superseded winner re-run on the new best
    fixes: int = 0                      # an interrupted fix redone: its number, the experiment it fixes, its words
    fix_of: int | None = None
    fix_words: str = ""
    by: str = ""                        # who chose it when the proposer mixes (hybrid: the sampler or the LLM)
    why: str = ""                       # the LLM's reason for an override or a code edit
    moves: tuple = ()                   # what it changes (harness.propose.memory.Change), when the gate looked at it
    families: tuple = ()
    asked: str = ""                     # the family the bandit named for it
    shaped: tuple = ()                  # what shaped its prompt: the outer loop's guidance ("outer 2"), mechanisms

    @property
    def credit(self):
        """The experiment event's fields saying who proposed it and why, what it changes and what steered it (none
        for a plain proposer's idea)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in (
            ("by", self.by), ("why", self.why), ("moves", self.moves), ("families", self.families),
            ("asked_family", self.asked), ("shaped_by", self.shaped)) if v}


@dataclasses.dataclass(frozen=True)
class Job:
    """A candidate commit on a device: experiment n's fix number `fixes`, built on the best `base` (its metric and
    its runs are what it is judged against)."""
    n: int
    idea: Idea
    commit: str
    base: str
    base_metric: float
    fixes: int = 0
    cost: Spend = Spend()
    t0: float = dataclasses.field(default_factory=time.monotonic)   # when it was handed to its device
    fix_of: int | None = None           # a fix: the experiment whose crash it fixes (the idea's first)
    fix_words: str = ""                 # a fix: what it changed, in the proposer's words

    @property
    def texts(self):
        """(its row description, its commit message): the idea's, and for a fix what it fixed (experiment.fix_texts)."""
        if not self.fixes:
            return self.idea.description, self.idea.description
        return experiment.fix_texts(self.idea.description, self.fixes, self.fix_words)

    @property
    def description(self):
        return self.texts[0]


@dataclasses.dataclass
class Backlog:
    """What waits for a device: fixes (amended crashed candidates, run before anything new) and ideas (proposals
    not run yet, in order); wave counts the proposal calls; proposer and system are who is asked and how; mixer, for
    --proposer hybrid, proposes instead of the plain path: (s, backlog, n, train_src, running, k) -> [Idea]
    (harness.propose.hybrid.propose: the sampler's points, each shown to the LLM)."""
    proposer: object
    system: str
    mixer: object = None
    fixes: collections.deque = dataclasses.field(default_factory=collections.deque)
    ideas: collections.deque = dataclasses.field(default_factory=collections.deque)
    wave: int = 0


def propose(s, backlog, n, running, k=1):
    """Ask for k distinct ideas against the best train.py in one call (an LLM is asked for k different ideas at once;
    random/grid draw k times) for experiments n, n+1, ...; running: the Jobs on devices now. The prompt says which
    results are known and which candidates are still in flight. The usable ideas join backlog.ideas. Returns how many
    there were (0: no answer could be repaired)."""
    train_src, t0 = best_source(s), time.monotonic()
    plain_llm, gate = backlog.proposer.is_llm and backlog.mixer is None, None
    if plain_llm and outer.due(s):      # the outer loop's step (--outer-every), before the proposal it shapes
        outer.step(s, backlog, n)
    explore = ""
    if plain_llm:                       # the memory's section and gate: tabu, families, freezes, mechanisms
        explore, picks, shaped = outer.section(s, train_src, k)
        gate = functools.partial(gated, s, n, train_src, picks, shaped)
    prompt = PROPOSE_PROMPT.format(
        program=program_brief(read_text(s.tag.target / "program.md"), s.tag.budget), metric=s.tag.metric,
        goal=goal_word(s.tag.goal),
        history=format_history(s.history, s.tag.metric, s.rule.margin, touched_by(s)), pending=pending(s, running),
        train=train_src, explore=explore and f"\n{explore}\n")
    if k > 1:
        prompt += WAVE_PROMPT.format(k=k)
    ahead = (f" ahead while {', '.join(f'#{j.n}' for j in sorted(running, key=lambda j: j.n))} "
             f"{'trains' if len(running) == 1 else 'train'} (speculation)") if running else \
        " ahead while the baseline trains (speculation)" if not s.history else ""
    session.status(s, n, "proposing" + (f" {k} ideas" if k > 1 else "") + ahead)
    backlog.wave += 1
    found, llm = 0, backlog.proposer.is_llm
    if backlog.mixer is not None:              # the sampler's points, each shown to the LLM (harness.propose.hybrid)
        backlog.ideas.extend(ideas := backlog.mixer(s, backlog, n, train_src, running, k))
        found, llm, k = len(ideas), True, 0
    for i in range(1 if llm and k else k):     # samplers, grid: one draw per idea
        ideas = ask_for_edit(s, backlog, n + i, [{"role": "user", "content": prompt}], train_src, running,
                             k if llm else 1, gate=gate)
        backlog.ideas.extend(ideas)
        found += len(ideas)
    if s.pool is not None:
        s.pool.waited(time.monotonic() - t0)
    if not found:
        s.log(Event.SKIPPED, n=n, reason=f"no usable answer after {MAX_REPAIRS} repairs")
        console.say(f"#{n:<4} skipped  no usable answer after {MAX_REPAIRS} repairs (see {ledger.EVENTS})")
    return found


def pending(s, running):
    """The prompt's line on which results are known and which candidates are still running."""
    if not s.history:
        return "Results known: none yet: the baseline (#0, train.py as it is) is still training."
    last = len(s.history) - 1
    if not running:
        return f"Results known: all {len(s.history)} experiments so far (#0-#{last}); none running."
    return (f"Results known: experiments #0-#{last}. Still running, results not known yet (do not propose these "
            "again): " + "; ".join(f"#{j.n} {j.description}" for j in sorted(running, key=lambda j: j.n)))


def gated(s, n, train_src, picks, shaped, description, source, i):
    """The gate of an LLM's idea i of an answer (harness.propose.outer.screen: tabu, freezes, mechanisms; EditError when
    refused): the Idea fields saying what it changes, the family the bandit named for it, what shaped its prompt."""
    change = outer.screen(s, n + i, description, train_src, source)
    return dict(moves=change.moves, families=change.families, asked=picks[i] if i < len(picks) else "",
                shaped=tuple(shaped))


def ask_for_edit(s, backlog, n, messages, train_src, running=(), k=1, read=None, again=REPAIR_PROMPT, gate=None):
    """One conversation with the proposer: an answer with no usable idea goes back with the exact error, at most
    MAX_REPAIRS times. An answer may hold up to k ideas (a DESCRIPTION line each, then its blocks); the unusable
    ones of an answer that has some usable ones are dropped (logged). read(text) -> [(description, source, answer,
    by, why)] reads another kind of answer (the hybrid's, whose repair request is `again`), raising EditError.
    gate(description, source, i) -> the Idea's extra fields, raising EditError when it refuses idea i (see gated).
    Returns the usable Ideas, [] if none."""
    before = s.spend
    for repair in range(MAX_REPAIRS + 1):
        reply = backlog.proposer.ask(backlog.system, messages, train_src, n)
        s.paid(reply.spend)
        s.log(Event.PROPOSE, n=n, repair=repair, proposer=s.settings.proposer, model=s.settings.model,
              input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
              cost_usd=round(reply.cost_usd, 6), llm_seconds=round(reply.seconds, 3), wave=backlog.wave)
        ideas, errors = [], []
        for at, answer in enumerate(split_ideas(reply.text)[:k] if read is None else [reply.text]):
            try:
                for description, source, text, by, why in read(answer) if read else \
                        [(*apply_answer(answer, train_src, FROZEN), answer, "", "")]:
                    check_new(s, source, [*in_flight(backlog, running), *ideas])
                    extra = gate(description, source, at) if gate else {}   # its place in the answer
                    ideas.append(Idea(description, source, text, s.best_commit, repair, Spend(), backlog.wave,
                                      by=by, why=why, **extra))
            except EditError as e:
                errors.append(str(e))
        cost = (s.spend - before).share(max(1, len(ideas)))
        if ideas:
            for error in errors:
                s.log(Event.DROPPED, n=n, error=error)
            return [dataclasses.replace(i, cost=cost) for i in ideas]
        error = errors[0] if len(errors) == 1 else "; ".join(f"idea {i + 1}: {e}" for i, e in enumerate(errors))
        s.log(Event.REPAIR, n=n, repair=repair, error=error, answer=reply.text[-4000:])
        messages = messages + [{"role": "assistant", "content": reply.text},
                               {"role": "user", "content": again.format(error=error)}]
    return []


def check_new(s, source, others=()):
    """Raise EditError (the message for the LLM) when this train.py was already measured, or is one of `others` (the
    ideas running, about to run, or of the same answer)."""
    if (earlier := measured_as(s, source)) is not None:
        raise EditError(f"the resulting train.py is the code of experiment {describe(earlier, s.tag.metric)} (comments "
                        "and spacing aside), already measured: propose a different idea")
    if (mine := fingerprint(source)) and any(fingerprint(i.source) == mine for i in others):
        raise EditError("the resulting train.py is the same as a candidate still running or about to run: propose a "
                        "different idea")


def in_flight(backlog, running):
    """The ideas asked for but not recorded yet: running on a device (the Jobs `running`), or waiting to run."""
    return [job.idea for job in running] + list(backlog.ideas)


def rebase(s, idea, backlog, running):
    """An idea written against an older best (prepared while a candidate that was kept trained), re-applied to the
    best. Returns the new Idea, or None (logged as dropped) when it no longer applies, or gives a train.py already
    measured or in flight."""
    try:
        description, source = apply_answer(idea.answer, best_source(s), FROZEN)
        check_new(s, source, in_flight(backlog, running))
    except EditError as e:
        s.log(Event.DROPPED, idea=idea.description, base=idea.base, best=s.best_commit, error=str(e),
              rebased_from=idea.rebased_from)
        console.say(f"      dropped  {idea.description!r}: written for {idea.base[:7]}, the best is now "
                    f"{s.best_commit[:7]} and {e}")
        return None
    s.log(Event.REAPPLIED, idea=idea.description, base=idea.base, best=s.best_commit)
    return dataclasses.replace(idea, description=description, source=source, base=s.best_commit)


def unfinished(s):
    """The ideas a stop (kill -9, Ctrl-C, a reboot) left unmeasured, to run first, with no proposer asked and nothing
    paid again: superseded winners whose re-run on the new best had not started, then the candidates committed but
    not recorded, in experiment order (each its last commit). Each is re-applied to the best like any idea (one that
    no longer applies is dropped then, and the proposer asked)."""
    events = [e for e in ledger.read_events(s.tag.target / ledger.EVENTS) if e.get("tag") == s.settings.tag]
    recorded = len(s.history)
    commits = {e["n"]: e for e in events if e.get("event") == Event.COMMIT and e.get("n", -1) >= recorded}
    later, sources = [], set()
    for _, e in sorted(commits.items()):        # one train.py once: a redo committed again under a later number
        idea = idea_of(s, e["full_commit"], fix_of=e.get("fix_of"))   # (a second stop) is the same idea, and so is
        #                                                                   a measured one
        if idea is not None and idea.source not in sources and measured_as(s, idea.source) is None:
            later.append(idea)
            sources.add(idea.source)
    begun = {e.get("rebased_from") for e in s.history} | {    # re-runs recorded, or dropped (they no longer apply)
        e.get("rebased_from") for e in events if e.get("event") == Event.DROPPED}
    pending = {idea.description for idea in later}                      # re-runs committed: redone as `later`
    first = [idea for e in s.history if e.get("superseded") and e["n"] not in begun
             and (idea := idea_of(s, e["full_commit"], e["n"])) and idea.description not in pending]
    for idea in first + later:
        s.log(Event.REDO, idea=idea.description, base=idea.base, rebased_from=idea.rebased_from)
    return first + later


def idea_of(s, commit, rebased_from=None, fix_of=None):
    """The Idea of a candidate commit (its subject, its train.py, an answer re-creating it on its parent; a fix of
    experiment fix_of keeps its number and words from the message's "fix N: ..." line), or None (logged) when git
    cannot read it."""
    try:
        c = s.repo.commit(commit)
        base = c.parents[0].hexsha
        old, new = file_at(s.repo, base, s.tag.train_rel), file_at(s.repo, commit, s.tag.train_rel)
    except (GitError, ValueError, IndexError, KeyError) as e:
        s.log(Event.DROPPED, commit=commit, error=f"cannot read the candidate: {e}"[:500])
        return None
    fix = re.search(r"(?m)^fix (\d+): (.*)$", c.message) if fix_of is not None else None
    return Idea(c.summary, new, answer_for(c.summary, old, new), base, 0, Spend(), 0, rebased_from,
                fixes=int(fix.group(1)) if fix else 0, fix_of=fix_of if fix else None,
                fix_words=fix.group(2) if fix else "")


def on_llm_retry(s, retry, problem, delay):
    """A transient LLM error while asking: log it and print a line per retry (an outage overnight is visible in a
    log file too, at most one line a RETRY_CAP_S once the backoff is at its cap)."""
    s.log(Event.ERROR, where="llm", retry=retry, error=problem[:500], retry_in_s=round(delay, 3))
    console.say(f"LLM error ({problem[:120]}): retry {retry + 1} in {delay:.0f}s")


def split_ideas(answer):
    """An answer's ideas: the text from each DESCRIPTION line to the next (the whole answer when it has at most one)."""
    starts = [m.start() for m in re.finditer(rf"(?m)^[ \t]*(?:{INVISIBLE.pattern})*DESCRIPTION:", answer)]
    if len(starts) <= 1:
        return [answer]
    return [answer[a:b] for a, b in zip(starts, starts[1:] + [len(answer)])]


def job_for(s, n, idea):
    """Commit an idea as experiment n's candidate on top of the best and make its Job (a redone fix stays that fix,
    with its number and words)."""
    job = Job(n, idea, "", s.best_commit, s.best_metric, idea.fixes, idea.cost,
              fix_of=idea.fix_of, fix_words=idea.fix_words)
    return dataclasses.replace(job, commit=experiment.commit(s, n, idea.source, job.texts[1], job.fixes,
                                                             fix_of=job.fix_of))


def ask_fix(s, backlog, job, n, reason, log_tail):
    """The crashed candidate (recorded as a crash) goes back to the LLM with its reason and log tail; a usable fix
    amends its commit (same parent) and becomes experiment n, the idea's next fix, with its own row as every measured
    candidate has (`try --fix` does the same). Returns that Job, or None."""
    with s.lock:                        # the devices' threads use the repository too
        crashed_src = file_at(s.repo, job.commit, s.tag.train_rel)
    prompt = FIX_PROMPT.format(description=job.idea.description, reason=reason, tail=log_tail, train=crashed_src)
    session.status(s, job.n, f"asking for fix {job.fixes + 1}")
    t0 = time.monotonic()
    fixed = ask_for_edit(s, backlog, n, [{"role": "user", "content": prompt}], crashed_src)
    s.pool.waited(time.monotonic() - t0)
    if not fixed:
        return None
    fix, fix_of = job.fixes + 1, job.n if job.fix_of is None else job.fix_of
    sha = experiment.commit(s, n, fixed[0].source, experiment.fix_texts(job.idea.description, fix,
                                                                         fixed[0].description)[1], fix=fix,
                            amend=job.commit, fix_of=fix_of)
    return dataclasses.replace(job, n=n, commit=sha, fixes=fix, cost=fixed[0].cost, t0=time.monotonic(),
                               fix_of=fix_of, fix_words=fixed[0].description)
