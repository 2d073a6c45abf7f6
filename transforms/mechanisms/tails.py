"""Exact two-sided tail quantiles of the per-step noise, for confidence intervals.

The noise of a release at step t is S_t = sum_j w_tj z_j: row t of the left factor L applied to
i.i.d. node noises z_j of one symmetric law, a `NodeLaw` (`Laplace`, `Gaussian`,
`DiscreteLaplace`, `DiscreteGaussian`: `node_law` builds one from a mechanism's noise name).
`step_quantiles` gives every step's half-width c_t, the smallest c with P(|S_t| > c) <= alpha;
`step_tails` gives P(|S_t| > x_t). One rule serves every mechanism. Rows come as equal weights
(`counts`: n_t nodes of weight +-1, the trees and the baselines) or as the prefixes of one
coefficient vector (`coefficients`: row t is l_{t-1}, ..., l_0, a Toeplitz L: square root, BLT).

Closed forms: Gaussian nodes (S_t ~ N(0, sigma^2 sum_j w_tj^2)); a single node (Laplace:
c = |w| b ln(1/alpha); discrete Laplace: P(|X| > c) = 2 q^(c+1) / (1 + q), q = exp(-1/t)).

Sums of continuous nodes (Laplace): Gil-Pelaez inversion of the real, positive characteristic
function phi(u) = prod_j psi(w_j u), psi(v) = 1 / (1 + b^2 v^2):

    P(|S| <= x) = (2/pi) int_0^inf phi(u) sin(u x) / u du,

by the trapezoid rule with step h: F(x) = (h/pi) [x + 2 sum_{k=1..N} phi(kh) sin(khx) / (kh)].
- Aliasing (Poisson summation): the untruncated sum is exactly
  sum_m P(|S - 2 pi m / h| <= x) = P(|S| <= x) + a with 0 <= a <= P(|S| >= 2 pi / h - x); with
  2 pi / h = x_max + Q, Q a Chernoff bound with P(|S| >= Q) <= eps, a <= eps.
- Truncation after N terms: phi(u) / u decreases, so the rest is at most
  (2/pi) int_U^inf phi(u) / u du <= (2/pi) phi(U) J(U), U = N h, with J from the largest
  factor alone (Laplace, y = (b max|w| U)^2: J = (1 + y) ln(1 + 1/y) / 2). U is the first
  point of a geometric ladder (ratio 2^(1/8)) where this is <= eps.
Integer sums (discrete nodes, weights +-1): the periodic version on the lattice, M odd,

    P(|S| <= c) = (1/M) sum_{k=0..M-1} phi(u_k) sin((c + 1/2) u_k) / sin(u_k / 2),

u_k = 2 pi k / M, exactly up to the aliasing sum_{m != 0} P(|S - m M| <= c) <= P(|S| >= M - c)
(M >= c + Q).
psi is positive and decreasing on [0, pi] (discrete Laplace: (1-q)^2 / (1 - 2q cos u + q^2);
discrete Gaussian: a Jacobi theta function, evaluated by Poisson summation
sum_m exp(-sigma^2 (u + 2 pi m)^2 / 2) / normaliser, or by its Fourier series for sigma < 1/2),
so the terms beyond U add at most phi(U) ln(pi / U). c is the smallest integer that passes.

Discrete Gaussian nodes with non-integer weights (the discrete square root, weights L~): S lives
on a fine dyadic lattice and phi has periodic revivals (phi(4 pi) = 1 at t = 2, weights 1 and
1/2), so it is not inverted as it is. With a = max_j |w_j| (the newest node's weight) and V
triangular on [-1, 1], S' = S + a V has the factor sinc^2(a u / 2), zero at that node's
revivals, and P(|S| > x' + a) <= P(|S'| > x') <= P(|S| > x' - a): c = x' + a, x' the quantile of
|S'|, covers and exceeds the exact (lattice) quantile by at most 2a (two grid units of the
release). The sum for S' is cut after the main lobe (phi decreasing on [0, pi / a]: at most
(2/pi) phi(U) ln(pi / (a U)), solved for U directly where log psi is quadratic), and the
revival lobes m >= 1 add at most
(2/pi) sum_m 4 / ((2m - 1) pi)^3 x 2 pi (p(0) - p(1)) = (2/pi) (7 zeta(3) / pi^2) (p(0) - p(1))
(the sum rule int_{-pi}^{pi} psi(d) sin^2(d/2) dd = pi (p(0) - p(1)); the factor 2 covers the
trapezoid's sampling of a lobe, verified against the summed lobes in the tests), about
0.108 / sigma^3 for sigma in grid units: <= 1.1e-10 for sigma >= 1000 (the mechanism's sigma
is 1639 at T = 100 and rho = 1/2, and grows with T); it is added to the tail too. The
subgaussian bound is used instead where it is narrower (both are valid: small sigma).

Error: the bounds (aliasing <= 0.4 tol, truncation <= 0.4 tol, 0.2 tol for rounding, with
tol = min(TOLERANCE, alpha / 1000)) are added to the tail before solving, so the half-width
never under-covers and over-covers by at most 2 tol: alpha - 2e-10 <= P(|S_t| > c_t) <= alpha
for continuous sums; for integer sums c_t is the exact lattice quantile (the smallest integer
with tail <= alpha; one more only if its tail is within 2e-10 of alpha). Float rounding is not
bounded analytically; measured below 1e-12 against closed forms (tests). A step whose inversion
would need more than MAX_POINTS points (never for the registry's mechanisms, tested) gets its
Chernoff bound instead (valid, wider). (Fichtenberger et al. 2023 Thm 1.2 as printed under-covers.)

The node laws are in `node_laws`; the Chernoff bounds (`laplace_sums`:
`laplace_chernoff_half_width`, `laplace_equal_weights_chernoff`) give the aliasing points Q and
brackets; `laplace_sums.laplace_sum_quantile` is the closed form of an equal-weight Laplace sum
(Gamma difference), used by `pivot` and as a reference in the tests.
"""
from __future__ import annotations

