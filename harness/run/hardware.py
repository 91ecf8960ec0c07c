"""
HARNESS: the comparability fingerprint. What a tag's numbers were measured on: the device the runs use (cuda, mps or
cpu), the GPU one run gets (name and memory), the CPU model, the thread count a run gets, the torch and CUDA versions,
the frozen inputs' digest and the attention kernel. A tag records it when it starts (a "hardware" event, epoch 1);
every later start of the tag (a resume, any `try`) measures it again and compares (harness.tag.checks.same_hardware).
`--new-hardware` opens
a new epoch: a new baseline is measured there and every later row is marked as of that hardware (ledger.hw_label).

Measured from this process, quickly (it runs at every start and every `try`): never by importing torch (2 s and
hundreds of MB): its version file is read with ast, the GPUs come from NVML (harness.run.usage.gpu_devices), the CPU
from /proc/cpuinfo. What a run actually saw is checked too: train.py's summary prints `device:` and `threads:`
(summary_mismatch). Never raises: what cannot be told is None.

It never writes anything (harness.tag.opening logs the events) and never decides a verdict.
"""

import ast
import hashlib
import importlib.util
import json
import platform
import subprocess
import sys
from pathlib import Path

from harness.run import usage
from harness.run.sandbox import run_gpu
from harness.run.pool import THREADS

# What makes two runs' metrics incomparable under a fixed time budget (the steps a run takes in it, and its kernels'
# numerics): the device kind, the GPU model a run gets (name and memory: a 40 GB and an 80 GB A100 train different
# batch sizes), the CPU model, the CPU threads this machine gives the harness (pool.THREADS, what its runs share:
# a CPU run's speed; compared only where runs train on the CPU, since on a GPU they only feed it), torch and
# the CUDA toolkit it was built with (its kernels, torch.compile), and the frozen inputs (the evaluator:
# harness.tag.checks.same_frozen_inputs refuses that one first, with its own message), and the attention kernel the
# runs load (harness.run.flash: "<repo>@<commit>", "sdpa" where the target wants one and has none, None otherwise).
COMPARED = ("device", "gpu", "cpu_model", "threads", "torch", "cuda", "frozen", "attention")
# Recorded, shown, not compared: the driver changes no kernel torch ships (it JIT-compiles PTX and manages clocks,
# which the speed probe around every run measures: harness.run.conditions), and the Python version runs no math.
INFORMATIONAL = ("driver", "python")
NAMES = {"device": "device", "gpu": "GPU", "cpu_model": "CPU", "threads": "threads", "torch": "torch",
         "cuda": "CUDA", "frozen": "frozen inputs", "attention": "attention", "driver": "driver", "python": "Python"}


def measure(devices=(), ray=False, digest=None):
    """The fingerprint of the runs this invocation will make: a dict of COMPARED and INFORMATIONAL fields.
    devices: the harness.run.pool.Device list the runs go to (empty: this machine as it is, as `try` runs); ray: the
    runs go to a Ray cluster (device "ray": its machines are not this one, so no GPU or threads are measured here);
    digest: the frozen inputs' digest (Session.evaluation["digest"]), None for a target without one. attention: None
    here; harness.tag.opening sets it where the target wants a kernel (harness.run.flash.ready).
    gpu: "NAME, N GiB" of the GPU one run gets (total memory, GiB rounded), several joined by " + " when the devices
    differ; None without one. threads: the CPU threads this process may use (pool.THREADS: its runs share them,
    `--devices cpu:K` gives each a K-th, the same on every resume that asks for K). Never raises."""
    torch_version, cuda = torch_versions()
    gpus = [] if ray else [run_gpu(getattr(d, "env", {})) for d in devices or [None]]
    described = sorted({g for g in (gpu_words(gpu) for gpu in gpus) if g})
    if ray:
        device = "ray"
    elif described and cuda:
        device = "cuda"
    elif sys.platform == "darwin" and platform.machine() == "arm64" and torch_version:
        device = "mps"
    else:
        device = "cpu"
    return {"device": device, "gpu": " + ".join(described) if device == "cuda" else None,
            "cpu_model": cpu_model(), "threads": None if ray else THREADS,
            "torch": torch_version, "cuda": cuda, "frozen": digest, "attention": None,
            "driver": driver() if described else None,
            "python": platform.python_version()}


def digest_of(fields):
    """sha256 (hex) of the canonical JSON of the compared fields: equal digests, comparable runs."""
    return hashlib.sha256(json.dumps({k: fields.get(k) for k in COMPARED}, sort_keys=True).encode()).hexdigest()


