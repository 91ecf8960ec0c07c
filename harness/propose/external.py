"""
HARNESS: `agent.py try`, one experiment for an external coding agent (Claude Code, Codex) that follows program.md
itself: the train.py in your checkout becomes a candidate with every guarantee of agent.py's loop (the same steps of
harness.record.experiment and the same rule of harness.judge.verdict), then your checkout's train.py is the best
commit's again. --baseline measures the branch start, --fix amends the last crashed candidate, --sync brings the best's
train.py. The verdict block it prints is key: value lines between '---' lines, like train.py's summary.
"""

import statistics
import time

from harness import console, ledger
from harness.propose import outer
from harness.record import baseline, experiment
from harness.judge.curves import Cancel
from harness.errors import SetupError
from harness.propose.edits import EditError, clean_description
from harness.run.runner import Kind
from harness.ledger import has_metric
from harness.tag import session
from harness.tag.session import RUN_LOG, best_source, describe, duplicate_of, file_at_bytes, measured_as
from harness.tag.settings import MAX_FIXES
from harness.judge.verdict import Verdict
from harness.schema import Event


def try_one(s, proposer=None, constants=None):
    """`agent.py try`: the checkout's train.py becomes one experiment with the loop's guarantees and rules (commit on
    top of the best, hermetic sandboxed run with the timeout, separate evaluation, judge, event, row, note, branch),
    then train.py in your checkout is the best commit's again. `--baseline` measures the branch start instead, and
    `--fix` amends the last crashed candidate as the loop's fix step does. Returns the exit code (0: a verdict).
    proposer, constants: unused (agent.COMMANDS' signature; the external agent proposes)."""
    a, train_path = s.settings, s.tag.target / "train.py"
    if a.sync:
        return sync_checkout(s)
    if a.baseline:                      # open_session checked that one is due (none yet, or --new-hardware's)
        t0, spend0, (n, sha) = time.monotonic(), s.spend, baseline.baseline_commit(s)
        session.status(s, n, f"baseline: {a.baseline_runs} run(s)")
        outcomes = [experiment.train(s, n, 0, sha, run=run) for run in range(a.baseline_runs)]
        baseline.record_baseline(s, outcomes, t0, spend0)
        return verdict(s, s.history[-1], None)
    check_based_on_best(s)
    try:
        source = train_path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise SetupError(f"train.py is not UTF-8 text ({e}): save it as UTF-8") from None
    fix_of, fixes, crashed, message = None, 0, None, clean_description(a.message)
    description = message
    if a.fix:                                   # the commit amends the crashed one, as the loop's fix step does
        fix_of, fixes, crashed = fixable(s)
        idea = s.history[fix_of].get("idea") or s.history[fix_of]["description"]
        description, message = experiment.fix_texts(idea, fixes, message)
    elif source == best_source(s):
        raise SetupError(f"train.py is the best commit's ({s.best_commit[:7]}) unchanged: edit it with one idea first")
    if (earlier := measured_as(s, source)) is not None:
        raise SetupError(f"this train.py is the code of experiment {describe(earlier, s.tag.metric)} (comments and "
                         f"spacing aside), already measured: try another idea (`git show {earlier['commit']}:"
                         f"{s.tag.train_rel}` shows it)")
    n, t0 = s.next_n, time.monotonic()
    if not a.fix:                       # the tabu, as the loop's proposals meet it (a fix repeats its idea by design)
        screen(s, n, description, source)
    if crashed and s.repo.commit(crashed).parents[0].hexsha != s.best_commit:
        crashed = None                  # a commit you added on the branch since: the fix goes on top of it instead
    sha = experiment.commit(s, n, source, message, fix=fixes, amend=crashed, fix_of=fix_of)
    outcome = experiment.train(s, n, fixes, sha, base=s.best_commit)
    judged = experiment.judge(s, n, fixes, outcome, s.best_commit, s.best_metric)
    result = experiment.Result(n, outcome, judged, description, time.monotonic() - t0, fixes=fixes,
                               fields=dict(fix_of=fix_of))
    s.recording = n                     # from here an interrupt may leave a result behind (main reads it back)
    event = experiment.record(s, result)
    if judged.status == "keep":
        experiment.keep(s, event)
    synced = write_checkout(s, expected=source)
    return verdict(s, event, result, synced)


