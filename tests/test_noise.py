"""
Noise-aware verdicts, offline, on a stand-in train.py whose val_bpb is 1.0 - gain + Gaussian noise of known sd (0.01)
seeded by AUTORESEARCH_SEED, and whose constants change nothing (tests/agent_target.NOISY_TRAIN): the
baseline runs measure the noise floor; a no-op is (almost) never kept with confirmation, often without; a real gain of
3 sd is kept by the margin rule, one of half an sd by the paired rule, which keeps more of the small gains at the
same false-keep rate. The statistics over hundreds of experiments are the rules' arithmetic on the stand-in's draws:
they are simulated in-process with the same draws (agent_target.noisy_metric) and the real harness.judge.verdict.judge
and judge_paired, and short real loops check that the loop's runs, seeds and verdicts are exactly the simulated
ones.
"""

import re
import statistics
from pathlib import Path

import git
import pytest

import agent
import report
from harness.judge import verdict
from harness.propose import prompts
from harness.tag import opening
from harness.record.experiment import seed_of
from harness.run.runner import Outcome
from harness.judge.verdict import Rule, judge, judge_paired, pooled_of
from agent_target import NOISE_SD, STRICT, edit, make_noisy_target, noisy_metric
from llm_server import ScriptedLLM
from helpers import events, rows


MARGIN = ["--verdict", "margin"]      # the margin rule (the default before the paired rule)
SEED_BASE = 2                         # the tag's secret seed base in the simulations (the loop's is fixed to it)


def fixed_seed_base(monkeypatch, base=SEED_BASE):
    """The loop draws this tag seed base (opening.new_session's secrets.randbelow), so that its draws are known."""
    monkeypatch.setattr(opening.secrets, "randbelow", lambda n: base)


def loop(target, *extra):
    """The loop with the random proposer on tag t."""
    return agent.main(["--tag", "t", "--target", str(target), "--timeout", "20", "--no-speculate", "--proposer", "random", *extra])


def noisy_target(root, monkeypatch, salt=0):
    """make_noisy_target in root/repo with its data "prepared" in root/cache."""
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(root / "cache"))
    (root / "cache").mkdir(parents=True)
    (root / "cache" / "ready").touch()
    return make_noisy_target(root / "repo", salt)


def simulate(salt, experiments, baseline_runs=3, confirm=1, gain=0.0, rho=1.0, move=True, seed_base=SEED_BASE):
    """The loop's verdicts by the margin rule on `experiments` proposals of the noisy stand-in with this true gain (0:
    no-ops), in-process: the baseline's runs (seeds seed_of(seed_base, 0, run)), their mean the first best and their
    sd the rule's noise floor, then for each experiment n the real judge() on its first run (seed
    seed_of(seed_base, n, 0)) and its further runs, the best moving to a kept mean (when move). Experiment n's code is
    "n" (its share of the noise, rho < 1). Returns (the baseline's runs, [Verdict of experiment 1, 2, ...], [(n, seed)
    of every run in order])."""
    seeds = [(0, seed_of(seed_base, 0, run)) for run in range(baseline_runs)]
    runs = tuple(noisy_metric(salt, seed, 0.0, rho, "0") for _, seed in seeds)
    rule = Rule("min", confirm, None, statistics.stdev(runs) if len(runs) > 1 else None, len(runs))
    best, verdicts = statistics.fmean(runs), []
    for n in range(1, experiments + 1):
        def run_of(run):
            seeds.append((n, seed_of(seed_base, n, run)))
            return Outcome(commit="0" * 40, metric=noisy_metric(salt, seed_of(seed_base, n, run), gain, rho, str(n)),
                           memory_gb=0.0, seconds=0.0)
        verdicts.append(judge(run_of(0), run_of, rule, best))
        best = verdicts[-1].metric if verdicts[-1].status == "keep" and move else best
    return runs, verdicts, seeds


