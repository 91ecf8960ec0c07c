"""
HARNESS: the model artifacts a tag keeps and the holdout re-score. Each run's artifact (train.py's model, handed to the
frozen evaluation) is moved to <harness dir>/artifacts/<n>-<name>; only the baseline's and the best's stay, so that
`report.py --holdout` and the end of a run can score both on the split the search never saw. No git, no ledger
writes: report.py imports this without the harness's session.
"""

import os
import shutil
from pathlib import Path

from harness import schema
from harness.errors import SetupError
from harness.ledger import baseline_of
from harness.run.target import score_holdout
from harness.schema import Event


def artifact_path(home, n, name):
    """Where experiment n's model artifact (its last run's) is kept in the tag's harness dir `home`."""
    return Path(home) / "artifacts" / f"{n:04d}-{name}"


def remove(path):
    """Delete a file, a link (never what it points to) or a folder; nothing if it is not there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def keep_artifact(home, n, name, path):
    """Move a run's model artifact (a file, or a folder: GRPO's weights; checked regular files and folders only) to
    artifact_path (moved, not copied: the run dir goes anyway), readable by all, writable by nobody else."""
    saved = artifact_path(home, n, name)
    saved.parent.mkdir(parents=True, exist_ok=True)
    remove(saved)
    for entry in [path, *(path.rglob("*") if path.is_dir() else [])]:
        entry.chmod(0o755 if entry.is_dir() else 0o644)
    os.replace(path, saved)


def prune_artifacts(home, keep, recorded):
    """Remove the kept artifacts of the recorded experiments (numbered below `recorded`) but those numbered in
    `keep` (the baseline and the best); those of experiments still in flight on other devices stay."""
    for path in (Path(home) / "artifacts").glob("*"):
        if int(path.name.split("-")[0]) not in keep and int(path.name.split("-")[0]) < recorded:
            remove(path)


def pinned_env(all_events, tag):
    """The variables the tag's frozen inputs pinned when it started (e.g. AUTORESEARCH_GRPO_MODEL: the base model's
    absolute snapshot path, resolved once), from its "frozen_inputs" event; {} when none."""
    return next(iter(schema.of(all_events, Event.FROZEN_INPUTS, tag=tag)), {}).get("env") or {}


def holdout_summary(home, history, metric, goal, env=None, wrap=None):
    """One line comparing the gain the search reported on its own split with the gain on the hidden holdout split:
    the baseline's and the best's saved artifacts re-scored there (target.score_holdout). history: the tag's
    "experiment" events (the baseline is its latest, ledger.baseline_of: the current hardware's); env: the variables
    pinned at tag start (pinned_env); wrap: (argv, artifact) -> argv, the evaluator's sandbox. Raises SetupError when it
    cannot be measured (no artifacts, no holdout)."""
    best, first = [e for e in history if e["status"] == "keep"][-1], baseline_of(history)   # this hardware's
    found = [next(iter(sorted((Path(home) / "artifacts").glob(f"{e['n']:04d}-*"))), None) for e in (first, best)]
    if None in found:
        raise SetupError(f"no saved model artifact of experiment #{first['n'] if found[0] is None else best['n']} "
                         f"in {Path(home) / 'artifacts'} (runs before artifacts were kept, or a target without a "
                         "separate evaluation)")
    base, top = (score_holdout(Path(home) / "frozen", path, metric, env=env, wrap=wrap) for path in found)
    sign = 1 if goal == "min" else -1
    return (f"holdout      baseline {base:.6f}, best #{best['n']} {top:.6f}: gain {sign * (base - top):+.6f} on the "
            f"holdout the search never saw, {sign * (first['metric'] - best['metric']):+.6f} reported on "
            f"{metric}'s own split")