def screen(s, n, description, source):
    """The loop's gate for your idea (harness.propose.outer.screen, without the search mechanisms: they review the LLM's
    proposals): SetupError with the same words the LLM would read, unless --force (the override is logged)."""
    try:
        outer.screen(s, n, description, best_source(s), source, by="try", review=False)
    except EditError as e:
        if not s.settings.force:
            raise SetupError(f"refused: {e}. Nothing ran; `--force` runs it anyway") from None
        s.log(Event.FORCED, n=n, reason=str(e))
        console.say(f"--force: running it although {e}")


def check_based_on_best(s):
    """Your train.py must be an edit of the best commit's: when the loop kept something since `try` last wrote your
    checkout, an unedited file just becomes the new best's (nothing runs) and an edited one is refused, since the
    edit would undo the keep. SetupError either way."""
    a, train_path = s.settings, s.tag.target / "train.py"
    based_on = s.synced or s.history[0]["full_commit"]      # what `try` last wrote into your checkout
    if based_on != s.best_commit and file_at_bytes(s, based_on) != file_at_bytes(s, s.best_commit):
        if train_path.read_bytes() == file_at_bytes(s, based_on):   # not edited yet: just bring the best
            write_checkout(s)
            raise SetupError(f"the best commit of tag {a.tag!r} moved to {s.best_commit[:7]} (agent.py's loop kept "
                             f"something) and your train.py was the older best, unedited: it is now the best's. "
                             "Nothing ran; make your edit on it, then run the same command again")
        raise SetupError(f"the best commit of tag {a.tag!r} moved to {s.best_commit[:7]} (agent.py's loop kept "
                         f"something) since train.py in your checkout was last set to the best, so your edit would undo "
                         f"it. Run `uv run agent.py try --tag {a.tag} --sync` (it saves your train.py first and prints "
                         "where), then make your edit again")


def fixable(s):
    """--fix: (n of the idea, number of this fix, sha of the crashed candidate to amend) when the last experiment
    crashed and may get another fix (a timeout or a rejected run is a verdict, not a bug); SetupError otherwise."""
    last = s.history[-1]
    if last["status"] != "crash" or last["n"] == 0:
        raise SetupError("--fix amends a crashed candidate, but the last experiment is "
                         f"{describe(last, s.tag.metric)}; "
                         "run a new idea without --fix")
    if not Kind(last.get("kind", "crash")).fixable:
        raise SetupError(f"experiment {describe(last, s.tag.metric)} ended {last['kind']}: that is its verdict (or the "
                         "cluster's doing), not a bug to fix; run a new idea without --fix")
    fix_of, fixes = last.get("fix_of"), last.get("fixes", 0)
    fix_of = last["n"] if fix_of is None else fix_of
    if fixes >= MAX_FIXES:
        raise SetupError(f"experiment #{fix_of}'s idea crashed after {MAX_FIXES} fixes (the loop's limit too): give "
                         "it up and try another idea")
    return fix_of, fixes + 1, last["full_commit"]


def write_checkout(s, expected=None):
    """Your checkout's train.py becomes the best commit's (its index and HEAD are untouched), and the "synced" event
    records which commit that was, so the next `try` knows what an edit is based on. expected: the text the file must
    still hold (what was measured); when you changed it meanwhile it is left alone, and False is returned."""
    path = s.tag.target / "train.py"
    if expected is not None and path.read_bytes() != expected.encode():
        console.say(f"train.py changed in your checkout while the run trained: left as it is (the best is "
                    f"{s.best_commit[:7]}; `uv run agent.py try --tag {s.settings.tag} --sync` saves yours and writes it)")
        return False
    path.write_bytes(file_at_bytes(s, s.best_commit))
    s.log(Event.SYNCED, commit=s.best_commit)
    s.synced = s.best_commit
    return True


def sync_checkout(s):
    """--sync: save your checkout's train.py (when it is not already some measured commit's) beside the tag's logs,
    then write the best commit's train.py there."""
    current = (s.tag.target / "train.py").read_bytes()
    if duplicate_of(s, current.decode("utf-8", "replace")) is None:
        saved = s.tag.home / "saved" / f"train.py.{time.strftime('%Y%m%d-%H%M%S')}.{time.time_ns() % 10**9:09d}"
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_bytes(current)
        console.say(f"your train.py was saved to {saved}")
    write_checkout(s)
    console.say(f"train.py is now the best commit's ({s.best_commit[:7]}, {s.tag.metric} {s.best_metric:.6f}): edit it")
    return 0


def _delta(event, rule, base):
    """The delta line of a measured experiment: what it was judged against (the best at the same seeds under the
    paired rule, else the best's recorded metric); [] when there was no best before it."""
    if event.get("best_runs") and rule.is_paired:
        return [("delta", f"{event['metric'] - base:+.6f} vs the best at the same seeds ({base:.6f}; recorded "
                          f"{event['base_metric']:.6f})")]
    if event.get("base_metric") is not None:
        return [("delta", f"{event['metric'] - event['base_metric']:+.6f} vs the best before it "
                          f"({event['base_metric']:.6f})")]
    return []


