"""Fixtures shared by the tests: the real corpora prepared with the cpu profile, and the tiny target of agent_target.py."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import git
import pytest

from agent_target import SECRET, make_target  # the tiny target of test_agent.py and test_cheats.py

REPO = Path(__file__).resolve().parents[1]
CORPORA = REPO.parent / "shared" / "data" / "corpora"


@pytest.fixture(scope="session")
def cpu_cache(tmp_path_factory):
    """The real corpora (../shared/data/corpora) prepared with the CPU profile through the CLI, as a user would."""
    if not CORPORA.is_dir():
        pytest.fail(f"{CORPORA} is missing: the tests read the shared corpora beside the checkout")
    cache = tmp_path_factory.mktemp("cpu-cache")
    env = {**os.environ, "AUTORESEARCH_CACHE": str(cache)}
    result = subprocess.run([sys.executable, "prepare.py", "--source", str(CORPORA), "--profile", "cpu"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return cache


@pytest.fixture
def target(tmp_path, monkeypatch):
    """The tiny target with prepared data, an Anthropic key in the environment and no other overrides."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "ready").touch()
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(cache))
    monkeypatch.delenv("AUTORESEARCH_TIME_BUDGET", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    return make_target(tmp_path / "repo")


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


@pytest.fixture
def grpo_repo(tmp_path):
    """A throwaway repository holding grpo/ with the tiny Qwen2 on one-digit sums prepared, and its environment."""
    grpo = REPO / "grpo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTORESEARCH_") and not k.endswith("_API_KEY")}
    env.update(AUTORESEARCH_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1", ANTHROPIC_API_KEY="test-key")
    tiny = subprocess.run([sys.executable, "tiny.py", "--out", str(tmp_path / "tiny")], cwd=grpo, env=env,
                          capture_output=True, text=True, timeout=600)
    assert tiny.returncode == 0, tiny.stderr[-2000:]
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
