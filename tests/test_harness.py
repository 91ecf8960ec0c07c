"""
Unit tests of the harness package's pure parts: the edit format, the random/grid perturbations, the frozen
constants and budget, prices, summary parsing. The loop itself is tested through agent.main in test_agent.py.
"""

import dataclasses
import json
import os
from types import SimpleNamespace

import git
import pytest

from agent_target import edit
from harness.record import baseline, experiment
from harness.propose.edits import EditError, apply_answer
from harness.errors import SetupError, Stop
from harness.propose.perturb import grid, moves, numeric_constants
from harness.propose.providers import price
from harness.run import guard
from harness.run.runner import Kind, Outcome, parse_summary, read_metric
from harness.run.target import default_timeout, effective_budget, own_budget, read_frozen_constants



def test_apply_answer_errors_name_the_fix():
    src = "A = 1\nB = 1\n"
    with pytest.raises(EditError, match="occurs 2 times in train.py; add surrounding lines"):
        apply_answer(edit("x", "= 1", "= 2"), src)
    with pytest.raises(EditError, match="leave train.py unchanged"):
        apply_answer(edit("x", "A = 1", "A = 1"), src)
    with pytest.raises(EditError, match=r"does not parse: .*\(line 1\)"):
        apply_answer(edit("x", "A = 1", "A = (1"), src)
    two = edit("both", "A = 1", "A = 3") + edit("ignored", "B = 1", "B = 4").split("\n", 1)[1]
    assert apply_answer(two.replace("\n", "\r\n"), src) == ("both", "A = 3\nB = 4\n")


OLD_BLOCKS = r"^<{7} SEARCH[ \t]*\n(.*?)^={7}[ \t]*\n(.*?)^>{7} REPLACE[ \t]*$"     # the regex split_blocks replaced


@pytest.mark.parametrize("answer", [
    "<<<<<<< SEARCH\nA = 1\n=======\nA = 2\n>>>>>>> REPLACE",
    "text\n<<<<<<< SEARCH \t\nA = 1\n\n=======\t\n>>>>>>> REPLACE\nB\n<<<<<<< SEARCH\n=======\n=======\n"
    ">>>>>>> REPLACE  \n",
    "<<<<<<< SEARCH\n>>>>>>> REPLACE\n=======\nx = '<<<<<<<< SEARCH'\n>>>>>>> REPLACE\n",
])
def test_blocks_split_as_the_regex_did(answer):
    import re
    from harness.propose.edits import split_blocks
    assert split_blocks(answer) == re.findall(OLD_BLOCKS, answer, re.S | re.M)


def test_a_huge_answer_is_refused_in_linear_time():
    """~1 MB of SEARCH lines (what froze the loop for minutes under the regex): refused at once, with the fix."""
    from harness.propose.edits import split_blocks
    for answer in ("DESCRIPTION: x\n" + "<<<<<<< SEARCH\n" * 70_000, "DESCRIPTION: x\n" + "\n" * 1_000_000 +
                   "<<<<<<< SEARCH\nA = 1\n=======\nA = 2\n" + "=======\n" * 100_000):
        with pytest.raises(EditError, match="a block is malformed: every <<<<<<< SEARCH line needs a ======= line"):
            split_blocks(answer)
        with pytest.raises(EditError, match="an edit may be at most 200,000 characters"):
            apply_answer(answer, "A = 1\n")
    assert apply_answer("\n" * 150_000 + edit("far down", "A = 1", "A = 2"), "A = 1\n") == ("far down", "A = 2\n")
    with pytest.raises(EditError, match="the DESCRIPTION line is empty"):          # a line of blanks: no backtracking
        apply_answer("DESCRIPTION:" + " " * 150_000, "A = 1\n")
    with pytest.raises(EditError, match=r"the answer is 2,000,015 characters .* at most 200,000 characters"):
        apply_answer("DESCRIPTION: x\n" + "\n" * 2_000_000, "A = 1\n")
    many = "DESCRIPTION: x\n" + "".join(edit("", f"A{i} = 1", f"A{i} = 2").split("\n", 1)[1] for i in range(201))
    with pytest.raises(EditError, match="201 blocks; an edit may be at most 200,000 characters and 200 blocks"):
        apply_answer(many, "".join(f"A{i} = 1\n" for i in range(201)))


