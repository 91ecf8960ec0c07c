"""
Noise-aware verdicts, offline, on a stand-in train.py whose val_bpb is 1.0 - gain + Gaussian noise of known sd (0.01)
seeded by AUTORESEARCH_SEED, and whose constants change nothing (tests/agent_target.NOISY_TRAIN): the
baseline runs measure the noise floor; a no-op is (almost) never kept with confirmation, often without; a real gain of
3 sd is kept.
"""

import statistics

import agent
from agent_target import NOISE_SD, edit, make_noisy_target
from llm_server import ScriptedLLM
from test_agent import events, rows


def loop(target, *extra):
    """The loop with the random proposer on tag t."""
    return agent.main(["--tag", "t", "--target", str(target), "--timeout", "20", "--proposer", "random", *extra])


def test_five_baseline_runs_measure_the_noise_floor(tmp_path, monkeypatch, capsys):
    """The sd of 5 draws is itself noisy (about 35 % relative spread), so three independent draws of the noise
    (salts 0, 1, 2) are pooled: their root-mean-square sd is within 30 % of the true 0.01."""
    measured = []
    for salt in range(3):
        root = tmp_path / str(salt)
        monkeypatch.setenv("AUTORESEARCH_CACHE", str(root / "cache"))
        (root / "cache").mkdir(parents=True)
        (root / "cache" / "ready").touch()
        target = make_noisy_target(root / "repo", salt)
        assert loop(target, "--baseline-runs", "5", "--max-experiments", "0") == 0
        baseline = events(target, "experiment")[0]
        assert [e["seed"] for e in events(target, "run")] == [0, 1, 2, 3, 4] and len(baseline["runs"]) == 5
        assert baseline["noise_sd"] == statistics.stdev(baseline["runs"])
        assert abs(baseline["metric"] - statistics.fmean(baseline["runs"])) < 1e-12
        assert rows(target)[0].split("\t")[1:] == [f"{baseline['metric']:.6f}", "0.5", "keep", "baseline (5 runs)"]
        assert f"noise floor: val_bpb sd {baseline['noise_sd']:.6f} over 5 seeds" in capsys.readouterr().out
        measured.append(baseline["noise_sd"])
    pooled = statistics.fmean(sd ** 2 for sd in measured) ** 0.5
    assert abs(pooled - NOISE_SD) <= 0.3 * NOISE_SD, measured


def test_no_op_proposals_are_not_kept_with_confirmation_but_are_without(tmp_path, monkeypatch):
    """50 random proposals with a true gain of 0, in three independent draws of the noise (salts 0, 1, 2): at most 2
    kept per 50 with the default verdict; visibly more with karpathy's strict single-run ratchet (one baseline run,
    --confirm 0)."""
    kept = {"noise-aware": [], "strict": []}
    for salt in range(3):
        for mode, flags in (("noise-aware", []), ("strict", ["--baseline-runs", "1", "--confirm", "0"])):
            root = tmp_path / f"{mode}-{salt}"
            monkeypatch.setenv("AUTORESEARCH_CACHE", str(root / "cache"))
            (root / "cache").mkdir(parents=True)
            (root / "cache" / "ready").touch()
            target = make_noisy_target(root / "repo", salt)
            assert loop(target, "--max-experiments", "50", *flags) == 0
            history = events(target, "experiment")
            assert len(history) == 51 and len(rows(target)) == 51
            kept[mode].append(sum(e["status"] == "keep" for e in history[1:]))
            for e, row in zip(history[1:], rows(target)[1:]):     # a confirmed candidate's row says so
                assert row.endswith(" (2 runs)") == (len(e.get("runs") or []) == 2), row
    print("kept per draw of the noise:", kept)
    assert max(kept["noise-aware"]) <= 2, kept
    assert sum(kept["strict"]) >= 3 * max(1, sum(kept["noise-aware"])), kept


def test_a_true_gain_of_three_sd_is_kept_after_its_confirmation(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "ready").touch()
    target = make_noisy_target(tmp_path / "repo")
    with ScriptedLLM([edit("a real gain of 3 sd", "gain = 0.0", "gain = 0.03")]) as llm:
        assert agent.main(["--tag", "t", "--target", str(target), "--timeout", "20", "--proposer", "anthropic",
                           "--base-url", llm.anthropic_url, "--max-experiments", "1"]) == 0
    baseline, gain = events(target, "experiment")
    assert gain["status"] == "keep" and len(gain["runs"]) == 2
    assert [e["seed"] for e in events(target, "run") if e["n"] == 1] == [1000, 1001]
    assert baseline["metric"] - gain["metric"] > 2 * baseline["noise_sd"]
    assert rows(target)[1].endswith("\tkeep\ta real gain of 3 sd (2 runs)")


def test_the_prompt_carries_deltas_near_misses_and_asks_what_an_idea_builds_on(target):
    """With --margin 0.05 on the deterministic tiny target: a discard 0.001 worse than its base is a near-miss."""
    answers = [edit("raise LR", "LR = 0.04", "LR = 0.05"), edit("deeper", "DEPTH = 8", "DEPTH = 9"),
               edit("shallower", "DEPTH = 8", "DEPTH = 7")]
    with ScriptedLLM(answers) as llm:
        assert agent.main(["--tag", "t", "--target", str(target), "--timeout", "20", "--proposer", "anthropic",
                           "--base-url", llm.anthropic_url, "--baseline-runs", "1", "--margin", "0.05",
                           "--max-experiments", "3"]) == 0
    prompt = llm.requests[-1][1]["messages"][-1]["content"]
    assert "n\tdelta\tcommit\tval_bpb" in prompt and "\n1\t-0.100000\t" in prompt and "\n2\t+0.001000\t" in prompt
    assert "Near-misses (discarded within the noise margin 0.050000 of their base: worth combining):\n" \
           "#2 (+0.001000): deeper" in prompt
    assert '"(builds on #4, #9)"' in prompt and "noise" in llm.requests[-1][1]["system"][0]["text"]
