"""
The research-yield replay (bench/bench_yield.py): its surrogate interpolates the recorded table and refuses to
extrapolate, its campaigns are decided by the harness's own verdict, sampler and cancel code, a campaign finds a
planted improvement and scores it by the truth, not by what it was kept with, and a table from another setup is
refused.
"""

import json

import pytest

from helpers import REPO
import sys

sys.path.insert(0, str(REPO / "bench"))
import bench_yield as Y  # noqa: E402
import lab_table as L  # noqa: E402

BASE = {k: v[0] for k, v in L.SPACE.items()}
CURVE = [[p / 20, 3.0 - p / 40] for p in range(1, 21)]


def row(point, seed, value):
    return dict(point=point, seed=seed, budget=60.0, val_bpb=value, steps=650, train_s=60.0, wall_s=70.0,
                curve=[[p, loss + (value - 2.0)] for p, loss in CURVE], error=None)


def table(effects, noise=0.001):
    """Rows: the base at 8 seeds around 2.0, each single-constant move at 2 seeds, its mean 2.0 + effects.get(...)."""
    rows = [row(BASE, s, 2.0 + noise * (-1) ** s * (1 + (s - 1) // 2 % 2)) for s in range(1, 9)]   # mean exactly 2
    for name, values in L.SPACE.items():
        for v in values[1:]:
            for s in (1, 2):
                rows.append(row({**BASE, name: v}, s, 2.0 + effects.get((name, v), 0.01) + noise * (-1) ** s))
    return rows


def test_the_surrogate_goes_through_the_moves_and_interpolates_between_levels():
    rows = table({("MATRIX_LR", 0.08): -0.06, ("MATRIX_LR", 0.02): 0.03, ("DEPTH", 2): 0.05})
    fit = Y.Surrogate(rows)
    base = fit.predict(BASE)
    assert base == pytest.approx(2.0, abs=1e-9)                 # the base's mean: the noise cancels over 8 seeds
    assert fit.predict({**BASE, "MATRIX_LR": 0.08}) == pytest.approx(1.94, abs=1e-9)
    assert fit.predict({**BASE, "DEPTH": 2}) == pytest.approx(2.05, abs=1e-9)
    # between 0.04 and 0.08 on a log2 axis: sqrt(0.04 x 0.08) is halfway, so half the effect
    assert fit.predict({**BASE, "MATRIX_LR": (0.04 * 0.08) ** 0.5}) == pytest.approx(1.97, abs=1e-9)
    # additive: two moves together add their effects
    assert fit.predict({**BASE, "MATRIX_LR": 0.08, "DEPTH": 2}) == pytest.approx(1.99, abs=1e-9)


def test_the_surrogate_refuses_a_point_outside_the_table():
    fit = Y.Surrogate(table({}))
    with pytest.raises(Y.OutsideTable, match=r"MATRIX_LR = 0.16 is outside the table's range 0.02..0.08"):
        fit.predict({**BASE, "MATRIX_LR": 0.16})
    with pytest.raises(Y.OutsideTable):
        Y.step_of({**BASE, "MATRIX_LR": 0.02}, 13, 0)       # the grid's 13th step halves MATRIX_LR: 0.01
    assert Y.step_of(BASE, 13, 0) == {**BASE, "MATRIX_LR": 0.02}
    with pytest.raises(Y.OutsideTable, match="EMBEDDING_LR = 0.2"):
        Y.step_of(BASE, 2, 0)                               # 0.6 -> 0.2: its distance to 1 doubled (perturb.moves)


def test_seed_sd_is_pooled_within_points():
    rows = [row(BASE, 1, 2.0), row(BASE, 2, 2.2), row({**BASE, "DEPTH": 2}, 1, 3.0), row({**BASE, "DEPTH": 2}, 2, 3.0),
            row({**BASE, "DEPTH": 4}, 1, 1.0)]
    sd, df = Y.seed_sd(rows)
    assert df == 2 and sd == pytest.approx((0.02 / 2) ** 0.5)     # (0.02 + 0) / 2 degrees of freedom


def test_recorded_runs_are_looked_up_exactly_and_others_drawn_alike_for_every_arm():
    rows = table({})
    world = Y.World(rows, 60.0, 0)
    value, curve, wall = world.run(BASE, 3)
    assert value == rows[2]["val_bpb"] and wall == 70.0 + Y.AGENT_OVERHEAD_S
    assert curve.points[-1].loss == pytest.approx(CURVE[-1][1] + value - 2.0)
    off = {**BASE, "WEIGHT_DECAY": 0.1}
    a, b = world.run(off, 5), Y.World(rows, 60.0, 0).run(off, 5)
    assert a[0] == b[0] and a[0] != world.run(off, 5)[0]        # the same draw for the same ask, a new one asked again
    assert a[2] == pytest.approx(70.0 + Y.AGENT_OVERHEAD_S)


def count_calls(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def wrapped(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, wrapped)
    return calls


def test_a_campaign_is_judged_by_the_harness_rule_and_scored_by_the_truth(monkeypatch):
    rows = table({("UNEMBEDDING_LR", 0.002): -0.08})        # the grid's 2nd experiment: a large, real improvement
    paired = count_calls(monkeypatch, Y.verdict, "judge_paired")
    decide = count_calls(monkeypatch, Y.curves, "decide")
    result = Y.campaign(Y.ARMS["grid"], Y.World(rows, 60.0, 0), 0, hours=1.0, max_experiments=3)
    assert result["experiments"] == 3 and len(paired) == 3
    assert decide                                           # early cancel asked the harness's rule
    assert result["best"] == {**BASE, "UNEMBEDDING_LR": 0.002} and result["keeps"] == 1 and result["false_keeps"] == 0
    # refused before running, outside the table: EMBEDDING_LR 0.2 (experiment 2), UNEMBEDDING_LR 0.001 (experiment 3,
    # whose next step, back to 0.004, is the baseline's point, already measured)
    assert result["refused"] == 2
    assert Y.gain_at(result, 1.0) == pytest.approx(0.08, abs=1e-9)   # the surrogate's truth, not the kept runs' mean
    assert [(n, round(truth, 6)) for _, truth, n in result["trace"]] == [(0, 2.0), (1, 2.0), (2, 1.92), (3, 1.92)]


def test_the_plain_ratchet_keeps_on_one_run_with_the_strict_rule(monkeypatch):
    strict = count_calls(monkeypatch, Y.verdict, "judge")
    result = Y.campaign(Y.ARMS["plain"], Y.World(table({}, noise=0.0), 60.0, 1), 1, hours=1.0, max_experiments=4)
    assert len(strict) == 4 and all(call[2].confirm == 0 for call in strict)
    assert result["runs"] == 1 + 4                      # one baseline run, one run per experiment


def test_a_sampler_campaign_tells_the_study_and_spends_device_time():
    result = Y.campaign(Y.ARMS["tpe"], Y.World(table({}), 60.0, 2), 2, hours=0.2)
    hours = [h for h, _, _ in result["trace"]]
    assert hours == sorted(hours) and 0.2 <= result["hours"] < 0.2 + 4 * 76 / 3600
    assert result["experiments"] >= 5 and result["runs"] >= 3 + result["experiments"]


def test_a_table_from_another_setup_is_refused(tmp_path, capsys):
    here = Y.expected()
    path = tmp_path / "t.jsonl"
    rows = table({})
    header = dict(table="lab", provenance=dict(here, budget=48.0, train_sha="b" * 64), space=L.SPACE)
    path.write_text("\n".join(json.dumps(x) for x in [header, *rows]) + "\n")
    assert Y.main(["--table", str(path), "--campaigns", "2", "--hours", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "recorded with another setup: budget 48.0 (here: 60.0)" in err
    path.write_text("\n".join(json.dumps(x) for x in [dict(header, provenance=here), *rows]) + "\n{torn")
    assert Y.main(["--table", str(path), "--surrogate"]) == 0
    assert "(1 torn rows skipped)" in capsys.readouterr().out
