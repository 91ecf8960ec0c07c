"""
BENCHMARK: research yield of the numeric search. Campaigns of agent.py on the real train.py (cpu profile, a short
budget), one fresh repository each, --proposer random, tpe and cmaes side by side in one run (repeat r of every
proposer runs before repeat r+1, with --seed r), each for the same --experiments experiments after the baseline under
the default verdict rule. Then the final best of each campaign and the unmodified train.py are trained again with
--fresh seeds that no campaign used (plain train.py runs: sampler edits are honest), and each best is judged by its
re-measured gain: the baseline's mean minus its mean at the same seeds.

    uv run bench/bench_search.py                                   # budget 20 s, 24 experiments, 3 repeats: hours
    uv run bench/bench_search.py --budget 10 --experiments 10 --repeats 2 --timeout 40   # docs/benchmarks.md
    uv run bench/bench_search.py --table bench-search.json         # print a saved run's table again

Printed per proposer: the median re-measured gain (val_bpb, positive is better), its spread over the repeats, the median
gain the campaign reported (its own best vs its own baseline), the median number of experiments until the reported gain
reached 90 % of its final value, keeps, crashes, and the closest miss (its baseline's metric minus the best measured
candidate's, kept or not); and each sampler's median re-measured gain over random's. Goal (issue 22): TPE or CMA-ES with
a median re-measured gain >= 1.5x random's at the same number of experiments. Run it on a quiet machine: another process
changes a run's steps.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchrepo import ROOT, bench_repo, parse_bench_args, prepare_cache, save

PROPOSERS = ("random", "tpe", "cmaes")
TAG = "bench"


def campaign(tmp, budget, proposer, seed, experiments, devices, timeout):
    """One agent.py campaign in a fresh repository. Returns {proposer, seed, train.py of the final best, the
    experiment events, wall seconds}."""
    tmp.mkdir(parents=True)
    repo, env = bench_repo(tmp, budget)
    t0 = time.monotonic()
    argv = [sys.executable, str(ROOT / "agent.py"), "--tag", TAG, "--target", str(repo), "--proposer", proposer,
            "--seed", str(seed), "--max-experiments", str(experiments), "--no-holdout", "--baseline-runs", "2"]
    argv += ["--timeout", str(timeout)] if timeout else []
    done = subprocess.run(argv + (["--devices", devices] if devices else []), env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"agent.py failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    events = [json.loads(line) for line in (repo / "events.jsonl").read_text().splitlines()]
    best = subprocess.run(["git", "show", f"autoresearch/{TAG}:train.py"], cwd=repo, capture_output=True, text=True,
                          check=True).stdout
    return dict(proposer=proposer, seed=seed, best=best, wall=time.monotonic() - t0,
                experiments=[e for e in events if e.get("event") == "experiment"])


def remeasure(tmp, repo, env, source, seeds, name):
    """[val_bpb] of this train.py, one plain run per seed (its own copy of prepare.py and train.py)."""
    found = []
    for seed in seeds:
        run = tmp / name / f"run-{seed}"
        run.mkdir(parents=True)
        (run / "prepare.py").write_text((repo / "prepare.py").read_text())
        (run / "train.py").write_text(source)
        out = subprocess.run([sys.executable, "train.py"], cwd=run, env={**env, "AUTORESEARCH_SEED": str(seed)},
                             capture_output=True, text=True)
        value = next((float(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("val_bpb:")),
                     None)
        found.append(value if value is not None else float("nan"))
        print(f"  re-measure {name:<16} seed {seed}: val_bpb {found[-1]:.4f}", flush=True)
    return found


def to_90(experiments):
    """Experiments until the campaign's reported gain (its baseline minus its best so far) first reached 90 % of
    its final value; None when it found no gain."""
    base = experiments[0]["metric"]
    bests = [e["metric"] for e in experiments if e["status"] == "keep"]
    final = base - min(bests)
    if final <= 0:
        return None
    best = base
    for e in experiments[1:]:
        if e["status"] == "keep":
            best = min(best, e["metric"])
        if base - best >= 0.9 * final:
            return e["n"]
    return None


def closest(c):
    """How far the campaign's best measured candidate (kept or not) got: its baseline's metric minus the lowest
    metric of an experiment after it (positive: one measured better than the baseline's mean)."""
    measured = [e["metric"] for e in c["experiments"][1:] if e["status"] != "crash" and not e.get("cancelled")]
    return c["experiments"][0]["metric"] - min(measured) if measured else float("nan")


def table(results):
    """The printed table (see the module docstring). A run stopped before the re-measurement (--save keeps each
    campaign as it ends) shows what the campaigns reported; a campaign that kept nothing has a re-measured gain of 0
    by construction (its best is the unmodified train.py)."""
    if "baseline" not in results:
        results = dict(results, baseline=[0.0])
        for c in results["campaigns"]:
            kept = any(e["status"] == "keep" for e in c["experiments"][1:])
            c["remeasured"] = [float("nan") if kept else 0.0]
        head = "not re-measured (stopped before it): a campaign that kept nothing has a gain of 0"
    else:
        sd = statistics.stdev(results["baseline"]) if len(results["baseline"]) > 1 else float("nan")
        mean = statistics.fmean(results["baseline"])
        head = f"baseline re-measured: val_bpb {mean:.4f} (seeds {results['fresh']}; sd {sd:.4f})"
    base = statistics.fmean(results["baseline"])
    lines = [head, "",
             f"{'proposer':<8} {'re-measured gain (median, min..max)':<38} {'reported gain':>13} {'exp to 90%':>10} "
             f"{'keeps':>5} {'crashes':>7} {'hours':>6} {'closest':>8}"]
    medians = {}
    for p in PROPOSERS:
        runs = [c for c in results["campaigns"] if c["proposer"] == p]
        if not runs:
            continue
        gains = [base - statistics.fmean(c["remeasured"]) for c in runs]
        reported = [c["experiments"][0]["metric"] - min(e["metric"] for e in c["experiments"] if e["status"] == "keep")
                    for c in runs]
        reach = [r for c in runs if (r := to_90(c["experiments"])) is not None]
        medians[p] = statistics.median(gains)
        lines.append(f"{p:<8} {medians[p]:+.4f} ({min(gains):+.4f} .. {max(gains):+.4f}){'':<13} "
                     f"{statistics.median(reported):>+13.4f} {statistics.median(reach) if reach else '-':>10} "
                     f"{sum(sum(e['status'] == 'keep' for e in c['experiments'][1:]) for c in runs):>5} "
                     f"{sum(sum(e['status'] == 'crash' for e in c['experiments']) for c in runs):>7} "
                     f"{sum(c['wall'] for c in runs) / 3600:>6.2f} {statistics.median(map(closest, runs)):>+8.4f}")
    if medians.get("random", 0) > 0:
        lines.append("")
        lines += [f"{p} / random: {medians[p] / medians['random']:.2f}x median re-measured gain" for p in medians
                  if p != "random"]
    return "\n".join(lines)


def main():
    """Run the campaigns and the re-measurement, print and optionally save the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=20.0, help="seconds of training per run (default 20)")
    p.add_argument("--experiments", type=int, default=24, help="experiments per campaign after the baseline")
    p.add_argument("--repeats", type=int, default=3, help="campaigns per proposer, --seed 0 .. repeats-1")
    p.add_argument("--fresh", type=int, default=3, help="seeds of the re-measurement (none a campaign used)")
    p.add_argument("--devices", help="agent.py --devices for the campaigns (e.g. cpu:2); default one run at a time")
    p.add_argument("--timeout", type=float, help="agent.py --timeout (a point that builds a huge model times out: "
                   "a shorter timeout wastes less; default agent.py's)")
    p.add_argument("--proposers", default=",".join(PROPOSERS), help="comma-separated subset of random,tpe,cmaes")
    args = parse_bench_args(p, table)
    fresh = [900_001 + i for i in range(args.fresh)]   # far from any seed a campaign draws (secrets: < 2**31 too,
    results = dict(fresh=fresh, budget=args.budget, experiments=args.experiments, campaigns=[])   # but unlikely)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prepare_cache(tmp, args.eval_tokens)
        for seed in range(args.repeats):
            for proposer in args.proposers.split(","):
                print(f"campaign {proposer} seed {seed} ...", flush=True)
                c = campaign(tmp / f"{proposer}-{seed}", args.budget, proposer, seed, args.experiments, args.devices,
                             args.timeout)
                print(f"  {len(c['experiments']) - 1} experiments in {c['wall']:.0f} s, "
                      f"{sum(e['status'] == 'keep' for e in c['experiments'][1:])} kept", flush=True)
                results["campaigns"].append(c)
                save(results, args.save)       # kept as it goes: a stopped bench keeps its campaigns
        (tmp / "remeasure").mkdir()
        repo, env = bench_repo(tmp / "remeasure", args.budget)
        results["baseline"] = remeasure(tmp, repo, env, (ROOT / "train.py").read_text(), fresh, "baseline")
        for c in results["campaigns"]:
            same = c["best"] == (ROOT / "train.py").read_text()
            c["remeasured"] = results["baseline"] if same else remeasure(tmp, repo, env, c["best"], fresh,
                                                                         f"{c['proposer']}-{c['seed']}")
    save(results, args.save)
    print()
    print(table(results))


if __name__ == "__main__":
    main()
