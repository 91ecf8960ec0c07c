"""
HARNESS: the overnight research loop. Start it, go to bed, read `git log autoresearch/<tag>` and results.tsv
in the morning.

    uv run agent.py --tag nov30                        # LLM proposer (ANTHROPIC_API_KEY or OPENAI_API_KEY)
    uv run agent.py --tag nov30 --proposer random      # no API key: random hyperparameter perturbations
    uv run agent.py --tag nov30 --target grpo          # another target: a dir with program.md, prepare.py, train.py
    uv run agent.py --help                             # every flag

This file is the loop and its rules, nothing else; research_loop() is program.md's LOOP FOREVER, with every device
busy (--devices, --ray; one device by default):
    propose     ask for ideas while candidates train (speculation), N different ones in one call when N devices are
                free: an answer -> search/replace edits to train.py, repaired at most twice
    commit      a free device takes the next idea: a candidate commit on the best (re-applied if the best moved)
    run         on its device: train with a hard timeout, evaluate separately (a crash may get up to two fixes)
    judge       keep if it beats the best it was built on by the noise margin (confirmed), else discard (or crash)
    record      in experiment order, one at a time: one event, one results.tsv row; a win over a best that moved
                while it ran is never kept untested: it runs again on the new best
    advance     a kept candidate becomes the branch tip (update-ref); nothing else ever moves the branch
Every run is hermetic: a fresh export of its commit, sandboxed where bubblewrap works, scored by the frozen
evaluator in a separate process; your checkout is never switched or reset. What each step uses lives in harness/
(see harness/__init__.py for the map). agent.py never imports prepare.py or train.py.
"""

import argparse
import collections
import dataclasses
import functools
import os
import re
import signal
import statistics
import sys
import time
from pathlib import Path

from harness import cluster, console, ledger
from harness.edits import EditError, apply_answer, clean_description
from harness.errors import SetupError, Stop
from harness.gitops import file_at, lock_repo, make_candidate_ref, open_repo
from harness.prompts import (FIX_PROMPT, PROPOSE_PROMPT, REPAIR_PROMPT, SYSTEM_PROMPT, WAVE_PROMPT, format_history,
                             goal_word, program_brief)
from harness.proposers import DEFAULT_MODELS, RETRY_CAP_S, make_proposer, price_key
from harness.pool import Pool, parse_devices
from harness.runner import become_subreaper
from harness.session import (RUN_LOG, THREADS, advance_branch, best_source, commit_candidate, describe, duplicate_of,
                             file_at_bytes, holdout_summary, open_session, record, tokens_per_sec,
                             touched_by, train_candidate)
from harness.target import FROZEN, check_target, ensure_prepared, read_text, run_prepare

# ---------------------------------------------------------------------------
# Settings (the rules of the loop)
# ---------------------------------------------------------------------------

MAX_REPAIRS = 2                 # a rejected answer goes back with the exact error at most this often
MAX_FIXES = 2                   # a crashed candidate goes back with the log tail for this many amended fixes
BREAKER = (6, 8)                # stop when 6 of the last 8 iterations failed (crash or unusable answer)
THROUGHPUT_SHARE = 0.25         # a first run whose tokens/s is this far from the best's is run again before judging

# ---------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Idea:
    """A proposal not run yet: the answer (SEARCH/REPLACE blocks against train.py of commit `base`), the train.py it
    gives, and what asking for it cost (tokens in, tokens out, USD, LLM seconds)."""
    description: str
    source: str
    answer: str
    base: str
    repairs: int
    cost: tuple
    wave: int
    rebased_from: int | None = None     # a superseded winner re-run on the new best


@dataclasses.dataclass
class Job:
    """A candidate commit on a device: experiment n's attempt `fixes`, built on the best `base` (its metric and
    tokens/s are what it is judged against)."""
    n: int
    idea: Idea
    commit: str
    base: str
    base_metric: float
    base_tps: float | None
    fixes: int = 0
    cost: tuple = (0, 0, 0.0, 0.0)
    t0: float = dataclasses.field(default_factory=time.monotonic)   # when it was handed to its device


def research_loop(s):
    """LOOP FOREVER (until a --max-* limit or the breaker), as in program.md, with every device busy: the proposer is
    asked for the next ideas while candidates train (speculation; --no-speculate: only when a device is free), each
    idea becomes a candidate commit on the best as it is when a device frees, the devices train and judge (see
    measure), and the verdicts are recorded here, one at a time, in experiment order. On one device with
    --no-speculate that is exactly propose, commit, run, judge, record, advance."""
    pool, lookahead = s.pool, 0 if s.args.no_speculate else 1
    s.assigned = max(1, s.next_n)       # s.queue: fixes to run before any new idea; s.ideas: proposals not run yet
    if s.next_n == 0:
        run_baseline(s, lookahead)
    ideas, finished, reason = s.ideas, {}, None
    while True:
        while s.next_n in finished:                              # record (and advance), in experiment order
            settle(s, *finished.pop(s.next_n), ideas)
        reason = reason or stop_reason(s)
        while pool.free and (s.queue or ideas and allowed(s) > 0):   # commit: ideas (paid for) start on free devices
            if s.queue:
                pool.submit(functools.partial(measure, s), s.queue.popleft())
            else:
                start(s, ideas.popleft())
        room = allowed(s) - len(ideas)
        want = min(len(pool.free) + lookahead - len(ideas), room)
        if reason is None and want > 0:                          # propose (several devices free: a wave)
            propose(s, max(1, min(want, len(pool.free))) if pool.free else 1)
            continue
        if not pool.running:
            if reason is not None:
                return reason
            continue
        for job, result in pool.done():                          # run and judge: a device finished
            finished[job.n] = (job, *result)


