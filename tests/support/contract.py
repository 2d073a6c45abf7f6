"""The contract every mechanism passes: one base class, subclassed per mechanism and option set
(as google/differential-privacy's privacy_accountant_test does for accountants).

Statistical checks use fixed seeds; each states its false-failure rate.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import sparse, stats

from transforms.mechanisms import ConstantNoiseSource, CounterState, make
from transforms.mechanisms import discrete

# Two-sided normal quantile for a per-check false-failure rate of about 1e-5.
Z_CHECK = 4.42


def variance_check(mechanism, streams: int, steps: int):
    """z-scores of the empirical noise variance against the analytic one, on all-zero input.

    For each stream s, Y_s = mean_t (noise_t^2 / var_t) has mean exactly 1. Streams are
    independent, so mean(Y) is tested with the sample standard deviation of Y (CLT; per-check
    false-failure rate ~1e-5). Per step, mean_s noise_t^2 / var_t is tested the same way.
    """
    variance = mechanism.noise_variance()[:steps]
    ratios = np.empty((streams, steps))
    for s in range(streams):
        ratios[s] = mechanism.for_stream(s).release(np.zeros(steps)) ** 2 / variance
    pooled = ratios.mean(axis=1)
    z_pooled = (pooled.mean() - 1.0) / (pooled.std(ddof=1) / math.sqrt(streams))
    z_steps = (ratios.mean(axis=0) - 1.0) / (ratios.std(axis=0, ddof=1) / math.sqrt(streams))
    return z_pooled, z_steps


def integer_law_pvalue(values, law) -> float:
    """Chi-square p-value of integer samples against a pmf over -K..K (bins with expected
    count >= 5, the rest pooled into one bin)."""
    center = (law.shape[0] - 1) // 2
    index = np.asarray(values).astype(np.int64) + center
    assert index.min() >= 0 and index.max() < law.shape[0]
    observed = np.bincount(index, minlength=law.shape[0])
    expected = law * index.shape[0]
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] < 5:
        obs[-2] += obs[-1]
        exp[-2] += exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


class MechanismContract:
    """Subclasses set NAME, PARAMS (passed to make) and NOISE, and may narrow HORIZONS."""

    NAME: str = ""
    PARAMS: dict = {}
    NOISE = "discrete"
    HORIZONS = list(range(1, 301)) + [511, 512, 513, 1000, 2187]
    PRIVACY = ({"epsilon": 1.0}, {"rho": 0.5})
    EXACT_FACTORS = True  # L R == A exactly in floating point (integer entries)

    def make(self, horizon, privacy=None, **extra):
        privacy = privacy or self.PRIVACY[0]
        return make(self.NAME, horizon, **privacy, **{"noise": self.NOISE, **self.PARAMS,
                                                      **extra})

    def input(self, values):
        """Inputs the noise kind accepts (discrete noise releases integer streams)."""
        return np.round(values) if self.NOISE == "discrete" else values

    # ----- factorization ---------------------------------------------------------------------
    def test_factors_multiply_to_prefix_sum_matrix(self):
        for horizon in self.HORIZONS:
            left, right = self.make(horizon, seed=0).dense_factors()
            if np.count_nonzero(left) < 0.05 * left.size:
                # tree factors are sparse (a few nodes per row and column): the sparse
                # product is the same sums of the same products (exact for integer entries),
                # several times faster at T = 2187 than the dense one
                product = (sparse.csr_matrix(left) @ sparse.csr_matrix(right)).toarray()
            else:
                product = left @ right
            target = np.tril(np.ones((horizon, horizon)))
            if self.EXACT_FACTORS:
                assert np.array_equal(product, target), horizon
            else:
                np.testing.assert_allclose(product, target, rtol=0, atol=1e-12)

    def test_sensitivity_is_the_largest_column_norm_of_right_factor(self):
        for horizon in (1, 2, 7, 64, 100, 300, 1000):
            for privacy, p in zip(self.PRIVACY, (1, 2)):
                mechanism = self.make(horizon, privacy, seed=0)
                _, right = mechanism.dense_factors()
                largest = np.max(np.sum(np.abs(right) ** p, axis=0) ** (1.0 / p))
                assert mechanism.sensitivity == pytest.approx(largest, rel=1e-12, abs=0)

    def test_variance_is_node_variance_times_squared_row_norm_of_left_factor(self):
        for horizon in (1, 5, 100, 1000):
            for privacy in self.PRIVACY:
                mechanism = self.make(horizon, privacy, seed=0)
                left, _ = mechanism.dense_factors()
                expected = mechanism.node_variance * np.sum(left ** 2, axis=1)
                np.testing.assert_allclose(mechanism.noise_variance(), expected, rtol=1e-12)
                assert mechanism.max_se() == pytest.approx(math.sqrt(expected.max()))
                assert mechanism.mean_se() == pytest.approx(math.sqrt(expected.mean()))

    def test_release_adds_left_factor_times_node_noise(self):
        """With constant node noise c, release(x) = cumsum(x) + scale * c * L 1."""
        rng = np.random.default_rng(1)
        for horizon in (1, 13, 100, 1000):
            mechanism = self.make(horizon, noise_source=ConstantNoiseSource(0.75))
            left, _ = mechanism.dense_factors()
            x = rng.integers(-3, 4, horizon).astype(float)
            scale = 1.0 if self.NOISE == "discrete" else mechanism.node_scale
            expected = np.cumsum(x) + scale * 0.75 * left.sum(axis=1)
            np.testing.assert_allclose(mechanism.release(x), expected, rtol=1e-12, atol=1e-9)

    def test_zero_noise_release_is_the_exact_running_total(self):
        x = np.random.default_rng(2).integers(0, 5, 257)
        mechanism = self.make(257, noise_source=ConstantNoiseSource(0.0))
        np.testing.assert_array_equal(mechanism.release(x), np.cumsum(x))

    # ----- streaming -------------------------------------------------------------------------
    def test_streaming_steps_equal_batch_release_bit_for_bit(self):
        rng = np.random.default_rng(3)
        for privacy in self.PRIVACY:
            for horizon in (1, 2, 100, 1000, 2500):
                mechanism = self.make(horizon, privacy, seed=11, stream="key-a")
                x = self.input(rng.normal(size=horizon) * 10)
                state, outs = mechanism.init_state(), []
                for value in x:
                    out, state = mechanism.step(state, value)
                    outs.append(out)
                assert np.array_equal(np.array(outs), mechanism.release(x))
                assert state == CounterState(horizon, float(np.cumsum(x)[-1]))

    def test_block_prefixes_read_first_then_past_them_equal_a_fresh_release(self):
        """A short batch read derives only the first nodes of each block it touches
        (`noise.prefix_length`); the same mechanism then reads past them, step by step and in
        chunks, deriving the blocks again, longer: every value equals a fresh mechanism's
        whole release, bit for bit."""
        x = self.input(np.random.default_rng(8).normal(size=700) * 5)
        reference = self.make(700, seed=13, stream="k").release(x)
        mechanism = self.make(700, seed=13, stream="k")
        outs, state = [], mechanism.init_state()
        for chunk in (x[:3], x[3:40]):
            released, state = mechanism.advance(state, chunk)
            outs.extend(released)
        for value in x[40:150]:
            out, state = mechanism.step(state, value)
            outs.append(out)
        outs.extend(mechanism.advance(state, x[150:])[0])
        assert np.array_equal(np.array(outs).view(np.uint64), reference.view(np.uint64))

    def test_resume_from_serialised_state_in_chunks_matches_batch(self):
        x = np.arange(500) % 7
        mechanism = self.make(500, seed=5)
        state, outs = mechanism.init_state(), []
        for chunk in np.array_split(x, [3, 4, 100, 350]):
            fresh = self.make(500, seed=5)  # a new process: only the bytes survive
            released, state = fresh.advance(CounterState.from_bytes(state.to_bytes()), chunk)
            outs.append(released)
        assert np.array_equal(np.concatenate(outs), mechanism.release(x))

    def test_stepping_past_the_horizon_fails_closed(self):
        mechanism = self.make(3, seed=0)
        state = mechanism.advance(mechanism.init_state(), [1, 1, 1])[1]
        with pytest.raises(ValueError,
                           match=r"^`steps released` must be <= horizon \(3\); got 4\.$"):
            mechanism.step(state, 1)
        with pytest.raises(ValueError, match=r"`values` must be finite numbers"):
            mechanism.release([1.0, float("nan")])

    # ----- noise seam ------------------------------------------------------------------------
    def test_noise_is_keyed_by_secret_and_stream(self):
        zeros = np.zeros(200)
        base = self.make(200, secret=b"s1").for_stream("k1").release(zeros)
        assert np.array_equal(base, self.make(200, secret=b"s1", stream="k1").release(zeros))
        assert not np.array_equal(base, self.make(200, secret=b"s2", stream="k1").release(zeros))
        assert not np.array_equal(base, self.make(200, secret=b"s1", stream="k2").release(zeros))
        unseeded = [self.make(200).release(zeros) for _ in range(2)]
        assert not np.array_equal(*unseeded)

    def test_empirical_variance_matches_analytic_variance(self):
        for privacy in self.PRIVACY:
            mechanism = self.make(96, privacy, seed=2024)
            z_pooled, z_steps = variance_check(mechanism, streams=600, steps=96)
            assert abs(z_pooled) < Z_CHECK, (privacy, z_pooled)
            # 96 per-step checks: Bonferroni keeps the family false-failure rate ~1e-4.
            assert np.max(np.abs(z_steps)) < 5.0, (privacy, np.max(np.abs(z_steps)))

    def test_variance_check_catches_a_miscalibrated_scale(self):
        """Negative control: noise with variance 1.5x the claimed one fails the same check."""
        mechanism = self.make(96, self.PRIVACY[1], seed=2024)
        mechanism._cache["sensitivity"] = mechanism.sensitivity * math.sqrt(1.5)
        claimed = self.make(96, self.PRIVACY[1], seed=2024)
        variance = claimed.noise_variance()
        ratios = np.array([mechanism.for_stream(s).release(np.zeros(96)) ** 2 / variance
                           for s in range(600)]).mean(axis=1)
        z = (ratios.mean() - 1.0) / (ratios.std(ddof=1) / math.sqrt(600))
        assert z > Z_CHECK

    def test_discrete_noise_follows_the_exact_law_and_releases_integers(self):
        """Chi-square of noise_t against the exact n-fold convolution of the node law, at steps
        of different node counts (bins with expected count >= 5 pooled; false failure 1e-4
        each); every released value is an integer."""
        if self.NOISE != "discrete":
            pytest.skip("float noise: see the KS test")
        for privacy in self.PRIVACY:
            mechanism = self.make(64, privacy, seed=99)
            samples = np.array([mechanism.for_stream(s).release(np.arange(64) % 3)
                                for s in range(700)]) - np.cumsum(np.arange(64) % 3)
            assert np.array_equal(samples, np.round(samples))
            terms = mechanism._equal_weight_terms()
            pmf = mechanism.sampler.pmf(1e-15)
            for t in sorted({int(np.argmax(terms)), int(np.argmin(terms)), 31}):
                law = np.array([1.0])
                for _ in range(int(terms[t])):
                    law = np.convolve(law, pmf)
                if terms[t] == 0:
                    assert np.all(samples[:, t] == 0)
                    continue
                assert integer_law_pvalue(samples[:, t], law) > 1e-4, (privacy, t)

    def test_gaussian_noise_is_normal_with_the_analytic_std(self):
        """KS test of noise_t / std_t against N(0, 1) at fixed steps (false failure 1e-4 each)."""
        if self.NOISE == "discrete":
            pytest.skip("discrete noise: see the exact-law test")
        mechanism = self.make(64, self.PRIVACY[1], seed=99)
        std = mechanism.noise_std()
        samples = np.array([mechanism.for_stream(s).release(np.zeros(64)) for s in range(1500)])
        for t in (0, 31, 63):
            assert stats.kstest(samples[:, t] / std[t], "norm").pvalue > 1e-4, t

    # ----- confidence intervals --------------------------------------------------------------
    def test_confidence_intervals_reach_nominal_coverage(self):
        """Per-step coverage within 4.42 binomial sd of the level on both sides (every
        interval is the exact quantile: `tails`), and simultaneous coverage >= level;
        false-failure rate ~1e-5 per check."""
        streams, horizon, level = 1200, 40, 0.9
        for privacy in self.PRIVACY:
            mechanism = self.make(horizon, privacy, seed=7)
            noise = np.array([mechanism.for_stream(s).release(np.zeros(horizon))
                              for s in range(streams)])
            half = mechanism.confidence_half_width(level)
            coverage = np.mean(np.abs(noise) <= half, axis=0)
            sd = math.sqrt(level * (1 - level) / streams)
            assert np.all(coverage >= level - Z_CHECK * sd), (privacy, coverage.min())
            if self.NOISE == "discrete":  # exact integer quantiles: as tight as integers allow
                terms = mechanism._equal_weight_terms()
                for t in np.nonzero((terms > 0) & (terms <= 64))[0]:
                    sampler = mechanism.sampler
                    c = discrete.equal_weight_quantile(sampler.kind, sampler.parameter,
                                                       int(terms[t]), 1 - level)
                    assert half[t] == c
                    # one unit narrower would under-cover (c is the smallest valid integer)
                    narrower = np.mean(np.abs(noise[:, t]) <= c - 1)
                    assert c == 0 or narrower <= level + Z_CHECK * sd, (t, narrower)
            else:  # exact continuous quantiles: neither side may be off
                assert np.all(coverage <= level + Z_CHECK * sd), (privacy, coverage.max())
            together = mechanism.confidence_half_width(level, simultaneous=True)
            joint = np.mean(np.all(np.abs(noise) <= together, axis=1))
            assert joint >= level - Z_CHECK * sd
            low, high = mechanism.confidence_interval(np.full(horizon, 5.0), level)
            np.testing.assert_allclose(high - low, 2 * half)

    def test_state_is_small_and_serialisable(self):
        mechanism = self.make(1000, seed=1)
        _, state = mechanism.advance(mechanism.init_state(), np.ones(10))
        data = state.to_bytes()
        assert len(data) <= 32
        assert CounterState.from_bytes(data) == state
        with pytest.raises(ValueError, match="`state bytes` must be"):
            CounterState.from_bytes(data[:-1])

    def test_describe_reports_privacy_and_error(self):
        info = self.make(100, {"epsilon": 0.5}, seed=1).describe()
        assert info["mechanism"] == self.NAME and info["epsilon"] == 0.5
        expected = "discrete_laplace" if self.NOISE == "discrete" else "laplace"
        assert info["noise"] == expected
        assert info["max_se"] >= info["mean_se"] * (1 - 1e-12) > 0
