"""Unit tests of harness/ledger.py on real files in tmp_path: the exact results.tsv row, torn last lines, one tag per
results.tsv, a lost row, and a tag's position rebuilt from its events. The loop's use of them (kills, resumes) is
tested against real processes in test_agent.py and test_faults.py."""

import json

import pytest

from harness import files, ledger
from harness.judge import curves
from harness.run import processes
from harness.tag import tagview


def experiment(tag, n, commit, metric, status="keep", description="idea", **extra):
    """An "experiment" event as the loop logs it (the fields results_row reads)."""
    return {"event": "experiment", "tag": tag, "n": n, "commit": commit, "metric": metric, "memory_gb": 1.25,
            "status": status, "description": description, **extra}


def write(path, *lines, end="\n"):
    path.write_text("".join(line + "\n" for line in lines[:-1]) + lines[-1] + end if lines else "")
    return path

# ---------------------------------------------------------------------------
# The row
# ---------------------------------------------------------------------------


def test_results_row_is_karpathys_five_columns_exactly():
    event = experiment("t", 1, "abc1234", 1.0080004, description="raise LR", memory_gb=12.34)
    assert ledger.results_row(event) == "abc1234\t1.008000\t12.3\tkeep\traise LR"
    crash = experiment("t", 2, "def5678", 0.0, status="crash", description="oops (timeout after 2s)")
    assert ledger.results_row(crash) == "def5678\t0.000000\t1.2\tcrash\toops (timeout after 2s)"
    smoke = experiment("t", 0, "abc1234", 2.5, description="baseline", smoke=True, budget_s=10)
    assert ledger.results_row(smoke) == "abc1234\t2.500000\t1.2\tkeep\t[budget 10s] baseline"
    assert ledger.SMOKE_LABEL.sub("", ledger.results_row(smoke).split("\t")[4]) == "baseline"
    assert ledger.results_header("pass@1") == "commit\tpass@1\tmemory_gb\tstatus\tdescription"
    assert ledger.row_of({"event": "experiment", "commit": "abc1234"}) is None      # too malformed for a row


def test_is_row_and_is_event():
    assert ledger.is_row("abc1234\t1.008000\t0.0\tkeep\tx") and ledger.is_row("commit\tval_bpb\tm\ts\td")
    assert not ledger.is_row("abc1234\t1.008000\t0.0\tkeep") and not ledger.is_row("abc1234\tnope\t0.0\tkeep\tx")
    assert ledger.is_event(b'{"event": "x"}') and not ledger.is_event(b'{"event": ') and not ledger.is_event(b"[1]")

# ---------------------------------------------------------------------------
# Torn last lines
# ---------------------------------------------------------------------------


def test_repair_last_line_cuts_a_torn_line_and_keeps_whole_ones(tmp_path):
    path = write(tmp_path / "f", "one", "two", "par", end="")
    assert ledger.repair_last_line(path, lambda data: False) == "par"
    assert path.read_text() == "one\ntwo\n"
    assert ledger.repair_last_line(path, lambda data: False) == "" and path.read_text() == "one\ntwo\n"
    write(path, "one", "whole", end="")
    seen = []
    assert ledger.repair_last_line(path, lambda data: seen.append(data) or True) == ""
    assert path.read_text() == "one\nwhole\n" and seen == [b"whole"]
    assert ledger.repair_last_line(tmp_path / "absent", lambda data: False) == ""


def test_repair_last_line_inside_a_utf8_character(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"one\n" + "caf\u00e9".encode()[:-1])      # cut between the two bytes of the e-acute
    assert ledger.repair_last_line(path, lambda data: False) == "caf\ufffd" and path.read_bytes() == b"one\n"


def test_repair_results_cuts_a_prefix_of_an_events_row_and_completes_a_whole_row(tmp_path):
    events = [experiment("t", 0, "abc1234", 1.5, description="baseline"),
              experiment("t", 1, "def5678", 1.25, description="raise LR")]
    header = ledger.results_header("val_bpb")
    path = write(tmp_path / "results.tsv", header, ledger.results_row(events[0]), "def5678\t1.250000\t1.2\tkeep\traise",
                 end="")
    assert ledger.repair_results(path, events) == "def5678\t1.250000\t1.2\tkeep\traise"
    assert path.read_text() == f"{header}\n{ledger.results_row(events[0])}\n"
    write(path, header, ledger.results_row(events[0]), ledger.results_row(events[1]), end="")   # saved without \n
    assert ledger.repair_results(path, events) == ""
    assert ledger.read_rows(path) == [ledger.results_row(e) for e in events] and path.read_text().endswith("LR\n")

