"""Discrete Laplace and discrete Gaussian noise on the integers (Canonne, Kamath, Steinke 2020,
"The Discrete Gaussian for Differential Privacy"), sampled from keyed random words.

Why discrete: a float64 Laplace or Gaussian added to an exact total leaks the total through the
low bits of the result (Mironov 2012). With integer node noise on an integer-valued R x the whole
release is a vector of integers, and the guarantee holds in exact arithmetic:
- discrete Laplace with scale t, P(x) ~ exp(-|x| / t): epsilon-DP for l1 sensitivity Delta_1
  when t >= Delta_1 / epsilon (CKS20 Sec. 2.2; the density ratio is exp(|a - b|_1 / t));
- discrete Gaussian with variance parameter sigma^2, P(x) ~ exp(-x^2 / (2 sigma^2)):
  Delta_2^2 / (2 sigma^2)-zCDP for integer queries with l2 sensitivity Delta_2 (CKS20 Thm. 14,
  independent coordinates).

How one value is drawn (vectorised, deterministic per node):
1. A uniform u on the 127-bit grid {0, ..., 2^127 - 1}: its top 64 bits are one keyed word, its
   low 63 bits are read (from the value's own keyed stream) only when the top word alone cannot
   decide, i.e. equals a threshold's top word; one more keyed bit is the sign.
2. |X| = number of table thresholds C_m <= u, with C_m = floor(2^127 F(m)) and F the exact CDF
   of |X| computed in 200-bit fixed point (parameters are exact rationals: the float given).
   The table covers magnitudes 0 .. M-1, where M is the first magnitude with tail mass
   1 - F(M-1) <= 2^-40 (or the table cap).
3. If u >= C_{M-1} (probability about 2^-40), |X| is drawn *exactly* from its conditional tail
   with integer-only rejection sampling on the node's own keyed bit stream (CKS20 Alg. 1 for
   Bernoulli(exp(-gamma)); a geometric proposal on the tangent for the Gaussian).
Every magnitude's probability is off by less than 2^-127 (rounding of C_m), so the sampled law is
within total variation (M + 1) 2^-124 <= 2^-103 of the exact one (thresholds are exact up to a
few units of 2^-127; M <= 2^20). A release drawing N node values is within N 2^-103 of the exact
mechanism (N <= 2^40 gives 2^-63): it is (epsilon, delta)-DP / delta-approximate rho-zCDP with
delta = N 2^-103 (1 + e^epsilon), stated in docs/privacy.md. The support is all of Z (nothing is cut, unlike float64 samplers).
"""
from __future__ import annotations

import decimal
import functools
import math
from fractions import Fraction
from typing import Callable

import numpy as np

from transforms import validation as check

DISCRETE_LAPLACE = "discrete_laplace"
DISCRETE_GAUSSIAN = "discrete_gaussian"
KINDS = (DISCRETE_LAPLACE, DISCRETE_GAUSSIAN)

_PRECISION = 200            # bits of the fixed-point table arithmetic
_UNIFORM_BITS = 127         # u is uniform on [0, 2^127)
TABLE_TAIL_BITS = 40        # the table covers all but <= 2^-40 of the mass
MAX_TABLE = 1 << 20         # entries (16 bytes each: 16 MiB at most); beyond it the tail is
                            # sampled exactly (a Gaussian leaving > 1e-6 there is refused)
_LOW_MASK = (1 << 63) - 1
# The largest parameter a sampler is built for, per kind: a discrete Laplace scale t beyond
# 1e12 is useless noise (its table is capped, the tail sampled exactly); a discrete Gaussian
# sigma^2 beyond 4e10 (sigma 2e5) would leave more than 1e-6 of its mass beyond the capped
# table of MAX_TABLE entries (4e10 leaves 1.6e-7; 4.6e10 is refused by the table itself).
# Mechanisms check this when they are built (`ContinualMechanism.check_noise`), not at the
# first draw on a worker.
MAX_PARAMETER = {DISCRETE_LAPLACE: 1e12, DISCRETE_GAUSSIAN: 4e10}


