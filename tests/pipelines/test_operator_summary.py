"""The operator summary (pipelines/operator_summary.py): its warnings and its one line."""
from __future__ import annotations

import pytest

from pipelines import operator_summary


@pytest.mark.parametrize("name,truncated,events,bound,vary", [
    ("active_users", {"max_contributions": 51, "max_keys_per_unit": 1}, 100,
     "max_contributions", "max_contributions=6,12,24,48"),
    ("active_users", {"max_contributions_per_step": 60}, 100, "max_contributions_per_step",
     "max_contributions_per_step=2,4,8,16"),
    ("cart_items", {"contribution_bound": 7}, 10, "max_flips", "max_flips=6,12,24,48"),
    ("friend_degrees", {"contribution_bound": 9}, 10, "max_updates", "max_updates=4,8,16,32"),
    ("seconds_on_page", {"max_contributions": 9}, 10, "max_contributions",
     "max_contributions=600,1200,2400,4800"),
])
def test_the_warning_names_the_bound_that_cut_most_and_values_to_try(name, truncated, events,
                                                                     bound, vary):
    from pipelines import config as job_config
    job = job_config.load(f"demo:{name}")
    line = operator_summary.truncation_warning(
        {"events_in_window": events, "truncated": truncated}, job, f"demo:{name}")
    most = max(truncated.values())
    assert f"(most by {bound}: {most})" in line
    assert line.endswith(f"python3 -m pipelines.caps --config demo:{name} --vary {vary}")
    cut = sum(truncated.values())
    assert f"cut {100.0 * cut / events:.1f} % of the {events} events" in line
    half = {"events_in_window": 2 * cut, "truncated": truncated}  # exactly half: no warning
    assert operator_summary.truncation_warning(half, job, "x.yaml") is None
    assert operator_summary.truncation_warning({"events_in_window": None, "truncated": {}},
                                               job) is None


def test_a_means_warning_says_how_caps_reads_its_config():
    from pipelines import config as job_config
    job = job_config.load("demo:mean_seconds")
    line = operator_summary.truncation_warning(
        {"events_in_window": 10, "truncated": {"max_contributions": 6}}, job,
        "configs/mean_seconds.yaml")
    assert "--config configs/mean_seconds.yaml --vary max_contributions=10,20,40,80" in line
    assert "`transform: count`" in line


def test_the_line_counts_values_clamped_at_each_end():
    summary = {"events_in_window": 10, "truncated": {}, "dead_letters": {},
               "clamped": {"values_below_min_value": 3, "values_above_max_value": 1}}
    line = operator_summary.describe(summary)
    assert "4 values clamped (3 below min_value, 1 above max_value)" in line
    assert "clamped" not in operator_summary.describe(dict(summary, clamped=None))
