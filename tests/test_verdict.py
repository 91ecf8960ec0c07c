"""Unit tests of harness/verdict.py, the verdict rule, with hand-computed numbers (binary fractions: exact in floats).
The loop's wiring of the rule is tested against real runs in test_noise.py and test_agent.py."""

import copy

import pytest

from harness import verdict
from harness.runner import Kind, Outcome
from harness.verdict import Rule, judge


def run(metric, tps=None, reason="", kind=Kind.OK):
    """A runner Outcome as a run of the candidate would return it (metric None: it crashed)."""
    summary = {"tokens_per_sec": str(tps)} if tps is not None else {}
    return Outcome(commit="c" * 40, metric=metric, memory_gb=0.0, seconds=1.0, reason=reason, summary=summary,
                   kind=kind)


class Runs:
    """run_again for judge(): hands out these Outcomes in order and records each call's (run, again)."""

    def __init__(self, *outcomes):
        self.outcomes, self.calls = list(outcomes), []

    def __call__(self, run, again):
        self.calls.append((run, again))
        return self.outcomes.pop(0)

# ---------------------------------------------------------------------------
# The margin
# ---------------------------------------------------------------------------


def test_the_margin_is_two_noise_sds_when_confirming():
    rule = Rule("min", confirm=1, noise_sd=0.25, noise_runs=3)
    assert rule.margin == 0.5 and rule.noise_aware and rule.source == "2 x noise sd"


def test_an_explicit_margin_wins_over_the_noise():
    rule = Rule("min", confirm=1, margin_flag=0.125, noise_sd=0.25, noise_runs=3)
    assert rule.margin == 0.125 and not rule.noise_aware and rule.source == "--margin"
    assert Rule("min", confirm=0, margin_flag=0.125).margin == 0.125        # also with --confirm 0


@pytest.mark.parametrize("rule", [Rule("min", confirm=0, noise_sd=0.25, noise_runs=3),   # --confirm 0
                                  Rule("min", confirm=1, noise_sd=None, noise_runs=1)])  # one baseline run
def test_confirm_0_or_one_baseline_run_is_strictly_better(rule):
    assert rule.margin == 0.0 and not rule.noise_aware and rule.source == "strict: --confirm 0 or one baseline run"
    assert rule.beats(1.999, 2.0) and not rule.beats(2.0, 2.0) and not rule.near_miss(2.0, 2.0)


def test_identical_baseline_runs_get_the_floor_not_a_zero_margin():
    """sd 0 (three baseline runs alike): the margin is 2 x the floor, and the source says so; a measured sd above the
    floor wins; --margin and the strict rule ignore the floor."""
    floor, words = verdict.sd_floor("val_bpb", (1.5, 1.5, 1.5), {}, 1e-4)
    assert (floor, words) == (1e-4, "METRIC_SD_FLOOR 0.0001 of prepare.py")
    rule = Rule("min", confirm=1, noise_sd=0.0, noise_runs=3, sd_floor=floor, floor_source=words)
    assert rule.margin == pytest.approx(2e-4) and not rule.beats(1.5 - 1.5e-4, 1.5) and rule.beats(1.5 - 2.5e-4, 1.5)
    assert rule.source == "2 x the noise floor, METRIC_SD_FLOOR 0.0001 of prepare.py: the baseline's runs spread less"
    assert Rule("min", confirm=1, noise_sd=0.25, noise_runs=3, sd_floor=floor).margin == 0.5
    assert Rule("min", confirm=1, margin_flag=0.0, noise_sd=0.0, noise_runs=3, sd_floor=floor).margin == 0.0
    assert Rule("min", confirm=0, noise_sd=0.0, noise_runs=3, sd_floor=floor).margin == 0.0
    assert verdict.sd_floor("val_bpb", (1.5,), {}, None) == (0.0, "")          # nothing declared: no floor


def test_a_score_over_n_problems_gets_its_binomial_standard_error():
    """pass@1 0.30 over 100 problems: sqrt(0.3 * 0.7 / 100) = 0.0458258; a score of 0 or 1 is kept 1/N inside."""
    floor, words = verdict.sd_floor("pass@1", (0.3, 0.3, 0.3), {"num_problems": "100"})
    assert floor == pytest.approx(0.0458258, abs=1e-7)
    assert words == "the binomial standard error of pass@1 over 100 problems"
    zero = verdict.sd_floor("pass@1", (0.0, 0.0), {"num_problems": "100"})[0]
    assert zero == pytest.approx((0.01 * 0.99 / 100) ** 0.5)
    declared = verdict.sd_floor("pass@1", (0.3,), {"num_problems": "x"}, 0.01)
    assert declared == (0.01, "METRIC_SD_FLOOR 0.01 of prepare.py")


def test_before_the_baseline_is_measured_the_rule_is_noise_aware_with_no_margin_yet():
    rule = Rule("min", confirm=1, noise_sd=None, noise_runs=3)
    assert rule.noise_aware and rule.margin == 0.0

