"""
HARNESS: one tag's state: the Session the steps of an experiment (harness.record.experiment) work on (the repository,
the best commit, the history, the evaluation, the sandbox, the spend), what they read of it (the best's train.py,
whether an idea was already measured), and the words of what a stop left behind. harness.tag.opening creates it. It
never decides keep or discard (harness.judge.verdict), never proposes (harness.propose.ideas) and never imports
agent.py.

Hermetic runs: the user's checkout is never switched, reset or written (except results.tsv, events.jsonl and a copy
of the last run.log in the target dir). Candidates are committed in the harness's own detached worktree
(<git dir>/autoresearch/<tag>/stage, so hooks run); each run gets a fresh export of exactly its commit's files
(runs/<n>-<fix>, removed afterwards; its log stays in logs/); the frozen evaluator runs from a pristine export
of the tag's base commit (frozen/); the branch moves only by update-ref, to a measured, kept commit.
"""

import dataclasses
import functools
import re
import shutil
import threading
import time
from pathlib import Path

import git

from harness import console, files, gitops, ledger
from harness.errors import Stop
from harness.propose import memory, prompts
from harness.run import guard, runner
from harness.propose.edits import fingerprint
from harness.gitops import git_blob_sha
from harness.propose.providers import Spend
from harness.tag.settings import Settings
from harness.tag.tagview import Derived, read_tag
from harness.judge.verdict import Rule
from harness.schema import Event

RUN_LOG = "run.log"
TRY_LOG = "try.log"                 # where program.md's background `try` writes its output (ignored like run.log)


@dataclasses.dataclass
class Caches:
    """What the steps would otherwise read again and again from git and the events, kept for this invocation: filled
    as the tag opens (checks.readable, opening.measured_runs) and as experiments are recorded, never written
    anywhere; a fresh Caches() is the one way to rebuild them (the next open_session makes one)."""
    blobs: dict = dataclasses.field(default_factory=dict)        # experiment n -> blob sha of its train.py
    #                                                              (duplicate_of)
    prints: dict = dataclasses.field(default_factory=dict)       # experiment n -> edits.fingerprint of it (measured_as)
    unreadable: set = dataclasses.field(default_factory=set)     # experiments whose objects git cannot read (discards)
    changes: dict = dataclasses.field(default_factory=dict)      # experiment n -> memory.Change (the tabu, the bandit)
    measured: dict = dataclasses.field(default_factory=dict)     # commit[:7] -> {seed: (metric, probe_s)}: every run
    #                                                              with a metric (the best's runs the paired rule
    #                                                              pairs with)
    curves: dict = dataclasses.field(default_factory=dict)       # commit[:7] -> {seed: curves.Curve} of its runs with
    #                                                              a metric (what a candidate's first run is held to)


@dataclasses.dataclass(frozen=True)
class TagConfig:
    """What the tag is: fixed as it opens (harness.tag.opening makes it, from the flags, prepare.py's constants and the
    tag's first events), read by the steps, written by none (frozen: an assignment raises
    dataclasses.FrozenInstanceError)."""
    target: Path                        # the target dir (prepare.py, train.py, program.md, the records)
    target_rel: str                     # the target dir relative to the repository root ("" for the root)
    home: Path                          # <git dir>/autoresearch/<tag>: stage worktree, frozen/, runs/, logs/
    branch: str                         # autoresearch/<tag>
    train_rel: str                      # paths relative to the repository root
    frozen_rels: tuple
    metric: str                         # prepare.py's METRIC_NAME
    goal: str                           # "min" or "max"
    budget: float                       # effective TIME_BUDGET in seconds
    smoke: bool = False                 # the budget is shortened (AUTORESEARCH_TIME_BUDGET): rows are labelled
    budget_like: dict | None = None     # --budget-like: {"name", "base_s"}, budget is base_s on that GPU here
    timeout: float | None = None        # --timeout, else the one the tag's baseline recorded; None: derived
    #                                     (experiment.run_timeout)
    profile: str | None = None          # device class reported by `prepare.py --check`, if any
    sd_floor_declared: float | None = None   # prepare.py's METRIC_SD_FLOOR, if any (verdict.sd_floor)
    speed_probe: bool = False           # prepare.py declares SPEED_PROBE: `prepare.py --probe` times the device
    seed_base: int | None = None        # the tag's secret for its seeds (experiment.run_seed): drawn at random when the
    #                                     tag starts, recorded with the baseline; None: a tag from before it was drawn
    frozen_base: str = ""               # the commit the pristine frozen/ copy is exported from (the tag's start)
    evaluation: dict = None             # {"digest", "tolerance", "artifact", "inputs", "env"}; None: train.py's own
    #                                     number. inputs: prepare.py --frozen-inputs (what the sandbox shows each
    #                                     process); env: the variables pinned at tag start (the GRPO base model)