def differences(old, new, keys=COMPARED):
    """What changed from fingerprint `old` to `new`, in words, one string per field of `keys` that differs, e.g.
    ["GPU NVIDIA H100 80GB HBM3, 79 GiB -> NVIDIA A100-SXM4-40GB, 39 GiB", "torch 2.8.0 -> 2.9.1"] ([] when none).
    A field absent from `old` (recorded before it existed) is not compared, nor threads unless a run trains on the
    CPU in either."""
    found = []
    for key in keys:
        if key == "threads" and "cpu" not in (old.get("device"), new.get("device")):
            continue
        if key in old and old.get(key) != new.get(key):
            a, b = (shown(key, f.get(key)) for f in (old, new))
            found.append(f"{NAMES[key]} {a} -> {b}")
    return found


def words(fields):
    """The fingerprint in a few words, e.g. "cuda: NVIDIA H100 80GB HBM3, 79 GiB; torch 2.8.0+cu128, CUDA 12.8" or
    "cpu: Intel(R) Xeon(R) Processor, 2 threads; torch 2.8.0"."""
    device = fields.get("device") or "?"
    what = fields.get("gpu") if device == "cuda" else f"{fields.get('cpu_model') or '?'}, {fields.get('threads')} " \
        "threads" if device == "cpu" else fields.get("cpu_model") or "?"
    cuda = f", CUDA {fields['cuda']}" if fields.get("cuda") and device == "cuda" else ""
    attention = f"; attention {fields['attention']}" if fields.get("attention") else ""
    return f"{device}: {what}; torch {fields.get('torch') or '?'}{cuda}{attention}"


def summary_mismatch(fields, summary, threads):
    """What a run's summary (train.py's `device:` and `threads:` lines, {key: text}) says against the fingerprint
    `fields` and the threads this run was given, e.g. "device cpu, recorded cuda"; None when they agree or the summary
    does not say (a target whose train.py prints neither)."""
    found = []
    said = (summary.get("device") or "").strip().split(":")[0]
    if said and fields.get("device") not in (None, "ray") and said != fields["device"]:
        found.append(f"device {said}, recorded {fields['device']}")
    if (summary.get("threads") or "").strip() and threads is not None and summary["threads"].strip() != str(threads):
        found.append(f"threads {summary['threads'].strip()}, given {threads}")
    used = (summary.get("attention") or "").strip()
    if used == "sdpa" and "@" in (fields.get("attention") or ""):
        found.append(f"attention sdpa, pinned {fields['attention']}")
    return "; ".join(found) or None

# ---------------------------------------------------------------------------
# The facts, each on its own (None where it cannot be told)
# ---------------------------------------------------------------------------


def torch_versions():
    """(torch.__version__, torch.version.cuda) of the torch this interpreter would import (train.py runs with the
    same one), read from its version.py with ast, without importing it; (None, None) without torch."""
    try:
        spec = importlib.util.find_spec("torch")
        path = Path(spec.origin).parent / "version.py"
        found = {}
        for node in ast.parse(path.read_text()).body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            if isinstance(target, ast.Name) and getattr(node, "value", None) is not None:
                try:
                    found[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
        return found.get("__version__"), found.get("cuda")
    except (AttributeError, ImportError, OSError, SyntaxError, TypeError, ValueError):
        return None, None


def gpu_words(gpu):
    """"NAME, N GiB" of the GPU a CUDA_VISIBLE_DEVICES value names first (an index in PCI bus order, as NVML and
    nvidia-smi count, or a GPU-<uuid>), from NVML; None for "" (a CPU worker) or where NVML cannot tell."""
    wanted = str(gpu).split(",")[0].strip()
    handles = usage.gpu_devices()
    if not wanted or not handles:
        return None
    import pynvml                       # gpu_devices imported it
    try:
        for i, handle in enumerate(handles):
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            if wanted in (str(i), uuid):
                name = pynvml.nvmlDeviceGetName(handle)
                name = name.decode() if isinstance(name, bytes) else name
                return f"{name}, {round(pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30)} GiB"
    except Exception:                   # NVML errors (MIG, containers): not told
        return None
    return None


def driver():
    """The NVIDIA driver version from NVML, None without one."""
    if not usage.gpu_devices():
        return None
    import pynvml
    try:
        found = pynvml.nvmlSystemGetDriverVersion()
        return found.decode() if isinstance(found, bytes) else found
    except Exception:
        return None


def cpu_model():
    """The CPU's model name: /proc/cpuinfo's "model name" (Linux x86), sysctl's brand string (macOS), else
    platform.processor() or platform.machine(); None when nothing says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return " ".join(value.split())
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                 timeout=5)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or None


def shown(key, value):
    """A field's value for a message: the frozen digest cut to 12 characters, None as "none"."""
    if value is None:
        return "none"
    return str(value)[:12] if key == "frozen" else str(value)
