"""
Faults found by hostile tries of agent.py and report.py, each a test: control characters in an LLM's description,
secrets in the environment, a results.tsv line cut mid-write, memory on a CPU, runs with a shortened budget, a
results.tsv holding two tags or lying next to another run's events, and an unpriced model under --max-cost-usd.
Runs the tiny target of tests/agent_target.py (see test_agent.py for its known metric).
"""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import git
import pandas as pd
import pytest

import agent
import report
from agent_target import STRICT, edit
from harness import console, files, gitops, ledger, redact
from harness.run import runner, view
from harness.tag import session
from harness.propose.edits import clean_description
from llm_server import ScriptedLLM
from helpers import (AGENT, REPO, LOWER_LR, RAISE_LR, SLOW, baseline_row, events, rows, run_agent, sha, start_agent,
                     tree_is_clean, wait_for_run)

FIXTURES = Path(__file__).parent / "fixtures"
NO_FIX = ["I cannot fix this."] * 3          # a crash is sent back for a fix: these answers give up


def test_control_characters_never_reach_git_results_or_the_terminal(target, capsys):
    nasty = edit("lower\x00 LR \x1b]0;pwned\x07 now\x9b", "LR = 0.04", "LR = 0.05")
    with ScriptedLLM([nasty]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    e = events(target, "experiment")[-1]
    assert rows(target)[-1] == f"{e['commit']}\t1.008000\t0.0\tkeep\tlower LR ]0;pwned now"
    assert git.Repo(target).commit(e["full_commit"]).summary == "lower LR ]0;pwned now"
    out = capsys.readouterr().out
    assert "\x00" not in out and "\x07" not in out and "\x1b]" not in out and "\x9b" not in out
    assert clean_description("a\tb\r\nc\u200bd\x7fe") == "a b cd e"    # DEL too; a zero-width space is removed


def test_descriptions_are_cut_at_a_word_boundary_and_the_reason_is_kept_whole():
    """A 200-character row: the idea cut between words with "...", its reason in parentheses whole (cut mid-word and
    mid-parenthesis before); a reason so long it would leave under 60 characters is cut too, its parenthesis closed."""
    from harness.propose.edits import shorten, with_reason
    idea = "halve the learning rate of the embedding (with a longer warmup) " * 5
    reason = "rejected: train.py ran 83.1s, more than the budget plus the start-up and evaluation allowance (80.0s)"
    row = with_reason(clean_description(idea), reason)
    assert len(row) <= 200 and row.endswith(f"... ({reason})")
    assert row.startswith("halve the learning rate") and row[:-len(reason) - 6].split()[-1] in idea.split()
    assert clean_description(idea).endswith("...") and len(clean_description(idea)) <= 200
    assert clean_description(idea)[:-3].split()[-1] in idea.split()
    assert shorten("short", 10) == "short" and shorten("abcdefghijklmnop", 10) == "abcdefg..."
    long = with_reason("idea " * 30, "x " * 200)
    assert len(long) <= 200 and long.endswith("...)") and long.startswith("idea idea") and len(long.split(" (")[0]) > 50


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
    with ScriptedLLM([dump, *NO_FIX, RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "2") == 0
    crash = events(target, "experiment")[1]
    assert crash["status"] == "crash"
    log = Path(events(target, "run_end")[1]["log"]).read_text()
    fix_prompt = json.dumps(llm.requests[1])                # the crash goes back for a fix with its log's tail
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
    files.append_line(events_path, '{"event": "stop"}')
    assert [e["event"] for e in ledger.read_events(events_path)] == ["start", "stop"]


def test_memory_on_a_cpu_is_the_peak_rss():
    assert runner.read_metric({"val_bpb": "1.5", "peak_vram_mb": "0.0", "peak_rss_mb": "3072.0"}, "val_bpb") == (1.5, 3.0, "")
    assert runner.read_metric({"val_bpb": "1.5", "peak_vram_mb": "2048.0", "peak_rss_mb": "3072.0"}, "val_bpb") == (1.5, 2.0, "")
    assert runner.read_metric({"val_bpb": "1.5"}, "val_bpb") == (1.5, 0.0, "")


def test_smoke_runs_are_labelled_and_reported_apart(target, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("AUTORESEARCH_TIME_BUDGET", "2")       # the tiny target's TIME_BUDGET is 3
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1") == 0
    assert all(row.split("\t")[4].startswith("[budget 2s] ") for row in rows(target))
    assert rows(target)[0].endswith("\tkeep\t[budget 2s] baseline")
    assert events(target, "experiment")[0]["description"] == "baseline"    # the label is the row's, not the idea's
    capsys.readouterr()
    assert report.main([str(target / "results.tsv"), "--png", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "smoke run: every row has a shortened budget ([budget 2s])" in out and "2 rows = baseline + 1" in out
    # the same tag at the full budget would rank full runs against smoke numbers: refused, nothing changed
    monkeypatch.delenv("AUTORESEARCH_TIME_BUDGET")
    before = (target / "results.tsv").read_text()
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "2") == 2
    assert "was measured with a 2 s budget and this run has 3 s" in capsys.readouterr().err
    assert (target / "results.tsv").read_text() == before
    # an LLM cannot pass its idea off as a smoke row: the label is stripped from its description
    assert clean_description("[budget 1s] huge win") == "huge win"
    # a file holding both (written by hand or by an older version): the full rows are the run, smoke rows apart
    smoke = (target / "results.tsv").read_text().splitlines()[1:]
    (tmp_path / "mixed.tsv").write_text(ledger.results_header("val_bpb") + "\n" + "\n".join(
        [*smoke, "ccccccc\t1.200000\t2.0\tkeep\tbaseline", "ddddddd\t1.100000\t2.0\tkeep\tlr"]) + "\n")
    assert report.main([str(tmp_path / "mixed.tsv"), "--png", str(tmp_path / "q.png")]) == 0
    out = capsys.readouterr().out
    assert "2 rows = baseline + 1: 1 keep" in out and "baseline     1.200000" in out
    assert "smoke rows   2 with a shortened budget" in out


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
    assert report.main([str(target / "results.tsv"), "--tag", "first", "--png", str(tmp_path / "r.png")]) == 0
    out = capsys.readouterr().out                      # --tag finds the rows where they were moved
    assert "report of results.first.tsv tag first" in out and "2 rows = baseline + 1" in out
    assert f"baseline     {first[0]['metric']:.6f}" in out


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
    assert "2 rows = baseline + 1: 1 keep" in captured.out and "baseline     1.600000" in captured.out
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
    assert "results.tsv holds 2 row(s) that events.jsonl does not account for" in err and "by-hand-results.tsv" in err
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
            "--proposer", "anthropic", "--base-url", llm.anthropic_url, *STRICT, "--no-speculate"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.slow
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
        assert run_agent(target, llm, provider, "--max-experiments", "1") == 2
    assert len(llm.pings) == 1 and llm.requests == []
    assert hint in capsys.readouterr().err
    nothing_was_created(target)


def nothing_was_created(target):
    """A refused start leaves no trace: no branch, no ledger, no results file."""
    assert "autoresearch/t" not in git.Repo(target).heads
    assert not (target / "events.jsonl").exists() and not (target / "results.tsv").exists()


def test_a_dead_server_is_an_error_at_once_and_creates_nothing(target, capsys):
    """--base-url where nothing listens: one clear error in seconds (no retries forever), before anything exists."""
    import socket
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    t0 = time.monotonic()
    assert agent_main(target, "--proposer", "openai", "--base-url", f"http://127.0.0.1:{port}/v1") == 2
    assert time.monotonic() - t0 < 30
    err = capsys.readouterr().err
    assert f"cannot reach http://127.0.0.1:{port}/v1 (APIConnectionError: Connection error.)" in err
    assert "is the server running" in err and "Traceback" not in err
    nothing_was_created(target)


def agent_main(target, *extra):
    """agent.main on tag t with these flags (no loopback LLM)."""
    import agent
    return agent.main(["--tag", "t", "--target", str(target), *STRICT, "--max-experiments", "1", *extra])


def test_three_tags_and_a_return_keep_every_row_with_its_tag_once(target, tmp_path):
    """Baselines of tags started from one commit have the same row text: the order of rows and events tells them
    apart, and a tag resumed after another brings its own rows back."""
    for tag, n in (("a", "1"), ("b", "1"), ("a", "2"), ("c", "1")):
        assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", n, "--tag", tag) == 0
    by_tag = {}
    for e in events(target, "experiment"):
        by_tag.setdefault(e["tag"], []).append(ledger.results_row(e))
    assert len(by_tag["a"]) == 3 and len(by_tag["b"]) == 2 and len(by_tag["c"]) == 2
    header = ledger.results_header("val_bpb")
    assert rows(target) == by_tag["c"]
    for tag in ("a", "b"):
        assert (target / f"results.{tag}.tsv").read_text().splitlines() == [header, *by_tag[tag]], tag
    assert not (target / "results.c.tsv").exists() and not (target / "results.tsv.new").exists()


def test_moving_rows_aside_is_finished_not_repeated_after_a_kill(target):
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1", "--tag", "a") == 0
    all_events = ledger.read_events(target / "events.jsonl")
    a_rows = rows(target)
    archive = target / "results.a.tsv"
    # killed after writing the archive, before results.tsv was replaced; and mid-append of its last row
    archive.write_text(ledger.results_header("val_bpb") + "\n" + a_rows[0] + "\n" + a_rows[1][:-7])
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1", "--tag", "b") == 0
    assert archive.read_text().splitlines() == [ledger.results_header("val_bpb"), *a_rows]
    assert len(rows(target)) == 2 and all(row not in a_rows[1:] for row in rows(target))
    assert ledger.keep_one_tag(target / "results.tsv", ledger.read_events(target / "events.jsonl"), "b",
                               "val_bpb") == {}          # nothing left to move: a second call changes nothing
    assert len(all_events) < len(ledger.read_events(target / "events.jsonl"))


def test_a_row_cut_inside_a_utf8_character_is_repaired(target):
    utf8 = edit("raise LR to 0.05 — café 日本語", "LR = 0.04", "LR = 0.05")
    with ScriptedLLM([utf8]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    path = target / "results.tsv"
    complete = path.read_bytes()
    path.write_bytes(complete[:complete.rindex("\u65e5".encode()) + 1])     # one byte of a 3-byte character
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1") == 0
    assert path.read_bytes() == complete
    assert events(target, "torn_line")[0]["file"] == "results.tsv"


def test_malformed_events_do_not_crash_the_restart_or_the_report(target, capsys):
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1") == 0
    with open(target / "events.jsonl", "a") as f:
        f.write('{"event": "experiment", "tag": "zz"}\n{"event": "experiment", "tag": "zz", "commit": "x", '
                '"metric": null, "memory_gb": 1, "status": "keep", "description": "d"}\n')
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "2") == 0
    assert len(rows(target)) == 3
    assert report.main([str(target / "results.tsv"), "--png", str(target / "p.png")]) == 0


def test_redaction_catches_escaped_overlapping_and_url_secrets(monkeypatch, tmp_path):
    monkeypatch.setenv("A_TOKEN", "overlap-123")
    monkeypatch.setenv("B_TOKEN", "overlap-123-and-the-rest-of-b")
    monkeypatch.setenv("DB_PASSWORD", 'pa"ss\\w0rd-99 ünïcode')
    assert redact.redact("x overlap-123-and-the-rest-of-b y") == "x [redacted] y"
    assert redact.redact("index https://me:s3cr3t@pypi.example/simple") == "index https://me:[redacted]@pypi.example/simple"
    ledger.log_event(tmp_path / "events.jsonl", "t", "error", text='said pa"ss\\w0rd-99 ünïcode')
    line = (tmp_path / "events.jsonl").read_text()
    assert "[redacted]" in line and "w0rd-99" not in line
    monkeypatch.setenv("UV_INDEX_URL", "https://me:s3cr3t@pypi.example/simple")
    assert "UV_INDEX_URL" not in redact.clean_env()
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".netrc").write_text("machine x login me password p\n")
    (tmp_path / ".cache" / "huggingface").mkdir(parents=True)
    (tmp_path / ".cache" / "huggingface" / "token").write_text("hf_x\n")
    assert sorted(view.credential_paths()) == [tmp_path / ".cache" / "huggingface" / "token", tmp_path / ".netrc"]


def test_a_secret_quoted_in_a_rejection_reason_is_redacted_in_every_record(target, monkeypatch, tmp_path, capsys):
    """Without the sandbox train.py can read files (or agent.py's /proc environ); what it prints back is redacted."""
    secret = "hf_abcdefghijklmnopqrst"
    monkeypatch.setenv("HF_TOKEN", secret)
    (tmp_path / "token").write_text(secret)
    budget_line = "print(f\"time_budget_s:    {{os.environ.get('AUTORESEARCH_TIME_BUDGET', '1')}}\")"
    budget_line = budget_line.replace("{{", "{").replace("}}", "}")
    liar = edit("report a stolen token", budget_line,
                f"print('time_budget_s:    ' + open({str(tmp_path / 'token')!r}).read())")
    with ScriptedLLM([liar, *NO_FIX]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1", "--sandbox", "off") == 0
    crash = events(target, "experiment")[-1]
    assert crash["status"] == "crash" and "[redacted]" in crash["description"], crash
    for text in ((target / "results.tsv").read_text(), (target / "events.jsonl").read_text(),
                 json.dumps(llm.requests), capsys.readouterr().out):
        assert secret not in text


def test_an_endpoint_of_another_kind_stops_with_a_message_not_a_traceback(target, capsys):
    with ScriptedLLM([RAISE_LR], ping={}) as llm:                      # a 200 whose body is not a Messages response
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 2
    err = capsys.readouterr().err
    assert "answered, but not in an Anthropic Messages format" in err and "Traceback" not in err
    with ScriptedLLM([{"id": "x", "object": "chat.completion", "choices": []}]) as llm:
        assert run_agent(target, llm, "openai", "--max-experiments", "1", "--tag", "o") == 1   # after the baseline
    assert "answered, but not in an OpenAI Chat Completions format" in capsys.readouterr().err


def test_escape_sequences_from_an_endpoint_never_reach_the_terminal(target, capsys):
    with ScriptedLLM([RAISE_LR], ping=401) as llm:
        llm.error_text = "\x1b]0;pwned\x07\x1b[2J YOUR KEY WAS REVOKED"
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 2
    assert console.shown("a\x1b]0;t\x07b\n") == "a\\x1b]0;t\\x07b\n"


def test_git_log_tells_the_story_through_notes(target):
    with ScriptedLLM([RAISE_LR, edit("lower LR", "LR = 0.05", "LR = 0.03")]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "2") == 0
    repo = git.Repo(target)
    base, keep, discard = [e["full_commit"] for e in events(target, "experiment")]
    assert repo.git.notes("show", keep).startswith(
        f"autoresearch t #1: keep, val_bpb 1.008000 (-0.100000 vs its base {base[:7]} at 1.108000); 1 run; memory 0.0 GB;")
    assert repo.git.notes("show", discard).startswith(
        f"autoresearch t #2: discard, val_bpb 1.208000 (+0.200000 vs its base {keep[:7]} at 1.008000); 1 run;")
    assert "autoresearch t #0: keep, val_bpb 1.108000; 1 run" in repo.git.notes("show", base)
    log = repo.git.log("autoresearch/t")                     # plain git log shows them, no flags
    assert "Notes:" in log and "autoresearch t #1: keep" in log
    # a kill between the event and its note: the resume writes it, once
    repo.git.notes("remove", discard)
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "2") == 0
    assert repo.git.notes("show", discard).count("autoresearch t #2: discard") == 1
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "2") == 0
    assert repo.git.notes("show", discard).count("autoresearch t #2: discard") == 1


def test_a_forged_row_in_a_tags_own_file_is_not_brought_back(target):
    for tag in ("a", "b"):
        assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1", "--tag", tag) == 0
    archive = target / "results.a.tsv"
    real = archive.read_text()
    forged = real.splitlines()[1].split("\t")[0] + "\t0.100000\t2.0\tkeep\tforged\n"
    archive.write_text(real + forged)                  # written by something other than agent.py
    assert run_agent(target, None, "anthropic", "--proposer", "random", "--max-experiments", "1", "--tag", "a") == 0
    assert rows(target) == real.splitlines()[1:] and archive.read_text() == real + forged   # kept apart, not lost


def test_a_branch_checked_out_during_the_loop_is_never_moved(target):
    """`git switch autoresearch/t` while a winner trains: its keep is recorded, the branch (and so the user's HEAD,
    index and worktree) stays where it was, the loop stops with the way out; after switching back the rerun moves
    the branch to the kept commit."""
    slow_win = edit("raise LR slowly", "LR = 0.04\nDEPTH = 8\nWARMUP = 0.1\nSLEEP = 0.0",
                    "LR = 0.05\nDEPTH = 8\nWARMUP = 0.1\nSLEEP = 2.0")
    repo = git.Repo(target)
    with ScriptedLLM([slow_win]) as llm:
        proc = start_agent(target, llm, "--max-experiments", "1")
        wait_for_run(target, 1, proc)
        repo.git.switch("autoresearch/t")
        before = repo.head.commit.hexsha
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "autoresearch/t was checked out in" in err and "Experiment #1 was kept and recorded" in err
    kept = events(target, "experiment")[-1]
    assert kept["status"] == "keep" and rows(target)[-1].startswith(kept["commit"])
    assert repo.head.commit.hexsha == before == sha(target, "main") and tree_is_clean(target)
    repo.git.switch("main")
    with ScriptedLLM([]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    assert sha(target, "autoresearch/t") == kept["full_commit"]


def test_stale_git_locks_are_named_at_start_and_a_git_failure_is_a_message(target, capsys):
    """A lock a dead git command left on a ref not the agent's (a reboot mid-write): refused at the start, nothing
    created. One on its own refs (a killed agent's): removed with a line. One that appears while a winner trains:
    the keep is recorded, the stop quotes git, no traceback; the rerun removes it and resumes."""
    locks = target / ".git" / "refs" / "heads" / "main.lock"
    locks.write_text("")
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "1") == 2
    err = capsys.readouterr().err
    assert f"stale git lock file (left by a git command that died mid-write, e.g. at a reboot): {locks}" in err
    assert f"remove it (rm {locks})" in err
    assert "autoresearch/t" not in git.Repo(target).heads and not (target / "events.jsonl").exists()
    locks.unlink()
    notes_lock = target / ".git" / "refs" / "notes" / "commits.lock"
    notes_lock.parent.mkdir(parents=True, exist_ok=True)
    notes_lock.write_text("")
    slow_win = edit("raise LR slowly", "LR = 0.04\nDEPTH = 8\nWARMUP = 0.1\nSLEEP = 0.0",
                    "LR = 0.05\nDEPTH = 8\nWARMUP = 0.1\nSLEEP = 2.0")
    branch_lock = target / ".git" / "refs" / "heads" / "autoresearch" / "t.lock"
    with ScriptedLLM([slow_win]) as llm:
        proc = start_agent(target, llm, "--max-experiments", "1")
        wait_for_run(target, 1, proc)
        assert not notes_lock.exists()
        branch_lock.write_text("")
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in err
    assert "agent.py: stopped: `git update-ref` failed: fatal: update_ref failed for ref 'refs/heads/autoresearch/t': cannot lock ref" in err
    kept = events(target, "experiment")[-1]
    assert kept["status"] == "keep" and rows(target)[-1].startswith(kept["commit"])
    with ScriptedLLM([]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    assert f"removed {branch_lock}: a git lock left by a git command of a killed agent.py" in capsys.readouterr().out
    assert sha(target, "autoresearch/t") == kept["full_commit"] and not branch_lock.exists()


def test_a_target_file_that_is_not_utf8_is_named_before_anything_is_created(target, capsys):
    """A binary program.md (or train.py): exit 2 naming the file and the byte, no branch, no ledger; one that turns
    binary while the loop runs stops it with the same words (exit 1), no traceback."""
    program = (target / "program.md").read_bytes()
    (target / "program.md").write_bytes(b"# directions\n\xff\xfe\x00binary")
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "1") == 2
    err = capsys.readouterr().err
    assert f"agent.py: error: {target / 'program.md'} is not UTF-8 text (invalid start byte, byte 13)" in err
    assert "save it as UTF-8, then rerun" in err
    assert "autoresearch/t" not in git.Repo(target).heads and not (target / "events.jsonl").exists()
    (target / "program.md").write_bytes(program)
    with ScriptedLLM([RAISE_LR]) as llm:
        proc = start_agent(target, llm, "--max-experiments", "1")     # the idea is asked once the baseline is in
        wait_for_run(target, 0, proc)
        (target / "program.md").write_bytes(b"\xff" + program)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in err
    assert f"agent.py: stopped: {target / 'program.md'} is not UTF-8 text (invalid start byte, byte 0)" in err
    assert rows(target) == [baseline_row(target)]                     # the baseline is recorded


def test_an_unwritable_results_file_stops_with_its_name_and_the_fix(target, capsys):
    """results.tsv made immutable (even root cannot write it) between runs: the first record stops the loop with the
    file, the error and the fix, no traceback; once writable again the rerun resumes with every row."""
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "0") == 0
    results = target / "results.tsv"
    if subprocess.run(["chattr", "+i", str(results)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i does not work on this filesystem")
    try:
        capsys.readouterr()
        assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "1") == 1
        err = capsys.readouterr().err
        assert f"agent.py: stopped: {results}: Operation not permitted; make it writable for root" in err
        assert "Traceback" not in err
    finally:
        subprocess.run(["chattr", "-i", str(results)], check=True)
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "1") == 0
    assert [r.split("\t")[0] for r in rows(target)] == [e["commit"] for e in events(target, "experiment")]
    assert len(rows(target)) == 2


def test_a_full_process_table_stops_with_the_fix_and_the_rerun_measures_the_experiment(target, monkeypatch, capsys):
    """The machine cannot start train.py (fork: EAGAIN, as a run's fork bomb or a machine out of memory leaves it):
    the loop stops with what happened and the fix, no traceback, nothing recorded for the idea; the rerun measures
    it."""
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "0") == 0
    real = subprocess.Popen

    class Full(real):
        def __init__(self, argv, *args, **kwargs):
            if "train.py" in argv:
                raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
            super().__init__(argv, *args, **kwargs)
    monkeypatch.setattr(subprocess, "Popen", Full)
    capsys.readouterr()
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "1") == 1
    err = capsys.readouterr().err
    assert "agent.py: stopped: the machine could not start a process (Resource temporarily unavailable): its process " \
           "table or its memory is full; end what holds them (`ps -e | wc -l` counts the processes), then rerun the " \
           "same command to resume" in err and "Traceback" not in err
    assert len(events(target, "experiment")) == 1
    monkeypatch.setattr(subprocess, "Popen", real)
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "1") == 0
    assert len(rows(target)) == 2 and len(events(target, "experiment")) == 2


