"""
HARNESS: the ledger. Owns the two record formats and every read and write of them:
  results.tsv   karpathy's 5 columns, one row per experiment (commit, metric, memory_gb, status, description)
  events.jsonl  one JSON object per line: everything else (tokens and cost, timings, repairs, crash log tails)
Events are the source of truth and are written first; a row is derived from its "experiment" event. agent.py
writes through this module and report.py and analysis.ipynb read through it. Appends, with two exceptions: a
last line torn by a kill (no final newline, not a whole row or event) is cut off before the next append
(repair_last_line, repair_results; the caller logs the fragment as a "torn_line" event), and when a tag starts or
resumes after another, the rows of other tags move to results.<tag>.tsv and results.tsv is replaced atomically by
the header and this tag's rows (keep_one_tag). No row an event accounts for is lost; it never touches git.

Order of operations for experiment n, and what a restart after SIGKILL at each point finds and does:
  1. "candidate" event (with the blob sha of the new train.py), commit in the harness's stage worktree, candidate
     ref, "commit" event          -> nothing to undo: the branch has not moved; experiment n is simply redone
  2. "run" event (process group id, run dir), train and evaluate, "run_end" event
                                  -> a training group still alive is killed; the run dir is replaced on the redo
  3. "experiment" event  (the experiment happened: from here on it counts)
  4. results.tsv row              -> if the kill hit between 3 and 4, the row is appended on restart (restore_outputs);
                                     a row cut mid-write is removed first (repair_results)
  5. keep: the branch moves to the candidate (update-ref)
                                  -> if the kill hit between 3 and 5, the branch is moved on restart
n is the number of the tag's "experiment" events, so an interrupted experiment is simply redone (its commit stays
reachable under refs/autoresearch/<tag>/), and no row is ever duplicated or lost.
"""

import dataclasses
import datetime
import json
import os
import re
from pathlib import Path

from harness import files, schema
from harness.errors import Stop
from harness.redact import redact_all
from harness.schema import Event

RESULTS, EVENTS = "results.tsv", "events.jsonl"
STATUSES = ("keep", "discard", "crash")
HEADER_HINT = "commit<TAB><metric><TAB>memory_gb<TAB>status<TAB>description"

# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def results_header(metric):
    """karpathy's header line for a metric, e.g. commit<TAB>val_bpb<TAB>memory_gb<TAB>status<TAB>description."""
    return f"commit\t{metric}\tmemory_gb\tstatus\tdescription"


# A run with a shortened budget (AUTORESEARCH_TIME_BUDGET) is labelled at the start of its row's description, e.g.
# "[budget 10s] baseline", so that it never passes for a full run. Only the harness writes it (see smoke_label).
SMOKE_LABEL = re.compile(r"^\[budget [^\]]*\]\s*")


def smoke_label(budget):
    """The label of a smoke row: "[budget 10s] " for budget 10."""
    return f"[budget {budget:g}s] "


# A row of a tag with a compute-matched budget (--budget-like, harness.run.matched) says so first, e.g.
# "[like h100 300s: 1799s] baseline": its number is this device's at an H100's compute, not a plain 300 s run.
LIKE_LABEL = re.compile(r"^\[like [^\]]*\]\s*")


def like_label(event):
    """The label of a row of an experiment event with budget_like: "[like h100 300s: 1799s] "; "" without."""
    like = event.get("budget_like")
    return f"[like {like['name']} {like['base_s']:g}s: {event['budget_s']:g}s] " if like else ""


# A row measured on the tag's k-th hardware (k >= 2: `--new-hardware`, harness.run.hardware) is labelled after any smoke
# label, e.g. "[hw2] baseline on new hardware": its number is not comparable with the rows before its epoch.
HW_LABEL = re.compile(r"^(?:\[(?:budget|like) [^\]]*\]\s*)?\[hw(\d+)\]\s*")
LABELS = re.compile(r"^(?:\[(?:budget [^\]]*|like [^\]]*|hw\d+)\]\s*)+")    # every label the harness writes


def hw_label(epoch):
    """The label of a row of hardware epoch `epoch`: "" for the first, "[hw2] " for the second, ..."""
    return f"[hw{epoch}] " if (epoch or 1) > 1 else ""


def epoch_of_row(description):
    """The hardware epoch a results.tsv row's description says (its HW_LABEL), 1 without one."""
    found = HW_LABEL.match(description)
    return int(found.group(1)) if found else 1


def results_row(event):
    """karpathy's 5 columns from an "experiment" event: 7-char commit, metric (6 decimals), memory_gb
    (1 decimal), status, description (with smoke_label first for an event with smoke=True, else like_label, then
    hw_label of its hardware_epoch)."""
    label = smoke_label(event["budget_s"]) if event.get("smoke") else like_label(event)
    label += hw_label(event.get("hardware_epoch"))
    return (f"{event['commit']}\t{event['metric']:.6f}\t{event['memory_gb']:.1f}\t{event['status']}\t"
            f"{label}{event['description']}")


