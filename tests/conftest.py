"""Fixtures shared by the tests: the real corpora prepared with the cpu profile, and the tiny target of agent_target.py."""

import os
import shutil
import subprocess
import sys

import git
import pytest

from agent_target import CURVE_BUDGET, SECRET, make_curve_target, make_target  # the tiny targets
from helpers import CORPORA, REPO, run_train, train_definitions


# The tests' evaluations score 8192 val tokens (32 rows of 256), not the cpu profile's 65,536: every evaluation of a
# real run (train.py's own and the separate evaluator's) takes ~1 s instead of ~7 s, and what the tests check (rows,
# verdicts, the evaluator agreeing with train.py, tampering caught) does not depend on the count.
TEST_EVAL_TOKENS = 8192


@pytest.fixture(scope="session")
def cpu_cache(tmp_path_factory):
    """The real corpora (../shared/data/corpora) prepared with the CPU profile through the CLI, as a user would, with
    --eval-tokens TEST_EVAL_TOKENS."""
    if not CORPORA.is_dir():
        pytest.fail(f"{CORPORA} is missing: the tests read the shared corpora beside the checkout")
    cache = tmp_path_factory.mktemp("cpu-cache")
    env = {**os.environ, "AUTORESEARCH_CACHE": str(cache)}
    result = subprocess.run([sys.executable, "prepare.py", "--source", str(CORPORA), "--profile", "cpu",
                             "--eval-tokens", str(TEST_EVAL_TOKENS)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return cache


@pytest.fixture(scope="session")
def train_defs():
    """train.py's definitions (helpers.train_definitions), executed once per session: its device setup measures the
    CPU's matmul speed, which takes seconds. A test that replaces an entry puts it back."""
    return train_definitions()


@pytest.fixture(scope="session")
def gpt_run(cpu_cache, tmp_path_factory):
    """One real train.py run on the CPU profile's data (budget 4 s, seed 7, its model artifact exported), shared by
    the tests that read a real run's summary (test_train.py) or score its artifact (test_evaluate.py): (the
    CompletedProcess, the artifact's path)."""
    artifact = tmp_path_factory.mktemp("gpt-run") / "run" / "model.pt2"
    result = run_train(cpu_cache, budget=4, env={"AUTORESEARCH_SEED": "7", "AUTORESEARCH_ARTIFACT": str(artifact)})
    return result, artifact


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
def tiny_build(tmp_path_factory):
    """`grpo/tiny.py --out DIR` run once per session, as a user would: the tiny Qwen2 (model/) and the one-digit
    sums task (sums/). Read-only: grpo_repo gives each test its own copy."""
    out = tmp_path_factory.mktemp("tiny-build") / "tiny"
    tiny = subprocess.run([sys.executable, "tiny.py", "--out", str(out)], cwd=REPO / "grpo",
                          env=grpo_env(out.parent / "cache"), capture_output=True, text=True, timeout=600)
    assert tiny.returncode == 0, tiny.stderr[-2000:]
    return out


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
