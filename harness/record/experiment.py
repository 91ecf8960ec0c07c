"""
HARNESS: one experiment's steps on a tag's Session, for agent.py's loop and `agent.py try` alike: commit a candidate
(in the harness's stage worktree, only train.py), train it (a fresh export of its commit, through the device's
backend), judge it (harness.judge.verdict, with its further runs), record the result (one event, one results.tsv row,
one git note, one printed line), and keep it (the branch and the in-memory best move together, nowhere else). It never
proposes (harness.propose.ideas) and never decides the rule (harness.judge.verdict).
"""

import dataclasses
import hashlib
import secrets
import shutil
import statistics
import time
from pathlib import Path

from harness import console, files, gitops, ledger
from harness.judge import curves, holdout, verdict
from harness.record import sinks
from harness.run import conditions, flash, hardware, phases
from harness.run.backends import Local, Spec, Watch
from harness.propose.edits import clean_description, with_reason
from harness.errors import SetupError, Stop
from harness.gitops import git_blob_sha
from harness.propose.providers import Spend
from harness.redact import redact
from harness.run.runner import Kind, timeout_s
from harness.tag import session
from harness.tag.session import RUN_LOG, export_frozen, file_at_bytes, locked
from harness.tag.settings import THREADS
from harness.run.target import default_timeout, run_prepare
from harness.schema import Event


@locked
def commit(s, n, source, message, fix=0, amend=None, fix_of=None, same=False):
    """Commit this train.py as experiment n's candidate on top of the best commit, in the harness's stage worktree
    (amend: the crashed candidate's sha, amended with fix number `fix` > 0 of experiment fix_of's idea, which the
    events record so that an interrupted fix is redone as that fix). Only train.py is committed; hooks run
    and a blocking one raises Stop. The message body names the tag and experiment, so two identical candidates never
    share a commit (same=True: `source` is the best's train.py unchanged, a re-baseline). Keeps the commit reachable
    as refs/autoresearch/<tag>/<n>-<sha7>. Returns the full sha."""
    s.log(Event.CANDIDATE, n=n, fix=fix, fix_of=fix_of, parent=s.best_commit, blob=git_blob_sha(source.encode()),
          message=message)
    stage = gitops.open_stage(s.repo, s.tag.home / "stage", amend or s.best_commit)
    (Path(stage.working_tree_dir) / s.tag.train_rel).write_text(source)
    gitops.set_aside_damaged(s.repo, source.encode())     # an unreadable discard's train.py proposed again
    body = f"{message}\n\nautoresearch: tag {s.settings.tag}, experiment {n}"
    sha = gitops.commit_file(stage, s.tag.train_rel, redact(body), amend=amend is not None, allow_empty=same)
    if (s.repo.commit(sha).tree / s.tag.train_rel).hexsha != git_blob_sha(source.encode()):
        raise Stop(f"the candidate commit {sha[:7]} holds another train.py than the one proposed: a git filter "
                   "(filter.*.clean in your git config, with a .gitattributes or info/attributes line) rewrote it; "
                   "remove that filter, then rerun")
    changed = s.repo.git.diff("--name-only", s.best_commit, sha).split()
    if changed != ([] if same else [s.tag.train_rel]):   # a hook (or a planted one) added files to the commit
        raise Stop(f"the candidate commit {sha[:7]} changes {', '.join(changed) or 'nothing'}, not only "
                   f"{s.tag.train_rel}: a git hook altered it (check .git/hooks and core.hooksPath); the agent commits "
                   "train.py only")
    s.expect_ref(gitops.make_candidate_ref(s.repo, s.settings.tag, n, sha))
    s.log(Event.COMMIT, n=n, fix=fix, fix_of=fix_of, full_commit=sha)
    return sha


def evaluator_only_inside(s):
    """The evaluator-only paths committed with the target, relative to it (prepare.py --frozen-inputs names them in
    evaluator_only_in_target, or lists them in evaluator_only under the target or its pristine copy): a corpus
    committed with the target holds the validation text, so no run dir gets a copy."""
    inputs = (s.tag.evaluation or {}).get("inputs") or {}
    found = [str(p) for p in inputs.get("evaluator_only_in_target", [])]
    for p in inputs.get("evaluator_only", []):
        path = Path(p).resolve()
        for root in (s.tag.target, (s.tag.home / "frozen").resolve()):
            if path.is_relative_to(root):
                found.append(path.relative_to(root).as_posix())
    return found


