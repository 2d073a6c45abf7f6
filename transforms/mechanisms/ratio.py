"""Confidence intervals for a running mean released as noisy sum / noisy count, and the split of
one budget between the two releases (`ContinualMean`'s numeric core; Beam-free, numpy only).

Setting. At one step a key has the exact sum S and count C of its (clamped, truncated) values,
and the two continual releases publish S^ = S + Ns and C^ = C + Nc. The noises are independent
(two mechanisms, independent node noise), each a known weighted sum of i.i.d. node noises
(`StepNoise`; `step_noise` reads it off a mechanism). The mean m = S / C lies in
[min_value, max_value] whenever C >= 1.

Method: test inversion (Fieller's construction). For a candidate m, the pivot
S^ - m C^ = (S - m C) + Ns - m Nc equals Ns - m Nc exactly when m is the true mean, and the law
of Ns - m Nc is known for every m. With q(m) its two-sided (1 - alpha) quantile,
P(|Ns - m Nc| <= q(m)) >= 1 - alpha at the true m, so the set
    {m in [min_value, max_value] : |S^ - m C^| <= q(m)}
contains the true mean with probability >= 1 - alpha: the confidence set obtained by inverting
a family of level-alpha tests (Lehmann & Romano, Testing Statistical Hypotheses, Thm 3.5.1 /
Sec. 3.5: the acceptance regions of level-alpha tests of m = m0 form a 1 - alpha confidence
set). Fieller's theorem (Fieller 1954, "Some problems in interval estimation", JRSS B 16) is
the Gaussian case: the set is {m : (S^ - m C^)^2 <= z^2 (Vs + m^2 Vc)}, a quadratic inequality.
Coverage is exactly nominal when the pivot's law is exact and continuous (the interval here is
the set's hull, which can only add coverage).

The pivot's law and its quantile q(m), per node-noise kind, are in `pivot`: exact for Gaussian
noise (closed form) and for Laplace noise (numerical inversion of the characteristic function),
approximate for discrete noise (the continuous law of the discrete law's exact variance).

The set {m : |S^ - m C^| <= q(m)} may fail to be an interval in pathological cases (C^ small
compared with its noise: like Fieller's unbounded/two-ray sets); `ratio_interval` returns its
hull within [min_value, max_value], which can be the whole range (correct: the data do not pin
the mean down). An empty set (probability <= alpha) is reported as the single least-rejected
value (`empty=True`).

The budget split (`best_split`): the delta-method variance of S^ / C^ is
(Vs + m^2 Vc) / C^2. Both parts run the same mechanism kind on the same horizon, so at every
step Vs = K Delta_s^2 / share^p and Vc = K Delta_c^2 / (1 - share)^p, with p = 2 under pure DP
(Laplace scale Delta / epsilon) and p = 1 under zCDP (sigma^2 = Delta^2 / (2 rho)): the
minimiser does not depend on the step, on C or on K. See `best_split` for the closed forms.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Tuple

import numpy as np

from transforms import validation as check
from . import tails
from .pivot import (GAUSSIAN, LAPLACE, LAW_QUALITY, NOISE_LAWS, PivotLaw, QuantileCurve,
                    StepNoise, check_noise, pivot_law, pivot_quantile, truncation_bound)


# ----- the law of one step's noise -------------------------------------------------------------
def step_noise(mechanism, step: int) -> StepNoise:
    """The law of `mechanism`'s noise at `step` (1-based), through its public methods: the node
    law (`noise_name`, `node_scale`), the exact per-step variance (`noise_variance`) and the
    step's weights: +-1 on `node_counts` nodes for the trees, the left coefficients
    l_0 .. l_{t-1} for the Toeplitz family, else the row of `dense_factors()`.

    >>> from transforms.mechanisms import make
    >>> mech = make("binary_tree", horizon=8, epsilon=1.0, seed=1, noise="float")
    >>> step_noise(mech, 7).counts   # popcount(7) nodes of weight 1
    (3,)
    """
    horizon = check.integer_at_least("mechanism.horizon", mechanism.horizon, 1)
    step = check.integer_at_least("step", step, 1)
    if step > horizon:
        check.fail("step", f"<= horizon ({horizon})", step)
    variance = float(mechanism.noise_variance()[step - 1])
    law = mechanism.noise_name
    scale = float(mechanism.node_scale)
    weights = None
    if hasattr(mechanism, "node_counts"):
        weights = np.ones(int(round(float(mechanism.node_counts(step - 1, 1)[0]))))
    elif hasattr(mechanism, "left_coefficients"):
        weights = np.asarray(mechanism.left_coefficients(), dtype=np.float64)[:step]
    node_variance = float(mechanism.node_variance)
    if weights is None or not math.isclose(node_variance * float(np.sum(weights ** 2)),
                                           variance, rel_tol=1e-9, abs_tol=1e-300):
        weights = np.asarray(mechanism.dense_factors()[0], dtype=np.float64)[step - 1]
    return StepNoise.of(law, scale, weights, variance=variance)


# ----- the interval -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RatioInterval:
    """A mean's release at one step (floats, or arrays for array inputs).

    `estimate`: clamp(S^ / C^) when C^ > 0, else the range's midpoint. `low`, `high`: the hull
    of the test-inversion set within [min_value, max_value]. `std_error`: the delta-method
    sqrt(Vs + m^2 Vc) / C^ at m = estimate, capped at (max_value - min_value) / 2 (the largest
    standard deviation of anything in the range; the cap also applies when C^ <= 0).
    `whole`: the interval is the whole range. `empty`: the test-inversion set was empty
    (probability <= 1 - level): low = high = the least-rejected value. `quality`: 'exact'
    or 'approximate' (the worse of the two laws')."""
    estimate: object
    low: object
    high: object
    std_error: object
    whole: object
    empty: object
    level: float
    quality: str


def ratio_estimate(sum_release, count_release, min_value: float, max_value: float):
    """clamp(S^ / C^, min_value, max_value) where C^ > 0, else (min_value + max_value) / 2
    (nothing is known about the mean when the noisy count is not positive).

    >>> ratio_estimate(30.0, 4.0, 0.0, 5.0), ratio_estimate(30.0, -1.0, 0.0, 5.0)
    (5.0, 2.5)
    """
    low, high = _check_range(min_value, max_value)
    s = np.asarray(sum_release, dtype=np.float64)
    c = np.asarray(count_release, dtype=np.float64)
    positive = c > 0
    ratio = np.divide(s, c, out=np.zeros(np.broadcast(s, c).shape), where=positive)
    out = np.where(positive, np.clip(ratio, low, high), 0.5 * (low + high))
    return float(out) if out.ndim == 0 else out


def ratio_interval(sum_release, count_release, sum_noise: StepNoise, count_noise: StepNoise,
                   min_value: float, max_value: float, level: float = 0.95,
                   curve: Optional[QuantileCurve] = None) -> RatioInterval:
    """Confidence interval for the mean S / C from S^ = S + Ns and C^ = C + Nc (module
    docstring: Fieller / test inversion, the hull of {m in range : |S^ - m C^| <= q(m)}).

    Args:
      sum_release, count_release: the released noisy sum and count at one step (floats, or
        arrays of keys sharing the step's noise laws: one q(m) curve serves them all).
      sum_noise, count_noise: the laws of their noises at that step (`step_noise`), in the
        same units as the releases (e.g. `scaled(grid)` for a sum released in grid units).
      min_value, max_value: the clamping bounds (the mean lies in them when C >= 1).
      level: the confidence level.
      curve: a `QuantileCurve` for these laws, range and level, to reuse across calls.
    Returns:
      RatioInterval (estimate, low, high, std_error, whole, empty, level, quality).

    >>> s = StepNoise.of("gaussian", 3.0, [1.0])
    >>> c = StepNoise.of("gaussian", 1.0, [1.0])
    >>> r = ratio_interval(500.0, 100.0, s, c, 0.0, 10.0)
    >>> r.estimate, round(r.low, 4), round(r.high, 4)
    (5.0, 4.8876, 5.1162)
    """
    low, high = _check_range(min_value, max_value)
    level = check.open_unit_interval("level", level)
    check_noise("sum_noise", sum_noise)
    check_noise("count_noise", count_noise)
    s = np.asarray(sum_release, dtype=np.float64)
    c = np.asarray(count_release, dtype=np.float64)
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(c))):
        check.fail("releases", "finite numbers", (sum_release, count_release))
    scalar = s.ndim == 0 and c.ndim == 0
    s, c = np.broadcast_arrays(np.atleast_1d(s), np.atleast_1d(c))
    s, c = s.reshape(-1).astype(np.float64), c.reshape(-1).astype(np.float64)
    quality = max(sum_noise.quality, count_noise.quality,
                  key=("exact", "approximate").index)
    estimate = np.asarray(ratio_estimate(s, c, low, high)).reshape(-1)
    cap = 0.5 * (high - low)
    delta = np.sqrt(sum_noise.variance + estimate ** 2 * count_noise.variance)
    std_error = np.where(c > 0, np.minimum(delta / np.where(c > 0, c, 1.0), cap), cap)
    if high == low:
        lo_out = hi_out = np.full(s.shape, low)
        whole = np.ones(s.shape, bool)
        empty = np.zeros(s.shape, bool)
    else:
        if curve is None:
            curve = QuantileCurve(sum_noise, count_noise, low, high, level)
        elif (curve.sum_noise != sum_noise or curve.count_noise != count_noise
              or (curve.low, curve.high) != (low, high)
              or not math.isclose(curve.alpha, 1.0 - level)):
            check.fail("curve", "a QuantileCurve of these noises, range and level", curve)
        lo_out, hi_out, empty = _solve(s, c, low, high, curve)
        whole = (lo_out <= low) & (hi_out >= high)
    if scalar:
        return RatioInterval(float(estimate[0]), float(lo_out[0]), float(hi_out[0]),
                             float(std_error[0]), bool(whole[0]), bool(empty[0]), level,
                             quality)
    return RatioInterval(estimate, lo_out, hi_out, std_error, whole, empty, level, quality)


