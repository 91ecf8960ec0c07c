"""
BENCHMARK: how often each verdict rule keeps real gains (power, by gain size) and no-ops (false keeps), and what a
verdict costs in device-seconds, on the real train.py (cpu profile, a short budget).

1. Measure: the unmodified train.py and each edit of EDITS (no-ops, losses, gains of different sizes) trained once per
   seed for --seeds seeds (0 .. N-1), plain train.py in a copy (it scores itself: these are honest edits). A train.py
   seeds init and data order from AUTORESEARCH_SEED, so the table holds what any run at that seed gives (up to the
   timing of a wall-clock budget, which is part of the noise). The true effect of an edit: the mean over all seeds of
   its difference to the baseline at the same seed; the noise sd: the baseline's sd over seeds.
2. Judge, side by side in one run: --tags simulated tags per rule, each --verdicts verdicts of edits drawn at random,
   every run's number looked up in the table at the seed the rule gives it (the rules' code itself:
   harness.verdict.judge and judge_paired, fed the measured numbers):
     strict  karpathy's ratchet: one baseline run, one run per candidate, strictly better (--confirm 0)
     margin  3 baseline runs, a margin of 2 noise sds, one confirmation run, seeds never shared (the old default)
     paired  3 baseline runs, each candidate's run r at the baseline's seed r, the sequential t-test with the tag's
             pooled paired sd, up to 4 runs, false-keep rate 2 % (the default)
   The best stays the baseline (each verdict judges an edit against it), so the shares are per verdict.

    uv run bench/bench_verdict.py                        # budget 10 s, 12 seeds: ~25 minutes on 2 cores
    uv run bench/bench_verdict.py --budget 5 --seeds 8   # ~10 minutes

Printed: the measured table (true effects in noise sds), then per rule the share of no-ops kept, the share of gains
kept by size (under 1 sd, 1-2 sd, above 2 sd), the share of losses kept, runs and device-seconds per verdict (the
measured wall time of train.py per run; the harness's own overhead, the same for every rule, left out), and the
ratios paired / margin. Goal (issue 21): at the same false-keep rate, the paired rule keeps >= 2x as many of the gains
under 2 noise sds as the margin rule, for <= 1.3x its device-seconds per verdict. Run it on a quiet machine: another
process changes a run's steps.
"""

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchrepo import ROOT, bench_repo

sys.path.insert(0, str(ROOT))
from harness.runner import Outcome  # noqa: E402
from harness.verdict import Rule, judge, judge_paired, pooled_of  # noqa: E402

# (name, [(old line, new line)]): applied to train.py's cpu-profile block and constants
EDITS = [
    ("no-op: a comment", [("    MATRIX_LR = 0.06 ", "    MATRIX_LR = 0.06  # unchanged ")]),
    ("no-op: init drawn anew", [("torch.manual_seed(SEED)", "torch.manual_seed(SEED + 7919)")]),
    ("MATRIX_LR 0.06 -> 0.045", [("    MATRIX_LR = 0.06 ", "    MATRIX_LR = 0.045 ")]),
    ("MATRIX_LR 0.06 -> 0.08", [("    MATRIX_LR = 0.06 ", "    MATRIX_LR = 0.08 ")]),
    ("EMBEDDING_LR 0.6 -> 0.9", [("EMBEDDING_LR = 0.6 ", "EMBEDDING_LR = 0.9 ")]),
    ("UNEMBEDDING_LR 0.004 -> 0.008", [("UNEMBEDDING_LR = 0.004 ", "UNEMBEDDING_LR = 0.008 ")]),
    ("WARMDOWN_RATIO 0.5 -> 0.3", [("WARMDOWN_RATIO = 0.5 ", "WARMDOWN_RATIO = 0.3 ")]),
    ("WARMDOWN_RATIO 0.5 -> 0.7", [("WARMDOWN_RATIO = 0.5 ", "WARMDOWN_RATIO = 0.7 ")]),
    ("WEIGHT_DECAY 0.2 -> 0.0", [("WEIGHT_DECAY = 0.2 ", "WEIGHT_DECAY = 0.0 ")]),
    ("SOFTCAP 15 -> 30", [("SOFTCAP = 15.0 ", "SOFTCAP = 30.0 ")]),
]
RULES = {
    "strict": Rule("min", confirm=0),
    "margin": Rule("min", confirm=1),
    "paired": Rule("min", confirm=3, paired=True),
}
BASELINE_RUNS = {"strict": 1, "margin": 3, "paired": 3}


