"""
The numeric search (harness/propose/search.py, harness/propose/hybrid.py): the space read from train.py and program.md, the Optuna
study kept equal to events.jsonl (kill -9, resume, `try`, a missing, torn or hand-edited study), the samplers in the
loop, and the hybrid's dialogue with the loopback LLM.
"""

import collections
import json
import math
import os
import random
import signal
import subprocess
import sys

import git
import optuna
import pytest
from agent_target import STRICT
from helpers import AGENT, REPO, events, rows, run_agent, wait_for_run
from llm_server import ScriptedLLM

import agent
from harness.propose import memory, search, searchspace
from harness.propose.edits import apply_answer
from harness.errors import SetupError
from harness.run.runner import Kind

TRAIN = (REPO / "train.py").read_text()


def study_of(target, tag="t"):
    """The tag's study as Optuna reads it from its SQLite file."""
    db = target / ".git" / "autoresearch" / tag / search.STUDY_DB
    return optuna.load_study(study_name=tag, storage=f"sqlite:///{db}")


def told(target):
    """{n: (state, value, by)} of the study's trials that stand for a recorded experiment."""
    return {t.user_attrs["n"]: (t.state.name, t.value, t.user_attrs["by"]) for t in study_of(target).trials
            if "n" in t.user_attrs}


def recorded(target):
    """{n: (state, value)} of events.jsonl's experiments, as the study should hold them: a crash, timeout, rejection
    or overtime of a point the sampler or an override wrote is pruned (and infeasible)."""
    return {e["n"]: ("PRUNED", None) if e["status"] == "crash" and e.get("kind") in (
        "crash", "timeout", "rejected", "overtime") and e.get("by", e.get("proposer")) in (
        "tpe", "cmaes", "random", "llm override") else ("FAIL", None) if e["status"] == "crash" or not
        Kind.of(e).measured else ("COMPLETE", e["metric"]) for e in events(target, "experiment")}


def assert_study_matches(target):
    found = told(target)
    assert {n: v[:2] for n, v in found.items()} == recorded(target)
    assert not [t for t in study_of(target).trials if t.state.name == "RUNNING"]
    return found


def test_the_default_space_of_the_real_train_py_cpu_branch():
    space = searchspace.space_of(TRAIN, "cpu", "# program\n")
    words = {name: p.words() for name, p in space.items()}
    assert words["MATRIX_LR"] == "MATRIX_LR: low=0.02 high=0.18 log"            # 0.06 / 3 .. 0.06 x 3
    assert words["DEPTH"] == "DEPTH: low=2 high=8"                              # integer steps
    assert words["TOTAL_BATCH_SIZE"] == "TOTAL_BATCH_SIZE: low=2**10 high=2**14"  # 2**12, two powers each way
    assert words["HEAD_DIM"] == "HEAD_DIM: low=2**5 high=2**7"
    assert words["WINDOW_PATTERN"] == "WINDOW_PATTERN: choices=L,SL,SSL,SSSL,SSLL"
    assert words["WARMDOWN_RATIO"] == "WARMDOWN_RATIO: low=0 high=1"           # a share: [0, min(1, 2 x 0.5)]
    assert words["FINAL_LR_FRAC"] == "FINAL_LR_FRAC: low=0 high=0.5"           # a share at 0
    assert words["ADAM_BETA2"].startswith("ADAM_BETA2: low=0.85 high=0.98")    # distance to 1: 0.05 x 3 .. / 3
    assert not {"EVAL_BATCH_SIZE", "DEVICE_BATCH_SIZE", "SEED", "THREADS"} & set(space)
    # the small branch: its own values (a 2**16 batch), not the cpu one's
    assert searchspace.space_of(TRAIN, "small", "")["TOTAL_BATCH_SIZE"].words() == "TOTAL_BATCH_SIZE: low=2**14 high=2**18"


def test_a_point_is_an_edit_of_those_constants_only_and_reads_back_as_written():
    space = searchspace.space_of(TRAIN, "cpu", "")
    point = {**searchspace.values_of(space, TRAIN, "cpu"), "MATRIX_LR": 0.0812345678, "TOTAL_BATCH_SIZE": 13,
             "WINDOW_PATTERN": "SSL", "DEPTH": 5}
    answer, written = searchspace.write_point(TRAIN, "cpu", space, point, "tpe")
    description, new = apply_answer(answer, TRAIN)
    # the largest moves first, as shares of their ranges: a choice, 1 of 4 powers, 1 of 6 depths, log 1.35 of log 9
    assert description == 'tpe: WINDOW_PATTERN "L" -> "SSL", TOTAL_BATCH_SIZE 2**12 -> 2**13, DEPTH 4 -> 5, ' \
                          "MATRIX_LR 0.06 -> 0.08123"
    point["SOFTCAP"] = 30.0
    assert searchspace.write_point(TRAIN, "cpu", space, point, "tpe")[0].splitlines()[0].endswith(
        "DEPTH 4 -> 5, +1 more")                  # SOFTCAP x2 of x9 outranks MATRIX_LR, now the one left unnamed
    assert written == searchspace.values_of(space, new, "cpu") and written["MATRIX_LR"] == 0.08123
    changed = [(a, b) for a, b in zip(TRAIN.splitlines(), new.splitlines()) if a != b]
    assert len(changed) == 4 and len(TRAIN.splitlines()) == len(new.splitlines())
    assert "    TOTAL_BATCH_SIZE = 2**13  # smaller batches" in new             # comments and the 2**k form kept


