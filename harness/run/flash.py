"""
HARNESS: Flash Attention 3 for a target's runs on CUDA, pinned for the tag and found offline inside the sandbox. The
kernel (REPO at API version VERSION on the kernels hub) is resolved once to a commit, fetched into the Hugging Face
cache outside the sandbox before the first run (kernels.install_kernel: this machine's build variant only), loaded and
checked against SDPA in a run's view with no network (HF_HUB_OFFLINE=1), and named in the tag's fingerprint
(harness.run.hardware: another commit is another epoch). Each run then gets ENV=<repo>@<commit> and the kernel's cache
folder, read-only; train.py loads exactly that commit from the cache. A target opts in by reading ENV in its train.py.
Where the kernel cannot be had (no network and not cached, no build for this torch and CUDA, a failed check), every
run uses SDPA (ENV="") and the start says so once, with the fix. Never decides a verdict, never writes the ledger.
"""

import os
import subprocess
from pathlib import Path

REPO = "kernels-community/flash-attn3"    # the kernels hub's FA3 (CUDA capabilities 8.0 and 9.0a: A100, H100)
VERSION = 1                               # its API major version (kernels' `version=`), resolved to one commit
ENV = "AUTORESEARCH_FA3"                  # "<repo>@<commit>": load that from the cache; "": none here, use SDPA
SDPA = "sdpa"                             # the fingerprint's attention when a target wants the kernel and has none

# Run in a run's view (the sandbox's, when on) with no network: the pinned kernel loads from the cache and, on a GPU,
# agrees with SDPA on a small causal probe (as train.py's own start-up check does before every run).
CHECK = """
import sys
import torch
from kernels import get_kernel
repo, _, revision = sys.argv[1].partition("@")
try:
    module = get_kernel(repo, revision=revision, trust_remote_code=[repo])
except Exception as e:
    while e.__cause__ or e.__context__:    # what went wrong, not the loader's wrapping of it
        e = e.__cause__ or e.__context__
    sys.exit(f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}")
fa3 = getattr(module, "flash_attn_interface", module)
if torch.cuda.is_available():
    q, k, v = (torch.randn(2, 256, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    y = fa3.flash_attn_func(q, k, v, causal=True)
    y = y[0] if isinstance(y, tuple) else y
    t = [x.transpose(1, 2) for x in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(*t, is_causal=True).transpose(1, 2)
    err = (y.float() - ref.float()).abs().max().item()
    if not err < 2e-2:
        sys.exit(f"it disagrees with SDPA (max abs error {err:.3g})")
print("fa3 ok")
"""


class Unavailable(Exception):
    """The kernel cannot be had here; the message says why."""


def wanted(train_text, device):
    """Whether a tag's runs get the pinned kernel: on CUDA, for a target whose train.py reads ENV."""
    return device == "cuda" and ENV in train_text


def offline():
    """HF_HUB_OFFLINE is set: the hub is not asked, the cache alone is read."""
    from huggingface_hub import constants
    return bool(constants.HF_HUB_OFFLINE)


def fetch(pinned=None):
    """The kernel in the cache, outside the sandbox: the commit `pinned` ("<repo>@<commit>", a tag's fingerprint) or,
    for a new tag, the latest commit of REPO's VERSION; from the cache when it is there, else from the hub (unless
    offline()). Returns (attention "<repo>@<commit>", its cache folder: a Path). Raises Unavailable."""
    from kernels import install_kernel
    repo, _, revision = (pinned or REPO).partition("@")
    which = {"revision": revision} if revision else {"version": VERSION}
    tries = [True] if offline() else [True, False]
    problem = None
    for local in tries:
        try:
            path = Path(install_kernel(repo, local_files_only=local, trust_remote_code=[repo], **which))
        except Exception as e:          # the hub unreachable, no build for this torch/CUDA, a missing cache entry
            problem = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
            continue
        snapshot = path.parents[1]                                   # <folder>/snapshots/<commit>/build/<variant>
        return f"{repo}@{snapshot.name}", snapshot.parents[1]
    where = "not in the Hugging Face cache and HF_HUB_OFFLINE is set" if offline() else \
        "neither in the Hugging Face cache nor fetched from the hub"
    raise Unavailable(f"{repo}@{revision or f'v{VERSION}'} is {where} ({problem})")


def check(attention, run):
    """Load the kernel `attention` where a run would (run(argv, env) -> CompletedProcess: the run's view, its GPU),
    offline, and compare it with SDPA on a GPU. Raises Unavailable with what it printed."""
    from harness.run.runner import interpreter
    done = run([interpreter(), "-c", CHECK, attention], {ENV: attention, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0 or "fa3 ok" not in done.stdout:
        lines = (done.stderr or done.stdout or "").strip().splitlines()
        raise Unavailable(f"{attention} does not load in a run's view: {lines[-1][:300] if lines else done.returncode}")


def ready(pinned, run):
    """The attention of this invocation's runs and the line to say at start (None when all is well): pinned: the
    tag's recorded "<repo>@<commit>" (None for a new tag); run: as for check. Returns (attention, folder or None,
    line): attention is "<repo>@<commit>" when the kernel was fetched and checked, else SDPA."""
    try:
        attention, folder = fetch(pinned)
        check(attention, lambda argv, env: run(argv, env, folder))
    except Unavailable as e:
        return SDPA, None, (f"attention: SDPA for every run ({e}). For Flash Attention 3, run once where the Hugging "
                            f"Face hub can be reached (HF_HUB_OFFLINE unset), or copy its cache folder here")
    return attention, folder, None


def run_env(attention):
    """The variables a run gets for the fingerprint's attention: ENV (the pin, or "" for SDPA); {} where the target
    wants no kernel (attention None)."""
    if attention is None:
        return {}
    return {ENV: attention if "@" in attention else ""}


def plain_run(argv, env, folder):
    """check's run without a sandbox: this machine as it is, with env added."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env={**os.environ, **env})