class NoiseTooLarge(check.ValidationError):
    """A discrete node noise whose parameter exceeds MAX_PARAMETER[kind]: the sampler cannot be
    built. Carries the kind, the parameter checked and the limit, so that a transform can
    restate the refusal in terms of the budget its user gave."""

    def __init__(self, message: str, kind: str, parameter: float, limit: float):
        super().__init__(message)
        self.kind, self.parameter, self.limit = kind, parameter, limit


def _fixed_exp_neg(value: Fraction) -> int:
    """floor(exp(-value) 2^PRECISION) for a rational value >= 0 (Decimal at 90 digits)."""
    with decimal.localcontext() as ctx:
        ctx.prec = 90
        number = decimal.Decimal(value.numerator) / decimal.Decimal(value.denominator)
        scaled = (-number).exp() * (decimal.Decimal(2) ** _PRECISION)
        return int(scaled.to_integral_value(rounding=decimal.ROUND_FLOOR))


class BitStream:
    """Uniform integers from a keyed byte stream (`read(n)` returns the first n bytes)."""

    def __init__(self, read: Callable[[int], bytes]):
        self._read = read
        self._buffer = b""
        self._used = 0

    def _take(self, count: int) -> bytes:
        if self._used + count > len(self._buffer):
            self._buffer = self._read(max(2 * len(self._buffer), self._used + count, 64))
        out = self._buffer[self._used:self._used + count]
        self._used += count
        return out

    def word(self, bits: int) -> int:
        """Uniform on {0, ..., 2^bits - 1}."""
        width = (bits + 7) // 8
        return int.from_bytes(self._take(width), "little") & ((1 << bits) - 1)

    def below(self, n: int) -> int:
        """Uniform on {0, ..., n - 1} (rejection, exact)."""
        if n == 1:
            return 0
        bits = (n - 1).bit_length()
        width = (bits + 7) // 8
        while True:
            value = int.from_bytes(self._take(width), "little") & ((1 << bits) - 1)
            if value < n:
                return value


def bernoulli(bits: BitStream, p: Fraction) -> bool:
    return bits.below(p.denominator) < p.numerator


def bernoulli_exp(bits: BitStream, gamma: Fraction) -> bool:
    """Exactly Bernoulli(exp(-gamma)) for rational gamma >= 0 (CKS20 Algorithm 1)."""
    while gamma > 1:
        if not bernoulli_exp(bits, Fraction(1)):
            return False
        gamma -= 1
    k = 1
    while bernoulli(bits, gamma / k):
        k += 1
    return k % 2 == 1


def geometric(bits: BitStream, rate: Fraction) -> int:
    """Exactly P(g) ~ exp(-rate g), g >= 0, for rational rate = n / d > 0 (CKS20 Alg. 2's
    inner loop: X ~ Geometric(exp(-1/d)) by U + d V, then floor(X / n))."""
    n, d = rate.numerator, rate.denominator
    while True:
        u = bits.below(d)
        if bernoulli_exp(bits, Fraction(u, d)):
            break
    v = 0
    while bernoulli_exp(bits, Fraction(1)):
        v += 1
    return (u + d * v) // n


