"""
Tests for agent.py, offline. Each test builds a throwaway git repo holding a tiny target: a prepare.py with the
contract constants and --check, and a train.py whose metric is a known function of its UPPER_CASE constants
(baseline val_bpb = 1 + 10*|LR - 0.05| + DEPTH/1000 = 1.108000, memory: what the harness measures, a tiny process: 0.0 GB), so that a scripted
edit gives a known row. LLM answers come from tests/llm_server.py through the real anthropic/openai SDKs.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import git
import pytest

import agent
from harness.record import sinks
from agent_target import SECRET, STRICT, edit, make_target
from llm_server import INPUT_TOKENS, OUTPUT_TOKENS, ScriptedLLM
from helpers import (AGENT, LOWER_LR, RAISE_LR, SLOW, baseline_row, events, live_members, rows, run_agent, sha, start_agent,
                     steer_on_branch, tree_is_clean, wait_for_run)


# ---------------------------------------------------------------------------
# The loop with an LLM
# ---------------------------------------------------------------------------


def test_baseline_keep_discard_rows_and_branch(target):
    with ScriptedLLM([RAISE_LR, LOWER_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "2") == 0
    repo = git.Repo(target)
    keep, discard = [e["full_commit"] for e in events(target, "experiment")[1:]]
    assert rows(target) == [baseline_row(target),
                            f"{keep[:7]}\t1.008000\t0.0\tkeep\traise LR",
                            f"{discard[:7]}\t1.208000\t0.0\tdiscard\tlower LR"]
    assert sha(target, f"refs/autoresearch/t/0000-{sha(target, 'main')[:7]}") == sha(target, "main")
    # the user's checkout never moved; the branch holds the baseline and the kept candidate
    assert repo.active_branch.name == "main" and "LR = 0.04" in (target / "train.py").read_text()
    branch = repo.commit("autoresearch/t")
    assert branch.hexsha == keep and branch.parents[0].hexsha == sha(target, "main")
    assert branch.message == "raise LR\n\nautoresearch: tag t, experiment 1\n"
    assert "LR = 0.05" in repo.git.show("autoresearch/t:train.py") and tree_is_clean(target)
    # the discarded candidate stays reachable under its ref, with its edit
    assert repo.git.show(f"refs/autoresearch/t/0002-{discard[:7]}:train.py").count("LR = 0.03") == 1
    # the stable prefix is marked for caching; program.md, history and train.py are in the user turn
    first, second = llm.requests[0][1], llm.requests[1][1]
    assert first["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert "def evaluate" not in first["system"][0]["text"] and 'METRIC_GOAL = "min"' in first["system"][0]["text"]
    assert "Try the learning rate first." in first["messages"][0]["content"]
    assert "raise LR" in second["messages"][0]["content"] and "LR = 0.05" in second["messages"][0]["content"]
    # accounting per experiment: tokens and cost at the default model's price ($2 / $10 per million)
    exp = events(target, "experiment")[1]
    assert (exp["input_tokens"], exp["output_tokens"], exp["cost_usd"]) == (INPUT_TOKENS, OUTPUT_TOKENS, 0.003)
    assert exp["proposer"] == "anthropic" and exp["repairs"] == 0 and exp["train_seconds"] > 0
    # the key never reaches train.py, the records or git
    for path in ("results.tsv", "events.jsonl", "run.log"):
        assert SECRET not in (target / path).read_text()
    assert "key None" in (target / "run.log").read_text()
    assert SECRET not in repo.git.log("--all", "-p")


def test_edit_that_does_not_apply_is_repaired(target):
    bad = edit("raise LR", "LR = 0.99", "LR = 0.05")
    with ScriptedLLM([bad, RAISE_LR]) as llm:
        assert run_agent(target, llm, "openai", "--max-experiments", "1") == 0
    repair_turn = llm.requests[1][1]["messages"]
    assert repair_turn[0]["role"] == "system" and repair_turn[2]["content"] == bad
    assert "'LR = 0.99' does not occur in train.py" in repair_turn[3]["content"]
    assert [e["repairs"] for e in events(target, "experiment")] == [0, 1]
    assert rows(target)[1].endswith("\t1.008000\t0.0\tkeep\traise LR")


def test_garbage_answers_are_skipped_without_a_run(target):
    garbage = ["I would try a larger model.", "DESCRIPTION: bigger\nmake it bigger", "```python\nLR = 1\n```"]
    with ScriptedLLM(garbage + [RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    assert [e["n"] for e in events(target, "skipped")] == [1]
    assert [e["n"] for e in events(target, "run")] == [0, 1]          # no training run for the skipped answers
    assert len(llm.requests) == 4 and len(rows(target)) == 2
    errors = [e["error"] for e in events(target, "repair")]
    assert errors == ['the answer has no "DESCRIPTION: ..." line',
                      "the answer has no <<<<<<< SEARCH / ======= / >>>>>>> REPLACE block",
                      'the answer has no "DESCRIPTION: ..." line']


def test_crash_then_fix_then_keep(target):
    crashing = edit("raise LR", "LR = 0.04", "LR = 0.05\nimport no_such_module_xyz")
    fix = edit("drop the bad import", "import no_such_module_xyz\nDEPTH = 8", "DEPTH = 8")
    with ScriptedLLM([crashing, fix]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "2") == 0
    fix_prompt = llm.requests[1][1]["messages"][0]["content"]
    assert "ModuleNotFoundError" in fix_prompt and "crashed (exit code 1)" in fix_prompt
    crashed, fixed = [e["full_commit"] for e in events(target, "commit")]
    # every measured candidate has its row, as with `try --fix`: the crash, then its fix as the next experiment
    crash_row, fixed_row = rows(target)[1:]
    assert crash_row.startswith(f"{crashed[:7]}\t0.000000\t0.0\tcrash\traise LR (exit code 1")
    assert fixed_row == f"{fixed[:7]}\t1.008000\t0.0\tkeep\traise LR (fix 1: drop the bad import)"
    fixed_event = events(target, "experiment")[2]
    assert (fixed_event["n"], fixed_event["fix_of"], fixed_event["fixes"]) == (2, 1, 1)
    assert sha(target, "autoresearch/t") == fixed
    repo = git.Repo(target)
    assert repo.commit(fixed).message == "raise LR\n\nfix 1: drop the bad import\n\nautoresearch: tag t, experiment 2\n"
    assert repo.commit(fixed).parents == repo.commit(crashed).parents               # amended: the same parent
    assert sha(target, f"refs/autoresearch/t/0001-{crashed[:7]}") == crashed      # the crashed try stays reachable
    assert "no_such_module_xyz" in events(target, "run_end")[1]["log_tail"]
    # --max-experiments counts fixes: with the limit reached, a crash is recorded and no fix is asked for
    with ScriptedLLM([edit("shallower", "DEPTH = 8", "DEPTH = 6\nimport no_such_module_xyz")]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "3") == 0
    assert len(llm.requests) == 1 and rows(target)[-1].split("\t")[3] == "crash"


def test_timeout_kills_the_whole_process_group(target):
    token = f"ar-timeout-{os.getpid()}-{time.time_ns()}"       # finds the grandchild in /proc (pids differ in a sandbox)
    spawn = (f"SLEEP = 60.0\nchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{token}'])\n"
             "print('child started', flush=True)")
    with ScriptedLLM([edit("sleep long", "SLEEP = 0.0", spawn)]) as llm:
        argv = ["--tag", "t", "--target", str(target), "--timeout", "8", "--max-experiments", "1",
                "--proposer", "anthropic", "--base-url", llm.anthropic_url, *STRICT, "--no-speculate"]
        assert agent.main(argv) == 0
    pgid = events(target, "run")[1]["pgid"]
    assert live_members(pgid) == []
    assert "child started" in (target / "run.log").read_text()
    alive = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            alive += [p] if token.encode() in p.read_bytes() else []
        except OSError:
            pass
    assert alive == []
    commit = events(target, "experiment")[1]["commit"]
    assert rows(target)[1] == f"{commit}\t0.000000\t0.0\tcrash\tsleep long (timeout after 8s)"
    assert len(llm.requests) == 1                                     # a timeout is not sent back for a fix
    assert sha(target, "autoresearch/t") == sha(target, "main") and tree_is_clean(target)


def test_edit_touching_prepare_is_rejected(target):
    sneaky = "FILE: prepare.py\n" + edit("make the metric easy", 'METRIC_GOAL = "min"', 'METRIC_GOAL = "max"')
    with ScriptedLLM([sneaky, RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    assert "only train.py may change" in llm.requests[1][1]["messages"][2]["content"]
    assert 'METRIC_GOAL = "min"' in (target / "prepare.py").read_text()
    assert [r.split("\t")[3] for r in rows(target)] == ["keep", "keep"]


def test_train_writing_to_prepare_at_run_time_is_rejected_and_restored(target):
    original = (target / "prepare.py").read_text()
    hack = "LR = 0.05\nopen('prepare.py', 'a').write('METRIC_GOAL = \"max\"\\n')"
    with ScriptedLLM([edit("raise LR", "LR = 0.04", hack)]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    commit = events(target, "experiment")[1]["commit"]
    assert rows(target)[1] == f"{commit}\t0.000000\t0.0\tcrash\traise LR (rejected: train.py modified prepare.py)"
    assert (target / "prepare.py").read_text() == original
    assert sha(target, "autoresearch/t") == sha(target, "main") and tree_is_clean(target) and len(llm.requests) == 1


# ---------------------------------------------------------------------------
# LLM errors
# ---------------------------------------------------------------------------


def test_transient_errors_are_retried(target, capsys):
    with ScriptedLLM([429, 529, RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    assert [e["error"].split(":")[0] for e in events(target, "error")] == ["HTTP 429", "HTTP 529"]
    # a line per retry, also when the output is a file (an outage overnight shows in the log)
    retries = [line for line in capsys.readouterr().out.splitlines() if line.startswith("LLM error")]
    assert [line.split(":")[0] for line in retries] == ["LLM error (HTTP 429", "LLM error (HTTP 529"]
    assert [line.split("): ")[1].split(" in ")[0] for line in retries] == ["retry 1", "retry 2"]
    assert len(llm.requests) == 3 and rows(target)[1].endswith("keep\traise LR")


@pytest.mark.parametrize("provider,status,hint", [("anthropic", 401, "check ANTHROPIC_API_KEY"),
                                                  ("openai", 404, "pass a valid --model")])
def test_auth_error_and_unknown_model_stop_cleanly(target, capsys, monkeypatch, provider, status, hint):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    with ScriptedLLM([status, RAISE_LR]) as llm:
        assert run_agent(target, llm, provider) == 1
    err = capsys.readouterr().err
    assert f"HTTP {status}" in err and hint in err and SECRET not in err
    assert len(llm.requests) == 1                                     # not retried
    assert rows(target) == [baseline_row(target)]
    assert sha(target, "autoresearch/t") == sha(target, "main") and tree_is_clean(target)
    assert events(target)[-1]["event"] == "stop" and SECRET not in (target / "events.jsonl").read_text()


def test_cost_limit_stops_cleanly(target):
    answers = [RAISE_LR] + [edit(f"LR {v}", "LR = 0.05", f"LR = {v}") for v in (0.06, 0.07, 0.08)]
    with ScriptedLLM(answers) as llm:                        # $0.003 per call: stops once $0.005 is spent
        assert run_agent(target, llm, "anthropic", "--max-cost-usd", "0.005") == 0
    assert len(llm.requests) == 2 and len(rows(target)) == 3
    assert events(target, "stop")[-1]["reason"] == "--max-cost-usd 0.005 reached (spent $0.01)"


def test_circuit_breaker_stops_a_run_of_failures(target, capsys):
    with ScriptedLLM(["no idea"] * 18) as llm:
        assert run_agent(target, llm, "anthropic") == 1
    assert "circuit breaker: 6 of the last 8 iterations failed" in capsys.readouterr().err
    assert len(events(target, "skipped")) == 6 and rows(target) == [baseline_row(target)]


def test_blocking_pre_commit_hook_is_reported_not_bypassed(target, capsys):
    hook = Path(git.Repo(target).git_dir) / "hooks" / "pre-commit"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text("#!/bin/sh\necho 'blocked by the lint hook' >&2\nexit 1\n")
    hook.chmod(0o755)
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1") == 1
    err = capsys.readouterr().err
    assert "blocked by the lint hook" in err and "does not bypass hooks" in err
    assert sha(target, "autoresearch/t") == sha(target, "main") and tree_is_clean(target)
    assert rows(target) == [baseline_row(target)]


# ---------------------------------------------------------------------------
# Setup refusals
# ---------------------------------------------------------------------------


def test_uncommitted_train_py_is_refused_and_left_intact(target, capsys):
    (target / "train.py").write_text((target / "train.py").read_text() + "# my unsaved idea\n")
    assert run_agent(target, None, "anthropic", "--proposer", "random") == 2
    err = capsys.readouterr().err
    assert "uncommitted changes to train.py" in err and "would be ignored" in err and "commit or stash" in err
    assert (target / "train.py").read_text().endswith("# my unsaved idea\n")
    assert "autoresearch/t" not in git.Repo(target).heads and not (target / "results.tsv").exists()


def test_uncommitted_program_md_steers_the_loop(target):
    (target / "program.md").write_text("# program\nSteer: only touch DEPTH now.\n")       # edited, not committed
    with ScriptedLLM([RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    assert "Steer: only touch DEPTH now." in llm.requests[0][1]["messages"][0]["content"]
    assert (target / "program.md").read_text() == "# program\nSteer: only touch DEPTH now.\n"
    assert git.Repo(target).active_branch.name == "main"


def test_the_real_prepare_saying_no_data_is_not_shown_as_an_error(monkeypatch, capsys, tmp_path):
    """The real prepare.py's --check says "prepare.py: error: no prepared data in ...: run prepare.py first": agent.py
    prepares the data itself, so it says the fact, not prepare.py's error and advice (a newcomer read it as an error)."""
    from harness.run import target as target_mod
    real = subprocess.run([sys.executable, "prepare.py", "--check"], cwd=AGENT.parent, capture_output=True, text=True,
                          env={**os.environ, "AUTORESEARCH_CACHE": str(tmp_path / "empty")})
    missing = real.stderr.strip().splitlines()[-1]
    assert real.returncode == 1 and missing.startswith("prepare.py: error: no prepared data in")
    answers = iter([agent.SetupError(f"prepare.py --check failed\n{missing}"), "profile: cpu\n"])

    def check(where, *flags, timeout):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer
    monkeypatch.setattr(target_mod, "run_prepare", check)
    monkeypatch.setattr(target_mod, "relay", lambda argv, cwd, env: 0)
    assert target_mod.ensure_prepared(tmp_path) == "profile: cpu\n"
    assert capsys.readouterr().out == "no prepared data on this machine; preparing it now: prepare.py\n"


