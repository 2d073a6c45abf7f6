"""The symmetric laws of one node's noise (`NodeLaw`: Laplace, Gaussian, discrete Laplace,
discrete Gaussian), as the exact tail computation (`tails`) needs them: the log characteristic
function, a Chernoff bound, the variance and closed forms of a single node. `node_law` builds
one from a mechanism's noise name and parameter.
"""
from __future__ import annotations

import math
from statistics import NormalDist
from typing import Optional, Tuple

import numpy as np

from transforms import validation as check
from .laplace_sums import (golden_minimum, laplace_chernoff_half_width,
                           laplace_equal_weights_chernoff)


def gaussian_quantile(alpha: float) -> float:
    """c with P(|N(0,1)| > c) = alpha."""
    return NormalDist().inv_cdf(1.0 - alpha / 2.0)


class NodeLaw:
    """One node's noise law: symmetric, with a real positive characteristic function psi that
    decreases on [0, inf) (continuous laws) or on [0, pi] (integer laws, period 2 pi)."""

    kind = ""
    lattice = False
    kurtosis_hint = 0.0  # excess kurtosis, or close to it (Newton's starting point only)

    def __init__(self, parameter: float):
        self.parameter = check.positive_finite("parameter", parameter)

    @property
    def scale_hint(self) -> float:
        """A node's standard deviation, or close to it (grid and ladder sizes only)."""
        raise NotImplementedError

    def log_cf(self, v: np.ndarray) -> np.ndarray:
        """log psi(v)."""
        raise NotImplementedError

    def tail_bound(self, squares, largest, counts, eps: float) -> np.ndarray:
        """Q_t with P(|S_t| >= Q_t) <= eps for S_t = sum_j w_j X_j, from sum_j w_j^2
        (`squares`), max_j |w_j| (`largest`) and, for weights +-1, their number (`counts`)."""
        raise NotImplementedError

    def truncation(self, u: np.ndarray, largest: np.ndarray) -> np.ndarray:
        """J with int_U^inf phi(u) / u du <= phi(U) J for a sum whose largest |weight| is
        `largest` (continuous laws)."""
        raise NotImplementedError

    def quadratic(self) -> Optional[Tuple[float, float]]:
        """(c, v_max) when log psi(v) = -c v^2 to double precision for |v| <= v_max."""
        return None

    def nonzero_probability(self) -> float:
        """P(X != 0): 1 for continuous laws; integer laws with a tiny scale (a huge budget)
        are a point mass at 0 up to this (`_quantiles` uses it: P(S != 0) <= n P(X != 0))."""
        return 1.0

    def __repr__(self):
        return f"{type(self).__name__}({self.parameter!r})"


class Laplace(NodeLaw):
    """Laplace(0, b): psi(v) = 1 / (1 + b^2 v^2)."""

    kind = "laplace"
    kurtosis_hint = 3.0

    @property
    def scale_hint(self):
        return math.sqrt(2.0) * self.parameter

    def log_cf(self, v):
        return -np.log1p((self.parameter * np.asarray(v)) ** 2)

    def tail_bound(self, squares, largest, counts, eps):
        b = self.parameter
        bound = laplace_chernoff_half_width(2.0 * b * b * np.asarray(squares, np.float64),
                                            b * np.asarray(largest, np.float64), eps)
        if counts is not None:
            bound = np.minimum(bound, b * laplace_equal_weights_chernoff(counts, eps))
        return bound

    def truncation(self, u, largest):
        y = (self.parameter * largest * u) ** 2
        return 0.5 * (1.0 + y) * np.log1p(1.0 / y)


class Gaussian(NodeLaw):
    """N(0, sigma^2): psi(v) = exp(-sigma^2 v^2 / 2) (sums have a closed form)."""

    kind = "gaussian"

    @property
    def scale_hint(self):
        return self.parameter

    def log_cf(self, v):
        return -0.5 * (self.parameter * np.asarray(v)) ** 2

    def tail_bound(self, squares, largest, counts, eps):
        return gaussian_quantile(eps) * self.parameter * np.sqrt(np.asarray(squares, np.float64))

    def truncation(self, u, largest):  # e^z E1(z) <= 1 / z
        return 1.0 / (self.parameter * largest * u) ** 2

    def quadratic(self):
        return 0.5 * self.parameter ** 2, math.inf


