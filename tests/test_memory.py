"""The search's memory (harness/propose/memory.py), the gate and the outer loop (harness/propose/outer.py) and search mechanisms
(harness/propose/mechanisms.py), through agent.py's loop with a scripted LLM that behaves like the Bilevel paper's plain
loop: it proposes the same two changes over and over, and follows the prompt only when its favourite is refused."""

import json
import re
import types

import git
import pytest

import agent
from agent_target import STRICT, edit, make_noisy_target
from helpers import events, require_bwrap, rows
from harness.propose import memory
from harness.propose.memory import Change, change_of, families_of, value_of
from harness.judge.verdict import Rule
from harness.tag.session import Caches
from llm_server import ScriptedLLM


def flat_target(root):
    """The noisy stand-in target with its noise taken out: its 30 constants C00..C29 change nothing, so every
    experiment measures the baseline's val_bpb and is a discard (nothing is ever kept)."""
    target = make_noisy_target(root)
    train = target / "train.py"
    train.write_text(train.read_text().replace("offset = -gain + noise - 0.008", "offset = -gain - 0.008"))
    git.Repo(root).git.commit("-qam", "no noise")
    return target


@pytest.fixture
def noisy(tmp_path, monkeypatch):
    """flat_target, with its data "prepared" (and the evaluation data a mechanism must not read)."""
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "ready").touch()
    (tmp_path / "cache" / "val.txt").write_text("the evaluation data")
    return flat_target(tmp_path / "repo")


# ---------------------------------------------------------------------------
# What a proposal changes
# ---------------------------------------------------------------------------

TRAIN = '''import torch
DEPTH = 8
MATRIX_LR = 0.04
WINDOW_PATTERN = "SSSL"
if PROFILE == "cpu":
    TOTAL_BATCH_SIZE = 2**14

class CausalSelfAttention:
    def forward(self, x):
        y = x
        return y

def make_optimizer(model):
    lr = 1
    return lr

for step in range(10):
    loss = 1.0
'''


def test_a_change_is_its_moves_and_families():
    def changed(old, new):
        return change_of(TRAIN, TRAIN.replace(old, new))
    assert changed("DEPTH = 8", "DEPTH = 10") == Change(("DEPTH up",), ("DEPTH",), "-DEPTH = 8\n+DEPTH = 10")
    assert changed("MATRIX_LR = 0.04", "MATRIX_LR = 4e-2 # same").moves == ()      # the same value written another way
    assert changed("TOTAL_BATCH_SIZE = 2**14", "TOTAL_BATCH_SIZE = 2**13").moves == ("TOTAL_BATCH_SIZE down",)
    assert changed('"SSSL"', '"SSLL"').moves == ("WINDOW_PATTERN = \"SSLL\"",)
    assert changed("        y = x\n", "        y = x * 2\n") == Change(
        ("code: CausalSelfAttention.forward",), ("code: attention",), "-y = x\n+y = x * 2")
    assert changed("    lr = 1\n", "    lr = 2\n").families == ("code: optimizer",)
    assert changed("    loss = 1.0\n", "    loss = 2.0\n").moves == ("code: main loop: loss = 1.0",
                                                               "code: main loop: loss = 2.0")
    both = changed("DEPTH = 8\n", "DEPTH = 4\nimport math\n")
    assert both.moves == ("DEPTH down", "code: main loop: import math")
    assert both.families == ("DEPTH", "code: main loop")
    broken = change_of(TRAIN, TRAIN.replace("        return y", "        return y +"))   # syntax-broken: lines only
    assert broken.moves == ("code: CausalSelfAttention.forward",)
    assert change_of(TRAIN, TRAIN).moves == () and change_of(TRAIN, TRAIN).words() == "nothing"
    assert families_of(TRAIN)[:4] == ["DEPTH", "MATRIX_LR", "WINDOW_PATTERN", "TOTAL_BATCH_SIZE"]
    assert (value_of("2**19"), value_of("8 * 1024"), value_of("-1e-3"), value_of("'a'"), value_of("9**9**9")) == (
        524288.0, 8192.0, -0.001, None, None)