def allowed(s):
    """How many more candidates --max-experiments allows to start (a large number without it)."""
    if s.args.max_experiments is None:
        return 10**9
    return s.args.max_experiments - (s.assigned - 1)


def start(s, idea):
    """Commit an idea as the next experiment on top of the best and start it on a free device. An idea written
    against an older best (prepared while a candidate that was kept trained) is re-applied to the new best first; one
    that no longer applies, or gives a train.py already measured or in flight, is dropped (the loop asks again)."""
    if idea.base != s.best_commit:
        try:
            description, source = apply_answer(idea.answer, best_source(s), FROZEN)
            check_new(s, source)
        except EditError as e:
            s.log("dropped", idea=idea.description, base=idea.base, best=s.best_commit, error=str(e))
            console.say(f"      dropped  {idea.description!r}: written for {idea.base[:7]}, the best is now "
                        f"{s.best_commit[:7]} and {e}")
            return
        s.log("reapplied", idea=idea.description, base=idea.base, best=s.best_commit)
        idea = dataclasses.replace(idea, description=description, source=source, base=s.best_commit)
    n = s.assigned
    s.assigned += 1
    commit = commit_candidate(s, n, idea.source, idea.description)
    job = Job(n, idea, commit, s.best_commit, s.best_metric, best_event(s).get("tokens_per_sec"), cost=idea.cost)
    device = s.pool.submit(functools.partial(measure, s), job)
    s.log("started", n=n, device=device.name, base=s.best_commit, wave=idea.wave)


def measure(s, device, job):
    """On a device (a worker thread): train the candidate, then judge it against the best it was built on
    (confirmation runs included). Returns (Outcome, status, runs, when it ended)."""
    outcome = train_candidate(s, job.n, job.fixes, job.commit, device=device)
    status, runs = judge(s, job.n, job.fixes, outcome, base=(job.base_metric, job.base_tps), device=device)
    return outcome, status, runs, time.monotonic()


def settle(s, job, outcome, status, runs, ended, ideas):
    """The verdict on a finished candidate, in the main thread: a crash may get a fix (the amended commit runs before
    anything new); a win over a best that has moved since it started is never kept untested: it is recorded as
    superseded (a discard) and its edit, re-applied to the new best, runs next; otherwise the event, the row, and on
    a keep the branch advances."""
    n, description = job.n, job.idea.description
    if status == "crash" and job.fixes < MAX_FIXES and s.proposer.is_llm and not outcome.reason.startswith(
            ("timeout", "rejected", "lost", "node")):           # a verdict, or no run at all: not a bug to fix
        fixed = ask_fix(s, job, outcome)
        if fixed is not None:
            s.queue.append(fixed)
            return
    if status == "keep" and job.base != s.best_commit:
        status = "discard"
        outcome.reason = (f"superseded: it beat its base {job.base[:7]}, but the best moved to {s.best_commit[:7]} "
                          "while it ran; re-run on the new best")
        ideas.appendleft(dataclasses.replace(job.idea, cost=(0, 0, 0.0, 0.0), rebased_from=n))
    record(s, n, outcome, status, description, job.t0, None, job.idea.repairs, job.fixes, runs=runs,
           base=(job.base, job.base_metric), cost=job.cost, wall=ended - job.t0, wave=job.idea.wave,
           rebased_from=job.idea.rebased_from)
    if status == "keep":                                     # only a measured, kept commit enters the branch
        advance_branch(s, outcome.commit)
        s.best_commit, s.best_metric = outcome.commit, s.history[-1]["metric"]
    s.recent_failures.append(status == "crash")
    s.log("throughput", n=n, **s.pool.throughput(len(s.history)).fields())


def run_baseline(s, lookahead=0):
    """Experiment 0: the unmodified train.py at the branch start, measured on this machine --baseline-runs times
    with different seeds: their mean is the first best, their standard deviation the noise floor. lookahead: ask for
    the first ideas (one per device) while it trains (speculation)."""
    t0, spent0, commit = time.monotonic(), s.spent(), s.best_commit
    make_candidate_ref(s.repo, s.args.tag, 0, commit)
    s.status(0, f"baseline: {s.args.baseline_runs} run(s)")
    if s.pool is None:                  # `try --baseline`: here, one after the other
        outcomes = [train_candidate(s, 0, 0, commit, run=run) for run in range(s.args.baseline_runs)]
    else:                               # the loop: on every device at once, as the candidates will run
        outcomes, waiting = [None] * s.args.baseline_runs, list(range(s.args.baseline_runs))
        while waiting or s.pool.running:
            while waiting and s.pool.free:
                s.pool.submit(lambda device, run: train_candidate(s, 0, 0, commit, run=run, device=device),
                              waiting.pop(0))
            if lookahead and not waiting and not s.ideas and allowed(s) > 0:   # the devices are busy: ask now
                propose(s, min(len(s.pool.devices), allowed(s)))
            for run, outcome in s.pool.done():
                outcomes[run] = outcome
    for outcome in outcomes:
        if outcome.metric is None and outcome.reason.startswith(("lost", "node")):   # the cluster, not train.py
            raise Stop(f"the baseline could not run on the Ray cluster ({outcome.reason}); fix the cluster or its "
                       f"data (README: Ray), then rerun the same command. Last lines of {RUN_LOG}:\n{outcome.log_tail}")
        if outcome.metric is None:
            raise Stop(f"the baseline run crashed ({outcome.reason}); nothing to improve on. Fix train.py, commit "
                       f"it (on {s.branch} is fine), and rerun the same command. Last lines of {RUN_LOG}:\n"
                       f"{outcome.log_tail}")
    runs = [outcome.metric for outcome in outcomes]
    s.noise_sd = statistics.stdev(runs) if len(runs) > 1 else None
    record(s, 0, outcome, "keep", "baseline", t0, spent0, repairs=0, fixes=0, runs=runs, noise_sd=s.noise_sd)
    s.best_metric = s.baseline_metric = s.history[-1]["metric"]
    if s.noise_sd is not None:
        console.say(f"noise floor: {s.metric} sd {s.noise_sd:.6f} over {len(runs)} seeds; a candidate must beat the "
                    f"best by {margin(s):.6f} ({margin_rule(s)})")


