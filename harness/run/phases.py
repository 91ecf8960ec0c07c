"""
HARNESS: where a device's wall time goes. A run's seconds split into its phases (the speed probes, train.py's
start-up, its training budget, its own end (the final evaluation and the model's export), the separate evaluation,
the harness's work around it), summed per device by the pool; the training share is the seconds in training
budgets over the wall seconds, the figure a night's experiment count follows (karpathy's own run: 300 s of training
in 325.9 s of wall time, 92 %).
"""

import math

# The phases, in the order a run goes through them, with the words the status, the report and the page use.
PHASES = {
    "probe": "speed probes",
    "start-up": "train.py's start-up",
    "training": "training",
    "end": "train.py's own evaluation and export",
    "unsplit": "train.py with no summary (crashed, cancelled, timed out)",
    "evaluation": "the separate evaluation",
    "harness": "the harness (export, sandbox, guard, verdict, records)",
    "in flight": "a run in flight",
    "idle": "idle (waiting for an idea, recording)",
}


def _seconds(summary, key, most):
    """summary[key] as seconds in [0, most], or None when it is missing or not a number."""
    try:
        value = float(summary.get(key, ""))
    except ValueError:
        return None
    return min(max(value, 0.0), most) if math.isfinite(value) else None


def split(summary, process_s, probe_s=0.0, evaluation_s=0.0):
    """{phase: seconds} of one run. summary: train.py's summary block ({key: text}); process_s: the wall seconds of
    train.py's process; probe_s: of the speed probes around it; evaluation_s: of the separate evaluation. train.py's
    own `training_seconds` and `eval_seconds` (its final evaluation, which exports the model) are taken as it printed
    them, clipped to its process's wall time; the rest of that time is start-up. A run with no training_seconds (a
    crash, a cancel, a timeout) is "unsplit". The harness's own seconds are added by the caller, who sees them."""
    found = {"probe": probe_s, "evaluation": evaluation_s}
    training = _seconds(summary, "training_seconds", process_s)
    if training is None:
        return {**found, "unsplit": process_s}
    end = _seconds(summary, "eval_seconds", process_s - training) or 0.0
    return {**found, "start-up": process_s - training - end, "training": training, "end": end}


def add(total, phases):
    """Add phases ({phase: seconds}) into total, in place."""
    for name, seconds in phases.items():
        total[name] = total.get(name, 0.0) + seconds


def rounded(phases):
    """{phase: seconds to the millisecond} in PHASES' order, zeros left out: for an event."""
    return {name: round(phases[name], 3) for name in PHASES if phases.get(name)}


def words(shares, least=0.005):
    """'training 91%; start-up 4%, evaluation 2%, ...' from {phase: share of the wall time}: training first, then the
    rest largest first, shares under `least` left out."""
    rest = sorted(((v, k) for k, v in shares.items() if k != "training" and v >= least), reverse=True)
    return f"training {shares.get('training', 0.0):.0%}" + ("; " if rest else "") + ", ".join(
        f"{PHASES.get(k, k).split(' (')[0]} {v:.0%}" for v, k in rest)
