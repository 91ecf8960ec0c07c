"""
The lab profile's recorded table (bench/lab_table.py): its reader refuses a table recorded with another setup and
skips torn rows, its designs cover what docs/benchmarks.md reads from it, and a point's train.py is written by the
harness's own searchspace.write_point in the lab branch.
"""

import json
import sys

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
import lab_table as L  # noqa: E402

HERE = dict(prepare_sha="a" * 64, train_sha="b" * 64, profile="lab", dataset="sample", budget=60.0, probe_s=0.4)
BASE = {k: v[0] for k, v in L.SPACE.items()}


def write(path, header, rows, torn=()):
    lines = [json.dumps(header)] + [json.dumps(r) for r in rows] + list(torn)
    path.write_text("\n".join(lines) + "\n")


def row(point, seed, value, budget=60.0):
    return dict(point=point, seed=seed, budget=budget, val_bpb=value, steps=650, train_s=60.0, wall_s=70.0,
                curve=[[0.5, 3.0], [1.0, 2.6]], error=None)


def test_a_table_from_another_setup_is_refused_naming_what_differs(tmp_path):
    table = tmp_path / "t.jsonl"
    write(table, dict(table="lab", provenance=HERE, space=L.SPACE), [row(BASE, 1, 2.15)])
    header, rows, skipped = L.read_table(table, expect=dict(HERE, probe_s=0.5))   # another machine speed: printed only
    assert header["provenance"] == HERE and [r["val_bpb"] for r in rows] == [2.15] and skipped == 0
    with pytest.raises(L.TableError) as e:
        L.read_table(table, expect=dict(HERE, prepare_sha="c" * 64, budget=48.0))
    assert f"prepare_sha {'a' * 64!r} (here: {'c' * 64!r}); budget 60.0 (here: 48.0)" in str(e.value)
    assert "collect a new table (--out)" in str(e.value)
    with pytest.raises(L.TableError, match="cannot read the table"):
        L.read_table(tmp_path / "missing.jsonl")
    table.write_text('{"point": {}}\n')
    with pytest.raises(L.TableError, match="its first line is not the table's header"):
        L.read_table(table)


def test_torn_and_malformed_rows_are_skipped_and_counted(tmp_path):
    table = tmp_path / "t.jsonl"
    write(table, dict(table="lab", provenance=HERE, space=L.SPACE), [row(BASE, 1, 2.15), row(BASE, 2, 2.16)],
          torn=['{"point": {"MATRIX_LR": 0.0', '[1, 2]', '{"point": {}, "seed": "1", "budget": 60}'])
    _, rows, skipped = L.read_table(table)
    assert [r["seed"] for r in rows] == [1, 2] and skipped == 3


def test_designs_and_keys():
    assert L.key(BASE) == () and L.key({**BASE, "DEPTH": 4}) == (("DEPTH", 4),)
    moves = L.design("moves", 3)
    assert len(moves) == sum(len(v) - 1 for v in L.SPACE.values()) * 3
    assert all(len(L.key(p)) == 1 and share == 1.0 for p, _, share in moves)
    assert {share for _, _, share in L.design("slow", 8)} == {0.8} and len(L.design("base", 8)) == 8
    drawn = L.design("random", 2, draws=5)
    assert drawn == L.design("random", 2, draws=5) and len(drawn) == 10          # seeded: the same points again


def test_a_point_is_written_into_the_lab_branch():
    source = L.source_at({**BASE, "MATRIX_LR": 0.08, "TOTAL_BATCH_SIZE": 2**12})
    lab = source.split('if PROFILE == "lab":')[1].split("elif PROFILE")[0]
    assert "    MATRIX_LR = 0.08" in lab and "    TOTAL_BATCH_SIZE = 2**12" in lab
    assert source.split("elif PROFILE")[1:] == (REPO / "train.py").read_text().split("elif PROFILE")[1:]
    assert L.source_at(BASE) == (REPO / "train.py").read_text()


def test_kendall_tau_by_hand():
    """Four points, one pair swapped: (5 - 1) / 6. Ties in one list: tau-b, 2 / sqrt(3 x 2)."""
    assert L.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    assert L.kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / 6 ** 0.5)
    assert L.kendall_tau([1, 2], [2, 1]) == -1.0


def test_the_rank_agreement_of_a_short_budget_with_the_full_one_per_kind_of_change():
    """Six points; at 15 s the small model (DEPTH=2) is first, at 60 s fifth (issue 39's worry: a short budget
    favours small, fast models). Overall 10 concordant and 5 discordant pairs: +0.33; the rates keep their order
    (+1.00); model size (base, DEPTH=2, DEPTH=4) one pair swapped of three: +0.33; the batch has 2 points: no line.
    A screen keeping the short budget's best 2 keeps 1 of the full budget's best 2; two seeds 0.002 apart: the noise's
    ceiling +1.00."""
    full = {(): 2.00, ("MATRIX_LR", 0.02): 2.02, ("MATRIX_LR", 0.08): 2.05, ("DEPTH", 2): 2.06, ("DEPTH", 4): 2.10,
            ("TOTAL_BATCH_SIZE", 1024): 2.04}
    short = {(): 2.30, ("MATRIX_LR", 0.02): 2.33, ("MATRIX_LR", 0.08): 2.36, ("DEPTH", 2): 2.20, ("DEPTH", 4): 2.50,
             ("TOTAL_BATCH_SIZE", 1024): 2.31}
    point = lambda k: {**BASE, **dict([k] if k else [])}  # noqa: E731
    rows = [row(point(k), s, v + d) for k, v in full.items() for s, d in ((1, -0.001), (2, 0.001))]
    rows += [row(point(k), 1, v, budget=15.0) for k, v in short.items()]
    rows += [row(BASE, 1, 2.4, budget=48.0)]                              # the slow design: not a screening budget
    assert L.rank_agreement(rows, 60.0) == [
        "\nrank agreement, 15 s (own schedule) against 60 s: Kendall tau +0.33 over 6 points",
        "  rates       tau +1.00 over 3 points (the base and its single moves)",
        "  model size  tau +0.33 over 3 points (the base and its single moves)",
        "  a screen promoting the short budget's best 2 keeps 1 of the full budget's best 2; the full budget's best "
        "point ranks 2 of 6 at 15 s",
        "  a short run takes 1.00 of a full run's wall time (start-up included): screening every point and running its "
        "best third in full costs 1.33 of running every point in full, at most 0.75x the points per device-hour",
        "  the noise's ceiling: seed 1 against seed 2 at 60 s, tau +1.00 over 6 points"]
    assert L.rank_agreement(rows[:12], 60.0) == []
    assert {share for _, _, share in L.design("short", 2, held=[BASE])} == {L.SHORT}
