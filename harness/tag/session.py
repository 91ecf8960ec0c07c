"""
HARNESS: one tag's state. open_session checks the target, the repository and the ledger (each refusal is a function
of harness.tag.checks), then creates autoresearch/<tag> or resumes it; the Session it returns is what the steps of an
experiment (harness.record.experiment) work on: the repository, the best commit, the history, the evaluation, the sandbox,
the spend. It never decides keep or discard (harness.judge.verdict), never proposes (harness.propose.ideas) and never imports
agent.py.

Hermetic runs: the user's checkout is never switched, reset or written (except results.tsv, events.jsonl and a copy
of the last run.log in the target dir). Candidates are committed in the harness's own detached worktree
(<git dir>/autoresearch/<tag>/stage, so hooks run); each run gets a fresh export of exactly its commit's files
(runs/<n>-<fix>, removed afterwards; its log stays in logs/); the frozen evaluator runs from a pristine export
of the tag's base commit (frozen/); the branch moves only by update-ref, to a measured, kept commit.
"""

import dataclasses
import functools
import json
import re
import secrets
import shutil
import threading
import time
from pathlib import Path

import git

from harness import console, gitops, ledger, schema
from harness.judge import curves, verdict
from harness.propose import memory, prompts
from harness.record import dashboard, tracking
from harness.run import hardware, runner, sandbox
from harness.tag import checks
from harness.errors import SetupError
from harness.propose.edits import fingerprint
from harness.gitops import git_blob_sha
from harness.judge.holdout import pinned_env
from harness.propose.providers import Spend
from harness.propose.search import STUDY_DB
from harness.tag.settings import Settings
from harness.tag.tagview import Derived, read_tag, tag_state
from harness.run.target import (FROZEN, check_target, effective_budget, own_budget, read_frozen_constants,
                             run_prepare)
from harness.judge.verdict import DEFAULT_CONFIRM, FALSE_KEEP, PAIRED_CONFIRM, Rule, rule_of
from harness.schema import Event

RUN_LOG = "run.log"
TRY_LOG = "try.log"                 # where program.md's background `try` writes its output (ignored like run.log)


