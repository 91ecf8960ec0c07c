"""Unit tests of harness/judge/verdict.py, the verdict rule, with hand-computed numbers (binary fractions: exact in floats).
The loop's wiring of the rule is tested against real runs in test_noise.py and test_agent.py."""

import copy

import pytest

from harness.judge import stats, verdict
from harness.run.runner import Kind, Outcome
from harness.judge.verdict import Rule, judge, judge_paired


def run(metric, tps=None, reason="", kind=Kind.OK):
    """A runner Outcome as a run of the candidate would return it (metric None: it crashed)."""
    summary = {"tokens_per_sec": str(tps)} if tps is not None else {}
    return Outcome(commit="c" * 40, metric=metric, memory_gb=0.0, seconds=1.0, reason=reason, summary=summary,
                   kind=kind)


class Runs:
    """run_again for judge(): hands out these Outcomes in order and records each call's run index."""

    def __init__(self, *outcomes):
        self.outcomes, self.calls = list(outcomes), []

    def __call__(self, run):
        self.calls.append(run)
        return self.outcomes.pop(0)


class Best:
    """best_at for judge_paired(): the best's metric at each run's seed (None: it could not be run), the runs
    marked re-measured, and each call's run index."""

    def __init__(self, values, remeasured=()):
        self.values, self.remeasured, self.calls = values, remeasured, []

    def __call__(self, run, outcome):
        self.calls.append(run)
        value = self.values[run]
        return value, run in self.remeasured, "" if value is not None else "the best's run failed"

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
    deterministic target (noise sd 0: the floor decides) is not suspected."""
    for again in (run(1.25), run(1.25 + 0.002)):
        found = judge(run(1.25), Runs(again), NOISY, 2.0)
        assert (found.status, found.runs[0]) == ("discard", 1.25)
        assert found.reason.startswith("its runs with other seeds repeat one result: train.py ignores "
                                       "AUTORESEARCH_SEED")
    assert judge(run(1.25), Runs(run(1.25 + 0.003)), NOISY, 2.0).status == "keep"
    deterministic = Rule("min", confirm=1, noise_sd=0.0, noise_runs=3, sd_floor=0.01)
    assert judge(run(1.25), Runs(run(1.25)), deterministic, 2.0).status == "keep"


def test_a_likely_win_is_kept_only_if_the_mean_with_its_confirmation_still_beats_the_best():
    again = Runs(run(1.5))
    found = judge(run(1.25), again, NOISY, 2.0)                    # mean 1.375: 0.625 better
    assert (found.status, found.runs, found.metric) == ("keep", (1.25, 1.5), 1.375) and again.calls == [1]
    again = Runs(run(1.875))
    found = judge(run(1.25), again, NOISY, 2.0)                    # mean 1.5625: 0.4375 better, not enough
    assert (found.status, found.runs, found.metric) == ("discard", (1.25, 1.875), 1.5625)


def test_confirm_2_asks_for_two_more_runs_and_averages_all_three():
    again = Runs(run(1.5), run(1.0))
    found = judge(run(1.25), again, Rule("min", confirm=2, margin_flag=0.5), 2.0)
    assert (found.status, found.runs, found.metric) == ("keep", (1.25, 1.5, 1.0), 1.25)
    assert again.calls == [1, 2]


def test_a_confirmation_that_crashes_makes_a_crash_naming_it():
    failed = run(None, reason="timeout after 20s", kind=Kind.TIMEOUT)
    found = judge(run(1.25), Runs(failed), NOISY, 2.0)
    assert (found.status, found.runs, found.metric) == ("crash", (1.25,), None)
    assert found.reason == "confirmation run 2 crashed: timeout after 20s" and found.failed is failed


def overtime():
    """A run the wall-time allowance rejected (a busy machine can do that to an honest run): no metric, overtime."""
    return run(None, reason="rejected: train.py ran 87.8s, more than the budget plus the start-up and evaluation "
                            "allowance (77.4s)", kind=Kind.OVERTIME)


def test_a_confirmation_the_environment_fails_runs_again_at_its_seed_and_twice_is_not_judged():
    """Over the allowance once: the same confirmation (run index 1, so its seed) runs again and the verdict is the
    retry's. Failed by the environment twice (overtime, a lost Ray worker or node): not judged, a discard of the first
    run with the reason, its failed run the environment's, never a crash of an idea whose first run passed."""
    again = Runs(overtime(), run(1.5))
    found = judge(run(1.25), again, NOISY, 2.0)
    assert (found.status, found.runs, found.metric, found.retried, again.calls) == ("keep", (1.25, 1.5), 1.375, 1,
                                                                                     [1, 1])
    for kind in (Kind.OVERTIME, Kind.LOST, Kind.NODE):
        failed = run(None, reason="the Ray worker was lost", kind=kind)
        again = Runs(overtime(), failed)
        found = judge(run(1.25), again, NOISY, 2.0)
        assert (found.status, found.runs, found.metric, found.failed, found.retried) == ("discard", (1.25,), 1.25,
                                                                                          failed, 1)
        assert found.reason == ("not judged: confirmation run 2 failed 2 times for the environment (the Ray worker "
                                "was lost)") and again.calls == [1, 1]


