"""
Benchmark (not a test): the pretraining core on this machine's CPU with the full budget.

Prepares ../shared/data/corpora with the cpu profile in a throwaway cache, runs train.py for the real
TIME_BUDGET (no override), and prints what the issue asks for, measured in this one run:
  val_bpb, next to a unigram model's bpb on the same val split (the floor any LM must beat);
  tokens/s;
  start-up + evaluation overhead as a share of the budget (target <= 8 %);
  CPU MFU = model FLOP/s / matmul FLOP/s, the matmul peak measured by train.py at start-up (target >= 40 %).

Usage: uv run bench/bench_train_cpu.py [--corpora PATH] [--keep-cache DIR]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import prepare as P  # noqa: E402


class Unigram(torch.nn.Module):
    """Predicts every token with its training-set frequency (add-one smoothed), whatever the context."""

    def __init__(self, counts):
        super().__init__()
        self.logp = torch.nn.Parameter((counts + 1).log() - (counts + 1).sum().log(), requires_grad=False)

    def forward(self, x):
        return self.logp.expand(*x.shape, -1)


def unigram_bpb(prepared):
    tokenizer = P.Tokenizer.from_directory(prepared.tokenizer_dir)
    counts = torch.zeros(prepared.vocab_size, dtype=torch.float64)
    for path in P.train_files(prepared):
        texts = P.pq.read_table(path, columns=["text"]).column("text").to_pylist()
        for ids in tokenizer.encode(texts, prepend=tokenizer.get_bos_token_id()):
            counts += torch.bincount(torch.tensor(ids), minlength=prepared.vocab_size)
    return P.evaluate_bpb(Unigram(counts.float()), tokenizer, 64, prepared=prepared)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpora", default=str(REPO.parent / "shared" / "data" / "corpora"))
    parser.add_argument("--keep-cache", help="prepare into this folder instead of a temporary one")
    args = parser.parse_args()
    cache = Path(args.keep_cache or tempfile.mkdtemp(prefix="autoresearch-bench-"))
    env = {k: v for k, v in os.environ.items() if k != P.TIME_BUDGET_ENV}
    env["AUTORESEARCH_CACHE"] = str(cache)

    t0 = time.time()
    subprocess.run([sys.executable, "prepare.py", "--source", args.corpora, "--profile", "cpu"], cwd=REPO, env=env, check=True)
    print(f"prepare: {time.time() - t0:.1f}s")
    os.environ["AUTORESEARCH_CACHE"] = str(cache)
    prepared = P.load_prepared(cache)
    unigram = unigram_bpb(prepared)

    log = cache / "run.log"
    with open(log, "w") as f:
        result = subprocess.run([sys.executable, "train.py"], cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
    text = log.read_text()
    if result.returncode != 0 or "\n---\n" not in text:
        sys.exit(f"train.py failed (exit {result.returncode}); see {log}")
    summary = dict(re.findall(r"^(\w+):\s+(\S.*)$", text.split("\n---\n")[-1], re.M))
    budget = float(summary["time_budget_s"])
    overhead = float(summary["total_seconds"]) - float(summary["training_seconds"])

    print("--- bench_train_cpu")
    print(f"val_bpb:              {float(summary['val_bpb']):.4f}   (unigram on the same val split: {unigram:.4f}, ratio {float(summary['val_bpb']) / unigram:.3f})")
    print(f"tokens_per_sec:       {float(summary['tokens_per_sec']):,.0f}   ({summary['dtype']}, {summary['num_params_M']}M params, {summary['num_steps']} steps)")
    print(f"overhead_share:       {100 * overhead / budget:.1f} %   (start-up + excluded warm-up + eval {overhead:.1f}s of a {budget:g}s budget; eval {summary['eval_seconds']}s; target <= 8 %)")
    print(f"cpu_mfu:              {float(summary['mfu_percent']):.1f} %   (model FLOP/s / matmul peak {summary['peak_tflops']} TFLOP/s measured at start-up; target >= 40 %)")
    print(f"log: {log}")


if __name__ == "__main__":
    main()
