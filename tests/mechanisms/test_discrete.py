"""Discrete Laplace / discrete Gaussian samplers: the table against the exact law, the sampled
distribution (chi-square), the exact tail sampler far beyond the table, and keyed determinism.

Statistical checks use fixed keys; each states its false-failure rate."""
from __future__ import annotations

import bisect
import decimal
import hashlib
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from tests.support.contract import integer_law_pvalue
from transforms.mechanisms import discrete
from transforms.mechanisms.discrete import (DISCRETE_GAUSSIAN, DISCRETE_LAPLACE, BitStream,
                                            DiscreteSampler, bernoulli_exp, geometric)
from transforms.mechanisms.noise import KeyedNoiseSource

CASES = [(DISCRETE_LAPLACE, 0.7), (DISCRETE_LAPLACE, 3.0), (DISCRETE_LAPLACE, 41.5),
         (DISCRETE_GAUSSIAN, 0.3), (DISCRETE_GAUSSIAN, 4.0), (DISCRETE_GAUSSIAN, 250.0)]


def keyed_bits(label: str) -> BitStream:
    return BitStream(hashlib.shake_256(label.encode()).digest)


def exact_magnitude_law(kind, parameter, count):
    """P(|X| = m), m < count, independently in Decimal at 60 digits (no shared code)."""
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        p = decimal.Decimal(Fraction(parameter).numerator) / Fraction(parameter).denominator
        if kind == DISCRETE_LAPLACE:
            weight = lambda m: (-decimal.Decimal(m) / p).exp()  # noqa: E731
        else:
            weight = lambda m: (-decimal.Decimal(m * m) / (2 * p)).exp()  # noqa: E731
        terms, m = [], 0
        while True:
            w = weight(m)
            terms.append(w)
            if w < decimal.Decimal(10) ** -58:
                break
            m += 1
        total = terms[0] + 2 * sum(terms[1:])
        law = [terms[0] / total] + [2 * t / total for t in terms[1:]]
        return [float(v) for v in law[:count]], law


@pytest.mark.parametrize("kind,parameter", CASES)
def test_table_probabilities_equal_the_exact_law_to_2_pow_minus_120(kind, parameter):
    sampler = DiscreteSampler(kind, parameter)
    thresholds = [(int(h) << 63) | int(lo) for h, lo in zip(sampler._high, sampler._low)]
    _, law = exact_magnitude_law(kind, parameter, sampler.size)
    previous = 0
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        for m, threshold in enumerate(thresholds):
            realised = decimal.Decimal(threshold - previous) / (decimal.Decimal(2) ** 127)
            assert abs(realised - law[m]) < decimal.Decimal(2) ** -120, m
            previous = threshold
        tail = 1 - decimal.Decimal(previous) / (decimal.Decimal(2) ** 127)
        assert abs(tail - sum(law[sampler.size:])) < decimal.Decimal(2) ** -120
        assert tail <= decimal.Decimal(2) ** -39  # the table covers all but ~2^-40


@pytest.mark.parametrize("kind,parameter", CASES)
def test_keyed_samples_follow_the_exact_law(kind, parameter):
    """Chi-square of 200,000 keyed samples against the exact pmf (bins with expected >= 5,
    the rest pooled); false-failure rate 1e-4 per case. Mean and variance z-tests too."""
    sampler = discrete.sampler(kind, parameter)
    values = KeyedNoiseSource(b"chi-square").discrete_noise(sampler, "s", 0, 0, 200_000)
    assert np.array_equal(values, np.round(values))
    pmf = sampler.pmf(1e-15)
    assert integer_law_pvalue(values, pmf) > 1e-4
    n = values.shape[0]
    assert abs(values.mean()) / math.sqrt(sampler.variance / n) < 4.42
    center = (pmf.shape[0] - 1) // 2
    fourth = float(np.sum(pmf * (np.arange(pmf.shape[0]) - center) ** 4))
    sd_of_var = math.sqrt((fourth - sampler.variance ** 2) / n)
    assert abs(np.mean(values ** 2) - sampler.variance) / sd_of_var < 4.42


@pytest.mark.parametrize("kind,parameter", [(DISCRETE_LAPLACE, 2.0), (DISCRETE_GAUSSIAN, 4.0)])
def test_exact_tail_sampler_is_the_conditional_law_at_10_sigma(kind, parameter):
    """Beyond the table, |X| comes from an exact rejection sampler. Forced to start at 10
    standard deviations, its draws follow P(|X| = m | |X| >= start) (chi-square, 1e-4)."""
    sampler = DiscreteSampler(kind, parameter)
    sd = math.sqrt(sampler.variance)
    start = int(math.ceil(10 * sd))
    sampler.size = start  # the tail sampler conditions on |X| >= size
    draws = np.array([sampler.tail_magnitude(keyed_bits(f"tail-{i}")) for i in range(3000)])
    assert draws.min() >= start
    m = np.arange(start, start + 400)
    if kind == DISCRETE_LAPLACE:
        weights = np.exp(-(m - start) / parameter)
    else:
        weights = np.exp(-(m ** 2 - start ** 2) / (2.0 * parameter))
    law = weights / weights.sum()
    observed = np.bincount(draws - start, minlength=400)[:400]
    expected = law * draws.shape[0]
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-4


