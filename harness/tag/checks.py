"""
HARNESS: the refusals of open_session, one named function each, and the warnings of the loop's start. Each refusal
raises SetupError (exit 2, nothing changed) with the way out when the tag, the ledger or your checkout is in a state
agent.py will not touch: it never stashes, resets or deletes your work. Read-only: none of them writes anything.
"""

import re
from pathlib import Path

from harness import files, gitops, ledger
from harness.judge import verdict
from harness.propose.edits import fingerprint
from harness.errors import SetupError
from harness.propose.providers import price_key
from harness.run.target import FROZEN


def one_target(s):
    """One tag, one target: the branch and the harness dir are per repository."""
    owner = s.tag.home / "target"
    if owner.is_file() and owner.read_text() != s.tag.target_rel:
        raise SetupError(f"tag {s.settings.tag!r} belongs to the target {owner.read_text() or '(the repository root)'!r}"
                         " of this repository; pick another --tag for this target")


def regular_records(paths, folders, stores=()):
    """The loop's records (paths) are absent or regular files with one name, its folders absent or folders, and the
    stores a library writes (an MLflow SQLite file, whose other failures are warnings) no link: a link planted at
    any of them would take the writes (files.record_problem)."""
    for path in folders:
        problem = files.folder_problem(path)
        if problem:
            raise SetupError(files.record_refusal(path, problem))
    for path in [*paths, *stores]:
        problem = files.record_problem(path)
        if problem and (path in paths or "link" in problem):
            raise SetupError(files.record_refusal(path, problem))


def numbered(s):
    """The tag's experiments must be numbered 0..N-1 with #0 the baseline (events.jsonl cut or edited would make a
    resume reuse numbers and take another experiment for the baseline)."""
    numbers = [e.get("n") for e in s.history]
    if numbers != list(range(len(numbers))) or s.history and not str(s.history[0].get("description")).startswith(
            "baseline"):                # "baseline", or "baseline (3 runs)"
        shown = ", ".join(map(str, numbers[:12])) + (" ..." if len(numbers) > 12 else "")
        raise SetupError(f"events.jsonl holds experiments of tag {s.settings.tag} numbered {shown}, not 0..N-1 "
                         f"starting with the baseline: it was cut or edited. Put the whole file back (from a "
                         f"backup), or start a new --tag")


def readable(s):
    """Every recorded experiment's commit, the trees down to the target and its train.py and frozen files must still
    be readable from git, each object's content matching its hash (a disk fault or a killed `git gc` can damage
    objects): the resume compares new ideas with them, builds on the best and exports them. A kept one (the best and
    what it was built on, the frozen files they share) stops the start, named; a discarded or crashed one is only
    compared with new ideas: it is left out of the comparisons (s.cache.unreadable) and the start goes on. Fills
    s.cache.blobs and s.cache.prints (the duplicate checks' caches). Returns {n: what git said} of the unreadable ones,
    for the caller to record once the start is accepted."""
    content, unreadable = {}, {}        # content: binsha -> verified bytes (an object shared is read once)

    def check(obj):
        if obj.binsha not in content:
            content[obj.binsha] = gitops.verified(s.repo, obj.binsha)
        return obj
    for e in s.history:
        try:
            commit = check(s.repo.commit(e["full_commit"]))
            for rel in [s.tag.train_rel, *s.tag.frozen_rels]:
                tree = check(commit.tree)
                for part in Path(rel).parts[:-1]:
                    tree = check(tree / part)
                blob = check(tree / Path(rel).name)
                if rel == s.tag.train_rel:
                    s.cache.prints[e["n"]] = fingerprint(content[blob.binsha].decode("utf-8", "replace"))
                    s.cache.blobs[e["n"]] = blob.hexsha
        except (gitops.GitError, ValueError, KeyError, OSError) as err:
            said = " ".join(re.sub(r"b'([^']*)'", r"\1", str(err)).split())[:160]   # GitPython's SHAs as text
        else:
            continue
        # git's reader may be off track after a damaged object: a fresh one, once the exception (and the half-read
        # stream its frames hold) is gone
        s.repo.git.clear_cache()
        if e.get("status") != "keep":
            unreadable[e["n"]] = said
            s.cache.prints.pop(e["n"], None)
            s.cache.blobs.pop(e["n"], None)
            continue
        raise SetupError(f"git cannot read the commit, train.py or a frozen file of experiment #{e['n']} "
                         f"({e['commit']}: {said}) of tag {s.settings.tag!r}: objects in "
                         f"{gitops.git_dir(s.repo)}/objects are missing or damaged. `git fsck` names them; restore "
                         "them from a backup or a clone that has them, or start a new --tag. Nothing was changed: "
                         f"{ledger.RESULTS} and {ledger.EVENTS} are as they were")
    s.cache.unreadable = set(unreadable)
    return unreadable


