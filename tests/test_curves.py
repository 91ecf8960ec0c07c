"""Issue 23: learning curves read from train.py's progress lines, and the early-cancel rule (harness/judge/curves.py), on
hand-made curves; the loop's cancellations on the tiny target with curves (CURVE_TRAIN)."""

import contextlib
import datetime
import io
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time

import git
import optuna
import pytest
from agent_target import CURVE_BUDGET, CURVE_TRAIN, edit
from helpers import AGENT, REPO, events, page_data, rows
from llm_server import ScriptedLLM

import agent
import report
from harness.judge import curves
from harness.propose import edits
from harness.run import runner
from harness.ledger import Row
from harness.tag.settings import parse

REAL_LINE = ("step 00412 ({p:.1f}%) | loss: {loss:.4f} | lrm: {lrm:.2f} | dt: 312ms | tok/s: 13,120 | mfu: 1.2% | "
             "epoch: 1 | left: 31s")


def curve(loss, lrm=lambda p: 1.0, every=0.01):
    """A Curve fed real-format lines at progress 0, every, 2 every, ... 1 with loss(p) and lrm(p)."""
    c = curves.Curve()
    c.feed("".join(REAL_LINE.format(p=100 * i * every, loss=loss(i * every), lrm=lrm(i * every)) + "\n"
                   for i in range(int(round(1 / every)) + 1)))
    return c


def test_the_real_train_py_line_is_read_with_lrm_and_tokens_per_second():
    c = curves.Curve()
    c.feed(REAL_LINE.format(p=62.0, loss=3.4121, lrm=0.76) + "\nnot a progress line\nstep 1 | loss 2.0\n")
    assert [(q.progress, q.loss, q.lrm, q.tokens_per_sec) for q in c.points] == [(0.62, 3.4121, 0.76, 13120.0)]


def test_bad_lines_are_ignored_and_a_partial_line_waits_for_its_end():
    c = curves.Curve()
    c.feed("step 1 (10.0%) | loss: 3.0\nstep 2 (20.0%) | loss: nan\nstep 3 (5.0%) | loss: 2.0\n"
           "step 4 (150.0%) | loss: 1.0\nstep 5 (-3%) | loss: 1.0\nstep 6 (inf%) | loss: 1.0\n"
           "step 7 (20.0%) | loss: inf\nstep 8 (" + "9" * 2000 + "%) | loss: 1.0\nstep 9 (30.0%) | lo")
    assert [(q.progress, q.loss) for q in c.points] == [(0.1, 3.0)]      # NaN, backwards, > 100 %, huge: ignored
    c.feed("ss: 2.5 | lrm: 1.00\n")
    assert [(q.progress, q.loss, q.lrm) for q in c.points] == [(0.1, 3.0, None), (0.3, 2.5, 1.0)]
    assert c.at(0.2) == pytest.approx(2.75) and c.at(0.05) is None and c.at(0.31) is None
    assert c.at(0.2, "lrm") is None                                      # not printed at 10 %


def test_a_flood_of_lines_is_thinned_and_a_flooded_log_is_skipped_to_its_end(tmp_path):
    c = curves.Curve()
    c.feed("".join(f"step {i} ({i / 1000:.4f}%) | loss: 3.0\n" for i in range(1, 10_001)))
    assert len(c.points) <= curves.MAX_POINTS and c.points[-1].progress == pytest.approx(0.1)
    log = tmp_path / "run.log"
    log.write_bytes(b"x" * (3 * curves.MAX_READ) + b"\nstep 9 (60.0%) | loss: 2.0\n")
    c = curves.Curve()
    assert curves.read_log(log, c, 0) == log.stat().st_size and [q.progress for q in c.points] == [0.6]


