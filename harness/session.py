"""
HARNESS: one tag's state and the steps the loop takes on it. open_session checks the target, the repository and
the ledger, then creates autoresearch/<tag> or resumes it; the Session it returns carries everything the loop in
agent.py needs, and the functions below are the loop's plumbing: commit a candidate, train it, advance the branch,
record an experiment. It joins git (gitops), the ledger, the runner, the sandbox and the guard; it never decides
keep or discard (that is agent.py's rule) and never imports agent.py.

Hermetic runs: the user's checkout is never switched, reset or written (except results.tsv, events.jsonl and a copy
of the last run.log in the target dir). Candidates are committed in the harness's own detached worktree
(<git dir>/autoresearch/<tag>/stage, so hooks run); each run gets a fresh export of exactly its commit's files
(runs/<n>-<attempt>, removed afterwards; its log stays in logs/); the frozen evaluator runs from a pristine export
of the tag's base commit (frozen/); the branch moves only by update-ref, to a measured, kept commit.
"""

import argparse
import collections
import dataclasses
import difflib
import functools
import json
import os
import re
import shutil
import statistics
import threading
import time
from pathlib import Path

import git

from harness import console, gitops, guard, ledger, prompts, runner, sandbox
from harness.edits import clean_description
from harness.errors import SetupError, Stop
from harness.gitops import git_blob_sha
from harness.redact import redact
from harness.target import (FROZEN, check_target, default_timeout, effective_budget, read_frozen_constants,
                            run_prepare, score_holdout)

RUN_LOG = "run.log"
CONSTANT = re.compile(r"^\s*([A-Z][A-Z0-9_]*)\s*=")     # an UPPER_CASE constant's assignment line in train.py
TRY_LOG = "try.log"                 # where program.md's background `try` writes its output (ignored like run.log)
# The CPU thread count of every run (train.py and the evaluator, through AUTORESEARCH_THREADS): fixed, so that CPU
# runs are comparable; the cores this process may use.
THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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
    target_rel: str = ""                # the target dir relative to the repository root ("" for the root)
    home: Path = None                   # <git dir>/autoresearch/<tag>: stage worktree, frozen/, runs/, logs/
    evaluation: dict = None             # {"digest", "tolerance", "artifact", "inputs", "env"}; None: train.py's own
    #                                     number. inputs: prepare.py --frozen-inputs (what the sandbox shows each
    #                                     process); env: the variables pinned at tag start (the GRPO base model)
    frozen_base: str = ""               # the commit the pristine frozen/ copy is exported from (the tag's start)
    smoke: bool = False                 # the budget is shortened (AUTORESEARCH_TIME_BUDGET): rows are labelled
    wrap: object = None                 # (argv, run_dir, gpu) -> train.py's sandboxed argv (None: no sandbox)
    eval_wrap: object = None            # (argv, frozen_dir, artifact, gpu) -> the evaluator's sandboxed argv
    sandbox_env: dict = dataclasses.field(default_factory=dict)
    proposer: object = None             # harness.proposers.Proposer
    system_prompt: str = ""
    profile: str | None = None          # device class reported by `prepare.py --check`, if any
    cost_usd: float = 0.0               # the tag's LLM spend and tokens so far (resume sums "propose" events)
    input_tokens: int = 0
    output_tokens: int = 0
    llm_seconds: float = 0.0            # time spent waiting on the proposer in this invocation
    started: float = dataclasses.field(default_factory=time.monotonic)
    recent_failures: collections.deque = dataclasses.field(default_factory=collections.deque)
    last: str = "-"
    noise_sd: float | None = None       # the spread of the baseline's runs (None: one run)
    synced: str | None = None           # the commit whose train.py `try` last wrote into your checkout
    recorded: bool = False              # `try`: this invocation's experiment is recorded
    blobs: dict = dataclasses.field(default_factory=dict)   # experiment n -> blob sha of its train.py (duplicate_of)
    touched: dict = dataclasses.field(default_factory=dict)  # experiment n -> what its edit changed (touched_by)
    # Several runs at once (--devices, --ray, speculation): worker threads train while the main thread proposes and
    # records. The lock serialises git, the ledger and the guard's snapshots; `live` are the snapshots of the runs
    # in flight, told of every change the harness itself makes meanwhile (expect_ref, Snapshot.appended).
    lock: threading.RLock = dataclasses.field(default_factory=threading.RLock)
    live: list = dataclasses.field(default_factory=list)
    assigned: int = 0                   # the number the next candidate gets (> next_n while candidates are in flight)
    pool: object = None                 # harness.pool.Pool: the devices of the loop (None for `try`)
    queue: collections.deque = dataclasses.field(default_factory=collections.deque)   # fixes to run first
    ideas: collections.deque = dataclasses.field(default_factory=collections.deque)   # proposals not run yet
    wave: int = 0                       # proposal calls so far (an event's wave: ideas asked for together)

    @property
    def next_n(self):
        """The number of the next experiment."""
        return len(self.history)       # the baseline is experiment 0

    def log(self, event, **fields):
        """Append one event of this tag to events.jsonl; returns the record. The runs in flight expect the line."""
        with self.lock:
            record = ledger.log_event(self.target / ledger.EVENTS, self.args.tag, event, **fields)
            for snap in self.live:
                snap.appended(self.target / ledger.EVENTS, ledger.event_line(record) + "\n")
            return record

    def expect_ref(self, ref):
        """The harness itself just moved `ref`: the runs in flight must not be blamed for it (nor have it undone)."""
        with self.lock:
            if self.live:
                value = self.repo.git.for_each_ref("--format=%(objectname)", ref).strip()
                for snap in self.live:
                    snap.refs[ref] = value or None
                    if not value:
                        snap.refs.pop(ref)

    def spent(self):
        """(input tokens, output tokens, USD, LLM seconds) so far; record() logs the difference per experiment."""
        return self.input_tokens, self.output_tokens, self.cost_usd, self.llm_seconds

    def tick(self, n, elapsed, device=None):
        """A training run's tick (about once a second): the status line shows how far it is."""
        if self.pool is not None and self.pool.cancel.is_set():   # the loop is stopping: the runner kills this run
            raise KeyboardInterrupt
        where = f" on {device.name}" if device is not None and device.name != "default" else ""
        self.status(n, f"training{where} {console.fmt_duration(elapsed)}/{console.fmt_duration(self.budget)}")

    def status(self, n, phase):
        """The live status line: experiment, phase, best and change vs baseline, last result, tokens, $, elapsed;
        with a pool of devices or speculation, its throughput (experiments per hour, device busy share, proposal
        wait: see harness.pool.Pool.throughput)."""
        best = "-"
        if self.best_metric is not None:
            best = f"{self.best_metric:.6f}"
            if self.baseline_metric:
                best += f" ({100 * (self.best_metric - self.baseline_metric) / abs(self.baseline_metric):+.2f}%)"
            if self.noise_sd:
                best += f" noise sd {self.noise_sd:.4f}"
        if self.pool is not None:
            phase += f" | {self.pool.throughput(len(self.history)).short()}"
        console.status(f"exp {n} | {phase} | best {best} | last {self.last} | "
                       f"{(self.input_tokens + self.output_tokens) / 1000:.1f}k tok ${self.cost_usd:.2f} | "
                       f"{console.fmt_duration(time.monotonic() - self.started)}")

