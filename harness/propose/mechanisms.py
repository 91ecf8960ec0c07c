"""
HARNESS: search mechanisms, the Python modules the outer loop's LLM writes (harness.propose.outer) to change how the
search searches. Owns their interface (INTERFACE: the words the LLM reads), running one in its own process inside the
sandbox (JSON in, JSON out, a time limit per call), validating it on the recorded trace before it is activated, and the
checks on every answer, whose failure deactivates it. A mechanism is never imported into the harness: it cannot touch
git, results.tsv or events.jsonl, read the data or an API key, or reach the network; it only answers.

    problem = validate(s, source)              # None: activate it; else why it is rejected
    answer = call(s, source, "review", ...)    # raises Failed (then it is deactivated, with an event and a line)
"""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from harness.propose import memory
from harness.run import processes, sandbox
from harness.ledger import has_metric
from harness.run.runner import interpreter

CALL_S = 2.0                    # the time limit of one call, seconds (loading the module included)
VALIDATE_LAST = 30              # validation replays the last this many proposals of the trace
MAX_REFUSED = 0.5               # ... and rejects a mechanism that would have refused more than this share of them
GUIDANCE_CHARS = 1500           # the longest guidance shown to the proposer
MAX_IN_A_ROW = 3                # a mechanism that refuses more proposals than this in a row is deactivated
REASON_CHARS = 300              # the longest refusal reason
MEMORY_BYTES = 2 * 2**30        # address space of a mechanism's process
OUTPUT_BYTES = 4 * 2**20        # what a mechanism's process may write to its output files (and each private tmpfs)
START_S = 5.0                   # what starting the sandbox and Python may take, besides the calls' CALL_S each

INTERFACE = f"""\
A search mechanism is one Python module (the standard library only; no other package is guaranteed) defining one or
both of these functions. Each call gets JSON data and must return JSON data within {CALL_S:g} seconds. It runs in a
sandbox: no network, a read-only filesystem, no repository, no data; it keeps no state between calls (every call
gets the whole history), and print() goes to a log, never to the harness.

def review(proposal, history):
    # proposal: {{"id": "p7", "n": 7, "description": "...", "moves": ["DEPTH up", "code: GPT.forward"],
    #             "families": ["DEPTH", "code: attention"], "diff": "<unified diff of train.py>"}}
    # history:  [{{"n": 1, "status": "keep|discard|crash", "delta": -0.01 or null (metric minus its base's),
    #              "gain": 0.01 (> 0 is better), "description": "...", "moves": [...], "families": [...]}}, ...]
    # returns {{"id": proposal["id"], "accept": true or false, "reason": "<one line, why>"}}
    # A refusal sends the proposal back to the proposer with the reason. Refuse sparingly: a mechanism that would
    # have refused more than {100 * MAX_REFUSED:.0f} % of the recorded proposals is not activated.

def guidance(history):
    # returns a string (at most {GUIDANCE_CHARS} characters) shown to the proposer before each proposal.
"""


class Failed(Exception):
    """A mechanism's call failed: crashed, timed out, or answered something invalid (the message says which)."""


def unavailable(s):
    """Why no mechanism can run here (the sandbox is off or does not work), or None."""
    if s.settings.sandbox == "off":
        return "a mechanism runs only in the sandbox, and --sandbox off is set"
    return None if (reason := sandbox.probe()) is None else f"a mechanism runs only in the sandbox: {reason}"


# ---------------------------------------------------------------------------
# What a mechanism reads
# ---------------------------------------------------------------------------


def history_json(s, upto=None):
    """The tag's experiments after the baseline (before experiment `upto` when given), as the interface shows them."""
    out = []
    for e in s.history[1:upto]:
        change = memory.change_at(s, e)
        measured = has_metric(e) and e.get("base_metric") is not None
        out.append({"n": e["n"], "status": e["status"], "description": e["description"],
                    "delta": round(e["metric"] - e["base_metric"], 9) if measured else None,
                    "gain": round(memory.gain(s, e), 9) if measured else None,
                    "moves": list(change.moves), "families": list(change.families)})
    return out


def proposal_json(key, n, description, change, diff):
    """One proposal as the interface shows it (key: its id, unique within a call)."""
    return {"id": key, "n": n, "description": description, "moves": list(change.moves),
            "families": list(change.families), "diff": diff[:8000]}


