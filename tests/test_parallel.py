"""
Every device busy (issue 11) on the tiny target: speculative proposals (asked while a candidate trains, re-applied
to a new best or dropped), --devices cpu:2 (runs overlap, verdicts in order, a stale winner re-run on the new best,
SIGKILL mid-wave and resume), and --ray on a local Ray instance (a lost worker retried once, then a crash).
"""

import datetime
import os
import pickle
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import git
import pytest

import agent
import report
from agent_target import STRICT, edit, make_target
from llm_server import ScriptedLLM
from helpers import AGENT, events, live_members, rows, tree_is_clean

from harness.run import cluster, node, pool, sandbox
from harness.tag import settings
from harness.run.runner import Kind, timeout_s

LR_UP = edit("LR 0.045", "LR = 0.04", "LR = 0.045")             # 1.058000: keep
LR_OTHER = edit("LR 0.06", "LR = 0.04", "LR = 0.06")            # written for the baseline; gone after LR_UP
DEPTH_DOWN = edit("DEPTH 6", "DEPTH = 8", "DEPTH = 6")          # 1.106000 on the baseline, 1.056000 after LR_UP
WARMUP = edit("WARMUP 0.2", "WARMUP = 0.1", "WARMUP = 0.2")     # no change of the metric: discard


def slow(target, seconds):
    """Commit the tiny target's train.py with SLEEP = seconds on main (each run takes that long)."""
    path = target / "train.py"
    path.write_text(path.read_text().replace("SLEEP = 0.0", f"SLEEP = {seconds}"))
    git.Repo(target).git.commit("-qam", f"runs take {seconds}s")


def stamp(e):
    """An event's time as time.time() seconds."""
    return datetime.datetime.fromisoformat(e["ts"]).timestamp()


def loop(target, llm, *extra):
    """agent.main in-process: the loop on tag t, strict ratchet, the loopback LLM."""
    return agent.main(["--tag", "t", "--target", str(target), "--timeout", "30", *STRICT, "--proposer", "anthropic",
                       "--base-url", llm.anthropic_url, *extra])


def parent(target, commit):
    """The full sha of a commit's parent."""
    return git.Repo(target).commit(commit).parents[0].hexsha


def ledger_holds(target, tag="t"):
    """The ledger invariants: one row per experiment event (same commits, in order), every keep on the branch, the
    branch tip the last keep, the user's checkout clean and on main."""
    exps = events(target, "experiment")
    assert [r.split("\t")[0] for r in rows(target)] == [e["commit"] for e in exps]
    assert [e["n"] for e in exps] == list(range(len(exps)))
    repo = git.Repo(target)
    tip = repo.commit(f"autoresearch/{tag}").hexsha
    keeps = [e["full_commit"] for e in exps if e["status"] == "keep"]
    assert tip == keeps[-1] and all(repo.is_ancestor(k, tip) for k in keeps)
    assert tree_is_clean(target) and repo.active_branch.name == "main"
    return exps


# ---------------------------------------------------------------------------
# Speculation on one device
# ---------------------------------------------------------------------------


def test_the_next_idea_is_asked_while_training_and_reapplied_to_a_new_best(target):
    slow(target, 1.5)
    with ScriptedLLM([LR_UP, DEPTH_DOWN], delay=0.3) as llm:
        assert loop(target, llm, "--max-experiments", "2") == 0
    exps = ledger_holds(target)
    assert [(e["description"], e["status"]) for e in exps] == [("baseline", "keep"), ("LR 0.045", "keep"),
                                                               ("DEPTH 6", "keep")]
    assert [e["metric"] for e in exps] == [1.108, 1.058, 1.056]
    # the second idea was asked while #1 trained, against the baseline (#1's result unknown then) ...
    started1 = next(e for e in events(target, "started") if e["n"] == 1)
    end1 = next(e for e in events(target, "run_end") if e["n"] == 1)
    assert stamp(started1) < llm.times[1] < stamp(end1) - 1.0
    prompt = llm.requests[1][1]["messages"][0]["content"]
    assert "Still running, results not known yet" in prompt and "#1 LR 0.045" in prompt
    assert "LR = 0.04\n" in prompt.split("# Current train.py")[1]
    # ... and re-applied to the new best: #2 is built on #1's commit
    assert [e["idea"] for e in events(target, "reapplied")] == ["DEPTH 6"]
    assert parent(target, exps[2]["full_commit"]) == exps[1]["full_commit"]
    assert exps[2]["base"] == exps[1]["full_commit"] and exps[2]["base_metric"] == 1.058