def verdict(s, event, result, synced=True):
    """Print the verdict block of one `try` (key: value lines between '---' and '---', like train.py's summary,
    then the log tail after a crash); result: the experiment.Result (None for the baseline). Returns 0."""
    best, rule = s.best_event, s.rule
    measured = has_metric(event)
    base = statistics.fmean(event["best_runs"]) if event.get("best_runs") else event.get("base_metric")
    near = measured and event["status"] == "discard" and event["n"] > 0 and base is not None and \
        rule.near_miss(event["metric"], base)   # the best at its own seeds, when paired
    lines = [("experiment", event["n"]), ("status", event["status"] + (" (a near-miss: within the margin; worth "
                                                                        "combining with another idea)" if near else "")),
             (s.tag.metric, f"{event['metric']:.6f}" if measured else "- (crash)" if event["status"] == "crash" else
              f"- ({Cancel(**event['cancelled']).words()})")]
    lines += _delta(event, rule, base) if event["n"] > 0 and measured else []
    runs = event.get("runs") or ([event["metric"]] if measured else [])
    if len(runs) > 1 or result is not None and runs:    # the baseline's (result None): its seeds differ
        judged = result.judged if result is not None else Verdict("keep", tuple(runs))
        lines.append(("runs", ", ".join(f"{m:.6f}" for m in runs) + f" ({judged.runs_words(s.tag.metric)})"))
    if event.get("best_runs"):
        lines.append(("best_runs", ", ".join(f"{m:.6f}" for m in event["best_runs"]) + " (the best's at the same "
                      "seeds" + (", re-run now: the machine's speed changed)" if event.get("remeasured") else ")")))
    if rule.is_paired:
        lines.append(("noise", f"sd {rule.sd or 0:.6f} over {rule.noise_runs} baseline runs; false-keep rate "
                               f"{rule.false_keep:g}"))
    else:
        lines.append(("margin", f"{rule.margin:.6f} ({rule.source}): a candidate must beat the best by more"
                                + (f"; noise sd {rule.noise_sd:.6f}" if rule.noise_aware and rule.noise_sd is not None
                                   else "")))
    lines.append(("rule", rule.words(s.tag.metric)))
    if (allowance := experiment.max_wall(s)) is not None and not allowance.comparable:
        lines.append(("wall_time", allowance.words()))
    lines += [("best", f"{best['metric']:.6f} (#{best['n']}, commit {best['commit']})"),
              ("baseline", f"{ledger.baseline_of(s.history)['metric']:.6f}"
                           + (f" (on this hardware, epoch {s.hardware_epoch})" if s.hardware_epoch > 1 else "")),
              ("commit", f"{event['commit']} ({event['description']})"),
              ("branch", f"{s.tag.branch} at {s.best_commit[:7]}"),
              ("train.py", f"your checkout's train.py is the best's ({s.best_commit[:7]}): edit it for the next idea"
                           if synced else "changed by you during the run: left as it is (see above)"),
              ("memory_gb", f"{event['memory_gb']:.1f}"), ("seconds", f"{event['wall_seconds']:.0f}"),
              ("log", str(s.tag.target / RUN_LOG)), ("experiments", f"{len(s.history) - 1} after the baseline")]
    if result is not None:
        lines.append(("reason", result.why or rule.why(result.judged)))
    if event.get("idle"):               # its curve: the schedule or the loss says nothing was learned
        lines.append(("training", event["idle"]))
    if result is not None and (event["status"] == "crash" or not result.kind.measured):   # or not judged
        if result.kind.fixable and event.get("fixes", 0) < MAX_FIXES:
            train = s.tag.train_rel
            lines.append(("to fix", f"`git show {event['commit']}:{train} > {train}`, fix the mistake, "
                          f"then `uv run agent.py try --tag {s.settings.tag} --fix -m \"<what you fixed>\"` (fix "
                          f"{event.get('fixes', 0) + 1} of at most {MAX_FIXES}); or give the idea up"))
    print("---")
    for key, value in lines:
        print(console.shown(f"{key + ':':<13} {value}"))
    print("---")
    tail = result and (result.judged.failed or result.outcome).log_tail
    if event["status"] == "crash" and tail:
        print(console.shown(f"last lines of {RUN_LOG}:\n{tail}"))
    return 0