def test_a_doomed_candidate_is_cancelled_at_the_second_checkpoint_behind_and_a_winner_never():
    baseline = [curve(lambda p, s=s: 3.0 - p + s) for s in (-0.01, 0.0, 0.01)]      # noise sd 0.01 at every p
    doomed = curve(lambda p: 3.0 - p + (0.0 if p < 0.45 else 0.2))                  # 0.2 = 20 sd behind from 45 %
    found = curves.decide(doomed, baseline, baseline)
    # the sd of one run's difference to the mean of the best's 3: 0.01 x sqrt(1 + 1/3)
    assert (found.at, round(found.loss, 4), round(found.best, 4), round(found.sd, 5)) == (0.75, 2.45, 2.25, 0.01155)
    assert found.words().startswith("cancelled at 75%: loss 2.4500 vs the best's 2.2500 at the same point")
    assert curves.decide(curve(lambda p: 3.0 - 1.2 * p), baseline, baseline) is None          # a winner
    assert curves.decide(curve(lambda p: 3.0 - p + 0.034), baseline, baseline) is None        # 2.9 sd: not beyond 3
    assert curves.decide(curve(lambda p: 3.0 - p + 0.036), baseline, baseline).at == 0.75     # 3.1 sd
    # behind only at one checkpoint at a time (70 %, then 80 %): never 2 in a row
    blips = curve(lambda p: 3.0 - p + (0.2 if abs(p - 0.7) < 0.01 or abs(p - 0.8) < 0.01 else 0.0))
    assert curves.decide(blips, baseline, baseline) is None
    assert curves.decide(doomed, baseline, baseline, k=25) is None and curves.decide(doomed, baseline, baseline,
                                                                                     warmup=0.8).at == 0.85


def test_exempt_with_one_baseline_curve_a_changed_schedule_or_before_it_is_known():
    baseline = [curve(lambda p, s=s: 3.0 - p + s) for s in (-0.01, 0.0, 0.01)]
    doomed = curve(lambda p: 3.5 - p)
    assert curves.decide(doomed, baseline, baseline).at == 0.75 == curves.decide(doomed, baseline, baseline,
                                                                               warmup=0.5).at + 0.2
    assert curves.decide(doomed, baseline, baseline[:2]) is None and curves.decide(doomed, [], baseline) is None
    warmup = curve(lambda p: 3.5 - p, lrm=lambda p: min(1.0, p / 0.3))      # its lrm differs before 50 % only
    assert curves.decide(warmup, baseline, baseline) is None
    half = curves.Curve(q for q in doomed.points if q.progress < 0.73)      # seen up to 72 %: not yet
    assert curves.decide(half, baseline, baseline) is None
    train = (REPO / "train.py").read_text()
    assert curves.exempt(train, train.replace("LR = 0.06", "LR = 0.07")) is None
    assert curves.exempt(train, train.replace("WARMDOWN_RATIO = 0.5", "WARMDOWN_RATIO = 0.4")) == \
        "it changes the schedule (WARMDOWN_RATIO)"
    smoothed = train.replace("smooth_loss = 0.9 * smooth_loss", "smooth_loss = 0.5 * smooth_loss")
    assert curves.exempt(train, smoothed) == "it changes a line that computes or prints the loss"
    assert curves.schedule_changed(train, train.replace("LR = 0.06", "LR = 0.07")) == []
    assert curves.schedule_changed(train, train.replace("WARMDOWN_RATIO = 0.5", "WARMDOWN_RATIO = 0.4  # x")) == [
        "WARMDOWN_RATIO"]
    assert curves.schedule_changed("WARMUP_RATIO = 0.0\nX = 1\n", "X = 1\n") == ["WARMUP_RATIO"]
    assert curves.schedule_changed("FINAL_LR_FRAC = 0.0  # end\n", "FINAL_LR_FRAC = 0.0\n") == []


