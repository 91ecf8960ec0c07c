"""
BENCHMARK helper: the setting the agent benchmarks share. A prepared cpu-profile cache (the one in
$AUTORESEARCH_CACHE if it is ready, else one made from ../shared/data/corpora in the temporary folder) and a
throwaway git repository holding this project's prepare.py, train.py and program.md, committed on main.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPORA = ROOT.parent / "shared" / "data" / "corpora"


def bench_repo(tmp, budget):
    """(repo dir, environment) under the folder tmp: the environment has no API keys, the prepared cache and
    AUTORESEARCH_TIME_BUDGET = budget seconds."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["AUTORESEARCH_CACHE"] = os.environ.get("AUTORESEARCH_CACHE") or str(tmp / "cache")
    env["AUTORESEARCH_TIME_BUDGET"] = f"{budget:g}"
    ready = subprocess.run([sys.executable, "prepare.py", "--check"], cwd=ROOT, env=env, capture_output=True)
    if ready.returncode != 0:
        subprocess.run([sys.executable, "prepare.py", "--source", str(CORPORA), "--profile", "cpu"], cwd=ROOT,
                       env=env, check=True, capture_output=True)
    repo = tmp / "repo"
    repo.mkdir()
    for name in ("prepare.py", "train.py", "program.md", ".gitignore"):
        shutil.copy(ROOT / name, repo / name)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "init"], cwd=repo, check=True)
    return repo, env


def parse_bench_args(p, table):
    """Add the shared flags (add_bench_flags) and parse; with --table FILE print table(the saved results) and exit."""
    add_bench_flags(p)
    args = p.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        sys.exit(0)
    return args


def add_bench_flags(p):
    """The flags the campaign benchmarks share: --eval-tokens, --save, --table."""
    p.add_argument("--eval-tokens", type=int, default=16384, help="prepare.py --eval-tokens of the bench's data "
                   "(default 16384: a quarter of the cpu profile's, so that evaluation does not dominate a short run)")
    p.add_argument("--save", metavar="FILE", help="write the measurements as JSON")
    p.add_argument("--table", metavar="FILE", help="print the table of a saved run and exit")


def prepare_cache(tmp, eval_tokens):
    """Prepare the cpu profile's data from ../shared/data/corpora once in tmp/cache, with eval_tokens evaluation
    tokens, and point AUTORESEARCH_CACHE at it (every run of the bench shares it)."""
    os.environ["AUTORESEARCH_CACHE"] = str(tmp / "cache")
    subprocess.run([sys.executable, "prepare.py", "--source", str(CORPORA), "--profile", "cpu", "--eval-tokens",
                    str(eval_tokens)], cwd=ROOT, env=os.environ, check=True, capture_output=True)


def save(results, path):
    """Write a benchmark's results as JSON to path (--save; None: nowhere): kept as it goes, so that a stopped bench
    keeps what it measured."""
    if path:
        Path(path).write_text(json.dumps(results))