def stop_reason(s):
    """Why the loop should end before the next experiment, or None to go on."""
    a = s.args
    if a.max_experiments is not None and allowed(s) <= 0:
        return f"--max-experiments {a.max_experiments} reached"
    if a.hours is not None and time.monotonic() - s.started >= a.hours * 3600:
        return f"--hours {a.hours:g} reached"
    if a.max_cost_usd is not None and s.cost_usd >= a.max_cost_usd:
        return f"--max-cost-usd {a.max_cost_usd:g} reached (spent ${s.cost_usd:.2f})"
    if sum(s.recent_failures) >= BREAKER[0]:
        raise Stop(f"circuit breaker: {BREAKER[0]} of the last {BREAKER[1]} iterations failed (crash or unusable "
                   f"answer). Read the errors in {ledger.EVENTS} and {RUN_LOG}, fix program.md, train.py or the "
                   "model, then rerun the same command to resume.")
    return None


def judge(s, n, attempt, first, base=None, device=None):
    """The verdict on a candidate's first run, with confirmation runs where it looks like a win. Returns (status,
    the metrics of its runs). A first run whose throughput (tokens/s) is more than THROUGHPUT_SHARE away from the
    best's is run again first, and the repeat counts too (a busy or throttled device, or a model of another speed:
    the repeat tells; their mean is judged, since a repeat that replaced the first would be a re-roll train.py could
    ask for by printing another tokens/s); not with --confirm 0, the strict single-run ratchet. crash: no metric. discard: it
    beats the best (the mean of the best's runs) by less than margin(s). Otherwise it is run --confirm more times with
    other seeds, and kept only if the mean of all its runs beats the best by the margin (a confirmation that crashes:
    a crash). With --confirm 0, the first run decides
    alone (margin 0 unless --margin: karpathy's strict ratchet). base: (metric, tokens/s) of the best the candidate
    was built on (default: the best now); device: where its runs go (see train_candidate). Safe in a worker thread:
    it reads only settings and base."""
    if first.metric is None:
        return "crash", []
    best_metric, best_tps = base or (s.best_metric, best_event(s).get("tokens_per_sec"))
    tps = tokens_per_sec(first)
    if s.args.confirm and tps and best_tps and abs(tps / best_tps - 1) > THROUGHPUT_SHARE:   # a busy device? again
        s.log("rerun", n=n, reason=f"tokens/s {tps:.0f} differs from the best's {best_tps:.0f} by more than "
                                   f"{THROUGHPUT_SHARE:.0%}: run again before it is judged")
        s.status(n, "throughput off: running it again")
        again = train_candidate(s, n, attempt, first.commit, again=True, device=device)
        if again.metric is None:
            first.metric, first.reason, first.log_tail = None, f"its repeat crashed: {again.reason}", again.log_tail
            return "crash", []
        runs = [first.metric, again.metric]    # both count: train.py prints its own tokens/s, so a repeat it asks
    else:                                      # for must never replace an unlucky first run
        runs = [first.metric]
    if not beats(s, statistics.fmean(runs), best_metric):
        return "discard", runs
    for run in range(1, s.args.confirm + 1):
        s.status(n, f"confirming: run {run + 1} of {s.args.confirm + 1}")
        again = train_candidate(s, n, attempt, first.commit, run=run, device=device)
        if again.metric is None:
            first.metric, first.reason = None, f"confirmation run {run + 1} crashed: {again.reason}"
            first.log_tail = again.log_tail
            return "crash", runs
        runs.append(again.metric)
    return ("keep" if beats(s, statistics.fmean(runs), best_metric) else "discard"), runs


def beats(s, metric, best):
    """Whether metric is better than best by more than the margin (strictly better with margin 0)."""
    gain = best - metric if s.goal == "min" else metric - best
    return gain > margin(s)


def margin(s):
    """How much a candidate must beat the best by: --margin, else 2 x the baseline's noise sd (0 with --confirm 0,
    or when the noise was not measured: one baseline run)."""
    if s.args.margin is not None:
        return s.args.margin
    return 2 * s.noise_sd if s.noise_sd and s.args.confirm > 0 else 0.0


def margin_rule(s):
    """How margin(s) was set, in words."""
    if s.args.margin is not None:
        return "--margin"
    return "2 x noise sd" if s.noise_sd and s.args.confirm > 0 else "strict: --confirm 0 or one baseline run"

# ---------------------------------------------------------------------------
# Propose (repaired at most MAX_REPAIRS times) and fix (at most MAX_FIXES times)
# ---------------------------------------------------------------------------