# ---------------------------------------------------------------------------
# Running one in the sandbox
# ---------------------------------------------------------------------------

# The program the sandboxed process runs: loads the module, answers each call as one JSON line on the protocol
# descriptor (a copy of stdout; the module's own stdout goes to stderr), and stops at the first failure. SIGALRM
# bounds each call; the harness kills the process group if that is not enough.
HOST = r"""
import importlib.util, json, os, resource, signal, sys, time
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), int(sys.argv[3])))
proto = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
request = json.load(sys.stdin)
limit = request["limit"]
class Late(BaseException):
    pass
def late(*args):
    raise Late()
signal.signal(signal.SIGALRM, late)
def answer(**fields):
    try:
        line = json.dumps(fields, allow_nan=False)
    except (TypeError, ValueError) as e:
        line = json.dumps({"id": fields.get("id"), "error": f"the answer is not JSON: {e}"[:300]})
    proto.write(line + "\n")
    proto.flush()
try:
    signal.setitimer(signal.ITIMER_REAL, limit)
    spec = importlib.util.spec_from_file_location("mechanism", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    signal.setitimer(signal.ITIMER_REAL, 0)
except Late:
    answer(id=None, error=f"loading it took over {limit:g} s")
    sys.exit(0)
except BaseException as e:
    signal.setitimer(signal.ITIMER_REAL, 0)
    answer(id=None, error=f"it does not load: {type(e).__name__}: {e}"[:300])
    sys.exit(0)
for call in request["calls"]:
    fn = getattr(module, call["fn"], None)
    if not callable(fn):
        answer(id=call["id"], error=f"it defines no function {call['fn']}()")
        break
    t0 = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, limit)
        result = fn(*call["args"])
        signal.setitimer(signal.ITIMER_REAL, 0)
    except Late:
        answer(id=call["id"], error=f"{call['fn']}() took over {limit:g} s")
        break
    except BaseException as e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        answer(id=call["id"], error=f"{call['fn']}() raised {type(e).__name__}: {e}"[:300])
        break
    answer(id=call["id"], result=result, seconds=round(time.monotonic() - t0, 4))
"""


def run(s, source, calls):
    """Run the module `source` in the sandbox on calls [(fn, args), ...]: their results, in order. Raises Failed
    with the reason at the first failure (it does not load, a call raised, took over CALL_S, answered something not
    JSON, or the process died, printed garbage on the protocol or overran the total time)."""
    if (reason := unavailable(s)) is not None:
        raise Failed(reason)
    folder = Path(tempfile.mkdtemp(prefix="mechanism-"))
    try:
        (folder / "mechanism.py").write_text(source)
        request = {"limit": CALL_S, "calls": [{"id": i, "fn": fn, "args": args} for i, (fn, args) in enumerate(calls)]}
        argv = sandbox.wrap([interpreter(), "-I", "-c", HOST, str(folder / "mechanism.py"), str(MEMORY_BYTES),
                             str(OUTPUT_BYTES)],
                            run_dir=None, expose=[folder], chdir=folder, scratch_bytes=OUTPUT_BYTES,
                            no_fork=True)
        lines = _spawn(argv, json.dumps(request), folder, CALL_S * len(calls) + START_S)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    answers = []
    for line in lines:
        try:
            answers.append(json.loads(line))
        except (ValueError, RecursionError):     # not JSON, or nested too deep to read
            raise Failed(f"it printed something that is not the protocol's JSON: {line[:120]!r}") from None
        if not isinstance(answers[-1], dict):
            raise Failed(f"it printed something that is not the protocol's JSON: {line[:120]!r}")
    errors = [a["error"] for a in answers if "error" in a]
    if errors:                                  # the host stops at the first failure: this is it
        raise Failed(str(errors[0])[:300])
    if len(answers) > len(calls):
        raise Failed(f"it answered {len(answers)} times to {len(calls)} calls")
    results = []
    for line, answer in zip(lines, answers):
        if type(answer.get("id")) is not int or answer["id"] != len(results):
            raise Failed(f"it answered out of turn: {line[:120]!r}")
        if not isinstance(answer.get("seconds"), (int, float)) or not 0 <= answer["seconds"] <= CALL_S:
            raise Failed(f"it answered without the time a call took, or over {CALL_S:g} s: {line[:120]!r}")
        results.append(answer.get("result"))
    if len(results) < len(calls):
        raise Failed("its process ended before answering every call (killed by a limit, or it exited)")
    return results


