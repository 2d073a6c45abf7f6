"""The pivot's law and its quantile (mechanisms/pivot.py): the Gil-Pelaez quantile against
closed forms and quadrature, the discrete Laplace coupling, and the q(m) curve."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from transforms.mechanisms import pivot, tails


def _integral(f):
    """int f over the real line, split at 0 (f has a kink there)."""
    options = dict(epsabs=1e-13, epsrel=1e-13, limit=400)
    return (integrate.quad(f, -np.inf, 0.0, **options)[0]
            + integrate.quad(f, 0.0, np.inf, **options)[0])


def test_laplace_quantile_against_closed_forms_and_quadrature():
    """The Gil-Pelaez quantile: (1) forced on one equal-weight group, against the exact
    closed form of `tails` (|P - 0.95| < 1e-10); (2) two Laplace terms b1 L1 - m b2 L2 and (3) a
    Laplace plus a Gaussian, against scipy quadrature of the convolution (1e-8)."""
    for n in (1, 2, 5, 12):
        gamma = np.array([1.0 / math.sqrt(2 * n)])
        q = pivot._standard_quantile(gamma, np.array([float(n)]), 0.0, 0.05) * math.sqrt(2 * n)
        assert abs(2 * tails.laplace_sum_upper_tail(n, q) - 0.05) < 1e-10, n
    b1, b2 = 3.0, 1.7
    q = pivot._continuous_quantile((b2, b1), (1, 1), 0.0, 0.05)

    def laplace_cdf(x, b):
        return 0.5 * math.exp(x / b) if x < 0 else 1 - 0.5 * math.exp(-x / b)
    inside = _integral(lambda x: math.exp(-abs(x) / b1) / (2 * b1)
                       * (laplace_cdf(q - x, b2) - laplace_cdf(-q - x, b2)))
    assert inside == pytest.approx(0.95, abs=1e-8)
    assert pivot.truncation_bound((b2, b1), (1, 1), 0.0, q) <= pivot.TRUNCATION_TOLERANCE
    sd = 2.5
    q = pivot._continuous_quantile((b1,), (1,), sd * sd, 0.05)
    inside = _integral(lambda x: math.exp(-abs(x) / b1) / (2 * b1)
                       * (stats.norm.cdf((q - x) / sd) - stats.norm.cdf((-q - x) / sd)))
    assert inside == pytest.approx(0.95, abs=1e-8)


def test_pivot_quantile_gaussian_closed_form_and_discrete_laplace_variance():
    s = pivot.StepNoise.of("gaussian", 3.0, [1.0])
    c = pivot.StepNoise.of("gaussian", 4.0, [1.0])
    assert pivot.pivot_quantile(s, c, 1.0) == pytest.approx(5 * tails.gaussian_quantile(0.05))
    # discrete Laplace: the Laplace quantile at the node scale of the exact discrete variance
    def variance(t):  # of a discrete Laplace of scale t: 2p / (1 - p)^2, p = exp(-1/t)
        p = math.exp(-1.0 / t)
        return 2 * p / (1 - p) ** 2
    dl = pivot.StepNoise.of("discrete_laplace", 10.0, [1.0, 1.0], variance=2 * variance(10.0))
    cl = pivot.StepNoise.of("discrete_laplace", 2.0, [1.0] * 3, variance=3 * variance(2.0))
    fl = pivot.StepNoise.of("laplace", math.sqrt(variance(10.0) / 2), [1.0, 1.0])
    gl = pivot.StepNoise.of("laplace", math.sqrt(variance(2.0) / 2), [1.0] * 3)
    assert pivot.pivot_quantile(dl, cl, -2.0) == pytest.approx(
        pivot.pivot_quantile(fl, gl, -2.0), rel=1e-12)
    assert variance(2.0) < 2 * 2.0 ** 2  # smaller than the continuous law's: not the same q


def test_discrete_laplace_coupling_is_exact_in_law():
    """floor(t E1) - floor(t E2) is the discrete Laplace of scale t (the coupling the pivot
    module's argument for its discrete law rests on): its pmf against the sampler's exact pmf, 400k draws
    (chi-square-free: each of P(0), P(+-1), P(+-5) within 5 sd; false-failure rate < 1e-5)."""
    from transforms.mechanisms import discrete
    t = 3.0
    rng = np.random.default_rng(9)
    e = rng.exponential(size=(2, 400_000))
    x = np.floor(t * e[0]) - np.floor(t * e[1])
    pmf = discrete.DiscreteSampler("discrete_laplace", t).pmf()
    centre = (pmf.shape[0] - 1) // 2
    for value in (0, 1, -1, 5, -5):
        p = pmf[centre + value]
        assert abs(np.mean(x == value) - p) < 5 * math.sqrt(p * (1 - p) / 400_000)


def test_curve_is_verified_and_matches_exact():
    s = pivot.StepNoise.of("laplace", 30.0, [1.0] * 3)
    c = pivot.StepNoise.of("laplace", 3.0, [1.0] * 2)
    curve = pivot.QuantileCurve(s, c, -2.0, 10.0)
    assert curve.verified and curve.max_relative_error <= 1e-9
    for m in (-2.0, -0.3, 0.0, 0.01, 4.2, 10.0):
        assert curve(m) == pytest.approx(curve.exact(m), rel=1e-9)
