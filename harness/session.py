"""
HARNESS: one tag's state and the steps the loop takes on it. open_session checks the target, the repository and
the ledger, then creates autoresearch/<tag> or resumes it; the Session it returns carries everything the loop in
agent.py needs, and the functions below are the loop's plumbing: commit a candidate, train it, reset to the best
commit, record an experiment. It joins git (gitops), the ledger and the runner; it never decides keep or discard
(that is agent.py's rule) and never imports agent.py.
"""

import argparse
import collections
import dataclasses
import time
from pathlib import Path

import git

from harness import console, gitops, ledger, runner
from harness.edits import clean_description
from harness.errors import SetupError, Stop
from harness.gitops import git_blob_sha
from harness.target import FROZEN, check_target, default_timeout, effective_budget, read_frozen_constants

RUN_LOG = "run.log"


@dataclasses.dataclass
class Session:
    """Everything the loop needs; rebuilt from git and events.jsonl on every start (see open_session)."""
    args: argparse.Namespace
    target: Path
    repo: git.Repo
    branch: str
    train_rel: str                      # paths relative to the repository root
    frozen_rels: list
    metric: str
    goal: str                           # "min" or "max"
    budget: float                       # effective TIME_BUDGET in seconds
    timeout: float
    best_commit: str                    # full sha of the best kept commit (the branch tip between experiments)
    best_metric: float | None
    baseline_metric: float | None
    history: list                       # this tag's "experiment" events, in order
    candidate_blobs: set                # git blob shas of every train.py this tag wrote
    proposer: object = None             # harness.proposers.Proposer
    system_prompt: str = ""
    profile: str | None = None          # device class reported by `prepare.py --check`, if any
    cost_usd: float = 0.0               # the tag's LLM spend and tokens so far (resume sums "propose" events)
    input_tokens: int = 0
    output_tokens: int = 0
    llm_seconds: float = 0.0            # time spent waiting on the proposer in this invocation
    started: float = dataclasses.field(default_factory=time.monotonic)
    recent_failures: collections.deque = dataclasses.field(default_factory=collections.deque)
    last: str = "-"

    @property
    def next_n(self):
        """The number of the next experiment."""
        return len(self.history)       # the baseline is experiment 0

    def log(self, event, **fields):
        """Append one event of this tag to events.jsonl; returns the record."""
        return ledger.log_event(self.target / ledger.EVENTS, self.args.tag, event, **fields)

    def spent(self):
        """(input tokens, output tokens, USD, LLM seconds) so far; record() logs the difference per experiment."""
        return self.input_tokens, self.output_tokens, self.cost_usd, self.llm_seconds

    def status(self, n, phase):
        """The live status line: experiment, phase, best and change vs baseline, last result, tokens, $, elapsed."""
        best = "-"
        if self.best_metric is not None:
            best = f"{self.best_metric:.6f}"
            if self.baseline_metric:
                best += f" ({100 * (self.best_metric - self.baseline_metric) / abs(self.baseline_metric):+.2f}%)"
        console.status(f"exp {n} | {phase} | best {best} | last {self.last} | "
                       f"{(self.input_tokens + self.output_tokens) / 1000:.1f}k tok ${self.cost_usd:.2f} | "
                       f"{console.fmt_duration(time.monotonic() - self.started)}")

# ---------------------------------------------------------------------------
# The loop's plumbing: commit, train, reset, record
# ---------------------------------------------------------------------------


def commit_candidate(s, n, source, message, attempt=0):
    """Write train.py and commit it on the branch with this message (attempt > 0: amend the crashed candidate
    with a fix). Only train.py is committed; hooks run and a blocking one raises Stop (the tree is reset to the
    best commit first). Returns the full sha."""
    blob = git_blob_sha(source.encode())
    s.candidate_blobs.add(blob)
    s.log("candidate", n=n, attempt=attempt, parent=s.best_commit, blob=blob, message=message)
    (s.target / "train.py").write_text(source)
    try:
        commit = gitops.commit_file(s.repo, s.train_rel, message, amend=attempt > 0)
    except Stop:
        reset_to_best(s)
        raise
    gitops.make_candidate_ref(s.repo, s.args.tag, n, commit)
    s.log("commit", n=n, attempt=attempt, full_commit=commit)
    return commit