import math
from typing import Tuple

import numpy as np

from transforms import validation as check
# the node laws and the Laplace sums' closed forms, read here by callers too (re-exported)
from .laplace_sums import (laplace_chernoff_half_width, laplace_equal_weights_chernoff,  # noqa: F401
                           laplace_sum_quantile, laplace_sum_upper_tail)
from .node_laws import (NODE_LAWS, DiscreteGaussian, DiscreteLaplace, Gaussian,  # noqa: F401
                        Laplace, NodeLaw, gaussian_quantile, node_law)

EXACT_LAPLACE_TERMS = 64      # `laplace_sum_quantile`'s closed form is used up to here (pivot)
TOLERANCE = 1e-10             # bound on |estimated - exact| tail probability of one step
MAX_POINTS = 1 << 17          # largest grid of one step's inversion (else its Chernoff bound)
_ALIAS_SHARE, _TRUNCATION_SHARE, _ROUNDING_SHARE = 0.4, 0.4, 0.2
_LADDER = 2.0 ** 0.125        # ratio of the ladder on which truncation points are found
_ROWS = 4096                  # rows of log phi held at once, at most
_CELLS = 1 << 21              # rows x grid points held at once (16 MiB of float64 per array)
_ZETA3 = 1.2020569031595942
_REVIVAL = (2.0 / math.pi) * 7.0 * _ZETA3 / math.pi ** 2   # x (p(0) - p(1)): see the module

# how a step's quantile was found (`_quantiles`)
ZERO, CLOSED_FORM, INVERSION, LATTICE, SMOOTHED, CHERNOFF = range(6)


