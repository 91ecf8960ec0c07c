"""
train.py -- MUTABLE. The one file the research agent edits: model, optimizer, training loop.

A nanochat-style GPT (RoPE, RMSNorm, QK-norm, relu^2 MLP, value embeddings, sliding-window attention,
logit softcap) trained with Muon + AdamW for a fixed wall-clock budget, then scored by the frozen
evaluate_bpb in prepare.py. Runs on CUDA (Flash Attention 3 where it works, torch.compile, bf16),
Apple MPS and CPU. Everything is fair game for the agent except the evaluation it imports.

The harness scores a run with `prepare.py --evaluate` on the program that evaluate_bpb exports from the
trained model (torch.export, $AUTORESEARCH_ARTIFACT): the model's forward must stay traceable by
torch.export (plain torch ops; the FA3 fast path switches to SDPA while exporting).

Usage:
    uv run train.py > run.log 2>&1            # after `uv run prepare.py ...`
    AUTORESEARCH_TIME_BUDGET=30 uv run train.py   # smoke test; the summary says budget_override: 1
"""

import os
os.environ.setdefault("PYTORCH_ALLOC_CONF", "expandable_segments:True")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import atexit
import gc
import math
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from prepare import PrepareError, Tokenizer, evaluate_bpb, load_prepared, make_dataloader, time_budget

t_start = time.time()

# ---------------------------------------------------------------------------
# Device, precision and attention backend
# ---------------------------------------------------------------------------

if torch.cuda.is_available():
    DEVICE = torch.device("cuda")
elif torch.backends.mps.is_available():
    DEVICE = torch.device("mps")
else:
    DEVICE = torch.device("cpu")
# A fixed CPU thread count (the harness sets AUTORESEARCH_THREADS): a CPU run's speed, so its steps, depend on it.
THREADS = int(os.environ.get("AUTORESEARCH_THREADS") or torch.get_num_threads())
torch.set_num_threads(THREADS)


def measure_matmul_flops(dtype, n=1024, seconds=0.5):
    """Best observed FLOP/s of an n x n x n matmul in dtype on DEVICE (2 n^3 FLOPs each), tried for about `seconds`
    (at least once). On the CPU each matmul is timed alone, so that a slow dtype costs one matmul past the deadline."""
    a = torch.randn(n, n, device=DEVICE, dtype=dtype)
    b = torch.randn(n, n, device=DEVICE, dtype=dtype)
    reps = 1 if DEVICE.type == "cpu" else 4            # accelerators: 4 launches per synchronize
    best = 0.0
    deadline = time.perf_counter() + seconds
    while best == 0.0 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        if DEVICE.type != "cpu":
            torch.cuda.synchronize() if DEVICE.type == "cuda" else torch.mps.synchronize()
        best = max(best, reps * 2 * n ** 3 / (time.perf_counter() - t0))
    return best


# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' datasheets, matched on the device name.
GPU_PEAK_FLOPS = [
    ("H200", 989.5e12), ("H100 PCIe", 756e12), ("H100", 989.5e12), ("H800", 989.5e12), ("GH200", 989.5e12),
    ("B200", 2250e12), ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12),
    ("A10G", 70e12), ("A10", 125e12), ("A6000", 155e12), ("RTX 4090", 165e12), ("RTX 3090", 71e12),
]

if DEVICE.type == "cuda":
    # bf16 autocast where the GPU has it natively (Ampere+); older GPUs train in float32.
    DTYPE = torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float32
    name = torch.cuda.get_device_name()
    PEAK_FLOPS = next((f for key, f in GPU_PEAK_FLOPS if key in name), None)
    PEAK_SOURCE = f"datasheet ({name})"
    if PEAK_FLOPS is None:  # unknown GPU: measure rather than pretend it is an H100
        PEAK_FLOPS, PEAK_SOURCE = measure_matmul_flops(DTYPE, n=4096), f"measured matmul ({name})"
elif DEVICE.type == "mps":
    try:  # bf16 autocast exists on recent macOS / PyTorch; fall back to float32 where it does not
        with torch.autocast("mps", dtype=torch.bfloat16):
            (torch.ones(8, 8, device=DEVICE) @ torch.ones(8, 8, device=DEVICE)).sum().item()
        DTYPE = torch.bfloat16
    except Exception:
        DTYPE = torch.float32
    PEAK_FLOPS, PEAK_SOURCE = measure_matmul_flops(DTYPE, n=2048), "measured matmul (mps)"
