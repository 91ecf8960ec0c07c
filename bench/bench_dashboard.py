"""
BENCHMARK: how long the dashboard takes for a big tag, and how heavy the page is. A synthetic tag of N experiments
(default 10,000) in a throwaway git repository: one commit per experiment (written with `git fast-import`, each
changing one constant of a 60-line train.py on top of the best), results.tsv, events.jsonl with an experiment event
and a run_end event per run (the baseline 3 runs, every 20th experiment confirmed with a second run) and a learning
curve of 300 points beside each run's log. Measured: report.load_run, dashboard.gather, the progress plot and the
whole write (report.py --html), a second write (what the loop pays after every verdict: load_run again, the curve
files already read), the page's size, and, when chromium is installed, how long a headless chromium takes to load
the page and draw its first table page.

    uv run bench/bench_dashboard.py                  # 10,000 experiments: ~1-2 min on 2 cores (mostly the set-up)
    uv run bench/bench_dashboard.py --n 1000 --save bench-dashboard.json
    uv run bench/bench_dashboard.py --table bench-dashboard.json
"""

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchrepo import ROOT, save

sys.path.insert(0, str(ROOT))
import report  # noqa: E402
from harness.judge import curves  # noqa: E402
from harness.record import dashboard

TAG = "big"


def synthetic_tag(folder, n, seed=0):
    """A target folder with a git repository holding a tag of n experiments after the baseline (see the docstring)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=folder, check=True)
    constants = [f"CONST_{k} = {k}" for k in range(60)]
    stream, marks, best_mark, best_metric = [], [], 1, 1.0
    metrics, statuses = [], []
    for i in range(n + 1):
        lines = list(constants)
        if i:
            k = rng.randrange(60)
            lines[k] = f"CONST_{k} = {rng.randrange(10_000)}"
        data = ("\n".join(lines) + "\n").encode()
        parent = f"from :{best_mark}\n" if i else ""
        stream.append(f"commit refs/heads/c{i}\nmark :{i + 1}\ncommitter b <b@b> 1700000000 +0000\n"
                      f"data {len(str(i)) + 1}\nc{i}\n{parent}M 100644 inline train.py\ndata {len(data)}\n".encode()
                      + data + b"\n")
        metric = best_metric + rng.gauss(0.001, 0.004) if i else 1.0
        crash = i and rng.random() < 0.05
        status = "crash" if crash else "keep" if i == 0 or metric < best_metric - 0.004 else "discard"
        if status == "keep":
            best_mark, best_metric = i + 1, metric
            constants = lines
        marks.append(best_mark)
        metrics.append(None if crash else metric)
        statuses.append(status)
    stream.append(b"")
    subprocess.run(["git", "fast-import", "--quiet"], cwd=folder, input=b"".join(stream), check=True)
    shas = subprocess.run(["git", "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads"],
                          cwd=folder, check=True, capture_output=True, text=True).stdout.split("\n")
    sha = {int(name[1:]): s for name, s in (line.split() for line in shas if line.startswith("c"))}
    logs = folder / "logs"
    logs.mkdir()
    rows, events, best = ["commit\tval_bpb\tmemory_gb\tstatus\tdescription"], [], (sha[0], 1.0)
    for i in range(n + 1):
        m, status = metrics[i], statuses[i]
        runs = [] if m is None else [m + rng.gauss(0, 0.002) for _ in range(3 if i == 0 else 2 if i % 20 == 0 else 1)]
        for r, value in enumerate(runs):
            log = logs / f"{i:05d}-{r}.log"
            curve = curves.Curve(curves.Point((k + 1) / 300, 4.0 - 2.5 * (k / 300) ** 0.5 + rng.gauss(0, 0.01), 1.0,
                                              5000.0) for k in range(300))
            curves.save(curve, log)
            events.append({"event": "run_end", "tag": TAG, "n": i, "run": r, "commit": sha[i][:7], "metric": value,
                           "log": str(log), "log_tail": ""})
        idea = "baseline" if i == 0 else f"change constant #{i} <b>& \"quoted\"</b>"
        events.append({"event": "experiment", "tag": TAG, "n": i, "commit": sha[i][:7], "full_commit": sha[i],
                       "status": status, "metric": m or 0.0, "memory_gb": 1.0, "description": idea, "idea": idea,
                       "base": None if i == 0 else best[0], "base_metric": None if i == 0 else best[1],
                       "runs": runs or None, "noise_sd": 0.002 if i == 0 else None, "wall_seconds": 330.0,
                       "proposer": "anthropic", "input_tokens": 5000, "output_tokens": 400, "cost_usd": 0.02,
                       **({"confirm": 3, "margin": None, "verdict": "paired", "false_keep": 0.02} if i == 0 else {})})
        if status == "keep":
            best = (sha[i], m)
        rows.append(f"{sha[i][:7]}\t{m or 0.0:.6f}\t1.0\t{status}\t{idea}")
    (folder / "results.tsv").write_text("\n".join(rows) + "\n")
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return folder


def timed(f):
    t = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t


def table(results):
    return "\n".join([f"{'experiments':>12} {'load_run':>9} {'gather':>8} {'write':>8} {'rewrite':>8} {'page MB':>8} "
                       f"{'chromium':>9}"]
                     + [f"{r['n']:>12,} {r['load_s']:>8.2f}s {r['gather_s']:>7.2f}s {r['write_s']:>7.2f}s "
                        f"{r.get('again_s', 0):>7.2f}s "
                        f"{r['page_mb']:>8.1f} " + (f"{r['browser_s']:>8.2f}s" if r.get("browser_s") else f"{'-':>9}")
                        for r in results])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[10_000], help="experiments after the baseline (several: one "
                   "tag each)")
    p.add_argument("--save", metavar="FILE", help="write the measurements as JSON")
    p.add_argument("--table", metavar="FILE", help="print the table of a saved run and exit")
    args = p.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.n:
            folder, setup_s = timed(lambda: synthetic_tag(Path(tmp) / f"tag{n}", n))
            print(f"set up {n:,} experiments in {setup_s:.0f}s", flush=True)
            run, load_s = timed(lambda: report.load_run(folder))
            _, gather_s = timed(lambda: dashboard.gather(run))
            page, write_s = timed(lambda: dashboard.write(run, folder / dashboard.PAGE))
            dashboard._DRAWN[:] = [None, None]      # a verdict adds a row: its rewrite draws the plot again
            _, again_s = timed(lambda: dashboard.write(report.load_run(folder), folder / dashboard.PAGE))
            found = {"n": n, "load_s": load_s, "gather_s": gather_s, "write_s": write_s, "again_s": again_s,
                     "page_mb": page.stat().st_size / 2**20}
            browser = shutil.which("chromium")
            if browser:
                _, found["browser_s"] = timed(lambda: subprocess.run(
                    [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp}/profile",
                     "--dump-dom", f"file://{page}"], capture_output=True, timeout=300))
            results.append(found)
            print(table(results[-1:]), flush=True)
    print()
    print(table(results))
    if args.save:
        save(results, args.save)


if __name__ == "__main__":
    main()
