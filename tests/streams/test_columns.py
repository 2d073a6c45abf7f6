"""The columnar truncation (`truncate_columns`) against the rule (`CountProblem.run`) and the
bucket rule (`bucket_of`) against its vectorised form, on random data."""
from __future__ import annotations

import collections
import random

import numpy as np
import pyarrow as pa
import pytest

from transforms.streams.columns import (BUCKETS, Codes, UnitColumns, as_column, bucket_of,
                                        concat, exact_enough, normalised, truncate_columns,
                                        unit_buckets)
from transforms.streams.count import ContributionBounds
from transforms.streams.units import CountProblem, payloads_by_step, run_unit


def problem_for(rng: random.Random) -> CountProblem:
    caps = dict(max_contributions=rng.randint(1, 9),
                max_contributions_per_step=rng.choice([None, 1, 2, 3, 5]),
                max_keys_per_unit=rng.randint(1, 4))
    if rng.random() < 0.4:
        return CountProblem(ContributionBounds(**caps))
    low = rng.choice([0.0, -2.0, -5.0])
    high = rng.choice([1.0, 3.0, 4.0])
    grid = rng.choice([0.5, 1.0])
    bounds = ContributionBounds(**caps, max_value=high / grid,
                                min_value=low / grid if low else None)
    return CountProblem(bounds, with_value=True, value_grid=grid, max_value=high,
                        min_value=low or None)


def random_events(rng: random.Random, problem: CountProblem, units: list, keys: list):
    events = []
    for _ in range(rng.randint(1, 160)):
        value = 1.0 if not problem.with_value else float(
            problem.column_values(np.array([rng.uniform(-7, 6) if rng.random() < 0.9
                                            else 0.0]), 1)[0])
        events.append((rng.choice(units), rng.choice(keys), rng.randrange(12), value))
    return events


def reference(problem, events):
    """Per unit through the rule: ({(key, step): [signed takes]}, {unit: state}, dropped)."""
    per_unit = collections.defaultdict(list)
    for unit, key, step, value in events:
        per_unit[unit].append((step, 0, (key, value)))
    cells, states, dropped = collections.defaultdict(float), {}, collections.Counter()
    present = set()
    for unit, unit_events in per_unit.items():
        by_step = payloads_by_step(unit_events, ordered=problem.ordered)
        run = run_unit(problem, unit, problem.init_state(), by_step, 0, 12)
        states[unit] = run.state
        dropped.update(run.dropped)
        for key, step, value in run.contributions:
            cells[(key, step)] += value
            present.add((key, step))
    return {cell: cells[cell] for cell in present}, states, +dropped


def columnar(problem, events):
    units, keys = Codes(), Codes()
    u = units.of([e[0] for e in events])
    k = keys.of([e[1] for e in events])
    s = np.array([e[2] for e in events], dtype=np.int64)
    v = np.array([e[3] for e in events], dtype=np.float64)
    assert exact_enough(problem.limits, v)
    done = truncate_columns(problem.limits, u, len(units.ids), k, keys.canonical_ranks(), s, v)
    cells = {(keys.ids[key], step): float(value) for key, step, value in
             zip(done.cell_keys.tolist(), done.cell_steps.tolist(), done.cell_values.tolist())}
    states = {units.ids[code]: (used, tuple(keys.ids[c] for c in admitted.tolist()))
              for code, (used, admitted) in enumerate(zip(done.used.tolist(), done.admitted))}
    return cells, states, collections.Counter(done.dropped)


@pytest.mark.parametrize("seed", range(40))
def test_columnar_truncation_is_the_rule(seed):
    """Same (key, step) sums (and the same cells, zero sums included), the same unit states
    (used, admitted keys in order) and dropped counts by bound, for counts and grid sums
    (signed ones too), keys of mixed types (canonical order differs from numeric order)."""
    rng = random.Random(seed)
    problem = problem_for(rng)
    units = [f"u{i}" for i in range(rng.randint(1, 6))] + [7, -3]
    keys = rng.sample([9, 10, "a", "b", "é", 100, ("t", 1)], rng.randint(1, 6))
    events = random_events(rng, problem, units, keys)
    cells, states, dropped = reference(problem, events)
    got_cells, got_states, got_dropped = columnar(problem, events)
    assert got_cells == cells
    assert got_states == {unit: (state.used, state.keys) for unit, state in states.items()}
    assert got_dropped == dropped