def test_what_the_environment_left_unjudged_is_neither_tabu_nor_a_try_of_its_family():
    """Three experiments that raised LR: a discard that judged it (0.25 worse), one not judged (its confirmation over
    the wall-time allowance twice: a discard of kind overtime, its first run 0.5 better) and a first run lost with
    its Ray worker. Only the judged one is tabu and counts as a try of the family LR (reward 0, gain -0.25)."""
    def experiment(n, status, metric, kind):
        return dict(n=n, status=status, metric=metric, base_metric=2.0, kind=kind, description=f"raise LR {n}")
    history = [dict(n=0, status="keep", metric=2.0, kind="ok"), experiment(1, "discard", 2.25, "ok"),
               experiment(2, "discard", 1.5, "overtime"), experiment(3, "crash", 0.0, "lost")]
    lr_up = Change(("LR up",), ("LR",), "")
    s = types.SimpleNamespace(history=history, tag=types.SimpleNamespace(goal="min"),
                              cache=Caches(changes={0: Change(), 1: lr_up, 2: lr_up, 3: lr_up}), best_metric=2.0,
                              rule=Rule("min", confirm=1, noise_sd=0.25, noise_runs=3))
    assert [e["n"] for e, _ in memory.tabu_list(s, 10)] == [1]
    assert memory.family_stats(s) == {"LR": (1, 0.0, -0.25)}

# ---------------------------------------------------------------------------
# The plain loop's LLM
# ---------------------------------------------------------------------------


class PlainLoop:
    """An LLM that proposes the same two changes (C00 up, C01 up, with a new value each time, so that no train.py
    repeats byte for byte) in turn; when an answer is refused, it proposes in the family the prompt names for it
    (a constant: one step up; a code family: a new function or line named after it). Waves: one idea per family
    named. Outer-loop questions get `guidance` and the four rounds `rounds` (the last one's text: the module)."""

    def __init__(self, guidance="Try the constants never tried.", module=None):
        self.turn, self.guidance, self.module, self.favourites = 0, guidance, module, 0

    def __call__(self, messages):
        first, last = messages[0]["content"], messages[-1]["content"]
        if first.startswith("You oversee") and "Round 1 of 4" in first:       # the four rounds of a mechanism
            return self.module if "Round 4 of 4" in last and self.module is not None else "A thought."
        if first.startswith("You oversee"):                                   # the outer loop's guidance
            return self.guidance
        self.turn += 1
        train = re.search(r"# Current train.py\n```python\n(.*?)```", first, re.S).group(1)
        picks = re.findall(r"idea \d+: ([^;.]+)", first) or re.findall(r"in the family (.+?) \(", first)
        if len(messages) == 1 and not picks[1:]:       # its favourites, whatever the prompt says
            self.favourites += 1
            name = ("C00", "C01")[self.favourites % 2 == 0]
            return self.step(train, name, 0.5 * self.favourites)
        if len(messages) > 3:                          # refused twice: a constant of its own choice
            return self.step(train, f"C{20 + self.turn % 10:02d}", 0.25)
        return "".join(self.follow(train, family, self.turn * 10 + i) for i, family in enumerate(picks))

    def follow(self, train, family, k):
        if not family.startswith("code: "):
            return self.step(train, family, 0.25)
        name = family[6:].replace(" ", "_") + f"_probe_{k}"
        line = f"{name} = {k}" if family == "code: main loop" else f"def {name}():\n    return {k}"
        return edit(f"code {family[6:]} {k}", "gain = 0.0", f"{line}\ngain = 0.0")

    @staticmethod
    def step(train, name, by):
        value = float(re.search(rf"(?m)^{name} = (.*)$", train).group(1))
        return edit(f"raise {name}", f"{name} = {value}", f"{name} = {value + by:g}")


def loop(target, llm, *extra, n=10):
    return agent.main(["--tag", "t", "--target", str(target), "--timeout", "30", "--retry-base-delay", "0.01",
                       *STRICT, "--no-holdout", "--proposer", "anthropic", "--base-url", llm.anthropic_url,
                       "--max-experiments", str(n), *extra])


def new_family_share(history):
    """The share of experiments after the baseline whose families none of the earlier experiments touched."""
    seen, new = set(), 0
    for e in history[1:]:
        new += not set(e["families"]) & seen
        seen |= set(e["families"])
    return new / (len(history) - 1)


