"""
The lab profile's recorded table: plain train.py runs of the lab profile (prepare.py --profile lab: 60 s on 2 CPU
cores, the sample shipped in data/sample) over a declared space of the constants that matter, each point at several
seeds, with its learning curve. bench/bench_yield.py replays searches against it; docs/benchmarks.md reads the lab's
properties from it (seed sd, a slower machine, single-constant edits).

    uv run bench/lab_table.py                          # the whole design, resumable: stop it any time, rerun it
    uv run bench/lab_table.py --design base --seeds 8  # only the base point at 8 seeds
    uv run bench/lab_table.py --summary                # what the table holds: per point, n, mean, sd

Designs (in this order by default): base (train.py's lab values), slow (the base point at 80 % of the budget: what a
20 % slower machine trains, the schedule being a share of the budget), moves (each constant set to each of its other
values alone), random (points drawn from the grid, seeded), short (every point the table holds at the full budget,
again at SHORT of it with its own schedule: whether a short run ranks points as the full one does, issue 39's
question for multi-fidelity screening; --summary prints the rank agreement). A run is plain `python train.py` in a copy of the
repository's prepare.py and train.py with the point's values written by the harness's own searchspace.write_point;
train.py's own val_bpb is recorded (an honest train.py: it agrees with the separate evaluator within
METRIC_TOLERANCE; bench/bench_hermetic.py measures that). Run it on a quiet machine: the budget is wall time.

The table (bench/lab_table.jsonl) is one JSON object per line: a header {"table": "lab", "provenance": {...},
"space": {...}} then one row per run {"point", "seed", "budget", "val_bpb", "steps", "train_s", "wall_s", "probe_s",
"curve", "error"}. read_table refuses a table whose provenance differs from this checkout's (another prepare.py,
profile, dataset or budget), naming what differs, and collect one recorded with another train.py; a torn or malformed
row is skipped and counted.
"""

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.judge import curves  # noqa: E402
from harness.propose import edits, searchspace
from harness.run.runner import parse_summary  # noqa: E402

TABLE = Path(__file__).resolve().parent / "lab_table.jsonl"
TRAIN = ROOT / "train.py"   # the train.py the runs write points into (--train: the one a table was recorded with)
PROFILE = "lab"
# The declared space: each constant's values in the table, train.py's lab value first. Halving and doubling the
# rates, the batch and the schedule's share, one layer less and more: the moves an LLM or a sampler makes first.
SPACE = {
    "MATRIX_LR": [0.04, 0.02, 0.08],
    "EMBEDDING_LR": [0.6, 0.3, 1.2],
    "UNEMBEDDING_LR": [0.004, 0.002, 0.008],
    "WEIGHT_DECAY": [0.2, 0.0, 0.4],
    "WARMDOWN_RATIO": [0.5, 0.25, 0.75],
    "DEPTH": [3, 2, 4],
    "TOTAL_BATCH_SIZE": [2**11, 2**10, 2**12],
}
SLOW = 0.8              # the slow design's budget, as a share of the profile's: a machine 20 % slower
CURVE_POINTS = 40       # a run's curve is kept at about this many points (of ~60 progress lines)
SHORT = 0.25            # the short design's budget, as a share of the profile's (15 s of the lab's 60 s)
DESIGNS = ("base", "slow", "moves", "random", "short")
# The kinds of change whose rankings are compared apart (issue 39: a short budget may favour small, fast models)
KINDS = {"rates": ("MATRIX_LR", "EMBEDDING_LR", "UNEMBEDDING_LR", "WEIGHT_DECAY", "WARMDOWN_RATIO"),
         "model size": ("DEPTH",), "batch": ("TOTAL_BATCH_SIZE",)}


class TableError(Exception):
    """The table cannot be used as asked (its provenance differs, its file is unreadable): the message says why."""


def refused(body, prog):
    """body() -> exit code, or exit code 2 with `prog: error: <why>` on stderr when a table is refused (TableError)."""
    try:
        return body()
    except TableError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


