"""
BENCHMARK: what the verdict's protections cost per experiment on the cpu profile: the hermetic run dir (export of
the commit, guard, clean-up), the sandbox, the artifact export inside train.py and the separate evaluation, against
the old way (train.py evaluating itself in the user's checkout). Both measured side by side in one run on the real
corpora (../shared/data/corpora), with a shortened budget (the added cost does not depend on it: start-up, export and
evaluation are fixed costs), reported as seconds and as a share of the real 300 s budget.

    uv run bench/bench_hermetic.py                  # budget 20 s, 3 runs each way
    uv run bench/bench_hermetic.py --budget 60 --runs 2

plain(i)  = wall time of `python train.py` in a checkout, no harness (it evaluates in-process)
agent(i)  = an experiment's wall time under agent.py (--proposer random): export + sandboxed train.py + the separate
            `prepare.py --evaluate` + the harness's bookkeeping
added     = median(agent) - median(plain). Target: <= 5 % of 300 s.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchrepo import ROOT, bench_repo


def main():
    """Measure both ways and print the comparison."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=20.0, help="training seconds per run (default 20)")
    p.add_argument("--runs", type=int, default=3, help="runs each way (default 3)")
    p.add_argument("--sandbox", default="auto", choices=("auto", "off"), help="agent.py's --sandbox (default auto)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo, env = bench_repo(Path(tmp), args.budget)

        plain, plain_eval = [], []
        for _ in range(args.runs):
            t0 = time.monotonic()
            out = subprocess.run([sys.executable, "train.py"], cwd=repo, env=env, capture_output=True, text=True)
            plain.append(time.monotonic() - t0)
            plain_eval += [float(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("eval_seconds:")]
        subprocess.run(["git", "status", "--porcelain"], cwd=repo, check=True)
        subprocess.run([sys.executable, str(ROOT / "agent.py"), "--tag", "bench", "--target", str(repo), "--proposer",
                        "random", "--max-experiments", str(args.runs - 1), "--sandbox", args.sandbox,
                        "--baseline-runs", "1", "--confirm", "0"], cwd=repo,
                       env=env, check=True, capture_output=True)
        events = [json.loads(line) for line in (repo / "events.jsonl").read_text().splitlines()]
        agent = [e["wall_seconds"] for e in events if e["event"] == "experiment"]
        ends = [e for e in events if e["event"] == "run_end"]
        export = []
        for e in ends:
            export += [float(line.split(" in ")[-1].rstrip("s")) for line in Path(e["log"]).read_text().splitlines()
                       if line.startswith("evaluate_bpb: model exported")]

    added = statistics.median(agent) - statistics.median(plain)
    print(f"budget {args.budget:g}s, {args.runs} runs each way, sandbox {args.sandbox}")
    print(f"plain train.py (evaluates itself):   median {statistics.median(plain):6.1f}s "
          f"(in-process eval {statistics.median(plain_eval):.1f}s)")
    print(f"agent.py experiment (all included):  median {statistics.median(agent):6.1f}s "
          f"(train.py {statistics.median(e['train_seconds'] for e in ends):.1f}s incl. export "
          f"{statistics.median(export):.1f}s; separate evaluation {statistics.median(e['eval_seconds'] for e in ends):.1f}s)")
    print(f"added per experiment: {added:+.1f}s = {100 * added / 300:+.1f}% of the 300 s budget (target <= 5 %)")


if __name__ == "__main__":
    main()