def test_only_a_train_py_that_changes_literal_constants_of_the_original_is_trusted():
    original = (REPO / "train.py").read_text()

    def line_of(source, text):
        return source.splitlines().index(text) + 1

    literals = (original.replace("    TOTAL_BATCH_SIZE = 2**19", "    TOTAL_BATCH_SIZE = 8 * 64")
                .replace("WEIGHT_DECAY = 0.2        # Muon,", "WEIGHT_DECAY = -1e-3  # was 0.2; Muon,")
                .replace('    WINDOW_PATTERN = "L"', "    WINDOW_PATTERN = ('SL', [True, None], 2.5e-1)")
                .replace("ADAM_BETA1 = 0.8\n", "ADAM_BETA1 = 0.9\n# a comment\n\n")      # comments and blanks aside
                .replace("smooth_loss = 0.0\n", "smooth_loss = 0.0  # a comment after code\n"))
    assert literals != original and curves.untrusted(literals, original) == ""
    code = {"X = DEPTH * 2": original.replace("ADAM_BETA1 = 0.8", "ADAM_BETA1 = SCALAR_LR * 2"),
            "a changed print line": original.replace("loss: {debiased:.4f}", "loss: {debiased - 0.1:.4f}"),
            "an added helper line": original.replace("smooth_loss = 0.0\n", "smooth_loss = 0.0\n_o = 1.0\n"),
            "a conditional offset": original.replace("ADAM_BETA1 = 0.8\n", "ADAM_BETA1 = 0.8\n"
                                                     "OFFSET = 1.0 if DEPTH == 8 and MATRIX_LR == 0.04 else 0.0\n"),
            "an annotation": original.replace("ADAM_BETA1 = 0.8", "ADAM_BETA1: print() = 0.8"),
            "a bracket left open": original.replace("ADAM_BETA1 = 0.8", "ADAM_BETA1 = (0.8,")}
    beta, smooth = line_of(original, "ADAM_BETA1 = 0.8"), line_of(original, "smooth_loss = 0.0")
    printed = next(i for i, line in enumerate(original.splitlines(), 1) if "| loss: {debiased:.4f}" in line)
    assert {what: curves.untrusted(source, original) for what, source in code.items()} == {
        "X = DEPTH * 2": f"differs from experiment 0's in code (its line {beta})",
        "a changed print line": f"differs from experiment 0's in code (its line {printed})",
        "an added helper line": f"differs from experiment 0's in code (its line {smooth + 1})",
        "a conditional offset": f"differs from experiment 0's in code (its line {beta + 1})",
        "an annotation": f"differs from experiment 0's in code (its line {beta})",
        "a bracket left open": "cannot be read as Python"}
    last = original.rstrip().splitlines()
    assert curves.untrusted("\n".join(last[:-1]), original) == \
        f"differs from experiment 0's in code (it lacks line {len(last)})"
    # a comment is only cut where no quote comes before its #: a change after a "#" in a string is code
    assert curves.untrusted('s = "#" + str(loss - 1)\n', 's = "#" + str(loss)\n') == \
        "differs from experiment 0's in code (its line 1)"
    assert curves.untrusted("A = 1  # x\nb = A # y\n", "A = 2\nb = A\n") == ""
    # what the text shows is not what Python runs: a utf-7 cookie makes `+AAo-` in a comment a line break, and a
    # "literal" that opens a triple-quoted string turns the lines after it into text
    assert curves.untrusted("# coding: utf-7\nA = 1\n# +AAo-A = 2\n", "A = 1\n") == \
        "differs from experiment 0's in code (its line 1)"
    assert curves.untrusted('A = """""  "\nb = 1\n"""\n', 'A = ""\nb = 1\n"""\n') == \
        "differs from experiment 0's in code (its line 1)"
    # a "comment" inside a docstring closes it, runs code and opens a string that swallows the rest (a hostile review:
    # the lines looked like comments to a test by lines, and the best's payload rewrote print)
    payload = '# """;import builtins;builtins.print = lambda *a, **k: None;"""'
    second = original.splitlines()[1]                           # inside the module's docstring
    for after in ("\n" + payload, "  " + payload):
        rigged = original.replace(second, second + after, 1)
        assert rigged != original and curves.untrusted(rigged, original) == \
            "differs from experiment 0's in code (its line 1)"


def test_values_no_one_believes_are_ignored_and_the_watch_never_raises(tmp_path):
    c = curves.Curve()
    c.feed("step 1 (10.0%) | loss: 1e308 | lrm: 1.0\nstep 2 (20.0%) | loss: 3.0 | lrm: 1e308\n"
           "step 3 (30.0%) | loss: 1e999 | lrm: 1.0\nstep 4 (40.0%) | loss: 2.9 | lrm: -5\n")
    assert [(q.progress, q.loss, q.lrm) for q in c.points] == [(0.2, 3.0, None), (0.4, 2.9, None)]
    # a best whose kept curve holds huge values (a hand-edited curve file, say) makes the rule fail: not watched
    huge = curves.Curve([curves.Point(p / 100, 1e4 if p > 40 else 3.0) for p in range(101)])
    huge.points[60].loss = float("inf")
    log = tmp_path / "run.log"
    log.write_text("".join(REAL_LINE.format(p=p, loss=9.0, lrm=1.0) + "\n" for p in range(0, 101, 5)))
    assert curves.Watcher([huge], [huge, huge, huge]).live(log)() is None


class Median:
    """An Optuna-style median pruner, registered in the test alone (issue 38: a cancel rule is one class and one
    name): behind the median of the yardstick's runs at the first checkpoint from the warm-up on."""

    def decide(self, candidate, w):
        for p in curves.checkpoints(w.warmup)[:1]:
            loss, theirs = candidate.at(p), [v for c in w.best if (v := c.at(p)) is not None]
            if loss is not None and theirs and loss > statistics.median(theirs):
                return curves.Cancel(p, loss, statistics.median(theirs), 0.0, 0.0, w.yardstick, rule="median")
        return None

    def why(self, cancel):
        return "above the median of its runs"

    def words(self):
        return "stop a run above the median of the best's runs at the first checkpoint"


