"""
HARNESS: the settings. argv -> one frozen Settings for agent.py's loop and `agent.py try` (parse), with the defaults
filled in (the proposer from the keys present, its model, the devices); nothing changes them after parsing. Also the
loop's fixed rules, which no flag changes. Bad flags exit 2 with argparse's message naming the flag.
"""

import argparse
import dataclasses
import math
import os
import re
from pathlib import Path

from harness.judge import curves, verdict
from harness.propose import memory, providers
from harness.record import tracking
from harness.propose.edits import EMPTY_DESCRIPTION, clean_description
from harness.run import matched
from harness.run.pool import THREADS, parse_devices
from harness.propose.proposers import PROPOSERS
from harness.propose.providers import PROVIDERS, RETRY_CAP_S
from harness.judge.verdict import DEFAULT_CONFIRM, FALSE_KEEP, PAIRED_CONFIRM

MAX_REPAIRS = 2                 # a rejected answer goes back with the exact error at most this often
MAX_FIXES = 2                   # a crashed candidate goes back with the log tail for this many amended fixes
BREAKER = (6, 8)                # stop when 6 of the last 8 iterations failed (crash or unusable answer)
ROOT = Path(__file__).resolve().parents[2]      # the repository root: the default target


@dataclasses.dataclass(frozen=True)
class Settings:
    """One invocation's settings (see `agent.py --help` and `agent.py try --help` for each flag's meaning)."""
    command: str                        # "loop" (agent.py) or "try" (agent.py try)
    tag: str                            # the run's name: branch autoresearch/<tag>
    target: str                         # the target dir: program.md, the frozen prepare.py, train.py
    timeout: float | None               # hard limit per run in seconds (None: target.default_timeout of the budget)
    sandbox: str                        # auto | bwrap | off
    baseline_runs: int                  # runs of the baseline (seeds): their sd is the noise floor
    confirm: int | None                 # further runs a likely win gets before it is kept (0: strict ratchet; None:
                                        # not given: the tag's, or verdict.DEFAULT_CONFIRM for a new tag)
    margin: float | None                # --margin in metric units (None: not given: the tag's, or
                                        # MARGIN_SDS x noise sd)
    verdict: str | None                 # --verdict paired | margin (None: the tag's, or paired for a new tag)
    false_keep: float | None            # --false-keep-rate of the paired rule (None: the tag's, or FALSE_KEEP)
    source: str | None                  # local files to prepare the data from when none is prepared
    cancel: str = "on"                  # --cancel on | off | a rule in curves.RULES: stop a candidate's first run
    #                                     whose curve is behind
    budget_like: str | None = None      # --budget-like NAME: the budget is NAME's compute (harness.run.matched)
    new_hardware: bool = False          # --new-hardware: the tag's fingerprint (harness.run.hardware) differs here:
                                        # measure a new baseline on this hardware before any new candidate
    proposer: str = "external"          # anthropic | openai | tpe | cmaes | random | grid | hybrid; "external": `try`
    llm: str | None = None              # the LLM provider of anthropic | openai | hybrid (from the keys present)
    sampler: str = "tpe"                # --sampler of --proposer hybrid
    llm_share: float = 0.3              # --llm-share: the most experiments the hybrid's LLM may override
    stall: int = 8                      # --stall: experiments without a keep before the hybrid asks for code edits
    chosen: str = ""                    # why the proposer is the one it is (said at start when not given)
    model: str | None = None            # the LLM model (its default filled in)
    base_url: str | None = None         # an OpenAI-compatible endpoint
    max_experiments: int | None = None  # limits of the loop: experiments after the baseline (whole tag),
    hours: float | None = None          # hours of this invocation,
    max_cost_usd: float | None = None   # the tag's LLM spend
    devices: str | None = None          # --devices as given
    ray: str | None = None              # a Ray cluster's address, or "auto"
    no_speculate: bool = False          # ask for an idea only when a device is free
    no_holdout: bool = False            # skip the end-of-run holdout re-score (report.py --holdout does it later)
    seed: int = 0                       # seed of --proposer random
    retry_base_delay: float = 2.0       # first backoff in seconds after a transient LLM error
    message: str | None = None          # try -m: the idea in one line
    baseline: bool = False              # try --baseline
    sync: bool = False                  # try --sync
    fix: bool = False                   # try --fix
    force: bool = False                 # try --force: run an idea the tabu refuses
    tabu: int | None = None             # --tabu: the tenure (None: the tag's, or memory.TENURE; 0: off)
    explore: str = "on"                 # --explore on | off: the bandit names the family of the next proposal
    outer_every: int | None = None      # --outer-every K: an outer step every K experiments (None: off)
    mlflow: str | None = None           # --mlflow: the MLflow tracking URI each experiment is mirrored to (the
                                        # default filled in: sqlite:///<target>/mlflow.db); None: no tracking