def propose(s, k=1):
    """Ask the proposer for k distinct ideas against the current (best) train.py, in one call (an LLM is asked for k
    different ideas at once; random/grid draw k times). The prompt states which results are known and which
    candidates are still in flight. The usable ideas (possibly fewer than k) join s.ideas; none when no answer could
    be repaired (a failure for the breaker)."""
    n, train_src, t0 = s.assigned, best_source(s), time.monotonic()
    running = sorted((j.n, j.idea.description) for _, j in s.pool.running.values() if isinstance(j, Job))
    pending = (f"Results known: experiments #0-#{len(s.history) - 1}. Still running, results not known yet (do not "
               "propose these again): " + "; ".join(f"#{i} {d}" for i, d in running) if running else
               f"Results known: all {len(s.history)} experiments so far (#0-#{len(s.history) - 1}); none running."
               if s.history else "Results known: none yet: the baseline (#0, train.py as it is) is still training.")
    prompt = PROPOSE_PROMPT.format(program=program_brief(read_text(s.target / "program.md"), s.budget), metric=s.metric,
                                   goal=goal_word(s.goal), history=format_history(s.history, s.metric, margin(s),
                                                                          touched_by(s)),
                                   pending=pending, train=train_src)
    if k > 1:
        prompt += WAVE_PROMPT.format(k=k)
    s.status(n, "proposing" + (f" {k} ideas" if k > 1 else ""))
    s.wave += 1
    found = 0
    for i in range(1 if s.proposer.is_llm else k):       # random/grid: one draw per idea
        ideas = ask_for_edit(s, n + i, [{"role": "user", "content": prompt}], train_src, k if s.proposer.is_llm else 1)
        s.ideas.extend(ideas)
        found += len(ideas)
    s.pool.waited(time.monotonic() - t0)
    if not found:
        s.log("skipped", n=n, reason=f"no usable answer after {MAX_REPAIRS} repairs")
        console.say(f"#{n:<4} skipped  no usable answer after {MAX_REPAIRS} repairs (see {ledger.EVENTS})")
        s.recent_failures.append(True)


def ask_for_edit(s, n, messages, train_src, k=1):
    """One conversation with the proposer: an answer with no usable idea goes back with the exact error, at most
    MAX_REPAIRS times. An answer may hold up to k ideas (a DESCRIPTION line each, then its blocks); the unusable
    ones of an answer that has some usable ones are dropped (logged). Returns the usable Ideas, [] if none."""
    before = s.spent()
    for attempt in range(MAX_REPAIRS + 1):
        reply = s.proposer.ask(s.system_prompt, messages, train_src, n)
        with s.lock:
            s.cost_usd += reply.cost_usd
            s.input_tokens += reply.input_tokens
            s.output_tokens += reply.output_tokens
            s.llm_seconds += reply.seconds
        s.log("propose", n=n, attempt=attempt, proposer=s.args.proposer, model=s.args.model,
              input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
              cost_usd=round(reply.cost_usd, 6), llm_seconds=round(reply.seconds, 3), wave=s.wave)
        ideas, errors = [], []
        for answer in split_ideas(reply.text)[:k]:
            try:
                description, source = apply_answer(answer, train_src, FROZEN)
                check_new(s, source, ideas)
                ideas.append(Idea(description, source, answer, s.best_commit, attempt, (), s.wave))
            except EditError as e:
                errors.append(str(e))
        cost = tuple((now - was) / max(1, len(ideas)) for now, was in zip(s.spent(), before))
        ideas = [dataclasses.replace(i, cost=cost) for i in ideas]
        if ideas:
            for error in errors:
                s.log("dropped", n=n, error=error)
            return ideas
        error = errors[0] if len(errors) == 1 else "; ".join(f"idea {i + 1}: {e}" for i, e in enumerate(errors))
        s.log("repair", n=n, attempt=attempt, error=error, answer=reply.text[-4000:])
        messages = messages + [{"role": "assistant", "content": reply.text},
                               {"role": "user", "content": REPAIR_PROMPT.format(error=error)}]
    return []


def check_new(s, source, also=()):
    """Raise EditError (the message for the LLM) when this train.py was already measured, is a candidate still
    running or about to run, or is another idea of the same answer (also)."""
    if (earlier := duplicate_of(s, source)) is not None:
        raise EditError(f"the resulting train.py is byte-identical to experiment {describe(earlier, s.metric)}, "
                        "already measured: propose a different idea")
    if any(i.source == source for i in [*in_flight(s), *also]):
        raise EditError("the resulting train.py is the same as a candidate still running or about to run: propose a "
                        "different idea")


def best_event(s):
    """The "experiment" event of the best commit (the last keep)."""
    return next(e for e in reversed(s.history) if e["status"] == "keep")


def in_flight(s):
    """The ideas asked for but not recorded yet: running on a device, or prepared to run next."""
    return [job.idea for _, job in (s.pool.running.values() if s.pool else ()) if isinstance(job, Job)] + list(s.ideas)


def split_ideas(answer):
    """An answer's ideas: the text from each DESCRIPTION line to the next (the whole answer when it has at most one)."""
    starts = [m.start() for m in re.finditer(r"(?m)^[ \t]*DESCRIPTION:", answer)]
    if len(starts) <= 1:
        return [answer]
    return [answer[a:b] for a, b in zip(starts, starts[1:] + [len(answer)])]


