"""
HARNESS: the runner. "Run this commit's train.py, give me an Outcome": starts [python, train.py] in a directory
holding the commit's files, in its own process group with a hard timeout, stdout+stderr to a log file, kills the
whole group on timeout, on Ctrl-C and after the run (stray children), checks that the frozen files are unchanged,
and parses the summary block. It knows nothing of git or the ledger: callers pass callbacks for what happens around
a run (logging the process group, the status line, restoring a frozen file). Other backends (a hermetic run dir,
a sandbox, a pool of devices, a cluster) implement the same run(spec) -> Outcome.
"""

import dataclasses
import hashlib
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from harness.redact import clean_env

KILL_GRACE_S = 5.0              # SIGTERM -> SIGKILL grace for the training process group
LOG_TAIL_LINES = 60             # lines of the log sent back to the LLM and kept in the event after a crash


@dataclasses.dataclass
class RunSpec:
    """One training run. cwd holds train.py and the frozen files of the commit `commit` (a label only)."""
    commit: str
    cwd: Path
    log: Path                               # stdout + stderr of the run
    metric: str                             # the summary key that is the result, e.g. val_bpb
    timeout: float                          # seconds; the whole process group is killed after it
    frozen: tuple = ()                      # files of cwd that must be byte-identical after the run
    on_start: Callable = lambda pgid: None  # called with the process group id once it runs
    on_tick: Callable = lambda elapsed: None  # called about once a second while it runs
    restore: Callable = lambda files: None  # called (even on Ctrl-C) with the frozen files the run changed


@dataclasses.dataclass
class Outcome:
    """One training run of a candidate commit. metric is None when the run failed (reason says why)."""
    commit: str
    metric: float | None
    memory_gb: float
    seconds: float
    reason: str = ""
    log_tail: str = ""
    returncode: int | None = None           # None after a timeout
    timed_out: bool = False
    tampered: list = dataclasses.field(default_factory=list)


def run(spec):
    """Run spec's train.py, check the frozen files, parse the summary. Returns an Outcome; raises only what
    interrupts the harness itself (KeyboardInterrupt), after killing the run."""
    frozen_before = [file_hash(spec.cwd / f) for f in spec.frozen]
    tampered = []
    try:
        rc, seconds, timed_out = run_process([sys.executable, "train.py"], spec)
    finally:                                # also on Ctrl-C: a frozen file changed by the run is restored
        tampered = [f for f, h in zip(spec.frozen, frozen_before) if file_hash(spec.cwd / f) != h]
        if tampered:
            spec.restore(tampered)
    text = read_log(spec.log)
    tail = "\n".join(text.replace("\r", "\n").splitlines()[-LOG_TAIL_LINES:])
    metric, memory_gb, reason = None, 0.0, ""
    if tampered:
        reason = f"rejected: train.py modified {', '.join(tampered)} (restored)"
    elif timed_out:
        reason = f"timeout after {spec.timeout:.0f}s"
    elif rc != 0:
        reason = f"exit code {rc}"
    else:
        metric, memory_gb, reason = read_metric(parse_summary(text), spec.metric)
    return Outcome(spec.commit, metric, memory_gb, seconds, reason, tail, rc, timed_out, tampered)


def run_process(argv, spec):
    """Run argv in spec.cwd in its own process group, stdout+stderr -> spec.log, secrets removed from its
    environment. On timeout and on any exception (Ctrl-C) the whole group is killed; so are stray children of a
    run that exited. Returns (returncode or None on timeout, seconds, timed_out)."""
    t0 = time.monotonic()
    with open(spec.log, "wb") as log:
        proc = subprocess.Popen(argv, cwd=spec.cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=clean_env(), start_new_session=True)
        try:
            spec.on_start(proc.pid)
            while True:
                elapsed = time.monotonic() - t0
                if elapsed >= spec.timeout:
                    kill_group(proc.pid, proc)
                    return None, time.monotonic() - t0, True
                spec.on_tick(elapsed)
                try:
                    rc = proc.wait(timeout=min(1.0, spec.timeout - elapsed))
                    break
                except subprocess.TimeoutExpired:
                    pass
        except BaseException:
            kill_group(proc.pid, proc)
            raise
    seconds = time.monotonic() - t0
    kill_group(proc.pid, proc)
    return rc, seconds, False


def kill_group(pgid, proc=None):
    """SIGTERM the process group, SIGKILL it after KILL_GRACE_S, and wait (up to the grace) until it is gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + KILL_GRACE_S
        while time.monotonic() < deadline:
            if proc is not None:
                proc.poll()                  # reap the leader, else it stays a zombie member of the group
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)


def kill_stale_run(pgid, cwd):
    """Kill the training process group a killed agent left running, if its leader is still train.py in cwd
    (checked in /proc, so that a reused pid is never hit)."""
    try:
        leader_cwd = os.readlink(f"/proc/{pgid}/cwd")
        cmdline = Path(f"/proc/{pgid}/cmdline").read_bytes().split(b"\0")
        ours = Path(leader_cwd) == Path(cwd) and b"train.py" in cmdline and os.getpgid(pgid) == pgid
    except OSError:
        return
    if ours:
        kill_group(pgid)


def read_metric(summary, name):
    """(metric, memory_gb, "") from a parsed summary, or (None, 0.0, reason) when the metric is missing, not a
    number, NaN or infinite. memory_gb = peak_vram_mb / 1024, 0.0 when absent."""
    try:
        metric = float(summary[name])
    except KeyError:
        return None, 0.0, f"no {name} in the summary"
    except ValueError:
        return None, 0.0, f"{name} is not a number: {summary[name]!r}"
    if not math.isfinite(metric):
        return None, 0.0, f"{name} is {summary[name]}"
    try:
        return metric, float(summary.get("peak_vram_mb", 0.0)) / 1024, ""
    except ValueError:
        return metric, 0.0, ""


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


def read_log(path, limit=1 << 20):
    """The last `limit` bytes of a log as text (a training log can be large; the summary is at the end)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def file_hash(path):
    """sha256 of a file's bytes, or None if it does not exist."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except FileNotFoundError:
        return None
