"""
BENCHMARK: agent.py's harness overhead per iteration, i.e. what the loop itself costs on top of training and
the LLM. Offline: a loopback LLM (tests/llm_server.py, real anthropic SDK, simulated latency) and the tiny
train.py of tests/agent_target.py in a throwaway git repo.

    python bench/bench_agent.py                 # 12 experiments after the baseline
    python bench/bench_agent.py --experiments 30 --latency 0.2

overhead(n) = (time of experiment n's event - time of experiment n-1's event)
              - training subprocess seconds(n) - LLM seconds(n)
so it covers everything between two results: prompt building, parsing and applying the edit, git commit and
ref, the frozen-file hashes, summary parsing, records with fsync, the reset. Target: median <= 0.5 s.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import agent  # noqa: E402
from agent_target import edit, make_target  # noqa: E402
from llm_server import ScriptedLLM  # noqa: E402


def main():
    """Run the loop on a throwaway repo and print the overhead's median and p90."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiments", type=int, default=12, help="experiments after the baseline (default 12)")
    p.add_argument("--latency", type=float, default=0.05, help="simulated LLM latency in seconds (default 0.05)")
    args = p.parse_args()

    # one keep, then discards (each one resets the branch): the slower path of the ratchet
    answers = [edit("raise LR", "LR = 0.04", "LR = 0.05")]
    answers += [edit(f"LR {0.05 + i / 1000:.3f}", "LR = 0.05", f"LR = {0.05 + i / 1000:.3f}")
                for i in range(1, args.experiments)]
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        cache.mkdir()
        (cache / "ready").touch()
        os.environ.update(AUTORESEARCH_CACHE=str(cache), ANTHROPIC_API_KEY="bench-key-not-secret")
        os.environ.pop("AUTORESEARCH_TIME_BUDGET", None)
        target = make_target(Path(tmp) / "repo")
        with ScriptedLLM(answers, delay=args.latency) as llm:
            code = agent.main(["--tag", "bench", "--target", str(target), "--proposer", "anthropic", "--base-url",
                               llm.anthropic_url, "--max-experiments", str(args.experiments), "--timeout", "60",
                               "--baseline-runs", "1", "--confirm", "0"])
        if code != 0:
            sys.exit(f"agent.main exited with {code}")
        experiments = [e for e in map(json.loads, (target / "events.jsonl").read_text().splitlines())
                       if e["event"] == "experiment"]

    stamps = [datetime.datetime.fromisoformat(e["ts"]).timestamp() for e in experiments]
    overhead = sorted(stamps[i] - stamps[i - 1] - e["train_seconds"] - e["llm_seconds"]
                      for i, e in enumerate(experiments) if i > 0)
    p90 = overhead[min(len(overhead) - 1, round(0.9 * (len(overhead) - 1)))]
    train = statistics.median(e["train_seconds"] for e in experiments[1:])
    llm_s = statistics.median(e["llm_seconds"] for e in experiments[1:])
    print(f"{len(overhead)} iterations: harness overhead median {statistics.median(overhead):.3f}s, "
          f"p90 {p90:.3f}s, max {overhead[-1]:.3f}s (median training subprocess {train:.3f}s, LLM {llm_s:.3f}s)")


if __name__ == "__main__":
    main()