@dataclasses.dataclass
class Session(Derived):
    """A tag open for experiments, rebuilt from git and events.jsonl on every start (see open_session): its frozen
    configuration (`tag`), its state (derived from the events where it can be: Derived's properties), its caches and
    this invocation's handles. Written by the steps of an experiment (harness.record.experiment) under `lock`; the
    loop's own state (queue, ideas, failures) is agent.py's."""
    settings: Settings                  # this invocation's flags (frozen)
    tag: TagConfig                      # what the tag is (frozen)
    # the tag's state
    rule: Rule                          # the verdict rule: margin, confirmation runs (noise measured by the baseline)
    best_commit: str                    # full sha of the best kept commit (the branch tip between experiments)
    history: list                       # this tag's "experiment" events, in order
    spend: Spend = Spend()              # the tag's LLM spend (resume sums "propose" events; LLM seconds: this run's)
    hardware: dict = None               # this invocation's fingerprint (harness.run.hardware.measure); None: not
    #                                     measured
    hardware_epoch: int = 1             # the tag's current hardware epoch (its latest "hardware" event's; 2, 3, ...
    #                                     after each --new-hardware): every experiment event carries it
    last: str = "-"                     # the last verdict, for the status line
    synced: str | None = None           # the commit whose train.py `try` last wrote into your checkout
    recording: int | None = None        # `try`: the experiment this invocation records (an interrupt's words)
    events_size: int | None = None      # bytes events.jsonl must hold: its size after this invocation's first event
    #                                     plus the bytes of every later one (None: none yet)
    start: dict | None = None           # the "start" event's fields, logged before this invocation's first other
    #                                     event (a `try` refused after open_session logs nothing)
    deferred: list = dataclasses.field(default_factory=list)   # [(event, fields)] logged right after "start"
    cache: "Caches" = dataclasses.field(default_factory=lambda: Caches())   # what git and the events say, kept
    # this invocation's handles
    repo: git.Repo = None
    sandbox: object = None              # harness.run.sandbox.Tagged: train.py's and the evaluator's sandboxed argv
    #                                     (None: no sandbox)
    devices: list = dataclasses.field(default_factory=list)   # harness.run.pool.Device: where this invocation's runs go
    #                                     (agent.py's DeviceSource; empty: this machine as it is)
    pool: object = None                 # harness.run.pool.Pool: the devices of the loop (None for `try`)
    search: object = None               # harness.propose.search.Search: the tag's study, once a search opened it
    outer: object = None                # harness.propose.outer.State: the outer loop's freezes, guidance and mechanisms
    tracking: object = None             # harness.record.tracking.Tracker: the MLflow store (--mlflow; None: off)
    started: float = dataclasses.field(default_factory=time.monotonic)
    probe_warned: bool = False          # the speed probe's failure was said (once per invocation)
    dashboard_warned: bool = False      # the dashboard's failure was said (once per invocation)
    # Several runs at once (--devices, --ray, speculation): worker threads train while the main thread proposes and
    # records. The lock serialises git, the ledger and the guard's snapshots; `live` are the snapshots of the runs
    # in flight, told of every change the harness itself makes meanwhile (expect_ref, Snapshot.appended).
    lock: threading.RLock = dataclasses.field(default_factory=threading.RLock)
    live: list = dataclasses.field(default_factory=list)

    def log(self, event, **fields):
        """Append one event of this tag to events.jsonl; returns the record. The runs in flight expect the line."""
        path = self.tag.target / ledger.EVENTS
        with self.lock:
            if event != "start" and (self.start is not None or self.deferred):
                start, self.start, deferred, self.deferred = self.start, None, self.deferred, []
                if start is not None:
                    self.log(Event.START, **start)
                for name, held in deferred:
                    self.log(name, **held)
            record, line = ledger.event_record(self.settings.tag, event, **fields)
            self.append_own(path, line, self.events_size)
            if self.events_size is not None:    # counted, not stat'ed: a run's line appended before it (then
                self.events_size += len(line.encode())   # undone by the guard) is not this invocation's
            else:
                try:
                    self.events_size = path.stat().st_size
                except FileNotFoundError:   # deleted right after the append: the next event's check stops the loop
                    self.events_size = 1
            return record

    def append_own(self, path, line, expected=None):
        """Append line (with its newline) to the harness's own record `path` (events.jsonl: holding at least the
        `expected` bytes, ledger.check_size) and tell the runs in flight. One of them, outside the sandbox, may have
        cut, linked or replaced it meanwhile: the file is then put back with the line (guard.put_back), the run still
        blamed by its check, instead of the loop stopping for the run's doing. Raises Stop with no run in flight."""
        with self.lock:
            try:
                ledger.check_size(path, expected)
                files.append_line(path, line[:-1])
            except Stop:
                if not self.live or Path(path) not in self.live[0].own:
                    raise
                guard.put_back(self.live, path, line)
                return
            for snap in self.live:
                snap.appended(path, line)

    def expect_ref(self, ref):
        """The harness itself just moved `ref`: the runs in flight must not be blamed for it (nor have it undone)."""
        with self.lock:
            if self.live:
                value = self.repo.git.for_each_ref("--format=%(objectname)", ref).strip()
                for snap in self.live:
                    snap.refs[ref] = value or None
                    if not value:
                        snap.refs.pop(ref)

    def paid(self, spend):
        """Add what one proposer answer cost to the tag's spend (from any thread)."""
        with self.lock:
            self.spend = self.spend + spend