def parse(argv):
    """Settings from agent.py's argv: a command named first (SUBCOMMANDS: `try ...` for an external agent's
    experiment), else the loop. Exits 2 on bad flags."""
    args = SUBCOMMANDS[argv[0]](argv[1:]) if argv[:1] and argv[0] in SUBCOMMANDS else parse_args(argv)
    return Settings(**vars(args))


def parse_args(argv):
    """The command line (see --help); picks the default proposer and model. Exits 2 on bad flags."""
    p = loop_parser()
    args = p.parse_args(argv)
    args.command = "loop"
    check_common(p, args)
    check_loop(p, args)
    return args


def loop_parser():
    """The loop's argparse parser: who proposes and the limits, the flags `try` shares (add_common_flags), where the
    runs go (add_placement_flags), the memory (add_memory_flags), the seed and the retry delay."""
    p = argparse.ArgumentParser(
        prog="agent.py",
        description="The overnight research loop: propose an edit to train.py, commit it on autoresearch/<tag>, "
                    "train for the fixed budget, keep it if the metric improved, else reset; log to results.tsv and "
                    "events.jsonl. Rerun the same command to resume after a stop, Ctrl-C or crash.")
    p.add_argument("--tag", required=True, help="run name: work happens on branch autoresearch/<tag> (created from "
                   "HEAD, or resumed if it exists)")
    p.add_argument("--proposer", choices=PROPOSERS,
                   help="who proposes edits. Default: " + ", else ".join(f"{p.name} if {p.key_env} is set" for p in
                   PROVIDERS.values()) + f", else {providers.LOCAL} if --base-url is given, else tpe. "
                   "tpe/cmaes/random: an Optuna sampler "
                   "sets train.py's UPPER_CASE constants (no key; docs/search.md); grid: one constant a step at a "
                   "time; hybrid: a sampler whose points an LLM accepts or overrides, and code edits from the LLM "
                   "when the search stalls (a key)")
    p.add_argument("--sampler", choices=("tpe", "cmaes"), help="--proposer hybrid's sampler (default tpe: it learns "
                   "from every point run, the LLM's too; Optuna's CMA-ES only from its own)")
    p.add_argument("--llm-share", type=number(0, above=True, most=1.0), help="--proposer hybrid: the largest share "
                   "of experiments whose point the LLM may override (default 0.3)")
    p.add_argument("--stall", type=number(0, int, above=True), help="--proposer hybrid: after this many "
                   "experiments without a keep the LLM may propose a code edit instead of a point (default 8)")
    p.add_argument("--model", help="LLM model (default: " + ", ".join(
                   f"{p.default_model} for {p.name}" for p in PROVIDERS.values()) + ")")
    p.add_argument("--base-url", help="API endpoint, e.g. an OpenAI-compatible server (vLLM, ollama, DeepSeek, "
                   "OpenRouter: http://localhost:8000/v1)")
    p.add_argument("--max-experiments", type=number(0, int), help="stop once this many experiments after the baseline "
                   "are done (counted over the whole tag, so a resumed run adds only the difference)")
    p.add_argument("--hours", type=number(0), help="stop before starting an experiment once this invocation has run "
                   "this long")
    p.add_argument("--max-cost-usd", type=number(0), help="stop once the tag's LLM spend reaches this many dollars")
    add_common_flags(p)
    add_placement_flags(p)
    add_memory_flags(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the samplers and --proposer random (default 0)")
    p.add_argument("--retry-base-delay", type=number(0, above=True), default=2.0, help="first backoff in seconds "
                   f"after a transient LLM error (default 2); it doubles per retry up to {RETRY_CAP_S:.0f}s, retried "
                   "forever")
    return p


def add_placement_flags(p):
    """Where the runs go: --devices, --ray, --no-speculate, --no-holdout."""
    p.add_argument("--devices", metavar="SPEC", help="run experiments on several devices at once: CUDA indices "
                   "(e.g. 0,1,2,3: one run per GPU) or cpu:K (K CPU workers sharing this machine's threads). Default: "
                   "one run at a time on this machine as it is")
    p.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS", help="run experiments as tasks on a Ray "
                   "cluster, one GPU each (auto: the cluster `ray start` made on this machine, or ADDRESS, e.g. "
                   "10.0.0.5:6379); needs `uv sync --extra cluster`. agent.py stays the one process that owns git "
                   "and the results")
    p.add_argument("--no-speculate", action="store_true", help="ask for the next idea only when a device is free "
                   "(default: while a candidate trains, the next idea is already asked for)")
    p.add_argument("--no-holdout", action="store_true", help="at the stop, skip re-scoring the baseline and the "
                   "best on the hidden holdout split (a few minutes on a CPU; `report.py --holdout` does it later)")


