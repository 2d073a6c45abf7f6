"""The horizon-free factorization (`log_sqrt_toeplitz`): the shared contract (float noise), the
same outputs and calibration at every horizon, its bounds checked against long prefixes, and
its variance against the square root factorization calibrated for a known horizon."""
from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

from tests.support.contract import MechanismContract, variance_check, Z_CHECK
from transforms.mechanisms import make
from transforms.mechanisms.base import HistoryState
from transforms.mechanisms.toeplitz import DIRECT_LIMIT, series_inverse
from transforms.mechanisms.unbounded import (log_sqrt_coefficients, squared_norm_bound,
                                             tail_bound)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench_unbounded  # noqa: E402


class TestLogSqrtToeplitzFloat(MechanismContract):
    """The contract, with what differs for a horizon-free mechanism: zCDP only, and a
    sensitivity that is the largest column norm over every horizon (not the given one)."""
    NAME, NOISE = "log_sqrt_toeplitz", "float"
    HORIZONS = [1, 2, 7, 100, 513]
    PRIVACY = ({"rho": 0.5}, {"epsilon": 1.0, "delta": 1e-6})
    EXACT_FACTORS = False

    def test_sensitivity_is_the_largest_column_norm_of_right_factor(self):
        """Over any horizon: at least every column norm of the dense R, the same for every
        horizon, and within the tail bound of the columns' norm at 2^22 steps."""
        found = set()
        for horizon in (1, 2, 7, 64, 100, 300, 1000):
            mechanism = self.make(horizon, seed=0)
            _, right = mechanism.dense_factors()
            largest = np.max(np.sqrt(np.sum(right ** 2, axis=0)))
            assert mechanism.sensitivity >= largest
            found.add(mechanism.sensitivity)
        assert len(found) == 1
        c, s, g = (mechanism.params()[name] for name in "csg")  # the defaults
        long = log_sqrt_coefficients(1 << 22, c, s, g)
        assert found.pop() ** 2 == pytest.approx(float(np.sum(long ** 2))
                                                 + tail_bound(1 << 22, c, s, g))

    def test_describe_reports_privacy_and_error(self):
        info = self.make(100, {"rho": 0.25}, seed=1).describe()
        assert info["mechanism"] == self.NAME and info["rho"] == 0.25
        assert info["noise"] == "gaussian" and info["max_se"] >= info["mean_se"] > 0


@pytest.mark.parametrize("noise", ["float", "discrete"])
def test_every_horizon_releases_the_same_first_steps(noise):
    """A release computed for T steps gives, bit for bit, the first t outputs of one computed
    for any T' > t, in batch and step by step, with the same variance and intervals: the
    horizon is how far the release has got (intervals to their numerical inversion's error)."""
    x = np.random.default_rng(1).integers(0, 4, 2500).astype(np.float64)
    longest = make("log_sqrt_toeplitz", 2500, rho=0.5, seed=3, noise=noise, stream="k")
    full = longest.release(x)
    for horizon in (1, 9, 100, 1024, 1025, 2499):
        mechanism = make("log_sqrt_toeplitz", horizon, rho=0.5, seed=3, noise=noise,
                         stream="k")
        assert np.array_equal(mechanism.release(x[:horizon]).view(np.uint64),
                              full[:horizon].view(np.uint64)), horizon
        assert np.array_equal(mechanism.noise_variance(), longest.noise_variance()[:horizon])
        # (intervals: a numerical inversion per step, to its error bounds, not bits)
        np.testing.assert_allclose(mechanism.confidence_half_width(0.9),
                                   longest.confidence_half_width(0.9)[:horizon], rtol=1e-9)
    state, outs = longest.init_state(), []
    for value in x[:300]:
        out, state = longest.step(state, value)
        outs.append(out)
    assert np.array_equal(np.array(outs), full[:300])


