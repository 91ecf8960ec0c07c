"""
BENCHMARK: does the gain a search reports hold up when measured again? The random proposer runs N experiments on the
cpu profile three times, side by side in one run: with karpathy's strict single-run ratchet (--baseline-runs 1
--confirm 0), the margin rule (--verdict margin: 3 baseline runs, a margin of 2 noise sd, one confirmation run) and the
paired rule (agent.py's default: runs paired with the best's at the same seeds, a sequential t-test).
Then the baseline and each search's final best are trained again R times with fresh seeds (plain train.py in a copy
of the commit; it scores itself, honestly: these are the random proposer's edits) and the gains compared.

    uv run bench/bench_noise.py                         # budget 20 s, 20 experiments each way, 3 re-runs
    uv run bench/bench_noise.py --budget 30 --experiments 10

reported gain    = baseline metric - final best metric, as the search's results.tsv says (lower is better)
re-measured gain = mean of R baseline re-runs - mean of R re-runs of the final best
Target: the noise-aware reported gains within one noise sd (their baseline runs' sd) of the re-measured ones.
The budget is shortened from 300 s for time: stated in the output; with a wall-clock budget on a shared machine,
run it on a quiet one.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchrepo import ROOT, bench_repo

MODES = {"strict": ["--baseline-runs", "1", "--confirm", "0"], "margin": ["--verdict", "margin"], "paired": []}


def search(repo, env, tag, flags, experiments):
    """agent.py on tag with the random proposer; returns the tag's "experiment" events."""
    subprocess.run([sys.executable, str(ROOT / "agent.py"), "--tag", tag, "--target", str(repo), "--proposer",
                    "random", "--max-experiments", str(experiments), *flags], cwd=repo, env=env, check=True,
                   capture_output=True)
    events = [json.loads(line) for line in (repo / "events.jsonl").read_text().splitlines()]
    return [e for e in events if e["event"] == "experiment" and e["tag"] == tag]


def remeasure(repo, env, commit, seeds, scratch):
    """val_bpb of train.py at commit, trained once per seed (a fresh copy of the commit's files each time)."""
    values = []
    for seed in seeds:
        run = scratch / f"{commit[:7]}-{seed}"
        run.mkdir(parents=True)
        for name in ("prepare.py", "train.py"):
            (run / name).write_text(subprocess.run(["git", "show", f"{commit}:{name}"], cwd=repo, check=True,
                                                   capture_output=True, text=True).stdout)
        out = subprocess.run([sys.executable, "train.py"], cwd=run, env={**env, "AUTORESEARCH_SEED": str(seed)},
                             capture_output=True, text=True, check=True).stdout
        values.append(float(next(line.split()[1] for line in out.splitlines() if line.startswith("val_bpb:"))))
    return values


def main():
    """Run both searches and the re-measurements; print one table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=20.0, help="training seconds per run (default 20)")
    p.add_argument("--experiments", type=int, default=20, help="experiments after the baseline, each way (default 20)")
    p.add_argument("--reruns", type=int, default=3, help="re-runs of the baseline and of each best (default 3)")
    args = p.parse_args()
    seeds = [2**31 + 90001 + i for i in range(args.reruns)]  # never a search's (below 2^31, or a base below 2^31 + run)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        repo, env = bench_repo(tmp, args.budget)
        found = {mode: search(repo, env, f"bench-{mode}", flags, args.experiments) for mode, flags in MODES.items()}
        baseline_commit = found["strict"][0]["full_commit"]
        base = remeasure(repo, env, baseline_commit, seeds, tmp / "runs")
        noise_sd = found["margin"][0]["noise_sd"]
        print(f"budget {args.budget:g} s (shortened from 300 s for time), {args.experiments} random experiments each "
              f"way, {args.reruns} re-runs; noise sd from the margin rule's baseline runs: {noise_sd:.4f}")
        print(f"baseline re-measured: {statistics.fmean(base):.4f} ({', '.join(f'{v:.4f}' for v in base)})")
        print(f"{'verdict':<12} {'kept':>4} {'reported gain':>14} {'re-measured gain':>17} {'difference':>11} "
              f"{'in noise sd':>11}")
        for mode, history in found.items():
            best = [e for e in history if e["status"] == "keep"][-1]
            reported = history[0]["metric"] - best["metric"]
            again = remeasure(repo, env, best["full_commit"], seeds, tmp / "runs") if best["n"] else base
            measured = statistics.fmean(base) - statistics.fmean(again)
            kept = sum(e["status"] == "keep" for e in history[1:])
            print(f"{mode:<12} {kept:>4} {reported:>+14.4f} {measured:>+17.4f} {reported - measured:>+11.4f} "
                  f"{(reported - measured) / noise_sd:>+11.2f}")


if __name__ == "__main__":
    main()
