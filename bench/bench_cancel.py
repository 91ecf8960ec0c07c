"""
BENCHMARK: early cancellation (harness/judge/curves.py). A campaign of agent.py with --cancel off on the real train.py (cpu
profile, --proposer random over the constants that leave the schedule alone, so every point may be cancelled) records
every run's curve; the rule is then replayed on those curves for several k and warm-up values: the device time it would
have saved (a cancelled run's rest, its evaluation and its further runs) as a share of the device time of the discarded
experiments, and its false cancels (an experiment that was kept, or a near-miss: a discard within NEAR bpb of the best
at the same seeds, or better, that the rule would have stopped). Then the same campaign (the same seed: the same points)
live with --cancel on, side by side: experiments per hour.

    uv run bench/bench_cancel.py                                  # budget 60 s, 20 experiments each way: ~1 h
    uv run bench/bench_cancel.py --budget 30 --experiments 16     # what docs/benchmarks.md shows
    uv run bench/bench_cancel.py --table cancel.json              # print a saved run's table again

Goal (issue 23): >= 30 % of the discards' device time saved with 0 false cancels in the replay at the default rule;
experiments/hour up by >= 25 % live. Run it on a quiet machine: another process changes a run's steps.
"""

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchrepo import ROOT, bench_repo, parse_bench_args, prepare_cache, save

sys.path.insert(0, str(ROOT))
from harness.judge import curves  # noqa: E402

TAG = "bench"
# the searched constants: none of the schedule's (curves.SCHEDULE), whose changes are never cancelled
SPACE = """
## Search space
- MATRIX_LR: low=0.01 high=0.3 log
- EMBEDDING_LR: low=0.1 high=3.0 log
- UNEMBEDDING_LR: low=0.001 high=0.03 log
- SCALAR_LR: low=0.1 high=2.0 log
- WEIGHT_DECAY: low=0.01 high=0.6 log
- ADAM_BETA1: low=0.6 high=0.95
- DEPTH: low=2 high=6
"""
NEAR = 0.01          # a discard whose paired gain is at least -NEAR (bpb) is a near-miss: cancelling it is false
GRID = [(k, w) for k in (2.0, 3.0, 4.0) for w in (0.3, 0.5, 0.7)]


def campaign(tmp, budget, experiments, seed, cancel, timeout):
    """One agent.py campaign in a fresh repository. Returns its record: the experiments (what the replay needs of
    each) and the baseline's curves, its wall time, experiments per hour."""
    tmp.mkdir(parents=True)
    repo, env = bench_repo(tmp, budget)
    (repo / "program.md").write_text((repo / "program.md").read_text() + SPACE)
    subprocess.run(["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qam", "space"], cwd=repo,
                   check=True)
    argv = [sys.executable, str(ROOT / "agent.py"), "--tag", TAG, "--target", str(repo), "--proposer", "random",
            "--seed", str(seed), "--max-experiments", str(experiments), "--no-holdout", "--cancel", cancel,
            "--timeout", str(timeout)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"agent.py failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    events = [json.loads(line) for line in (repo / "events.jsonl").read_text().splitlines()]
    return record(repo, events, budget)


def ts(event):
    return datetime.datetime.fromisoformat(event["ts"]).timestamp()


def record(repo, events, budget):
    """What the replay and the table need of a finished campaign (events.jsonl and the curves beside the logs)."""
    exps = [e for e in events if e["event"] == "experiment"]
    ends = [e for e in events if e["event"] == "run_end"]
    started = {e["n"]: ts(e) for e in events if e["event"] == "started"}

    def points(log):
        c = curves.load(log)
        return [[q.progress, q.loss, q.lrm] for q in c.points] if c else None

    def show(commit, rel="train.py"):
        return subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=repo, capture_output=True, text=True).stdout

    baseline = [p for e in ends if e["commit"] == exps[0]["commit"] and e["metric"] is not None
                and (p := points(e["log"]))]
    found = []
    for e in exps[1:]:
        mine = [r for r in ends if r["n"] == e["n"]]
        first = next((r for r in mine if not r.get("run") and not r.get("best")), None)
        before = [r for r in ends if r["commit"] == e["base"][:7] and r["metric"] is not None
                  and ts(r) < started.get(e["n"], ts(e))]
        best = [p for r in before if (p := points(r["log"]))]
        same = [r for r in before if first and r.get("seed") == first.get("seed")]
        near = e["status"] == "discard" and e["kind"] == "ok" and (e.get("gain") or -1.0) >= -NEAR
        found.append(dict(
            n=e["n"], status=e["status"], near=near, metric=e["metric"], cancelled=e.get("cancelled"),
            device_s=sum(r["train_seconds"] + r["eval_seconds"] for r in mine),
            first_train_s=first["train_seconds"] if first else 0.0,
            curve=points(first["log"]) if first else None, best=best, gain=e.get("gain"),
            paired=points(same[-1]["log"]) if same else None,
            exempt=bool(curves.schedule_changed(show(e["full_commit"]), show(e["base"])))))
    wall = ts(exps[-1]) - ts(exps[0])
    return dict(budget=budget, baseline=baseline, experiments=found, wall=wall,
                per_hour=3600 * (len(exps) - 1) / wall if wall > 0 else None)


