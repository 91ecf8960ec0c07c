"""
BENCHMARK: does the search's memory break a repetitive proposer? Campaigns of agent.py on the real train.py (cpu
profile, a short budget) with a scripted LLM on the loopback server that behaves like the plain loop of the Bilevel
Autoresearch paper (Qu & Lu, 2026): it proposes the same two changes over and over (MATRIX_LR up, TOTAL_BATCH_SIZE
up, a new value each time), and only when an answer is refused does it follow the family the prompt names (a
constant: one step up; a code family: a no-op line in a function of that family). Side by side in one run:
  plain   --tabu 0 --explore off: no memory (what the paper's inner loop had)
  memory  the defaults: the tabu and the bandit over families
  outer   the defaults and --outer-every 3: guidance, and at step 2 a search mechanism (a module the scripted LLM
          writes: it refuses a proposal whose families were all tried twice with no keep)
No real LLM is asked (none can be reached here): what is measured is the harness, not a model's ideas.

    uv run bench/bench_memory.py                          # budget 5 s, 10 experiments per campaign: ~15 min on 2 cores
    uv run bench/bench_memory.py --table bench-memory.json

Printed per campaign: experiments, the share of them from a family no earlier experiment touched (goal, issue 24:
>= 80 % with the memory), the families touched, the proposals refused before a run (by rule), keeps, the best
val_bpb, the mechanisms activated, and the wall time.
"""

import argparse
import collections
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from benchrepo import ROOT, bench_repo, parse_bench_args, prepare_cache, save

sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from llm_server import ScriptedLLM  # noqa: E402
from harness.propose import memory, perturb  # noqa: E402

MECHANISM = '''
def review(proposal, history):
    """Refuse a proposal whose every family was tried at least twice, none of those tries kept."""
    tried = {}
    for e in history:
        for f in e["families"]:
            tried.setdefault(f, []).append(e["status"])
    stale = [f for f in proposal["families"] if len(tried.get(f, [])) >= 2 and "keep" not in tried[f]]
    refuse = bool(proposal["families"]) and len(stale) == len(proposal["families"])
    return {"id": proposal["id"], "accept": not refuse,
            "reason": "every family it touches (" + ", ".join(stale) + ") was tried twice without a keep" if refuse
            else "it touches a family with tries left"}


def guidance(history):
    """Name the families tried most without a keep."""
    counts = {}
    for e in history:
        for f in e["families"]:
            if e["status"] != "keep":
                counts[f] = counts.get(f, 0) + 1
    worst = sorted(counts, key=lambda f: -counts[f])[:3]
    return "Tried most without a keep: " + ", ".join(f"{f} ({counts[f]}x)" for f in worst) if worst else ""
'''


class PlainLoop:
    """The scripted LLM (see the module docstring). Outer-loop questions get a fixed guidance and the mechanism."""

    FAVOURITES = ("MATRIX_LR", "TOTAL_BATCH_SIZE")

    def __init__(self):
        self.turn, self.favourites = 0, 0

    def __call__(self, messages):
        first, last = messages[0]["content"], messages[-1]["content"]
        if first.startswith("You oversee") and "Round 1 of 4" in first:
            return f"```python\n{MECHANISM}```" if "Round 4 of 4" in last else "Noted."
        if first.startswith("You oversee"):
            return "MATRIX_LR and TOTAL_BATCH_SIZE were raised again and again; try the others, and code."
        self.turn += 1
        train = re.search(r"# Current train.py\n```python\n(.*?)```", first, re.S).group(1)
        picks = re.findall(r"idea \d+: ([^;.]+)", first) or re.findall(r"in the family (.+?) \(", first)
        if len(messages) == 1:
            self.favourites += 1
            return step(train, self.FAVOURITES[self.favourites % 2], 1 + 0.25 * self.favourites) or "no idea"
        family = picks[0] if picks and len(messages) <= 3 else f"code: {memory.CODE_MAIN}"
        tabu = re.search(r"(?m)^Tabu .*$", first)
        factor = 0.8 if tabu and f"{family} up" in tabu.group(0) else 1.25     # it reads the tabu: the other way
        return (step(train, family, factor) if not family.startswith("code: ") else probe(train, family, self.turn)) \
            or "no idea"


def step(train, name, factor):
    """An answer moving constant `name` of the cpu branch by `factor` (> 1 up, < 1 down; a power of two: one step;
    an int: at least 1), or ""."""
    for found, line, (start, end), number, kind in perturb.numeric_constants(train, "cpu"):
        if found == name:
            up, scaled = factor > 1, round(number * factor)
            new = f"2**{number + (1 if up else -1)}" if kind == "pow2" else \
                str(max(number + 1, scaled) if up else max(1, min(number - 1, scaled))) if kind == "int" else \
                f"{number * factor:.4g}"
            head, last = line[:line.rstrip("\n").rfind("\n") + 1], line[line.rstrip("\n").rfind("\n") + 1:]
            raw = last.encode()
            return (f"DESCRIPTION: {'raise' if up else 'lower'} {name} to {new}\n<<<<<<< SEARCH\n{line}=======\n"
                    f"{head}{(raw[:start] + new.encode() + raw[end:]).decode()}>>>>>>> REPLACE\n")
    return ""


