"""
Tests for `agent.py try`, the one-experiment command external coding agents use (program.md's loop), offline, on the
tiny target of tests/agent_target.py (baseline val_bpb 1.108000; LR = 0.05 gives 1.008000). Each test edits train.py
in the checkout as an agent would, runs `try`, and checks the verdict block, the rows, the branch and the checkout.
"""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import git
import pytest

import agent
import report
from agent_target import SECRET, STRICT, edit, make_noisy_target
from harness.run.conditions import Allowance
from llm_server import ScriptedLLM
from helpers import AGENT, events, rows, sha, steer_on_branch, tree_is_clean, wait_for_run


def try_(target, *extra):
    """`agent.py try --tag t` in-process; returns its exit code."""
    return agent.main(["try", "--tag", "t", "--target", str(target), "--timeout", "20", *STRICT, *extra])


def set_lr(target, lr):
    """Edit train.py in the checkout as an agent would."""
    path = target / "train.py"
    text = path.read_text()
    old = next(line for line in text.splitlines() if line.startswith("LR = "))
    path.write_text(text.replace(old, f"LR = {lr}"))


def block(out):
    """The verdict block's key: value lines as a dict."""
    lines = [part for part in out.split("---\n") if part.startswith("experiment:")][-1].splitlines()
    return dict(line.split(":", 1) for line in lines if ":" in line and not line.startswith(" "))


def value(out, key):
    return block(out)[key].strip()


def test_baseline_then_keep_discard_crash_and_fix(target, capsys):
    head = sha(target, "HEAD")
    assert try_(target, "--baseline") == 0
    out = capsys.readouterr().out
    assert value(out, "status") == "keep" and value(out, "val_bpb") == "1.108000"
    assert value(out, "experiment") == "0" and sha(target, "autoresearch/t") == head

    set_lr(target, 0.05)
    assert try_(target, "-m", "raise LR to 0.05") == 0
    out = capsys.readouterr().out
    keep = events(target, "experiment")[1]
    assert (value(out, "status"), value(out, "val_bpb")) == ("keep", "1.008000")
    assert value(out, "delta") == "-0.100000 vs the best before it (1.108000)"
    assert value(out, "reason") == "kept: its run beat the best"
    assert rows(target)[1] == f"{keep['commit']}\t1.008000\t0.0\tkeep\traise LR to 0.05"
    assert sha(target, "autoresearch/t") == keep["full_commit"]
    assert git.Repo(target).commit(keep["full_commit"]).parents[0].hexsha == head
    assert "LR = 0.05" in (target / "train.py").read_text()          # the checkout holds the best
    assert sha(target, "HEAD") == head                               # and is still on main

    set_lr(target, 0.03)
    assert try_(target, "-m", "lower LR") == 0
    out = capsys.readouterr().out
    assert (value(out, "status"), value(out, "val_bpb")) == ("discard", "1.208000")
    assert value(out, "best").startswith("1.008000 (#1")
    assert (value(out, "runs"), value(out, "reason")) == ("1.208000 (one run: it decides)",
                                                          "not kept: its run did not beat the best")
    assert "LR = 0.05" in (target / "train.py").read_text()          # restored to the best
    assert sha(target, "autoresearch/t") == keep["full_commit"]

    (target / "train.py").write_text((target / "train.py").read_text().replace("import json", "import jsonn"))
    assert try_(target, "-m", "a typo") == 0
    out = capsys.readouterr().out
    crash = events(target, "experiment")[3]
    assert value(out, "status") == "crash" and "ModuleNotFoundError: No module named 'jsonn'" in out
    assert f"git show {crash['commit']}:train.py > train.py" in value(out, "to fix") and "fix 1 of at most 2" in out
    assert rows(target)[3].startswith(f"{crash['commit']}\t0.000000\t0.0\tcrash\ta typo (exit code 1")
    assert "jsonn" not in (target / "train.py").read_text()

    # the fix: the crashed commit is amended (same parent, the fix in its message) and measured as a new row
    repo = git.Repo(target)
    (target / "train.py").write_text(repo.git.show(f"{crash['commit']}:train.py").replace("jsonn", "json")
                                     .replace("DEPTH = 8", "DEPTH = 4"))
    assert try_(target, "--fix", "-m", "import json, not jsonn") == 0
    out = capsys.readouterr().out
    fixed = events(target, "experiment")[4]
    assert (value(out, "status"), value(out, "val_bpb")) == ("keep", "1.004000")
    assert (fixed["fix_of"], fixed["fixes"], fixed["description"]) == (3, 1, "a typo (fix 1: import json, not jsonn)")
    commit = repo.commit(fixed["full_commit"])
    assert commit.parents[0].hexsha == keep["full_commit"] and "fix 1: import json, not jsonn" in commit.message
    assert [r.split("\t")[3] for r in rows(target)] == ["keep", "keep", "discard", "crash", "keep"]
    assert tree_is_clean(target) is False and "DEPTH = 4" in (target / "train.py").read_text()


