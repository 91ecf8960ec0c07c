"""
HARNESS: the processes of a run. One argv in its own process group and session, its stdout and stderr into a log
opened under a name the run cannot read back, ticked about once a second, killed as a group on its timeout, on any
exception (Ctrl-C, a cancel) and at its end, with every stray it detached (this process is their subreaper) found by
the run's token and killed too (with its process group), their dead reaped at each tick; and the group a killed agent left behind, killed on the next start. It never reads
what a run printed (harness.run.runner does).
"""

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import NamedTuple

from harness import files

RUN_TOKEN = "AUTORESEARCH_RUN_TOKEN"    # in the environment of a run's processes: which run a stray belongs to
_LIVE, _LIVE_LOCK = {}, threading.Lock()   # the runs in flight in this process: token -> its leader's pid (start)
KILL_GRACE_S = 5.0              # SIGTERM -> SIGKILL grace for the training process group
STRAYS_S = 10.0                 # how long kill_strays looks again while a run's strays keep turning up


class Cancelled(Exception):
    """Raised from a training run's tick when its curves.Watcher says stop: run_process kills the group."""

    def __init__(self, cancel, elapsed):
        super().__init__(cancel.words())
        self.cancel, self.elapsed = cancel, elapsed



def open_unnamed(path, append=False):
    """The log at path, opened for appending (emptied first unless append) through a second name of random hex that is
    removed at once: a run reads its stdout's name from /proc/self/fd/1, and the log's name (0007-0-r1-best.log) would
    tell it the experiment, the run and whether it is the best re-run for a successor's pairs (a hostile review: a
    kept train.py that threw its own re-runs moved the ratchet backwards). Returns the binary file object."""
    path = Path(path)
    with files.open_record(path, "ab" if append else "wb"):   # never through a link planted at the log's name
        pass
    other = path.with_name(f".{secrets.token_hex(8)}")
    try:
        os.link(path, other)        # a new name (EEXIST otherwise) for the regular file just checked
    except OSError:                 # a filesystem without hard links: the log under its own name, as before
        return files.open_record(path, "ab")
    try:
        return open(other, "ab")
    finally:
        os.unlink(other)


