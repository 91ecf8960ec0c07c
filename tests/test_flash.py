"""Flash Attention 3 pinned for a tag and found offline in the sandbox (harness.run.flash), without a GPU: a fake
kernel repository in a Hugging Face cache of its own, in the kernels library's layout, loaded by the real library."""

import json
import os
import shutil
import subprocess

import git
from huggingface_hub import constants as hub_constants
import pytest

from harness.run import flash, hardware, sandbox
from harness.schema import Event
from harness.tag import opening, settings
from tests.helpers import events

A, B = "a" * 40, "b" * 40
KERNEL = '''
import torch.nn.functional as F
{extra}
def flash_attn_func(q, k, v, causal=True, window_size=(-1, 0)):
    t = [x.transpose(1, 2) for x in (q, k, v)]
    return F.scaled_dot_product_attention(*t, is_causal=causal).transpose(1, 2)
'''


def fake_kernel(cache, commit, v1=True, extra=""):
    """REPO at `commit` in the cache, as kernels.install_kernel leaves it: one universal build variant; v1: the
    version ref points at it. Returns the repo's cache folder."""
    folder = cache / "kernels--kernels-community--flash-attn3"
    build = folder / "snapshots" / commit / "build" / "torch-universal"
    (build / "flash_attn3").mkdir(parents=True)
    (build / "flash_attn3" / "__init__.py").write_text(KERNEL.format(extra=extra))
    (build / "metadata.json").write_text(json.dumps({"name": "flash-attn3", "id": f"flash_attn3_{commit[:7]}",
                                                     "version": 1, "license": "bsd-3-clause", "python-depends": [],
                                                     "backend": {"type": "cuda"}}))
    if v1:
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "v1").write_text(commit)
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache of this test's own, offline (as a machine without network after HF_HUB_OFFLINE)."""
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("KERNELS_CACHE", raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    return root


def sandboxed(tmp_path, kernels=None):
    """check's run through a real sandbox's train.py view (bubblewrap, as root), showing `kernels` (default: the
    folder fetch found) and nothing else of the cache."""
    box = sandbox.Tagged(lambda: None, [])
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)

    def run(argv, env, folder):
        box.kernels = [folder] if kernels is None else kernels
        return subprocess.run(box.train(argv, run_dir, ""), capture_output=True, text=True, cwd=run_dir,
                              env={**os.environ, **box.env, **env}, timeout=300)
    return run


def test_the_kernel_is_pinned_fetched_from_the_cache_and_found_offline_in_the_sandbox(cache, tmp_path):
    if sandbox.probe() is not None:
        pytest.skip(f"no sandbox here: {sandbox.probe()}")
    folder = fake_kernel(cache, A)
    assert flash.fetch() == (f"{flash.REPO}@{A}", folder)                 # v1 resolved to its commit
    fake_kernel(cache, B, v1=False)
    (folder / "refs" / "v1").write_text(B)                                # the version moved on: the pin holds
    assert flash.fetch(f"{flash.REPO}@{A}") == (f"{flash.REPO}@{A}", folder)
    assert flash.ready(None, sandboxed(tmp_path)) == (f"{flash.REPO}@{B}", folder, None)
    assert flash.ready(f"{flash.REPO}@{A}", sandboxed(tmp_path)) == (f"{flash.REPO}@{A}", folder, None)
    # the view shows the kernel's folder and nothing else of the cache: without it the loader finds nothing
    attention, shown, line = flash.ready(f"{flash.REPO}@{A}", sandboxed(tmp_path, kernels=[]))
    assert (attention, shown) == (flash.SDPA, None)
    assert line.startswith(f"attention: SDPA for every run ({flash.REPO}@{A} does not load in a run's view: ")
    assert "LocalEntryNotFoundError: Cannot find an appropriate cached snapshot folder" in line and "run once where the Hugging Face hub can be reached" in line
    assert flash.run_env(f"{flash.REPO}@{A}") == {flash.ENV: f"{flash.REPO}@{A}"}
    assert flash.run_env(flash.SDPA) == {flash.ENV: ""} and flash.run_env(None) == {}


