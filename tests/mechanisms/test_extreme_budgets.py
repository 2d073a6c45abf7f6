"""Every mechanism, and `auto`, from the smallest to the largest budget the config accepts.

epsilon (pure DP: discrete Laplace, float Laplace) and rho (zCDP: discrete Gaussian, float
Gaussian) over a log grid from 1e-3 to 1e6, plus 1e7 (issue #38: `epsilon: 1e7` ended in `math
domain error`, q = exp(-1/t) underflowing to 0 in `tails`; rho >= 1e3 overflowed the discrete
Gaussian's table, whose last threshold reached 2^127). At every point: the mechanism builds,
releases every step (batch and streaming alike), and its stddevs, intervals and step-value laws
are finite; at the largest budgets they degenerate to the exact value. Where coverage is
measurable it is measured, on fixed seeds (false-failure rates in the tests). End to end: the
Beam transforms at the extremes, and the refusals of noise too large to sample, at construction.
"""
from __future__ import annotations

import functools
import math
import re

import numpy as np
import pytest
from scipy import stats

from transforms.mechanisms import NAMES, increments, make
from transforms.mechanisms.choose import choose
from transforms.mechanisms.discrete import MAX_PARAMETER, NoiseTooLarge
from transforms.validation import ValidationError

T = 16
GRID = tuple(10.0 ** e for e in range(-3, 7)) + (1e7,)
KINDS = (("discrete", "epsilon"), ("float", "epsilon"), ("discrete", "rho"), ("float", "rho"))
# refused by design at any budget (one-line errors at construction, tested below)
BY_DESIGN = {("sqrt_toeplitz", "discrete", "epsilon"), ("blt", "discrete", "epsilon"),
             ("blt", "discrete", "rho"), ("log_sqrt_toeplitz", "discrete", "epsilon"),
             ("log_sqrt_toeplitz", "float", "epsilon"), ("hybrid", "discrete", "epsilon"),
             ("hybrid", "discrete", "rho"), ("hybrid", "float", "epsilon")}
CASES = [(name, noise, kind) for name in NAMES + ("auto",) for noise, kind in KINDS
         if (name, noise, kind) not in BY_DESIGN]
X = np.array([3, 0, 1, 2, 0, 0, 5, 1, 1, 0, 2, 3, 0, 1, 4, 2], dtype=np.float64)


@functools.lru_cache(maxsize=None)
def build(name: str, noise: str, kind: str, budget: float):
    """The mechanism `name` (auto: `choose`'s pick) for the budget, with a fixed seed."""
    privacy = {kind: budget}
    params = {}
    if name == "auto":
        best, _ = choose(T, privacy, noise=noise)
        name, params = best.mechanism, dict(best.params)
    return make(name, T, **privacy, noise=noise, seed=11, **params)


def finite(array) -> bool:
    array = np.asarray(array, dtype=np.float64)
    return bool(np.all(np.isfinite(array)))


@pytest.mark.parametrize("name,noise,kind", CASES)
def test_every_budget_releases_finite_values_laws_and_intervals(name, noise, kind):
    truth = np.cumsum(X)
    for budget in GRID:
        where = f"{name} {noise} {kind}={budget:g}"
        mech = build(name, noise, kind, budget)
        out = mech.release(X)
        assert out.shape == (T,) and finite(out), where
        state, streamed = mech.init_state(), []
        for value in X:
            released, state = mech.step(state, value)
            streamed.append(released)
        assert np.array_equal(np.array(streamed), out), where
        if mech.integer_release:
            assert np.all(out == np.round(out)), where
        std = mech.noise_std()
        assert finite(std) and np.all(std >= 0), where
        described = mech.describe()
        for field in ("sensitivity", "node_scale", "max_se", "mean_se"):
            assert math.isfinite(described[field]) and described[field] >= 0, (where, field)
        for level, simultaneous in ((0.5, False), (0.95, False), (0.95, True)):
            low, high = mech.confidence_interval(out, level, simultaneous)
            assert finite(low) and finite(high), (where, level)
            assert np.all(low <= out) and np.all(out <= high), (where, level)
        # the step's own value (a record's step_value, step_stddev, step_ci_*)
        own = np.diff(out, prepend=0.0)
        step_std = np.sqrt(increments.increment_variance(mech))
        step_half = increments.increment_half_width(mech, 0.95)
        assert finite(own) and finite(step_std) and finite(step_half), where
        assert np.all(step_std >= 0) and np.all(step_half >= 0), where
        if budget >= 1e6:  # degenerate: the exact value, within a tight interval
            half = mech.confidence_half_width(0.95)
            assert np.max(half) <= 0.05 and np.max(std) <= 0.05, where
            # no noise left: within the interval for sure (the discrete square root: its
            # rounding bound); else within 50 stddevs (P < e^-30 for these laws)
            reach = half if not np.any(std) else 50.0 * np.max(std) + mech.rounding_bound()
            assert np.all(np.abs(out - truth) <= reach), where
            if mech.integer_release:  # integer noise with P(z != 0) ~ 0: exactly the truth
                assert np.array_equal(out, truth) and not np.any(half), where