def test_discrete_noise_is_exact_and_calibrated():
    """Discrete noise: y = R~ x / g + z is an exact integer vector (no rounding term: the
    intervals hold no rounding bound), the state is the input history, and the empirical
    variance of 600 streams matches the exact variance (pooled z-test, Z_CHECK: false failure
    about 1e-5)."""
    mechanism = make("log_sqrt_toeplitz", 96, rho=0.5, seed=2024)
    assert mechanism.grid == 2.0 ** -12 and not mechanism.rounding_bound().any()
    _, state = mechanism.advance(mechanism.init_state(), [1, 0, 2])
    assert isinstance(state, HistoryState) and state.inputs == (1, 0, 2)
    z_pooled, z_steps = variance_check(mechanism, streams=600, steps=96)
    assert abs(z_pooled) < Z_CHECK and np.max(np.abs(z_steps)) < 5.0


def test_the_bounds_hold_on_long_prefixes():
    """For several parameter sets: r is positive and non-increasing, L's coefficients are
    positive (Kaluza), and the tail bound exceeds the sum it bounds over 2^20 .. 2^23 (and
    the fixed-point coefficients' 4x bound theirs); the fixed-point bound is exact when R~
    ends before 2^22."""
    for c, s, g in ((4.0, 64.0, 0.9), (1.0, 1.0, 0.55), (8.0, 1000.0, 2.0)):
        r = log_sqrt_coefficients(1 << 23, c, s, g)
        assert np.all(r > 0) and np.all(np.diff(r) <= 0)
        left = np.cumsum(series_inverse(r[:1 << 14]))
        assert np.all(left > 0)
        assert tail_bound(1 << 20, c, s, g) >= float(np.sum(r[1 << 20:] ** 2))
        fixed = np.rint(r * 4096) / 4096
        assert 4 * tail_bound(1 << 20, c, s, g) >= float(np.sum(fixed[1 << 20:] ** 2))
    # 12 bits: R~ is 0 from 2^22 on (2^12 r_j <= 1/2 there), so its bound is its exact sum
    r = log_sqrt_coefficients(1 << 23, 4.0, 64.0, 0.9)
    fixed = np.rint(r * 4096) / 4096
    assert not fixed[1 << 22:].any()
    assert squared_norm_bound(4.0, 64.0, 0.9, 12) == pytest.approx(float(np.sum(fixed ** 2)),
                                                                    rel=1e-12)
    # 16 bits: not 0 there, so the 4x tail bound is added (and bounds the real tail)
    fixed16 = np.rint(r * 65536) / 65536
    assert fixed16[1 << 22] > 0
    assert squared_norm_bound(4.0, 64.0, 0.9, 16) >= float(np.sum(fixed16 ** 2))


def test_variance_against_the_square_root_for_a_known_horizon():
    """The price of no horizon (`benchmarks/bench_unbounded.py`): the variance at t = 2^k over
    that of the square root factorization for T = t and for T = 2^20 (the reach) known in
    advance, the same budget, are the rows docs/mechanisms.md shows for k = 4 .. 20; within
    1.5 of the reach's at every t = 2^k <= 2^20 (Jacobsen and Fawaz's comparison), within
    1.5 of T = t's for k >= 9, never below T = t's (no better than knowing the horizon); and
    smooth: from t = 16 on, consecutive steps' variances differ by at most the 1.0 % the docs
    say."""
    known, reach, jump = bench_unbounded.ratios(20)
    assert max(reach.values()) <= 1.5 and all(known[k] < 1.5 for k in range(9, 21))
    assert min(known.values()) > 1.0
    page = open(os.path.join(ROOT, "docs", "mechanisms.md"), encoding="utf-8").read()
    section = page.split("### With no horizon", 1)[1]
    header = [line for line in section.splitlines() if line.startswith("| k |")][0]
    shown = [int(k) for k in header.strip("|").split("|")[1:]]
    for label, found in (("| to T = t known |", known), ("| to T = 2^20 known |", reach)):
        row = [line for line in section.splitlines() if line.startswith(label)][0]
        assert [f"{found[k]:.2f}" for k in shown] == \
            [v.strip() for v in row[len(label):].strip("|").split("|")]
    assert f"at most {100 * (jump - 1):.1f} %" in section.replace("\n", " ")


