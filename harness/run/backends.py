"""
HARNESS: where a run goes. A backend is anything with run(spec, watch) -> Outcome: Local (this machine: the guard's
snapshot, the runner, the guard's check, the artifact kept) here, and the Ray cluster's RayBackend
(harness.run.cluster). A Spec is one run, fully described (no session); a Watch is the seam a running experiment talks
back through: its start, its ticks, its events, its artifact. Early cancellation travels in the Spec (a curves.Watcher,
plain data): the rule runs where the log is written, and the run's process group is stopped there (locally, or inside
the Ray task, which then returns at once). Swapping where runs go never touches the loop.
"""

import dataclasses
import shutil
from pathlib import Path
from typing import Callable

from harness import gitops, ledger
from harness.run import conditions, guard, runner, sandbox
from harness.redact import clean_env
from harness.run.runner import Kind
from harness.run.target import FROZEN


@dataclasses.dataclass
class Spec:
    """One run of experiment n's candidate `commit` (its fix `fix`, repeated run `run` of it, seed `seed`): its files
    exported in run_dir, its pristine evaluator in frozen_dir (fresh_frozen() re-makes it), its log, its environment,
    and the tag's settings a run is held to."""
    n: int
    fix: int
    run: int
    seed: int
    commit: str
    run_dir: Path
    frozen_dir: Path
    log: Path
    env: dict
    metric: str                             # the summary key that is the result
    timeout: float                          # seconds: the whole process group is killed after it
    budget: float | None                    # the summary's time_budget_s must be this (None: a legacy target)
    max_wall: float | None                  # seconds of train.py wall time allowed (None before the baseline)
    evaluation: dict | None                 # {"digest", "tolerance", "artifact", ...}; None: train.py's own number
    fresh_frozen: Callable = lambda: None   # re-export the pristine evaluator into frozen_dir
    device: object = None                   # the harness.run.pool.Device it runs on (None: this machine as it is)
    probe: bool = False                     # run the target's speed probe around it (prepare.py SPEED_PROBE)
    cancel: object = None                   # a curves.Watcher: stop the training early when its rule says so
    probed: tuple | None = None             # the probe before, already measured (runner.RunSpec.probed; local only)


class Watch:
    """What a backend tells about a run in flight. started(pgid): it runs (pgid None for a remote one); tick(elapsed):
    about once a second (raises KeyboardInterrupt when the loop is stopping); event(name, **fields): one event of
    the tag, for experiment spec.n; phase(name): what the run does now ("probing", "training", "evaluating"; a remote
    run tells none); keep_artifact(path): the run's model artifact, for the holdout."""

    def started(self, pgid):
        pass

    def tick(self, elapsed):
        pass

    def phase(self, name):
        pass

    def event(self, name, **fields):
        pass

    def keep_artifact(self, path):
        pass


class Local:
    """Runs on this machine, watched by the guard: a snapshot of everything outside the run dir that a run must not
    change (refs, results.tsv, events.jsonl, the frozen copy; without the sandbox also git's config and hooks), the
    runner (sandboxed where s.sandbox is set), then the check; a run that changed anything is rejected. s: the Session
    (its repository, lock and the snapshots in flight)."""

    def __init__(self, s):
        self.s = s

    def run(self, spec, watch):
        """One run: runner.run with the separate evaluation; the run dir is removed afterwards (the artifact moved
        out first when it is a clean one). Returns the Outcome (kind REJECTED when the guard found changes)."""
        s = self.s
        box = s.sandbox
        snapshot = self.snapshot(spec) if box is None else None   # sandboxed: the repository is out of its reach
        gpu = sandbox.run_gpu(spec.env)
        artifact = spec.run_dir / (spec.evaluation or {}).get("artifact", "artifact")
        evaluation = None
        eval_wrap = (lambda argv: box.evaluate(argv, spec.frozen_dir, artifact, gpu)) if box else (lambda a: a)
        if spec.evaluation is not None:
            evaluation = runner.Evaluation(
                prepare_dir=spec.frozen_dir, artifact=artifact, digest=spec.evaluation["digest"],
                tolerance=spec.evaluation["tolerance"], own_required=box is None, setup=spec.fresh_frozen,
                wrap=eval_wrap, timeout=spec.evaluation.get("timeout"),
                # sandboxed, the pristine copy is out of train.py's reach, so the evaluator may start with the run
                # (its view: the run dir read-only, where the artifact will be); unsandboxed, after it, as it was
                warm_wrap=(lambda argv: box.evaluate(argv, spec.frozen_dir, spec.run_dir, gpu)) if box else None)
        run = runner.RunSpec(
            commit=spec.commit, cwd=spec.run_dir, log=spec.log, metric=spec.metric, timeout=spec.timeout,
            frozen=FROZEN, env=spec.env, wrap=(lambda argv: box.train(argv, spec.run_dir, gpu)) if box else (lambda a: a),
            budget=spec.budget, max_wall=spec.max_wall, evaluation=evaluation, on_start=watch.started,
            on_tick=watch.tick, on_phase=watch.phase, cancel=spec.cancel, probed=spec.probed,
            probe=conditions.Probe(runner.interpreter(), spec.frozen_dir, eval_wrap, {**clean_env(), **spec.env},
                                   warm=box is not None) if spec.probe else None)   # warm: as the evaluator
        try:
            outcome = runner.run(run)
        finally:                                                   # also on Ctrl-C
            with s.lock:
                problems = []
                if snapshot is not None:
                    s.live.remove(snapshot)
                    problems = guard.check(s.repo, snapshot, frozen=s.tag.frozen_rels, keep_dir=s.tag.home / "changed",
                                           others=s.live)
                if spec.evaluation is not None and runner.artifact_problem(artifact) is None:
                    watch.keep_artifact(artifact)
                shutil.rmtree(spec.run_dir, ignore_errors=True)
        if problems:
            outcome.fail(Kind.REJECTED, "rejected: the run " + "; ".join(problems))
        outcome.outside = problems
        return outcome

    def snapshot(self, spec):
        """The guard's snapshot, taken before the run starts (its very first write is seen too) and registered as a
        run in flight (told of the harness's own changes meanwhile)."""
        s = self.s
        git_dir = gitops.git_dir(s.repo)
        own = [s.tag.target / ledger.RESULTS, s.tag.target / ledger.EVENTS, *s.tag.target.glob("results.*.tsv"),
               *spec.frozen_dir.rglob("*.py"), git_dir / "config", gitops.global_config(s.repo), *gitops.user_configs()]
        dirs = [git_dir / "hooks", git_dir / "info"]         # and what would make git run a program of the run's
        with s.lock:
            snapshot = guard.take(s.repo, own, dirs)
            s.live.append(snapshot)
        return snapshot
