"""harness/tag/settings.py: argv -> Settings. Every numeric flag of the loop and `try` is a finite number in range, or
exits 2 with argparse's message naming the flag and the range (nothing else happens: no branch, no file)."""

import pytest

from harness.tag.settings import parse

LOOP = ["--tag", "t", "--proposer", "random"]
TRY = ["try", "--tag", "t", "--baseline"]


@pytest.mark.parametrize("argv, message", [
    (LOOP + ["--timeout", "nan"], "argument --timeout: 'nan': use a finite number above 0"),
    (LOOP + ["--timeout", "inf"], "argument --timeout: 'inf': use a finite number above 0"),
    (LOOP + ["--timeout", "0"], "argument --timeout: '0': use a finite number above 0"),
    (LOOP + ["--retry-base-delay", "-1"], "argument --retry-base-delay: '-1': use a finite number above 0"),
    (LOOP + ["--hours=-inf"], "argument --hours: '-inf': use a finite number of at least 0"),
    (LOOP + ["--max-cost-usd", "nan"], "argument --max-cost-usd: 'nan': use a finite number of at least 0"),
    (LOOP + ["--max-experiments", "1.5"], "argument --max-experiments: '1.5' is not an integer"),
    (LOOP + ["--max-experiments", "-1"], "argument --max-experiments: '-1': use a finite number of at least 0"),
    (LOOP + ["--baseline-runs", "0"], "argument --baseline-runs: '0': use a finite number of at least 1"),
    (TRY + ["--margin", "nan"], "argument --margin: 'nan': use a finite number of at least 0"),
    (TRY + ["--confirm", "-1"], "argument --confirm: '-1': use a finite number of at least 0"),
    (TRY + ["--timeout", "1e999"], "argument --timeout: '1e999': use a finite number above 0"),
    (LOOP + ["--false-keep-rate", "0"], "argument --false-keep-rate: '0': use a rate above 0 and below 0.5 (e.g. "
                                        "0.02: one kept no-op per 50; 0 would keep nothing, 0.5 is a coin toss)"),
    (TRY + ["--false-keep-rate", "0.5"], "argument --false-keep-rate: '0.5': use a rate above 0 and below 0.5 (e.g. "
                                         "0.02: one kept no-op per 50; 0 would keep nothing, 0.5 is a coin toss)"),
    (LOOP + ["--false-keep-rate", "nan"], "argument --false-keep-rate: 'nan': use a rate above 0 and below 0.5 (e.g. "
                                          "0.02: one kept no-op per 50; 0 would keep nothing, 0.5 is a coin toss)"),
    (LOOP + ["--verdict", "paired", "--margin", "0.1"], "--margin is the margin rule's: use --verdict margin with it "
                                                        "(the paired rule has no margin: --false-keep-rate sets how "
                                                        "sure it must be)"),
    (TRY + ["--verdict", "margin", "--false-keep-rate", "0.1"], "--false-keep-rate is the paired rule's: leave it out "
                                                                "with --verdict margin or --margin (the margin decides "
                                                                "there)"),
    (LOOP + ["--margin", "0.01", "--false-keep-rate", "0.1"], "--false-keep-rate is the paired rule's: leave it out "
                                                              "with --verdict margin or --margin (the margin decides "
                                                              "there)"),
    (LOOP + ["--llm-share", "0"], "argument --llm-share: '0': use a finite number above 0 and at most 1"),
    (LOOP + ["--llm-share", "1.5"], "argument --llm-share: '1.5': use a finite number above 0 and at most 1"),
    (LOOP + ["--stall", "0"], "argument --stall: '0': use a finite number above 0"),
    (LOOP + ["--stall", "2.5"], "argument --stall: '2.5' is not an integer"),
    (["--tag", "a..b"], "--tag 'a..b': use up to 100 letters, digits, '.', '_' and '-', starting with a letter or digit, "
                        "without '..' and not ending in '.' or '.lock' (it names a git branch; e.g. nov30)"),
    (["--tag", "a."], "--tag 'a.': use up to 100 letters, digits, '.', '_' and '-', starting with a letter or digit, "
                      "without '..' and not ending in '.' or '.lock' (it names a git branch; e.g. nov30)"),
    (["--tag=-x"], "--tag '-x': use up to 100 letters, digits, '.', '_' and '-', starting with a letter or digit, "
                      "without '..' and not ending in '.' or '.lock' (it names a git branch; e.g. nov30)"),
])
def test_a_numeric_flag_out_of_range_exits_2_naming_it(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        parse(argv)
    assert stop.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith(f"error: {message}")


def test_numbers_in_range_are_parsed():
    s = parse(LOOP + ["--timeout", "30", "--hours", "0.5", "--max-experiments", "0", "--retry-base-delay", "0.25",
                      "--margin", "0", "--confirm", "0", "--baseline-runs", "2"])
    assert (s.timeout, s.hours, s.max_experiments, s.retry_base_delay, s.margin, s.confirm, s.baseline_runs) == \
        (30.0, 0.5, 0, 0.25, 0.0, 0, 2)
    assert type(s.max_experiments) is int and type(s.baseline_runs) is int
    assert (parse(LOOP + ["--false-keep-rate", "0.1"]).false_keep, parse(TRY).false_keep, parse(TRY).verdict) == \
        (0.1, None, None)
    h = parse(["--tag", "t", "--proposer", "hybrid", "--llm-share", "1", "--stall", "3", "--sampler", "tpe"])
    assert (h.llm_share, h.stall, h.sampler, h.llm) == (1.0, 3, "tpe", None)   # no key here: make_proposer stops