def edited(source, changes):
    """train.py with these line edits applied; raises ValueError when a line is not there once."""
    for old, new in changes:
        if source.count(old) != 1:
            raise ValueError(f"{old!r} is not in train.py exactly once: update EDITS")
        source = source.replace(old, new)
    return source


def measure(repo, env, source, seeds, scratch, name):
    """[(val_bpb, wall seconds)] of this train.py, one run per seed (a fresh copy of prepare.py and it each time)."""
    found = []
    for seed in seeds:
        run = scratch / f"{name}-{seed}"
        run.mkdir(parents=True)
        (run / "prepare.py").write_text((repo / "prepare.py").read_text())
        (run / "train.py").write_text(source)
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "train.py"], cwd=run, env={**env, "AUTORESEARCH_SEED": str(seed),
                                                                         "AUTORESEARCH_THREADS": "2"},
                             capture_output=True, text=True, check=True).stdout
        found.append((float(next(line.split()[1] for line in out.splitlines() if line.startswith("val_bpb:"))),
                      time.monotonic() - t0))
        print(f"  {name:<32} seed {seed:>2}: val_bpb {found[-1][0]:.4f} ({found[-1][1]:.0f} s)", flush=True)
    return found


def outcome(metric):
    """A runner Outcome of a run with this metric (what the rules read)."""
    return Outcome(commit="0" * 40, metric=metric, memory_gb=0.0, seconds=0.0)


def one_tag(rule_name, table, names, rng, verdicts):
    """One simulated tag of `verdicts` verdicts by this rule; returns [(edit name, status, runs)] where runs counts
    every run a verdict cost (a paired rule's run of the best at a seed it never ran included)."""
    seeds = list(range(len(table["baseline"])))
    rng.shuffle(seeds)                                          # this tag's seeds (the paired rule's seed base)
    base_seeds = seeds[:BASELINE_RUNS[rule_name]]
    base_runs = [table["baseline"][s] for s in base_seeds]
    rule = RULES[rule_name]
    rule = Rule(rule.goal, rule.confirm, None, statistics.stdev(base_runs) if len(base_runs) > 1 else None,
                len(base_runs), paired=rule.paired)
    best_known, done, found = set(base_seeds), [], []
    for _ in range(verdicts):
        name = rng.choice(names)
        cost = [0]
        if rule.is_paired:
            def run_of(run):
                cost[0] += 1
                return outcome(table[name][seeds[run]])

            def best_at(run, outcome_):
                if seeds[run] not in best_known:                 # the best's first run at this seed: measured once
                    best_known.add(seeds[run])
                    cost[0] += 1
                return table["baseline"][seeds[run]], False, ""
            v = judge_paired(run_of(0), run_of, rule, best_at, pooled_of(rule, done))
            done.append((v.runs, v.best))
        else:
            own = [s for s in seeds if s not in base_seeds]
            rng.shuffle(own)

            def run_of(run):
                cost[0] += 1
                return outcome(table[name][own[run]])
            v = judge(run_of(0), run_of, rule, statistics.fmean(base_runs))
        found.append((name, v.status, cost[0]))
    return found


