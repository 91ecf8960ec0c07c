"""
HARNESS: a Ray cluster as the devices of agent.py's loop (--ray). agent.py stays the one driver that owns git and
the ledger; each run becomes a Ray task that needs one GPU (one CPU on a cluster without GPUs). The task receives
the candidate's files (its commit's tree, never your checkout) and the pristine evaluator, prepares data with the
frozen prepare.py when its node has none, checks that the node's frozen inputs are the ones the tag recorded, trains
(in bubblewrap where the node has it) and runs the separate evaluation there, and returns the Outcome, the run's log,
the artifact's sha256 and the artifact itself (up to ARTIFACT_BACK_BYTES, for the holdout). A lost worker (node
gone, process killed) is retried once, then recorded as a crash.

    ray start --head                           # on the first machine (then: ray start --address=<head>:6379)
    uv run agent.py --tag dec1 --ray auto      # or --ray <head>:6379
"""

import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from harness import conditions, runner, sandbox
from harness.errors import SetupError
from harness.pool import Device
from harness.redact import clean_env
from harness.runner import Kind
from harness.target import FROZEN
from harness.schema import Event

CONNECT_TIMEOUT_S = 5.0         # --ray HOST:PORT must accept a TCP connection this fast
TICK_S = 1.0                    # how often the driver looks at a task in flight (status line, Ctrl-C)
ARTIFACT_BACK_BYTES = 1 << 30   # a model artifact up to this size comes back to the driver (report.py --holdout)


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
                     runtime_env={"py_modules": [str(Path(__file__).resolve().parent)],
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
    data the driver uses; a node where the path does not exist falls back to its own default (node_ready)."""
    per_run = ("AUTORESEARCH_TIME_BUDGET", "AUTORESEARCH_SEED", "AUTORESEARCH_THREADS", "AUTORESEARCH_ARTIFACT")
    return {k: v for k, v in os.environ.items() if k.startswith("AUTORESEARCH_") and k not in per_run}


class RayBackend:
    """A backend (harness.backends) whose runs are Ray tasks, one GPU each (one CPU on a cluster without GPUs).
    context: what every task needs besides its Spec: the tag's --sandbox, --source and profile, and the paths to
    hide on the nodes too (the driver's repository and git dir: the best's artifact, every log, the ledger; the
    driver's machine can be a node)."""

    def __init__(self, ray, gpus, context):
        self.ray, self.gpus, self.context = ray, gpus, context
        self.task = ray.remote(remote_run)

    def payload(self, spec):
        """What a worker needs to run spec: the files, the settings, the environment (its artifact path is the
        worker's own). Read here, in the device's thread: the run dir and the device's frozen copy are its alone."""
        spec.fresh_frozen()
        ev = spec.evaluation
        payload = dict(files=read_tree(spec.run_dir), frozen=read_tree(spec.frozen_dir), metric=spec.metric,
                       timeout=spec.timeout, env={k: v for k, v in spec.env.items() if k != "AUTORESEARCH_ARTIFACT"},
                       budget=spec.budget, max_wall=spec.max_wall, probe=spec.probe, cancel=spec.cancel,
                       evaluation=ev and {k: ev.get(k) for k in ("digest", "tolerance", "artifact", "timeout")},
                       **self.context)
        shutil.rmtree(spec.run_dir, ignore_errors=True)
        return payload

    def run(self, spec, watch):
        """Submit the run, wait for it (ticking; Ctrl-C cancels it), retry once when the worker is lost. Writes the
        run's log to spec.log. Returns the runner's Outcome (kind LOST after two lost workers)."""
        ray, lost, payload = self.ray, [], self.payload(spec)
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
                    return crashed(spec, Kind.CRASH, f"crash: the Ray task failed: {str(e).splitlines()[0][:300]}")
                if not isinstance(e, ray.exceptions.RayError):       # Ctrl-C, or the loop stopping
                    ray.cancel(ref, force=True)
                    raise
                lost.append(f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                watch.event(Event.WORKER_LOST, retry=retry, error=lost[-1])
                continue
            Path(spec.log).write_bytes(result["log"])
            watch.event(Event.REMOTE, node=result["node"], artifact_sha256=result["artifact_sha256"])
            if result.get("artifact") is not None:            # kept like a local run's, for the holdout
                with tempfile.TemporaryDirectory() as scratch:
                    write_tree(result["artifact"], scratch)
                    watch.keep_artifact(Path(scratch) / spec.evaluation["artifact"])
            result["outcome"].commit = spec.commit
            return result["outcome"]
        return crashed(spec, Kind.LOST, f"lost: the Ray worker was lost twice ({'; '.join(lost)})")


def crashed(spec, kind, reason):
    """An Outcome with no metric for a run that never returned one; its log says why."""
    Path(spec.log).write_text(reason + "\n")
    return runner.Outcome(commit=spec.commit, metric=None, memory_gb=0.0, seconds=0.0, log_tail=reason).fail(kind,
                                                                                                          reason)


def read_tree(folder):
    """{relative path: bytes} of every file under folder."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write_tree(files, folder):
    """Write read_tree's {relative path: bytes} under folder."""
    for rel, data in files.items():
        path = Path(folder) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def remote_run(payload):
    """On a Ray worker: one run of a candidate, as experiment.train does it on the driver's machine (runner.run with the
    sandbox and the separate evaluation), in a scratch directory removed afterwards. Returns {"outcome", "log" (bytes),
    "node", "artifact_sha256"}."""
    work = Path(tempfile.mkdtemp(prefix="autoresearch-ray-"))
    run_dir, frozen, log, node_log = work / "run", work / "frozen", work / "run.log", work / "node.log"
    try:
        write_tree(payload["files"], run_dir)
        write_tree(payload["frozen"], frozen)
        problem, inputs = node_ready(frozen, payload, node_log)   # its output leads the run's log
        if problem:
            return no_run(problem, node_log)
        ev = payload["evaluation"]
        artifact = run_dir / (ev or {}).get("artifact", "artifact")
        env = dict(payload["env"])
        sandboxed = payload["sandbox"] != "off" and sandbox.probe() is None
        wrap, eval_wrap = node_wraps(sandboxed, run_dir, frozen, artifact, inputs, payload)
        if sandboxed:
            env.update(sandbox.scratch_env())
        elif payload["sandbox"] == "bwrap":
            return no_run((Kind.NODE, f"node: --sandbox bwrap, but bubblewrap does not work on node "
                                      f"{socket.gethostname()}"), node_log)
        env["AUTORESEARCH_ARTIFACT"] = str(artifact)
        evaluation = ev and runner.Evaluation(prepare_dir=frozen, artifact=artifact, digest=ev["digest"],
                                              tolerance=ev["tolerance"], own_required=not sandboxed,
                                              wrap=eval_wrap, timeout=ev.get("timeout"))
        spec = runner.RunSpec(commit="", cwd=run_dir, log=log, metric=payload["metric"], timeout=payload["timeout"],
                              frozen=FROZEN, env=env, wrap=wrap, budget=payload["budget"],
                              max_wall=payload["max_wall"], evaluation=evaluation, cancel=payload.get("cancel"),
                              probe=conditions.Probe(runner.interpreter(), frozen, eval_wrap, {**clean_env(), **env})
                              if payload["probe"] else None)
        outcome = runner.run(spec)
        digest, back = None, None
        if artifact.exists():                       # a file, or a folder (GRPO's weights)
            files = read_tree(run_dir) if artifact.is_dir() else {artifact.name: artifact.read_bytes()}
            files = {rel: data for rel, data in files.items() if Path(rel).parts[0] == artifact.name}
            digest = hashlib.sha256(artifact.read_bytes() if artifact.is_file() else   # a folder: its paths and bytes
                                    b"".join(rel.encode() + data for rel, data in sorted(files.items()))).hexdigest()
            back = files if sum(map(len, files.values())) <= ARTIFACT_BACK_BYTES else None
        return {"outcome": outcome, "log": node_log.read_bytes() + log.read_bytes(), "node": socket.gethostname(),
                "artifact_sha256": digest, "artifact": back}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def no_run(problem, log):
    """remote_run's answer when the node could not run the candidate at all: (a Kind, the reason), the reason at the
    end of the log."""
    kind, reason = problem
    with open(log, "a") as out:
        out.write(reason + "\n")
    return {"outcome": runner.Outcome("", None, 0.0, 0.0, log_tail=reason).fail(kind, reason), "log": Path(log).read_bytes(),
            "node": socket.gethostname(), "artifact_sha256": None, "artifact": None}


def node_wraps(sandboxed, run_dir, frozen, artifact, inputs, payload):
    """(train.py's argv wrapper, the evaluator's) on this node: the sandbox's views (harness.sandbox.train_argv,
    eval_argv) from this node's frozen inputs, with the driver's repository hidden as well and the run's GPU
    (CUDA_VISIBLE_DEVICES, which Ray sets for the task). Identity without the sandbox."""
    if not sandboxed:
        return (lambda argv: argv), (lambda argv: argv)
    gpu = sandbox.run_gpu(payload["env"])
    return (lambda argv: sandbox.train_argv(argv, run_dir, inputs, gpu, hide=payload["hide"]),
            lambda argv: sandbox.eval_argv(argv, frozen, artifact, inputs, gpu))


def node_ready(frozen, payload, log):
    """The node's data: `prepare.py --check` from the pristine copy, else prepare it (the tag's --source, or the
    default download, with the driver's profile); then its frozen inputs must be the ones the tag recorded. Returns (problem: (Kind, reason) or None, the
    node's frozen inputs: what the sandbox shows each process, None without a separate evaluation). Their output goes
    to log."""
    python = runner.interpreter()
    if os.environ.get("AUTORESEARCH_CACHE") and not Path(os.environ["AUTORESEARCH_CACHE"]).is_dir():
        del os.environ["AUTORESEARCH_CACHE"]      # the driver's path is not on this node: its own default cache
    with open(log, "ab") as out:
        check = subprocess.run([python, "prepare.py", "--check"], cwd=frozen, stdout=out, stderr=subprocess.STDOUT)
        if check.returncode:
            argv = [python, "prepare.py"] + (["--source", payload["source"]] if payload["source"] else []) + (
                ["--profile", payload["profile"]] if payload["profile"] else [])   # the tag's, not the node's guess
            if subprocess.run(argv, cwd=frozen, stdout=out, stderr=subprocess.STDOUT).returncode:
                return (Kind.NODE, f"node: no prepared data on node {socket.gethostname()} and prepare.py failed "
                        "there (see the log): prepare it on every node (docs/parallel.md), or give --source PATH valid "
                        "on the nodes"), None
        if payload["evaluation"] is None:
            return None, None
        found = subprocess.run([python, "prepare.py", "--frozen-inputs"], cwd=frozen, capture_output=True, text=True,
                               env={**os.environ, **payload["env"]})      # the tag's pinned variables among them
    try:
        inputs = json.loads(found.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return (Kind.NODE, f"node: prepare.py --frozen-inputs failed on node {socket.gethostname()}: "
                           f"{found.stderr[-300:]}"), None
    if inputs["digest"] != payload["evaluation"]["digest"]:
        return (Kind.REJECTED, f"rejected: the frozen inputs on node {socket.gethostname()} (digest "
                f"{inputs['digest'][:12]}) differ from the tag's ({payload['evaluation']['digest'][:12]}): other data "
                "or tokenizer there"), None
    return None, inputs