else:
    # CPUs with AVX512-BF16 / AMX multiply bf16 ~2x faster than float32; others emulate it slowly.
    # Measure both and train in the faster one; MFU is then relative to that dtype's measured peak.
    # Emulated bf16 is ~50x slower (one 1024^3 matmul takes seconds): a 256^3 one tells it apart first.
    fp32_flops = measure_matmul_flops(torch.float32)
    bf16_flops = measure_matmul_flops(torch.bfloat16, n=256, seconds=0)
    if bf16_flops > fp32_flops / 4:
        bf16_flops = measure_matmul_flops(torch.bfloat16)
    DTYPE = torch.bfloat16 if bf16_flops > 1.5 * fp32_flops else torch.float32
    PEAK_FLOPS = bf16_flops if DTYPE == torch.bfloat16 else fp32_flops
    PEAK_SOURCE = f"measured matmul (cpu, {torch.get_num_threads()} threads)"

autocast = torch.autocast(DEVICE.type, dtype=DTYPE, enabled=DTYPE != torch.float32)


def sdpa_attention(q, k, v, window):
    """Causal attention with a sliding window through PyTorch SDPA.

    q, k, v: [B, T, H, D]. window: query i attends keys j with i - window <= j <= i, the same
    semantics as flash_attn_func(..., causal=True, window_size=(window, 0)). Returns [B, T, H, D].
    """
    T = q.size(1)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if window >= T - 1:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        i = torch.arange(T, device=q.device)
        offset = i[:, None] - i[None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=(offset >= 0) & (offset <= window))
    return y.transpose(1, 2)


FA3_REPO, FA3_VERSION = "kernels-community/flash-attn3", 1   # Flash Attention 3 on the kernels hub, its API version


