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


def test_the_keys_cut_most_are_the_ones_caps_finds_for_the_same_bounds(tmp_path, capsys):
    """The run's per-key shares (its truncation DoFn's operator metrics) equal what
    `pipelines.caps` computes from the input with the job's own rule, key by key; the
    summary line names the worst keys."""
    import json
    import os

    import yaml

    from pipelines import caps, config as job_config, run as job_run
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    config = yaml.safe_load(open(os.path.join(root, "configs", "active_users.yaml")))
    config.update(output={"path": str(tmp_path), "formats": ["jsonl"]},
                  secret={"seed": 1, "insecure": True})
    config["bounds"]["max_contributions"] = 3
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(path), "--json"]) == 0
    worst = json.loads(capsys.readouterr().out)["operator_not_private"]["worst_keys"]
    found = caps.explore(job_config.load(str(path)), {"max_contributions": [3]}, 10 ** 6)
    expected = found[0]["worst_keys_not_private"]
    assert [(row["key"], row["share_cut"]) for row in worst] == [
        (row["key"], row["share_cut"]) for row in expected]
    assert all(0 < row["kept"] < row["input"] for row in worst)
    line = operator_summary.describe({"events_in_window": 1, "truncated": {},
                                      "dead_letters": {}, "worst_keys": worst})
    top = worst[0]
    assert (f"keys cut most: {top['key']} {100 * top['share_cut']:.1f} % "
            f"({top['input'] - top['kept']} of {top['input']})") in line


def test_worst_keys_are_the_largest_shares_cut_and_none_without_counts():
    counters = {"key_input:a": 10, "key_kept:a": 10, "key_input:b": 8, "key_kept:b": 2,
                "key_input:c": 4, "key_input:d": 5, "key_kept:d": 4}
    assert operator_summary.worst_keys(counters) == [
        {"key": "c", "input": 4, "kept": 0, "share_cut": 1.0},
        {"key": "b", "input": 8, "kept": 2, "share_cut": 0.75},
        {"key": "d", "input": 5, "kept": 4, "share_cut": 0.2}]  # a: nothing cut, not listed
    assert operator_summary.worst_keys({"events_in_window": 3}) is None


def test_a_horizon_with_no_event_in_it_warns_and_one_with_some_does_not():
    """A mistyped origin (or seconds read as milliseconds) leaves every event outside the
    horizon: a warning; a source holding history beyond a horizon with events in it: none."""
    from pipelines import config as job_config
    job = job_config.load("demo:active_users")
    line = operator_summary.horizon_warning(
        {"events_in_window": 0, "dead_letters": {"outside_horizon": 3861}}, job)
    assert line == ("WARNING (operator-only, NOT private): 3861 events fall outside the "
                    "horizon [2026-01-05T00:00:00+00:00, 2026-01-07T00:00:00+00:00), 0 in it: "
                    "check steps.origin and input.timestamp_format")
    for summary in ({"events_in_window": 5, "dead_letters": {"outside_horizon": 3861}},
                    {"events_in_window": 0, "dead_letters": {}},
                    {"events_in_window": None, "dead_letters": {"outside_horizon": 1}}):
        assert operator_summary.horizon_warning(summary, job) is None


def test_odd_keys_stay_on_one_short_line():
    worst = [{"key": "a\nb", "input": 4, "kept": 1, "share_cut": 0.75},
             {"key": "k" * 3000, "input": 4, "kept": 2, "share_cut": 0.5}]
    line = operator_summary.describe({"events_in_window": 8, "truncated": {},
                                      "dead_letters": {}, "worst_keys": worst})
    part = [p for p in line.splitlines() if p.strip().startswith("keys cut most")][0]
    assert "'a\\nb' 75.0 %" in part and "k" * 21 + "..." in part and len(part) < 200