def test_invisible_characters_around_the_description_are_removed_and_an_empty_one_refused():
    from harness.propose.edits import EMPTY_DESCRIPTION
    from harness.propose.ideas import split_ideas
    body = edit("", "A = 1", "A = 2").split("\n", 1)[1]
    for head in ("\ufeffDESCRIPTION: raise A", "\u200bDESCRIPTION: raise A", "DESC\u200dRIPTION: raise\u200b A",
                 " \u2066DESCRIPTION:\u2069 raise A\u00ad"):
        assert apply_answer(f"{head}\n{body}", "A = 1\n") == ("raise A", "A = 2\n")
    # inside a block nothing is removed: train.py's own text is matched as written
    assert apply_answer("\ufeffDESCRIPTION: z\n" + edit("", "B = '\u200b'", "B = ''").split("\n", 1)[1],
                        "B = '\u200b'\n") == ("z", "B = ''\n")
    for empty in ("DESCRIPTION: \u200b", "DESCRIPTION: [hw2] [budget 10s]", "\ufeffDESCRIPTION:\u200e"):
        with pytest.raises(EditError) as e:
            apply_answer(f"{empty}\n{body}", "A = 1\n")
        assert str(e.value) == ("the DESCRIPTION line is empty (or holds only labels the harness writes): "
                                + EMPTY_DESCRIPTION)
    two = f"\ufeffDESCRIPTION: one\n{body}\nDESCRIPTION: two\n{body}"
    assert [apply_answer(idea, "A = 1\n")[0] for idea in split_ideas(two)] == ["one", "two"]


def test_perturbations_keep_types_and_powers_of_two():
    src = ("TOTAL_BATCH_SIZE = 2**19\nDEPTH = 8  # layers\nHEADS = 6\nMATRIX_LR = 0.04\nBETA = 0.95\n"
           "ADAM_BETAS = (0.8, 0.95)\nUSE_COMPILE = True\nWARMUP_RATIO = 0.0\nLAYER_2 = 2\nwidth = 64\n")
    found = {name: (number, kind) for name, _, _, number, kind in numeric_constants(src)}
    assert found == {"TOTAL_BATCH_SIZE": (19, "pow2"), "DEPTH": (8, "int"), "HEADS": (6, "int"),
                     "MATRIX_LR": (0.04, "float"), "BETA": (0.95, "float"), "LAYER_2": (2, "int")}
    assert moves(19, "pow2") == ["2**18", "2**20"]
    assert moves(8, "int") == ["4", "16"]
    assert moves(6, "int") == ["4", "8"]
    assert moves(0.04, "float") == ["0.02", "0.08"]
    assert moves(0.95, "float") == ["0.975", "0.9"]
    answer = grid(src, 1)                                # LAYER_2's value is replaced, not its name
    assert apply_answer(answer, src)[1].count("TOTAL_BATCH_SIZE = 2**18\n") == 1
    assert apply_answer(grid(src, 12), src)[1].endswith("LAYER_2 = 4\nwidth = 64\n")


def test_frozen_constants_and_timeout(tmp_path, monkeypatch):
    (tmp_path / "prepare.py").write_text('METRIC_NAME = "pass@1"\nMETRIC_GOAL = "max"\nTIME_BUDGET = 300\n')
    values = read_frozen_constants(tmp_path / "prepare.py")
    assert (values["METRIC_NAME"], values["METRIC_GOAL"], values["TIME_BUDGET"], values["PREFLIGHT"]) == \
        ("pass@1", "max", 300, False)
    monkeypatch.setenv("AUTORESEARCH_TIME_BUDGET", "10")
    assert effective_budget(300) == 10.0 and default_timeout(10.0) == 130.0
    assert default_timeout(300.0) == 600.0
    (tmp_path / "prepare.py").write_text('METRIC_NAME = "x"\nTIME_BUDGET = 300\n')
    with pytest.raises(SetupError, match="must declare METRIC_GOAL"):
        read_frozen_constants(tmp_path / "prepare.py")


def test_a_profile_declares_its_own_budget(tmp_path):
    """prepare.py's PROFILE_BUDGETS gives a profile (the lab's) a budget of its own; other profiles, and targets
    that declare none (grpo), keep TIME_BUDGET; a declared budget that is not a positive number is refused."""
    (tmp_path / "prepare.py").write_text('METRIC_NAME = "val_bpb"\nMETRIC_GOAL = "min"\nTIME_BUDGET = 300\n'
                                         'PROFILE_BUDGETS = {"lab": 60}\n')
    values = read_frozen_constants(tmp_path / "prepare.py")
    assert [own_budget(values, p) for p in ("lab", "cpu", None)] == [60.0, 300.0, 300.0]
    assert own_budget(dict(TIME_BUDGET=120), "lab") == 120.0
    for bad in (0, -5, "60", True):
        with pytest.raises(SetupError, match="budget for profile 'lab' is .*not a positive number"):
            own_budget(dict(TIME_BUDGET=300, PROFILE_BUDGETS={"lab": bad}), "lab")


