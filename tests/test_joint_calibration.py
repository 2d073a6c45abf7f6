"""Joint calibration over keys (ContinualCount / ContinualSum, issue 15 item 1).

`max_contributions` k caps one unit's total over the horizon ACROSS its keys, so the keys'
difference vectors v_1..v_m satisfy sum_j ||v_j||_1 <= k, and the concatenation (R v_1, ...,
R v_m) has l_p norm <= k x (largest column l_p norm of R). The brute force below enumerates
EVERY way a unit can spread its contributions over m keys and T steps (with and without the
per-step cap, which also holds across keys) and checks that the noise each key is released with
spends at most the total budget on the whole concatenation; negative controls show the same
check fails for calibrations that are wrong.
"""
from __future__ import annotations

import functools
import logging
import math

import numpy as np
import pytest

from tests.support.noise import ZERO
from transforms import (ContinualCount, ContinualCountDistinct, ContinualRelease,
                        ContinualSum, TimeSteps)
from transforms.calibration import JOINT, SPLIT, calibrate
from transforms.mechanisms import (MECHANISMS, NAMES, ConstantNoiseSource, PrivacyBudget,
                                  make)
from transforms.mechanisms.choose import candidate_specs
from transforms.mechanisms.sensitivity import joint_sensitivity
from transforms.streams import ContributionBounds
from transforms.streams.records import Declaration

logging.getLogger("transforms").setLevel(logging.ERROR)  # fixed-seed warnings

FAMILIES = [("binary_tree", {}), ("binary_tree", {"sparsify": False}), ("kary_tree", {"k": 3}),
            ("kary_subtraction", {"k": 3}), ("kary_subtraction", {"k": 4}),
            ("kary_subtraction", {"k": 5}), ("kary_subtraction", {"k": 3, "sparsify": False}),
            ("smooth_binary", {}), ("sqrt_toeplitz", {}), ("naive_composition", {}),
            ("input_perturbation", {})]
FAMILIES += [(name, {}) for name in NAMES if name not in {n for n, _ in FAMILIES}]  # new ones
BUDGETS = [(PrivacyBudget.resolve(epsilon=1.0), 1), (PrivacyBudget.resolve(rho=0.5), 2)]
NOISES = ("float", "discrete")
TOLERANCE = 1e-9