class DiscreteLaplace(NodeLaw):
    """Discrete Laplace of scale t on the integers, P(x) ~ q^|x|, q = exp(-1/t).

    Everything is computed from log q = -1/t (exact): q itself underflows to 0 for t below
    about 1/745 (an epsilon of 1e4 on sensitivity 1), where the law is a point mass at 0 to
    double precision."""

    kind = "discrete_laplace"
    lattice = True
    kurtosis_hint = 3.0

    @property
    def q(self) -> float:
        return math.exp(-1.0 / self.parameter)

    @property
    def log_q(self) -> float:
        return -1.0 / self.parameter

    @property
    def scale_hint(self):
        q = self.q
        return math.sqrt(2.0 * q) / (1.0 - q)

    def nonzero_probability(self) -> float:
        q = self.q
        return 2.0 * q / (1.0 + q)

    def log_cf(self, v):
        q = self.q
        half = np.sin(0.5 * np.asarray(v))
        return 2.0 * math.log1p(-q) - np.log((1.0 - q) ** 2 + 4.0 * q * half * half)

    def log_mgf(self, lam):
        """log E[exp(lam X)] for |lam| < 1/t (exact; q e^lam as exp(lam + log q), which
        neither overflows nor underflows to a wrong 0 near lam = 1/t)."""
        q, log_q = self.q, self.log_q
        lam = np.asarray(lam, dtype=np.float64)
        return (2.0 * math.log1p(-q) - np.log1p(-np.exp(lam + log_q))
                - np.log1p(-np.exp(-lam + log_q)))

    def tail_bound(self, squares, largest, counts, eps):
        if counts is not None:  # exact MGF: Q = min_l [ln(2/eps) + n log M(l)] / l, l < 1/t
            n = np.asarray(counts, dtype=np.float64)
            limit, log_term = 1.0 / self.parameter, math.log(2.0 / eps)
            return golden_minimum(
                lambda frac: (log_term + n * self.log_mgf(frac * limit)) / (frac * limit),
                n.shape)
        # Laplace(t) = D + W with W independent and symmetric (see `pivot`), so E e^{lD} <=
        # E e^{lL}: the continuous Laplace bound holds
        return Laplace(self.parameter).tail_bound(squares, largest, None, eps)

    def single_quantile(self, alpha: float) -> float:
        """Smallest integer c >= 0 with P(|X| > c) = 2 q^(c+1) / (1 + q) <= alpha (in log
        space: q^c = exp(c log q))."""
        q, log_q = self.q, self.log_q
        log_target = math.log(alpha * (1.0 + q) / 2.0)

        def tail(c):
            return 2.0 * math.exp((c + 1) * log_q) / (1.0 + q)

        c = max(0, math.ceil(log_target / log_q - 1.0))
        while c > 0 and tail(c - 1) <= alpha:
            c -= 1
        while tail(c) > alpha:
            c += 1
        return float(c)