# ---------------------------------------------------------------------------
# The loop's plumbing: commit, train, reset, record
# ---------------------------------------------------------------------------


def locked(step):
    """A step that reads or writes git or the ledger holds the session's lock (GitPython's repository handle is not
    thread-safe, and a run's guard snapshot must not be taken halfway through a step)."""
    @functools.wraps(step)
    def wrapper(s, *args, **kwargs):
        with s.lock:
            return step(s, *args, **kwargs)
    return wrapper


@locked
def best_source(s):
    """train.py of the best commit: what the next proposal edits."""
    return gitops.file_at(s.repo, s.best_commit, s.train_rel)


@locked
def duplicate_of(s, source):
    """The "experiment" event of this tag whose train.py is byte-identical to `source` (any status, the baseline
    included), or None: an idea already measured is never run again."""
    blob = git_blob_sha(source.encode())
    for e in s.history:
        if e["n"] not in s.blobs:
            s.blobs[e["n"]] = (s.repo.commit(e["full_commit"]).tree / s.train_rel).hexsha
        if s.blobs[e["n"]] == blob:
            return e
    return None


@locked
def touched_by(s):
    """{n: what experiment n's edit of train.py changed}: the UPPER_CASE constants on the lines it changed (e.g.
    "DEPTH, MATRIX_LR"), or "code" when it changed none; cached, for the prompt's grouped older history."""
    for e in s.history[1:-prompts.HISTORY_ROWS]:         # the prompt shows newer rows in full: no summary needed
        if e["n"] not in s.touched and e.get("base") and e.get("full_commit"):
            before = gitops.file_at(s.repo, e["base"], s.train_rel).splitlines()
            after = gitops.file_at(s.repo, e["full_commit"], s.train_rel).splitlines()
            changed = [line[1:] for line in difflib.unified_diff(before, after, lineterm="", n=0)
                       if line[:1] in "+-" and not line.startswith(("+++", "---"))]
            names = sorted({m.group(1) for line in changed if (m := CONSTANT.match(line))})
            s.touched[e["n"]] = ", ".join(names) or "code"
    return s.touched


def describe(e, metric):
    """One experiment for a message: '#3 (discard, val_bpb 1.208000: lower LR)'."""
    value = f", {metric} {e['metric']:.6f}" if e["status"] != "crash" else ""
    return f"#{e['n']} ({e['status']}{value}: {e['description']})"


