"""
Where a device's wall time goes (issue 40 part 2): a run's phases from its summary and the harness's clocks, the
pool's shares (the training share first), the probe after one run standing for the next run's probe before, and the
separate evaluator started with train.py (its start-up off the critical path).
"""

import os
import time

import pytest

from harness.run import conditions, phases, pool, runner
from harness.run.pool import Device, Pool
from harness.run.runner import Outcome


def test_a_run_splits_into_start_up_training_and_its_own_end_clipped_to_its_wall_time():
    """karpathy's run: 325.9 s of wall time, training_seconds 300.1, eval_seconds 14.2: start-up is the rest (11.6 s).
    A summary that claims more training than the process ran is clipped to its wall time; a run with no
    training_seconds (a crash, a cancel) is unsplit; the probes and the separate evaluation are as measured."""
    found = phases.split({"training_seconds": "300.1", "eval_seconds": "14.2"}, 325.9, 4.0, 6.5)
    assert found == pytest.approx({"probe": 4.0, "evaluation": 6.5, "start-up": 11.6, "training": 300.1, "end": 14.2})
    assert phases.split({"training_seconds": "1e9", "eval_seconds": "5"}, 80.0) == {
        "probe": 0.0, "evaluation": 0.0, "start-up": 0.0, "training": 80.0, "end": 0.0}
    assert phases.split({"training_seconds": "nan"}, 12.0, 1.0) == {"probe": 1.0, "evaluation": 0.0, "unsplit": 12.0}
    assert phases.split({"training_seconds": "60", "eval_seconds": "-3"}, 70.0)["start-up"] == 10.0
    assert phases.rounded({"training": 300.12345, "probe": 0.0, "harness": 1.0}) == {"training": 300.123,
                                                                                     "harness": 1.0}
    assert phases.words({"training": 0.912, "start-up": 0.04, "probe": 0.03, "idle": 0.015, "end": 0.003}) == \
        "training 91%; train.py's start-up 4%, speed probes 3%, idle 2%"


def test_the_pools_shares_add_up_to_its_wall_time():
    """One device for 100 s: two runs' phases (80 s of training), 90 s busy in all (the other 4 s of its busy time
    were the harness's), 10 s idle. The shares sum to 1 and the line says the training share first."""
    device = Device("default", {}, 2)
    p = Pool([device], 0)
    for training in (40.0, 40.0):
        p.ran(device, Outcome("c", 0.9, 0.0, 45.0, phases={"training": training, "start-up": 3.0, "probe": 0.0,
                                                           "evaluation": 0.0, "harness": 0.0}))
    device.busy_s = 90.0
    p.started = time.monotonic() - 100.0
    found = p.throughput(3)
    assert found.phases["training"] == pytest.approx(0.8, abs=0.01)
    assert found.phases["start-up"] == pytest.approx(0.06, abs=0.01)
    assert found.phases["harness"] == pytest.approx(0.04, abs=0.01)
    assert found.phases["idle"] == pytest.approx(0.10, abs=0.01)
    assert sum(found.phases.values()) == pytest.approx(1.0, abs=0.001)
    assert found.fields()["phases"]["training"] == pytest.approx(0.8, abs=0.01)
    assert "; wall time: training 80%; idle 10%, train.py's start-up 6%, the harness 4%" in found.line()
    assert ", training 80%, wait" in found.short()
    p.executor.shutdown()