def main():
    """Measure the table, judge it by each rule, print both."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=10.0, help="training seconds per run (default 10)")
    p.add_argument("--seeds", type=int, default=12, help="seeds each edit is trained with (default 12)")
    p.add_argument("--tags", type=int, default=400, help="simulated tags per rule (default 400)")
    p.add_argument("--verdicts", type=int, default=20, help="verdicts per simulated tag (default 20)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        repo, env = bench_repo(tmp, args.budget)
        source = (repo / "train.py").read_text()
        runs = {"baseline": measure(repo, env, source, range(args.seeds), tmp / "runs", "baseline")}
        for name, changes in EDITS:
            runs[name] = measure(repo, env, edited(source, changes), range(args.seeds), tmp / "runs", name)
    table = {name: [m for m, _ in values] for name, values in runs.items()}
    wall = statistics.fmean(w for values in runs.values() for _, w in values)
    sd = statistics.stdev(table["baseline"])
    print(f"\nbudget {args.budget:g} s (cpu profile, shortened from 300 s), {args.seeds} seeds per edit, "
          f"{wall:.1f} s of train.py per run; baseline {statistics.fmean(table['baseline']):.4f}, noise sd {sd:.4f}")
    effect, kind = {}, {}
    print(f"{'edit':<32} {'effect':>9} {'in sd':>6} {'paired sd':>9} {'class':>8}")
    for name, _ in EDITS:
        diffs = [b - m for m, b in zip(table[name], table["baseline"])]
        effect[name] = statistics.fmean(diffs)
        se = statistics.stdev(diffs) / len(diffs) ** 0.5
        kind[name] = ("no-op" if name.startswith("no-op") else "gain" if effect[name] > 2 * se else
                      "loss" if effect[name] < -2 * se else "unclear")
        print(f"{name:<32} {effect[name]:>+9.4f} {effect[name] / sd:>+6.2f} {statistics.stdev(diffs):>9.4f} "
              f"{kind[name]:>8}")
    names = [name for name, _ in EDITS]
    groups = {"no-ops": lambda n: kind[n] == "no-op", "gains < 1 sd": lambda n: kind[n] == "gain" and
              effect[n] < sd, "gains 1-2 sd": lambda n: kind[n] == "gain" and sd <= effect[n] < 2 * sd,
              "gains < 2 sd": lambda n: kind[n] == "gain" and effect[n] < 2 * sd,
              "gains >= 2 sd": lambda n: kind[n] == "gain" and effect[n] >= 2 * sd,
              "losses": lambda n: kind[n] == "loss"}
    rng = random.Random(0)
    results = {rule: [v for _ in range(args.tags) for v in one_tag(rule, table, names, rng, args.verdicts)]
               for rule in RULES}
    print(f"\n{args.tags} tags x {args.verdicts} verdicts per rule, edits drawn at random; kept share by group:")
    print(f"{'rule':<8} " + " ".join(f"{g:>13}" for g in groups) + f" {'runs/verdict':>12} {'device-s':>9}")
    shares = {}
    for rule, found in results.items():
        row = []
        for test in groups.values():
            chosen = [status for name, status, _ in found if test(name)]
            row.append(sum(s == "keep" for s in chosen) / len(chosen) if chosen else None)
        shares[rule] = row
        per = statistics.fmean(c for _, _, c in found)
        print(f"{rule:<8} " + " ".join(f"{x:>13.1%}" if x is not None else f"{'-':>13}" for x in row)
              + f" {per:>12.2f} {per * wall:>9.1f}")
    cost = {rule: statistics.fmean(c for _, _, c in found) for rule, found in results.items()}
    small = list(groups).index("gains < 2 sd")
    if shares["margin"][small]:
        print(f"paired / margin: gains < 2 sd kept {shares['paired'][small] / shares['margin'][small]:.2f}x, "
              f"no-ops kept {shares['paired'][0]:.1%} vs {shares['margin'][0]:.1%}, device-seconds per verdict "
              f"{cost['paired'] / cost['margin']:.2f}x")


if __name__ == "__main__":
    main()
