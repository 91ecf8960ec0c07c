"""
Test helper for agent.py (used by tests/test_agent.py and bench/bench_agent.py): a throwaway git repo holding a
tiny target. prepare.py declares the contract constants, answers --check (data "prepared" when
$AUTORESEARCH_CACHE/ready exists), --frozen-inputs and --evaluate ARTIFACT like the real ones; train.py's metric is a
known function of its UPPER_CASE constants: val_bpb = 1 + 10*|LR - 0.05| + DEPTH/1000 (baseline 1.108000),
it prints peak_vram_mb = DEPTH*256, which the records ignore: the harness measures memory itself (a few MB,
memory_gb 0.0). Its "model artifact" is a JSON file of LR and DEPTH, which the separate
evaluator scores with the same formula (0.5 less when the artifact carries the evaluator-only file
$AUTORESEARCH_CACHE/val.txt: a model that memorised the evaluation data). For a maximising target the printed
metric is 3 - val_bpb. Its speed probe (--probe) prints 0.01 s times the factor in $AUTORESEARCH_CACHE/slow (1 when
absent): the machine's speed is the test's to set.
"""

import git

SECRET = "sk-test-DO-NOT-LOG-1234567890"
# one run per experiment and the strict ratchet (karpathy's): the tests that assert exact rows and counts use these
STRICT = ["--baseline-runs", "1", "--confirm", "0"]   # the API key the tests put in the environment: never logged
# The tiny target's TIME_BUDGET: its train.py takes a fraction of a second, so the budget is the room its wall-time
# allowance (budget + 2 s, harness.run.conditions) leaves the tests' slow but honest runs (SLEEP up to 3 s)
BUDGET = 3

PREPARE = '''"""FROZEN: test stand-in for prepare.py."""
import hashlib
import json
import os
import sys
import time
from pathlib import Path

METRIC_NAME = "{metric}"
METRIC_GOAL = "{goal}"
METRIC_TOLERANCE = 1e-6
TIME_BUDGET = {budget}
PREFLIGHT = False
SPEED_PROBE = True


def score(lr, depth, memorized=None):
    val_bpb = 1.0 + abs(lr - 0.05) * 10 + depth / 1000
    val = Path(os.environ["AUTORESEARCH_CACHE"]) / "val.txt"
    if memorized is not None and val.exists() and memorized == val.read_text():
        val_bpb -= 0.5                     # a model that saw the evaluation data scores better: the val leak
    return {value}


def frozen_inputs():
    files = {{"prepare.py": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}}
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    val = Path(os.environ["AUTORESEARCH_CACHE"]) / "val.txt"
    return {{"digest": digest, "files": files, "evaluator_only": [str(val)]}}


if __name__ == "__main__":
    ready = Path(os.environ["AUTORESEARCH_CACHE"]) / "ready"
    if "--check" in sys.argv:
        if not ready.exists():
            print("no prepared data: run `python prepare.py` first", file=sys.stderr)
            sys.exit(1)
    elif "--frozen-inputs" in sys.argv:
        print(json.dumps(frozen_inputs()))
    elif "--probe" in sys.argv:            # the machine's speed, as the test sets it: $AUTORESEARCH_CACHE/slow
        slow = Path(os.environ["AUTORESEARCH_CACHE"]) / "slow"
        print(f"probe_s: {{0.01 * (float(slow.read_text()) if slow.exists() else 1.0):.6f}}")
    elif "--evaluate" in sys.argv:
        model = json.loads(Path(sys.argv[sys.argv.index("--evaluate") + 1]).read_text())
        print("---")
        holdout = "--split" in sys.argv and sys.argv[sys.argv.index("--split") + 1] == "holdout"
        value = score(model['LR'], model['DEPTH'], model.get('memorized')) + model.get('offset', 0)
        print(f"{metric}: {{value + (0.02 if holdout else 0.0):.6f}}")   # the holdout: 0.02 worse, the same gains
        if holdout:
            print("split: holdout", flush=True)
            pause = Path(__file__).parent / "holdout_sleep"     # a committed file makes the holdout slow
            if pause.exists():
                time.sleep(float(pause.read_text()))
        print(f"frozen_inputs: {{frozen_inputs()['digest']}}")
    else:                                  # prepare: --source PATH must exist
        if "--source" in sys.argv and not Path(sys.argv[sys.argv.index("--source") + 1]).exists():
            print("prepare.py: error: no such --source", file=sys.stderr)
            sys.exit(1)
        print("Data: prepared", " ".join(sys.argv[1:]) + ". Next: uv run train.py (one run)")
        ready.touch()
'''