def test_refusals_change_nothing(target, capsys):
    assert try_(target, "-m", "too early") == 2
    assert "no baseline yet" in capsys.readouterr().err
    assert try_(target, "--baseline") == 0
    ledger = (target / "events.jsonl").read_bytes()
    assert try_(target, "-m", "nothing edited") == 2 and try_(target, "--fix", "-m", "no crash") == 2
    capsys.readouterr()
    assert agent.main(["try", "--tag", "tt", "--target", str(target), *STRICT, "-m", "a typo'd tag"]) == 2
    assert "tag 'tt' has no baseline yet: run `uv run agent.py try --tag tt --baseline` first (tags with experiments " \
           "here: t; a typo?)" in capsys.readouterr().err
    assert (target / "events.jsonl").read_bytes() == ledger                  # not even a "start" event
    assert try_(target, "--baseline") == 2
    assert "already has its baseline" in capsys.readouterr().err
    assert try_(target, "-m", "nothing edited") == 2
    assert "unchanged: edit it with one idea first" in capsys.readouterr().err
    assert try_(target, "--fix", "-m", "no crash to fix") == 2
    assert "--fix amends a crashed candidate" in capsys.readouterr().err

    set_lr(target, 0.03)
    assert try_(target, "-m", "lower LR") == 0
    set_lr(target, 0.03)                          # the same code again (a comment added): refused, with its number
    (target / "train.py").write_text((target / "train.py").read_text().replace("LR = 0.03", "LR = 0.03    # again\n\n"))
    assert try_(target, "-m", "lower LR again") == 2
    err = capsys.readouterr().err
    assert "is the code of experiment #1 (discard, val_bpb 1.208000: lower LR) (comments and spacing aside)" in err
    (target / "prepare.py").write_text((target / "prepare.py").read_text() + "\n# tampered\n")
    set_lr(target, 0.06)
    assert try_(target, "-m", "with a frozen file edited") == 2
    assert "uncommitted changes to prepare.py" in capsys.readouterr().err
    assert len(rows(target)) == 2 and len(events(target, "experiment")) == 2