@locked
def make_candidate_ref(s, n, sha):
    """Keep commit sha reachable as experiment n's candidate ref (the baseline's is the branch start)."""
    return gitops.make_candidate_ref(s.repo, s.settings.tag, n, sha)


class RunWatch(Watch):
    """A run's talk back to the session: the "run" event once it started, the status line, its events, its
    artifact kept (only the baseline's and the best's stay: see record; never a re-run of the best's)."""

    def __init__(self, s, spec, best=False):
        self.s, self.spec, self.best = s, spec, best
        self.current, self.curve, self.offset = "training", curves.Curve(), 0

    def started(self, pgid):
        s, spec = self.s, self.spec
        s.log(Event.RUN, n=spec.n, fix=spec.fix, run=spec.run, seed=spec.seed, commit=spec.commit[:7], pgid=pgid,
              timeout_s=timeout_s(spec.timeout), cwd=str(spec.run_dir),
              device=spec.device.name if spec.device else None,
              sandbox=s.settings.sandbox if s.sandbox is not None or pgid is None else "off", best=self.best or None)

    def phase(self, name):
        self.current = name
        self.tick(0.0)

    def tick(self, elapsed):
        phase = self.current
        if phase == "training" and self.s.cache.curves:   # a target that prints progress lines (its baseline did):
            self.offset = curves.read_log(self.spec.log, self.curve, self.offset)   # start-up until the first one
            phase = "training" if self.curve.points else "start-up"
        session.tick(self.s, self.spec.n, elapsed, self.spec.device, phase, self.run_words())

    def run_words(self):
        """Which run of the experiment this is: "run 2 of 3" (the baseline), "run 1 of at most 4" (a candidate under
        the paired rule), "the best's run at this seed"."""
        s, spec = self.s, self.spec
        if self.best:
            return "the best's run at this seed"
        if s.baseline_due:
            return f"run {spec.run + 1} of {s.settings.baseline_runs}"
        most = 1 + s.rule.confirm
        return f"run {spec.run + 1} of {'at most ' if s.rule.is_paired and most > 1 else ''}{most}"

    def event(self, name, **fields):
        self.s.log(name, n=self.spec.n, **fields)

    def keep_artifact(self, path):
        if not self.best:
            with self.s.lock:
                holdout.keep_artifact(self.s.tag.home, self.spec.n, self.s.tag.evaluation["artifact"], path)


def train(s, n, fix, sha, run=0, device=None, best=False, base=None):
    """Run commit `sha` hermetically: a fresh export of its target files, the speed probe, train.py (sandboxed when
    available), the probe again, the separate evaluation, the guard's check of everything outside the run dir,
    through the device's backend (this machine: backends.Local; a Ray slot: its RayBackend); its log is kept in logs/
    and copied to <target>/run.log. Logs "run" and "run_end". run: the run's index among the runs of one commit
    (baseline runs, a candidate's further runs); train.py gets AUTORESEARCH_SEED = run_seed(s, n, run) and a fixed
    AUTORESEARCH_THREADS. best: sha is the best's commit, run again for experiment n at that seed (the paired rule,
    or the machine's speed changed): its artifact is not kept. device: the harness.run.pool.Device it runs on; None:
    this machine as it is. base: the best a candidate's first run was built on: its curve is held to base's, or to
    the baseline's (cancel_watcher). Its curve is kept beside its log; its summary's device and threads are checked
    against the fingerprint (after_run). Safe to call from several threads at once. Returns the runner's Outcome."""
    # the run dir's name tells train.py nothing (which run of the pairs it is: its seed's offset would follow)
    tag, started = s.tag, time.monotonic()
    seed, run_dir = run_seed(s, n, run), tag.home / "runs" / secrets.token_hex(8)
    frozen_dir, ev = tag.home / (device.frozen if device else "frozen"), tag.evaluation or {}
    env = {**ev.get("env", {}), "AUTORESEARCH_TIME_BUDGET": f"{tag.budget:g}", "AUTORESEARCH_SEED": str(seed),
           "AUTORESEARCH_THREADS": str(device.threads if device else THREADS),
           "AUTORESEARCH_ARTIFACT": str(run_dir / ev.get("artifact", "artifact")),
           **flash.run_env((s.hardware or {}).get("attention")),
           **(s.sandbox.env if s.sandbox else {}), **(device.env if device else {})}

    def fresh_frozen():                              # a fresh pristine evaluator right before it runs
        with s.lock:
            export_frozen(s, frozen_dir)

    evaluation = tag.evaluation and {**tag.evaluation, "timeout": eval_timeout(s)}
    spec = Spec(n, fix, run, seed, sha, run_dir, frozen_dir, log_path(s, n, fix, run, best), env, tag.metric,
                run_timeout(s), tag.budget if evaluation else None, None if s.baseline_due else max_wall(s),
                evaluation, fresh_frozen, device, tag.speed_probe,
                cancel_watcher(s, n, run, sha, base),
                s.pool.shared_probe(device, s.sandbox is not None) if tag.speed_probe and s.pool and device else None)
    with s.lock:
        shutil.rmtree(run_dir, ignore_errors=True)                  # a leftover of a killed agent
        gitops.export_commit(s.repo, sha, tag.target_rel, run_dir, leave_out=evaluator_only_inside(s))
        spec.log.parent.mkdir(parents=True, exist_ok=True)
        if tag.speed_probe and not (frozen_dir / "prepare.py").is_file() and (device is None or device.remote is None):
            export_frozen(s, frozen_dir)    # a device's first run: the probe before training runs from its copy
    outcome = (device.remote if device is not None and device.remote is not None else Local(s)).run(
        spec, RunWatch(s, spec, best))
    after_run(s, spec, outcome, best, started)
    return outcome