@functools.lru_cache(maxsize=None)
def unit_changes(horizon: int, keys: int, k: int, cap: int) -> np.ndarray:
    """Every (keys x horizon) non-negative integer array with total <= k and per-step totals
    (summed over keys) <= cap: all ways one unit's contributions split over keys and steps."""
    cells = keys * horizon
    out = []

    def fill(prefix, left):
        if len(prefix) == cells:
            out.append(prefix)
            return
        step = len(prefix) % horizon
        used_at_step = sum(prefix[j * horizon + step] for j in range(len(prefix) // horizon))
        for value in range(min(left, cap - used_at_step) + 1):
            fill(prefix + [value], left - value)

    fill([], k)
    return np.array(out, dtype=np.float64).reshape(-1, keys, horizon)


def joint_norms(right: np.ndarray, changes: np.ndarray):
    """Per unit change: (l1, l2) of the concatenation (R v_1, ..., R v_m)."""
    images = changes @ right.T  # (n, keys, nodes)
    return (np.abs(images).sum(axis=(1, 2)), np.sqrt((images ** 2).sum(axis=(1, 2))))


def spent(mechanism, p: int, joint: float) -> float:
    """Privacy the concatenated release spends with the key mechanism's node noise: l1 / b
    (Laplace, discrete Laplace scale t) or l2^2 / (2 sigma^2) (Gaussian, discrete Gaussian)."""
    if p == 1:
        return joint / mechanism.node_scale
    return joint ** 2 / (2.0 * mechanism.node_scale ** 2)


def build(name, horizon, privacy, k, noise, params):
    return make(name, horizon, **privacy, max_contributions=k, interval_bound=k,
                noise_source=ConstantNoiseSource(0.0), noise=noise, **params)


def calibrated(name, params, horizon, budget, keys, k, noise, mutation=None):
    """The key mechanism the release builds (mirrors `ContinualBase._calibrated`); a
    `mutation` builds a wrong one for the negative controls."""
    declaration = Declaration(k, k, keys, "user", joint_mass=k)
    full = {"epsilon": budget.epsilon} if budget.sensitivity_norm == 1 else {"rho": budget.rho}
    probe = build(name, horizon, full, k, noise, params)
    calibration = calibrate(probe, declaration, budget)
    if mutation == "ignore k":  # the key's noise calibrated to one contribution
        return calibration, build(name, horizon, calibration.key_privacy, 1, noise, params)
    if mutation == "full budget per key":  # as if no cap held across keys
        return calibration, build(name, horizon, full, k, noise, params)
    return calibration, build(name, horizon, calibration.key_privacy, k, noise, params)


def cases():
    for name, params in FAMILIES:
        for noise in NOISES:
            for budget, p in BUDGETS:
                if name == "sqrt_toeplitz" and noise == "discrete":
                    continue  # non-linear (rounded) release: its own test below
                if p == 1 and not MECHANISMS[name].pure_dp:
                    continue  # no pure-DP calibration (refused at construction)
                yield name, params, noise, budget, p


def worst_loss(name, params, noise, budget, p, horizons=(1, 2, 3, 4, 6), mutation=None,
               per_key_cap=False):
    """max over T, m in {2, 3}, k <= 3, per-step caps c <= k, and every unit change, of the
    budget the concatenated release spends divided by the total budget."""
    try:
        build(name, 4, {"rho": 1.0}, 1, noise, params)
    except ValueError:
        pytest.skip(f"{name} has no {noise} noise")
    worst = 0.0
    total = budget.epsilon if p == 1 else budget.rho
    for horizon in horizons:
        if name == "kary_subtraction" and params["k"] > max(3, 2 * horizon):
            continue
        _, right = build(name, horizon, {"rho": 1.0}, 1, "float", params).dense_factors()
        if noise == "discrete":
            _, right = build(name, horizon, {"rho": 1.0}, 1, noise, params).dense_factors()
        for keys in (2, 3):
            for k in (1, 2, 3):
                calibration, mechanism = calibrated(name, params, horizon, budget, keys, k,
                                                    noise, mutation)
                for cap in range(1, k + 1):
                    if per_key_cap:  # k and the step cap per key: every key may carry k e_t
                        single = unit_changes(horizon, 1, k, cap)
                        changes = np.stack([np.repeat(single, 1, axis=0)[:, 0, :]] * keys,
                                           axis=1)
                    else:
                        changes = unit_changes(horizon, keys, k, cap)
                    l1, l2 = joint_norms(right, changes)
                    joint = float(np.max(l1 if p == 1 else l2))
                    worst = max(worst, spent(mechanism, p, joint) / total)
                    if calibration.joint_sensitivity is not None and mutation is None \
                            and not per_key_cap:
                        assert calibration.joint_sensitivity >= joint - TOLERANCE, (
                            name, params, horizon, keys, k, cap, p)
    return worst


@pytest.mark.parametrize("name,params,noise,budget,p", list(cases()))
def test_brute_force_every_split_over_keys_and_steps_stays_within_the_budget(
        name, params, noise, budget, p):
    assert worst_loss(name, params, noise, budget, p) <= 1.0 + TOLERANCE


def test_joint_wins_for_every_linear_mechanism_and_gives_the_full_budget():
    for name, params in FAMILIES:
        for budget, p in BUDGETS:
            if p == 1 and not MECHANISMS[name].pure_dp:
                continue
            for keys in (2, 4):
                try:
                    calibration, _ = calibrated(name, params, 8, budget, keys, 3, "discrete")
                except ValueError:  # a float-only mechanism
                    calibration, _ = calibrated(name, params, 8, budget, keys, 3, "float")
                if name == "sqrt_toeplitz" and budget.rho is not None:
                    calibration, _ = calibrated(name, params, 8, budget, keys, 3, "float")
                assert calibration.kind == JOINT, (name, params, p, keys)
                assert calibration.key_privacy == (
                    {"epsilon": budget.epsilon} if p == 1 else {"rho": budget.rho})


def test_discrete_square_root_joint_release_with_rounding_stays_within_the_budget():
    """y_j = round(R~ x_j / g) + z_j: the rounding moves every coordinate of every touched key,
    so its joint sensitivity has the term sqrt(min(m, k) T); the actual y of random base
    streams (every unit change, exhaustively) never exceeds the calibration."""
    budget = PrivacyBudget.resolve(rho=0.5)
    rng = np.random.default_rng(15)
    for horizon in (2, 4, 6):
        for keys in (2, 3):
            for k in (1, 2, 3):
                calibration, mechanism = calibrated("sqrt_toeplitz", {}, horizon, budget, keys,
                                                    k, "discrete")
                assert calibration.kind == JOINT
                if k == 1:  # one contribution touches one key: one key's rounding term
                    assert calibration.key_privacy["rho"] == budget.rho
                else:  # the rounding of up to min(m, k) keys costs a little
                    assert calibration.key_privacy["rho"] < budget.rho
                assert calibration.key_privacy["rho"] > budget.rho / keys
                sigma2 = mechanism.sampler.parameter  # y's discrete Gaussian sigma^2
                single = unit_changes(horizon, 1, k, k)[:, 0, :]

                def y(x):
                    return np.array(mechanism.advance(mechanism.init_state(), x)[1].rounded)

                worst = 0.0
                for _ in range(4):
                    bases = rng.integers(0, 5, size=(keys, horizon))
                    # ||Delta y_j||^2 per key and single-key change
                    moved = np.array([[float(np.sum((y(bases[j] + v) - y(bases[j])) ** 2))
                                       for v in single] for j in range(keys)])
                    masses = single.sum(axis=1).astype(int)
                    # best joint total over assignments of masses to keys (sum <= k)
                    best = {0: 0.0}
                    for j in range(keys):
                        new = {}
                        for used, value in best.items():
                            for index, mass in enumerate(masses):
                                if used + mass <= k:
                                    new[used + mass] = max(new.get(used + mass, 0.0),
                                                           value + moved[j, index])
                        best = new
                    worst = max(worst, max(best.values()))
                assert worst / (2.0 * sigma2) <= budget.rho * (1 + TOLERANCE), (horizon, keys, k)
                assert math.sqrt(worst) <= calibration.joint_sensitivity + TOLERANCE


# ----- negative controls: the same brute force flags wrong calibrations -------------------------
def test_negative_control_a_calibration_that_ignores_k_fails_the_brute_force():
    """Joint full budget, but each key's noise calibrated to one contribution (k ignored): the
    same brute force finds units that spend k times epsilon (k^2 times rho)."""
    for budget, p in BUDGETS:
        for name, params in (("binary_tree", {}), ("kary_subtraction", {"k": 3})):
            loss = worst_loss(name, params, "float", budget, p, horizons=(4,),
                              mutation="ignore k")
            assert loss == pytest.approx(3.0 if p == 1 else 9.0), (name, p)


def test_negative_control_the_full_budget_is_wrong_without_a_cross_key_cap():
    """If k capped each key separately (as count-distinct's and declared releases' bounds do),
    every key could carry k e_t at once: the full budget per key spends m epsilon (m rho), so the
    brute force flags it; the split (what those transforms keep) passes the same check."""
    for budget, p in BUDGETS:
        loss = worst_loss("binary_tree", {}, "float", budget, p, horizons=(4,),
                          mutation="full budget per key", per_key_cap=True)
        assert loss == pytest.approx(3.0)  # m = 3 keys at the worst
        budget_split = worst_loss("binary_tree", {}, "float", budget, p, horizons=(4,),
                                  per_key_cap=True)
        assert budget_split > 1.5  # the joint calibration would be wrong there too


def test_negative_control_rounding_term_of_one_key_only_is_not_enough():
    """The discrete square root's joint bound with sqrt(T) (one key's rounding) in place of
    sqrt(min(m, k) T) is below what the linear part plus the rounding can reach."""
    mechanism = build("sqrt_toeplitz", 6, {"rho": 0.5}, 3, "discrete", {})
    right = joint_sensitivity(mechanism, 2, 3, 3)
    wrong = 3 * mechanism.column_norm(2) * 2.0 ** mechanism.grid_bits + math.sqrt(6)
    assert wrong < right
    assert right == pytest.approx(wrong - math.sqrt(6) + math.sqrt(18))


# ----- the truncation really caps the total across keys (what `joint_mass` claims) --------------
@pytest.mark.parametrize("max_value", [None, 2.5])
def test_truncation_caps_the_total_and_the_step_across_keys(max_value):
    rng = np.random.default_rng(7)
    bounds = ContributionBounds(5, 2, 3, max_value=max_value)
    for _ in range(300):
        from transforms.streams.count import truncate_step
        keys, used, total = [], 0.0, 0.0
        for step in range(6):
            events = [(f"k{rng.integers(5)}", 1.0 if max_value is None
                       else float(rng.uniform(-1, 4))) for _ in range(rng.integers(0, 6))]
            out = []
            used = truncate_step(bounds.limits, keys, used, step, events, out, None)
            assert all(v >= 0 for _, _, v in out)
            assert sum(v for _, _, v in out) <= 2 + 1e-12
            total += sum(v for _, _, v in out)
            assert len(keys) <= 3
        assert total <= 5 + 1e-12


# ----- the transforms ---------------------------------------------------------------------------
STEPS = TimeSteps(1_700_000_000.0, 3600.0, 48)


def count(m, noise="float", mechanism="kary_subtraction", params=None, **privacy):
    return ContinualCount(steps=STEPS, public_keys=["a", "b", "c", "d"], max_contributions=6,
                          max_contributions_per_step=2, max_keys_per_unit=m, noise=noise,
                          mechanism=mechanism, mechanism_params=params or {}, **privacy,
                          **ZERO)


@pytest.mark.parametrize("noise", NOISES)
def test_four_keys_per_unit_cost_nothing_four_x_less_laplace_two_x_less_gaussian(noise):
    for privacy, factor in (({"epsilon": 1.0}, 4.0), ({"rho": 0.5}, 2.0)):
        transform = count(4, noise, "kary_subtraction", {"k": 3}, **privacy)
        assert transform.descriptor["calibration"] == JOINT
        assert transform.descriptor["key_budget"] == privacy
        joint = transform.config.build().noise_std()
        (name, value), = privacy.items()
        split = make("kary_subtraction", 48, **{name: value / 4}, max_contributions=6,
                     interval_bound=6, noise=noise, noise_source=ConstantNoiseSource(0.0),
                     k=3).noise_std()
        assert np.all(split > 0)
        # float noise: exactly; discrete laws: their variance is the continuous one up to O(1)
        np.testing.assert_allclose(split / joint, factor, rtol=1e-12 if noise == "float"
                                   else 2e-3)
        single = count(1, noise, "kary_subtraction", {"k": 3}, **privacy)
        assert single.descriptor["calibration"] == SPLIT
        np.testing.assert_array_equal(single.config.build().noise_std(), joint)


def test_sums_calibrate_jointly_in_grid_units_and_per_key_transforms_keep_the_split():
    transform = ContinualSum(steps=STEPS, public_keys=["a", "b"], rho=0.5, max_value=2.0,
                             max_contributions=4, max_contributions_per_step=2,
                             max_keys_per_unit=3, mechanism="binary_tree", **ZERO)
    declaration = transform.problem.declaration
    assert declaration.joint_mass == declaration.max_contributions == 200  # grid 0.02
    assert transform.descriptor["calibration"] == JOINT
    assert transform.descriptor["key_budget"] == {"rho": 0.5}
    floats = ContinualSum(steps=STEPS, public_keys=["a"], epsilon=1.0, max_value=2.0,
                          max_contributions=4, max_keys_per_unit=2, noise="float", **ZERO)
    assert floats.descriptor["calibration"] == JOINT
    assert floats.descriptor["key_budget"] == {"epsilon": 1.0}
    distinct = ContinualCountDistinct(steps=STEPS, public_keys=["a", "b"], rho=1.0,
                                      max_flips=2, max_keys_per_unit=2, **ZERO)
    assert distinct.descriptor["calibration"] == SPLIT
    assert distinct.descriptor["key_budget"] == {"rho": 0.5}
    declared = ContinualRelease(steps=STEPS, public_keys=["a"], epsilon=1.0, keys_per_unit=2,
                                **ZERO)
    assert declared.descriptor["calibration"] == SPLIT
    assert declared.descriptor["key_budget"] == {"epsilon": 0.5}


@pytest.mark.parametrize("privacy", [{"epsilon": 1.0}, {"rho": 0.5}])
def test_auto_chooses_with_the_calibration_it_releases_with(privacy):
    """auto's mechanism has the lowest MaxSE among all candidates, each built as the release
    would build it (its own calibration), and is never worse than auto under the split."""
    auto = count(4, "discrete", "auto", **privacy)
    chosen = auto.config.build().max_se()
    pure = "epsilon" in privacy
    for name, params in candidate_specs(48, "discrete", pure):
        try:
            other = count(4, "discrete", name, params, **privacy)
        except ValueError:
            continue
        assert chosen <= other.config.build().max_se() + 1e-9, (name, params)
    (key, value), = privacy.items()
    from transforms.mechanisms.choose import choose
    split_best, _ = choose(48, {key: value / 4}, 6, 6, noise="discrete")
    assert chosen < split_best.max_se