_GRID = 129
_OFFSETS = np.array([0.125, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0, 8.0])
_BISECTIONS = 64


def _solve(s: np.ndarray, c: np.ndarray, low: float, high: float, curve: QuantileCurve):
    """Hull of {m in [low, high] : |s - m c| <= q(m)} per sample (vectorised): q on a uniform
    grid and on points around s / c at the scale of the interval's half-width, then the
    outermost accepted candidates are pushed out by bisection against the next (rejected)
    candidate. A set whose pieces all fall between candidates would be missed; the candidates
    are dense where the set lives (around s / c, and everywhere at the uniform grid's step)."""
    n = s.shape[0]
    center = np.where(c != 0, s / np.where(c != 0, c, 1.0), 0.5 * (low + high))
    anchor = np.clip(center, low, high)
    radius = curve(anchor) / np.maximum(np.abs(c), 1e-300)
    around = anchor[:, None] + radius[:, None] * np.concatenate((-_OFFSETS[::-1], [0.0],
                                                                 _OFFSETS))[None, :]
    grid = np.broadcast_to(np.linspace(low, high, _GRID), (n, _GRID))
    candidates = np.sort(np.clip(np.concatenate((grid, around), axis=1), low, high), axis=1)

    def slack(m):
        return curve(m) - np.abs(s.reshape((-1,) + (1,) * (m.ndim - 1)) - m
                                 * c.reshape((-1,) + (1,) * (m.ndim - 1)))

    f = slack(candidates)
    accepted = f >= 0
    empty = ~accepted.any(axis=1)
    width = candidates.shape[1]
    first = np.argmax(accepted, axis=1)
    last = width - 1 - np.argmax(accepted[:, ::-1], axis=1)
    rows = np.arange(n)
    lo_out = candidates[rows, first].copy()
    hi_out = candidates[rows, last].copy()
    # push the lower end down towards the previous (rejected) candidate
    inner = lo_out.copy()
    outer = candidates[rows, np.maximum(first - 1, 0)]
    move = (~empty) & (first > 0) & (outer < inner)
    lo_out[move] = _bisect(slack, inner[move], outer[move], rows[move], s, c, curve)
    inner = hi_out.copy()
    outer = candidates[rows, np.minimum(last + 1, width - 1)]
    move = (~empty) & (last < width - 1) & (outer > inner)
    hi_out[move] = _bisect(slack, inner[move], outer[move], rows[move], s, c, curve)
    if np.any(empty):  # the least-rejected candidate, as a point
        best = candidates[rows, np.argmax(f, axis=1)]
        lo_out[empty] = hi_out[empty] = best[empty]
    if not curve.verified:
        lo_out, hi_out = _polish(lo_out, hi_out, empty, s, c, low, high, curve)
    return lo_out, hi_out, empty