class DiscreteGaussian(NodeLaw):
    """Discrete Gaussian on the integers with variance parameter sigma^2 (`parameter`),
    P(x) ~ exp(-x^2 / (2 sigma^2))."""

    kind = "discrete_gaussian"
    lattice = True

    @property
    def sigma(self) -> float:
        return math.sqrt(self.parameter)

    @property
    def scale_hint(self):
        return self.sigma

    def _poisson(self) -> bool:
        return self.sigma >= 0.5

    def _terms(self) -> np.ndarray:
        if self._poisson():  # images m with exp(-2 pi^2 sigma^2 (|m| - 1/2)^2 ...) > e^-45
            count = 1 + int(math.ceil(math.sqrt(45.0 / (2.0 * math.pi ** 2 * self.parameter))))
        else:               # integers k with exp(-k^2 / (2 sigma^2)) > e^-45
            count = 1 + int(math.ceil(math.sqrt(90.0 * self.parameter)))
        return np.arange(-count, count + 1, dtype=np.float64)

    @property
    def normaliser(self) -> float:
        """sum_k exp(-k^2 / (2 sigma^2)) (Poisson: sigma sqrt(2 pi) sum_m exp(-2 pi^2 sigma^2
        m^2))."""
        m = self._terms()
        if self._poisson():
            return self.sigma * math.sqrt(2.0 * math.pi) * math.fsum(
                np.exp(-2.0 * math.pi ** 2 * self.parameter * m * m))
        return math.fsum(np.exp(-m * m / (2.0 * self.parameter)))

    def nonzero_probability(self) -> float:
        """P(X != 0) = sum_{k != 0} exp(-k^2 / (2 sigma^2)) / normaliser, summed term by term
        for sigma < 1/2 (no cancellation against the normaliser; 1 - 1/normaliser beyond)."""
        if self._poisson():
            return 1.0 - 1.0 / self.normaliser
        m = self._terms()
        weights = np.exp(-m * m / (2.0 * self.parameter))
        return math.fsum(weights[m != 0]) / math.fsum(weights)

    def pmf_gap(self) -> float:
        """p(0) - p(1) = (1 - exp(-1 / (2 sigma^2))) / normaliser."""
        return -math.expm1(-0.5 / self.parameter) / self.normaliser

    def log_cf(self, v):
        v = np.asarray(v, dtype=np.float64)
        v = v - 2.0 * math.pi * np.round(v / (2.0 * math.pi))   # period 2 pi, |v| <= pi
        s2, m = self.parameter, self._terms()
        if self._poisson():
            # sum_m exp(-s2 (v + 2 pi m)^2 / 2) = exp(-s2 v^2 / 2) sum_m exp(-2 pi s2 m (v + pi m))
            images = -2.0 * math.pi * s2 * m * (v[..., None] + math.pi * m)
            top = np.max(images, axis=-1)
            log_sum = top + np.log(np.sum(np.exp(images - top[..., None]), axis=-1))
            log_norm = math.log(math.fsum(np.exp(-2.0 * math.pi ** 2 * s2 * m * m)))
            return -0.5 * s2 * v * v + log_sum - log_norm
        weights = np.exp(-m * m / (2.0 * s2))
        series = np.sum(weights * np.cos(v[..., None] * m), axis=-1) / math.fsum(weights)
        return np.log(series)

    def tail_bound(self, squares, largest, counts, eps):
        # sigma-subgaussian (CKS20 Cor. 9): a weighted sum is (sigma^2 sum w^2)-subgaussian
        return np.sqrt(2.0 * self.parameter * np.asarray(squares, np.float64)
                       * math.log(2.0 / eps))

    def quadratic(self):
        # |v| <= pi/2: the images m != 0 add exp(-2 pi s2 |m| (pi |m| - |v|)) <= exp(-pi^2 s2),
        # below 1e-38 relative for sigma >= 3; the normaliser is 1 to double precision
        if self.sigma >= 3.0:
            return 0.5 * self.parameter, 0.5 * math.pi
        return None


NODE_LAWS = {cls.kind: cls for cls in (Laplace, Gaussian, DiscreteLaplace, DiscreteGaussian)}


def node_law(kind: str, parameter: float) -> NodeLaw:
    """The node law `kind` ('laplace', 'gaussian', 'discrete_laplace', 'discrete_gaussian', a
    mechanism's `noise_name`) with its parameter: Laplace scale b, Gaussian sigma, discrete
    Laplace scale t, discrete Gaussian sigma^2 (the samplers' parameters)."""
    check.one_of("kind", kind, tuple(NODE_LAWS))
    return NODE_LAWS[kind](parameter)
