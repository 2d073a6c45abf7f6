"""CountDistinct and the generic per-entity hook: references, theorems, negative controls."""
from __future__ import annotations

import numpy as np
import pytest

from tests.support.streams import (flippancy, is_alternating, max_interval_sum,
                                   neighbour_differences, presence_by_step,
                                   random_item_stream)
from transforms.streams import (EntityCardinality, EntityState, count_distinct,
                                count_distinct_streams, entity_difference_streams)

N_STREAMS = 1500


def reference_count_distinct(records, horizon, key=None):
    """CountDistinct(x)[t] recomputed from scratch at every step, then differenced."""
    mine = [r for r in records if r[3] == key]
    presence = presence_by_step(mine, horizon)
    totals = np.array([sum(series[t] for series in presence.values()) for t in range(horizon)])
    return np.diff(np.concatenate(([0], totals)))


def reference_truncation(records, horizon, k):
    """trunc(x) the slow way: per item, keep a step's updates iff the flippancy of the kept
    stream, recomputed from scratch, stays <= k."""
    kept = []
    for item in sorted({r[2] for r in records}):
        mine = []
        for t in range(horizon):
            step = [r for r in records if r[2] == item and r[0] == t]
            if step and flippancy(presence_by_step(mine + step, horizon)[item]) > k:
                continue
            mine += step
        kept += mine
    return kept


def test_incremental_equals_from_scratch_reference_without_truncation():
    rng = np.random.default_rng(1)
    for _ in range(N_STREAMS):
        horizon = int(rng.integers(1, 9))
        records = random_item_stream(rng, horizon)
        result = count_distinct_streams(records, horizon, max_flips=horizon + 1)
        assert np.array_equal(result.stream(None), reference_count_distinct(records, horizon))
        assert result.dropped.get("contribution bound", 0) == 0


def test_truncation_equals_slow_reference():
    rng = np.random.default_rng(2)
    for _ in range(N_STREAMS):
        horizon, k = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        records = random_item_stream(rng, horizon, items=4)
        expected = reference_count_distinct(reference_truncation(records, horizon, k), horizon)
        assert np.array_equal(count_distinct_streams(records, horizon, k).stream(None), expected)


def test_truncation_is_identity_when_flippancy_is_within_bound():
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(N_STREAMS):
        horizon = int(rng.integers(1, 9))
        records = random_item_stream(rng, horizon)
        k = max([flippancy(s) for s in presence_by_step(records, horizon).values()] + [1])
        result = count_distinct_streams(records, horizon, max_flips=k)
        assert result.dropped.get("contribution bound", 0) == 0
        assert np.array_equal(result.stream(None), reference_count_distinct(records, horizon))
        checked += k > 1
    assert checked > 100


def check_count_distinct_theorems(machine_factory, seed, streams=N_STREAMS):
    """Thm 6.2 / 6.8 after truncation: every neighbour difference is alternating, l1 <= k."""
    rng = np.random.default_rng(seed)
    for _ in range(streams):
        horizon, k = int(rng.integers(2, 10)), int(rng.integers(1, 4))
        records = random_item_stream(rng, horizon, items=3, max_per_step=5)
        machine = machine_factory(k)
        make = lambda recs: entity_difference_streams(recs, horizon, machine)  # noqa: E731
        for _, diffs in neighbour_differences(records, horizon, make):
            for diff in diffs.values():
                if not (is_alternating(diff) and np.abs(diff).sum() <= k):
                    return False
    return True


def test_neighbours_differ_by_alternating_vectors_with_at_most_k_flips():
    assert check_count_distinct_theorems(count_distinct, seed=4)


class NoTruncation(EntityCardinality):
    def step(self, state, ops):
        count = state.count + sum(1 if op == "+" else -1 for op in ops)
        value = int(count > 0)
        change = value - state.value
        return change, EntityState(count, value, state.used + abs(change)), 0


class OffByOne(EntityCardinality):
    def step(self, state, ops):
        count = state.count + sum(1 if op == "+" else -1 for op in ops)
        value = int(count > 0)
        if state.used + abs(value - state.value) > self.max_contributions + 1:
            return 0, state, len(ops)
        change = value - state.value
        return change, EntityState(count, value, state.used + abs(change)), 0


class PerUpdateFlips(EntityCardinality):
    """Counts a flip for every update that changes presence, even within one step."""
    def step(self, state, ops):
        count, used, value = state.count, state.used, state.value
        kept = 0
        for op in ops:
            new = count + (1 if op == "+" else -1)
            flip = int(new > 0) != int(count > 0)
            if used + flip > self.max_contributions:
                continue
            count, used, kept = new, used + flip, kept + 1
        value = int(count > 0)
        return value - state.value, EntityState(count, value, used), len(ops) - kept


@pytest.mark.parametrize("broken", [NoTruncation, OffByOne])
def test_negative_control_broken_truncation_fails_the_theorem_check(broken):
    assert not check_count_distinct_theorems(
        lambda k: broken(lambda n: int(n > 0), 1, k), seed=5, streams=400)