def test_a_confirmation_that_crashes_by_itself_is_not_run_again():
    for kind in (Kind.CRASH, Kind.TIMEOUT, Kind.REJECTED):
        failed = run(None, reason="exit code 1", kind=kind)
        again = Runs(failed)
        found = judge(run(1.25), again, NOISY, 2.0)
        assert (found.status, found.reason, found.retried, again.calls) == (
            "crash", "confirmation run 2 crashed: exit code 1", 0, [1])


def test_strict_rule_keeps_a_strictly_better_first_run_without_confirmation():
    again = Runs()
    assert judge(run(1.999), again, STRICT, 2.0).status == "keep"
    assert judge(run(2.0), again, STRICT, 2.0).status == "discard"
    assert again.calls == []


def test_a_maximised_metric_is_kept_when_higher():
    found = judge(run(2.75), Runs(run(2.5)), Rule("max", confirm=1, noise_sd=0.25, noise_runs=3), 2.0)
    assert (found.status, found.runs, found.metric) == ("keep", (2.75, 2.5), 2.625)
    assert judge(run(1.25), Runs(), Rule("max", confirm=0), 2.0).status == "discard"


def test_judge_never_changes_an_outcome():
    first, confirmation = run(1.25, tps=500), run(1.25, tps=1000)
    before = copy.deepcopy([first, confirmation])
    judge(first, Runs(confirmation), NOISY, 2.0)
    judge_paired(first, Runs(confirmation), PAIRED, Best([2.0, 2.25]), LEARNED)
    assert [first, confirmation] == before


def test_tokens_per_sec_is_read_for_the_records_only():
    assert verdict.tokens_per_sec(run(1.0, tps=512)) == 512.0 and verdict.tokens_per_sec(run(1.0)) is None
    assert verdict.tokens_per_sec(run(1.0, tps="fast")) is None

# ---------------------------------------------------------------------------
# The paired rule
# ---------------------------------------------------------------------------


PAIRED = Rule("min", confirm=3, noise_sd=0.0625, noise_runs=3, verdict="paired")   # up to 4 runs, false-keep rate 2 %
LEARNED = (0.0625 ** 2 * 100, 100)      # a tag's earlier paired verdicts: 100 degrees of freedom of sd 0.0625
BEST = [2.0, 2.25, 1.75, 2.0]           # the best's runs at seeds 0..3


def candidate(*gains):
    """The candidate's runs at seeds 0.. that beat the best's there by these gains (binary fractions)."""
    return [run(b - g) for b, g in zip(BEST, gains)]


def paired(gains, pooled=LEARNED, best=None):
    """judge_paired on the candidate with these gains over BEST; returns (Verdict, run_again's calls)."""
    first, *rest = candidate(*gains)
    again = Runs(*rest)
    return judge_paired(first, again, PAIRED, best or Best(BEST), pooled), again.calls


def test_student_t_quantiles_are_the_tables():
    """Student's t (one-sided upper quantiles) as printed in any table: 12.706 (df 1, 0.975), 4.303 (2, 0.975),
    2.228 (10, 0.975), 3.365 (5, 0.99); the CDF at 0 is 1/2."""
    for p, df, table in ((0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 10, 2.228), (0.99, 5, 3.365)):
        assert stats.t_quantile(p, df) == pytest.approx(table, abs=5e-4)
    assert stats.t_cdf(0.0, 3) == 0.5 and stats.t_cdf(-12.706, 1) == pytest.approx(0.025, abs=1e-5)