def sha(path):
    """sha256 of a file's bytes, hex."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def provenance(cache=None):
    """What a row of the table depends on: prepare.py's and train.py's bytes, the profile, its dataset and budget
    (the prepared record in the cache), and this machine's speed probe (information: rows from a machine of another
    speed are refused only through the budget's steps, which the replay does not know; it is printed)."""
    sys.path.insert(0, str(ROOT))
    env = {**os.environ, **({"AUTORESEARCH_CACHE": str(cache)} if cache else {})}
    meta = json.loads(subprocess.run([sys.executable, "-c", "import json, prepare; p = prepare.load_prepared(); "
                                      "print(json.dumps(dict(profile=p.profile.name, dataset=p.dataset, "
                                      "budget=prepare.time_budget(p.profile.name)[0])))"],
                                     cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout)
    return dict(prepare_sha=sha(ROOT / "prepare.py"), train_sha=sha(TRAIN), **meta, probe_s=probe(env))


def probe(env=None):
    """This machine's speed now: prepare.py --probe's seconds (harness.run.conditions), or None when it printed none."""
    out = subprocess.run([sys.executable, "prepare.py", "--probe"], cwd=ROOT, env=env or os.environ,
                         capture_output=True, text=True).stdout
    return next((float(line.split()[1]) for line in out.splitlines() if line.startswith("probe_s:")), None)


COMPARED = ("prepare_sha", "profile", "dataset", "budget")    # what a replay needs alike (train.py: collect)


def read_table(path=TABLE, expect=None):
    """(header, rows, skipped): the table at path. expect: a provenance (provenance()) the table must match in
    COMPARED, else TableError naming each difference; None: not checked. Rows that are not JSON objects with a
    point, a seed and a budget (a line torn by a kill, a hand edit) are skipped and counted. TableError when the
    file is missing or has no header."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise TableError(f"{path}: cannot read the table ({e.strerror}); collect it with bench/lab_table.py") from None
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("table") != PROFILE or "provenance" not in header:
        raise TableError(f"{path}: its first line is not the table's header; collect it again with "
                         "bench/lab_table.py")
    if expect is not None:
        differ = [f"{k} {header['provenance'].get(k)!r} (here: {expect.get(k)!r})" for k in COMPARED
                  if header["provenance"].get(k) != expect.get(k)]
        if differ:
            raise TableError(f"{path} was recorded with another setup: {'; '.join(differ)}. Its runs say nothing "
                             "about this one: collect a new table (--out) or check out the commit it names")
    rows, skipped = [], 0
    for line in lines[1:]:
        try:
            row = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if not (isinstance(row, dict) and isinstance(row.get("point"), dict) and isinstance(row.get("seed"), int)
                and isinstance(row.get("budget"), (int, float))):
            skipped += 1
            continue
        rows.append(row)
    return header, rows, skipped


def key(point):
    """A point as a hashable key: its constants that differ from the base's, sorted (the base point: ())."""
    return tuple(sorted((k, v) for k, v in point.items() if SPACE[k][0] != v))


def design(name, seeds, draws=40, rng_seed=0, held=()):
    """[(point, seed, budget share)] of a design (see the module's docstring); a point holds every constant. held:
    the points the table holds at the full budget (the short design's)."""
    base = {k: values[0] for k, values in SPACE.items()}
    if name == "short":
        return [(p, s, SHORT) for p in held for s in range(1, seeds + 1)]
    if name == "base":
        return [(base, s, 1.0) for s in range(1, seeds + 1)]
    if name == "slow":
        return [(base, s, SLOW) for s in range(1, seeds + 1)]
    if name == "moves":
        return [({**base, k: v}, s, 1.0) for k, values in SPACE.items() for v in values[1:]
                for s in range(1, seeds + 1)]
    rng = random.Random(rng_seed)
    points = [{k: rng.choice(values) for k, values in SPACE.items()} for _ in range(draws)]
    return [(p, s, 1.0) for p in points for s in range(1, seeds + 1)]


def source_at(point):
    """train.py with the point's values written (the harness's searchspace.write_point and edits.apply_answer)."""
    source = TRAIN.read_text()
    space = {k: searchspace.Param(k, "choice", choices=tuple(values)) for k, values in SPACE.items()}
    answer, _ = searchspace.write_point(source, PROFILE, space, point, "lab table")
    if "no change" in answer.splitlines()[0]:
        return source
    return edits.apply_answer(answer, source)[1]


def run_one(point, seed, budget, cache=None, source=None):
    """One plain train.py run of point at seed with this budget (seconds): the row to record. source: the train.py
    to run (its point recorded as `point`; default: this checkout's with point written)."""
    with tempfile.TemporaryDirectory(prefix="lab-run-") as tmp:
        shutil.copy(ROOT / "prepare.py", tmp)
        Path(tmp, "train.py").write_text(source if source is not None else source_at(point))
        env = {**os.environ, "AUTORESEARCH_SEED": str(seed), "AUTORESEARCH_TIME_BUDGET": f"{budget:g}",
               **({"AUTORESEARCH_CACHE": str(cache)} if cache else {})}
        speed = probe(env)
        t0 = time.monotonic()
        result = subprocess.run([sys.executable, "train.py"], cwd=tmp, env=env, capture_output=True, text=True,
                                timeout=10 * budget + 300)
        wall = time.monotonic() - t0
    log = result.stdout + result.stderr
    summary = parse_summary(log)
    curve = curves.Curve()
    curve.feed(log + "\n")
    every = max(1, len(curve.points) // CURVE_POINTS)
    kept = curve.points[::every]
    if curve.points and kept[-1] is not curve.points[-1]:
        kept.append(curve.points[-1])
    value = summary.get("val_bpb")
    ok = result.returncode == 0 and value is not None
    return dict(point=point, seed=seed, budget=budget, val_bpb=float(value) if ok else None,
                steps=int(summary["num_steps"]) if ok else None,
                train_s=float(summary["training_seconds"]) if ok else None, wall_s=round(wall, 2), probe_s=speed,
                curve=[[round(q.progress, 4), round(q.loss, 4)] for q in kept],
                error=None if ok else (log.strip().splitlines() or ["no output"])[-1][-300:])


def collect(out, designs, seeds, draws, limit_s, cache=None):
    """Run every (point, seed, budget) of the designs that out does not hold yet, appending a row after each run
    (a kill loses at most the run in flight); stops after limit_s seconds. The header is written first, and a table
    with another provenance is refused (read_table)."""
    here = provenance(cache)
    if not Path(out).exists():
        Path(out).write_text(json.dumps(dict(table=PROFILE, provenance=here, space=SPACE)) + "\n")
    header, rows, skipped = read_table(out, expect=here)
    if header["provenance"]["train_sha"] != here["train_sha"]:
        raise TableError(f"{out} was recorded with another train.py (sha256 {header['provenance']['train_sha'][:12]}, "
                         f"here {here['train_sha'][:12]}): new rows would mix two programs; collect into a new --out")
    done = {(key(r["point"]), r["seed"], r["budget"]) for r in rows}
    held = list({key(r["point"]): r["point"] for r in rows if r["budget"] == here["budget"]}.values())
    todo = [(p, s, share * here["budget"]) for name in designs for p, s, share in design(name, seeds, draws,
                                                                                         held=held)]
    todo = [t for t in todo if (key(t[0]), t[1], t[2]) not in done]
    print(f"{out}: {len(rows)} runs recorded ({skipped} torn rows skipped), {len(todo)} to go; "
          f"probe_s {here['probe_s']}", flush=True)
    t0 = time.monotonic()
    for i, (point, seed, budget) in enumerate(todo):
        if time.monotonic() - t0 > limit_s:
            print(f"stopped after {limit_s:.0f} s: {len(todo) - i} runs left; rerun to go on")
            return
        row = run_one(point, seed, budget, cache)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[{i + 1}/{len(todo)}] {dict(key(point)) or 'base'} seed {seed} budget {budget:g}: "
              f"val_bpb {row['val_bpb']} steps {row['steps']} wall {row['wall_s']} s"
              + (f" error {row['error']}" if row["error"] else ""), flush=True)


def summary(out):
    """Print per point and budget: runs, mean val_bpb, seed sd, steps, wall; then the lab's properties against the
    targets of docs/benchmarks.md: the base's seed sd, what 80 % of the budget (a 20 % slower machine) moves, and
    each single-constant move's effect, in seed sds (positive: worse)."""
    header, rows, skipped = read_table(out)
    budget = header["provenance"]["budget"]
    groups = {}
    for r in rows:
        groups.setdefault((key(r["point"]), r["budget"]), []).append(r)
    print(f"{len(rows)} runs, {skipped} torn rows skipped; failed runs: {sum(r['val_bpb'] is None for r in rows)}")
    stats = {}
    for (k, b), rs in sorted(groups.items(), key=lambda g: (len(g[0][0]), str(g[0]))):
        values = [r["val_bpb"] for r in rs if r["val_bpb"] is not None]
        sd = statistics.stdev(values) if len(values) > 1 else float("nan")
        mean = statistics.fmean(values) if values else float("nan")
        stats[k, b] = (len(values), mean, sd)
        steps = [r["steps"] for r in rs if r["steps"]]
        print(f"{', '.join(f'{n}={v}' for n, v in k) or 'base':40s} {b:5g}s n={len(values)}/{len(rs)} "
              f"mean {mean:.4f} sd {sd:.4f} steps {statistics.fmean(steps) if steps else 0:.0f} "
              f"wall {statistics.fmean(r['wall_s'] for r in rs):.1f}s")
    if ((), budget) not in stats:
        return
    n, base, sd = stats[(), budget]
    print(f"\nbase: n={n} mean {base:.4f}, seed sd {sd:.4f}")
    if ((), SLOW * budget) in stats:
        m, slow, _ = stats[(), SLOW * budget]
        print(f"{SLOW:.0%} of the budget (a 20 % slower machine): n={m} mean {slow:.4f}, {slow - base:+.4f} = "
              f"{(slow - base) / sd:+.2f} seed sd (target: under 1)")
    effects = {k: mean - base for (k, b), (_, mean, _) in stats.items() if len(k) == 1 and b == budget}
    for k, effect in sorted(effects.items(), key=lambda e: -abs(e[1])):
        print(f"  {k[0][0]} = {k[0][1]}: {effect:+.4f} = {effect / sd:+.1f} seed sd (n={stats[k, budget][0]})")
    if effects:
        largest = max(abs(e) for e in effects.values())
        print(f"largest single-constant effect {largest:.4f} = {largest / sd:.1f} seed sd (target: at least 5)")
    for line in rank_agreement(rows, budget):
        print(line)


def kendall_tau(xs, ys):
    """Kendall's tau-b of two equally long lists of numbers (Kendall 1945: ties in either list counted apart);
    nan for fewer than two pairs without ties."""
    concordant = discordant = tied_x = tied_y = 0
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tied_x += 1
            elif dy == 0:
                tied_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    both = (concordant + discordant + tied_x) * (concordant + discordant + tied_y)
    return (concordant - discordant) / both ** 0.5 if both else float("nan")


def rank_agreement(rows, budget):
    """Lines on whether shorter budgets rank points as the full budget does: for each shorter budget, Kendall's tau
    between the points' mean val_bpb there and at the full budget, over every point run at both and per kind of
    change (KINDS: the base and the single-constant moves of that kind); the noise's own ceiling (tau between seed 1
    and seed 2 at the full budget); and what a screen keeping the short budget's best third would keep of the full
    budget's best third. [] when the table holds no shorter budget (collect --design short)."""
    means = {}
    for r in rows:
        if r["val_bpb"] is not None:
            means.setdefault(r["budget"], {}).setdefault(key(r["point"]), []).append(r["val_bpb"])
    full = {k: statistics.fmean(v) for k, v in means.get(budget, {}).items()}
    lines = []
    for short in sorted(b for b in means if b < budget and b != SLOW * budget):
        at = {k: statistics.fmean(v) for k, v in means[short].items() if k in full}
        points = sorted(at)
        if len(points) < 3:
            continue
        tau = kendall_tau([at[k] for k in points], [full[k] for k in points])
        lines.append(f"\nrank agreement, {short:g} s (own schedule) against {budget:g} s: Kendall tau {tau:+.2f} over "
                     f"{len(points)} points")
        for kind, names in KINDS.items():
            kin = [k for k in points if len(k) <= 1 and all(n in names for n, _ in k)]
            if len(kin) >= 3:
                lines.append(f"  {kind:<11} tau {kendall_tau([at[k] for k in kin], [full[k] for k in kin]):+.2f} "
                             f"over {len(kin)} points (the base and its single moves)")
        third = max(1, len(points) // 3)
        best_full = set(sorted(points, key=full.get)[:third])
        best_short = set(sorted(points, key=at.get)[:third])
        champion = min(points, key=full.get)
        lines.append(f"  a screen promoting the short budget's best {third} keeps {len(best_full & best_short)} of the "
                     f"full budget's best {third}; the full budget's best point ranks "
                     f"{sorted(points, key=at.get).index(champion) + 1} of {len(points)} at {short:g} s")
        walls = {b: statistics.fmean(r["wall_s"] for r in rows if r["budget"] == b and r["val_bpb"] is not None)
                 for b in (short, budget)}
        cost = walls[short] / walls[budget] + 1 / 3
        lines.append(f"  a short run takes {walls[short] / walls[budget]:.2f} of a full run's wall time (start-up "
                     f"included): screening every point and running its best third in full costs {cost:.2f} of "
                     f"running every point in full, at most {1 / cost:.2f}x the points per device-hour")
        by_seed = {}
        for r in rows:
            if r["budget"] == budget and r["val_bpb"] is not None and r["seed"] in (1, 2):
                by_seed.setdefault(key(r["point"]), {})[r["seed"]] = r["val_bpb"]
        pairs = [v for k, v in by_seed.items() if k in at and len(v) == 2]
        if len(pairs) >= 3:
            lines.append(f"  the noise's ceiling: seed 1 against seed 2 at {budget:g} s, tau "
                         f"{kendall_tau([v[1] for v in pairs], [v[2] for v in pairs]):+.2f} over {len(pairs)} points")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default=str(TABLE), help="the table file (default: bench/lab_table.jsonl)")
    p.add_argument("--design", choices=DESIGNS, action="append", help="designs to collect (default: all, in order)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per point (default 3; base and slow: 8)")
    p.add_argument("--draws", type=int, default=40, help="random points (default 40)")
    p.add_argument("--limit-minutes", type=float, default=float("inf"), help="stop after this long (resume later)")
    p.add_argument("--cache", help="AUTORESEARCH_CACHE holding the lab profile's data (default: the environment's)")
    p.add_argument("--summary", action="store_true", help="only print what the table holds")
    p.add_argument("--train", help="the train.py to write points into (default: this checkout's); to add rows to a "
                   "table recorded with an older one: git show COMMIT:train.py > FILE")
    a = p.parse_args(argv)
    if a.train and not Path(a.train).is_file():
        p.error(f"--train {a.train}: no such file (write it with: git show COMMIT:train.py > {a.train})")
    global TRAIN
    TRAIN = Path(a.train).resolve() if a.train else TRAIN

    def body():
        if a.summary:
            summary(a.out)
            return 0
        for name in a.design or DESIGNS:
            seeds = max(a.seeds, 8) if name in ("base", "slow") and a.design is None else \
                min(a.seeds, 2) if name == "short" and a.design is None else a.seeds
            collect(a.out, [name], seeds, a.draws, a.limit_minutes * 60, a.cache)
        return 0
    return refused(body, "lab_table.py")


if __name__ == "__main__":
    sys.exit(main())