SPACE = """# program
## Search space
- MATRIX_LR: low=0.01 high=0.2 log
- DEPTH: low=2 high=6
- TOTAL_BATCH_SIZE: low=2**10 high=2**13
- WINDOW_PATTERN: choices=L,SSSL

## Research directions
anything
"""


def test_program_md_search_space_section_names_the_space():
    space = searchspace.space_of(TRAIN, "cpu", SPACE)
    assert [p.words() for p in space.values()] == [
        "MATRIX_LR: low=0.01 high=0.2 log", "DEPTH: low=2 high=6", "TOTAL_BATCH_SIZE: low=2**10 high=2**13",
        "WINDOW_PATTERN: choices=L,SSSL"]


@pytest.mark.parametrize("entry, words", [
    ("MATRIX_LR: low=abc high=0.2", "low and high must be finite numbers"),
    ("MATRIX_LR: low=0.2 high=0.1", "the range is empty"),
    ("MATRIX_LR: low=0 high=0.1 log", "not positive for log"),
    ("NOT_THERE: low=1 high=2", "train.py defines no constant NOT_THERE"),
    ("MATRIX_LR: low=0.1 high=0.2", "train.py's MATRIX_LR = 0.06 is outside it"),
    ("DEPTH: low=1.5 high=6", "DEPTH is an int (4) in train.py"),
    ("DEPTH: low=2 high=6 step=2", "unknown setting 'step=2'"),
    ("WINDOW_PATTERN: choices=L", "choices need at least two values"),
    ("lower_case: low=1 high=2", "not `NAME: ...`"),
    ("DEPTH: choices=8,[1]", "DEPTH is a int in train.py, so its choices must be too, not [1]"),
    ("MATRIX_LR: choices=0.04,None,0.05", "MATRIX_LR is a float in train.py, so its choices must be too, not None"),
    ("DEPTH: choices=4,True", "its choices must be too, not True"),
    ("MATRIX_LR: low=0.01 high=1e999", "low and high must be finite numbers"),
    ("MATRIX_LR: low=0.01 low=0.02 high=0.1", "low is given twice"),
    ("TOTAL_BATCH_SIZE: low=1000 high=20000", "train.py writes TOTAL_BATCH_SIZE as 2**k, so give its bounds as powers"),
    ("WINDOW_PATTERN: low=1 high=2", "WINDOW_PATTERN is a string in train.py: give it choices="),
])
def test_a_bad_search_space_entry_names_the_entry_and_the_fix(entry, words):
    with pytest.raises(SetupError) as e:
        searchspace.space_of(TRAIN, "cpu", f"## Search space\n- {entry}\n")
    assert f"search space entry {entry!r}" in str(e.value) and words in str(e.value)


def test_the_study_learns_no_value_from_an_experiment_the_environment_left_unjudged():
    """A discard whose confirmation went over the wall-time allowance twice (kind overtime) was not judged: a failed
    trial, as a crash is, so that its first run's number does not pass for the point's value; a judged discard is
    complete with its metric, a run cancelled early pruned."""
    states = optuna.trial.TrialState
    assert search.outcome_of(dict(status="discard", metric=1.5, kind="overtime")) == (states.FAIL, None)
    assert search.outcome_of(dict(status="discard", metric=1.5, kind="lost")) == (states.FAIL, None)
    assert search.outcome_of(dict(status="discard", metric=1.5, kind="ok")) == (states.COMPLETE, 1.5)
    assert search.outcome_of(dict(status="crash", metric=0.0, kind="crash")) == (states.FAIL, None)
    assert search.outcome_of(dict(status="discard", metric=0.0, kind="cancelled", cancelled={"at": 0.5})) == (
        states.PRUNED, None)


CONSTANTS = memory.Change(moves=("DEPTH up",), families=("DEPTH",))    # an edit of the space's constants only