def add_memory_flags(p):
    """The LLM proposers' memory and outer loop: --tabu, --explore, --outer-every."""
    p.add_argument("--tabu", type=number(0, int), metavar="T", help="refuse a proposal that repeats the change of one "
                   f"of the last T discarded or crashed experiments (a constant moved the same way, the same functions "
                   f"edited; the opposite direction is allowed), before any run (default {memory.TENURE}, kept for "
                   "the tag; 0: off). docs/memory.md")
    p.add_argument("--explore", choices=("on", "off"), help="on (default): the LLM's prompt names the "
                   "least explored families (each constant, code: attention, code: optimizer, ...) and the one a UCB1 "
                   "bandit picks for the next proposal; off: not named")
    p.add_argument("--outer-every", type=number(0, int, above=True), metavar="K", help="the outer loop: every K "
                   "experiments freeze families tried 3 times without a keep and ask the LLM for guidance; every "
                   "second time also for a search mechanism (a Python module run in the sandbox that reviews "
                   "proposals), validated on the trace before it is activated. Off by default; an LLM proposer only")


def check_loop(p, args):
    """The loop's flags checked together and their defaults filled in: the proposer (an LLM whose key is set, else
    tpe: args.chosen says why), hybrid's and the memory's flags only where they apply, --devices or --ray, the
    model. Exits 2 (p.error) naming the conflict."""
    llm = providers.detect(os.environ, args.base_url)
    args.chosen = ""
    if args.proposer is None:
        args.proposer = llm or "tpe"
        args.chosen = "" if llm else (
            "no LLM key, so --proposer tpe: Optuna's TPE sampler sets train.py's UPPER_CASE constants (docs/search.md)."
            f" For LLM edits (or --proposer hybrid) set {providers.words('key_env')}, or --base-url")
    args.llm = args.proposer if args.proposer in PROVIDERS else llm if args.proposer == "hybrid" else None
    hybrid = {"--sampler": args.sampler, "--llm-share": args.llm_share, "--stall": args.stall}
    if args.proposer != "hybrid" and any(v is not None for v in hybrid.values()):
        p.error(f"{', '.join(k for k, v in hybrid.items() if v is not None)}: only --proposer hybrid has them")
    args.sampler, args.llm_share, args.stall = args.sampler or "tpe", args.llm_share or 0.3, args.stall or 8
    memory_flags = {"--tabu": args.tabu, "--explore": args.explore}
    if args.proposer not in PROVIDERS and any(v is not None for v in memory_flags.values()):
        p.error(f"{', '.join(k for k, v in memory_flags.items() if v is not None)}: the memory is the LLM proposers' "
                f"(--proposer {providers.words('name')}); --proposer {args.proposer} has its own (docs/memory.md)")
    args.explore = args.explore or "on"
    if args.outer_every is not None and args.proposer not in PROVIDERS:
        p.error(f"--outer-every: the outer loop asks an LLM, and --proposer is {args.proposer}: use --proposer "
                f"{providers.words('name')} (a key in the environment, or --base-url)")
    if args.devices is not None and args.ray is not None:
        p.error("--devices and --ray: pick one (a Ray cluster schedules its own GPUs)")
    try:
        parse_devices(args.devices, THREADS)        # checked here, made by agent.py (pool.Local)
    except ValueError as e:
        p.error(str(e))
    if args.model is None and args.llm in PROVIDERS:
        args.model = PROVIDERS[args.llm].default_model