def test_a_tag_resumed_on_another_profiles_data_is_refused_naming_the_profile_to_prepare(target, capsys):
    """A newcomer resumed a lab-profile tag on a machine with an empty cache: agent.py prepared the device's default
    data and refused the tag for its budget, advising the same AUTORESEARCH_TIME_BUDGET, which could not help. The
    tag's start event records the profile of its data, and the refusal names it and the command that prepares it."""
    prepare = target / "prepare.py"
    prepare.write_text(prepare.read_text().replace(
        "TIME_BUDGET = ", 'PROFILE_BUDGETS = {"quick": 2}\nTIME_BUDGET = ', 1).replace(
        '            sys.exit(1)\n', '            sys.exit(1)\n        print("profile:", (ready.parent / "profile").read_text())\n', 1))
    git.Repo(target).git.commit("-qam", "profiles")
    profile = Path(os.environ["AUTORESEARCH_CACHE"]) / "profile"
    profile.write_text("quick")
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "0") == 0
    assert [(e["profile"], e["new_branch"]) for e in events(target, "start")] == [("quick", True)]
    assert events(target, "experiment")[0]["budget_s"] == 2
    profile.write_text("full")                   # the device's default, prepared on a fresh machine
    capsys.readouterr()
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "1") == 2
    assert "agent.py: error: tag 't' was measured with a 2 s budget and this run has 3 s: its numbers would not be " \
           "comparable. The tag's data was the 'quick' profile's and the data prepared here is the 'full' profile's: " \
           "prepare the tag's (`uv run prepare.py --profile quick --force`, with --source PATH offline) to resume it, " \
           "or start a new --tag" in capsys.readouterr().err
    profile.write_text("quick")
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "1") == 0
    assert [e["profile"] for e in events(target, "start")] == ["quick", "quick"] and len(rows(target)) == 2


