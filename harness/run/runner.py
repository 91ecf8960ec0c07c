"""
HARNESS: the runner. "Run this commit's train.py, give me an Outcome": starts [python, train.py] in a directory
holding the commit's files, in its own process group with a hard timeout, stdout+stderr to a log file, kills the
whole group on timeout, on Ctrl-C and after the run (stray children), measures the run's memory itself (usage.py),
checks that the frozen files are unchanged, and parses the summary block. It knows nothing of git or the ledger:
callers pass callbacks for what happens around a run (logging the process group, the status line). How a run ended
is an Outcome's kind (Kind), set where its reason is written. harness.run.backends puts it behind Backend.run(spec,
watch), next to the Ray cluster's.
"""

import contextlib
import dataclasses
import enum
import hashlib
import math
import os
import stat
import sys
import time
from pathlib import Path
from typing import Callable

from harness.run import conditions, evaluator, phases, usage
from harness.run.processes import Cancelled, run_process
from harness.redact import clean_env, redact

LOG_CAP_BYTES = 16 * 2**20      # a run's kept log: its first and last 8 MiB, the cut marked (the summary is last)
LOG_TAIL_LINES = 60             # lines of the log sent back to the LLM and kept in the event after a crash


@dataclasses.dataclass
class Evaluation:
    """The frozen evaluator, run in a fresh interpreter after training: `python prepare.py --evaluate ARTIFACT` from
    a pristine copy of the target (prepare_dir). Its printed metric is the one that counts."""
    prepare_dir: Path                       # holds the pristine prepare.py (never the run's copy)
    artifact: Path                          # what train.py's call into the frozen evaluation saved
    digest: str | None = None               # the frozen-inputs digest recorded when the tag started
    tolerance: float = 0.0                  # |train.py's own metric - the evaluator's| allowed (METRIC_TOLERANCE)
    own_required: bool = False              # train.py could read the evaluation data, so it must print its number
    setup: Callable = lambda: None          # called right before the evaluator starts (e.g. a fresh pristine copy)
    wrap: Callable = lambda argv: argv      # e.g. a sandbox; identity by default
    timeout: float | None = None            # seconds the evaluator may take (None: the run's timeout)
    warm_wrap: Callable | None = None       # the evaluator's view with the artifact's folder in it (a sandbox): it
    #                                         starts with the run and waits for the artifact (evaluator.Warm); None:
    #                                         it starts after training, with wrap (evaluator.Cold)


@dataclasses.dataclass
class RunSpec:
    """One training run. cwd holds the files of commit `commit` (a label only: the runner knows no git)."""
    commit: str
    cwd: Path
    log: Path                               # stdout + stderr of the run (and of its evaluation)
    metric: str                             # the summary key that is the result, e.g. val_bpb
    timeout: object                         # seconds, or a conditions.Timeout of the run's speed probe; the whole
    #                                         process group is killed after it
    frozen: tuple = ()                      # files of cwd that must be byte-identical after the run
    env: dict = dataclasses.field(default_factory=dict)   # added to the (secret-free) environment
    wrap: Callable = lambda argv: argv      # the sandbox: argv -> the argv that runs it confined
    budget: float | None = None             # the harness's budget: the summary's time_budget_s must equal it
    max_wall: object = None                 # conditions.Allowance: train.py's wall time allowed (None: unchecked)
    probe: Callable | None = None           # conditions.Probe: () -> (seconds | None, problem), before and after
    probed: tuple | None = None             # the probe before, already measured: the previous run's probe after, on
    #                                         this device with nothing run since (harness.run.pool.Pool.shared_probe)
    evaluation: Evaluation | None = None    # None: the metric comes from train.py's own summary (legacy targets)
    on_start: Callable = lambda pgid: None  # called with the process group id once it runs
    on_tick: Callable = lambda elapsed: None  # called about once a second while it runs
    on_phase: Callable = lambda phase: None  # called as the run moves on: "probing", "training", "evaluating"
    cancel: object = None                   # a curves.Watcher: training stops early when its rule says so