def test_the_plain_loops_repeats_are_refused_and_it_explores(noisy):
    """The scripted plain loop gets its repeats refused (the tabu names the experiment), follows the bandit's
    family, and after 10 experiments >= 80 % of what ran came from a family not tried before; without the memory
    (--tabu 0 --explore off) the same LLM spends 10 experiments on 2 families."""
    with ScriptedLLM([PlainLoop()] * 40) as llm:
        assert loop(noisy, llm, "--no-speculate") == 0
    history = events(noisy, "experiment")
    assert len(history) == 11 and all(e["status"] == "discard" for e in history[1:])
    assert [e["moves"] for e in history[1:3]] == [["C00 up"], ["C01 up"]]
    share = new_family_share(history)
    assert share >= 0.8, [e["families"] for e in history]
    refused = events(noisy, "refused")
    assert refused and {e["rule"] for e in refused} == {"tabu"}
    assert refused[0]["repeats"] == 1 and refused[0]["moves"] == ["C00 up"]
    first_repair = next(b for _, b, _ in llm.requests if len(b["messages"]) > 1)   # #3: C00 up again, sent back
    repair, prompt = first_repair["messages"][-1]["content"], first_repair["messages"][0]["content"]
    assert repair.startswith("Your answer was rejected: it repeats the change of experiment #1 (discard: raise C00):"
                             " C00 up. That change is tabu for the next 10 discards and crashes")
    assert ("Tabu (refused: the changes of the last 2 discards and crashes; the opposite direction is allowed): "
            "C01 up (#2); C00 up (#1)") in prompt
    asked = [e.get("asked_family") for e in history[1:]]
    assert all(asked) and sum(a in e["families"] for a, e in zip(asked, history[1:])) >= 8
    assert {f for e in history[1:] for f in e["families"]} >= {"code: attention", "C02"}   # constants and code in turn

    plain = flat_target(noisy.parent / "plain")
    with ScriptedLLM([PlainLoop()] * 40) as llm:
        assert loop(plain, llm, "--no-speculate", "--tabu", "0", "--explore", "off") == 0
    history = events(plain, "experiment")
    assert len(history) == 11 and new_family_share(history) == 0.2 and not events(plain, "refused")
    assert "# Exploration" in llm.requests[0][1]["messages"][0]["content"]      # the section, with no pick named
    assert "in the family" not in llm.requests[0][1]["messages"][0]["content"]
    print(f"new-family share: memory on {share:.2f}, off 0.20")


def test_a_wave_spreads_over_families_and_a_resume_keeps_the_memory(noisy):
    """--devices cpu:2: each wave names two different families, one per idea; a second invocation restores the
    tenure from the ledger (3, given to the first) and refuses a repeat of the first invocation's discard."""
    with ScriptedLLM([PlainLoop()] * 40) as llm:
        assert loop(noisy, llm, "--devices", "cpu:2", "--tabu", "3", n=6) == 0
    waves = [re.findall(r"idea \d+: ([^;.]+)", b["messages"][0]["content"]) for _, b, _ in llm.requests]
    waves = [w for w in waves if w]
    assert waves and all(len(set(w)) == len(w) == 2 for w in waves)
    history = events(noisy, "experiment")
    assert len(history) == 7
    assert [e["tabu"] for e in events(noisy, "memory")] == [3]
    with ScriptedLLM([PlainLoop()] * 40) as llm:
        assert loop(noisy, llm, "--no-speculate", n=8) == 0
    first = llm.requests[0][1]["messages"][0]["content"]
    assert "the last 3 discards and crashes" in first
    assert [e["tabu"] for e in events(noisy, "memory")] == [3]           # restored, not recorded again
    assert len(events(noisy, "experiment")) == 9


# ---------------------------------------------------------------------------
# The outer loop and search mechanisms
# ---------------------------------------------------------------------------

VALID = '''
def review(proposal, history):
    refuse = bool({"C02", "C03", "C04"} & set(proposal["families"]))
    return {"id": proposal["id"], "accept": not refuse, "reason": "C02-C04 are off limits" if refuse else "ok"}

def guidance(history):
    print("debug output goes to the log")
    return "Mechanism says: try C05."
'''

