"""The target contract as the harness reads it (harness/run/target.py), against both shipped targets' own readers."""

import importlib.util

import pytest

import prepare
from harness.errors import SetupError
from harness.run.target import effective_budget

from helpers import REPO


def grpo_prepare():
    """grpo/prepare.py as a module (it shares its name with the root prepare.py)."""
    spec = importlib.util.spec_from_file_location("grpo_prepare", REPO / "grpo" / "prepare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("raw", [None, "", "300", "600", "2", "0.5", "1e3"])
def test_both_targets_read_the_budget_override_as_the_harness_does(raw, monkeypatch):
    """AUTORESEARCH_TIME_BUDGET: the harness's budget is each target's, and a target calls it overridden exactly
    when it differs from its own TIME_BUDGET (600 on the GRPO target is its full budget, not a smoke run)."""
    if raw is None:
        monkeypatch.delenv("AUTORESEARCH_TIME_BUDGET", raising=False)
    else:
        monkeypatch.setenv("AUTORESEARCH_TIME_BUDGET", raw)
    for module in (prepare, grpo_prepare()):
        seconds, overridden = module.time_budget()
        assert seconds == effective_budget(module.TIME_BUDGET)
        assert overridden == (seconds != module.TIME_BUDGET)
    if raw == "600":
        assert grpo_prepare().time_budget() == (600.0, False) and prepare.time_budget() == (600.0, True)


@pytest.mark.parametrize("raw", ["0", "-3", "nan", "inf", "five"])
def test_a_bad_budget_override_is_refused_by_every_reader(raw, monkeypatch):
    """A value that is not a positive, finite number: each reader refuses it, naming the variable."""
    monkeypatch.setenv("AUTORESEARCH_TIME_BUDGET", raw)
    with pytest.raises(SetupError, match="AUTORESEARCH_TIME_BUDGET"):
        effective_budget(300)
    with pytest.raises(prepare.PrepareError, match="AUTORESEARCH_TIME_BUDGET"):
        prepare.time_budget()
    with pytest.raises(SystemExit, match="AUTORESEARCH_TIME_BUDGET"):
        grpo_prepare().time_budget()