@dataclasses.dataclass
class Session(Derived):
    """A tag's state; rebuilt from git and events.jsonl on every start (see open_session). Written by the steps of an
    experiment (harness.record.experiment) under `lock`; the loop's own state (queue, ideas, failures) is agent.py's."""
    settings: Settings
    target: Path
    repo: git.Repo
    branch: str
    train_rel: str                      # paths relative to the repository root
    frozen_rels: list
    metric: str
    goal: str                           # "min" or "max"
    budget: float                       # effective TIME_BUDGET in seconds
    timeout: float | None               # --timeout, else the one the tag's baseline recorded; None: derived
    #                                     (experiment.run_timeout)
    rule: Rule                          # the verdict rule: margin, confirmation runs (noise measured by the baseline)
    best_commit: str                    # full sha of the best kept commit (the branch tip between experiments)
    history: list                       # this tag's "experiment" events, in order
    home: Path                          # <git dir>/autoresearch/<tag>: stage worktree, frozen/, runs/, logs/
    target_rel: str = ""                # the target dir relative to the repository root ("" for the root)
    evaluation: dict = None             # {"digest", "tolerance", "artifact", "inputs", "env"}; None: train.py's own
    #                                     number. inputs: prepare.py --frozen-inputs (what the sandbox shows each
    #                                     process); env: the variables pinned at tag start (the GRPO base model)
    frozen_base: str = ""               # the commit the pristine frozen/ copy is exported from (the tag's start)
    smoke: bool = False                 # the budget is shortened (AUTORESEARCH_TIME_BUDGET): rows are labelled
    sd_floor_declared: float | None = None   # prepare.py's METRIC_SD_FLOOR, if any (verdict.sd_floor)
    wrap: object = None                 # (argv, run_dir, gpu) -> train.py's sandboxed argv (None: no sandbox)
    eval_wrap: object = None            # (argv, frozen_dir, artifact, gpu) -> the evaluator's sandboxed argv
    sandbox_env: dict = dataclasses.field(default_factory=dict)
    profile: str | None = None          # device class reported by `prepare.py --check`, if any
    spend: Spend = Spend()              # the tag's LLM spend (resume sums "propose" events; LLM seconds: this run's)
    started: float = dataclasses.field(default_factory=time.monotonic)
    last: str = "-"                     # the last verdict, for the status line
    synced: str | None = None           # the commit whose train.py `try` last wrote into your checkout
    recording: int | None = None        # `try`: the experiment this invocation records (an interrupt's words)
    devices: list = dataclasses.field(default_factory=list)   # harness.run.pool.Device: where this invocation's runs go
    #                                     (agent.py's DeviceSource; empty: this machine as it is)
    pool: object = None                 # harness.run.pool.Pool: the devices of the loop (None for `try`)
    search: object = None               # harness.propose.search.Search: the tag's study, once a search opened it
    blobs: dict = dataclasses.field(default_factory=dict)   # experiment n -> blob sha of its train.py (duplicate_of)
    prints: dict = dataclasses.field(default_factory=dict)  # experiment n -> edits.fingerprint of it (measured_as)
    unreadable: set = dataclasses.field(default_factory=set)  # experiments whose objects git cannot read (discards)
    changes: dict = dataclasses.field(default_factory=dict)  # experiment n -> memory.Change (the tabu, the bandit)
    outer: object = None                # harness.propose.outer.State: the outer loop's freezes, guidance and mechanisms
    tracking: object = None             # harness.record.tracking.Tracker: the MLflow store (--mlflow; None: off)
    # Several runs at once (--devices, --ray, speculation): worker threads train while the main thread proposes and
    # records. The lock serialises git, the ledger and the guard's snapshots; `live` are the snapshots of the runs
    # in flight, told of every change the harness itself makes meanwhile (expect_ref, Snapshot.appended).
    lock: threading.RLock = dataclasses.field(default_factory=threading.RLock)
    live: list = dataclasses.field(default_factory=list)
    events_size: int | None = None      # bytes of events.jsonl after this invocation's last event (None: none yet)
    start: dict | None = None           # the "start" event's fields, logged before this invocation's first other
    #                                     event (a `try` refused after open_session logs nothing)
    seed_base: int | None = None        # the tag's secret for its seeds (experiment.run_seed): drawn at random when the
    #                                     tag starts, recorded with the baseline; None: a tag from before it was drawn
    speed_probe: bool = False           # prepare.py declares SPEED_PROBE: `prepare.py --probe` times the device
    probe_warned: bool = False          # the speed probe's failure was said (once per invocation)
    measured: dict = dataclasses.field(default_factory=dict)   # commit[:7] -> {seed: (metric, probe_s)}: every
    #                                     run with a metric (the best's runs the paired rule pairs with)
    curves: dict = dataclasses.field(default_factory=dict)     # commit[:7] -> {seed: curves.Curve} of its runs
    #                                     with a metric (what a candidate's first run is held to: harness.judge.curves)
    hardware: dict = None               # this invocation's fingerprint (harness.run.hardware.measure); None: not measured
    hardware_epoch: int = 1             # the tag's current hardware epoch (its latest "hardware" event's; 2, 3, ...
    #                                     after each --new-hardware): every experiment event carries it
    deferred: list = dataclasses.field(default_factory=list)   # [(event, fields)] logged right after "start"

    def log(self, event, **fields):
        """Append one event of this tag to events.jsonl; returns the record. The runs in flight expect the line."""
        path = self.target / ledger.EVENTS
        with self.lock:
            if event != "start" and (self.start is not None or self.deferred):
                start, self.start, deferred, self.deferred = self.start, None, self.deferred, []
                if start is not None:
                    self.log(Event.START, **start)
                for name, held in deferred:
                    self.log(name, **held)
            ledger.check_size(path, self.events_size)
            record = ledger.log_event(path, self.settings.tag, event, **fields)
            try:
                self.events_size = path.stat().st_size
            except FileNotFoundError:       # deleted right after the append: the next event's check stops the loop
                self.events_size = max(self.events_size or 0, 1)
            for snap in self.live:
                snap.appended(path, ledger.event_line(record) + "\n")
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

    def paid(self, spend):
        """Add what one proposer answer cost to the tag's spend (from any thread)."""
        with self.lock:
            self.spend = self.spend + spend

    def tick(self, n, elapsed, device=None, phase="training", run=""):
        """A run's tick (about once a second, and when its phase changes): the status line names the run ("run 1 of
        3"), its phase ("probing" the speed, "start-up" until train.py's first progress line, "training" against the
        budget, "finishing" past it, "evaluating" in the separate evaluator) and how far it is."""
        if self.pool is not None and self.pool.cancel.is_set():   # the loop is stopping: the runner kills this run
            raise KeyboardInterrupt
        where = f" on {device.name}" if device is not None and device.name != "default" else ""
        if phase == "training" and elapsed > self.budget:     # its last step, its own evaluation, the artifact
            phase = "finishing"
        clock = console.fmt_duration(elapsed) + (f"/{console.fmt_duration(self.budget)}" if phase == "training" else
                                                 f" (past the {console.fmt_duration(self.budget)} budget)"
                                                 if phase == "finishing" else "")
        self.status(n, f"{run + ', ' if run else ''}{phase}{where}{'' if phase == 'probing' else ' ' + clock}")

    def status(self, n, phase):
        """The live status line: experiment, phase, best and change vs baseline, last result, tokens, $, elapsed;
        with a pool of devices or speculation, its throughput (experiments per hour, device busy share, proposal
        wait: see harness.run.pool.Pool.throughput)."""
        best = "-"
        if self.best_metric is not None:
            best = f"{self.best_metric:.6f}"
            if self.baseline_metric:
                best += f" ({100 * (self.best_metric - self.baseline_metric) / abs(self.baseline_metric):+.2f}%)"
            if self.rule.sd:
                best += f" noise sd {self.rule.sd:.4f}"
        key = f"{n} {re.sub(r'[0-9]+:[0-9:]+|[0-9.]+s', '', phase)}"   # a plain line per phase: its clocks do not count
        if self.pool is not None:
            phase += f" | {self.pool.throughput(len(self.history)).short()}"
        console.status(f"exp {n} | {phase} | best {best} | last {self.last} | "
                       f"{(self.spend.input_tokens + self.spend.output_tokens) / 1000:.1f}k tok ${self.spend.usd:.2f} | "
                       f"{console.fmt_duration(time.monotonic() - self.started)}",
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
    return gitops.file_at(s.repo, s.best_commit, s.train_rel)


@locked
def duplicate_of(s, source):
    """The "experiment" event of this tag whose train.py is byte-identical to `source` (any status, the baseline
    included), or None: an idea already measured is never run again."""
    blob = git_blob_sha(source.encode())
    for e in s.history:
        if e["n"] in s.unreadable:
            continue
        if e["n"] not in s.blobs:
            s.blobs[e["n"]] = (s.repo.commit(e["full_commit"]).tree / s.train_rel).hexsha
        if s.blobs[e["n"]] == blob:
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
        if kind is not runner.Kind.OVERTIME and not kind.measured or e["n"] in s.unreadable:
            continue
        if e["n"] not in s.prints:
            s.prints[e["n"]] = fingerprint(gitops.file_at(s.repo, e["full_commit"], s.train_rel))
        if s.prints[e["n"]] != mine:
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



# ---------------------------------------------------------------------------
# Setup and resume: open_session and its steps
# ---------------------------------------------------------------------------


def open_session(settings, profile=None, devices=()):
    """Check everything, then create autoresearch/<tag> from HEAD or resume it. Returns (Session, constants).

    The user's checkout stays on its branch; only the target's train.py and frozen files must be committed (their
    uncommitted edits would be silently ignored), any other edit (program.md: steer as you like) is fine. Resume
    rebuilds the best commit and the experiment count from this tag's events, kills a training run left by a killed
    agent, adopts commits a human added on top of the best one when they leave train.py and the frozen files alone,
    and appends a results.tsv row lost to a kill. Raises SetupError with the fix for anything it will not touch."""
    target = Path(settings.target).resolve()
    check_target(target)
    constants = read_frozen_constants(target / "prepare.py")
    all_events = ledger.read_events(target / ledger.EVENTS)   # a line cut mid-write is skipped (cut after the checks)
    state = tag_state(all_events, settings.tag)
    s = new_session(settings, target, constants, state, profile)
    s.devices = list(devices)
    mlflow = tracking.sqlite_path(settings.mlflow) if settings.mlflow else None
    checks.regular_records(records(s), [s.home.parent, s.home, s.home / "logs"], [mlflow] if mlflow else [])
    checks.one_target(s)
    checks.numbered(s)
    checks.no_stale_git_locks(s)
    damaged = checks.readable(s)
    checks.one_budget(s)
    checks.one_rule(s, state.rule)
    check_checkout(s)
    recover_runs(s, state.stale_runs, all_events)
    record_unreadable(s, damaged, all_events)
    (target / (ledger.RESULTS + ".new")).unlink(missing_ok=True)  # a staged copy left by a kill (keep_one_tag)
    checks.no_stray_rows(s, all_events)
    place_branch(s)
    s.synced = next((e["commit"] for e in reversed(all_events)
                     if e.get("tag") == settings.tag and e.get("event") == Event.SYNCED), None)
    claim_home(s)
    ledger.route_library_logs(s.home / ledger.LIBRARY_LOG)     # the stores' libraries: never on the terminal
    frozen_side(s, all_events, constants)
    hardware_side(s, all_events)
    restore_outputs(s, all_events)
    measured_runs(s, all_events)
    s.tracking = tracking.start(s)
    return s, constants


def left_behind(s, n=None):
    """What a stop at this moment (an interrupt, anywhere) left of the tag's records, in words true now, read back from
    disk: the last experiment event, its results.tsv row, its git note, and where the branch is against the last
    keep. A record the next start completes (ledger.py's order of writes) is named as such. n: None when the last
    experiment on disk is not experiment n (`try`: its result not recorded)."""
    try:
        history = read_tag(s.target, s.settings.tag).history
        tip = s.repo.heads[s.branch].commit.hexsha if s.branch in s.repo.heads else None
        if not history:
            return "nothing was recorded yet"
        last, kept = history[-1], [e for e in history if e.get("status") == "keep"]
        if n is not None and last["n"] != n:
            return None
        missing = []
        if ledger.results_row(last) not in ledger.read_rows(s.target / ledger.RESULTS):
            missing.append("its results.tsv row")
        if ledger.note_text(last, s.metric) not in gitops.note_of(s.repo, last["full_commit"]):
            missing.append("its git note")
        behind = bool(kept) and tip != kept[-1]["full_commit"]
        words = [f"the last experiment, #{last['n']} ({last['status']}), is recorded in {ledger.EVENTS}"]
        words.append(f"{s.branch} is still at {tip[:7] if tip else 'nothing'}, behind the last keep "
                     f"(#{kept[-1]['n']}, {kept[-1]['commit']})" if behind else
                     f"{s.branch} is at the best commit ({tip[:7] if tip else '-'})")
        if missing:
            words.append(f"{' and '.join(missing)} not written yet")
        return "; ".join(words) + ("; the next start completes them" if missing or behind else "")
    except Exception as e:  # noqa: BLE001  (words at an interrupt: never a second traceback)
        return f"the records could not be read back ({type(e).__name__})"


def interrupt_words(s, settings):
    """What an interrupt left behind, in words (s: None when it came before the session opened): the loop's records
    (left_behind), or for `try` whether its result was recorded and what to do with your checkout."""
    if settings.command == "loop":
        return f"{left_behind(s) if s else 'nothing was recorded'}. Rerun the same command to resume"
    recorded = left_behind(s, s.recording) if s and s.recording is not None else None
    if recorded is None:
        return "no result was recorded and train.py in your checkout is as you left it. Rerun the same command"
    return (f"{recorded}; train.py in your checkout may not be the best: `uv run agent.py try --tag {settings.tag} "
            "--sync`")


def records(s):
    """Every file the loop writes its records into: results.tsv (and its staged copy, other tags' archives),
    events.jsonl, run.log, the dashboard, the study, the libraries' log."""
    target = s.target
    return [target / name for name in (ledger.RESULTS, ledger.RESULTS + ".new", ledger.EVENTS, RUN_LOG,
                                       dashboard.PAGE)] + sorted(target.glob("results.*.tsv")) + \
        [s.home / STUDY_DB, s.home / ledger.LIBRARY_LOG]


def new_session(settings, target, constants, state, profile=None):
    """The Session of tag settings.tag in the repository holding target, its position from its TagState; profile:
    the prepared one (`prepare.py --check`), whose own budget the target may declare (target.own_budget)."""
    own = own_budget(constants, profile)
    budget = effective_budget(own)
    repo = gitops.open_repo(target)
    history = state.history
    s = Session(settings=settings, target=target, repo=repo, branch=f"autoresearch/{settings.tag}",
                train_rel=gitops.repo_rel(repo, target / "train.py"),
                frozen_rels=[gitops.repo_rel(repo, target / f) for f in FROZEN],
                metric=constants["METRIC_NAME"], goal=constants["METRIC_GOAL"], budget=budget,
                smoke=budget != own, profile=profile, sd_floor_declared=constants.get("METRIC_SD_FLOOR"),
                speed_probe=constants.get("SPEED_PROBE") is True,
                timeout=settings.timeout or (ledger.baseline_of(history) or {}).get("timeout_s"),
                rule=rule_of(constants["METRIC_GOAL"], baseline=ledger.baseline_of(history),
                             runs=settings.baseline_runs, **tag_rule(settings, state)),
                best_commit="", history=history,
                home=gitops.harness_dir(repo, settings.tag),
                spend=Spend(state.input_tokens, state.output_tokens, state.cost_usd))
    s.target_rel = "" if target == Path(repo.working_tree_dir).resolve() else gitops.repo_rel(repo, target)
    s.seed_base = history[0].get("seed_base") if history else secrets.randbelow(2**31)
    return s


def tag_rule(settings, state):
    """{confirm, margin, verdict, false_keep} of the verdict rule (verdict.rule_of's): the tag's, once its baseline
    is recorded (one rule per tag, like the budget: checks.one_rule refuses other explicit flags), else this
    invocation's flags or the defaults: verdict.DEFAULT (the margin rule when --margin is given)."""
    if state.rule is not None:
        return verdict.settings_of(state.rule)
    name = settings.verdict or ("margin" if settings.margin is not None else verdict.DEFAULT)
    paired = verdict.RULES[name].pairs_seeds
    confirm = settings.confirm if settings.confirm is not None else PAIRED_CONFIRM if paired else DEFAULT_CONFIRM
    return dict(confirm=confirm, margin=settings.margin, verdict=name, false_keep=settings.false_keep or FALSE_KEEP)


def measured_runs(s, all_events):
    """s.measured from the tag's "run_end" events: each run's metric and probe by commit and seed (a resumed paired
    tag pairs with the best's runs measured before); s.curves: the curves kept beside their logs."""
    for e in all_events:
        if e.get("tag") == s.settings.tag and e.get("event") == Event.RUN_END and e.get("metric") is not None:
            if e.get("seed") is not None:
                s.measured.setdefault(e["commit"], {})[e["seed"]] = (e["metric"], e.get("probe_s"))
            if e.get("log") and (curve := curves.load(e["log"])) is not None:
                s.curves.setdefault(e["commit"], {})[e.get("seed", e["log"])] = curve
    # adopted commits (a human's on top of the best) are measured anew at each seed when first paired: what they
    # changed besides train.py (a file train.py reads) must not be credited to the next candidate


def recover_runs(s, stale_runs, all_events):
    """What a killed agent left: its training runs (killed now) and a line cut mid-write at the end of events.jsonl
    or results.tsv (cut off, its text kept as an event). Runs after the refusals that need no repair, so that a
    refused start changes nothing."""
    for stale in stale_runs:
        runner.kill_stale_run(stale["pgid"], stale.get("cwd") or s.target)
    torn = [("events.jsonl", ledger.repair_last_line(s.target / ledger.EVENTS, ledger.is_event)),
            ("results.tsv", ledger.repair_results(s.target / ledger.RESULTS, all_events))]
    for name, fragment in torn:
        if fragment:   # cut off so that it is not kept as a line of its own; its text stays on record here
            s.log(Event.TORN_LINE, file=name, fragment=fragment)
            console.say(f"{name}: removed a line cut mid-write ({fragment[:60]!r}); it is kept in {ledger.EVENTS}")


def record_unreadable(s, damaged, all_events):
    """The discards and crashes whose objects git cannot read (checks.readable: {n: what git said}): named on the
    terminal at each start, recorded once as an "unreadable" event; their rows stay, and new ideas are no longer
    compared with them."""
    known = {e.get("n") for e in schema.of(all_events, Event.UNREADABLE, tag=s.settings.tag)}
    for e in s.history:
        if e["n"] in damaged:
            console.say(f"warning: experiment #{e['n']} ({e['commit']}) is unreadable: git cannot read its commit or "
                        f"its train.py ({damaged[e['n']]}); its row stays, and new ideas are not compared with it. "
                        "`git fsck` names the damaged objects")
            if e["n"] not in known:
                s.log(Event.UNREADABLE, n=e["n"], commit=e["commit"], reason=damaged[e["n"]])


def check_checkout(s):
    """Your checkout: the frozen files committed, the branch not checked out; for the loop an uncommitted train.py
    that would be ignored is refused; for `try`, a baseline first, once, of the committed train.py."""
    changed = gitops.changed_files(s.repo)
    checks.committed_frozen(s, changed)
    checks.branch_not_checked_out(s)
    here = (s.target / "train.py").read_bytes()
    best = s.best_event["full_commit"] if s.best_event else (s.branch if s.branch in s.repo.heads else "HEAD")
    best_bytes = file_at_bytes(s, best)
    measured = here == best_bytes or s.settings.command != "loop" or s.train_rel not in changed or duplicate_of(
        s, here.decode("utf-8", "replace")) is not None
    checks.train_edit_not_ignored(s, changed, here, best_bytes, measured)
    checks.try_baseline_state(s, here, best, best_bytes, describe)


def place_branch(s):
    """Create the branch from HEAD, or find the best commit of a resumed one (moving the branch to it when a kill
    came between a keep's event and its move; adopting commits a human added on top)."""
    checks.branch_exists_for_history(s)
    rule = s.rule.recorded()
    if s.branch not in s.repo.heads:
        s.repo.create_head(s.branch, s.repo.head.commit)
        s.best_commit = s.repo.head.commit.hexsha
        s.start = dict(new_branch=True, best=s.best_commit, **rule)
        return
    # before the baseline is measured, whatever the branch holds is the baseline
    s.best_commit = s.best_event["full_commit"] if s.best_event else s.repo.heads[s.branch].commit.hexsha
    tip = s.repo.heads[s.branch].commit.hexsha
    if tip != s.best_commit and s.repo.is_ancestor(tip, s.best_commit):
        gitops.advance_branch(s.repo, s.branch, s.best_commit, tip)   # a kill between a keep's event and its move
        s.log(Event.ADVANCED, n=s.next_n - 1, tip=tip, best=s.best_commit)
    elif tip != s.best_commit:
        adopt_human_commits(s, tip)
    s.start = dict(new_branch=False, best=s.best_commit, experiments=len(s.history), **rule)


def claim_home(s):
    """The tag's harness dir: yours alone (as root the sandbox's uid is root's outside, so what a run writes in runs/
    and leaves in an artifact is root's; no other user of the machine may reach it), owned by this target, and no
    run dir left by a killed agent (we hold the lock and killed its run)."""
    owner = s.home / "target"
    owner.parent.mkdir(parents=True, exist_ok=True)
    s.home.chmod(0o700)
    owner.write_text(s.target_rel)
    shutil.rmtree(s.home / "runs", ignore_errors=True)


def frozen_side(s, all_events, constants):
    """A pristine copy of the target, the sandbox, the frozen inputs' digest."""
    s.frozen_base = next((e["base"] for e in all_events if e.get("tag") == s.settings.tag
                          and e.get("event") == Event.FROZEN_INPUTS and e.get("base")), s.best_commit)
    export_frozen(s)
    setup_sandbox(s)
    checks.one_sandbox_rule(s)
    if "METRIC_TOLERANCE" in constants:
        s.evaluation = frozen_inputs(s, all_events, float(constants["METRIC_TOLERANCE"]))
        s.evaluation["artifact"] = constants.get("ARTIFACT_NAME", "artifact")   # where train.py saves its model
    if s.wrap is not None:
        check_view(s)


def hardware_side(s, all_events):
    """The comparability fingerprint (harness.run.hardware) of this invocation's runs: recorded as the tag's epoch 1 when
    it starts (or first resumes, for a tag from before fingerprints), else compared with the tag's latest. A
    difference is refused (checks.same_hardware) unless --new-hardware, which opens the next epoch: its baseline is
    measured before any candidate (Session.baseline_due). Before any experiment a difference just replaces the
    fingerprint. The event is logged with this invocation's first one (a refused `try` logs nothing); `try --sync`
    measures nothing."""
    a = s.settings
    if a.command == "try" and a.sync:
        return
    s.hardware = hardware.measure(s.devices, a.ray is not None, (s.evaluation or {}).get("digest"))
    recorded = ledger.hardware_events(all_events, a.tag)
    last = recorded[-1] if recorded else None
    s.hardware_epoch = last.get("epoch", 1) if last else 1
    changed = hardware.differences(last, s.hardware) if last else []
    if changed and s.history:
        checks.same_hardware(s, last, changed)          # refused unless --new-hardware
        s.hardware_epoch += 1
        console.say(f"--new-hardware: tag {a.tag!r} continues on {hardware.words(s.hardware)} as hardware epoch "
                    f"{s.hardware_epoch} ({'; '.join(changed)}): a new baseline is measured first, and its rows "
                    f"are marked {ledger.hw_label(s.hardware_epoch).strip()}")
    elif a.new_hardware and last is not None:
        console.say(f"--new-hardware: this machine matches the fingerprint of tag {a.tag} (hardware epoch "
                    f"{s.hardware_epoch}: {hardware.words(s.hardware)}); nothing to re-measure for it")
    if last is None or changed:
        s.deferred.append((Event.HARDWARE, dict(epoch=s.hardware_epoch, digest=hardware.digest_of(s.hardware),
                                            **s.hardware)))
    checks.try_baseline_due(s, describe)


def restore_outputs(s, all_events):
    """The outputs ignored by git, results.tsv with its header and this tag's rows only (karpathy's contract, which
    his analysis notebook assumes: earlier tags move to their own file), and a row or note lost to a kill between
    the "experiment" event and them."""
    target, tag = s.target, s.settings.tag
    gitops.ensure_ignored(s.repo, [target / name for name in (ledger.RESULTS, ledger.EVENTS, RUN_LOG, TRY_LOG,
                                                               dashboard.PAGE)])
    try:
        ledger.ensure_results_header(target / ledger.RESULTS, s.metric)
    except ValueError as e:
        raise SetupError(str(e)) from None
    for path, n in ledger.keep_one_tag(target / ledger.RESULTS, all_events, tag, s.metric).items():
        if path.name == ledger.RESULTS:
            s.log(Event.UNARCHIVED, file=ledger.archive_path(path, tag).name, rows=n)
            console.say(f"{ledger.RESULTS}: brought back {n} row(s) of tag {tag} from its own file")
            continue
        gitops.ensure_ignored(s.repo, [path])
        s.log(Event.ARCHIVED, file=path.name, rows=n)
        console.say(f"{ledger.RESULTS}: moved {n} row(s) of another tag to {path.name} (report.py reads it)")
    rows, wanted = ledger.read_rows(target / ledger.RESULTS), [ledger.results_row(e) for e in s.history]
    if len(rows) < len(wanted) and rows == wanted[:len(rows)]:   # lost to a kill, or results.tsv moved aside
        for event, row in zip(s.history[len(rows):], wanted[len(rows):]):
            ledger.append_line(target / ledger.RESULTS, row)
            s.log(Event.ROW_RESTORED, n=event["n"])
    if s.history and s.history[-1].get("full_commit"):      # a kill between the event and its note (no-op if there)
        gitops.add_note(s.repo, s.history[-1]["full_commit"], ledger.note_text(s.history[-1], s.metric))


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
    checks.human_commits_leave_measured_files(s, tip)
    s.log(Event.ADOPTED, previous_best=s.best_commit, tip=tip)
    s.best_commit = tip


def setup_sandbox(s):
    """--sandbox auto|bwrap|off: run train.py and the evaluator in bubblewrap, each seeing only its view (sandbox's
    docstring; what the target declares comes from frozen_inputs), the repository hidden even should a declared path
    contain it; or say once which protections are missing. --sandbox bwrap refuses to start without all of them."""
    reason = sandbox.probe() if s.settings.sandbox != "off" else "--sandbox off"
    lacking = sandbox.missing() if reason is None else []
    checks.sandbox_complete(s.settings, reason, lacking)
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


def check_view(s):
    """With the sandbox on: train.py's real view (a run dir where runs get theirs) reads none of the repository, its
    git dir and the evaluator-only files, wherever they lie (under /usr too); the probe runs inside the sandbox.
    A file it can read refuses the start, naming the files and the way out."""
    inputs = (s.evaluation or {}).get("inputs") or {}
    run_dir = s.home / "runs" / "view-check"
    run_dir.mkdir(parents=True, exist_ok=True)
    shown = [*sandbox.environment(), *sandbox.train_reads(inputs), run_dir]
    try:
        found = sandbox.readable_inside(lambda argv: s.wrap(argv, run_dir, ""), [
            Path(s.repo.working_tree_dir), gitops.git_dir(s.repo), *inputs.get("evaluator_only", [])], skip=shown)
    except RuntimeError as e:
        raise SetupError(f"the sandbox's view could not be checked: {e}; try --sandbox off to run without it") from None
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    if found:
        raise SetupError(f"train.py's sandbox could read files it must not (the repository, its git dir or "
                         f"evaluation data), e.g. {', '.join(found[:3])}. Move the repository and the data cache "
                         "(AUTORESEARCH_CACHE) to a folder of their own outside the system's folders (not under "
                         "/usr), then rerun the same command")


def frozen_inputs(s, all_events, tolerance):
    """Run the pristine `prepare.py --frozen-inputs` (with the variables the tag pinned, if it has started); record
    its digest, what each sandboxed process reads and the pinned variables when the tag starts, and refuse to resume
    when the frozen inputs (prepare.py, tokenizer, evaluation data, base model) changed since. Returns the
    evaluation settings."""
    pinned = pinned_env(all_events, s.settings.tag)
    out = run_prepare(s.home / "frozen", "--frozen-inputs", timeout=600, env=pinned)   # SetupError on failure
    try:
        found = json.loads(out.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise SetupError(f"prepare.py --frozen-inputs printed no JSON object: {out[-2000:]!r}") from None
    recorded = schema.of(all_events, Event.FROZEN_INPUTS, tag=s.settings.tag)
    checks.same_frozen_inputs(s, recorded, found)
    env = pinned if recorded else {k: str(v) for k, v in (found.get("env") or {}).items()}
    if not recorded:
        s.log(Event.FROZEN_INPUTS, digest=found["digest"], files=found["files"], evaluator_only=found["evaluator_only"],
              train_reads=found.get("train_reads"), eval_reads=found.get("eval_reads"), env=env, base=s.frozen_base)
    return {"digest": found["digest"], "tolerance": tolerance, "inputs": found, "env": env}
