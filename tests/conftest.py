"""Fixtures shared by the tests of the pretraining core and of the loop on it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
