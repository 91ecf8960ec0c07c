"""
HARNESS: opening a tag. open_session checks the target, the repository and the ledger (each refusal is a function
of harness.tag.checks), then creates autoresearch/<tag> or resumes it, as a short sequence of named steps: the
position from the events, the branch, the harness's own worktree and frozen copy, the sandbox and its view, the
hardware fingerprint, the outputs a kill left unwritten, the runs each commit measured. Returns the Session
(harness.tag.session) the steps of an experiment work on.
"""

import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path


from harness import console, files, gitops, ledger, schema
from harness.judge import curves, verdict
from harness.record import dashboard, tracking
from harness.run import flash, hardware, matched, processes, sandbox, view
from harness.run.pool import THREADS
from harness.run.runner import interpreter
from harness.tag import checks
from harness.errors import SetupError
from harness.judge.holdout import pinned_env
from harness.propose.providers import Spend
from harness.propose.search import STUDY_DB
from harness.tag.tagview import latest_profile, tag_state
from harness.run.target import (FROZEN, check_target, effective_budget, own_budget, read_frozen_constants,
                             run_prepare)
from harness.judge.verdict import DEFAULT_CONFIRM, PAIRED_CONFIRM, rule_of
from harness.schema import Event
from harness.tag.session import (RUN_LOG, TRY_LOG, Session, TagConfig, describe, duplicate_of, export_frozen,
                                  file_at_bytes)


DEAD_LOCK_AGE = 1.0    # seconds


def open_session(settings, profile=None, devices=()):
    """Check everything, then create autoresearch/<tag> from HEAD or resume it. Returns (Session, constants).

    The user's checkout stays on its branch; only the target's train.py and frozen files must be committed (their
    uncommitted edits would be silently ignored), any other edit (program.md: steer as you like) is fine. Resume
    rebuilds the best commit and the experiment count from this tag's events, kills a training run left by a killed
    agent, adopts commits a human added on top of the best one when they leave train.py and the frozen files alone,
    and appends a results.tsv row lost to a kill. Raises SetupError with the fix for anything it will not touch."""
    target = Path(settings.target).resolve()
    check_target(target)
    constants = read_frozen_constants(target / "prepare.py")
    all_events = ledger.read_events(target / ledger.EVENTS)   # a line cut mid-write is skipped (cut after the checks)
    state = tag_state(all_events, settings.tag)
    s = new_session(settings, target, constants, state, profile)
    s.devices = list(devices)
    budget_like_side(s)
    mlflow = tracking.sqlite_path(settings.mlflow) if settings.mlflow else None
    checks.regular_records(records(s), [s.tag.home.parent, s.tag.home, s.tag.home / "logs"], [mlflow] if mlflow else [])
    checks.one_target(s)
    checks.numbered(s)
    checks.no_stale_git_locks(s)
    damaged = checks.readable(s)
    checks.one_budget(s, state.profile)
    checks.one_rule(s, state.rule)
    check_checkout(s)
    recover_runs(s, state.stale_runs, all_events)
    record_unreadable(s, damaged, all_events)
    (target / (ledger.RESULTS + ".new")).unlink(missing_ok=True)  # a staged copy left by a kill (keep_one_tag)
    checks.no_stray_rows(s, all_events)
    place_branch(s)
    s.synced = next((e["commit"] for e in reversed(all_events)
                     if e.get("tag") == settings.tag and e.get("event") == Event.SYNCED), None)
    claim_home(s)
    files.route_library_logs(s.tag.home / files.LIBRARY_LOG)     # the stores' libraries: never on the terminal
    frozen_side(s, all_events, constants)
    hardware_side(s, all_events)
    restore_outputs(s, all_events)
    measured_runs(s, all_events)
    s.tracking = tracking.start(s)
    return s, constants


def records(s):
    """Every file the loop writes its records into: results.tsv (and its staged copy, other tags' archives),
    events.jsonl, run.log, the dashboard, the study, the libraries' log."""
    target = s.tag.target
    return [target / name for name in (ledger.RESULTS, ledger.RESULTS + ".new", ledger.EVENTS, RUN_LOG,
                                       dashboard.PAGE)] + sorted(target.glob("results.*.tsv")) + \
        [s.tag.home / STUDY_DB, s.tag.home / files.LIBRARY_LOG]