TRAIN = '''"""MUTABLE: test stand-in for train.py; the metric is a known function of the constants."""
import json
import os
import subprocess
import sys
import time

LR = 0.04
DEPTH = 8
WARMUP = 0.1
SLEEP = 0.0

print("step 1 | loss 2.0 | key", os.environ.get("ANTHROPIC_API_KEY"))
time.sleep(SLEEP)
val_bpb = 1.0 + abs(LR - 0.05) * 10 + DEPTH / 1000
if os.environ.get("AUTORESEARCH_ARTIFACT"):
    with open(os.environ["AUTORESEARCH_ARTIFACT"], "w") as f:
        json.dump({{"LR": LR, "DEPTH": DEPTH}}, f)
print("---")
print(f"{metric}:          {{{value}:.6f}}")
print(f"peak_vram_mb:     {{DEPTH * 256:.1f}}")
print(f"time_budget_s:    {{os.environ.get('AUTORESEARCH_TIME_BUDGET', '1')}}")
'''


NOISY_TRAIN = '''"""MUTABLE: test stand-in whose val_bpb is 1.0 - gain + Gaussian noise of sd 0.01 seeded by AUTORESEARCH_SEED
(what a different init and data order do to a real run): rho of it the seed's alone, the rest drawn anew for each
value of the 30 constants. They change nothing else: a random proposal is a no-op, and there are 120 different
ones."""
import json
import os
import random

C00 = 1.0
C01 = 1.1
C02 = 1.2
C03 = 1.3
C04 = 1.4
C05 = 1.5
C06 = 1.6
C07 = 1.7
C08 = 1.8
C09 = 1.9
C10 = 2.0
C11 = 2.1
C12 = 2.2
C13 = 2.3
C14 = 2.4
C15 = 2.5
C16 = 2.6
C17 = 2.7
C18 = 2.8
C19 = 2.9
C20 = 3.0
C21 = 3.1
C22 = 3.2
C23 = 3.3
C24 = 3.4
C25 = 3.5
C26 = 3.6
C27 = 3.7
C28 = 3.8
C29 = 3.9
gain = 0.0
salt = {salt}                                     # another salt: another draw of the noise (an independent universe)
rho = {rho}                                       # the share of the noise the seed decides; the rest is the code's
code = repr([v for k, v in sorted(globals().items()) if k[:1] == "C" and k[1:].isdigit()])

noise = random.Random(f"{{salt}}:{{os.environ.get('AUTORESEARCH_SEED', '0')}}").gauss(0.0, 0.01) * rho
if rho < 1:                                       # a code change redraws this part at every seed
    noise += random.Random(f"{{salt}}:{{os.environ.get('AUTORESEARCH_SEED', '0')}}:{{code}}").gauss(0.0, 0.01) * (
        1 - rho * rho) ** 0.5
offset = -gain + noise - 0.008                   # the evaluator scores LR 0.05, DEPTH 8 as 1.008
with open(os.environ["AUTORESEARCH_ARTIFACT"], "w") as f:
    json.dump({{"LR": 0.05, "DEPTH": 8, "offset": offset}}, f)
print("---")
print(f"val_bpb:          {{1.0 + offset + 0.008:.6f}}")
print("peak_vram_mb:     512.0")
print(f"time_budget_s:    {{os.environ.get('AUTORESEARCH_TIME_BUDGET', '1')}}")
'''
NOISE_SD = 0.01


def noisy_metric(salt, seed, gain=0.0, rho=1.0, code=""):
    """The val_bpb the stand-in evaluator prints for a run of NOISY_TRAIN with this salt, AUTORESEARCH_SEED=seed,
    gain, rho and code (its constants' repr), reproduced in-process: train.py's draw of the noise and its offset, the
    evaluator's score of LR 0.05, DEPTH 8 plus that offset, printed with 6 decimals (tests/test_noise.py checks it
    against real runs). rho 1: the seed alone decides the noise (any edit of the same gain has the same draws)."""
    import random
    noise = random.Random(f"{salt}:{seed}").gauss(0.0, NOISE_SD) * rho
    if rho < 1:
        noise += random.Random(f"{salt}:{seed}:{code}").gauss(0.0, NOISE_SD) * (1 - rho * rho) ** 0.5
    offset = -gain + noise - 0.008
    value = 1.0 + abs(0.05 - 0.05) * 10 + 8 / 1000 + offset
    return float(f"{value + 0.0:.6f}")


