"""
HARNESS: MLflow tracking (`--mlflow [URI]`): mirrors each recorded experiment into one MLflow run of the experiment
"autoresearch/<tag>": the constants it changed (params), its metric, each run's, memory, time and throughput, its
learning curve (metrics), status, commit, branch and proposer (tags), its diff and log tail (artifacts, redacted).
A copy for browsing, never a record the loop reads: events.jsonl, results.tsv and the git notes stay the truth, and a
failure of MLflow (not installed, the store locked, unwritable or full, any exception) is one warning line, never a
lost experiment; the next experiment tries again. mlflow is imported only with --mlflow, with its telemetry off;
nothing here touches the network but a URI you give. Never writes the ledger or git.

    s.tracking = tracking.start(s)              # at session start: None without --mlflow
    run = tracking.begin(s, n, name)            # before the "experiment" event: the MLflow run's id (None: not tracked)
    tracking.finish(s, run, event, result, log) # after it: params, metrics, tags, artifacts, the run's end status
"""

import dataclasses
import errno
import logging
import os
import time
from pathlib import Path
from urllib.parse import urlparse

from harness import console, files, gitops, ledger
from harness.judge import curves
from harness.propose import memory
from harness.errors import FIXES
from harness.redact import redact
from harness.schema import Event

DEFAULT_URI = "sqlite:///{target}/mlflow.db"    # --mlflow without a URI: a SQLite store in the target dir
ARTIFACTS = "mlartifacts"                       # the artifacts' dir beside a SQLite store
SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks")
# Set before mlflow is imported: MLflow 3 sends usage telemetry unless told not to (mlflow/telemetry/utils.py reads
# both), and a tracking server that is down must not hold an experiment for minutes of retries (yours win).
QUIET_ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
SERVER_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
LOG_TAIL_LINES = 200


@dataclasses.dataclass
class Tracker:
    """One session's MLflow connection: the URI, where its artifacts go (None: the server's choice), and once
    connected the client and the experiment's id (dropped after a failure, so the next experiment reconnects)."""
    uri: str
    artifacts: str | None
    client: object = None
    experiment: str | None = None


def check_uri(text, target):
    """The tracking URI --mlflow names ("" : DEFAULT_URI in the target dir `target`, a Path). Raises ValueError with
    the accepted forms for a URI without a known scheme (a bare path included)."""
    if text == "":
        return DEFAULT_URI.format(target=Path(target).as_posix())
    scheme = urlparse(text).scheme.split("+")[0].lower()
    if scheme not in SCHEMES:
        raise ValueError(f"{text!r} is not an MLflow tracking URI: use sqlite:///PATH/mlflow.db, http://HOST:5000 "
                         f"(a tracking server) or another of {', '.join(SCHEMES)}; or --mlflow alone for "
                         f"{DEFAULT_URI.format(target='<target>')}")
    return text


def start(s):
    """The session's Tracker, or None without --mlflow. Makes a SQLite store inside the repository ignored by git
    (with its artifacts dir), and says once when mlflow is not installed (experiments are then not tracked)."""
    uri = s.settings.mlflow
    if uri is None:
        return None
    artifacts, db = None, sqlite_path(uri)
    if db is not None:
        artifacts = (db.parent / ARTIFACTS).as_uri()
        root = Path(s.repo.working_tree_dir).resolve()
        if db.parent.resolve().is_relative_to(root):
            gitops.ensure_ignored(s.repo, [db, db.with_name(db.name + "-journal"), db.parent / ARTIFACTS])
    elif urlparse(uri).scheme.split("+")[0] not in ("http", "https", "databricks", "file"):
        artifacts = (s.tag.target / ARTIFACTS).as_uri()     # another database: artifacts beside the target, not the cwd
    try:
        load()
    except Exception as e:      # ImportError; or an install broken another way
        console.say(f"warning: mlflow: not installed ({e}): `uv sync --extra tracking`; experiments are recorded "
                    "without MLflow")
    return Tracker(uri, artifacts)