# ---------------------------------------------------------------------------
# The status line
# ---------------------------------------------------------------------------


def tick(s, n, elapsed, device=None, phase="training", run=""):
    """A run's tick (about once a second, and when its phase changes): the status line names the run ("run 1 of
    3"), its phase ("probing" the speed, "start-up" until train.py's first progress line, "training" against the
    budget, "finishing" past it, "evaluating" in the separate evaluator) and how far it is."""
    if s.pool is not None and s.pool.cancel.is_set():   # the loop is stopping: the runner kills this run
        raise KeyboardInterrupt
    where = f" on {device.name}" if device is not None and device.name != "default" else ""
    if phase == "training" and elapsed > s.tag.budget:     # its last step, its own evaluation, the artifact
        phase = "finishing"
    clock = console.fmt_duration(elapsed) + (f"/{console.fmt_duration(s.tag.budget)}" if phase == "training" else
                                             f" (past the {console.fmt_duration(s.tag.budget)} budget)"
                                             if phase == "finishing" else "")
    status(s, n, f"{run + ', ' if run else ''}{phase}{where}{'' if phase == 'probing' else ' ' + clock}")

def status(s, n, phase):
    """The live status line: experiment, phase, best and change vs baseline, last result, tokens, $, elapsed;
    with a pool of devices or speculation, its throughput (experiments per hour, device busy share, proposal
    wait: see harness.run.pool.Pool.throughput)."""
    best = "-"
    if s.best_metric is not None:
        best = f"{s.best_metric:.6f}"
        if s.baseline_metric:
            best += f" ({100 * (s.best_metric - s.baseline_metric) / abs(s.baseline_metric):+.2f}%)"
        if s.rule.sd:
            best += f" noise sd {s.rule.sd:.4f}"
    key = f"{n} {re.sub(r'[0-9]+:[0-9:]+|[0-9.]+s', '', phase)}"   # a plain line per phase: its clocks do not count
    if s.pool is not None:
        phase += f" | {s.pool.throughput(len(s.history)).short()}"
    console.status(f"exp {n} | {phase} | best {best} | last {s.last} | "
                   f"{(s.spend.input_tokens + s.spend.output_tokens) / 1000:.1f}k tok ${s.spend.usd:.2f} | "
                   f"{console.fmt_duration(time.monotonic() - s.started)}",
                   phase=key)


# ---------------------------------------------------------------------------
# What the steps read
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
    return gitops.file_at(s.repo, s.best_commit, s.tag.train_rel)


@locked
def duplicate_of(s, source):
    """The "experiment" event of this tag whose train.py is byte-identical to `source` (any status, the baseline
    included), or None: an idea already measured is never run again."""
    blob = git_blob_sha(source.encode())
    for e in s.history:
        if e["n"] in s.cache.unreadable:
            continue
        if e["n"] not in s.cache.blobs:
            s.cache.blobs[e["n"]] = (s.repo.commit(e["full_commit"]).tree / s.tag.train_rel).hexsha
        if s.cache.blobs[e["n"]] == blob:
            return e
    return None


OVERTIME_TRIES = 2      # a train.py the wall-time allowance left unjudged may be an experiment this often in all


@locked
def measured_as(s, source):
    """The "experiment" event of this tag whose train.py is the same idea as `source` (edits.fingerprint: comments
    and spacing aside), or None. What the environment may be to blame for does not count (Kind.measured): a lost Ray
    worker or node, and an experiment ended by the wall-time allowance (a busier machine: its first run over it, or
    a further run over it twice at its seed, not judged), which may be tried OVERTIME_TRIES times in all, no more: a
    train.py that idles past the allowance when its run goes badly gets no endless fresh draws."""
    mine, overtime = fingerprint(source), []
    for e in s.history:
        kind = runner.Kind.of(e)
        if kind is not runner.Kind.OVERTIME and not kind.measured or e["n"] in s.cache.unreadable:
            continue
        if e["n"] not in s.cache.prints:
            s.cache.prints[e["n"]] = fingerprint(gitops.file_at(s.repo, e["full_commit"], s.tag.train_rel))
        if s.cache.prints[e["n"]] != mine:
            continue
        if kind is not runner.Kind.OVERTIME:
            return e
        overtime.append(e)
    return overtime[-1] if len(overtime) >= OVERTIME_TRIES else None