def as_curve(points):
    return curves.Curve(curves.Point(p, loss, lrm) for p, loss, lrm in points)


def replay(rec, k, warmup):
    """The rule replayed on a --cancel off campaign: (cancelled, device-seconds saved, the discards' device-seconds,
    false cancels: [n])."""
    baseline = [as_curve(p) for p in rec["baseline"]]
    cancelled, saved, false = 0, 0.0, []
    for e in rec["experiments"]:
        if e["curve"] is None or e["exempt"] or e["status"] == "crash":
            continue
        paired = as_curve(e["paired"]) if e.get("paired") else None
        found = curves.decide(as_curve(e["curve"]), [as_curve(p) for p in e["best"]], baseline, k, warmup, paired)
        if found is None:
            continue
        cancelled += 1
        saved += e["device_s"] - e["first_train_s"] * found.at
        if e["status"] == "keep" or e["near"]:
            false.append(e["n"])
    discards = sum(e["device_s"] for e in rec["experiments"] if e["status"] == "discard")
    return cancelled, saved, discards, false


def table(results):
    """The printed table (see the module docstring)."""
    off, on = results["off"], results.get("on")
    exps = off["experiments"]
    lines = [f"replay on the --cancel off campaign: {len(exps)} experiments, "
             f"{sum(e['status'] == 'keep' for e in exps)} kept, {sum(e['status'] == 'discard' for e in exps)} "
             f"discarded ({sum(e['near'] for e in exps)} near-misses: within {NEAR} bpb of the best at the same "
             "seeds, or better), "
             f"{sum(e['status'] == 'crash' for e in exps)} crashed; {len(off['baseline'])} baseline curves; "
             f"{sum(e['exempt'] for e in exps)} exempt (schedule changed)", "",
             f"{'k':>4} {'warm-up':>7} {'cancelled':>9} {'saved s':>8} {'of discards':>11}  false cancels"]
    for k, w in GRID:
        cancelled, saved, discards, false = replay(off, k, w)
        mark = "  <- the default" if (k, w) == (curves.K, curves.WARMUP) else ""
        lines.append(f"{k:>4g} {w:>7.0%} {cancelled:>9} {saved:>8.0f} {saved / discards if discards else 0:>11.1%}  "
                     f"{len(false)} {false if false else ''}{mark}")
    if on:
        n_on = sum(1 for e in on["experiments"] if e["cancelled"])
        lines += ["", f"live, the same points: --cancel off {off['per_hour']:.1f} exp/h, --cancel on "
                  f"{on['per_hour']:.1f} exp/h ({on['per_hour'] / off['per_hour']:.2f}x); {n_on} cancelled live, "
                  f"statuses {'the same' if statuses(on) == statuses(off) else 'different'} apart from them"]
    return "\n".join(lines)


def statuses(rec):
    """{n: status} of the experiments that were not cancelled."""
    return {e["n"]: e["status"] for e in rec["experiments"] if not e["cancelled"]}


def main():
    """Run the two campaigns, print and optionally save the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=60.0, help="seconds of training per run (default 60)")
    p.add_argument("--experiments", type=int, default=20, help="experiments per campaign after the baseline")
    p.add_argument("--seed", type=int, default=0, help="the random proposer's seed (both campaigns)")
    p.add_argument("--timeout", type=float, help="agent.py --timeout (default 2.5 x the budget)")
    p.add_argument("--no-live", action="store_true", help="only the --cancel off campaign and its replay")
    p.add_argument("--resume", metavar="FILE", help="a --save file: its campaigns are kept, the missing ones run")
    args = parse_bench_args(p, table)
    results = json.loads(Path(args.resume).read_text()) if args.resume else {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prepare_cache(tmp, args.eval_tokens)
        for cancel in [c for c in (("off",) if args.no_live else ("off", "on")) if c not in results]:
            print(f"campaign --cancel {cancel} ...", flush=True)
            results[cancel] = campaign(tmp / cancel, args.budget, args.experiments, args.seed, cancel,
                                       args.timeout or 2.5 * args.budget)
            print(f"  {args.experiments} experiments, {results[cancel]['per_hour']:.1f} exp/h", flush=True)
            save(results, args.save)
    print()
    print(table(results))


if __name__ == "__main__":
    main()