def test_the_probe_after_a_run_stands_for_the_next_ones_before_only_on_one_device_and_once(monkeypatch):
    """A run's probe after serves the next run on the same device within SHARED_PROBE_S of when it was taken (not
    of the run's end: its evaluation can be long), once; never with two devices (the other's run changed the
    conditions), unsandboxed (a detached process can outlive its run into that probe), when that probe failed, or
    when it is older."""
    one = Device("default", {}, 2)
    p = Pool([one], 0)
    p.ran(one, Outcome("c", 0.9, 0.0, 1.0, probe_after=0.25, probe_after_at=time.monotonic()))
    assert p.shared_probe(one) == (0.25, "")
    assert p.shared_probe(one) is None                                   # used: the next run probes itself
    p.ran(one, Outcome("c", None, 0.0, 1.0, probe_after=None))          # a crash: no probe after
    assert p.shared_probe(one) is None
    p.ran(one, Outcome("c", 0.9, 0.0, 1.0, probe_after=0.25, probe_after_at=time.monotonic()))
    now = time.monotonic()
    monkeypatch.setattr(pool.time, "monotonic", lambda: now + pool.SHARED_PROBE_S + 1)
    assert p.shared_probe(one) is None                                   # too old
    monkeypatch.undo()
    taken = time.monotonic() - pool.SHARED_PROBE_S - 1                  # a long evaluation after the probe: too old
    p.ran(one, Outcome("c", 0.9, 0.0, 1.0, probe_after=0.25, probe_after_at=taken))
    assert p.shared_probe(one) is None
    p.ran(one, Outcome("c", 0.9, 0.0, 1.0, probe_after=0.25, probe_after_at=time.monotonic()))
    assert p.shared_probe(one, sandboxed=False) is None                 # a stray could have slowed it
    two = [Device("cpu:0", {}, 1), Device("cpu:1", {}, 1)]
    q = Pool(two, 0)
    q.ran(two[0], Outcome("c", 0.9, 0.0, 1.0, probe_after=0.25, probe_after_at=time.monotonic()))
    assert q.shared_probe(two[0]) is None
    for each in (p, q):
        each.executor.shutdown()


WARM_MARK = """import os, time
with open("warm.started", "a") as f:            # once per process that imports it
    f.write(f"{time.time()} {os.getpid()}\\n")
"""
WARM_PREPARE = """import os, sys, time
import warmmark                                 # imported by the warm evaluator while train.py still trains
if __name__ == "__main__" and sys.argv[1:] == ["--probe"]:     # the n-th probe prints n / 100 s
    with open("probe.ran", "a") as f:
        f.write(f"{time.time()} {os.getpid()}\\n")
    print(f"probe_s: {len(open('probe.ran').readlines()) / 100}")
elif __name__ == "__main__":
    assert sys.argv[1] == "--evaluate" and os.path.basename(__file__) == "prepare.py", sys.argv
    print(f"evaluated by {os.getpid()}")
    print("---\\nval_bpb: " + open(sys.argv[2]).read())
"""


def warm_run(tmp_path, train, prepare=WARM_PREPARE, probe=False, **modules):
    """runner.run of `train` (train.py's text) with a warm evaluator (no sandbox: warm_wrap is the identity) whose
    prepare.py (default: it prints the artifact's text as val_bpb) and modules ({name: text}, beside it) are given;
    its time limit, 2 s, is shorter than the training. probe: with a warm speed probe (conditions.Probe, warm) from
    the same prepare.py. Returns (the Outcome, the log's text, [(time, pid)] of each import of warmmark)."""
    frozen, run_dir = tmp_path / "frozen", tmp_path / "run"
    frozen.mkdir()
    run_dir.mkdir()
    (frozen / "warmmark.py").write_text(WARM_MARK)
    (frozen / "prepare.py").write_text(prepare)
    for name, text in modules.items():
        (frozen / f"{name}.py").write_text(text)
    (run_dir / "train.py").write_text(train)
    made = []
    evaluation = runner.Evaluation(prepare_dir=frozen, artifact=run_dir / "model.json", timeout=2.0,
                                   setup=lambda: made.append(time.time()), warm_wrap=lambda argv: argv)
    spec = runner.RunSpec(commit="c0ffee", cwd=run_dir, log=tmp_path / "run.log", metric="val_bpb", timeout=60,
                          evaluation=evaluation, probe=conditions.Probe(
                              runner.interpreter(), frozen, lambda argv: argv, dict(os.environ), warm=True)
                          if probe else None)
    outcome = runner.run(spec)
    assert len(made) == 1                               # the pristine copy, made once, before the evaluator started
    marks = [(float(t), int(pid)) for t, pid in (line.split() for line in
                                                  (frozen / "warm.started").read_text().splitlines())] \
        if (frozen / "warm.started").exists() else []
    return outcome, spec.log.read_text(), marks


