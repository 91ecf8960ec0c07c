"""
The memory the harness records is measured by the harness (harness/run/usage.py), never what train.py prints: real
processes run through runner.run (the legacy path, evaluation=None, and the separate evaluation), their resident
memory read from /proc and the kernel's rusage; NVML where there is a driver, quietly absent where there is none.
"""

import os
import resource
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from harness.run import processes, runner, usage

HOLD = """
import time
def hold(mb, seconds):                      # mb MB resident (every page written) for seconds
    block = bytearray(mb * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(seconds)
    return block
"""


def run_train(tmp_path, code, evaluation=None):
    """runner.run of a train.py holding `code` (after HOLD) in tmp_path; returns the Outcome."""
    (tmp_path / "train.py").write_text(HOLD + textwrap.dedent(code))
    spec = runner.RunSpec(commit="c0ffee", cwd=tmp_path, log=tmp_path / "run.log", metric="val_bpb", timeout=60,
                          evaluation=evaluation)
    outcome = runner.run(spec)
    assert outcome.reason == "" and outcome.metric == 1.0, (outcome.reason, (tmp_path / "run.log").read_text())
    return outcome


def test_memory_is_measured_when_the_summary_says_zero(tmp_path):
    outcome = run_train(tmp_path, """
        keep = hold(200, 2.0)
        print("---\\nval_bpb: 1.0\\npeak_vram_mb: 0.0")
    """)
    print("200 MB, reported 0:", outcome.memory_gb)
    assert 0.15 <= outcome.memory_gb <= 1.0 and outcome.memory_source == "rss"
    assert outcome.reported_memory_gb == 0.0


def test_a_claimed_memory_is_not_recorded(tmp_path):
    outcome = run_train(tmp_path, 'print("---\\nval_bpb: 1.0\\npeak_vram_mb: 99999")')
    print("nothing, reported 99999 MB:", outcome.memory_gb)
    assert outcome.memory_gb < 0.15 and abs(outcome.reported_memory_gb - 99999 / 1024) < 1e-9


def test_the_whole_process_tree_is_summed(tmp_path):
    outcome = run_train(tmp_path, f"""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", {HOLD + "hold(150, 2.5)"!r}])
        keep = hold(100, 2.5)
        child.wait()
        print("---\\nval_bpb: 1.0\\npeak_vram_mb: 0.0")
    """)
    print("tree of 100 + 150 MB:", outcome.memory_gb)
    assert 0.23 <= outcome.memory_gb <= 1.0


def test_a_child_between_samples_counts_through_the_rusage(tmp_path):
    """A child that allocates and exits before any sample sees it: the leader waited for it, so the leader's
    ru_maxrss (os.wait4 when the harness reaps it) holds its peak. The kernel counts the harness's own memory in it
    too, so it counts where it is above the harness's peak: the child allocates more than that."""
    mb = max(300, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 + 200)
    outcome = run_train(tmp_path, f"""
        import subprocess, sys
        subprocess.run([sys.executable, "-c", {HOLD + f"hold({mb}, 0.05)"!r}], check=True)
        print("---\\nval_bpb: 1.0\\npeak_vram_mb: 0.0")
    """)
    print(f"a {mb} MB child gone before a sample:", outcome.memory_gb)
    assert mb / 1024 <= outcome.memory_gb <= mb / 1024 + 0.5


def test_a_detached_process_of_the_run_counts(tmp_path):
    """A process the run detaches (double fork + setsid: out of the tree, re-parented to the harness as subreaper)
    still carries the run's token, and is counted."""
    if not processes.become_subreaper():
        pytest.skip("no subreaper here")
    outcome = run_train(tmp_path, """
        import os
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                hold(250, 2.5)
                open("done", "w").close()
                os._exit(0)
            os._exit(0)
        os.wait()
        while not os.path.exists("done"):
            time.sleep(0.05)
        print("---\\nval_bpb: 1.0\\npeak_vram_mb: 0.0")
    """)
    print("a detached 250 MB process:", outcome.memory_gb)
    assert 0.2 <= outcome.memory_gb <= 1.0


def test_the_separate_evaluation_is_not_counted(tmp_path):
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    (frozen / "prepare.py").write_text(HOLD + 'keep = hold(300, 1.5)\nprint("---\\nval_bpb: 1.0")\n')
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    evaluation = runner.Evaluation(prepare_dir=frozen, artifact=run_dir / "model.json")
    outcome = run_train(run_dir, 'open("model.json", "w").write("{}")\nprint("---\\nval_bpb: 1.0")', evaluation)
    print("train.py small, its evaluator 300 MB:", outcome.memory_gb)
    assert outcome.memory_gb < 0.15 and outcome.eval_seconds >= 1.5


def test_an_evaluation_past_its_own_limit_is_a_timeout_not_a_crash(tmp_path):
    """The separate evaluation has a time limit of its own (Evaluation.timeout, sized by evaluation): past it the
    evaluator's process group is killed and the run is a timeout (no fix is asked for), its reason saying so."""
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    (frozen / "prepare.py").write_text('import time\ntime.sleep(60)\nprint("---\\nval_bpb: 1.0")\n')
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "train.py").write_text('open("model.json", "w").write("{}")\nprint("---\\nval_bpb: 1.0")\n')
    spec = runner.RunSpec(commit="c0ffee", cwd=run_dir, log=tmp_path / "run.log", metric="val_bpb", timeout=60,
                          evaluation=runner.Evaluation(prepare_dir=frozen, artifact=run_dir / "model.json", timeout=2.0))
    outcome = runner.run(spec)
    assert outcome.kind is runner.Kind.TIMEOUT and not outcome.kind.fixable and outcome.metric is None
    assert outcome.reason == ("evaluation timeout after 2s: the frozen evaluator did not finish scoring the model "
                              "in time")
    assert 2.0 <= outcome.eval_seconds < 10


def test_sampling_never_raises_and_sees_this_process():
    peak = usage.Peak()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    peak.sample(dead.pid)                   # gone: nothing added, nothing raised
    peak.sample(10 ** 9)
    assert (peak.rss, peak.samples) == (0, 0)
    t0 = time.perf_counter()
    for _ in range(20):
        peak.sample(os.getpid())
    per_sample = (time.perf_counter() - t0) / 20
    own = int(next(line for line in Path("/proc/self/status").read_text().splitlines()
                   if line.startswith("VmHWM:")).split()[1]) * 1024
    print(f"one sample: {per_sample * 1000:.2f} ms")
    assert peak.samples == 20 and peak.process_hwm >= 0.5 * own and 0 < peak.tree_rss   # its cost: a print, no target


def test_without_nvml_the_gpu_part_is_absent_quietly(capfd):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        peak = usage.Peak()
        peak.sample(os.getpid())
        peak.sample(os.getpid())
        devices = usage.gpu_devices()
    if devices:                             # a machine with a driver: measured, maybe 0 for this process
        assert peak.gpu is not None and usage.gpu_memory([os.getpid()]) >= 0
    else:
        assert peak.gpu is None and usage.gpu_memory([os.getpid()]) is None and peak.source == "rss"
        assert capfd.readouterr() == ("", "")
