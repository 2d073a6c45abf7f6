"""The bounded stages' fast paths equal the Beam-free reference, bit for bit.

`transforms.streams.units.advance_unit` over each unit's `sorted_payloads` is the semantics;
the bounded truncation (`run_unit`: `Problem.run`, one pass for counts, sums and entities, payloads
ordered only where order matters), the per-bundle exact sums (`KeySums`: integers as ints,
fractions as Shewchuk partials) and the key coder's fast paths must give the same bits.
"""
from __future__ import annotations

import copy
import json
import math
import random

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue

from transforms.bounded import (KeySums, SumPerKey, TruncateBucketsFn, TruncateUnits,
                                TruncateUnitsFn)
from transforms.messages import KeyCoder, StepWindow, tagged
from transforms.stages import AssignSteps
from transforms.streams.units import payloads_by_step, run_unit, sorted_payloads
from transforms.steps import TimeSteps
from transforms.streams.columns import UnitColumns, bucket_of
from transforms.streams import ContributionBounds, count_distinct
from transforms.streams.records import Declaration
from transforms.streams.units import (CountProblem, DeclaredProblem, DegreeProblem,
                                      EntityProblem, TriangleProblem, advance_unit,
                                      steps_to_run)

HORIZON = 8
KEYS = ["a", "b", 3, ("g", 1), "a'b", 'q"x']


def problems():
    return {
        "count": CountProblem(ContributionBounds(3, 2, 2)),
        "count_one_key": CountProblem(ContributionBounds(4, None, 1)),
        "count_many": CountProblem(ContributionBounds(50, 7, 5)),
        "sum_fractional": CountProblem(ContributionBounds(5, 3, 2, max_value=2.5),
                                       with_value=True),
        "sum_grid": CountProblem(ContributionBounds(40, None, 3, max_value=30.0),
                                 with_value=True, value_grid=0.3, max_value=9.0),
        "distinct": EntityProblem(count_distinct(3), max_keys_per_unit=2),
        "distinct_one_key": EntityProblem(count_distinct(1), max_keys_per_unit=1),
        "distinct_set": EntityProblem(count_distinct(2, "set"), max_keys_per_unit=3),
        "degree": DegreeProblem(3),
        "triangles": TriangleProblem(max_degree=3, max_contribution=4),
        "declared": DeclaredProblem(Declaration(1, 3, 1, "declared"), integers=False),
    }


def random_element(name, rng):
    key = rng.choice(KEYS)
    if name.startswith("count"):
        return (rng.choice(["u", "v", 7]), key)
    if name.startswith("sum"):
        value = rng.choice([0.1, 0.7, 1.0, 2.0, 2.4999, 3.7, 1e-17, -1.0, 0.30000000000000004])
        return (rng.choice(["u", "v"]), key, value)
    if name.startswith("distinct"):
        return (rng.choice("+-"), rng.choice(["i", "j"]), key)
    if name in ("degree", "triangles"):
        a, b = rng.sample(range(5), 2)
        return (rng.choice("++-"), (a, b))
    return (rng.choice(["k", "m"]), rng.choice([1.0, 0.1, 0.2, 1e15, -3.0, 0.3]))


def random_units(name, problem, rng, n):
    """{unit: [Event tuple (step, micros, payload)]}, with shared event times (ties)."""
    units = {}
    for _ in range(n):
        parsed, reason = problem.parse(random_element(name, rng))
        assert parsed is not None, reason
        step = rng.randrange(HORIZON)
        micros = step * 1000 + rng.choice([0, 0, 1, 5, rng.randrange(1000)])
        units.setdefault(parsed.unit, []).append((step, micros, parsed.payload))
    return units


def reference(problem, unit, state, events, first, stop):
    by_step = sorted_payloads(events)
    return advance_unit(problem, unit, state, by_step,
                        steps_to_run(problem, by_step, first, stop))


def comparable(state):
    """A state's value (the triangle counter has no __eq__: its attributes)."""
    return vars(state) if hasattr(state, "__dict__") and type(state).__eq__ is object.__eq__ \
        else state


def same_run(fast, ref):
    assert comparable(fast.state) == comparable(ref.state)
    assert [(k, s, v.hex()) for k, s, v in fast.contributions] == \
        [(k, s, v.hex()) for k, s, v in ref.contributions]
    assert fast.halt == ref.halt
    assert +fast.dropped == +ref.dropped