def test_a_prepared_edit_that_no_longer_applies_is_dropped_and_asked_again(target):
    slow(target, 1.5)
    with ScriptedLLM([LR_UP, LR_OTHER, DEPTH_DOWN], delay=0.3) as llm:
        assert loop(target, llm, "--max-experiments", "2") == 0
    exps = ledger_holds(target)
    assert [e["description"] for e in exps] == ["baseline", "LR 0.045", "DEPTH 6"]
    [dropped] = events(target, "dropped")
    assert dropped["idea"] == "LR 0.06" and "does not occur in train.py" in dropped["error"]
    assert len(llm.requests) == 3
    # the fresh proposal saw #1's result and no run in flight
    prompt = llm.requests[2][1]["messages"][0]["content"]
    assert "Results known: all 2 experiments so far" in prompt and "LR = 0.045\n" in prompt


def test_no_speculate_asks_only_when_the_device_is_free(target):
    slow(target, 1.0)
    with ScriptedLLM([LR_UP, DEPTH_DOWN], delay=0.3) as llm:
        assert loop(target, llm, "--max-experiments", "2", "--no-speculate") == 0
    end1 = next(e for e in events(target, "run_end") if e["n"] == 1)
    assert llm.times[1] > stamp(end1) and not events(target, "reapplied")

# ---------------------------------------------------------------------------
# Several devices: --devices cpu:2
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_two_cpu_workers_overlap_and_a_stale_winner_is_rerun_on_the_new_best(target, tmp_path, capsys):
    slow(target, 2.0)
    with ScriptedLLM([LR_UP + "\n" + DEPTH_DOWN, WARMUP], delay=0.2) as llm:
        assert loop(target, llm, "--max-experiments", "4", "--devices", "cpu:2", "--no-speculate") == 0
    exps = ledger_holds(target)
    # one call asked for two different ideas
    assert "This time propose 2 experiments" in llm.requests[0][1]["messages"][0]["content"]
    first, second = exps[1], exps[2]
    assert (first["description"], first["status"]) == ("LR 0.045", "keep")
    # DEPTH 6 beat the baseline it was built on, but #1 moved the best while it ran: superseded, never kept untested
    assert second["status"] == "discard" and "superseded" in second["description"]
    assert second["base"] == exps[0]["full_commit"] and second["metric"] == 1.106
    rerun = next(e for e in exps[3:] if e.get("rebased_from") == 2)
    assert rerun["status"] == "keep" and rerun["metric"] == 1.056 and rerun["description"] == "DEPTH 6"
    assert parent(target, rerun["full_commit"]) == first["full_commit"]
    # every run was probed, the first on each device too (its evaluator copy is made before the probe)
    ends = events(target, "run_end")
    assert {e["device"] for e in ends} == {"cpu:0", "cpu:1"}, {e["device"] for e in ends}
    assert all(e["probe_s"] == 0.01 and e["probe_problem"] is None for e in ends), ends
    # the two runs of the wave overlapped in time, one on each device
    runs = {e["n"]: e for e in events(target, "run")}
    ends = {e["n"]: e for e in events(target, "run_end")}
    assert stamp(runs[2]) < stamp(ends[1]) and stamp(runs[1]) < stamp(ends[2])
    assert {runs[1]["device"], runs[2]["device"]} == {"cpu:0", "cpu:1"}
    assert {e["n"]: e["wave"] for e in events(target, "started")}[1] == {e["n"]: e["wave"]
                                                                        for e in events(target, "started")}[2]
    # the throughput figures are logged: both devices busy most of the time
    stop = events(target, "stop")[-1]
    assert set(stop["busy"]) == {"cpu:0", "cpu:1"} and stop["experiments_per_hour"] > 0
    capsys.readouterr()
    assert report.main([str(target), "--png", str(tmp_path / "progress.png")]) == 0
    assert re.search(r"(?m)^throughput   [\d.]+ experiments/hour over \S+; device busy cpu:0 \d+%, cpu:1 \d+%; "
                     r"proposal wait \d+ device-seconds; wall time: training \d+%", capsys.readouterr().out)


