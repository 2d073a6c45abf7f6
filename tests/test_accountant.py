"""The budget of a composed release: shares compose to at most the total."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from transforms.accountant import part_kwargs, share_budget
from transforms.mechanisms.accounting import PureDp, Zcdp, compose
from transforms.mechanisms.privacy import PrivacyBudget


@pytest.mark.parametrize("budget", [{"epsilon": 1.0}, {"rho": 0.3},
                                    {"epsilon": 2.0, "delta": 1e-7}])
def test_shares_never_compose_to_more_than_the_total(budget):
    """10,000 random splits into 2 to 4 parts: the parts' events compose (sequential
    composition) to at most the total, exactly (not only after float rounding), and lose at
    most a few ulps of it."""
    total = PrivacyBudget.resolve(**budget)
    rng = np.random.default_rng(4)
    for _ in range(10_000):
        weights = rng.dirichlet(np.ones(int(rng.integers(2, 5))))
        weights = weights / math.fsum(weights)
        shares = {f"p{i}": float(w) for i, w in enumerate(weights)}
        if not all(0 < w < 1 for w in shares.values()) or not math.isclose(
                math.fsum(shares.values()), 1.0, abs_tol=1e-12):
            continue
        parts = share_budget(total, shares)
        if total.noise == "laplace":
            amounts, whole = [p.epsilon for p in parts.values()], total.epsilon
            assert compose(PureDp(a) for a in amounts).epsilon <= whole
        else:
            amounts, whole = [p.rho for p in parts.values()], total.rho
            assert compose(Zcdp(a) for a in amounts).rho <= whole
            assert all(p.epsilon is None and p.delta is None for p in parts.values())
        exact = sum(map(Fraction, amounts))  # in exact arithmetic, not only rounded
        assert exact <= Fraction(whole) and exact >= Fraction(whole) * (1 - Fraction(1, 10**14))


def test_an_epsilon_delta_budget_shares_its_rho():
    total = PrivacyBudget.resolve(epsilon=1.0, delta=1e-6)
    parts = share_budget(total, {"sum": 0.25, "count": 0.75})
    assert parts["sum"].rho == pytest.approx(total.rho / 4)
    assert part_kwargs(parts["sum"]) == {"rho": parts["sum"].rho}
    assert part_kwargs(PrivacyBudget.resolve(epsilon=0.5)) == {"epsilon": 0.5}


@pytest.mark.parametrize("shares,message", [
    ({}, r"^`shares` must be a non-empty mapping"),
    ({"a": 0.5, "b": 0.6}, r"^`shares` must be fractions summing to 1"),
    ({"a": 0.0, "b": 1.0}, r"^`shares.a` must be a number in \(0, 1\)"),
    ({"a": 0.5}, r"^`shares` must be fractions summing to 1"),
])
def test_bad_shares_are_refused(shares, message):
    with pytest.raises(ValueError, match=message):
        share_budget(PrivacyBudget.resolve(epsilon=1.0), shares)