EVAL_TIMEOUT = "evaluation timeout"      # how a reason starts when the separate evaluation ran out of time


class Kind(enum.Enum):
    """How a run ended, set where its reason is written (Optuna's TrialState plays this part there)."""
    OK = "ok"                   # a metric (or none because a verdict says so: see harness.judge.verdict)
    CRASH = "crash"             # train.py or its evaluation failed: a bug, which an LLM may be asked to fix
    TIMEOUT = "timeout"         # killed at the hard timeout: a verdict on the idea, not a bug
    REJECTED = "rejected"       # ran, but its result is not believed (tampering, budget, mismatch)
    OVERTIME = "overtime"       # ran longer than the budget plus the start-up and evaluation allowance: rejected too,
    #                             but a busier machine can do that to an honest run, so it may be tried again
    LOST = "lost"               # the Ray worker was lost: the cluster, not train.py
    NODE = "node"               # the Ray node could not run it (no data there, no sandbox there)
    CANCELLED = "cancelled"     # stopped early, its curve behind the best's (harness.judge.curves): a discard, no metric

    @property
    def fixable(self):
        """Whether the run failed in a way a fix of train.py can mend (only a crash)."""
        return self is Kind.CRASH

    @property
    def measured(self):
        """Whether the run says something about its train.py: not when the environment may be to blame (the wall
        time under load, the cluster), so the same train.py may be tried again."""
        return self not in (Kind.OVERTIME, Kind.LOST, Kind.NODE)

    @classmethod
    def of(cls, event):
        """The kind an "experiment" event recorded (an older event without one, or with an unknown one: OK)."""
        return cls._value2member_map_.get(event.get("kind"), cls.OK)


@dataclasses.dataclass
class Outcome:
    """One training run of a candidate commit. metric is None when the run failed (kind and reason say how and
    why)."""
    commit: str
    metric: float | None
    memory_gb: float                        # measured by the harness (usage.Peak) for a run with a metric, else 0.0
    seconds: float
    reason: str = ""
    log_tail: str = ""
    returncode: int | None = None           # None after a timeout
    timed_out: bool = False
    tampered: list = dataclasses.field(default_factory=list)
    own_metric: float | None = None         # what train.py printed itself (None: nothing, or not a number)
    summary: dict = dataclasses.field(default_factory=dict)   # train.py's summary block, {key: text}
    hardware_mismatch: str | None = None    # what the summary's device/threads say against the tag's fingerprint
    #                                         (harness.run.hardware.summary_mismatch; set by experiment.train)
    eval_seconds: float = 0.0
    reported_memory_gb: float = 0.0         # what the summary says (peak_vram_mb or peak_rss_mb): information only
    memory_source: str = ""                 # what memory_gb measured: "gpu" (NVML per process), "rss" (the tree's)
    kind: Kind = Kind.OK
    outside: list = dataclasses.field(default_factory=list)   # what the run changed outside its run dir (guard)
    eval_summary: dict = dataclasses.field(default_factory=dict)   # the separate evaluator's summary block
    probe_s: float | None = None            # the speed probe's seconds around the run (harness.run.conditions)
    probe_problem: str = ""                 # why a probe gave no number (the old rules apply), else ""
    cancel: object = None                   # the curves.Cancel that stopped it (kind CANCELLED)
    timeout_s: float | None = None          # the training's hard limit at its speed probe (conditions.Timeout)
    probe_after: float | None = None        # the probe after the run alone (the next run's, when nothing runs between)
    probe_after_at: float | None = None     # when it was taken (time.monotonic() on the machine that ran it)
    phases: dict = dataclasses.field(default_factory=dict)   # {phase: wall seconds} (harness.run.phases.split)

    def fail(self, kind, reason):
        """The run has no believed metric: how (a Kind) and why (a line for the row, the event and the LLM)."""
        self.metric, self.kind, self.reason = None, kind, reason
        if kind is not Kind.CANCELLED:      # a cancelled run the guard then rejects is a rejection
            self.cancel = None
        return self