def simulate_paired(salt, gains, rho=1.0, seed_base=0, baseline_runs=3, confirm=3, move=True):
    """The paired rule's verdicts, in-process, on experiments whose train.py has these `gain` values (experiment n's
    code "n": its own draw of the code's share of the noise when rho < 1): the baseline's runs at seeds seed_base + r,
    each candidate's run r at the same seed, judged by the real judge_paired against the best's run at that seed (the
    best's draw, as the loop reuses its recorded runs), the best moving to a keep (when move). Returns (the
    baseline's runs, [Verdict of experiment 1, 2, ...], [(n, seed) of every candidate run in order])."""
    def metric(n, run, gain):
        return noisy_metric(salt, seed_base + run, gain, rho, str(n))
    base = tuple(metric(0, run, 0.0) for run in range(baseline_runs))
    rule = Rule("min", confirm, None, statistics.stdev(base), baseline_runs, verdict="paired")
    best, verdicts, seeds = (0, 0.0), [], []
    for n, gain in enumerate(gains, 1):
        def run_of(run):
            seeds.append((n, seed_base + run))
            return Outcome(commit="0" * 40, metric=metric(n, run, gain), memory_gb=0.0, seconds=0.0)

        def best_at(run, outcome):
            return metric(best[0], run, best[1]), False, ""
        pooled = pooled_of(rule, [(v.runs, v.best) for v in verdicts])
        verdicts.append(judge_paired(run_of(0), run_of, rule, best_at, pooled))
        best = (n, gain) if verdicts[-1].status == "keep" and move else best
    return base, verdicts, seeds


def test_five_baseline_runs_measure_the_noise_floor(tmp_path, monkeypatch, capsys):
    """The sd of 5 draws is itself noisy (about 35 % relative spread), so three independent draws of the noise
    (salts 0, 1, 2) are pooled: their root-mean-square sd is within 30 % of the true 0.01. The loop measures salt 0's
    (its seeds, runs, mean, sd, row and printed line); salts 1 and 2 are the same draws simulated."""
    target = noisy_target(tmp_path, monkeypatch, salt=0)
    fixed_seed_base(monkeypatch)
    assert loop(target, "--baseline-runs", "5", "--max-experiments", "0", *MARGIN) == 0
    baseline = events(target, "experiment")[0]
    assert [e["seed"] for e in events(target, "run")] == [seed_of(SEED_BASE, 0, run) for run in range(5)]
    assert len(baseline["runs"]) == 5
    assert baseline["runs"] == list(simulate(0, 0, baseline_runs=5)[0])
    assert baseline["noise_sd"] == statistics.stdev(baseline["runs"])
    assert abs(baseline["metric"] - statistics.fmean(baseline["runs"])) < 1e-12
    assert rows(target)[0].split("\t")[1:] == [f"{baseline['metric']:.6f}", "0.0", "keep", "baseline (5 runs)"]
    assert f"noise floor: val_bpb sd {baseline['noise_sd']:.6f} over 5 seeds" in capsys.readouterr().out
    measured = [statistics.stdev(simulate(salt, 0, baseline_runs=5)[0]) for salt in range(3)]
    assert measured[0] == baseline["noise_sd"]
    pooled = statistics.fmean(sd ** 2 for sd in measured) ** 0.5
    assert abs(pooled - NOISE_SD) <= 0.3 * NOISE_SD, measured


def test_no_op_proposals_are_not_kept_with_confirmation_but_are_without():
    """50 random proposals with a true gain of 0, in three independent draws of the noise (salts 0, 1, 2): at most 2
    kept per 50 with the default verdict; visibly more with karpathy's strict single-run ratchet (one baseline run,
    --confirm 0). Simulated (see simulate); test_the_loop_gives_the_simulated_verdicts runs the same on real runs."""
    kept = {"noise-aware": [], "strict": []}
    for salt in range(3):
        for mode, (baseline_runs, confirm) in (("noise-aware", (3, 1)), ("strict", (1, 0))):
            verdicts = simulate(salt, 50, baseline_runs, confirm)[1]
            assert len(verdicts) == 50 and {v.status for v in verdicts} <= {"keep", "discard"}
            assert all(len(v.runs) in ((1, 2) if confirm else (1,)) for v in verdicts)
            kept[mode].append(sum(v.status == "keep" for v in verdicts))
    print("kept per draw of the noise:", kept)
    assert max(kept["noise-aware"]) <= 2, kept
    assert sum(kept["strict"]) >= 3 * max(1, sum(kept["noise-aware"])), kept


