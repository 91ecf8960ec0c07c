"""MLflow tracking (harness/record/tracking.py, agent.py --mlflow): the loop on the tiny curve target mirrors each experiment
into one MLflow run of the SQLite store, read back with MlflowClient; a store MLflow cannot write, and mlflow missing,
are one warning line and every experiment is still recorded; a bad URI exits 2."""

import os
import subprocess
import sys

import git
import pytest

import agent
from agent_target import SECRET, STRICT, edit, make_curve_target, make_target
from conftest import tiny_env
from helpers import AGENT, events, rows, wait_for_run
from harness import files, ledger
from llm_server import ScriptedLLM

KEEP = edit("raise LR", "LR = 0.04", "LR = 0.05")                            # 1.108 -> 1.008: keep
DISCARD = edit("deeper", "DEPTH = 8", "DEPTH = 80")                          # 1.008 -> 1.080: discard
CRASH = edit("warmup and a typo", "WARMUP = 0.1", "WARMUP = 0.2\nraise SystemExit('boom ' + 'x')")


def loop(target, llm, *extra):
    return agent.main(["--tag", "t", "--target", str(target), "--timeout", "30", "--retry-base-delay", "0.01",
                       *STRICT, "--no-speculate", "--no-holdout", "--proposer", "anthropic", "--base-url",
                       llm.anthropic_url, *extra])


@pytest.fixture
def curve2(tmp_path, monkeypatch):
    """The tiny target whose train.py prints progress lines, with a 2 s budget."""
    tiny_env(tmp_path, monkeypatch)
    return make_curve_target(tmp_path / "repo", 2)


def test_each_experiment_is_one_mlflow_run(curve2, capsys):
    import mlflow
    with ScriptedLLM([KEEP, DISCARD, CRASH]) as llm:
        assert loop(curve2, llm, "--mlflow", "--max-experiments", "3") == 0
    out = capsys.readouterr()
    assert "warning" not in out.out + out.err and "Traceback" not in out.err
    uri = f"sqlite:///{curve2}/mlflow.db"
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("autoresearch/t")
    assert experiment.artifact_location == (curve2 / "mlartifacts").as_uri()
    runs = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id], max_results=100)}
    recorded = events(curve2, "experiment")
    assert [e["status"] for e in recorded] == ["keep", "keep", "discard", "crash"]
    assert len(runs) == len(recorded) == 4
    table = {line.split("\t")[0]: line.split("\t") for line in rows(curve2)}
    repo = git.Repo(curve2)
    for e in recorded:
        run = runs[e["mlflow_run"]]
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        assert tags["status"] == e["status"] and tags["commit"] == e["full_commit"]
        assert tags["branch"] == "autoresearch/t" and tags["proposer"] == "anthropic"
        assert (tags["hardware_epoch"], tags["smoke"], tags["budget_s"]) == ("1", "false", f"{e['budget_s']:g}")
        assert tags["mlflow.runName"] == f"#{e['n']} {e['idea']}"
        assert run.info.status == ("FAILED" if e["status"] == "crash" else "FINISHED")
        assert params["tag"] == "t" and params["base"] == e["base"]
        assert f"mlflow run {run.info.run_id}" in repo.git.notes("--ref", "refs/notes/commits", "show",
                                                                  e["full_commit"])
        names = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert "log_tail.txt" in names and ("diff.patch" in names) == (e["n"] > 0)
        assert SECRET not in client.download_artifacts(run.info.run_id, "log_tail.txt", str(curve2.parent))
        if e["status"] == "crash":
            assert ledger.has_metric(e) is False and "val_bpb" not in metrics
            assert "boom x" in open(client.download_artifacts(run.info.run_id, "log_tail.txt",
                                                              str(curve2.parent))).read()
            continue
        assert f"{metrics['val_bpb']:.6f}" == table[e["commit"]][1]
        assert metrics["memory_gb"] == e["memory_gb"] and metrics["wall_seconds"] == e["wall_seconds"]
        curve = client.get_metric_history(run.info.run_id, "train_loss")
        steps = [m.step for m in curve]
        assert len(curve) >= 10 and min(steps) < 100 and max(steps) == 1000
        assert all(0 <= m.step <= 1000 and m.value > 0 for m in curve)
        assert [m.value for m in client.get_metric_history(run.info.run_id, "curve_tokens_per_sec")][:1] == [1000.0]
        assert [m.value for m in client.get_metric_history(run.info.run_id, "val_bpb_run")] == e["runs"]
    keep, discard, crash = (runs[e["mlflow_run"]] for e in recorded[1:])
    assert keep.data.params["LR"] == "0.05" and "DEPTH" not in keep.data.params
    assert discard.data.params["DEPTH"] == "80" and crash.data.params["WARMUP"] == "0.2"
    patch = open(client.download_artifacts(keep.info.run_id, "diff.patch", str(curve2.parent))).read()
    assert "-LR = 0.04\n+LR = 0.05" in patch
    assert repo.ignored("mlflow.db", "mlartifacts") == ["mlflow.db", "mlartifacts"]       # never a stray file