def run(spec):
    """Train, check, evaluate. Returns an Outcome whose metric is the frozen evaluator's (or, without an Evaluation,
    train.py's own); raises only what interrupts the harness itself (KeyboardInterrupt), after killing the run. With
    spec.cancel, training stops early when its rule says so (Kind.CANCELLED, outcome.cancel), unless the speed probe
    before it differs from the best's (the curves would not be comparable). Rejections (Kind.REJECTED) are runs whose
    result is not believed; crashes (Kind.CRASH, TIMEOUT) are runs with no result. With an Evaluation's warm_wrap
    the evaluator starts with train.py and waits for the artifact (evaluator.Warm); it is killed however the run
    ends."""
    warm = []                               # the evaluator.Warm and the probe's conditions.Started, once started
    try:
        return _run(spec, warm)
    finally:
        with contextlib.ExitStack() as closing:     # each closed, also when another's close raised
            for each in warm:
                closing.callback(each.close)


def _run(spec, warm):
    """run's body; it appends the processes it starts to wait (evaluator.Warm, conditions.Started) to warm."""
    frozen_before = [file_hash(spec.cwd / f) for f in spec.frozen]
    peak = usage.Peak()                     # training only: the evaluator's process is the harness's, not counted
    before, probing = (spec.probed, 0.0) if spec.probed else probe_now(spec)   # probing: the probes' wall seconds
    limit = timeout_s(spec.timeout, before[0])
    evaluation, probe_after = start_waiting(spec, warm)   # after the probe (they would slow it)
    spec.on_phase("training")
    try:
        rc, seconds, timed_out = run_process(spec.wrap([interpreter(), "train.py"]), spec.cwd, spec.log,
                                             run_env(spec), limit, spec.on_start, watched(spec, before[0]),
                                             peak=peak)
    except Cancelled as stopped:            # its process group is gone: one outcome, never a second one
        cap_log(spec.log)
        outcome = Outcome(spec.commit, None, 0.0, stopped.elapsed, cancel=stopped.cancel,
                          log_tail=redact("\n".join(read_log(spec.log).splitlines()[-LOG_TAIL_LINES:])),
                          phases=phases.split({}, stopped.elapsed, probing))
        return outcome.fail(Kind.CANCELLED, f"cancelled at {stopped.cancel.percent}%")
    after, took = probe_now(spec, rc == 0, probe_after)    # a crash or a timeout is judged without it
    probing += took
    cap_log(spec.log)
    tampered = [f for f, h in zip(spec.frozen, frozen_before) if file_hash(spec.cwd / f) != h]
    summary = parse_summary(read_log(spec.log))
    own, reported_gb, own_problem = read_metric(summary, spec.metric)
    outcome = Outcome(spec.commit, None, 0.0, seconds, "", "", rc, timed_out, tampered, own, summary=summary,
                      reported_memory_gb=reported_gb, probe_s=conditions.combine(before[0], after[0]),
                      probe_problem=before[1] or after[1], timeout_s=limit, probe_after=after[0],
                      probe_after_at=time.monotonic())
    allowed = spec.max_wall.seconds(outcome.probe_s) if spec.max_wall is not None else None
    if tampered:
        outcome.fail(Kind.REJECTED, f"rejected: train.py modified {', '.join(tampered)}")
    elif timed_out and isinstance(spec.timeout, conditions.Timeout) and spec.timeout.short(before[0]):
        outcome.fail(Kind.OVERTIME, spec.timeout.short_words(before[0]))    # the harness's limit, not the idea
    elif timed_out:
        outcome.fail(Kind.TIMEOUT, f"timeout after {limit:.0f}s")
    elif rc != 0:
        outcome.fail(Kind.CRASH, f"exit code {rc}")
    elif spec.budget is not None and not _same_budget(summary.get("time_budget_s"), spec.budget):
        outcome.fail(Kind.REJECTED, (
            f"rejected: the summary says time_budget_s {summary.get('time_budget_s', '(missing)')}, "
            f"the harness's budget is {spec.budget:g}"))
    elif allowed is not None and seconds > allowed:
        outcome.fail(Kind.OVERTIME, (
            f"rejected: train.py ran {seconds:.1f}s, more than the budget plus the start-up and evaluation "
            f"allowance ({allowed:.1f}s{spec.max_wall.scaled_words(outcome.probe_s)})"))
    elif spec.evaluation is None:
        outcome.metric, outcome.reason = own, own_problem
        outcome.kind = Kind.OK if own is not None else Kind.CRASH
    else:
        evaluate(spec, outcome, evaluation)
    if outcome.metric is not None:          # karpathy's rows: a run without a result records 0.0
        outcome.memory_gb, outcome.memory_source = peak.memory_gb(), peak.source
    outcome.phases = phases.split(summary if rc == 0 and not timed_out else {}, seconds, probing, outcome.eval_seconds)
    # redacted here, at the source: the tail goes to the event, the status line and the LLM's fix prompt
    outcome.log_tail = redact("\n".join(read_log(spec.log).replace("\r", "\n").splitlines()[-LOG_TAIL_LINES:]))
    return outcome