def test_a_finished_candidate_not_yet_recorded_counts_as_in_flight(target):
    """Two devices, speculation: #2 finishes while #1 still runs (it waits to be recorded after #1). The proposal
    asked then must not measure #2's train.py again: the prompt lists #2 as not known yet, and the same answer is
    refused and repaired."""
    sleepy = edit("sleep 6s", "SLEEP = 0.0", "SLEEP = 6.0")      # #1: the baseline's metric, 6 s
    with ScriptedLLM([sleepy + "\n" + DEPTH_DOWN, WARMUP, DEPTH_DOWN, LR_UP], delay=0.2) as llm:
        assert loop(target, llm, "--max-experiments", "4", "--devices", "cpu:2") == 0
    exps = ledger_holds(target)
    assert [e["description"].split(" (")[0] for e in exps] == ["baseline", "sleep 6s", "DEPTH 6", "WARMUP 0.2",
                                                               "LR 0.045"]
    ends = {e["n"]: stamp(e) for e in events(target, "run_end")}
    asked = llm.times[2]                                   # the third request: #2 done, #1 still running
    assert ends[2] < asked < ends[1]
    prompt = llm.requests[2][1]["messages"][0]["content"]
    assert "Still running, results not known yet" in prompt and "#2 DEPTH 6" in prompt
    repair = llm.requests[3][1]["messages"][-1]["content"]
    assert "the same as a candidate still running or about to run" in repair
    assert len({git.Repo(target).commit(e["full_commit"]).tree["train.py"].hexsha for e in exps}) == len(exps)


def test_a_superseded_winners_rerun_survives_a_stop(target):
    """Two devices: #2 beat the baseline but #1 moved the best while it ran (superseded), and --max-experiments
    stopped the loop before its promised re-run. The next invocation runs it first, on the new best, without asking
    the LLM."""
    slow(target, 1.0)
    with ScriptedLLM([LR_UP + "\n" + DEPTH_DOWN], delay=0.2) as llm:
        assert loop(target, llm, "--max-experiments", "2", "--devices", "cpu:2", "--no-speculate") == 0
    second = events(target, "experiment")[2]
    assert second["status"] == "discard" and second["superseded"] is True
    with ScriptedLLM([]) as llm:
        assert loop(target, llm, "--max-experiments", "3", "--no-speculate") == 0
    assert llm.requests == []
    exps = ledger_holds(target)
    assert (exps[3]["description"], exps[3]["status"], exps[3]["metric"], exps[3]["rebased_from"]) == \
        ("DEPTH 6", "keep", 1.056, 2)
    assert parent(target, exps[3]["full_commit"]) == exps[1]["full_commit"]