def test_the_paired_rule_keeps_more_small_gains_at_a_lower_false_keep_rate():
    """Each edit judged against the baseline (the best does not move), 8 draws of the noise x 50 edits per true gain,
    noise sd 0.01 of which the seed decides rho = 0.9 (the rest is redrawn by any code change, as a real edit
    perturbs training): the paired rule (false-keep rate 2 %) keeps no more no-ops than 2 % and than the margin rule
    (2 sd, one confirmation), at least twice as many of the gains of 0.5, 1 and 1.5 noise sd, and stops a no-op after
    1.6 runs on average (its first paired verdicts, while it learns the paired sd, go on more often)."""
    kept, runs = {}, {}
    for gain in (0.0, 0.005, 0.01, 0.015):
        margin = [v for salt in range(8) for v in simulate(salt, 50, gain=gain, rho=0.9, move=False)[1]]
        paired = [v for salt in range(8) for v in simulate_paired(salt, [gain] * 50, rho=0.9, move=False)[1]]
        kept[gain] = [sum(v.status == "keep" for v in verdicts) for verdicts in (margin, paired)]
        runs[gain] = [statistics.fmean(len(v.runs) for v in verdicts) for verdicts in (margin, paired)]
    print("kept of 400 (margin, paired) by gain:", kept, "mean runs:", runs)
    assert kept[0.0][1] <= min(8, kept[0.0][0]), kept
    small = [sum(kept[gain][rule] for gain in (0.005, 0.01, 0.015)) for rule in (0, 1)]
    assert small[1] >= 2 * small[0], kept
    assert runs[0.0][1] <= 1.6, runs


def test_the_loop_pairs_each_run_with_the_best_at_its_seed(tmp_path, monkeypatch):
    """The paired rule in the real loop (its default): the baseline's runs at the tag's random seeds base, base+1,
    base+2; a no-op edit's first run repeats the baseline's first draw (the seed decides the stand-in's noise) and
    stops there; a gain of a tenth of a noise sd (which the margin rule discards; the stand-in's noise is all the
    seed's, so the differences are exact) is kept after 4 runs at the baseline's seeds, paired with the baseline's
    recorded runs there (the best runs only at the seed it never ran, the 4th). Every seed, run and verdict is the
    simulation's. (The seed base is drawn at random; the test fixes it at one whose draws take all 4 runs.)"""
    target = noisy_target(tmp_path, monkeypatch)
    fixed_seed_base(monkeypatch, 9)                                      # the tag's seed base: 9 (a keep at 4 runs)
    answers = [edit("a no-op", "C00 = 1.0", "C00 = 1.5"), edit("a tenth of an sd", "gain = 0.0", "gain = 0.001")]
    with ScriptedLLM(answers) as llm:
        assert agent.main(["--tag", "t", "--target", str(target), "--timeout", "20", "--no-speculate", "--proposer",
                           "anthropic", "--base-url", llm.anthropic_url, "--max-experiments", "2"]) == 0
    baseline, noop, gain = events(target, "experiment")
    base = baseline["seed_base"]
    assert base == 9 and baseline["verdict"] == "paired" and baseline["confirm"] == 3 and baseline["false_keep"] == 0.02
    runs, verdicts, seeds = simulate_paired(0, [0.0, 0.001], seed_base=base)
    best = [(n, seed) for n, seed in seeds if seed >= base + 3]        # the best's run at a seed it never ran
    assert [(e["n"], e["seed"]) for e in events(target, "run")] == \
        [(0, base), (0, base + 1), (0, base + 2)] + sorted(seeds + best, key=seeds.index)
    assert [(e["n"], e["seed"], e["run"]) for e in events(target, "run") if e.get("best")] == \
        [(n, seed, seed - base) for n, seed in best]
    assert [e["reason"] for e in events(target, "rerun_best")] == ["no run of the best at this seed yet"] * len(best)
    assert all(re.fullmatch(r"[0-9a-f]{16}", Path(e["cwd"]).name) for e in events(target, "run"))   # says no r
    assert baseline["runs"] == list(runs)
    draws = tuple(noisy_metric(0, base + run) for run in range(4))      # the best's (the baseline's) at its seeds
    assert runs == draws[:3] and [(v.status, v.best) for v in verdicts] == [("discard", draws[:1]), ("keep", draws)]
    assert [(e["status"], e["runs"], e["best_runs"], e["t"]) for e in (noop, gain)] == \
        [(v.status, list(v.runs), list(v.best), v.t) for v in verdicts]
    assert rows(target)[2].endswith("\tkeep\ta tenth of an sd (4 runs)")
    assert 0.001 < Rule("min", 1, None, baseline["noise_sd"], 3).margin      # under the margin rule's margin