def test_a_failure_of_the_point_is_infeasible_and_the_machines_or_a_code_edits_tells_nothing():
    """search.failure_of: a crash, a timeout, a rejection or an overtime run of a constants-only edit is its point's
    failure; a lost worker or node (the machine), a code edit (its constants may be the best's), an edit git could
    not read and a crash an older version recorded without its kind are not. Such a failure is a pruned trial with
    no value (marked infeasible by search.finish or search.added); the others stay failed trials."""
    states = optuna.trial.TrialState
    crash = dict(n=4, status="crash", metric=0.0, kind="crash")
    assert [search.failure_of({**crash, "kind": k}, CONSTANTS) for k in ("crash", "timeout", "rejected", "overtime",
                                                                         "lost", "node")] == \
        ["crash", "timeout", "rejected", "overtime", None, None]
    assert search.failure_of(crash, memory.Change(("code: GPT.forward",), ("DEPTH", "code: GPT.forward"))) is None
    assert search.failure_of(crash, memory.Change()) is None
    assert search.failure_of({k: v for k, v in crash.items() if k != "kind"}, CONSTANTS) is None
    assert search.failure_of(dict(n=4, status="discard", metric=2.0, kind="ok"), CONSTANTS) is None
    assert search.outcome_of(crash, "crash") == (states.PRUNED, None)
    assert search.outcome_of(crash) == (states.FAIL, None)


def centaur(name, told, overrides, n=40):
    """A search over DEPTH (2..16) and LR whose points with DEPTH > 12 crash (run out of memory), n experiments: the
    sampler's own points, and with `overrides` every second experiment an LLM's override at DEPTH 16 (the Centaur
    pathology of Ferreira et al. 2026: overrides that keep failing), added to the study as the harness adds it.
    told: "harness" (search.finish / search.added with failure_of: an infeasible trial) or "blind" (a failed trial,
    as before). Returns (the sampler's own points that crashed, its own points), and the study."""
    dist = {"DEPTH": optuna.distributions.IntDistribution(2, 16),
            "LR": optuna.distributions.FloatDistribution(0.005, 0.5, log=True)}
    value = lambda p: 1.0 + math.log(p["LR"] / 0.05) ** 2 + p["DEPTH"] / 100   # noqa: E731
    study = optuna.create_study(direction="minimize")
    study.add_trial(search.added(optuna.trial.TrialState.COMPLETE, value({"DEPTH": 8, "LR": 0.04}), None,
                                 {"DEPTH": 8, "LR": 0.04}, dist, {"n": 0}))
    own = []
    for i in range(1, n + 1):
        crash = dict(n=i, status="crash", metric=0.0, kind="crash")
        failure = search.failure_of(crash, CONSTANTS) if told == "harness" else None
        if overrides and i % 2 == 0:
            study.add_trial(search.added(*search.outcome_of(crash, failure), failure, {"DEPTH": 16, "LR": 0.05}, dist,
                                         {"n": i, "by": "llm override"}))
            continue
        study.sampler = search.sampler_for(name, random.Random(f"{name}:{i}").randrange(2**31),
                                           search.holds_infeasible(study.trials))     # as search.ask makes it
        trial = study.ask(dist)
        own.append(trial.params["DEPTH"] > 12)
        event = crash if own[-1] else dict(n=i, status="discard", metric=value(trial.params), kind="ok")
        search.finish(study, trial, *search.outcome_of(event, failure if own[-1] else None),
                      failure if own[-1] else None)
    return (sum(own), len(own)), study


def test_failures_keep_the_samplers_own_points_out_of_the_failing_region_and_failed_overrides_cannot_pull_them_in():
    """TPE told of its own crashes as infeasible trials samples the crashing region far less than when they are
    failed trials (which it ignores: it keeps sampling there); overrides that keep failing, told as the harness tells
    them, do not make the sampler's own points fail more (TPE counts them among its bad trials; CMA-ES models no
    pruned trial); an infeasible trial is never the study's best."""
    blind, _ = centaur("tpe", "blind", False)
    aware, study = centaur("tpe", "harness", False)
    assert blind == (37, 40) and aware == (6, 40)        # the seeds are fixed: exact counts
    assert study.best_trial.user_attrs.get(search.INFEASIBLE) is None
    failed = [t for t in study.trials if search.INFEASIBLE in t.user_attrs]
    assert len(failed) == 6 and all(t.state.name == "PRUNED" and t.constraints == {search.CONSTRAINT: 1.0}
                                    for t in failed)
    for name in ("tpe", "cmaes"):
        alone, _ = centaur(name, "harness", False)
        (crashed, runs), study = centaur(name, "harness", True)
        assert crashed / runs <= alone[0] / alone[1], name
        assert [t.user_attrs[search.INFEASIBLE] for t in study.trials if t.user_attrs.get("by") == "llm override"] \
            == ["crash"] * 20


