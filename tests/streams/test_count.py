"""Count / sum with per-unit caps: reference, S_{k,k} and key cap, dead letters."""
from __future__ import annotations

import numpy as np
import pytest

from tests.support.streams import max_interval_sum
from transforms.streams import ContributionBounds, count_streams


def random_events(rng, horizon, units=4, keys=("a", "b", "c"), with_value=False):
    records = []
    for step in range(horizon):
        for _ in range(rng.integers(0, 6)):
            record = (step, f"u{rng.integers(units)}", keys[rng.integers(len(keys))])
            if with_value:
                record += (float(rng.uniform(-1, 4)),)
            records.append(record)
    return records


def test_uncapped_count_equals_plain_count():
    rng = np.random.default_rng(20)
    for _ in range(300):
        horizon = int(rng.integers(1, 8))
        records = random_events(rng, horizon)
        result = count_streams(records, horizon, ContributionBounds(10 ** 6, None, 10))
        for key in "abc":
            expected = np.bincount([r[0] for r in records if r[2] == key], minlength=horizon)
            assert np.array_equal(result.stream(key), expected)


@pytest.mark.parametrize("with_value,min_value", [(False, None), (True, None), (True, -0.5)])
def test_unit_contributions_are_in_s_k_k_on_at_most_m_keys(with_value, min_value):
    """The empirical neighbour test: removing one unit changes each key's stream by a vector
    of S_{k,k} (l1 <= k over all its keys, |entries| <= the per-step cap), on at most m keys;
    non-negative unless values may be negative (min_value < 0: values in [-1, 4) clamped to
    [-0.5, 2.5])."""
    rng = np.random.default_rng(21)
    negative = False
    for _ in range(400):
        horizon = int(rng.integers(1, 8))
        k, per_step, m = int(rng.integers(1, 5)), int(rng.integers(1, 3)), int(rng.integers(1, 3))
        bounds = ContributionBounds(k, per_step, m, max_value=2.5 if with_value else None,
                                    min_value=min_value)
        records = random_events(rng, horizon, with_value=with_value)
        full = count_streams(records, horizon, bounds)
        assert full.declaration.interval_bound == k == full.declaration.max_contributions
        for unit in {r[1] for r in records}:
            without = count_streams([r for r in records if r[1] != unit], horizon, bounds)
            diffs = [full.stream(key) - without.stream(key) for key in "abc"]
            touched = [d for d in diffs if np.any(d != 0)]
            assert len(touched) <= m
            total = sum(np.abs(d).sum() for d in diffs)
            assert total <= k + 1e-9
            floor = -per_step if min_value is not None else 0.0
            for d in diffs:
                assert np.all(d >= floor - 1e-12) and np.all(d <= per_step + 1e-9)
                assert max_interval_sum(d) <= k + 1e-9
            negative = negative or any(np.any(d < 0) for d in diffs)
    assert negative == (min_value is not None)  # the signed case did take negative values


def test_deterministic_drops():
    bounds = ContributionBounds(max_contributions=3, max_contributions_per_step=2,
                                max_keys_per_unit=1)
    records = [(0, "u", "b"), (0, "u", "a"), (0, "u", "a"), (0, "u", "a"), (1, "u", "a"),
               (2, "u", "a")]
    result = count_streams(records, 3, bounds)
    # step 0: keys a, b seen; "a" admitted first (canonical order); 2 of 3 "a" events (per step)
    assert result.stream("a").tolist() == [2, 1, 0] and result.stream("b").tolist() == [0, 0, 0]
    assert result.dropped == {"max_keys_per_unit": 1, "max_contributions_per_step": 1,
                              "max_contributions": 1}  # b; the third a of step 0; step 2
    sums = count_streams([(0, "u", "a", 5.0), (0, "u", "a", -2.0), (1, "u", "a", 1.5)], 2,
                         ContributionBounds(3, None, 1, max_value=2.0))
    assert sums.stream("a").tolist() == [2.0, 1.0]  # clamped to [0, 2], then cut at k = 3
    signed = count_streams([(0, "u", "a", 5.0), (0, "u", "a", -2.0), (1, "u", "a", 1.5)], 2,
                           ContributionBounds(3, None, 1, max_value=2.0, min_value=-1.0))
    # clamped to [-1, 2]: -1 (mass 1) then 2 (mass 2) fill k = 3; step 1 has no room left
    assert signed.stream("a").tolist() == [1.0, 0.0]


@pytest.mark.parametrize("record,reason", [
    ((0, None, "a"), "unit id must be a non-empty str or int"),
    ((0, "u", None), "key must be a non-empty str or int"),
    ((3, "u", "a"), "step must be an integer in [0, 3); got 3"),
    ((0, "u"), "record must be (step, unit, key)"),
])
def test_bad_events_become_dead_letters(record, reason):
    result = count_streams([record], 3, ContributionBounds(1))
    assert [(d.record, d.reason) for d in result.dead_letters] == [(record, reason)]