def test_try_and_the_loop_share_one_tag(target, capsys, tmp_path):
    """Baseline and 2 experiments with try, then the loop continues the same tag, then try again: one history,
    one row per experiment, one baseline in the report."""
    assert try_(target, "--baseline") == 0
    set_lr(target, 0.05)
    assert try_(target, "-m", "raise LR") == 0
    set_lr(target, 0.04)                                             # back to the baseline's file: a duplicate
    assert try_(target, "-m", "back to 0.04") == 2
    set_lr(target, 0.07)
    assert try_(target, "-m", "LR 0.07") == 0
    capsys.readouterr()
    with ScriptedLLM([edit("shallower", "DEPTH = 8", "DEPTH = 2"), edit("deeper", "DEPTH = 2", "DEPTH = 3")]) as llm:
        assert agent.main(["--tag", "t", "--target", str(target), "--timeout", "20", *STRICT, "--no-speculate", "--proposer", "anthropic",
                           "--base-url", llm.anthropic_url, "--max-experiments", "4"]) == 0
    assert "3 experiments so far" in capsys.readouterr().out  # the checkout's train.py is a measured one: accepted
    history = events(target, "experiment")
    assert [(e["n"], e["status"]) for e in history] == [(0, "keep"), (1, "keep"), (2, "discard"), (3, "keep"),
                                                         (4, "discard")]
    assert len(rows(target)) == 5 and sum(e["description"] == "baseline" for e in history) == 1

    set_lr(target, 0.051)                           # an edit of the old best would undo the loop's keep: refused
    assert try_(target, "-m", "stale edit") == 2
    assert "--sync" in capsys.readouterr().err
    assert try_(target, "--sync") == 0
    saved = capsys.readouterr().out.split("saved to ")[1].split()[0]
    assert "LR = 0.051" in Path(saved).read_text()  # the stale edit is kept, not lost
    assert (target / "train.py").read_text() == git.Repo(target).git.show(f"{history[3]['full_commit']}:train.py") + "\n"
    set_lr(target, 0.0501)                          # LR up again after #2 (LR up) was discarded: the tabu refuses it
    assert try_(target, "-m", "LR 0.0501") == 2
    assert "refused: it repeats the change of experiment #2 (discard: LR 0.07): LR up." in capsys.readouterr().err
    assert [(e["n"], e["rule"], e["repeats"], e["by"]) for e in events(target, "refused")] == [(5, "tabu", 2, "try")]
    assert len(rows(target)) == 5
    assert try_(target, "-m", "LR 0.0501", "--force") == 0           # --force: a human may insist
    assert [e["n"] for e in events(target, "forced")] == [5]
    last = events(target, "experiment")[-1]
    assert (last["n"], last["status"], last["metric"]) == (5, "discard", 1.003)   # 1 + 0.001 + 0.002
    assert git.Repo(target).commit(last["full_commit"]).parents[0].hexsha == history[3]["full_commit"]

    results = report.load_results(target / "results.tsv")
    assert len(results.rows) == 6 and sum(r.description == "baseline" for r in results.rows) == 1
    assert json.loads((target / "events.jsonl").read_text().splitlines()[-1])["tag"] == "t"


@pytest.mark.parametrize("flags, message", [
    (["--fix", "--baseline"], "--fix needs -m"),
    (["--fix"], "one of the arguments -m/--message --baseline --sync is required"),
    (["-m", "\x00\x1b"], "-m: describe the idea"),
    (["--baseline", "-m", "x"], "not allowed with"),
])
def test_bad_flags_exit_2(target, capsys, flags, message):
    with pytest.raises(SystemExit) as e:
        try_(target, *flags)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_the_loop_sends_a_duplicate_back_to_the_llm_with_the_earlier_number(target):
    """An answer whose train.py was already measured (any status) is refused like a bad edit, naming the experiment."""
    shallower = edit("shallower", "DEPTH = 8", "DEPTH = 2")
    lower = edit("lower LR", "LR = 0.05", "LR = 0.03")
    with ScriptedLLM([edit("raise LR", "LR = 0.04", "LR = 0.05"), lower, lower, shallower]) as llm:
        assert agent.main(["--tag", "t", "--target", str(target), "--timeout", "20", *STRICT, "--no-speculate", "--proposer", "anthropic",
                           "--base-url", llm.anthropic_url, "--max-experiments", "3"]) == 0
    repair = events(target, "repair")
    assert len(repair) == 1 and repair[0]["n"] == 3 and repair[0]["error"].startswith(
        "the resulting train.py is the code of experiment #2 (discard, val_bpb 1.208000: lower LR)")
    assert "the code of experiment #2" in llm.requests[-1][1]["messages"][-1]["content"]
    assert [e["description"] for e in events(target, "experiment")] == ["baseline", "raise LR", "lower LR", "shallower"]


# ---------------------------------------------------------------------------
# Found by a hostile tester of `try`: each a test
# ---------------------------------------------------------------------------