def test_the_paired_sd_pools_the_tags_verdicts_and_the_unpaired_noise_before_there_are_any():
    """Before any paired data: the unpaired sqrt(2) x 0.0625 with 1 degree of freedom (PRIOR_DF); then the tag's 100
    (sd 0.0625) and a verdict's own deviations, the unpaired noise left out; a verdict whose own differences spread
    more than that (an edit that breaks the pairing) is judged on its own sd and degrees of freedom. The false-keep
    rate 2 % is split over the 3 looks after runs 2, 3, 4."""
    assert stats.paired_sd(PAIRED, [0.25]) == (0.0625 * 2 ** 0.5, 1)
    assert stats.paired_sd(PAIRED, [0.25], LEARNED) == (0.0625, 100)
    sd, df = stats.paired_sd(PAIRED, [0.25, 0.1875], LEARNED)                   # spreads less than the tag's: pooled
    assert df == 101 and sd == pytest.approx(((0.390625 + 0.001953125) / 101) ** 0.5)
    assert stats.paired_sd(PAIRED, [0.25, 0.125], LEARNED) == (0.0078125 ** 0.5, 1)   # more than the tag's: its own
    assert [round(stats.threshold(PAIRED, df), 3) for df in (1, 2, 3)] == [47.740, 8.573, 5.268]
    assert stats.paired_sd(Rule("min", verdict="paired"), [0.5]) == (None, 0)          # one baseline run: nothing known yet
    assert stats.pair_floor(PAIRED) == 0.000625 and stats.pair_floor(Rule("min", verdict="paired")) == stats.PRINT_FLOOR
    assert verdict.pooled_of(PAIRED, [((1.75, 2.125), (2.0, 2.25)), ((1.5,), (2.0,))]) == (0.0078125, 1)


def test_a_gain_the_seeds_share_is_kept_after_two_runs():
    """Common random numbers: the same 0.25 gain at both seeds (1 noise sd: the margin rule's 2-sd margin discards it);
    paired, t 5.69 over 2.519 after 2 runs."""
    best = Best(BEST)
    found, calls = paired((0.25, 0.25), best=best)
    assert (found.status, found.runs, found.best, found.metric) == ("keep", (1.75, 2.0), (2.0, 2.25), 1.875)
    assert found.t == pytest.approx(0.25 / ((0.390625 / 101) ** 0.5 / 2 ** 0.5)) and found.gain == 0.25
    assert calls == [1] and best.calls == [0, 1]
    assert judge(run(1.75), Runs(run(2.0)), Rule("min", confirm=1, noise_sd=0.25, noise_runs=3), 2.0).status == \
        "discard"
    assert found.runs_words("val_bpb") == ("paired with the best's runs at the same seeds, mean gain +0.250000, "
                                           "t 5.7; val_bpb is the mean of its runs")


def test_a_first_run_not_clearly_better_than_the_best_at_its_seed_stops_there():
    """Not better: discarded after 1 run; better by 0.0625, under 1.25 paired sds (0.079): discarded too, once the
    tag has learned its paired sd; while it learns (fewer than LEARN_DF pooled), any better first run goes on."""
    for gains in ((0.0,), (0.0625,)):
        found, calls = paired(gains)
        assert (found.status, found.runs, found.best) == ("discard", (2.0 - gains[0],), (2.0,)) and calls == []
    assert paired((0.0625,) * 4, pooled=(0.0, 0))[1][:1] == [1]


def test_a_mean_difference_that_turns_negative_stops():
    found, calls = paired((0.25, -0.5))
    assert (found.status, found.runs, found.gain, calls) == ("discard", (1.75, 2.75), -0.125, [1])


def test_borderline_cases_get_more_runs_up_to_the_cap():
    """t after runs 2, 3, 4 (the tag's sd: these spread less): 1.78, 2.04, 2.53 (over 2.518: kept at the 4th); 1.78,
    2.04, 2.28 (discarded at the cap); 1.78, 2.62 (kept at the 3rd)."""
    for gains, status, n in (((0.09375, 0.0625, 0.0625, 0.09375), "keep", 4),
                             ((0.09375, 0.0625, 0.0625, 0.0625), "discard", 4), ((0.09375, 0.0625, 0.125), "keep", 3)):
        found, calls = paired(gains)
        assert (found.status, len(found.runs), calls) == (status, n, list(range(1, n))), gains


