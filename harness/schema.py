"""
The event schema: every name an events.jsonl line can carry in its "event" field, what that event records, and
readers by kind. Writers name events by these constants (ledger.log_event refuses any other name); readers select
events through of() and last() rather than comparing strings of their own. tests/test_docs.py checks that every
name written or compared anywhere in the repository is one of these, and that each constant is used.

Each line is {ts, event, tag, **fields} (ledger.log_event); the fields of each kind are those its one writer passes.
"""


class Event:
    """The event names (str constants; an event's "event" field is one of their values)."""
    # an invocation of the loop
    CONFIG = "config"                   # the command's settings: proposer, model, metric, goal, devices, budget
    START = "start"                     # the loop starts or resumes on the tag's branch: best, the verdict's rule
    HARDWARE = "hardware"               # the tag's hardware fingerprint and epoch (harness.run.hardware)
    FROZEN_INPUTS = "frozen_inputs"     # the digest of the frozen files and data the tag's runs read
    STOP = "stop"                       # the loop ends: why, what it spent, how busy the devices were
    THROUGHPUT = "throughput"           # the devices' busy shares and experiments per hour so far
    WARNING = "warning"                 # something degraded, not fatal (a search mechanism skipped, MLflow off)
    ERROR = "error"                     # an LLM call failed and is retried
    # restoring the ledger and the branch on start
    TORN_LINE = "torn_line"             # a line cut mid-write, with its fragment
    UNREADABLE = "unreadable"           # an experiment's commit cannot be read (a damaged object)
    ADVANCED = "advanced"               # the branch tip moved past the best outside the loop
    ADOPTED = "adopted"                 # the loop takes the branch's tip as the best (a commit made by hand)
    ARCHIVED = "archived"               # results.tsv held another tag's rows: moved aside
    UNARCHIVED = "unarchived"           # this tag's archived rows brought back
    ROW_RESTORED = "row_restored"       # a results.tsv row re-derived from its experiment event
    SYNCED = "synced"                   # `try` synchronised the best with the branch
    # proposing
    PROPOSE = "propose"                 # an LLM or sampler answer: tokens, price, seconds
    REPAIR = "repair"                   # an answer that did not apply, sent back to be repaired
    SKIPPED = "skipped"                 # no usable answer after the repairs
    DROPPED = "dropped"                 # an idea or candidate given up (does not apply to the new best, unreadable)
    REAPPLIED = "reapplied"             # a waiting idea re-applied on top of a new best
    REDO = "redo"                       # a candidate run again after a restart (no LLM call)
    HYBRID = "hybrid"                   # --proposer hybrid: the sampler's point or the LLM's override, and why
    REFUSED = "refused"                 # the gate refused a proposal (tabu: it repeats measured moves)
    FORCED = "forced"                   # `try --force`: a refusal overridden
    MEMORY = "memory"                   # the search memory's families and their outcomes
    OUTER = "outer"                     # an outer-loop step: what is frozen, the guidance
    MECHANISM = "mechanism"             # a search mechanism proposed, activated, rejected, retired or deactivated
    # one experiment
    CANDIDATE = "candidate"             # the candidate's source, before its commit
    COMMIT = "commit"                   # the candidate committed on the branch
    STARTED = "started"                 # the experiment handed to a device
    RUN = "run"                         # one training run started: seed, device, process group
    REMOTE = "remote"                   # a run ran on a Ray node: which, and the artifact's hash
    WORKER_LOST = "worker_lost"         # a Ray worker died under a run; retried
    CANCEL = "cancel"                   # a run cancelled early: the curve against the yardstick
    CANCEL_YARDSTICK = "cancel_yardstick"  # which curves the early-cancel rule compares against
    CANCEL_EXEMPT = "cancel_exempt"     # an experiment early cancel leaves alone, and why
    RERUN_BEST = "rerun_best"           # the best re-run at a seed (the paired rule) or on a changed machine
    RUN_END = "run_end"                 # one training run ended: its outcome, metric, conditions
    EXPERIMENT = "experiment"           # the verdict: one per finished experiment, the results.tsv row's source
    HOLDOUT = "holdout"                 # the holdout re-score of the baseline and the best


NAMES = frozenset(v for k, v in vars(Event).items() if k.isupper())


def check(name):
    """name, if it is an event name; ValueError naming it otherwise (a writer's bug, never a user's input)."""
    if name not in NAMES:
        raise ValueError(f"{name!r} is not an event name: add it to harness/schema.py's Event, with what it records")
    return name


def of(events, *kinds, tag=None):
    """The events (dicts, in file order) whose "event" is one of kinds, and whose tag is `tag` when it is given."""
    wanted = {check(k) for k in kinds}
    return [e for e in events if e.get("event") in wanted and (tag is None or e.get("tag") == tag)]


def last(events, kind, tag=None):
    """The last event of this kind (and tag, when given), None if there is none."""
    found = of(events, kind, tag=tag)
    return found[-1] if found else None