def test_words_beyond_the_table_are_sent_to_the_exact_tail():
    sampler = DiscreteSampler(DISCRETE_GAUSSIAN, 1.0)
    top = np.array([2 ** 64 - 1, 0], dtype=np.uint64)
    values = sampler.sample(top, np.array([True, False]), lambda i: keyed_bits(f"w{i}"))
    assert values[0] <= -sampler.size  # top of the grid, sign bit set: negative tail
    assert values[1] == 0


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2)])
def test_bernoulli_exp_is_exact(gamma):
    """Binomial z-test of 20,000 draws (false-failure rate 1e-5)."""
    bits = keyed_bits(f"b{gamma}")
    hits = sum(bernoulli_exp(bits, gamma) for _ in range(20_000))
    p = math.exp(-gamma)
    assert abs(hits / 20_000 - p) <= 4.42 * math.sqrt(p * (1 - p) / 20_000) + 1e-12


def test_geometric_has_the_exact_mean():
    """P(g) ~ exp(-rate g): mean q / (1 - q), z-test on 20,000 draws (1e-5)."""
    rate = Fraction(3, 7)
    bits = keyed_bits("geometric")
    draws = np.array([geometric(bits, rate) for _ in range(20_000)])
    q = math.exp(-3 / 7)
    mean, var = q / (1 - q), q / (1 - q) ** 2
    assert abs(draws.mean() - mean) < 4.42 * math.sqrt(var / 20_000)


def test_noise_is_keyed_by_secret_release_stream_level_and_law():
    sampler = discrete.sampler(DISCRETE_GAUSSIAN, 100.0)
    base = KeyedNoiseSource(b"s", release=b"r1").discrete_noise(sampler, "k", 0, 0, 3000)
    again = KeyedNoiseSource(b"s", release=b"r1").discrete_noise(sampler, "k", 0, 1000, 2000)
    assert np.array_equal(base[1000:], again)  # re-derived, not re-drawn
    others = [KeyedNoiseSource(b"s", release=b"r2").discrete_noise(sampler, "k", 0, 0, 3000),
              KeyedNoiseSource(b"t", release=b"r1").discrete_noise(sampler, "k", 0, 0, 3000),
              KeyedNoiseSource(b"s", release=b"r1").discrete_noise(sampler, "k2", 0, 0, 3000),
              KeyedNoiseSource(b"s", release=b"r1").discrete_noise(sampler, "k", 1, 0, 3000),
              KeyedNoiseSource(b"s", release=b"r1").discrete_noise(
                  discrete.sampler(DISCRETE_GAUSSIAN, 101.0), "k", 0, 0, 3000)]
    for other in others:
        assert abs(np.corrcoef(base, other)[0, 1]) < 0.1  # |corr| of independent: ~0.02


@pytest.mark.parametrize("name,value", [("noise parameter", 0.0), ("noise parameter", 1e13),
                                        ("noise kind", "poisson")])
def test_bad_sampler_arguments(name, value):
    kind, parameter = (value, 1.0) if name == "noise kind" else (DISCRETE_LAPLACE, value)
    with pytest.raises(ValueError, match=rf"^`{name}` must be "):
        DiscreteSampler(kind, parameter)


class _FixedWordBits(BitStream):
    """A node stream whose first 63-bit word is `low` (then keyed bits for any tail)."""

    def __init__(self, low: int, label: str):
        super().__init__(hashlib.shake_256(label.encode()).digest)
        self._low = low

    def word(self, bits):
        value, self._low = self._low, None
        return value if value is not None else super().word(bits)


@pytest.mark.parametrize("kind,parameter", [(DISCRETE_LAPLACE, 3.0), (DISCRETE_GAUSSIAN, 4.0),
                                            (DISCRETE_GAUSSIAN, 1e5)])
def test_sampled_magnitude_is_the_exact_127_bit_count_including_ties(kind, parameter):
    """Magnitude = #{m : C_m <= u} for u = top 2^63 + low, compared with Python integers on
    random u and on crafted ties (u = C_m and C_m - 1, whose top word equals a threshold's),
    at the table's head and tail (where the guide's buckets hold several thresholds)."""
    sampler = DiscreteSampler(kind, parameter)
    size = sampler.size
    thresholds = [(int(h) << 63) | int(lo) for h, lo in zip(sampler._high, sampler._low)]
    rng = np.random.default_rng(5)
    us = [int(a) << 63 | int(b) for a, b in zip(rng.integers(0, 2 ** 63, 500, dtype=np.uint64) * 2
                                               + rng.integers(0, 2, 500, dtype=np.uint64),
                                               rng.integers(0, 2 ** 63, 500, dtype=np.uint64))]
    us += [c + d for c in thresholds[:50] + thresholds[-50:] for d in (-1, 0, 1)]
    us = [u for u in us if u < thresholds[-1]]  # beyond the table: the tail test covers it
    top = np.array([u >> 63 for u in us], dtype=np.uint64)
    lows = [u & ((1 << 63) - 1) for u in us]
    values = sampler.sample(top, np.zeros(len(us), dtype=bool),
                            lambda i: _FixedWordBits(lows[i], f"t{i}"))
    expected = [bisect.bisect_right(thresholds, u) for u in us]  # thresholds ascend
    assert values.tolist() == expected
    assert size == len(thresholds)


def test_the_fast_negation_is_numpys():
    """`discrete._negated` (the sampler's sign step) against np.negative(where=), on random
    magnitudes from 0 to 2^62 and the extremes."""
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.integers(0, 2 ** 62, 5000), [0, 1, 2 ** 63 - 1]])
    for negative in (rng.random(values.shape[0]) < 0.5, np.ones(values.shape[0], bool),
                     np.zeros(values.shape[0], bool)):
        expected = np.negative(values, where=negative, out=values.copy())
        ours = discrete._negated(values.copy(), negative)  # noqa: SLF001 (under test)
        assert np.array_equal(ours, expected)