def profile_words(s, recorded):
    """What a refusal of the budget or of the frozen inputs adds when the data prepared here is another profile's than
    the tag's (recorded: its latest start's, tagview.latest_profile; a fresh machine prepares its device's default),
    "" otherwise: the likely cause and the command that prepares the tag's data (the pretraining target's --profile)."""
    here = s.tag.profile
    if not (recorded and here and recorded != here):
        return ""
    return (f". The tag's data was the {recorded!r} profile's and the data prepared here is the {here!r} profile's: "
            f"prepare the tag's (`uv run prepare.py --profile {recorded} --force`, with --source PATH offline) to "
            "resume it")


def one_budget(s, profile=None):
    """One budget per tag: a smoke run's numbers (AUTORESEARCH_TIME_BUDGET) never compete with full ones. profile:
    the tag's recorded data profile (profile_words)."""
    first = next((e for e in s.history if e.get("budget_s") is not None),
                 {"budget_s": s.tag.budget, "budget_like": s.tag.budget_like})
    started, like = first["budget_s"], (first.get("budget_like") or {}).get("name")
    if started != s.tag.budget or like != (s.tag.budget_like or {}).get("name"):
        how = f"--budget-like {like}" if like else "the same AUTORESEARCH_TIME_BUDGET, no --budget-like"
        raise SetupError(f"tag {s.settings.tag!r} was measured with a {started:g} s budget and this run has "
                         f"{s.tag.budget:g} s: its numbers would not be comparable" + (profile_words(s, profile) or (
                             f". Use the same budget ({how}) to resume it")) + ", or start a new --tag")


def one_rule(s, recorded):
    """One verdict rule per tag (paired or margin, its runs, margin and false-keep rate, fixed when the baseline is
    recorded): a `try` or a resume with other explicit --verdict, --confirm, --margin or --false-keep-rate would
    judge its experiments by another rule than the rest."""
    a = s.settings
    if recorded is None:
        return
    asked = {flag: (getattr(a, key, None), recorded.get(key))
             for key, flag in (verdict.COMMON | verdict.own_flags()).items()}
    other = [f"{flag} {given} (the tag's: {f'none: {s.rule.source}' if mine is None else mine})"
             for flag, (given, mine) in asked.items() if given is not None and given != mine]
    if other:
        raise SetupError(f"tag {a.tag!r} judges every experiment by one rule, fixed when its baseline was recorded: "
                         f"{'; '.join(other)}. Leave these flags out to resume it with its own rule, or start a new "
                         "--tag for another rule")


def no_stray_rows(s, all_events):
    """results.tsv holds agent.py's rows only: rows no event accounts for are never silently started over."""
    _, strays = ledger.rows_by_tag(s.tag.target / ledger.RESULTS, all_events)
    if strays:
        raise SetupError(f"{ledger.RESULTS} holds {len(strays)} row(s) that {ledger.EVENTS} does not account for "
                         f"(the first: {strays[0][:80]!r}): written by hand, by an agent following program.md's manual "
                         f"loop, or by an older agent.py. agent.py will not mix them with its own experiments or start "
                         f"tag {s.settings.tag!r} over them. Move them aside, e.g. `mv {ledger.RESULTS} "
                         "by-hand-results.tsv` (report.py reads that file too), then rerun")


def committed_frozen(s, changed):
    """The target's frozen files must be committed (their uncommitted edits would be silently ignored)."""
    dirty = [rel for rel in changed if rel in s.tag.frozen_rels]
    if dirty:
        raise SetupError(f"uncommitted changes to {', '.join(dirty)}: the experiments run committed code only, so "
                         "these edits would be ignored (and the frozen files are never yours to edit). agent.py never "
                         "stashes, resets or deletes your work: commit or stash them yourself, then rerun")


def git_locks(s):
    """The lock files of the repository's refs and packed-refs: a git command writing them, or one that died
    mid-write. Returns (own, other): own are on the refs this agent writes (its branch, its candidate refs, the notes
    ref), which only it writes while it holds the repo lock; other are the rest."""
    root = gitops.git_dir(s.repo)
    locks = sorted((root / "refs").rglob("*.lock")) + [p for p in [root / "packed-refs.lock"] if p.exists()]
    mine = (f"refs/heads/{s.tag.branch}.lock", f"{gitops.NOTES_REF}.lock")
    own = [p for p in locks if p.relative_to(root).as_posix() in mine
           or p.relative_to(root).as_posix().startswith(f"refs/autoresearch/{s.settings.tag}/")]
    return own, [p for p in locks if p not in own]