def test_the_evaluation_limit_is_sized_by_evaluation():
    """Before this hardware's baseline is measured its evaluations get EVAL_FIRST_S; then 5 x the baseline's
    evaluation + 120 s, whatever the training budget; --timeout when longer. A baseline whose pristine evaluator or
    whose training ran out of time stops the loop as the machine's problem, with the flag that fixes it, never "Fix
    train.py"."""
    base = dict(n=0, status="keep", description="baseline", eval_seconds=3.0, hardware_epoch=1)
    s = SimpleNamespace(baseline_due=False, history=[base], tag=SimpleNamespace(timeout=None))
    assert experiment.eval_timeout(s) == 5 * 3.0 + 120
    assert experiment.eval_timeout(changed(s, baseline_due=True)) == 1800.0
    assert experiment.eval_timeout(changed(s, tag=SimpleNamespace(timeout=4000.0))) == 4000.0
    late = Outcome("c0ffee", None, 0.0, 65.0, kind=Kind.TIMEOUT, eval_seconds=1800.0,
                   reason="evaluation timeout after 1800s: the frozen evaluator did not finish scoring the model in time")
    with pytest.raises(Stop) as stop:
        baseline.record_baseline(s, [late], 0.0, None)
    assert str(stop.value).startswith("the baseline's separate evaluation ran out of time (evaluation timeout after "
                                      "1800s: ") and "Fix train.py" not in str(stop.value)
    assert "--timeout 3780," in str(stop.value) and "--profile lab" in str(stop.value)
    slow = Outcome("c0ffee", None, 0.0, 140.2, kind=Kind.TIMEOUT, reason="timeout after 140s", timed_out=True)
    with pytest.raises(Stop) as stop:
        baseline.record_baseline(s, [slow], 0.0, None)
    assert str(stop.value) == (
        "the baseline's training ran out of time (timeout after 140s): this machine is too slow or too busy for this "
        "budget, which is not train.py's fault (do not change it). Rerun the same command with a longer limit, "
        "--timeout 300, quiet the machine, or prepare the smaller lab profile (`uv run prepare.py --profile lab "
        "--force`)")


def test_the_run_timeout_is_the_tags_or_follows_its_baseline():
    """experiment.run_timeout: the given one (--timeout or the tag's recorded) as is; else the target's default until
    the baseline is measured, then twice the allowance its runs measured (at least the default)."""
    base = dict(n=0, status="keep", description="baseline", train_seconds=168.0, base_probe_s=0.2, hardware_epoch=1)
    s = SimpleNamespace(baseline_due=False, history=[base], tag=SimpleNamespace(timeout=None, budget=20.0, smoke=False),
                        pool=None)
    assert experiment.run_timeout(s).seconds(0.2) == pytest.approx(2 * (20 + 148 * 1.1 + 0.1 + 2))
    assert experiment.run_timeout(changed(s, baseline_due=True)).seconds(0.2) == default_timeout(20.0) == 140.0
    assert experiment.run_timeout(changed(s, tag=changed(s.tag, timeout=90.0))).seconds(0.2) == 90.0
    assert experiment.run_timeout(changed(s, tag=changed(s.tag, timeout=90.0))).short(0.2)


def changed(namespace, **changes):
    """A copy of a SimpleNamespace with changes."""
    return SimpleNamespace(**{**vars(namespace), **changes})


def test_price_table():
    assert price("claude-haiku-4-5-20251001", 1_000_000, 0, 0, 0) == 1.0
    assert price("some-local-model", 10**6, 10**6, 0, 0) == 0.0


def test_summary_takes_the_last_block_and_rejects_nan():
    log = "---\nval_bpb: 9.0\nstep 5\r step 6\n---\nval_bpb:   1.234567\npeak_vram_mb: 45060.2\nnote: a b\n"
    summary = parse_summary(log)
    assert summary == {"val_bpb": "1.234567", "peak_vram_mb": "45060.2", "note": "a b"}
    assert read_metric(summary, "val_bpb") == (1.234567, 45060.2 / 1024, "")
    assert read_metric({"val_bpb": "nan"}, "val_bpb") == (None, 0.0, "val_bpb is nan")
    assert read_metric({"pass@1": "0.5"}, "val_bpb") == (None, 0.0, "no val_bpb in the summary")


