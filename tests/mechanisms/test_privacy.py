"""Budgets, conversions and calibration."""
from __future__ import annotations

import math

import pytest

from transforms.mechanisms import make as make_mechanism
from transforms.mechanisms.privacy import (PrivacyBudget, epsilon_from_rho,
                                           rho_from_epsilon_delta)


def make(*args, **kwargs):
    """These tests check the papers' continuous-noise formulas: float noise unless asked."""
    kwargs.setdefault("noise", "float")
    return make_mechanism(*args, **kwargs)


@pytest.mark.parametrize("epsilon,delta", [(1.0, 1e-6), (0.1, 1e-9), (10.0, 1e-3), (3.0, 0.5)])
def test_rho_from_epsilon_delta_is_the_largest_feasible_rho(epsilon, delta):
    rho = rho_from_epsilon_delta(epsilon, delta)
    assert epsilon_from_rho(rho, delta) == pytest.approx(epsilon, rel=1e-12)
    assert epsilon_from_rho(rho * (1 + 1e-9), delta) > epsilon


def test_calibration():
    laplace = PrivacyBudget.resolve(epsilon=2.0)
    assert laplace.noise == "laplace" and laplace.node_scale(3.0) == 1.5
    assert laplace.node_variance(3.0) == 2 * 1.5 ** 2
    gauss = PrivacyBudget.resolve(rho=0.125)
    assert gauss.node_scale(1.0) == 2.0 and gauss.node_variance(2.0) == 16.0
    approx = PrivacyBudget.resolve(epsilon=1.0, delta=1e-6)
    assert approx.noise == "gaussian" and approx.rho == rho_from_epsilon_delta(1.0, 1e-6)


@pytest.mark.parametrize("kwargs,message", [
    ({}, r"^`epsilon` must be given when `rho` is not \(pass exactly one of them\); got None\.$"),
    ({"epsilon": 1.0, "rho": 1.0},
     r"^`epsilon` must be None when `rho` is given \(pass exactly one of them\); got 1\.0\.$"),
    ({"rho": 1.0, "delta": 1e-6}, r"^`delta` must be None when `rho` is given; got 1e-06\.$"),
    ({"epsilon": 0}, r"^`epsilon` must be a positive finite number; got 0\.$"),
    ({"epsilon": -1.0}, r"^`epsilon` must be a positive finite number; got -1\.0\.$"),
    ({"epsilon": math.inf}, r"^`epsilon` must be a positive finite number; got inf\.$"),
    ({"epsilon": True}, r"^`epsilon` must be a positive finite number; got True\.$"),
    ({"rho": "1"}, r"^`rho` must be a positive finite number; got '1'\.$"),
    ({"epsilon": 1.0, "delta": 0.0}, r"^`delta` must be a number in \(0, 1\); got 0\.0\.$"),
    ({"epsilon": 1.0, "delta": 1.0}, r"^`delta` must be a number in \(0, 1\); got 1\.0\.$"),
])
def test_budget_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PrivacyBudget.resolve(**kwargs)


@pytest.mark.parametrize("call,message", [
    (lambda: make("quantum_tree", 10, epsilon=1.0), r"^`name` must be one of 'binary_tree'.*"
     r"got 'quantum_tree'\.$"),
    (lambda: make("binary_tree", 0, epsilon=1.0), r"^`horizon` must be an integer >= 1; got 0\.$"),
    (lambda: make("binary_tree", 10.0, epsilon=1.0),
     r"^`horizon` must be an integer >= 1; got 10\.0\.$"),
    (lambda: make("binary_tree", 10, epsilon=1.0, k=3),
     r"^`params` must be among \['sparsify', 'prune'\] for 'binary_tree'; got \['k'\]\.$"),
    (lambda: make("sqrt_toeplitz", 10, epsilon=1.0, b=3),
     r"^`params` must be among \[\] for 'sqrt_toeplitz'; got \['b'\]\.$"),
    (lambda: make("binary_tree", 10, epsilon=1.0, max_contributions=0),
     r"^`max_contributions` must be an integer >= 1; got 0\.$"),
    (lambda: make("binary_tree", 10, epsilon=1.0, interval_bound=-2),
     r"^`interval_bound` must be an integer >= 1; got -2\.$"),
    (lambda: make("binary_tree", 10, epsilon=1.0, stream=2.5),
     r"^`stream` must be a str, bytes or int key; got 2\.5\.$"),
    (lambda: make("binary_tree", 10, epsilon=1.0, seed=3).confidence_half_width(1.5),
     r"^`level` must be a number in \(0, 1\); got 1\.5\.$"),
])
def test_factory_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_larger_sensitivity_sets_scale_the_error_with_the_sensitivity():
    base = make("kary_subtraction", 100, epsilon=1.0, k=5, seed=0)
    for k in (2, 5):
        for d in (1, 2):
            wider = make("kary_subtraction", 100, epsilon=1.0, k=5, seed=0,
                         max_contributions=k, interval_bound=d)
            assert wider.sensitivity > base.sensitivity
            assert wider.max_se() == pytest.approx(base.max_se() * wider.sensitivity
                                                   / base.sensitivity)