def test_a_bad_search_space_stops_the_loop_at_start_with_exit_2(target, capsys):
    (target / "program.md").write_text("# program\n## Search space\n- LR: low=0.1 high=0.2\n")
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "1") == 2
    err = capsys.readouterr().err
    assert "search space entry 'LR: low=0.1 high=0.2': train.py's LR = 0.04 is outside it" in err


def test_no_key_and_no_proposer_runs_tpe_and_says_so(target, monkeypatch, capsys):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    assert agent.main(["--tag", "t", "--target", str(target), *STRICT, "--no-speculate", "--max-experiments", "3",
                       "--no-holdout"]) == 0
    out = capsys.readouterr().out
    assert "no LLM key, so --proposer tpe" in out and "ANTHROPIC_API_KEY or OPENAI_API_KEY" in out
    assert "search: tpe over 3 constants of train.py (ranges from their values" in out
    assert all(r.split("\t")[4].startswith("tpe: ") for r in rows(target)[1:]) and len(rows(target)) == 4
    assert set(assert_study_matches(target)) == {0, 1, 2, 3}


@pytest.mark.parametrize("proposer", ["hybrid", "anthropic"])
def test_an_llm_proposer_without_a_key_still_stops_with_the_fix(target, monkeypatch, capsys, proposer):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    assert agent.main(["--tag", "t", "--target", str(target), "--proposer", proposer]) == 2
    err = capsys.readouterr().err
    assert "ANTHROPIC_API_KEY" in err and "--proposer tpe" in err and not (target / "results.tsv").exists()


@pytest.mark.parametrize("proposer", ["cmaes", "random", "grid"])
def test_each_sampler_runs_in_the_loop_and_the_study_holds_every_experiment(target, proposer):
    assert run_agent(target, None, "anthropic", "--proposer", proposer, "--max-experiments", "4", "--no-holdout") == 0
    found = assert_study_matches(target)
    assert len(rows(target)) == 5 and {by for n, (_, _, by) in found.items() if n} == {proposer}
    assert found[0][2] == "baseline"
    assert all(r.split("\t")[4].startswith(f"{proposer}: ") for r in rows(target)[1:])


def test_the_study_survives_a_resume_and_is_rebuilt_when_missing_torn_or_edited(target, capsys):
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "3", "--no-holdout") == 0
    first = assert_study_matches(target)
    db = target / ".git" / "autoresearch" / "t" / search.STUDY_DB
    db.unlink()                                                  # missing: rebuilt, with the same trials
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "4", "--no-holdout") == 0
    assert {n: v for n, v in assert_study_matches(target).items() if n < 4} == first
    assert "rebuilt" not in capsys.readouterr().out              # a missing study is simply made again
    db.write_bytes(b"not a database" * 100)                      # torn
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "5", "--no-holdout") == 0
    out = capsys.readouterr().out
    assert "cannot be read" in out and "rebuilt from 5 experiments in events.jsonl" in out
    assert list((db.parent).glob("study.db.bad-*")) and len(assert_study_matches(target)) == 6
    study = study_of(target)                                     # edited by hand: a trial events.jsonl lacks
    study.add_trial(optuna.trial.create_trial(value=0.5, params={}, distributions={}, user_attrs={"n": 99}))
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "6", "--no-holdout") == 0
    assert "has a trial for experiment #99, which events.jsonl does not record" in capsys.readouterr().out
    assert set(assert_study_matches(target)) == set(range(7))
    (target / "program.md").write_text("# p\n## Search space\n- LR: low=0.01 high=0.1 log  # the rate\n")
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "7", "--no-holdout") == 0
    assert "was made for another search space (program.md's section or the tag's train.py changed): rebuilt from " \
           "7 experiments" in capsys.readouterr().out
    assert set(assert_study_matches(target)) == set(range(8))
    warned = [e for e in events(target, "warning") if e.get("where") == "search"]
    assert len(warned) == 3


def test_devices_cpu_2_asks_for_two_points_at_once_and_tells_them_all(target):
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--devices", "cpu:2", "--max-experiments", "6",
                     "--no-holdout") == 0
    found = assert_study_matches(target)
    assert set(found) == set(range(7))
    waves = [e["wave"] for e in events(target, "experiment")[1:]]
    assert len(set(waves)) < len(waves)                          # some wave held two points
    sources = {e["full_commit"] for e in events(target, "experiment")}
    assert len(sources) == 7