def start_try(target, *extra):
    """`agent.py try --tag t` as a separate process (so that the test can act while it trains)."""
    argv = [sys.executable, str(AGENT), "try", "--tag", "t", "--target", str(target), "--timeout", "60", *STRICT,
            *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sandbox", ["auto", pytest.param("off", marks=pytest.mark.slow)])
def test_your_work_during_a_run_is_never_undone(target, sandbox):
    """Steering program.md, committing on main, stashing, editing the next idea in train.py while `try` trains: all
    of it stays. Inside the sandbox it is not the run's doing, so the run is judged normally; without the sandbox
    the harness cannot tell, so the run is rejected, but still nothing of yours is reverted."""
    assert try_(target, "--baseline", "--sandbox", sandbox) == 0
    repo = git.Repo(target)
    set_lr(target, 0.05)
    text = (target / "train.py").read_text()
    (target / "train.py").write_text(text.replace("SLEEP = 0.0", "SLEEP = 3.0"))
    proc = start_try(target, "-m", "raise LR, slowly", "--sandbox", sandbox)
    wait_for_run(target, 1, proc)
    (target / "program.md").write_text("steer: try DEPTH next\n")
    (target / "notes.md").write_text("mine\n")
    repo.git.add("notes.md")
    repo.git.commit("-qm", "my notes")
    mine = repo.head.commit.hexsha
    (target / "train.py").write_text(text.replace("WARMUP = 0.1", "WARMUP = 0.5"))      # the next idea, early
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (target / "program.md").read_text() == "steer: try DEPTH next\n"
    assert sha(target, "main") == mine and (target / "notes.md").read_text() == "mine\n"
    assert "WARMUP = 0.5" in (target / "train.py").read_text()          # not overwritten by the best
    assert "changed by you during the run: left as it is" in out
    status = value(out, "status")
    assert status == ("keep" if sandbox == "auto" else "crash"), out
    if sandbox == "off":
        assert "(not undone" in events(target, "experiment")[1]["description"]


def test_a_git_filter_cannot_change_what_is_measured(target, capsys):
    """A smudge filter (from your config and info/attributes, or one a run wrote there) would rewrite train.py or
    prepare.py on export; runs are exported from the blobs. A clean filter that rewrites the commit stops."""
    assert try_(target, "--baseline") == 0
    repo = git.Repo(target)
    (Path(repo.git_dir) / "info" / "attributes").write_text("train.py filter=x\nprepare.py filter=x\n")
    repo.git.config("filter.x.smudge", "sed s/^DEPTH\\ =\\ 8/DEPTH\\ =\\ 0/")
    repo.git.config("filter.x.clean", "cat")
    set_lr(target, 0.041)
    assert try_(target, "-m", "tiny LR change") == 0
    assert value(capsys.readouterr().out, "val_bpb") == "1.098000"        # 1 + 0.09 + 8/1000: DEPTH 8 as committed
    repo.git.config("filter.x.clean", "sed s/^LR\\ =\\ 0.042/LR\\ =\\ 0.05/")
    set_lr(target, 0.042)
    assert try_(target, "-m", "LR 0.042") == 1
    assert "a git filter" in capsys.readouterr().err and len(rows(target)) == 2


def test_a_tag_keeps_its_sandbox_like_its_budget(target, capsys):
    assert try_(target, "--baseline") == 0
    set_lr(target, 0.05)
    assert try_(target, "-m", "raise LR", "--sandbox", "off") == 2
    assert "was measured inside the sandbox" in capsys.readouterr().err and len(rows(target)) == 1


def test_a_refused_baseline_changes_nothing_and_its_advice_works(target, capsys):
    set_lr(target, 0.045)
    assert try_(target, "--baseline") == 2
    assert "commit it first" in capsys.readouterr().err
    assert "autoresearch/t" not in git.Repo(target).heads and not (target / "events.jsonl").exists()
    git.Repo(target).git.commit("-qam", "tuned")
    assert try_(target, "--baseline") == 0 and rows(target)[0].split("\t")[1] == "1.058000"


def test_a_secret_in_the_message_is_redacted_in_the_commit_too(target):
    assert try_(target, "--baseline") == 0
    set_lr(target, 0.05)
    assert try_(target, "-m", f"raise LR {SECRET}") == 0
    log = git.Repo(target).git.log("--format=%B", "autoresearch/t")
    assert SECRET not in log and "[redacted]" in log


def test_a_fix_after_your_commit_on_the_branch_goes_on_top_of_it(target, capsys):
    assert try_(target, "--baseline") == 0
    (target / "train.py").write_text((target / "train.py").read_text().replace("import json", "import jsonn"))
    assert try_(target, "-m", "a typo") == 0
    crash = events(target, "experiment")[1]
    repo = git.Repo(target)
    steer = steer_on_branch(target, "steer\n")
    (target / "train.py").write_text(repo.git.show(f"{crash['commit']}:train.py").replace("jsonn", "json")
                                     .replace("LR = 0.04", "LR = 0.05") + "\n")
    assert try_(target, "--fix", "-m", "import json") == 0
    fixed = events(target, "experiment")[2]
    assert fixed["status"] == "keep" and repo.commit(fixed["full_commit"]).parents[0].hexsha == steer


def test_two_targets_cannot_share_a_tag(target, tmp_path, capsys):
    assert try_(target, "--baseline") == 0
    other = target / "rl"
    other.mkdir()
    for name in ("program.md", "prepare.py", "train.py"):
        (other / name).write_text((target / name).read_text())
    repo = git.Repo(target)
    repo.git.add("rl")
    repo.git.commit("-qm", "a second target")
    assert agent.main(["try", "--tag", "t", "--target", str(other), "--baseline", *STRICT]) == 2
    assert "belongs to the target '(the repository root)'" in capsys.readouterr().err


def test_links_locks_and_syncs_give_messages_not_tracebacks(target, capsys, tmp_path):
    assert try_(target, "--baseline") == 0
    stage_lock = Path(git.Repo(target).git_dir) / "worktrees"
    set_lr(target, 0.05)
    assert try_(target, "-m", "raise LR") == 0
    locks = list(stage_lock.glob("*/"))
    (locks[0] / "index.lock").write_text("")                           # a kill mid-commit
    set_lr(target, 0.06)
    assert try_(target, "-m", "LR 0.06") == 0 and len(rows(target)) == 3
    set_lr(target, 0.07)
    assert try_(target, "--sync") == 0 and try_(target, "--sync") == 0
    saved = list((Path(git.Repo(target).git_dir) / "autoresearch" / "t" / "saved").iterdir())
    assert len(saved) == 1 and "LR = 0.07" in saved[0].read_text()    # the second sync had nothing new to save
    real = target / "train.py"
    (tmp_path / "elsewhere.py").write_text(real.read_text())
    real.unlink()
    real.symlink_to(tmp_path / "elsewhere.py")
    assert try_(target, "-m", "via a link") == 2
    assert "is a symbolic link" in capsys.readouterr().err


def test_identical_crash_candidates_never_share_a_commit(target, capsys):
    """The same crashing file twice: the second is refused with the first's number; every candidate commit names
    its tag and experiment, so no two rows ever share a hash."""
    assert try_(target, "--baseline") == 0
    broken = (target / "train.py").read_text().replace("import json", "import jsonn")
    (target / "train.py").write_text(broken)
    assert try_(target, "-m", "a typo") == 0
    (target / "train.py").write_text(broken)
    assert try_(target, "-m", "the same typo") == 2
    assert "the code of experiment #1 (crash: a typo" in capsys.readouterr().err
    (target / "train.py").write_text(broken.replace("LR = 0.04", "LR = 0.05"))
    assert try_(target, "-m", "another typo") == 0
    commits = [row.split("\t")[0] for row in rows(target)]
    assert len(set(commits)) == len(commits) == 3
    bodies = [git.Repo(target).commit(e["full_commit"]).message for e in events(target, "experiment")[1:]]
    assert ["autoresearch: tag t, experiment 1" in bodies[0], "autoresearch: tag t, experiment 2" in bodies[1]] == \
        [True, True]


def test_an_unedited_old_best_is_brought_up_to_date_after_the_loop_kept(target, capsys):
    assert try_(target, "--baseline") == 0
    with ScriptedLLM([edit("raise LR", "LR = 0.04", "LR = 0.05")]) as llm:
        assert agent.main(["--tag", "t", "--target", str(target), "--timeout", "20", *STRICT, "--no-speculate", "--proposer",
                           "anthropic", "--base-url", llm.anthropic_url, "--max-experiments", "1"]) == 0
    capsys.readouterr()
    assert try_(target, "-m", "not edited yet") == 2
    assert "it is now the best's. Nothing ran" in capsys.readouterr().err
    assert "LR = 0.05" in (target / "train.py").read_text() and len(rows(target)) == 2
    set_lr(target, 0.051)
    assert try_(target, "-m", "LR 0.051") == 0 and len(rows(target)) == 3


def test_a_near_miss_is_named_and_the_background_log_is_ignored(target, capsys):
    assert try_(target, "--baseline", "--margin", "0.05") == 0
    path = target / "train.py"
    path.write_text(path.read_text().replace("DEPTH = 8", "DEPTH = 9"))      # +0.001: within a 0.05 margin
    assert try_(target, "-m", "deeper") == 0                                  # the tag's margin: 0.05
    assert value(capsys.readouterr().out, "status").startswith("discard (a near-miss: within the margin")
    (target / "try.log").write_text("program.md's background try writes here\n")
    assert "try.log" not in git.Repo(target).git.status("--porcelain")


def test_the_paired_delta_is_against_the_best_at_the_same_seeds(tmp_path, monkeypatch, capsys):
    """Under the paired rule an edit is judged against the best's runs at its own seeds, not the best's recorded mean
    (a newcomer read a delta of -0.72 beside a verdict that the edit was worse: the baseline ran on a busier
    machine). The delta line says what the verdict compared."""
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "ready").touch()
    target = make_noisy_target(tmp_path / "repo", salt=3)
    argv = ["try", "--tag", "p", "--target", str(target), "--timeout", "20"]
    assert agent.main(argv + ["--baseline", "--baseline-runs", "3"]) == 0
    (target / "train.py").write_text((target / "train.py").read_text().replace("gain = 0.0", "gain = 0.02"))
    capsys.readouterr()
    assert agent.main(argv + ["-m", "a gain of 0.02"]) == 0
    out = capsys.readouterr().out
    exp = events(target, "experiment")[1]
    paired = statistics.fmean(exp["best_runs"])
    assert paired != exp["base_metric"]            # two of the baseline's three seeds: not the recorded mean
    assert value(out, "delta") == (f"{exp['metric'] - paired:+.6f} vs the best at the same seeds ({paired:.6f}; "
                                   f"recorded {exp['base_metric']:.6f})")


