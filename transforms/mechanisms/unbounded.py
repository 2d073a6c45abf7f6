"""Continual counting with no horizon: a factorization whose first t outputs, and their
calibration, do not depend on how many steps will follow.

`log_sqrt_toeplitz`: R = T(r), L = A R^-1, both lower-triangular Toeplitz, with

    r_j = f_j w_j,   f_j = binom(2j, j) / 4^j,   w_j = (1 + ln(1 + j / s) / c)^(-g),  g > 1/2,

a logarithmic perturbation of the square root factorization's coefficients f (the generating
function 1 / sqrt(1 - z)), in the spirit of Jacobsen and Fawaz, "Private Continual Counting of
Unbounded Streams" (NeurIPS 2025), who perturb the generating function itself. Perturbing the
coefficients keeps every bound in closed form:
- r is positive and non-increasing (f and w are), so the sensitivity on S_{D,k} is
  sqrt(k D) times the largest column norm (`sensitivity.toeplitz_set_sensitivity`'s monotone
  case, Andersson et al. 2026 Thm 8.4);
- the largest column norm over any horizon is sqrt(sum_{j >= 0} r_j^2), finite because
  f_j^2 <= 1 / (pi j) and w decays like (ln j)^(-g) with 2g > 1: for N - 1 > s,
  sum_{j >= N} r_j^2 <= integral_{N-1}^inf (1 / (pi x)) (1 + ln(x / s) / c)^(-2g) dx
                     = c (1 + ln((N - 1) / s) / c)^(1 - 2g) / (pi (2g - 1));
  the calibration uses the exact prefix below N = 2^22 plus this bound, whatever the horizon;
- r is log-convex (f is; ln w_j is a convex function of j), so by Kaluza's theorem the
  coefficients of 1 / R(z) beyond the first are non-positive and L's are positive.
Hence the noise a step's output carries, its variance and its interval are those of every
longer release: `horizon` is only how many steps this object computes. The outputs are the same
bits for every horizon up to 2^15 steps (L read at one canonical length, per-step dot products);
beyond, a batch goes through FFTs whose rounding depends on the length: the same node noise and
(discrete) the same integer vector y, post-processed to within about 1e-10. The variance at step t grows like (ln t)^(2g + 1), against (ln T)^2 for
the square root factorization calibrated for a known horizon T.

zCDP only: R's l1 column norm (sum r_j) diverges, so there is no pure-DP calibration. Discrete
noise releases g L~ y with y = R~ x / g + z exactly, g = 2^-b (b <= 12, `fixed_bits`) and
R~ = round(r / g) g (still non-negative and non-increasing; R~ x / g is an integer, so there is
no rounding term, which would grow with the horizon).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from transforms import validation as check
from .discrete import DISCRETE_GAUSSIAN, MAX_PARAMETER, MAX_TABLE
from .privacy import GAUSSIAN
from .toeplitz import DIRECT_LIMIT, SqrtToeplitz, series_inverse, sqrt_coefficients

PREFIX = 1 << 22  # coefficients summed exactly for the column norm; beyond, the tail bound


def log_weights(count: int, c: float, s: float, g: float) -> np.ndarray:
    """w_0..w_{count-1}: (1 + ln(1 + j / s) / c)^(-g)."""
    j = np.arange(count, dtype=np.float64)
    return (1.0 + np.log1p(j / s) / c) ** (-g)


def log_sqrt_coefficients(count: int, c: float, s: float, g: float) -> np.ndarray:
    """r_0..r_{count-1} = f_j w_j (the module docstring).

    >>> [round(float(v), 4) for v in log_sqrt_coefficients(4, 4.0, 64.0, 0.9)]
    [1.0, 0.4983, 0.3724, 0.3093]
    """
    return sqrt_coefficients(count) * log_weights(count, c, s, g)


def tail_bound(start: int, c: float, s: float, g: float) -> float:
    """An upper bound on sum_{j >= start} r_j^2 (and on the same sum of any r' <= r), for
    start - 1 > s (the module docstring's integral)."""
    if not start - 1 > s:
        raise ValueError(f"tail_bound needs start - 1 > s; got start {start}, s {s}")
    return c * (1.0 + math.log((start - 1) / s) / c) ** (1.0 - 2.0 * g) / (
        math.pi * (2.0 * g - 1.0))


@functools.lru_cache(maxsize=32)
def squared_norm_bound(c: float, s: float, g: float, bits: int = 0) -> float:
    """An upper bound on sum_{j >= 0} r_j^2 (`bits` b > 0: of R~'s coefficients
    round(2^b r_j) / 2^b: exactly their sum when they are all 0 from PREFIX on, i.e. when
    2^b r_PREFIX <= 1/2; else 4 times r's tail bounds theirs, as they are <= 2 r_j wherever
    they are not 0)."""
    r = log_sqrt_coefficients(PREFIX + 1, c, s, g)
    if not bits:
        return float(np.sum(r[:PREFIX] ** 2)) + tail_bound(PREFIX, c, s, g)
    head = np.rint(r[:PREFIX] * (1 << bits)) / float(1 << bits)
    if r[PREFIX] * (1 << bits) <= 0.5:  # r is non-increasing: R~ is 0 from PREFIX on
        return float(np.sum(head ** 2))
    return float(np.sum(head ** 2)) + 4.0 * tail_bound(PREFIX, c, s, g)


def canonical_length(horizon: int) -> int:
    """The length the left factor is computed at: 2^20 (the discrete release's limit), or the
    next power of two beyond it (float noise), so that every horizon up to 2^20 reads the very
    same coefficients."""
    return max(1 << 20, 1 << (horizon - 1).bit_length())


@functools.lru_cache(maxsize=8)
def left_of(c: float, s: float, g: float, bits: int, length: int) -> np.ndarray:
    """L's coefficients, the prefix sums of 1 / R(z) (R~ with `bits` > 0), at `length`."""
    r = log_sqrt_coefficients(length, c, s, g)
    if bits:
        r = np.rint(r * (1 << bits)) / float(1 << bits)
    left = np.cumsum(series_inverse(r))
    left.setflags(write=False)
    return left


class LogSqrtToeplitz(SqrtToeplitz):
    """The horizon-free factorization of the module docstring (zCDP; discrete or float noise).

    >>> from transforms.mechanisms import make
    >>> short = make("log_sqrt_toeplitz", 50, rho=0.5, seed=1)
    >>> long = make("log_sqrt_toeplitz", 5000, rho=0.5, seed=1)
    >>> x = [1.0] * 50
    >>> bool(np.array_equal(short.release(x), long.release(x)))   # the same 50 outputs
    True
    >>> bool(short.noise_variance()[-1] == long.noise_variance()[49])
    True
    """

    name = "log_sqrt_toeplitz"
    accepts = ("c", "s", "g")
    auto_rank = 90
    pure_dp = False
    horizon_free = True
    MAX_BITS = 12  # R~'s coefficients stay positive up to t ~ 2e6 (past 2^20 steps) at 12
    # the first 2^15 steps always by dot products: their bits are the same however far a
    # batch reaches (beyond, an FFT over the batch's length rounds otherwise, by ~1e-10)
    DIRECT_STEPS = DIRECT_LIMIT

    @classmethod
    def candidates(cls, horizon, noise, pure_dp):
        return []  # for releases with no horizon; a known horizon has better factorizations

    @classmethod
    def default_params(cls, noise_law):
        # on a grid of (c, s, g) (`benchmarks/bench_unbounded.py --grid`): of those whose
        # variance stays within 1.5 times the square root's for the whole reach (T = 2^20) at
        # every t = 2^k <= 2^20, the smallest largest ratio to the square root for T = t
        # known in advance over t = 2^4 .. 2^20
        return {"c": 4.0, "s": 16384.0, "g": 1.7}

    def __init__(self, horizon, budget, noise_source, c: float = 4.0, s: float = 16384.0,
                 g: float = 1.7, **kwargs):
        if budget.noise != GAUSSIAN:
            check.fail("privacy", "rho, or epsilon and delta, for log_sqrt_toeplitz (its l1 "
                                  "column norm diverges: no pure-DP calibration)",
                       "epsilon alone")
        self.c = check.positive_finite("c", c)
        self.s = check.positive_finite("s", s)
        self.g = check.positive_finite("g", g)
        if not self.g > 0.5:
            check.fail("g", "> 1/2 (the column norm converges only then)", g)
        if not PREFIX - 1 > self.s:
            check.fail("s", f"< {PREFIX - 1}", s)
        super().__init__(horizon, budget, noise_source, **kwargs)

    @property
    def fixed_bits(self) -> int:
        """b: R~ = round(2^b r) / 2^b, and y's noise is 2^b times R~'s sensitivity: the
        largest b <= MAX_BITS whose noise fits the discrete sampler's table (b depends on the
        budget and bounds, never on the horizon; a small b zeroes R~ early, so the variance
        grows faster after that step, all of it in `noise_variance`)."""
        if "fixed_bits" not in self._cache:
            k, d = self.max_contributions, min(self.interval_bound, self.max_contributions)
            factor = 1.0 if k == 1 else min(k, math.sqrt(k * d))
            bits = self.MAX_BITS
            while bits > 1:
                column = math.sqrt(squared_norm_bound(self.c, self.s, self.g, bits))
                sigma = factor * column * 2.0 ** bits / math.sqrt(2.0 * self.budget.rho)
                # the table's reach and the sampler's own limit (with the sampler's margin)
                if sigma * 4.9 <= MAX_TABLE and sigma ** 2 * (1.0 + 2.0 ** -30) <= \
                        MAX_PARAMETER[DISCRETE_GAUSSIAN]:
                    break
                bits -= 1
            self._cache["fixed_bits"] = bits
        return self._cache["fixed_bits"]

    def params(self) -> dict:
        return {"c": self.c, "s": self.s, "g": self.g}

    def _f(self):
        if "f" not in self._cache:
            self._cache["f"] = log_sqrt_coefficients(self.horizon, self.c, self.s, self.g)
        return self._cache["f"]

    def left_coefficients(self):
        """L (or L~ = A R~^-1) from a canonical length (`left_of`), so that every horizon up
        to it has the very same bits (a longer release continues a shorter one exactly)."""
        if "left" not in self._cache:
            self._cache["left"] = left_of(self.c, self.s, self.g,
                                          self.fixed_bits if self.discrete else 0,
                                          canonical_length(self.horizon))[:self.horizon]
        return self._cache["left"]

    def _noise_vector(self):
        """Float noise: (L z)_t = sum_{j <= t} l_{t-j} z_j, each a dot product over its own
        terms for the first DIRECT_LIMIT steps (bits independent of the horizon), by FFT
        beyond."""
        direct = min(self.horizon, DIRECT_LIMIT)
        vector = super()._noise_vector() if self.horizon > DIRECT_LIMIT else np.empty(direct)
        vector[:direct] = self._direct_noise(0, direct)
        return vector

    def _direct_noise(self, start: int, stop: int) -> np.ndarray:
        z = self._unit_z(0, stop)
        left = self._reversed_left()
        return np.array([np.dot(left[self.horizon - 1 - t:], z[:t + 1])
                         for t in range(start, stop)])

    def _unit_noise(self, start, count):
        """One step (a streaming release's) by its dot product, O(t), rather than the key's
        whole noise vector over the horizon computed (the same bits below DIRECT_LIMIT)."""
        if count == 1 and self.horizon > DIRECT_LIMIT:
            return self._direct_noise(start, start + 1)
        return super()._unit_noise(start, count)

    def column_norm(self, p):
        if p != 2:
            return math.inf  # sum r_j diverges
        return math.sqrt(squared_norm_bound(self.c, self.s, self.g,
                                            self.fixed_bits if self.discrete else 0))

    def set_sensitivity(self, p, k, d):
        column = self.column_norm(p)
        return min(k * column, math.sqrt(k * d) * column) if p == 2 else k * column

    # discrete noise: y = 2^16 R~ x + z, exact (no rounding term)
    def _rounding_term(self) -> float:
        return 0.0

    @property
    def grid_bits(self) -> int:
        return self.fixed_bits

    def rounding_bound(self, increments: bool = False):
        return np.zeros(self.horizon)