def parse_try_args(argv):
    """`agent.py try`'s command line (see `agent.py try --help`). Exits 2 on bad flags."""
    p = argparse.ArgumentParser(
        prog="agent.py try",
        description="One experiment for an external coding agent (Claude Code, Codex) following program.md: the "
                    "train.py in your checkout becomes a candidate commit on autoresearch/<tag>, runs with every "
                    "guarantee of agent.py's loop (hermetic sandboxed run, timeout, separate evaluation, the same "
                    "verdict, a results.tsv row, events, a git note), the branch advances if it is kept, and your "
                    "checkout's train.py becomes the best commit's. Prints a verdict block. Exit codes: 0 a verdict "
                    "(keep, discard or crash: read `status:`), 1 stopped by a problem (message on stderr), 2 bad "
                    "input or state (nothing was run), 130 interrupted (no result; your train.py as you left it).")
    p.add_argument("--tag", required=True, help="run name: experiments go on branch autoresearch/<tag>")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("-m", "--message", help="the idea in one line (the commit subject and results.tsv description)")
    what.add_argument("--baseline", action="store_true", help="the first run of a tag: measure the committed "
                      "train.py unmodified (creates autoresearch/<tag> from HEAD)")
    what.add_argument("--sync", action="store_true", help="write the best commit's train.py into your checkout "
                      "(your current train.py is saved first, and where is printed)")
    p.add_argument("--fix", action="store_true", help="with -m: your train.py fixes the last experiment, which "
                   "crashed: it is committed as an amend of the crashed commit (same parent) and measured as a new "
                   f"experiment with its own row (at most {MAX_FIXES} fixes per idea)")
    p.add_argument("--force", action="store_true", help="with -m: run your train.py even when the tabu refuses it "
                   "(it repeats a recent discard's or crash's change, or a measured diff); the refusal is logged")
    add_common_flags(p)
    args = p.parse_args(argv)
    check_common(p, args)
    if args.fix and args.message is None:
        p.error("--fix needs -m \"<what you fixed>\"")
    if args.new_hardware and not args.baseline:
        p.error(f"--new-hardware measures a new baseline: `agent.py try --tag {args.tag} --baseline --new-hardware` "
                "first, then -m as usual")
    if args.message is not None and not clean_description(args.message):
        p.error(f"-m: {EMPTY_DESCRIPTION}")
    args.command, args.proposer, args.model, args.base_url = "try", "external", None, None
    return args


SUBCOMMANDS = {"try": parse_try_args}   # agent.py's first word -> its parser (Settings.command names it); the loop:
#                                         parse_args. What each runs: agent.COMMANDS