@pytest.mark.slow
def test_sigkill_mid_wave_then_resume_keeps_the_ledger_whole(target):
    slow(target, 4.0)
    argv = [sys.executable, str(AGENT), "--tag", "t", "--target", str(target), "--timeout", "60", *STRICT,
            "--proposer", "random", "--devices", "cpu:2", "--max-experiments", "3", "--sandbox", "off"]
    proc = subprocess.Popen(argv, cwd=target, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:           # wait until both devices train a candidate
        running = [e for e in (events(target, "run") if (target / "events.jsonl").exists() else []) if e["n"] > 0]
        if len(running) >= 2:
            break
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    else:
        raise AssertionError("the two devices never trained at once")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    orphans = [e["pgid"] for e in running]
    assert agent.main(argv[2:]) == 0             # resume: the orphaned runs are killed, the wave re-asked
    assert all(live_members(pgid) == [] for pgid in orphans)   # without the sandbox they outlived the agent
    exps = ledger_holds(target)
    assert len(exps) == 4 and exps[0]["description"] == "baseline"
    assert len({e["full_commit"] for e in exps}) == 4             # no idea ran twice, in flight or not
    assert not list((target / ".git" / "autoresearch" / "t" / "runs").glob("*"))

# ---------------------------------------------------------------------------
# A backend of the test's own: the remote path (payload, the shared node body, result) without a cluster
# ---------------------------------------------------------------------------

NODE_SLACK_S = 60      # the node's own work (data check, export of the result) beyond a run's hard limit


class SubprocessBackend:
    """Each run a child process on this machine, `python -m harness.run.node PAYLOAD RESULT`, the payload and the result
    through files: what a backend that starts a process (a Kubernetes job, a SkyPilot task) does, in 20 lines."""

    def __init__(self, context, pids):
        self.context, self.pids = context, pids

    def run(self, spec, watch):
        watch.started(None)
        with tempfile.TemporaryDirectory() as wire:
            sent, back = Path(wire) / "payload", Path(wire) / "result"
            sent.write_bytes(pickle.dumps(node.payload(spec, self.context)))
            proc = subprocess.Popen([sys.executable, "-m", "harness.run.node", str(sent), str(back)],
                                    cwd=Path(__file__).resolve().parents[1])
            self.pids.append(proc.pid)
            t0 = time.monotonic()
            while proc.poll() is None:
                watch.tick(time.monotonic() - t0)
                time.sleep(0.2)
                if time.monotonic() - t0 > timeout_s(spec.timeout) + NODE_SLACK_S:   # the node itself hung
                    proc.kill()
                    proc.wait()
                    return node.crashed(spec, Kind.LOST, "lost: the node ran past the run's hard limit")
            if proc.returncode:
                return node.crashed(spec, Kind.CRASH, f"crash: the node process exited {proc.returncode}")
            return node.received(spec, watch, pickle.loads(back.read_bytes()))


def swapped_artifact(how):
    """A candidate whose train.py, as it exits, puts `how` (a symbolic link to a file outside its view, or a FIFO
    with no writer) where its model artifact was."""
    swap = "os.symlink('/etc/hostname', a)" if how == "symlink" else "os.mkfifo(a)"
    return edit(f"a {how} for an artifact", "DEPTH = 8", "DEPTH = 6\nimport atexit\n"
                "def _swap():\n"
                "    a = os.environ['AUTORESEARCH_ARTIFACT']\n"
                f"    os.remove(a); {swap}\n"
                "atexit.register(_swap)")


@pytest.mark.parametrize("how", ["symlink", "fifo"])
def test_the_node_never_reads_an_artifact_swapped_for_a_link_or_a_fifo(target, monkeypatch, how):
    """From the hostile review: the node read the artifact whatever it was, so a FIFO hung the node for good and a
    link shipped (and hashed) a file of the node's to the driver. Now the node sends back only an artifact of regular
    files (runner.artifact_problem), and the run is rejected as before."""
    pids = []
    monkeypatch.setattr(cluster, "connect", lambda address, context: [
        pool.Device("sub:0", {}, 1, "frozen-sub0", remote=SubprocessBackend(context, pids))])
    with ScriptedLLM([swapped_artifact(how)]) as llm:
        assert loop(target, llm, "--max-experiments", "1", "--ray", "auto", "--no-speculate") == 0
    exps = ledger_holds(target)
    assert exps[1]["status"] == "crash" and "ran past" not in exps[1]["description"]
    remote = {e["n"]: e for e in events(target, "remote")}
    assert len(remote[0]["artifact_sha256"]) == 64 and remote[1]["artifact_sha256"] is None
    home = target / ".git" / "autoresearch" / "t"
    assert sorted(p.name for p in (home / "artifacts").iterdir()) == ["0000-artifact"]


def test_a_node_removes_the_scratch_a_killed_run_left_and_never_a_live_one(tmp_path):
    """A node's run killed with -9 (a lost Ray worker) could not remove its scratch directory (the target twice and
    the artifact: a GPU model's weights each time); the next run on that node removes it. Never a run's still going
    (its lock is held), one of an older version (no owner file), a link to elsewhere, another host's (a temporary
    directory shared by nodes), nor one whose owner file is a FIFO (opening it would block every later run)."""
    holder = ("import sys, time\nfrom harness.run import node\nwith node.scratch(sys.argv[1]) as work:\n"
              "    print(work, flush=True)\n    time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", holder, str(tmp_path)], cwd=AGENT.parent, stdout=subprocess.PIPE,
                             text=True)
    dead = Path(child.stdout.readline().strip())
    assert dead.name.startswith(node.SCRATCH_PREFIX) and dead.parent == tmp_path
    (dead / "run").mkdir()
    (dead / "run" / "artifact").write_bytes(b"weights")
    node.sweep(tmp_path)                            # its run is still going
    assert (dead / "run" / "artifact").read_bytes() == b"weights"
    child.kill()
    child.wait()
    old = tmp_path / (node.SCRATCH_PREFIX + "old")
    old.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / node.OWNER).touch()
    (tmp_path / (node.SCRATCH_PREFIX + "link")).symlink_to(elsewhere)
    (tmp_path / (node.SCRATCH_PREFIX + "fifo")).mkdir()
    os.mkfifo(tmp_path / (node.SCRATCH_PREFIX + "fifo") / node.OWNER)     # planted: opening it must not block
    (tmp_path / (node.SCRATCH_PREFIX + "host")).mkdir()
    (tmp_path / (node.SCRATCH_PREFIX + "host") / node.OWNER).write_text("another-host")   # a shared /tmp: not ours
    with node.scratch(tmp_path) as live:
        assert not dead.exists() and old.is_dir() and (elsewhere / node.OWNER).exists() and live.is_dir()
        node.sweep(tmp_path)                        # another run starting on this node meanwhile
        assert live.is_dir()
    assert not live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autoresearch-ray-fifo", "autoresearch-ray-host",
                                                          "autoresearch-ray-link", "autoresearch-ray-old", "elsewhere"]