def ask_fix(s, job, outcome):
    """The crashed candidate goes back to the LLM with its log tail; a usable fix amends the commit (same parent) and
    becomes the job's next attempt. Returns that Job, or None."""
    with s.lock:                        # the devices' threads use the repository too
        crashed_src = file_at(s.repo, job.commit, s.train_rel)
    prompt = FIX_PROMPT.format(description=job.idea.description, reason=outcome.reason, tail=outcome.log_tail,
                               train=crashed_src)
    s.status(job.n, f"asking for fix {job.fixes + 1}")
    t0 = time.monotonic()
    fixed = ask_for_edit(s, job.n, [{"role": "user", "content": prompt}], crashed_src)
    s.pool.waited(time.monotonic() - t0)
    if not fixed:
        return None
    fix = job.fixes + 1
    commit = commit_candidate(s, job.n, fixed[0].source, f"{job.idea.description}\n\nfix {fix}: {fixed[0].description}",
                              attempt=fix, amend=job.commit)
    return dataclasses.replace(job, commit=commit, fixes=fix,
                               cost=tuple(a + b for a, b in zip(job.cost, fixed[0].cost)))

# ---------------------------------------------------------------------------
# One experiment for an external coding agent: `agent.py try` (program.md's loop)
# ---------------------------------------------------------------------------


def try_one(s):
    """`agent.py try`: the checkout's train.py becomes one experiment with the loop's guarantees and rules (commit on
    top of the best, hermetic sandboxed run with the timeout, separate evaluation, judge, event, row, note, branch),
    then train.py in your checkout is the best commit's again. `--baseline` measures the branch start instead, and
    `--fix` amends the last crashed candidate as the loop's fix step does. Returns the exit code (0: a verdict)."""
    a, train_path = s.args, s.target / "train.py"
    if a.sync:
        return sync_checkout(s)
    if a.baseline:                      # open_session checked that there is none yet and train.py is committed
        run_baseline(s)
        return verdict(s, s.history[-1], None)
    based_on = s.synced or s.history[0]["full_commit"]      # what `try` last wrote into your checkout
    if based_on != s.best_commit and file_at_bytes(s, based_on) != file_at_bytes(s, s.best_commit):
        if train_path.read_bytes() == file_at_bytes(s, based_on):   # not edited yet: just bring the best
            write_checkout(s)
            raise SetupError(f"the best commit of tag {a.tag!r} moved to {s.best_commit[:7]} (agent.py's loop kept "
                             f"something) and your train.py was the older best, unedited: it is now the best's. "
                             "Nothing ran; make your edit on it, then run the same command again")
        raise SetupError(f"the best commit of tag {a.tag!r} moved to {s.best_commit[:7]} (agent.py's loop kept "
                         f"something) since train.py in your checkout was last set to the best, so your edit would undo "
                         f"it. Run `uv run agent.py try --tag {a.tag} --sync` (it saves your train.py first and prints "
                         "where), then make your edit again")
    try:
        source = train_path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise SetupError(f"train.py is not UTF-8 text ({e}): save it as UTF-8") from None
    fix_of, fixes, crashed, message = None, 0, None, clean_description(a.message)
    description = message
    if a.fix:                                   # the commit amends the crashed one, as the loop's fix step does
        fix_of, fixes, crashed = fixable(s)
        idea = s.history[fix_of].get("idea") or s.history[fix_of]["description"]
        description, message = f"{idea} (fix {fixes}: {message})", f"{idea}\n\nfix {fixes}: {message}"
    elif source == best_source(s):
        raise SetupError(f"train.py is the best commit's ({s.best_commit[:7]}) unchanged: edit it with one idea first")
    if (earlier := duplicate_of(s, source)) is not None:
        raise SetupError(f"this train.py is byte-identical to experiment {describe(earlier, s.metric)}, already "
                         f"measured: try another idea (`git show {earlier['commit']}:{s.train_rel}` shows it)")
    n, t0 = s.next_n, time.monotonic()
    if crashed and s.repo.commit(crashed).parents[0].hexsha != s.best_commit:
        crashed = None                  # a commit you added on the branch since: the fix goes on top of it instead
    commit = commit_candidate(s, n, source, message, attempt=fixes, amend=crashed)
    outcome = train_candidate(s, n, fixes, commit)
    status, runs = judge(s, n, fixes, outcome)
    record(s, n, outcome, status, description, t0, s.spent(), repairs=0, fixes=fixes, fix_of=fix_of, runs=runs)
    s.recorded = True                   # from here on an interrupt leaves a result behind (main's message)
    if status == "keep":
        advance_branch(s, outcome.commit)
        s.best_commit, s.best_metric = outcome.commit, s.history[-1]["metric"]
    synced = write_checkout(s, expected=source)
    return verdict(s, s.history[-1], outcome, synced)


def fixable(s):
    """--fix: (n of the idea, number of this fix, sha of the crashed candidate to amend) when the last experiment
    crashed and may get another fix (a timeout or a rejected run is a verdict, not a bug); SetupError otherwise."""
    last = s.history[-1]
    if last["status"] != "crash" or last["n"] == 0:
        raise SetupError(f"--fix amends a crashed candidate, but the last experiment is {describe(last, s.metric)}; "
                         "run a new idea without --fix")
    if last.get("reason", "").startswith(("timeout", "rejected")):
        raise SetupError(f"experiment {describe(last, s.metric)} timed out or was rejected: that is its verdict, not "
                         "a bug to fix; run a new idea without --fix")
    fix_of, fixes = last.get("fix_of"), last.get("fixes", 0)
    fix_of = last["n"] if fix_of is None else fix_of
    if fixes >= MAX_FIXES:
        raise SetupError(f"experiment #{fix_of}'s idea crashed after {MAX_FIXES} fixes (the loop's limit too): give "
                         "it up and try another idea")
    return fix_of, fixes + 1, last["full_commit"]


