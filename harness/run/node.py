"""
HARNESS: a run on another node, both sides of the wire, shared by every backend whose runs go elsewhere (the Ray
cluster's tasks, a child process): payload(spec, context) on the driver (a Spec as plain data), run(payload) on the
node (the candidate's files in a scratch dir, the data checked or prepared by the pristine prepare.py, the frozen
inputs compared with the tag's, runner.run with the sandbox and the separate evaluation) and received(spec, watch,
result) back on the driver (the log, the "remote" event, the artifact kept for the holdout). A backend only moves the
payload there and the result back: `python -m harness.run.node PAYLOAD RESULT` runs one pickled payload, for a backend
that starts a process.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import pickle
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.run import conditions, runner, sandbox
from harness.redact import clean_env
from harness.run.runner import Kind
from harness.schema import Event
from harness.run.target import FROZEN

ARTIFACT_BACK_BYTES = 1 << 30   # a model artifact up to this size comes back to the driver (report.py --holdout)
SCRATCH_PREFIX, OWNER = "autoresearch-ray-", ".owner"   # a run's scratch directory on a node, and its lock file


def payload(spec, context):
    """What a node needs to run spec: the files, the settings, the environment (its artifact path is the node's
    own), and context (the tag's --sandbox, --source, profile and the paths to hide: cluster.RayBackend). Read here,
    in the device's thread: the run dir and the device's frozen copy are its alone; the run dir is removed."""
    spec.fresh_frozen()
    ev = spec.evaluation
    found = dict(files=read_tree(spec.run_dir), frozen=read_tree(spec.frozen_dir), metric=spec.metric,
                 timeout=spec.timeout, env={k: v for k, v in spec.env.items() if k != "AUTORESEARCH_ARTIFACT"},
                 budget=spec.budget, max_wall=spec.max_wall, probe=spec.probe, cancel=spec.cancel,
                 evaluation=ev and {k: ev.get(k) for k in ("digest", "tolerance", "artifact", "timeout")}, **context)
    shutil.rmtree(spec.run_dir, ignore_errors=True)
    return found


def received(spec, watch, result):
    """The driver's side of a result from run(): the run's log written to spec.log, a "remote" event, the artifact
    kept like a local run's (for the holdout). Returns the Outcome, its commit spec's."""
    Path(spec.log).write_bytes(result["log"])
    watch.event(Event.REMOTE, node=result["node"], artifact_sha256=result["artifact_sha256"])
    if result.get("artifact") is not None:
        with tempfile.TemporaryDirectory() as scratch:
            write_tree(result["artifact"], scratch)
            watch.keep_artifact(Path(scratch) / spec.evaluation["artifact"])
    result["outcome"].commit = spec.commit
    return result["outcome"]


def crashed(spec, kind, reason):
    """An Outcome with no metric for a run that never returned one; its log says why."""
    Path(spec.log).write_text(reason + "\n")
    return runner.Outcome(commit=spec.commit, metric=None, memory_gb=0.0, seconds=0.0, log_tail=reason).fail(kind,
                                                                                                          reason)


def read_tree(folder):
    """{relative path: bytes} of every regular file under folder (a symbolic link, a FIFO or a device is left out:
    never followed, never read)."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if stat.S_ISREG(p.lstat().st_mode)}


def write_tree(files, folder):
    """Write read_tree's {relative path: bytes} under folder."""
    for rel, data in files.items():
        path = Path(folder) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def run(payload):
    """On the node (a Ray worker, a child process): one run of a candidate, as experiment.train does it on the
    driver's machine (runner.run with the sandbox and the separate evaluation), in a scratch directory removed
    afterwards. Returns {"outcome", "log" (bytes), "node", "artifact_sha256", "artifact"}."""
    with scratch() as work:
        return run_in(payload, work)


def run_in(payload, work):
    """run's body in the scratch directory work."""
    run_dir, frozen, log, node_log = work / "run", work / "frozen", work / "run.log", work / "node.log"
    write_tree(payload["files"], run_dir)
    write_tree(payload["frozen"], frozen)
    problem, inputs = ready(frozen, payload, node_log)   # its output leads the run's log
    if problem:
        return no_run(problem, node_log)
    ev = payload["evaluation"]
    artifact = run_dir / (ev or {}).get("artifact", "artifact")
    env = dict(payload["env"])
    sandboxed = payload["sandbox"] != "off" and sandbox.probe() is None
    wrap, eval_wrap = wraps(sandboxed, run_dir, frozen, artifact, inputs, payload)
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
    if runner.artifact_problem(artifact) is None:   # regular files only (a file, or GRPO's folder of weights):
        #                                             a link or a FIFO left in its place is never read
        files = read_tree(run_dir) if artifact.is_dir() else {artifact.name: artifact.read_bytes()}
        files = {rel: data for rel, data in files.items() if Path(rel).parts[0] == artifact.name}
        digest = hashlib.sha256(artifact.read_bytes() if artifact.is_file() else   # a folder: its paths and bytes
                                b"".join(rel.encode() + data for rel, data in sorted(files.items()))).hexdigest()
        back = files if sum(map(len, files.values())) <= ARTIFACT_BACK_BYTES else None
    return {"outcome": outcome, "log": node_log.read_bytes() + log.read_bytes(), "node": socket.gethostname(),
            "artifact_sha256": digest, "artifact": back}


@contextlib.contextmanager
def scratch(folder=None):
    """A fresh directory for one run on this node (in folder, default the temporary directory), held while the run
    lasts (an flock on its OWNER file, which names this host, released by the kernel however the process ends) and
    removed afterwards. First removes those a run on this host left when its process died before it could (kill -9, a
    lost Ray worker: an artifact and two copies of the target each): the ones whose lock is free. Where the filesystem
    has no flock, nothing is held or removed but the run's own directory. Yields its Path."""
    folder = Path(folder or tempfile.gettempdir())
    sweep(folder)
    work = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=folder))
    owner = None
    try:
        owner = os.open(work / (OWNER + ".new"), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.write(owner, socket.gethostname().encode())
        fcntl.flock(owner, fcntl.LOCK_EX)
        os.rename(work / (OWNER + ".new"), work / OWNER)   # named once held: a sweep never finds it free
    except OSError:                         # no flock there (some network filesystems): the run goes on unheld
        pass
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if owner is not None:
            os.close(owner)


def sweep(folder):
    """Remove each run's scratch directory in folder whose owner is gone: a directory of this user (not a link) whose
    OWNER file is a regular file naming this host (a temporary directory shared by nodes: another host's lock may not
    be seen here) and whose lock is free. One without an OWNER file (being made, or an older version's) is left."""
    for work in Path(folder).glob(SCRATCH_PREFIX + "*"):
        try:
            if work.is_symlink() or not work.is_dir() or work.stat().st_uid != os.getuid():
                continue
            owner = os.open(work / OWNER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)   # a FIFO never blocks
        except OSError:
            continue
        try:
            if stat.S_ISREG(os.fstat(owner).st_mode) and os.read(owner, 256) == socket.gethostname().encode():
                fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(work, ignore_errors=True)
        except OSError:                     # held: its run is still going (or no flock there)
            pass
        finally:
            os.close(owner)


def no_run(problem, log):
    """run's answer when the node could not run the candidate at all: (a Kind, the reason), the reason at the
    end of the log."""
    kind, reason = problem
    with open(log, "a") as out:
        out.write(reason + "\n")
    return {"outcome": runner.Outcome("", None, 0.0, 0.0, log_tail=reason).fail(kind, reason), "log": Path(log).read_bytes(),
            "node": socket.gethostname(), "artifact_sha256": None, "artifact": None}


def wraps(sandboxed, run_dir, frozen, artifact, inputs, payload):
    """(train.py's argv wrapper, the evaluator's) on this node: the sandbox's views (harness.run.sandbox.train_argv,
    eval_argv) from this node's frozen inputs, with the driver's repository hidden as well and the run's GPU
    (CUDA_VISIBLE_DEVICES, which Ray sets for the task). Identity without the sandbox."""
    if not sandboxed:
        return (lambda argv: argv), (lambda argv: argv)
    gpu = sandbox.run_gpu(payload["env"])
    return (lambda argv: sandbox.train_argv(argv, run_dir, inputs, gpu, hide=payload["hide"]),
            lambda argv: sandbox.eval_argv(argv, frozen, artifact, inputs, gpu))


def ready(frozen, payload, log):
    """The node's data: `prepare.py --check` from the pristine copy, else prepare it (the tag's --source, or the
    default download, with the driver's profile); then its frozen inputs must be the ones the tag recorded. Returns
    (problem: (Kind, reason) or None, the node's frozen inputs: what the sandbox shows each process, None without a
    separate evaluation). Their output goes to log."""
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


def main(argv=None):
    """`python -m harness.run.node PAYLOAD RESULT`: run the pickled payload in file PAYLOAD, pickle the result to file
    RESULT. Exit 0 once RESULT is written (the run's own failure is in the result), 2 on bad arguments or a payload
    that cannot be read. A pickle runs code as it loads: only the driver's own payload files belong here."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m harness.run.node PAYLOAD RESULT (pickled files: a payload from harness.run.node.payload, "
              "the result of harness.run.node.run)", file=sys.stderr)
        return 2
    try:
        found = pickle.loads(Path(argv[0]).read_bytes())
    except Exception as e:          # noqa: BLE001 - a missing, cut or foreign file: said, exit 2
        print(f"harness.run.node: cannot read the payload {argv[0]} ({e}): write it with "
              "pickle.dumps(harness.run.node.payload(spec, context))", file=sys.stderr)
        return 2
    Path(argv[1]).write_bytes(pickle.dumps(run(found)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