def _bisect(slack, inner, outer, rows, s, c, curve):
    """The accepted end of the boundary between inner (accepted) and outer (rejected)."""
    if rows.shape[0] == 0:
        return inner
    ss, cc = s[rows], c[rows]
    for _ in range(_BISECTIONS):
        mid = 0.5 * (inner + outer)
        ok = curve(mid) - np.abs(ss - mid * cc) >= 0
        inner = np.where(ok, mid, inner)
        outer = np.where(ok, outer, mid)
        if np.all(np.abs(outer - inner) <= 1e-14 * np.maximum(1.0, np.abs(inner))):
            break
    return inner


def _polish(lo_out, hi_out, empty, s, c, low, high, curve):
    """Boundaries re-found with exact q(m) (when the interpolant did not verify): secant-free
    bisection over a bracket of +-1 % of the range around each interpolated boundary."""
    span = 0.01 * (high - low)
    for ends, direction in ((lo_out, -1.0), (hi_out, 1.0)):
        for i in np.nonzero(~empty)[0]:
            m = ends[i]
            if (direction < 0 and m <= low) or (direction > 0 and m >= high):
                continue

            def ok(x):
                return curve.exact(x) - abs(s[i] - x * c[i]) >= 0
            inner, outer = m, min(high, max(low, m + direction * span))
            if not ok(inner):
                inner, outer = m - direction * span, m
                inner = min(high, max(low, inner))
                if not ok(inner):
                    continue
            if ok(outer):
                ends[i] = outer
                continue
            for _ in range(60):
                mid = 0.5 * (inner + outer)
                if ok(mid):
                    inner = mid
                else:
                    outer = mid
            ends[i] = inner
    return lo_out, hi_out