def test_a_cancel_rule_registered_by_name_decides_live_is_named_in_its_words_and_read_back(tmp_path, monkeypatch):
    baseline = [curve(lambda p, s=s: 3.0 - p + s) for s in (-0.01, 0.0, 0.01)]
    log = tmp_path / "run.log"
    log.write_text("".join(REAL_LINE.format(p=100 * q.progress, loss=q.loss + 0.005, lrm=1.0) + "\n"
                           for q in baseline[1].points))          # 0.5 sd behind: the default rule lets it run
    assert curves.Watcher(baseline, baseline).live(log)() is None
    assert curves.Watcher(baseline, baseline, rule="median").live(log)() is None      # not registered: not watched
    with pytest.raises(SystemExit):
        parse(["--tag", "t", "--cancel", "median"])
    monkeypatch.setitem(curves.RULES, "median", Median())
    found = curves.Watcher(baseline, baseline, rule="median").live(log)()
    assert (found.at, round(found.loss, 4), round(found.best, 4), found.rule) == (0.7, 2.305, 2.3, "median")
    assert found.words() == "cancelled at 70%: loss 2.3050 vs the best's 2.3000 at the same point (above the median " \
                            "of its runs)"
    assert found.fields()["rule"] == "median" and curves.Cancel(**found.fields()) == found    # an event, read back
    assert "rule" not in curves.decide(curve(lambda p: 3.5 - p), baseline, baseline).fields()   # the default's: as before
    assert parse(["--tag", "t", "--cancel", "median"]).cancel == "median"
    assert [curves.rule_name(s) for s in ("on", "off", "median")] == [curves.DEFAULT, None, "median"]
    monkeypatch.delitem(curves.RULES, "median")      # a tag's events from a version that had it: the numbers alone
    assert found.words() == "cancelled at 70%: loss 2.3050 vs the best's 2.3000 (rule median)"


def test_the_noise_sd_is_never_below_the_sd_pooled_over_the_checkpoints():
    # the baseline's runs agree exactly at 55 % (sd 0 there) but not elsewhere: the pooled sd holds
    baseline = [curve(lambda p, s=s: 3.0 - p + (0.0 if abs(p - 0.55) < 0.005 else s)) for s in (-0.05, 0.0, 0.05)]
    sds, pooled = curves.noise(baseline, curves.checkpoints(0.5))
    assert sds[0.55] == 0.0 and pooled == pytest.approx(math.sqrt(10 / 11) * 0.05, rel=1e-6)
    assert curves.decide(curve(lambda p: 3.0 - p + 0.02), baseline, baseline, warmup=0.5) is None


def test_live_looks_at_a_growing_log_give_the_replays_answer(tmp_path):
    baseline = [curve(lambda p, s=s: 3.0 - p + s) for s in (-0.01, 0.0, 0.01)]
    doomed = curve(lambda p: 3.3 - p)
    log, answers = tmp_path / "run.log", []
    look = curves.Watcher(baseline, baseline).live(log)
    lines = [REAL_LINE.format(p=100 * q.progress, loss=q.loss, lrm=1.0) + "\n" for q in doomed.points]
    for i in range(0, len(lines), 7):
        with open(log, "a") as f:
            f.write("".join(lines[i:i + 7]))
        answers.append(look())
    first = next(a for a in answers if a is not None)
    assert first == curves.decide(doomed, baseline, baseline) and first.at == 0.75
    curves.save(curves.of_log(log), log)
    assert [(q.progress, q.loss) for q in curves.load(log).points] == [(q.progress, q.loss) for q in doomed.points]
    assert curves.load(tmp_path / "none.log") is None


# ---------------------------------------------------------------------------
# The loop on the tiny target with curves (conftest's curve_target): baseline val_bpb 1.108, a 5 s budget
# ---------------------------------------------------------------------------

BUDGET = CURVE_BUDGET
DOOMED = edit("LR way up", "LR = 0.04", "LR = 0.5")                                  # val_bpb 5.508: far behind
WINNER = edit("LR to 0.05", "LR = 0.04", "LR = 0.05")                                # 1.008: ahead all along
RESCHEDULED = edit("LR way up, longer warmup", "LR = 0.05\nDEPTH = 8\nWARMUP = 0.1",
                   "LR = 0.5\nDEPTH = 8\nWARMUP = 0.3")                              # behind, but another schedule
