"""The hybrid mechanism (Chan, Shi and Song 2011): the shared contract (Gaussian, float
noise), its variance's closed form, and the same outputs at every horizon."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tests.support.contract import MechanismContract
from transforms.mechanisms import make
from transforms.mechanisms.hybrid import block_and_prefix, hybrid_terms


class TestHybrid(MechanismContract):
    NAME, NOISE = "hybrid", "float"
    HORIZONS = list(range(1, 40)) + [63, 64, 65, 513]
    PRIVACY = ({"rho": 0.5}, {"epsilon": 1.0, "delta": 1e-6})
    EXACT_FACTORS = False  # R's tree rows have weights 1 / (b + 1)

    def test_sensitivity_is_the_largest_column_norm_of_right_factor(self):
        """sqrt(2) at every horizon: the largest column l2 norm of the dense R (t = 1)."""
        for horizon in (1, 2, 7, 64, 100, 300, 1000):
            mechanism = self.make(horizon, seed=0)
            _, right = mechanism.dense_factors()
            largest = np.max(np.sqrt(np.sum(right ** 2, axis=0)))
            assert mechanism.sensitivity == pytest.approx(largest, rel=1e-12) == math.sqrt(2)

    def test_describe_reports_privacy_and_error(self):
        info = self.make(100, {"rho": 0.25}, seed=1).describe()
        assert info["mechanism"] == self.NAME and info["noise"] == "gaussian"
        assert info["max_se"] >= info["mean_se"] > 0


def test_variance_is_the_closed_form():
    """s^2 (b + (b + 1)^2 popcount(m)) at step t = 2^b + m - 1, checked against an independent
    count of the nodes: the b completed blocks' sums, and the prefix's tree nodes, one per
    binary digit of m, each of weight b + 1."""
    mechanism = make("hybrid", 5000, rho=0.5, noise="float", seed=0)
    variance = mechanism.noise_variance() / mechanism.node_variance
    for t in (1, 2, 3, 4, 7, 8, 100, 1023, 1024, 4097, 5000):
        b = t.bit_length() - 1
        m = t - (1 << b) + 1
        assert variance[t - 1] == b + (b + 1) ** 2 * bin(m).count("1"), t
    assert np.array_equal(hybrid_terms(5000), variance)
    b, m = block_and_prefix(np.array([1, 2, 3, 4, (1 << 40) - 1, 1 << 40]))
    assert b.tolist() == [0, 1, 1, 2, 39, 40] and m.tolist() == [1, 1, 2, 1, 1 << 39, 1]


def test_every_horizon_releases_the_same_first_steps():
    x = np.random.default_rng(3).integers(0, 4, 3000).astype(np.float64)
    full = make("hybrid", 3000, rho=0.5, noise="float", seed=5, stream="k").release(x)
    for horizon in (1, 2, 3, 64, 65, 1000):
        mechanism = make("hybrid", horizon, rho=0.5, noise="float", seed=5, stream="k")
        assert np.array_equal(mechanism.release(x[:horizon]), full[:horizon]), horizon


def test_refusals():
    with pytest.raises(ValueError, match=r"^`privacy` must be rho, or epsilon and delta, for "
                                         r"hybrid"):
        make("hybrid", 10, epsilon=1.0, noise="float")
    with pytest.raises(ValueError, match=r"^`noise` must be 'float' for hybrid"):
        make("hybrid", 10, rho=1.0)


def test_a_step_own_value_has_the_closed_form_of_its_row_difference():
    """Var(release_t - release_{t-1}) = s^2 ||L_t - L_{t-1}||^2 from the dense factor, and its
    interval the Gaussian quantile of it."""
    from transforms.mechanisms import increments, tails
    for horizon in (1, 2, 9, 64, 100):
        mechanism = make("hybrid", horizon, rho=0.5, noise="float", seed=0)
        left, _ = mechanism.dense_factors()
        squares = np.sum(np.diff(left, axis=0, prepend=0.0) ** 2, axis=1)
        np.testing.assert_allclose(mechanism.increment_squares(), squares, rtol=1e-12)
        np.testing.assert_allclose(increments.increment_variance(mechanism),
                                   mechanism.node_variance * squares, rtol=1e-12)
        np.testing.assert_allclose(increments.increment_half_width(mechanism, 0.9),
                                   tails.gaussian_quantile(0.1) * mechanism.node_scale
                                   * np.sqrt(squares), rtol=1e-12)