def test_ratchet_branch_checked_out_is_refused(target, capsys):
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "0") == 0
    git.Repo(target).git.switch("autoresearch/t")
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1") == 2
    assert "autoresearch/t is checked out in" in capsys.readouterr().err and len(rows(target)) == 1


def test_a_fresh_machine_prepares_its_data_first(target, capfd, tmp_path):
    """No prepared data: agent.py runs prepare.py (with --source when given) and goes on, its output relayed
    without its advice for a human running it alone ("Next: uv run train.py"); a failure stops with its message and
    changes nothing."""
    ready = Path(os.environ["AUTORESEARCH_CACHE"]) / "ready"
    ready.unlink()
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--source", str(tmp_path / "absent")) == 1
    out, err = capfd.readouterr()
    assert "no prepared data on this machine; preparing it now: prepare.py --source" in out and "error: no prepared" \
        not in out
    assert "prepare.py: error: no such --source" in out and "preparing the data failed" in err
    assert "autoresearch/t" not in git.Repo(target).heads and not ready.exists()
    (tmp_path / "corpus").mkdir()
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "0",
                     "--source", str(tmp_path / "corpus")) == 0
    out = capfd.readouterr().out
    assert f"Data: prepared --source {tmp_path / 'corpus'}.\n" in out and "Next:" not in out and ready.exists()
    assert len(rows(target)) == 1