def write_checkout(s, expected=None):
    """Your checkout's train.py becomes the best commit's (its index and HEAD are untouched), and the "synced" event
    records which commit that was, so the next `try` knows what an edit is based on. expected: the text the file must
    still hold (what was measured); when you changed it meanwhile it is left alone, and False is returned."""
    path = s.target / "train.py"
    if expected is not None and path.read_bytes() != expected.encode():
        console.say(f"train.py changed in your checkout while the run trained: left as it is (the best is "
                    f"{s.best_commit[:7]}; `uv run agent.py try --tag {s.args.tag} --sync` saves yours and writes it)")
        return False
    path.write_bytes(file_at_bytes(s, s.best_commit))
    s.log("synced", commit=s.best_commit)
    s.synced = s.best_commit
    return True


def sync_checkout(s):
    """--sync: save your checkout's train.py (when it is not already some measured commit's) beside the tag's logs,
    then write the best commit's train.py there."""
    current = (s.target / "train.py").read_bytes()
    if duplicate_of(s, current.decode("utf-8", "replace")) is None:
        saved = s.home / "saved" / f"train.py.{time.strftime('%Y%m%d-%H%M%S')}.{time.time_ns() % 10**9:09d}"
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_bytes(current)
        console.say(f"your train.py was saved to {saved}")
    write_checkout(s)
    console.say(f"train.py is now the best commit's ({s.best_commit[:7]}, {s.metric} {s.best_metric:.6f}): edit it")
    return 0


def verdict(s, event, outcome, synced=True):
    """Print the verdict block of one `try` (key: value lines between '---' and '---', like train.py's summary,
    then the log tail after a crash). Returns 0."""
    best = best_event(s)
    near = (event["status"] == "discard" and event["n"] > 0
            and abs(event["metric"] - event["base_metric"]) <= margin(s) and margin(s) > 0)
    lines = [("experiment", event["n"]), ("status", event["status"] + (" (a near-miss: within the noise margin; worth "
                                                                        "combining with another idea)" if near else "")),
             (s.metric, f"{event['metric']:.6f}" if event["status"] != "crash" else "- (crash)")]
    if event["n"] > 0 and event["status"] != "crash":
        lines.append(("delta", f"{event['metric'] - event['base_metric']:+.6f} vs the best before it "
                               f"({event['base_metric']:.6f})"))
    runs = event.get("runs") or []
    if len(runs) > 1:
        lines.append(("runs", ", ".join(f"{m:.6f}" for m in runs) + f" (seeds differ; {s.metric} is their mean)"))
    lines.append(("margin", f"{margin(s):.6f} ({margin_rule(s)}): a candidate must beat the best by more"
                            + (f"; noise sd {s.noise_sd:.6f}" if s.noise_sd else "")))
    lines += [("best", f"{best['metric']:.6f} (#{best['n']}, commit {best['commit']})"),
              ("baseline", f"{s.history[0]['metric']:.6f}"),
              ("commit", f"{event['commit']} ({event['description']})"),
              ("branch", f"{s.branch} at {s.best_commit[:7]}"),
              ("train.py", f"your checkout's train.py is the best's ({s.best_commit[:7]}): edit it for the next idea"
                           if synced else "changed by you during the run: left as it is (see above)"),
              ("memory_gb", f"{event['memory_gb']:.1f}"), ("seconds", f"{event['wall_seconds']:.0f}"),
              ("log", str(s.target / RUN_LOG)), ("experiments", f"{len(s.history) - 1} after the baseline")]
    if event["status"] == "crash" and outcome is not None:
        lines.append(("reason", outcome.reason))
        if not outcome.reason.startswith(("timeout", "rejected")) and event.get("fixes", 0) < MAX_FIXES:
            lines.append(("to fix", f"`git show {event['commit']}:{s.train_rel} > {s.train_rel}`, fix the mistake, "
                          f"then `uv run agent.py try --tag {s.args.tag} --fix -m \"<what you fixed>\"` (fix "
                          f"{event.get('fixes', 0) + 1} of at most {MAX_FIXES}); or give the idea up"))
    print("---")
    for key, value in lines:
        print(console.shown(f"{key + ':':<13} {value}"))
    print("---")
    if event["status"] == "crash" and outcome is not None and outcome.log_tail:
        print(console.shown(f"last lines of {RUN_LOG}:\n{outcome.log_tail}"))
    return 0

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
    add_common_flags(p)
    p.add_argument("--devices", metavar="SPEC", help="run experiments on several devices at once: CUDA indices "
                   "(e.g. 0,1,2,3: one run per GPU) or cpu:K (K CPU workers sharing this machine's threads). Default: "
                   "one run at a time on this machine as it is")
    p.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS", help="run experiments as tasks on a Ray "
                   "cluster, one GPU each (auto: the cluster `ray start` made on this machine, or ADDRESS, e.g. "
                   "10.0.0.5:6379); needs `uv sync --extra cluster`. agent.py stays the one process that owns git "
                   "and the results")
    p.add_argument("--no-speculate", action="store_true", help="ask for the next idea only when a device is free "
                   "(default: while a candidate trains, the next idea is already asked for)")
    p.add_argument("--seed", type=int, default=0, help="seed of --proposer random (default 0)")
    p.add_argument("--retry-base-delay", type=float, default=2.0, help="first backoff in seconds after a "
                   f"transient LLM error (default 2); it doubles per retry up to {RETRY_CAP_S:.0f}s, retried forever")
    args = p.parse_args(argv)
    args.command = "loop"
    check_common(p, args)
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
    if args.devices is not None and args.ray is not None:
        p.error("--devices and --ray: pick one (a Ray cluster schedules its own GPUs)")
    try:
        args.device_list = parse_devices(args.devices, THREADS)
    except ValueError as e:
        p.error(str(e))
    if args.model is None and args.proposer in DEFAULT_MODELS:
        args.model = DEFAULT_MODELS[args.proposer]
    return args