def after_run(s, spec, outcome, best, started):
    """The bookkeeping of a run that ended (train's): its curve kept, its log copied to <target>/run.log, a "cancel"
    event when its rule stopped it, its metric and probe kept by seed, its summary checked against the fingerprint,
    the probe's failure said once, its phases counted on its device (the harness's: what else passed since
    `started`, monotonic), "run_end"."""
    n, fix, run, seed, sha, device = spec.n, spec.fix, spec.run, spec.seed, spec.commit, spec.device
    curve = curves.of_log(spec.log)
    curves.save(curve, spec.log)
    with s.lock:
        outcome.phases["harness"] = max(0.0, time.monotonic() - started - sum(outcome.phases.values()))
        if s.pool is not None and device is not None:
            s.pool.ran(device, outcome)    # its phases counted, its probe after kept for the next run
        if spec.log.exists():
            files.copy_record(spec.log, s.tag.target / RUN_LOG)
        if outcome.metric is not None and curve.points:      # by seed: a run redone after a kill replaces its own
            s.cache.curves.setdefault(sha[:7], {})[seed] = curve
        if outcome.cancel is not None:
            watched = spec.cancel
            s.log(Event.CANCEL, n=n, commit=sha[:7], **outcome.cancel.fields(), words=outcome.cancel.words(),
                  curve=curve.until(outcome.cancel.at), paired=watched.paired is not None,
                  best_curve=mean_curve([watched.paired] if watched.paired else watched.best, curve, outcome.cancel.at))
        if outcome.metric is not None:
            s.cache.measured.setdefault(sha[:7], {})[seed] = (outcome.metric, outcome.probe_s)
        outcome.hardware_mismatch = hardware.summary_mismatch(s.hardware or {}, outcome.summary,
                                                              device.threads if device else THREADS)
        if outcome.hardware_mismatch:
            console.say(f"warning: experiment #{n}'s run says {outcome.hardware_mismatch} (the tag's fingerprint: "
                        f"{hardware.words(s.hardware)}): its number may not be comparable")
        if outcome.probe_problem and not s.probe_warned:
            s.probe_warned = True
            console.say(f"speed probe: none ({outcome.probe_problem}); the wall-time allowance and the comparison "
                        "of conditions fall back to the rules without it")
        s.log(Event.RUN_END, n=n, fix=fix, run=run, commit=sha[:7], returncode=outcome.returncode,
              timed_out=outcome.timed_out, train_seconds=round(outcome.seconds, 3), reason=outcome.reason,
              kind=outcome.kind.value, metric=outcome.metric, own_metric=outcome.own_metric,
              eval_seconds=round(outcome.eval_seconds, 3), frozen_tampered=outcome.tampered, outside=outcome.outside,
              log=str(spec.log), log_tail=outcome.log_tail if outcome.metric is None else "",
              device=device.name if device else None, seed=seed, probe_s=outcome.probe_s,
              probe_problem=outcome.probe_problem or None, best=best or None,
              hardware_mismatch=outcome.hardware_mismatch, timeout_s=outcome.timeout_s,
              phases=phases.rounded(outcome.phases), probe_shared=spec.probed is not None or None)