def test_negative_control_per_update_flip_counting_breaks_trunc_identity():
    rng = np.random.default_rng(6)
    for _ in range(N_STREAMS):
        horizon = int(rng.integers(2, 9))
        records = random_item_stream(rng, horizon, items=3, max_per_step=5)
        k = max([flippancy(s) for s in presence_by_step(records, horizon).values()] + [1])
        broken = entity_difference_streams(records, horizon,
                                           PerUpdateFlips(lambda n: int(n > 0), 1, k))
        if not np.array_equal(broken.stream(None), reference_count_distinct(records, horizon)):
            return
    pytest.fail("per-update flip counting was never caught")


def test_generic_hook_with_interval_bound_2():
    """g(n) = clip(n, 0, 2) (items counted with multiplicity up to 2): S_{2,k} after truncation,
    and equal to the from-scratch value when the l1 mass is within the bound."""
    g = lambda n: min(max(n, 0), 2)  # noqa: E731
    rng = np.random.default_rng(7)
    for _ in range(600):
        horizon, k = int(rng.integers(2, 8)), int(rng.integers(1, 5))
        records = random_item_stream(rng, horizon, items=3, max_per_step=4)
        machine = EntityCardinality(g, 2, k)
        make = lambda recs: entity_difference_streams(recs, horizon, machine)  # noqa: E731
        for _, diffs in neighbour_differences(records, horizon, make):
            for diff in diffs.values():
                assert max_interval_sum(diff) <= 2 and np.abs(diff).sum() <= k
        wide = entity_difference_streams(records, horizon, EntityCardinality(g, 2, 10 ** 6))
        totals = [sum(g(sum(1 if r[1] == "+" else -1 for r in records if r[2] == item
                             and r[0] <= t)) for item in {r[2] for r in records})
                  for t in range(horizon)]
        assert np.array_equal(wide.totals(None), np.array(totals, dtype=np.int64))


def test_generic_hook_rejects_values_outside_declared_range():
    machine = EntityCardinality(lambda n: n, 1, 3)
    with pytest.raises(ValueError, match=r"^`g\(state\)` must be an integer in \[0, 1\] "
                                         r"\(the declared D\); got 2\.$"):
        entity_difference_streams([(0, "+", "a"), (0, "+", "a")], 2, machine)


def test_key_cap_keeps_first_keys_and_bounds_neighbour_keys():
    records = [(0, "+", "item", "b"), (0, "+", "item", "a"), (1, "+", "item", "c"),
               (1, "+", "other", "c")]
    result = count_distinct_streams(records, 3, max_flips=1, max_keys_per_unit=2)
    assert sorted(result.streams) == ["a", "b", "c"]  # "c" only from "other"
    assert result.stream("c").tolist() == [0, 1, 0] and result.dropped["max_keys_per_unit"] == 1
    assert result.declaration.keys_per_unit == 2
    rng = np.random.default_rng(8)
    for _ in range(300):
        horizon = int(rng.integers(2, 7))
        recs = random_item_stream(rng, horizon, items=3, keys=("x", "y", "z"))
        make = lambda r: count_distinct_streams(r, horizon, 2, max_keys_per_unit=2)  # noqa: E731
        for _, diffs in neighbour_differences(recs, horizon, make):
            assert sum(1 for d in diffs.values() if d.any()) <= 2


def test_set_semantics_last_update_of_the_step_wins():
    records = [(0, "+", "a"), (0, "+", "a"), (1, "-", "a"), (2, "+", "a"), (2, "-", "a")]
    counted = count_distinct_streams(records, 3, 5)
    assert counted.stream(None).tolist() == [1, 0, 0]  # count 2 -> 1 -> 1: present throughout
    as_set = count_distinct_streams(records, 3, 5, semantics="set")
    assert as_set.stream(None).tolist() == [1, -1, 0]


@pytest.mark.parametrize("record,reason", [
    ((0, "*", "a"), "op must be '+' or '-'; got '*'"),
    ((5, "+", "a"), "step must be an integer in [0, 3); got 5"),
    ((-1, "+", "a"), "step must be an integer in [0, 3); got -1"),
    ((1.0, "+", "a"), "step must be an integer in [0, 3); got 1.0"),
    ((0, "+", None), "item id must be a non-empty str or int"),
    ((0, "+", ""), "item id must be a non-empty str or int"),
    ((0, "+", ["list"]), "item id must be a non-empty str or int"),
    ((0, "+"), "record must be (step, op, entity) or (step, op, entity, key)"),
    ("garbage", "record must be (step, op, entity) or (step, op, entity, key)"),
])
def test_malformed_updates_become_dead_letters(record, reason):
    result = count_distinct_streams([record, (0, "+", "ok")], 3, 1)
    assert [(d.record, d.reason) for d in result.dead_letters] == [(record, reason)]
    assert result.stream(None).tolist() == [1, 0, 0]