def fieller_interval(sum_release: float, count_release: float, sum_variance: float,
                     count_variance: float, level: float = 0.95
                     ) -> Tuple[Tuple[float, float], ...]:
    """Fieller's confidence set for S / C under Gaussian noise, on the whole real line: the
    solutions of (S^ - m C^)^2 <= z^2 (Vs + m^2 Vc), as a tuple of closed pieces (lo, hi)
    (lo may be -inf, hi +inf): one bounded piece, two rays, the whole line, or none.

    >>> fieller_interval(500.0, 100.0, 9.0, 1.0)   # doctest: +ELLIPSIS
    ((4.88..., 5.11...),)
    """
    z2 = tails.gaussian_quantile(1.0 - check.open_unit_interval("level", level)) ** 2
    s, c = float(sum_release), float(count_release)
    a = c * c - z2 * count_variance
    b = -2.0 * s * c
    k = s * s - z2 * sum_variance
    # discriminant / 4 = z^2 (Vc S^2 + Vs C^2 - z^2 Vs Vc), without cancellation
    quarter = z2 * (count_variance * s * s + sum_variance * c * c
                    - z2 * sum_variance * count_variance)
    if a == 0.0:
        if b == 0.0:
            return ((-math.inf, math.inf),) if k <= 0 else ()
        root = -k / b
        return ((-math.inf, root),) if b > 0 else ((root, math.inf),)
    if quarter < 0:
        return () if a > 0 else ((-math.inf, math.inf),)
    root = math.sqrt(quarter)
    r1, r2 = sorted(((s * c - root) / a, (s * c + root) / a))
    if a > 0:
        return ((r1, r2),)
    return ((-math.inf, r1), (r2, math.inf))


# ----- the budget split -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class BudgetSplit:
    """The share of the budget for the sum part (the count part gets the rest), for printing.

    `objective`: C^2 Var(S^/C^) at the reference mean, per unit of the mechanisms' common
    factor K (Vs = K Delta_s^2 / share^p, Vc = K Delta_c^2 / (1 - share)^p): compare splits
    with `split_variance`. `formula`: the closed form used."""
    sum_share: float
    count_share: float
    noise: str
    reference_mean: float
    sum_sensitivity: float
    count_sensitivity: float
    objective: float
    formula: str

    def describe(self) -> dict:
        return dataclasses.asdict(self)


def _exponent(noise: str) -> int:
    check.one_of("noise", noise, (LAPLACE, GAUSSIAN))
    return 2 if noise == LAPLACE else 1


def split_variance(sum_share: float, noise: str, sum_sensitivity: float,
                   count_sensitivity: float, reference_mean: float) -> float:
    """C^2 Var(S^ / C^) by the delta method at mean `reference_mean`, per unit of K:
    Delta_s^2 / w^p + m^2 Delta_c^2 / (1 - w)^p (p = 2 pure DP, 1 zCDP).

    >>> split_variance(0.5, "laplace", 10.0, 1.0, 10.0)
    800.0
    """
    w = check.open_unit_interval("sum_share", sum_share)
    p = _exponent(noise)
    return (sum_sensitivity ** 2 / w ** p
            + reference_mean ** 2 * count_sensitivity ** 2 / (1.0 - w) ** p)