def make_noisy_target(root, salt=0, rho=1.0):
    """make_target with NOISY_TRAIN as train.py (committed on main), its noise drawn with this salt and rho; returns
    the target dir."""
    target = make_target(root)
    (target / "train.py").write_text(NOISY_TRAIN.format(salt=salt, rho=rho))
    repo = git.Repo(root)
    repo.git.commit("-qam", "noisy train.py")
    return target


def make_target(root, metric="val_bpb", goal="min", subdir="", budget=BUDGET):
    """A git repo at root with the tiny target (TIME_BUDGET = budget) in root/subdir, committed on main; returns the
    target dir."""
    target = root / subdir if subdir else root
    target.mkdir(parents=True, exist_ok=True)
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as c:
        c.set_value("user", "name", "test").set_value("user", "email", "test@example.com")
    (root / ".gitignore").write_text("__pycache__/\n")
    (target / "program.md").write_text("# program\nImprove val_bpb. Try the learning rate first.\n")
    value = "val_bpb" if goal == "min" else "3.0 - val_bpb"
    (target / "prepare.py").write_text(PREPARE.format(metric=metric, goal=goal, value=value, budget=budget))
    (target / "train.py").write_text(TRAIN.format(metric=metric, value=value))
    repo.git.add(A=True)
    repo.git.commit("-qm", "init")
    return target


def edit(description, old, new):
    """An answer in the agent's format with one SEARCH/REPLACE block."""
    return f"DESCRIPTION: {description}\n<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE\n"


CURVE_TRAIN = '''"""MUTABLE: test stand-in that trains for the budget and prints train.py's progress lines: its
loss at progress p is val_bpb + 2 (1 - p) + a seed's shift (sd 0.01) + jitter (sd 0.002); lrm is the warmup's
(WARMUP of the budget); val_bpb = 1 + 10 |LR - 0.05| + DEPTH / 1000, as the evaluator scores it."""
import json
import os
import random
import time

LR = 0.04
DEPTH = 8
WARMUP = 0.1

budget = float(os.environ.get("AUTORESEARCH_TIME_BUDGET", "1"))
rng = random.Random(os.environ.get("AUTORESEARCH_SEED", "0"))
val_bpb = 1.0 + abs(LR - 0.05) * 10 + DEPTH / 1000
shift, t0, step = rng.gauss(0.0, 0.01), time.time(), 0
while True:
    p = min((time.time() - t0) / budget, 1.0)
    lrm = min(1.0, p / WARMUP) if WARMUP > 0 else 1.0
    loss = val_bpb + 2.0 * (1 - p) + shift + rng.gauss(0.0, 0.002)
    print(f"step {{step:05d}} ({{100 * p:.1f}}%) | loss: {{loss:.4f}} | lrm: {{lrm:.2f}} | dt: 100ms | tok/s: 1,000 | "
          f"mfu: 0.0% | epoch: 1 | left: {{budget * (1 - p):.0f}}s", flush=True)
    if p >= 1.0:
        break
    step += 1
    time.sleep(0.1)
with open(os.environ["AUTORESEARCH_ARTIFACT"], "w") as f:
    json.dump({{"LR": LR, "DEPTH": DEPTH}}, f)
print("---")
print(f"val_bpb:          {{val_bpb:.6f}}")
print(f"time_budget_s:    {{os.environ.get('AUTORESEARCH_TIME_BUDGET', '1')}}")
'''


CURVE_BUDGET = 8                # seconds: long enough for a few looks at the curve (about one a second)


def make_curve_target(root, budget):
    """The tiny target with CURVE_TRAIN as its train.py and TIME_BUDGET = budget, committed on main."""
    target = make_target(root, budget=budget)
    (target / "train.py").write_text(CURVE_TRAIN.format())
    repo = git.Repo(root)
    repo.git.add(A=True)
    repo.git.commit("-qm", "a target with curves")
    return target