def probe(train, family, k):
    """An answer adding a no-op line in the first function of this code family (at the end of the file for the main
    loop), or ""."""
    lines = train.splitlines()
    for i, line in enumerate(lines):
        m = memory.DEF.match(line)
        names = memory.enclosing(lines, i) + [m.group(2)] if m else []
        if m and line.rstrip().endswith(":") and f"code: {memory.code_family(names, '')}" == family:   # by name
            body = next((x for x in lines[i + 1:] if x.strip()), "")
            indent = body[:len(body) - len(body.lstrip())]
            return (f"DESCRIPTION: {family[6:]}: probe {k}\n<<<<<<< SEARCH\n{line}\n=======\n{line}\n"
                    f"{indent}_probe_{k} = {k}\n>>>>>>> REPLACE\n")
    tail = next(x for x in reversed(lines) if x.strip())
    return (f"DESCRIPTION: main loop: probe {k}\n<<<<<<< SEARCH\n{tail}\n=======\n{tail}\n_probe_{k} = {k}\n"
            ">>>>>>> REPLACE\n")


def campaign(tmp, name, flags, budget, experiments):
    """One campaign on a fresh repository: its experiments, refusals, mechanisms and wall time."""
    import agent
    repo, env = bench_repo(tmp, budget)
    os.environ.update({k: env[k] for k in ("AUTORESEARCH_CACHE", "AUTORESEARCH_TIME_BUDGET")})
    t0 = time.monotonic()
    with ScriptedLLM([PlainLoop()] * (6 * experiments + 40)) as llm:
        code = agent.main(["--tag", "bench", "--target", str(repo), "--proposer", "anthropic", "--base-url",
                           llm.anthropic_url, "--baseline-runs", "1", "--confirm", "0", "--no-speculate",
                           "--no-holdout", "--max-experiments", str(experiments), *flags])
    prompts = [b["messages"][0]["content"] for _, b, _ in llm.requests if len(b["messages"]) == 1]
    sections = [m.group(0) for p in prompts if (m := re.search(r"# Exploration.*?(?=\n# Current train.py)", p, re.S))]
    events = [json.loads(line) for line in (repo / "events.jsonl").read_text().splitlines()]
    exps = [e for e in events if e["event"] == "experiment"]
    return dict(name=name, flags=flags, exit=code, wall=time.monotonic() - t0,
                experiments=[{k: e.get(k) for k in ("n", "status", "metric", "description", "families", "moves",
                                                    "asked_family", "shaped_by")} for e in exps],
                refused=[{k: e.get(k) for k in ("n", "rule", "repeats", "reason")} for e in events
                         if e["event"] == "refused"],
                mechanisms=[{k: e.get(k) for k in ("id", "action", "reason", "after")} for e in events
                            if e["event"] == "mechanism"],
                outer=[{k: e.get(k) for k in ("step", "after", "frozen", "guidance")} for e in events
                       if e["event"] == "outer"], sections=sections)


def new_share(exps):
    """The share of experiments after the baseline touching only families no earlier experiment touched."""
    seen, new = set(), 0
    for e in exps[1:]:
        families = set(e["families"] or [])
        new += bool(families) and not families & seen
        seen |= families
    return new / max(1, len(exps) - 1)


def table(results):
    """The campaigns side by side."""
    rows = [f"{'campaign':<8} {'exps':>4} {'new-family':>10} {'families':>8} {'refused':<34} {'kept':>4} "
            f"{'best val_bpb':>12} {'mechanisms':<22} {'wall':>6}"]
    for c in results["campaigns"]:
        exps = c["experiments"]
        rules = collections.Counter(r["rule"] for r in c["refused"])
        best = min(e["metric"] for e in exps if e["status"] == "keep")
        mechs = ", ".join(f"{m['id']} {m['action']}" for m in c["mechanisms"] if m["action"] != "proposed") or "-"
        rows.append(f"{c['name']:<8} {len(exps) - 1:>4} {100 * new_share(exps):>9.0f}% "
                    f"{len({f for e in exps for f in e['families'] or []}):>8} "
                    f"{(', '.join(f'{r} {k}' for r, k in rules.items()) or '-'):<34} "
                    f"{sum(e['status'] == 'keep' for e in exps[1:]):>4} {best:>12.6f} {mechs:<22} {c['wall']:>5.0f}s")
    return "\n".join(rows)


def main():
    """Run the campaigns side by side, print and optionally save the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=5.0, help="seconds of training per run (default 5)")
    p.add_argument("--experiments", type=int, default=10, help="experiments per campaign after the baseline")
    p.add_argument("--campaigns", default="plain,memory,outer", help="comma-separated subset of plain,memory,outer")
    args = parse_bench_args(p, table)
    flags = {"plain": ["--tabu", "0", "--explore", "off"], "memory": [], "outer": ["--outer-every", "3"]}
    results = dict(budget=args.budget, experiments=args.experiments, campaigns=[])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prepare_cache(tmp, args.eval_tokens)
        for name in args.campaigns.split(","):
            print(f"campaign {name} ...", flush=True)
            (tmp / name).mkdir()
            results["campaigns"].append(campaign(tmp / name, name, flags[name], args.budget, args.experiments))
            save(results, args.save)
    print()
    print(table(results))


if __name__ == "__main__":
    main()