def best_split(min_value: float, max_value: float, noise: str, *,
               sum_sensitivity: Optional[float] = None, count_sensitivity: float = 1.0,
               reference_mean: Optional[float] = None) -> BudgetSplit:
    """The sum part's share w of the budget (epsilon under pure DP, rho under zCDP; an
    (epsilon, delta) request splits its rho) minimising the delta-method variance of the mean,
    C^2 Var(S^/C^) ~ a / w^p + b / (1 - w)^p with a = Delta_s^2, b = m^2 Delta_c^2.

    Closed forms: pure DP (Laplace, p = 2): w = a^(1/3) / (a^(1/3) + b^(1/3)), minimum
    (a^(1/3) + b^(1/3))^3; zCDP (Gaussian, p = 1): w = sqrt(a) / (sqrt(a) + sqrt(b)), minimum
    (sqrt(a) + sqrt(b))^2. The factor 1/C^2 and the per-step factor K are common to every
    split, so the optimum depends neither on C nor on the step.

    Reference mean: by default the worst case over [min_value, max_value], |m| =
    max(|min_value|, |max_value|) = M (the variance grows with m^2). The default sensitivities
    are Delta_c = `count_sensitivity` and Delta_s = M Delta_c (each kept contribution changes
    the sum by at most M, the count by 1, on the same S_{D,k}); then a = b and the worst-case
    optimum is exactly 1/2 for both noises. Pass `reference_mean` (e.g. the expected mean) to
    optimise for a typical mean instead.

    >>> best_split(0.0, 10.0, "laplace").sum_share
    0.5
    >>> round(best_split(0.0, 10.0, "laplace", reference_mean=5.0).sum_share, 4)
    0.6135
    """
    low, high = _check_range(min_value, max_value)
    p = _exponent(noise)
    bound = max(abs(low), abs(high))
    count_sensitivity = check.positive_finite("count_sensitivity", count_sensitivity)
    if sum_sensitivity is None:
        if bound == 0:
            check.fail("max_value", "nonzero when min_value is 0 (the sum carries no "
                                    "information)", max_value)
        sum_sensitivity = bound * count_sensitivity
    sum_sensitivity = check.positive_finite("sum_sensitivity", sum_sensitivity)
    if reference_mean is None:
        reference_mean = bound
    elif (isinstance(reference_mean, bool) or not isinstance(reference_mean, (int, float))
          or not math.isfinite(reference_mean) or reference_mean == 0):
        check.fail("reference_mean", "a nonzero finite number (at m = 0 the count carries "
                                     "no error)", reference_mean)
    if reference_mean == 0:
        check.fail("reference_mean", "nonzero (max(|min_value|, |max_value|) is 0)",
                   reference_mean)
    a = sum_sensitivity ** 2
    b = reference_mean ** 2 * count_sensitivity ** 2
    if p == 2:
        ra, rb = a ** (1.0 / 3.0), b ** (1.0 / 3.0)
        share = ra / (ra + rb)
        formula = "w = a^(1/3) / (a^(1/3) + b^(1/3)), a = Delta_s^2, b = m^2 Delta_c^2"
    else:
        ra, rb = math.sqrt(a), math.sqrt(b)
        share = ra / (ra + rb)
        formula = "w = sqrt(a) / (sqrt(a) + sqrt(b)), a = Delta_s^2, b = m^2 Delta_c^2"
    return BudgetSplit(share, 1.0 - share, noise, float(reference_mean), sum_sensitivity,
                       count_sensitivity,
                       split_variance(share, noise, sum_sensitivity, count_sensitivity,
                                      reference_mean), formula)


# ----- validation -------------------------------------------------------------------------------
def _check_range(min_value, max_value) -> Tuple[float, float]:
    for name, value in (("min_value", min_value), ("max_value", max_value)):
        if (isinstance(value, bool) or not isinstance(value, (int, float, np.floating,
                                                               np.integer))
                or not math.isfinite(value)):
            check.fail(name, "a finite number", value)
    if min_value > max_value:
        check.fail("max_value", f">= min_value ({min_value})", max_value)
    return float(min_value), float(max_value)


__all__ = ["StepNoise", "step_noise", "PivotLaw", "pivot_law", "pivot_quantile",
           "truncation_bound", "QuantileCurve", "RatioInterval", "ratio_estimate",
           "ratio_interval", "fieller_interval", "BudgetSplit", "split_variance", "best_split",
           "NOISE_LAWS", "LAW_QUALITY"]