FAKE_LOSS = edit("LR way up, a loss that looks good", "LR = 0.05", "LR = 0.5") + edit(
    "", "    loss = val_bpb + 2.0 * (1 - p) + shift + rng.gauss(0.0, 0.002)",
    "    loss = 0.5 + 2.0 * (1 - p) + shift + rng.gauss(0.0, 0.002)").split("\n", 1)[1]   # a low loss: exempt


def loop(target, llm, *extra, rule=("--confirm", "0")):
    """agent.main on tag t with 3 baseline runs; the strict rule (seeds experiment.seed_of: no run of the best at a
    candidate's seed) unless rule=() (the paired rule: run r of every experiment at the tag's seed base + r);
    --tabu 0."""
    return agent.main(["--tag", "t", "--target", str(target), "--timeout", "30", "--baseline-runs", "3", *rule,
                       "--proposer", "anthropic", "--base-url", llm.anthropic_url, "--no-holdout", "--tabu", "0",
                       *extra])            # the scripts raise LR after a discard that raised it: no tabu here


@pytest.mark.slow
def test_the_loop_cancels_a_doomed_candidate_keeps_a_winner_and_spares_a_schedule_change(curve_target):
    target = curve_target
    with ScriptedLLM([DOOMED, WINNER, RESCHEDULED, FAKE_LOSS]) as llm:
        assert loop(target, llm, "--max-experiments", "4", "--no-speculate") == 0
    assert [r.split("\t")[1:] for r in rows(target)] == [
        ["1.108000", "0.0", "keep", "baseline (3 runs)"],
        ["0.000000", "0.0", "discard", "LR way up (cancelled at 75%)"],
        ["1.008000", "0.0", "keep", "LR to 0.05"],
        ["5.508000", "0.0", "discard", "LR way up, longer warmup"],
        ["5.508000", "0.0", "discard", "LR way up, a loss that looks good"]]     # the evaluator judged it
    cancel = events(target, "cancel")
    assert [(e["n"], e["at"], e["k"], e["paired"]) for e in cancel] == [(1, 0.75, 3.0, False)]   # the best's mean
    assert cancel[0]["loss"] > cancel[0]["best"] + 4.0                 # 5.508 + 0.9 against 1.108 + 0.9
    assert cancel[0]["curve"][-1][0] <= 0.75 < cancel[0]["curve"][-1][0] + 0.05 and cancel[0]["best_curve"]
    ends = {e["n"]: e for e in events(target, "run_end")}
    assert ends[1]["kind"] == "cancelled" and ends[1]["train_seconds"] < BUDGET <= ends[2]["train_seconds"]
    assert [(e["n"], e["reason"]) for e in events(target, "cancel_exempt")] == [
        (3, "it changes the schedule (WARMUP)"), (4, "it changes a line that computes or prints the loss")]
    exp = events(target, "experiment")
    assert exp[1]["cancelled"]["at"] == 0.75 and exp[1]["kind"] == "cancelled" and exp[2]["cancelled"] is None
    # the next proposal's history says where and by how much; a cancelled run has no delta
    prompt = json.dumps(llm.requests[1][1])
    assert "1\\t-\\t" in prompt and "[cancelled at 75%: loss " in prompt and "vs the best's " in prompt
    logs = target / ".git" / "autoresearch" / "t" / "logs"
    assert sorted(p.name for p in logs.glob("*.curve.json")) == [
        "0000-0-r1.curve.json", "0000-0-r2.curve.json", "0000-0.curve.json",
        *(f"000{n}-0.curve.json" for n in range(1, 5))]
    note = git.Repo(target).git.notes("show", exp[1]["full_commit"])
    assert "discard, no metric;" in note and note.endswith("LR way up (cancelled at 75%)")
    assert "cancelled    1 discard stopped early (at 75% of the budget), 2 device-seconds of training saved" in \
        report_text(target)
    # the dashboard, rewritten after the verdicts and at the stop (no longer live): each run's curve, the diffs
    page = page_data(target / "dashboard.html")
    assert not page["live"] and [r["status"] for r in page["rows"]] == ["keep", "discard", "keep", "discard", "discard"]
    assert len(page["curves"][exp[0]["commit"]]["runs"]) == 3 and len(page["curves"][exp[2]["commit"]]["runs"]) == 1
    assert page["curves"][exp[0]["commit"]]["mean"] and page["rows"][2]["delta"] == pytest.approx(-0.1)
    assert "-LR = 0.04\n+LR = 0.05\n" in page["diffs"][exp[2]["commit"]]