def new_session(settings, target, constants, state, profile=None):
    """The Session of tag settings.tag in the repository holding target, its position from its TagState; profile:
    the prepared one (`prepare.py --check`), whose own budget the target may declare (target.own_budget)."""
    own = own_budget(constants, profile)
    budget = effective_budget(own)
    repo = gitops.open_repo(target)
    history = state.history
    root = Path(repo.working_tree_dir).resolve()
    config = TagConfig(target=target, home=gitops.harness_dir(repo, settings.tag), branch=f"autoresearch/{settings.tag}",
                       target_rel="" if target == root else gitops.repo_rel(repo, target),
                       train_rel=gitops.repo_rel(repo, target / "train.py"),
                       frozen_rels=tuple(gitops.repo_rel(repo, target / f) for f in FROZEN),
                       metric=constants["METRIC_NAME"], goal=constants["METRIC_GOAL"], budget=budget,
                       smoke=budget != own,
                       timeout=settings.timeout or (ledger.baseline_of(history) or {}).get("timeout_s"),
                       profile=profile, sd_floor_declared=constants.get("METRIC_SD_FLOOR"),
                       speed_probe=constants.get("SPEED_PROBE") is True,
                       seed_base=history[0].get("seed_base") if history else secrets.randbelow(2**31))
    return Session(settings=settings, tag=config, repo=repo, best_commit="", history=history,
                   rule=rule_of(constants["METRIC_GOAL"], baseline=ledger.baseline_of(history),
                                runs=settings.baseline_runs, **tag_rule(settings, state)),
                   spend=Spend(state.input_tokens, state.output_tokens, state.cost_usd))


def budget_like_side(s):
    """--budget-like: the tag's budget is the profile's on the reference GPU in this device's seconds
    (harness.run.matched), said at start; a resume with the same reference keeps the seconds the tag recorded (a
    measured speed varies). Refused (exit 2, nothing changed) with AUTORESEARCH_TIME_BUDGET, on Ray, or where this
    device's speed cannot be told."""
    like = s.settings.budget_like
    if like is None:
        return
    if s.tag.smoke:
        raise SetupError("--budget-like scales the profile's budget; AUTORESEARCH_TIME_BUDGET sets another one: "
                         "unset one of them")
    recorded = next((e for e in s.history if (e.get("budget_like") or {}).get("name") == like), None)
    if recorded is not None:
        seconds, words = recorded["budget_s"], f"{s.tag.budget:g} s on {matched.article(matched.REFERENCES[like])}" \
            f" = {recorded['budget_s']:,.0f} s here (recorded by tag {s.settings.tag})"
    else:
        remote = any(d.remote is not None for d in s.devices)
        fields = hardware.measure(s.devices, remote)
        device = s.devices[0] if s.devices else None
        env = {**os.environ, **(device.env if device else {}),
               "OMP_NUM_THREADS": str(device.threads if device else THREADS)}
        try:
            seconds, words = matched.scaled(s.tag.budget, like, fields,
                                            lambda: matched.measure(fields["device"], interpreter(), env))
        except matched.Unmeasurable as e:
            raise SetupError(f"--budget-like {like}: {e}. Leave --budget-like out for the profile's own budget") \
                from None
    s.tag = dataclasses.replace(s.tag, budget=float(seconds), budget_like={"name": like, "base_s": s.tag.budget})
    console.say(f"budget: {words}")


def tag_rule(settings, state):
    """rule_of's settings of the verdict rule (confirm, margin, verdict and the rule's own): the tag's, once its
    baseline is recorded (one rule per tag, like the budget: checks.one_rule refuses other explicit flags), else this
    invocation's flags or the defaults: verdict.DEFAULT (the margin rule when --margin is given)."""
    if state.rule is not None:
        return verdict.settings_of(state.rule)
    name = settings.verdict or ("margin" if settings.margin is not None else verdict.DEFAULT)
    rule = verdict.RULES[name]
    confirm = settings.confirm if settings.confirm is not None else PAIRED_CONFIRM if rule.pairs_seeds else \
        DEFAULT_CONFIRM
    return dict(confirm=confirm, margin=settings.margin, verdict=name) | {
        key: getattr(settings, key, None) for key in rule.own_flags if getattr(settings, key, None) is not None}


