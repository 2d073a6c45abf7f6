"""How a release's budget is shared over the keys one unit can touch: the split (budget / m per
key) or the joint calibration (`Declaration.joint_mass`), and the auto choice of mechanism under
the calibration it would be released with. Imports no Beam.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

from transforms import validation as check
from transforms.mechanisms import MECHANISMS, NAMES, ConstantNoiseSource, make
from transforms.mechanisms.choose import (DEFAULT_MAX_STATE_BYTES_PER_KEY, check_state_budget,
                                           choose, evaluate, within_budget)
from transforms.mechanisms.privacy import PrivacyBudget
from transforms.mechanisms.sensitivity import joint_sensitivity
from transforms.streams.records import Declaration


SPLIT, JOINT = "split", "joint"
# The joint ratio S / J is rounded down by this relative margin, so that float rounding can never
# make a key's noise smaller than the joint calibration needs.
_RATIO_MARGIN = 2.0 ** -40


class Calibration(NamedTuple):
    """How the budget is shared over the keys one unit can touch (see `Declaration`)."""
    kind: str                      # "split" or "joint"
    key_privacy: dict              # the budget each key's mechanism is built with
    sensitivity: Optional[float]   # the key mechanism's own sensitivity S (S_{D,k}), if used
    joint_sensitivity: Optional[float] = None  # J of the concatenation over keys, if bounded


def calibrate(mechanism, declaration: Declaration, budget: PrivacyBudget,
              sensitivity: Optional[float] = None) -> Calibration:
    """The calibration with less noise for `mechanism` (built at any budget; only its R, its
    sensitivity S and its column norms are used): the split (budget / m per key) or, when the
    declaration bounds a unit's total over all keys (`joint_mass` M), the joint one.

    Joint (Declaration docstring, `sensitivity.joint_sensitivity`): the concatenation over the
    keys changes by at most J = M c_p (c_p the largest column l_p norm of R; plus the rounding
    term of the discrete square root), for ANY way the unit spreads its M over keys and steps,
    so node noise calibrated to J at the full budget covers all keys at once. A key's mechanism
    calibrates to its own S, so it gets the budget epsilon min(1, S/J) (rho min(1, S/J)^2),
    whose noise is that of J at the full budget. The split gives epsilon / m (rho / m); the
    larger key budget wins (same mechanism, so strictly less noise), ties keep the split: the
    result is never noisier than the split.
    """
    p = budget.sensitivity_norm
    split = split_privacy(declaration, budget)
    s = float(mechanism.sensitivity if sensitivity is None else sensitivity)
    if declaration.joint_mass is None or declaration.keys_per_unit == 1:
        return Calibration(SPLIT, split, s)  # m = 1: the split is the full budget already
    j = joint_sensitivity(mechanism, p, declaration.joint_mass, declaration.keys_per_unit)
    ratio = 1.0 if s >= j else (s / j) * (1.0 - _RATIO_MARGIN)
    joint = (declaration.joint_share(ratio, rho=budget.rho) if p == 2
             else declaration.joint_share(ratio, epsilon=budget.epsilon))
    (name, share), = joint.items()
    if share > split[name]:
        return Calibration(JOINT, joint, s, j)
    return Calibration(SPLIT, split, s, j)


def full_privacy(budget: PrivacyBudget) -> dict:
    """The whole budget in the mechanism's terms (epsilon for Laplace, rho for Gaussian)."""
    return {"epsilon": budget.epsilon} if budget.noise == "laplace" else {"rho": budget.rho}


def split_privacy(declaration: Declaration, budget: PrivacyBudget) -> dict:
    """Each key's budget under the split: the total over the keys one unit can touch."""
    return (declaration.budget_share(epsilon=budget.epsilon) if budget.noise == "laplace"
            else declaration.budget_share(rho=budget.rho))