def load_flash_attention():
    """Flash Attention 3 from the kernels hub, or None (with the reason) if it cannot run here.

    $AUTORESEARCH_FA3 is the agent's pin, "<repo>@<commit>", loaded from the local cache (the sandbox has no
    network), or "" where the agent found none (SDPA, said once at its start). Unset: FA3_VERSION from the hub.
    A kernel that loads but fails or disagrees with SDPA on a small probe (Blackwell, ROCm, an old
    driver) is rejected, so the fallback never silently changes the model.
    """
    pinned = os.environ.get("AUTORESEARCH_FA3")
    if DEVICE.type != "cuda" or DTYPE != torch.bfloat16:
        return None, f"no CUDA bf16 device ({DEVICE.type})"
    if pinned == "":
        return None, "none pinned by the agent"
    try:
        from kernels import get_kernel
        repo, _, revision = (pinned or FA3_REPO).partition("@")
        which = {"revision": revision} if revision else {"version": FA3_VERSION}
        module = get_kernel(repo, trust_remote_code=[repo], **which)
        fa3 = getattr(module, "flash_attn_interface", module)
        q, k, v = (torch.randn(2, 256, 2, 64, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
        for window in (255, 64):
            y = fa3.flash_attn_func(q, k, v, causal=True, window_size=(window, 0))
            y = y[0] if isinstance(y, tuple) else y
            err = (y.float() - sdpa_attention(q, k, v, window).float()).abs().max().item()
            if not err < 2e-2:
                return None, f"{repo} disagrees with SDPA (max abs error {err:.3g})"
        return fa3, f"{repo}@{revision}" if revision else repo
    except Exception as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


fa3, fa3_info = load_flash_attention()
if fa3 is None and DEVICE.type == "cuda" and os.environ.get("AUTORESEARCH_FA3") != "":
    print(f"WARNING: Flash Attention 3 unavailable ({fa3_info}); using PyTorch SDPA with the same sliding windows (slower)")
ATTENTION = f"fa3 ({fa3_info})" if fa3 is not None else "sdpa"


def attention(q, k, v, window):
    # FA3 is a hub kernel that torch.export cannot put into a self-contained program: export SDPA instead
    if fa3 is not None and not torch.compiler.is_exporting():
        y = fa3.flash_attn_func(q, k, v, causal=True, window_size=(window, 0))
        return y[0] if isinstance(y, tuple) else y
    return sdpa_attention(q, k, v, window)

# ---------------------------------------------------------------------------
# GPT model
# ---------------------------------------------------------------------------


@dataclass
class GPTConfig:
    sequence_len: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    window_pattern: str  # per layer, cycled: L = full context, S = half context; the last layer is always L


def norm(x):
    return F.rms_norm(x, (x.size(-1),))


def has_value_embedding(layer_idx, n_layer):
    # value embeddings on alternating layers, always including the last one
    return layer_idx % 2 == (n_layer - 1) % 2


def apply_rotary(x, cos, sin):
    d = x.size(3) // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=3)


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.c_q = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.c_k = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.c_v = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.ve_gate_channels = min(32, config.n_embd)
        self.ve_gate = nn.Linear(self.ve_gate_channels, config.n_head, bias=False) if has_value_embedding(layer_idx, config.n_layer) else None

    def forward(self, x, ve, cos, sin, window):
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_head, self.head_dim)
        if ve is not None:  # mix in the value embedding, gated per head from the first channels
            gate = 2 * torch.sigmoid(self.ve_gate(x[..., :self.ve_gate_channels]))
            v = v + gate.unsqueeze(-1) * ve.view(B, T, self.n_head, self.head_dim)
        q, k = norm(apply_rotary(q, cos, sin)), norm(apply_rotary(k, cos, sin))
        y = attention(q, k, v, window)
        return self.c_proj(y.contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp = MLP(config)

    def forward(self, x, ve, cos, sin, window):
        x = x + self.attn(norm(x), ve, cos, sin, window)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.padded_vocab = ((config.vocab_size + 63) // 64) * 64  # lm_head rows padded for efficient matmuls
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        self.lm_head = nn.Linear(config.n_embd, self.padded_vocab, bias=False)
        self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(config.vocab_size, config.n_embd)
                                           for i in range(config.n_layer) if has_value_embedding(i, config.n_layer)})
        # per-layer learnable mix of the running residual and the initial embedding x0 (values set in init_weights)
        self.resid_lambdas = nn.Parameter(torch.empty(config.n_layer))
        self.x0_lambdas = nn.Parameter(torch.empty(config.n_layer))
        self.windows = self.compute_windows(config)
        cos, sin = self.rotary_tables()
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def rotary_tables(self, base=10000):
        """RoPE cos/sin tables, each float32[1, sequence_len, 1, head_dim / 2] (Su et al., 2021)."""
        head_dim = self.config.n_embd // self.config.n_head
        device = self.wte.weight.device
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
        angles = torch.outer(torch.arange(self.config.sequence_len, dtype=torch.float32, device=device), inv_freq)
        return angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]

    @staticmethod
    def compute_windows(config):
        pattern = config.window_pattern.upper()
        if not pattern or set(pattern) - {"L", "S"}:
            raise ValueError(f"WINDOW_PATTERN must be letters L and S, got {config.window_pattern!r}")
        long, short = config.sequence_len, config.sequence_len // 2
        windows = [long if pattern[i % len(pattern)] == "L" else short for i in range(config.n_layer)]
        windows[-1] = long
        return windows

    @torch.no_grad()
    def init_weights(self):
        """Initialise every parameter and buffer in place (the model may have been built on the meta device)."""
        self.cos, self.sin = self.rotary_tables()
        s = 3 ** 0.5 * self.config.n_embd ** -0.5  # uniform with std n_embd^-0.5
        nn.init.normal_(self.wte.weight, std=1.0)
        nn.init.normal_(self.lm_head.weight, std=0.001)
        for block in self.blocks:
            for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_fc):
                nn.init.uniform_(lin.weight, -s, s)
            nn.init.zeros_(block.attn.c_proj.weight)  # each block starts as the identity
            nn.init.zeros_(block.mlp.c_proj.weight)
            if block.attn.ve_gate is not None:
                nn.init.zeros_(block.attn.ve_gate.weight)
        for ve in self.value_embeds.values():
            nn.init.uniform_(ve.weight, -s, s)
        self.resid_lambdas.fill_(1.0)
        self.x0_lambdas.fill_(0.1)

    def num_flops_per_token(self):
        """Training FLOPs per token: 6 x (parameters in matmuls) + 12 x layers x n_embd x attended keys.

        Embedding lookups are free; attention counts QK^T and AV forward + backward over the window
        (the nanochat / PaLM appendix B convention, full window length rather than the causal average).
        """
        nparams = sum(p.numel() for p in self.parameters())
        nparams_embedding = self.wte.weight.numel() + sum(ve.weight.numel() for ve in self.value_embeds.values())
        nparams_scalar = self.resid_lambdas.numel() + self.x0_lambdas.numel()
        attn = sum(12 * self.config.n_embd * min(w + 1, self.config.sequence_len) for w in self.windows)
        return 6 * (nparams - nparams_embedding - nparams_scalar) + attn

    def forward(self, idx, targets=None):
        """idx: int64[B, T]. Returns logits float32[B, T, vocab_size], or the mean loss if targets are given."""
        B, T = idx.shape
        cos, sin = self.cos[:, :T], self.sin[:, :T]
        x = x0 = norm(self.wte(idx))
        for i, block in enumerate(self.blocks):
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            ve = self.value_embeds[str(i)](idx) if str(i) in self.value_embeds else None
            x = block(x, ve, cos, sin, self.windows[i])
        logits = self.lm_head(norm(x))[..., :self.config.vocab_size].float()
        logits = SOFTCAP * torch.tanh(logits / SOFTCAP)  # bounded logits keep early training stable
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