def measured_runs(s, all_events):
    """s.cache.measured from the tag's "run_end" events: each run's metric and probe by commit and seed (a resumed
    paired tag pairs with the best's runs measured before); s.cache.curves: the curves kept beside their logs."""
    for e in all_events:
        if e.get("tag") == s.settings.tag and e.get("event") == Event.RUN_END and e.get("metric") is not None:
            if e.get("seed") is not None:
                s.cache.measured.setdefault(e["commit"], {})[e["seed"]] = (e["metric"], e.get("probe_s"))
            if e.get("log") and (curve := curves.load(e["log"])) is not None:
                s.cache.curves.setdefault(e["commit"], {})[e.get("seed", e["log"])] = curve


def recover_runs(s, stale_runs, all_events):
    """What a killed agent left: its training runs (killed now), a lock on a ref it writes that is still there
    DEAD_LOCK_AGE seconds after it was made (removed: a live git holds one for milliseconds, and no other agent.py
    runs here while we hold the repo lock), and a line cut mid-write at the end of events.jsonl or results.tsv (cut
    off, its text kept as an event). Runs after the refusals that need no repair, so that a refused start changes
    nothing."""
    for stale in stale_runs:
        processes.kill_stale_run(stale["pgid"], stale.get("cwd") or s.tag.target)
    for lock in checks.git_locks(s)[0]:   # git holds a ref lock for the milliseconds of one update
        try:
            time.sleep(max(0.0, DEAD_LOCK_AGE - (time.time() - lock.stat().st_mtime)))
            lock.unlink()
            console.say(f"removed {lock}: a git lock left by a git command of a killed agent.py")
        except FileNotFoundError:         # its writer was alive and done
            pass
    torn = [("events.jsonl", ledger.repair_last_line(s.tag.target / ledger.EVENTS, ledger.is_event)),
            ("results.tsv", ledger.repair_results(s.tag.target / ledger.RESULTS, all_events))]
    for name, fragment in torn:
        if fragment:   # cut off so that it is not kept as a line of its own; its text stays on record here
            s.log(Event.TORN_LINE, file=name, fragment=fragment)
            console.say(f"{name}: removed a line cut mid-write ({fragment[:60]!r}); it is kept in {ledger.EVENTS}")


def record_unreadable(s, damaged, all_events):
    """The discards and crashes whose objects git cannot read (checks.readable: {n: what git said}): named on the
    terminal at each start, recorded once as an "unreadable" event; their rows stay, and new ideas are no longer
    compared with them."""
    known = {e.get("n") for e in schema.of(all_events, Event.UNREADABLE, tag=s.settings.tag)}
    for e in s.history:
        if e["n"] in damaged:
            console.say(f"warning: experiment #{e['n']} ({e['commit']}) is unreadable: git cannot read its commit or "
                        f"its train.py ({damaged[e['n']]}); its row stays, and new ideas are not compared with it. "
                        "`git fsck` names the damaged objects")
            if e["n"] not in known:
                s.log(Event.UNREADABLE, n=e["n"], commit=e["commit"], reason=damaged[e["n"]])


def check_checkout(s):
    """Your checkout: the frozen files committed, the branch not checked out; for the loop an uncommitted train.py
    that would be ignored is refused; for `try`, a baseline first, once, of the committed train.py."""
    changed = gitops.changed_files(s.repo)
    checks.committed_frozen(s, changed)
    checks.branch_not_checked_out(s)
    here = (s.tag.target / "train.py").read_bytes()
    best = s.best_event["full_commit"] if s.best_event else (s.tag.branch if s.tag.branch in s.repo.heads else "HEAD")
    best_bytes = file_at_bytes(s, best)
    measured = here == best_bytes or s.settings.command != "loop" or s.tag.train_rel not in changed or duplicate_of(
        s, here.decode("utf-8", "replace")) is not None
    checks.train_edit_not_ignored(s, changed, here, best_bytes, measured)
    checks.try_baseline_state(s, here, best, best_bytes, describe)


