"""
HARNESS: the overnight research loop. Start it, go to bed, read `git log autoresearch/<tag>` and results.tsv
in the morning.

    uv run agent.py --tag nov30                        # LLM proposer (ANTHROPIC_API_KEY or OPENAI_API_KEY)
    uv run agent.py --tag nov30 --proposer random      # no API key: random hyperparameter perturbations
    uv run agent.py --tag nov30 --target grpo          # another target: a dir with program.md, prepare.py, train.py
    uv run agent.py try --tag nov30 -m "idea"          # one experiment for Claude Code / Codex (propose/external)
    uv run agent.py --help                             # every flag

This file is the loop and its rules; research_loop() is program.md's LOOP FOREVER, with every device busy:
    propose     ask for ideas while candidates train (speculation), N different ones in one call when N devices are
                free: an answer -> search/replace edits to train.py, repaired <= MAX_REPAIRS times (propose/ideas)
    commit      a free device takes the next idea: a candidate commit on the best (re-applied if the best moved)
    run         on its device: train with a hard timeout, evaluate separately (record/experiment, run/backends)
    judge       keep if it beats the best it was built on by the margin, confirmed (judge/verdict)
    record      in experiment order, one at a time: one event, one results.tsv row, one git note
    keep        a kept candidate becomes the branch tip (update-ref); nothing else ever moves the branch
Every run is hermetic and sandboxed where bubblewrap works; your checkout is never switched or reset. agent.py
never imports prepare.py or train.py. The map of harness/ (paths above: under it) is in docs/architecture.md.
"""

import os
import signal

if __name__ == "__main__":      # Ctrl-C before main's try (modules loading, flags): exit 130 at once; os._exit,
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))   # as a library's bare except drops SystemExit

import collections
import dataclasses
import functools
import sys
import time
from pathlib import Path

from harness import console, ledger
from harness.propose import hybrid, ideas, search
from harness.record import baseline, experiment
from harness.run import cluster
from harness.tag import checks
from harness.errors import Interrupts, SetupError, Stop, from_interrupt
from harness.propose.external import try_one
from harness.gitops import GitError, failure_words, git_dir, lock_repo, open_repo
from harness.run.pool import Local, Pool, acquired
from harness.propose.proposers import make_proposer
from harness.propose.providers import Spend
from harness.propose.prompts import SYSTEM_PROMPT, goal_word
from harness.run.processes import become_subreaper
from harness.tag.opening import open_session
from harness.tag.session import RUN_LOG, interrupt_words, status
from harness.tag.settings import BREAKER, MAX_FIXES, MAX_REPAIRS, THREADS, parse  # noqa: F401  (the loop's rules, stated there)
from harness.run.target import FROZEN, check_target, ensure_prepared, profile_of, read_text, run_prepare
from harness.schema import Event


@dataclasses.dataclass
class Loop:
    """The loop's own state: the devices, what waits for them, the next experiment number to hand out (ahead of the
    recorded ones while candidates are in flight), finished candidates waiting their turn, the breaker's failures."""
    pool: Pool
    backlog: ideas.Backlog
    assigned: int
    failures: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=BREAKER[1]))
    lookahead: int = 1                  # ideas asked for ahead of a free device (0: --no-speculate)
    finished: dict = dataclasses.field(default_factory=dict)   # n -> (Job, Outcome, Verdict, ended): not recorded yet

    def running(self):
        """The candidates started and not recorded yet (ideas.Job): on a device, or finished and waiting for an
        earlier experiment to be recorded first. Their results are not known to the proposer."""
        return [job for _, job in self.pool.running.values() if isinstance(job, ideas.Job)] + \
            [job for job, *_ in self.finished.values()]


