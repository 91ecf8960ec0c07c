"""
BENCHMARK: the kill campaign. agent.py on the tiny target (tests/agent_target.py), two CPU workers with
speculation, the sandbox as configured (auto), a loopback LLM that answers every request with new ideas (the real
anthropic SDK against tests/llm_server.py), is stopped again and again at a random moment by kill -9 (the agent
alone: its runs are orphaned), Ctrl-C to its whole process group, or SIGTERM, and rerun with the same command.
After every stop and at the end it checks what a user is promised:

    lost        a recorded experiment gone: experiment numbers not 0..N-1, a row missing or extra, a kept commit
                not on the branch, the branch tip not the last keep, the checkout not clean on main
    duplicated  one train.py measured twice (the same blob in two experiments' commits)
    tracebacks  a Python traceback on agent.py's stderr
    redone      interrupted candidates run again without asking the LLM ("redo" events)

Every 4th idea crashes (a missing import) and is sent back for a fix, which the LLM gives: a crash row, then the fix
as the next experiment, under the same faults. The tabu is off (its ideas all raise LR: the tabu would refuse them
and the breaker stop the loop, which is not what this measures).

The moments of the stops come from the machine's own timings: a first, unfaulted invocation measures the start-up
(launch to the baseline's first run) and the seconds per experiment after it; each stop then lands at a uniform
moment between half the start-up and the start-up plus three experiments. Where each stop landed is read from the
events it left (start-up, proposing/committing, training/evaluating, judging, recording) and tabulated.

    python bench/bench_faults.py                       # 30 faults
    python bench/bench_faults.py --faults 90 --seed 3

Goal: 0 lost, 0 duplicated, 0 tracebacks; each resume consistent; stops in every phase.
"""

import argparse
import collections
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import git

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from agent_target import STRICT, edit, make_target  # noqa: E402
from llm_server import ScriptedLLM  # noqa: E402


class IdeaLLM(ScriptedLLM):
    """Answers every request with as many new ideas as it asks for: LR set to a value never proposed before (read
    from the current train.py in the prompt), so that a train.py measured twice is the harness's doing."""

    def __init__(self, delay):
        super().__init__([], delay=delay)
        self.count = 0

    def _next(self, path, body, headers):
        with self.lock:
            if body.get("max_tokens") == 1:
                return "OK"
            self.requests.append((path, body, headers))
            prompt = body["messages"][-1]["content"] if body["messages"] else ""
            whole = " ".join(m["content"] for m in body["messages"] if isinstance(m["content"], str))
            current = re.findall(r"(?m)^LR = (\S+)$", whole)
            lr = current[-1] if current else "0.04"
            k = int((re.findall(r"propose (\d+) experiments", prompt) or ["1"])[0])
            if prompt.startswith("The experiment ") and BUG in prompt:    # a crash sent back: fix it
                return edit("drop the bad import", BUG + "\n", "")
            answers = []
            for _ in range(k):
                self.count += 1
                bug = "\n" + BUG if self.count % 4 == 0 else ""        # every 4th idea crashes, then gets its fix
                answers.append(edit(f"LR {self.count}", f"LR = {lr}", f"LR = {0.03 + self.count * 0.0007:.4f}{bug}"))
            return "\n".join(answers)


BUG = "import no_such_module_in_the_bench"


def check(target, tag):
    """What a stop may never break; returns (lost problems, duplicated experiments)."""
    repo = git.Repo(target)
    problems = []
    events = [json.loads(line) for line in (target / "events.jsonl").read_text().splitlines() if line.strip()]
    exps = [e for e in events if e.get("event") == "experiment" and e.get("tag") == tag]
    rows = (target / "results.tsv").read_text().splitlines()[1:]
    if [e["n"] for e in exps] != list(range(len(exps))):
        problems.append(f"experiment numbers {[e['n'] for e in exps]}")
    if [r.split("\t")[0] for r in rows] != [e["commit"] for e in exps]:
        problems.append(f"{len(rows)} rows for {len(exps)} experiments")
    keeps = [e["full_commit"] for e in exps if e["status"] == "keep"]
    if keeps:
        tip = repo.commit(f"autoresearch/{tag}").hexsha
        if tip != keeps[-1]:
            problems.append(f"branch tip {tip[:7]} is not the last keep {keeps[-1][:7]}")
        if not all(repo.is_ancestor(k, tip) for k in keeps):
            problems.append("a kept commit is not on the branch")
    if repo.active_branch.name != "main" or repo.git.status("--porcelain", "--untracked-files=no"):
        problems.append("the checkout moved or is dirty")
    blobs = collections.Counter(repo.commit(e["full_commit"]).tree["train.py"].hexsha for e in exps)
    return problems, sum(c - 1 for c in blobs.values())


def event_lines(target):
    """The events.jsonl lines as dicts ([] before the file exists; a line cut by a kill skipped)."""
    path = target / "events.jsonl"
    found = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return found


def phase_at_stop(since):
    """Where a stop landed, from the events its invocation wrote (since: those events, in order)."""
    if not any(e.get("event") == "config" for e in since):
        return "start-up"
    open_runs = set()
    for e in since:
        key = (e.get("n"), e.get("fix", 0), e.get("run", 0), e.get("best"))
        if e.get("event") == "run":
            open_runs.add(key)
        elif e.get("event") == "run_end":
            open_runs.discard(key)
    if open_runs:
        return "training/evaluating"
    last = next((e["event"] for e in reversed(since) if e.get("event") not in ("throughput", "warning", "stop")), "")
    return {"run_end": "judging", "experiment": "recording", "advanced": "recording", "rerun_best": "judging",
            "propose": "proposing/committing", "candidate": "proposing/committing",
            "commit": "proposing/committing", "started": "exporting/probing"}.get(last, f"other ({last})")