def has_metric(event):
    """Whether an "experiment" event's metric is a measurement: not a crash's, not a run cancelled early (both
    record karpathy's 0.0 placeholder)."""
    return event["status"] != "crash" and not event.get("cancelled")


def note_text(event, metric):
    """The git note of an experiment's commit, from its "experiment" event: what `git log` shows under the idea."""
    value = f"{metric} {event['metric']:.6f}" if has_metric(event) else "no metric"
    base = event.get("base_metric")
    delta = (f" ({event['metric'] - base:+.6f} vs its base {event['base'][:7]} at {base:.6f})"
             if base is not None and has_metric(event) and event["n"] > 0 else "")
    fixes = f", {event['fixes']} fix(es)" if event.get("fixes") else ""
    runs = len(event.get("runs") or [0])
    line = (f"autoresearch {event['tag']} #{event['n']}: {event['status']}, {value}{delta}; {runs} "
            f"run{'s' if runs > 1 else ''}{fixes}; "
            f"memory {event['memory_gb']:.1f} GB; {event['wall_seconds']:.0f} s")
    line = line if event["status"] == "keep" else f"{line}\n{event['description']}"
    return f"{line}\nmlflow run {event['mlflow_run']}" if event.get("mlflow_run") else line


def check_size(path, expected):
    """events.jsonl must still hold at least the `expected` bytes this invocation wrote (None: nothing yet): a ledger
    deleted or cut while the loop runs would be recreated with only the later events. Raises Stop with the way out."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = None
    if expected is not None and (size is None or size < expected):
        found = "is gone" if size is None else f"was cut to {size} bytes"
        raise Stop(f"{path} {found} while the loop ran ({expected} bytes were written): nothing more is written to "
                   f"it. Put it back (from a backup), then rerun the same command; results.tsv "
                   f"and the branch are unchanged")


def log_event(path, tag, event, **fields):
    """Append one JSON line {ts, event, tag, **fields} to events.jsonl at path, fsynced, secrets redacted.
    Returns the record (unredacted dict). ValueError if event is not a harness.schema name."""
    record, line = event_record(tag, event, **fields)
    files.append_line(path, line[:-1])
    return record


def event_record(tag, event, **fields):
    """(the record {ts, event, tag, **fields}: an unredacted dict, its line of events.jsonl: str, secrets redacted,
    with its newline). ValueError if event is not a harness.schema name."""
    record = {"ts": datetime.datetime.now(datetime.timezone.utc).isoformat(), "event": schema.check(event), "tag": tag,
              **fields}
    return record, event_line(record) + "\n"


def event_line(record):
    """The line of events.jsonl that log_event writes for record (without its newline)."""
    return json.dumps(redact_all(record))


def repair_last_line(path, complete):
    """Deal with a last line that has no final newline (a kill or power loss during an append). If complete(line)
    says it is whole (say, a row an editor saved without a newline) it gets its newline; otherwise it is a torn
    fragment and is cut off, so the next append does not continue it: a results.tsv row is re-derived from its
    event (opening.restore_outputs) and a cut event was never complete. complete gets the line's bytes (a cut can
    split a UTF-8 character). Returns the fragment cut off ("" if none), for the caller to log, so nothing is lost
    without a trace."""
    path = Path(path)
    data = path.read_bytes() if path.is_file() else b""
    if not data or data.endswith(b"\n"):
        return ""
    cut = data.rfind(b"\n") + 1
    if complete(data[cut:]):
        files.append_line(path, "")
        return ""
    with files.open_record(path, "r+b") as f:
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    return data[cut:].decode("utf-8", errors="replace")


def repair_results(path, all_events):
    """repair_last_line for a results file: a last line is whole when it is valid UTF-8, a 5-cell row, and not a
    strict prefix of a row that an "experiment" event produced (which is what an append cut by a kill looks like)."""
    made = [row.encode() for row in (row_of(e) for e in schema.of(all_events, Event.EXPERIMENT)) if row]

    def complete(data):
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return is_row(line) and not any(row != data and row.startswith(data) for row in made)
    return repair_last_line(path, complete)


def is_row(line):
    """A whole results.tsv row: 5 tab-separated cells, a number (or the header's metric name) in the second."""
    cells = line.split("\t")
    if len(cells) != 5:
        return False
    try:
        float(cells[1])
    except ValueError:
        return cells[0] == "commit"
    return True


def is_event(data):
    """A whole events.jsonl line (bytes): one JSON object."""
    try:
        return isinstance(json.loads(data.decode("utf-8")), dict)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False


def ensure_results_header(path, metric):
    """Write karpathy's header to a missing or empty results.tsv; ValueError if an existing header differs."""
    header = results_header(metric)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if not text.strip():
        files.append_line(path, header)
        return
    if text.splitlines()[0] != header:
        raise ValueError(f"{path} starts with {text.splitlines()[0]!r}, not {header!r}: it belongs to another "
                         "metric; move it away or use the right --target")


def row_of(event):
    """results_row(event), or None for an event too malformed to have produced a row (fields missing or wrong)."""
    try:
        return results_row(event)
    except (KeyError, TypeError, ValueError):
        return None


def read_rows(path):
    """The row lines of a results file (header, blank and malformed lines left out); [] if there is none. Bytes that
    are not UTF-8 are replaced, so a damaged line is just a line that matches nothing."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[1:] if path.is_file() else []
    return [line for line in lines if is_row(line)]


def rows_by_tag(results_path, all_events):
    """results.tsv's rows grouped by the tag whose "experiment" event wrote them: ({tag: [row text]}, [rows no event
    accounts for]), each in file order. Rows are appended right after their events and only ever removed (moved to
    another tag's file), so the rows are an ordered subsequence of the events: matched from the end, each row takes
    the latest event before the one its successor took that produces exactly its text. Tags started from one commit
    share the baseline row's text; the order tells them apart."""
    events = [(row_of(e), str(e.get("tag"))) for e in schema.of(all_events, Event.EXPERIMENT)]
    lines = read_rows(results_path)
    tags, j = [None] * len(lines), len(events)
    for i in reversed(range(len(lines))):
        k = next((k for k in range(j - 1, -1, -1) if events[k][0] == lines[i]), None)
        if k is not None:
            tags[i], j = events[k][1], k
    by_tag = {}
    for line, tag in zip(lines, tags):
        if tag is not None:
            by_tag.setdefault(tag, []).append(line)
    return by_tag, [line for line, tag in zip(lines, tags) if tag is None]


def archive_path(results_path, tag):
    """Where a tag's rows go while another tag runs: results.<tag>.tsv beside results.tsv."""
    return results_path.with_name(f"results.{tag}.tsv")


def keep_one_tag(results_path, all_events, tag, metric):
    """karpathy's contract: results.tsv holds one run. Move the rows of every other tag to archive_path, and bring
    back `tag`'s own rows if an earlier switch moved them there; results.tsv then holds the header and `tag`'s rows.
    Idempotent, so a kill at any point is finished by the next start: a row already in its archive is not appended
    again, a line cut mid-append is repaired first, results.tsv is replaced atomically (after the archives are on
    disk) and an archive is removed only once all its rows are back in results.tsv. Returns {path: rows moved}.
    Rows no event accounts for must have been refused before (rows_by_tag)."""
    by_tag, _ = rows_by_tag(results_path, all_events)
    mine = by_tag.get(tag, [])
    own = archive_path(results_path, tag)
    back = [row for row in rows_by_tag(own, all_events)[0].get(tag, []) if row not in mine]   # rows its events made
    moved = {}
    for other, rows in by_tag.items():
        if other == tag:
            continue
        path = archive_path(results_path, other)
        repair_results(path, all_events)
        present = set(read_rows(path))
        if not present and not (path.is_file() and path.read_text(encoding="utf-8", errors="replace").strip()):
            files.append_line(path, results_header(metric))
        for row in rows:
            if row not in present:
                files.append_line(path, row)
        moved[path] = len(rows)
    if back:
        moved[results_path] = len(back)
    if moved:
        staged = results_path.with_name(results_path.name + ".new")
        with files.open_record(staged, "w") as f:
            f.write("".join(line + "\n" for line in [results_header(metric), *back, *mine]))
            f.flush()
            os.fsync(f.fileno())
        os.replace(staged, results_path)
    if own.is_file() and set(read_rows(own)) <= set(read_rows(results_path)):
        own.unlink()        # every row it held is in results.tsv again
    return moved


# ---------------------------------------------------------------------------
# Reading (tolerant: the agent may be appending while we read)
# ---------------------------------------------------------------------------


def read_events(path):
    """Every event of an events.jsonl as a dict, in order; [] when the file does not exist. A line that is not a
    JSON object (one cut by a kill mid-write) is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def experiment_events(events, tag=None):
    """The "experiment" events (one per finished experiment), optionally only those of one tag."""
    return schema.of(events, Event.EXPERIMENT, tag=tag)


@dataclasses.dataclass
class Row:
    commit: str
    metric: float       # as written: 0.000000 on a crash, so tell crashes apart by status, never by value
    memory_gb: float
    status: str         # keep | discard | crash
    description: str


@dataclasses.dataclass
class Results:
    path: Path
    metric_name: str    # the header's second column, e.g. "val_bpb" or "pass@1"
    rows: list          # list[Row] in file order; rows[0] is the baseline
    skipped: list       # raw lines left out as malformed, e.g. a partial last line still being written


def load_results(path):
    """Read a results.tsv. Columns are found by header name, so extra columns anywhere are ignored.

    Blank and malformed lines (too few fields, unknown status, unparseable metric) are skipped and listed in
    Results.skipped. Raises FileNotFoundError when the file is missing and ValueError when the first line is
    not a results.tsv header (both messages name the fix).
    """
    path = Path(path)
    if not path.is_file():
        example = Path(__file__).resolve().parents[1] / "results.tsv.example"
        raise FileNotFoundError(f"{path.absolute()}: no such results file. agent.py writes results.tsv in the directory "
                                "of the target it ran on (uv run agent.py --tag <tag>): run report.py there or pass "
                                f"that file's path; {example} is an example")
    # split on "\n" only: splitlines() would also break a row at characters like U+2028 inside a description
    text = path.read_text(encoding="utf-8-sig", errors="replace")
    lines = [line.rstrip("\r") for line in text.split("\n")] if text else []
    header = lines[0].split("\t") if lines else []
    if len(header) < 2 or header[0] != "commit" or "status" not in header:
        got = repr(lines[0][:80]) if lines else "an empty file"
        raise ValueError(f"{path}: expected a results.tsv header '{HEADER_HINT}', got {got}. "
                         f"Pass the results.tsv the agent wrote in the target folder")
    col = {name: i for i, name in enumerate(header)}
    rows, skipped = [], []
    for line in lines[1:]:
        if not line.strip():
            continue
        row = _parse_row(line.split("\t"), col)
        if row is None:
            skipped.append(line)
        else:
            rows.append(row)
    return Results(path=path, metric_name=header[1], rows=rows, skipped=skipped)


def _parse_row(fields, col):
    """One Row, or None when the line is malformed (a line cut short while being written ends up here)."""
    def field(name, default=""):
        i = col.get(name)
        return fields[i].strip() if i is not None and i < len(fields) else default
    status = field("status")
    if status not in STATUSES:
        return None
    try:
        metric = float(fields[1])
        memory_gb = float(field("memory_gb", "0") or 0)
    except ValueError:
        return None
    return Row(commit=fields[0].strip(), metric=metric, memory_gb=memory_gb, status=status,
               description=field("description"))


def select_tag(rows, events, tag):
    """The rows of run `tag`, matched to its experiment events by commit.

    Matching walks both lists backwards and only moves back in the file, so when two runs started from the
    same commit (same baseline commit), each run's baseline pairs with the row written just before its own
    experiments. Raises ValueError listing the tags present when `tag` has no experiment event.
    """
    wanted = experiment_events(events, tag)
    if not wanted:
        tags = sorted({str(e.get("tag")) for e in experiment_events(events)})
        raise ValueError(f"no experiment events for tag {tag!r}; tags in the events file: {', '.join(tags) or 'none'}")
    picked, i = [], len(rows) - 1
    for event in reversed(wanted):
        j = i
        while j >= 0 and rows[j].commit != event.get("commit"):
            j -= 1
        if j >= 0:
            picked.append(rows[j])
            i = j - 1
    return picked[::-1]

def is_baseline(e):
    """Whether an "experiment" event measured a baseline: experiment 0, or a re-baseline on new hardware
    (`--new-hardware`: the best's train.py re-run --baseline-runs times, `rebaseline` in its event)."""
    return e.get("n") == 0 or bool(e.get("rebaseline"))


def baseline_of(history):
    """The baseline the tag's verdicts use now: the latest is_baseline event of `history` (a tag's experiment events,
    in order), None before there is one. Its runs' sd is the noise floor, its wall time the allowance's overhead, its
    curves the early-cancel reference, its mean report.py's baseline; a tag's rule settings stay its first's."""
    return next((e for e in reversed(history) if is_baseline(e)), None)


def since_baseline(history):
    """The experiments after the current baseline (baseline_of): those measured on the same hardware epoch."""
    base = baseline_of(history)
    return history[history.index(base) + 1:] if base is not None else []


def hardware_events(all_events, tag):
    """The tag's "hardware" events (harness.run.hardware fingerprints), in order; the last one is the current epoch."""
    return schema.of(all_events, Event.HARDWARE, tag=tag)


def run_key(e):
    """What pairs a "run" event with its "run_end": experiment, fix number, run index."""
    return e.get("n"), e.get("fix", e.get("attempt")), e.get("run", 0)   # "attempt": events before "fix"