def train_candidate(s, n, attempt, commit):
    """Run train.py at HEAD (= commit) through the runner and log its "run" and "run_end" events. Returns the
    runner's Outcome."""
    frozen = dict(zip(FROZEN, s.frozen_rels))
    spec = runner.RunSpec(
        commit=commit, cwd=s.target, log=s.target / RUN_LOG, metric=s.metric, timeout=s.timeout, frozen=FROZEN,
        on_start=lambda pgid: s.log("run", n=n, attempt=attempt, commit=commit[:7], pgid=pgid, timeout_s=s.timeout),
        on_tick=lambda elapsed: s.status(n, f"training {console.fmt_duration(elapsed)}/"
                                            f"{console.fmt_duration(s.budget)}"),
        restore=lambda files: s.repo.git.checkout("HEAD", "--", *[frozen[f] for f in files]))
    outcome = runner.run(spec)
    s.log("run_end", n=n, attempt=attempt, commit=commit[:7], returncode=outcome.returncode,
          timed_out=outcome.timed_out, train_seconds=round(outcome.seconds, 3), reason=outcome.reason,
          metric=outcome.metric, frozen_tampered=[frozen[f] for f in outcome.tampered],
          log_tail=outcome.log_tail if outcome.metric is None else "")
    return outcome


def reset_to_best(s):
    """The branch and train.py back at the best commit (see gitops.reset_to: nothing else is touched)."""
    gitops.reset_to(s.repo, s.best_commit, s.train_rel)


def record(s, n, outcome, status, description, t0, spent0, repairs, fixes):
    """Log the "experiment" event (tokens, $ and LLM seconds since spent0), then append the results.tsv row
    derived from it, then print one line."""
    if outcome.reason:
        description = clean_description(f"{description} ({outcome.reason})")
    tokens_in, tokens_out, cost, llm = (now - before for now, before in zip(s.spent(), spent0))
    event = s.log("experiment", n=n, commit=outcome.commit[:7], full_commit=outcome.commit, status=status,
                  metric=outcome.metric or 0.0, memory_gb=round(outcome.memory_gb, 1), description=description,
                  wall_seconds=round(time.monotonic() - t0, 3), train_seconds=round(outcome.seconds, 3),
                  llm_seconds=round(llm, 3), input_tokens=tokens_in, output_tokens=tokens_out,
                  cost_usd=round(cost, 6), proposer=s.args.proposer, repairs=repairs, fixes=fixes)
    ledger.append_line(s.target / ledger.RESULTS, ledger.results_row(event))
    s.history.append(event)
    s.last = f"{status} {outcome.metric:.6f}" if outcome.metric is not None else status
    best = outcome.metric if status == "keep" else s.best_metric
    shown = f"{outcome.metric:.6f}" if outcome.metric is not None else "-"
    console.say(f"#{n:<4} {status:<7} {s.metric} {shown:<10} best {best:.6f}  {outcome.seconds:5.0f}s  {description}")

# ---------------------------------------------------------------------------
# Setup and resume
# ---------------------------------------------------------------------------