SALT = 6385     # its first 3 no-ops: a confirmed discard, a confirmed keep, a first-run discard against the new best;
                # strictly: a keep, a discard, a keep on the new best (asserted below, from the simulation)


@pytest.mark.parametrize("mode", ["noise-aware", "strict"])
def test_the_loop_gives_the_simulated_verdicts(tmp_path, monkeypatch, mode):
    """3 no-op experiments through the real loop: every run's seed and metric, each verdict (status, runs, mean)
    and each row are the simulation's for the same draws."""
    flags, (baseline_runs, confirm) = (MARGIN, (3, 1)) if mode == "noise-aware" else (STRICT, (1, 0))
    runs, verdicts, seeds = simulate(SALT, 3, baseline_runs, confirm)
    paths = [(v.status, len(v.runs)) for v in verdicts]
    assert paths == ([("discard", 2), ("keep", 2), ("discard", 1)] if confirm else
                     [("keep", 1), ("discard", 1), ("keep", 1)])      # the draws exercise these paths of the rule
    target = noisy_target(tmp_path, monkeypatch, salt=SALT)
    fixed_seed_base(monkeypatch)
    assert loop(target, "--max-experiments", "3", *flags) == 0
    assert [(e["n"], e["seed"]) for e in events(target, "run")] == seeds
    assert [e["metric"] for e in events(target, "run_end")] == [noisy_metric(SALT, seed) for _, seed in seeds]
    baseline, *history = events(target, "experiment")
    assert baseline["runs"] == list(runs) and baseline["metric"] == statistics.fmean(runs)
    assert [(e["status"], tuple(e["runs"]), e["metric"]) for e in history] == \
        [(v.status, v.runs, v.metric) for v in verdicts]
    assert len(rows(target)) == 4
    for v, row in zip(verdicts, rows(target)[1:]):                    # a confirmed candidate's row says so
        assert row.split("\t")[1:4] == [f"{v.metric:.6f}", "0.0", v.status]
        assert row.endswith(" (2 runs)") == (len(v.runs) == 2), row
    kept = [e["full_commit"] for e in history if e["status"] == "keep"]
    assert git.Repo(target).commit("autoresearch/t").hexsha == kept[-1]


def test_the_margin_rules_seeds_follow_the_tags_secret_base_and_survive_a_resume(tmp_path, monkeypatch):
    """The margin rule's seeds tell train.py nothing: every run's is seed_of(the seed_base its tag's baseline
    recorded, n, run), none is 1000 n + run (which named the experiment and the run), no two are alike, and another
    tag's differ; a resume reads seed_base from the baseline's event (it draws none), so the experiment after it
    follows from the same one."""
    target = noisy_target(tmp_path, monkeypatch)
    assert loop(target, "--max-experiments", "1", *MARGIN) == 0
    assert loop(target, "--max-experiments", "2", *MARGIN) == 0                       # a resume
    assert loop(target, "--tag", "u", "--max-experiments", "0", *MARGIN) == 0        # another tag: its baseline
    base = {e["tag"]: e["seed_base"] for e in events(target, "experiment") if e["n"] == 0}
    runs = [(e["tag"], e["n"], e["run"], e["seed"]) for e in events(target, "run")]
    assert {(tag, n) for tag, n, _, _ in runs} == {("t", 0), ("t", 1), ("t", 2), ("u", 0)}
    assert [seed for *_, seed in runs] == [seed_of(base[tag], n, run) for tag, n, run, _ in runs]
    assert [e["seed"] for e in events(target, "run_end")] == [seed for *_, seed in runs]
    assert not any(seed == 1000 * n + run for _, n, run, seed in runs) and len({r[3] for r in runs}) == len(runs)
    assert base["t"] != base["u"] and all(0 <= r[3] < 2**31 for r in runs)