def test_one_rule_per_tag_fixed_when_the_baseline_is_recorded(target, capsys):
    """--verdict, --confirm, --margin, --false-keep-rate are the tag's once its baseline is recorded (like the budget):
    other explicit values are
    refused with the tag's named, nothing run; leaving them out resumes with the tag's rule, in `try` and the loop."""
    assert agent.main(["try", "--tag", "t", "--target", str(target), "--timeout", "20", "--baseline-runs", "1",
                       "--confirm", "0", "--margin", "0.05", "--baseline"]) == 0
    capsys.readouterr()
    set_lr(target, 0.041)                                                    # -0.01: not beyond the 0.05 margin
    for flags, words in ((["--margin", "0.001"], "--margin 0.001 (the tag's: 0.05)"),
                         (["--confirm", "1"], "--confirm 1 (the tag's: 0)"),
                         (["--verdict", "paired"], "--verdict paired (the tag's: margin)"),
                         (["--false-keep-rate", "0.01"], "--false-keep-rate 0.01 (the tag's: none: --margin)")):
        assert agent.main(["try", "--tag", "t", "--target", str(target), "--timeout", "20", "-m", "LR 0.041",
                           *flags]) == 2
        err = capsys.readouterr().err
        assert f"tag 't' judges every experiment by one rule, fixed when its baseline was recorded: {words}" in err
        assert len(rows(target)) == 1
    assert agent.main(["try", "--tag", "t", "--target", str(target), "--timeout", "20", "-m", "LR 0.041"]) == 0
    out = capsys.readouterr().out
    assert value(out, "status").startswith("discard (a near-miss")
    assert value(out, "margin").startswith("0.050000 (--margin)")
    assert "There is no confirmation run: the first run decides" in value(out, "rule")
    with ScriptedLLM([edit("raise LR", "LR = 0.04", "LR = 0.05")]) as llm:
        argv = ["--tag", "t", "--target", str(target), "--timeout", "20", "--no-speculate", "--proposer", "anthropic",
                "--base-url", llm.anthropic_url, "--max-experiments", "2", "--tabu", "0"]   # LR up again: not tabu
        assert agent.main(argv + ["--confirm", "2"]) == 2 and len(llm.requests) == 0
        assert agent.main(argv) == 0
    assert rows(target)[-1].endswith("keep\traise LR")                      # one run: the tag's --confirm 0
    assert [e["n"] for e in events(target, "run")].count(2) == 1
    assert [(e["confirm"], e["margin"]) for e in events(target, "config")] == [(0, 0.05)]