def start_waiting(spec, warm):
    """(the evaluator.Warm or None, the probe after's conditions.Started or None), started now, with train.py's
    start-up, where the evaluation and the probe are warm (sandboxed runs); each is appended to warm."""
    evaluation = probe_after = None
    if spec.evaluation is not None and spec.evaluation.warm_wrap is not None:
        evaluation = evaluator.Warm(spec.evaluation, run_env(spec), interpreter())
        warm.append(evaluation)
    if spec.probe and spec.probe.warm:
        try:
            probe_after = spec.probe.start()
            warm.append(probe_after)
        except OSError:                     # it could not start: the probe after runs cold, and says why if it fails
            probe_after = None
    return evaluation, probe_after


def probe_now(spec, due=True, started=None):
    """(spec.probe()'s (seconds | None, problem), the wall seconds it took), the phase said first; ((None, ""), 0.0)
    without a probe or when not due. started: the probe's process already started (Probe.start), taken instead."""
    if not (spec.probe and due):
        return (None, ""), 0.0
    spec.on_phase("probing")
    t0 = time.monotonic()
    return (started or spec.probe)(), time.monotonic() - t0


def timeout_s(timeout, probe_s=None):
    """Seconds of a Spec's timeout (a number, or a conditions.Timeout at probe_s)."""
    return timeout.seconds(probe_s) if isinstance(timeout, conditions.Timeout) else timeout


def watched(spec, probe_s):
    """The training run's tick: spec.on_tick, then (with spec.cancel) a look at the log's new progress lines, which
    raises Cancelled once the rule says so. Only training is watched, never the evaluation; not a run whose speed
    probe (probe_s, before it) differs from the best's (conditions.differ: its steps per share differ)."""
    if spec.cancel is None or conditions.differ(probe_s, spec.cancel.probe_s):
        return spec.on_tick
    look = spec.cancel.live(spec.log)

    def tick(elapsed):
        spec.on_tick(elapsed)
        if (cancel := look()) is not None:
            raise Cancelled(cancel, elapsed)
    return tick