def log_path(s, n, fix, run=0, best=False):
    """Where the log of run `run` of experiment n's candidate (fix number `fix`; best: the best's commit run again
    at that seed) is kept: <harness dir>/logs/0007-0.log, 0007-1-r2.log, 0007-0-r1-best.log; its curve beside it."""
    return s.tag.home / "logs" / (f"{n:04d}-{fix}" + (f"-r{run}" if run else "") + ("-best" if best else "") + ".log")


def cancel_watcher(s, n, run, sha, base):
    """The curves.Watcher a run is held to, or None: only a candidate's first run (n > 0, run 0, not the best's) with
    --cancel not off (its rule: curves.rule_name), not without the sandbox on several local devices, with at least
    curves.MIN_BASELINE of this hardware baseline's curves known; held to the curves curves.yardstick picks (the best's,
    or the baseline's when the best's train.py is not the original's code and the candidate's is; a "cancel_yardstick"
    event says which and why, curves None: not watched) where some are known, and not exempt by what its train.py
    changes against theirs (curves.exempt: the schedule, the printed loss; a "cancel_exempt" event). The Watcher carries
    their speed probe (a run probed otherwise is not watched) and their run at the candidate's seed."""
    rule = curves.rule_name(s.settings.cancel)
    if rule is None or not n or run or base is None or not s.history:
        return None
    # unsandboxed runs side by side could write into each other's logs: curves are then not evidence
    if s.sandbox is None and sum(d.remote is None for d in s.devices) > 1:
        return None
    with s.lock:
        baseline, original = ledger.baseline_of(s.history)["full_commit"], s.history[0]["full_commit"]
        known = {c: dict(s.cache.curves.get(c[:7], {})) for c in (base, baseline)}
    if len(known[baseline]) < curves.MIN_BASELINE:
        return None
    try:
        mine, best, theirs, original = (file_at_bytes(s, c).decode("utf-8") for c in (sha, base, baseline, original))
    except UnicodeDecodeError:
        return None
    which, why = curves.yardstick(mine, best, theirs, original)
    s.log(Event.CANCEL_YARDSTICK, n=n, curves=which, reason=why)
    commit, source = (base, best) if which == "best" else (baseline, theirs)
    if which is None or not known[commit]:
        return None
    if why := curves.exempt(mine, source):
        s.log(Event.CANCEL_EXEMPT, n=n, reason=why)
        return None
    return curves.Watcher(list(known[commit].values()), list(known[baseline].values()), probe_s=best_probe(s, commit),
                          paired=known[commit].get(run_seed(s, n, 0)), yardstick=which, rule=rule)


def mean_curve(best, curve, until):
    """[[progress, the mean loss of best's curves], ...] at the candidate curve's points up to `until` (the cancel
    event: the yardstick's run at the same seed, or the mean of its runs)."""
    found = []
    for q in curve.points:
        values = [v for c in best if (v := c.at(q.progress)) is not None]
        if q.progress <= until and values:
            found.append([round(q.progress, 4), round(statistics.fmean(values), 5)])
    return found