def test_a_further_run_that_crashes_makes_a_crash_naming_it():
    failed = run(None, reason="exit code 1", kind=Kind.CRASH)
    found = judge_paired(candidate(0.25)[0], Runs(failed), PAIRED, Best(BEST), LEARNED)
    assert (found.status, found.runs, found.metric, found.failed) == ("crash", (1.75,), None, failed)
    assert found.reason == "run 2 crashed: exit code 1"


def test_a_paired_run_the_environment_fails_runs_again_at_its_seed_and_twice_is_not_judged():
    """Run 2 over the allowance once: run again at its seed (run index 1), paired as before and kept after 2 runs.
    Run 3 failed by the environment twice: not judged, a discard of runs 1 and 2 with their pairs; a crash of run 2
    (train.py's own) is a crash, not run again."""
    kept, _ = paired((0.25, 0.25))
    again = Runs(overtime(), *candidate(0.25, 0.25)[1:])
    found = judge_paired(candidate(0.25)[0], again, PAIRED, Best(BEST), LEARNED)
    assert (found.status, found.runs, found.best, found.t, found.retried, again.calls) == (
        "keep", kept.runs, kept.best, kept.t, 1, [1, 1])
    first, second = candidate(0.09375, 0.0625)                  # borderline after 2 runs: a 3rd is due
    lost = run(None, reason="the Ray node has no data", kind=Kind.NODE)
    again = Runs(second, overtime(), lost)
    found = judge_paired(first, again, PAIRED, Best(BEST), LEARNED)
    assert (found.status, found.runs, found.best, found.failed, found.retried, again.calls) == (
        "discard", (first.metric, second.metric), (2.0, 2.25), lost, 1, [1, 2, 2])
    assert found.metric == (first.metric + second.metric) / 2
    assert found.reason == "not judged: run 3 failed 2 times for the environment (the Ray node has no data)"
    crashed = run(None, reason="exit code 1", kind=Kind.CRASH)
    again = Runs(crashed)
    found = judge_paired(first, again, PAIRED, Best(BEST), LEARNED)
    assert (found.status, found.reason, again.calls) == ("crash", "run 2 crashed: exit code 1", [1])


def test_a_best_that_cannot_be_run_ends_the_pairs_with_the_reason():
    found, _ = paired((0.25, 0.25), best=Best([2.0, None]))
    assert (found.status, found.runs, found.reason) == ("discard", (1.75,), "the best's run failed")
    found, _ = paired((0.25,), best=Best([None]))
    assert (found.status, found.runs, found.reason) == ("discard", (1.75,), "the best's run failed")


def test_paired_runs_that_repeat_one_draw_are_discarded_as_seed_ignoring():
    """A pinned seed: 1.5 at every seed; the differences 0.5, 0.75 look like a win, but they are the best's noise
    around one draw: stopped after the second run."""
    again = Runs(run(1.5), run(1.5))
    found = judge_paired(run(1.5), again, PAIRED, Best(BEST), LEARNED)
    assert found.status == "discard" and found.reason.startswith("its runs with other seeds repeat one result")
    assert again.calls == [1]


def test_two_equal_scores_over_n_problems_are_not_taken_for_an_ignored_seed():
    """pass@1 over 64 problems moves in steps of 1/64: two honest runs score the same often, three rarely."""
    quantised = Rule("max", confirm=3, noise_sd=0.03125, noise_runs=3, verdict="paired", sd_floor=0.0625,
                     floor_source="the binomial standard error of pass@1 over 64 problems")
    assert verdict.seed_ignored(quantised, [0.5, 0.5]) == ""
    assert verdict.seed_ignored(quantised, [0.5, 0.5, 0.5]).startswith("its runs with other seeds repeat one result")
    assert verdict.seed_ignored(PAIRED, [0.5, 0.5]).startswith("its runs with other seeds repeat one result")


def test_paired_runs_that_stay_still_while_the_best_moves_are_a_swapped_seed():
    """A train.py that trains with a lucky seed of its own whatever it is given, nudged 1/128 a run so that no two
    runs repeat: its runs spread 0.0078 while the best's at the same seeds spread 0.25 (under a tenth: discarded after
    the third run); an honest candidate whose runs move with the best's is not."""
    again = Runs(run(1.5 + 1 / 128), run(1.5 + 2 / 128), run(1.5))
    found = judge_paired(run(1.5), again, PAIRED, Best(BEST), LEARNED)
    assert found.status == "discard" and again.calls == [1, 2]
    assert found.reason.startswith("its runs with other seeds barely move while the best's at the same seeds do")
    assert paired((0.09375, 0.0625, 0.125))[0].status == "keep"


