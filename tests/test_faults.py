"""
Faults found by hostile tries of agent.py and report.py, each a test: control characters in an LLM's description,
secrets in the environment, a results.tsv line cut mid-write, memory on a CPU, runs with a shortened budget, a
results.tsv holding two tags or lying next to another run's events, and an unpriced model under --max-cost-usd.
Runs the tiny target of tests/agent_target.py (see test_agent.py for its known metric).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import git
import pandas as pd
import pytest

import report
from agent_target import edit
from harness import ledger, redact, runner
from harness.edits import clean_description
from llm_server import ScriptedLLM
from test_agent import (AGENT, RAISE_LR, SLOW, baseline_row, events, rows, run_agent, sha, tree_is_clean,
                        wait_for_run)

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[1]
NO_FIX = ["I cannot fix this."] * 3          # a crash is sent back for a fix: these answers give up


def test_control_characters_never_reach_git_results_or_the_terminal(target, capsys):
    nasty = edit("lower\x00 LR \x1b]0;pwned\x07 now\x9b", "LR = 0.04", "LR = 0.05")
    with ScriptedLLM([nasty]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    e = events(target, "experiment")[-1]
    assert rows(target)[-1] == f"{e['commit']}\t1.008000\t2.0\tkeep\tlower LR ]0;pwned now"
    assert git.Repo(target).commit(e["full_commit"]).summary == "lower LR ]0;pwned now"
    out = capsys.readouterr().out
    assert "\x00" not in out and "\x07" not in out and "\x1b]" not in out and "\x9b" not in out
    assert clean_description("a\tb\r\nc\u200bd\x7fe") == "a b c d e"   # zero-width space and DEL too


SECRETS = {"HF_TOKEN": "hf_abcdefghijklmnopqrst", "WANDB_API_TOKEN": "wandb-0123456789abcdef",
           "AWS_SECRET_ACCESS_KEY": "aws/Secret+0123456789", "DB_PASSWORD": "correct-horse-battery",
           "GITHUB_PAT": "ghp_0123456789abcdefghij", "MY_OWN_SETTING": "not-for-train-py-4242"}


def test_secrets_never_reach_train_py_the_records_or_the_llm(target, monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AUTORESEARCH_PROBE", "visible-setting-1234")   # allowed: proves the dump reached the log
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    line = "val_bpb = 1.0 + abs(LR - 0.05) * 10 + DEPTH / 1000"
    dump = edit("print the environment", line, f"print(dict(os.environ)); raise SystemExit(3)\n{line}")
    with ScriptedLLM([dump, *NO_FIX]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    crash = events(target, "experiment")[-1]
    assert crash["status"] == "crash"
    log = Path(events(target, "run_end")[-1]["log"]).read_text()
    fix_prompt = json.dumps(llm.requests[-1])
    assert "visible-setting-1234" in log and "visible-setting-1234" in fix_prompt
    assert "'TOKENIZERS_PARALLELISM': 'false'" in log
    for name, value in SECRETS.items():
        for text in (log, fix_prompt, (target / "events.jsonl").read_text(), (target / "results.tsv").read_text()):
            assert value not in text and f"'{name}'" not in text, name
    # and a secret that reaches a log some other way is redacted wherever the harness writes or sends it
    assert redact.redact(f"token={SECRETS['HF_TOKEN']} ok") == "token=[redacted] ok"
    assert not redact.is_secret_name("TOKENIZERS_PARALLELISM") and redact.is_secret_name("OPENAI_ADMIN_KEY")


def test_row_cut_mid_write_is_replaced_on_resume(target):
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1") == 0
    path = target / "results.tsv"
    complete = path.read_text()
    path.write_text(complete[:-9])                    # killed while appending the last row
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1") == 0
    assert path.read_text() == complete               # the fragment is gone, the row is whole, once
    [torn] = events(target, "torn_line")
    assert torn["file"] == "results.tsv" and complete[:-9].endswith(torn["fragment"]) and len(torn["fragment"]) > 20


def test_torn_lines_are_cut_whole_lines_kept(tmp_path):
    results = tmp_path / "results.tsv"
    results.write_text("commit\tval_bpb\tmemory_gb\tstatus\tdescription\nabc1234\t1.000000\t0.0\tkeep\tby hand")
    assert ledger.repair_results(results, []) == ""   # a whole row saved without a newline: kept, newline added
    assert results.read_text().endswith("\tby hand\n")
    events_path = tmp_path / "events.jsonl"
    events_path.write_text('{"event": "start"}\n{"event": "experi')
    assert ledger.repair_last_line(events_path, ledger.is_event) == '{"event": "experi'
    assert events_path.read_text() == '{"event": "start"}\n'
    ledger.append_line(events_path, '{"event": "stop"}')
    assert [e["event"] for e in ledger.read_events(events_path)] == ["start", "stop"]


def test_memory_on_a_cpu_is_the_peak_rss():
    assert runner.read_metric({"val_bpb": "1.5", "peak_vram_mb": "0.0", "peak_rss_mb": "3072.0"}, "val_bpb") == (1.5, 3.0, "")
    assert runner.read_metric({"val_bpb": "1.5", "peak_vram_mb": "2048.0", "peak_rss_mb": "3072.0"}, "val_bpb") == (1.5, 2.0, "")
    assert runner.read_metric({"val_bpb": "1.5"}, "val_bpb") == (1.5, 0.0, "")


def test_smoke_runs_are_labelled_and_reported_apart(target, monkeypatch, capsys):
    monkeypatch.setenv("AUTORESEARCH_TIME_BUDGET", "2")       # the tiny target's TIME_BUDGET is 1
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1") == 0
    assert all(row.split("\t")[4].startswith("[budget 2s] ") for row in rows(target))
    assert rows(target)[0].endswith("\tkeep\t[budget 2s] baseline")
    assert events(target, "experiment")[0]["description"] == "baseline"    # the label is the row's, not the idea's
    capsys.readouterr()
    assert report.main([str(target / "results.tsv"), "--png", str(target / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "smoke run: every row has a shortened budget ([budget 2s])" in out and "2 rows = baseline + 1" in out
    # a full-budget run of the same file counts apart from the smoke rows
    monkeypatch.delenv("AUTORESEARCH_TIME_BUDGET")
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "2") == 0
    assert not rows(target)[-1].split("\t")[4].startswith("[budget")
    assert report.main([str(target / "results.tsv"), "--png", str(target / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "1 rows = baseline + 0" in out and "smoke rows   2 with a shortened budget" in out


def test_one_tag_per_results_tsv_earlier_tags_archived_and_reported(target, tmp_path, capsys):
    for tag in ("first", "second"):
        assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1",
                         "--tag", tag) == 0
    first = [e for e in events(target, "experiment") if e["tag"] == "first"]
    second = [e for e in events(target, "experiment") if e["tag"] == "second"]
    assert rows(target) == [ledger.results_row(e) for e in second]        # karpathy's contract: one run per file
    archived = (target / "results.first.tsv").read_text().splitlines()
    assert archived == [ledger.results_header("val_bpb"), *map(ledger.results_row, first)]
    assert "results.first.tsv" not in git.Repo(target).git.status("--porcelain")     # untracked and ignored
    # the logic of karpathy's analysis.ipynb (counts, baseline = first row, best kept, kept list) on results.tsv
    df = pd.read_csv(target / "results.tsv", sep="\t")
    kept = df[df["status"] == "keep"]
    assert len(df) == 2 and list(df["description"]).count("baseline") == 1
    assert df["val_bpb"].iloc[0] == second[0]["metric"] and kept["val_bpb"].min() <= second[0]["metric"]
    # report.py reads either file, each as its own run
    capsys.readouterr()
    assert report.main([str(target / "results.tsv"), "--png", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "report of results.tsv tag second" in out and "2 rows = baseline + 1" in out
    assert report.main([str(target / "results.first.tsv"), "--png", str(tmp_path / "q.png")]) == 0
    out = capsys.readouterr().out
    assert "report of results.first.tsv tag first" in out and f"baseline     {first[0]['metric']:.6f}" in out


def test_report_of_a_file_holding_two_tags_reads_the_latest(tmp_path, capsys):
    """A results.tsv written before tags were archived holds both; the report picks one run, never mixes them."""
    evs = [{"event": "experiment", "tag": tag, "n": n, "commit": c, "status": "keep", "metric": m, "memory_gb": 1.0,
            "description": d} for tag, n, c, m, d in [("a", 0, "aaaaaaa", 2.0, "baseline"), ("a", 1, "bbbbbbb", 1.5, "x"),
                                                      ("b", 0, "bbbbbbb", 1.6, "baseline"), ("b", 1, "ccccccc", 1.4, "y")]]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    (tmp_path / "results.tsv").write_text(ledger.results_header("val_bpb") + "\n" +
                                          "".join(ledger.results_row(e) + "\n" for e in evs))
    assert report.main([str(tmp_path / "results.tsv"), "--png", str(tmp_path / "p.png")]) == 0
    captured = capsys.readouterr()
    assert "holds the tags a, b: reporting the latest, b" in captured.err
    assert "2 rows = baseline + 1: 2 keep" in captured.out and "baseline     1.600000" in captured.out
    # next to another run's events.jsonl, the events are not attached to it
    shutil.copy(FIXTURES / "normal.tsv", tmp_path / "results.tsv")
    assert report.main([str(tmp_path / "results.tsv"), "--png", str(tmp_path / "q.png")]) == 0
    captured = capsys.readouterr()
    assert "events.jsonl does not account for" in captured.err
    assert "report of results.tsv\n" in captured.out and "tokens   " not in captured.out


def test_rows_no_event_accounts_for_are_refused_not_started_over(target, capsys):
    """An external agent followed program.md by hand on the same tag: agent.py says what it found, changes nothing."""
    hand = ledger.results_header("val_bpb") + "\na1b2c3d\t1.108000\t2.0\tkeep\tbaseline\nb2c3d4e\t1.0\t2.0\tkeep\tlr\n"
    (target / "results.tsv").write_text(hand)
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1") == 2
    err = capsys.readouterr().err
    assert "results.tsv holds 2 row(s) that events.jsonl does not account for" in err and "results.manual.tsv" in err
    assert (target / "results.tsv").read_text() == hand and not (target / "events.jsonl").exists()


def test_cost_limit_with_an_unpriced_model_warns_at_start(target, capsys):
    with ScriptedLLM([RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--model", "my-local-model", "--max-cost-usd", "1",
                         "--max-experiments", "1") == 0
    out = capsys.readouterr().out
    assert "--max-cost-usd 1 cannot stop this run: model 'my-local-model' is not in the price table" in out


def start_in_own_group(target, llm):
    """agent.py as the leader of its own process group, as a terminal's foreground job is."""
    argv = [sys.executable, str(AGENT), "--tag", "t", "--target", str(target), "--timeout", "60",
            "--proposer", "anthropic", "--base-url", llm.anthropic_url]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.parametrize("when", ["training", "waiting for the LLM"])
