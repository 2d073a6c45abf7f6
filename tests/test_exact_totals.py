"""Exact totals: declared-integer data (discrete noise, the default) is summed exactly.

Every value, per-step total, running total and released value of a key stays an integer of
magnitude < 2^53 (float64 adds integers exactly only below it); a key whose total would reach
it halts at that step (no record for it or later) with an "exact totals" dead letter, in batch
and streaming alike. Before this limit, totals past 2^53 were rounded: a declared change of 1
moved the released value by 0 or 2.
"""
from __future__ import annotations

import math

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that

from tests.support.beam import run
from tests.support.noise import ZERO
from transforms import ContinualCount, ContinualRelease, ContinualSum, TimeSteps
from transforms.mechanisms import make
from transforms.mechanisms.base import EXACT_LIMIT, CounterState
from transforms.mechanisms.noise import NOISE_DOMAIN_VERSION, ConstantNoiseSource
from transforms.release import NoNoise, RecordMaker
from transforms.bounded import ReleaseKeys
from transforms.messages import StepWindow
from transforms.streams import ContributionBounds
from transforms.streams.records import Declaration
from transforms.streams.units import CountProblem, DeclaredProblem

ORIGIN = 1_700_000_000.0
STEPS = TimeSteps(ORIGIN, 60.0, 6)
TOP = 2 ** 53
LIMIT_MESSAGE = r"^`values` must be integers whose running totals stay below 2\^53"


def at(step):
    return ORIGIN + step * 60.0 + 1.0


def release(**kwargs):
    options = dict(steps=STEPS, public_keys=["k", "small"], epsilon=1.0,
                   mechanism="binary_tree", **ZERO)
    options.update(kwargs)
    return ContinualRelease(**options)


def values_by_key(records):
    out = {}
    for record in records:
        out.setdefault(record["key"], {})[record["step"]] = record["value"]
    return out


def exact_reasons(dead):
    return [d for d in dead if d["reason"].startswith("exact totals")]


@pytest.mark.parametrize("mode", ["batch", "streaming"])
def test_release_near_2_53_is_exact_then_halts_the_key_with_a_dead_letter(mode):
    """The reproducer: 2^53 - 3, then +1 per step. The exact totals are 2^53 - 3, - 2, - 1,
    2^53, 2^53 + 1, 2^53 + 2; float64 rounded the last three to 2^53, 2^53, 2^53 + 2 (a change
    of 1 moved the release by 0, then 2). Now the first three are released exactly and the key
    halts at step 3 (its total would reach 2^53), naming the reason; other keys go on."""
    events = [(("k", float(TOP - 3)), at(0))] + [(("k", 1.0), at(s)) for s in range(1, 6)]
    events += [(("small", 1.0), at(s)) for s in range(6)]
    records, dead = run(release(), events, mode=mode, steps=STEPS)
    released = values_by_key(records)
    assert released["k"] == {0: TOP - 3, 1: TOP - 2, 2: TOP - 1}
    assert all(type(v) is int for v in released["k"].values())
    assert released["small"] == {s: s + 1 for s in range(6)}
    halts = exact_reasons(dead)
    assert len(halts) == 1 and halts[0]["record"] == "'k'"
    assert "key 'k' halts at step 3" in halts[0]["reason"]
    assert "2^53" in halts[0]["reason"]


@pytest.mark.parametrize("mode", ["batch", "streaming"])
def test_negative_totals_and_one_step_sums_past_the_limit_halt_too(mode):
    """A step whose own sum reaches 2^53 (two values of 2^52 in one step) halts at that step;
    negative totals are bounded alike; a step whose values cancel exactly is fine."""
    events = [(("k", float(2 ** 52)), at(1)), (("k", float(2 ** 52)), at(1)),
              (("k", 5.0), at(0)),
              (("small", -float(TOP - 1)), at(0)), (("small", float(TOP - 1)), at(2)),
              (("small", float(TOP - 1)), at(2)), (("small", -float(TOP - 1)), at(2)),
              (("small", -1.0), at(4))]
    records, dead = run(release(), events, mode=mode, steps=STEPS)
    released = values_by_key(records)
    assert released["k"] == {0: 5}
    # small: -(2^53 - 1), then a step of exact sum 2^53 - 1 (back to 0), then -1 at step 4
    assert released["small"] == {0: -(TOP - 1), 1: -(TOP - 1), 2: 0, 3: 0, 4: -1, 5: -1}
    halts = exact_reasons(dead)
    assert [d["record"] for d in halts] == ["'k'"]
    assert "halts at step 1" in halts[0]["reason"]