def test_the_node_command_refuses_bad_arguments_and_an_unreadable_payload(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    node_cmd = [sys.executable, "-m", "harness.run.node"]
    usage = subprocess.run(node_cmd, cwd=repo, capture_output=True, text=True)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: python -m harness.run.node PAYLOAD RESULT")
    (tmp_path / "cut").write_bytes(pickle.dumps({"files": {}})[:5])
    for bad in (tmp_path / "absent", tmp_path / "cut"):
        found = subprocess.run([*node_cmd, str(bad), str(tmp_path / "result")], cwd=repo, capture_output=True, text=True)
        assert found.returncode == 2 and "Traceback" not in found.stderr, found.stderr
        assert found.stderr.startswith(f"harness.run.node: cannot read the payload {bad} (")
        assert not (tmp_path / "result").exists()


def test_a_backend_of_the_tests_own_runs_real_runs_through_the_shared_node_body(target, monkeypatch):
    """One slot of the subprocess backend stands in for a cluster (cluster.connect replaced): every run is a child
    process running harness.run.node's body (in bubblewrap where it works, with the separate evaluation), and the loop
    records the tiny target's exact metrics, a "remote" event per run, the runs' logs and the kept artifacts, as on
    Ray."""
    pids = []
    monkeypatch.setattr(cluster, "connect", lambda address, context: [
        pool.Device(f"sub:{i}", {}, 1, f"frozen-sub{i}", remote=SubprocessBackend(context, pids)) for i in range(1)])
    with ScriptedLLM([LR_UP, DEPTH_DOWN]) as llm:
        assert loop(target, llm, "--max-experiments", "2", "--ray", "auto", "--no-speculate") == 0
    exps = ledger_holds(target)
    assert [(e["description"].split(" (")[0], e["status"], e["metric"]) for e in exps[1:]] == [
        ("LR 0.045", "keep", 1.058), ("DEPTH 6", "keep", 1.056)]
    ends, remote = events(target, "run_end"), events(target, "remote")
    assert [e["n"] for e in remote] == [e["n"] for e in ends] == [0, 1, 2]
    assert {e["device"] for e in ends} == {"sub:0"} and all(e["sandbox"] for e in exps)
    assert all(e["node"] == socket.gethostname() and len(e["artifact_sha256"]) == 64 for e in remote)
    assert len(pids) == 3 and os.getpid() not in pids
    home = target / ".git" / "autoresearch" / "t"
    assert sorted(p.name for p in (home / "artifacts").iterdir()) == ["0000-artifact", "0002-artifact"]
    assert "=== separate evaluation" in (home / "logs" / "0002-0.log").read_text()


# ---------------------------------------------------------------------------
# A Ray cluster: a local instance
# ---------------------------------------------------------------------------

KILL_WORKER = edit("kill my worker", "DEPTH = 8", "DEPTH = 7\nos.kill(os.getppid(), 9)")
KILL_ONCE = edit("kill my worker once", "DEPTH = 8", "DEPTH = 6\n"
                 "MARKER = os.path.join(os.environ['AUTORESEARCH_CACHE'], 'killed-once')\n"
                 "if not os.path.exists(MARKER):\n"
                 "    open(MARKER, 'w').close()\n"
                 "    os.kill(os.getppid(), 9)")


@pytest.fixture
def local_ray(target, monkeypatch):
    """A local Ray instance with 2 CPUs, started by the test in this process (agent.py uses it as it is)."""
    monkeypatch.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")   # else Ray ships this checkout to its workers
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_runs_the_experiments_and_retries_a_lost_worker_once(target, local_ray):
    with ScriptedLLM([LR_UP, KILL_WORKER, KILL_ONCE]) as llm:
        assert loop(target, llm, "--max-experiments", "3", "--ray", "auto", "--sandbox", "off",
                    "--no-speculate") == 0
    exps = ledger_holds(target)
    assert [(e["description"].split(" (")[0], e["status"]) for e in exps[:3]] == [
        ("baseline", "keep"), ("LR 0.045", "keep"), ("kill my worker", "crash")]
    assert exps[1]["metric"] == 1.058 and "the Ray worker was lost twice" in exps[2]["description"]
    # two Ray slots: #3 started on the baseline (1.106, then superseded by #1) or on #1 (1.056), by timing
    assert exps[3]["description"].startswith("kill my worker once") and exps[3]["metric"] in (1.106, 1.056)
    assert len(llm.requests) == 3                              # a lost worker is not a bug: no fix was asked for
    lost = events(target, "worker_lost")
    assert sorted(e["n"] for e in lost) == [2, 2, 3]         # retried once each; the second try of #3 succeeded
    remote = events(target, "remote")
    assert {e["n"] for e in remote} == {0, 1, 3} and all(len(e["artifact_sha256"]) == 64 for e in remote)
    assert {e["device"] for e in events(target, "run")} <= {"ray:0", "ray:1"}
    # the runs' logs and artifacts came back: the separate evaluation ran on the worker; the holdout is scored here
    best = [e["n"] for e in exps if e["status"] == "keep"][-1]
    assert sorted(p.name for p in (target / ".git" / "autoresearch" / "t" / "artifacts").iterdir()) == [
        "0000-artifact", f"{best:04d}-artifact"]
    assert "=== separate evaluation" in (target / ".git" / "autoresearch" / "t" / "logs" / "0003-0.log").read_text()


@pytest.mark.slow
def test_a_ray_node_without_data_prepares_it_with_the_frozen_prepare(target, tmp_path, monkeypatch):
    """The node's workers see another data cache (empty): the task runs the pristine prepare.py there first."""
    monkeypatch.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    ray = pytest.importorskip("ray")
    node_cache = tmp_path / "node-cache"
    node_cache.mkdir()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"AUTORESEARCH_CACHE": str(node_cache)}})
    try:
        assert agent.main(["--tag", "t", "--target", str(target), "--timeout", "30", *STRICT, "--proposer", "random",
                           "--max-experiments", "1", "--ray", "auto", "--sandbox", "off"]) == 0
    finally:
        ray.shutdown()
    assert (node_cache / "ready").exists()
    exps = ledger_holds(target)
    assert exps[0]["metric"] == 1.108 and len(exps) == 2
    assert "Data: prepared" in (target / ".git" / "autoresearch" / "t" / "logs" / "0000-0.log").read_text()