@pytest.mark.parametrize("name", sorted(problems()))
@pytest.mark.parametrize("seed", range(12))
def test_fast_truncation_equals_advance_unit_on_random_units(name, seed):
    """Shuffled wire order, ties in event time, key caps, fractional sums, resumed states."""
    rng = random.Random(seed * 101 + len(name))
    problem = problems()[name]
    for unit, events in random_units(name, problem, rng, rng.randrange(1, 60)).items():
        ordered = type(problem) is not CountProblem
        for first in (0, rng.randrange(HORIZON)):
            state = problem.init_state()
            if first:  # resumed: the state after the earlier steps
                earlier = [e for e in events if e[0] < first]
                state = reference(problem, unit, state, earlier, 0, first).state
            now = [e for e in events if e[0] >= first]
            shuffled = list(now)
            rng.shuffle(shuffled)
            fast = run_unit(problem, unit, copy.deepcopy(state),
                            payloads_by_step(shuffled, ordered),
                            first, HORIZON)  # (a triangle counter is mutable)
            same_run(fast, reference(problem, unit, copy.deepcopy(state), now, first, HORIZON))


def test_count_payload_order_never_matters_and_caps_hold():
    problem = CountProblem(ContributionBounds(2, None, 2))
    events = [(0, 5, ("z", 1.0)), (0, 1, ("b", 1.0)), (0, 1, ("a", 1.0)), (1, 2, ("a", 1.0))]
    run = run_unit(problem, "u", problem.init_state(), payloads_by_step(events, False), 0,
                   HORIZON)
    assert run.contributions == [("a", 0, 1.0), ("b", 0, 1.0)]
    assert run.state.used == 2.0 and run.state.keys == ("a", "b")
    assert dict(run.dropped) == {"max_keys_per_unit": 1, "max_contributions": 1}


VALUES = [0.1, 0.2, 0.3, 1e16, 1.0, -1e16, 3.0, 1e-300, 2.0 ** 60, -2.5, 7.0, 1e300, -1e300,
          0.5, 2.0 ** 53 + 2, 1.0 / 3, 5e-324]


@pytest.mark.parametrize("seed", range(30))
def test_key_sums_over_bundles_are_the_correctly_rounded_exact_sum(seed):
    rng = random.Random(seed)
    values = {step: [rng.choice(VALUES) * rng.choice([1, -1, 3])
                     for _ in range(rng.randrange(1, 25))] for step in range(4)}
    bundles = [KeySums.new() for _ in range(rng.randrange(1, 4))]
    for step, vs in values.items():
        for v in vs:
            KeySums.add(rng.choice(bundles), step, v)
    merged = KeySums.new()
    for bundle in rng.sample(bundles, len(bundles)):
        KeySums.merge(merged, KeySums.wire(bundle))
    totals = KeySums.totals(merged)
    for step, vs in values.items():
        assert totals[step].hex() == math.fsum(vs).hex()


def test_key_sums_of_integers_beyond_2_53_round_once():
    acc = KeySums.new()
    for v in (2.0 ** 53, 1.0, 1.0, 0.5, 2.0 ** 60, -(2.0 ** 60)):
        KeySums.add(acc, 0, v)
    assert KeySums.totals(acc)[0] == math.fsum([2.0 ** 53, 1.0, 1.0, 0.5, 2.0 ** 60,
                                                -(2.0 ** 60)])


@pytest.mark.parametrize("key", [0, -7, 2 ** 70, "a", "", "a\"b", "back\\slash", "é ü 中",
                                 "tab\tx", "\x7f", "\u2028", ("t", 1), (("x",), 2)])
