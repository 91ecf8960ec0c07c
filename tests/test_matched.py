"""The compute-matched budget (--budget-like, harness.run.matched): the arithmetic from datasheet peaks, a measured
matmul where there is none, the refusals, and a tag that records it, labels its rows and keeps it on a resume."""

import sys

import pytest

from harness import ledger
from harness.run import hardware, matched, target
from harness.tag import settings
from tests.helpers import REPO, events, rows, run_agent

RTX = {"device": "cuda", "gpu": "NVIDIA GeForce RTX 4090, 24 GiB"}


def test_the_budget_scales_by_datasheet_peaks_or_a_measured_matmul():
    assert matched.scaled(300, "h100", RTX, measured=None) == (
        1799.0, "300 s on an H100 = 1,799 s here (NVIDIA GeForce RTX 4090, 24 GiB: 165 TFLOP/s datasheet bf16, "
                "against 989.5)")                                          # 300 x 989.5 / 165 = 1799.1
    pcie = {"device": "cuda", "gpu": "NVIDIA H100 PCIe, 80 GiB"}
    assert matched.scaled(300, "h100", pcie, None)[0] == 393.0            # 300 x 989.5 / 756 = 392.7
    assert matched.scaled(300, "b200", RTX, None)[1].startswith("300 s on a B200 = 4,091 s here")
    mps = {"device": "mps", "gpu": None}
    assert matched.scaled(300, "a100", mps, lambda: 20e12) == (
        4680.0, "300 s on an A100 = 4,680 s here (mps: 20 TFLOP/s measured matmul, against 312)")
    with pytest.raises(matched.Unmeasurable, match=r"^300 s on an H100 = 2,968,500 s here \(cpu: 0\.1 TFLOP/s "
                                                   r"measured matmul, against 989\.5\): over 86,400 s per run"):
        matched.scaled(300, "h100", {"device": "cpu"}, lambda: 1e11)
    with pytest.raises(matched.Unmeasurable, match="Ray"):
        matched.scaled(300, "h100", {"device": "ray"}, lambda: 1e12)


def test_the_datasheet_is_train_pys_table():
    """The harness's peaks are the ones train.py computes MFU with (train.py stays standalone, so it keeps its own
    copy; main's copy must not drift from the harness's)."""
    assert target.read_literals(REPO / "train.py")["GPU_PEAK_FLOPS"] == matched.DATASHEET


def test_the_matmul_is_measured_on_this_cpu_and_a_failed_measurement_is_refused():
    flops = matched.measure("cpu", sys.executable, {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert 1e8 < flops < 1e13                                             # one core: a GFLOP/s to a TFLOP/s
    with pytest.raises(matched.Unmeasurable, match=r"^the matmul measurement on cpu failed \(IndexError\)$"):
        matched.measure("cpu", "/bin/true", {})


def test_an_unknown_reference_is_exit_2_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as done:
        settings.parse(["--tag", "t", "--budget-like", "tpu"])
    assert done.value.code == 2
    assert "argument --budget-like: invalid choice: 'tpu' (choose from 'a100', 'a10g', 'b200', 'h100', 'h200', " \
           "'l4', 'l40s', 'rtx3090', 'rtx4090')" in capsys.readouterr().err


def test_a_tag_records_the_matched_budget_labels_its_rows_and_keeps_it(target, monkeypatch, capsys):
    real = hardware.measure
    h100 = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3, 79 GiB"}
    monkeypatch.setattr(hardware, "measure", lambda *a, **k: {**real(*a, **k), **h100})
    # 3 s on an A100 is 3 x 312 / 989.5 = 0.95 s on an H100: a 1 s budget
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "1",
                     "--budget-like", "a100") == 0
    out = capsys.readouterr().out
    assert "budget: 3 s on an A100 = 1 s here (NVIDIA H100 80GB HBM3, 79 GiB: 989.5 TFLOP/s datasheet bf16, " \
           "against 312)" in out
    assert len(rows(target)) == 2 and all(r.split("\t")[4].startswith("[like a100 3s: 1s] ") for r in rows(target))
    assert rows(target)[0].endswith("\tkeep\t[like a100 3s: 1s] baseline")
    first = events(target, "experiment")[0]
    assert (first["budget_s"], first["budget_like"], first["smoke"]) == (1.0, {"name": "a100", "base_s": 3.0}, False)
    assert ledger.results_row(first).endswith("\tkeep\t[like a100 3s: 1s] baseline")
    assert ledger.epoch_of_row("[like a100 3s: 1s] [hw2] x") == 2
    monkeypatch.setattr(matched, "scaled", None)                          # a resume is never measured again
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "2",
                     "--budget-like", "a100") == 0                       # recorded: not measured again
    assert "budget: 3 s on an A100 = 1 s here (recorded by tag t)" in capsys.readouterr().out
    assert run_agent(target, None, "random", "--proposer", "random", "--max-experiments", "3") == 2
    assert "was measured with a 1 s budget and this run has 3 s: its numbers would not be comparable. Use the " \
           "same budget (--budget-like a100) to resume it" in capsys.readouterr().err
    monkeypatch.setenv("AUTORESEARCH_TIME_BUDGET", "2")
    assert run_agent(target, None, "random", "--proposer", "random", "--budget-like", "a100") == 2
    assert "--budget-like scales the profile's budget; AUTORESEARCH_TIME_BUDGET sets another one" in \
        capsys.readouterr().err