class _Constant(NoNoise):
    """Every node's noise is `value` (a public test source)."""

    def __init__(self, value):
        self.value = value

    def noise_source(self, release=b"", version=NOISE_DOMAIN_VERSION):
        return ConstantNoiseSource(self.value)


@pytest.mark.parametrize("mode", ["batch", "streaming"])
def test_a_released_value_reaching_2_53_halts_the_key(mode):
    """The running total stays below 2^53 but total + noise would not: the released value
    could not be the exact integer sum, so the key halts there (this depends on the released
    value only: post-processing)."""
    noise = make("binary_tree", STEPS.horizon, epsilon=1.0,
                 noise_source=ConstantNoiseSource(2.0)).release(np.zeros(STEPS.horizon))
    assert noise[0] >= 2 and noise[1] >= 2  # every step has a node: 2 or more
    first = int(noise[0])
    # totals TOP - 1 - first, then TOP - 1; released TOP - 1, then TOP - 1 + noise[1]
    events = [(("k", float(TOP - 1 - first)), at(0)), (("k", float(first)), at(1))]
    records, dead = run(release(noise_source=_Constant(2.0), insecure=True), events,
                        mode=mode, steps=STEPS)
    released = values_by_key(records)
    assert released["k"] == {0: TOP - 1}
    halts = exact_reasons(dead)
    assert len(halts) == 1 and "halts at step 1" in halts[0]["reason"]


def _release_window(config, window, totals, saved, records, reasons, states):
    """ReleaseKeys (bounded) over `window` for key "k" on the local runner: its records
    ((step, value)), the reasons of its dead letters and its key states are as expected."""

    def equal(expected):
        def check(items):
            assert sorted(items) == sorted(expected), (sorted(items), expected)
        return check

    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        resumed = pipeline | "Saved" >> beam.Create(list(saved)) if saved else None
        out = (pipeline | beam.Create([("k", totals)])
               | ReleaseKeys(config, ["k"], window, resumed))
        assert_that(out.main | beam.Map(lambda r: (r["step"], r["value"])), equal(records),
                    label="Records")
        assert_that(out.dead_letters | beam.Map(lambda d: d["reason"]), equal(reasons),
                    label="Dead")
        assert_that(out.states, equal(states), label="States")


def test_a_resumed_window_keeps_the_halt_and_an_exact_state():
    """Bounded release of two windows: the first halts the key at step 2; the saved state's
    running total is the exact total before the halt, and the second window adds nothing and
    releases nothing more for the key (no second dead letter)."""
    config = release().config
    maker = RecordMaker(config)
    halted = maker.seal("k", CounterState(3, float(TOP - 1)))
    _release_window(config, StepWindow(0, 3), ({0: float(TOP - 2), 1: 1.0, 2: 1.0}, ()), (),
                    [(0, TOP - 2), (1, TOP - 1)], [RecordMaker.limit_reason("k", 2)],
                    [("k", (halted, 2))])
    assert "key 'k' halts at step 2" in RecordMaker.limit_reason("k", 2)
    _release_window(config, StepWindow(3, 6), ({3: 5.0, 4: float(TOP - 1)}, ()),
                    [("k", (halted, 2))], [], [],
                    [("k", (maker.seal("k", CounterState(6, float(TOP - 1))), 2))])