# ---------------------------------------------------------------------------
# One tag per results.tsv
# ---------------------------------------------------------------------------


def test_keep_one_tag_moves_other_tags_aside_and_back(tmp_path):
    a = [experiment("a", 0, "aaaaaaa", 1.5, description="baseline"), experiment("a", 1, "abababa", 1.25)]
    b = [experiment("b", 0, "aaaaaaa", 1.5, description="baseline"),       # the same baseline row as a's
         experiment("b", 1, "bbbbbbb", 1.375, status="discard")]
    events = a + b
    header = ledger.results_header("val_bpb")
    results = write(tmp_path / "results.tsv", header, *map(ledger.results_row, events))
    archive_a, archive_b = tmp_path / "results.a.tsv", tmp_path / "results.b.tsv"
    assert ledger.archive_path(results, "a") == archive_a
    assert ledger.rows_by_tag(results, events) == ({"a": [ledger.results_row(e) for e in a],
                                                    "b": [ledger.results_row(e) for e in b]}, [])

    assert ledger.keep_one_tag(results, events, "b", "val_bpb") == {archive_a: 2}
    assert results.read_text() == "".join(f"{line}\n" for line in [header, *map(ledger.results_row, b)])
    assert archive_a.read_text() == "".join(f"{line}\n" for line in [header, *map(ledger.results_row, a)])
    assert ledger.keep_one_tag(results, events, "b", "val_bpb") == {}            # idempotent
    assert archive_a.read_text().count("\n") == 3 and results.read_text().count("\n") == 3

    assert ledger.keep_one_tag(results, events, "a", "val_bpb") == {archive_b: 2, results: 2}   # a comes back
    assert results.read_text() == "".join(f"{line}\n" for line in [header, *map(ledger.results_row, a)])
    assert not archive_a.exists() and ledger.read_rows(archive_b) == [ledger.results_row(e) for e in b]
    assert not (tmp_path / "results.tsv.new").exists()


def test_a_kill_after_the_archive_is_written_is_finished_without_repeating_rows(tmp_path):
    a = [experiment("a", 0, "aaaaaaa", 1.5, description="baseline")]
    b = [experiment("b", 0, "bbbbbbb", 1.25, description="baseline")]
    header = ledger.results_header("val_bpb")
    results = write(tmp_path / "results.tsv", header, *map(ledger.results_row, a + b))
    write(tmp_path / "results.a.tsv", header, ledger.results_row(a[0]))        # archived, results.tsv not replaced
    assert ledger.keep_one_tag(results, a + b, "b", "val_bpb") == {tmp_path / "results.a.tsv": 1}
    assert ledger.read_rows(tmp_path / "results.a.tsv") == [ledger.results_row(a[0])]
    assert ledger.read_rows(results) == [ledger.results_row(b[0])]

# ---------------------------------------------------------------------------
# A lost row, and where a tag stands
# ---------------------------------------------------------------------------


