"""`agent.py try` (harness/propose/external.py): what its verdict block says of the rule, and which crashes --fix amends,
on the tiny target of tests/agent_target.py."""

import json

import agent
from agent_target import STRICT
from helpers import events
from harness.judge.verdict import Rule


def try_(target, *extra):
    """`agent.py try --tag t` in-process; returns its exit code."""
    return agent.main(["try", "--tag", "t", "--target", str(target), *extra])


def block(out):
    """The last verdict block's key: value lines as a dict of stripped values."""
    part = [p for p in out.split("---\n") if p.startswith("experiment:")][-1]
    return {k: v.strip() for k, v in (line.split(":", 1) for line in part.splitlines() if ":" in line)}


def test_the_verdict_block_states_the_rule_the_tag_is_judged_by(target, capsys):
    """--confirm 0: the block says the first run decides and there is no confirmation run (verdict.Rule's words)."""
    assert try_(target, "--timeout", "20", *STRICT, "--baseline") == 0
    shown = block(capsys.readouterr().out)
    assert shown["rule"] == Rule("min", confirm=0).words("val_bpb")
    assert "There is no confirmation run: the first run decides." in shown["rule"]
    assert shown["margin"].startswith("0.000000 (strict: --confirm 0 or one baseline run)")


def test_a_timed_out_experiment_is_its_verdict_and_gets_no_fix(target, capsys):
    """A run killed at the timeout ends with kind timeout (its event says so), and `--fix` refuses to amend it."""
    assert try_(target, "--timeout", "20", *STRICT, "--baseline") == 0
    path = target / "train.py"
    path.write_text(path.read_text().replace("SLEEP = 0.0", "SLEEP = 60.0"))
    assert try_(target, "--timeout", "12", *STRICT, "-m", "sleep long") == 0     # > the baseline's own ~3 s
    out = capsys.readouterr().out
    assert block(out)["status"] == "crash" and block(out)["reason"] == "timeout after 12s" and "to fix" not in block(out)
    last = [json.loads(line) for line in (target / "events.jsonl").read_text().splitlines()][-2:]
    assert [e["event"] for e in last] == ["experiment", "synced"] and last[0]["kind"] == "timeout"
    assert try_(target, "--timeout", "20", *STRICT, "--fix", "-m", "sleep less") == 2
    assert "ended timeout: that is its verdict" in capsys.readouterr().err
    path.write_text(path.read_text().replace("LR = 0.04", "LR = 0.05"))
    assert try_(target, *STRICT, "-m", "a higher LR") == 0       # no --timeout: the tag's, which its baseline kept
    assert [e["timeout_s"] for e in events(target, "run")][-1] == 20.0