def test_perturbations_follow_the_profile_branch():
    src = ('LR = 0.5\nif PROFILE == "cpu":\n    DEPTH = 4\n    HEAD_DIM = 64\nelif PROFILE == "small":\n    DEPTH = 6\n'
           '    HEAD_DIM = 64\nelse:\n    DEPTH = 8\n    BATCH = 2**19\n')
    def names(profile):
        return {name: number for name, _, _, number, _ in numeric_constants(src, profile)}
    assert names(None) == {"LR": 0.5}                                   # no profile known: module level only
    assert names("cpu") == {"LR": 0.5, "DEPTH": 4, "HEAD_DIM": 64}
    assert names("small") == {"LR": 0.5, "DEPTH": 6, "HEAD_DIM": 64}
    assert names("default") == {"LR": 0.5, "DEPTH": 8, "BATCH": 19}     # no branch named: the else
    # HEAD_DIM = 64 occurs twice: the edit carries enough context to hit the small branch only
    answers = [grid(src, n, "small") for n in range(1, 7)]
    edits = [apply_answer(a, src)[1] for a in answers if "HEAD_DIM" in a.splitlines()[0]]
    assert edits and all(e.count("    HEAD_DIM = 64\n") == 1 and e.split("elif")[0] == src.split("elif")[0] for e in edits)


def test_exports_ignore_replace_refs(tmp_path):
    """A refs/replace/ ref swaps a blob's bytes for git's readers; the harness's exports (the pristine evaluator
    among them) read the object itself. (Found by a hostile test: a replaced prepare.py scored every later run.)"""
    import git
    from harness import gitops
    repo = git.Repo.init(tmp_path / "repo", initial_branch="main")
    (tmp_path / "repo" / "prepare.py").write_text("HONEST = True\n")
    (tmp_path / "repo" / "train.py").write_text("X = 1\n")
    repo.index.add(["prepare.py", "train.py"])
    commit = repo.index.commit("target").hexsha
    (tmp_path / "evil.py").write_text("HONEST = False\n")
    evil = repo.git.hash_object("-w", str(tmp_path / "evil.py"))
    repo.git.replace(repo.git.rev_parse(f"{commit}:prepare.py"), evil)
    assert repo.git.show(f"{commit}:prepare.py") == "HONEST = False"        # what plain git now shows
    ours = gitops.open_repo(tmp_path / "repo")
    dest = gitops.export_commit(ours, commit, "", tmp_path / "export")
    assert (dest / "prepare.py").read_text() == "HONEST = True\n"


def test_an_artifact_folder_must_hold_regular_files_only(tmp_path):
    """GRPO's artifact is a folder of weights: a link, a second name of a file or a pipe anywhere in it is named;
    lstat only, nothing followed."""
    import os
    from harness.run.runner import artifact_problem
    good = tmp_path / "good"
    (good / "sub").mkdir(parents=True)
    (good / "model.safetensors").write_bytes(b"w")
    (good / "sub" / "extra.json").write_text("{}")
    assert artifact_problem(good) is None
    for name, plant in [("link", lambda d: (d / "model.safetensors").symlink_to(tmp_path / "elsewhere")),
                        ("linked folder", lambda d: (d / "sub").symlink_to(tmp_path, target_is_directory=True)),
                        ("hard", lambda d: os.link(tmp_path / "elsewhere", d / "model.safetensors")),
                        ("fifo", lambda d: os.mkfifo(d / "model.safetensors"))]:
        (tmp_path / "elsewhere").write_bytes(b"better")
        folder = tmp_path / name
        folder.mkdir()
        plant(folder)
        problem = artifact_problem(folder)
        assert problem is not None and problem.startswith(f"the model artifact {name} (")
    assert "is a symbolic link" in artifact_problem(tmp_path / "link")
    assert "has another name" in artifact_problem(tmp_path / "hard")
    assert "not a regular file" in artifact_problem(tmp_path / "fifo")
    setid = tmp_path / "setid"
    setid.mkdir()
    (setid / "rootid").write_bytes(b"\x7fELF")
    (setid / "rootid").chmod(0o6755)                  # a root-owned program a run left for later (hostile test)
    assert "has a set-user-id or set-group-id bit" in artifact_problem(setid)
    (tmp_path / "top").symlink_to(good)
    assert artifact_problem(tmp_path / "top").startswith("the model artifact top is a symbolic link")
    assert artifact_problem(tmp_path / "missing") == "no model artifact missing"


