"""The budget of a release made of parts: each part's share, composing back to the total.

A statistic released as several continual releases (`ContinualMean`: a sum and a count) spends
one budget. `share_budget` gives each part its share as a `PrivacyBudget` and proves, with the
privacy events of `mechanisms.accounting` (sequential composition: epsilons of pure DP add,
rhos of zCDP add; Bun & Steinke 2016, Lemma 2.3), that the parts compose to at most the
total: float rounding is resolved downwards, never up. An (epsilon, delta) budget is served by
zCDP (`PrivacyBudget.resolve`), so its rho is what is shared. Imports no Beam.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Dict, Mapping

from transforms import validation as check
from transforms.mechanisms.accounting import PureDp, Zcdp, compose
from transforms.mechanisms.privacy import LAPLACE, PrivacyBudget


def total_event(budget: PrivacyBudget):
    """The budget as one privacy event: PureDp(epsilon) for Laplace noise, else Zcdp(rho)."""
    return PureDp(budget.epsilon) if budget.noise == LAPLACE else Zcdp(budget.rho)


def share_budget(budget: PrivacyBudget, shares: Mapping[str, float]
                 ) -> Dict[str, PrivacyBudget]:
    """Each part's budget: `shares` (part -> fraction in (0, 1), summing to 1) of the total's
    epsilon (Laplace) or rho (zCDP). The parts' events compose to at most the total's.

    >>> parts = share_budget(PrivacyBudget.resolve(epsilon=1.0), {"sum": 0.3, "count": 0.7})
    >>> parts["sum"].epsilon, parts["count"].epsilon
    (0.3, 0.7)
    """
    if not isinstance(shares, Mapping) or not shares:
        check.fail("shares", "a non-empty mapping of part names to fractions", shares)
    if len(shares) > 1:
        for name, share in shares.items():
            check.open_unit_interval(f"shares.{name}", share)
    if not math.isclose(math.fsum(shares.values()), 1.0, rel_tol=0.0, abs_tol=1e-12):
        check.fail("shares", "fractions summing to 1", dict(shares))
    total = total_event(budget)
    amount = total.epsilon if isinstance(total, PureDp) else total.rho
    values = {name: amount * share for name, share in shares.items()}
    last = list(values)[-1]
    # rounding: the last part gives up ulps until the parts compose to at most the total
    # exactly (fractions: a correctly rounded float sum may still hide half an ulp over)
    while sum(map(Fraction, values.values())) > Fraction(amount):
        values[last] = math.nextafter(values[last], 0.0)
    compose(_event(budget, v) for v in values.values())  # one kind of event: they compose
    return {name: (PrivacyBudget(budget.noise, epsilon=value) if budget.noise == LAPLACE
                   else PrivacyBudget(budget.noise, rho=value))
            for name, value in values.items()}


def part_kwargs(budget: PrivacyBudget) -> dict:
    """A part's budget as a transform's arguments (epsilon=, or rho=)."""
    return {"epsilon": budget.epsilon} if budget.noise == LAPLACE else {"rho": budget.rho}


def _event(budget: PrivacyBudget, value: float):
    return PureDp(value) if budget.noise == LAPLACE else Zcdp(value)



# the input gate's share of a release's budget: at most this (a gate is a small check)
MAX_GATE_SHARE = 0.5


def gate_budget(budget: PrivacyBudget, share: float):
    """(the gate's descriptor entry, the counting budget): `share` of the release's epsilon
    (Laplace) or rho (zCDP; an (epsilon, delta) budget's rho) for the input gate
    (`pipelines.gate`), the rest for the release; the two compose to at most the total.

    >>> gate, counting = gate_budget(PrivacyBudget.resolve(epsilon=1.0), 0.02)
    >>> gate, counting.epsilon
    ({'share': 0.02, 'budget': {'epsilon': 0.02}}, 0.98)
    """
    share = check.open_unit_interval("gate_share", share)
    if share > MAX_GATE_SHARE:
        check.fail("gate_share", f"at most {MAX_GATE_SHARE:g} (the input gate is a small "
                                 f"check beside the release)", share)
    parts = share_budget(budget, {"gate": share, "release": 1.0 - share})
    return {"share": share, "budget": part_kwargs(parts["gate"])}, parts["release"]