@locked
def commit_candidate(s, n, source, message, attempt=0, amend=None):
    """Commit this train.py as experiment n's candidate on top of the best commit, in the harness's stage worktree
    (amend: the crashed candidate's sha, amended with a fix as attempt > 0). Only train.py is committed; hooks run and a blocking one
    raises Stop. The message body names the tag and experiment, so two identical candidates never share a commit.
    Keeps the commit reachable as refs/autoresearch/<tag>/<n>-<sha7>. Returns the full sha."""
    s.log("candidate", n=n, attempt=attempt, parent=s.best_commit, blob=git_blob_sha(source.encode()), message=message)
    stage = gitops.open_stage(s.repo, s.home / "stage", amend or s.best_commit)
    (Path(stage.working_tree_dir) / s.train_rel).write_text(source)
    body = f"{message}\n\nautoresearch: tag {s.args.tag}, experiment {n}"
    commit = gitops.commit_file(stage, s.train_rel, redact(body), amend=amend is not None)
    if (s.repo.commit(commit).tree / s.train_rel).hexsha != git_blob_sha(source.encode()):
        raise Stop(f"the candidate commit {commit[:7]} holds another train.py than the one proposed: a git filter "
                   "(filter.*.clean in your git config, with a .gitattributes or info/attributes line) rewrote it; "
                   "remove that filter, then rerun")
    changed = s.repo.git.diff("--name-only", s.best_commit, commit).split()
    if changed != [s.train_rel]:                     # a hook (or a planted one) added files to the commit
        raise Stop(f"the candidate commit {commit[:7]} changes {', '.join(changed) or 'nothing'}, not only "
                   f"{s.train_rel}: a git hook altered it (check .git/hooks and core.hooksPath); the agent commits "
                   "train.py only")
    s.expect_ref(gitops.make_candidate_ref(s.repo, s.args.tag, n, commit))
    s.log("commit", n=n, attempt=attempt, full_commit=commit)
    return commit


def train_candidate(s, n, attempt, commit, run=0, again=False, device=None):
    """Run `commit` hermetically: a fresh export of its target files, train.py (sandboxed when available), the
    separate evaluation, the guard's check of everything outside the run dir; then the run dir is removed, its log
    kept in logs/ and copied to <target>/run.log. Logs "run" and "run_end". run: the run's index among the repeated
    runs of one commit (baseline runs, confirmations); train.py gets AUTORESEARCH_SEED = seed_of(n, run) and a fixed
    AUTORESEARCH_THREADS. again: the same run repeated (its throughput was off), logged apart. device: the
    harness.pool.Device it runs on (its environment, its own pristine evaluator copy, or a Ray cluster); None: this
    machine as it is. Safe to call from several threads at once. Returns the runner's Outcome."""
    name = f"{n:04d}-{attempt}" + (f"-r{run}" if run else "") + ("-again" if again else "")
    seed = seed_of(n, run)
    run_dir = s.home / "runs" / name
    frozen_dir = s.home / (device.frozen if device else "frozen")
    log = s.home / "logs" / f"{name}.log"
    env = {**(s.evaluation or {}).get("env", {}), "AUTORESEARCH_TIME_BUDGET": f"{s.budget:g}", "AUTORESEARCH_SEED": str(seed),
           "AUTORESEARCH_THREADS": str(device.threads if device else THREADS),
           "AUTORESEARCH_ARTIFACT": str(run_dir / (s.evaluation or {}).get("artifact", "artifact")),
           **s.sandbox_env, **(device.env if device else {})}
    with s.lock:
        shutil.rmtree(run_dir, ignore_errors=True)                  # a leftover of a killed agent
        gitops.export_commit(s.repo, commit, s.target_rel, run_dir)
        log.parent.mkdir(parents=True, exist_ok=True)
        if device is not None and device.remote is not None:        # a Ray worker: nothing of it runs here
            export_frozen(s, frozen_dir)
            fields = dict(n=n, attempt=attempt, run=run, seed=seed, commit=commit[:7], pgid=None, timeout_s=s.timeout,
                          cwd=str(run_dir), device=device.name, sandbox=s.args.sandbox)
            job = device.remote.job(s, run_dir, frozen_dir, env, log, n, commit)
            shutil.rmtree(run_dir, ignore_errors=True)
            s.log("run", **fields)
    if device is not None and device.remote is not None:
        outcome, problems = device.remote.run(job, device), []
    else:
        outcome, problems = train_here(s, n, attempt, commit, run, seed, run_dir, frozen_dir, env, log, device)
    with s.lock:
        if log.exists():
            shutil.copyfile(log, s.target / RUN_LOG)
        if problems:
            outcome.metric, outcome.reason = None, "rejected: the run " + "; ".join(problems)
        s.log("run_end", n=n, attempt=attempt, run=run, commit=commit[:7], returncode=outcome.returncode,
              timed_out=outcome.timed_out, train_seconds=round(outcome.seconds, 3), reason=outcome.reason,
              metric=outcome.metric, own_metric=outcome.own_metric, eval_seconds=round(outcome.eval_seconds, 3),
              frozen_tampered=outcome.tampered, outside=problems, log=str(log),
              log_tail=outcome.log_tail if outcome.metric is None else "",
              device=device.name if device else None)
    return outcome