def test_step_sealed_halts_instead_of_rounding():
    """The streaming release's one call: a step whose exact sum or running total would reach
    2^53 returns (None, the state unchanged); non-finite sums are still refused as before."""
    transform = release()
    maker = RecordMaker(transform.config)
    sealed = maker.seal("k", CounterState(0, float(TOP - 2)))
    out, after = maker.step_sealed("k", sealed, [1.0], 0)
    assert out == TOP - 1 and maker.restore("k", after) == CounterState(1, float(TOP - 1))
    assert maker.step_sealed("k", after, [1.0], 1) == (None, after)
    assert maker.step_sealed("k", after, [-float(TOP)], 1) == (None, after)
    assert maker.step_sealed("k", after, [float(TOP), -float(TOP), -3.0], 1)[0] == TOP - 4
    with pytest.raises(ValueError, match="finite numbers"):
        maker.step_sealed("k", after, [math.inf], 1)


@pytest.mark.parametrize("name", ["binary_tree", "smooth_binary", "kary_subtraction",
                                  "naive_composition", "input_perturbation"])
def test_the_mechanism_refuses_inexact_running_totals_with_discrete_noise(name):
    """The Beam-free core: `advance` and `step` refuse (the same message) a value or running
    total that reaches 2^53 with discrete noise; below it they are exact; float noise sums
    float64 as before."""
    mechanism = make(name, 8, epsilon=1.0, noise_source=ConstantNoiseSource(0.0))
    out, state = mechanism.advance(mechanism.init_state(), [TOP - 2, 1])
    assert out.tolist() == [TOP - 2, TOP - 1] and state == CounterState(2, float(TOP - 1))
    for start, values in ((state, [1]), (CounterState(0, 0.0), [TOP]),
                          (CounterState(0, float(TOP)), [-1]),
                          (CounterState(0, 0.0), [2 ** 60 + 1]),
                          (CounterState(0, -float(TOP - 1)), [-1.0])):
        with pytest.raises(ValueError, match=LIMIT_MESSAGE):
            mechanism.advance(start, values)
        with pytest.raises(ValueError, match=LIMIT_MESSAGE):
            mechanism.step(start, values[0])
    floats = make(name, 8, epsilon=1.0, noise="float", noise_source=ConstantNoiseSource(0.0))
    assert floats.advance(state, [1.0])[1] == CounterState(3, float(TOP))


def test_count_and_sum_bounds_keep_one_unit_below_the_limit():
    with pytest.raises(ValueError, match=r"^`max_contributions` must be an integer < 2\^53 "):
        ContinualCount(steps=STEPS, public_keys=["a"], epsilon=1.0,
                       max_contributions=TOP, **ZERO)
    with pytest.raises(ValueError, match=r"^`value_resolution` must be at least "):
        ContinualSum(steps=STEPS, public_keys=["a"], epsilon=1.0, max_value=1.0,
                     value_resolution=1e-17, **ZERO)
    # the largest allowed: fine
    CountProblem(ContributionBounds(TOP - 1))
    # float sums without a grid are real-valued: no limit on their bound
    CountProblem(ContributionBounds(TOP), with_value=True)
    assert EXACT_LIMIT == TOP


def test_declared_step_sums_reaching_the_limit_halt_the_key_in_truncation():
    problem = DeclaredProblem(Declaration(1, 1, 1, "declared"), integers=True)
    ok = problem.advance("k", None, 3, [float(TOP - 1), 1.0, -1.0])
    assert ok.violation is None and ok.contributions == (("k", float(TOP - 1)),)
    over = problem.advance("k", None, 3, [float(TOP - 1), 1.0])
    assert over.contributions == () and over.violation.startswith("exact totals: ")
    floats = DeclaredProblem(Declaration(1, 1, 1, "declared"), integers=False)
    assert floats.advance("k", None, 3, [float(TOP - 1), 1.0]).violation is None


def test_float64_would_have_rounded_these_totals():
    """What the limit guards against (the arithmetic itself)."""
    totals = np.cumsum(np.array([TOP - 3, 1, 1, 1, 1, 1], dtype=np.float64))
    assert totals.tolist() != [TOP - 3 + i for i in range(6)]