def judge(s, n, fix, first, base, base_metric, device=None):
    """The tag's rule on this candidate's first run against the best it was built on (commit `base`, its metric
    base_metric), its further runs trained here (on `device`), each logged; the rule decides (verdict.RULES: the
    paired rule judges on the best's run at each seed, taken from s.cache.measured or run now, a "rerun_best" event,
    when there is none or the candidate's speed probe differs from it; the margin rule against the best's mean, or the
    best re-run now at the candidate's seed when the probes differ). Safe in a worker thread. Returns a Verdict."""
    def run_again(run):
        session.status(s, n, f"run {run + 1} of at most {1 + s.rule.confirm}" if s.rule.is_paired else
                 f"confirmation run {run} of {s.rule.confirm}")
        return train(s, n, fix, first.commit, run=run, device=device)

    def best_at(run, outcome, then=None):
        seed = run_seed(s, n, run)
        with s.lock:
            known = s.cache.measured.get(base[:7], {}).get(seed)
        if known is not None and not conditions.differ(outcome.probe_s, known[1]):
            return known[0], False, ""
        then = then or (known or (None, None))[1]
        why = ("no run of the best at this seed yet" if then is None else
               f"its probe {outcome.probe_s:.3f}s against the best's {then:.3f}s: the machine's speed changed")
        s.log(Event.RERUN_BEST, n=n, run=run, seed=seed, best=base[:7], reason=why)
        session.status(s, n, f"running the best at seed {seed} ({why.split(':')[-1].strip()})")
        again = train(s, n, fix, base, run=run, device=device, best=True)
        if again.metric is None:
            return None, False, f"the best's run at seed {seed} failed ({again.reason}): judged on the runs before"
        if conditions.differ(outcome.probe_s, again.probe_s):     # the machine changed again between the two
            return None, False, (f"the machine's speed changed between its run and the best's at seed {seed} "
                                 f"(probes {outcome.probe_s:.3f}s, {again.probe_s:.3f}s): judged on the runs before")
        return again.metric, then is not None, ""

    def pooled():
        with s.lock:
            return verdict.pooled_of(s.rule, [(e["runs"], e.get("best_runs"))     # this hardware's verdicts
                                              for e in ledger.since_baseline(s.history)])

    return s.rule.judge(first, run_again, verdict.Best(base_metric, best_at, lambda: best_probe(s, base), pooled))


@locked
def best_probe(s, base):
    """The mean speed probe of commit base's measured runs (the best's; the baseline's as a yardstick; None: none
    probed)."""
    probes = [p for _, p in s.cache.measured.get(base[:7], {}).values() if p]
    return statistics.fmean(probes) if probes else None


@dataclasses.dataclass
class Result:
    """A judged experiment, ready to record. outcome: its first run; judged: the Verdict; description: the idea (its
    reason and run count are added); wall: seconds from its start on its device to its verdict; spend: what asking
    for it (and its fixes) cost; base, base_metric: the best it was built on and judged against; fields: more of its
    event (the proposal wave, a re-run's superseded experiment, the experiment a `try --fix` fixes)."""
    n: int
    outcome: object
    judged: verdict.Verdict
    description: str
    wall: float
    spend: Spend = Spend()
    repairs: int = 0
    fixes: int = 0
    base: str | None = None
    base_metric: float | None = None
    noise_sd: float | None = None
    reason: str | None = None           # replaces the verdict's and the run's reason (a superseded win)
    fields: dict = dataclasses.field(default_factory=dict)

    @property
    def why(self):
        """Why it was not kept as measured: the override, the verdict's (a further run crashed, or the environment
        failed one: not judged), or the run's."""
        return self.reason if self.reason is not None else self.judged.reason or self.outcome.reason

    @property
    def kind(self):
        """How it ended (a Kind): the failed further run's, else its first run's."""
        return (self.judged.failed or self.outcome).kind