def test_an_opened_tags_configuration_is_frozen_and_its_state_follows_the_events(target):
    """open_session splits the Session by what its fields are: the tag's configuration (TagConfig) is frozen once
    the tag is open, whichever step tries to write it; best and baseline are read from the history."""
    from harness.tag import opening, settings
    s, _ = opening.open_session(settings.parse(["--tag", "t", "--proposer", "random", "--target", str(target),
                                                "--sandbox", "off"]))
    assert (s.tag.branch, s.tag.metric, s.tag.goal, s.tag.train_rel, s.tag.frozen_rels, s.tag.target_rel) == \
        ("autoresearch/t", "val_bpb", "min", "train.py", ("prepare.py",), "")
    assert s.tag.frozen_base == s.best_commit == git.Repo(target).head.commit.hexsha and s.tag.home.is_dir()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.tag.budget = 1e9
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.settings.tag = "other"
    assert (s.best_metric, s.baseline_metric, s.baseline_due, s.next_n) == (None, None, True, 0)
    s.history.append(dict(n=0, status="keep", metric=1.5, description="baseline", hardware_epoch=1))
    assert (s.best_metric, s.baseline_metric, s.baseline_due, s.next_n) == (1.5, 1.5, False, 1)


def session_with_a_run_in_flight(target):
    """(the tiny target's Session unsandboxed, its events.jsonl, the guard's snapshot of it for a run in flight), one
    event logged before the snapshot."""
    from harness.tag import opening, settings
    s, _ = opening.open_session(settings.parse(["--tag", "t", "--proposer", "random", "--target", str(target),
                                                "--sandbox", "off"]))
    events_path = target / "events.jsonl"
    s.log("warning", reason="before the run")
    snap = guard.take(s.repo, [events_path])
    s.live.append(snap)
    return s, events_path, snap


def test_a_runs_forged_event_undone_by_the_guard_never_stops_the_loop_as_a_cut_ledger(target):
    """A run outside the sandbox appends a line to events.jsonl before the harness logs its own "run" event; the
    guard then puts the file back to the harness's lines. The bytes the ledger must hold are the harness's own,
    counted: they were the file's size after each append, forged line included, and the next event stopped the loop
    with "events.jsonl was cut" (a CI failure, when the run's import beat the "run" event)."""
    s, events_path, snap = session_with_a_run_in_flight(target)
    forged = '{"event": "experiment", "tag": "t", "n": 9, "status": "keep", "metric": 0.1}\n'
    with open(events_path, "a") as f:
        f.write(forged)
    s.log("warning", reason="the run started")
    assert guard.check(s.repo, snap) == ["wrote events.jsonl (restored)"]
    s.live.remove(snap)
    s.log("warning", reason="after the run")
    text = events_path.read_text()
    assert forged not in text and [json.loads(line).get("reason") for line in text.splitlines()][-3:] == \
        ["before the run", "the run started", "after the run"]
    events_path.write_text(text[:-10])                  # a ledger really cut still stops the loop
    with pytest.raises(Stop, match="was cut to"):
        s.log("warning", reason="never written")


@pytest.mark.parametrize("change", ["cut", "link", "fifo"])
def test_a_record_a_run_changes_while_the_harness_writes_is_put_back_and_the_run_blamed(target, change):
    """A hostile review: with a run outside the sandbox in flight, the harness logs (a proposal made ahead, another
    device's verdict). The run had cut events.jsonl, made it a symbolic link or a FIFO: the loop stopped ("was cut
    to 0 bytes", "is a symbolic link"), blaming the ledger for the run's doing. Now the file is put back with the
    harness's line, and the run's check still reports it."""
    s, events_path, snap = session_with_a_run_in_flight(target)
    kept = events_path.read_bytes()
    events_path.unlink()
    if change == "cut":
        events_path.write_bytes(kept[:5])
    elif change == "link":
        (target / "elsewhere.jsonl").write_bytes(kept)
        events_path.symlink_to(target / "elsewhere.jsonl")
    else:
        os.mkfifo(events_path)
    s.log("warning", reason="while the run trains")
    assert events_path.is_file() and not events_path.is_symlink()
    assert guard.check(s.repo, snap) == ["wrote events.jsonl (restored)"]
    s.live.remove(snap)
    s.log("warning", reason="after the run")
    assert [json.loads(line).get("reason") for line in events_path.read_text().splitlines()] == \
        [json.loads(line).get("reason") for line in kept.decode().splitlines()] + ["while the run trains",
                                                                                  "after the run"]
    if change == "link":
        assert (target / "elsewhere.jsonl").read_bytes() == kept      # the link's target is never written through
