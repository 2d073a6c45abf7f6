"""Tail quantiles behind the confidence intervals."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from transforms.mechanisms import tails


def test_laplace_sum_tail_matches_numerical_convolution():
    for n in (1, 2, 3, 7):
        for c in (0.0, 0.5, 2.0, 6.0):
            got = tails.laplace_sum_upper_tail(n, c)
            if n == 1:
                expected = 0.5 * math.exp(-c)
            elif n == 2:  # density of the sum of two Laplace(1): (1 + |x|) e^{-|x|} / 4
                expected = integrate.quad(lambda x: (1 + x) * math.exp(-x) / 4, c, np.inf)[0]
            else:  # difference of Gammas
                expected = integrate.quad(
                    lambda y: stats.gamma.pdf(y, n) * stats.gamma.sf(c + y, n), 0, np.inf)[0]
            assert got == pytest.approx(expected, rel=1e-9), (n, c)


def test_laplace_sum_quantile_inverts_the_tail():
    for n in (1, 5, 30, 64):
        for alpha in (0.5, 0.05, 1e-6):
            c = tails.laplace_sum_quantile(n, alpha)
            assert 2 * tails.laplace_sum_upper_tail(n, c) == pytest.approx(alpha, rel=1e-9)
    assert tails.laplace_sum_quantile(1, 0.05) == pytest.approx(math.log(20), rel=1e-12)


def test_chernoff_widths_are_valid_and_measured():
    """Both Chernoff forms are conservative against the exact quantile; the exact-MGF form is
    never wider than the (variance, max weight) form, and within 1.25x of exact at n = 64,
    alpha = 1e-3 (where it is used: equal-weight sums of more than 64 terms)."""
    for n in (1, 4, 16, 64):
        for alpha in (0.1, 1e-3):
            exact = tails.laplace_sum_quantile(n, alpha)
            generic = tails.laplace_chernoff_half_width(np.array([2.0 * n]), np.array([1.0]),
                                                        alpha)[0]
            equal = tails.laplace_equal_weights_chernoff(np.array([n]), alpha)[0]
            assert exact <= equal <= generic * (1 + 1e-9), (n, alpha)
    assert tails.laplace_equal_weights_chernoff(np.array([64]), 1e-3)[0] <= (
        1.25 * tails.laplace_sum_quantile(64, 1e-3))


def test_weighted_chernoff_covers_a_monte_carlo_sqrt_sum():
    """200k draws of sum_j f(j) Z_j, f the square-root coefficients (T = 300): the empirical
    tail beyond the bound is below alpha (binomial false-failure rate < 1e-6)."""
    from transforms.mechanisms.toeplitz import sqrt_coefficients
    f = sqrt_coefficients(300)
    draws = np.random.default_rng(8).laplace(size=(200_000, 300)) @ f
    for alpha in (0.2, 0.05):
        c = tails.laplace_chernoff_half_width(np.array([2 * np.sum(f ** 2)]), np.array([1.0]),
                                              alpha)[0]
        assert np.mean(np.abs(draws) > c) < alpha


def test_gaussian_quantile():
    assert tails.gaussian_quantile(0.05) == pytest.approx(1.959963984540054, rel=1e-12)