def test_a_true_gain_of_three_sd_is_kept_after_its_confirmation(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "ready").touch()
    target = make_noisy_target(tmp_path / "repo")
    fixed_seed_base(monkeypatch)        # fixed draws (a baseline sd of 0.0089): at some seed bases the 3 sd gain
    #                                     falls within an unluckily wide margin
    with ScriptedLLM([edit("a real gain of 3 sd", "gain = 0.0", "gain = 0.03")]) as llm:
        assert agent.main(["--tag", "t", "--target", str(target), "--timeout", "20", "--no-speculate", "--proposer", "anthropic",
                           "--base-url", llm.anthropic_url, "--max-experiments", "1", *MARGIN]) == 0
    baseline, gain = events(target, "experiment")
    assert gain["status"] == "keep" and len(gain["runs"]) == 2
    assert [e["seed"] for e in events(target, "run") if e["n"] == 1] == [seed_of(baseline["seed_base"], 1, run)
                                                                          for run in (0, 1)]
    assert baseline["metric"] - gain["metric"] > 2 * baseline["noise_sd"]
    assert rows(target)[1].endswith("\tkeep\ta real gain of 3 sd (2 runs)")
    capsys.readouterr()
    assert report.main([str(target)]) == 0                  # the report states the noise floor and draws its band
    out = capsys.readouterr().out
    assert f"noise floor  sd {baseline['noise_sd']:.6f} over 3 baseline runs" in out
    assert "a real gain of 3 sd (2 runs)" in out and (target / "progress.png").stat().st_size > 10_000
    assert f"runs: {gain['runs'][0]:.6f}, {gain['runs'][1]:.6f}" in out          # each kept commit's runs


def test_a_train_py_that_pins_a_lucky_seed_is_not_confirmed_by_itself(tmp_path, monkeypatch):
    """A no-op with its seed pinned to one found offline to beat the margin (what "pin the seed for reproducibility"
    does by luck, or an agent on purpose): its confirmation repeats the draw, so it is discarded with the reason."""
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "ready").touch()
    target = make_noisy_target(tmp_path / "repo")
    fixed_seed_base(monkeypatch)
    base = [noisy_metric(0, seed_of(SEED_BASE, 0, run)) for run in range(3)]
    margin = 2 * statistics.stdev(base)
    lucky = next(f"lucky{i}" for i in range(10_000) if noisy_metric(0, f"lucky{i}") < statistics.fmean(base) - margin)
    line = next(line for line in (target / "train.py").read_text().splitlines() if "AUTORESEARCH_SEED', '0'" in line)
    pin = edit("pin the seed", line, line.replace("os.environ.get('AUTORESEARCH_SEED', '0')", repr(lucky)))
    with ScriptedLLM([pin]) as llm:
        assert agent.main(["--tag", "t", "--target", str(target), "--timeout", "20", "--no-speculate", "--proposer", "anthropic",
                           "--base-url", llm.anthropic_url, "--max-experiments", "1", *MARGIN]) == 0
    pinned = events(target, "experiment")[1]
    assert pinned["status"] == "discard" and pinned["runs"] == [noisy_metric(0, lucky)] * 2
    assert rows(target)[1].endswith("discard\tpin the seed (2 runs) (its runs with other seeds repeat one result: "
                                    "train.py ignores AUTORESEARCH_SEED, so they are one draw, unpaired and unconfirmed "
                                    "(use the seed))")