# ---------------------------------------------------------------------------
# beats and near-misses, both goals
# ---------------------------------------------------------------------------


def test_beats_and_near_miss_for_a_minimised_metric():
    rule = Rule("min", margin_flag=0.5)
    assert rule.gain(1.25, 2.0) == 0.75 and rule.gain(2.5, 2.0) == -0.5
    assert rule.beats(1.25, 2.0)                     # 0.75 better
    assert not rule.beats(1.5, 2.0)                  # exactly the margin: not more than it
    assert not rule.beats(2.5, 2.0)                  # worse
    assert rule.near_miss(2.5, 2.0) and rule.near_miss(1.75, 2.0)     # within 0.5 either way
    assert not rule.near_miss(2.75, 2.0) and not rule.near_miss(1.25, 2.0)


def test_beats_and_near_miss_for_a_maximised_metric():
    rule = Rule("max", margin_flag=0.5)
    assert rule.gain(2.75, 2.0) == 0.75 and rule.gain(1.5, 2.0) == -0.5
    assert rule.beats(2.75, 2.0) and not rule.beats(2.5, 2.0) and not rule.beats(1.25, 2.0)
    assert rule.near_miss(1.5, 2.0) and rule.near_miss(2.25, 2.0) and not rule.near_miss(1.25, 2.0)

# ---------------------------------------------------------------------------
# judge
# ---------------------------------------------------------------------------

NOISY = Rule("min", confirm=1, noise_sd=0.25, noise_runs=3)        # margin 0.5
STRICT = Rule("min", confirm=0)                                     # margin 0, no confirmation


def test_a_run_without_a_metric_is_a_crash_and_runs_nothing_more():
    again = Runs()
    assert judge(run(None, reason="exit code 1", kind=Kind.CRASH), again, NOISY, 2.0) == verdict.Verdict("crash")
    assert again.calls == []


def test_a_first_run_that_does_not_beat_the_margin_is_discarded_without_confirmation():
    again = Runs()
    found = judge(run(1.75), again, NOISY, 2.0)                    # 0.25 better: within the margin
    assert (found.status, found.runs, found.metric, found.reason) == ("discard", (1.75,), 1.75, "")
    assert again.calls == []


def test_a_confirmation_that_repeats_the_first_run_is_a_seed_ignored_not_a_confirmed_win():
    """A train.py that pins its seed (or folds it) draws once: 1.25 twice beats the margin 0.5 by a lucky single draw.
    Discarded with the reason; within 1 % of the sd too (kernel nondeterminism); an honest 1 %-plus gap is kept; a
    deterministic target (noise sd 0: the floor decides) and the throughput repeat (same seed) are not suspected."""
    for again in (run(1.25), run(1.25 + 0.002)):
        found = judge(run(1.25), Runs(again), NOISY, 2.0)
        assert (found.status, found.runs[0]) == ("discard", 1.25)
        assert found.reason.startswith("its runs with other seeds repeat one result: train.py ignores AUTORESEARCH_SEED")
    assert judge(run(1.25), Runs(run(1.25 + 0.003)), NOISY, 2.0).status == "keep"
    deterministic = Rule("min", confirm=1, noise_sd=0.0, noise_runs=3, sd_floor=0.01)
    assert judge(run(1.25), Runs(run(1.25)), deterministic, 2.0).status == "keep"
    found = judge(run(1.25, tps=500), Runs(run(1.25, tps=1000), run(1.4, tps=1000)), NOISY, 2.0, best_tps=1000)
    assert (found.status, found.runs, found.reason) == ("keep", (1.25, 1.25, 1.4), "")


def test_a_likely_win_is_kept_only_if_the_mean_with_its_confirmation_still_beats_the_best():
    again = Runs(run(1.5))
    found = judge(run(1.25), again, NOISY, 2.0)                    # mean 1.375: 0.625 better
    assert (found.status, found.runs, found.metric) == ("keep", (1.25, 1.5), 1.375) and again.calls == [(1, False)]
    again = Runs(run(1.875))
    found = judge(run(1.25), again, NOISY, 2.0)                    # mean 1.5625: 0.4375 better, not enough
    assert (found.status, found.runs, found.metric) == ("discard", (1.25, 1.875), 1.5625)


def test_confirm_2_asks_for_two_more_runs_and_averages_all_three():
    again = Runs(run(1.5), run(1.0))
    found = judge(run(1.25), again, Rule("min", confirm=2, margin_flag=0.5), 2.0)
    assert (found.status, found.runs, found.metric) == ("keep", (1.25, 1.5, 1.0), 1.25)
    assert again.calls == [(1, False), (2, False)]


def test_a_confirmation_that_crashes_makes_a_crash_naming_it():
    failed = run(None, reason="timeout after 20s", kind=Kind.TIMEOUT)
    found = judge(run(1.25), Runs(failed), NOISY, 2.0)
    assert (found.status, found.runs, found.metric) == ("crash", (1.25,), None)
    assert found.reason == "confirmation run 2 crashed: timeout after 20s" and found.failed is failed