def test_a_re_measured_best_is_counted_and_named():
    found, _ = paired((0.25, 0.25), best=Best(BEST, remeasured={1}))
    assert found.remeasured == 1 and "the best re-run for 1 of them" in found.runs_words("val_bpb")


def test_a_maximised_metric_is_paired_the_other_way():
    rule = Rule("max", confirm=3, noise_sd=0.0625, noise_runs=3, verdict="paired")
    found = judge_paired(run(2.25), Runs(run(2.5)), rule, Best([2.0, 2.25]), LEARNED)
    assert (found.status, found.gain) == ("keep", 0.25)

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


def test_the_words_of_the_paired_rule_name_its_test_its_rate_and_its_runs():
    words = PAIRED.words("val_bpb")
    assert "uses the seed of a run of the best" in words and "one-sided t-test at a false-keep rate of 2%" in words
    assert "after 2 to 4 runs" in words and "speed probe" in words and "margin" not in words
    assert Rule("min", confirm=0, verdict="paired").words() == STRICT.words()      # --confirm 0: the strict ratchet
    assert (PAIRED.name, NOISY.name, STRICT.name) == ("paired", "margin", "strict")


def test_every_verdict_says_why_in_words():
    """`try`'s reason: line for a keep or a discard with no reason of its own (a discard that looked 2.6 sds better
    with no reason read as a bug): the paired gain and t against the bar, the first look, or the margin."""
    kept, _ = paired((0.25, 0.25), best=Best(BEST))
    assert PAIRED.why(kept) == ("kept: mean gain +0.250000 over the best's runs at the same seeds (2 runs, t 5.7), "
                                "above the one-sided t-test's bar at a false-keep rate of 0.02")
    capped, _ = paired((0.09375, 0.0625, 0.0625, 0.0625))
    assert PAIRED.why(capped).startswith("not kept: mean gain +0.070312 over the best's runs at the same seeds (4 runs, "
                                         "t ") and PAIRED.why(capped).endswith("at a false-keep rate of 0.02: it may "
                                                                               "be noise")
    first, _ = paired((0.0625,))
    assert PAIRED.why(first) == ("not kept: its first run beat the best's at the same seed by +0.062500, within 1.25 "
                                 "paired sds: too close to be worth more runs")
    worse, _ = paired((0.25, -0.5))
    assert PAIRED.why(worse) == "not kept: not better than the best's runs at the same seeds (mean gain -0.125000, 2 runs)"
    margin = Rule("min", confirm=1, noise_sd=0.25, noise_runs=3)
    assert margin.why(judge(run(1.75), Runs(run(2.0)), margin, 2.0)) == ("not kept: its run did not beat the best by "
                                                                         "more than the margin 0.500000")


def test_a_rules_recorded_settings_read_back_into_the_same_rule():
    """Rule.recorded() -> the event -> verdict.recorded_of -> settings_of -> rule_of gives the same rule: the common
    settings and the rule's own (the paired rule's false-keep rate); a tag from before the paired rule recorded no
    verdict name and reads back as the margin rule; a rule this version lacks is refused with the way out."""
    paired = verdict.rule_of("min", 3, None, verdict="paired", false_keep=0.05)
    event = dict(n=0, status="keep", **paired.recorded(), seed_base=7)
    assert paired.recorded() == dict(confirm=3, margin=None, verdict="paired", false_keep=0.05)
    assert verdict.recorded_of(event) == paired.recorded()
    assert verdict.settings_of(verdict.recorded_of(event)) == dict(confirm=3, margin=None, verdict="paired",
                                                                   false_keep=0.05)
    assert verdict.rule_of("min", **verdict.settings_of(verdict.recorded_of(event))) == paired
    margin = verdict.rule_of("max", 1, 0.02)
    assert margin.recorded() == dict(confirm=1, margin=0.02, verdict="margin", false_keep=None)
    assert verdict.settings_of(verdict.recorded_of(dict(confirm=1, margin=0.02))) == dict(confirm=1, margin=0.02,
                                                                                          verdict="margin")
    assert verdict.rule_of("max", **verdict.settings_of(verdict.recorded_of(margin.recorded()))) == margin
    with pytest.raises(verdict.SetupError, match="verdict rule 'bayes', which this version does not have"):
        verdict.settings_of(verdict.recorded_of(dict(confirm=1, verdict="bayes")))