@pytest.mark.parametrize("name,noise,kind", sorted(BY_DESIGN))
def test_combinations_refused_by_design_are_refused_at_construction(name, noise, kind):
    for budget in (1e-3, 1e7):
        with pytest.raises(ValidationError,
                           match=r"^`(noise` must be 'float'|privacy` must be rho,.*) for "):
            make(name, T, **{kind: budget}, noise=noise, seed=1)


# Coverage of the true running total, on N fixed streams (independent keyed noise each). At
# level 0.9 a step's misses are Binomial(N, p) with p <= 0.1 (the intervals are exact quantiles,
# conservative for integer sums and the discrete square root); a check fails when they exceed
# the 1 - 1e-7 quantile of Binomial(N, 0.1). The same bound holds for the simultaneous
# intervals' misses of any step. Over the 33 cases x 3 budgets x (16 + 1) checks, the chance
# that correct intervals fail on random seeds is at most 1683 x 1e-7 < 2e-4 (union bound).
N = 300
LEVEL = 0.9
COVERAGE_BUDGETS = (1e-3, 1.0, 1e3)
MAX_MISSES = int(stats.binom.isf(1e-7, N, 1.0 - LEVEL))


@pytest.mark.parametrize("name,noise,kind", CASES)
def test_intervals_cover_the_truth_at_their_nominal_level(name, noise, kind):
    truth = np.cumsum(X)
    for budget in COVERAGE_BUDGETS:
        mech = build(name, noise, kind, budget)
        half = mech.confidence_half_width(LEVEL)
        joint = mech.confidence_half_width(LEVEL, simultaneous=True)
        outs = np.array([mech.for_stream(f"coverage-{i}").release(X) for i in range(N)])
        errors = np.abs(outs - truth)
        misses = np.sum(errors > half, axis=0)
        joint_misses = int(np.sum(np.any(errors > joint, axis=1)))
        assert np.all(misses <= MAX_MISSES), (name, noise, kind, budget, misses.tolist())
        assert joint_misses <= MAX_MISSES, (name, noise, kind, budget, joint_misses)


def test_the_coverage_check_can_fail():
    """A half-width 30 % too narrow is caught at a moderate budget (the check has power)."""
    mech = build("binary_tree", "float", "epsilon", 1.0)
    half = 0.7 * mech.confidence_half_width(LEVEL)
    outs = np.array([mech.for_stream(f"coverage-{i}").release(X) for i in range(N)])
    misses = np.sum(np.abs(outs - np.cumsum(X)) > half, axis=0)
    assert np.any(misses > MAX_MISSES)


def test_a_point_mass_law_has_quantile_zero_and_a_discrete_laplace_of_tiny_scale_is_exact():
    """The cases of the issue: t = 1e-7 (epsilon 1e7 on sensitivity 1) and a discrete Gaussian
    of sigma^2 = 1e-7 (rho 5e6): q and the probabilities underflow to 0."""
    from transforms.mechanisms import tails
    for law in (tails.DiscreteLaplace(1e-7), tails.DiscreteGaussian(1e-7)):
        assert law.nonzero_probability() == 0.0
        assert tails.step_quantiles(law, 0.05, counts=[0, 1, 5]).tolist() == [0.0, 0.0, 0.0]
    assert tails.DiscreteLaplace(1e-7).single_quantile(1e-300) == 0.0
    # and where it is not a point mass, the log-space quantile is the closed form's
    law = tails.DiscreteLaplace(0.01)  # q = e^-100
    assert law.single_quantile(1e-50) == 1.0  # P(|X| > 0) ~ 2e-44 > 1e-50 >= P(|X| > 1)
    assert np.all(np.isfinite(law.log_mgf(np.array([0.0, 99.0, -99.9]))))