def train_here(s, n, attempt, commit, run, seed, run_dir, frozen_dir, env, log, device):
    """train_candidate on this machine: the guard's snapshot, the runner, the guard's check, the artifact kept.
    Returns (Outcome, what the run changed outside its run dir)."""
    own = [s.target / ledger.RESULTS, s.target / ledger.EVENTS, *s.target.glob("results.*.tsv"),
           *frozen_dir.rglob("*.py")]
    git_dir, dirs = gitops.git_dir(s.repo), []
    if s.wrap is None:           # and what would make git run a program of the run's (in the sandbox: unreachable,
        own += [git_dir / "config", gitops.global_config(s.repo), *gitops.user_configs()]   # so yours to change)
        dirs = [git_dir / "hooks", git_dir / "info"]
    with s.lock:
        snapshot = guard.take(s.repo, own, dirs)     # before the run starts: its very first write is seen too
        s.live.append(snapshot)

    def on_start(pgid):
        s.log("run", n=n, attempt=attempt, run=run, seed=seed, commit=commit[:7], pgid=pgid, timeout_s=s.timeout,
              cwd=str(run_dir), sandbox=s.args.sandbox if s.wrap is not None else "off",
              device=device.name if device else None)

    def setup():                                     # a fresh pristine evaluator right before it runs
        with s.lock:
            export_frozen(s, frozen_dir)

    evaluation, gpu = None, sandbox.run_gpu(env)
    artifact = run_dir / (s.evaluation or {}).get("artifact", "artifact")
    if s.evaluation is not None:
        evaluation = runner.Evaluation(
            prepare_dir=frozen_dir, artifact=artifact, digest=s.evaluation["digest"],
            tolerance=s.evaluation["tolerance"], own_required=s.wrap is None, setup=setup,
            wrap=(lambda argv: s.eval_wrap(argv, frozen_dir, artifact, gpu)) if s.wrap else (lambda argv: argv))
    spec = runner.RunSpec(
        commit=commit, cwd=run_dir, log=log, metric=s.metric, timeout=s.timeout, frozen=FROZEN, env=env,
        wrap=(lambda argv: s.wrap(argv, run_dir, gpu)) if s.wrap else (lambda argv: argv),
        budget=s.budget if s.evaluation is not None else None, max_wall=max_wall(s) if n else None,
        evaluation=evaluation, on_start=on_start,
        on_tick=lambda elapsed: s.tick(n, elapsed, device))
    try:
        outcome = runner.run(spec)
    finally:                                                   # also on Ctrl-C
        with s.lock:
            s.live.remove(snapshot)
            problems = guard.check(s.repo, snapshot, sandboxed=s.wrap is not None, frozen=s.frozen_rels)
            if s.evaluation is not None and runner.artifact_problem(artifact) is None:   # for report.py --holdout
                keep_artifact(s, n, artifact)
            shutil.rmtree(run_dir, ignore_errors=True)
    return outcome, problems


def keep_artifact(s, n, path):
    """Move a run's model artifact (a file, or a folder: GRPO's weights) to artifact_path (moved, not copied: the run
    dir goes anyway)."""
    saved = artifact_path(s.home, n, s.evaluation["artifact"])
    saved.parent.mkdir(parents=True, exist_ok=True)
    remove(saved)
    for entry in [path, *(path.rglob("*") if path.is_dir() else [])]:   # checked: regular files and folders only
        entry.chmod(0o755 if entry.is_dir() else 0o644)                  # nobody else writes the best's weights
    os.replace(path, saved)


def remove(path):
    """Delete a file, a link (never what it points to) or a folder; nothing if it is not there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def artifact_path(home, n, name):
    """Where experiment n's model artifact is kept (its last run's) in the tag's harness dir: only the baseline's and
    the best's stay (record prunes the others), for `report.py --holdout`."""
    return Path(home) / "artifacts" / f"{n:04d}-{name}"


def holdout_summary(home, history, metric, goal, env=None):
    """One line comparing the gain the search reported on its own split with the gain on the hidden holdout split:
    the baseline's and the best's saved artifacts re-scored there (see artifact_path, target.score_holdout). history:
    the tag's "experiment" events; env: the variables pinned at tag start (pinned_env). Raises SetupError when it
    cannot be measured (no artifacts, no holdout)."""
    best = [e for e in history if e["status"] == "keep"][-1]
    found = [next(iter(sorted((Path(home) / "artifacts").glob(f"{e['n']:04d}-*"))), None) for e in (history[0], best)]
    if None in found:
        raise SetupError(f"no saved model artifact of experiment #{history[0]['n'] if found[0] is None else best['n']} "
                         f"in {Path(home) / 'artifacts'} (runs before artifacts were kept, or a target without a "
                         "separate evaluation)")
    base, top = (score_holdout(Path(home) / "frozen", path, metric, env=env) for path in found)
    sign = 1 if goal == "min" else -1
    return (f"holdout      baseline {base:.6f}, best #{best['n']} {top:.6f}: gain {sign * (base - top):+.6f} on the "
            f"holdout the search never saw, {sign * (history[0]['metric'] - best['metric']):+.6f} reported on "
            f"{metric}'s own split")


def seed_of(n, run):
    """The seed of run `run` of experiment n: distinct for every run of a tag, so that repeated runs measure the
    spread that init and data order cause (the noise floor), and the same on a resume."""
    return 1000 * n + run


def tokens_per_sec(outcome):
    """The training throughput train.py's summary states (`tokens_per_sec:`), or None."""
    try:
        return float(outcome.summary["tokens_per_sec"])
    except (KeyError, ValueError):
        return None


def max_wall(s):
    """Seconds of train.py wall time allowed: the budget plus an allowance for start-up, export and evaluation
    measured on the baseline: 1.5 x (baseline wall time - budget) x K + 2 % of the budget + 5 s, where K is the
    number of CPU workers sharing this machine (--devices cpu:K: K runs import and compile at once; else 1). None
    before the baseline is measured."""
    if not s.history:
        return None
    overhead = max(0.0, s.history[0]["train_seconds"] - s.budget)
    return s.budget + 1.5 * overhead * (s.pool.cpu_workers if s.pool else 1) + 0.02 * s.budget + 5