def evaluate(spec, outcome, warm=None):
    """The separate evaluation: the pristine prepare.py scores the artifact in a fresh process (warm: the
    evaluator.Warm started with the run, told the artifact now; else an evaluator.Cold); its output is appended to
    the run's log. Sets outcome.metric, or outcome.reason when the artifact is missing or unloadable, the frozen
    inputs changed, or train.py's own number disagrees with the evaluator's beyond the tolerance."""
    ev = spec.evaluation
    if not os.path.lexists(ev.artifact):
        outcome.fail(Kind.CRASH, "crash: no model artifact: train.py must hand its model to the frozen evaluation "
                     "(evaluate_bpb / evaluate in prepare.py), which saves it for the separate evaluator")
        return
    problem = artifact_problem(ev.artifact)
    if problem:
        outcome.fail(Kind.REJECTED, f"rejected: {problem}")
        return
    if ev.own_required and outcome.own_metric is None:
        outcome.fail(Kind.REJECTED, (
            f"rejected: train.py printed no finite {spec.metric} although it could read the evaluation "
            "data (without the sandbox its own number is checked against the evaluator's)"))
        return
    spec.on_phase("evaluating")
    with open(spec.log, "ab") as log:
        log.write(b"\n=== separate evaluation: prepare.py --evaluate (pristine copy, fresh process) ===\n")
        offset = log.tell()                 # the evaluator's output starts here, however long train.py's log was
    t0, limit = time.monotonic(), ev.timeout or timeout_s(spec.timeout)
    rc, timed_out = (warm or evaluator.Cold(ev, run_env(spec), interpreter())).evaluate(limit, spec.log,
                                                                                       spec.on_tick)
    outcome.eval_seconds = time.monotonic() - t0
    if timed_out:       # a model too slow to score, or a machine too slow or busy: not a bug a fix could mend
        outcome.fail(Kind.TIMEOUT, f"{EVAL_TIMEOUT} after {limit:.0f}s: the frozen evaluator did not finish scoring "
                     "the model in time")
        return
    if rc != 0:
        outcome.fail(Kind.CRASH, (
            f"evaluation failed (exit code {rc}): the artifact could not be loaded or scored; see the end of the "
            "log"))
        return
    with open(spec.log, "rb") as log:
        log.seek(offset)
        summary = parse_summary(log.read().decode("utf-8", errors="replace"))
    outcome.eval_summary = summary
    metric, _, problem = read_metric(summary, spec.metric)
    if metric is None:
        outcome.fail(Kind.CRASH, f"evaluation failed: {problem}")
    elif ev.digest and summary.get("frozen_inputs") != ev.digest:
        outcome.fail(Kind.REJECTED, (
            f"rejected: the frozen inputs changed (digest {summary.get('frozen_inputs', '(missing)')[:12]}"
            f", recorded {ev.digest[:12]}): prepare.py, the tokenizer or the evaluation data differ "
            "from when the tag started"))
    elif outcome.own_metric is not None and abs(outcome.own_metric - metric) > ev.tolerance:
        outcome.fail(Kind.REJECTED, (
            f"rejected: metric mismatch: train.py printed {spec.metric} {outcome.own_metric:.6f}, the "
            f"frozen evaluator measured {metric:.6f} (tolerance {ev.tolerance:g})"))
    else:
        outcome.metric = metric


def artifact_problem(path):
    """None when the model artifact at path is only regular files (a file, or a folder of files and folders), each
    with no other name; else what is wrong, naming the artifact by its file name. The evaluator reads the artifact
    and nothing else the candidate controls: a symbolic link (to a better model beside it, or to any file the run
    could see), a hard link (a second name of another file), a pipe, a socket or a device is never followed, and a
    set-id bit (a root-owned program left in the harness's folders) is refused. Checks with lstat, never following
    links."""
    name = Path(path).name
    if not os.path.lexists(path):
        return f"no model artifact {name}"
    entries = [Path(path)]
    if Path(path).is_dir() and not Path(path).is_symlink():
        for top, dirs, files in os.walk(path):          # os.walk never descends into a linked folder
            entries += [Path(top) / e for e in dirs + files]
    for entry in entries:
        st = entry.lstat()
        inside = "" if entry == Path(path) else f" ({entry.relative_to(path)} in it)"
        if stat.S_ISLNK(st.st_mode):
            return (f"the model artifact {name}{inside} is a symbolic link: the evaluator scores regular files only; "
                    "let the frozen evaluation write the artifact itself")
        if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            return (f"the model artifact {name}{inside} has a set-user-id or set-group-id bit (a program that would "
                    "run as the harness's user): an artifact is data")
        if stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            return f"the model artifact {name}{inside} is not a regular file (a pipe, a socket or a device)"
        if st.st_nlink > 1:
            return (f"the model artifact {name}{inside} has another name (a hard link to a file elsewhere): the "
                    "evaluator scores files the run wrote, once")
    return None


