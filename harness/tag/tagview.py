"""
HARNESS: a tag as its events say it stands, read and never written (TagState): its history, the best, the baseline,
the hardware epoch, the LLM spend, the verdict rule it recorded, the runs a killed invocation left behind. read_tag
opens one for a reader (report-like commands, a future `finalize`, the words of an interrupt): it measures nothing,
logs nothing, creates nothing and takes no lock. The Session derives its best and baseline by the same properties
(Derived), so the two cannot disagree with the history or with each other.
"""

import collections
import dataclasses

from harness import ledger, schema
from harness.judge import verdict
from harness.schema import Event


class Derived:
    """What follows from `history` (a tag's "experiment" events, in order) and `hardware_epoch`: properties, never
    fields, so that they cannot disagree with the history."""

    @property
    def best_event(self):
        """The "experiment" event of the best commit (the last keep), or None before the baseline."""
        return next((e for e in reversed(self.history) if e["status"] == "keep"), None)

    @property
    def best_metric(self):
        """The best's metric, from its event (best_event; None before the baseline)."""
        return (self.best_event or {}).get("metric")

    @property
    def baseline_metric(self):
        """The current baseline's metric (ledger.baseline_of: the latest hardware epoch's), None before one."""
        return (ledger.baseline_of(self.history) or {}).get("metric")

    @property
    def baseline_due(self):
        """Whether a baseline is measured before any candidate: the tag has none yet, or its current hardware epoch
        (--new-hardware) has none (a kill before it was recorded leaves it due)."""
        base = ledger.baseline_of(self.history)
        return base is None or base.get("hardware_epoch", 1) < self.hardware_epoch

    @property
    def next_n(self):
        """The number of the next experiment."""
        return len(self.history)       # the baseline is experiment 0


def read_tag(target, tag):
    """The TagState of `tag` from <target>/events.jsonl (a line torn by a kill is skipped; no file: an empty tag),
    read only. Raises OSError when the file cannot be read."""
    return tag_state(ledger.read_events(target / ledger.EVENTS), tag)


@dataclasses.dataclass
class TagState(Derived):
    """A tag's position rebuilt from its events (see the order of operations in the module docstring)."""
    history: list           # the tag's "experiment" events, in order (the baseline is n = 0)
    kept: list              # those with status keep
    cost_usd: float         # LLM spend and tokens so far (the "propose" events)
    input_tokens: int
    output_tokens: int
    stale_runs: list        # the "run" events of training runs started but not ended by the last invocation
    rule: dict | None       # what the tag recorded of its verdict rule (verdict.recorded_of): its baseline's (older
                            # tags: their first start event's; verdict "margin" before the paired rule), None
                            # before the baseline is recorded (or not recorded at all)
    hardware_epoch: int = 1  # the tag's current hardware epoch (its latest "hardware" event's)
    profile: str | None = None  # the profile of its data, as its latest start recorded it (latest_profile)


def tag_state(all_events, tag):
    """The TagState of `tag` from every event of the file."""
    mine = [e for e in all_events if e.get("tag") == tag]
    history = schema.of(mine, Event.EXPERIMENT)
    proposals = schema.of(mine, Event.PROPOSE)
    starts = [i for i, e in enumerate(mine) if e.get("event") == Event.START]
    ends = collections.Counter(ledger.run_key(e) for e in mine[starts[-1] if starts else 0:] if e.get("event") == Event.RUN_END)
    stale = []                              # the last invocation's runs without their run_end (several devices: many)
    for e in mine[starts[-1] if starts else 0:]:
        if e.get("event") == Event.RUN:
            if ends[ledger.run_key(e)]:
                ends[ledger.run_key(e)] -= 1
            elif e.get("pgid") is not None:
                stale.append(e)
    ruled = [e for e in (history[:1] + schema.of(mine, Event.START)) if "confirm" in e]
    rule = None
    if history and ruled:
        rule = verdict.recorded_of(ruled[0])
    return TagState(history=history, kept=[e for e in history if e["status"] == "keep"],
                    cost_usd=sum(e.get("cost_usd", 0.0) for e in proposals),
                    input_tokens=sum(e.get("input_tokens", 0) for e in proposals),
                    output_tokens=sum(e.get("output_tokens", 0) for e in proposals),
                    stale_runs=stale, rule=rule,
                    hardware_epoch=(schema.last(mine, Event.HARDWARE) or {}).get("epoch", 1),
                    profile=latest_profile(mine, tag))


def latest_profile(events, tag):
    """The data profile tag `tag`'s latest start recorded (`prepare.py --check`'s `profile:`), None before any did."""
    return next((e["profile"] for e in reversed(schema.of(events, Event.START, tag=tag)) if e.get("profile")), None)


