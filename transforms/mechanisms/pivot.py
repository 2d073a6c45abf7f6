"""The law of one step's noise and of the running mean's pivot, and the pivot's quantile (the
numeric core of `ratio`'s confidence intervals; Beam-free, numpy only).

A release's noise at one step is a known weighted sum of i.i.d. node noises (`StepNoise`). For
the independent noises Ns and Nc of a sum and a count release (variances Vs and Vc) and a
candidate mean m, `ratio` inverts tests on the pivot Ns - m Nc, whose law `pivot_law` gives
(`PivotLaw`): it needs q(m), the law's two-sided (1 - alpha) quantile (`pivot_quantile`), over
[min_value, max_value] (`QuantileCurve`).

The pivot's law, per node-noise kind:
- "gaussian": N(0, Vs + m^2 Vc): q(m) = z_{alpha} sqrt(Vs + m^2 Vc), exact.
- "laplace": a weighted sum of independent Laplace variables, exact in law. Its quantile is
  computed by numerical inversion of the characteristic function (Gil-Pelaez, symmetric form
  P(|D| <= c) = (2/pi) int_0^inf phi(u) sin(c u) / u du, phi(u) = prod_i 1 / (1 + b_i^2 u^2)):
  the integral is truncated at U where the truncation error is at most 4 phi(U) / (pi c U)
  (phi(u)/u is positive and decreasing, so the tail of the sine integral is bounded by the
  second mean value theorem), U chosen so this bound is <= 1e-10, and the rest is integrated by
  12-point Gauss-Legendre panels no wider than a half period of sin(c u) (quadrature error
  not bounded analytically: measured below 1e-10 in P against the closed forms and scipy
  quadrature in the tests). A single group of equal Laplace
  weights uses the exact closed form of `tails.laplace_sum_quantile` instead.
  Across m, q(m) is a smooth function; it is interpolated (barycentric Chebyshev) and the
  interpolant is verified against exact evaluations at the interleaved points to a relative
  1e-9 before use (if that fails, every boundary is polished with exact evaluations instead).
- "discrete_laplace": approximate: the Laplace law with the discrete law's exact variance per
  node (b with 2 b^2 = 2p / (1 - p)^2, p = exp(-1/t)). Why not exact: a discrete Laplace of
  scale t is floor(t E1) - floor(t E2) with E1, E2 i.i.d. Exp(1); by the memorylessness of the
  exponential its integer and fractional parts are independent, so Laplace(t) = D + W with W
  independent of D (W = F1 - F2, |W| < 1): the discrete law is the continuous one with W's
  variance taken out, which the matched variance keeps. The coupling bound |D - L| < 1 per node
  gives a conservative quantile (q + sum |w_i|), but at small node scales it over-covers
  (0.97 for a nominal 0.95); the approximation's coverage is tested in the nominal band.
- "discrete_gaussian": approximate: the normal law with the discrete laws' exact variances
  (the discrete Gaussian of parameter sigma^2 >= 1 has the continuous Gaussian's
  characteristic function up to terms of order exp(-2 pi^2 sigma^2)); coverage is tested.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional, Sequence, Tuple

import numpy as np

from transforms import validation as check
from . import tails

LAPLACE = "laplace"
GAUSSIAN = "gaussian"
DISCRETE_LAPLACE = "discrete_laplace"
DISCRETE_GAUSSIAN = "discrete_gaussian"
NOISE_LAWS = (LAPLACE, GAUSSIAN, DISCRETE_LAPLACE, DISCRETE_GAUSSIAN)
# How the pivot's quantile relates to the law of the released noise, per node law.
LAW_QUALITY = {LAPLACE: "exact", GAUSSIAN: "exact", DISCRETE_LAPLACE: "approximate",
               DISCRETE_GAUSSIAN: "approximate"}

TRUNCATION_TOLERANCE = 1e-10   # bound on the Gil-Pelaez truncation error of P(|D| <= c)
_MAX_CUTOFF = float(1 << 16)   # largest truncation point U (in units of 1 / sd of D)
_INTERPOLATION_TOLERANCE = 1e-9  # relative error of the q(m) interpolant, verified
_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(12)


# ----- the law of one step's noise -------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StepNoise:
    """The noise of one release at one step: sum_i w_i z_i over i.i.d. node noises z_i.

    `law`: one of NOISE_LAWS. `scale`: a node's Laplace scale b (discrete Laplace: t) or
    Gaussian sigma (discrete Gaussian: sqrt of its parameter). `weights`: the distinct |w_i|,
    `counts`: how many nodes carry each. `variance`: the exact variance of the step's noise
    (the discrete laws' own). Multiply by a constant with `scaled` (e.g. a value grid).

    >>> noise = StepNoise.of("laplace", 2.0, [1.0, -1.0, 1.0])
    >>> noise.weights, noise.counts, noise.variance
    ((1.0,), (3,), 24.0)
    """
    law: str
    scale: float
    weights: Tuple[float, ...]
    counts: Tuple[int, ...]
    variance: float

    @classmethod
    def of(cls, law: str, scale: float, weights: Sequence[float],
           variance: Optional[float] = None) -> "StepNoise":
        """From a node law, its scale and the per-node weights (signs do not matter: every node
        law is symmetric). `variance` defaults to the continuous law's (2 b^2 or sigma^2 per
        unit weight); give the exact one for discrete laws."""
        check.one_of("law", law, NOISE_LAWS)
        scale = check.positive_finite("scale", scale)
        w = np.abs(np.asarray(weights, dtype=np.float64).reshape(-1))
        if not np.all(np.isfinite(w)):
            check.fail("weights", "finite numbers", weights)
        w = w[w > 0]
        distinct, counts = np.unique(w, return_counts=True)
        if variance is None:
            node = 2.0 * scale * scale if law in (LAPLACE, DISCRETE_LAPLACE) else scale * scale
            variance = node * float(np.sum(counts * distinct ** 2))
        elif (isinstance(variance, bool) or not isinstance(variance, (int, float))
              or not math.isfinite(variance) or variance < 0):
            check.fail("variance", "a finite number >= 0", variance)
        return cls(law, scale, tuple(float(x) for x in distinct),
                   tuple(int(c) for c in counts), float(variance))

    def scaled(self, factor: float) -> "StepNoise":
        """The law of factor x this noise (e.g. grid units to value units)."""
        if (isinstance(factor, bool) or not isinstance(factor, (int, float, np.floating))
                or not math.isfinite(factor)):
            check.fail("factor", "a finite number", factor)
        factor = abs(float(factor))
        if factor == 0.0:
            return dataclasses.replace(self, weights=(), counts=(), variance=0.0)
        return dataclasses.replace(self, weights=tuple(w * factor for w in self.weights),
                                   variance=self.variance * factor * factor)

    @property
    def quality(self) -> str:
        """'exact' or 'approximate' (see the module docstring)."""
        return LAW_QUALITY[self.law]


# ----- the pivot's law and its quantile ---------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PivotLaw:
    """The law of Ns - m Nc as its parts: independent Laplace(b) terms (`scales` with
    `counts`) and an independent N(0, `gaussian_variance`) term."""
    scales: Tuple[float, ...]
    counts: Tuple[int, ...]
    gaussian_variance: float

    @property
    def variance(self) -> float:
        """Variance of the continuous part."""
        return (2.0 * math.fsum(c * b * b for b, c in zip(self.scales, self.counts))
                + self.gaussian_variance)


def pivot_law(sum_noise: StepNoise, count_noise: StepNoise, mean: float) -> PivotLaw:
    """The law of Ns - `mean` Nc for independent noises of these laws (see PivotLaw)."""
    groups = {}
    gaussian = 0.0
    for noise, factor in ((sum_noise, 1.0), (count_noise, abs(float(mean)))):
        if factor == 0.0 or not noise.weights:
            continue
        if noise.law in (GAUSSIAN, DISCRETE_GAUSSIAN):
            gaussian += noise.variance * factor * factor
            continue
        node = noise.scale
        if noise.law == DISCRETE_LAPLACE:  # the Laplace scale of the node's exact variance
            node = math.sqrt(noise.variance / (2.0 * math.fsum(
                c * w * w for w, c in zip(noise.weights, noise.counts))))
        for w, c in zip(noise.weights, noise.counts):
            b = node * w * factor
            groups[b] = groups.get(b, 0) + c
    scales = tuple(sorted(groups))
    return PivotLaw(scales, tuple(groups[b] for b in scales), gaussian)


def pivot_quantile(sum_noise: StepNoise, count_noise: StepNoise, mean: float,
                   level: float = 0.95) -> float:
    """q with P(|Ns - mean Nc| <= q) = `level` (exact laws; for discrete noise the continuous
    law of the same variance: `StepNoise.quality`).

    >>> s, c = StepNoise.of("gaussian", 3.0, [1.0]), StepNoise.of("gaussian", 4.0, [1.0])
    >>> round(pivot_quantile(s, c, 1.0), 6)   # 1.959964 x 5
    9.79982
    """
    level = check.open_unit_interval("level", level)
    check_noise("sum_noise", sum_noise)
    check_noise("count_noise", count_noise)
    return _law_quantile(pivot_law(sum_noise, count_noise, mean), 1.0 - level)


def _law_quantile(law: PivotLaw, alpha: float) -> float:
    return _continuous_quantile(law.scales, law.counts, law.gaussian_variance, alpha)


@functools.lru_cache(maxsize=65536)
def _continuous_quantile(scales: Tuple[float, ...], counts: Tuple[int, ...], gaussian: float,
                         alpha: float) -> float:
    """Two-sided (1 - alpha) quantile of sum_k Laplace(scales_k) x counts_k + N(0, gaussian)."""
    variance = 2.0 * math.fsum(c * b * b for b, c in zip(scales, counts)) + gaussian
    if variance <= 0.0:
        return 0.0
    sigma = math.sqrt(variance)
    if not scales:
        return tails.gaussian_quantile(alpha) * sigma
    if gaussian == 0.0 and len(scales) == 1 and counts[0] <= tails.EXACT_LAPLACE_TERMS:
        return scales[0] * tails.laplace_sum_quantile(counts[0], alpha)
    gammas = np.array(scales) / sigma
    multiplicity = np.array(counts, dtype=np.float64)
    g_var = gaussian / variance
    return sigma * _standard_quantile(gammas, multiplicity, g_var, alpha)


def _char(x: np.ndarray, gammas: np.ndarray, multiplicity: np.ndarray, g_var: float
          ) -> np.ndarray:
    """phi(x) of the standardised law (real, positive, decreasing in x >= 0)."""
    log_phi = -0.5 * g_var * x * x
    for g, n in zip(gammas, multiplicity):
        log_phi = log_phi - n * np.log1p((g * x) ** 2)
    return np.exp(log_phi)


def _standard_quantile(gammas, multiplicity, g_var, alpha) -> float:
    """The (1 - alpha) quantile of |D| for the unit-variance law (Gil-Pelaez, see module)."""
    target = 1.0 - alpha
    # brackets: 0 below; above, the Chernoff bound of `tails` (valid for Laplace + Gaussian:
    # the Gaussian's log-MGF l^2 v / 2 is below l^2 v / (2 (1 - l^2 m^2)))
    ceiling = float(tails.laplace_chernoff_half_width(np.array([1.0]),
                                                      np.array([float(np.max(gammas))]),
                                                      alpha)[0]) * 1.01
    low, high = 0.0, ceiling
    guess = min(tails.gaussian_quantile(alpha), 0.9 * high)
    c_min = 0.5 * guess
    for _ in range(4):
        x, w = _nodes(gammas, multiplicity, g_var, c_min, high)
        kernel = w * _char(x, gammas, multiplicity, g_var) * (2.0 / math.pi)
        c = guess
        for _ in range(200):
            cdf = float(np.dot(kernel, np.sin(c * x) / x))
            if cdf < target:
                low = max(low, c)
            else:
                high = min(high, c)
            density = float(np.dot(kernel, np.cos(c * x)))
            step = (target - cdf) / density if density > 0 else 0.0
            nxt = c + step
            if not low < nxt < high:
                nxt = 0.5 * (low + high)
            if abs(nxt - c) <= 1e-13 * max(1.0, c) or high - low <= 1e-13 * max(1.0, c):
                c = nxt
                break
            c = nxt
        if c >= c_min:
            return c
        c_min = 0.5 * c  # the truncation bound assumed c >= c_min: redo with nodes for c
        low, high = 0.0, ceiling
    return c


@functools.lru_cache(maxsize=4096)
def _cutoff(gammas: tuple, multiplicity: tuple, g_var: float, c_min: float) -> float:
    """Smallest U = 2^j with truncation bound 4 phi(U) / (pi c_min U) <= TRUNCATION_TOLERANCE."""
    g, n = np.array(gammas), np.array(multiplicity)
    cutoff = 4.0
    while cutoff < _MAX_CUTOFF:
        phi = float(_char(np.array([cutoff]), g, n, g_var)[0])
        if 4.0 * phi / (math.pi * c_min * cutoff) <= TRUNCATION_TOLERANCE:
            break
        cutoff *= 2.0
    return cutoff


def truncation_bound(scales: Sequence[float], counts: Sequence[int], gaussian_variance: float,
                     c: float) -> float:
    """The bound on |P(|D| <= c) - its truncated Gil-Pelaez integral| used here, for the law of
    `PivotLaw` parts (c in the law's own units)."""
    variance = 2.0 * math.fsum(n * b * b for b, n in zip(scales, counts)) + gaussian_variance
    sigma = math.sqrt(variance)
    g = np.array(scales, dtype=np.float64) / sigma
    n = np.array(counts, dtype=np.float64)
    g_var = gaussian_variance / variance
    cutoff = _cutoff(tuple(g), tuple(n), g_var, c / sigma)
    phi = float(_char(np.array([cutoff]), g, n, g_var)[0])
    return 4.0 * phi / (math.pi * (c / sigma) * cutoff)


def _nodes(gammas, multiplicity, g_var, c_min, c_max):
    """Gauss-Legendre nodes and weights on [0, U], panels no wider than a half period of
    sin(c_max x) (and <= 1)."""
    cutoff = _cutoff(tuple(gammas), tuple(multiplicity), g_var, float(c_min))
    width = min(1.0, math.pi / c_max)
    panels = int(math.ceil(cutoff / width))
    edges = np.linspace(0.0, cutoff, panels + 1)
    half = 0.5 * (edges[1:] - edges[:-1])
    mid = 0.5 * (edges[1:] + edges[:-1])
    x = (mid[:, None] + half[:, None] * _GL_NODES[None, :]).reshape(-1)
    w = (half[:, None] * _GL_WEIGHTS[None, :]).reshape(-1)
    return x, w


# ----- q(m) over [min_value, max_value] ---------------------------------------------------------
class QuantileCurve:
    """m -> q(m) on [min_value, max_value] for one (sum noise, count noise, level): exact for
    Gaussian laws (closed form), else a barycentric Chebyshev interpolant of the exact q(m),
    verified at the interleaved points (`verified`, `max_relative_error`) to 1e-9."""

    def __init__(self, sum_noise: StepNoise, count_noise: StepNoise, low: float, high: float,
                 level: float = 0.95):
        self.sum_noise, self.count_noise = sum_noise, count_noise
        self.low, self.high = float(low), float(high)
        self.alpha = 1.0 - level
        self.gaussian = (sum_noise.law in (GAUSSIAN, DISCRETE_GAUSSIAN) or not sum_noise.weights
                         ) and (count_noise.law in (GAUSSIAN, DISCRETE_GAUSSIAN)
                                or not count_noise.weights)
        self.verified = True
        self.max_relative_error = 0.0
        if not self.gaussian and self.high > self.low:
            self._build()

    def exact(self, mean: float) -> float:
        """q(mean), computed exactly (no interpolation)."""
        return _law_quantile(pivot_law(self.sum_noise, self.count_noise, mean), self.alpha)

    def _build(self):
        size = 17
        while True:
            nodes = self._chebyshev(size)
            values = np.array([self.exact(m) for m in nodes])
            check_at = self._chebyshev(2 * size - 1)[1::2]
            want = np.array([self.exact(m) for m in check_at])
            got = self._interpolate(nodes, values, check_at)
            error = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-300)))
            if error <= _INTERPOLATION_TOLERANCE or size >= 257:
                break
            size = 2 * size - 1
        self.nodes, self.values = nodes, values
        self.max_relative_error = error
        self.verified = error <= _INTERPOLATION_TOLERANCE

    def _chebyshev(self, size: int) -> np.ndarray:
        j = np.arange(size)
        x = np.cos(np.pi * j / (size - 1))[::-1]
        return 0.5 * (self.low + self.high) + 0.5 * (self.high - self.low) * x

    @staticmethod
    def _interpolate(nodes, values, at):
        """Barycentric interpolation on Chebyshev points of the second kind."""
        size = nodes.shape[0]
        weights = (-1.0) ** np.arange(size)
        weights[0] *= 0.5
        weights[-1] *= 0.5
        at = np.asarray(at, dtype=np.float64)
        diff = at[..., None] - nodes
        exact_hit = diff == 0
        diff = np.where(exact_hit, 1.0, diff)
        terms = weights / diff
        out = np.sum(terms * values, axis=-1) / np.sum(terms, axis=-1)
        hit = exact_hit.any(axis=-1)
        if np.any(hit):
            out = np.where(hit, values[np.argmax(exact_hit, axis=-1)], out)
        return out

    def __call__(self, mean) -> np.ndarray:
        mean = np.asarray(mean, dtype=np.float64)
        if self.gaussian:
            vs, vc = self.sum_noise.variance, self.count_noise.variance
            return tails.gaussian_quantile(self.alpha) * np.sqrt(vs + mean * mean * vc)
        if self.high == self.low:
            return np.full(mean.shape, self.exact(self.low))
        return self._interpolate(self.nodes, self.values, mean)


# ----- validation -------------------------------------------------------------------------------
def check_noise(name: str, noise) -> None:
    """Refuse an argument `name` that is not a StepNoise (shared with `ratio`)."""
    if not isinstance(noise, StepNoise):
        check.fail(name, "a StepNoise (see step_noise)", noise)


__all__ = ["NOISE_LAWS", "LAW_QUALITY", "StepNoise", "PivotLaw", "pivot_law",
           "pivot_quantile", "truncation_bound", "QuantileCurve"]