def sqlite_path(uri):
    """The database file of a sqlite:/// URI (a Path), else None."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(urlparse(uri).path[1:]).absolute()       # sqlite:////abs/mlflow.db, sqlite:///relative.db


def load():
    """Import mlflow with its telemetry off and its own log lines quiet; returns the module. Raises ImportError."""
    for name, value in QUIET_ENV.items():
        os.environ[name] = value
    for name, value in SERVER_ENV.items():
        os.environ.setdefault(name, value)
    import mlflow
    from mlflow.store.db import utils
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.ERROR)
    files.route_library_logs()         # mlflow's own terminal handler, put there by its import: off
    # MLflow tries a database that will not open 10 times over 100 s, at every experiment: twice is enough here
    utils.MAX_RETRY_COUNT = min(getattr(utils, "MAX_RETRY_COUNT", 2), 2)
    return mlflow


def begin(s, n, name):
    """Start experiment n's MLflow run, named `name` (shortened to 60 characters after "#n "). Returns its run id,
    or None: no --mlflow, mlflow not installed, or MLflow failed (one warning line; the experiment is recorded as
    without it). Runs that a killed agent left running in the experiment are ended as KILLED first."""
    t = s.tracking
    if t is None:
        return None
    try:
        mlflow = load()
    except Exception:
        return None                                     # said once at the start
    try:
        if t.client is None:
            if (db := sqlite_path(t.uri)) is not None and db.exists() and not db.is_file():
                raise IsADirectoryError(errno.EISDIR, "not a database file", str(db))
            t.client = mlflow.MlflowClient(tracking_uri=t.uri)
            t.experiment = experiment_id(t, f"autoresearch/{s.settings.tag}")
        for left in t.client.search_runs([t.experiment], "attributes.status = 'RUNNING'", max_results=100):
            t.client.set_terminated(left.info.run_id, "KILLED")
        run = t.client.create_run(t.experiment, run_name=redact(f"#{n} {name[:60]}"), tags={"n": str(n)})
        return run.info.run_id
    except Exception as e:          # MLflow's errors have no common base: any of them is a warning, never a stop
        fail(s, f"experiment #{n} not tracked", e)
        return None


def experiment_id(t, name):
    """The id of MLflow experiment `name`, created with the tracker's artifact location when new."""
    found = t.client.get_experiment_by_name(name)
    return found.experiment_id if found else t.client.create_experiment(name, artifact_location=t.artifacts)


def finish(s, run, event, result, log):
    """Log experiment event `event` (its Result `result`; log: its first run's log, the curve beside it) into MLflow
    run `run` (None: nothing) and end it:
    FINISHED for a keep or discard, FAILED for a crash. A failure is one warning line (the run is ended FAILED
    when MLflow still answers)."""
    if run is None:
        return
    t = s.tracking
    try:
        load()
        metrics, params, tags = contents(s, event, log)
        from mlflow.entities import Metric, Param, RunTag
        now = int(time.time() * 1000)
        t.client.log_batch(run, metrics=[Metric(k, v, now, step) for k, v, step in metrics],
                           params=[Param(k, v) for k, v in params.items()],
                           tags=[RunTag(k, v) for k, v in tags.items()])
        for artifact, text in artifacts(s, event, result, log).items():
            t.client.log_text(run, text, artifact)
        t.client.set_terminated(run, "FAILED" if event["status"] == "crash" else "FINISHED")
    except Exception as e:
        fail(s, f"experiment #{event['n']}'s MLflow run {run} is incomplete", e)
        try:
            t.client.set_terminated(run, "FAILED")
        except Exception:
            pass


