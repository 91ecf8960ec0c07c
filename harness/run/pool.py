"""
HARNESS: every device busy. The devices experiments run on (--devices: CUDA indices or cpu:K workers on this
machine; --ray: the GPUs of a Ray cluster), the worker threads that train candidates on them while agent.py's loop
proposes and records, and the throughput that gives (experiments per hour, device busy share, proposal wait). One
process, agent.py, owns git, results.tsv and events.jsonl: a worker only trains, evaluates and returns an Outcome
(harness.record.experiment.train does the bookkeeping around it under the session's lock).
"""

import concurrent.futures
import contextlib
import dataclasses
import itertools
import os
import queue
import re
import signal
import sys
import threading
import time
import typing
from pathlib import Path

from harness.errors import SetupError
from harness.run import phases

# The CPU thread count of every run (train.py and the evaluator, through AUTORESEARCH_THREADS): fixed, so that CPU
# runs are comparable; the cores this process may use.
THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclasses.dataclass
class Device:
    """One place a run can go. Its runs get env added (CUDA_VISIBLE_DEVICES) and `threads` as
    AUTORESEARCH_THREADS, and evaluate from their own pristine copy of the target (frozen: a directory name in the
    tag's harness dir). remote: the Ray backend (harness.run.cluster.RayBackend) of a cluster slot, None here."""
    name: str                       # "default", "cuda:3", "cpu:1", "ray:0"
    env: dict
    threads: int
    frozen: str = "frozen"
    remote: object = None
    busy_s: float = 0.0             # seconds it spent running (training, evaluation, confirmations) this invocation
    since: float | None = None      # when the job in flight on it started (monotonic), None when it is free
    phases: dict = dataclasses.field(default_factory=dict)   # its runs' {phase: seconds} (harness.run.phases)
    last_probe: tuple | None = None   # (the probe after its last run, when it ended: monotonic), for the next run


class DeviceSource(typing.Protocol):
    """Where an invocation's devices come from: --devices on this machine (Local), a Ray cluster's slots (--ray:
    harness.run.cluster.RaySource), or a scheduler's allocation (a class of its own, in one file). agent.py acquires
    them once, before the tag opens, and releases them however the invocation ends (`acquired`)."""

    def acquire(self):
        """The Devices the runs go to (a list, at least one). Raises SetupError naming the problem and the fix."""

    def release(self):
        """Give them back (after the last run has ended)."""


@dataclasses.dataclass(frozen=True)
class Local:
    """--devices on this machine (parse_devices); nothing to give back."""
    spec: str | None
    threads: int

    def acquire(self):
        try:
            return parse_devices(self.spec, self.threads)
        except ValueError as e:
            raise SetupError(str(e)) from None

    def release(self):
        pass


@contextlib.contextmanager
def acquired(source):
    """The with block gets source.acquire()'s devices; source.release() runs after it, however it ends."""
    devices = source.acquire()
    try:
        yield devices
    finally:
        source.release()


