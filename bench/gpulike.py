"""
BENCHMARK helper: a GPU-like stand-in target, whose "GPU" work and CPU work can be told apart (issue 40's training
share). Its processes do the CPU work the real ones do: prepare.py and train.py import torch, train.py builds a
model and exports it with torch.export to $AUTORESEARCH_ARTIFACT, the evaluator loads it with torch.export; what
a GPU would do is a sleep, which leaves the host's cores free: train.py's training budget (the whole budget, as on a
GPU where the host waits on the kernels), the evaluator's scoring (0.5 s, what it took on an H200:
docs/benchmarks.md) and the speed probe's workload (0.1 s, its size on an H100: prepare.py's PROBE_WORK). The metric
is a known function of LR (val_bpb = 1 + 10 |LR - 0.05|, baseline 1.1), so that a strict ratchet keeps the better
LR. Not modelled: torch.compile's warm-up, data loading, CUDA's initialisation (each on the real GPU's host).
"""

import subprocess

SCORE_S = 0.5      # the separate evaluation's scoring on an H200 (bench/gpu_check.sh, cpu profile)
PROBE_S = 0.1      # the speed probe's workload on an H100 (prepare.py's PROBE_WORK comment)

PREPARE = '''"""FROZEN: GPU-like stand-in for prepare.py (bench/gpulike.py)."""
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

METRIC_NAME = "val_bpb"
METRIC_GOAL = "min"
METRIC_TOLERANCE = 1e-6
TIME_BUDGET = {budget}
PREFLIGHT = False
SPEED_PROBE = True


def frozen_inputs():
    files = {{"prepare.py": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}}
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return {{"digest": digest, "files": files, "evaluator_only": []}}


if __name__ == "__main__":
    cache = Path(os.environ["AUTORESEARCH_CACHE"])
    if "--check" in sys.argv:
        if not (cache / "ready").exists():
            print("no prepared data: run `python prepare.py` first", file=sys.stderr)
            sys.exit(1)
    elif "--frozen-inputs" in sys.argv:
        print(json.dumps(frozen_inputs()))
    elif "--probe" in sys.argv:                # the "GPU" workload: a sleep
        t0 = time.perf_counter()
        time.sleep({probe_s})
        print(f"probe_s: {{time.perf_counter() - t0:.6f}}")
    elif "--evaluate" in sys.argv:
        model = torch.export.load(sys.argv[sys.argv.index("--evaluate") + 1]).module()
        time.sleep({score_s})                  # the "GPU" scoring
        print("---")
        print(f"val_bpb: {{1.0 + abs(float(model.lr) - 0.05) * 10:.6f}}")
        print(f"frozen_inputs: {{frozen_inputs()['digest']}}")
    else:
        print("Data: prepared. Next: uv run agent.py --tag TAG")
        (cache / "ready").touch()
'''

TRAIN = '''"""MUTABLE: GPU-like stand-in for train.py (bench/gpulike.py): val_bpb = 1 + 10 |LR - 0.05|."""
import os
import time

import torch

LR = 0.04

t_start = time.time()
budget = float(os.environ.get("AUTORESEARCH_TIME_BUDGET", "300"))
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
model.register_buffer("lr", torch.tensor(LR))
print("step 1 | loss 2.0", flush=True)
t0 = time.time()
time.sleep(budget)                             # the "GPU" training: the host waits on the device
training_seconds = time.time() - t0
t0 = time.time()
if os.environ.get("AUTORESEARCH_ARTIFACT"):
    torch.export.save(torch.export.export(model, (torch.zeros(1, 256),)), os.environ["AUTORESEARCH_ARTIFACT"])
print("---")
print(f"val_bpb:          {{1.0 + abs(LR - 0.05) * 10:.6f}}")
print(f"training_seconds: {{training_seconds:.1f}}")
print(f"total_seconds:    {{time.time() - t_start:.1f}}")
print(f"eval_seconds:     {{time.time() - t0:.1f}}")
print(f"time_budget_s:    {{budget:g}}")
'''


def make_gpu_like(root, budget):
    """A git repo at root holding the stand-in (TIME_BUDGET = budget seconds) committed on main, and its prepared
    cache at root/cache (AUTORESEARCH_CACHE); returns the cache's path."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "prepare.py").write_text(PREPARE.format(budget=budget, probe_s=PROBE_S, score_s=SCORE_S))
    (root / "train.py").write_text(TRAIN.format())
    (root / "program.md").write_text("# program\nImprove val_bpb. Try the learning rate.\n")
    (root / ".gitignore").write_text("__pycache__/\ncache/\n")
    (root / "cache").mkdir()
    (root / "cache" / "ready").touch()
    for argv in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "the GPU-like stand-in"]):
        subprocess.run(["git", *argv], cwd=root, check=True)
    return root / "cache"


def lr_edit(value):
    """An answer in the agent's format changing the baseline's LR (0.04) to value; a value further from 0.05 is a
    discard, so that the best stays the baseline and every such answer applies to it."""
    return f"DESCRIPTION: LR {value}\n<<<<<<< SEARCH\nLR = 0.04\n=======\nLR = {value}\n>>>>>>> REPLACE\n"
