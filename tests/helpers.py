"""Helpers shared by the tests (import them from here, never from another test module). Fixtures stay in
conftest.py; the tiny target is agent_target.py, the loopback LLM llm_server.py."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import git
import pytest

from agent_target import STRICT, edit

REPO = Path(__file__).resolve().parents[1]          # the repository root: agent.py, prepare.py, train.py, grpo/
AGENT = REPO / "agent.py"
CORPORA = REPO.parent / "shared" / "data" / "corpora"

# The files a test plants under /usr (as root) are removed when the whole pytest run ends, not when the test does:
# another worker's sandbox may have found them a moment before (view.foreign_trees) and be about to hide them, and
# bubblewrap fails on a mount point that vanished in between ("Can't mkdir /usr/lib/ar-test-...: Read-only file
# system"). conftest.py names the list's file in this variable and empties it at the run's end.
USR_TREES_ENV = "PYTEST_AR_USR_TREES"


def remove_at_end(*paths):
    """Remove these planted files and folders when the pytest run ends (now where no run's list is named)."""
    listed = os.environ.get(USR_TREES_ENV)
    if listed is None:
        return remove_planted([str(p) for p in paths])
    with open(listed, "a") as f:                        # one short appended write: the workers' lines do not mix
        f.write("".join(f"{path}\n" for path in paths))


def remove_planted(paths):
    """Remove each path (a folder with what it holds, or a file); gone already is fine."""
    for path in map(Path, paths):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------
# The loop on the tiny target (tests/agent_target.py): baseline val_bpb 1 + 10*|LR - 0.05| + DEPTH/1000 = 1.108000
# ---------------------------------------------------------------------------

RAISE_LR = edit("raise LR", "LR = 0.04", "LR = 0.05")           # -> 1.008000, keep
LOWER_LR = edit("lower LR", "LR = 0.05", "LR = 0.03")           # after RAISE_LR -> 1.208000, discard
SLOW = edit("slow and better", "LR = 0.04\nDEPTH = 8\nWARMUP = 0.1\nSLEEP = 0.0",
            "LR = 0.05\nDEPTH = 8\nWARMUP = 0.1\nSLEEP = 30.0")


def run_agent(target, llm=None, provider="anthropic", *extra):
    """agent.main in-process on tag t, with the loopback LLM for this provider when llm is given."""
    import agent
    argv = ["--tag", "t", "--target", str(target), "--timeout", "20", "--retry-base-delay", "0.01", *STRICT,
            "--no-speculate", *extra]
    if llm is not None:
        argv += ["--proposer", provider, "--base-url", llm.anthropic_url if provider == "anthropic" else
                 llm.openai_url]
    return agent.main(argv)


def rows(target):
    """results.tsv without its header."""
    lines = (target / "results.tsv").read_text().splitlines()
    return lines[1:]


def events(target, kind=None):
    """events.jsonl, optionally only one kind of event."""
    all_events = [json.loads(line) for line in (target / "events.jsonl").read_text().splitlines()]
    return [e for e in all_events if kind is None or e["event"] == kind]


def page_data(page):
    """The data block of a dashboard page (harness/record/dashboard.py), as the page's script reads it."""
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', Path(page).read_text(), re.S)
    return json.loads(found.group(1))


def sha(target, rev):
    """The full sha of a revision in the target's repository."""
    return git.Repo(target, search_parent_directories=True).commit(rev).hexsha


def tree_is_clean(target):
    """No tracked file differs from HEAD."""
    return git.Repo(target, search_parent_directories=True).git.status("--porcelain", "--untracked-files=no") == ""


def baseline_row(target):
    """The results.tsv row the tiny target's baseline must produce."""
    return f"{sha(target, 'main')[:7]}\t1.108000\t0.0\tkeep\tbaseline"


def steer_on_branch(target, text):
    """A human's commit of new directions in program.md on autoresearch/t (switching there and back); its sha."""
    repo = git.Repo(target)
    repo.git.switch("autoresearch/t")
    (target / "program.md").write_text(text)
    repo.git.commit("-qam", "steer: new directions")
    repo.git.switch("main")
    return repo.commit("autoresearch/t").hexsha


def live_members(pgid):
    """Processes of group pgid that are not zombies (a container's PID 1 may never reap an orphan)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def start_agent(target, llm, *extra):
    """agent.py as a separate process (so that it can be killed), talking to the loopback LLM."""
    argv = [sys.executable, str(AGENT), "--tag", "t", "--target", str(target), "--timeout", "60",
            "--proposer", "anthropic", "--base-url", llm.anthropic_url, *STRICT, "--no-speculate", *extra]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for_run(target, n, proc, timeout=30):
    """Wait until experiment n's training has started; returns its process group id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (target / "events.jsonl").exists():
            found = [e for e in events(target, "run") if e["n"] == n]
            if found:
                return found[0]["pgid"]
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    raise AssertionError(f"no run {n} started")

# ---------------------------------------------------------------------------
# The real pretraining target: train.py and prepare.py
# ---------------------------------------------------------------------------


def train_definitions():
    """Execute train.py up to its hyperparameter section: the device setup, model and optimizer
    definitions, without loading data or training. Returns the resulting namespace."""
    source = (REPO / "train.py").read_text()
    head = source.split("# Prepared data and hyperparameters")[0]
    namespace = {"__name__": "train_definitions", "SOFTCAP": 15.0}
    exec(compile(head, str(REPO / "train.py"), "exec"), namespace)
    return namespace


def run_train(cache, budget, script=REPO / "train.py", cwd=REPO, env=None):
    """train.py as a process on a prepared cache with this time budget; the CompletedProcess."""
    import prepare as P
    env = {**os.environ, "AUTORESEARCH_CACHE": str(cache), P.TIME_BUDGET_ENV: str(budget), **(env or {})}
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def parse_summary(stdout):
    """The last `---` summary block of a run's stdout as {key: text}."""
    block = stdout.split("\n---\n")[-1]
    return dict(re.match(r"^(\w+):\s+(.*)$", line).groups() for line in block.strip().splitlines())


def _bigram():
    import torch

    class Bigram(torch.nn.Module):
        """Logits from the current token only: causal, and not uniform."""

        def __init__(self, V):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(V, V, generator=torch.Generator().manual_seed(1)))

        def forward(self, x):
            return self.table[x]
    Bigram.__qualname__ = "Bigram"            # helpers.Bigram, as if defined at the top level
    return Bigram


