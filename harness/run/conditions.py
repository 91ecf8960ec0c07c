"""
HARNESS: the conditions a run ran under, measured by the harness, never by train.py: the device's speed, as the time
the target's fixed probe takes (`prepare.py --probe` from the pristine copy, run right before and right after
train.py, in the evaluator's view); what those conditions allow a run (its wall time, Allowance); and when two runs'
conditions differ enough that comparing their metrics would compare machines (differ). A probe that fails or prints
nonsense gives None: nothing is scaled by it and no conditions are compared, with a warning.
"""

import dataclasses
import math
import subprocess
from pathlib import Path

from harness.run import evaluator

PROBE_TIMEOUT_S = 120       # a probe is a few seconds; one that takes this long is broken, not slow
SHARE = 0.15                # runs whose probes differ by more than this share ran under other conditions
RATIO_RANGE = (0.1, 10.0)   # a slowdown is clamped to this range (a probe 30x slower under load still allows 10x)
OVERHEAD_SHARE = 0.10       # the allowance: the baseline's start-up and evaluation overhead, scaled, plus this share
SLACK_SHARE = 0.005         # ... plus this share of the budget (the last step overshooting it) ...
SLACK_S = 2.0               # ... plus these seconds (process start, export; a further run over the allowance runs
#                             again: harness.judge.verdict): docs/trust.md tabulates the slack this leaves
LEGACY = (1.5, 0.02, 5.0)   # a smoke budget: 1.5 x overhead + 2 % of the budget + 5 s (the allowance before probes)
TIMEOUT_TIMES = 2.0         # once the baseline is measured, a run is killed at this many times its allowance (at least
#                             target.default_timeout): a limit for hung runs, never one that an honest run meets