# ----- noise too large to sample: refused at construction, in the user's terms -----------------
def test_a_mechanism_refuses_noise_it_cannot_sample_when_built_with_the_value_checked():
    mech = make("binary_tree", T, rho=1e-12, seed=1)
    with pytest.raises(NoiseTooLarge) as caught:
        mech.check_noise()
    message = str(caught.value)
    assert message.startswith("`noise parameter` must be <= 4e+10 for discrete_gaussian")
    assert caught.value.parameter > MAX_PARAMETER["discrete_gaussian"]
    assert message.endswith(f"; got {caught.value.parameter!r}.") and len(message) < 200
    make("binary_tree", T, rho=1e-12, seed=1, noise="float").check_noise()  # no limit


def _transform_error(factory) -> str:
    with pytest.raises(ValidationError) as caught:
        factory()
    return str(caught.value)


def test_transforms_refuse_too_much_noise_at_construction_naming_the_budget():
    from transforms import ContinualCount, TimeSteps
    from transforms.mean import ContinualMean
    steps = TimeSteps(1_700_000_000.0, 60.0, 8)
    common = dict(steps=steps, public_keys=["a"], seed=3, insecure=True)
    # the mean: generous bounds under zCDP (the sum part's sigma^2 is 1e12)
    message = _transform_error(lambda: ContinualMean(rho=0.01, max_value=600.0,
                                                     max_contributions=1000, **common))
    found = re.fullmatch(r"`rho` must be >= (\S+) with these bounds \(the sum part's "
                         r"discrete_gaussian noise parameter 1e\+12 > 4e\+10; .*\); got 0\.01\.",
                         message)
    assert found and len(message) < 200, message
    # the minimum stated is enough, and just enough (0.25 exactly, up to the margin)
    minimum = float(found.group(1))
    assert 0.25 <= minimum <= 0.252
    ContinualMean(rho=minimum, max_value=600.0, max_contributions=1000, **common)
    with pytest.raises(ValidationError, match=r"^`rho` must be >= "):
        ContinualMean(rho=0.249, max_value=600.0, max_contributions=1000, **common)
    message = _transform_error(lambda: ContinualCount(
        epsilon=1.0, delta=1e-6, max_contributions=10 ** 5, mechanism="binary_tree", **common))
    found = re.fullmatch(r"`epsilon` must be >= (\S+) with these bounds \(discrete_gaussian "
                         r"noise parameter .*\); got 1\.0\.", message)
    assert found and len(message) < 200, message
    minimum = float(found.group(1))
    ContinualCount(epsilon=minimum, delta=1e-6, max_contributions=10 ** 5,
                   mechanism="binary_tree", **common)
    with pytest.raises(ValidationError, match=r"^`epsilon` must be >= "):
        ContinualCount(epsilon=0.99 * minimum, delta=1e-6, max_contributions=10 ** 5,
                       mechanism="binary_tree", **common)
    # float noise has no such limit
    ContinualMean(rho=0.01, max_value=600.0, max_contributions=1000, noise="float", **common)


# ----- end to end: the transforms at the extremes on the local runner --------------------------
ORIGIN = 1_700_000_000.0
EVENTS = [((f"u{i % 5}", "ab"[i % 2]), ORIGIN + (i % 8) * 60.0 + 1.0) for i in range(20)]
FIELDS = ("value", "stddev", "ci_low", "ci_high", "step_value", "step_stddev", "step_ci_low",
          "step_ci_high")