def test_data_gone_during_a_run_stops_without_blaming_the_idea(target, monkeypatch):
    """The prepared data deleted while #1 trains (and #1 crashes): the machine is at fault, not the idea: nothing is
    recorded, nothing sent for a fix, the stop names the fix; once the data is back the rerun measures #1 again."""
    crash = edit("crash slowly", "LR = 0.04\nDEPTH = 8\nWARMUP = 0.1\nSLEEP = 0.0",
                 "LR = 0.04\nDEPTH = 8\nWARMUP = 0.1\nSLEEP = 2.0\nraise SystemExit(3)")
    ready = Path(os.environ["AUTORESEARCH_CACHE"]) / "ready"
    with ScriptedLLM([crash]) as llm:
        proc = start_agent(target, llm, "--max-experiments", "1")
        wait_for_run(target, 1, proc)
        ready.unlink()
        _, err = proc.communicate(timeout=60)
        assert len(llm.requests) == 1                                   # no fix was asked for
    assert proc.returncode == 1 and "Traceback" not in err
    assert "the prepared data is not usable any more (no prepared data: run `python prepare.py` first)" in err
    assert "experiment #1's crash is not counted, it runs again" in err
    assert rows(target) == [baseline_row(target)] and len(events(target, "experiment")) == 1
    ready.touch()
    with ScriptedLLM(NO_FIX) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    [redo] = events(target, "redo")
    assert redo["idea"] == "crash slowly"
    row = rows(target)[1].split("\t")
    assert row[3] == "crash" and row[4].startswith("crash slowly (exit code 3"), row


