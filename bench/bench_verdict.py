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
   harness.judge.verdict.judge and judge_paired, fed the measured numbers):
     strict  karpathy's ratchet: one baseline run, one run per candidate, strictly better (--confirm 0)
     margin  3 baseline runs, a margin of 2 noise sds, one confirmation run, seeds never shared (the old default)
     paired  3 baseline runs, each candidate's run r at the baseline's seed r, the sequential t-test with the tag's
             pooled paired sd, up to 4 runs, false-keep rate 2 % (the default)
     paired@P the paired rule at the largest --false-keep-rate P (of MATCH_RATES) whose no-ops are kept no more often
             than the margin rule's: the two at the same false-keep rate
   The best stays the baseline (each verdict judges an edit against it), so the shares are per verdict. Each rule
   judges the same draws of edits and seeds.

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
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchrepo import ROOT, bench_repo

sys.path.insert(0, str(ROOT))
from harness.run.runner import Outcome  # noqa: E402
from harness.judge.verdict import Rule, judge, judge_paired, pooled_of  # noqa: E402

# (name, [(old line, new line)]): applied to train.py's cpu-profile block and constants
EDITS = [
    ("no-op: a comment", [("    MATRIX_LR = 0.06 ", "    MATRIX_LR = 0.06  # unchanged ")]),
    ("no-op: init drawn anew", [("torch.manual_seed(SEED)", "torch.manual_seed(SEED + 7919)")]),
    ("DEPTH 4 -> 3", [("    DEPTH = 4\n", "    DEPTH = 3\n")]),
    ("DEPTH 4 -> 2", [("    DEPTH = 4\n", "    DEPTH = 2\n")]),
    ("batch 2**12 -> 2**11", [("    TOTAL_BATCH_SIZE = 2**12 ", "    TOTAL_BATCH_SIZE = 2**11 "),
                              ("    DEVICE_BATCH_SIZE = 16\n", "    DEVICE_BATCH_SIZE = 8\n")]),
    ("MATRIX_LR 0.06 -> 0.12", [("    MATRIX_LR = 0.06 ", "    MATRIX_LR = 0.12 ")]),
    ("MATRIX_LR 0.06 -> 0.03", [("    MATRIX_LR = 0.06 ", "    MATRIX_LR = 0.03 ")]),
    ("EMBEDDING_LR 0.6 -> 0.3", [("EMBEDDING_LR = 0.6 ", "EMBEDDING_LR = 0.3 ")]),
    ("WARMDOWN_RATIO 0.5 -> 0.3", [("WARMDOWN_RATIO = 0.5 ", "WARMDOWN_RATIO = 0.3 ")]),
    ("WARMDOWN_RATIO 0.5 -> 0.9", [("WARMDOWN_RATIO = 0.5 ", "WARMDOWN_RATIO = 0.9 ")]),
]
RULES = {                               # (the rule before its noise is measured, baseline runs)
    "strict": (Rule("min", confirm=0), 1),
    "margin": (Rule("min", confirm=1), 3),
    "paired": (Rule("min", confirm=3, verdict="paired"), 3),
}
MATCH_RATES = (0.05, 0.1, 0.2, 0.3, 0.4, 0.49)  # --false-keep-rate values tried for "paired at the margin rule's rate"


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