def contents(s, event, log):
    """(metrics as [(key, value, step)], params, tags) of an experiment's run: the verdict's metric (key: the
    target's metric name), each run's (<metric>_run, step: the run's index), memory_gb, wall, train and eval seconds,
    tokens_per_sec, cost_usd; the curve of its first run (train_loss, curve_tokens_per_sec; step: progress in
    per-mille); params: the constants it changed (their new values; "(removed)"), the tag, its base commit; tags:
    status, kind, commit (full sha), branch, proposer, hardware_epoch, budget_s, smoke; the note: the row's
    description with its labels."""
    metrics = [(s.tag.metric, event["metric"], 0)] if ledger.has_metric(event) else []
    metrics += [(f"{s.tag.metric}_run", value, i) for i, value in enumerate(event.get("runs") or [])
                if value is not None]
    for key in ("memory_gb", "wall_seconds", "train_seconds", "eval_seconds", "tokens_per_sec", "cost_usd"):
        if isinstance(event.get(key), (int, float)):
            metrics.append((key, float(event[key]), 0))
    curve = curves.load(log)
    if curve is not None:
        points = {round(1000 * q.progress): q for q in curve.points}      # one per per-mille: the last
        metrics += [("train_loss", q.loss, step) for step, q in points.items()]
        metrics += [("curve_tokens_per_sec", q.tokens_per_sec, step) for step, q in points.items()
                    if q.tokens_per_sec is not None]
    params = {"tag": s.settings.tag, "base": event["base"]}
    if event["n"] > 0:
        before, after = (gitops.file_at(s.repo, c, s.tag.train_rel) for c in (event["base"], event["full_commit"]))
        params.update({name: "(removed)" if new is None else redact(new)[:500]
                       for name, (_, new) in memory.constants_changed(before, after).items()})
    tags = {"status": event["status"], "kind": event["kind"], "commit": event["full_commit"], "branch": s.tag.branch,
            "proposer": event["proposer"], "mlflow.note.content": ledger.results_row(event).split("\t", 4)[4],
            "hardware_epoch": str(event.get("hardware_epoch") or 1), "budget_s": f"{event['budget_s']:g}",
            "smoke": str(bool(event.get("smoke"))).lower()}     # a smoke or another hardware's run is told apart
    return metrics, params, tags


def artifacts(s, event, result, log):
    """{artifact file: text}: diff.patch (train.py from its base to its commit; none for the baseline) and
    log_tail.txt (the first run's last lines), secrets redacted."""
    found = {}
    if event["base"] != event["full_commit"]:
        found["diff.patch"] = redact(s.repo.git.diff(event["base"], event["full_commit"], "--", s.tag.train_rel) + "\n")
    tail = result.outcome.log_tail
    if not tail and Path(log).is_file():
        tail = "\n".join(Path(log).read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
    if tail:
        found["log_tail.txt"] = redact(tail + "\n")
    return found


def fail(s, what, e):
    """One warning line (and a "warning" event) for a failure of MLflow: what was not done, the error's first line,
    the fix. The client is dropped so that the next experiment reconnects."""
    first = (str(e).strip().splitlines() or [""])[0][:200]
    words = f"{type(e).__name__}: {first}" if first else type(e).__name__
    s.tracking.client = None
    reason = f"{what} in {s.tracking.uri} ({words}): {fix_of(e, first)}; the experiment is recorded as without MLflow"
    console.say(f"warning: mlflow: {reason}")
    s.log(Event.WARNING, where="mlflow", reason=reason)


def fix_of(e, first):
    """The fix for an MLflow failure, in words."""
    low = first.lower()
    if isinstance(e, OSError) and e.errno in FIXES:
        return FIXES[e.errno]
    if "locked" in low:
        return "another process holds the store's lock: wait for it or stop it (the next experiment tries again)"
    if "disk" in low and "full" in low or "no space" in low:
        return "free space on the store's disk"
    if isinstance(e, OSError) or any(w in low for w in ("unable to open", "readonly", "read-only", "permission")):
        return "make the store's directory exist and writable, or pass another --mlflow URI"
    return "check the store (--mlflow URI) and its server"