def research_loop(s, loop):
    """LOOP FOREVER (until a --max-* limit or the breaker), as in program.md, with every device busy: the proposer is
    asked for the next ideas while candidates train (speculation; --no-speculate: only when a device is free), each
    idea becomes a candidate commit on the best as it is when a device frees, the devices train and judge (see
    measure), and the verdicts are recorded here, one at a time, in experiment order. On one device with
    --no-speculate that is exactly propose, commit, run, judge, record, keep."""
    pool, backlog = loop.pool, loop.backlog
    if s.baseline_due:                  # the tag's first, or a new hardware epoch's
        run_baseline(s, loop)
    finished, reason = loop.finished, None
    while True:
        while s.next_n in finished:                              # record (and keep), in experiment order
            settle(s, loop, *finished.pop(s.next_n))
        reason = reason or stop_reason(s, loop)
        while pool.free and (backlog.fixes or backlog.ideas and allowed(s, loop) > 0):   # commit, on free devices
            if backlog.fixes:
                pool.submit(functools.partial(measure, s), backlog.fixes.popleft())
            else:
                start(s, loop, backlog.ideas.popleft())
        want = min(len(pool.free) + loop.lookahead - len(backlog.ideas), allowed(s, loop) - len(backlog.ideas))
        if reason is None and want > 0:                          # propose (several devices free: a wave)
            propose(s, loop, max(1, min(want, len(pool.free))) if pool.free else 1)
            continue
        if not pool.running:
            if reason is not None:
                return reason
            continue
        for job, result in pool.done():                          # run and judge: a device finished
            finished[job.n] = (job, *result)


def propose(s, loop, k):
    """Ask for k ideas (harness.propose.ideas); an iteration with no usable answer counts as a failure for the
    breaker."""
    if not ideas.propose(s, loop.backlog, loop.assigned, loop.running(), k):
        loop.failures.append(True)


def allowed(s, loop):
    """How many more candidates --max-experiments allows to start (a large number without it)."""
    if s.settings.max_experiments is None:
        return 10**9
    return s.settings.max_experiments - (loop.assigned - 1)


def start(s, loop, idea):
    """Commit an idea as the next experiment on top of the best and start it on a free device. An idea written
    against an older best is re-applied to the new best first; one that no longer applies, or gives a train.py
    already measured or in flight, is dropped (the loop asks again)."""
    if idea.base != s.best_commit and (idea := ideas.rebase(s, idea, loop.backlog, loop.running())) is None:
        return
    n, loop.assigned = loop.assigned, loop.assigned + 1
    job = ideas.job_for(s, n, idea)
    device = loop.pool.submit(functools.partial(measure, s), job)
    s.log(Event.STARTED, n=n, device=device.name, base=s.best_commit, wave=idea.wave)


def measure(s, device, job):
    """On a device (a worker thread): train the candidate, then judge it against the best it was built on
    (confirmation runs included). Returns (its first run's Outcome, the Verdict, when it ended)."""
    outcome = experiment.train(s, job.n, job.fixes, job.commit, device=device, base=job.base)
    judged = experiment.judge(s, job.n, job.fixes, outcome, job.base, job.base_metric, device=device)
    return outcome, judged, time.monotonic()


def settle(s, loop, job, outcome, judged, ended):
    """The verdict on a finished candidate, in the main thread: the event, the row, and on a keep the branch moves.
    A win over a best that has moved since it started is never kept untested: it is recorded as superseded (a
    discard) and its edit, re-applied to the new best, runs next. A crash is recorded, then may get a fix: the
    amended commit is the next experiment and runs before anything new."""
    result = experiment.Result(job.n, outcome, judged, job.description, ended - job.t0, job.cost,
                               job.idea.repairs, job.fixes, job.base, job.base_metric,
                               fields=dict(wave=job.idea.wave, rebased_from=job.idea.rebased_from, fix_of=job.fix_of,
                                           **job.idea.credit))
    if judged.status == "crash":        # the machine's fault (data gone, disk full) stops the loop: the idea is
        experiment.check_environment(s, job.n)      # not blamed, nothing is sent for a fix, a rerun redoes it
    if judged.status == "keep" and job.base != s.best_commit:
        result.judged = dataclasses.replace(judged, status="discard")
        result.reason = (f"superseded: it beat its base {job.base[:7]}, but the best moved to {s.best_commit[:7]} "
                         "while it ran; re-run on the new best")
        result.fields["superseded"] = True                      # its re-run survives a restart (ideas.unfinished)
        loop.backlog.ideas.appendleft(dataclasses.replace(job.idea, cost=Spend(), rebased_from=job.n))
    event = experiment.record(s, result)
    if event["status"] == "keep":                               # only a measured, kept commit enters the branch
        experiment.keep(s, event)
    loop.failures.append(event["status"] == "crash")
    s.log(Event.THROUGHPUT, n=job.n, **loop.pool.throughput(len(s.history)).fields())
    if result.kind.fixable and job.fixes < MAX_FIXES and loop.backlog.proposer.is_llm and allowed(s, loop) > 0 \
            and sum(loop.failures) < BREAKER[0]:            # not when the breaker is about to stop the loop
        fixed = ideas.ask_fix(s, loop.backlog, job, loop.assigned, result.why, (judged.failed or outcome).log_tail)
        if fixed is not None:
            loop.assigned += 1
            loop.backlog.fixes.append(fixed)