def test_kill_9_while_a_point_trains_then_resume_keeps_the_study_equal_to_the_events(target):
    (target / "train.py").write_text((target / "train.py").read_text().replace("SLEEP = 0.0", "SLEEP = 1.5"))
    (target / "program.md").write_text("# p\n## Search space\n- LR: low=0.01 high=0.1 log\n- DEPTH: low=2 high=9\n")
    subprocess.run(["git", "commit", "-qam", "slow"], cwd=target, check=True)
    argv = [sys.executable, str(AGENT), "--tag", "t", "--target", str(target), "--timeout", "60", "--proposer", "tpe",
            *STRICT, "--no-speculate", "--no-holdout", "--max-experiments", "6"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_run(target, 3, proc, timeout=90)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    running = [t for t in study_of(target).trials if t.state.name == "RUNNING"]
    assert running                                               # the point of #3 was asked, never told
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "6", "--no-holdout") == 0
    assert set(assert_study_matches(target)) == set(range(7))    # the stale point closed, #3 told once


def test_try_on_a_search_tag_is_an_added_trial_by_external(target, monkeypatch):
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "2", "--no-holdout") == 0
    best = subprocess.run(["git", "show", "autoresearch/t:train.py"], cwd=target, capture_output=True, text=True,
                          check=True).stdout
    (target / "train.py").write_text(best.replace("DEPTH = ", "DEPTH = 1 + "))   # a code edit: not a constant
    assert agent.main(["try", "--tag", "t", "--target", str(target), "-m", "depth plus one", "--timeout", "20"]) == 0
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "4", "--no-holdout") == 0
    found = assert_study_matches(target)
    assert found[3][2] == "external" and {found[n][2] for n in (1, 2, 4)} == {"tpe"}


def test_a_constant_removed_by_a_code_edit_leaves_the_search_without_it(target, capsys):
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "1", "--no-holdout") == 0
    best = subprocess.run(["git", "show", "autoresearch/t:train.py"], cwd=target, capture_output=True, text=True,
                          check=True).stdout
    lines = [line for line in best.splitlines(keepends=True) if not line.startswith(("WARMUP", "LR ="))]
    (target / "train.py").write_text("".join(lines).replace("DEPTH =", "LR = 0.05\nDEPTH ="))   # kept: LR 0.05
    assert agent.main(["try", "--tag", "t", "--target", str(target), "-m", "no warmup", "--timeout", "20"]) == 0
    assert events(target, "experiment")[-1]["status"] == "keep"
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "3", "--no-holdout") == 0
    out = capsys.readouterr().out
    assert "search: the search continues without WARMUP: the best train.py no longer defines it" in out
    assert {tuple(sorted(t.params)) for t in study_of(target).trials if t.user_attrs.get("n", 0) >= 2} == \
        {("DEPTH", "LR")}
    assert_study_matches(target)


def test_program_md_names_the_space_of_the_loop(target, capsys):
    (target / "program.md").write_text("# p\n## Search space\n- LR: low=0.01 high=0.1 log\n- DEPTH: low=2 high=9\n")
    assert run_agent(target, None, "anthropic", "--proposer", "cmaes", "--max-experiments", "2", "--no-holdout") == 0
    assert "search: cmaes over 2 constants of train.py (program.md's ## Search space" in capsys.readouterr().out
    assert all(set(t.params) == {"LR", "DEPTH"} for t in study_of(target).trials)


def hybrid_llm_answers(target, script, *extra):
    """agent.py --proposer hybrid on the tiny target with the loopback LLM answering `script`."""
    with ScriptedLLM(script) as llm:
        rc = agent.main(["--tag", "t", "--target", str(target), "--timeout", "20", "--retry-base-delay", "0.01",
                         *STRICT, "--no-speculate", "--no-holdout", "--proposer", "hybrid", "--base-url",
                         llm.anthropic_url, "--sampler", "tpe", *extra])
        return rc, [body for _, body, _ in llm.requests]