def calibrate(argv, target, env):
    """(seconds from launch to the baseline's first run, seconds per experiment after it), from an unfaulted
    invocation that records the baseline and 3 experiments."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv + ["--max-experiments", "3"], cwd=target, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    first = None
    while proc.poll() is None:
        if first is None and any(e.get("event") == "run" for e in event_lines(target)):
            first = time.monotonic() - t0
        time.sleep(0.05)
    total = time.monotonic() - t0
    first = first or total / 2
    return first, (total - first) / 4


def main():
    """Run the campaign and print its table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--faults", type=int, default=30, help="stops to inject (default 30)")
    p.add_argument("--seed", type=int, default=0, help="seed of the moments and kinds of the faults (default 0)")
    p.add_argument("--latency", type=float, default=0.5, help="simulated LLM latency in seconds (default 0.5)")
    args = p.parse_args()
    rng = random.Random(args.seed)
    counts = collections.Counter()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        cache.mkdir()
        (cache / "ready").touch()
        env = {**os.environ, "AUTORESEARCH_CACHE": str(cache), "ANTHROPIC_API_KEY": "bench-key-not-secret"}
        env.pop("AUTORESEARCH_TIME_BUDGET", None)
        target = make_target(Path(tmp) / "repo")
        train = target / "train.py"
        train.write_text(train.read_text().replace("SLEEP = 0.0", "SLEEP = 1.0"))
        git.Repo(target).git.commit("-qam", "runs take a second")
        with IdeaLLM(args.latency) as llm:
            argv = [sys.executable, str(ROOT / "agent.py"), "--tag", "k", "--target", str(target), "--timeout", "30",
                    *STRICT, "--proposer", "anthropic", "--base-url", llm.anthropic_url, "--devices", "cpu:2",
                    "--no-holdout", "--tabu", "0"]
            start_up, per_experiment = calibrate(argv, target, env)
            counts["calibration: start-up s"] = round(start_up, 1)
            counts["calibration: s per experiment"] = round(per_experiment, 1)
            for i in range(args.faults + 1):
                last = i == args.faults
                extra = ["--max-experiments", str(len(events_of(target)) + 2)] if last else []
                proc = subprocess.Popen(argv + extra, cwd=target, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True, start_new_session=True)
                kind, before = None, len(event_lines(target))
                if not last:
                    time.sleep(rng.uniform(start_up / 2, start_up + 3 * per_experiment))
                    kind = rng.choice(["kill -9", "ctrl-c (group)", "sigterm"])
                    if proc.poll() is None:
                        if kind == "kill -9":
                            proc.kill()
                        elif kind == "sigterm":
                            proc.terminate()
                        else:
                            os.killpg(proc.pid, signal.SIGINT)
                try:
                    _, err = proc.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    _, err = proc.communicate()
                    counts["hung"] += 1
                counts[kind or "final run"] += 1
                if kind is not None:
                    counts[f"stopped in: {phase_at_stop(event_lines(target)[before:])}"] += 1
                counts["tracebacks"] += "Traceback" in err
                if "Traceback" in err or kind in ("sigterm", "ctrl-c (group)") and proc.returncode not in (130, None):
                    print(f"stop {i} ({kind}), exit {proc.returncode}:\n{err[-3000:]}", file=sys.stderr)
                if kind is None and proc.returncode != 0:
                    counts["final run failed"] += 1
                    print(err[-2000:], file=sys.stderr)
                if kind in ("sigterm", "ctrl-c (group)") and proc.returncode not in (130, None):
                    counts[f"{kind}: exit {proc.returncode}"] += 1
                if (target / "events.jsonl").exists():
                    # the resume's repairs (a row lost to the kill, the branch behind a keep), then no experiment
                    resume = subprocess.run(argv + ["--max-experiments", str(max(0, len(events_of(target)) - 1))],
                                            cwd=target, env=env, capture_output=True, text=True, timeout=120)
                    counts["resumes"] += 1
                    counts["resume failed"] += resume.returncode != 0
                    counts["tracebacks"] += "Traceback" in resume.stderr
                    if resume.returncode != 0:
                        print(resume.stderr[-2000:], file=sys.stderr)
                    problems, duplicated = check(target, "k")
                    counts["lost"] += bool(problems)
                    counts["duplicated (total so far)"] = duplicated
                    for problem in problems:
                        print(f"after stop {i} ({kind}): {problem}", file=sys.stderr)
            events = event_lines(target)
            counts["experiments recorded"] = len([e for e in events if e["event"] == "experiment"])
            counts["redo events (candidates run again, no LLM call)"] = len([e for e in events if e["event"] == "redo"])
            counts["crashes recorded"] = len([e for e in events if e["event"] == "experiment" and e["status"] == "crash"])
            counts["fixes recorded"] = len([e for e in events if e["event"] == "experiment" and e.get("fix_of") is not None])
            counts["LLM requests"] = len(llm.requests)
    width = max(map(len, counts))
    for name, value in sorted(counts.items()):
        print(f"{name:<{width}}  {value}")
    bad = counts["lost"] + counts["duplicated (total so far)"] + counts["tracebacks"] + counts["final run failed"] + \
        counts["resume failed"] + counts["hung"]
    sys.exit(1 if bad else 0)


def events_of(target):
    """The experiment events so far."""
    return [e for e in event_lines(target) if e.get("event") == "experiment"]


if __name__ == "__main__":
    main()