def test_a_missing_or_broken_kernel_is_sdpa_with_one_line_naming_why(cache, tmp_path):
    attention, folder, line = flash.ready(None, lambda argv, env, f: flash.plain_run(argv, env, f))
    assert (attention, folder) == ("sdpa", None)
    assert line.startswith(f"attention: SDPA for every run ({flash.REPO}@v1 is not in the Hugging Face cache and "
                           "HF_HUB_OFFLINE is set (ValueError: Version 1 of 'kernels-community/flash-attn3' is not "
                           "available in the local cache")
    assert line.endswith("For Flash Attention 3, run once where the Hugging Face hub can be reached (HF_HUB_OFFLINE "
                         "unset), or copy its cache folder here")
    fake_kernel(cache, A, extra="raise ImportError('built for another torch')")
    attention, folder, line = flash.ready(None, lambda argv, env, f: flash.plain_run(argv, env, f))
    assert (attention, folder) == ("sdpa", None)
    assert f"({flash.REPO}@{A} does not load in a run's view: ImportError: built for another torch)" in line


def test_the_fingerprint_names_the_kernel_and_a_run_that_did_not_use_it():
    old = {"device": "cuda", "gpu": "H100", "attention": f"{flash.REPO}@{A}"}
    assert hardware.differences(old, {**old, "attention": "sdpa"}) == [f"attention {flash.REPO}@{A} -> sdpa"]
    assert hardware.differences(old, {**old, "attention": f"{flash.REPO}@{B}"}) == \
        [f"attention {flash.REPO}@{A} -> {flash.REPO}@{B}"]
    before = {k: v for k, v in old.items() if k != "attention"}           # a tag from before the kernel was pinned
    assert hardware.differences(before, old) == []
    assert hardware.words({**old, "torch": "2.9.1"}) == f"cuda: H100; torch 2.9.1; attention {flash.REPO}@{A}"
    assert hardware.summary_mismatch(old, {"attention": "sdpa", "device": "cuda"}, None) == \
        f"attention sdpa, pinned {flash.REPO}@{A}"
    assert hardware.summary_mismatch(old, {"attention": "fa3", "device": "cuda"}, None) is None
    assert hardware.summary_mismatch({**old, "attention": "sdpa"}, {"attention": "sdpa"}, None) is None


def open_tag(target, tag, box="off"):
    s, _ = opening.open_session(settings.parse(["--tag", tag, "--proposer", "random", "--target", str(target),
                                                "--sandbox", box]))
    s.log(Event.CONFIG)                      # the deferred start and hardware events are written with the first one
    return s


def test_the_tag_records_its_pin_and_a_resume_keeps_it_or_names_the_change(target, cache, monkeypatch, capsys):
    s = open_tag(target, "t")
    assert s.hardware["device"] == "cpu" and s.hardware["attention"] is None       # on a CPU nothing is fetched
    assert "attention:" not in capsys.readouterr().out
    (target / "train.py").write_text((target / "train.py").read_text() + f"\nimport os\nos.environ.get('{flash.ENV}')\n")
    git.Repo(target).git.commit("-qam", "read the pin")
    real = hardware.measure
    monkeypatch.setattr(hardware, "measure", lambda *a, **k: {**real(*a, **k), "device": "cuda", "gpu": "H100"})
    fake_kernel(cache, A)
    s = open_tag(target, "u", "auto")                  # checked in the sandbox's view, which then shows it to runs
    assert s.hardware["attention"] == f"{flash.REPO}@{A}"
    assert s.sandbox is None or s.sandbox.kernels == [cache / "kernels--kernels-community--flash-attn3"]
    assert f"attention: Flash Attention 3, {flash.REPO}@{A} (pinned for tag u" in capsys.readouterr().out
    assert events(target, "hardware")[-1]["attention"] == f"{flash.REPO}@{A}"
    fake_kernel(cache, B, v1=False)
    (cache / "kernels--kernels-community--flash-attn3" / "refs" / "v1").write_text(B)
    assert open_tag(target, "u").hardware["attention"] == f"{flash.REPO}@{A}"
    capsys.readouterr()
    # the pinned commit gone from the cache, offline: SDPA, said once (a change of fingerprint: hardware.differences)
    shutil.rmtree(cache / "kernels--kernels-community--flash-attn3" / "snapshots" / A)
    assert open_tag(target, "u").hardware["attention"] == "sdpa"
    assert f"attention: SDPA for every run ({flash.REPO}@{A} is not in the Hugging Face cache" in capsys.readouterr().out
