"""
HARNESS: every device busy. The devices experiments run on (--devices: CUDA indices or cpu:K workers on this
machine; --ray: the GPUs of a Ray cluster), the worker threads that train candidates on them while agent.py's loop
proposes and records, and the throughput that gives (experiments per hour, device busy share, proposal wait). One
process, agent.py, owns git, results.tsv and events.jsonl: a worker only trains, evaluates and returns an Outcome
(harness.session.train_candidate does the bookkeeping around it under the session's lock).
"""

import concurrent.futures
import dataclasses
import re
import threading
import time


@dataclasses.dataclass
class Device:
    """One place a run can go. Its runs get env added (CUDA_VISIBLE_DEVICES) and `threads` as
    AUTORESEARCH_THREADS, and evaluate from their own pristine copy of the target (frozen: a directory name in the
    tag's harness dir). remote: the Ray backend (harness.cluster.RayBackend) of a cluster slot, None here."""
    name: str                       # "default", "cuda:3", "cpu:1", "ray:0"
    env: dict
    threads: int
    frozen: str = "frozen"
    remote: object = None
    busy_s: float = 0.0             # seconds it spent running (training, evaluation, confirmations) this invocation
    since: float | None = None      # when the job in flight on it started (monotonic), None when it is free


def parse_devices(spec, threads):
    """--devices: None -> this machine as it is (one device); "0,1,3" -> one device per CUDA index (each run sees
    only its GPU through CUDA_VISIBLE_DEVICES); "cpu:K" -> K CPU workers sharing this machine's `threads` CPU
    threads (each run gets threads // K, and no GPU). Raises ValueError naming the mistake."""
    if spec is None:
        return [Device("default", {}, threads)]
    if m := re.fullmatch(r"cpu:(\d+)", spec.strip()):
        k = int(m.group(1))
        if not 1 <= k <= threads:
            raise ValueError(f"--devices {spec}: between cpu:1 and cpu:{threads} (this machine's {threads} CPU "
                             "threads; each worker needs one)")
        return [Device(f"cpu:{i}", {"CUDA_VISIBLE_DEVICES": ""}, threads // k, frozen_name(i)) for i in range(k)]
    indices = [part.strip() for part in spec.split(",")]
    if not all(re.fullmatch(r"\d+", i) for i in indices) or len(set(indices)) != len(indices):
        raise ValueError(f"--devices {spec!r}: give distinct CUDA device indices (e.g. 0,1,2,3) or cpu:K for K CPU "
                         "workers (e.g. cpu:2)")
    return [Device(f"cuda:{i}", {"CUDA_VISIBLE_DEVICES": i}, max(1, threads // len(indices)), frozen_name(j))
            for j, i in enumerate(indices)]


def frozen_name(i):
    """The pristine evaluator copy of device i: the first keeps the tag's frozen/, which report.py --holdout uses."""
    return "frozen" if i == 0 else f"frozen-{i}"


@dataclasses.dataclass
class Throughput:
    """How busy the devices are (this invocation): experiments recorded per wall hour, each device's busy share
    (seconds running / wall seconds since the pool started) and the proposal wait (device-seconds spent idle
    because no proposal was ready: the LLM was still thinking)."""
    experiments_per_hour: float
    busy: dict                      # device name -> share in [0, 1]
    proposal_wait_s: float
    wall_s: float

    def short(self):
        """For the status line: '12.3 exp/h, busy 97%, wait 14s'."""
        busy = sum(self.busy.values()) / max(1, len(self.busy))
        return f"{self.experiments_per_hour:.1f} exp/h, busy {busy:.0%}, wait {self.proposal_wait_s:.0f}s"

    def line(self):
        """For the end of a run: every figure in words."""
        busy = ", ".join(f"{name} {share:.0%}" for name, share in self.busy.items())
        return (f"throughput: {self.experiments_per_hour:.1f} experiments/hour; device busy {busy}; proposal wait "
                f"{self.proposal_wait_s:.0f} device-seconds over {self.wall_s:.0f}s")

    def fields(self):
        """For an event: rounded numbers."""
        return dict(experiments_per_hour=round(self.experiments_per_hour, 3),
                    busy={k: round(v, 4) for k, v in self.busy.items()},
                    proposal_wait_s=round(self.proposal_wait_s, 3), wall_s=round(self.wall_s, 3))


class Pool:
    """Worker threads, one per device: submit(fn, job) runs fn(device, job) on a free device; done() waits for the
    next to finish. The caller (agent.py's loop, the main thread) alone decides what runs and records verdicts."""

    def __init__(self, devices, experiments_before):
        self.devices = list(devices)
        self.free = list(devices)
        self.running = {}               # future -> (device, job)
        self.executor = concurrent.futures.ThreadPoolExecutor(len(devices), thread_name_prefix="device")
        self.cancel = threading.Event()  # set: every run in flight is killed at its next tick
        # CPU workers share this machine's cores and disk: their start-up (imports, compile) slows down together
        self.cpu_workers = len(devices) if all(d.name.startswith("cpu:") for d in devices) else 1
        self.started = time.monotonic()
        self.before = experiments_before
        self.wait_s = 0.0

    def submit(self, fn, job):
        """Start fn(device, job) on the first free device (there must be one). Returns the device."""
        device = self.free.pop(0)
        self.running[self.executor.submit(self._work, fn, device, job)] = (device, job)
        return device

    def _work(self, fn, device, job):
        device.since = time.monotonic()
        try:
            return fn(device, job)
        finally:
            device.busy_s += time.monotonic() - device.since
            device.since = None

    def done(self):
        """Wait until at least one job finishes; returns [(job, result)] (a job's exception is raised here)."""
        finished, _ = concurrent.futures.wait(self.running, return_when=concurrent.futures.FIRST_COMPLETED)
        results = []
        for future in finished:
            device, job = self.running.pop(future)
            self.free.append(device)
            results.append((job, future.result()))
        return results

    def waited(self, seconds):
        """The loop spent `seconds` waiting for the proposer: each device free meanwhile waited that long."""
        self.wait_s += seconds * len(self.free)

    def throughput(self, experiments):
        """The Throughput now, given the number of experiments recorded so far (the tag's, baseline included)."""
        wall = max(1e-9, time.monotonic() - self.started)
        now = time.monotonic()
        busy = {d.name: min(1.0, (d.busy_s + (now - d.since if d.since is not None else 0.0)) / wall)
                for d in self.devices}
        return Throughput(3600 * (experiments - self.before) / wall, busy, self.wait_s, wall)

    def close(self):
        """Stop: every run in flight is killed (the runner kills its process group), the threads are joined."""
        self.cancel.set()
        for future in list(self.running):
            try:
                future.result()
            except BaseException:
                pass
        self.executor.shutdown(wait=True)