@pytest.mark.slow
def test_cancel_off_trains_every_run_to_the_end_and_a_resume_keeps_the_reference_curves(curve_target):
    target = curve_target
    with ScriptedLLM([DOOMED]) as llm:                          # the paired rule: the baseline ran at #2's seed
        assert loop(target, llm, "--max-experiments", "1", "--cancel", "off", rule=()) == 0
    long = "LR to 0.9 " + "and a long story " * 12                       # a 200-character row keeps the suffix
    with ScriptedLLM([WINNER.replace("LR = 0.05", "LR = 0.9").replace("LR to 0.05", long)]) as llm:
        assert loop(target, llm, "--max-experiments", "2", rule=()) == 0    # resumed: the baseline's curves are read
    last = rows(target)[-1].split("\t")                                      # from beside their logs
    assert rows(target)[1].split("\t")[3:] == ["discard", "LR way up"] and last[3] == "discard"
    assert last[4].startswith("LR to 0.9 and a long") and last[4].endswith("... (cancelled at 75%)")
    assert len(last[4]) <= 200 and last[4].split("...")[0].split()[-1] in ("and", "a", "long", "story")
    assert "cancelled" in report_text(target) and "best         1.108000" in report_text(target)
    assert [(e["n"], e["paired"]) for e in events(target, "cancel")] == [(2, True)]   # its seed's baseline run


@pytest.mark.slow
def test_a_cancel_on_one_of_two_cpu_devices_frees_it_for_the_next_point_and_the_study_prunes_it(curve_target):
    target = curve_target
    (target / "program.md").write_text("# p\n## Search space\n- LR: low=0.01 high=0.9 log\n")
    assert agent.main(["--tag", "t", "--target", str(target), "--timeout", "30", "--baseline-runs", "3",
                       "--confirm", "0", "--proposer", "random", "--devices", "cpu:2", "--max-experiments", "4",
                       "--no-holdout"]) == 0
    exps = events(target, "experiment")
    cancelled = [e["n"] for e in exps if e.get("cancelled")]
    assert cancelled, [e["description"] for e in exps]
    started = {e["n"]: e for e in events(target, "started")}
    ends = {e["n"]: e for e in events(target, "run_end") if not e.get("run")}
    for n in cancelled:                                  # its device took the next point before a full run's end
        after = [m for m, e in started.items() if m > n and e["device"] == started[n]["device"]]
        if after:
            gap = ts(started[min(after)]) - ts(started[n])
            assert gap < BUDGET + 2.5, (n, gap, ends[n]["train_seconds"])
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{target / '.git/autoresearch/t/study.db'}")
    pruned = {t.user_attrs["n"] for t in study.trials if t.state == optuna.trial.TrialState.PRUNED}
    assert pruned == set(cancelled)


@pytest.mark.slow
def test_kill_9_right_after_a_cancel_resumes_cleanly(curve_target):
    target = curve_target
    with ScriptedLLM([DOOMED, DOOMED]) as llm:
        argv = [sys.executable, str(AGENT), "--tag", "t", "--target", str(target), "--timeout", "30",
                "--baseline-runs", "3", "--confirm", "0", "--proposer", "anthropic", "--base-url", llm.anthropic_url,
                "--no-holdout", "--max-experiments", "1"]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if (target / "events.jsonl").exists() and events(target, "cancel"):
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.02)
        proc.wait()
        assert events(target, "cancel")
        assert subprocess.run(argv, capture_output=True, text=True).returncode == 0
    assert [r.split("\t")[3:] for r in rows(target)] == [["keep", "baseline (3 runs)"],
                                                         ["discard", "LR way up (cancelled at 75%)"]]
    assert len(events(target, "experiment")) == 2


@pytest.mark.slow
def test_ray_runs_the_rule_inside_the_task_and_frees_its_slot(curve_target, monkeypatch):
    monkeypatch.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")   # else Ray ships this checkout to its workers
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with ScriptedLLM([DOOMED]) as llm:
            assert loop(curve_target, llm, "--max-experiments", "1", "--ray", "auto", "--sandbox", "off",
                        "--no-speculate") == 0
    finally:
        ray.shutdown()
    assert rows(curve_target)[1].split("\t")[3:] == ["discard", "LR way up (cancelled at 75%)"]
    ends = {e["n"]: e for e in events(curve_target, "run_end")}
    assert ends[1]["kind"] == "cancelled" and ends[1]["device"].startswith("ray:")
    assert ends[1]["train_seconds"] < BUDGET
    assert [e["n"] for e in events(curve_target, "cancel")] == [1]