@locked
def advance_branch(s, commit):
    """The kept candidate becomes the best commit: the branch moves to it (update-ref, old value checked)."""
    gitops.advance_branch(s.repo, s.branch, commit, s.best_commit)
    s.expect_ref(f"refs/heads/{s.branch}")


@locked
def record(s, n, outcome, status, description, t0, spent0, repairs, fixes, fix_of=None, runs=(), noise_sd=None,
           base=None, cost=None, wall=None, **fields):
    """Log the "experiment" event (tokens, $ and LLM seconds since spent0; fix_of: the experiment whose crashed
    candidate `try --fix` amended), then append the results.tsv row derived from it, then print one line. runs: the
    metrics of every measured run of this commit (baseline runs, confirmations) when more than one: the event's
    metric is their mean and the description says how many; noise_sd: the baseline's spread. base: (commit, metric)
    of the best the candidate was built on and measured against (default: the best now); cost: (tokens in, tokens
    out, USD, LLM seconds) of its proposal and fixes, instead of the spend since spent0 (several in flight at once);
    wall: its seconds from the start on its device to its verdict, instead of since t0 (the wait for the verdicts
    of the experiments before it is not its own);
    fields: more of the event (the proposal wave, a re-run's superseded experiment)."""
    idea = redact(description)
    if len(runs) > 1:
        outcome = dataclasses.replace(outcome, metric=statistics.fmean(runs))
        description = f"{description} ({len(runs)} runs)"
    if outcome.reason:
        description = clean_description(f"{description} ({outcome.reason})")
    description = redact(description)   # a reason can quote what train.py printed (a secret it read somewhere)
    tokens_in, tokens_out, cost, llm = cost or (now - before for now, before in zip(s.spent(), spent0))
    event = s.log("experiment", n=n, commit=outcome.commit[:7], full_commit=outcome.commit, status=status,
                  metric=outcome.metric or 0.0, memory_gb=round(outcome.memory_gb, 1), description=description,
                  memory_source=outcome.memory_source or None, reported_memory_gb=round(outcome.reported_memory_gb, 3),
                  wall_seconds=round(time.monotonic() - t0 if wall is None else wall, 3), train_seconds=round(outcome.seconds, 3),
                  llm_seconds=round(llm, 3), input_tokens=tokens_in, output_tokens=tokens_out,
                  cost_usd=round(cost, 6), proposer=s.args.proposer, repairs=repairs, fixes=fixes,
                  budget_s=s.budget, smoke=s.smoke, base=(base or (s.best_commit,))[0],
                  base_metric=(base or (None, s.best_metric))[1],
                  idea=idea, reason=redact(outcome.reason), fix_of=fix_of, sandbox=s.wrap is not None,
                  tokens_per_sec=tokens_per_sec(outcome),
                  runs=list(runs) or None,
                  noise_sd=noise_sd, **fields)
    gitops.add_note(s.repo, event["full_commit"], note_text(event, s.metric))
    s.expect_ref(gitops.NOTES_REF)
    ledger.append_line(s.target / ledger.RESULTS, ledger.results_row(event))
    for snap in s.live:
        snap.appended(s.target / ledger.RESULTS, ledger.results_row(event) + "\n")
    s.history.append(event)
    best = n if status == "keep" else next(e["n"] for e in reversed(s.history) if e["status"] == "keep")
    for path in (s.home / "artifacts").glob("*"):               # only the baseline's and the best's stay
        if int(path.name.split("-")[0]) not in (0, best):
            remove(path)
    s.last = f"{status} {outcome.metric:.6f}" if outcome.metric is not None else status
    best = outcome.metric if status == "keep" else s.best_metric
    shown = f"{outcome.metric:.6f}" if outcome.metric is not None else "-"
    console.say(f"#{n:<4} {status:<7} {s.metric} {shown:<10} best {best:.6f}  {event['wall_seconds']:5.0f}s  {description}")

# ---------------------------------------------------------------------------
# Setup and resume
# ---------------------------------------------------------------------------


def note_text(event, metric):
    """The git note of an experiment's commit, from its "experiment" event: what `git log` shows under the idea."""
    value = f"{metric} {event['metric']:.6f}" if event["status"] != "crash" else "no metric"
    base = event.get("base_metric")
    delta = (f" ({event['metric'] - base:+.6f} vs its base {event['base'][:7]} at {base:.6f})"
             if base is not None and event["status"] != "crash" and event["n"] > 0 else "")
    fixes = f", {event['fixes']} fix(es)" if event.get("fixes") else ""
    runs = len(event.get("runs") or [0])
    line = (f"autoresearch {event['tag']} #{event['n']}: {event['status']}, {value}{delta}; {runs} "
            f"run{'s' if runs > 1 else ''}{fixes}; "
            f"memory {event['memory_gb']:.1f} GB; {event['wall_seconds']:.0f} s")
    return line if event["status"] == "keep" else f"{line}\n{event['description']}"