@locked
def record(s, result):
    """Log the "experiment" event (with the fields each sink adds before it), add it to the history, then hand it to
    the record sinks in order (harness.record.sinks: the results.tsv row and git note, the study, the artifacts, the
    printed line, MLflow, the dashboard). Returns the event."""
    r, outcome, status = result, result.outcome, result.judged.status
    idea = redact(r.description)
    description = r.description if len(r.judged.runs) < 2 else f"{r.description} ({len(r.judged.runs)} runs)"
    if r.judged.remeasured:
        description += f" (the best re-run {r.judged.remeasured}x: the machine's speed changed)"
    cancel = outcome.cancel if outcome.kind is Kind.CANCELLED else None
    idle = [curves.idle(c) for c in s.cache.curves.get(outcome.commit[:7], {}).values()]
    still = idle[0] if idle and all(idle) else ""      # every run of it: did not train
    if r.why or still:                  # the reason kept whole: it says why the row's metric is what it is
        description = with_reason(clean_description(description), clean_description(r.why or still))
    description = redact(description)   # a reason can quote what train.py printed (a secret it read somewhere)
    metric = r.judged.metric if status != "crash" else None
    before = {k: v for sink in sinks.SINKS for k, v in sink.before(s, r.n, idea).items()}
    event = s.log(Event.EXPERIMENT, n=r.n, commit=outcome.commit[:7], full_commit=outcome.commit, status=status,
                  metric=metric or 0.0, memory_gb=round(outcome.memory_gb, 1), description=description,
                  memory_source=outcome.memory_source or None, reported_memory_gb=round(outcome.reported_memory_gb, 3),
                  wall_seconds=round(r.wall, 3), train_seconds=round(outcome.seconds, 3),
                  llm_seconds=round(r.spend.llm_seconds, 3), input_tokens=r.spend.input_tokens,
                  output_tokens=r.spend.output_tokens, cost_usd=round(r.spend.usd, 6), proposer=s.settings.proposer,
                  repairs=r.repairs, fixes=r.fixes, budget_s=s.tag.budget, smoke=s.tag.smoke,
                  budget_like=s.tag.budget_like,
                  base=r.base or s.best_commit, base_metric=r.base_metric if r.base else s.best_metric,
                  idea=idea, reason=redact(r.why), kind=r.kind.value, sandbox=s.sandbox is not None,
                  tokens_per_sec=verdict.tokens_per_sec(outcome), runs=list(r.judged.runs) or None,
                  eval_seconds=round(outcome.eval_seconds, 3), probe_s=outcome.probe_s,
                  best_runs=list(r.judged.best) or None, remeasured=r.judged.remeasured or None, t=r.judged.t,
                  gain=r.judged.gain, noise_sd=r.noise_sd, retried=r.judged.retried or None,
                  cancelled=cancel.fields() if cancel is not None else None, **before,
                  hardware_epoch=s.hardware_epoch, hardware_mismatch=outcome.hardware_mismatch, idle=still or None,
                  **r.fields)
    s.history.append(event)
    context = {"log": log_path(s, r.n, r.fixes), "timeout_s": run_timeout(s).seconds()}
    for sink in sinks.SINKS:
        sink.on_record(s, event, r, context)
    return event


def fix_texts(idea, fix, words):
    """A fix's row description and commit message: ("raise LR (fix 1: import math)", "raise LR\n\nfix 1: import
    math"). The same for the loop's fixes and `try --fix`: each is its own experiment and row, the crash keeps its."""
    return f"{idea} (fix {fix}: {words})", f"{idea}\n\nfix {fix}: {words}"


FREE_BYTES = 16 * 2**20      # less free space than this where the harness writes: the disk is full


def check_environment(s, n):
    """After experiment n crashed: was it the machine? Raises Stop, before anything is recorded (so a rerun redoes
    the candidate), when the disk of the repository or the harness dir is full, or `prepare.py --check` fails (the
    prepared data deleted or damaged). Returns None when the machine is fine: the crash is the idea's."""
    for place in (s.tag.target, s.tag.home):
        free = shutil.disk_usage(place).free
        if free < FREE_BYTES:
            raise Stop(f"disk full at {place} ({free / 2**20:.1f} MiB free): free some space, then rerun the same "
                       f"command; experiment #{n}'s crash is not counted, it runs again")
    try:
        run_prepare(s.tag.target, "--check", timeout=600, env=(s.tag.evaluation or {}).get("env"))
    except SetupError as e:
        raise Stop(f"the prepared data is not usable any more ({str(e).strip().splitlines()[-1]}): prepare it again "
                   f"(uv run prepare.py), then rerun the same command; experiment #{n}'s crash is not counted, it "
                   "runs again") from None


@locked
def keep(s, event):
    """A kept experiment becomes the best: the branch moves to its commit (update-ref, old value checked) and the
    session's best with it. The only place either moves after the start. A branch someone checked out meanwhile
    (`git switch`, a worktree) is never moved under them: raises Stop (the keep is recorded; a rerun moves it)."""
    where = gitops.checked_out_in(s.repo, s.tag.branch)
    if where:
        raise Stop(f"{s.tag.branch} was checked out in {', '.join(where)} while the loop ran; the loop never moves a "
                   f"branch under a checkout. Experiment #{event['n']} was kept and recorded, the branch not moved. "
                   f"`git switch -` there (to read the best use `git show {s.tag.branch}:train.py`, or a detached "
                   f"worktree: `git worktree add --detach DIR {s.tag.branch}`), then rerun the same command to resume")
    gitops.advance_branch(s.repo, s.tag.branch, event["full_commit"], s.best_commit)
    s.expect_ref(f"refs/heads/{s.tag.branch}")
    s.best_commit = event["full_commit"]        # its metric: s.best_metric, from the history