def add_common_flags(p):
    """The flags agent.py's loop and `agent.py try` share: the target, the timeout, the sandbox, the data source."""
    p.add_argument("--target", default=str(ROOT),
                   help="directory holding program.md, the frozen prepare.py and train.py (default: the directory of "
                   "agent.py, the repository root; e.g. grpo for the RL target)")
    p.add_argument("--timeout", type=number(0, above=True), help="hard limit per training run in seconds, kept for "
                   "the tag (default: 2 x TIME_BUDGET, at least TIME_BUDGET + 120, for the baseline; then 2 x the "
                   "wall-time allowance its runs measured); the whole process group is killed. Raise it when this "
                   "machine is too slow or busy for the budget")
    p.add_argument("--sandbox", choices=("auto", "bwrap", "off"), default="auto",
                   help="run train.py inside bubblewrap (read-only filesystem, repository and evaluation data hidden, "
                   "no network): auto = when it works here (Linux), bwrap = required, off = never (default auto)")
    p.add_argument("--baseline-runs", type=number(1, int), default=3, metavar="K", help="run the baseline K times with "
                   "different seeds (AUTORESEARCH_SEED): their mean is the first best, their standard deviation the "
                   "noise floor (default 3)")
    p.add_argument("--confirm", type=number(0, int), metavar="C", help="runs a candidate may get after its first "
                   f"(the paired rule: at most, default {PAIRED_CONFIRM}; the margin rule: a likely win's "
                   f"confirmations, default {DEFAULT_CONFIRM}); 0: the first run decides, strictly, as in karpathy's "
                   "ratchet. Fixed for a tag when its baseline is recorded, like the budget")
    p.add_argument("--margin", type=number(0), help="the margin rule: how much a candidate must beat the best by, "
                   "in metric units (default: 2 x the noise sd measured by the baseline runs; 0, strictly better, "
                   "with --confirm 0 or one baseline run). Fixed for a tag when its baseline is recorded")
    p.add_argument("--verdict", choices=tuple(verdict.RULES), help="paired (the default for a new tag): each run of "
                   "a candidate uses the seed of a run of the best and the candidate is judged on the differences, "
                   f"with a sequential t-test of up to 1 + C runs (--confirm C, default {PAIRED_CONFIRM}); margin: its "
                   "mean must beat the best's by --margin (default 2 noise sds), confirmed by C more runs (default "
                   f"{DEFAULT_CONFIRM}). Fixed for a tag when its baseline is recorded")
    p.add_argument("--false-keep-rate", type=rate, dest="false_keep", metavar="P", help="the paired rule: how often "
                   f"an edit that changes nothing may be kept (above 0, below 0.5; default {FALSE_KEEP:g}: one per "
                   f"{1 / FALSE_KEEP:.0f}). Fixed for a tag when its baseline is recorded")
    p.add_argument("--source", metavar="PATH", help="when no data is prepared yet: prepare it from these local files "
                   "(prepare.py --source PATH; offline) instead of the default download for this device")
    p.add_argument("--budget-like", choices=sorted(matched.REFERENCES), metavar="GPU", help="a compute-matched "
                   "budget: the profile's budget on this GPU (" + ", ".join(sorted(matched.REFERENCES)) + ") in this "
                   "device's seconds, by datasheet peaks (a measured matmul where there is none), e.g. 300 s on an "
                   "H100 = 1,799 s on an RTX 4090. Fixed for a tag; its rows are labelled [like GPU ...]")
    p.add_argument("--new-hardware", action="store_true", help="resume a tag whose hardware or software (GPU, CPU, "
                   "threads, torch, CUDA: its fingerprint, recorded when it started) differs here: a new baseline "
                   "(the best's train.py, --baseline-runs times) is measured here before anything else, and every "
                   "later row is marked [hwN] (report.py keeps the hardware apart). `try`: with --baseline. Without "
                   "it such a resume is refused, naming the differences")
    p.add_argument("--cancel", choices=("on", "off", *curves.RULES), default="on", help=f"on (default): "
                   f"{curves.RULES[curves.DEFAULT].words().replace('%', '%%')} (docs/loop.md); off: every run trains to the end; or a "
                   "cancel rule by name")
    p.add_argument("--mlflow", nargs="?", const="", metavar="URI", help="mirror each experiment into MLflow as a run "
                   "(params, metrics, the learning curve, the diff; docs/tracking.md): URI of the tracking store "
                   f"(default: {tracking.DEFAULT_URI.format(target='<target>')}, artifacts in <target>/"
                   f"{tracking.ARTIFACTS}); needs `uv sync --extra tracking`. A failure of MLflow is a warning, "
                   "never a lost experiment")


def number(low, kind=float, above=False, most=math.inf):
    """An argparse type: a finite `kind` (float or int) of at least `low` (above `low` with above=True), at most
    `most`. A value out of range, nan or inf exits 2 with "argument --FLAG: ..." naming the range."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}")
        if not math.isfinite(value) or value < low or above and value == low or value > most:
            raise argparse.ArgumentTypeError(f"{text!r}: use a finite number {'above' if above else 'of at least'} "
                                             f"{low:g}" + (f" and at most {most:g}" if most < math.inf else ""))
        return value
    return parse


def rate(text):
    """An argparse type: a false-keep rate, a number above 0 and below 0.5 (0 would keep nothing, 0.5 is a coin)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 0.5:
        raise argparse.ArgumentTypeError(f"{text!r}: use a rate above 0 and below 0.5 (e.g. 0.02: one kept no-op per "
                                         "50; 0 would keep nothing, 0.5 is a coin toss)")
    return value


def check_common(p, args):
    """The shared flags the parser cannot check alone: a tag that makes a valid, short branch name, an MLflow URI
    (its default filled in)."""
    tag = args.tag
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", tag) or ".." in tag or tag.endswith((".", ".lock")):
        p.error(f"--tag {tag!r}: use up to 100 letters, digits, '.', '_' and '-', starting with a letter or digit, "
                "without '..' and not ending in '.' or '.lock' (it names a git branch; e.g. nov30)")
    if args.verdict == "paired" and args.margin is not None:
        p.error("--margin is the margin rule's: use --verdict margin with it (the paired rule has no margin: "
                "--false-keep-rate sets how sure it must be)")
    if args.false_keep is not None and (args.verdict == "margin" or args.verdict is None and args.margin is not None):
        p.error("--false-keep-rate is the paired rule's: leave it out with --verdict margin or --margin (the margin "
                "decides there)")
    if args.mlflow is not None:
        try:
            args.mlflow = tracking.check_uri(args.mlflow, Path(args.target).resolve())
        except ValueError as e:
            p.error(f"--mlflow: {e}")