def open_session(args):
    """Check everything, then create autoresearch/<tag> from HEAD or resume it. Returns (Session, constants).

    The user's checkout stays on its branch; only the target's train.py and frozen files must be committed (their
    uncommitted edits would be silently ignored), any other edit (program.md: steer as you like) is fine. Resume
    rebuilds the best commit and the experiment count from this tag's events, kills a training run left by a killed
    agent, adopts commits a human added on top of the best one when they leave train.py and the frozen files alone,
    and appends a results.tsv row lost to a kill. Raises SetupError with the fix for anything it will not touch."""
    target = Path(args.target).resolve()
    check_target(target)
    constants = read_frozen_constants(target / "prepare.py")
    budget = effective_budget(constants["TIME_BUDGET"])
    repo = gitops.open_repo(target)
    branch = f"autoresearch/{args.tag}"
    events_path = target / ledger.EVENTS
    torn = [("events.jsonl", ledger.repair_last_line(events_path, ledger.is_event))]
    all_events = ledger.read_events(events_path)
    torn.append(("results.tsv", ledger.repair_results(target / ledger.RESULTS, all_events)))
    state = ledger.tag_state(all_events, args.tag)
    history, kept = state.history, state.kept
    s = Session(args=args, target=target, repo=repo, branch=branch, train_rel=gitops.repo_rel(repo, target / "train.py"),
                frozen_rels=[gitops.repo_rel(repo, target / f) for f in FROZEN],
                metric=constants["METRIC_NAME"], goal=constants["METRIC_GOAL"], budget=budget,
                smoke=budget != float(constants["TIME_BUDGET"]),
                timeout=args.timeout or default_timeout(budget), best_commit="",
                best_metric=kept[-1]["metric"] if kept else None,
                baseline_metric=history[0]["metric"] if history else None, history=history,
                noise_sd=history[0].get("noise_sd") if history else None,
                cost_usd=state.cost_usd, input_tokens=state.input_tokens,
                output_tokens=state.output_tokens, home=gitops.harness_dir(repo, args.tag))
    s.target_rel = "" if target == Path(repo.working_tree_dir).resolve() else gitops.repo_rel(repo, target)
    owner = s.home / "target"          # one tag, one target: the branch and the harness dir are per repository
    if owner.is_file() and owner.read_text() != s.target_rel:
        raise SetupError(f"tag {args.tag!r} belongs to the target {owner.read_text() or '(the repository root)'!r} of "
                         "this repository; pick another --tag for this target")
    for stale in state.stale_runs:
        runner.kill_stale_run(stale["pgid"], stale.get("cwd") or target)
    for name, fragment in torn:
        if fragment:   # cut off so that it is not kept as a line of its own; its text stays on record here
            s.log("torn_line", file=name, fragment=fragment)
            console.say(f"{name}: removed a line cut mid-write ({fragment[:60]!r}); it is kept in {ledger.EVENTS}")

    # 0. one budget per tag: a smoke run's numbers (AUTORESEARCH_TIME_BUDGET) never compete with full ones
    started = next((e.get("budget_s") for e in history if e.get("budget_s") is not None), budget)
    if started != budget:
        raise SetupError(f"tag {args.tag!r} was measured with a {started:g} s budget and this run has {budget:g} s: "
                         f"its numbers would not be comparable. Use the same budget (AUTORESEARCH_TIME_BUDGET) to "
                         f"resume it, or start a new --tag")
    (target / (ledger.RESULTS + ".new")).unlink(missing_ok=True)  # a staged copy left by a kill (keep_one_tag)

    #    results.tsv holds agent.py's rows only: rows no event accounts for are never silently started over
    _, strays = ledger.rows_by_tag(target / ledger.RESULTS, all_events)
    if strays:
        raise SetupError(f"{ledger.RESULTS} holds {len(strays)} row(s) that {ledger.EVENTS} does not account for "
                         f"(the first: {strays[0][:80]!r}): written by hand, by an agent following program.md's manual "
                         f"loop, or by an older agent.py. agent.py will not mix them with its own experiments or start "
                         f"tag {args.tag!r} over them. Move them aside, e.g. `mv {ledger.RESULTS} by-hand-results.tsv` "
                         f"(report.py reads that file too), then rerun")

    # 1. the user's checkout: the target's code must be committed; the ratchet branch must not be checked out
    changed = gitops.changed_files(repo)
    dirty = [rel for rel in changed if rel in s.frozen_rels]
    if dirty:
        raise SetupError(f"uncommitted changes to {', '.join(dirty)}: the experiments run committed code only, so "
                         "these edits would be ignored (and the frozen files are never yours to edit). agent.py never "
                         "stashes, resets or deletes your work: commit or stash them yourself, then rerun")
    if gitops.checked_out_in(repo, branch):
        raise SetupError(f"{branch} is checked out in {', '.join(gitops.checked_out_in(repo, branch))}; the agent "
                         "moves that branch itself and never touches your checkout: `git switch -` (or any other "
                         "branch) there, then rerun")

    #    the checkout's train.py: `try` takes it as the candidate; the loop takes the best commit's, so an edit
    #    there would be ignored, unless it is one this tag already measured (what `try` leaves in your checkout)
    here = (target / "train.py").read_bytes()
    best = kept[-1]["full_commit"] if kept else (branch if branch in repo.heads else "HEAD")
    if (args.command == "loop" and s.train_rel in changed and here != file_at_bytes(s, best)
            and duplicate_of(s, here.decode("utf-8", "replace")) is None):
        raise SetupError(f"uncommitted changes to {s.train_rel}: the experiments run committed code only, so these "
                         "edits would be ignored. agent.py never stashes, resets or deletes your work: commit or stash "
                         "them yourself (or run them with `uv run agent.py try`), then rerun")

    if args.command == "try" and not args.baseline and not history:
        raise SetupError(f"tag {args.tag!r} has no baseline yet: run `uv run agent.py try --tag {args.tag} --baseline` "
                         "first")
    if args.command == "try" and args.baseline and history:
        raise SetupError(f"tag {args.tag!r} already has its baseline ({describe(history[0], s.metric)}): edit "
                         f"train.py and run `uv run agent.py try --tag {args.tag} -m \"<idea>\"`")
    if args.command == "try" and args.baseline and here != file_at_bytes(s, best):
        raise SetupError(f"train.py in your checkout differs from the committed one ({best}), which the baseline "
                         "measures: commit it first (then it is the baseline), or move it aside (`git stash`), then "
                         "rerun")

    # 2. the branch: create it, or find the best commit of a resumed one
    if branch not in repo.heads:
        if history:
            raise SetupError(f"{ledger.EVENTS} has experiments for tag {args.tag!r} but branch {branch} is gone; "
                             f"restore it with `git branch {branch} {kept[-1]['full_commit']}` or pick a new --tag")
        repo.create_head(branch, repo.head.commit)
        s.best_commit = repo.head.commit.hexsha
        s.log("start", new_branch=True, best=s.best_commit)
    else:
        # before the baseline is measured, whatever the branch holds is the baseline
        s.best_commit = kept[-1]["full_commit"] if kept else repo.heads[branch].commit.hexsha
        tip = repo.heads[branch].commit.hexsha
        if tip != s.best_commit and repo.is_ancestor(tip, s.best_commit):
            gitops.advance_branch(repo, branch, s.best_commit, tip)   # a kill between a keep's event and its move
            s.log("advanced", n=s.next_n - 1, tip=tip, best=s.best_commit)
        elif tip != s.best_commit:
            adopt_human_commits(s, tip)
        s.log("start", new_branch=False, best=s.best_commit, experiments=len(history))

    s.synced = next((e["commit"] for e in reversed(all_events)
                     if e.get("tag") == args.tag and e.get("event") == "synced"), None)

    owner.parent.mkdir(parents=True, exist_ok=True)
    # yours alone: as root the sandbox's uid is root's outside, so what a run writes in runs/ (and leaves in an
    # artifact) is root's; no other user of the machine may reach it
    s.home.chmod(0o700)
    owner.write_text(s.target_rel)

    # 3. the frozen side: a pristine copy of the target, the sandbox, the frozen inputs' digest (and no run dir
    #    left by a killed agent: we hold the lock and killed its run)
    shutil.rmtree(s.home / "runs", ignore_errors=True)
    s.frozen_base = next((e["base"] for e in all_events if e.get("tag") == args.tag and e.get("event") == "frozen_inputs"
                          and e.get("base")), s.best_commit)
    export_frozen(s)
    setup_sandbox(s)
    if history and history[0].get("sandbox") and s.wrap is None:   # one sandbox rule per tag, like one budget
        raise SetupError(f"tag {args.tag!r} was measured inside the sandbox and this run would be without it "
                         f"(--sandbox {args.sandbox}): its numbers would not be held to the same rules. Run it with "
                         "--sandbox auto or bwrap (bubblewrap installed), or start a new --tag")
    if "METRIC_TOLERANCE" in constants:
        s.evaluation = frozen_inputs(s, all_events, float(constants["METRIC_TOLERANCE"]))
        s.evaluation["artifact"] = constants.get("ARTIFACT_NAME", "artifact")   # where train.py saves its model

    # 4. outputs and a row lost to a kill between the "experiment" event and its row
    gitops.ensure_ignored(repo, [target / name for name in (ledger.RESULTS, ledger.EVENTS, RUN_LOG, TRY_LOG)])
    try:
        ledger.ensure_results_header(target / ledger.RESULTS, s.metric)
    except ValueError as e:
        raise SetupError(str(e)) from None
    #    one tag per results.tsv (karpathy's contract, which his analysis notebook assumes): earlier tags move out
    for path, n in ledger.keep_one_tag(target / ledger.RESULTS, all_events, args.tag, s.metric).items():
        if path.name == ledger.RESULTS:
            s.log("unarchived", file=ledger.archive_path(path, args.tag).name, rows=n)
            console.say(f"{ledger.RESULTS}: brought back {n} row(s) of tag {args.tag} from its own file")
            continue
        gitops.ensure_ignored(repo, [path])
        s.log("archived", file=path.name, rows=n)
        console.say(f"{ledger.RESULTS}: moved {n} row(s) of another tag to {path.name} (report.py reads it)")
    if history and ledger.missing_row(target / ledger.RESULTS, all_events, history[-1]):
        ledger.append_line(target / ledger.RESULTS, ledger.results_row(history[-1]))
        s.log("row_restored", n=history[-1]["n"])
    if history and history[-1].get("full_commit"):      # a kill between the event and its note (no-op if there)
        gitops.add_note(repo, history[-1]["full_commit"], note_text(history[-1], s.metric))
    return s, constants