# ----- the rows of L ---------------------------------------------------------------------------
class _Rows:
    """Per row (a distinct step law): sum w^2, max |w|, number of nonzero weights; `prefix`
    holds the coefficients when rows are their prefixes and not all |w| are 0 or 1."""

    def __init__(self, counts, coefficients):
        if (counts is None) == (coefficients is None):
            check.fail("counts", "given, or coefficients given, but not both", counts)
        self.prefix = None
        if counts is not None:
            n = np.asarray(counts)
            valid = n.ndim == 1 and n.dtype.kind in "iuf"
            if valid:
                bad = ~(np.isfinite(n) & (n == np.round(n)) & (n >= 0))
                valid = not bad.any()
            if not valid:
                check.fail("counts", "a 1-D array of integers >= 0",
                           n[bad][0].item() if n.ndim == 1 and n.dtype.kind in "iuf" else counts)
            values, self.step_row = np.unique(n.astype(np.int64), return_inverse=True)
            self.nonzero = values.astype(np.float64)
            self.squares = self.quartics = self.nonzero
            self.largest = (values > 0).astype(np.float64)
        else:
            try:
                l = np.asarray(coefficients, dtype=np.float64)
            except (TypeError, ValueError):
                l = None
            if l is None or l.ndim != 1 or not np.all(np.isfinite(l)):
                check.fail("coefficients", "a 1-D array of finite numbers",
                           l[~np.isfinite(l)][0].item() if l is not None and l.ndim == 1
                           else coefficients)
            self.step_row = np.arange(l.shape[0])
            self.squares = np.cumsum(l * l)
            self.quartics = np.cumsum(l ** 4)
            self.largest = np.maximum.accumulate(np.abs(l)) if l.shape[0] else l
            self.nonzero = np.cumsum(l != 0).astype(np.float64)
            if not np.all((l == 0) | (np.abs(l) == 1)):
                self.prefix = l

    @property
    def unit(self) -> bool:
        """Every |weight| is 0 or 1 (then phi_t = psi^n_t)."""
        return self.prefix is None

    def counts(self, ids):
        return self.nonzero[ids] if self.unit else None