def one_tag(template, baseline_runs, table, names, rng, verdicts):
    """One simulated tag of `verdicts` verdicts by this rule (a Rule before its noise is measured, and its baseline
    runs); returns [(edit name, status, runs)] where runs counts every run a verdict cost (a paired rule's run of the
    best at a seed it never ran included)."""
    seeds = list(range(len(table["baseline"])))
    rng.shuffle(seeds)                                          # this tag's seeds (the paired rule's seed base)
    base_seeds = seeds[:baseline_runs]
    base_runs = [table["baseline"][s] for s in base_seeds]
    rule = Rule(template.goal, template.confirm, None, statistics.stdev(base_runs) if len(base_runs) > 1 else None,
                len(base_runs), verdict=template.verdict, false_keep=template.false_keep)
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
    p.add_argument("--save", metavar="JSON", help="write the measured table (every run's val_bpb and seconds) here")
    p.add_argument("--table", metavar="JSON", help="judge a table --save wrote instead of measuring one")
    args = p.parse_args()
    if args.table:
        saved = json.loads(Path(args.table).read_text())
        runs = {name: [tuple(run) for run in values] for name, values in saved.items()}
    else:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            repo, env = bench_repo(tmp, args.budget)
            source = (repo / "train.py").read_text()
            runs = {"baseline": measure(repo, env, source, range(args.seeds), tmp / "runs", "baseline")}
            for name, changes in EDITS:
                runs[name] = measure(repo, env, edited(source, changes), range(args.seeds), tmp / "runs", name)
        if args.save:
            Path(args.save).write_text(json.dumps(runs))
    table = {name: [m for m, _ in values] for name, values in runs.items()}
    wall = statistics.fmean(w for values in runs.values() for _, w in values)
    sd = statistics.stdev(table["baseline"])
    print(f"\nbudget {args.budget:g} s (cpu profile, shortened from 300 s), {args.seeds} seeds per edit, "
          f"{wall:.1f} s of train.py per run; baseline {statistics.fmean(table['baseline']):.4f}, noise sd {sd:.4f}")
    effect, kind = {}, {}
    print(f"{'edit':<32} {'effect':>9} {'in sd':>6} {'paired sd':>9} {'class':>8}")
    for name in [name for name in runs if name != "baseline"]:
        diffs = [b - m for m, b in zip(table[name], table["baseline"])]
        effect[name] = statistics.fmean(diffs)
        se = statistics.stdev(diffs) / len(diffs) ** 0.5
        kind[name] = ("no-op" if name.startswith("no-op") else "gain" if effect[name] > 2 * se else
                      "loss" if effect[name] < -2 * se else "unclear")
        print(f"{name:<32} {effect[name]:>+9.4f} {effect[name] / sd:>+6.2f} {statistics.stdev(diffs):>9.4f} "
              f"{kind[name]:>8}")
    names = [name for name in runs if name != "baseline"]
    groups = {"no-ops": lambda n: kind[n] == "no-op", "gains < 1 sd": lambda n: kind[n] == "gain" and
              effect[n] < sd, "gains 1-2 sd": lambda n: kind[n] == "gain" and sd <= effect[n] < 2 * sd,
              "gains < 2 sd": lambda n: kind[n] == "gain" and effect[n] < 2 * sd,
              "gains >= 2 sd": lambda n: kind[n] == "gain" and effect[n] >= 2 * sd,
              "losses": lambda n: kind[n] == "loss"}
    def judged(template, baseline_runs):
        rng = random.Random(0)                                  # every rule judges the same draws of edits and seeds
        return [v for _ in range(args.tags) for v in one_tag(template, baseline_runs, table, names, rng,
                                                             args.verdicts)]
    results = {rule: judged(*setting) for rule, setting in RULES.items()}
    noops = [name for name in names if kind[name] == "no-op"]

    def false_keeps(found):
        return statistics.fmean(status == "keep" for name, status, _ in found if name in noops)
    matched = None                              # the paired rule at the largest rate keeping no more no-ops than margin
    for rate in MATCH_RATES:
        found = judged(Rule("min", confirm=3, verdict="paired", false_keep=rate), 3)
        if false_keeps(found) <= false_keeps(results["margin"]):
            matched = (rate, found)
    if matched:
        results[f"paired@{matched[0]:g}"] = matched[1]
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
    for rule in [r for r in results if r.startswith("paired")]:
        if shares["margin"][small] and shares[rule][small] is not None:
            print(f"{rule} / margin: gains < 2 sd kept {shares[rule][small] / shares['margin'][small]:.2f}x, "
                  f"no-ops kept {shares[rule][0]:.1%} vs {shares['margin'][0]:.1%}, device-seconds per verdict "
                  f"{cost[rule] / cost['margin']:.2f}x")


if __name__ == "__main__":
    main()