def place_branch(s):
    """Create the branch from HEAD, or find the best commit of a resumed one (moving the branch to it when a kill
    came between a keep's event and its move; adopting commits a human added on top)."""
    checks.branch_exists_for_history(s)
    rule = s.rule.recorded()
    if s.tag.branch not in s.repo.heads:
        s.repo.create_head(s.tag.branch, s.repo.head.commit)
        s.best_commit = s.repo.head.commit.hexsha
        s.start = dict(new_branch=True, best=s.best_commit, profile=s.tag.profile, **rule)
        return
    # before the baseline is measured, whatever the branch holds is the baseline
    s.best_commit = s.best_event["full_commit"] if s.best_event else s.repo.heads[s.tag.branch].commit.hexsha
    tip = s.repo.heads[s.tag.branch].commit.hexsha
    if tip != s.best_commit and s.repo.is_ancestor(tip, s.best_commit):
        gitops.advance_branch(s.repo, s.tag.branch, s.best_commit, tip)   # a kill between a keep's event and its move
        s.log(Event.ADVANCED, n=s.next_n - 1, tip=tip, best=s.best_commit)
    elif tip != s.best_commit:
        adopt_human_commits(s, tip)
    s.start = dict(new_branch=False, best=s.best_commit, experiments=len(s.history), profile=s.tag.profile, **rule)


def claim_home(s):
    """The tag's harness dir: yours alone (as root the sandbox's uid is root's outside, so what a run writes in runs/
    and leaves in an artifact is root's; no other user of the machine may reach it), owned by this target, and no
    run dir left by a killed agent (we hold the lock and killed its run)."""
    owner = s.tag.home / "target"
    owner.parent.mkdir(parents=True, exist_ok=True)
    s.tag.home.chmod(0o700)
    owner.write_text(s.tag.target_rel)
    shutil.rmtree(s.tag.home / "runs", ignore_errors=True)


def frozen_side(s, all_events, constants):
    """A pristine copy of the target, the sandbox, the frozen inputs' digest."""
    base = next((e["base"] for e in all_events if e.get("tag") == s.settings.tag
                 and e.get("event") == Event.FROZEN_INPUTS and e.get("base")), s.best_commit)
    s.tag = dataclasses.replace(s.tag, frozen_base=base)
    export_frozen(s)
    setup_sandbox(s)
    checks.one_sandbox_rule(s)
    if "METRIC_TOLERANCE" in constants:
        evaluation = frozen_inputs(s, all_events, float(constants["METRIC_TOLERANCE"]))
        evaluation["artifact"] = constants.get("ARTIFACT_NAME", "artifact")   # where train.py saves its model
        s.tag = dataclasses.replace(s.tag, evaluation=evaluation)
    if s.sandbox is not None:
        check_view(s)


def hardware_side(s, all_events):
    """The comparability fingerprint (harness.run.hardware) of this invocation's runs: recorded as the tag's epoch 1
    when it starts (or first resumes, for a tag from before fingerprints), else compared with the tag's latest. A
    difference is refused (checks.same_hardware) unless --new-hardware, which opens the next epoch: its baseline is
    measured before any candidate (Session.baseline_due). Before any experiment a difference just replaces the
    fingerprint. The event is logged with this invocation's first one (a refused `try` logs nothing); `try --sync`
    measures nothing."""
    a = s.settings
    if a.command == "try" and a.sync:
        return
    remote = any(d.remote is not None for d in s.devices)     # runs on other machines (Ray, another backend)
    s.hardware = hardware.measure(s.devices, remote, (s.tag.evaluation or {}).get("digest"))
    recorded = ledger.hardware_events(all_events, a.tag)
    last = recorded[-1] if recorded else None
    s.hardware["attention"] = attention_side(s, last)
    s.hardware_epoch = last.get("epoch", 1) if last else 1
    changed = hardware.differences(last, s.hardware) if last else []
    if changed and s.history:
        checks.same_hardware(s, last, changed)          # refused unless --new-hardware
        s.hardware_epoch += 1
        console.say(f"--new-hardware: tag {a.tag!r} continues on {hardware.words(s.hardware)} as hardware epoch "
                    f"{s.hardware_epoch} ({'; '.join(changed)}): a new baseline is measured first, and its rows "
                    f"are marked {ledger.hw_label(s.hardware_epoch).strip()}")
    elif a.new_hardware and last is not None:
        console.say(f"--new-hardware: this machine matches the fingerprint of tag {a.tag} (hardware epoch "
                    f"{s.hardware_epoch}: {hardware.words(s.hardware)}); nothing to re-measure for it")
    if last is None or changed or (s.hardware["attention"] and "attention" not in last):   # or the first pin
        s.deferred.append((Event.HARDWARE, dict(epoch=s.hardware_epoch, digest=hardware.digest_of(s.hardware),
                                            **s.hardware)))
    checks.try_baseline_due(s, describe)