@pytest.mark.parametrize("after", [0.2, 0.6])
def test_ctrl_c_while_agent_py_starts_is_a_clean_exit(target, after):
    """Ctrl-C in the first second (the modules still loading, or the setup): exit 130, no traceback."""
    for argv in (["--tag", "t", "--proposer", "random"], ["try", "--tag", "t", "--baseline"]):
        proc = subprocess.Popen([sys.executable, str(AGENT), *argv, "--target", str(target)], cwd=target,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(after)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "Traceback" not in err + out, err


def test_ctrl_c_inside_an_sdk_import_is_an_interrupt_not_a_traceback(target, capsys, monkeypatch):
    """Ctrl-C while an SDK's classes are being made: Python 3.11 wraps the KeyboardInterrupt raised inside a
    __set_name__ in `RuntimeError: Error calling __set_name__ ...`. Exit 130 with the interrupt's words."""
    def importing(settings):
        class Field:
            def __set_name__(self, owner, name):
                raise KeyboardInterrupt

        class Model:            # what `import anthropic` does by the hundred
            field = Field()
        return Model
    monkeypatch.setattr(agent, "make_proposer", importing)
    assert agent.main(["--tag", "t", "--target", str(target), "--proposer", "anthropic"]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and "RuntimeError" not in err
    assert err.endswith("agent.py: interrupted; nothing was recorded. Rerun the same command to resume.\n")


def test_ctrl_c_inside_a_study_query_is_an_interrupt_not_a_traceback(target, capsys, monkeypatch):
    """Ctrl-C while SQLAlchemy runs one of the study's queries (TPE asking for experiment #1's point): SQLAlchemy
    rolls back and logs, Optuna may wrap what it raised; exit 130 with the interrupt's words, nothing of either
    library on the terminal, and the same command resumes."""
    import sqlalchemy
    fired = []

    def interrupt(conn, cursor, statement, parameters, context, executemany):
        if not fired and "trial" in statement and len((target / "results.tsv").read_text().splitlines()) == 2:
            fired.append(statement)
            raise KeyboardInterrupt
    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", interrupt)
    try:
        code = agent.main(["--tag", "t", "--target", str(target), *STRICT, "--proposer", "tpe", "--no-speculate",
                           "--max-experiments", "3"])
    finally:
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "before_cursor_execute", interrupt)
    out, err = capsys.readouterr()
    assert code == 130 and fired and "Traceback" not in out + err and "sqlalchemy" not in (out + err).lower()
    assert err.endswith(f"agent.py: interrupted; the last experiment, #0 (keep), is recorded in events.jsonl; "
                        f"autoresearch/t is at the best commit ({sha(target, 'main')[:7]}). Rerun the same command "
                        "to resume.\n")
    assert agent.main(["--tag", "t", "--target", str(target), *STRICT, "--proposer", "tpe", "--no-speculate",
                       "--max-experiments", "2"]) == 0
    assert len(rows(target)) == 3 and events(target, "experiment")[1]["description"].startswith("tpe: ")


def test_a_baseline_that_does_not_parse_stops_with_its_crash_under_random_and_speculation(target, capsys):
    """--proposer random proposes while the baseline trains: a train.py with a syntax error gives no idea (not a
    traceback from the perturbation), and the baseline's crash stops the loop with its reason."""
    train = target / "train.py"
    train.write_text(train.read_text() + "\ndef broken(:\n")
    git.Repo(target).git.commit("-qam", "a typo")
    import agent
    assert agent.main(["--tag", "t", "--target", str(target), *STRICT, "--proposer", "random",
                       "--max-experiments", "2"]) == 1
    err = capsys.readouterr().err
    assert "agent.py: stopped: the baseline run crashed (exit code 1" in err and "SyntaxError" in err
    assert rows(target) == []


def test_a_run_that_prints_a_flood_keeps_its_head_and_tail(target):
    """~20 MB of output: the kept log is cut to its first and last 8 MiB with the cut marked; the summary at its end
    is still read (the row is a normal keep) and run.log is the same capped copy."""
    flood = edit("print a lot", "time.sleep(SLEEP)", "time.sleep(SLEEP)\nfor _ in range(20_000):\n    print('x' * 999)")
    with ScriptedLLM([flood]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    assert rows(target)[1].split("\t")[1:4] == ["1.108000", "0.0", "discard"]
    log = Path(events(target, "run_end")[-1]["log"]).read_bytes()
    assert len(log) < runner.LOG_CAP_BYTES + 4096 and b"bytes cut by the harness" in log
    assert log.startswith(b"step 1 | loss 2.0") and b"=== separate evaluation" in log
    assert (target / "run.log").read_bytes() == log


def test_a_ledger_deleted_while_the_loop_runs_stops_it_and_a_renumbered_one_is_refused(target, capsys):
    """events.jsonl deleted while #1 trains: the next event is not written into a new file (which would hold only
    later events); the loop stops with the way out. Put back, the tag resumes; cut to experiments that are not
    numbered 0..N-1 from the baseline, the resume is refused before anything runs."""
    slow_win = edit("raise LR slowly", "LR = 0.04\nDEPTH = 8\nWARMUP = 0.1\nSLEEP = 0.0",
                    "LR = 0.05\nDEPTH = 8\nWARMUP = 0.1\nSLEEP = 2.0")
    ledger_path = target / "events.jsonl"
    with ScriptedLLM([slow_win]) as llm:
        proc = start_agent(target, llm, "--max-experiments", "1")
        wait_for_run(target, 1, proc)
        saved = ledger_path.read_bytes()
        ledger_path.unlink()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in err
    assert f"{ledger_path} is gone while the loop ran" in err and not ledger_path.exists()
    ledger_path.write_bytes(saved)
    with ScriptedLLM([]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0       # #1 redone from its commit
    assert [e["n"] for e in events(target, "experiment")] == [0, 1] and len(rows(target)) == 2
    lines = ledger_path.read_text().splitlines()
    ledger_path.write_text("\n".join(line for line in lines if '"n": 0' not in line or '"experiment"' not in line)
                           + "\n")
    capsys.readouterr()
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "2") == 2
    assert "holds experiments of tag t numbered 1, not 0..N-1 starting with the baseline" in capsys.readouterr().err


def test_a_tag_with_several_baseline_runs_resumes_and_results_moved_aside_come_back(target):
    """--baseline-runs 2 (the baseline's row says "baseline (2 runs)") resumes; results.tsv moved aside, as the stray
    rows refusal advises, is rebuilt with every row of the tag from its events."""
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "2",
                     "--baseline-runs", "2") == 0
    before = rows(target)
    assert before[0].endswith("\tkeep\tbaseline (2 runs)") and len(before) == 3
    (target / "results.tsv").rename(target / "aside.tsv")
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "3",
                     "--baseline-runs", "2") == 0
    assert rows(target)[:3] == before and len(rows(target)) == 4
    assert [e["n"] for e in events(target, "row_restored")] == [0, 1, 2]