@locked
def file_at_bytes(s, commit):
    """The bytes of the target's train.py at commit."""
    return gitops.blob_at(s.repo, commit, s.train_rel)


def export_frozen(s, dest=None):
    """A fresh pristine copy of the target at the tag's base commit (recorded with the frozen inputs) in frozen/ (or
    dest: each device has its own, so that one evaluation never runs from a copy another is re-making): made at start
    and again right before every evaluation, so nothing a run did to it can score the run."""
    dest = dest or s.home / "frozen"
    shutil.rmtree(dest, ignore_errors=True)
    gitops.export_commit(s.repo, s.frozen_base, s.target_rel, dest)


def adopt_human_commits(s, tip):
    """The branch tip is not the best commit: commits a human added on top of it (steering: program.md, notes) are
    adopted, and the tip becomes the base of the next candidates, if they leave train.py and the frozen files as
    measured. Anything else is refused with the way out."""
    untouched = s.repo.is_ancestor(s.best_commit, tip) and not s.repo.git.diff(
        "--name-only", s.best_commit, tip, "--", s.train_rel, *s.frozen_rels)
    if not untouched:
        raise SetupError(f"{s.branch} points at {tip[:7]}, which changes train.py or {', '.join(FROZEN)} after the "
                         f"best commit {s.best_commit[:7]} (or does not descend from it), so its result is unknown; "
                         f"move those commits elsewhere (e.g. `git branch -f {s.branch} {s.best_commit[:7]}` after "
                         "saving them on another branch), or start a new --tag from them")
    s.log("adopted", previous_best=s.best_commit, tip=tip)
    s.best_commit = tip