def test_a_bucket_whose_masses_could_round_is_refused():
    limits = ContributionBounds(2 ** 52, max_value=2.0 ** 51).limits
    assert exact_enough(limits, np.array([1.0, 2.0 ** 50]))
    assert not exact_enough(limits, np.array([2.0 ** 51, 2.0 ** 51]))


def test_bucket_of_matches_its_vectorised_form():
    rng = random.Random(5)
    ints = [rng.randrange(-2 ** 63, 2 ** 63) for _ in range(500)] + [0, -1, 255, 256]
    assert unit_buckets(pa.array(ints, pa.int64())).tolist() == [bucket_of(i) for i in ints]
    texts = ["".join(rng.choice("abcé€😀 \"'\\") for _ in range(rng.randint(1, 40)))
             for _ in range(500)]
    column = pa.array(["x"] + texts, pa.string()).slice(1)  # an offset into its buffers
    assert unit_buckets(column).tolist() == [bucket_of(t) for t in texts]
    assert unit_buckets(normalised(pa.array(texts, pa.large_string()))).tolist() == \
        [bucket_of(t) for t in texts]
    large = pa.array(["x"] + texts, pa.large_string()).slice(1)
    assert unit_buckets(large).tolist() == [bucket_of(t) for t in texts]
    assert unit_buckets(pa.array([1.5])) is None
    spread = collections.Counter(bucket_of(f"user-{i}") for i in range(BUCKETS * 50))
    assert len(spread) == BUCKETS and max(spread.values()) < 100  # mean 50 per bucket
    assert 0 <= bucket_of(("a", 1)) < BUCKETS


def test_split_and_concat_keep_every_event_once():
    rng = random.Random(6)
    units = pa.array([rng.randrange(1000) for _ in range(300)], pa.int64())
    keys = pa.array([rng.choice("xyz") for _ in range(300)])
    part = UnitColumns(units, keys, np.arange(300), np.ones(300))
    pieces = part.split()
    assert sum(len(p) for _, p in pieces) == 300
    assert all(set(p.buckets().tolist()) == {b} for b, p in pieces)
    mixed = concat([UnitColumns(["s"], ["x"], np.array([1]), np.array([1.0])), pieces[0][1]])
    assert isinstance(mixed.units, list) and len(mixed) == 1 + len(pieces[0][1])
    codes = Codes()
    assert codes.of(pa.array([5, 6, 5])).tolist() == [0, 1, 0]
    assert codes.of([6, "6"]).tolist() == [1, 2]  # 6 and "6" are two ids


def test_as_column_makes_arrow_ids_only_of_one_kind():
    assert as_column([1, 2]).type == pa.int64() and as_column(["a"]).type == pa.large_string()
    assert as_column([1, "a"]) == [1, "a"] and as_column([2 ** 70]) == [2 ** 70]
    assert as_column([("a", 1)]) == [("a", 1)]


def test_an_id_of_a_str_or_int_subclass_is_the_plain_id():
    """numpy's str_ and an IntEnum equal a str and an int: one unit, so one bucket (else a
    unit given both ways would be truncated twice), and `parse` makes them the plain id."""
    import enum

    class Code(enum.IntEnum):
        A = 300
    assert bucket_of(np.str_("u1")) == bucket_of("u1") and bucket_of(Code.A) == bucket_of(300)
    assert bucket_of((np.str_("g"), 1)) == bucket_of(("g", 1))
    problem = CountProblem(ContributionBounds(3))
    for element in ((np.str_("u1"), "k"), ("u1", np.str_("k")), (Code.A, "k")):
        parsed, _ = problem.parse(element)
        assert type(parsed.unit) in (str, int) and type(parsed.payload[0]) is str
