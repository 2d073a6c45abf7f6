"""Privacy units, immutable privacy-cost records and conversions (like dp_accounting's DpEvents).

- `PureDp(epsilon)`: Laplace noise calibrated to the l1 sensitivity.
- `Zcdp(rho)`: Gaussian noise calibrated to the l2 sensitivity.
- `LaplaceRelease(l1, l2, scale)`: a Laplace release whose (epsilon, delta) guarantee also uses
  the l2 sensitivity (Andersson et al. 2024 Thm 1.3):
  epsilon(delta) = min(l1 / b, (l2 / b) (l2 / (2 b) + sqrt(2 ln(1/delta)))).
Composition is explicit: `compose(events)` adds epsilons of pure-DP events and rhos of zCDP
events (DegreeCount's two endpoints: two Zcdp(rho/2) events compose to Zcdp(rho)).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Union

from transforms import validation as check
from .privacy import epsilon_from_rho


@dataclasses.dataclass(frozen=True)
class PureDp:
    epsilon: float

    def __post_init__(self):
        check.positive_finite("epsilon", self.epsilon)

    def epsilon_at(self, delta: float) -> float:
        return self.epsilon


@dataclasses.dataclass(frozen=True)
class Zcdp:
    rho: float

    def __post_init__(self):
        check.positive_finite("rho", self.rho)

    def epsilon_at(self, delta: float) -> float:
        """(epsilon, delta)-DP implied by rho-zCDP: rho + 2 sqrt(rho ln(1/delta))."""
        return epsilon_from_rho(self.rho, delta)


@dataclasses.dataclass(frozen=True)
class LaplaceRelease:
    """Laplace noise of scale b on a query with l1 / l2 sensitivities (Andersson et al. 2024 Thm
    1.3)."""
    l1_sensitivity: float
    l2_sensitivity: float
    scale: float

    def __post_init__(self):
        check.positive_finite("l1_sensitivity", self.l1_sensitivity)
        check.positive_finite("l2_sensitivity", self.l2_sensitivity)
        check.positive_finite("scale", self.scale)
        if self.l2_sensitivity > self.l1_sensitivity * (1 + 1e-12):
            check.fail("l2_sensitivity", "<= l1_sensitivity", self.l2_sensitivity)

    @property
    def pure(self) -> PureDp:
        return PureDp(self.l1_sensitivity / self.scale)

    def epsilon_at(self, delta: float) -> float:
        check.open_unit_interval("delta", delta)
        ratio = self.l2_sensitivity / self.scale
        return min(self.l1_sensitivity / self.scale,
                   ratio * (ratio / 2.0 + math.sqrt(2.0 * math.log(1.0 / delta))))


Event = Union[PureDp, Zcdp]


def compose(events: Iterable[Event]) -> Event:
    """Sequential composition of events of one kind (pure DP or zCDP)."""
    events = list(events)
    if not events:
        check.fail("events", "a non-empty list of PureDp or Zcdp", events)
    if all(isinstance(e, PureDp) for e in events):
        return PureDp(math.fsum(e.epsilon for e in events))
    if all(isinstance(e, Zcdp) for e in events):
        return Zcdp(math.fsum(e.rho for e in events))
    check.fail("events", "all PureDp or all Zcdp (convert first)", events)


def pure_to_zcdp(event: PureDp) -> Zcdp:
    """epsilon-DP implies (epsilon^2 / 2)-zCDP (Bun & Steinke 2016, Prop. 1.4)."""
    return Zcdp(event.epsilon ** 2 / 2.0)


def split(event: Event, parts: int) -> Event:
    """The per-part budget such that `parts` copies compose to `event`."""
    check.integer_at_least("parts", parts, 1)
    if isinstance(event, PureDp):
        return PureDp(event.epsilon / parts)
    return Zcdp(event.rho / parts)