BAD = {
    "crash": ("def review(proposal, history):\n    raise ValueError('boom')\n", "review() raised ValueError: boom"),
    "slow": ("def review(proposal, history):\n    while True:\n        pass\n", "review() took over 2 s"),
    "not json": ("def review(proposal, history):\n    return {'id': proposal['id'], 'accept': {1, 2}}\n",
                 "the answer is not JSON"),
    "garbage": ("import os\ndef review(proposal, history):\n    for fd in range(1, 10):\n        try:\n"
                "            os.write(fd, b'garbage\\n')\n        except OSError:\n            pass\n"
                "    return {'id': proposal['id'], 'accept': True, 'reason': ''}\n",
                "it printed something that is not the protocol's JSON: 'garbage'"),
    "another proposal": ("def review(proposal, history):\n    return {'id': 'p999', 'accept': True, 'reason': ''}\n",
                         "review() answered for proposal 'p999', but was asked about 'p1'"),
    "refuses all": ("def review(proposal, history):\n    return {'id': proposal['id'], 'accept': False, "
                    "'reason': 'no'}\n", "it would have refused 2 of the last 2 proposals"),
    "missing package": ("import no_such_package_xyz\ndef guidance(history):\n    return ''\n",
                        "it does not load: ModuleNotFoundError: No module named 'no_such_package_xyz'"),
    "writes": ("def guidance(history):\n    open({repo!r} + '/PWNED', 'w').write('x')\n    return ''\n",
               "guidance() raised FileNotFoundError"),                  # the repository is not even in its view
    "reads the evaluation data": ("def guidance(history):\n    return open({val!r}).read()\n",
                                  "guidance() raised FileNotFoundError"),
    "socket": ("import socket\ndef guidance(history):\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
               "    return ''\n", "guidance() raised"),
    "reads a key": ("import os\ndef guidance(history):\n    return os.environ['ANTHROPIC_API_KEY']\n",
                    "guidance() raised KeyError: 'ANTHROPIC_API_KEY'"),
    "forks": ("import os\ndef review(proposal, history):\n    os.fork()\n", "review() raised PermissionError"),
    "no alarm": ("import signal, time\ndef review(proposal, history):\n    signal.setitimer(signal.ITIMER_REAL, 0)\n"
                 "    time.sleep(30)\n", "it overran 9 s in all (killed)"),
    "deep json": ("import os\ndef guidance(history):\n    os.write(3, b'[' * 100000 + b']' * 100000 + b'\\n')\n"
                  "    os._exit(0)\n", "it printed something that is not the protocol's JSON: '[[["),
    "two answers": ("import os\ndef guidance(history):\n    os.write(3, b'{\"id\": 0, \"result\": 1}\\n')\n"
                    "    return 'x'\n", "it answered 2 times to 1 calls"),
    "lone surrogate": ("def guidance(history):\n    return 'try deeper \\ud800'\n",
                       "guidance() holds '\\ud800', not text the prompt can carry"),
    "no functions": ("x = 1\n", "it defines neither review(proposal, history) nor guidance(history) at top level"),
    "no code": (None, "the answer holds no ```python block"),
}


def design_answer(module):
    return "No module today." if module is None else f"Here it is:\n```python\n{module}```\n"


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_mechanism_is_rejected_with_its_reason(noisy, case, monkeypatch):
    """--outer-every 1: step 1 (guidance) after #1, step 2 designs a mechanism after #2; each bad one is rejected
    with the reason, and nothing it tried reached the repository, results.tsv or events.jsonl."""
    require_bwrap()
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-secret-key-1234567890")
    module, words = BAD[case]
    with ScriptedLLM([]) as llm:
        if module is not None:
            module = module.replace("{repo!r}", repr(str(noisy))).replace("{port}", str(llm.server.server_port))
            module = module.replace("{val!r}", repr(str(noisy.parent.parent / "cache" / "val.txt")))
        llm.script = [PlainLoop(module=design_answer(module))] * 40
        assert loop(noisy, llm, "--no-speculate", "--outer-every", "1", n=3) == 0
    mechanisms = events(noisy, "mechanism")
    assert [(e["id"], e["action"]) for e in mechanisms] == [("m1", "proposed"), ("m1", "rejected")]
    assert words in mechanisms[1]["reason"], mechanisms[1]["reason"]
    assert not (noisy / "PWNED").exists() and len(rows(noisy)) == 4
    assert all(e["event"] != "experiment" or e["n"] <= 3 for e in events(noisy))
    repo = git.Repo(noisy)
    if module is not None:                  # committed for review, with its dialogue, under the tag's refs
        ref = "refs/autoresearch/t/mechanisms/m1"
        assert repo.git.show(f"{ref}:mechanism.py") == module.rstrip("\n")
        assert "## generate" in repo.git.show(f"{ref}:dialogue.md")
        assert mechanisms[0]["ref"] == ref
    assert "sk-ant-secret" not in (noisy / "events.jsonl").read_text()


