"""The loop on the GRPO target: agent.py drives grpo/train.py with the random proposer (the pretraining target is
driven, and report.py read, in tests/test_cheats_real.py)."""

import re
import subprocess
import sys

import git
import pytest

from helpers import REPO

pytestmark = pytest.mark.slow      # the loop trains the tiny Qwen2 with GRPO


def test_agent_runs_the_grpo_target_with_the_random_proposer(grpo_repo):
    """issue 5's end-to-end run: a tiny Qwen2 on one-digit sums (non-degenerate reward), 2 experiments."""
    target, env = grpo_repo
    repo_dir, repo = target.parent, git.Repo(target.parent)

    result = subprocess.run([sys.executable, str(REPO / "agent.py"), "--target", str(repo_dir / "grpo"), "--tag", "rl",
                             "--proposer", "random", "--max-experiments", "2", "--baseline-runs", "1"],
                            cwd=repo_dir, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "preflight" in result.stdout
    # the stop asks the real GRPO evaluator for the holdout: the tiny task's test sums are all in the evaluation subset
    assert result.stdout.endswith("holdout: not measured (no holdout: the test split's 100 problems are all in the "
                                  "evaluation subset)\n")
    lines = (repo_dir / "grpo" / "results.tsv").read_text().splitlines()
    assert lines[0] == "commit\tpass@1\tmemory_gb\tstatus\tdescription" and len(lines) == 4
    rows = [line.split("\t") for line in lines[1:]]
    # a shortened budget (AUTORESEARCH_TIME_BUDGET=3 in env): every row is labelled as a smoke run
    assert rows[0][3:] == ["keep", "[budget 3s] baseline"]
    # the baseline's number is the separate evaluator's count of right answers (the warm start's greedy "7" is right
    # for 12 of the 100 sums; a few GRPO steps at the tag's random seed may move it either way, so no value is fixed)
    log = (repo_dir / ".git" / "autoresearch" / "rl" / "logs" / "0000-0.log").read_text()
    scored = log.split("=== separate evaluation")[-1]
    correct, total = (int(re.search(rf"^{k}:\s+(\d+)$", scored, re.M).group(1)) for k in ("correct", "num_problems"))
    assert total == 100 and float(rows[0][1]) == pytest.approx(correct / total, abs=1e-6), log[-3000:]
    # a run repeated (throughput off, or a confirmation) says how many runs its mean is of
    move = r"[A-Z_0-9]+ \S+ -> \S+"                 # a sampled point: its largest moves named, then "+N more"
    smoke = rf"\[budget 3s\] random: {move}(, {move})*(, \+\d+ more)?( \(\d runs\))?"
    assert all(re.fullmatch(smoke, row[4]) for row in rows[1:]), rows
    kept = [row for row in rows if row[3] == "keep"]
    assert all(float(b[1]) > float(a[1]) for a, b in zip(kept, kept[1:]))  # higher is better here
    assert repo.commit("autoresearch/rl").hexsha.startswith(kept[-1][0])
    assert not repo.is_dirty()