def parse_try_args(argv):
    """`agent.py try`'s command line (see `agent.py try --help`). Exits 2 on bad flags."""
    p = argparse.ArgumentParser(
        prog="agent.py try",
        description="One experiment for an external coding agent (Claude Code, Codex) following program.md: the "
                    "train.py in your checkout becomes a candidate commit on autoresearch/<tag>, runs with every "
                    "guarantee of agent.py's loop (hermetic sandboxed run, timeout, separate evaluation, the same "
                    "verdict, a results.tsv row, events, a git note), the branch advances if it is kept, and your "
                    "checkout's train.py becomes the best commit's. Prints a verdict block. Exit codes: 0 a verdict "
                    "(keep, discard or crash: read `status:`), 1 stopped by a problem (message on stderr), 2 bad "
                    "input or state (nothing was run), 130 interrupted (no result; your train.py as you left it).")
    p.add_argument("--tag", required=True, help="run name: experiments go on branch autoresearch/<tag>")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("-m", "--message", help="the idea in one line (the commit subject and results.tsv description)")
    what.add_argument("--baseline", action="store_true", help="the first run of a tag: measure the committed "
                      "train.py unmodified (creates autoresearch/<tag> from HEAD)")
    what.add_argument("--sync", action="store_true", help="write the best commit's train.py into your checkout "
                      "(your current train.py is saved first, and where is printed)")
    p.add_argument("--fix", action="store_true", help="with -m: your train.py fixes the last experiment, which "
                   f"crashed; the crashed commit is amended (at most {MAX_FIXES} fixes per idea)")
    add_common_flags(p)
    args = p.parse_args(argv)
    check_common(p, args)
    if args.fix and args.message is None:
        p.error("--fix needs -m \"<what you fixed>\"")
    if args.message is not None and not clean_description(args.message):
        p.error("-m: describe the idea in a few words")
    args.command, args.proposer, args.model, args.base_url = "try", "external", None, None
    args.devices = args.ray = None
    args.max_experiments = args.hours = args.max_cost_usd = None
    return args


def add_common_flags(p):
    """The flags agent.py's loop and `agent.py try` share: the target, the timeout, the sandbox, the data source."""
    p.add_argument("--target", default=str(Path(__file__).resolve().parent),
                   help="directory holding program.md, the frozen prepare.py and train.py (default: the directory of "
                   "agent.py, the repository root; e.g. grpo for the RL target)")
    p.add_argument("--timeout", type=float, help="hard limit per training run in seconds (default: 2 x TIME_BUDGET, "
                   "at least TIME_BUDGET + 120); the whole process group is killed")
    p.add_argument("--sandbox", choices=("auto", "bwrap", "off"), default="auto",
                   help="run train.py inside bubblewrap (read-only filesystem, repository and evaluation data hidden, "
                   "no network): auto = when it works here (Linux), bwrap = required, off = never (default auto)")
    p.add_argument("--baseline-runs", type=int, default=3, metavar="K", help="run the baseline K times with "
                   "different seeds (AUTORESEARCH_SEED): their mean is the first best, their standard deviation the "
                   "noise floor (default 3)")
    p.add_argument("--confirm", type=int, default=1, metavar="C", help="a candidate that beats the best by the margin "
                   "is run C more times with other seeds and kept only if the mean of its runs still does (default 1; "
                   "0: the first run decides, strictly, as in karpathy's ratchet)")
    p.add_argument("--margin", type=float, help="how much a candidate must beat the best by, in metric units "
                   "(default: 2 x the noise sd measured by the baseline runs)")
    p.add_argument("--source", metavar="PATH", help="when no data is prepared yet: prepare it from these local files "
                   "(prepare.py --source PATH; offline) instead of the default download for this device")


def check_common(p, args):
    """The shared flags' values: a tag that makes a valid, short branch name; counts and margin in range."""
    tag = args.tag
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", tag) or ".." in tag or tag.endswith(".lock"):
        p.error(f"--tag {tag!r}: use up to 100 letters, digits, '.', '_' and '-' (e.g. nov30)")
    if args.baseline_runs < 1 or args.confirm < 0 or args.margin is not None and not args.margin >= 0:
        p.error("--baseline-runs must be at least 1, --confirm and --margin at least 0")


