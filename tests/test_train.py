"""Tests of train.py (the mutable side): attention fallback, model causality, a real short run."""

import math
import shutil

import pytest
import torch

import prepare as P

from helpers import REPO, parse_summary, run_train

# every test executes train.py's definitions or runs it: its device setup alone measures the CPU's matmul speed
# (seconds of emulated bf16), and the runs need the corpora prepared with the CPU profile
pytestmark = pytest.mark.slow

SUMMARY_KEYS = ["val_bpb", "training_seconds", "total_seconds", "peak_vram_mb", "mfu_percent",
                "total_tokens_M", "num_steps", "num_params_M", "depth"]  # karpathy's keys, in his order


@pytest.fixture(scope="module")
def T(train_defs):
    return train_defs


def reference_attention(q, k, v, window):
    """softmax(q k^T / sqrt(d) + mask) v written out: key j is visible to query i iff i - window <= j <= i."""
    B, S, H, D = q.shape
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(D)
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    scores = scores.masked_fill(~((j <= i) & (j >= i - window)), float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v)


@pytest.mark.parametrize("window", [31, 100, 8, 1, 0])
def test_sdpa_sliding_window_matches_reference(T, window):
    g = torch.Generator().manual_seed(window)
    q, k, v = (torch.randn(2, 32, 3, 16, generator=g) for _ in range(3))
    got = T["sdpa_attention"](q, k, v, window)
    assert got.shape == (2, 32, 3, 16)
    torch.testing.assert_close(got, reference_attention(q, k, v, window), atol=1e-5, rtol=1e-5)


def test_windows_follow_the_pattern_and_end_long(T):
    cfg = T["GPTConfig"](sequence_len=64, vocab_size=100, n_layer=5, n_head=2, n_embd=32, window_pattern="SSL")
    assert T["GPT"].compute_windows(cfg) == [32, 32, 64, 32, 64]
    with pytest.raises(ValueError, match="WINDOW_PATTERN"):
        T["GPT"].compute_windows(T["GPTConfig"](64, 100, 2, 2, 32, "SX"))


def test_gpt_is_causal_and_returns_vocab_logits(T):
    torch.manual_seed(0)
    cfg = T["GPTConfig"](sequence_len=48, vocab_size=97, n_layer=3, n_head=2, n_embd=32, window_pattern="SL")
    model = T["GPT"](cfg)
    model.init_weights()
    # init leaves the projections at zero; perturb so the attention path really mixes positions
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x = torch.randint(0, 97, (4, 48))
    logits = model(x)
    assert logits.shape == (4, 48, 97) and logits.dtype == torch.float32
    assert logits.abs().max() < 15.0  # softcap
    P.check_causality(model, x, 97)
    loss = model(x, x)
    assert loss.ndim == 0 and math.isfinite(loss.item())


def test_init_weights_sets_every_parameter(T):
    """train.py builds the model on the meta device: init_weights must set every parameter and buffer itself."""
    cfg = T["GPTConfig"](sequence_len=32, vocab_size=50, n_layer=3, n_head=2, n_embd=32, window_pattern="L")
    with torch.device("meta"):
        model = T["GPT"](cfg)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            t.fill_(float("nan"))  # what uninitialised memory may hold
    model.init_weights()
    assert all(torch.isfinite(t).all() for t in [*model.parameters(), *model.buffers()])
    assert (model.resid_lambdas == 1.0).all() and (model.x0_lambdas == 0.1).all()
    assert model.cos.shape == (1, 32, 1, 8) and model.cos[0, 0, 0, 0] == 1.0
    loss = model(torch.randint(0, 50, (2, 32)), torch.randint(0, 50, (2, 32)))
    assert abs(loss.item() - math.log(50)) < 0.1  # starts near the uniform loss, and finite