@pytest.mark.slow
def test_a_run_rejected_for_its_wall_time_may_be_tried_once_more(target, capsys):
    """A first run over the budget plus the allowance (kind overtime): a busier machine can do that to an honest run,
    so the same train.py may run once more; after a second overtime it counts as measured (a train.py that idles
    past the allowance when its draw is unlucky gets no fresh draws)."""
    assert try_(target, "--baseline") == 0
    path = target / "train.py"
    path.write_text(path.read_text().replace("SLEEP = 0.0", "SLEEP = 15.0"))
    slow = path.read_text()
    assert try_(target, "-m", "sleep 15 s", "--timeout", "60") == 0
    assert value(capsys.readouterr().out, "reason").startswith("rejected: train.py ran")
    assert events(target, "experiment")[1]["kind"] == "overtime"
    path.write_text(slow)
    assert try_(target, "-m", "sleep 15 s, again", "--timeout", "60") == 0     # ran again, not refused
    assert [e["kind"] for e in events(target, "experiment")] == ["ok", "overtime", "overtime"]
    capsys.readouterr()
    path.write_text(slow)
    assert try_(target, "-m", "sleep 15 s, a third time", "--timeout", "60") == 2
    assert "is the code of experiment #2 (crash: sleep 15 s, again" in capsys.readouterr().err