def run_env(spec):
    """The environment of the run's processes: ours without secrets, plus what the spec adds (budget, artifact)."""
    return {**clean_env(), **spec.env}


def interpreter():
    """This Python, named through the real path of its environment: a virtualenv reached through a symlink stays a
    virtualenv, and the path exists inside the sandbox (which binds real paths)."""
    try:
        return str(Path(sys.prefix).resolve() / Path(sys.executable).relative_to(sys.prefix))
    except ValueError:
        return sys.executable


def _same_budget(text, budget):
    """True when the summary's time_budget_s text is the harness's budget (to the printed precision)."""
    try:
        return abs(float(text) - budget) <= 1e-6 * max(1.0, budget)
    except (TypeError, ValueError):
        return False


def read_metric(summary, name):
    """(metric, memory_gb, "") from a parsed summary, or (None, memory_gb, reason) when the metric is missing, not
    a number, NaN or infinite. memory_gb is what train.py says it used (information only: the records hold what the
    harness measured, usage.Peak): peak_vram_mb / 1024 (GPU memory), or on a device without its own memory
    (CPU; peak_vram_mb 0 or absent) peak_rss_mb / 1024, the process's peak resident memory; 0.0 when neither."""
    try:
        memory_gb = (float(summary.get("peak_vram_mb", 0.0)) or float(summary.get("peak_rss_mb", 0.0))) / 1024
    except ValueError:
        memory_gb = 0.0
    if not (math.isfinite(memory_gb) and memory_gb >= 0):   # a self-reported number: never nan in the records
        memory_gb = 0.0
    try:
        metric = float(summary[name])
    except KeyError:
        return None, memory_gb, f"no {name} in the summary"
    except ValueError:
        return None, memory_gb, f"{name} is not a number: {summary[name]!r}"
    if not math.isfinite(metric):
        return None, memory_gb, f"{name} is {summary[name]}"
    return metric, memory_gb, ""


def parse_summary(text):
    """The last `---` block of a log as {key: value} strings (lines that are not `key: value` are ignored)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == "---"]
    if not starts:
        return {}
    summary = {}
    for line in lines[starts[-1] + 1:]:
        key, sep, value = line.partition(":")
        if sep and key.strip() and " " not in key.strip():
            summary[key.strip()] = value.strip()
    return summary


def cap_log(path, cap=LOG_CAP_BYTES):
    """Cut a log longer than `cap` bytes to its first and last cap/2 bytes, with a line in between that says how
    much was cut and why (a run that prints 400 MB would otherwise be kept twice: its log and run.log). Returns the
    bytes cut (0: none)."""
    size = path.stat().st_size if path.exists() else 0
    half = cap // 2
    if size <= cap:
        return 0
    with open(path, "r+b") as f:
        f.seek(size - half)
        tail = f.read()
        f.seek(half)
        f.write(f"\n[... {size - 2 * half} bytes cut by the harness: a run's kept log is its first and last "
                f"{half / 2**20:g} MiB ...]\n".encode() + tail)
        f.truncate()
    return size - 2 * half


def read_log(path, limit=1 << 20):
    """The last `limit` bytes of a log as text (a training log can be large; the summary is at the end)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


NOT_A_FILE = "(not a regular file)"   # file_hash of a link, a FIFO, a device or a folder: never a file's hash


def file_hash(path):
    """sha256 (hex) of a regular file's bytes; None if nothing is at path; NOT_A_FILE for a symbolic link, a FIFO, a
    device or a folder, which is never read (a run that put a FIFO or a link to /dev/zero in place of a frozen file
    must not hang the harness or feed it without end: it reads as modified)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:                 # ELOOP (a link), ENXIO, EACCES...
        return NOT_A_FILE
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return NOT_A_FILE
        digest = hashlib.sha256()
        while chunk := f.read(1 << 20):
            digest.update(chunk)
        return digest.hexdigest()
