"""
Where a device's wall time goes (issue 40 part 2): a run's phases from its summary and the harness's clocks, the
pool's shares (the training share first), and the probe after one run standing for the next run's probe before.
"""

import time

import pytest

from harness.run import phases, pool
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