def run_baseline(s, loop):
    """Experiment 0: the unmodified train.py at the branch start, measured on this machine --baseline-runs times
    with different seeds, on every device at once as the candidates will run: their mean is the first best, their
    standard deviation the noise floor (on new hardware, --new-hardware: the best's train.py, as the next experiment).
    The first ideas (one per device) are asked for while it trains."""
    t0, spend0, k, (n, sha) = time.monotonic(), s.spend, s.settings.baseline_runs, baseline.baseline_commit(s)
    status(s, n, f"baseline: {k} run(s)")
    outcomes, waiting, pool = [None] * k, list(range(k)), loop.pool
    while waiting or pool.running:
        while waiting and pool.free:
            pool.submit(lambda device, run: experiment.train(s, n, 0, sha, run=run, device=device), waiting.pop(0))
        if loop.lookahead and not waiting and not loop.backlog.ideas and allowed(s, loop) > 0:   # busy: ask now
            propose(s, loop, min(len(pool.devices), allowed(s, loop)))
        for run, outcome in pool.done():
            outcomes[run] = outcome
    baseline.record_baseline(s, outcomes, t0, spend0)


def stop_reason(s, loop):
    """Why the loop should end before the next experiment, or None to go on. Raises Stop at the breaker."""
    a = s.settings
    if a.max_experiments is not None and allowed(s, loop) <= 0:
        return f"--max-experiments {a.max_experiments} reached"
    if a.hours is not None and time.monotonic() - s.started >= a.hours * 3600:
        return f"--hours {a.hours:g} reached"
    if a.max_cost_usd is not None and s.spend.usd >= a.max_cost_usd:
        return f"--max-cost-usd {a.max_cost_usd:g} reached (spent ${s.spend.usd:.2f})"
    if sum(loop.failures) >= BREAKER[0]:
        raise Stop(f"circuit breaker: {BREAKER[0]} of the last {BREAKER[1]} iterations failed (crash or unusable "
                   f"answer). Read the errors in {ledger.EVENTS} and {RUN_LOG}, fix program.md, train.py or the "
                   "model, then rerun the same command to resume.")
    return None


def research_main(s, proposer, constants):
    """The loop's own setup (the proposer, its prompts and check, the preflight, the devices), then research_loop
    until a limit. Returns 0."""
    a, tag, devices = s.settings, s.tag, s.devices
    search.attach(s, proposer)          # the profile it edits; a sampler's study (propose/search)
    proposer.on_retry = functools.partial(ideas.on_llm_retry, s)
    system = SYSTEM_PROMPT.format(budget=tag.budget, metric=tag.metric, goal=goal_word(tag.goal), rule=s.rule.words(
        tag.metric), frozen="\n\n".join(f"=== {f} ===\n{read_text(tag.target / f)}" for f in FROZEN))
    for warning in checks.start_warnings(s, devices, proposer.is_llm):
        console.say(f"warning: {warning}")
        s.log(Event.WARNING, reason=warning)
    if constants["PREFLIGHT"]:
        console.say("preflight: prepare.py --preflight ...")
        run_prepare(tag.target, "--preflight", timeout=experiment.run_timeout(s).seconds())
    s.log(Event.CONFIG, proposer=a.proposer, model=a.model, base_url=a.base_url, metric=tag.metric, goal=tag.goal,
          budget_s=tag.budget, timeout_s=tag.timeout, max_experiments=a.max_experiments, hours=a.hours,
          max_cost_usd=a.max_cost_usd, devices=[d.name for d in devices], threads=[d.threads for d in devices],
          speculate=not a.no_speculate, ray=a.ray, verdict=s.rule.name, confirm=s.rule.confirm, margin=s.rule.margin_flag)
    console.say(f"autoresearch: {tag.branch} at {s.best_commit[:7]}, {len(s.history)} experiments so far, proposer "
                f"{a.proposer}{' ' + a.model if proposer.is_llm else ''}, budget {tag.budget:g}s, timeout "
                f"{experiment.run_timeout(s).words()}, devices {', '.join(d.name for d in devices)}{'' if a.no_speculate else ', speculating'}")
    s.pool = Pool(devices, len(s.history))   # its clock (busy share, experiments per hour) starts with the loop
    mixer = hybrid.propose if a.proposer == "hybrid" else None     # the sampler's points, shown to the LLM
    loop = Loop(s.pool, ideas.Backlog(proposer, system, mixer), s.next_n + s.baseline_due, lookahead=int(not a.no_speculate))
    loop.backlog.ideas.extend(ideas.unfinished(s) if s.history else [])   # what a stop left unmeasured runs first
    try:
        reason = research_loop(s, loop)
    finally:                            # also on Stop and Ctrl-C: the runs in flight are killed, the threads joined
        s.pool.close()
        search.close(s)                 # the points speculated and never run are closed in the study
    experiment.stopped(s, reason=reason, **s.pool.throughput(len(s.history)).fields())
    console.say(s.pool.throughput(len(s.history)).line())
    console.say(f"stopped: {reason}. Branch {s.tag.branch} at best {s.best_commit[:7]} ({s.tag.metric} "
                f"{s.best_metric:.6f}); rows in {ledger.RESULTS}, details in {ledger.EVENTS}")
    if s.tag.evaluation is not None and len(s.history) > 1 and not a.no_holdout:   # the gain on unseen data
        console.say(baseline.holdout_line(s))
    return 0