def test_plain_progress_lines_come_once_per_phase(target, capsys, monkeypatch):
    """stdout not a terminal, speculation on (its throughput figures change every tick): one "training" line per
    run, not one per second."""
    slow = edit("slow", "SLEEP = 0.0", "SLEEP = 4.0")
    with ScriptedLLM([slow, RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "2") == 0
    out = capsys.readouterr().out
    training = [line for line in out.splitlines() if line.startswith("exp 1 | run 1 of 1, training")]
    assert 1 <= len(training) <= 2, training
    phases = [line.split(" | ")[1] for line in out.splitlines() if line.startswith("exp 1 | ")]
    said = [p.split(", ")[-1].split(" ")[0] for p in phases if p.startswith("run 1 of 1, ")]
    assert said[0] == "training" and "probing" in said[1:]    # its probe before: the baseline's probe after
    assert [e.get("probe_shared") for e in events(target, "run_end") if e["n"] == 1] == [True]
    assert any(p.startswith("run 1 of 1, evaluating") for p in phases)
    s = types.SimpleNamespace(tag=types.SimpleNamespace(budget=60.0), pool=None)
    said = []
    monkeypatch.setattr(session, "status", lambda s, n, phase: said.append(phase))
    for elapsed in (30.0, 65.0):
        session.tick(s, 2, elapsed, None, "training", "run 1 of 3")
    assert said == ["run 1 of 3, training 0:30/1:00", "run 1 of 3, finishing 1:05 (past the 1:00 budget)"]


def test_a_candidate_redone_under_two_numbers_is_measured_once(target):
    """Two stops in a row can leave the same train.py committed as #1 and as #2 (the redo of #2 committed as #1,
    then killed): the resume redoes it once, and the proposer gives the next experiment."""
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "0") == 0
    repo = git.Repo(target)
    base = repo.commit("autoresearch/t")
    text = (target / "train.py").read_text().replace("LR = 0.04", "LR = 0.05")
    def git_out(*argv, given=""):
        return subprocess.run(["git", *argv], cwd=target, input=given, capture_output=True, text=True,
                              check=True).stdout.strip()
    blob = git_out("hash-object", "-w", "--stdin", given=text)
    tree = git_out("mktree", given="".join(f"{e.mode:o} {e.type} {blob if e.path == 'train.py' else e.hexsha}\t"
                                           f"{e.path}\n" for e in base.tree))
    sha = git_out("commit-tree", tree, "-p", base.hexsha, "-m", "raise LR")
    with open(target / "events.jsonl", "a") as f:
        for n in (1, 2):
            f.write(json.dumps({"ts": "2026-12-02T00:00:00+00:00", "event": "commit", "tag": "t", "n": n, "fix": 0,
                                "full_commit": sha}) + "\n")
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "2") == 0
    exps = events(target, "experiment")
    assert exps[1]["description"] == "raise LR" and exps[2]["description"].startswith("random: ")
    assert len(events(target, "redo")) == 1
    blobs = [repo.commit(e["full_commit"]).tree["train.py"].hexsha for e in exps]
    assert len(set(blobs)) == 3