class DiscreteSampler:
    """One discrete distribution (kind, exact rational parameter) with its sampling table.

    `parameter` is the Laplace scale t or the Gaussian variance parameter sigma^2 (a float; its
    exact binary value is used)."""

    def __init__(self, kind: str, parameter: float):
        check.one_of("noise kind", kind, KINDS)
        parameter = check.positive_finite("noise parameter", parameter)
        limit = MAX_PARAMETER[kind]
        if parameter > limit:
            raise NoiseTooLarge(check.message(
                "noise parameter", f"<= {limit:g} for {kind} noise (larger noise is useless "
                                   f"and its sampling table would not fit)", parameter),
                kind, parameter, limit)
        self.kind = kind
        self.parameter = parameter
        self.exact = Fraction(parameter)
        self.tag = f"{kind}:{parameter.hex()}".encode("ascii")
        self._table = None

    @property
    def variance(self) -> float:
        """Exact variance: 2q / (1 - q)^2 (discrete Laplace, q = exp(-1/t)); the pmf's second
        moment for the discrete Gaussian (< sigma^2). Needs no sampling table."""
        if self.kind == DISCRETE_LAPLACE:
            q = math.exp(-1.0 / self.parameter)
            return 2.0 * q / (1.0 - q) ** 2
        pmf = self.pmf(1e-30)
        x = np.arange(pmf.shape[0]) - (pmf.shape[0] - 1) // 2
        return float(np.sum(pmf * x.astype(np.float64) ** 2))

    def _built(self):
        if self._table is None:  # built on first draw: planning needs only the variance
            self._table = self._weights()
        return self._table

    @property
    def size(self) -> int:
        return self._built()[0]

    @size.setter
    def size(self, value: int) -> None:  # tests: condition the tail sampler elsewhere
        self._table = (value,) + tuple(self._built()[1:])

    @property
    def _high(self):
        return self._built()[1]

    @property
    def _low(self):
        return self._built()[2]

    @property
    def _tail_mass(self):
        return self._built()[4]

    def _guide(self):
        """Per b-bit prefix of a word (b = 16, or 2 more bits than the table size needs):
        thresholds whose top word is below the prefix's bucket, and whether several fall inside
        it (a guide table: one gather instead of a binary search). The counts are int32 (the
        table has at most MAX_TABLE entries): half the memory that random reads go through."""
        if len(self._built()) == 5:
            high = self._high
            bits = min(22, max(16, high.shape[0].bit_length() + 2))
            starts = np.arange(1 << bits, dtype=np.uint64) << np.uint64(64 - bits)
            below = np.searchsorted(high, starts, side="left").astype(np.int32)
            inside = np.diff(np.append(below, high.shape[0]))
            padded = np.append(high, np.uint64(2 ** 64 - 1))
            self._table = self._table + (below, inside > 1, padded, bits)
        return self._table[5:9]

    def _count_below(self, hi: np.ndarray):
        """(number of thresholds whose top word is < hi, as a left binary search gives it,
        int64; whether the threshold at that count has top word hi). Outside crowded buckets
        the bucket holds at most the threshold at `first`, so the one after it is beyond hi:
        a tie can only be with the threshold at `first`."""
        below, dense, padded, bits = self._guide()
        prefix = (hi >> np.uint64(64 - bits)).view(np.int64)  # < 2^bits: the same values
        first = below[prefix]
        at_first = padded[first]
        count = np.add(first, at_first < hi, dtype=np.int64)
        tie = at_first == hi
        crowded = np.nonzero(dense[prefix])[0]  # buckets holding several thresholds (tail)
        if crowded.shape[0]:
            counts = np.searchsorted(self._high, hi[crowded], side="left")
            count[crowded] = counts
            tie[crowded] = padded[counts] == hi[crowded]
        return count, tie

    # ----- table -------------------------------------------------------------------------------
    def _weight_sequence(self):
        """Unnormalised weights w(0), w(1), ... in fixed point (w(0) = 2^PRECISION)."""
        one = 1 << _PRECISION
        if self.kind == DISCRETE_LAPLACE:
            q = _fixed_exp_neg(1 / self.exact)
            w = one
            while w:
                yield w
                w = (w * q) >> _PRECISION
        else:
            ratio = _fixed_exp_neg(1 / (2 * self.exact))         # w(1) / w(0)
            step = _fixed_exp_neg(1 / self.exact)                # ratio of successive ratios
            w, factor = one, ratio
            while w:
                yield w
                w = (w * factor) >> _PRECISION
                factor = (factor * step) >> _PRECISION

    def _weights(self):
        """(table size M, thresholds' high words, low 63-bit words, exact variance, tail mass).

        C_m = 2^127 F(m) up to a few units (fixed-point rounding), |X| <= m with probability F."""
        one = 1 << _PRECISION
        thresholds = []
        if self.kind == DISCRETE_LAPLACE:
            # F(m) = 1 - 2 q^(m+1) / (1 + q); one multiplication per entry.
            q = _fixed_exp_neg(1 / self.exact)
            reciprocal = (1 << (2 * _PRECISION)) // (one + q)     # 2^P / (1 + q), fixed point
            scale = 2 * _PRECISION - _UNIFORM_BITS - 1
            power = q
            while len(thresholds) < MAX_TABLE:
                tail = (power * reciprocal) >> scale                # 2^127 * 2 q^(m+1) / (1+q)
                thresholds.append((1 << _UNIFORM_BITS) - tail - 1)
                if tail <= 1 << (_UNIFORM_BITS - TABLE_TAIL_BITS):
                    break
                power = (power * q) >> _PRECISION
            qf = math.exp(-1.0 / self.parameter)
            variance = 2.0 * qf / (1.0 - qf) ** 2
            tail_mass = tail / 2.0 ** _UNIFORM_BITS
        else:
            magnitudes, second = [], 0
            for m, w in enumerate(self._weight_sequence()):
                mass = w if m == 0 else 2 * w
                magnitudes.append(mass)
                second += mass * m * m
            total = sum(magnitudes)
            variance = second / total
            cutoff = total >> TABLE_TAIL_BITS
            cumulative = 0
            for mass in magnitudes:
                cumulative += mass
                # below 2^127 (u's range): a table holding all the fixed-point mass (a tiny
                # sigma, whose w(1) rounds to 0) would end at 2^127 exactly; its last
                # threshold is 2^127 - 1 (the exact tail sampler then takes u = 2^127 - 1,
                # probability 2^-127, within the rounding stated above)
                thresholds.append(min((cumulative << _UNIFORM_BITS) // total,
                                      (1 << _UNIFORM_BITS) - 1))
                if total - cumulative <= cutoff:
                    break
                if len(thresholds) >= MAX_TABLE:
                    break  # beyond the cap the exact tail sampler takes over
            if (total - cumulative) / total > 1e-6:
                check.fail("noise parameter", "a Gaussian variance whose sampling table of "
                                              f"{MAX_TABLE} entries leaves < 1e-6 to the exact "
                                              "tail sampler", self.parameter)
            tail_mass = (total - cumulative) / total
        high = np.array([c >> 63 for c in thresholds], dtype=np.uint64)
        low = np.array([c & _LOW_MASK for c in thresholds], dtype=np.uint64)
        return len(thresholds), high, low, float(variance), float(tail_mass)

    # ----- sampling ----------------------------------------------------------------------------
    def sample(self, top: np.ndarray, negative: np.ndarray,
               node_bits: Callable[[int], BitStream]) -> np.ndarray:
        """Values from the top 64-bit words of u (uint64, shape (n,)) and sign flags (bool);
        `node_bits(i)` is value i's own keyed bit stream, read only in the rare cases: u's low
        63 bits when its top word equals a threshold's (probability about M 2^-64 per value),
        then the exact tail (probability about 2^-40)."""
        magnitude, tie = self._count_below(top)
        size = self.size
        streams = {}
        for i in np.nonzero(tie)[0]:
            bits = streams[i] = node_bits(int(i))
            j, low = int(magnitude[i]), bits.word(63)
            while j < size and int(self._high[j]) == int(top[i]) and int(self._low[j]) <= low:
                j += 1
            magnitude[i] = j
        for i in np.nonzero(magnitude >= size)[0]:
            bits = streams.get(i) or node_bits(int(i))
            magnitude[i] = self.tail_magnitude(bits)
        return _negated(magnitude, negative)

    def tail_magnitude(self, bits: BitStream) -> int:
        """Exactly |X| conditioned on |X| >= M (M = table size >= 1)."""
        start = self.size
        if self.kind == DISCRETE_LAPLACE:  # memoryless: M + Geometric(exp(-1/t))
            return start + geometric(bits, 1 / self.exact)
        # Proposal M + G, G ~ Geometric(exp(-M / sigma^2)) (the tangent of m^2 / (2 sigma^2)
        # at M bounds it from below); accept with exp(-G^2 / (2 sigma^2)) <= 1.
        rate = Fraction(start) / self.exact
        while True:
            g = geometric(bits, rate)
            if bernoulli_exp(bits, Fraction(g * g) / (2 * self.exact)):
                return start + g

    # ----- exact law (for intervals and tests) -------------------------------------------------
    def pmf(self, cut: float = 1e-18) -> np.ndarray:
        """P(X = x) for x = -K .. K as float64, where K leaves less than `cut` outside."""
        t = self.parameter
        if self.kind == DISCRETE_LAPLACE:
            q = math.exp(-1.0 / t)
            k = max(1, int(math.ceil(t * math.log(2.0 / (cut * (1 - q))))) + 1)
            x = np.arange(-k, k + 1)
            return (1 - q) / (1 + q) * q ** np.abs(x)
        k = max(1, int(math.ceil(math.sqrt(2.0 * t * math.log(4.0 / cut)))) + 1)
        x = np.arange(-k, k + 1)
        w = np.exp(-(x.astype(np.float64) ** 2) / (2.0 * t))
        return w / w.sum()

    def log_mgf(self, lam: np.ndarray) -> np.ndarray:
        """An upper bound on log E[exp(lam X)] (exact for the discrete Laplace, |lam| < 1/t;
        sigma^2 lam^2 / 2 for the discrete Gaussian, CKS20 Cor. 9: it is sigma-subgaussian)."""
        lam = np.asarray(lam, dtype=np.float64)
        if self.kind == DISCRETE_LAPLACE:
            q = math.exp(-1.0 / self.parameter)
            return (2.0 * math.log1p(-q) - np.log1p(-q * np.exp(lam))
                    - np.log1p(-q * np.exp(-lam)))
        return 0.5 * self.parameter * lam * lam


