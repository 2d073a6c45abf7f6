"""Tail quantiles behind the confidence intervals: the exact inversion of `tails` against
independent references (closed forms, FFT convolution, extended-precision partial fractions,
QUADPACK's Fourier quadrature), its error bounds, and the retained Chernoff bounds."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import integrate, stats

from transforms.mechanisms import discrete, tails
from transforms.mechanisms.toeplitz import sqrt_coefficients

# the stated error: for continuous sums alpha - 2 TOLERANCE <= P(|S| > c) <= alpha; references
# agree with the inversion to ~1e-12, so the checks allow 1e-11 on top
BAND = 2 * tails.TOLERANCE + 1e-11


def partial_fraction_tail(weights, x) -> float:
    """P(|sum_i a_i L_i| > x) for Laplace(0, 1) L_i and distinct |a_i| (60 digits):
    sum_i prod_{j != i} a_i^2 / (a_i^2 - a_j^2) exp(-x / a_i)."""
    with mpmath.workdps(60):
        a = [mpmath.mpf(float(abs(v))) for v in weights]
        total = mpmath.mpf(0)
        for i, ai in enumerate(a):
            c = mpmath.mpf(1)
            for j, aj in enumerate(a):
                if j != i:
                    c *= ai ** 2 / (ai ** 2 - aj ** 2)
            total += c * mpmath.exp(-mpmath.mpf(float(x)) / ai)
        return float(total)


def fft_law(kind, parameter, terms):
    """pmf of the sum of `terms` i.i.d. discrete nodes on -K..K (repeated convolution)."""
    base = discrete.sampler(kind, parameter).pmf(1e-20)
    law = np.array([1.0])
    for _ in range(terms):
        law = np.convolve(law, base)
    return law, (law.shape[0] - 1) // 2


# ----- exactness against independent references ---------------------------------------------
def test_equal_weight_laplace_sums_match_the_gamma_closed_form():
    """n i.i.d. Laplace(1) (n <= 64, where the Gamma-difference closed form is exact): the
    returned c has closed-form tail in [alpha - 2e-10, alpha], and the inverted tail at any x
    equals the closed form to 1e-11."""
    node = tails.Laplace(1.0)
    ns = [1, 2, 3, 5, 17, 40, 64]
    for alpha in (0.5, 0.1, 0.05, 0.01, 1e-6):
        c = tails.step_quantiles(node, alpha, counts=ns)
        for n, value in zip(ns, c):
            tail = 2 * tails.laplace_sum_upper_tail(n, value)
            assert alpha - BAND <= tail <= alpha + 1e-12, (n, alpha, tail - alpha)
    for n in (2, 3, 9, 64):
        xs = np.array([0.3, 2.0, 7.5, 15.0]) * math.sqrt(n)
        got = tails.step_tails(node, xs, counts=[n] * 4)
        expected = [2 * tails.laplace_sum_upper_tail(n, x) for x in xs]
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-11)


def test_weighted_laplace_sums_match_partial_fractions_and_quadpack():
    """Weighted Laplace sums: the square root's rows l_0..l_{t-1} (t <= 12, distinct weights:
    partial fractions at 60 digits) and random weights (QUADPACK's Fourier quadrature of the
    Gil-Pelaez integral, scipy.integrate.quad(weight='sin'), an independent integrator)."""
    f = sqrt_coefficients(12)
    node = tails.Laplace(1.0)
    for alpha in (0.1, 0.05, 0.01):
        c = tails.step_quantiles(node, alpha, coefficients=f)
        for t in range(2, 13):
            tail = partial_fraction_tail(f[:t], c[t - 1])
            assert alpha - BAND <= tail <= alpha + 1e-12, (t, alpha, tail - alpha)
    rng = np.random.default_rng(5)
    for size in (3, 6):
        w = rng.uniform(0.2, 2.0, size) * rng.choice([-1, 1], size)
        b = 0.7
        for x in (1.0, 4.0, 9.0):
            phi = lambda u: np.prod(1.0 / (1.0 + (b * w * u) ** 2)) / u  # noqa: E731
            near = lambda u: x * np.sinc(u * x / math.pi) * u * phi(u)  # noqa: E731
            inside = 2 / math.pi * (integrate.quad(near, 0, 1, epsabs=1e-14, limit=200)[0]
                                    + integrate.quad(phi, 1, np.inf, weight="sin",
                                                     wvar=x)[0])
            # row t of a prefix vector is l_{t-1}..l_0: the whole vector is the last row
            got = tails.step_tails(tails.Laplace(b), x, coefficients=w)[-1]
            assert got == pytest.approx(1 - inside, abs=1e-9), (size, x)


def test_integer_sums_match_the_fft_convolution():
    """Discrete Laplace and discrete Gaussian sums (n <= 64): the same integer quantiles as the
    FFT convolution of `discrete.equal_weight_quantile`, and tails at integers equal to the
    repeatedly convolved pmf to 1e-11."""
    ns = [1, 2, 3, 7, 25, 64]
    for kind in discrete.KINDS:
        for parameter in (0.3, 1.0, 4.5, 40.0):
            node = tails.node_law(kind, parameter)
            for alpha in (0.1, 0.05, 0.01, 1e-5):
                got = tails.step_quantiles(node, alpha, counts=ns)
                expected = [discrete.equal_weight_quantile(kind, parameter, n, alpha)
                            for n in ns]
                assert got.tolist() == expected, (kind, parameter, alpha)
    for kind, parameter, n in ((discrete.DISCRETE_LAPLACE, 2.5, 5),
                               (discrete.DISCRETE_GAUSSIAN, 3.0, 9)):
        law, center = fft_law(kind, parameter, n)
        cs = np.array([0, 1, 4, 12, 25])
        expected = [1 - law[center - c:center + c + 1].sum() for c in cs]
        got = tails.step_tails(tails.node_law(kind, parameter), cs, counts=[n] * 5)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-11)


def test_long_integer_and_laplace_sums_against_references():
    """Beyond 64 terms (where the old intervals were Chernoff bounds): integer sums of 65..300
    nodes match the FFT convolution exactly; Laplace sums of 65 and 200 terms match the
    Gamma closed form."""
    for kind, parameter in ((discrete.DISCRETE_LAPLACE, 1.5), (discrete.DISCRETE_GAUSSIAN, 2.0)):
        ns = [65, 130, 300]
        got = tails.step_quantiles(tails.node_law(kind, parameter), 0.05, counts=ns)
        assert got.tolist() == [discrete.equal_weight_quantile(kind, parameter, n, 0.05)
                                for n in ns]
    c = tails.step_quantiles(tails.Laplace(2.0), 0.01, counts=[65, 200])
    for n, value in zip((65, 200), c):
        tail = 2 * tails.laplace_sum_upper_tail(n, value / 2.0)
        assert 0.01 - BAND <= tail <= 0.01 + 1e-12


def test_gaussian_sums_by_inversion_match_the_closed_form():
    """Gaussian nodes use the closed form; forced through the same inversion they give the
    same quantile (a check of the engine on a law with an exact answer)."""
    node = tails.Gaussian(1.3)
    rows = tails._Rows(None, sqrt_coefficients(300))
    ids = np.arange(1, 300)
    for alpha in (0.1, 0.01):
        inverted, fallback = tails._invert(node, rows, ids, tails.INVERSION, alpha)
        closed = tails.step_quantiles(node, alpha, coefficients=sqrt_coefficients(300))[1:]
        assert not fallback.any()
        tail = [math.erfc(c / (1.3 * math.sqrt(2 * v))) for c, v in
                zip(inverted, rows.squares[ids])]
        assert np.all(np.array(tail) <= alpha + 1e-12)
        assert np.all(np.array(tail) >= alpha - BAND)
        np.testing.assert_allclose(inverted, closed, rtol=1e-8)  # 1e-10 in probability


# ----- the discrete Gaussian with non-integer weights (discrete square root) ----------------
def lattice_quantile(weights, sigma2, alpha):
    """Exact quantile of sum_j w_j z_j for dyadic w (integer multiples of 1/d): the law of
    d S on the integers by direct convolution of the scaled pmfs."""
    d = 8
    base = discrete.sampler(discrete.DISCRETE_GAUSSIAN, sigma2).pmf(1e-22)
    law = np.array([1.0])
    for w in weights:
        k = int(round(w * d))
        spread = np.zeros((base.shape[0] - 1) * k + 1)
        spread[::k] = base
        law = np.convolve(law, spread)
    center = (law.shape[0] - 1) // 2
    inside = np.cumsum(law[center:]) + np.concatenate(([0.0], np.cumsum(law[center - 1::-1])))
    c = int(np.nonzero(1 - inside <= alpha)[0][0])
    return c / d


def test_discrete_gaussian_with_dyadic_weights_brackets_the_exact_lattice_quantile():
    """Weights 1, 1/2, 3/8 (the discrete square root's first L~): at t = 1 the exact lattice
    quantile; beyond, the sandwich c in [q, q + 2 max|w|] around the exact quantile q of the
    law on (1/8) Z, for sigma from 4 (revival bound added to the tail) to 60."""
    w = np.array([1.0, 0.5, 0.375])
    for sigma2 in (16.0, 200.0, 3600.0):
        node = tails.DiscreteGaussian(sigma2)
        for alpha in (0.1, 0.01):
            c, how = tails._quantiles(node, alpha, coefficients=w)
            assert how[0] == tails.LATTICE and np.all(how[1:] == tails.SMOOTHED)
            for t in (1, 2, 3):
                exact = lattice_quantile(w[:t], sigma2, alpha)
                if t == 1:
                    assert c[0] == exact
                else:
                    assert exact <= c[t - 1] <= exact + 2 * w.max(), (sigma2, alpha, t)


def test_the_revival_bound_covers_the_summed_revival_lobes():
    """The bound (2/pi)(7 zeta(3)/pi^2)(p(0) - p(1)) on the trapezoid terms of S' past the
    main lobe, against the terms summed over the first 1000 revivals (the rest is below
    1e-6 of the bound by the 1/m^3 decay), for sigma = 3..30 and 2..5 weights."""
    f = sqrt_coefficients(5)
    for sigma in (3.0, 10.0, 30.0):
        node = tails.DiscreteGaussian(sigma ** 2)
        bound = tails._REVIVAL * node.pmf_gap()
        # p(0) - p(1) <= p(0) / (2 sigma^2), p(0) <= 1 / (sigma sqrt(2 pi))
        assert 0.9 * 0.10828 / sigma ** 3 <= bound <= 0.10828 / sigma ** 3
        for t in (2, 3, 5):
            w = f[:t]
            reach = node.tail_bound(np.sum(w * w), 1.0, None, 4e-11) + 1.0
            h = 2 * math.pi / (2 * reach)
            u = h * np.arange(int(math.pi / h) + 1, int(1000 * 2 * math.pi / h))
            log_phi = sum(node.log_cf(wj * u) for wj in w)
            summed = (2 / math.pi) * h * np.sum(np.exp(log_phi) * np.sinc(u / (2 * math.pi))
                                                ** 2 / u)
            assert summed <= bound, (sigma, t)


def test_mechanism_sigma_keeps_the_revival_bound_negligible():
    """The discrete square root's sigma (grid units) at rho = 1/2 and T = 100: the revival
    bound is below 1e-10 (the stated numbers of the docs)."""
    from transforms.mechanisms import make
    mechanism = make("sqrt_toeplitz", 100, rho=0.5, seed=1)
    node, _ = mechanism._noise_node()
    assert node.sigma > 1000
    assert tails._REVIVAL * node.pmf_gap() < 1e-10


# ----- node laws and the API -------------------------------------------------------------------
def test_node_characteristic_functions_match_their_pmf_series():
    """log psi of the discrete laws (closed form / Poisson summation) against the Fourier
    series sum_k p(k) cos(k v) of their pmf, to 1e-12."""
    v = np.linspace(0, 2 * math.pi, 41)
    for kind in discrete.KINDS:
        for parameter in (0.2, 0.45, 1.0, 7.0):
            pmf = discrete.sampler(kind, parameter).pmf(1e-22)
            k = np.arange(pmf.shape[0]) - (pmf.shape[0] - 1) // 2
            series = np.cos(np.outer(v, k)) @ pmf
            got = np.exp(tails.node_law(kind, parameter).log_cf(v))
            np.testing.assert_allclose(got, series, rtol=1e-12, atol=1e-15)
            assert np.all(np.diff(got[:21]) <= 1e-15)  # decreasing on [0, pi]


def test_validation_messages():
    node = tails.Laplace(1.0)
    with pytest.raises(ValueError, match=r"^`counts` must be given, or coefficients given, "
                                         r"but not both; got None\.$"):
        tails.step_quantiles(node, 0.05)
    with pytest.raises(ValueError, match=r"^`counts` must be a 1-D array of integers >= 0; "
                                         r"got -2\.$"):
        tails.step_quantiles(node, 0.05, counts=[1, -2])
    with pytest.raises(ValueError, match=r"^`coefficients` must be a 1-D array of finite "
                                         r"numbers; got nan\.$"):
        tails.step_quantiles(node, 0.05, coefficients=[1.0, math.nan])
    with pytest.raises(ValueError, match=r"^`alpha` must be"):
        tails.step_quantiles(node, 1.0, counts=[1])
    with pytest.raises(ValueError, match=r"^`coefficients` must be 0 or \+-1 with "
                                         r"discrete_laplace nodes"):
        tails.step_quantiles(tails.DiscreteLaplace(1.0), 0.05, coefficients=[1.0, 0.5])
    with pytest.raises(ValueError, match=r"^`kind` must be one of"):
        tails.node_law("cauchy", 1.0)
    with pytest.raises(ValueError, match=r"^`parameter` must be a positive finite number"):
        tails.Laplace(-1.0)
    with pytest.raises(ValueError, match=r"^`x` must be integers for integer sums"):
        tails.step_tails(tails.DiscreteLaplace(1.0), 2.5, counts=[3])


def test_zero_rows_and_scaling():
    """Steps without noise get 0; quantiles scale with the node scale (exact laws)."""
    c = tails.step_quantiles(tails.Laplace(1.0), 0.05, counts=[0, 3, 0, 3])
    assert c[0] == c[2] == 0.0 and c[1] == c[3] > 0
    scaled = tails.step_quantiles(tails.Laplace(3.0), 0.05, counts=[3])[0]
    assert scaled == pytest.approx(3 * c[1], rel=1e-9)
    assert tails.step_quantiles(tails.Laplace(1.0), 0.05, coefficients=[0.0, 0.0]).tolist() \
        == [0.0, 0.0]


# ----- the retained closed form and Chernoff bounds --------------------------------------------
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


def test_chernoff_bounds_are_valid_and_measured():
    """Both Chernoff forms (the inversion's aliasing points and brackets) are conservative
    against the exact quantile; the exact-MGF form is never wider than the (variance, max
    weight) form; and they are 1.2x (n = 64, alpha = 1e-3) to 2.5x (n = 1, alpha = 0.1) too
    wide, which is why intervals no longer use them."""
    ratios = []
    for n in (1, 4, 16, 64):
        for alpha in (0.1, 1e-3):
            exact = tails.laplace_sum_quantile(n, alpha)
            generic = tails.laplace_chernoff_half_width(np.array([2.0 * n]), np.array([1.0]),
                                                        alpha)[0]
            equal = tails.laplace_equal_weights_chernoff(np.array([n]), alpha)[0]
            assert exact <= equal <= generic * (1 + 1e-9), (n, alpha)
            ratios.append(generic / exact)
    assert 1.2 < min(ratios) and max(ratios) < 2.5
    assert tails.laplace_equal_weights_chernoff(np.array([64]), 1e-3)[0] <= (
        1.25 * tails.laplace_sum_quantile(64, 1e-3))
    # the weighted form against the exact quantile of a weighted sum (square root, T = 300)
    f = sqrt_coefficients(300)
    for alpha in (0.2, 0.05, 1e-4):
        bound = tails.laplace_chernoff_half_width(np.array([2 * np.sum(f ** 2)]),
                                                  np.array([1.0]), alpha)[0]
        exact = tails.step_quantiles(tails.Laplace(1.0), alpha, coefficients=f)[-1]
        assert exact < bound < 2.5 * exact  # 2.1x at alpha = 0.2, 1.6x at 1e-4


def test_gaussian_quantile():
    assert tails.gaussian_quantile(0.05) == pytest.approx(1.959963984540054, rel=1e-12)
