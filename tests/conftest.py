"""Fixtures shared by the tests: the real corpora prepared with the cpu profile, and the tiny target of agent_target.py."""

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import filelock
import git
import pytest

from agent_target import CURVE_BUDGET, SECRET, make_curve_target, make_target  # the tiny targets
from helpers import CORPORA, REPO, USR_TREES_ENV, remove_planted, run_train, train_definitions


# The tests' evaluations score 8192 val tokens (32 rows of 256), not the cpu profile's 65,536: every evaluation of a
# real run (train.py's own and the separate evaluator's) takes ~1 s instead of ~7 s, and what the tests check (rows,
# verdicts, the evaluator agreeing with train.py, tampering caught) does not depend on the count.
TEST_EVAL_TOKENS = 8192

# The suite runs 4 pytest-xdist workers on 2 cores, so up to 4 torch processes of 2 threads each share them. OpenMP's
# default is to spin while a thread waits for the others; oversubscribed, the spinning takes the cores the work needs
# (3 train.py runs at once: 33 s spinning, 18.5 s passive; one alone: the same 10 s). Every process the tests start
# inherits this.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Python's compiled files are written and reused by the workers and the Pythons the tests start (agent.py's loops,
# prepare.py's checks), even where the shell says PYTHONDONTWRITEBYTECODE: without them each such process compiles
# the harness again (importing agent.py: 0.29 s instead of 0.18 s of CPU) and each worker rewrites the test modules'
# asserts again (~5 s). They go to __pycache__ folders, which git ignores.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def once(tmp_path_factory, worker_id, name, build):
    """The folder `name` made by build(folder) once per pytest run, shared by every pytest-xdist worker (the first
    builds it under a file lock, the others wait and read it; a build that fails leaves nothing, and the next worker
    tries again). Read-only for the tests. Without xdist (worker_id "master"), in the session's own basetemp."""
    root = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        root = root.parent                                  # this run's folder, above each worker's basetemp
    folder, done = root / name, root / f"{name}.done"
    with filelock.FileLock(root / f"{name}.lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)       # a failed build's leftovers
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


def prepare_cpu(cache):
    """prepare.py --profile cpu on the real corpora into cache, through the CLI, as a user would."""
    if not CORPORA.is_dir():
        pytest.fail(f"{CORPORA} is missing: the tests read the shared corpora beside the checkout")
    env = {**os.environ, "AUTORESEARCH_CACHE": str(cache)}
    result = subprocess.run([sys.executable, "prepare.py", "--source", str(CORPORA), "--profile", "cpu",
                             "--eval-tokens", str(TEST_EVAL_TOKENS)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr


def pytest_configure(config):
    """The run's list of files planted under /usr (helpers.remove_at_end), named before the xdist workers start."""
    if not hasattr(config, "workerinput"):
        fd, listed = tempfile.mkstemp(prefix="ar-test-usr-trees-")
        os.close(fd)
        os.environ[USR_TREES_ENV] = listed


def pytest_unconfigure(config):
    """At the run's end (every worker done): remove what the tests planted under /usr, and the list."""
    listed = os.environ.pop(USR_TREES_ENV, None) if not hasattr(config, "workerinput") else None
    if listed and os.path.exists(listed):
        remove_planted(Path(listed).read_text().splitlines())
        os.unlink(listed)


@pytest.fixture(scope="session")
def cpu_cache(tmp_path_factory, worker_id):
    """The real corpora (../shared/data/corpora) prepared with the CPU profile through the CLI, as a user would, with
    --eval-tokens TEST_EVAL_TOKENS; once per pytest run (`once`)."""
    return once(tmp_path_factory, worker_id, "cpu-cache", prepare_cpu)


@pytest.fixture(scope="session")
def train_defs():
    """train.py's definitions (helpers.train_definitions), executed once per session: its device setup measures the
    CPU's matmul speed, which takes seconds. A test that replaces an entry puts it back."""
    return train_definitions()


@pytest.fixture(scope="session")
def gpt_run(cpu_cache, tmp_path_factory, worker_id):
    """One real train.py run on the CPU profile's data (budget 4 s, seed 7, its model artifact exported), shared by
    the tests that read a real run's summary (test_train.py) or score its artifact (test_evaluate.py): (the
    CompletedProcess, the artifact's path). Once per pytest run (`once`)."""
    def build(folder):
        result = run_train(cpu_cache, budget=4, env={"AUTORESEARCH_SEED": "7",
                                                     "AUTORESEARCH_ARTIFACT": str(folder / "run" / "model.pt2")})
        (folder / "result.pickle").write_bytes(pickle.dumps(result))
    folder = once(tmp_path_factory, worker_id, "gpt-run", build)
    return pickle.loads((folder / "result.pickle").read_bytes()), folder / "run" / "model.pt2"


@pytest.fixture
def target(tmp_path, monkeypatch):
    """The tiny target with prepared data, an Anthropic key in the environment and no other overrides."""
    tiny_env(tmp_path, monkeypatch)
    return make_target(tmp_path / "repo")


@pytest.fixture
def curve_target(tmp_path, monkeypatch):
    """The tiny target whose train.py prints progress lines for a 5 s budget (agent_target.CURVE_TRAIN), in the
    same environment as `target`."""
    tiny_env(tmp_path, monkeypatch)
    return make_curve_target(tmp_path / "repo", CURVE_BUDGET)


def tiny_env(tmp_path, monkeypatch):
    """The tiny target's environment: its "prepared" cache, an Anthropic key, no budget override, no OpenAI key."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "ready").touch()
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(cache))
    monkeypatch.delenv("AUTORESEARCH_TIME_BUDGET", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)


@pytest.fixture
def real_repo(cpu_cache, tmp_path):
    """A throwaway repository holding the real pretraining target, and the environment to run agent.py in it."""
    repo_dir = tmp_path / "repo"
    repo_dir.mkdir()
    for name in ("prepare.py", "train.py", "program.md", ".gitignore"):
        shutil.copy(REPO / name, repo_dir / name)
    repo = git.Repo.init(repo_dir, initial_branch="main")
    repo.index.add(["prepare.py", "train.py", "program.md", ".gitignore"])
    repo.index.commit("initial")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(AUTORESEARCH_CACHE=str(cpu_cache), AUTORESEARCH_TIME_BUDGET="2", ANTHROPIC_API_KEY="test-key")
    return repo_dir, env


def grpo_env(cache):
    """The environment of the GRPO tests' processes: no AUTORESEARCH_ settings or API keys of the caller's, one
    thread, this cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTORESEARCH_") and not k.endswith("_API_KEY")}
    env.update(AUTORESEARCH_CACHE=str(cache), OMP_NUM_THREADS="1", ANTHROPIC_API_KEY="test-key")
    return env


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory, worker_id):
    """`grpo/tiny.py --out DIR` run once per pytest run (`once`), as a user would: the tiny Qwen2 (model/) and the
    one-digit sums task (sums/). Read-only: grpo_repo gives each test its own copy."""
    def build(folder):
        tiny = subprocess.run([sys.executable, "tiny.py", "--out", str(folder / "tiny")], cwd=REPO / "grpo",
                              env=grpo_env(folder / "cache"), capture_output=True, text=True, timeout=600)
        assert tiny.returncode == 0, tiny.stderr[-2000:]
    return once(tmp_path_factory, worker_id, "tiny-build", build) / "tiny"


@pytest.fixture
def grpo_repo(tmp_path, tiny_build):
    """A throwaway repository holding grpo/ with the tiny Qwen2 on one-digit sums prepared, and its environment.
    The model and task are a copy of the session's tiny.py build in tmp_path/tiny."""
    grpo = REPO / "grpo"
    env = grpo_env(tmp_path / "cache")
    shutil.copytree(tiny_build, tmp_path / "tiny")
    env.update(AUTORESEARCH_GRPO_MODEL=str(tmp_path / "tiny" / "model"), AUTORESEARCH_TIME_BUDGET="3")
    prepared = subprocess.run([sys.executable, "prepare.py", "--source", str(tmp_path / "tiny" / "sums"), "--force"],
                              cwd=grpo, env=env, capture_output=True, text=True, timeout=600)
    assert prepared.returncode == 0, prepared.stderr[-2000:]
    repo_dir = tmp_path / "repo"
    (repo_dir / "grpo").mkdir(parents=True)
    for name in ("prepare.py", "train.py", "program.md"):
        shutil.copy(grpo / name, repo_dir / "grpo" / name)
    shutil.copy(REPO / ".gitignore", repo_dir / ".gitignore")
    repo = git.Repo.init(repo_dir, initial_branch="main")
    repo.index.add([".gitignore", "grpo/prepare.py", "grpo/train.py", "grpo/program.md"])
    repo.index.commit("initial")
    return repo_dir / "grpo", env


def pytest_collection_modifyitems(items):
    """The slow tests first (stable otherwise): with pytest-xdist handing out one test at a time (pyproject.toml),
    the long ones start while the short ones fill the cores around them, instead of ending the run alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