def test_a_valid_mechanism_is_activated_steers_refuses_then_fails_and_is_deactivated(noisy, capsys):
    """The valid module is activated after outer step 2; its guidance reaches the prompt, its refusal goes back as
    a repair; a resume keeps it active; when it later fails (here: a history longer than 4), it is deactivated with
    an event and a line and the search goes on."""
    require_bwrap()
    module = VALID.replace("    refuse =", '    if len(history) > 4:\n        raise RuntimeError("too long")\n'
                                           "    refuse =")
    with ScriptedLLM([PlainLoop(module=design_answer(module))] * 60) as llm:
        assert loop(noisy, llm, "--no-speculate", "--outer-every", "1", n=3) == 0
    actions = [(e["id"], e["action"]) for e in events(noisy, "mechanism")]
    assert actions == [("m1", "proposed"), ("m1", "activated")]
    assert "search mechanism m1 activated (review, guidance" in capsys.readouterr().out
    outer = events(noisy, "outer")
    assert [(e["step"], e["guidance"]) for e in outer] == [(1, "Try the constants never tried."),
                                                           (2, "Try the constants never tried.")]
    with ScriptedLLM([PlainLoop(module=design_answer(module))] * 60) as llm:   # resumed: m1 is active again
        assert loop(noisy, llm, "--no-speculate", "--outer-every", "1", n=6) == 0
    prompts = [b["messages"][0]["content"] for _, b, _ in llm.requests if "# Current train.py" in
               b["messages"][0]["content"]]
    assert "Guidance (search mechanism m1):\nMechanism says: try C05." in prompts[0]
    deactivated = [e for e in events(noisy, "mechanism") if e["action"] == "deactivated" and e["id"] == "m1"]
    assert len(deactivated) == 1 and "review() raised RuntimeError: too long" in deactivated[0]["reason"]
    assert "search mechanism m1 deactivated: review() raised RuntimeError: too long; the search goes on without it" \
        in capsys.readouterr().out
    assert len(events(noisy, "experiment")) == 7
    history = events(noisy, "experiment")
    assert any("m1" in e.get("shaped_by", []) for e in history)


def test_the_mechanism_refuses_and_report_lists_it(noisy, capsys):
    """A mechanism's refusal is a "refused" event naming it and a repair; report.py lists the mechanism, what it
    refused and the experiments it shaped."""
    require_bwrap()
    import report
    with ScriptedLLM([PlainLoop(module=design_answer(VALID))] * 60) as llm:
        assert loop(noisy, llm, "--no-speculate", "--outer-every", "1", n=5) == 0
    refused = [e for e in events(noisy, "refused") if e["rule"] == "mechanism m1"]
    assert refused and "C02-C04 are off limits" in refused[0]["reason"]
    repairs = [b["messages"][-1]["content"] for _, b, _ in llm.requests if len(b["messages"]) > 1]
    assert any("the search mechanism m1 refused it: C02-C04 are off limits" in r for r in repairs)
    capsys.readouterr()
    assert report.main([str(noisy / "results.tsv")]) == 0
    out = capsys.readouterr().out
    shaped = sum("m1" in e.get("shaped_by", []) for e in events(noisy, "experiment"))
    assert shaped == 3
    assert re.search(rf"mechanism m1 +activated after #2; refused {len(refused)}, shaped 3 experiments \(0 kept, best "
                     r"gain \+0\.000000\); git show refs/autoresearch/t/mechanisms/m1:mechanism.py", out), out


def test_outer_flags_and_unusable_answers(noisy, capsys):
    """--outer-every 0, negative, or with a sampler, and --tabu or --explore with a sampler: exit 2 naming the problem;
    an empty guidance answer is logged and the loop goes on."""
    for bad in ("0", "-2"):
        with pytest.raises(SystemExit) as e:
            agent.main(["--tag", "t", "--target", str(noisy), "--proposer", "anthropic", "--outer-every", bad])
        assert e.value.code == 2
        assert "--outer-every" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        agent.main(["--tag", "t", "--target", str(noisy), "--proposer", "tpe", "--outer-every", "3"])
    assert "the outer loop asks an LLM, and --proposer is tpe" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        agent.main(["--tag", "t", "--target", str(noisy), "--proposer", "random", "--tabu", "3", "--explore", "off"])
    assert "--tabu, --explore: the memory is the LLM proposers'" in capsys.readouterr().err
    with ScriptedLLM([PlainLoop(guidance="")] * 20) as llm:
        assert loop(noisy, llm, "--no-speculate", "--outer-every", "1", n=3) == 0
    outer = events(noisy, "outer")
    assert [(e["step"], e["guidance"], e["error"][:30]) for e in outer] == [
        (1, None, "the LLM's guidance was empty: "), (2, None, "the LLM's guidance was empty: ")]
    assert [e["action"] for e in events(noisy, "mechanism")] == ["proposed", "rejected"]
    assert len(events(noisy, "experiment")) == 4
    spent = [e for e in events(noisy, "propose") if e.get("outer")]
    assert [e["round"] for e in spent] == ["guidance", "guidance", "explore", "critique", "specify", "generate"]
    assert json.loads((noisy / "events.jsonl").read_text().splitlines()[-1])["event"] == "stop"