def no_stale_git_locks(s):
    """A lock file left by a git command that died mid-write (a reboot, kill -9) would make the first keep or record
    fail after a whole training run: the refs and packed-refs locks are named here, before anything runs, except
    those on this agent's own refs (opening.recover_runs removes a killed agent's)."""
    stale = git_locks(s)[1]
    if stale:
        raise SetupError(f"stale git lock file{'s' * (len(stale) > 1)} (left by a git command that died mid-write, "
                         f"e.g. at a reboot): {', '.join(map(str, stale))}. If no git command is running in this "
                         f"repository, remove {'them' if len(stale) > 1 else 'it'} (rm {' '.join(map(str, stale))}) "
                         "and rerun")


def branch_not_checked_out(s):
    """The ratchet branch moves by update-ref: no worktree may have it checked out."""
    where = gitops.checked_out_in(s.repo, s.tag.branch)
    if where:
        raise SetupError(f"{s.tag.branch} is checked out in {', '.join(where)}; the agent moves that branch itself and "
                         "never touches your checkout: `git switch -` (or any other branch) there, then rerun")


def train_edit_not_ignored(s, changed, here, best_bytes, measured):
    """The loop takes the best commit's train.py, so an uncommitted edit in your checkout would be ignored, unless it
    is one this tag already measured (what `try` leaves there). here: your train.py's bytes; best_bytes: the best
    commit's; measured: whether `here` is some experiment's train.py."""
    if s.settings.command == "loop" and s.tag.train_rel in changed and here != best_bytes and not measured:
        raise SetupError(f"uncommitted changes to {s.tag.train_rel}: the experiments run committed code only, so these "
                         "edits would be ignored. agent.py never stashes, resets or deletes your work: commit or stash "
                         "them yourself (or run them with `uv run agent.py try`), then rerun")


def try_baseline_state(s, here, best, best_bytes, describe):
    """`try`: a baseline first, and only once (once per hardware epoch: try_baseline_due); the first measures the
    committed train.py, a new hardware's the best's."""
    a, tag = s.settings, s.settings.tag
    if a.command != "try":
        return
    if not a.baseline and not s.history:
        others = sorted({str(e.get("tag")) for e in ledger.experiment_events(ledger.read_events(
            s.tag.target / ledger.EVENTS))} - {tag})
        raise SetupError(f"tag {tag!r} has no baseline yet: run `uv run agent.py try --tag {tag} --baseline` first"
                         + (f" (tags with experiments here: {', '.join(others)}; a typo?)" if others else ""))
    if a.baseline and s.history and not a.new_hardware:    # --new-hardware: try_baseline_due decides
        raise SetupError(f"tag {tag!r} already has its baseline ({describe(s.history[0], s.tag.metric)}): edit "
                         f"train.py and run `uv run agent.py try --tag {tag} -m \"<idea>\"`")
    if a.baseline and here != best_bytes and not s.history:     # a new hardware's measures the best's, as it is
        raise SetupError(f"train.py in your checkout differs from the committed one ({best}), which the baseline "
                         "measures: commit it first (then it is the baseline), or move it aside (`git stash`), then "
                         "rerun")


def branch_exists_for_history(s):
    """A tag with experiments needs its branch."""
    if s.history and s.tag.branch not in s.repo.heads:
        raise SetupError(f"{ledger.EVENTS} has experiments for tag {s.settings.tag!r} but branch {s.tag.branch} is "
                         f"gone; restore it with `git branch {s.tag.branch} {s.best_event['full_commit']}` or pick a "
                         "new --tag")


def human_commits_leave_measured_files(s, tip):
    """Commits a human added on top of the best (steering: program.md, notes) may stay only when they leave train.py
    and the frozen files as measured."""
    untouched = s.repo.is_ancestor(s.best_commit, tip) and not s.repo.git.diff(
        "--name-only", s.best_commit, tip, "--", s.tag.train_rel, *s.tag.frozen_rels)
    if not untouched:
        raise SetupError(f"{s.tag.branch} points at {tip[:7]}, which changes train.py or {', '.join(FROZEN)} after the "
                         f"best commit {s.best_commit[:7]} (or does not descend from it), so its result is unknown; "
                         f"move those commits elsewhere (e.g. `git branch -f {s.tag.branch} {s.best_commit[:7]}` after "
                         "saving them on another branch), or start a new --tag from them")


