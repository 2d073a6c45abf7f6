"""Plain continual count / sum per public key with per-unit contribution caps.

Each privacy unit (user) contributes at most `max_contributions_per_step` events (for sums: value
mass, each value clamped to [0, `max_value`]) per step and `max_contributions` over the whole
horizon, across all keys, to at most `max_keys_per_unit` keys. Deterministic drops:
- keys: a unit keeps the first `max_keys_per_unit` keys it uses, by step of first use, ties in
  canonical key order; events for other keys are dropped;
- events within a step: taken in canonical (key, value) order until a cap is reached; for sums
  the event that crosses a cap is cut to what is left.
One unit then changes each key's difference stream by a non-negative vector with l1 <= k, hence
interval sums <= k: S_{k,k} (not the alternating S_{1,k}), on at most max_keys_per_unit keys.
Both caps hold across keys (`used` and the step's total are one budget per unit, not per key):
the unit's vectors v_1..v_m satisfy sum_j ||v_j||_1 <= k and sum_j v_j[t] <= per-step cap, which
is what the joint calibration over keys uses (`Declaration.joint_mass` = k, see records.py).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

from transforms import validation as check

from .records import canonical


@dataclasses.dataclass(frozen=True)
class UnitState:
    used: float = 0.0
    keys: Tuple[Hashable, ...] = ()


# what cut a dropped event, named by its bound (operator-only counts: they depend on the data)
KEY_CAP, HORIZON_CAP, STEP_CAP = ("max_keys_per_unit", "max_contributions",
                                  "max_contributions_per_step")


@dataclasses.dataclass(frozen=True)
class ContributionBounds:
    max_contributions: int
    max_contributions_per_step: Optional[int] = None
    max_keys_per_unit: int = 1
    max_value: Optional[float] = None  # sums only

    def __post_init__(self):
        check.integer_at_least("max_contributions", self.max_contributions, 1)
        if self.max_contributions_per_step is not None:
            check.integer_at_least("max_contributions_per_step",
                                   self.max_contributions_per_step, 1)
        check.integer_at_least("max_keys_per_unit", self.max_keys_per_unit, 1)
        if self.max_value is not None:
            check.positive_finite("max_value", self.max_value)

    @property
    def per_step(self) -> float:
        cap = self.max_contributions_per_step
        return float(self.max_contributions if cap is None else min(cap, self.max_contributions))

    def step(self, state: UnitState, events: Sequence[Tuple[Hashable, float]]
             ) -> Tuple[Dict[Hashable, float], UnitState, List[Tuple[Hashable, float, str]]]:
        """One unit's events of one step -> (contribution per key, new state, dropped events
        as (key, value, the bound that cut it: KEY_CAP, HORIZON_CAP or STEP_CAP))."""
        keys = list(state.keys)
        for key in sorted({key for key, _ in events}, key=canonical):
            if key not in keys and len(keys) < self.max_keys_per_unit:
                keys.append(key)
        out: Dict[Hashable, float] = {}
        dropped = []
        step_used, used = 0.0, state.used
        for key, value in sorted(events, key=lambda e: (canonical(e[0]), e[1])):
            if key not in keys:
                dropped.append((key, value, KEY_CAP))
                continue
            amount = value if self.max_value is None else min(max(value, 0.0), self.max_value)
            step_room, horizon_room = self.per_step - step_used, self.max_contributions - used
            room = min(step_room, horizon_room)
            take = min(amount, room) if self.max_value is not None else (
                amount if amount <= room else 0.0)
            if take <= 0:
                dropped.append((key, value, HORIZON_CAP if horizon_room <= step_room
                                else STEP_CAP))
                continue
            out[key] = out.get(key, 0.0) + take
            step_used += take
            used += take
        return out, UnitState(used, tuple(keys)), dropped