def quiet_env(tmp_path, **extra):
    """agent.py's environment for a subprocess run on the tiny target: its cache, no budget override, no keys."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and not k.startswith("AUTORESEARCH_")}
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    (cache / "ready").touch()
    return {**env, "AUTORESEARCH_CACHE": str(cache), **extra}


def run_loop(target, env, *extra):
    argv = [sys.executable, str(AGENT), "--tag", "t", "--target", str(target), "--timeout", "20", *STRICT,
            "--no-holdout", "--proposer", "random", "--max-experiments", "2", *extra]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("store", ["under a file", "db is a directory"])
def test_a_store_mlflow_cannot_write_is_a_warning(tmp_path, store):
    target = make_target(tmp_path / "repo")
    if store == "under a file":             # (a missing dir MLflow creates; root writes where chmod says no)
        (tmp_path / "a-file").write_text("")
        uri = f"sqlite:///{tmp_path}/a-file/mlflow.db"
    else:
        (target / "mlflow.db").mkdir()
        uri = ""
    done = run_loop(target, quiet_env(tmp_path), "--mlflow", *([uri] if uri else []))
    assert done.returncode == 0, done.stderr
    assert len(rows(target)) == 3 and all(e["mlflow_run"] is None for e in events(target, "experiment"))
    warnings = [line for line in done.stdout.splitlines() if line.startswith("warning: mlflow:")]
    assert len(warnings) == 3, done.stdout                                 # one per experiment: each tries again
    assert "experiment #0 not tracked in sqlite:///" in warnings[0] and "make the store's directory" in warnings[0]
    assert "Traceback" not in done.stdout + done.stderr
    assert [e["where"] for e in events(target, "warning")] == ["mlflow"] * 3


LOCK = """import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(300)
"""


def test_a_store_locked_by_another_process_is_a_warning_and_its_libraries_stay_off_the_terminal(tmp_path):
    """mlflow.db held under an exclusive lock by another process: MLflow and SQLAlchemy log their tracebacks (four
    per experiment, before): they go to the tag's libraries.log, the terminal gets the harness's one warning per
    experiment, and every experiment is recorded."""
    target = make_target(tmp_path / "repo")
    argv = [sys.executable, str(AGENT), "--tag", "t", "--target", str(target), "--timeout", "20", *STRICT,
            "--no-holdout", "--proposer", "random", "--max-experiments", "1", "--mlflow"]
    proc = subprocess.Popen(argv, env=quiet_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_run(target, 1, proc, timeout=120)          # the store is open: locked from now on, mid-run
    locker = subprocess.Popen([sys.executable, "-c", LOCK, str(target / "mlflow.db")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert locker.stdout.readline() == "locked\n"
        out, err = proc.communicate(timeout=300)
    finally:
        locker.kill()
        locker.wait()
    assert proc.returncode == 0, err
    assert len(rows(target)) == 2 and events(target, "experiment")[1]["mlflow_run"] is None
    warnings = [line for line in out.splitlines() if line.startswith("warning: mlflow:")]
    assert len(warnings) == 1 and "database is locked" in warnings[0], out
    assert "Traceback" not in out + err and "sqlalchemy" not in err.lower(), err
    logged = (target / ".git" / "autoresearch" / "t" / files.LIBRARY_LOG).read_text()
    assert "database is locked" in logged


def test_mlflow_missing_is_said_once(tmp_path):
    target = make_target(tmp_path / "repo")
    shadow = tmp_path / "shadow" / "mlflow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no mlflow here')\n")
    done = run_loop(target, quiet_env(tmp_path, PYTHONPATH=str(shadow.parent)), "--mlflow")
    assert done.returncode == 0, done.stderr
    assert len(rows(target)) == 3 and all(e["mlflow_run"] is None for e in events(target, "experiment"))
    warnings = [line for line in done.stdout.splitlines() if "warning" in line]
    assert warnings == ["warning: mlflow: not installed (no mlflow here): `uv sync --extra tracking`; experiments are "
                        "recorded without MLflow"]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("uri", ["ftp://host/x", "mlflow.db"])
def test_a_bad_uri_exits_2(target, capsys, uri):
    with pytest.raises(SystemExit) as exit:
        agent.main(["--tag", "t", "--target", str(target), "--mlflow", uri])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert f"agent.py: error: --mlflow: {uri!r} is not an MLflow tracking URI: use sqlite:///PATH/mlflow.db" in err
    assert not (target / "events.jsonl").exists()


def test_no_flag_no_import():
    """Without --mlflow the harness never imports mlflow (the loop pays nothing for it)."""
    code = "import agent, harness.record.experiment, harness.tag.settings, sys; print('mlflow' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=AGENT.parent)
    assert done.stdout.strip() == "False", done.stderr


def test_the_store_is_no_stray_file_for_the_guard(target):
    """The guard's check around an unsandboxed run does not blame the store MLflow writes meanwhile (another
    experiment recorded while this one trains), and git sees no untracked file."""
    from harness import gitops
    from harness.run import guard
    repo = git.Repo(target)
    gitops.ensure_ignored(repo, [target / "mlflow.db", target / "mlartifacts"])
    snap = guard.take(repo, [target / "results.tsv", target / "events.jsonl"])
    (target / "mlflow.db").write_bytes(b"SQLite format 3\0")
    (target / "mlartifacts" / "0123" / "artifacts").mkdir(parents=True)
    (target / "mlartifacts" / "0123" / "artifacts" / "diff.patch").write_text("+LR = 0.05\n")
    assert guard.check(repo, snap) == []
    assert repo.git.status("--porcelain") == ""


def test_the_params_are_the_constants_an_edit_changed():
    from harness.propose.memory import constants_changed
    before = "LR = 0.04\nDEPTH = 8\nNAME = 'a'\nif PROFILE == 'cpu':\n    BATCH = 2**14\ndef f():\n    X = 1\n"
    after = before.replace("0.04", "4e-2").replace("8", "10").replace("'a'", "'b'").replace("2**14", "2**13")
    assert constants_changed(before, after.replace("X = 1", "X = 2")) == {
        "DEPTH": ("8", "10"), "NAME": ("'a'", "'b'"), "BATCH": ("2**14", "2**13")}     # not LR, not a local
    assert constants_changed(before, before.replace("DEPTH = 8\n", "")) == {"DEPTH": ("8", None)}