def test_the_prompt_carries_deltas_near_misses_and_asks_what_an_idea_builds_on(target):
    """With --margin 0.05 on the deterministic tiny target: a discard 0.001 worse than its base is a near-miss."""
    answers = [edit("raise LR", "LR = 0.04", "LR = 0.05"), edit("deeper", "DEPTH = 8", "DEPTH = 9"),
               edit("shallower", "DEPTH = 8", "DEPTH = 7")]
    with ScriptedLLM(answers) as llm:
        assert agent.main(["--tag", "t", "--target", str(target), "--timeout", "20", "--no-speculate", "--proposer", "anthropic",
                           "--base-url", llm.anthropic_url, "--baseline-runs", "1", "--margin", "0.05",
                           "--max-experiments", "3"]) == 0
    prompt = llm.requests[-1][1]["messages"][-1]["content"]
    assert "n\tdelta\tcommit\tval_bpb" in prompt and "\n1\t-0.100000\t" in prompt and "\n2\t+0.001000\t" in prompt
    assert "Near-misses (discarded within the noise margin 0.050000 of their base: worth combining):\n" \
           "#2 (+0.001000): deeper" in prompt
    assert '"(builds on #4, #9)"' in prompt and "noise" in llm.requests[-1][1]["system"][0]["text"]


def test_a_run_at_another_throughput_is_not_run_again_for_it(target):
    """tokens/s half the best's (a model of another speed) on a machine whose speed probe did not change: judged on
    its runs as they are; tokens/s is recorded, never a reason to run it again (the probe judges the machine)."""
    repo = git.Repo(target)
    path = target / "train.py"
    path.write_text(path.read_text().replace('print(f"peak_vram_mb:', 'print("tokens_per_sec:   1000")\nprint(f"peak_vram_mb:'))
    repo.git.commit("-qam", "train.py states its throughput")
    slower = edit("raise LR, at half the speed", 'LR = 0.04', 'LR = 0.05')
    slower += edit("", 'print("tokens_per_sec:   1000")', 'print("tokens_per_sec:   500")').split("\n", 1)[1]
    with ScriptedLLM([slower]) as llm:      # a margin of 0.5: judged on its first run alone
        assert agent.main(["--tag", "t", "--target", str(target), "--timeout", "20", "--no-speculate", "--proposer", "anthropic",
                           "--base-url", llm.anthropic_url, "--baseline-runs", "1", "--margin", "0.5",
                           "--max-experiments", "1"]) == 0
    assert events(target, "rerun") == [] and events(target, "rerun_best") == []
    assert [e["n"] for e in events(target, "run")] == [0, 1]
    assert [(e["status"], e["tokens_per_sec"], e["probe_s"]) for e in events(target, "experiment")] == \
        [("keep", 1000.0, 0.01), ("discard", 500.0, 0.01)]


def test_the_holdout_rescored_at_the_end_of_a_run_and_by_report(target, capsys):
    """The baseline's and the best's artifacts are kept (a discard's is not) and re-scored on the hidden holdout split
    (the stand-in scores it 0.02 worse than val) at the end of the loop and by `report.py --holdout`."""
    with ScriptedLLM([edit("raise LR", "LR = 0.04", "LR = 0.05"), edit("lower LR", "LR = 0.05", "LR = 0.03")]) as llm:
        assert agent.main(["--tag", "t", "--target", str(target), "--timeout", "20", "--no-speculate", "--proposer", "anthropic",
                           "--base-url", llm.anthropic_url, "--baseline-runs", "1", "--max-experiments", "2"]) == 0
    line = ("holdout      baseline 1.128000, best #1 1.028000: gain +0.100000 on the holdout the search never saw, "
            "+0.100000 reported on val_bpb's own split")
    assert line in capsys.readouterr().out
    kept = sorted(p.name for p in (Path(git.Repo(target).git_dir) / "autoresearch" / "t" / "artifacts").iterdir())
    assert kept == ["0000-artifact", "0001-artifact"]
    assert report.main([str(target), "--holdout"]) == 0 and line in capsys.readouterr().out