def test_key_coder_fast_paths_write_the_json_bytes(key):
    coder = KeyCoder()
    slow = json.dumps(tagged(key), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert coder.encode(key) == slow
    assert coder.decode(slow) == key and type(coder.decode(slow)) is type(key)


ORIGIN = 1_700_000_000.0
STEPS = TimeSteps(ORIGIN, 60.0, HORIZON)


def test_bounded_stages_give_the_reference_totals_per_key_and_step():
    """AssignSteps | TruncateUnits | SumPerKey on Beam == the Beam-free reference:
    every unit's advance_unit, then math.fsum per (key, step), halts per key."""
    rng = random.Random(5)
    problem = CountProblem(ContributionBounds(5, 3, 2, max_value=2.5), with_value=True)
    elements = []
    for _ in range(400):
        element = random_element("sum_fractional", rng)
        element = (rng.choice(["u", "v", "w", 1, 2, 3]),) + element[1:]
        elements.append((element, ORIGIN + rng.uniform(0, 60 * HORIZON)))
    units = {}
    for element, ts in elements:
        parsed, _ = problem.parse(element)
        micros = int(round(ts * 1e6))
        step = STEPS.step_of(micros / 1e6)
        units.setdefault(parsed.unit, []).append((step, micros, parsed.payload))
    sums = {}
    for unit, events in units.items():
        run = reference(problem, unit, problem.init_state(), events, 0, HORIZON)
        for key, step, value in run.contributions:
            sums.setdefault(key, {}).setdefault(step, []).append(value)
    expected = [(key, sorted((step, math.fsum(vs).hex()) for step, vs in by.items()))
                for key, by in sums.items()]

    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        events = (pipeline | beam.Create(elements)
                  | beam.MapTuple(lambda e, ts: TimestampedValue(e, ts)))
        stepped = events | AssignSteps(problem, STEPS, StepWindow.whole(STEPS), packed=True)
        truncated = stepped.main | TruncateUnits(problem, StepWindow.whole(STEPS))
        totals = truncated.main | SumPerKey()
        assert_that(totals | beam.MapTuple(lambda key, t: (
            key, sorted((step, v.hex()) for step, v in t[0].items())) if not t[1] else None),
            equal_to(expected))


def test_truncation_of_a_bundle_sums_exactly_like_fsum():
    """np.float64 contributions (never from the machines, but harmless) add like floats."""
    acc = KeySums.new()
    for v in np.array([0.1, 0.2, 3.0]):
        KeySums.add(acc, 0, v)
    assert KeySums.totals(acc)[0] == math.fsum([0.1, 0.2, 3.0])


def _drive(fn, items):
    """A truncation DoFn over items in one bundle -> (sums, states, dead letters, dropped,
    per-key input and kept)."""
    fn.start_bundle()
    outputs = [out for item in items for out in fn.process(item)]
    dropped, given, kept = dict(fn._dropped), dict(fn._given), dict(fn._kept)
    outputs.extend(fn.finish_bundle())
    sums, states, dead = {}, {}, []
    for out in outputs:
        if isinstance(out, beam.pvalue.TaggedOutput):
            if out.tag == "unit_states":
                states[repr(out.value[0])] = comparable(out.value[1])
            else:
                dead.append(json.dumps(out.value, sort_keys=True, default=repr))
        else:
            key, wire = out.value
            acc = sums.setdefault(repr(key), KeySums.new())
            KeySums.merge(acc, wire)
    totals = {key: {step: v.hex() for step, v in KeySums.totals(acc).items()}
              for key, acc in sums.items()}
    return totals, states, sorted(dead), dropped, given, kept


@pytest.mark.parametrize("case", ["count", "sum_grid", "signed", "rounding"])
@pytest.mark.parametrize("seed", range(4))
def test_bucket_truncation_equals_the_per_unit_stage(case, seed):
    """`TruncateBucketsFn` (columnar packs per bucket, numpy) gives what `TruncateUnitsFn`
    gives (packs per unit), resumed from saved states of some units: the same key sums, unit
    states, dropped counts and per-key input and kept amounts ("rounding": masses that could
    round in float64 take the rule one unit at a time)."""
    rng = random.Random(seed)
    grid = dict(with_value=True, value_grid=1.0)
    problem = {
        "count": CountProblem(ContributionBounds(4, 2, 2)),
        "sum_grid": CountProblem(ContributionBounds(9, 4, 3, max_value=5.0), max_value=5.0,
                                 **grid),
        "signed": CountProblem(ContributionBounds(9, None, 2, max_value=5.0, min_value=-3.0),
                               max_value=5.0, min_value=-3.0, **grid),
        "rounding": CountProblem(ContributionBounds(2 ** 52, None, 2, max_value=2.0 ** 51),
                                 max_value=2.0 ** 51, **grid),
    }[case]
    top = 2.0 ** 51 if case == "rounding" else 6.0
    units = [f"u{i}" for i in range(30)] + list(range(30))
    events = [(rng.choice(units), rng.choice(KEYS[:4]), rng.randrange(HORIZON),
               1.0 if not problem.with_value else
               float(problem.column_values(np.array([rng.uniform(-4, top)]), 1)[0]))
              for _ in range(400)]
    window = StepWindow(3, HORIZON)
    saved = {}
    for unit in units[::3]:  # states of an earlier run
        past = [(rng.randrange(3), 0, (rng.choice(KEYS[:4]), 1.0)) for _ in range(3)]
        saved[unit] = run_unit(problem, unit, problem.init_state(),
                               payloads_by_step(past, ordered=False), 0, 3).state
    events = [e for e in events if e[2] >= 3]
    per_unit = {}
    for unit, key, step, value in events:
        per_unit.setdefault(unit, []).append((step, 0, (key, value)))
    unit_items = [(unit, (per_unit.get(unit, []) and [per_unit[unit]],
                          [saved[unit]] if unit in saved else []))
                  for unit in set(per_unit) | set(saved)]
    columns = UnitColumns([e[0] for e in events], [e[1] for e in events],
                          np.array([e[2] for e in events]), np.array([e[3] for e in events]))
    by_bucket = {}
    for bucket, part in columns.split():
        by_bucket.setdefault(bucket, ([], []))[0].append(part)
    for unit, state in saved.items():
        by_bucket.setdefault(bucket_of(unit), ([], []))[1].append((unit, state))
    public = KEYS[:3]
    reference_out = _drive(TruncateUnitsFn(problem, window, True, True, public), unit_items)
    bucket_out = _drive(TruncateBucketsFn(problem, window, True, True, public),
                        list(by_bucket.items()))
    assert bucket_out == reference_out
    assert reference_out[0] and reference_out[1] and (case == "rounding" or reference_out[3])