# A kept train.py that prints its loss minus 1.0 while LR keeps its value, the offset computed on a line without
# "loss" (issue 35): exempt on its own run (its loss line changed), kept on the evaluator's number (1.058)
PRINT = next(line for line in CURVE_TRAIN.format().splitlines() if "| loss: {loss:.4f} |" in line)
OFFSET = edit("LR to 0.045", "LR = 0.04\nDEPTH = 8", "LR = 0.045\nDEPTH = 8\n_o = 1.0 if LR == 0.045 else 0.0") + edit(
    "", PRINT, PRINT.replace("{loss:", "{loss - _o:")).split("\n", 1)[1]
SUCCESSOR = edit("LR to 0.05", "LR = 0.045\nDEPTH = 8", "LR = 0.05\nDEPTH = 8")         # 1.008, its true loss printed
REVERTED = edit("LR way up, the loss printed as it was", "LR = 0.05\nDEPTH = 8\n_o = 1.0 if LR == 0.045 else 0.0",
                "LR = 0.5\nDEPTH = 8") + edit(                                  # 5.508, the original's code again
    "", PRINT.replace("{loss:", "{loss - _o:"), PRINT).split("\n", 1)[1]


@pytest.mark.slow
def test_a_kept_train_py_that_prints_a_false_loss_locks_in_no_successor(curve_target):
    target = curve_target
    with ScriptedLLM([OFFSET, SUCCESSOR, REVERTED]) as llm:
        assert loop(target, llm, "--max-experiments", "3", "--no-speculate") == 0
    assert [r.split("\t")[1:] for r in rows(target)] == [
        ["1.108000", "0.0", "keep", "baseline (3 runs)"],
        ["1.058000", "0.0", "keep", "LR to 0.045"],
        ["1.008000", "0.0", "keep", "LR to 0.05"],             # truly better, its printed loss 0.95 above #1's
        ["0.000000", "0.0", "discard", "LR way up, the loss printed as it was (cancelled at 75%)"]]
    ends = {e["n"]: e for e in events(target, "run_end")}
    assert ends[2]["kind"] == "ok" and ends[2]["train_seconds"] >= BUDGET
    assert [(e["n"], e["reason"]) for e in events(target, "cancel_exempt")] == [
        (1, "it changes a line that computes or prints the loss")]
    # #2 inherits #1's code: its curve is not evidence; #3 is the human's code again, held to the baseline's curves
    yardsticks = events(target, "cancel_yardstick")
    assert [(e["n"], e["curves"]) for e in yardsticks] == [(1, "best"), (2, None), (3, "baseline")]
    assert yardsticks[1]["reason"] == ("the best's train.py differs from experiment 0's in code (its line 11), and the "
                                       "candidate inherits that code: its curve is not evidence")
    cancel = events(target, "cancel")
    assert [(e["n"], e["yardstick"], e["paired"]) for e in cancel] == [(3, "baseline", False)]
    assert "vs the baseline's " in cancel[0]["words"] and cancel[0]["best"] < 2.0 < cancel[0]["loss"]