def open_session(args):
    """Check everything, then create autoresearch/<tag> from HEAD or resume it. Returns (Session, constants).

    Resume rebuilds the best commit and the experiment count from this tag's events, kills a training run left
    by a killed agent, restores what an interrupted iteration left half-applied (only files the agent itself
    wrote, see the order of operations in harness/ledger.py), and appends a results.tsv row lost to a kill.
    Raises SetupError with the fix for anything it will not touch."""
    target = Path(args.target).resolve()
    check_target(target)
    constants = read_frozen_constants(target / "prepare.py")
    budget = effective_budget(constants["TIME_BUDGET"])
    repo = gitops.open_repo(target)
    root = Path(repo.working_tree_dir).resolve()
    branch = f"autoresearch/{args.tag}"
    events_path = target / ledger.EVENTS
    ledger.end_with_newline(events_path)
    all_events = ledger.read_events(events_path)
    state = ledger.tag_state(all_events, args.tag)
    history, kept = state.history, state.kept
    s = Session(args=args, target=target, repo=repo, branch=branch, train_rel=gitops.repo_rel(repo, target / "train.py"),
                frozen_rels=[gitops.repo_rel(repo, target / f) for f in FROZEN],
                metric=constants["METRIC_NAME"], goal=constants["METRIC_GOAL"], budget=budget,
                timeout=args.timeout or default_timeout(budget), best_commit="",
                best_metric=kept[-1]["metric"] if kept else None,
                baseline_metric=history[0]["metric"] if history else None, history=history,
                candidate_blobs=state.candidate_blobs, cost_usd=state.cost_usd, input_tokens=state.input_tokens,
                output_tokens=state.output_tokens)
    run_in_flight = state.stale_pgid is not None
    if run_in_flight:
        runner.kill_stale_run(state.stale_pgid, target)

    # 1. the working tree: clean, or dirty only with what an interrupted iteration of this tag wrote
    ours = set()
    for rel in gitops.changed_files(repo):
        path = root / rel
        if rel == s.train_rel and path.exists() and git_blob_sha(path.read_bytes()) in s.candidate_blobs:
            ours.add(rel)
        elif rel in s.frozen_rels and run_in_flight:
            ours.add(rel)
        else:
            dirty = ", ".join(gitops.changed_files(repo))
            raise SetupError(f"uncommitted changes to tracked files: {dirty}. agent.py never stashes, resets or "
                             "deletes your work: commit or stash them yourself, then rerun")
    if ours and repo.active_branch.name != branch:
        raise SetupError(f"{', '.join(sorted(ours))} changed, and {branch} is not checked out: "
                         f"`git switch {branch}` and rerun to let the agent restore them")

    # 2. the branch: create it, or find the best commit of a resumed one
    if branch not in repo.heads:
        if history:
            raise SetupError(f"{ledger.EVENTS} has experiments for tag {args.tag!r} but branch {branch} is gone; "
                             f"restore it with `git branch {branch} {kept[-1]['full_commit']}` or pick a new --tag")
        repo.create_head(branch, repo.head.commit)
        repo.heads[branch].checkout()
        s.best_commit = repo.head.commit.hexsha
        s.log("start", new_branch=True, best=s.best_commit)
    else:
        # before the baseline is measured, whatever the branch holds is the baseline
        s.best_commit = kept[-1]["full_commit"] if kept else repo.heads[branch].commit.hexsha
        if repo.active_branch.name != branch:
            repo.heads[branch].checkout()
        tip = repo.head.commit.hexsha
        if tip != s.best_commit and not gitops.is_candidate(repo.head.commit, s.best_commit, s.train_rel,
                                                             s.candidate_blobs):
            raise SetupError(f"{branch} points at {tip[:7]}, which the agent did not make on top of the best commit "
                             f"{s.best_commit[:7]}; move your commits elsewhere (e.g. `git branch -f {branch} "
                             f"{s.best_commit[:7]}` after saving them on another branch) and rerun")
        s.log("start", new_branch=False, best=s.best_commit, experiments=len(history))
        if tip != s.best_commit or ours:
            if tip != s.best_commit:
                gitops.make_candidate_ref(repo, args.tag, s.next_n, tip)   # a kill may have come before its ref
            reset_to_best(s)
            if ours & set(s.frozen_rels):
                repo.git.checkout(s.best_commit, "--", *sorted(ours & set(s.frozen_rels)))
            s.log("cleaned", n=s.next_n, tip=tip, restored=sorted(ours))

    # 3. outputs and a row lost to a kill between the "experiment" event and its row
    gitops.ensure_ignored(repo, [target / name for name in (ledger.RESULTS, ledger.EVENTS, RUN_LOG)])
    try:
        ledger.ensure_results_header(target / ledger.RESULTS, s.metric)
    except ValueError as e:
        raise SetupError(str(e)) from None
    if history and ledger.missing_row(target / ledger.RESULTS, all_events, history[-1]):
        ledger.append_line(target / ledger.RESULTS, ledger.results_row(history[-1]))
        s.log("row_restored", n=history[-1]["n"])
    return s, constants