def test_older_history_is_grouped_by_what_it_changed():
    """Beyond the newest HISTORY_ROWS experiments, the prompt groups the older ones by the constants they touched."""
    def event(n, status, metric, base_metric):
        return {"n": n, "status": status, "metric": metric, "base_metric": base_metric, "commit": f"c{n:06d}",
                "memory_gb": 1.0, "description": f"idea {n}", "tag": "t"}
    old = [event(0, "keep", 1.2, None), event(1, "keep", 1.1, 1.2), event(2, "discard", 1.15, 1.1),
           event(3, "crash", 0.0, 1.1)]
    history = old + [event(n, "discard", 1.2, 1.1) for n in range(4, 4 + prompts.HISTORY_ROWS)]
    text = prompts.format_history(history, "val_bpb", 0.0, {1: "LR", 2: "LR", 3: "code"})
    assert "(4 older experiments: 2 keep, 1 discard, 1 crash; by what they changed:)\n" \
           "  LR: 2 tried (1 keep, 1 discard, 0 crash), deltas -0.100000 .. +0.050000\n" \
           "  code: 1 tried (0 keep, 0 discard, 1 crash)\n(their kept ones:)\n0\t-\tc000000" in text
    assert "\n1\t-0.100000\tc000001\t1.100000" in text and "\n2\t" not in text and "\n3\t" not in text


def test_what_an_edit_touched_comes_from_its_diff(target, monkeypatch):
    """In a real loop (the table cut to 1 row): the older experiments are grouped by the constants their diff
    changed, or "code"."""
    monkeypatch.setattr(prompts, "HISTORY_ROWS", 1)
    answers = [edit("raise LR", "LR = 0.04", "LR = 0.05"), edit("a nap", "SLEEP = 0.0", "SLEEP = 0.001"),
               edit("deeper", "DEPTH = 8", "DEPTH = 9"), edit("shallower", "DEPTH = 8", "DEPTH = 7")]
    with ScriptedLLM(answers) as llm:
        assert agent.main(["--tag", "t", "--target", str(target), "--timeout", "20", "--no-speculate", "--proposer", "anthropic",
                           "--base-url", llm.anthropic_url, "--baseline-runs", "1", "--max-experiments", "4"]) == 0
    prompt = llm.requests[-1][1]["messages"][-1]["content"]
    assert "  LR: 1 tried (1 keep, 0 discard, 0 crash), deltas -0.100000 .. -0.100000" in prompt
    assert "  SLEEP: 1 tried (0 keep, 1 discard, 0 crash), deltas +0.000000 .. +0.000000" in prompt


def test_an_adopted_commit_is_measured_anew_not_credited_to_the_next_candidate(tmp_path, monkeypatch):
    """A human adds knob.txt (which train.py reads: +0.01 gain) on top of the best; the loop adopts it (train.py
    unchanged). The adopted best is run at the candidate's seed, not paired with the old best's runs: the next
    no-op carries the knob too and is discarded, not kept with the knob's 0.01 credited to it."""
    target = noisy_target(tmp_path, monkeypatch)
    path = target / "train.py"
    path.write_text(path.read_text().replace("gain = 0.0\n", "gain = 0.0\nfrom pathlib import Path\nif Path("
                                             "'knob.txt').exists():\n    gain += float(Path('knob.txt').read_text())\n"))
    repo = git.Repo(target)
    repo.git.commit("-qam", "train.py reads an optional knob.txt")
    assert loop(target, "--max-experiments", "0") == 0
    worktree = tmp_path / "wt"
    repo.git.worktree("add", str(worktree), "autoresearch/t")
    (worktree / "knob.txt").write_text("0.01")
    git.Repo(worktree).git.add("knob.txt")
    git.Repo(worktree).git.commit("-qm", "notes for the agent")
    repo.git.worktree("remove", str(worktree))
    assert loop(target, "--max-experiments", "1") == 0
    assert len(events(target, "adopted")) == 1
    first = events(target, "experiment")[1]
    assert [e["reason"] for e in events(target, "rerun_best")][:1] == ["no run of the best at this seed yet"]
    assert first["status"] == "discard" and first["runs"][0] == first["best_runs"][0]