def test_hybrid_accepts_overrides_within_the_share_repairs_bad_json_and_writes_code_after_a_stall(target, capsys):
    script = ['{"decision": "override", "values": {"LR": 0.05}, "reason": "the optimum is at 0.05"}',
              "this is not json", '{"decision": "override", "values": {"NOPE": 1}, "reason": "x"}',
              '{"decision": "accept", "reason": "fine"}',
              '{"decision": "override", "values": {"LR": "0.05"}}',
              '{"decision": "override", "values": {"DEPTH": true}}',
              '{"decision": "override", "values": {"LR": 1' + "0" * 400 + '}}'] + \
        ['{"decision": "accept", "reason": "ok"}'] * 20
    rc, asked = hybrid_llm_answers(target, script, "--max-experiments", "10", "--llm-share", "0.3", "--stall", "50")
    assert rc == 0
    found = assert_study_matches(target)
    by = {e["n"]: e.get("by") for e in events(target, "experiment")}
    overrides = [n for n, b in by.items() if b == "llm override"]
    # asked only while one more override stays within 0.3 of the experiments: first at #4 (1 <= 0.3 x 4, an
    # override), again at #7 (2 <= 2.1: bad JSON, an unknown name, then accepted), #8 (a string, a bool, a number
    # beyond a float: the sampler's point runs) and #9-#10 (accepted)
    assert overrides == [4] and len(asked) == 1 + 3 + 3 + 2
    first = [e for e in events(target, "experiment") if e["n"] == overrides[0]][0]
    assert first["why"] == "the optimum is at 0.05" and "LR" in first["description"]
    assert "llm override: " in first["description"] and found[overrides[0]][2] == "llm override"
    repairs = [e["error"] for e in events(target, "repair")]
    assert any("not valid JSON" in r for r in repairs) and any("unknown parameter(s) NOPE" in r for r in repairs)
    assert 'LR = "0.05" is not a value of it (LR: low=0.0133333 high=0.12 log)' in repairs
    assert "DEPTH = true is not a value of it (DEPTH: low=4 high=16)" in repairs
    assert [e for e in events(target, "hybrid") if e["n"] == 8][0]["decision"] == "sampler"
    assert all(b in ("tpe", "llm override") for n, b in by.items() if n)
    # the LLM was asked only when an override was open: never for the first experiments (0.3 x 1..3 < 1)
    assert len(asked) < 10 + 3
    prompt = asked[0]["messages"][0]["content"]
    assert "Its next point, experiment #" in prompt and "Search space: LR: low=" in prompt
    assert '"decision": "override"' in prompt and "code edit" not in prompt


def test_hybrid_code_edit_after_a_stall_and_report_shows_who_proposed(target):
    base = (target / "train.py").read_text()
    edit = ("DESCRIPTION: depth doubled in code\nREASON: numbers are exhausted\n<<<<<<< SEARCH\nSLEEP = 0.0\n=======\n"
            "SLEEP = 0.0 * 2\n>>>>>>> REPLACE\n")
    assert "SLEEP = 0.0\n" in base
    script = [edit] + ['{"decision": "accept", "reason": "ok"}'] * 20
    rc, asked = hybrid_llm_answers(target, script, "--max-experiments", "4", "--llm-share", "0.01", "--stall", "1")
    assert rc == 0
    by = {e["n"]: e.get("by") for e in events(target, "experiment")}
    assert "llm code" in by.values()
    coded = [e for e in events(target, "experiment") if e.get("by") == "llm code"][0]
    assert coded["why"] == "numbers are exhausted" and coded["description"].startswith("depth doubled in code")
    assert "code edit" in asked[0]["messages"][0]["content"]
    assert_study_matches(target)
    report = subprocess.run([sys.executable, str(REPO / "report.py"), str(target), "--tag", "t"],
                            capture_output=True, text=True, check=True).stdout
    counts = collections.Counter(e.get("by") or e["proposer"] for e in events(target, "experiment")[1:])
    keeps = collections.Counter(e.get("by") or e["proposer"] for e in events(target, "experiment")[1:]
                                if e["status"] == "keep")
    assert "proposed by  " + ", ".join(f"{k} {v} ({keeps[k]} kept)" for k, v in counts.most_common()) in report
    assert "llm code 1 (" in report


def test_overrides_that_keep_failing_are_infeasible_trials_shown_to_the_llm_and_rebuilt_alike(target, capsys,
                                                                                                  monkeypatch):
    """The hybrid with an LLM whose overrides keep crashing (DEPTH 16: out of memory above 12): each is recorded
    (by "llm override", kind crash), told to the study as an infeasible trial (pruned, constraint violated), shown
    to the LLM as a failure of its point; a study rebuilt from the events holds the same trials. TPE draws its wider
    set of candidates from the first infeasible trial on."""
    wide, sampler_for = [], search.sampler_for
    monkeypatch.setattr(search, "sampler_for", lambda name, seed, infeasible=False: wide.append(infeasible) or
                        sampler_for(name, seed, infeasible))
    train = target / "train.py"
    train.write_text(train.read_text().replace("SLEEP = 0.0\n", "SLEEP = 0.0\nif DEPTH > 12:\n    raise MemoryError("
                                               "'CUDA out of memory: DEPTH > 12')\n"))
    git.Repo(target).git.commit("-qam", "out of memory above DEPTH 12")
    script = ['{"decision": "override", "values": {"DEPTH": 16}, "reason": "deeper is better"}'] * 40
    rc, asked = hybrid_llm_answers(target, script, "--max-experiments", "8", "--llm-share", "0.5", "--stall", "50")
    assert rc == 0
    overrides = [e for e in events(target, "experiment") if e.get("by") == "llm override"]
    assert len(overrides) >= 2 and {(e["status"], e["kind"]) for e in overrides} == {("crash", "crash")}
    assert wide[0] is False and wide[-1] is True and wide == sorted(wide)
    found = assert_study_matches(target)
    trials = {t.user_attrs["n"]: t for t in study_of(target).trials if "n" in t.user_attrs}
    assert all(trials[e["n"]].user_attrs[search.INFEASIBLE] == "crash" and trials[e["n"]].constraints ==
               {search.CONSTRAINT: 1.0} for e in overrides)
    assert any(f"#{overrides[0]['n']} by llm override: failed at its point (crash)" in body["messages"][0]["content"]
               for body in asked)
    (target / ".git" / "autoresearch" / "t" / search.STUDY_DB).unlink()
    assert hybrid_llm_answers(target, [], "--max-experiments", "8")[0] == 0
    assert assert_study_matches(target) == found
    # an older version recorded no kind: its crash tells the sampler nothing, said once as the study is rebuilt
    old = overrides[0]["n"]
    lines = [json.loads(line) for line in (target / "events.jsonl").read_text().splitlines()]
    (target / "events.jsonl").write_text("".join(json.dumps({k: v for k, v in e.items() if not (
        k == "kind" and e["event"] == "experiment" and e["n"] == old)}) + "\n" for e in lines))
    (target / ".git" / "autoresearch" / "t" / search.STUDY_DB).unlink()
    capsys.readouterr()
    assert hybrid_llm_answers(target, [], "--max-experiments", "8")[0] == 0
    assert assert_study_matches(target)[old][:2] == ("FAIL", None)
    assert f"1 crash(es) recorded by an older version (#{old}) tell the sampler nothing" in capsys.readouterr().out