def main(argv=None):
    """Entry point: `agent.py --tag T ...` runs the loop, `agent.py try --tag T ...` one experiment (try_one). Exit
    codes: 0 clean stop at a limit (try: a verdict), 1 stopped by a problem (message on stderr), 2 bad input or state
    (nothing changed), 130 interrupted (training killed, branch at the best commit)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_try_args(argv[1:]) if argv[:1] == ["try"] else parse_args(argv)
    previous_sigterm = signal.signal(signal.SIGTERM, raise_interrupt)  # `kill` cleans up like Ctrl-C
    become_subreaper()                      # a process a run detaches still ends with the run
    s = None
    try:
        target = Path(args.target).resolve()
        check_target(target)
        proposer = make_proposer(args) if args.command == "loop" else None   # a missing key stops here, unchanged
        with lock_repo(open_repo(target)):
            ready = ensure_prepared(target, args.source)      # a fresh machine: prepared here, with progress
            s, constants = open_session(args)
            # a `profile: <name>` line from --check picks train.py's `if PROFILE == ...` branch for random/grid
            s.profile = (re.findall(r"^profile:\s*(\S+)\s*$", ready, re.M) or [None])[-1]
            if args.command == "try":
                return try_one(s)
            return research_main(s, proposer, constants)
    except SetupError as e:
        console.error(f"agent.py: error: {e}")
        return 2
    except Stop as e:
        log_stop(s, "error", str(e))
        console.error(f"agent.py: stopped: {e}")
        return 1
    except KeyboardInterrupt:
        log_stop(s, "interrupted", "interrupted")
        after = (f"{s.branch if s else 'the branch'} is at the best commit. Rerun the same command to resume"
                 if args.command == "loop" else "no result was recorded and train.py in your checkout is as you left "
                 "it. Rerun the same command" if not (s and s.recorded) else "the result was recorded (results.tsv) "
                 f"but train.py in your checkout may not be the best: `uv run agent.py try --tag {args.tag} --sync`")
        print(f"\nagent.py: interrupted; {after}.", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)


def research_main(s, proposer, constants):
    """The loop's own setup (the proposer, its prompts and check, the preflight), then research_loop until a
    limit. Returns 0."""
    args, target = s.args, s.target
    s.proposer = proposer
    proposer.profile = s.profile
    proposer.on_retry = lambda attempt, problem, delay: on_llm_retry(s, attempt, problem, delay)
    s.recent_failures = collections.deque(maxlen=BREAKER[1])
    s.system_prompt = SYSTEM_PROMPT.format(
        budget=s.budget, metric=s.metric, goal=goal_word(s.goal),
        frozen="\n\n".join(f"=== {f} ===\n{read_text(target / f)}" for f in FROZEN))
    devices = args.device_list if args.ray is None else cluster.connect(args.ray, s)
    if len(devices) > 1 and s.wrap is None and args.ray is None:   # same user, same machine, nothing in between
        console.say(f"warning: {len(devices)} devices without the sandbox: a run can see and rewrite the files of the "
                    "runs beside it (their run dirs, their evaluator copies while they score). Install bubblewrap "
                    "(--sandbox auto) before trusting the verdicts of an unattended run")
        s.log("warning", reason="several devices without the sandbox")
    if constants["PREFLIGHT"]:
        console.say("preflight: prepare.py --preflight ...")
        run_prepare(target, "--preflight", timeout=s.timeout)
    s.log("config", proposer=args.proposer, model=args.model, base_url=args.base_url, metric=s.metric,
          goal=s.goal, budget_s=s.budget, timeout_s=s.timeout, max_experiments=args.max_experiments,
          hours=args.hours, max_cost_usd=args.max_cost_usd, devices=[d.name for d in devices],
          threads=[d.threads for d in devices], speculate=not args.no_speculate, ray=args.ray)
    if proposer.is_llm and args.max_cost_usd is not None and price_key(args.model) is None:
        console.say(f"warning: --max-cost-usd {args.max_cost_usd:g} cannot stop this run: model {args.model!r} "
                    f"is not in the price table (PRICES in harness/proposers.py), so its calls count as $0. "
                    f"Add its prices there, or also set --max-experiments or --hours")
    console.say(f"autoresearch: {s.branch} at {s.best_commit[:7]}, {len(s.history)} experiments so far, "
                f"proposer {args.proposer}{' ' + args.model if s.proposer.is_llm else ''}, budget "
                f"{s.budget:g}s, timeout {s.timeout:g}s, devices {', '.join(d.name for d in devices)}"
                f"{'' if args.no_speculate else ', speculating'}")
    s.status(s.next_n, f"checking {args.proposer} {args.model or ''} with a 1-token request")
    proposer.check()                    # a refused key or unknown model stops here, before the baseline
    s.pool = Pool(devices, len(s.history))   # its clock (busy share, experiments per hour) starts with the loop
    try:
        reason = research_loop(s)
    finally:                            # also on Stop and Ctrl-C: the runs in flight are killed, the threads joined
        s.pool.close()
    s.log("stop", reason=reason, **s.pool.throughput(len(s.history)).fields())
    console.say(s.pool.throughput(len(s.history)).line())
    console.say(f"stopped: {reason}. Branch {s.branch} at best {s.best_commit[:7]} ({s.metric} "
                f"{s.best_metric:.6f}); rows in {ledger.RESULTS}, details in {ledger.EVENTS}")
    if s.evaluation is not None and len(s.history) > 1:      # the gain on data the search never saw
        try:
            console.say(holdout_summary(s.home, s.history, s.metric, s.goal, s.evaluation["env"]))
        except SetupError as e:
            console.say(f"holdout: not measured ({str(e).splitlines()[-1]})")
    return 0


def on_llm_retry(s, attempt, problem, delay):
    """A transient LLM error: log it and show the wait."""
    s.log("error", where="llm", attempt=attempt, error=problem[:500], retry_in_s=round(delay, 3))
    s.status(s.next_n, f"LLM error ({problem[:60]}), retry {attempt + 1} in {delay:.0f}s")


def log_stop(s, event, reason):
    """Log why the loop ended. Nothing to undo: the branch only ever moves to a kept commit, and the training
    group is already dead (the runner kills it on any exception)."""
    if s is not None and s.best_commit:
        s.log("stop", reason=reason, status=event)


def raise_interrupt(signum, frame):
    """SIGTERM handler: clean up exactly as for Ctrl-C."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