class Probe:
    """Runs the pristine `prepare.py --probe` (prepare_dir) through wrap (argv -> argv: the evaluator's sandbox)
    with env; a call returns (seconds, "") or (None, why not). The target's probe times a fixed workload on the
    run's device and prints `probe_s: SECONDS`. warm: the probe after a run may start with it (start(); sandboxed
    runs only: out of train.py's reach while it waits). Picklable (a Ray worker builds its own)."""

    def __init__(self, python, prepare_dir, wrap, env, warm=False):
        self.python, self.prepare_dir, self.wrap, self.env = python, Path(prepare_dir), wrap, env
        self.warm = warm

    def start(self):
        """A probe started now, to be taken later: its process does prepare.py's imports while a run trains (torch's
        alone, about 2 s on a CPU and on a GPU's host) and waits; calling it (once) tells it to go and returns what
        a call of this Probe would. close() kills it if it was never called. Raises OSError when it cannot start."""
        return Started(evaluator.Waiting(self.wrap, self.python, self.prepare_dir, ["--probe"], self.env,
                                         errors_apart=True))

    def __call__(self):
        argv = self.wrap([self.python, str(self.prepare_dir / "prepare.py"), "--probe"])
        try:
            done = subprocess.run(argv, cwd=self.prepare_dir, env=self.env, capture_output=True, text=True,
                                  timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"the probe did not finish ({type(e).__name__})"
        return answer(done.returncode, done.stdout, done.stderr)


class Started:
    """A probe's process waiting to be told to go (Probe.start)."""

    def __init__(self, waiting):
        self.waiting = waiting

    def __call__(self):
        """(seconds, "") or (None, why not), as Probe's call."""
        rc, timed_out = self.waiting.finish(PROBE_TIMEOUT_S)
        if timed_out:
            return None, "the probe did not finish (TimeoutExpired)"
        return answer(rc, self.waiting.output().decode(errors="replace"),
                      self.waiting.output(errors=True).decode(errors="replace"))

    def close(self):
        """Kill it unless it was called."""
        self.waiting.close()


def answer(rc, stdout, stderr):
    """(seconds, "") or (None, why not) from a probe's exit code and output (text): its stderr's last line names a
    failure."""
    if rc != 0:
        last = (stderr.strip().splitlines() or ["no output"])[-1][:200]
        return None, f"`prepare.py --probe` exited {rc}: {last}"
    return parse(stdout)


def parse(text):
    """(seconds, "") from a probe's output (its last `probe_s:` line), or (None, what is wrong)."""
    lines = [line.partition(":")[2].strip() for line in text.splitlines() if line.startswith("probe_s:")]
    if not lines:
        return None, "`prepare.py --probe` printed no probe_s line"
    try:
        seconds = float(lines[-1])
    except ValueError:
        return None, f"probe_s is not a number: {lines[-1][:40]!r}"
    if not math.isfinite(seconds) or seconds <= 0 or seconds > PROBE_TIMEOUT_S:
        return None, f"probe_s is {seconds}: not a time the probe can have taken"
    return seconds, ""


def start_up_scale(probe_s, base_probe_s):
    """The factor on the baseline's start-up overhead for a run whose probe took probe_s: the slowdown when the
    device is slower (a machine made 3x slower gets 3x the start-up), 1 when it is as fast or faster or unknown. The
    probe times a matmul; start-up is imports, data and process work, which a faster probe does not shorten: in a
    lab campaign on 2 shared cores, probes at 0.76x and 0.81x the baseline's came with 76.7 s and 76.8 s of train.py
    wall time against the baseline's 74-77 s, and scaling down rejected both honest runs."""
    return max(1.0, slowdown(probe_s, base_probe_s) or 1.0)


def combine(before, after):
    """The probe of a run: the mean of the probes before and after it (either alone when the other failed)."""
    found = [p for p in (before, after) if p is not None]
    return sum(found) / len(found) if found else None


def slowdown(probe_s, base_probe_s):
    """probe_s / base_probe_s: how much slower the device is now than it was (2.0: half as fast), clamped to
    RATIO_RANGE. None when either is unknown."""
    if not probe_s or not base_probe_s:
        return None
    return min(max(probe_s / base_probe_s, RATIO_RANGE[0]), RATIO_RANGE[1])


def differ(probe_s, other_s):
    """Whether two runs ran under other conditions: their probes differ by more than SHARE of the faster one's.
    False when either is unknown (nothing to compare: the old rule)."""
    if not probe_s or not other_s:
        return False
    return max(probe_s, other_s) / min(probe_s, other_s) - 1 > SHARE


@dataclasses.dataclass(frozen=True)
class Allowance:
    """The wall time a run of train.py may take: the budget, plus the baseline's overhead (its train.py wall time
    minus the budget: imports, data, compilation, the final evaluation) scaled by the device's slowdown since the
    baseline's probe (unscaled without a probe) and by K, the CPU workers sharing the machine (K runs import at once),
    plus OVERHEAD_SHARE of it, SLACK_SHARE of the budget and SLACK_S: tight at every budget whose rows are compared,
    so that compute outside the budget (work at import time, training past the budget) gains at most slack(). Only at
    a smoke budget (comparable False: the target's TIME_BUDGET shortened, its rows labelled and never compared with
    full ones), where start-up dominates: the lenient allowance from before probes, LEGACY (scaled by the slowdown
    when there is one), so that the start-up's own jitter under load rejects no honest run."""
    budget: float
    overhead: float
    base_probe: float | None = None
    workers: int = 1
    comparable: bool = True         # the target's own TIME_BUDGET (False: a smoke budget, Session.smoke)

    def seconds(self, probe_s=None):
        """Seconds of train.py wall time allowed for a run whose probe took probe_s. A slower probe scales the
        overhead up; a faster one leaves it at the baseline's (start_up_scale): the probe times matmuls, and on 2
        shared cores probes 0.76x the baseline's came with the baseline's start-up (docs/loop.md)."""
        overhead = self.overhead * start_up_scale(probe_s, self.base_probe) * self.workers
        if not self.comparable:
            scale, share, fixed = LEGACY
            return self.budget + scale * overhead + share * self.budget + fixed
        return self.budget + overhead * (1 + OVERHEAD_SHARE) + SLACK_SHARE * self.budget + SLACK_S

    def need(self, probe_s=None):
        """Seconds of train.py wall time the baseline's own run would take at probe_s: the budget plus its overhead
        scaled like seconds(), without the slack. A timeout shorter than this kills the baseline itself."""
        return self.budget + self.overhead * start_up_scale(probe_s, self.base_probe) * self.workers

    def scaled_words(self, probe_s):
        """How the allowance was scaled, for an overtime rejection: ", the speed probe 1.80x the baseline's: start-up
        allowed 36s" ("" without a probe)."""
        ratio = slowdown(probe_s, self.base_probe)
        if ratio is None:
            return ""
        return (f", the speed probe {ratio:.2f}x the baseline's: start-up allowed "
                f"{self.overhead * start_up_scale(probe_s, self.base_probe):.0f}s")

    def slack(self, probe_s=None):
        """Seconds a candidate can spend outside the budget without being rejected, under the baseline's conditions
        (probe_s None: the baseline's own): the allowance minus the budget and the overhead it measured."""
        probe_s = probe_s or self.base_probe
        return self.seconds(probe_s) - self.need(probe_s)

    def words(self):
        """The allowance in a line, for the baseline's output and `try`."""
        slack = self.slack()
        line = (f"wall-time allowance: a run may take {self.seconds(self.base_probe):.0f}s, the {self.budget:g}s "
                f"budget plus the {self.overhead:.1f}s of start-up and evaluation the baseline took ("
                f"{'scaled by the speed probe' if self.base_probe else 'not scaled: no speed probe'}) plus slack; "
                f"an edit that does work outside the budget (at import, or training past it) gains at most "
                f"{slack:.1f}s ({slack / self.budget:.1%} of the budget) before its run is rejected as overtime")
        if not self.comparable:
            line += ("; at this smoke budget edits that move work to start-up or past the budget are not comparable "
                     "(start-up dominates, and its rows are labelled; the allowance is the lenient one)")
        return line


@dataclasses.dataclass(frozen=True)
class Timeout:
    """The hard limit on a training run's wall time, the tag's like its budget: `given` (--timeout, or the one the
    tag's baseline recorded) as is; else, before the baseline is measured (allowance None), `floor`
    (target.default_timeout); after it, TIMEOUT_TIMES x the wall-time allowance at the run's speed probe, at least
    `floor`, so that a machine whose start-up outlasts the budget gets a limit its honest runs fit in. A run killed
    by a limit shorter than the baseline's own need at that speed (short) is not judged, like an overtime."""
    floor: float
    given: float | None = None
    allowance: Allowance | None = None

    def seconds(self, probe_s=None):
        """Seconds a run whose speed probe (before it) took probe_s may take before its process group is killed."""
        if self.given:
            return self.given
        if self.allowance is None:
            return self.floor
        return max(self.floor, TIMEOUT_TIMES * self.allowance.seconds(probe_s))

    def short(self, probe_s=None):
        """Whether seconds(probe_s) is shorter than the baseline's own run would take at probe_s (Allowance.need):
        a run it kills says nothing of its train.py. False before the baseline."""
        return self.allowance is not None and self.seconds(probe_s) < self.allowance.need(probe_s)

    def words(self):
        """The limit in a few words, for the loop's first line: "600s (given)", "180s until the baseline is measured,
        then 2 x the wall-time allowance", "180s (2 x the wall-time allowance, at least 180s)"."""
        if self.given:
            return f"{self.given:g}s (given)"
        if self.allowance is None:
            return f"{self.floor:g}s until the baseline is measured, then {TIMEOUT_TIMES:g} x the wall-time allowance"
        return f"{self.seconds():.0f}s ({TIMEOUT_TIMES:g} x the wall-time allowance, at least {self.floor:g}s)"

    def short_words(self, probe_s=None):
        """Why a run killed at a short limit is not judged, and the flag that fixes it."""
        return (f"not judged: killed at the {self.seconds(probe_s):.0f}s timeout, shorter than the "
                f"{self.allowance.need(probe_s):.0f}s the baseline's own run takes on this machine now; give "
                f"--timeout {math.ceil(TIMEOUT_TIMES * self.allowance.seconds(probe_s))} or more")
