"""
HARNESS: a Ray cluster as the devices of agent.py's loop (--ray). agent.py stays the one driver that owns git and
the ledger; each run becomes a Ray task that needs one GPU (one CPU on a cluster without GPUs). The task is
harness.run.node's body, which every backend that runs elsewhere shares: it receives the candidate's files (its commit's
tree, never your checkout) and the pristine evaluator, prepares data with the frozen prepare.py when its node has
none, checks that the node's frozen inputs are the ones the tag recorded, trains (in bubblewrap where the node has it)
and runs the separate evaluation there, and returns the Outcome, the run's log, the artifact's sha256 and the
artifact itself (up to node.ARTIFACT_BACK_BYTES, for the holdout). This module adds what is Ray's: connecting, the
task's resources, waiting, and a lost worker (node gone, process killed) retried once, then recorded as a crash.

    ray start --head                           # on the first machine (then: ray start --address=<head>:6379)
    uv run agent.py --tag dec1 --ray auto      # or --ray <head>:6379
"""

import dataclasses
import logging
import os
import socket
import time
from pathlib import Path

from harness.run import node
from harness.errors import SetupError
from harness.run.pool import Device
from harness.run.runner import Kind
from harness.schema import Event

CONNECT_TIMEOUT_S = 5.0         # --ray HOST:PORT must accept a TCP connection this fast
TICK_S = 1.0                    # how often the driver looks at a task in flight (status line, Ctrl-C)


@dataclasses.dataclass(frozen=True)
class RaySource:
    """--ray as a harness.run.pool.DeviceSource: the cluster's slots (connect). release keeps the Ray session: it is
    this process's (a caller's own session is used as it is), and ends with it."""
    address: str
    context: dict

    def acquire(self):
        return connect(self.address, self.context)

    def release(self):
        pass


def connect(address, context):
    """Join the Ray cluster at address ("auto": the one `ray start` made on this machine; a Ray session this
    process already opened is used as it is). Returns one Device per GPU of the cluster (per CPU when it has none),
    each running through a RayBackend with `context` (see there). Raises SetupError when Ray is missing or no
    cluster answers."""
    # workers get each run's files from us, never a copy of this checkout (Ray's `uv run` hook would ship it whole,
    # untracked files and all); Ray reads this when it is imported
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    try:
        import ray
    except ImportError:
        raise SetupError("--ray needs Ray: `uv sync --extra cluster`, then rerun") from None
    if address != "auto" and not ray.is_initialized():      # Ray itself retries a dead address for minutes
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S).close()
        except (OSError, ValueError) as e:
            raise SetupError(f"--ray {address}: nothing answers there ({e}): give the head node's HOST:PORT (6379 "
                             "unless `ray start --head --port` said otherwise), or start one (docs/parallel.md)") from None
    if not ray.is_initialized():
        try:
            ray.init(address=address, log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING,
                     runtime_env={"py_modules": [str(Path(__file__).resolve().parents[1])],
                                  "env_vars": node_env()})
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise SetupError(f"--ray {address}: no Ray cluster answered ({e}). Start one with `ray start --head` "
                             "(docs/parallel.md), or give its address. Ray >= 2.50 authenticates with a token by "
                             "default: a driver that connects by address needs RAY_AUTH_MODE=token and the head's "
                             "~/.ray/auth_token") from None
    resources = ray.cluster_resources()
    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
    backend = RayBackend(ray, gpus > 0, context)
    slots = gpus or cpus
    if slots < 1:
        raise SetupError(f"--ray {address}: the cluster has no GPU and no CPU to run on ({resources})")
    return [Device(f"ray:{i}", {}, 1, f"frozen-ray{i}", remote=backend) for i in range(slots)]


def node_env():
    """Environment variables the tasks get on every node: this process's AUTORESEARCH_CACHE (and other
    AUTORESEARCH_* settings but the per-run ones), so that a node that is this machine, or shares its disk, uses the
    data the driver uses; a node where the path does not exist falls back to its own default (node.ready)."""
    per_run = ("AUTORESEARCH_TIME_BUDGET", "AUTORESEARCH_SEED", "AUTORESEARCH_THREADS", "AUTORESEARCH_ARTIFACT")
    return {k: v for k, v in os.environ.items() if k.startswith("AUTORESEARCH_") and k not in per_run}


class RayBackend:
    """A backend (harness.run.backends) whose runs are Ray tasks, one GPU each (one CPU on a cluster without GPUs).
    context: what every task needs besides its Spec: the tag's --sandbox, --source and profile, and the paths to
    hide on the nodes too (the driver's repository and git dir: the best's artifact, every log, the ledger; the
    driver's machine can be a node)."""

    def __init__(self, ray, gpus, context):
        self.ray, self.gpus, self.context = ray, gpus, context
        self.task = ray.remote(node.run)

    def run(self, spec, watch):
        """Submit the run, wait for it (ticking; Ctrl-C cancels it), retry once when the worker is lost. Writes the
        run's log to spec.log. Returns the runner's Outcome (kind LOST after two lost workers)."""
        ray, lost, payload = self.ray, [], node.payload(spec, self.context)
        watch.started(None)
        for retry in range(2):
            options = {"num_gpus": 1} if self.gpus else {"num_cpus": 1}
            ref = self.task.options(max_retries=0, **options).remote(payload)
            t0 = time.monotonic()
            try:
                while not ray.wait([ref], timeout=TICK_S)[0]:
                    watch.tick(time.monotonic() - t0)
                result = ray.get(ref)
            except BaseException as e:
                if isinstance(e, ray.exceptions.RayTaskError):       # a bug in the task itself: a crash
                    return node.crashed(spec, Kind.CRASH, f"crash: the Ray task failed: {str(e).splitlines()[0][:300]}")
                if not isinstance(e, ray.exceptions.RayError):       # Ctrl-C, or the loop stopping
                    ray.cancel(ref, force=True)
                    raise
                lost.append(f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                watch.event(Event.WORKER_LOST, retry=retry, error=lost[-1])
                continue
            return node.received(spec, watch, result)
        return node.crashed(spec, Kind.LOST, f"lost: the Ray worker was lost twice ({'; '.join(lost)})")