def test_the_evaluator_starts_with_train_py_and_scores_the_artifact_once_training_ends(tmp_path):
    """The evaluator's start-up (its imports) overlaps the training, not the critical path: it imported prepare.py's
    modules before train.py wrote the artifact, scored it in that same process, its output after the log's marker;
    its time limit counts from the artifact (2 s, training 2.5 s), and it is gone afterwards."""
    outcome, log, marks = warm_run(tmp_path, "import time\ntime.sleep(2.5)\nt = time.time()\n"
                                             "open('model.json', 'w').write('0.75')\nopen('end', 'w').write(str(t))\n")
    assert outcome.kind is runner.Kind.OK and outcome.metric == 0.75, (outcome.reason, log)
    [(started, pid)] = marks
    assert started < float((tmp_path / "run" / "end").read_text()) - 1.0   # well before the artifact existed
    section = log.split("=== separate evaluation")[1]
    assert f"evaluated by {pid}" in section and "val_bpb: 0.75" in section and "val_bpb" not in log.split("===")[0]
    assert outcome.eval_seconds < 2.0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_probe_after_a_run_starts_with_it_and_is_taken_once_training_ends(tmp_path):
    """The speed probe after a run (sandboxed: Probe.warm) does its imports while train.py trains and measures when
    it ends: the probe before ran cold (0.01 s, the first), the one after in a process that had imported prepare.py's
    modules well before the training's end (0.02 s, the second); both its processes are gone afterwards."""
    outcome, log, marks = warm_run(tmp_path, "import time\ntime.sleep(2.5)\nt = time.time()\n"
                                             "open('model.json', 'w').write('0.75')\nopen('end', 'w').write(str(t))\n",
                                   probe=True)
    assert outcome.kind is runner.Kind.OK and outcome.metric == 0.75, (outcome.reason, log)
    assert outcome.probe_after == 0.02 and outcome.probe_s == 0.015 and outcome.probe_problem == ""
    ran = [(float(t), int(pid)) for t, pid in (line.split() for line in
                                               (tmp_path / "frozen" / "probe.ran").read_text().splitlines())]
    end = float((tmp_path / "run" / "end").read_text())
    assert len(marks) == 3 and ran[0][0] < end - 2.0                      # before: cold, before the training
    [warm_import] = [t for t, pid in marks if pid == ran[1][1]]
    assert warm_import < end - 1.0 < end < ran[1][0]                     # imported while training, taken after
    for _, pid in marks:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


FAILING_PROBE = """    if len(open('probe.ran').readlines()) == 2:     # the probe after fails
        print("boom on stderr", file=sys.stderr, flush=True)
        print("a later stdout line")
        sys.exit(3)
"""


def test_a_warm_probe_that_fails_says_why_as_a_cold_one_does(tmp_path):
    """A hostile review: the warm probe's output merged stderr into stdout, so a failing probe was reported by its
    last stdout line; the reason is stderr's last line, as for a cold probe (the probe before, here, succeeds)."""
    line = "    print(f\"probe_s: {len(open('probe.ran').readlines()) / 100}\")\n"
    assert line in WARM_PREPARE
    outcome, log, _ = warm_run(tmp_path, "open('model.json', 'w').write('0.5')\n",
                               WARM_PREPARE.replace(line, FAILING_PROBE + line), probe=True)
    assert outcome.kind is runner.Kind.OK and outcome.metric == 0.5, (outcome.reason, log)
    assert outcome.probe_after is None and outcome.probe_s == 0.01
    assert outcome.probe_problem == "`prepare.py --probe` exited 3: boom on stderr"