def test_refusals():
    with pytest.raises(ValueError, match=r"^`privacy` must be rho, or epsilon and delta"):
        make("log_sqrt_toeplitz", 10, epsilon=1.0)
    with pytest.raises(ValueError, match=r"^`g` must be > 1/2"):
        make("log_sqrt_toeplitz", 10, rho=0.5, g=0.5)
    with pytest.raises(ValueError, match=r"^`c` must be"):
        make("log_sqrt_toeplitz", 10, rho=0.5, c=-1.0)
    assert math.isinf(make("log_sqrt_toeplitz", 10, rho=0.5).column_norm(1))


@pytest.mark.parametrize("noise", ["float", "discrete"])
def test_claimed_sensitivity_never_below_brute_force(noise):
    """On S_{D,k} (every vector, by enumeration: `tests/support/brute_force.py`) at small
    horizons, ||R v||_2 never exceeds the claimed sensitivity (discrete: of R~, the claim
    divided by 2^b, the grid)."""
    from tests.mechanisms.test_sensitivity import K_MAX, brute_by_mass
    for horizon in (1, 2, 3, 5, 8, 12):
        for d in (1, 2):
            mechanism = make("log_sqrt_toeplitz", horizon, rho=1.0, seed=0, noise=noise)
            _, right = mechanism.dense_factors()
            truth = brute_by_mass(right, horizon, d, 2)
            for k in range(d, min(d * horizon, K_MAX) + 1):
                claimed = make("log_sqrt_toeplitz", horizon, rho=1.0, seed=0, noise=noise,
                               max_contributions=k, interval_bound=d)
                scale = 1.0
                if noise == "discrete":  # the same R~ as the enumerated one
                    assert claimed.fixed_bits == mechanism.fixed_bits
                    scale = claimed.grid
                assert claimed.sensitivity * scale >= truth[k] - 1e-9, (horizon, d, k)


def test_budgets_near_the_samplers_limit_still_release():
    """`fixed_bits` keeps the noise within both the table and the sampler's own limit: the
    budgets whose 12-bit noise the sampler would refuse take 11 bits instead (found by a
    review: 6.2e-4 .. 6.9e-4 raised NoiseTooLarge at release)."""
    for rho in (6.2e-4, 6.9e-4):
        mechanism = make("log_sqrt_toeplitz", 16, rho=rho, seed=1)
        assert np.all(np.isfinite(mechanism.release(np.ones(16)))), rho


def test_every_horizon_to_2_20_reads_the_same_left_factor():
    """L is computed at one length for every horizon up to 2^20, so a step's weights, and so
    its output step by step, do not depend on the horizon (past 2^16 too)."""
    short = make("log_sqrt_toeplitz", 100, rho=0.5, seed=1, noise="float")
    long = make("log_sqrt_toeplitz", 70000, rho=0.5, seed=1, noise="float")
    assert np.array_equal(short.left_coefficients(), long.left_coefficients()[:100])
    assert short.left_coefficients()[0] == 1.0


@pytest.mark.parametrize("noise", ["discrete", "float"])
def test_the_first_2_15_steps_have_the_same_bits_however_far_a_batch_reaches(noise):
    """Whatever a batch's length, the horizon built for, or steps taken one at a time: the
    first DIRECT_LIMIT steps are dot products (the same bits); beyond, an FFT over the batch's
    length rounds otherwise, within 1e-9 of the values."""
    x = np.random.default_rng(5).integers(0, 3, DIRECT_LIMIT + 7000).astype(float)
    once = make("log_sqrt_toeplitz", 1 << 16, rho=0.5, seed=3, noise=noise)
    whole, _ = once.advance(once.init_state(), x)
    runs = make("log_sqrt_toeplitz", 1 << 17, rho=0.5, seed=3, noise=noise)
    state, parts = runs.init_state(), []
    for stop in (1000, DIRECT_LIMIT - 8, DIRECT_LIMIT + 3000, x.shape[0]):
        out, state = runs.advance(state, x[state.steps:stop])
        parts.append(out)
        if stop == DIRECT_LIMIT - 8:  # steps one at a time, across the boundary
            for _ in range(16):
                out, state = runs.step(state, x[state.steps])
                parts.append(np.array([out]))
    joined = np.concatenate(parts)
    assert np.array_equal(joined[:DIRECT_LIMIT], whole[:DIRECT_LIMIT])
    np.testing.assert_allclose(joined, whole, rtol=0, atol=1e-9 * np.abs(whole).max())