@pytest.mark.parametrize("declared", [
    '"evaluator_only": [str(val), str(Path(__file__).resolve().parent / "data")]',   # by path (its pristine copy)
    '"evaluator_only": [str(val)], "evaluator_only_in_target": ["data"]',             # by name, as prepare.py does
])
def test_a_committed_evaluator_only_corpus_is_not_copied_into_run_dirs(target, declared):
    """prepare.py --frozen-inputs names a folder committed with the target as evaluator-only (the sample corpus
    holds the validation text): the run dir train.py runs in has no copy."""
    (target / "data").mkdir()
    (target / "data" / "val.txt").write_text("the validation text\n")
    prepare = (target / "prepare.py").read_text().replace('"evaluator_only": [str(val)]', declared)
    (target / "prepare.py").write_text(prepare)
    train = (target / "train.py").read_text().replace(
        'print("step 1', 'print("sees val:", os.path.exists("data/val.txt"))\nprint("step 1')
    (target / "train.py").write_text(train)
    subprocess.run(["git", "add", "-A"], cwd=target, check=True)
    subprocess.run(["git", "commit", "-qm", "sample corpus"], cwd=target, check=True)
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "0", "--no-holdout") == 0
    logs = list((target / ".git" / "autoresearch" / "t" / "logs").glob("*.log"))
    assert logs and all("sees val: False" in log.read_text() for log in logs)
    assert (target / "data" / "val.txt").exists()                # the checkout keeps it