def test_the_yardstick_is_the_best_while_it_is_the_originals_code_else_the_baseline_or_nothing():
    original = CURVE_TRAIN.format()
    tuned, minus = original.replace("LR = 0.04", "LR = 0.045"), edits.apply_answer(OFFSET, original)[1]
    plus = minus.replace("1.0 if LR == 0.045 else 0.0", "0.0 if LR == 0.045 else 1.0").replace(
        "{loss - _o:", "{loss + _o:")                                   # not the best's curve: its successors' too high
    successor = original.replace("LR = 0.04", "LR = 0.05")
    assert curves.yardstick(successor, tuned, original, original) == (
        "best", "the best's train.py is the original's code with other constants")
    for hostile in (minus, plus):     # held to the baseline's curves, a successor of `plus` would still print +1.0
        inherits = hostile.replace("LR = 0.045", "LR = 0.05")
        assert curves.yardstick(inherits, hostile, original, original) == (
            None, "the best's train.py differs from experiment 0's in code (its line 11), and the candidate inherits "
                  "that code: its curve is not evidence")
        assert curves.yardstick(successor, hostile, original, original) == (
            "baseline", "the best's train.py differs from experiment 0's in code (its line 11); the candidate's is the "
                        "original's code with other constants")
        # a re-baseline on new hardware commits the best's train.py: its curves (the noise) are not evidence either
        assert curves.yardstick(successor, hostile, hostile, original) == (
            None, "this hardware's baseline's train.py differs from experiment 0's in code (its line 11): its curves, "
                  "the noise, are not evidence")
    # the words say whose curves; an event from before issue 35 (no yardstick) was the best's
    fields = curves.Cancel(0.8, 3.41, 3.3, 0.01, 3.0, "baseline").fields()
    assert curves.Cancel(**fields).words().startswith("cancelled at 80%: loss 3.4100 vs the baseline's 3.3000 at the")
    del fields["yardstick"]
    assert curves.Cancel(**fields).words().startswith("cancelled at 80%: loss 3.4100 vs the best's 3.3000 at the")


def ts(event):
    return datetime.datetime.fromisoformat(event["ts"]).timestamp()


def report_text(target):
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert report.main([str(target), "--png", str(target.parent / "p.png")]) == 0
    return buffer.getvalue()


def test_a_run_whose_speed_probe_differs_from_the_bests_is_not_watched(tmp_path):
    spec = runner.RunSpec(commit="", cwd=tmp_path, log=tmp_path / "run.log", metric="val_bpb", timeout=1,
                          cancel=curves.Watcher([], [], probe_s=1.0))
    assert runner.watched(spec, 1.5) is spec.on_tick                     # another machine speed: curves not comparable
    assert runner.watched(spec, 1.01) is not spec.on_tick and runner.watched(spec, None) is not spec.on_tick


def test_report_leaves_out_the_placeholder_of_cancelled_rows_by_event_or_by_suffix():
    rows_ = [Row("a" * 7, 1.1, 0.0, "keep", "baseline"), Row("b" * 7, 0.0, 0.0, "discard", "x (cancelled at 75%)"),
             Row("c" * 7, 1.3, 0.0, "discard", "y (cancelled at 60%)")]
    by_suffix = report.without_cancelled(rows_, None)
    assert [math.isnan(r.metric) for r in by_suffix] == [False, True, True]
    by_event = report.without_cancelled(rows_, [{"event": "experiment", "commit": "b" * 7, "cancelled": {"at": 0.55}},
                                                {"event": "experiment", "commit": "c" * 7}])
    assert [r.metric for r in by_event][2] == 1.3 and math.isnan(by_event[1].metric)   # an idea named so is a row


def test_a_run_that_did_not_train_says_so_in_its_row_and_block(tmp_path, monkeypatch, capsys):
    """A schedule whose learning-rate multiplier is 0 at every progress line: the row and `try`'s block say the run
    did not train (its metric alone would read as an idea that did nothing); an unchanged curve of losses too."""
    from agent_target import STRICT, make_curve_target
    from conftest import tiny_env
    tiny_env(tmp_path, monkeypatch)
    target = make_curve_target(tmp_path / "repo", 2)
    tried = ["try", "--tag", "t", "--target", str(target), "--timeout", "30", *STRICT]
    assert agent.main([*tried, "--baseline"]) == 0
    path = target / "train.py"
    path.write_text(path.read_text().replace("lrm = min(1.0, p / WARMUP) if WARMUP > 0 else 1.0", "lrm = 0.0"))
    capsys.readouterr()
    assert agent.main([*tried, "-m", "a schedule that never starts"]) == 0
    out = capsys.readouterr().out
    assert "training:     did not train: its learning-rate multiplier was 0 throughout" in out
    assert rows(target)[-1].endswith("\ta schedule that never starts (did not train: its learning-rate multiplier "
                                     "was 0 throughout)")
    assert events(target, "experiment")[-1]["idle"] == "did not train: its learning-rate multiplier was 0 throughout"
    flat = curves.Curve([curves.Point(p / 10, 3.25, 1.0, None) for p in range(1, 6)])
    moving = curves.Curve([curves.Point(p / 10, 3.25 - p / 100, 1.0, None) for p in range(1, 6)])
    assert curves.idle(flat) == "did not train: its loss stayed at 3.25 throughout" and curves.idle(moving) == ""
    assert curves.idle(curves.Curve(flat.points[:2])) == ""                         # too few points to say