def test_export_traces_sdpa_where_fa3_runs_eagerly(T):
    """On CUDA train.py calls the FA3 hub kernel; the exported program must not contain it."""
    class FakeFA3:
        @staticmethod
        def flash_attn_func(*args, **kwargs):
            raise RuntimeError("the FA3 kernel ran")
    cfg = T["GPTConfig"](sequence_len=16, vocab_size=50, n_layer=2, n_head=2, n_embd=32, window_pattern="SL")
    model = T["GPT"](cfg)
    model.init_weights()
    x = torch.randint(0, 50, (2, 16))
    expected = model(x)
    T["fa3"] = FakeFA3
    try:
        with pytest.raises(RuntimeError, match="the FA3 kernel ran"):
            model(x)
        program = torch.export.export(model, (x,))
    finally:
        T["fa3"] = None
    torch.testing.assert_close(program.module()(x), expected)


def test_muon_orthogonalizes(T):
    G = torch.randn(2, 64, 32, generator=torch.Generator().manual_seed(0))
    X = T["orthogonalize"](G).float()
    s = torch.linalg.svdvals(X)
    assert X.shape == G.shape
    assert s.min() > 0.5 and s.max() < 1.5  # singular values pushed towards 1 (the quintic is not exact)


def test_short_cpu_run_prints_a_parsable_summary(cpu_cache, gpt_run):
    result = gpt_run[0]                           # budget 4, AUTORESEARCH_SEED 7 (conftest.py)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = parse_summary(result.stdout)
    assert summary["seed"] == "7"                 # the harness's seed: init and data order
    assert list(summary)[:len(SUMMARY_KEYS)] == SUMMARY_KEYS
    # even a few steps must beat the model that knows nothing (equal logits for every token)
    prepared = P.load_prepared(cpu_cache)
    tokenizer = P.Tokenizer.from_directory(prepared.tokenizer_dir)
    uniform = P.evaluate_bpb(lambda x: torch.zeros(*x.shape, 2048), tokenizer, 64, prepared=prepared)
    assert 0.5 < float(summary["val_bpb"]) < uniform - 0.1
    assert summary["profile"] == "cpu" and summary["device"] == "cpu"
    assert summary["budget_override"] == "1" and summary["time_budget_s"] == "4"
    assert float(summary["training_seconds"]) >= 4
    assert float(summary["peak_vram_mb"]) == 0.0 and float(summary["peak_rss_mb"]) > 0
    assert int(summary["num_steps"]) >= 2 and float(summary["mfu_percent"]) > 0
    assert int(summary["total_tokens"]) == int(summary["num_steps"]) * 4096 and float(summary["tokens_per_sec"]) > 0
    # gc.freeze in the loop once left ~30 "nanobind: leaked" lines after the summary (and after tracebacks)
    assert "nanobind" not in result.stdout + result.stderr


def edited_train(tmp_path, old, new):
    """A copy of train.py with one edit, next to prepare.py (as an agent's candidate would be)."""
    source = (REPO / "train.py").read_text()
    assert old in source
    (tmp_path / "train.py").write_text(source.replace(old, new))
    shutil.copy(REPO / "prepare.py", tmp_path / "prepare.py")
    return tmp_path / "train.py"


def test_batch_arithmetic_is_checked_before_training(cpu_cache, tmp_path):
    # 12 x 256 does not divide 4096 (a DEVICE_BATCH_SIZE above TOTAL_BATCH_SIZE // MAX_SEQ_LEN is lowered to it)
    script = edited_train(tmp_path, "    DEVICE_BATCH_SIZE = 16\n", "    DEVICE_BATCH_SIZE = 12\n")
    result = run_train(cpu_cache, 2, script, tmp_path)
    assert result.returncode == 1
    assert "TOTAL_BATCH_SIZE=4096" in result.stderr and "DEVICE_BATCH_SIZE=12" in result.stderr
    assert "MAX_SEQ_LEN=256" in result.stderr


def test_nan_loss_fails_fast(cpu_cache, tmp_path):
    script = edited_train(tmp_path, "loss_value = loss.item()", "loss_value = loss.item() * float('nan')")
    result = run_train(cpu_cache, 30, script, tmp_path)
    assert result.returncode == 1
    assert "FAIL: loss is nan at step 0" in result.stdout
    assert "val_bpb:" not in result.stdout


def test_missing_cache_says_run_prepare_first(tmp_path):
    result = run_train(tmp_path / "nothing-here", 2)
    assert result.returncode == 1 and "run prepare.py first" in result.stderr