def test_detached_head_is_refused(target, capsys):
    repo = git.Repo(target)
    repo.git.checkout("--detach", "HEAD")
    assert run_agent(target, None, "anthropic", "--proposer", "random") == 2
    assert "HEAD is detached" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# Without an LLM; resume
# ---------------------------------------------------------------------------


def test_random_proposer_three_iterations_then_a_resume_adds_the_difference(target):
    """--proposer random, 3 experiments; then --max-experiments 5 on the same tag adds 2 (one loop for both checks:
    the first run is the same in each)."""
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "3") == 0
    found = rows(target)
    assert len(found) == 4 and found[0] == baseline_row(target)
    assert all(r.split("\t")[4].startswith("random: ") for r in found[1:])
    assert all(e["cost_usd"] == 0 and e["proposer"] == "random" for e in events(target, "experiment"))
    # the branch holds exactly the baseline and the kept candidates, in order
    repo = git.Repo(target)
    branch = [c.hexsha[:7] for c in repo.iter_commits("autoresearch/t", first_parent=True)][::-1]
    assert branch == [r.split("\t")[0] for r in found if r.split("\t")[3] == "keep"]
    assert repo.git.status("--porcelain") == ""               # outputs are untracked and ignored
    # the resume: --max-experiments counts the tag's experiments, so 5 adds the difference
    first = rows(target)
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "5") == 0
    assert rows(target)[:4] == first and len(rows(target)) == 6
    assert [e["n"] for e in events(target, "experiment")] == [0, 1, 2, 3, 4, 5]


