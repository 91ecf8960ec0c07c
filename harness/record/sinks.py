"""
HARNESS: where a recorded experiment goes after its event. experiment.record writes the "experiment" event (the
record: everything below is derived from it, and a resume restores what a kill cut short), then hands it to each
sink of SINKS in order; a sink's before() adds fields to the event before it is written (MLflow's run id), and
on_stop() runs when the loop stops. The order: the ledger's row and git note first, then the study, the artifacts
kept, the printed line, MLflow, the dashboard. Another sink (a webhook, W&B) is a Sink subclass appended to SINKS; a
sink's failure must be its own warning, never a lost experiment.
"""

from harness import console, gitops, ledger
from harness.judge import holdout
from harness.propose import search
from harness.record import dashboard, tracking


class Sink:
    """The protocol. before(s, n, idea) -> fields for experiment n's event; on_record(s, event, result, context): the
    event as written, its experiment.Result, and context {"log": its first run's log, "timeout_s": a run's hard
    limit now}; on_stop(s): the loop ended (its "stop" event is written; s None: it could not be, so only what runs
    in the background ends)."""

    def before(self, s, n, idea):
        return {}

    def on_record(self, s, event, result, context):
        pass

    def on_stop(self, s):
        pass


class Ledger(Sink):
    """The results.tsv row (karpathy's 5 columns) and the commit's git note, both derived from the event."""

    def on_record(self, s, event, result, context):
        gitops.add_note(s.repo, event["full_commit"], ledger.note_text(event, s.tag.metric))
        s.expect_ref(gitops.NOTES_REF)
        s.append_own(s.tag.target / ledger.RESULTS, ledger.results_row(event) + "\n")


class Study(Sink):
    """The search's study (a cache of the events) learns of the point, whoever proposed it."""

    def on_record(self, s, event, result, context):
        search.tell(s, event)


class Artifacts(Sink):
    """Only the baseline's and the best's model artifacts are kept (for the holdout)."""

    def on_record(self, s, event, result, context):
        holdout.prune_artifacts(s.tag.home, (0, ledger.baseline_of(s.history)["n"], s.best_event["n"]), len(s.history))


class Line(Sink):
    """The experiment's line on the terminal, and the status line's "last"."""

    def on_record(self, s, event, result, context):
        status = event["status"]
        metric = result.judged.metric if status != "crash" else None
        s.last = f"{status} {metric:.6f}" if metric is not None else status
        shown, best = f"{metric:.6f}" if metric is not None else "-", metric if status == "keep" else s.best_metric
        console.say(f"#{result.n:<4} {status:<7} {s.tag.metric} {shown:<10} best {best:.6f}  {result.wall:5.0f}s  "
                    f"{event['description']}")


class MLflow(Sink):
    """--mlflow: the experiment's MLflow run, started before the event (its id in the event) and filled in after."""

    def before(self, s, n, idea):
        return {"mlflow_run": tracking.begin(s, n, idea)}

    def on_record(self, s, event, result, context):
        tracking.finish(s, event.get("mlflow_run"), event, result, context["log"])


class Dashboard(Sink):
    """dashboard.html rewritten: live (reloading itself) while the loop runs, in the background dashboard.PAGE_GAP_S
    after a verdict (dashboard.Pacer); as a still page when it stops, after the last live rewrite."""

    def __init__(self):
        self.pacer = None                           # the session's dashboard.Pacer, made at its first record

    def on_record(self, s, event, result, context):
        if s.settings.command != "loop":            # `try`: one verdict, then the process ends
            dashboard.refresh(s, live=False)
            return
        if self.pacer is None or self.pacer.s is not s:
            self.on_stop(None)                      # another session of this process (the tests'): its pacer ends
            self.pacer = dashboard.Pacer(s)
        self.pacer.request(live=True, timeout_s=context["timeout_s"])

    def on_stop(self, s):
        if self.pacer is not None:
            self.pacer.stop()
            self.pacer = None
        if s is not None:
            dashboard.refresh(s, live=False)


SINKS = [Ledger(), Study(), Artifacts(), Line(), MLflow(), Dashboard()]


def stop(s, log_stop):
    """The loop ended: log_stop() writes its "stop" event, then each sink's on_stop(s); where log_stop raises, each
    sink's on_stop(None) (what runs in the background ends) before the error goes on."""
    try:
        log_stop()
    except BaseException:
        for sink in SINKS:
            sink.on_stop(None)
        raise
    for sink in SINKS:
        sink.on_stop(s)