def parse_devices(spec, threads, gpus=None):
    """--devices: None -> this machine as it is (one device); "0,1,3" (or "cuda:0,cuda:1") -> one device per CUDA
    index (each run sees only its GPU through CUDA_VISIBLE_DEVICES); "cpu:K" -> K CPU workers sharing this machine's
    `threads` CPU threads (each run gets threads // K, and no GPU). gpus: how many NVIDIA GPUs this machine has
    (default: nvidia_gpus()); CUDA indices on a machine with none are refused. Raises ValueError naming the
    mistake."""
    if spec is None:
        return [Device("default", {}, threads)]
    if m := re.fullmatch(r"cpu:(\d+)", spec.strip()):
        k = int(m.group(1))
        if not 1 <= k <= threads:
            raise ValueError(f"--devices {spec}: between cpu:1 and cpu:{threads} (this machine's {threads} CPU "
                             "threads; each worker needs one)")
        return [Device(f"cpu:{i}", {"CUDA_VISIBLE_DEVICES": ""}, threads // k, frozen_name(i)) for i in range(k)]
    indices = [part.strip().removeprefix("cuda:") for part in spec.split(",")]
    if not all(re.fullmatch(r"\d+", i) for i in indices) or len(set(indices)) != len(indices):
        raise ValueError(f"--devices {spec!r}: give distinct CUDA device indices (e.g. 0,1,2,3) or cpu:K for K CPU "
                         "workers (e.g. cpu:2)")
    gpus = nvidia_gpus() if gpus is None else gpus
    if gpus == 0:
        raise ValueError(f"--devices {spec}: this machine has no NVIDIA GPU (no /dev/nvidia0, ...): use cpu:K for "
                         "K CPU workers, or leave --devices out")
    return [Device(f"cuda:{i}", {"CUDA_VISIBLE_DEVICES": i}, max(1, threads // len(indices)), frozen_name(j))
            for j, i in enumerate(indices)]


def nvidia_gpus():
    """How many NVIDIA GPUs this machine shows (/dev/nvidia0, /dev/nvidia1, ...); None where that cannot be told
    (not Linux: no check)."""
    if not sys.platform.startswith("linux"):
        return None
    return sum(1 for p in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name))


def frozen_name(i):
    """The pristine evaluator copy of device i: the first keeps the tag's frozen/, which report.py --holdout uses."""
    return "frozen" if i == 0 else f"frozen-{i}"


# How old the probe after a run may be to stand for the next run's probe before (Pool.shared_probe): long enough for
# an LLM's answer between two experiments (20 s for a reasoning model), short enough that the device's conditions
# are those the probe measured.
SHARED_PROBE_S = 60.0


@dataclasses.dataclass
class Throughput:
    """How busy the devices are (this invocation): experiments recorded per wall hour, each device's busy share
    (seconds running / wall seconds since the pool started) and the proposal wait (device-seconds spent idle
    because no proposal was ready: the LLM was still thinking)."""
    experiments_per_hour: float
    busy: dict                      # device name -> share in [0, 1]
    proposal_wait_s: float
    wall_s: float
    phases: dict = dataclasses.field(default_factory=dict)   # phase -> share of the devices' wall time (sums to 1)

    def short(self):
        """For the status line: '12.3 exp/h, busy 97%, training 88%, wait 14s'."""
        busy = sum(self.busy.values()) / max(1, len(self.busy))
        return (f"{self.experiments_per_hour:.1f} exp/h, busy {busy:.0%}, training {self.phases.get('training', 0):.0%}"
                f", wait {self.proposal_wait_s:.0f}s")

    def line(self):
        """For the end of a run: every figure in words."""
        busy = ", ".join(f"{name} {share:.0%}" for name, share in self.busy.items())
        return (f"throughput: {self.experiments_per_hour:.1f} experiments/hour; device busy {busy}; proposal wait "
                f"{self.proposal_wait_s:.0f} device-seconds over {self.wall_s:.0f}s; wall time: "
                f"{phases.words(self.phases)}")

    def fields(self):
        """For an event: rounded numbers."""
        return dict(experiments_per_hour=round(self.experiments_per_hour, 3),
                    busy={k: round(v, 4) for k, v in self.busy.items()},
                    proposal_wait_s=round(self.proposal_wait_s, 3), wall_s=round(self.wall_s, 3),
                    phases={k: round(v, 4) for k, v in self.phases.items()})


class Pool:
    """Worker threads, one per device: submit(fn, job) runs fn(device, job) on a free device; done() waits for the
    next to finish. The caller (agent.py's loop, the main thread) alone decides what runs and records verdicts.
    Finished jobs come back through a queue: the main thread only ever waits in Queue.get, which a Ctrl-C interrupts
    cleanly (concurrent.futures.wait can be left holding half its locks). A Ctrl-C can also be handled just after get took
    a job off the queue (the put wakes the main thread, which runs a pending handler at its next check): close()
    therefore waits for the threads, never on the queue."""

    def __init__(self, devices, experiments_before):
        self.devices = list(devices)
        self.free = list(devices)
        self.running = {}               # key -> (device, job)
        self.finished = queue.Queue()   # (key, result, exception) of each job that ended
        self.keys = itertools.count()
        self.executor = concurrent.futures.ThreadPoolExecutor(len(devices), thread_name_prefix="device")
        self.cancel = threading.Event()  # set: every run in flight is killed at its next tick
        # CPU workers share this machine's cores and disk: their start-up (imports, compile) slows down together
        self.cpu_workers = len(devices) if all(d.name.startswith("cpu:") for d in devices) else 1
        self.started = time.monotonic()
        self.before = experiments_before
        self.wait_s = 0.0

    def submit(self, fn, job):
        """Start fn(device, job) on the first free device (there must be one). Returns the device."""
        device, key = self.free.pop(0), next(self.keys)
        self.running[key] = (device, job)
        self.executor.submit(self._work, fn, device, job, key)
        return device

    def _work(self, fn, device, job, key):
        device.since = time.monotonic()
        result, error = None, None
        try:
            result = fn(device, job)
        except BaseException as e:      # handed to the main thread, which raises it
            error = e
        device.busy_s += time.monotonic() - device.since
        device.since = None
        self.finished.put((key, result, error))

    def done(self):
        """Wait until at least one job finishes; returns [(job, result)] (a job's exception is raised here)."""
        ended = [self.finished.get()]
        while not self.finished.empty():
            ended.append(self.finished.get())
        results, error = [], None
        for key, result, e in ended:
            device, job = self.running.pop(key)
            self.free.append(device)
            results.append((job, result))
            error = error or e
        if error is not None:
            raise error
        return results

    def waited(self, seconds):
        """The loop spent `seconds` waiting for the proposer: each device free meanwhile waited that long."""
        self.wait_s += seconds * len(self.free)

    def throughput(self, experiments):
        """The Throughput now, given the number of experiments recorded so far (the tag's, baseline included). Its
        phases: the runs' phases summed over the devices, the rest of their busy time "harness" (the verdict, the
        bookkeeping around a run), a job still running "in flight", the time no job ran "idle"; shares of the
        devices' wall time together."""
        now = time.monotonic()
        wall = max(1e-9, now - self.started)
        busy, spent = {}, {}
        for d in self.devices:
            flight = now - d.since if d.since is not None else 0.0
            busy[d.name] = min(1.0, (d.busy_s + flight) / wall)
            phases.add(spent, d.phases)
            phases.add(spent, {"harness": max(0.0, d.busy_s - sum(d.phases.values())), "in flight": flight,
                               "idle": max(0.0, wall - d.busy_s - flight)})
        shares = {k: spent[k] / (wall * len(self.devices)) for k in phases.PHASES if spent.get(k)}
        return Throughput(3600 * (experiments - self.before) / wall, busy, self.wait_s, wall, shares)

    def shared_probe(self, device, sandboxed=True):
        """The probe before a run on device, already measured: the probe after its previous run, if this pool has
        one device (no other run can have changed its conditions since), that probe was taken at most SHARED_PROBE_S
        ago (its separate evaluation included), it gave a number, and runs are sandboxed (unsandboxed, a train.py's
        detached processes can outlive its run into its probe after, to be handed to its successor). Each probe
        after serves one run. Returns (seconds, "") or None (probe again)."""
        found, device.last_probe = device.last_probe, None
        if found is None or len(self.devices) != 1 or found[0] is None or device.remote is not None or not sandboxed:
            return None
        return (found[0], "") if time.monotonic() - found[1] <= SHARED_PROBE_S else None

    def ran(self, device, outcome):
        """A run on device ended (the worker's thread): its phases counted, its probe after kept for the next."""
        phases.add(device.phases, outcome.phases)
        device.last_probe = (outcome.probe_after, outcome.probe_after_at or 0.0)

    def close(self):
        """Stop: every run in flight is killed (the runner kills its process group at its next tick), the threads
        are joined. A second Ctrl-C or SIGTERM meanwhile is ignored (this is the cleanup of the first)."""
        self.cancel.set()
        main = threading.current_thread() is threading.main_thread()
        handlers = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            self.executor.shutdown(wait=True)     # every job has ended, whether or not done() took it off the queue
            self.free.extend(device for device, _ in self.running.values())
            self.running.clear()
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
