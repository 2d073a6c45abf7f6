"""Closed forms and Chernoff bounds of sums of Laplace noises: the tail and quantile of an
equal-weight sum (a difference of Gamma laws: `laplace_sum_upper_tail`,
`laplace_sum_quantile`, used by `pivot` and as the tests' reference), and the Chernoff
half-widths (`laplace_chernoff_half_width`, `laplace_equal_weights_chernoff`) that give
`tails` its aliasing points and brackets.
"""
from __future__ import annotations

import functools
import math

import numpy as np


def laplace_sum_upper_tail(n: int, c: float) -> float:
    """P(S > c) for S the sum of n i.i.d. Laplace(0, 1) and c >= 0 (exact, log-space sum).

    S = G1 - G2 with G1, G2 ~ Gamma(n, 1), so
    P(S > c) = e^{-c}/(n-1)! * sum_{i<n} sum_{m<=i} C(i, m) c^{i-m} / i! * (n-1+m)! / 2^{n+m}.
    """
    if c <= 0:
        return 0.5
    log_c = math.log(c)
    logs = []
    for i in range(n):
        for m in range(i + 1):
            # C(i, m) / i! = 1 / (m! (i - m)!)
            logs.append(-math.lgamma(m + 1) - math.lgamma(i - m + 1) + (i - m) * log_c
                        + math.lgamma(n + m) - (n + m) * math.log(2.0))
    top = max(logs)
    log_sum = top + math.log(math.fsum(math.exp(v - top) for v in logs))
    return math.exp(-c - math.lgamma(n) + log_sum)


@functools.lru_cache(maxsize=4096)
def laplace_sum_quantile(n: int, alpha: float) -> float:
    """c with P(|S_n| > c) = alpha for the sum of n i.i.d. Laplace(0, 1) (bisection)."""
    low, high = 0.0, 1.0
    while 2.0 * laplace_sum_upper_tail(n, high) > alpha:
        high *= 2.0
    for _ in range(100):
        mid = 0.5 * (low + high)
        if 2.0 * laplace_sum_upper_tail(n, mid) > alpha:
            low = mid
        else:
            high = mid
    return high


def laplace_chernoff_half_width(variance: np.ndarray, max_scale: np.ndarray,
                                alpha: float) -> np.ndarray:
    """Conservative c with P(|sum w_i b Z_i| > c) <= alpha, from the variance and b max|w|.

    log E[exp(l b w Z)] = -log(1 - l^2 b^2 w^2) <= l^2 b^2 w^2 / (1 - l^2 m^2), m = b max|w|,
    so for any l in (0, 1/m): c(l) = [ln(2/alpha) + l^2 V / (2 (1 - l^2 m^2))] / l is valid; c
    is convex in l, so golden-section search finds the smallest. (Measured 1.2x (alpha = 1e-3)
    to 1.9x (alpha = 0.1) wider than exact quantiles: used for aliasing points and brackets.)
    """
    variance = np.asarray(variance, dtype=np.float64)
    m = np.asarray(max_scale, dtype=np.float64) * np.ones_like(variance)
    log_term = math.log(2.0 / alpha)

    def width(frac):
        lam = frac / m
        return (log_term + lam * lam * variance / (2.0 * (1.0 - frac * frac))) / lam

    return golden_minimum(width, variance.shape)


def laplace_equal_weights_chernoff(terms: np.ndarray, alpha: float) -> np.ndarray:
    """Conservative c with P(|S_n| > c) <= alpha for the sum of n i.i.d. Laplace(0, 1), from the
    exact MGF: c(l) = [ln(2/alpha) - n ln(1 - l^2)] / l, minimised over l in (0, 1)."""
    terms = np.asarray(terms, dtype=np.float64)
    log_term = math.log(2.0 / alpha)
    return golden_minimum(lambda frac: (log_term - terms * np.log1p(-frac * frac)) / frac,
                           terms.shape)


def golden_minimum(width, shape, iterations: int = 50) -> np.ndarray:
    """Element-wise minimum over frac in (0, 1) of a convex width(frac) (golden section);
    every value returned is width at some frac, so any use of it as a bound is valid."""
    lo = np.full(shape, 1e-9)
    hi = np.full(shape, 1.0 - 1e-9)
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a = hi - ratio * (hi - lo)
    b = lo + ratio * (hi - lo)
    wa, wb = width(a), width(b)
    for _ in range(iterations):  # bracket 0.618^50 = 4e-11 of (0, 1) by default
        left = wa < wb
        hi = np.where(left, b, hi)
        lo = np.where(left, lo, a)
        a = hi - ratio * (hi - lo)
        b = lo + ratio * (hi - lo)
        wa, wb = width(a), width(b)
    return np.minimum(wa, wb)