@functools.lru_cache(maxsize=64)
def sampler(kind: str, parameter: float) -> DiscreteSampler:
    """Shared samplers (tables are built once per process and parameter)."""
    return DiscreteSampler(kind, parameter)


@functools.lru_cache(maxsize=256)
def equal_weight_quantile(kind: str, parameter: float, terms: int, alpha: float) -> float:
    """Smallest integer c with P(|X_1 + ... + X_n| > c) <= alpha for i.i.d. X_i of the law.

    Exact n-fold convolution of the pmf (FFT), conservative against the truncated mass and the
    FFT's rounding (both added to the tail before comparing)."""
    base = sampler(kind, parameter).pmf()
    width = (base.shape[0] - 1) // 2
    size = 1 << (terms * 2 * width + 1).bit_length()
    spectrum = np.fft.rfft(base, size) ** terms
    law = np.fft.irfft(spectrum, size)[:terms * 2 * width + 1]
    law = np.clip(law, 0.0, None)
    center = terms * width
    slack = terms * 1e-18 + 1e-12
    # P(|S| > c) = 1 - sum_{|x| <= c} law
    inside = np.cumsum(law[center:]) + np.concatenate(([0.0], np.cumsum(law[center - 1::-1])))
    outside = 1.0 - inside + slack
    ok = np.nonzero(outside <= alpha)[0]
    if ok.shape[0] == 0:
        return float(center)
    return float(ok[0])


def _negated(values: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """int64 `values` with those at `negative` negated, in place: (v ^ s) - s with s = -1 there
    and 0 elsewhere (two's complement), what np.negative(where=) gives, several times faster.

    >>> _negated(np.array([3, 0, 5]), np.array([True, True, False])).tolist()
    [-3, 0, 5]
    """
    sign = negative.view(np.int8).astype(np.int64)
    np.negative(sign, out=sign)
    np.bitwise_xor(values, sign, out=values)
    return np.subtract(values, sign, out=values)