@pytest.mark.slow
def test_tpe_on_the_real_cpu_target_writes_runnable_points(real_repo):
    """The real train.py and prepare.py (cpu profile, a 2 s budget): TPE's points of the 16-constant space are edits
    that train and are scored by the separate evaluator, and the study holds them."""
    repo_dir, env = real_repo
    env = {k: v for k, v in env.items() if k != "ANTHROPIC_API_KEY"}
    done = subprocess.run([sys.executable, str(AGENT), "--tag", "real", "--target", str(repo_dir), "--max-experiments",
                           "2", "--baseline-runs", "1", "--confirm", "0", "--no-holdout", "--no-speculate"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no LLM key, so --proposer tpe" in done.stdout and "search: tpe over 16 constants" in done.stdout
    exps = events(repo_dir, "experiment")
    assert [e["n"] for e in exps] == [0, 1, 2]
    assert [e["profile"] for e in events(repo_dir, "start")] == ["cpu"]   # a fresh machine resuming prepares this one
    lines = (repo_dir / "results.tsv").read_text().splitlines()[2:]
    assert all(line.split("\t")[4].startswith("[budget 2s] tpe: ") for line in lines) and len(lines) == 2
    study = study_of(repo_dir, "real")
    assert {t.user_attrs["n"] for t in study.trials if "n" in t.user_attrs} == {0, 1, 2}
    for e in exps[1:]:
        assert e["description"].startswith("tpe: ")
        trial = [t for t in study.trials if t.user_attrs.get("n") == e["n"]][0]
        assert len(trial.params) == 16 and trial.params["MATRIX_LR"] != 0.06
        # the commit's train.py says what the study asked for (the description names only the largest moves)
        source = git.Repo(repo_dir).git.show(f"{e['full_commit']}:train.py")
        space = searchspace.space_of((repo_dir / "train.py").read_text(), "cpu", (repo_dir / "program.md").read_text())
        written = searchspace.values_of(space, source, "cpu")      # floats written to 4 significant digits
        assert written.keys() == trial.params.keys()
        assert all(written[k] == v or written[k] == pytest.approx(v, rel=1e-3) for k, v in trial.params.items())


def test_a_used_up_space_stops_cleanly_and_grid_sweeps_only_what_program_md_names(target, capsys):
    (target / "program.md").write_text("# p\n## Search space\n- DEPTH: low=7 high=9\n")
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "5", "--no-holdout") == 1
    err = capsys.readouterr().err
    assert "the search space is exhausted: tpe drew 20 points in a row that are already measured or running" in err
    assert [e["description"] for e in events(target, "experiment")[1:]] == ["tpe: DEPTH 8 -> 7", "tpe: DEPTH 7 -> 9"]
    assert_study_matches(target)
    (target / "program.md").write_text("# p\n## Search space\n- WARMUP: low=0.01 high=0.5 log\n")
    assert agent.main(["--tag", "g", "--target", str(target), *STRICT, "--no-speculate", "--proposer", "grid",
                       "--max-experiments", "2", "--no-holdout"]) == 0
    grid = [e["description"] for e in events(target, "experiment") if e["tag"] == "g"][1:]
    assert grid == ["grid: WARMUP 0.1 -> 0.05", "grid: WARMUP 0.1 -> 0.2"]


def test_speculated_points_never_run_are_closed_at_a_clean_stop(target):
    assert agent.main(["--tag", "t", "--target", str(target), *STRICT, "--proposer", "tpe", "--devices", "cpu:2",
                       "--max-experiments", "3", "--no-holdout", "--timeout", "20"]) == 0
    assert set(assert_study_matches(target)) == {0, 1, 2, 3}       # no RUNNING trial left


def test_hybrid_flags_belong_to_hybrid(target, capsys):
    with pytest.raises(SystemExit) as e:
        agent.main(["--tag", "t", "--target", str(target), "--proposer", "tpe", "--sampler", "cmaes", "--stall", "3"])
    assert e.value.code == 2 and "--sampler, --stall: only --proposer hybrid has them" in capsys.readouterr().err


LOCK = """import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(120)
"""


def test_a_study_locked_by_another_process_is_a_warning_and_the_loop_goes_on(target, monkeypatch, capsys):
    """study.db held under an exclusive lock by another process, from the start and from mid-run (after #1's
    point was asked): each time one warning naming the file and the lock, then the loop goes on with a study in memory
    rebuilt from the events; every experiment is recorded, no traceback; the next start catches the file up."""
    monkeypatch.setattr(search, "STUDY_LOCK_WAIT_S", 0.2)
    db = target / ".git" / "autoresearch" / "t" / search.STUDY_DB
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "1", "--no-holdout") == 0
    capsys.readouterr()
    locker = subprocess.Popen([sys.executable, "-c", LOCK, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout.readline() == "locked\n"
        assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "3",
                         "--no-holdout") == 0
    finally:
        locker.kill()
        locker.wait()
    captured = capsys.readouterr()
    assert f"search: the search's study {db} cannot be used (OperationalError: database is locked); this run goes " \
           "on with a study in memory rebuilt from the 2 recorded experiments" in captured.out
    assert "Traceback" not in captured.out + captured.err and not list(db.parent.glob("study.db.bad-*"))
    assert [e["n"] for e in events(target, "experiment")] == [0, 1, 2, 3]
    real_tell = optuna.study.Study.tell
    calls = []

    def locked_tell(self, *args, **kwargs):         # mid-run: the lock taken between a point's ask and its tell
        calls.append(1)
        if len(calls) == 1:
            import sqlite3
            import sqlalchemy.exc
            cause = sqlite3.OperationalError("database is locked")
            raise sqlalchemy.exc.OperationalError("UPDATE trials", {}, cause) from cause
        return real_tell(self, *args, **kwargs)
    monkeypatch.setattr(optuna.study.Study, "tell", locked_tell)
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "5", "--no-holdout") == 0
    out = capsys.readouterr().out
    # told of #4 (recorded: 5 experiments), the study fails; #5 is asked from the one in memory
    assert "cannot be used (OperationalError: database is locked); this run goes on with a study in memory rebuilt " \
           "from the 5 recorded experiments" in out and "Traceback" not in out
    assert [e["n"] for e in events(target, "experiment")] == list(range(6))
    monkeypatch.setattr(optuna.study.Study, "tell", real_tell)
    assert run_agent(target, None, "anthropic", "--proposer", "tpe", "--max-experiments", "6", "--no-holdout") == 0
    assert set(assert_study_matches(target)) == set(range(7))   # the file caught up at the next start
