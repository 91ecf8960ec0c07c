"""
HARNESS package: everything agent.py's loop uses, in one subpackage per phase of an experiment, over the records
they all share. agent.py holds only the loop and its order; report.py reads the ledger through the same module
agent.py writes it with. docs/architecture.md says which files a change touches.

harness/ (the records and git every phase writes with)
    ledger      results.tsv and events.jsonl: the formats, writing, reading, resume facts, git note text
    files       the files records live in: regular files only, never through a link, atomic replace, fsynced lines
    schema      the event schema: every event name and what it records, readers by kind
    gitops      git: the branch, candidate commits and refs, exports of a commit's blobs, notes, the repository lock
    redact      secrets: which environment variables never reach train.py, and their values out of every record
    console     the live status line and printed lines
    errors      SetupError (exit 2) / Stop (exit 1): how a problem reaches the user
tag/ (the tag: its configuration and state)
    settings    argv -> one frozen Settings (the loop and `try`: SUBCOMMANDS); MAX_REPAIRS, MAX_FIXES, BREAKER
    session     one tag's state (Session), what the steps read of it, the words of what a stop left
    opening     open_session: create or resume a tag, rebuilt from git and the ledger, a sequence of steps
    tagview     a tag as its events say it stands (history, best, baseline, epoch, spend, rule), read only: read_tag
    checks      each refusal open_session makes (SetupError with the way out), one function each
run/ (one run of one commit, wherever it goes)
    backends    where a run goes: Backend.run(spec, watch) -> Outcome; Local here (cluster.RayBackend on Ray)
    node        a run on another node, both sides: payload(spec), the node body run(payload) shared by every
                remote backend (`python -m harness.run.node` for one that starts a process), received(result)
    cluster     the Ray side (--ray): RaySource, RayBackend (its tasks run node's body)
    pool        where the devices come from (DeviceSource: Local for --devices), the worker threads, throughput
    phases      where a device's wall time goes: a run's phases and the training share
    runner      run one commit's train.py with a timeout, evaluate it separately -> Outcome
                (Outcome.kind: ok, crash, timeout, rejected, overtime, lost, node, cancelled)
    evaluator   prepare.py's processes around a run: the separate evaluator after training (cold), or started with it
                (warm), and a waiting process (the warm evaluator, the warm probe)
    processes   a run's process group: its log, ticks, the kill of the group and its strays; stale runs killed
    sandbox     the bubblewrap view train.py and the evaluator run in (allow-list, root confined, no network)
    view        what of this machine the sandbox shows, as paths: the system, the environment, what is no system's
    guard       what a run may not change outside its run dir: checked around every run
    conditions  the conditions a run ran under, measured by the harness: the speed probe, the wall-time allowance
    usage       a run's memory, measured by the harness (process tree RSS, NVML)
    hardware    the tag's fingerprint (GPU, CPU, threads, torch, CUDA, attention); --new-hardware re-measures the baseline
    flash       Flash Attention 3 pinned per tag: fetched outside the sandbox, loaded offline by its runs
    matched     the compute-matched budget (--budget-like h100): a reference GPU's budget in this device's seconds
    target      what a target is: its frozen constants, the budget, prepare.py --check / --preflight / --holdout
judge/ (keep, discard or cancel)
    verdict     the keep/discard/crash rule: Rule, the verdict rules by name (RULES: paired, margin), Verdict,
                and their words for the prompt, `try` and report.py
    stats       the paired verdict's statistics: Student's t, the pooled paired sd, the threshold, each step
    curves      a run's learning curve (train.py's progress lines, kept beside its log) and the early-cancel rules
                by name (RULES: behind)
    holdout     the model artifacts kept (baseline, best) and their holdout re-score (no git: report.py uses it)
propose/ (what to try next)
    providers   the LLM providers: one protocol (complete, ping, classify an error, price), PROVIDERS by name,
                call_with_retries, the price table, Spend
    proposers   who proposes: an LLM provider, a sampler or grid, one signature (Proposer.ask)
    ideas       proposing: waves, the repair loop, fixes, "already measured / in flight", the Backlog of ideas
    prompts     every word the LLM reads, and the history table
    edits       DESCRIPTION + SEARCH/REPLACE answers -> a new train.py (the one path every proposer's answer takes)
    search      the numeric search: the Optuna study (rebuilt from the events), its samplers, asking and telling
    searchspace the space of train.py's constants (or program.md's), a point read from and written into train.py
    hybrid      --proposer hybrid: the sampler's point, accepted or overridden by the LLM; code edits after a stall
    perturb     the grid sweep of train.py's UPPER_CASE constants, and the PROFILE branch that runs
    memory      what an edit changes (moves, families), the tabu, the bandit over families
    outer       the gate every proposal passes; the outer loop (--outer-every): guidance, mechanisms
    mechanisms  a search mechanism run sandboxed: JSON in and out, validated, deactivated on failure
    external    `agent.py try`: one experiment for Claude Code / Codex, and its verdict block
record/ (what happened, written down and shown)
    experiment  one experiment's steps: commit, train (through a backend), judge, record(Result), keep
    baseline    what a tag is measured against: its baseline (and on new hardware), the holdout at the stop
    pagedata    the dashboard's data: the tag as one JSON-able dict (gather), texts made safe, numbers finite
    sinks       the record sinks (SINKS, in order): the row and git note, the study, the artifacts, the printed
                line, MLflow, the dashboard; experiment.record writes the event, then calls them
    tracking    --mlflow: each recorded experiment mirrored into an MLflow run (a copy, never a record)
    dashboard   dashboard.html: the tag in one self-contained page, rewritten after every verdict
    analysis    a run's numbers, read-only (load_run -> Run, the summary, kept table, noise, rule, epochs): report.py
                prints them, analysis.ipynb and the dashboard read them
    plots       the figures: progress.png and the learning curves (matplotlib, loaded only when drawing)

No module here imports agent.py, report.py, prepare.py or train.py, no two import each other, and run/ and judge/
import nothing of tag/, propose/ or record/ (tests/test_structure.py).
"""
