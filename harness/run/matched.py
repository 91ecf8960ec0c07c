"""
HARNESS: the compute-matched budget (`--budget-like NAME`): a reference GPU's budget in this device's seconds, so
that a slower GPU trains the same FLOPs a 5-minute run gets on an H100 (karpathy/autoresearch#596: a 4090 needs ~5x
the time to reach an H100's 5-minute val_bpb). The scale is the reference's datasheet dense bf16 peak over this
device's: its datasheet peak for a GPU in the table, else a matmul measured on it (MPS, CPU, an unknown GPU). Pure
arithmetic and one measurement; harness.tag.opening records the result in the tag and labels its rows.
"""

import json
import subprocess

# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' datasheets (the table train.py computes MFU with), matched
# on the GPU's name, the more specific name first.
DATASHEET = [
    ("H200", 989.5e12), ("H100 PCIe", 756e12), ("H100", 989.5e12), ("H800", 989.5e12), ("GH200", 989.5e12),
    ("B200", 2250e12), ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12),
    ("A10G", 70e12), ("A10", 125e12), ("A6000", 155e12), ("RTX 4090", 165e12), ("RTX 3090", 71e12),
]
# The references --budget-like names: a name -> the datasheet entry it means.
REFERENCES = {"h100": "H100", "h200": "H200", "b200": "B200", "a100": "A100", "l40s": "L40S", "l4": "L4",
              "a10g": "A10G", "rtx4090": "RTX 4090", "rtx3090": "RTX 3090"}
LONGEST_S = 86400.0       # a matched budget over a day per run is no experiment: refused, naming the numbers

# A bf16 (CUDA, MPS) or float32 (CPU) matmul timed on the device a run gets, best of a few: FLOP/s on stdout.
MEASURE = """
import json, sys, time, torch
kind = sys.argv[1]
device = torch.device({"cuda": "cuda", "mps": "mps"}.get(kind, "cpu"))
dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
n = 1024 if device.type == "cpu" else 4096
a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
sync = {"cuda": torch.cuda.synchronize, "mps": torch.mps.synchronize}.get(device.type, lambda: None)
best = 0.0
for _ in range(5):
    sync(); t0 = time.perf_counter()
    for _ in range(4):
        a @ b
    sync(); best = max(best, 4 * 2 * n ** 3 / (time.perf_counter() - t0))
print(json.dumps({"flops": best}))
"""


class Unmeasurable(Exception):
    """This device's speed cannot be told, or the matched budget is no experiment; the message says which."""


def article(name):
    """ "an H100", "a B200": the name with the article its first letter takes when spelled out."""
    return f"{'an' if name[0] in 'AEFHILMNORSX' else 'a'} {name}"


def datasheet(gpu):
    """The datasheet peak (FLOP/s) for a GPU description (the fingerprint's "NVIDIA H100 80GB HBM3, 79 GiB"), or
    None for a GPU the table does not know."""
    return next((flops for name, flops in DATASHEET if gpu and name in gpu), None)


def measure(device, python, env):
    """A matmul's FLOP/s on `device` (cuda | mps | cpu) in a fresh `python` with env (the run's threads and GPU).
    Raises Unmeasurable."""
    try:
        done = subprocess.run([python, "-c", MEASURE, device], capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL, env=env)
        flops = float(json.loads(done.stdout.strip().splitlines()[-1])["flops"])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, KeyError) as e:
        raise Unmeasurable(f"the matmul measurement on {device} failed ({type(e).__name__})") from None
    if not flops > 0:
        raise Unmeasurable(f"the matmul measurement on {device} gave {flops}")
    return flops


def scaled(budget, like, fields, measured):
    """The budget of `budget` seconds on the reference `like` (a REFERENCES name) in this device's seconds.
    fields: the fingerprint (harness.run.hardware: device, gpu); measured() -> FLOP/s where no datasheet applies.
    Returns (seconds, words), words e.g. "300 s on an H100 = 1,799 s here (NVIDIA GeForce RTX 4090, 24 GiB: 165
    TFLOP/s datasheet bf16, against 989.5)". Raises Unmeasurable (an unmeasurable device, over LONGEST_S)."""
    ref = datasheet(REFERENCES[like])
    if fields.get("device") == "ray":
        raise Unmeasurable("the runs go to other machines (Ray), whose speed is not measured here")
    mine = datasheet(fields.get("gpu")) if fields.get("device") == "cuda" else None
    source = "datasheet bf16" if mine else "measured matmul"
    mine = mine or measured()
    seconds = max(1.0, float(round(budget * ref / mine)))
    what = fields.get("gpu") if fields.get("device") == "cuda" else fields.get("device")
    words = (f"{budget:g} s on {article(REFERENCES[like])} = {seconds:,.0f} s here ({what}: {mine / 1e12:.4g} "
             f"TFLOP/s {source}, against {ref / 1e12:g})")
    if seconds > LONGEST_S:
        raise Unmeasurable(f"{words}: over {LONGEST_S:,.0f} s per run, no experiment; use a faster device or a "
                           "smaller profile")
    return seconds, words