def attention_side(s, last):
    """The attention kernel of this invocation's runs (harness.run.flash), for a target on CUDA that wants one: the
    commit the tag recorded (last: its latest fingerprint), or, for a new tag or --new-hardware, the latest of the
    kernel's version; fetched here, outside the sandbox, and checked where a run would load it. SDPA, said once, where
    it cannot be had; kept SDPA on a resume of a tag that recorded SDPA. None where the target wants no kernel."""
    train = s.tag.target / s.tag.train_rel
    if not flash.wanted(train.read_text(errors="replace") if train.exists() else "", s.hardware["device"]):
        return None
    pinned = None if last is None or s.settings.new_hardware else last.get("attention")
    if pinned == flash.SDPA:
        return pinned
    gpu = sandbox.run_gpu(s.devices[0].env if s.devices else {})

    def run(argv, env, folder):
        if s.sandbox is None:
            return flash.plain_run(argv, env, folder)
        run_dir = s.tag.home / "runs" / "kernel-check"
        run_dir.mkdir(parents=True, exist_ok=True)
        s.sandbox.kernels = [folder]
        try:
            return subprocess.run(s.sandbox.train(argv, run_dir, gpu), capture_output=True, text=True, timeout=300,
                                  stdin=subprocess.DEVNULL, cwd=run_dir, env={**os.environ, **s.sandbox.env, **env})
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
    attention, folder, line = flash.ready(pinned, run)
    if s.sandbox is not None:
        s.sandbox.kernels = [folder] if folder else []
    console.say(line or f"attention: Flash Attention 3, {attention} (pinned for tag {s.settings.tag}; in the cache, "
                        "shown read-only to each run)")
    return attention


def restore_outputs(s, all_events):
    """The outputs ignored by git, results.tsv with its header and this tag's rows only (karpathy's contract, which
    his analysis notebook assumes: earlier tags move to their own file), and a row or note lost to a kill between
    the "experiment" event and them."""
    target, tag = s.tag.target, s.settings.tag
    gitops.ensure_ignored(s.repo, [target / name for name in (ledger.RESULTS, ledger.EVENTS, RUN_LOG, TRY_LOG,
                                                               dashboard.PAGE)])
    try:
        ledger.ensure_results_header(target / ledger.RESULTS, s.tag.metric)
    except ValueError as e:
        raise SetupError(str(e)) from None
    for path, n in ledger.keep_one_tag(target / ledger.RESULTS, all_events, tag, s.tag.metric).items():
        if path.name == ledger.RESULTS:
            s.log(Event.UNARCHIVED, file=ledger.archive_path(path, tag).name, rows=n)
            console.say(f"{ledger.RESULTS}: brought back {n} row(s) of tag {tag} from its own file")
            continue
        gitops.ensure_ignored(s.repo, [path])
        s.log(Event.ARCHIVED, file=path.name, rows=n)
        console.say(f"{ledger.RESULTS}: moved {n} row(s) of another tag to {path.name} (report.py reads it)")
    rows, wanted = ledger.read_rows(target / ledger.RESULTS), [ledger.results_row(e) for e in s.history]
    if len(rows) < len(wanted) and rows == wanted[:len(rows)]:   # lost to a kill, or results.tsv moved aside
        for event, row in zip(s.history[len(rows):], wanted[len(rows):]):
            files.append_line(target / ledger.RESULTS, row)
            s.log(Event.ROW_RESTORED, n=event["n"])
    if s.history and s.history[-1].get("full_commit"):      # a kill between the event and its note (no-op if there)
        gitops.add_note(s.repo, s.history[-1]["full_commit"], ledger.note_text(s.history[-1], s.tag.metric))