def __getattr__(name):
    """Bigram (the causal, non-uniform model of the evaluator tests) is made on first use, so that importing the
    helpers does not import torch."""
    if name == "Bigram":
        globals()["Bigram"] = _bigram()
        return globals()["Bigram"]
    raise AttributeError(name)

# ---------------------------------------------------------------------------
# The sandbox and what a process opens
# ---------------------------------------------------------------------------


def in_ci():
    """Whether this runs in CI, where a missing tool is a failure, not a skip."""
    return os.environ.get("CI", "").lower() in ("true", "1")


def require_bwrap():
    """Skip unless bubblewrap works here; fail instead in CI."""
    from harness.run import sandbox
    reason = sandbox.probe()
    if reason is not None:
        # CI installs bubblewrap: a skip there would hide a regression.
        if in_ci():
            pytest.fail(f"bubblewrap unusable in CI: {reason}")
        pytest.skip(reason)


def opened_outside(argv, cwd, env, trace, allowed):
    """Run argv under strace (every open, all threads and children) and return (the set of files it opened, those of
    them outside `allowed`: paths, with the system's, the environment's and the private /tmp's added). Skips the
    test where strace is missing (fails in CI, which installs it)."""
    from harness.run import view
    strace = shutil.which("strace")
    if strace is None:
        if in_ci():
            pytest.fail("strace is not installed in CI (.ci/run installs it)")
        pytest.skip("strace is not installed")
    out = subprocess.run([strace, "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", str(trace), *map(str, argv)],
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    opened = {Path(m.group(1)).resolve() for m in
              re.finditer(r'open(?:at2?)?\((?:AT_FDCWD, |\d+, )?"([^"]+)".*\) = \d+', Path(trace).read_text())}
    roots = [p.resolve() for p, _ in view.system_view()] + \
        [Path(p).resolve() for p in ("/etc", "/proc", "/sys", "/dev", "/tmp")] + \
        [p.resolve() for p in view.environment()] + [Path(p).resolve() for p in allowed]
    return opened, sorted(str(p) for p in opened if not any(p == r or p.is_relative_to(r) for r in roots))
