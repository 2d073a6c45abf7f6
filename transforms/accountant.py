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
from transforms.mechanisms.discrete import NoiseTooLarge
from transforms.mechanisms.privacy import LAPLACE, PrivacyBudget, epsilon_from_rho


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


def selection_budget(selects: bool, epsilon, rho, delta, selection_delta):
    """(the delta key selection spends or None, the delta left to the counting budget).

    Selection costs delta only (docs/selection.md): under epsilon alone or rho it is
    `selection_delta` (with rho, `delta` may name it); under (epsilon, delta) it is a part of
    delta (default half) and the key budget's conversion gets the rest."""
    if not selects:
        if selection_delta is not None:
            check.fail("selection_delta", "None when public_keys are given (only a release "
                                          "that selects its keys spends it)", selection_delta)
        return None, delta
    if rho is not None:
        if delta is not None and selection_delta is not None:
            check.fail("selection_delta", "None when `delta` is given with `rho` (under zCDP "
                                          "`delta` is the selection's)", selection_delta)
        given = selection_delta if selection_delta is not None else delta
        if given is None:
            check.fail("delta", "given with `rho` when public_keys are not (selecting keys "
                                "privately spends a delta, e.g. delta=1e-6)", None)
        return check.open_unit_interval("delta", given), None
    if delta is None:
        if selection_delta is None:
            check.fail("selection_delta", "given when public_keys are not and the budget is "
                                          "epsilon alone (selecting keys privately spends a "
                                          "delta, e.g. selection_delta=1e-6)", None)
        return check.open_unit_interval("selection_delta", selection_delta), None
    delta = check.open_unit_interval("delta", delta)
    if selection_delta is None:
        return delta / 2.0, delta / 2.0
    chosen = check.open_unit_interval("selection_delta", selection_delta)
    if not chosen < delta:
        check.fail("selection_delta", f"below delta ({delta:g}: the rest converts the key "
                                      f"budget)", chosen)
    return chosen, delta - chosen


def round_up(value: float, digits: int = 3) -> float:
    """`value` rounded up to `digits` significant digits (a minimum stated in a message)."""
    if not value > 0 or not math.isfinite(value):
        return value
    scale = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    return math.ceil(value / scale) * scale


def refuse_noise(budget: PrivacyBudget, error: NoiseTooLarge, what: str = "",
                 grid: bool = False):
    """Restate a mechanism's `NoiseTooLarge` in the user's budget, in one line: the smallest
    epsilon (or rho) whose discrete noise fits, from the parameter checked (proportional to
    1 / epsilon or 1 / rho: the key budget is a fixed fraction of the total)."""
    ratio = error.parameter / error.limit
    if budget.noise == LAPLACE:
        name, value, minimum = "epsilon", budget.epsilon, budget.epsilon * ratio
    elif budget.delta is None:
        name, value, minimum = "rho", budget.rho, budget.rho * ratio
    else:  # (epsilon, delta): the epsilon whose rho is large enough
        name, value = "epsilon", budget.epsilon
        minimum = epsilon_from_rho(budget.rho * ratio, budget.delta)
    check.fail(name, f">= {round_up(minimum):.3g} with these bounds ({what}{error.kind} noise "
                     f"parameter {error.parameter:.3g} > {error.limit:g}; or lower the bounds"
                     f"{', a coarser value_resolution' if grid else ''}, or noise='float')",
               value)