def _log_phi(node: NodeLaw, rows: _Rows, ids: np.ndarray, u: np.ndarray):
    """Yield (positions in ids, log phi of those rows at u) in chunks of at most _ROWS rows
    and _CELLS values. Prefix rows: ids must be ascending; log phi_t is a running sum over the
    coefficients (carried from chunk to chunk), unless psi is quadratic over the range."""
    u = np.asarray(u, dtype=np.float64)
    chunk = max(1, min(_ROWS, _CELLS // max(1, u.shape[0])))
    quadratic = node.quadratic()
    if rows.unit or (quadratic is not None and u.shape[0]
                     and float(np.max(rows.largest[ids])) * float(u[-1]) <= quadratic[1]):
        if rows.unit:
            base, weight = node.log_cf(u), rows.nonzero
        else:
            base, weight = -quadratic[0] * u * u, rows.squares
        for start in range(0, ids.shape[0], chunk):
            part = slice(start, min(start + chunk, ids.shape[0]))
            yield part, weight[ids[part], None] * base[None, :]
        return
    l = rows.prefix
    first, last = int(ids[0]), int(ids[-1])
    carry = np.zeros(u.shape[0])
    for start in range(0, first, chunk):
        carry += np.sum(node.log_cf(l[start:min(start + chunk, first), None] * u), axis=0)
    for start in range(first, last + 1, chunk):
        stop = min(start + chunk, last + 1)
        block = np.cumsum(node.log_cf(l[start:stop, None] * u), axis=0) + carry
        carry = block[-1].copy()
        lo, hi = np.searchsorted(ids, [start, stop])
        yield slice(lo, hi), block[ids[lo:hi] - start]


# ----- the inversion ---------------------------------------------------------------------------
def _tolerance(alpha: float) -> float:
    return min(TOLERANCE, alpha / 1000.0)


def _truncation_log_bound(node, kind, u, largest, log_phi):
    """log of the bound on the trapezoid terms beyond u (per row x ladder point)."""
    if kind == LATTICE:
        with np.errstate(divide="ignore"):
            return np.where(u < math.pi, log_phi + np.log(np.log(math.pi / np.minimum(
                u, math.pi))), -np.inf)
    if kind == SMOOTHED:
        v = largest[:, None] * u[None, :]
        inside = v < math.pi
        with np.errstate(divide="ignore", invalid="ignore"):
            sinc = np.sin(0.5 * v) / (0.5 * v)
            value = (math.log(2.0 / math.pi) + log_phi + 2.0 * np.log(np.abs(sinc))
                     + np.log(np.log(math.pi / np.where(inside, v, math.pi))))
        return np.where(inside, value, -np.inf)
    return (math.log(2.0 / math.pi) + log_phi
            + np.log(node.truncation(u[None, :], largest[:, None])))


def _cutoffs(node, rows, ids, kind, eps, high):
    """Per row, the first ladder point U with truncation bound <= eps (or `high`); for the
    smoothed kind with a quadratic log psi, the U solving the bound directly."""
    found = np.full(ids.shape[0], np.inf)
    quadratic = node.quadratic()
    ladder_rows = np.arange(ids.shape[0])
    if kind == SMOOTHED and quadratic is not None:
        # (2/pi) exp(-c W u^2) ln(pi / (a u)) <= eps (sinc^2 <= 1), by fixed-point iteration
        c, a, w = quadratic[0], rows.largest[ids], rows.squares[ids]
        target = math.log(eps * math.pi / 2.0)
        u = np.sqrt(-target / (c * w))
        for _ in range(6):
            log_log = np.log(np.maximum(np.log(math.pi / np.minimum(a * u, math.pi)), 1e-300))
            u = np.sqrt(np.maximum(log_log - target, 0.0) / (c * w))
        for _ in range(60):  # verify, and step up where the iteration fell short
            inside = a * u < math.pi
            bound = np.where(inside, math.log(2.0 / math.pi) - c * w * u * u + np.log(np.log(
                math.pi / np.where(inside, a * u, 1.0))), -np.inf)
            short = bound > math.log(eps)
            if not short.any():
                break
            u = np.where(short, u * 1.02, u)
        exact = (a * u <= quadratic[1]) & ~short
        found[exact] = u[exact]
        ladder_rows = np.nonzero(~exact)[0]
    if ladder_rows.shape[0]:
        sub = ids[ladder_rows]
        sd = np.sqrt(rows.squares[sub]) * node.scale_hint
        low = 0.5 / float(np.max(sd))
        top = float(np.max(high[ladder_rows]))
        count = max(2, int(math.ceil(math.log(top / low) / math.log(_LADDER))) + 2)
        ladder = low * _LADDER ** np.arange(count)
        ladder[-1] = max(ladder[-1], top)
        if quadratic is not None and not rows.unit:
            # an upper bound is enough: phi decreases on [0, pi / a], so beyond v_max / a
            # (where log psi stops being quadratic) log phi is at most its value there
            reach = quadratic[1] / rows.largest[sub]
            step = max(1, _CELLS // count)
            chunks = ((slice(i, i + step), -quadratic[0] * rows.squares[sub[i:i + step], None]
                       * np.minimum(ladder[None, :], reach[i:i + step, None]) ** 2)
                      for i in range(0, sub.shape[0], step))
        else:
            chunks = _log_phi(node, rows, sub, ladder)
        for part, log_phi in chunks:
            bound = _truncation_log_bound(node, kind, ladder, rows.largest[sub[part]],
                                          log_phi)
            ok = bound <= math.log(eps)
            first = np.argmax(ok, axis=1)
            found[ladder_rows[part]] = np.where(ok.any(axis=1), ladder[first], np.inf)
    return np.minimum(found, high)


def _blocks(points: np.ndarray, steps: np.ndarray, cutoffs: np.ndarray, lattice: bool):
    """Consecutive rows sharing one grid while it costs at most 1.25 times their own grids
    (plus 4 points a row; greedy, on a look-ahead window that doubles while the block fills
    it)."""
    start, n = 0, points.shape[0]
    while start < n:
        window = 1024
        while True:
            stop = min(n, start + window)
            step = np.minimum.accumulate(steps[start:stop])
            grid = np.ceil(np.maximum.accumulate(cutoffs[start:stop]) / step)
            if lattice:
                grid = np.minimum(grid, (np.round(2.0 * math.pi / step) - 1) // 2)
            size = np.arange(1, stop - start + 1)
            fits = size * grid <= 1.25 * np.cumsum(points[start:stop]) + 4 * size
            fits[0] = True
            if fits.all() and stop < n:
                window *= 2
                continue
            end = start + (int(np.argmin(fits)) if not fits.all() else stop - start)
            break
        yield start, end
        start = end


def _newton(amplitude, theta, scale, target, low, high, x):
    """Solve scale (x + sum_k A_k sin(theta_k x)) = target per row (bracketed Newton)."""
    active = np.arange(x.shape[0])
    for _ in range(100):
        if active.shape[0] == 0:
            break
        xa = x[active]
        phase = xa[:, None] * theta[None, :]
        a = amplitude[active]
        value = scale * (xa + np.sum(a * np.sin(phase), axis=1)) - target[active]
        slope = scale * (1.0 + np.sum(a * theta * np.cos(phase), axis=1))
        below = value < 0
        low[active] = np.where(below, xa, low[active])
        high[active] = np.where(below, high[active], xa)
        with np.errstate(divide="ignore", invalid="ignore"):
            nxt = xa - value / slope
        bad = ~((nxt > low[active]) & (nxt < high[active]) & (slope > 0))
        nxt = np.where(bad, 0.5 * (low[active] + high[active]), nxt)
        done = (np.abs(nxt - xa) <= 1e-14 * np.abs(xa) + 1e-300) | (
            high[active] - low[active] <= 1e-14 * high[active])
        x[active] = nxt
        active = active[~done]
    return x


def _solve(amplitude, theta, scale, target, upper, start):
    """`_newton` on every row, started from the solutions of every 32nd row interpolated
    (rows are ordered by their law: neighbours have close quantiles)."""
    n = start.shape[0]
    if n >= 256:
        pick = np.unique(np.append(np.arange(0, n, 32), n - 1))
        coarse = _newton(amplitude[pick], theta, scale, target[pick], np.zeros(pick.shape[0]),
                         upper[pick].copy(), start[pick].copy())
        start = np.clip(np.interp(np.arange(n), pick, coarse), 1e-3 * upper, upper)
    return _newton(amplitude, theta, scale, target, np.zeros(n), upper.copy(), start)


def _cdf(amplitude, theta, scale, x):
    return scale * (x + np.sum(amplitude * np.sin(x[:, None] * theta[None, :]), axis=1))


def _invert(node, rows, ids, kind, alpha=None, x=None):
    """Quantiles (alpha given) or tails (x given) of the rows `ids` by inversion; returns
    (values, rows that fell back to the Chernoff bound)."""
    quantile = alpha is not None
    tol = _tolerance(alpha) if quantile else TOLERANCE
    eps_alias, eps_trunc = _ALIAS_SHARE * tol, _TRUNCATION_SHARE * tol
    squares, largest = rows.squares[ids], rows.largest[ids]
    counts = rows.nonzero[ids] if kind == LATTICE else rows.counts(ids)
    spread = largest if kind == SMOOTHED else 0.0
    aliasing = node.tail_bound(squares, largest, counts, eps_alias) + spread
    if quantile:
        top = node.tail_bound(squares, largest, counts, 0.5 * alpha) + spread
    else:
        top = np.asarray(x, dtype=np.float64) + (0.5 if kind == LATTICE else 0.0)
    if kind == LATTICE:
        period = np.ceil(top + aliasing) + 1.0
        period += (period % 2 == 0)                     # odd M
        steps = 2.0 * math.pi / period
        high = np.full(ids.shape[0], math.pi)
    else:
        steps = 2.0 * math.pi / (top + aliasing)
        if kind == SMOOTHED:
            high = math.pi / largest
        else:  # one factor alone: phi(u) J(u) <= ln(1 + 1/y) / 2 <= 1 / (2 y)
            high = np.full(ids.shape[0], np.inf)
            if isinstance(node, Laplace):
                high = 1.0 / (node.parameter * largest * math.sqrt(math.pi * eps_trunc))
            elif isinstance(node, Gaussian):
                high = math.sqrt(2.0 * math.log(1.0 / eps_trunc)) / (node.parameter * largest)
    cutoffs = _cutoffs(node, rows, ids, kind, eps_trunc, high)
    points = np.ceil(cutoffs / steps)
    if kind == LATTICE:
        points = np.minimum(points, (period - 1) // 2)
    fallback = ~(points <= MAX_POINTS)
    values = np.full(ids.shape[0], np.nan)
    keep = np.nonzero(~fallback)[0]
    revival = _REVIVAL * node.pmf_gap() if kind == SMOOTHED else 0.0
    error = eps_alias + eps_trunc + _ROUNDING_SHARE * tol + revival
    for lo, hi in _blocks(points[keep], steps[keep], cutoffs[keep], kind == LATTICE):
        block = keep[lo:hi]
        if kind == LATTICE:
            m_points = float(np.max(period[block]))
            h = 2.0 * math.pi / m_points
            count = int(min(math.ceil(np.max(cutoffs[block]) / h), (m_points - 1) // 2))
        else:
            h = float(np.min(steps[block]))
            count = int(math.ceil(np.max(cutoffs[block]) / h))
        count = max(count, 1)
        theta = h * np.arange(1, count + 1)
        if kind == LATTICE:
            kernel = 1.0 / np.sin(0.5 * theta)
        else:
            kernel = 2.0 / theta
        for part, log_phi in _log_phi(node, rows, ids[block], theta):
            rows_here = block[part]
            amplitude = np.exp(log_phi) * kernel
            if kind == SMOOTHED:
                v = 0.5 * largest[rows_here, None] * theta[None, :]
                amplitude *= (np.sin(v) / v) ** 2
            scale = h / math.pi
            if not quantile:
                at = top[rows_here]
                values[rows_here] = 1.0 - _cdf(amplitude, theta, scale, at)
                continue
            target = np.full(rows_here.shape[0], 1.0 - alpha + error)
            upper = top[rows_here]
            # Cornish-Fisher start: z + kurtosis (z^3 - 3z) / 24, in standard deviations
            sd = np.sqrt(squares[rows_here]) * node.scale_hint
            kurtosis = node.kurtosis_hint * rows.quartics[ids[rows_here]] / (
                squares[rows_here] ** 2)
            z = gaussian_quantile(alpha)
            start = np.clip((z + kurtosis * (z ** 3 - 3 * z) / 24) * sd, 1e-3 * upper,
                            0.9 * upper)
            root = _solve(amplitude, theta, scale, target, upper, start)
            if kind == LATTICE:
                result, short = _integer_quantile(amplitude, theta, scale, target, root)
            else:
                # a root from below: step up by a relative 1e-12 until F passes the target
                result = root * (1.0 + 1e-12)
                for _ in range(40):
                    short = _cdf(amplitude, theta, scale, result) < target
                    if not short.any():
                        break
                    result = np.where(short, result * (1.0 + 1e-11) + 1e-300, result)
                result = result + (spread[rows_here] if kind == SMOOTHED else 0.0)
            values[rows_here] = result
            fallback[rows_here] |= short  # not converged (never seen): the Chernoff bound
    return values, fallback


def _integer_quantile(amplitude, theta, scale, target, root):
    """(smallest integer c >= 0 with F(c + 1/2) >= target near the continuous root, rows
    where none was found)."""
    c = np.maximum(0.0, np.ceil(root - 0.5))
    for _ in range(64):
        short = _cdf(amplitude, theta, scale, c + 0.5) < target
        if not short.any():
            break
        c = c + short
    for _ in range(64):
        lower = (c > 0) & (_cdf(amplitude, theta, scale, c - 0.5) >= target)
        if not lower.any():
            break
        c = c - lower
    return c, short


def _kind(node: NodeLaw, rows: _Rows) -> int:
    """How sums of two or more nodes are inverted (module docstring)."""
    if not node.lattice:
        return INVERSION
    if rows.unit:
        return LATTICE
    if isinstance(node, DiscreteGaussian):
        return SMOOTHED
    check.fail("coefficients", f"0 or +-1 with {node.kind} nodes", "other weights")


def _quantiles(node: NodeLaw, alpha: float, counts=None, coefficients=None
               ) -> Tuple[np.ndarray, np.ndarray]:
    """(half-widths, how each was found: ZERO, CLOSED_FORM, INVERSION, LATTICE, SMOOTHED or
    CHERNOFF) per step (`step_quantiles`)."""
    if not isinstance(node, NodeLaw):
        check.fail("node", "a NodeLaw", node)
    alpha = check.open_unit_interval("alpha", alpha)
    rows = _Rows(counts, coefficients)
    size = rows.nonzero.shape[0]
    out, how = np.zeros(size), np.full(size, ZERO)
    if node.lattice:
        # a point mass at 0 up to alpha: P(S_t != 0) <= n_t P(X != 0) <= alpha, so c_t = 0 is
        # the smallest half-width that covers (a huge budget: q = exp(-1/t) underflows there)
        point = rows.nonzero * node.nonzero_probability() * (1.0 + 1e-9) <= alpha
    else:
        point = np.zeros(size, dtype=bool)
    many = np.nonzero((rows.nonzero >= 2) & ~point)[0]
    single = np.nonzero((rows.nonzero == 1) & ~point)[0]
    if isinstance(node, Gaussian):
        live = np.nonzero(rows.nonzero > 0)[0]
        out[live] = gaussian_quantile(alpha) * node.parameter * np.sqrt(rows.squares[live])
        how[live] = CLOSED_FORM
        return out[rows.step_row], how[rows.step_row]
    if single.shape[0]:
        if isinstance(node, Laplace):
            unit = node.parameter * math.log(1.0 / alpha)
        elif isinstance(node, DiscreteLaplace):
            unit = node.single_quantile(alpha)
        else:
            unit = float(_invert(node, _Rows([1], None), np.array([0]), LATTICE, alpha)[0][0])
        out[single] = unit * rows.largest[single]
        how[single] = CLOSED_FORM if not isinstance(node, DiscreteGaussian) else LATTICE
    if many.shape[0]:
        kind = _kind(node, rows)
        values, fallback = _invert(node, rows, many, kind, alpha)
        how[many] = kind
        check_rows = np.arange(many.shape[0]) if kind == SMOOTHED else np.nonzero(fallback)[0]
        if check_rows.shape[0]:
            ids = many[check_rows]
            bound = node.tail_bound(rows.squares[ids], rows.largest[ids], rows.counts(ids),
                                    alpha)
            if kind == LATTICE:
                bound = np.ceil(bound)
            # fallbacks, and the subgaussian bound where it is narrower (tiny sigma)
            use = fallback[check_rows] | (bound < values[check_rows])
            values[check_rows] = np.where(use, bound, values[check_rows])
            how[ids] = np.where(use, CHERNOFF, kind)
        out[many] = values
    return out[rows.step_row] + 0.0, how[rows.step_row]  # + 0.0: no -0.0


def step_quantiles(node: NodeLaw, alpha: float, *, counts=None, coefficients=None
                   ) -> np.ndarray:
    """Per step t, the half-width c_t: the smallest c with P(|S_t| > c) <= alpha.

    S_t = sum_j w_tj z_j with i.i.d. nodes z_j of law `node`; give either `counts` (n_t
    weights +-1 per step) or `coefficients` l (row t is l_{t-1}, ..., l_0). Method and error:
    see the module docstring (Gil-Pelaez inversion, error bounds added to the tail: for
    continuous sums alpha - 2e-10 <= P(|S_t| > c_t) <= alpha).

    Args:
        node: the node law (`node_law`).
        alpha: the two-sided tail probability, in (0, 1).
        counts: per step, the number of nodes (weights +-1).
        coefficients: the coefficients whose prefixes are the rows.

    Returns:
        float64 array of c_t, one per step (integers for integer sums).

    >>> round(float(step_quantiles(Laplace(1.0), 0.05, counts=[1])[0]), 6)  # ln 20
    2.995732
    >>> step_quantiles(DiscreteLaplace(2.0), 0.05, counts=[0, 1, 4]).tolist()
    [0.0, 6.0, 11.0]
    """
    return _quantiles(node, alpha, counts, coefficients)[0]


def step_tails(node: NodeLaw, x, *, counts=None, coefficients=None) -> np.ndarray:
    """P(|S_t| > x_t) per step (rows as in `step_quantiles`; x per step or one number), to
    within 1e-10 (the bounds of the module docstring). Integer sums need integer x. For
    discrete Gaussian nodes with non-integer weights this is the tail of the smoothed S'_t
    (module docstring): P(|S_t| > x) lies between its values at x + a and x - a.

    >>> round(float(step_tails(Laplace(1.0), 3.0, counts=[1])[0]), 9)  # e^-3
    0.049787068
    """
    if not isinstance(node, NodeLaw):
        check.fail("node", "a NodeLaw", node)
    rows = _Rows(counts, coefficients)
    steps = rows.step_row.shape[0]
    x = np.broadcast_to(np.asarray(x, dtype=np.float64), (steps,)).copy()
    if not np.all(np.isfinite(x)) or np.any(x < 0):
        check.fail("x", "finite numbers >= 0", x)
    nonzero, largest = rows.nonzero[rows.step_row], rows.largest[rows.step_row]
    out = np.zeros(steps)
    if isinstance(node, Gaussian):
        live = np.nonzero(nonzero > 0)[0]
        sd = node.parameter * np.sqrt(rows.squares[rows.step_row][live])
        out[live] = [math.erfc(v) for v in x[live] / (sd * math.sqrt(2.0))]
        return out
    single = np.nonzero(nonzero == 1)[0]
    if single.shape[0]:
        if isinstance(node, Laplace):
            out[single] = np.exp(-x[single] / (node.parameter * largest[single]))
        else:  # a |w| z with z on the integers: P(|z| > floor(x / a))
            c = np.floor(x[single] / largest[single] * (1.0 + 1e-15))
            if isinstance(node, DiscreteLaplace):
                out[single] = 2.0 * node.q ** (c + 1.0) / (1.0 + node.q)
            else:
                one = _Rows(np.ones(single.shape[0], dtype=np.int64), None)
                out[single] = _invert(node, one, np.zeros(single.shape[0], dtype=np.int64),
                                      LATTICE, x=c)[0]
    many = np.nonzero(nonzero >= 2)[0]
    if many.shape[0]:
        kind = _kind(node, rows)
        if kind == LATTICE and not np.all(x[many] == np.round(x[many])):
            check.fail("x", "integers for integer sums", x)
        ids = rows.step_row[many]
        order = np.argsort(ids, kind="stable")
        values, fallback = _invert(node, rows, ids[order], kind, x=x[many][order])
        if fallback.any():
            check.fail("x", f"within reach of the inversion ({MAX_POINTS} points)", x)
        out[many[order]] = values
    return out