def one_sandbox_rule(s):
    """One sandbox rule per tag, like one budget."""
    if s.history and s.history[0].get("sandbox") and s.sandbox is None:
        raise SetupError(f"tag {s.settings.tag!r} was measured inside the sandbox and this run would be without it "
                         f"(--sandbox {s.settings.sandbox}): its numbers would not be held to the same rules. Run it "
                         "with --sandbox auto or bwrap (bubblewrap installed), or start a new --tag")


def sandbox_complete(settings, reason, lacking):
    """--sandbox bwrap refuses to start without every protection."""
    if settings.sandbox == "bwrap" and (reason or lacking):
        raise SetupError(f"--sandbox bwrap: {reason or 'missing here: ' + '; '.join(lacking)}. Install bubblewrap "
                         "(Debian/Ubuntu: apt install bubblewrap) where user namespaces work, or use --sandbox auto / "
                         "off")


def same_frozen_inputs(s, recorded, found, profile=None):
    """The frozen inputs (prepare.py, tokenizer, evaluation data, base model) must be the ones the tag started with.
    profile: the tag's recorded data profile (profile_words)."""
    if recorded and recorded[0]["digest"] != found["digest"]:
        raise SetupError(f"the frozen inputs changed since tag {s.settings.tag!r} started (digest "
                         f"{found['digest'][:12]}, recorded {recorded[0]['digest'][:12]}): prepare.py, the tokenizer, "
                         "the evaluation data or the base model differ, so new results would not be comparable"
                         + (profile_words(s, profile) or ". Restore them") + ", or start a new --tag")


def same_hardware(s, recorded, changed):
    """The tag's runs were measured on the hardware and software of its latest fingerprint (harness.run.hardware:
    `recorded`, its "hardware" event); `changed`: the differences in words. Refused unless --new-hardware: numbers
    measured elsewhere would be judged against its best and noise floor."""
    a = s.settings
    if a.new_hardware:
        return
    fix = (f"`uv run agent.py try --tag {a.tag} --baseline --new-hardware`" if a.command == "try" else
           "the same command with --new-hardware")
    when = str(recorded.get("ts", ""))[:19].replace("T", " ")
    raise SetupError(f"tag {a.tag!r} was measured on other hardware or software (its fingerprint, hardware epoch "
                     f"{recorded.get('epoch', 1)}{', recorded ' + when if when else ''}): {'; '.join(changed)}. Its "
                     f"results are not comparable with runs here. Resume it where it was measured, start a new --tag, "
                     f"or run {fix}: a new baseline is measured here first, the rows from then on are marked "
                     f"[hw{recorded.get('epoch', 1) + 1}] and report.py keeps the hardware apart. Nothing was changed")


def try_baseline_due(s, describe):
    """`try` on a tag whose current hardware epoch has no baseline yet (--new-hardware opened it): only `try
    --baseline` may run; `try --baseline` when it has one is refused."""
    a, tag = s.settings, s.settings.tag
    if a.command != "try" or a.sync or not s.history:
        return
    if a.baseline and not s.baseline_due:
        raise SetupError(f"tag {tag!r} already has its baseline on this hardware ("
                         f"{describe(ledger.baseline_of(s.history), s.tag.metric)}): edit train.py and run `uv run "
                         f"agent.py try --tag {tag} -m \"<idea>\"`")
    if not a.baseline and s.baseline_due:
        raise SetupError(f"tag {tag!r} continues on new hardware (epoch {s.hardware_epoch}) whose baseline is not "
                         f"measured yet: run `uv run agent.py try --tag {tag} --baseline --new-hardware` first")


def start_warnings(s, devices, is_llm):
    """What the loop will run although it may not do what you expect, in words: several devices without the
    sandbox (a run can see the runs beside it); a cost limit that cannot stop a model with no price."""
    a, found = s.settings, []
    local = [d for d in devices if d.remote is None]     # runs beside each other on this machine
    if len(local) > 1 and s.sandbox is None:   # same user, same machine, nothing in between
        found.append(f"{len(local)} devices without the sandbox: a run can see and rewrite the files of the runs "
                     "beside it. Install bubblewrap (--sandbox auto) before trusting an unattended run's verdicts")
    if is_llm and a.max_cost_usd is not None and price_key(a.model) is None:
        found.append(f"--max-cost-usd {a.max_cost_usd:g} cannot stop this run: model {a.model!r} is not in the price "
                     "table (PRICES in harness/propose/providers.py), so its calls count as $0. Add its prices there, or "
                     "also set --max-experiments or --hours")
    return found