def damage(obj, how):
    """Damage a loose git object file as a disk fault would: garbage, cut in half, or valid zlib of other bytes."""
    import zlib
    good = obj.read_bytes()
    obj.chmod(0o644)
    data = zlib.decompress(good)
    obj.write_bytes({"garbage": b"garbage", "cut": good[:len(good) // 2],
                     "rewritten": zlib.compress(data.replace(b"LR = 0.05", b"LR = 0.07"))}[how])
    return good


@pytest.mark.parametrize("how, what", [("garbage", "commit"), ("cut", "train.py"), ("rewritten", "train.py"),
                                       ("garbage", "prepare.py")])
def test_a_damaged_git_object_of_a_recorded_candidate_is_named_at_resume(target, capsys, how, what):
    """A recorded candidate's object damaged on disk (a disk fault, a killed `git gc`): the resume names that
    experiment, the objects folder and `git fsck`, exit 2, no traceback, nothing written; once the object is back
    the tag resumes."""
    with ScriptedLLM([RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    kept = events(target, "experiment")[1]
    repo = git.Repo(target)
    sha = kept["full_commit"] if what == "commit" else repo.commit(kept["full_commit"]).tree[what].hexsha
    if what == "prepare.py":                        # in every experiment's tree: the first one checked is named
        kept = events(target, "experiment")[0]
    obj = target / ".git" / "objects" / sha[:2] / sha[2:]
    good = damage(obj, how)
    before = [(target / name).read_bytes() for name in ("results.tsv", "events.jsonl")]
    with ScriptedLLM([]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "2") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"of experiment #{kept['n']} ({kept['commit']}" in err
    assert f"{target / '.git'}/objects are missing or damaged. `git fsck` names them" in err
    assert [(target / name).read_bytes() for name in ("results.tsv", "events.jsonl")] == before
    obj.write_bytes(good)
    with ScriptedLLM([LOWER_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "2") == 0
    assert rows(target)[-1].endswith("discard\tlower LR")


@pytest.mark.parametrize("how, what", [("garbage", "commit"), ("cut", "train.py"), ("garbage", "train.py")])
def test_a_damaged_object_of_a_discarded_candidate_is_named_and_the_tag_goes_on(target, capsys, how, what):
    """Only a discard's object is damaged: the loop needs it only to compare new ideas with it. The resume names
    it, records it as unreadable in the events (once), keeps its row, and runs the next experiment; the same idea
    proposed again is measured (nothing can say it repeats an unreadable one)."""
    with ScriptedLLM([RAISE_LR, LOWER_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "2") == 0
    discard = events(target, "experiment")[2]
    assert discard["status"] == "discard"
    repo = git.Repo(target)
    sha = discard["full_commit"] if what == "commit" else repo.commit(discard["full_commit"]).tree[what].hexsha
    damage(target / ".git" / "objects" / sha[:2] / sha[2:], how)
    row = rows(target)[2]
    with ScriptedLLM([edit("lower LR again", "LR = 0.05", "LR = 0.03")]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "3") == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert f"experiment #2 ({discard['commit']}) is unreadable" in out and "(SHA b'" not in out
    assert [e["n"] for e in events(target, "unreadable")] == [2] and rows(target)[2] == row
    assert rows(target)[3].endswith("\tlower LR again") and len(rows(target)) == 4
    with ScriptedLLM([]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "3") == 0
    assert [e["n"] for e in events(target, "unreadable")] == [2]                    # recorded once


@pytest.mark.parametrize("where", ["add_note", "advance_branch"])
def test_an_interrupt_right_after_a_keeps_event_says_what_is_recorded_and_the_next_start_completes_it(
        target, capsys, monkeypatch, where):
    """Ctrl-C right after the keep's event (before its note and row: add_note), or after them before the branch
    moves (advance_branch): exit 130, and the words say what is on disk at that moment, not "at the best commit";
    the next start writes what is missing and moves the branch."""
    real = getattr(gitops, where)
    calls = []

    def interrupted(repo, commit, *rest):
        if not calls and (where == "advance_branch" or " #1: keep" in rest[0]):
            calls.append(commit)
            raise KeyboardInterrupt
        return real(repo, commit, *rest)
    monkeypatch.setattr(gitops, where, interrupted)
    with ScriptedLLM([RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 130
    err = capsys.readouterr().err
    kept = events(target, "experiment")[1]
    assert kept["status"] == "keep" and calls and "Traceback" not in err
    main = sha(target, "main")[:7]
    said = err.split("agent.py: interrupted; ")[1]
    assert said.startswith(f"the last experiment, #1 (keep), is recorded in events.jsonl; autoresearch/t is still "
                           f"at {main}, behind the last keep (#1, {kept['commit']})")
    missing = "; its results.tsv row and its git note not written yet" if where == "add_note" else ""
    assert said == (f"the last experiment, #1 (keep), is recorded in events.jsonl; autoresearch/t is still at {main}, "
                    f"behind the last keep (#1, {kept['commit']}){missing}; the next start completes them. Rerun the "
                    "same command to resume.\n")
    assert len(rows(target)) == (1 if where == "add_note" else 2)
    monkeypatch.setattr(gitops, where, real)
    with ScriptedLLM([]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    assert sha(target, "autoresearch/t") == kept["full_commit"] and rows(target)[1].endswith("keep\traise LR")
    assert "autoresearch t #1: keep" in gitops.note_of(git.Repo(target), kept["full_commit"])


@pytest.mark.parametrize("how", ["git's helpers died, a library swallowed the interrupt", "a second Ctrl-C"])
def test_an_interrupt_that_breaks_git_or_comes_twice_ends_in_the_interrupts_words(target, capsys, monkeypatch, how):
    """The terminal's Ctrl-C also kills GitPython's `git cat-file` helpers (our process group): when the next read
    from one raises BrokenPipeError before any KeyboardInterrupt reaches main (a library swallowed it), that is still
    the interrupt. A second Ctrl-C during the clean-up cuts it short. Either way: exit 130 and the interrupt's words,
    never a traceback, and the next start resumes."""
    from harness.record import dashboard, experiment
    real_commit, real_refresh, calls = experiment.commit, dashboard.refresh, []

    def commit(s, n, *rest, **kw):
        if n == 1 and not calls:
            calls.append(n)
            if how.startswith("git"):
                for helper in (s.repo.git.cat_file_all, s.repo.git.cat_file_header):
                    if helper is not None:
                        os.kill(helper.proc.pid, signal.SIGINT)
                        helper.proc.wait()
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(1)
                except KeyboardInterrupt:   # as a library's `except BaseException` would
                    pass
            else:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
        return real_commit(s, n, *rest, **kw)

    def refresh(s, live=True, **kw):
        if not live and how == "a second Ctrl-C":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        return real_refresh(s, live=live, **kw)
    monkeypatch.setattr(experiment, "commit", commit)
    monkeypatch.setattr(dashboard, "refresh", refresh)
    with ScriptedLLM([RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 130
    err = capsys.readouterr().err
    assert calls == [1] and "Traceback" not in err
    assert err.endswith(f"agent.py: interrupted; the last experiment, #0 (keep), is recorded in events.jsonl; "
                        f"autoresearch/t is at the best commit ({sha(target, 'main')[:7]}). Rerun the same command to "
                        "resume.\n")
    if how.startswith("git"):               # fresh helpers: the stop was recorded
        assert events(target)[-1]["event"] == "stop" and events(target)[-1]["reason"] == "interrupted"
    monkeypatch.setattr(experiment, "commit", real_commit)
    monkeypatch.setattr(dashboard, "refresh", real_refresh)
    with ScriptedLLM([RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    assert rows(target)[1].endswith("keep\traise LR")


def test_a_refused_start_leaves_a_line_cut_mid_write_as_it_was(target, capsys, monkeypatch):
    """events.jsonl ends with a line cut by a kill, and the start is refused (another budget): nothing is cut, the
    file is byte for byte as it was; the accepted start then cuts it and keeps its text as a torn_line event."""
    with ScriptedLLM([RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    with open(target / "events.jsonl", "a") as f:
        f.write('{"event": "experiment", "n": 2, "half')
    before = (target / "events.jsonl").read_bytes()
    monkeypatch.setenv("AUTORESEARCH_TIME_BUDGET", "7")
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "1") == 2
    monkeypatch.delenv("AUTORESEARCH_TIME_BUDGET")
    assert "budget" in capsys.readouterr().err and (target / "events.jsonl").read_bytes() == before
    prepare = (target / "prepare.py").read_text()
    (target / "prepare.py").write_text(prepare + "# mine\n")                 # refused: uncommitted frozen file
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "1") == 2
    assert "uncommitted changes to prepare.py" in capsys.readouterr().err
    assert (target / "events.jsonl").read_bytes() == before
    (target / "prepare.py").write_text(prepare)
    with ScriptedLLM([]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    [torn] = events(target, "torn_line")
    assert torn["fragment"] == '{"event": "experiment", "n": 2, "half' and len(rows(target)) == 2


def test_a_record_is_written_only_into_a_regular_file_of_its_own(tmp_path):
    """ledger's writes refuse a symbolic link, a hard link, a FIFO (without hanging) and a folder, naming the path
    and the fix, and leave what they point to as it was; a regular file is appended to, replaced, copied into."""
    outside = tmp_path / "passwd"
    outside.write_text("root:x:0:0:root:/root:/bin/bash\n")
    link, hard, fifo, folder, plain = (tmp_path / name for name in ("link", "hard", "fifo", "folder", "plain"))
    link.symlink_to(outside)
    os.link(outside, hard)
    os.mkfifo(fifo)
    folder.mkdir()
    fixes = {link: f"Remove the link (`rm {link}` removes the link, not the file it names)",
             hard: f"keeping its content (`cp {hard} {hard}.own && mv {hard}.own {hard}`: the other name keeps",
             fifo: "Move it aside", folder: "Move it aside"}
    for path, problem in ((link, f"is a symbolic link (to {outside})"), (hard, "is one of 2 names of one file"),
                          (fifo, "is not a regular file"), (folder, "is not a regular file")):
        with pytest.raises(files.RecordError) as e:
            files.append_line(path, "row")
        assert str(e.value).startswith(f"{path} {problem}") and fixes[path] in str(e.value)
        assert (f"`rm {path}`" in str(e.value)) == (path == link)      # rm of a hard link takes the record away
        assert files.record_problem(path).startswith(problem)
        with pytest.raises(files.RecordError):
            files.copy_record(outside, path)
    with pytest.raises(files.RecordError):
        with files.open_record(link, "w"):
            pass
    assert outside.read_text() == "root:x:0:0:root:/root:/bin/bash\n" and link.is_symlink()
    subprocess.run(["sh", "-c", f"cp {hard} {hard}.own && mv {hard}.own {hard}"], check=True)   # the words' fix
    files.append_line(hard, "row")
    assert hard.read_text() == "root:x:0:0:root:/root:/bin/bash\nrow\n"
    assert outside.read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    files.append_line(plain, "a")
    files.append_line(plain, "b")
    assert plain.read_text() == "a\nb\n" and files.record_problem(plain) is None
    files.copy_record(outside, plain)
    assert plain.read_text() == outside.read_text()


@pytest.mark.parametrize("name", ["results.tsv", "events.jsonl", "run.log", "dashboard.html", "results.other.tsv",
                                  ".git/autoresearch/t/study.db", ".git/autoresearch/t", ".git/autoresearch"])
def test_a_link_at_a_record_or_the_tags_folder_is_refused_at_start(target, tmp_path, capsys, name):
    """A link planted at any record, store or the tag's folder before the loop starts: exit 2 naming it and the fix,
    nothing written through it, no branch created (and no traceback from the check that outputs are ignored)."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    path = target / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(outside if name.startswith(".git/autoresearch/t") and not name.endswith(".db")
                    or name == ".git/autoresearch" else outside / "passwd")
    assert agent_main(target, "--proposer", "random") == 2
    err = capsys.readouterr().err
    assert f"{path} is a symbolic link" in err and f"`rm {path}`" in err and "Traceback" not in err
    assert [p.name for p in outside.iterdir()] == ["passwd"]
    assert (outside / "passwd").read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    assert "autoresearch/t" not in [h.name for h in git.Repo(target).heads]


@pytest.mark.parametrize("name", ["results.tsv", "events.jsonl", "run.log"])
def test_a_record_replaced_by_a_link_while_the_loop_runs_stops_it_and_nothing_is_written_through(target, tmp_path,
                                                                                                   name):
    """results.tsv, events.jsonl or run.log swapped for a link (to a copy of itself, or to the user's notes) while #1
    trains: the next write stops the loop with the reason, the file behind the link is unchanged; with the file put
    back the tag resumes and no row is lost or doubled."""
    slow_win = edit("raise LR slowly", "LR = 0.04\nDEPTH = 8\nWARMUP = 0.1\nSLEEP = 0.0",
                    "LR = 0.05\nDEPTH = 8\nWARMUP = 0.1\nSLEEP = 2.0")
    path, notes = target / name, tmp_path / "notes.txt"
    with ScriptedLLM([slow_win]) as llm:
        proc = start_agent(target, llm, "--max-experiments", "1")
        wait_for_run(target, 1, proc)
        saved = path.read_bytes()
        notes.write_bytes(saved)
        path.unlink()
        path.symlink_to(notes)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert f"{path} is a symbolic link (to {notes})" in err and notes.read_bytes() == saved
    path.unlink()
    path.write_bytes(saved)
    with ScriptedLLM([slow_win]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    assert [e["n"] for e in events(target, "experiment")] == [0, 1]
    assert [r.split("\t")[0] for r in rows(target)] == [e["commit"] for e in events(target, "experiment")]


def holdout_evaluators(target):
    """Pids of live processes scoring this target's holdout (`prepare.py --evaluate ARTIFACT --split holdout`)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"holdout" in argv and b"--evaluate" in argv and str(target).encode() in argv[argv.index(b"--evaluate") + 1]:
            found.append(int(proc.name))
    return found


def test_kill_9_during_the_holdout_leaves_no_evaluator_behind(target):
    """kill -9 of agent.py while it re-scores the holdout at its stop: the holdout evaluator runs in the separate
    evaluator's sandbox (bwrap --die-with-parent), so it dies with the harness instead of running on."""
    (target / "holdout_sleep").write_text("60")
    repo = git.Repo(target)
    repo.git.add("holdout_sleep")
    repo.git.commit("-qm", "a slow holdout")
    with ScriptedLLM([RAISE_LR]) as llm:
        proc = start_agent(target, llm, "--max-experiments", "1", "--sandbox", "bwrap")
        deadline = time.monotonic() + 90
        while not holdout_evaluators(target):
            assert proc.poll() is None, f"agent.py exited {proc.returncode}: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "no holdout evaluator started"
            time.sleep(0.1)
        proc.kill()
        proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while holdout_evaluators(target) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert holdout_evaluators(target) == []