def adopt_human_commits(s, tip):
    """The branch tip is not the best commit: commits a human added on top of it (steering: program.md, notes) are
    adopted, and the tip becomes the base of the next candidates, if they leave train.py and the frozen files as
    measured. Anything else is refused with the way out."""
    checks.human_commits_leave_measured_files(s, tip)
    s.log(Event.ADOPTED, previous_best=s.best_commit, tip=tip)
    s.best_commit = tip


def setup_sandbox(s):
    """--sandbox auto|bwrap|off: run train.py and the evaluator in bubblewrap, each seeing only its view (sandbox's
    docstring; what the target declares comes from frozen_inputs), the repository hidden even should a declared path
    contain it; or say once which protections are missing. --sandbox bwrap refuses to start without all of them."""
    reason = sandbox.probe() if s.settings.sandbox != "off" else "--sandbox off"
    lacking = sandbox.missing() if reason is None else []
    checks.sandbox_complete(s.settings, reason, lacking)
    if reason is None:
        def inputs():
            return (s.tag.evaluation or {}).get("inputs")
        s.sandbox = sandbox.Tagged(inputs, [Path(s.repo.working_tree_dir), gitops.git_dir(s.repo)])
        console.say("sandbox: bubblewrap (an allow-list view: the system, the environment, the declared data and the "
                    "run dir; root confined; no network)"
                    + (f"; missing here: {'; '.join(lacking)}" if lacking else ""))
        return
    console.say(f"sandbox: off ({reason}); missing protections: " + "; ".join(sandbox.PROTECTIONS)
                + ". Still on: hermetic run dirs, separate evaluation, the check of refs, results and your checkout "
                "after each run.")


def check_view(s):
    """With the sandbox on: train.py's real view (a run dir where runs get theirs) reads none of the repository, its
    git dir and the evaluator-only files, wherever they lie (under /usr too); the probe runs inside the sandbox.
    A file it can read refuses the start, naming the files and the way out."""
    inputs = (s.tag.evaluation or {}).get("inputs") or {}
    run_dir = s.tag.home / "runs" / "view-check"
    run_dir.mkdir(parents=True, exist_ok=True)
    shown = [*view.environment(), *sandbox.train_reads(inputs), run_dir]
    try:
        found = sandbox.readable_inside(lambda argv: s.sandbox.train(argv, run_dir, ""), [
            Path(s.repo.working_tree_dir), gitops.git_dir(s.repo), *inputs.get("evaluator_only", [])], skip=shown)
    except RuntimeError as e:
        raise SetupError(f"the sandbox's view could not be checked: {e}; try --sandbox off to run without it") from None
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    if found:
        raise SetupError(f"train.py's sandbox could read files it must not (the repository, its git dir or "
                         f"evaluation data), e.g. {', '.join(found[:3])}. Move the repository and the data cache "
                         "(AUTORESEARCH_CACHE) to a folder of their own outside the system's folders (not under "
                         "/usr), then rerun the same command")


def frozen_inputs(s, all_events, tolerance):
    """Run the pristine `prepare.py --frozen-inputs` (with the variables the tag pinned, if it has started); record
    its digest, what each sandboxed process reads and the pinned variables when the tag starts, and refuse to resume
    when the frozen inputs (prepare.py, tokenizer, evaluation data, base model) changed since. Returns the
    evaluation settings."""
    pinned = pinned_env(all_events, s.settings.tag)
    out = run_prepare(s.tag.home / "frozen", "--frozen-inputs", timeout=600, env=pinned)   # SetupError on failure
    try:
        found = json.loads(out.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise SetupError(f"prepare.py --frozen-inputs printed no JSON object: {out[-2000:]!r}") from None
    recorded = schema.of(all_events, Event.FROZEN_INPUTS, tag=s.settings.tag)
    checks.same_frozen_inputs(s, recorded, found, latest_profile(all_events, s.settings.tag))
    env = pinned if recorded else {k: str(v) for k, v in (found.get("env") or {}).items()}
    if not recorded:
        s.log(Event.FROZEN_INPUTS, digest=found["digest"], files=found["files"], evaluator_only=found["evaluator_only"],
              train_reads=found.get("train_reads"), eval_reads=found.get("eval_reads"), env=env, base=s.tag.frozen_base)
    return {"digest": found["digest"], "tolerance": tolerance, "inputs": found, "env": env}
