"""
Tests for the comparability fingerprint (harness/run/hardware.py): what it measures on this machine, the differences in
words, and a tag resumed on "other hardware" (its recorded fingerprint edited in events.jsonl): refused with the
differences named, or, with --new-hardware, a new baseline measured there and every later row marked [hw2]; report.py
keeps the epochs apart; `try` the same; a tag from before fingerprints resumes. On the tiny target of
tests/agent_target.py (baseline val_bpb 1.108000; LR = 0.05 gives 1.008000).
"""

import json
import subprocess
import sys
from pathlib import Path

import git
import pytest

import agent
import report
from agent_target import STRICT
from helpers import LOWER_LR, RAISE_LR, events, page_data, rows, run_agent, sha
from llm_server import ScriptedLLM
from harness.run import hardware
from harness.tag.settings import THREADS


def test_measure_on_this_machine():
    found = hardware.measure(digest="abc")
    model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name"))
    assert found["cpu_model"] == " ".join(model.split()) and found["threads"] == THREADS
    said = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                          capture_output=True, text=True, timeout=120).stdout.split()    # what train.py's torch says
    assert [found["torch"], str(found["cuda"])] == said and found["frozen"] == "abc"
    if found["device"] == "cpu":                        # no NVIDIA GPU here: nothing of a GPU
        assert found["gpu"] is None and found["driver"] is None
    assert hardware.digest_of(found) == hardware.digest_of(dict(found, driver="550.1", python="3.0"))   # not compared
    assert hardware.digest_of(found) != hardware.digest_of(dict(found, torch="0.0.1"))
    assert hardware.differences(found, hardware.measure(digest="abc")) == []


def test_differences_in_words():
    old = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3, 79 GiB", "cpu_model": "AMD EPYC 9654", "threads": 8,
           "torch": "2.8.0", "cuda": "12.8", "frozen": "a" * 64, "driver": "550.54"}
    new = dict(old, gpu="NVIDIA A100-SXM4-40GB, 39 GiB", torch="2.9.1", threads=16, driver="560.1", frozen="b" * 64)
    assert hardware.differences(old, new) == ["GPU NVIDIA H100 80GB HBM3, 79 GiB -> NVIDIA A100-SXM4-40GB, 39 GiB",
                                              "torch 2.8.0 -> 2.9.1", f"frozen inputs {'a' * 12} -> {'b' * 12}"]
    cpu = dict(old, device="cpu", gpu=None)             # on a CPU the threads count; a field never recorded does not
    assert hardware.differences(cpu, dict(cpu, threads=2)) == ["threads 8 -> 2"]
    assert hardware.differences({"device": "cpu"}, dict(cpu, torch="0.1")) == []
    assert hardware.words(cpu) == "cpu: AMD EPYC 9654, 8 threads; torch 2.8.0"
    assert hardware.words(old) == "cuda: NVIDIA H100 80GB HBM3, 79 GiB; torch 2.8.0, CUDA 12.8"
    assert hardware.summary_mismatch(cpu, {"device": "cuda", "threads": "8"}, 8) == "device cuda, recorded cpu"
    assert hardware.summary_mismatch(cpu, {"device": "cpu", "threads": "3"}, 2) == "threads 3, given 2"
    assert hardware.summary_mismatch(cpu, {"val_bpb": "1.0"}, 2) is None     # a train.py that prints neither


def edit_fingerprint(target, **fields):
    """Make the tag's latest recorded fingerprint say other things, as if measured on another machine."""
    path = target / "events.jsonl"
    lines = path.read_text().splitlines()
    last = max(i for i, line in enumerate(lines) if json.loads(line)["event"] == "hardware")
    lines[last] = json.dumps({**json.loads(lines[last]), **fields})
    path.write_text("\n".join(lines) + "\n")