def test_bad_sum_values_become_dead_letters():
    result = count_streams([(0, "u", "a", float("nan")), (0, "u", "a", "3")], 2,
                           ContributionBounds(1, max_value=1.0))
    assert [d.reason for d in result.dead_letters] == ["value must be a finite number; got nan",
                                                       "value must be a finite number; got '3'"]


@pytest.mark.parametrize("kwargs,message", [
    ({"max_contributions": 0}, r"^`max_contributions` must be an integer >= 1; got 0\.$"),
    ({"max_contributions": 2, "max_contributions_per_step": 0},
     r"^`max_contributions_per_step` must be an integer >= 1; got 0\.$"),
    ({"max_contributions": 2, "max_keys_per_unit": 0},
     r"^`max_keys_per_unit` must be an integer >= 1; got 0\.$"),
    ({"max_contributions": 2, "max_value": -1.0},
     r"^`max_value` must be a positive finite number; got -1\.0\.$"),
    ({"max_contributions": 2, "max_value": 1.0, "min_value": 1.0},
     r"^`min_value` must be below max_value \(1\.0\); got 1\.0\.$"),
    ({"max_contributions": 2, "min_value": -1.0},
     r"^`min_value` must be None without a max_value"),
    ({"max_contributions": 2, "max_value": 1.0, "min_value": float("-inf")},
     r"^`min_value` must be a finite number; got -inf\.$"),
])
def test_bounds_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ContributionBounds(**kwargs)


@pytest.mark.parametrize("max_value,min_value", [(None, None), (2.5, None), (2.5, -0.7)])
def test_one_event_fast_path_equals_the_general_loop(max_value, min_value):
    """`truncate_one` (the unrolled single event) == the rule `truncate_events`: the same
    keys, contributions, dropped reasons and mass, over random states and events."""
    from transforms.streams.count import truncate_events, truncate_one
    rng = np.random.default_rng(22)
    for _ in range(3000):
        k, per_step, m = int(rng.integers(1, 6)), int(rng.integers(1, 4)), int(rng.integers(1, 3))
        limits = ContributionBounds(k, per_step, m, max_value=max_value,
                                    min_value=min_value).limits
        keys = [f"k{i}" for i in rng.permutation(3)[:int(rng.integers(0, m + 1))]]
        used = float(rng.integers(0, k + 1)) if max_value is None else float(rng.uniform(0, k))
        value = 1.0 if max_value is None else float(rng.uniform(-1, 4))
        event = (f"k{rng.integers(3)}", value)
        fast_keys, fast_out, fast_dropped = list(keys), [], {}
        fast = truncate_one(limits, fast_keys, used, 5, event, fast_out, fast_dropped)
        slow_keys, slow_out, slow_dropped = list(keys), [], {}
        slow = truncate_events(limits, slow_keys, used, 5, [event], slow_out, slow_dropped)
        assert (fast, fast_keys, fast_out, fast_dropped) == (slow, slow_keys, slow_out,
                                                            slow_dropped)


def test_grid_ranges_stay_inside_the_range_and_keep_a_unit_on_each_side():
    """`grid_range` over 2,000 random ranges and grids: the ends in grid units, times g, lie in
    [min_value, max_value] (up to float rounding); an end on the grid stays (M / (M / 100) is
    100 units, not 99); a grid that would round a side to 0 is refused in the config's terms."""
    from transforms.streams.count import grid_range
    rng = np.random.default_rng(23)
    for _ in range(2000):
        most = float(rng.uniform(0.01, 500))
        least = -float(rng.uniform(0.01, 500)) if rng.random() < 0.7 else 0.0
        g = max(most, -least) / 100
        if most < g or 0 < -least < g:  # a side narrower than one grid unit: refused
            with pytest.raises(ValueError, match=r"^`value_resolution` must be at most"):
                grid_range(least, most, g)
            continue
        low, high = grid_range(least, most, g)
        assert least - 1e-9 * g <= low * g and high * g <= most + 1e-9 * g
        assert high == 100 or -low == 100
    with pytest.raises(ValueError, match=r"^`value_resolution` must be at most max_value \(5\) "
                                         r"so values keep a grid unit"):
        grid_range(-1000.0, 5.0, 10.0)
    with pytest.raises(ValueError, match=r"^`value_resolution` must be at most \|min_value\| "
                                         r"\(2\) so negative values keep a grid unit"):
        grid_range(-2.0, 300.0, 3.0)
    with pytest.raises(ValueError, match=r"^`value_resolution` must be small enough for two "
                                         r"grid points in \[min_value, max_value\]"):
        grid_range(0.5, 0.6, 0.6)


def test_a_zero_value_is_neither_taken_nor_counted_as_cut():
    """Signed data centred on 0 (flights on time): zeros take nothing and cut nothing, so
    the operator's truncation counts name only what a cap cut."""
    from transforms.streams.count import truncate_events, truncate_one
    limits = ContributionBounds(4, None, 1, max_value=5.0, min_value=-5.0).limits
    for rule in (truncate_one, truncate_events):
        out, dropped = [], {}
        event = ("a", 0.0)
        used = rule(limits, [], 1.0, 3, event if rule is truncate_one else [event], out,
                    dropped)
        assert (used, out, dropped) == (1.0, [], {})