def seed_of(seed_base, n, run):
    """The seed of run `run` of experiment n under the margin rule: the tag's secret seed_base, n and run hashed
    (sha256) to a number below 2**31. Distinct for every run of a tag (two runs share one with odds of 1 in 2**31), so
    that repeated runs measure the spread that init and data order cause (the noise floor); the same on a resume
    (seed_base is recorded with the baseline); and, unlike 1000 n + run, it tells train.py neither which experiment
    nor which of its runs it is."""
    digest = hashlib.sha256(f"{seed_base}:{n}:{run}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 2**31


def run_seed(s, n, run):
    """The seed of run `run` of experiment n, from the tag's seed_base (drawn at random when the tag starts, recorded
    with the baseline, so that no train.py can be written for it): under the paired rule seed_base + run for every
    experiment (the baseline's run r and each candidate's run r share init and data order: common random numbers),
    else seed_of(seed_base, n, run). A tag whose baseline recorded no seed_base (from before it was drawn) keeps the
    seeds it was measured with, 1000 n + run."""
    if s.tag.seed_base is None:
        return 1000 * n + run
    return s.tag.seed_base + run if s.rule.is_paired else seed_of(s.tag.seed_base, n, run)


def max_wall(s):
    """The wall time train.py may take (a conditions.Allowance): the budget plus the baseline's measured overhead
    (its wall time minus the budget) scaled by the speed probe, times K, the CPU workers sharing this machine
    (--devices cpu:K: K runs import and compile at once; else 1); tight unless the budget is a smoke one (s.tag.smoke).
    None before the baseline is measured."""
    if not s.history:
        return None
    base = ledger.baseline_of(s.history)            # this hardware's
    return conditions.Allowance(s.tag.budget, max(0.0, base["train_seconds"] - s.tag.budget), base.get("base_probe_s"),
                                s.pool.cpu_workers if s.pool else 1, comparable=not s.tag.smoke)


def run_timeout(s):
    """The hard limit on a training run (a conditions.Timeout of its speed probe): s.tag.timeout (--timeout, or the one
    the tag's baseline recorded) when there is one, else target.default_timeout before the baseline and twice the
    wall-time allowance (max_wall) after it."""
    return conditions.Timeout(default_timeout(s.tag.budget), s.tag.timeout, None if s.baseline_due else max_wall(s))


EVAL_FIRST_S = 1800.0   # the baseline's separate evaluations may take this long (nothing is known of the machine yet)
EVAL_TIMES = 5          # later, a run's may take this many times the baseline's (a bigger model, a busier machine) ...
EVAL_SLACK_S = 120.0    # ... plus this (the evaluator's start-up: Python, torch, loading the exported program)


def eval_timeout(s):
    """Seconds the separate evaluation of a run may take, sized by evaluation, not by the training budget: before
    this hardware's baseline is measured EVAL_FIRST_S, then EVAL_TIMES x the baseline's evaluation + EVAL_SLACK_S;
    --timeout, when given, when it is longer."""
    base = None if s.baseline_due else ledger.baseline_of(s.history)
    sized = EVAL_FIRST_S if base is None else EVAL_TIMES * (base.get("eval_seconds") or 0.0) + EVAL_SLACK_S
    return max(sized, s.tag.timeout or 0.0)


def stopped(s, **fields):
    """The loop ended: its "stop" event (fields: why, its throughput), then each record sink's on_stop (the dashboard
    rewritten as not live)."""
    sinks.stop(s, lambda: s.log(Event.STOP, **fields))


def log_stop(s, event, reason):
    """Log why the loop ended (s: None before the session opened, or a tag with no best yet: nothing to log). Nothing
    to undo: the branch only moves to a kept commit (runs are killed on errors). A failure of the ledger itself is
    not raised again: the stop's message says so."""
    if s is not None and s.best_commit:
        try:
            stopped(s, reason=reason, status=event)
        except (Stop, OSError):
            pass
