"""The step's own value: release_t - release_{t-1}, its exact variance and interval."""
from __future__ import annotations


import numpy as np
import pytest
from scipy import stats

from transforms.mechanisms import MECHANISMS, increments, make
from transforms.mechanisms.noise import ConstantNoiseSource


def _all(horizon, seed=0):
    """Every mechanism with each noise it supports (pure DP and zCDP)."""
    for name in MECHANISMS:
        for privacy in ({"epsilon": 1.0}, {"rho": 0.5}):
            for noise in ("discrete", "float"):
                try:
                    yield name, noise, make(name, horizon, noise=noise, seed=seed, **privacy)
                except ValueError:  # a combination the mechanism refuses (e.g. blt discrete)
                    continue


@pytest.mark.parametrize("horizon", [1, 2, 7, 64, 100, 257])
def test_the_variance_is_the_difference_rows_of_the_left_factor(horizon):
    """Exact against the dense factors: node variance x ||L_t - L_{t-1}||^2 (not the sum of
    the two steps' variances: consecutive rows share nodes)."""
    for name, noise, mechanism in _all(horizon):
        left, _ = mechanism.dense_factors()
        rows = left - np.vstack([np.zeros((1, left.shape[1])), left[:-1]])
        expected = mechanism.node_variance * np.sum(rows ** 2, axis=1)
        np.testing.assert_allclose(increments.increment_variance(mechanism), expected,
                                   rtol=1e-12, err_msg=f"{name} {noise}")
        if horizon > 2 and name != "naive_composition":  # L = I has independent rows; the
            # others' consecutive rows share nodes: independence would be another number
            independent = mechanism.noise_variance()[1:] + mechanism.noise_variance()[:-1]
            assert not np.allclose(expected[1:], independent), (name, noise)


def test_tree_difference_rows_have_unit_weights_at_long_horizons():
    for name in ("binary_tree", "kary_tree", "kary_subtraction", "smooth_binary"):
        for horizon in (1000, 2187):
            mechanism = make(name, horizon, epsilon=1.0, seed=0)
            kind, rows = increments.increment_weights(mechanism)
            assert kind == "weights" and all(np.all(np.abs(w) == 1.0) for w in rows), name


@pytest.mark.parametrize("horizon", [5, 40])
def test_last_output_is_the_value_released_at_the_last_step(horizon):
    rng = np.random.default_rng(horizon)
    for name, noise, mechanism in _all(horizon, seed=9):
        x = rng.integers(0, 4, horizon).astype(float)
        state = mechanism.init_state()
        assert mechanism.last_output(state) == 0.0
        for start, stop in ((0, 1), (1, horizon // 2), (horizon // 2, horizon)):
            out, state = mechanism.advance(state, x[start:stop])
            assert mechanism.last_output(state) == out[-1], (name, noise, stop)


def test_intervals_of_the_step_value_cover_at_their_level():
    """Noise-only releases (constant-free: each stream its own noise) of every mechanism at
    T = 100: the share of |release_t - release_{t-1}| beyond the stated half-width, at steps
    0, 1, 37 and 99 and level 0.9, lies in its binomial band (two-sided, 1e-6 each; 4 steps x
    ~17 mechanisms: false-failure rate < 1e-4). Integer sums cover at least the level. (1000
    draws: Gaussian noise 1.5x its stated variance misses 0.18 instead of 0.10, far
    outside the band of 0.058 .. 0.148.)"""
    draws = 1000
    for name, noise, mechanism in _all(100, seed=0):
        half = increments.increment_half_width(mechanism, 0.9)
        outs = np.array([mechanism.for_stream(f"s{i}").release(np.zeros(100))
                         for i in range(draws)])
        own = np.diff(outs, axis=1, prepend=0.0)
        for t in (0, 1, 37, 99):
            beyond = int(np.sum(np.abs(own[:, t]) > half[t] + 1e-9))
            low = stats.binom.ppf(1e-6, draws, 0.1)
            high = stats.binom.isf(1e-6, draws, 0.1)
            assert beyond <= high, (name, noise, t, beyond)
            if not mechanism.integer_release:
                assert beyond >= low, (name, noise, t, beyond)


def test_the_zero_noise_step_value_is_the_step_total():
    mechanism = make("binary_tree", 16, epsilon=1.0, noise_source=ConstantNoiseSource(0.0))
    x = np.arange(16, dtype=float)
    out, _ = mechanism.advance(mechanism.init_state(), x)
    np.testing.assert_array_equal(np.diff(out, prepend=0.0), x)


def test_the_documented_ratios_of_the_last_steps_own_value_to_its_running_total():
    """docs/mechanisms.md ("A step's own value"): T = 100, epsilon = 1, float noise."""
    documented = {"input_perturbation": 0.1, "kary_subtraction": 0.32, "smooth_binary": 0.63,
                  "sqrt_toeplitz": 0.71, "blt": 0.71, "binary_tree": 1.0,
                  "naive_composition": 1.41}
    for name, ratio in documented.items():
        mechanism = make(name, 100, epsilon=1.0, noise="float", seed=0)
        found = np.sqrt(increments.increment_variance(mechanism)[-1]
                        / mechanism.noise_variance()[-1])
        assert round(float(found), 2) == ratio, (name, found)