def run_process(argv, cwd, log_path, env, timeout, on_start, on_tick, append=False, peak=None):
    """Run argv in cwd in its own process group, stdout+stderr -> log_path. On timeout and on any exception
    (Ctrl-C) the whole group is killed; so are stray children of a run that exited. With peak (a usage.Peak), its
    process tree is sampled about once a second and the leader's rusage added when it is reaped. Returns (returncode
    or None on timeout, seconds, timed_out)."""
    ours = children()                       # anything else that turns up as our child afterwards is the run's
    with open_unnamed(log_path, append) as log:
        proc, token = start(argv, env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return watch(proc, token, ours, log, timeout, on_start, on_tick, peak)


def watch(proc, token, ours, log, timeout, on_start=lambda pid: None, on_tick=lambda elapsed: None, peak=None):
    """Wait for proc (started by start() with this token; ours: our children before it) for at most timeout seconds
    from now, ticking about once a second; then, or on any exception, kill its group and its strays, the reason
    written to log (its binary output file). Returns (returncode or None on timeout, seconds, timed_out)."""
    t0 = time.monotonic()
    try:
        on_start(proc.pid)
        while True:
            elapsed = time.monotonic() - t0
            if elapsed >= timeout:
                kill_group(proc.pid, proc, lambda: reap_dead(ours, token))
                kill_strays(ours, token)    # the token too: left live, its strays were no run's to kill
                killed(log, time.monotonic() - t0, f"the {timeout:.0f}s timeout")
                return None, time.monotonic() - t0, True
            on_tick(elapsed)
            reap_dead(ours, token)
            if peak is not None:
                peak.sample(proc.pid, f"{RUN_TOKEN}={token}".encode())
            try:
                rc = wait(proc, min(1.0, timeout - elapsed), peak)
                break
            except subprocess.TimeoutExpired:
                pass
    except BaseException as e:
        kill_group(proc.pid, proc, lambda: reap_dead(ours, token))
        kill_strays(ours, token)
        killed(log, time.monotonic() - t0, "cancelled early: its learning curve fell behind the best's"
               if isinstance(e, Cancelled) else "the harness was interrupted (Ctrl-C or SIGTERM)")
        raise
    seconds = time.monotonic() - t0
    kill_group(proc.pid, proc, lambda: reap_dead(ours, token))
    kill_strays(ours, token)
    return rc, seconds, False


def start(argv, env, **popen):
    """subprocess.Popen(argv, **popen) in a session of its own, env plus a new run token (which run a stray belongs
    to: other runs may be in flight on other devices), registered as in flight (token -> its pid) in the same step:
    no run's scan for strays ever takes it or its exit status for its own (a hostile review: a crash read as rc 0,
    and the harness's own process killed with a run). Returns (the Popen, the token); done(token) when it is waited
    for (run_process's kill_strays does it)."""
    token = uuid.uuid4().hex
    with _LIVE_LOCK:                        # a scan reads _LIVE after listing our children: it waits for this
        proc = subprocess.Popen(argv, env={**env, RUN_TOKEN: token}, start_new_session=True, **popen)
        _LIVE[token] = proc.pid
    return proc, token


def done(token):
    """The process started with this token is waited for: no longer in flight."""
    with _LIVE_LOCK:
        _LIVE.pop(token, None)


def killed(log, seconds, why):
    """The last line of a run's log (log: its binary file object) when the harness killed the run: why, and after
    how long, so that a log cut mid-step is not read as a crash of its own."""
    try:
        log.write(f"\n=== killed by the harness after {seconds:.0f}s: {why} ===\n".encode())
        log.flush()
    except OSError:                 # a full disk: the kill itself is what matters
        pass


def wait(proc, timeout, peak=None):
    """proc.wait(timeout) (raises subprocess.TimeoutExpired), but with peak the leader is reaped by os.wait4 (polled
    as Popen.wait polls) so that its rusage joins peak; proc.returncode is then set as Popen sets it."""
    if peak is None or not hasattr(os, "wait4"):
        return proc.wait(timeout=timeout)
    deadline, delay = time.monotonic() + timeout, 0.0005
    while proc.returncode is None:
        try:
            pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:           # reaped elsewhere: Popen knows its return code (or says 0, as it does)
            return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        if pid == proc.pid:
            peak.reaped(rusage)
            proc.returncode = os.waitstatus_to_exitcode(status)
            break
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        time.sleep(min(delay, left, 0.05))
        delay *= 2
    return proc.returncode


def become_subreaper():
    """Linux: make this process the subreaper of everything it starts, so that a process a run detaches from its
    process group (double fork + setsid, which kill_group cannot reach) is re-parented to us, not to init, and
    kill_strays finds it. Returns False where that is not possible (then such a process outlives the run)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0   # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def children():
    """The pids whose parent is this process: /proc/self/task/*/children where the kernel has it (one read per
    thread), else a scan of /proc; empty where there is no /proc."""
    found = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            found.update(int(pid) for pid in Path("/proc/self/task", tid, "children").read_text().split())
        return found
    except (OSError, ValueError):
        found.clear()
    me = os.getpid()
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]   # a glob raised when a process vanished
    except OSError:
        return found
    for pid in pids:
        stat = _stat(int(pid))
        if stat is not None and stat.ppid == me:
            found.add(int(pid))
    return found


class Stat(NamedTuple):
    """A process's fields from /proc/PID/stat (proc(5)): state ("Z" for a zombie), parent, process group, session."""
    state: str
    ppid: int
    pgrp: int
    session: int


def _stat(pid):
    """The Stat of pid, or None once it is gone (or where there is no /proc)."""
    try:
        fields = Path("/proc", str(pid), "stat").read_text().rsplit(")", 1)[1].split()
        return Stat(fields[0], int(fields[1]), int(fields[2]), int(fields[3]))
    except (OSError, IndexError, ValueError):
        return None


def strays(ours, token):
    """The run's processes among our children, {pid: Stat}: every child that was not one before the run (ours) and
    is no run's leader in flight (Popen reads its status), known as the run's by its token, or by its session (see
    _stray)."""
    found = children() - ours
    with _LIVE_LOCK:                        # read after the scan: start() registers a process with its Popen
        others = dict(_LIVE)
    sessions = {leader for run, leader in others.items() if run != token} | {os.getsid(0)}   # not the run's
    stats = {pid: _stat(pid) for pid in found - set(others.values())}
    return {pid: stat for pid, stat in stats.items()
            if stat is not None and _stray(pid, stat.session not in sessions, token, others)}


def reap_dead(ours, token):
    """Reap the run's zombies now (while it runs): a run that forks and exits in a loop, its dead re-parented to us
    (become_subreaper), would fill the PID table long before its end (a hostile review: 32,447 zombies after 9
    runs, then no process could start)."""
    for pid, stat in strays(ours, token).items():
        if stat.state == "Z":
            _reap(pid)


def _reap(pid):
    """waitpid(pid) without blocking (a process whose main thread exited shows as a zombie while its other threads
    run: a blocking wait would stop the run's ticks, its timeout included). Returns whether it was reaped."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return False


def kill_strays(ours, token, limit=STRAYS_S):
    """SIGKILL and reap every child of ours that was not one before the run and is the run's: a detached descendant
    re-parented to us (become_subreaper), known by this run's token in its environment, or, having none (or dead),
    by its session (a run starts a session of its own; git and whatever else this process starts meanwhile share
    ours, and another run's processes carry that run's token). Each one's process group goes too, when it is not
    ours: a chain that forks and exits is one group, killed at once, where killing its member of the moment would
    miss the child it forked meanwhile. Looks again until a look finds none, for at most limit seconds. Only those
    pids are waited for. Returns whether none was left."""
    done(token)
    mine = (os.getpgid(0), os.getsid(0))
    deadline = time.monotonic() + limit
    while True:
        found = strays(ours, token)
        if not found:
            return True
        for pid, stat in found.items():
            if stat.pgrp not in mine and stat.session not in mine and stat.pgrp > 1:
                _signal(os.killpg, stat.pgrp)
            for each in _descendants(pid):      # a chain whose every level stays alive in a session of its own
                _signal(os.kill, each)
        if not sum(_reap(pid) for pid in found):
            time.sleep(0.01)                    # killed, not dead yet: look again
        if time.monotonic() >= deadline:
            return not strays(ours, token)


def _signal(kill, target, sig=signal.SIGKILL):
    """kill(target, sig), quiet when the target is gone or not ours to signal; returns whether it was sent."""
    try:
        kill(target, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _descendants(pid, most=100_000):
    """pid and its descendants (read from /proc/PID/task/*/children), each stopped (SIGSTOP) before its children are
    read so that none forks while the tree is walked (a hostile review: a chain of 6,000 live levels, one level
    killed per look, outlived the run)."""
    found, todo = [], [pid]
    while todo and len(found) < most:
        each = todo.pop()
        if not _signal(os.kill, each, signal.SIGSTOP):
            continue
        found.append(each)
        try:
            for task in os.listdir(f"/proc/{each}/task"):
                todo.extend(int(child) for child in Path(f"/proc/{each}/task/{task}/children").read_text().split())
        except (OSError, ValueError):
            pass
    return found


def _stray(pid, by_session, token, others):
    """Whether our child pid belongs to the run with this token (see kill_strays); others: the runs in flight, token
    -> leader; by_session: whether its session is neither ours nor another run's (a run's leader starts a session
    of its own), which says for a process without a token, or whose environment cannot be read (a zombie's)."""
    try:
        env = dict(item.split(b"=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                   if b"=" in item)
    except (ProcessLookupError, PermissionError):   # a zombie's (ESRCH); a non-dumpable one's, unless we are root
        env = {}
    except OSError:
        return False
    theirs = env.get(RUN_TOKEN.encode(), b"").decode(errors="replace")
    if theirs:
        return theirs == token or theirs not in others
    return by_session


def kill_group(pgid, proc=None, reap=None):
    """SIGTERM the process group, SIGKILL it after KILL_GRACE_S, and wait (up to the grace) until it is gone. A dead
    member that is our child stays a member until reaped: proc (the leader) is polled, and reap() reaps the others
    (a run's descendant re-parented to us: else each end of such a run waited out both graces, 10 s)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + KILL_GRACE_S
        while time.monotonic() < deadline:
            if proc is not None:
                proc.poll()                  # reap the leader, else it stays a zombie member of the group
            if reap is not None:
                reap()
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