def touched_by(s):
    """{n: what experiment n's edit of train.py changed}: the UPPER_CASE constants it changed (e.g. "DEPTH,
    MATRIX_LR"), or "code" when it changed none (memory.change_at, cached there), for the prompt's grouped older
    history."""
    return {e["n"]: ", ".join(sorted(f for f in memory.change_at(s, e).families if not f.startswith("code: ")))
            or "code" for e in s.history[1:-prompts.HISTORY_ROWS]}   # the newer rows are shown in full


def describe(e, metric):
    """One experiment for a message: '#3 (discard, val_bpb 1.208000: lower LR)'."""
    value = f", {metric} {e['metric']:.6f}" if ledger.has_metric(e) else ""
    return f"#{e['n']} ({e['status']}{value}: {e['description']})"


def left_behind(s, n=None):
    """What a stop at this moment (an interrupt, anywhere) left of the tag's records, in words true now, read back from
    disk: the last experiment event, its results.tsv row, its git note, and where the branch is against the last
    keep. A record the next start completes (ledger.py's order of writes) is named as such. n: None when the last
    experiment on disk is not experiment n (`try`: its result not recorded)."""
    try:
        history = read_tag(s.tag.target, s.settings.tag).history
        tip = s.repo.heads[s.tag.branch].commit.hexsha if s.tag.branch in s.repo.heads else None
        if not history:
            return "nothing was recorded yet"
        last, kept = history[-1], [e for e in history if e.get("status") == "keep"]
        if n is not None and last["n"] != n:
            return None
        missing = []
        if ledger.results_row(last) not in ledger.read_rows(s.tag.target / ledger.RESULTS):
            missing.append("its results.tsv row")
        if ledger.note_text(last, s.tag.metric) not in gitops.note_of(s.repo, last["full_commit"]):
            missing.append("its git note")
        behind = bool(kept) and tip != kept[-1]["full_commit"]
        words = [f"the last experiment, #{last['n']} ({last['status']}), is recorded in {ledger.EVENTS}"]
        words.append(f"{s.tag.branch} is still at {tip[:7] if tip else 'nothing'}, behind the last keep "
                     f"(#{kept[-1]['n']}, {kept[-1]['commit']})" if behind else
                     f"{s.tag.branch} is at the best commit ({tip[:7] if tip else '-'})")
        if missing:
            words.append(f"{' and '.join(missing)} not written yet")
        return "; ".join(words) + ("; the next start completes them" if missing or behind else "")
    except Exception as e:  # noqa: BLE001  (words at an interrupt: never a second traceback)
        return f"the records could not be read back ({type(e).__name__})"


def interrupt_words(s, settings):
    """What an interrupt left behind, in words (s: None when it came before the session opened): the tag's records
    (left_behind) for the loop and any command but `try`, for `try` whether its result was recorded and what to do
    with your checkout."""
    if settings.command != "try":
        return f"{left_behind(s) if s else 'nothing was recorded'}. Rerun the same command to resume"
    recorded = left_behind(s, s.recording) if s and s.recording is not None else None
    if recorded is None:
        return "no result was recorded and train.py in your checkout is as you left it. Rerun the same command"
    return (f"{recorded}; train.py in your checkout may not be the best: `uv run agent.py try --tag {settings.tag} "
            "--sync`")


    # adopted commits (a human's on top of the best) are measured anew at each seed when first paired: what they
    # changed besides train.py (a file train.py reads) must not be credited to the next candidate


@locked
def file_at_bytes(s, commit):
    """The bytes of the target's train.py at commit."""
    return gitops.blob_at(s.repo, commit, s.tag.train_rel)


def export_frozen(s, dest=None):
    """A fresh pristine copy of the target at the tag's base commit (recorded with the frozen inputs) in frozen/ (or
    dest: each device has its own, so that one evaluation never runs from a copy another is re-making): made at start
    and again right before every evaluation, so nothing a run did to it can score the run."""
    dest = dest or s.tag.home / "frozen"
    shutil.rmtree(dest, ignore_errors=True)
    gitops.export_commit(s.repo, s.tag.frozen_base, s.tag.target_rel, dest)