@pytest.mark.slow
def test_a_confirmation_over_the_allowance_twice_leaves_a_winner_not_judged(target, tmp_path, capsys):
    """A busy machine, as train.py plays it (no sandbox, so it can leave a mark): its first run is quick and wins, every
    later run sleeps past the wall-time allowance. The confirmation runs again at its seed, goes over again, and the
    experiment is recorded as not judged: a discard with the first run's number and the reason, its kind overtime
    (the environment's), not a crash of the idea. So the same train.py may be tried again, once (OVERTIME_TRIES): a
    third try is refused as measured."""
    flags = ("--sandbox", "off", "--verdict", "margin", "--confirm", "1", "--timeout", "60")
    assert try_(target, "--baseline", *flags) == 0
    base = events(target, "experiment")[0]
    budget, probe = base["budget_s"], base["base_probe_s"]
    allowed = Allowance(budget, max(0.0, base["train_seconds"] - budget), probe).seconds(probe)
    mark, path = tmp_path / "ran once", target / "train.py"
    path.write_text(path.read_text().replace("LR = 0.04", "LR = 0.05").replace(
        "SLEEP = 0.0", f"SLEEP = {allowed + 2:.1f} if os.path.exists({str(mark)!r}) else 0.0\n"
                       f"open({str(mark)!r}, 'a').close()"))
    busy = path.read_text()
    capsys.readouterr()
    assert try_(target, "-m", "raise LR", *flags) == 0
    out = capsys.readouterr().out
    unjudged = events(target, "experiment")[1]
    assert (unjudged["status"], unjudged["kind"], unjudged["runs"], unjudged["retried"]) == (
        "discard", "overtime", [1.008], 1)
    assert [e["run"] for e in events(target, "run") if e["n"] == 1] == [0, 1, 1]     # the retry: the same seed
    assert len({e["seed"] for e in events(target, "run") if e["n"] == 1 and e["run"] == 1}) == 1
    assert value(out, "status") == "discard" and value(out, "reason").startswith(
        "not judged: confirmation run 2 failed 2 times for the environment (rejected: train.py ran")
    assert rows(target)[1].startswith(f"{unjudged['commit']}\t1.008000\t0.0\tdiscard\traise LR (not judged: ")
    mark.unlink()
    path.write_text(busy)
    assert try_(target, "-m", "raise LR, again", *flags) == 0                      # tried again, not refused
    assert [e["kind"] for e in events(target, "experiment")] == ["ok", "overtime", "overtime"]
    path.write_text(busy)
    capsys.readouterr()
    assert try_(target, "-m", "raise LR, a third time", *flags) == 2
    assert "is the code of experiment #2 (discard, val_bpb 1.008000: raise LR, again (not judged" in \
        capsys.readouterr().err