def test_resume_on_other_hardware_refused_then_new_hardware_rebaselines(target, capsys):
    with ScriptedLLM([RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    first = events(target, "hardware")
    assert len(first) == 1 and first[0]["epoch"] == 1 and first[0]["cpu_model"] == hardware.cpu_model()
    assert first[0]["digest"] == hardware.digest_of(first[0]) and first[0]["frozen"]     # the frozen inputs' digest
    assert [e["hardware_epoch"] for e in events(target, "experiment")] == [1, 1]
    edit_fingerprint(target, cpu_model="Other CPU", torch="0.0.1")
    before, ledger = rows(target), (target / "events.jsonl").read_bytes()
    capsys.readouterr()

    with ScriptedLLM([LOWER_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "2") == 2
    err = capsys.readouterr().err
    assert f"CPU Other CPU -> {hardware.cpu_model()}" in err and f"torch 0.0.1 -> {hardware.torch_versions()[0]}" in err
    assert "--new-hardware" in err and "Traceback" not in err
    assert rows(target) == before and (target / "events.jsonl").read_bytes() == ledger      # nothing changed

    kept = sha(target, "autoresearch/t")
    with ScriptedLLM([LOWER_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--new-hardware", "--baseline-runs", "2",
                         "--max-experiments", "3") == 0
    assert "continues on cpu: " in capsys.readouterr().out
    again, later = events(target, "experiment")[2:]
    assert (again["n"], again["status"], again["rebaseline"], again["hardware_epoch"]) == (2, "keep", True, 2)
    assert again["runs"] == [1.008, 1.008] and again["metric"] == 1.008 and again["base_metric"] is None
    assert (later["n"], later["status"], later["hardware_epoch"], later["base"]) == (3, "discard", 2,
                                                                                   again["full_commit"])
    repo = git.Repo(target)
    assert sha(target, "autoresearch/t") == again["full_commit"] != kept           # the new baseline is the best
    assert repo.commit(again["full_commit"]).parents[0].hexsha == kept
    assert repo.git.show(f"{kept}:train.py") == repo.git.show(f"{again['full_commit']}:train.py")
    assert [e["epoch"] for e in events(target, "hardware")] == [1, 2]
    assert all(e["proposer"] == "anthropic" for e in events(target, "config"))   # logged after it, whole
    assert rows(target)[2:] == [f"{again['commit']}\t1.008000\t0.0\tkeep\t[hw2] baseline on new hardware (2 runs)",
                                f"{later['commit']}\t1.208000\t0.0\tdiscard\t[hw2] lower LR"]

    assert report.main([str(target), "--png", str(target / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "baseline     1.008000" in out and "experiments  2 rows = baseline + 1: 0 keep, 1 discard, 0 crash" in out
    assert f"hardware 1   2 rows, best 1.008000 ({events(target, 'experiment')[1]['commit']}); not comparable: " \
           "measured on cpu: Other CPU" in out
    assert f"hardware 2   the figures above: measured on {hardware.words(hardware.measure())}" in out
    run = report.load_run(target)
    assert [(e.number, len(e.rows)) for e in report.epochs_of(run)] == [(1, 2), (2, 2)]
    page = page_data(target / "dashboard.html")             # the loop's page keeps them apart too
    assert page["epochs"] == 2 and [r["epoch"] for r in page["rows"]] == [1, 1, 2, 2]
    assert "baseline     1.008000" in page["summary"] and any(line.startswith("hardware 1 ") for line in page["lines"])
    assert page["baselines"] == {"1": page["rows"][0]["commit"], "2": again["commit"]}   # each row's band is its own
    assert [k["commit"] for k in page["kept"]] == [again["commit"]] and sorted(page["margins"]) == ["1", "2"]

    # --new-hardware on the same hardware: a note, nothing else (the limit is reached)
    with ScriptedLLM([]) as llm:
        assert run_agent(target, llm, "anthropic", "--new-hardware", "--max-experiments", "3") == 0
    assert "nothing to re-measure" in capsys.readouterr().out and len(events(target, "hardware")) == 2
    # `try` on other hardware again: refused, naming the command that re-measures
    edit_fingerprint(target, torch="0.0.2")
    (target / "train.py").write_text((target / "train.py").read_text().replace("DEPTH = 8", "DEPTH = 4"))
    assert agent.main(["try", "--tag", "t", "--target", str(target), *STRICT, "-m", "shallower"]) == 2
    err = capsys.readouterr().err
    assert "torch 0.0.2 -> " in err and "try --tag t --baseline --new-hardware" in err and len(rows(target)) == 4


def try_(target, *extra):
    return agent.main(["try", "--tag", "t", "--target", str(target), "--timeout", "20", *STRICT, *extra])


def test_try_new_hardware_and_a_run_that_says_another_device(target, capsys):
    assert try_(target, "--baseline") == 0
    edit_fingerprint(target, threads=THREADS + 7)
    (target / "train.py").write_text((target / "train.py").read_text().replace("LR = 0.04", "LR = 0.05"))
    assert try_(target, "-m", "raise LR") == 2
    assert f"threads {THREADS + 7} -> {THREADS}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:                                 # the flag goes with --baseline
        try_(target, "-m", "raise LR", "--new-hardware")
    assert exit_.value.code == 2
    assert "--baseline --new-hardware" in capsys.readouterr().err
    assert try_(target, "--baseline", "--new-hardware") == 0
    assert "baseline:     1.108000 (on this hardware, epoch 2)" in capsys.readouterr().out
    assert try_(target, "--baseline", "--new-hardware") == 2                 # measured: once per epoch
    assert "already has its baseline on this hardware" in capsys.readouterr().err
    # a train.py whose summary says it ran on another device than the fingerprint's: warned, recorded, judged
    path = target / "train.py"
    path.write_text(path.read_text().replace("LR = 0.04", "LR = 0.05").replace(
        'print("---")\n', 'print("---")\nprint("device:           cuda")\n'))
    assert try_(target, "-m", "raise LR") == 0
    assert "says device cuda, recorded cpu" in capsys.readouterr().out
    exps = events(target, "experiment")
    assert [(e["n"], e["status"], e["hardware_epoch"], e.get("rebaseline")) for e in exps] == [
        (0, "keep", 1, None), (1, "keep", 2, True), (2, "keep", 2, None)]
    assert exps[2]["hardware_mismatch"] == "device cuda, recorded cpu"
    assert [r.split("\t")[4] for r in rows(target)] == ["baseline", "[hw2] baseline on new hardware",
                                                        "[hw2] raise LR"]


def test_a_tag_from_before_fingerprints_resumes(target):
    with ScriptedLLM([RAISE_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "1") == 0
    path = target / "events.jsonl"                       # as an older agent.py wrote it: no fingerprint, no epochs
    old = [json.loads(line) for line in path.read_text().splitlines()]
    old = [{k: v for k, v in e.items() if k != "hardware_epoch"} for e in old if e["event"] != "hardware"]
    path.write_text("".join(json.dumps(e) + "\n" for e in old))
    with ScriptedLLM([LOWER_LR]) as llm:
        assert run_agent(target, llm, "anthropic", "--max-experiments", "2") == 0
    assert [e["epoch"] for e in events(target, "hardware")] == [1]
    assert all("n" in e for e in events(target, "run")) and all(e["proposer"] for e in events(target, "config"))
    assert [r.split("\t")[3:] for r in rows(target)] == [["keep", "baseline"], ["keep", "raise LR"],
                                                         ["discard", "lower LR"]]