class Tally(sinks.Sink):
    """A record sink of the test's own: what the loop hands to sinks, in order."""

    def __init__(self):
        self.seen = []

    def before(self, s, n, idea):
        return {"tally": n * 10}

    def on_record(self, s, event, result, context):
        self.seen.append(("record", event["n"], event["status"], result.n, Path(context["log"]).name))

    def on_stop(self, s):
        self.seen.append(("stop", len(s.history)))


def test_a_sink_appended_in_a_test_sees_each_record_after_its_event_and_the_stop(target, monkeypatch):
    """The record seam: experiment.record writes the event (with the fields a sink's before() adds), then calls each
    sink of harness.record.sinks.SINKS in order; the loop's stop calls on_stop. Nothing else changes: the rows are written."""
    tally = Tally()
    monkeypatch.setattr(sinks, "SINKS", [*sinks.SINKS, tally])
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "2") == 0
    exps = events(target, "experiment")
    assert [e["tally"] for e in exps] == [0, 10, 20]
    assert tally.seen == [("record", e["n"], e["status"], e["n"], f"{e['n']:04d}-0.log") for e in exps] + [("stop", 3)]
    assert [r.split("\t")[0] for r in rows(target)] == [e["commit"] for e in exps]


def test_grid_proposer_on_a_maximising_target_in_a_subdir(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "ready").touch()
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(cache))
    target = make_target(tmp_path / "repo", metric="pass@1", goal="max", subdir="grpo")
    assert agent.main(["--tag", "g", "--target", str(target), "--proposer", "grid", "--max-experiments", "2",
                       "--timeout", "20", *STRICT, "--no-speculate"]) == 0
    header, *found = (target / "results.tsv").read_text().splitlines()
    assert header == "commit\tpass@1\tmemory_gb\tstatus\tdescription"
    # grid: LR down (0.02 -> 3 - 1.308 = 1.692 discard), LR up (0.08 -> 3 - 1.308 = 1.692 discard)
    assert [r.split("\t")[1:] for r in found] == [["1.892000", "0.0", "keep", "baseline"],
                                                 ["1.692000", "0.0", "discard", "grid: LR 0.04 -> 0.02"],
                                                 ["1.692000", "0.0", "discard", "grid: LR 0.04 -> 0.08"]]
    assert tree_is_clean(target)


