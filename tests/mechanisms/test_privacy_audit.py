"""Empirical privacy audit: sample real releases on a worst-case neighbouring pair of difference
streams and estimate the privacy loss; real mechanisms pass, a negative control with half the
noise is flagged by the same test.

- zCDP (Gaussian and discrete Gaussian): releases are y = A x + L z. The most powerful test
  between x and a neighbour x' = x + e_s is linear, along w = Sigma^-1 Delta (Delta = A e_s,
  Sigma = node variance L L^T); the loss is rho_hat = (w^T Delta)^2 / (2 Var[w^T y]) with the
  variance estimated from the sampled releases (its upper confidence bound, 1e-4 one-sided,
  from the sample fourth moment). s is the step where rho is largest.
- Pure DP (discrete Laplace): for mechanisms whose noisy nodes are as many as the steps (binary
  tree, naive composition) the node noise is recovered exactly, z = L^-1 (y - A x), and the
  exact privacy-loss statistic l = sum (|z - delta| - |z|) / t defines the event {l >= c};
  epsilon_hat = ln(P_x(E) / P_x'(E)) with Clopper-Pearson bounds (1e-4 each side).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from transforms.mechanisms import make

HORIZON = 16
Z = 3.72  # one-sided 1e-4


def releases(mechanism, samples):
    zeros = np.zeros(mechanism.horizon)
    return np.array([mechanism.for_stream(s).release(zeros) for s in range(samples)])


def noisy_factor(mechanism):
    left, right = mechanism.dense_factors()
    used = np.abs(left).sum(axis=0) > 0
    return left[:, used], right[used]


def zcdp_audit(mechanism, samples):
    """(rho_hat lower confidence bound, rho of the output at the worst step)."""
    left, _ = noisy_factor(mechanism)
    sigma = mechanism.node_variance * left @ left.T
    prefix = np.tril(np.ones((HORIZON, HORIZON)))
    step = max(range(HORIZON), key=lambda s: prefix[:, s] @ np.linalg.solve(sigma, prefix[:, s]))
    delta = prefix[:, step]
    w = np.linalg.solve(sigma, delta)
    statistic = releases(mechanism, samples) @ w  # x = 0: y = L z
    variance = statistic.var(ddof=1)
    fourth = np.mean((statistic - statistic.mean()) ** 4)
    upper = variance + Z * math.sqrt(max(fourth - variance ** 2, 0.0) / samples)
    return (w @ delta) ** 2 / (2.0 * upper), (delta @ w) / 2.0


ZCDP_CASES = [("binary_tree", {}, "discrete"), ("kary_subtraction", {"k": 5}, "discrete"),
              ("smooth_binary", {}, "discrete"), ("naive_composition", {}, "discrete"),
              ("sqrt_toeplitz", {}, "discrete"), ("sqrt_toeplitz", {}, "float"),
              ("kary_subtraction", {"k": 5}, "float"),
              # horizon-free: calibrated for every horizon, audited on its first steps
              ("log_sqrt_toeplitz", {}, "discrete"), ("log_sqrt_toeplitz", {}, "float"),
              ("hybrid", {}, "float")]


@pytest.mark.parametrize("name,params,noise", ZCDP_CASES)
def test_zcdp_loss_of_real_releases_is_within_the_budget_and_half_noise_is_flagged(
        name, params, noise):
    rho = 0.5
    real = make(name, HORIZON, rho=rho, seed=31, noise=noise, **params)
    estimate, analytic = zcdp_audit(real, 1500)
    assert analytic <= rho * (1 + 1e-6)
    assert estimate <= rho, (name, estimate)
    control = make(name, HORIZON, rho=rho, seed=32, noise=noise, **params)
    control._cache["sensitivity"] = real.sensitivity / 2  # half the noise
    control._cache.pop("sampler", None)
    flagged, _ = zcdp_audit(control, 1500)
    assert flagged > rho, (name, flagged)


def clopper_pearson(hits, n, alpha=1e-4):
    low = stats.beta.ppf(alpha, hits, n - hits + 1) if hits else 0.0
    high = stats.beta.ppf(1 - alpha, hits + 1, n - hits) if hits < n else 1.0
    return low, high


def pure_dp_audit(mechanism, samples):
    """Lower confidence bound on epsilon from the exact loss statistic's top event."""
    left, right = noisy_factor(mechanism)
    assert left.shape[0] == left.shape[1]  # as many noisy nodes as steps: z is recoverable
    columns = np.abs(right).sum(axis=0)
    step = int(np.argmax(columns))
    delta = right[:, step]
    z = np.linalg.solve(left, releases(mechanism, samples).T).T  # x = 0
    z = np.round(z)
    scale = mechanism.sampler.parameter

    def loss(nodes):
        return (np.abs(nodes - delta) - np.abs(nodes)).sum(axis=1) / scale

    under_x, under_neighbour = loss(z), loss(z + delta)
    best = 0.0
    for c in np.unique(under_x)[-3:]:
        p1 = clopper_pearson(int(np.sum(under_x >= c)), samples)[0]
        p2 = clopper_pearson(int(np.sum(under_neighbour >= c)), samples)[1]
        if p1 > 0:
            best = max(best, math.log(p1 / p2))
    return best


@pytest.mark.parametrize("name,horizon", [("binary_tree", 8), ("naive_composition", 3)])
def test_pure_dp_loss_of_real_releases_is_within_the_budget_and_half_noise_is_flagged(
        name, horizon):
    epsilon = 1.0
    real = make(name, horizon, epsilon=epsilon, seed=41)
    assert pure_dp_audit(real, 4000) <= epsilon
    control = make(name, horizon, epsilon=epsilon, seed=42)
    control._cache["sensitivity"] = real.sensitivity / 2
    control._cache.pop("sampler", None)
    assert pure_dp_audit(control, 4000) > epsilon


@pytest.mark.parametrize("name,params", [("binary_tree", {}), ("kary_subtraction", {"k": 3}),
                                         ("smooth_binary", {}), ("naive_composition", {}),
                                         ("input_perturbation", {})])
def test_discrete_releases_of_neighbours_have_identical_support(name, params):
    """The check that would have caught the floating-point attack: default releases are integer
    vectors, and A (x - x') = L (R (x - x')) with R integer, so every output possible under x
    is possible under its neighbour x' (node noise has full support on the integers). 1,500
    releases of each are checked; float noise fails the same structural check."""
    x = np.random.default_rng(1).integers(0, 3, HORIZON).astype(float)
    neighbour = x.copy()
    neighbour[3] += 1
    mechanism = make(name, HORIZON, epsilon=1.0, seed=5, **params)
    left, right = mechanism.dense_factors()
    assert np.array_equal(right, np.round(right)) and np.array_equal(left, np.round(left))
    shift = right @ (neighbour - x)
    assert np.array_equal(left @ shift, np.cumsum(neighbour - x))
    for data in (x, neighbour):
        outputs = np.array([mechanism.for_stream(s).release(data) for s in range(1500)])
        assert np.array_equal(outputs, np.round(outputs))
    floats = make(name, HORIZON, epsilon=1.0, seed=5, noise="float", **params).release(x)
    assert not np.array_equal(floats, np.round(floats))  # negative control