def setup_sandbox(s):
    """--sandbox auto|bwrap|off: run train.py and the evaluator in bubblewrap, each seeing only its view (sandbox's
    docstring; what the target declares comes from frozen_inputs), the repository hidden even should a declared path
    contain it; or say once which protections are missing. --sandbox bwrap refuses to start without all of them."""
    reason = sandbox.probe() if s.args.sandbox != "off" else "--sandbox off"
    lacking = sandbox.missing() if reason is None else []
    if s.args.sandbox == "bwrap" and (reason or lacking):
        raise SetupError(f"--sandbox bwrap: {reason or 'missing here: ' + '; '.join(lacking)}. Install bubblewrap "
                         "(Debian/Ubuntu: apt install bubblewrap) where user namespaces work, or use --sandbox auto / off")
    if reason is None:
        def inputs():
            return (s.evaluation or {}).get("inputs")
        hide = [Path(s.repo.working_tree_dir), gitops.git_dir(s.repo)]
        s.wrap = lambda argv, run_dir, gpu: sandbox.train_argv(argv, run_dir, inputs(), gpu, hide=hide)
        s.eval_wrap = lambda argv, frozen, artifact, gpu: sandbox.eval_argv(argv, frozen, artifact, inputs(), gpu)
        s.sandbox_env = sandbox.scratch_env()
        console.say("sandbox: bubblewrap (an allow-list view: the system, the environment, the declared data and the "
                    "run dir; root confined; no network)"
                    + (f"; missing here: {'; '.join(lacking)}" if lacking else ""))
        return
    console.say(f"sandbox: off ({reason}); missing protections: " + "; ".join(sandbox.PROTECTIONS)
                + ". Still on: hermetic run dirs, separate evaluation, the check of refs, results and your checkout "
                "after each run.")


def pinned_env(all_events, tag):
    """The variables the tag's frozen inputs pinned when it started (e.g. AUTORESEARCH_GRPO_MODEL: the base model's
    absolute snapshot path, resolved once), from its "frozen_inputs" event; {} when none."""
    return next((e.get("env") or {} for e in all_events if e.get("tag") == tag and e.get("event") == "frozen_inputs"), {})


def frozen_inputs(s, all_events, tolerance):
    """Run the pristine `prepare.py --frozen-inputs` (with the variables the tag pinned, if it has started); record
    its digest, what each sandboxed process reads and the pinned variables when the tag starts, and refuse to resume
    when the frozen inputs (prepare.py, tokenizer, evaluation data, base model) changed since. Returns the
    evaluation settings."""
    pinned = pinned_env(all_events, s.args.tag)
    out = run_prepare(s.home / "frozen", "--frozen-inputs", timeout=600, env=pinned)   # SetupError on failure
    try:
        found = json.loads(out.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise SetupError(f"prepare.py --frozen-inputs printed no JSON object: {out[-2000:]!r}") from None
    recorded = [e for e in all_events if e.get("tag") == s.args.tag and e.get("event") == "frozen_inputs"]
    if recorded and recorded[0]["digest"] != found["digest"]:
        raise SetupError(f"the frozen inputs changed since tag {s.args.tag!r} started (digest {found['digest'][:12]}, "
                         f"recorded {recorded[0]['digest'][:12]}): prepare.py, the tokenizer, the evaluation data or "
                         "the base model differ, so new results would not be comparable. Restore them, or start a new "
                         "--tag")
    env = pinned if recorded else {k: str(v) for k, v in (found.get("env") or {}).items()}
    if not recorded:
        s.log("frozen_inputs", digest=found["digest"], files=found["files"], evaluator_only=found["evaluator_only"],
              train_reads=found.get("train_reads"), eval_reads=found.get("eval_reads"), env=env, base=s.frozen_base)
    return {"digest": found["digest"], "tolerance": tolerance, "inputs": found, "env": env}