# ---------------------------------------------------------------------------
# Optimizer: Muon for the matrices in the blocks, AdamW for everything else
# ---------------------------------------------------------------------------


def orthogonalize(G, steps=5):
    """Approximate U V^T of G = U S V^T with the quintic Newton-Schulz iteration of Muon.

    G: [..., m, n]. Coefficients (3.4445, -4.7750, 2.0315) from Keller Jordan's Muon (2024).
    Runs in bf16 when training in bf16 (the iteration tolerates it), else float32.
    """
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.to(DTYPE)
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return X.mT if tall else X


class Muon(torch.optim.Optimizer):
    """MomentUm Orthogonalized by Newton-schulz: SGD-Nesterov whose update is orthogonalized per matrix.

    Parameters of one shape are updated together (a batched orthogonalization). Decoupled weight
    decay: p <- p * (1 - lr * weight_decay).
    """

    def __init__(self, params, lr, momentum=0.95, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            by_shape = {}
            for p in group["params"]:
                if p.grad is not None:
                    by_shape.setdefault(p.shape, []).append(p)
            for shape, params in by_shape.items():
                grads = torch.stack([p.grad for p in params])
                key = params[0]
                if "momentum_buffer" not in self.state[key]:
                    self.state[key]["momentum_buffer"] = torch.zeros_like(grads)
                buf = self.state[key]["momentum_buffer"]
                buf.lerp_(grads, 1 - group["momentum"])
                update = orthogonalize(grads.lerp_(buf, group["momentum"]))  # Nesterov
                update = update.to(grads.dtype) * max(1.0, shape[-2] / shape[-1]) ** 0.5
                for p, u in zip(params, update):
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.add_(u, alpha=-group["lr"])

# ---------------------------------------------------------------------------
# Prepared data and hyperparameters (edit these directly, no CLI flags needed)
# ---------------------------------------------------------------------------

try:
    prepared = load_prepared()
    budget_seconds, budget_override = time_budget(prepared.profile.name)
except PrepareError as e:
    sys.exit(f"train.py: {e}")
PROFILE = prepared.profile.name   # lab | cpu | small | default, fixed by prepare.py
SEED = int(os.environ.get("AUTORESEARCH_SEED", "42"))   # init and data order; the harness varies it between runs
MAX_SEQ_LEN = prepared.max_seq_len

# Optimization (shared by every device class)
EMBEDDING_LR = 0.6        # AdamW, token and value embeddings
UNEMBEDDING_LR = 0.004    # AdamW, lm_head
SCALAR_LR = 0.5           # AdamW, per-layer residual mixing scalars
WEIGHT_DECAY = 0.2        # Muon, decays linearly to 0 with the learning rate schedule
ADAM_BETA1 = 0.8
ADAM_BETA2 = 0.95
WARMUP_RATIO = 0.0        # fraction of the time budget for learning-rate warmup
WARMDOWN_RATIO = 0.5      # fraction of the time budget for the linear decay at the end
FINAL_LR_FRAC = 0.0       # learning rate at the end, as a fraction of the peak
SOFTCAP = 15.0            # logits are squashed to (-SOFTCAP, SOFTCAP)

# Model size and batch per device class: the branch of the prepared profile is the one that runs.
if PROFILE == "lab":      # 2 CPU cores, 60 s: ~0.5M parameters, ~650 steps (research measurable on a laptop)
    DEPTH = 3
    ASPECT_RATIO = 32
    HEAD_DIM = 32
    WINDOW_PATTERN = "L"
    TOTAL_BATCH_SIZE = 2**11
    DEVICE_BATCH_SIZE = 16
    EVAL_BATCH_SIZE = 64
    MATRIX_LR = 0.04
elif PROFILE == "cpu":    # a 2-core CPU, 300 s: ~5M parameters, many small steps (more steps beat bigger batches here)
    DEPTH = 4
    ASPECT_RATIO = 64     # model_dim = DEPTH * ASPECT_RATIO, rounded up to a multiple of HEAD_DIM
    HEAD_DIM = 64
    WINDOW_PATTERN = "L"  # at 256 tokens a half window saves nothing on CPU
    TOTAL_BATCH_SIZE = 2**12  # smaller batches step more often but Muon's orthogonalization then costs ~20 %
    DEVICE_BATCH_SIZE = 16
    EVAL_BATCH_SIZE = 64
    MATRIX_LR = 0.06          # Muon, all matrices inside the blocks: small batches take a higher rate
elif PROFILE == "small":  # a Mac or a GPU with 8-24 GB
    DEPTH = 6
    ASPECT_RATIO = 64
    HEAD_DIM = 64
    WINDOW_PATTERN = "SSSL"
    TOTAL_BATCH_SIZE = 2**16
    DEVICE_BATCH_SIZE = 32
    EVAL_BATCH_SIZE = 32
    MATRIX_LR = 0.04
else:                     # default: one H100-class GPU
    DEPTH = 8
    ASPECT_RATIO = 64
    HEAD_DIM = 128
    WINDOW_PATTERN = "SSSL"
    TOTAL_BATCH_SIZE = 2**19
    DEVICE_BATCH_SIZE = 128
    EVAL_BATCH_SIZE = 64      # float32 logits of 64 x 2048 x 8192 are 4 GiB; the causality probe holds two
    MATRIX_LR = 0.04          # Muon, all matrices inside the blocks

# ---------------------------------------------------------------------------
# Setup: model, optimizers, data
# ---------------------------------------------------------------------------

torch.manual_seed(SEED)
DEVICE_BATCH_SIZE = max(1, min(DEVICE_BATCH_SIZE, TOTAL_BATCH_SIZE // MAX_SEQ_LEN))  # a total below one micro-batch
tokens_per_micro_step = DEVICE_BATCH_SIZE * MAX_SEQ_LEN
if TOTAL_BATCH_SIZE % tokens_per_micro_step != 0:
    sys.exit(f"train.py: TOTAL_BATCH_SIZE={TOTAL_BATCH_SIZE} must be a multiple of DEVICE_BATCH_SIZE={DEVICE_BATCH_SIZE} "
             f"x MAX_SEQ_LEN={MAX_SEQ_LEN} = {tokens_per_micro_step}; change TOTAL_BATCH_SIZE or DEVICE_BATCH_SIZE")
grad_accum_steps = TOTAL_BATCH_SIZE // tokens_per_micro_step

tokenizer = Tokenizer.from_directory(prepared.tokenizer_dir)
model_dim = -(-DEPTH * ASPECT_RATIO // HEAD_DIM) * HEAD_DIM
config = GPTConfig(sequence_len=MAX_SEQ_LEN, vocab_size=tokenizer.get_vocab_size(), n_layer=DEPTH,
                   n_head=model_dim // HEAD_DIM, n_embd=model_dim, window_pattern=WINDOW_PATTERN)
with torch.device("meta"):
    model = GPT(config)
model.to_empty(device=DEVICE)
model.init_weights()

num_params = sum(p.numel() for p in model.parameters())
flops_per_token = model.num_flops_per_token()

matrix_params = [p for p in model.blocks.parameters() if p.ndim == 2]
lr_scale = (model_dim / 768) ** -0.5  # AdamW learning rates were tuned at model_dim 768
adam_groups = [
    dict(params=[model.lm_head.weight], lr=UNEMBEDDING_LR * lr_scale),
    dict(params=[model.wte.weight], lr=EMBEDDING_LR * lr_scale),
    dict(params=list(model.value_embeds.parameters()), lr=EMBEDDING_LR * lr_scale),
    dict(params=[model.resid_lambdas], lr=SCALAR_LR * 0.01),
    dict(params=[model.x0_lambdas], lr=SCALAR_LR),
]
adamw = torch.optim.AdamW(adam_groups, betas=(ADAM_BETA1, ADAM_BETA2), eps=1e-10, weight_decay=0.0)
muon = Muon(matrix_params, lr=MATRIX_LR, weight_decay=WEIGHT_DECAY)
optimizers = [adamw, muon]
for opt in optimizers:
    for group in opt.param_groups:
        group["initial_lr"] = group["lr"]

# torch.compile pays off on CUDA; on CPU/MPS its compile time would eat a 5-minute budget.
compiled = DEVICE.type == "cuda"
train_model = torch.compile(model, dynamic=False) if compiled else model
# The first steps compile and warm up caches: they do not count against the budget.
EXCLUDED_STEPS = 10 if compiled else 1

train_loader = make_dataloader(tokenizer, DEVICE_BATCH_SIZE, MAX_SEQ_LEN, "train", device=DEVICE, prepared=prepared,
                               seed=SEED)
x, y, epoch = next(train_loader)

print(f"profile: {PROFILE} | device: {DEVICE.type} | dtype: {str(DTYPE).replace('torch.', '')} | attention: {ATTENTION}")
print(f"model: {num_params / 1e6:.2f}M params, depth {DEPTH}, dim {model_dim}, heads {config.n_head}, windows {model.windows}")
print(f"batch: {TOTAL_BATCH_SIZE} tokens/step = {DEVICE_BATCH_SIZE} x {MAX_SEQ_LEN} x {grad_accum_steps} accumulation steps")
print(f"budget: {budget_seconds:g}s{' (OVERRIDE: not comparable to a real run)' if budget_override else ''} | "
      f"peak: {PEAK_FLOPS / 1e12:.2f} TFLOP/s, {PEAK_SOURCE}")


def lr_multiplier(progress):
    """Learning-rate multiplier at progress in [0, 1] of the time budget: warmup, flat, linear warmdown."""
    if progress < WARMUP_RATIO:
        return (progress + 1e-8) / WARMUP_RATIO
    if progress < 1.0 - WARMDOWN_RATIO:
        return 1.0
    cooldown = (1.0 - progress) / WARMDOWN_RATIO
    return cooldown + (1 - cooldown) * FINAL_LR_FRAC

# ---------------------------------------------------------------------------
# Training loop
# ---------------------------------------------------------------------------

step = 0
training_time = 0.0
smooth_loss = 0.0
last_print = 0.0
peak_mps_bytes = 0
while True:
    t0 = time.time()
    for _ in range(grad_accum_steps):
        with autocast:
            loss = train_model(x, y)
        (loss / grad_accum_steps).backward()
        x, y, epoch = next(train_loader)
    progress = min(training_time / budget_seconds, 1.0)
    lrm = lr_multiplier(progress)
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * lrm
    muon.param_groups[0]["momentum"] = 0.85 + 0.10 * min(step / 300, 1)  # momentum warmup, as in Muon
    muon.param_groups[0]["weight_decay"] = WEIGHT_DECAY * (1 - progress)
    for opt in optimizers:
        opt.step()
    model.zero_grad(set_to_none=True)

    loss_value = loss.item()  # also the device sync that makes the step time real
    if not math.isfinite(loss_value) or loss_value > 100:
        print(f"\nFAIL: loss is {loss_value} at step {step}: training diverged (lower the learning rates or check the change)")
        sys.exit(1)
    dt = time.time() - t0
    if step >= EXCLUDED_STEPS:
        training_time += dt
    if DEVICE.type == "mps":
        peak_mps_bytes = max(peak_mps_bytes, torch.mps.current_allocated_memory())

    smooth_loss = 0.9 * smooth_loss + 0.1 * loss_value
    debiased = smooth_loss / (1 - 0.9 ** (step + 1))
    tok_per_sec = TOTAL_BATCH_SIZE / dt
    mfu = 100 * flops_per_token * tok_per_sec / PEAK_FLOPS
    remaining = max(0.0, budget_seconds - training_time)
    if time.time() - last_print >= 1.0 or step < 3:
        last_print = time.time()
        print(f"step {step:05d} ({100 * progress:.1f}%) | loss: {debiased:.4f} | lrm: {lrm:.2f} | dt: {dt * 1000:.0f}ms | "
              f"tok/s: {tok_per_sec:,.0f} | mfu: {mfu:.1f}% | epoch: {epoch} | left: {remaining:.0f}s", flush=True)

    if step == 0:  # everything allocated so far lives to the end: keep the GC from rescanning it
        gc.collect()
        gc.freeze()
        # ... but let it collect them at exit: triton's nanobind bindings (imported by torch._dynamo when
        # the optimizers were built) print ~30 "nanobind: leaked" lines after a frozen exit, even a crash's
        atexit.register(gc.unfreeze)
    step += 1
    if step > EXCLUDED_STEPS and training_time >= budget_seconds:
        break

# ---------------------------------------------------------------------------
# Evaluation (the frozen metric) and summary
# ---------------------------------------------------------------------------

model.eval()
t_eval = time.time()
# The eager model, not train_model: on an H200 with torch 2.11 the inductor graph compiled under no_grad returned
# different logits on each call of the same batch (spread up to 15), while eager and the compiled training graph
# agree; bench/gpu_check.sh checks this. Evaluation is a small share of the run, so eager costs little.
with autocast:
    val_bpb = evaluate_bpb(model, tokenizer, EVAL_BATCH_SIZE, prepared=prepared)
eval_seconds = time.time() - t_eval

trained_steps = step - EXCLUDED_STEPS
total_tokens = step * TOTAL_BATCH_SIZE
mfu_percent = 100 * flops_per_token * trained_steps * TOTAL_BATCH_SIZE / training_time / PEAK_FLOPS
if DEVICE.type == "cuda":
    peak_vram_mb = torch.cuda.max_memory_allocated() / 1024 / 1024
elif DEVICE.type == "mps":
    peak_vram_mb = peak_mps_bytes / 1024 / 1024  # sampled once per step: a lower bound of the true peak
else:
    peak_vram_mb = 0.0  # a CPU has no VRAM; peak_rss_mb below is the process's resident memory
try:
    import resource  # POSIX only
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_rss_mb = rss / 1024 / (1024 if sys.platform == "darwin" else 1)  # macOS reports bytes, Linux KiB
except ImportError:
    peak_rss_mb = 0.0

print("---")
print(f"val_bpb:          {val_bpb:.6f}")
print(f"training_seconds: {training_time:.1f}")
print(f"total_seconds:    {time.time() - t_start:.1f}")
print(f"peak_vram_mb:     {peak_vram_mb:.1f}")
print(f"mfu_percent:      {mfu_percent:.2f}")
print(f"total_tokens_M:   {total_tokens / 1e6:.1f}")
print(f"num_steps:        {step}")
print(f"num_params_M:     {num_params / 1e6:.1f}")
print(f"depth:            {DEPTH}")
print(f"profile:          {PROFILE}")
print(f"device:           {DEVICE.type}")
print(f"dtype:            {str(DTYPE).replace('torch.', '')}")
print(f"attention:        {'fa3' if fa3 is not None else 'sdpa'}")
print(f"eval_seconds:     {eval_seconds:.1f}")
print(f"tokens_per_sec:   {trained_steps * TOTAL_BATCH_SIZE / training_time:.0f}")
print(f"total_tokens:     {total_tokens}")
print(f"peak_tflops:      {PEAK_FLOPS / 1e12:.2f}")
print(f"peak_rss_mb:      {peak_rss_mb:.1f}")
print(f"time_budget_s:    {budget_seconds:g}")
print(f"budget_override:  {int(budget_override)}")
print(f"seed:             {SEED}")
print(f"threads:          {THREADS}")
