"""The loop on the real pretraining target: agent.py drives the real train.py, report.py reads what it wrote."""

import re
import subprocess
import sys
from pathlib import Path

import git

REPO = Path(__file__).resolve().parents[1]


def test_agent_runs_the_real_train_py_and_the_report_reads_it(real_repo):
    repo_dir, env = real_repo
    repo = git.Repo(repo_dir)

    result = subprocess.run([sys.executable, str(REPO / "agent.py"), "--tag", "it", "--proposer", "random",
                             "--max-experiments", "1", "--seed", "3", "--target", str(repo_dir)],
                            cwd=repo_dir, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]

    lines = (repo_dir / "results.tsv").read_text().splitlines()
    assert lines[0] == "commit\tval_bpb\tmemory_gb\tstatus\tdescription"
    assert len(lines) == 3
    baseline, experiment = (line.split("\t") for line in lines[1:])
    assert baseline[3:] == ["keep", "baseline"] and baseline[2] == "0.0"  # a CPU has no VRAM
    assert re.fullmatch(r"\d\.\d{6}", baseline[1]) and 0.5 < float(baseline[1]) < 11
    assert re.fullmatch(r"random: [A-Z_0-9]+ \S+ -> \S+", experiment[4])
    assert experiment[3] in ("keep", "discard", "crash")
    branch = repo.commit("autoresearch/it")
    kept = [row[0] for row in (baseline, experiment) if row[3] == "keep"]
    assert branch.hexsha.startswith(kept[-1])
    assert not repo.is_dirty()
    assert repo.git.show(f"{experiment[0]}:prepare.py") == (REPO / "prepare.py").read_text().rstrip("\n")

    report = subprocess.run([sys.executable, str(REPO / "report.py"), str(repo_dir / "results.tsv"), "--tag", "it"],
                            cwd=repo_dir, capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    keeps = sum(row[3] == "keep" for row in (baseline, experiment))
    assert f"baseline + 1: {keeps} keep" in report.stdout
    assert f"baseline     {baseline[1]}" in report.stdout
    assert (repo_dir / "progress.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_agent_runs_the_grpo_target_with_the_random_proposer(grpo_repo):
    """issue 5's end-to-end run: a tiny Qwen2 on one-digit sums (non-degenerate reward), 2 experiments."""
    target, env = grpo_repo
    repo_dir, repo = target.parent, git.Repo(target.parent)

    result = subprocess.run([sys.executable, str(REPO / "agent.py"), "--target", str(repo_dir / "grpo"), "--tag", "rl",
                             "--proposer", "random", "--max-experiments", "2"],
                            cwd=repo_dir, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "preflight" in result.stdout
    lines = (repo_dir / "grpo" / "results.tsv").read_text().splitlines()
    assert lines[0] == "commit\tpass@1\tmemory_gb\tstatus\tdescription" and len(lines) == 4
    rows = [line.split("\t") for line in lines[1:]]
    assert rows[0][3:] == ["keep", "baseline"] and 0.0 < float(rows[0][1]) < 1.0
    assert all(re.fullmatch(r"random: [A-Z_0-9]+ \S+ -> \S+", row[4]) for row in rows[1:])
    kept = [row for row in rows if row[3] == "keep"]
    assert all(float(b[1]) > float(a[1]) for a, b in zip(kept, kept[1:]))  # higher is better here
    assert repo.commit("autoresearch/rl").hexsha.startswith(kept[-1][0])
    assert not repo.is_dirty()