def _spawn(argv, request, folder, total_s):
    """Start the sandboxed process with a minimal environment (no secrets), the request on stdin; its output
    lines. Raises Failed when it overruns total_s (the process group is killed)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    out_path, err_path = folder / "out", folder / "err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        # a session of its own, registered: the strays of the runs in flight meanwhile never include it
        proc, token = processes.start(argv, env, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=folder)
        try:
            proc.communicate(request.encode(), timeout=total_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise Failed(f"it overran {total_s:g} s in all (killed)") from None
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            processes.done(token)
    return out_path.read_text(errors="replace").splitlines()


# ---------------------------------------------------------------------------
# The checks of its answers
# ---------------------------------------------------------------------------


def check_review(answer, key):
    """(accept, reason) of a review answer for proposal `key`; Failed when it is not a valid verdict on that one."""
    if not isinstance(answer, dict) or not isinstance(answer.get("accept"), bool):
        raise Failed(f"review() must return {{\"id\", \"accept\": true|false, \"reason\"}}, not {str(answer)[:120]!r}")
    if answer.get("id") != key:
        raise Failed(f"review() answered for proposal {str(answer.get('id'))[:40]!r}, but was asked about {key!r}")
    reason = answer.get("reason", "")
    if not isinstance(reason, str):
        raise Failed(f"review()'s reason must be a string, not {str(reason)[:60]!r}")
    return answer["accept"], " ".join(text(reason, "review()'s reason").split())[:REASON_CHARS]


def check_guidance(answer):
    """The guidance text; Failed when it is not a string of at most GUIDANCE_CHARS characters."""
    if not isinstance(answer, str) or len(answer) > GUIDANCE_CHARS:
        raise Failed(f"guidance() must return a string of at most {GUIDANCE_CHARS} characters, not "
                     f"{type(answer).__name__} of {len(str(answer))} characters")
    return text(answer, "guidance()").strip()


def text(words, what):
    """words if they are text the prompt can carry: valid Unicode (no lone surrogate: an SDK could not send it) with
    no control character but newlines and tabs; Failed otherwise."""
    bad = next((c for c in words if 0xD800 <= ord(c) <= 0xDFFF or (ord(c) < 32 and c not in "\n\t")
                or 0x7F <= ord(c) < 0xA0), None)
    if bad is not None:
        raise Failed(f"{what} holds {bad!r}, not text the prompt can carry")
    return words


def functions(source):
    """Which of review and guidance the module defines at top level (by its text: it is never imported here)."""
    return [fn for fn in ("review", "guidance") if re.search(rf"(?m)^def {fn}\s*\(", source)]


def validate(s, source):
    """Why the module must not be activated, or None: it defines neither function; it fails on the recorded trace
    (the last VALIDATE_LAST proposals, each with the history before it, and the guidance on the whole trace); or it
    would have refused more than MAX_REFUSED of those proposals."""
    fns = functions(source)
    if not fns:
        return "it defines neither review(proposal, history) nor guidance(history) at top level"
    past = [e for e in s.history[1:]][-VALIDATE_LAST:]
    calls = []
    if "review" in fns:
        calls += [("review", [proposal_json(f"p{e['n']}", e["n"], e["description"], memory.change_at(s, e), ""),
                              history_json(s, e["n"])]) for e in past]
    if "guidance" in fns:
        calls.append(("guidance", [history_json(s)]))
    try:
        results = run(s, source, calls)
        verdicts = [check_review(r, f"p{e['n']}") for r, e in zip(results, past)] if "review" in fns else []
        if "guidance" in fns:
            check_guidance(results[-1])
    except Failed as e:
        return str(e)
    refused = sum(not ok for ok, _ in verdicts)
    if verdicts and refused > MAX_REFUSED * len(verdicts):
        return (f"it would have refused {refused} of the last {len(verdicts)} proposals (more than "
                f"{100 * MAX_REFUSED:.0f} %)")
    return None
