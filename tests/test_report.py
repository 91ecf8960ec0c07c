"""Tests for report.py and analysis.ipynb against the fixture results files in tests/fixtures."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import matplotlib.image
import nbformat
import pytest
from nbclient import NotebookClient

import report

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png_drawn(path):
    """A real PNG with something drawn on it (not one flat colour)."""
    path = Path(path)
    assert path.read_bytes()[:8] == PNG_MAGIC
    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert pixels.var() > 0
    assert len({tuple(p) for p in pixels.reshape(-1, pixels.shape[2])[::97]}) > 2


# ---------------------------------------------------------------------------
# The notebook, top to bottom, once per fixture, all in one kernel (a kernel start is the slow part): each run starts
# with `%reset -f`, so it sees only its own parameters, as in a fresh kernel
# ---------------------------------------------------------------------------

NOTEBOOK_FIXTURES = [("normal.tsv", "normal_events.jsonl"), ("no_keeps.tsv", None), ("only_crashes.tsv", None),
                     ("extra_columns.tsv", None), ("partial_line.tsv", None), ("header_only.tsv", None)]


@pytest.fixture(scope="module")
def notebook_runs(tmp_path_factory):
    """analysis.ipynb executed for every fixture in one kernel: {fixture: (its code cells as executed, its PNG)}."""
    nb = nbformat.read(REPO / "analysis.ipynb", as_version=4)
    params = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "analysis.ipynb needs exactly one cell tagged 'parameters'"
    combined, spans = nbformat.v4.new_notebook(metadata=nb.metadata), {}
    for fixture, events in NOTEBOOK_FIXTURES:
        png = tmp_path_factory.mktemp("notebook") / "progress.png"
        events_path = str(FIXTURES / events) if events else None
        cells = [nbformat.v4.new_code_cell("%reset -f")] + [nbformat.from_dict(c) for c in nb.cells]
        cells[1 + params[0]].source = (f"RESULTS = {str(FIXTURES / fixture)!r}\nEVENTS = {events_path!r}\n"
                                       f"TAG = None\nGOAL = None\nPNG = {str(png)!r}")
        # the kernel must be the Python running the tests (the project venv), not whatever `python` is on PATH
        cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable)"))
        spans[fixture] = (len(combined.cells), len(combined.cells) + len(cells), png)
        combined.cells.extend(cells)
    NotebookClient(combined, kernel_name="python3", timeout=60, allow_errors=True,
                   resources={"metadata": {"path": str(REPO)}}).execute()
    return {fixture: ([c for c in combined.cells[a:b] if c.cell_type == "code"], png)
            for fixture, (a, b, png) in spans.items()}


@pytest.mark.parametrize("fixture, events", NOTEBOOK_FIXTURES)
@pytest.mark.slow
def test_notebook_runs_top_to_bottom(fixture, events, notebook_runs):
    cells, png = notebook_runs[fixture]
    assert Path(cells[-1].outputs[0]["text"].strip()).resolve() == Path(sys.executable).resolve()
    errors = [o for c in cells for o in c.outputs if o.output_type == "error"]
    assert errors == []
    assert_png_drawn(png)
    text = "".join(o.get("text", "") for c in cells for o in c.outputs)
    expected_counts = {"normal.tsv": "2 keep, 2 discard, 1 crash", "no_keeps.tsv": "0 keep, 2 discard, 0 crash",
                       "only_crashes.tsv": "0 keep, 0 discard, 1 crash", "extra_columns.tsv": "1 keep, 0 discard, 1 crash",
                       "partial_line.tsv": "1 keep, 0 discard, 0 crash", "header_only.tsv": "0 keep, 0 discard, 0 crash"}
    assert expected_counts[fixture] in text
    if events:
        assert "6 experiments in 29m00s" in text
    else:
        assert "no events file: time and cost are not known" in text      # nothing left from the run before


# ---------------------------------------------------------------------------
# Numbers, against values worked out by hand from the fixtures
# ---------------------------------------------------------------------------

def test_summary_of_normal_fixture_matches_hand_computed():
    results = report.load_results(FIXTURES / "normal.tsv")
    assert results.metric_name == "val_bpb" and results.skipped == []
    s = report.summarize(results.rows, results.metric_name, "min")
    assert s.total == 6
    assert s.counts == {"keep": 3, "discard": 2, "crash": 1}
    assert s.baseline == 1.0
    assert s.best == 0.98 and s.best_commit == "eeeeeee"
    assert s.improvement == pytest.approx(0.02, abs=1e-12)
    assert s.improvement_pct == pytest.approx(2.0, abs=1e-9)
    assert s.kept_experiments == 2 and s.success_rate == 2 / 5
    assert report.running_best(results.rows, "min") == [1.0, 0.99, 0.99, 0.99, 0.98, 0.98]
    table = report.kept_table(results.rows, "min")
    assert [(t["commit"], t["metric"], t["description"]) for t in table] == [
        ("aaaaaaa", 1.0, "baseline"), ("bbbbbbb", 0.99, "lr up"), ("eeeeeee", 0.98, "deeper")]
    assert table[0]["gain"] is None
    assert table[1]["gain"] == pytest.approx(0.01, abs=1e-12) and table[2]["gain"] == pytest.approx(0.01, abs=1e-12)


def test_max_goal_pass_at_1():
    results = report.load_results(FIXTURES / "passk.tsv")
    goal = report.infer_goal(results.metric_name)
    assert goal == "max"
    s = report.summarize(results.rows, results.metric_name, goal)
    assert s.counts == {"keep": 3, "discard": 2, "crash": 1}
    assert s.baseline == 0.2 and s.best == 0.3 and s.best_commit == "5555555"
    assert s.improvement == pytest.approx(0.1, abs=1e-12) and s.improvement_pct == pytest.approx(50.0, abs=1e-9)
    assert s.success_rate == 2 / 5
    assert report.running_best(results.rows, goal) == [0.2, 0.25, 0.25, 0.25, 0.3, 0.3]
    assert [t["commit"] for t in report.kept_table(results.rows, goal)] == ["1111111", "2222222", "5555555"]
    # read the other way round, the same file's best is the baseline and the 0.15 discard is no improvement
    s_min = report.summarize(results.rows, results.metric_name, "min")
    assert s_min.best == 0.2 and s_min.improvement == 0.0


def test_max_goal_zero_baseline_has_no_percentage(tmp_path):
    path = tmp_path / "results.tsv"
    path.write_text("commit\tpass@1\tmemory_gb\tstatus\tdescription\n"
                    "1111111\t0.000000\t30.0\tkeep\tbaseline\n2222222\t0.125000\t30.0\tkeep\tlr up\n")
    results = report.load_results(path)
    s = report.summarize(results.rows, results.metric_name, "max")
    assert s.baseline == 0.0 and s.best == 0.125 and s.improvement == 0.125 and s.improvement_pct is None
    assert "best         0.125000 at 2222222, improvement +0.125000\n" in report.format_summary(s) + "\n"


def test_goal_from_prepare_py_then_header_then_error(tmp_path):
    (tmp_path / "results.tsv").write_text("commit\tmystery\tmemory_gb\tstatus\tdescription\n"
                                          "1111111\t3.000000\t1.0\tkeep\tbaseline\n")
    with pytest.raises(ValueError, match="--goal"):
        report.load_run(tmp_path)
    assert report.load_run(tmp_path, goal="max").goal == "max"
    (tmp_path / "prepare.py").write_text('"""frozen"""\nMETRIC_NAME = "mystery"\nMETRIC_GOAL = "max"\nTIME_BUDGET = 300\n')
    assert report.read_goal(tmp_path) == "max"
    assert report.load_run(tmp_path / "results.tsv").goal == "max"
    assert report.load_run(tmp_path, goal="min").goal == "min"
    (tmp_path / "prepare.py").write_text('METRIC_GOAL = "up"\n')
    with pytest.raises(ValueError, match="'min' or 'max'"):
        report.read_goal(tmp_path)
    assert report.infer_goal("val_bpb") == "min" and report.infer_goal("accuracy") == "max"


def test_event_stats_of_normal_fixture():
    events = report.load_events(FIXTURES / "normal_events.jsonl")   # its last line is cut short: skipped
    assert [e["event"] for e in events].count("experiment") == 6 and len(events) == 8
    st = report.event_stats(events)
    assert (st.experiments, st.wall_seconds, st.train_seconds, st.llm_seconds) == (6, 1740.0, 1580.0, 105.0)
    assert (st.input_tokens, st.output_tokens) == (26000, 4100)
    assert st.cost_usd == pytest.approx(0.26, abs=1e-12)
    assert report.event_stats(events, tag="other").experiments == 0

# ---------------------------------------------------------------------------
# Tolerant loading and clear errors
# ---------------------------------------------------------------------------

def test_loader_tolerates_extra_columns_partial_line_and_header_only():
    extra = report.load_results(FIXTURES / "extra_columns.tsv")
    assert [(r.commit, r.metric, r.memory_gb, r.status, r.description) for r in extra.rows] == [
        ("aaaaaaa", 1.0, 10.0, "keep", "baseline"), ("bbbbbbb", 0.99, 10.0, "keep", "lr up"),
        ("ccccccc", 0.0, 0.0, "crash", "oom")]
    partial = report.load_results(FIXTURES / "partial_line.tsv")
    assert [r.commit for r in partial.rows] == ["aaaaaaa", "bbbbbbb"] and partial.skipped == ["ccccccc\t0.98"]
    empty = report.load_results(FIXTURES / "header_only.tsv")
    assert empty.rows == [] and empty.metric_name == "val_bpb"
    s = report.summarize(empty.rows, "val_bpb", "min")
    assert s.total == 0 and s.best is None and s.success_rate is None
    crashes = report.load_results(FIXTURES / "only_crashes.tsv")
    s = report.summarize(crashes.rows, "val_bpb", "min")
    assert s.baseline is None and s.best is None and s.improvement is None and s.success_rate == 0.0


def test_bad_input_gives_clear_errors(tmp_path, capsys, monkeypatch):
    with pytest.raises(FileNotFoundError, match="results.tsv.example"):
        report.load_results(tmp_path / "results.tsv")
    (tmp_path / "empty.tsv").write_text("")
    with pytest.raises(ValueError, match="an empty file"):
        report.load_results(tmp_path / "empty.tsv")
    (tmp_path / "other.tsv").write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ValueError, match="expected a results.tsv header"):
        report.load_results(tmp_path / "other.tsv")
    assert report.main([str(tmp_path / "missing.tsv")]) == 2
    assert f"{tmp_path / 'missing.tsv'}: no such results file. agent.py writes results.tsv in the directory of the " \
           f"target it ran on" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)             # run from elsewhere: the path it looked at, and where the example is
    assert report.main([]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'results.tsv'}: no such results file" in err and f"{REPO / 'results.tsv.example'} is an " \
           "example" in err
    assert report.main([str(FIXTURES / "normal.tsv"), "--tag", "t1", "--events", str(tmp_path / "none.jsonl")]) == 2
    assert "no such events file" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# The command line: printed numbers, progress.png, --tag
# ---------------------------------------------------------------------------

def test_cli_prints_summary_and_writes_png(tmp_path, capsys):
    png = tmp_path / "progress.png"
    rc = report.main([str(FIXTURES / "normal.tsv"), "--events", str(FIXTURES / "normal_events.jsonl"), "--png", str(png)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "experiments  6 rows = baseline + 5: 2 keep, 2 discard, 1 crash\n" in out
    assert "baseline     1.000000\n" in out
    assert "best         0.980000 at eeeeeee, improvement +0.020000 (+2.00%)\n" in out
    assert "success rate 2/5 = 40.0% of experiments kept\n" in out
    assert "bbbbbbb   0.990000  +0.010000  lr up\n" in out
    assert "time         6 experiments in 29m00s: per experiment 290.0 s (train 263.3 s, llm 17.5 s)\n" in out
    assert "tokens       26,000 in, 4,100 out, cost $0.26\n" in out
    assert_png_drawn(png)


def test_cli_defaults_to_target_folder_and_its_events(tmp_path, capsys):
    (tmp_path / "results.tsv").write_text((FIXTURES / "passk.tsv").read_text())
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "pass@1 (higher is better)" in out and "time " not in out   # no events file next to it
    assert_png_drawn(tmp_path / "progress.png")


def test_tag_selects_the_rows_of_one_run(tmp_path, capsys):
    # two runs started from the same commit, so both baselines are commit aaaaaaa
    rows = [("aaaaaaa", "1.000000", "keep", "baseline"), ("bbbbbbb", "0.990000", "keep", "lr up"),
            ("aaaaaaa", "1.000100", "keep", "baseline"), ("ccccccc", "1.010000", "discard", "gelu"),
            ("ddddddd", "0.000000", "crash", "oom")]
    (tmp_path / "results.tsv").write_text("commit\tval_bpb\tmemory_gb\tstatus\tdescription\n" + "".join(
        f"{c}\t{m}\t10.0\t{s}\t{d}\n" for c, m, s, d in rows))
    tags = ["nov29", "nov29", "nov30", "nov30", "nov30"]
    (tmp_path / "events.jsonl").write_text("".join(
        json.dumps({"ts": "2026-11-30T00:00:00Z", "event": "experiment", "tag": t, "n": n, "commit": c,
                    "status": s, "wall_seconds": 100.0}) + "\n"
        for t, n, (c, _, s, _) in zip(tags, [0, 1, 0, 1, 2], rows)))
    run = report.load_run(tmp_path, tag="nov30")
    assert [(r.commit, r.metric) for r in run.rows] == [("aaaaaaa", 1.0001), ("ccccccc", 1.01), ("ddddddd", 0.0)]
    assert [(r.commit, r.metric) for r in report.load_run(tmp_path, tag="nov29").rows] == [
        ("aaaaaaa", 1.0), ("bbbbbbb", 0.99)]
    assert report.main([str(tmp_path), "--tag", "nov30", "--png", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "3 rows = baseline + 2: 0 keep, 1 discard, 1 crash" in out and "3 experiments in 5m00s" in out
    assert report.main([str(tmp_path), "--tag", "dec01"]) == 2
    assert "tags in the events file: nov29, nov30" in capsys.readouterr().err
    (tmp_path / "events.jsonl").unlink()
    assert report.main([str(tmp_path), "--tag", "nov30"]) == 2
    assert "--tag needs the events file" in capsys.readouterr().err


@pytest.mark.parametrize("fixture", ["only_crashes.tsv", "header_only.tsv", "passk.tsv"])
def test_png_is_drawn_for_edge_cases(fixture, tmp_path):
    results = report.load_results(FIXTURES / fixture)
    goal = report.infer_goal(results.metric_name)
    assert_png_drawn(report.plot_progress(results.rows, results.metric_name, goal, tmp_path / "p.png"))


def test_crashes_and_diverged_discards_do_not_stretch_the_y_axis():
    results = report.load_results(FIXTURES / "normal.tsv")
    lo, hi = report._y_limits(results.rows, "min")
    # kept span 0.98..1.0 -> the bad side is capped at 1.0 + 0.02, not 2.5 (diverged) nor 0.0 (crash)
    assert 0.97 < lo < 0.98 and 1.02 < hi < 1.03


def test_example_file_reads_as_documented():
    run = report.load_run(REPO / "results.tsv.example")
    s = report.summarize(run.rows, run.metric_name, run.goal)
    assert run.goal == "min" and run.skipped == [] and all(len(r.commit) == 7 for r in run.rows)
    assert s.counts == {"keep": 7, "discard": 6, "crash": 2} and s.baseline == 0.997912 and s.best == 0.985473


def test_proposers_leave_out_every_baseline_and_throughput_lines_carry_no_label():
    """A re-baseline on new hardware (n 3, `rebaseline`) is no proposer's experiment; the throughput line is its
    figures only (the report prints the label, the page its own: "throughput: throughput ..." before)."""
    events = [dict(event="experiment", tag="t", n=n, commit=f"c{n}", status=status, proposer="tpe", **extra)
              for n, status, extra in ((0, "keep", {}), (1, "keep", {}), (2, "discard", {}),
                                       (3, "keep", dict(rebaseline=True, description="baseline on new hardware")))]
    who, line = report.proposers_of(events, "t")
    assert line == "proposed by  tpe 2 (1 kept)" and set(who) == {"c1", "c2"}
    run = SimpleNamespace(tag="t", events=[dict(event="throughput", tag="t", experiments_per_hour=12.0, wall_s=600.0,
                                                busy={"cuda:0": 0.9}, proposal_wait_s=3.0)])
    assert report.throughput_of(run) == ["12.0 experiments/hour over 10m00s; device busy cuda:0 90%; proposal wait "
                                         "3 device-seconds"]