def test_lost_row_is_restored_once_on_resume(target):
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1") == 0
    path = target / "results.tsv"
    complete = path.read_text()
    path.write_text(complete[:complete.rstrip("\n").rfind("\n") + 1])   # as if killed between event and row
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1") == 0
    assert path.read_text() == complete
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1") == 0
    assert path.read_text() == complete


def test_kill_between_keep_event_and_branch_move_is_finished_on_resume(target):
    with ScriptedLLM([RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    keep = events(target, "experiment")[1]["full_commit"]
    repo = git.Repo(target)
    repo.git.update_ref("refs/heads/autoresearch/t", sha(target, "main"))   # as if killed before the update-ref
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1") == 0
    assert sha(target, "autoresearch/t") == keep and events(target, "advanced")[0]["best"] == keep
    assert len(rows(target)) == 2


def test_human_steering_commit_on_the_branch_is_adopted(target):
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "0") == 0
    repo = git.Repo(target)
    mine = steer_on_branch(target, "new directions\n")
    with ScriptedLLM([RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    keep = events(target, "experiment")[1]
    assert keep["status"] == "keep" and repo.commit(keep["full_commit"]).parents[0].hexsha == mine
    assert sha(target, "autoresearch/t") == keep["full_commit"] and events(target, "adopted")[0]["tip"] == mine


def test_human_commit_changing_train_py_on_the_branch_is_refused(target, capsys):
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "0") == 0
    repo = git.Repo(target)
    repo.git.switch("autoresearch/t")
    (target / "train.py").write_text((target / "train.py").read_text().replace("LR = 0.04", "LR = 0.06"))
    repo.git.commit("-qam", "my edit")
    mine = repo.head.commit.hexsha
    repo.git.switch("main")
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1") == 2
    assert "changes train.py" in capsys.readouterr().err
    assert sha(target, "autoresearch/t") == mine and len(rows(target)) == 1


@pytest.mark.parametrize("sandbox", ["auto", pytest.param("off", marks=pytest.mark.slow)])   # off: the orphan runs on
def test_sigkill_mid_run_then_resume_redoes_the_candidate(target, sandbox):
    """kill -9 while #1 trains: the resume runs the same train.py again as #1 (the LLM is not asked, nothing is paid
    twice), on the best, and the ledger is whole."""
    slow_win = edit("slow and better", "LR = 0.04\nDEPTH = 8\nWARMUP = 0.1\nSLEEP = 0.0",
                    "LR = 0.05\nDEPTH = 8\nWARMUP = 0.1\nSLEEP = 2.0")
    with ScriptedLLM([slow_win]) as llm:
        proc = start_agent(target, llm, "--sandbox", sandbox)
        pgid = wait_for_run(target, 1, proc)
        proc.kill()
        proc.wait()
    killed = events(target, "commit")[0]["full_commit"]
    assert sha(target, "autoresearch/t") == sha(target, "main")   # the half-done candidate never entered the branch
    with ScriptedLLM([]) as llm:                                   # in the sandbox the run died with the agent;
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0   # else the resume kills it
    assert live_members(pgid) == [] and llm.requests == []
    keep = events(target, "experiment")[-1]["full_commit"]
    assert rows(target) == [baseline_row(target), f"{keep[:7]}\t1.008000\t0.0\tkeep\tslow and better"]
    assert [e["n"] for e in events(target, "experiment")] == [0, 1]
    [redo] = events(target, "redo")
    assert redo["idea"] == "slow and better" and redo["base"] == sha(target, "main")
    repo = git.Repo(target)
    assert repo.commit(keep).tree["train.py"].hexsha == repo.commit(killed).tree["train.py"].hexsha
    assert repo.commit("autoresearch/t").parents[0].hexsha == sha(target, "main") and tree_is_clean(target)
    assert sha(target, f"refs/autoresearch/t/0001-{killed[:7]}") == killed


def test_a_fix_killed_mid_run_is_redone_as_that_fix(target):
    """kill -9 while the fix of a crash (#2) trains: the resume runs it again as #2, still fix 1 of #1's idea (its
    row, event and commit say so), with no LLM call; the crash keeps its row."""
    crashing = edit("raise LR", "LR = 0.04", "LR = 0.05\nimport no_such_module_xyz")
    slow_fix = edit("drop the import, nap", "import no_such_module_xyz\nDEPTH = 8\nWARMUP = 0.1\nSLEEP = 0.0",
                    "DEPTH = 8\nWARMUP = 0.1\nSLEEP = 2.0")
    with ScriptedLLM([crashing, slow_fix]) as llm:
        proc = start_agent(target, llm, "--max-experiments", "2")
        wait_for_run(target, 2, proc)
        proc.kill()
        proc.wait()
    with ScriptedLLM([]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "2") == 0
    assert llm.requests == [] and events(target, "redo")[0]["idea"] == "raise LR"
    crash, fixed = events(target, "experiment")[1:]
    assert crash["status"] == "crash" and (fixed["n"], fixed["fix_of"], fixed["fixes"]) == (2, 1, 1)
    assert rows(target)[-1] == f"{fixed['commit']}\t1.008000\t0.0\tkeep\traise LR (fix 1: drop the import, nap)"
    assert git.Repo(target).commit(fixed["full_commit"]).message.startswith("raise LR\n\nfix 1: drop the import, nap")


def test_sigterm_mid_run_kills_training_and_leaves_the_best_commit(target):
    with ScriptedLLM([SLOW]) as llm:
        proc = start_agent(target, llm)
        pgid = wait_for_run(target, 1, proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 130
    assert live_members(pgid) == []
    assert sha(target, "autoresearch/t") == sha(target, "main") and tree_is_clean(target)
    assert rows(target) == [baseline_row(target)]
    assert events(target)[-1]["event"] == "stop" and events(target)[-1]["reason"] == "interrupted"
