"""
HARNESS: what a target is. A target is a directory holding program.md (the human's directions), a FROZEN
prepare.py (data, evaluator, contract constants) and a MUTABLE train.py. This module reads the contract constants
with ast (it never imports prepare.py or train.py), computes the effective time budget (the harness's one parser
of AUTORESEARCH_TIME_BUDGET; the frozen files keep their own, self-contained) and runs prepare.py's
--check / --preflight in a subprocess, and prepare.py itself on a machine with no prepared data. It never writes
to the target.
"""

import ast
import math
import os
import re
import subprocess
import sys
from pathlib import Path

from harness import console
from harness.run import runner
from harness.errors import SetupError, Stop
from harness.redact import clean_env

FROZEN = ("prepare.py",)                                 # files of a target that train.py may never change
TARGET_FILES = ("program.md", "prepare.py", "train.py")


def read_text(path):
    """A file's text as UTF-8. Raises Stop naming the file and the first bad byte when it is not UTF-8 (a file
    edited while the loop runs; check_target refuses one at the start)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise Stop(not_utf8(path, e)) from None


def not_utf8(path, e):
    """The message for a file that is not UTF-8 text."""
    return (f"{path} is not UTF-8 text ({e.reason}, byte {e.start}): the harness reads it as text; save it as UTF-8, "
            "then rerun the same command")


def check_target(target):
    """The target dir must hold program.md, prepare.py and train.py; SetupError otherwise."""
    if not target.is_dir():
        raise SetupError(f"--target {target} is not a directory")
    missing = [f for f in TARGET_FILES if not (target / f).is_file()]
    if missing:
        raise SetupError(f"{target} is not an autoresearch target: missing {', '.join(missing)} "
                         "(a target holds program.md, a frozen prepare.py and a mutable train.py); if you deleted "
                         "train.py, `git checkout -- train.py` brings it back")
    links = [f for f in FROZEN + ("train.py",) if (target / f).is_symlink()]
    if links:
        raise SetupError(f"{', '.join(links)} in {target} is a symbolic link: the experiments commit and run regular "
                         "files; replace it by the file itself")
    for f in TARGET_FILES:
        try:
            (target / f).read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise SetupError(not_utf8(target / f, e).replace("rerun the same command", "rerun")) from None


def read_literals(path):
    """{NAME: value} for every module-level `NAME = <literal>` of a Python file, read with ast (never imported)."""
    values = {}
    for node in ast.parse(read_text(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return values


def read_frozen_constants(prepare_path):
    """METRIC_NAME, METRIC_GOAL, TIME_BUDGET, PREFLIGHT from prepare.py's module-level literals (via ast, never
    imported). Raises SetupError naming the missing or invalid constant."""
    values = read_literals(prepare_path)
    for name in ("METRIC_NAME", "METRIC_GOAL", "TIME_BUDGET"):
        if name not in values:
            raise SetupError(f"{prepare_path} must declare {name} as a plain literal "
                             '(e.g. METRIC_NAME = "val_bpb", METRIC_GOAL = "min", TIME_BUDGET = 300)')
    if values["METRIC_GOAL"] not in ("min", "max"):
        raise SetupError(f'{prepare_path}: METRIC_GOAL must be "min" or "max", not {values["METRIC_GOAL"]!r}')
    values.setdefault("PREFLIGHT", False)
    return values


def own_budget(constants, profile):
    """The target's own budget in seconds for the prepared profile: PROFILE_BUDGETS[profile] where prepare.py declares
    one (the lab's 60 s), else TIME_BUDGET. constants: read_frozen_constants'; profile: `prepare.py --check`'s, or
    None. SetupError when a declared budget is not a positive number."""
    budgets = constants.get("PROFILE_BUDGETS", {})
    own = budgets.get(profile, constants["TIME_BUDGET"]) if isinstance(budgets, dict) else constants["TIME_BUDGET"]
    if isinstance(own, bool) or not isinstance(own, (int, float)) or not own > 0:
        raise SetupError(f"prepare.py's budget for profile {profile!r} is {own!r}, not a positive number of seconds")
    return float(own)


def effective_budget(time_budget):
    """TIME_BUDGET seconds, or AUTORESEARCH_TIME_BUDGET when set (smoke tests); SetupError if not positive."""
    raw = os.environ.get("AUTORESEARCH_TIME_BUDGET")
    try:
        budget = float(raw) if raw else float(time_budget)
    except ValueError:
        budget = -1.0
    if not (budget > 0 and math.isfinite(budget)):
        raise SetupError(f"AUTORESEARCH_TIME_BUDGET={raw!r} is not a positive, finite number of seconds; unset it or fix it")
    return budget


def default_timeout(budget):
    """2 x the budget (karpathy's 10 minutes for 5), but at least budget + 120 s so that start-up and the final
    evaluation fit even in a 10-second smoke budget."""
    return max(2 * budget, budget + 120)


def profile_of(ready):
    """`prepare.py --check`'s `profile: <name>` line: train.py's `if PROFILE == ...` branch that random/grid edit."""
    return (re.findall(r"^profile:\s*(\S+)\s*$", ready, re.M) or [None])[-1]


def run_prepare(target, *flags, timeout, env=None, wrap=None):
    """Run `python prepare.py <flags>` in the target dir (secrets removed from its environment, `env` added; through
    wrap, argv -> argv, e.g. the evaluator's sandbox) and return its stdout; SetupError with its own message if it
    exits nonzero or outlasts timeout seconds."""
    shown = " ".join(flags)
    argv = ([sys.executable, "prepare.py", *flags] if wrap is None else
            wrap([runner.interpreter(), str(Path(target) / "prepare.py"), *flags]))
    try:
        p = subprocess.run(argv, cwd=target, env={**clean_env(), **(env or {})},
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SetupError(f"prepare.py {shown} did not finish within {timeout:.0f}s") from None
    if p.returncode != 0:
        output = (p.stderr.strip() or p.stdout.strip() or f"exit code {p.returncode}")[-3000:]
        raise SetupError(f"prepare.py {shown} failed:\n{output}")
    return p.stdout


def score_holdout(frozen_dir, artifact, metric, timeout=3600, env=None, wrap=None):
    """The metric of a saved model artifact on the hidden holdout split, which the search never saw: the pristine
    prepare.py in frozen_dir runs `--evaluate ARTIFACT --split holdout` in a fresh process (through wrap(argv,
    artifact) -> argv when given: the evaluator's sandbox, which also dies with the harness). Returns a float;
    SetupError with prepare.py's message when it cannot (no holdout in the prepared data, a target without one)."""
    out = run_prepare(frozen_dir, "--evaluate", str(artifact), "--split", "holdout", timeout=timeout, env=env,
                      wrap=wrap and (lambda argv: wrap(argv, artifact)))
    found = [line.split(":", 1)[1] for line in out.splitlines() if line.startswith(f"{metric}:")]
    if not found or "split: holdout" not in " ".join(out.split()):
        raise SetupError(f"prepare.py --evaluate --split holdout printed no holdout {metric}: {out[-500:]!r}")
    return float(found[-1])


def ensure_prepared(target, source=None):
    """`prepare.py --check`, and when it fails (a fresh machine), prepare.py itself: the default data for this device
    class, or `--source PATH`, with its progress on the terminal; then the check again. Returns the check's stdout;
    raises Stop (prepare.py's own message is above it) when the data cannot be prepared (offline, a cache prepared
    otherwise)."""
    try:
        ready = run_prepare(target, "--check", timeout=600)
        if source is not None:
            console.say(f"--source {source}: ignored, data is already prepared ({ready.splitlines()[0]}); to replace "
                        f"it run `uv run prepare.py --source {source} --force`")
        return ready
    except SetupError as e:
        missing = str(e).splitlines()[-1]
    argv = [sys.executable, "prepare.py"] + (["--source", str(Path(source).expanduser().resolve())] if source else [])
    why = missing.split("error: ", 1)[-1]         # prepare.py's own "prepare.py: error: ": not an error here
    console.say(f"{'no prepared data on this machine' if why.startswith('no prepared data') else why[:200]}; "
                f"preparing it now: {' '.join(['prepare.py', *argv[2:]])}")
    if relay(argv, target, clean_env()) != 0:    # its output and progress go to you
        raise Stop("preparing the data failed (prepare.py's message is above). Fix that and rerun, or prepare "
                         "it yourself first (`uv run prepare.py --help`; offline: `uv run prepare.py --source PATH`), "
                         "or pass --source PATH")
    return run_prepare(target, "--check", timeout=600)


def relay(argv, cwd, env):
    """Run prepare.py with its output and progress relayed to the terminal as it comes (carriage-return progress
    lines too), leaving out its advice for a human running it alone ("Next: uv run train.py ..."), which in the middle
    of the loop or a `try` would tell you to do what the harness does next. Returns the exit code."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    pending = b""
    try:
        while chunk := os.read(proc.stdout.fileno(), 4096):
            pending += chunk
            *done, pending = re.split(rb"(?<=[\r\n])", pending)
            for segment in done:
                sys.stdout.write(NEXT_ADVICE.sub("", segment.decode("utf-8", "replace")))
            sys.stdout.flush()
        sys.stdout.write(NEXT_ADVICE.sub("", pending.decode("utf-8", "replace")))
        sys.stdout.flush()
        return proc.wait()
    finally:
        if proc.poll() is None:         # Ctrl-C: prepare.py goes with us
            proc.kill()
            proc.wait()
        proc.stdout.close()


NEXT_ADVICE = re.compile(r" ?Next: [^\r\n]*")     # prepare.py's last line, for a human who runs it alone