COMMANDS = {"loop": research_main, "try": try_one}   # Settings.command -> (s, proposer, constants) -> exit code


def main(argv=None):
    """Entry point: `agent.py --tag T ...` runs the loop, `agent.py try --tag T ...` one experiment (try_one). Exit
    codes: 0 clean stop at a limit (try: a verdict), 1 stopped by a problem (message on stderr), 2 bad input or state
    (nothing changed), 130 interrupted (training killed; the words say what was recorded)."""
    settings = parse(list(sys.argv[1:] if argv is None else argv))
    become_subreaper()                      # a process a run detaches still ends with the run
    s, interrupts = None, Interrupts()      # once one arrived, whatever ends main is the interrupt
    previous = {sig: signal.signal(sig, interrupts) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        target = Path(settings.target).resolve()
        check_target(target)
        proposer = make_proposer(settings) if settings.command == "loop" else None   # a missing key stops here
        if proposer is not None:        # one 1-token request: a dead server, a refused key or an unknown model
            proposer.check()            # stop here, before anything is created or trained
        with lock_repo(repo := open_repo(target)):
            profile = profile_of(ensure_prepared(target, settings.source))   # a fresh machine: prepared here
            with acquired(Local(settings.devices, THREADS) if settings.ray is None else cluster.RaySource(settings.ray,
                    dict(sandbox=settings.sandbox, source=settings.source, profile=profile,   # a dead address stops
                         hide=[repo.working_tree_dir, str(git_dir(repo))]))) as devices:     # here
                s, constants = open_session(settings, profile, devices)
                return COMMANDS[settings.command](s, proposer, constants)
    except (KeyboardInterrupt, Exception) as e:     # Ctrl-C, also inside an import (wrapped by Python)
        return ending(e, s, settings, interrupts)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def ending(e, s, settings, interrupts):
    """Say why main ended on exception e and return the exit code (main's docstring); re-raises one that is no known
    stop (a bug: its traceback)."""
    if from_interrupt(e, interrupts.count > 0):
        try:
            if s is not None:
                s.repo.git.clear_cache()    # git's helper processes died with the Ctrl-C: fresh ones from here
            experiment.log_stop(s, "interrupted", "interrupted")
            interrupts.quiet()
        except KeyboardInterrupt:           # a second Ctrl-C cuts the clean-up short (the next start completes it)
            pass
        print(f"\nagent.py: interrupted; {interrupt_words(s, settings)}.", file=sys.stderr)
        return 130
    if isinstance(e, SetupError):
        console.error(f"agent.py: error: {e}")
        return 2
    if isinstance(e, Stop):
        experiment.log_stop(s, "error", str(e))
        console.error(f"agent.py: stopped: {e}")
        return 1
    if isinstance(e, (GitError, OSError)) and failure_words(e) is not None:   # git or the machine (disk full, a
        console.error(f"agent.py: stopped: {failure_words(e)}, then rerun the same command to resume")   # file made
        return 1                            # read-only): every record before it is complete, a rerun resumes there
    raise


if __name__ == "__main__":
    sys.exit(main())
