"""
HARNESS: the statistics of the paired verdict (harness.judge.verdict's Paired rule): Student's t in closed form, the
sd of one paired difference pooled over the tag's verdicts, the threshold a no-op passes at most false_keep of the
time, and the rule's decision after each run. Pure functions of a verdict.Rule and numbers.
"""

import math
import statistics

PAIRED_FLOOR_SDS = 0.01     # the least sd of paired differences assumed: this share of the noise sd (or the floor)
PRINT_FLOOR = 1e-6          # ... and never below the summary's printed precision (6 decimals)
PRIOR_DF = 1                # the degrees of freedom of the unpaired fallback for the paired sd (no paired data yet)
FIRST_LOOK = 1.25           # the paired rule goes on after a first run that beats the best's by this many paired sds
LEARN_DF = 4                # ... or by anything, while the tag's pooled paired differences have fewer degrees of
#                             freedom than this: its first candidates teach the rule how much pairing removes


def t_cdf(t, df):
    """P(T <= t) for Student's t with an integer df >= 1, in closed form (Abramowitz & Stegun 26.7.3 for odd df,
    26.7.4 for even df: the series in cos(theta), theta = atan(t / sqrt(df)))."""
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    if df % 2:
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        inside = (2 / math.pi) * (theta + (math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0))
    else:
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        inside = math.sin(theta) * total
    return 0.5 + inside / 2 if t >= 0 else 0.5 - inside / 2


def t_quantile(p, df):
    """The t with P(T <= t) = p (0.5 < p < 1) for Student's t with integer df, by bisection on t_cdf (1e-9)."""
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    while hi - lo > 1e-9 * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def threshold(rule, df):
    """The t a paired mean difference over its standard error must exceed to be kept, with df degrees of freedom
    (paired_sd's): the one-sided Student t quantile at false_keep / confirm (the rate split over the confirm looks
    after runs 2.., Bonferroni: a no-op is kept at most false_keep of the time whichever look keeps it)."""
    return t_quantile(1 - rule.false_keep / rule.confirm, df)


def pair_floor(rule):
    """The least sd of paired differences assumed (runs that agree exactly would make any gain certain): the rule's
    noise floor (sd_floor), else PAIRED_FLOOR_SDS x its noise sd, never below PRINT_FLOOR."""
    return max(rule.sd_floor, PAIRED_FLOOR_SDS * (rule.noise_sd or 0.0), PRINT_FLOOR)


def paired_sd(rule, diffs, pooled=(0.0, 0)):
    """(the sd of one paired difference, its degrees of freedom): pooled from the squared deviations of this
    tag's earlier paired verdicts around their means (pooled: (sum, degrees of freedom)) and of these diffs; before
    there are any, the unpaired sqrt(2) x noise sd (no correlation assumed) with PRIOR_DF degrees of freedom
    (None when no noise sd was measured either); at least pair_floor(rule). Pairing removes most of the noise (on the
    cpu profile the paired sd was 1/3 to 1/57 of the unpaired one: docs/benchmarks.md), so the baseline's
    unpaired noise is a fallback only: weighed in, it would outweigh dozens of paired degrees of freedom."""
    squares, df = pooled
    if len(diffs) > 1:
        own = statistics.variance(diffs)
        squares, df = squares + (len(diffs) - 1) * own, df + len(diffs) - 1
        if own > squares / df:              # this edit's differences spread more than the tag's: its own sd
            return max(math.sqrt(own), pair_floor(rule)), len(diffs) - 1
    if df:
        return max(math.sqrt(squares / df), pair_floor(rule)), df
    if not rule.sd:
        return None, 0
    return max(math.sqrt(2) * rule.sd, pair_floor(rule)), PRIOR_DF

def step(rule, diffs, pooled=(0.0, 0)):
    """The paired rule's decision after len(diffs) runs (diffs: gain of each run over the best's run at its
    seed; pooled: paired_sd's): after the first run, "discard" unless it beats the best's run (by more than
    FIRST_LOOK paired sds once the tag has pooled LEARN_DF degrees of freedom: a no-op then goes on 11 % of the
    time); later, "keep" when the mean over its standard
    error exceeds threshold(), "discard" when the mean is not above 0 or at the cap, else None: one more run."""
    mean = statistics.fmean(diffs)
    sd, df = paired_sd(rule, diffs, pooled)
    if mean <= 0 or sd is None and len(diffs) < 2:
        return "discard" if mean <= 0 else None
    if len(diffs) < 2:
        return None if sd is None or pooled[1] < LEARN_DF or mean > FIRST_LOOK * sd else "discard"
    if mean / (sd / math.sqrt(len(diffs))) > threshold(rule, df):
        return "keep"
    return "discard" if len(diffs) >= 1 + rule.confirm else None
