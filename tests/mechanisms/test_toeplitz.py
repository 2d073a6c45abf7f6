"""Square-root and naive factorizations against seeds 003/004 and NOTES.md."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from transforms.mechanisms import make as make_mechanism
from transforms.mechanisms.toeplitz import sqrt_coefficients


def make(*args, **kwargs):
    """These tests check the papers' continuous-noise formulas: float noise unless asked."""
    kwargs.setdefault("noise", "float")
    return make_mechanism(*args, **kwargs)


def exact_sqrt_coefficients(n):
    f = [Fraction(1)]
    for j in range(1, n):
        f.append(f[-1] * Fraction(2 * j - 1, 2 * j))
    return f


def test_sqrt_coefficients_square_to_the_all_ones_sequence_exactly():
    exact = exact_sqrt_coefficients(200)
    for j in range(200):  # (f * f)(j) = 1: T(f)^2 = A in exact arithmetic
        assert sum(exact[i] * exact[j - i] for i in range(j + 1)) == 1
    np.testing.assert_allclose(sqrt_coefficients(200), [float(v) for v in exact], rtol=1e-14)
    assert float(exact[10]) == pytest.approx(math.comb(20, 10) / 4 ** 10, rel=1e-15)


@pytest.mark.parametrize("horizon", [1, 10, 11, 1000, 4096])
def test_max_squared_row_norm_is_sum_of_f_squared(horizon):
    """Seed 003: ||L||^2_{2->inf} = sum_{j<T} f(j)^2, and rows grow with t."""
    mechanism = make("sqrt_toeplitz", horizon, rho=0.5, seed=0)
    exact = float(sum(v * v for v in exact_sqrt_coefficients(horizon)))
    weights = mechanism._squared_weights()
    assert weights[-1] == pytest.approx(exact, rel=1e-13)
    assert np.all(np.diff(weights) > 0)
    assert mechanism.sensitivity == pytest.approx(math.sqrt(exact), rel=1e-13)


def test_notes_limit_and_valid_bound_replace_seed_003_psi():
    """NOTES.md: sum f^2 - ln(T)/pi -> 1.066276; 1 + (gamma + ln T)/pi is a valid bound."""
    gamma = 0.5772156649015329
    for horizon in (11, 100, 10 ** 4, 10 ** 6):
        total = float(np.sum(sqrt_coefficients(horizon) ** 2))
        assert total <= 1 + (gamma + math.log(horizon)) / math.pi
    total = float(np.sum(sqrt_coefficients(10 ** 6) ** 2))
    assert total - math.log(10 ** 6) / math.pi == pytest.approx(1.066276, abs=2e-6)


def test_notes_table_T_1000_square_root_and_naive():
    cases = [("sqrt_toeplitz", 91.1712, 86.6262, 3.2650, 3.1022),
             ("naive_composition", 1414.2136, 1414.2136, 31.6228, 31.6228)]
    for name, lap_max, lap_mean, gau_max, gau_mean in cases:
        laplace = make(name, 1000, epsilon=1.0, seed=0)
        gauss = make(name, 1000, rho=0.5, seed=0)
        got = (laplace.max_se(), laplace.mean_se(), gauss.max_se(), gauss.mean_se())
        assert got == pytest.approx((lap_max, lap_mean, gau_max, gau_mean), abs=6e-5), name


def test_input_perturbation_variance_is_t_node_variances():
    mechanism = make("input_perturbation", 50, epsilon=2.0, seed=0)
    assert mechanism.sensitivity == 1.0
    np.testing.assert_allclose(mechanism.noise_variance(), 2 * 0.5 ** 2 * np.arange(1, 51))


def test_fft_noise_vector_equals_direct_convolution():
    mechanism = make("sqrt_toeplitz", 777, rho=1.0, seed=4)
    z = mechanism.noise_source.unit_noise("gaussian", mechanism.stream, 0, 0, 777)
    direct = np.convolve(sqrt_coefficients(777), z)[:777]
    np.testing.assert_allclose(mechanism._unit_noise(0, 777), direct, rtol=0, atol=1e-11)