def test_ctrl_c_to_the_whole_process_group_stops_cleanly(target, when):
    """The terminal sends SIGINT to every process of the foreground group, GitPython's git cat-file children too."""
    with ScriptedLLM([SLOW], delay=0.0 if when == "training" else 8.0) as llm:
        proc = start_in_own_group(target, llm)
        if when == "training":
            wait_for_run(target, 1, proc)
        else:
            deadline = time.monotonic() + 30
            while not llm.requests and time.monotonic() < deadline:
                time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        stderr = proc.stderr.read()
    assert "Traceback" not in stderr and "interrupted" in stderr, stderr
    assert sha(target, "autoresearch/t") == sha(target, "main") and tree_is_clean(target)
    assert rows(target) == [baseline_row(target)]
    assert events(target)[-1]["event"] == "stop" and events(target)[-1]["reason"] == "interrupted"
    with ScriptedLLM([RAISE_LR]) as llm:                     # and the same command resumes
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    assert len(rows(target)) == 2 and tree_is_clean(target)


def test_the_proposer_reads_the_goal_rules_and_directions_with_the_real_budget(target, monkeypatch):
    """Not program.md's setup, logging and shell loop for external agents, nor its "5 minutes"."""
    monkeypatch.setenv("AUTORESEARCH_TIME_BUDGET", "2")
    (target / "program.md").write_text((REPO / "program.md").read_text())   # uncommitted: read live
    with ScriptedLLM([RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    prompt = llm.requests[0][1]["messages"][-1]["content"]
    assert "## Research directions" in prompt and "**You CANNOT**" in prompt
    for external in ("## Setup", "## The experiment loop", "## Logging results", "pkill", "git reset --hard"):
        assert external not in prompt, external
    assert "fixed time budget of 2 seconds" in prompt and "5 minutes" not in prompt and "five-minute" not in prompt


@pytest.mark.parametrize("provider,status,hint", [("anthropic", 401, "refused the key"),
                                                   ("openai", 404, "does not know model")])
def test_a_bad_key_or_model_stops_before_the_baseline_trains(target, capsys, provider, status, hint):
    with ScriptedLLM([RAISE_LR], ping=status) as llm:
        assert run_agent(target, llm, provider, "--max-experiments", "1") == 1
    assert len(llm.pings) == 1 and llm.requests == []
    assert hint in capsys.readouterr().err
    assert events(target, "run") == [] and rows(target) == []      # nothing trained, nothing recorded