WAIT_FOR_WARM = "import os, sys, time\nwhile not os.path.exists('../frozen/warm.started'):\n    time.sleep(0.05)\n"


@pytest.mark.parametrize("end", ["sys.exit(3)\n", "print('no artifact')\n"])
def test_a_run_that_leaves_nothing_to_score_kills_its_waiting_evaluator(tmp_path, end):
    """train.py crashed, or wrote no artifact, once the evaluator and the probe after started with it were waiting:
    the evaluator is killed, never told anything, and nothing of it is in the log; so is the probe after a crash
    (a crash is judged without it); after a run with no artifact the probe is taken."""
    outcome, log, marks = warm_run(tmp_path, WAIT_FOR_WARM.replace("warm.started')", "warm.started') or len(open("
                                                                   "'../frozen/warm.started').readlines()) < 3")
                                   + end, probe=True)
    assert outcome.kind is runner.Kind.CRASH and outcome.metric is None, outcome.reason
    assert "separate evaluation" not in log and "evaluated by" not in log
    assert len(marks) == 3
    probes = (tmp_path / "frozen" / "probe.ran").read_text().splitlines()
    assert len(probes) == (1 if "exit" in end else 2)
    for _, pid in marks:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


ORDERED_PREPARE = """\"\"\"A target whose imports read sys.argv and an environment variable its own code sets.\"\"\"
import os, sys
import argmod                                   # a leading import: imported warm, with the evaluator's argv
os.environ["EVAL_MODE"] = "scoring"
import envmod                                   # after a statement: left to prepare.py, so it sees EVAL_MODE
if __name__ == "__main__":
    print(f"argv at import {argmod.ARGV}, mode at import {envmod.MODE}")
    print("---\\nval_bpb: " + open(sys.argv[2]).read())
"""


def test_prepare_pys_imports_see_what_they_would_see_in_a_cold_start(tmp_path):
    """A hostile review's robustness findings: an import that parses sys.argv saw the warm program's argv (and its
    SystemExit was not caught), and a module imported after prepare.py sets a variable was imported before it.
    The warm evaluator imports only the leading imports, with the argv of `prepare.py --evaluate ARTIFACT`."""
    outcome, log, _ = warm_run(
        tmp_path, "import time\ntime.sleep(2.5)\nopen('model.json', 'w').write('0.5')\n", ORDERED_PREPARE,
        argmod="import argparse, sys\np = argparse.ArgumentParser()\np.add_argument('--evaluate')\n"
               "ARGV = p.parse_args().evaluate.rsplit('/', 1)[1]\n",
        envmod="import os\nMODE = os.environ.get('EVAL_MODE', 'unset')\n")
    assert outcome.kind is runner.Kind.OK and outcome.metric == 0.5, (outcome.reason, log)
    assert "argv at import model.json, mode at import scoring" in log.split("=== separate evaluation")[1]


def test_a_warm_probe_that_cannot_start_leaves_the_probe_cold_and_the_run_whole(tmp_path, monkeypatch):
    """A hostile review: an OSError starting the warm probe escaped the run as a traceback. Now the probe after runs
    cold, as it did before warm probes, and the run is scored."""
    def refuse(*args, **kwargs):
        raise OSError("no process for the probe")
    monkeypatch.setattr(conditions.Probe, "start", refuse)
    outcome, log, marks = warm_run(tmp_path, "open('model.json', 'w').write('0.5')\n", probe=True)
    assert outcome.kind is runner.Kind.OK and outcome.metric == 0.5, (outcome.reason, log)
    assert outcome.probe_after == 0.02 and outcome.probe_problem == ""    # the second probe, cold
    assert len(marks) == 3                               # the probe before, the evaluator, the cold probe after