def choose_calibrated(horizon: int, budget: PrivacyBudget, declaration: Declaration,
                      metric: str = "max", noise: str = "discrete",
                      max_state_bytes: Optional[int] = DEFAULT_MAX_STATE_BYTES_PER_KEY):
    """(best, rows): every candidate's exact errors under the calibration it would be released
    with (the split over `keys_per_unit`, or the joint one: `calibrate`), for the auto choice
    and `pipelines.plan`. Each row's `calibration` says which; `best` is the lowest error among
    the rows whose per-key state (`state_bytes`) fits `max_state_bytes` (None: no cap), `rows`
    holds every candidate."""
    if max_state_bytes is not None:
        check_state_budget(max_state_bytes)
    k, d = declaration.max_contributions, declaration.interval_bound
    split = split_privacy(declaration, budget)
    order = (lambda c: (c.max_se, c.mean_se)) if metric == "max" else (
        lambda c: (c.mean_se, c.max_se))
    if declaration.joint_mass is None or declaration.keys_per_unit == 1:
        _, rows = choose(horizon, split, k, d, metric, noise=noise)
        rows = [dataclasses.replace(r, calibration=SPLIT) for r in rows]
        return min(within_budget(rows, max_state_bytes), key=order), rows
    full = full_privacy(budget)
    _, full_rows = choose(horizon, full, k, d, metric, noise=noise)
    split_rows, rows = None, []
    for row in full_rows:
        probe = make(row.mechanism, horizon, **full, max_contributions=k, interval_bound=d,
                     noise_source=ConstantNoiseSource(0.0), noise=noise, **row.params)
        calibration = calibrate(probe, declaration, budget, row.sensitivity)
        if calibration.kind == JOINT and calibration.key_privacy == full:
            rows.append(dataclasses.replace(row, calibration=JOINT))
        elif calibration.kind == JOINT:
            rows += [dataclasses.replace(r, calibration=JOINT) for r in evaluate(
                horizon, calibration.key_privacy, k, d,
                specs=[(row.mechanism, dict(row.params))], noise=noise)]
        else:
            if split_rows is None:
                split_rows = choose(horizon, split, k, d, metric, noise=noise)[1]
            rows += [dataclasses.replace(r, calibration=SPLIT) for r in split_rows
                     if r.mechanism == row.mechanism and r.params == row.params]
    return min(within_budget(rows, max_state_bytes), key=order), rows


HORIZON_FREE_PROBE = 1 << 12  # steps the auto choice compares horizon-free mechanisms over


def choose_horizon_free(budget: PrivacyBudget, declaration: Declaration, noise: str) -> str:
    """The auto choice for steps with no horizon: among the mechanisms whose output at step t
    does not depend on the horizon (`horizon_free`) and that accept this budget and noise, the
    one with the lowest largest stddev at the steps t = 2^j <= 2^12 (each calibrated as its
    release would be: `calibrate` on the split budget). Refused under pure DP (none has a
    pure-DP calibration)."""
    if budget.noise == "laplace":
        check.fail("privacy", "rho, or epsilon and delta, for steps with no horizon (no "
                              "horizon-free mechanism has a pure-DP calibration)",
                   "epsilon alone")
    k, d = declaration.max_contributions, declaration.interval_bound
    steps = [(1 << j) - 1 for j in range(HORIZON_FREE_PROBE.bit_length())]
    errors = {}
    for name in (n for n in NAMES if MECHANISMS[n].horizon_free):
        try:
            probe = make(name, HORIZON_FREE_PROBE, **full_privacy(budget), max_contributions=k,
                         interval_bound=d, noise_source=ConstantNoiseSource(0.0), noise=noise)
        except ValueError:  # (this noise or budget is not one it takes)
            continue
        key_privacy = calibrate(probe, declaration, budget).key_privacy
        mechanism = make(name, HORIZON_FREE_PROBE, **key_privacy, max_contributions=k,
                         interval_bound=d, noise_source=ConstantNoiseSource(0.0), noise=noise)
        errors[name] = float(max(mechanism.noise_std()[steps]))
    return min(sorted(errors), key=errors.get)