def test_strict_rule_keeps_a_strictly_better_first_run_without_confirmation():
    again = Runs()
    assert judge(run(1.999), again, STRICT, 2.0).status == "keep"
    assert judge(run(2.0), again, STRICT, 2.0).status == "discard"
    assert judge(run(1.25, tps=500), again, STRICT, 2.0, best_tps=1000).runs == (1.25,)   # no throughput repeat
    assert again.calls == []


def test_a_maximised_metric_is_kept_when_higher():
    found = judge(run(2.75), Runs(run(2.5)), Rule("max", confirm=1, noise_sd=0.25, noise_runs=3), 2.0)
    assert (found.status, found.runs, found.metric) == ("keep", (2.75, 2.5), 2.625)
    assert judge(run(1.25), Runs(), Rule("max", confirm=0), 2.0).status == "discard"


def test_a_first_run_at_another_throughput_is_repeated_and_both_runs_count():
    """tokens/s 500 against the best's 1000 (50 % off, more than THROUGHPUT_SHARE): repeated first; the mean of both
    decides whether it is confirmed, and the confirmation is averaged with both."""
    again = Runs(run(1.5, tps=1000), run(1.3, tps=1000))
    found = judge(run(1.25, tps=500), again, NOISY, 2.0, best_tps=1000)
    assert again.calls == [(0, True), (1, False)]
    assert (found.status, found.runs) == ("keep", (1.25, 1.5, 1.3)) and found.metric == pytest.approx(1.35)
    assert found.repeated and found.runs_words("val_bpb") == ("run 2 re-ran run 1 with the same seed, its tokens/s "
                                                              "was off; the others: other seeds; val_bpb is their mean")
    again = Runs(run(2.0, tps=1000))                              # the repeat is worse: mean 1.625, discarded
    found = judge(run(1.25, tps=500), again, NOISY, 2.0, best_tps=1000)
    assert (found.status, found.runs, found.metric) == ("discard", (1.25, 2.0), 1.625) and again.calls == [(0, True)]
    assert found.runs_words("val_bpb") == "run 2 re-ran run 1 with the same seed, its tokens/s was off; val_bpb is " \
        "their mean"


def test_a_throughput_within_the_share_or_unknown_is_not_repeated():
    again = Runs(run(1.5))
    assert judge(run(1.25, tps=800), again, NOISY, 2.0, best_tps=1000).runs == (1.25, 1.5)   # 20 % off
    assert judge(run(1.75), again, NOISY, 2.0, best_tps=1000).runs == (1.75,)                # states none
    assert judge(run(1.75, tps=500), again, NOISY, 2.0, best_tps=None).runs == (1.75,)       # best states none
    assert again.calls == [(1, False)]


def test_a_repeat_that_crashes_makes_a_crash_naming_it():
    failed = run(None, reason="exit code 1", kind=Kind.CRASH)
    found = judge(run(1.25, tps=500), Runs(failed), NOISY, 2.0, best_tps=1000)
    assert (found.status, found.runs, found.metric) == ("crash", (), None)
    assert found.reason == "its repeat crashed: exit code 1" and found.failed is failed


def test_judge_never_changes_an_outcome():
    first, repeat, confirmation = run(1.25, tps=500), run(1.5, tps=1000), run(1.25, tps=1000)
    before = copy.deepcopy([first, repeat, confirmation])
    judge(first, Runs(repeat, confirmation), NOISY, 2.0, best_tps=1000)
    assert [first, repeat, confirmation] == before


def test_throughput_helpers():
    assert verdict.tokens_per_sec(run(1.0, tps=512)) == 512.0 and verdict.tokens_per_sec(run(1.0)) is None
    assert verdict.tokens_per_sec(run(1.0, tps="fast")) is None
    assert verdict.throughput_off(500, 1000).startswith("tokens/s 500 differs from the best's 1000 by more than 25%")

# ---------------------------------------------------------------------------
# The rule in words
# ---------------------------------------------------------------------------


def test_the_words_of_confirm_0_say_there_is_no_confirmation_run():
    words = Rule("min", confirm=0).words("val_bpb")
    assert "no confirmation run" in words and "second run" not in words and "beats the best val_bpb" in words
    assert "margin" not in words                                    # strictly better: no margin to state
    assert "a margin of 0.01 (--margin)" in Rule("min", confirm=0, margin_flag=0.01).words()


def test_the_words_of_confirm_1_mention_the_second_run():
    words = Rule("min", confirm=1, noise_sd=0.25, noise_runs=3).words("val_bpb")
    assert "a second run" in words and "no confirmation run" not in words and "val_bpb" in words
    assert "noise margin" in words
    assert "2 more runs" in Rule("min", confirm=2, noise_sd=0.25, noise_runs=3).words()