def true_counts():
    """Per key, the running count by step (every unit keeps its 4 events: nothing truncated)."""
    out = {}
    for (_, key), ts in EVENTS:
        out.setdefault(key, np.zeros(8))[int((ts - ORIGIN) // 60)] += 1
    return {key: np.cumsum(per_step) for key, per_step in out.items()}


@pytest.mark.parametrize("noise", ["discrete", "float"])
@pytest.mark.parametrize("kind,budget", [("epsilon", 1e-3), ("epsilon", 1e6), ("rho", 1e-3),
                                         ("rho", 1e6)])
def test_continual_count_runs_end_to_end_at_the_extremes(noise, kind, budget):
    from tests.support.beam import run
    from transforms import ContinualCount, TimeSteps
    steps = TimeSteps(ORIGIN, 60.0, 8)
    transform = ContinualCount(steps=steps, public_keys=["a", "b"], **{kind: budget}, seed=3,
                               insecure=True, noise=noise, max_contributions=4,
                               max_keys_per_unit=2)
    records, dead = run(transform, EVENTS)
    assert len(records) == 16 and not dead
    truth = true_counts()
    for record in records:
        for field in FIELDS:
            assert math.isfinite(record[field]) and (record[field] >= 0 or "std" not in field)
        assert record["ci_low"] <= record["value"] <= record["ci_high"]
        assert record["step_ci_low"] <= record["step_value"] <= record["step_ci_high"]
        if budget >= 1e6:  # the exact count, or within 50 stddevs (P < e^-30) and the
            # interval's half-width (the discrete square root's rounding bound)
            exact = truth[record["key"]][record["step"]]
            reach = 50.0 * record["stddev"] + 0.5 * (record["ci_high"] - record["ci_low"])
            assert abs(record["value"] - exact) <= reach
            assert record["ci_high"] - record["ci_low"] <= 0.05
            if record["stddev"] == 0:
                assert record["value"] == exact


@pytest.mark.parametrize("noise", ["discrete", "float"])
@pytest.mark.parametrize("kind,budget", [("epsilon", 1e-3), ("rho", 1e6)])
def test_continual_mean_runs_end_to_end_at_the_extremes(noise, kind, budget):
    from tests.support.beam import run
    from transforms import TimeSteps
    from transforms.mean import ContinualMean
    steps = TimeSteps(ORIGIN, 60.0, 8)
    transform = ContinualMean(steps=steps, public_keys=["a", "b"], **{kind: budget}, seed=3,
                              insecure=True, noise=noise, max_value=10.0, max_contributions=4,
                              max_keys_per_unit=2)
    events = [((unit, key, float(i % 7)), ts) for i, ((unit, key), ts) in enumerate(EVENTS)]
    records, dead = run(transform, events)
    assert len(records) == 16 and not dead
    for record in records:
        for field in ("value", "stddev", "ci_low", "ci_high"):
            assert math.isfinite(record[field]) and 0.0 <= record[field] <= 10.0
        # the estimate may lie outside the Fieller set (a noisy count <= 0: the midpoint);
        # the set itself is an interval within the range
        assert record["ci_low"] <= record["ci_high"]
    if budget >= 1e6:  # every mean known to within its (tight) interval
        assert all(r["ci_high"] - r["ci_low"] <= 0.1 for r in records if r["step"] > 0)


# ----- which mechanisms release integers: the docs' statement is `integer_release` -------------
def _document(path: str) -> str:
    import os
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, path), encoding="utf-8") as handle:
        return handle.read()


def _integer_table() -> dict:
    text = _document("docs/mechanisms.md")
    table = text.split("<!-- integer-values:start -->")[1].split("<!-- integer-values:end -->")[0]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|$", table, re.M)
    return {name: said.strip() for name, said in rows}


def _releases_integers(name: str):
    """True / False: whether its values are integers with discrete noise under every budget it
    takes; None: it takes no discrete noise."""
    found = set()
    for privacy in ({"epsilon": 1.0}, {"rho": 0.5}, {"epsilon": 1.0, "delta": 1e-6}):
        try:
            mech = make(name, T, **privacy, seed=5)
        except ValidationError:
            continue  # refused by design (its float noise only)
        found.add(mech.integer_release)
        assert not make(name, T, **privacy, seed=5, noise="float").integer_release
        out = mech.release(X)
        assert np.array_equal(out, np.round(out)) == mech.integer_release, name
    assert len(found) <= 1, name
    return found.pop() if found else None


def test_the_docs_say_which_mechanisms_release_integers():
    table = _integer_table()
    assert sorted(table) == sorted(NAMES)
    fractional = set()
    for name in NAMES:
        integers = _releases_integers(name)
        said = table[name]
        if integers:
            assert said == "exact integer", (name, said)
        else:
            assert said.startswith("fraction"), (name, said)
            fractional.add(name)
            if integers is None:
                assert "float noise only" in said, (name, said)
    # the README's record fields say the same: the mechanisms it names as exceptions
    readme = _document("README.md")
    value = readme.split("window_end, value` (")[1].split("`,\nstddev")[0]
    named = set(re.findall(r"`(\w+)`", value)) & set(NAMES)
    assert named == fractional, (named, fractional)
