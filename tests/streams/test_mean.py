"""The mean's one truncation rule (streams/mean.py) against the count rule it is built on."""
from __future__ import annotations


import numpy as np
import pytest

from transforms.streams.count import ContributionBounds, truncate_step
from transforms.streams.mean import COUNT, SUM, MeanProblem, mean_step
from transforms.streams.units import run_unit


def random_steps(rng, keys=("a", "b", "c"), low=0):
    return {int(step): [(keys[rng.integers(len(keys))], float(rng.integers(low, 40)))
                        for _ in range(int(rng.integers(1, 5)))]
            for step in rng.choice(6, size=int(rng.integers(1, 5)), replace=False)}


@pytest.mark.parametrize("value_range", [(0.0, 30.0), (-20.0, 30.0)])
@pytest.mark.parametrize("limits", [(1.0, 3, None, 1, None), (2.0, 4, None, 2, None),
                                    (5.0, 5, None, 3, None)])
def test_both_parts_keep_the_count_rules_events_and_the_smallest_values(limits, value_range):
    """3,000 random units: the COUNT part is `truncate_step` on the events counted as 1 (same
    `used`, admitted keys and drop counts); the SUM part's contribution of a key is the sum of
    its n smallest clamped values, n the count kept; both parts end in the same unit state.
    Signed values (a negative min_value) keep the same events."""
    rng = np.random.default_rng(int(limits[1]))
    low, cap = value_range
    for _ in range(3_000):
        by_step = random_steps(rng, low=-30 if low < 0 else 0)
        states = {}
        for part in (SUM, COUNT):
            keys, used, out, dropped = [], 0.0, [], {}
            ref_keys, ref_used, ref_out, ref_dropped = [], 0.0, [], {}
            for step in sorted(by_step):
                events = by_step[step]
                used = mean_step(part, value_range, limits, keys, used, step, events, out,
                                 dropped)
                ref_used = truncate_step(limits, ref_keys, ref_used, step,
                                         [(k, 1.0) for k, _ in events], ref_out, ref_dropped)
            assert (used, keys, dropped) == (ref_used, ref_keys, ref_dropped)
            if part == COUNT:
                assert out == ref_out
            else:
                expected = [(key, step, float(sum(sorted(
                    min(max(v, low), cap) for k, v in by_step[step] if k == key)[:int(n)])))
                    for key, step, n in ref_out]
                assert out == expected
            states[part] = (used, tuple(keys))
        assert states[SUM] == states[COUNT]


def test_parts_declare_their_streams_sensitivities():
    """One unit: at most k events, each of value <= cap grid units: the count streams change
    by l1 <= k, the sum streams by l1 <= k cap, over all its keys (the joint mass)."""
    bounds = ContributionBounds(4, 2, 3)
    count = MeanProblem(bounds, with_value=True, value_grid=0.5, max_value=10.0, part=COUNT)
    total = MeanProblem(bounds, with_value=True, value_grid=0.5, max_value=10.0, part=SUM)
    assert (count.declaration.interval_bound, count.declaration.max_contributions,
            count.declaration.joint_mass, count.declaration.keys_per_unit) == (4, 4, 4, 3)
    assert (total.declaration.interval_bound, total.declaration.max_contributions,
            total.declaration.joint_mass) == (80, 80, 80)
    floats = MeanProblem(bounds, with_value=True, max_value=2.5, part=SUM)  # no grid
    assert floats.declaration.max_contributions == 10  # ceil(4 x 2.5): never under
    # signed values: the mass is the largest magnitude, |min_value| here (-7.3 / 0.5 rounded
    # toward the inside: -14 grid units, -7.0, so a kept value stays in [min_value, max_value])
    signed = MeanProblem(bounds, with_value=True, value_grid=0.5, max_value=5.0,
                         min_value=-7.3, part=SUM)
    assert signed.value_range == (-14.0, 10.0)
    assert (signed.declaration.interval_bound, signed.declaration.max_contributions,
            signed.declaration.joint_mass) == (56, 56, 56)


def test_a_unit_run_of_both_parts_agrees_with_the_rule():
    bounds = ContributionBounds(3)
    by_step = {0: [("k", 14.0), ("k", 3.0)], 1: [("k", 20.0), ("j", 1.0), ("k", 2.0)]}
    runs = {part: run_unit(MeanProblem(bounds, with_value=True, value_grid=0.5,
                                       max_value=10.0, part=part), "u",
                           MeanProblem(bounds, with_value=True, value_grid=0.5,
                                       max_value=10.0, part=part).init_state(), by_step, 0, 2)
            for part in (SUM, COUNT)}
    assert runs[COUNT].contributions == [("k", 0, 2.0), ("k", 1, 1.0)]
    assert runs[SUM].contributions == [("k", 0, 17.0), ("k", 1, 2.0)]  # 3 + 14; then 2
    assert runs[SUM].state == runs[COUNT].state and runs[SUM].dropped == runs[COUNT].dropped


@pytest.mark.parametrize("kwargs,message", [
    ({"part": "both"}, r"^`part` must be one of"),
    ({"bounds": ContributionBounds(2, max_value=3.0)}, r"^`bounds` must be event counts"),
    ({"max_value": None}, r"^`bounds` must be event counts"),
    ({"value_grid": 1e-15}, r"^`value_resolution` must be"),
])
def test_bad_parts_are_refused(kwargs, message):
    base = dict(bounds=ContributionBounds(2), with_value=True, value_grid=0.5, max_value=10.0,
                part=SUM)
    base.update(kwargs)
    with pytest.raises(ValueError, match=message):
        MeanProblem(**base)


def test_the_kept_values_of_a_mean_stay_in_its_range_on_any_grid():
    """The mean's interval looks for the mean in [min_value, max_value]: its range in grid
    units, rounded toward the inside, keeps every kept value there (a grid of 3 on [-2, 300]
    would round -2 to -3 if rounded to the nearest: refused instead, -2 keeps no grid unit)."""
    rng = np.random.default_rng(24)
    for _ in range(500):
        most, least = float(rng.uniform(1, 400)), -float(rng.uniform(1, 400))
        g = float(rng.uniform(0.01, min(most, -least)))
        part = MeanProblem(ContributionBounds(3), with_value=True, value_grid=g, max_value=most,
                           min_value=least, part=SUM)
        low, high = part.value_range
        assert least - 1e-9 * g <= low * g and high * g <= most + 1e-9 * g
    with pytest.raises(ValueError, match=r"^`value_resolution` must be at most \|min_value\|"):
        MeanProblem(ContributionBounds(3), with_value=True, value_grid=3.0, max_value=300.0,
                    min_value=-2.0, part=SUM)