def test_tag_state_rebuilds_history_spend_and_stale_runs(tmp_path):
    log = [{"event": "start", "tag": "t"},
           experiment("t", 0, "abc1234", 1.5, description="baseline"),
           {"event": "propose", "tag": "t", "cost_usd": 0.003, "input_tokens": 100, "output_tokens": 20},
           {"event": "run", "tag": "t", "n": 1, "fix": 0, "pgid": 41},             # ended before the next start
           {"event": "start", "tag": "t"},
           {"event": "propose", "tag": "t", "cost_usd": 0.004, "input_tokens": 50, "output_tokens": 30},
           {"event": "run", "tag": "t", "n": 1, "fix": 0, "run": 0, "pgid": 42},
           {"event": "run_end", "tag": "t", "n": 1, "fix": 0, "run": 0},
           experiment("t", 1, "def5678", 1.25),
           {"event": "run", "tag": "t", "n": 2, "fix": 0, "pgid": 43},             # started, never ended: stale
           {"event": "run", "tag": "t", "n": 2, "fix": 0, "run": 1, "pgid": None},  # no process group: not stale
           {"event": "run", "tag": "u", "n": 5, "fix": 0, "pgid": 44},             # another tag's
           experiment("u", 0, "0000000", 2.0)]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in log) + '{"event": "torn')
    state = tagview.tag_state(ledger.read_events(path), "t")     # read_events skips the torn last line
    assert [e["n"] for e in state.history] == [0, 1] and [e["commit"] for e in state.kept] == ["abc1234", "def5678"]
    assert state.cost_usd == 0.007 and (state.input_tokens, state.output_tokens) == (150, 50)
    assert [e["pgid"] for e in state.stale_runs] == [43]
    assert [e["n"] for e in ledger.experiment_events(ledger.read_events(path), "u")] == [0]
    # read only: the same state from the target folder, its best and baseline derived; nothing written, not even a
    # repair of the torn line
    before = path.read_bytes()
    read = tagview.read_tag(tmp_path, "t")
    assert read == state and path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "events.jsonl"]
    assert (read.best_metric, read.baseline_metric, read.next_n, read.hardware_epoch, read.baseline_due) == (
        1.25, 1.5, 2, 1, False)
    assert tagview.read_tag(tmp_path / "elsewhere", "t").history == [] and tagview.read_tag(tmp_path, "v").best_event \
        is None
    # --new-hardware opened epoch 2 and its baseline is not recorded yet: due
    path.write_text("".join(json.dumps(e) + "\n" for e in [*log, {"event": "hardware", "tag": "t", "epoch": 2}]))
    assert (tagview.read_tag(tmp_path, "t").hardware_epoch, tagview.read_tag(tmp_path, "t").baseline_due) == (2, True)


def test_run_key_pairs_a_run_with_its_end():
    assert ledger.run_key({"n": 3, "fix": 1, "run": 2}) == (3, 1, 2)
    assert ledger.run_key({"n": 3, "fix": 0}) == (3, 0, 0)
    assert ledger.run_key({"n": 3, "attempt": 2}) == (3, 2, 0)               # events written before "fix"


def test_pruning_keeps_the_baseline_the_best_and_what_is_not_recorded_yet(tmp_path):
    """Recording #1 with #2 finished first on another device (recorded = 2): #2's artifact stays, it may be kept
    next; #1's goes (neither baseline nor best); the baseline's and the best's (#3 here) stay."""
    from harness.judge import holdout
    for n in range(5):
        made = tmp_path / f"run{n}" / "model.pt2"
        made.parent.mkdir()
        made.write_text(str(n))
        holdout.keep_artifact(tmp_path, n, "model.pt2", made)
    holdout.prune_artifacts(tmp_path, (0, 3), 2)
    assert sorted(p.name for p in (tmp_path / "artifacts").iterdir()) == [
        "0000-model.pt2", "0002-model.pt2", "0003-model.pt2", "0004-model.pt2"]
    holdout.prune_artifacts(tmp_path, (0, 3), 5)
    assert sorted(p.name for p in (tmp_path / "artifacts").iterdir()) == ["0000-model.pt2", "0003-model.pt2"]


def test_a_link_planted_at_a_runs_log_or_curve_is_never_written_through(tmp_path):
    """Root writes the run's log and curve: a symbolic link at their names must not turn that into a write to the
    link's target (a hostile review planted logs/0001-0.log -> a file outside the tag)."""
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me\n")
    log = tmp_path / "0001-0.log"
    log.symlink_to(outside)
    with pytest.raises(files.RecordError, match="symbolic link"):
        processes.open_unnamed(log)
    assert outside.read_text() == "keep me\n" and log.is_symlink()
    log.unlink()
    with processes.open_unnamed(log) as f:                 # the regular case: written under a name of its own
        f.write(b"step 1\n")
    assert log.read_bytes() == b"step 1\n" and sorted(p.name for p in tmp_path.iterdir()) == ["0001-0.log", "outside.txt"]
    curves.path_of(log).symlink_to(outside)
    curves.save(curves.Curve([curves.Point(0.5, 2.0, 1.0)]), log)
    assert outside.read_text() == "keep me\n" and not curves.path_of(log).is_symlink()
    assert [(q.progress, q.loss) for q in curves.load(log).points] == [(0.5, 2.0)]