@pytest.mark.slow
def test_a_ray_node_hides_the_drivers_repository_from_train_py(monkeypatch):
    """The driver's machine is a node too (`ray start --head` here): its repository, outside /tmp (which the sandbox
    replaces anyway), must be as hidden from train.py as in a local run: the best's artifact, the logs, the ledger."""
    if sandbox.probe() is not None:
        pytest.skip(sandbox.probe())
    root = Path(tempfile.mkdtemp(dir="/var/tmp"))
    try:
        target = make_target(root / "repo")
        (root / "cache").mkdir()
        (root / "cache" / "ready").touch()
        monkeypatch.setenv("AUTORESEARCH_CACHE", str(root / "cache"))
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        monkeypatch.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        ray = pytest.importorskip("ray")
        artifacts = target / ".git" / "autoresearch" / "t" / "artifacts"
        look = edit("look around", "DEPTH = 8", f"DEPTH = 8\nprint('SEES', os.path.exists({str(artifacts)!r}), "
                    f"os.path.exists({str(target / 'program.md')!r}))")
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            with ScriptedLLM([look]) as llm:
                assert loop(target, llm, "--max-experiments", "1", "--ray", "auto", "--no-speculate") == 0
        finally:
            ray.shutdown()
        assert artifacts.is_dir() and (target / "program.md").exists()
        assert "SEES False False" in (target / ".git" / "autoresearch" / "t" / "logs" / "0001-0.log").read_text()
        assert ledger_holds(target)[1]["status"] == "discard"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_bad_devices_and_ray_flags_are_refused(target, capsys):
    for flags, message in ((["--devices", "cpu:0"], "between cpu:1 and cpu:"),
                           (["--devices", "0,0"], "distinct CUDA device indices"),
                           (["--devices", "gpu"], "distinct CUDA device indices"),
                           (["--devices", "0", "--ray", "auto"], "pick one"),
                           *[(["--devices", "0,1"], "this machine has no NVIDIA GPU")] * (pool.nvidia_gpus() == 0)):
        with pytest.raises(SystemExit) as e:
            settings.parse(["--tag", "t", "--proposer", "random", *flags])
        assert e.value.code == 2 and message in capsys.readouterr().err
    pytest.importorskip("ray")
    started = time.monotonic()                 # a dead address fails fast (Ray itself retries it for minutes)
    assert agent.main(["--tag", "t", "--target", str(target), "--proposer", "random", "--ray", "127.0.0.1:1"]) == 2
    assert "--ray 127.0.0.1:1: nothing answers there" in capsys.readouterr().err and time.monotonic() - started < 30
    assert "autoresearch/t" not in git.Repo(target).heads and not (target / "events.jsonl").exists()  # no trace
    assert [(d.name, d.env) for d in pool.parse_devices("1,cuda:3", 8, gpus=4)] == [
        ("cuda:1", {"CUDA_VISIBLE_DEVICES": "1"}), ("cuda:3", {"CUDA_VISIBLE_DEVICES": "3"})]
    assert [(d.name, d.threads, d.env) for d in pool.parse_devices("cpu:2", 2)] == [
        ("cpu:0", 1, {"CUDA_VISIBLE_DEVICES": ""}), ("cpu:1", 1, {"CUDA_VISIBLE_DEVICES": ""})]