class Sign(verdict.VerdictRule):
    """A verdict rule of this test's own (registered in harness.judge.verdict.RULES only here): runs at the best's seeds,
    kept when every one of its 1 + confirm runs beats the best's run at the same seed; the first that does not ends it."""
    name, pairs_seeds = "sign", True

    def judge(self, rule, first, run_again, best):
        if first.metric is None:
            return verdict.no_metric(first)
        runs, bests, outcome = [], [], first
        for run in range(1 + rule.confirm):
            if run and (outcome := run_again(run)).metric is None:
                return verdict.failed_further(f"run {run + 1}", outcome, runs)
            value, _, _ = best.at(run, outcome)
            runs.append(outcome.metric)
            bests.append(value)
            if rule.gain(outcome.metric, value) <= 0:
                break
        diffs = [rule.gain(m, b) for m, b in zip(runs, bests)]
        won = len(runs) == 1 + rule.confirm and min(diffs) > 0
        return verdict.Verdict("keep" if won else "discard", tuple(runs), statistics.fmean(runs), best=tuple(bests),
                               gain=statistics.fmean(diffs))

    def words(self, rule, metric):
        return f"SIGN RULE: an edit is kept when each of its {1 + rule.confirm} runs beats the best's run at its seed."


def test_a_verdict_rule_registered_only_here_judges_records_and_resumes(tmp_path, monkeypatch, capsys):
    """The verdict seam: a rule in verdict.RULES is a --verdict choice, judges in the real loop (a no-op stops at its
    first run, a gain of a tenth of a noise sd is kept after 3 runs at the baseline's seeds), states itself in the
    prompt and the report, is recorded with the baseline and read back on resume; another --verdict on resume is
    refused, and a tag whose rule this version lacks is refused with the way out."""
    monkeypatch.setitem(verdict.RULES, "sign", Sign())
    target = noisy_target(tmp_path, monkeypatch)
    answers = [edit("a no-op", "C00 = 1.0", "C00 = 1.5"), edit("a tenth of an sd", "gain = 0.0", "gain = 0.001")]
    argv = ["--tag", "t", "--target", str(target), "--timeout", "20", "--no-speculate", "--proposer", "anthropic"]
    with ScriptedLLM(answers) as llm:
        assert agent.main([*argv, "--base-url", llm.anthropic_url, "--verdict", "sign", "--confirm", "2",
                           "--max-experiments", "2"]) == 0
    assert "SIGN RULE: an edit is kept when each of its 3 runs" in llm.requests[0][1]["system"][0]["text"]
    baseline, noop, gain = events(target, "experiment")
    assert (baseline["verdict"], baseline["confirm"], baseline["false_keep"]) == ("sign", 2, None)
    base = baseline["seed_base"]
    draws = [noisy_metric(0, base + run) for run in range(3)]
    assert baseline["runs"] == draws
    assert (noop["status"], noop["runs"], noop["best_runs"]) == ("discard", draws[:1], draws[:1])
    assert (gain["status"], gain["best_runs"], len(gain["runs"])) == ("keep", draws, 3)
    assert [round(b - m, 9) for m, b in zip(gain["runs"], gain["best_runs"])] == [0.001] * 3
    assert [e["seed"] for e in events(target, "run") if e["n"] == 2] == [base, base + 1, base + 2]
    capsys.readouterr()
    assert report.main([str(target)]) == 0
    assert "verdict      SIGN RULE: an edit is kept when each of its 3 runs" in capsys.readouterr().out
    assert agent.main([*argv, "--proposer", "random", "--max-experiments", "2"]) == 0      # its own rule, read back
    assert agent.main([*argv, "--proposer", "random", "--verdict", "paired", "--max-experiments", "3"]) == 2
    assert "--verdict paired (the tag's: sign)" in capsys.readouterr().err
    monkeypatch.delitem(verdict.RULES, "sign")
    assert agent.main([*argv, "--proposer", "random", "--max-experiments", "3"]) == 2
    assert "the tag was judged by the verdict rule 'sign', which this version does not have (paired, margin): use " \
           "the version that made it, or start a new --tag" in capsys.readouterr().err
    assert len(events(target, "experiment")) == 3
    assert report.main([str(target)]) == 0                  # the report goes on, without the rule's line
    assert "verdict  " not in capsys.readouterr().out