def test_your_edit_of_results_tsv_during_two_unsandboxed_runs_is_saved_and_rejects_one_run(target):
    """Without the sandbox the harness cannot tell your edit of its results.tsv from a run's, so the run whose guard
    sees it first is rejected and the file restored, with what it held saved and named; the other device's guard
    knows the harness's own appends since, so it is not rejected too (no cascade), and the ledger stays whole."""
    slow(target, 3.0)
    with ScriptedLLM([LR_UP + "\n" + DEPTH_DOWN]) as llm:
        proc = subprocess.Popen([sys.executable, str(AGENT), "--tag", "t", "--target", str(target), "--timeout", "30",
                                 *STRICT, "--proposer", "anthropic", "--base-url", llm.anthropic_url, "--sandbox",
                                 "off", "--devices", "cpu:2", "--no-speculate", "--max-experiments", "2"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not {1, 2} <= {e["n"] for e in (events(target, "run") if (target / "events.jsonl").exists() else [])}:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        with open(target / "results.tsv", "a") as f:
            f.write("mine\t0.5\t0.0\tkeep\tmy own note\n")
        _, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    exps = ledger_holds(target)
    words = "rejected: the run wrote results.tsv (restored; copy at .git/autoresearch/t/changed/"
    rejected = [e for e in exps[1:] if words in e["description"]]
    assert len(rejected) == 1 and len(exps) == 3
    [other] = [e for e in exps[1:] if e is not rejected[0]]
    assert other["status"] in ("keep", "discard") and "rejected" not in other["description"]
    saved = target / rejected[0]["description"].split("copy at ")[1].split(")")[0]
    assert saved.read_text().endswith("mine\t0.5\t0.0\tkeep\tmy own note\n")
    assert "my own note" not in (target / "results.tsv").read_text()


def test_settings_hold_no_device_and_a_scheduler_is_one_device_source():
    """Settings are frozen values (hashable: no pool.Device, which the pool mutates); the devices come from a
    DeviceSource at start, here a scheduler's allocation written in the test alone, released however the
    invocation ends (a refused start included)."""
    for argv in (["--tag", "t", "--proposer", "random", "--devices", "cpu:2"], ["try", "--tag", "t", "-m", "x"]):
        parsed = settings.parse(argv)
        assert hash(parsed) and not any(isinstance(v, pool.Device) for v in vars(parsed).values())
    assert [(d.name, d.threads) for d in pool.Local("cpu:2", 2).acquire()] == [("cpu:0", 1), ("cpu:1", 1)]
    with pytest.raises(agent.SetupError, match="between cpu:1 and cpu:2"):
        pool.Local("cpu:3", 2).acquire()

    class Scheduler:
        """GPUs handed out by a scheduler: its allocation (an environment variable, say) read at acquire."""
        def __init__(self):
            self.calls = []

        def acquire(self):
            self.calls.append("acquire")
            return [pool.Device("slurm:0", {"CUDA_VISIBLE_DEVICES": ""}, 1)]

        def release(self):
            self.calls.append("release")

    source = Scheduler()
    with pytest.raises(RuntimeError), pool.acquired(source) as devices:
        assert [d.name for d in devices] == ["slurm:0"] and source.calls == ["acquire"]
        raise RuntimeError("the loop stopped")
    assert source.calls == ["acquire", "release"]


def test_a_ctrl_c_just_after_a_finished_job_left_the_queue_still_lets_the_pool_close():
    """bench_faults once saw agent.py hang for good after a Ctrl-C to its process group (1 of 31 stops, no output):
    the signal reached a worker's thread, the main thread ran its handler only when a job's put woke it, after
    Queue.get had taken the job off the queue, and close() then waited on the queue for a job that had ended. close()
    waits for the threads: it returns once the job still training has ended, and the pool holds nothing running."""
    class InterruptedAfterGet(queue.Queue):
        interrupts = 1

        def get(self, *args, **kwargs):
            item = super().get(*args, **kwargs)
            if self.interrupts:
                self.interrupts -= 1
                raise KeyboardInterrupt
            return item

    p = pool.Pool([pool.Device("cpu:0", {}, 1), pool.Device("cpu:1", {}, 1)], 0)
    p.finished = InterruptedAfterGet()
    ended = threading.Event()

    def job(device, seconds):
        time.sleep(seconds)
        if seconds:
            ended.set()
        return device.name

    p.submit(job, 0.0)
    p.submit(job, 1.0)                  # still training when the Ctrl-C lands
    with pytest.raises(KeyboardInterrupt):
        p.done()
    closer = threading.Thread(target=p.close, daemon=True)
    closer.start()
    closer.join(10)
    assert not closer.is_alive() and ended.is_set()
    assert p.running == {} and sorted(d.name for d in p.free) == ["cpu:0", "cpu:1"]
