"""Input records, dead letters and the privacy declaration every difference stream carries.

Time steps are t = 0..T-1. An update inserts (`+`) or deletes (`-`) an item or an undirected edge
at a step. Malformed records are never raised mid-stream and never dropped silently: they come
back as DeadLetter(record, reason).
"""
from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Hashable, Optional, Tuple

INSERT, DELETE = "+", "-"
OPS = (INSERT, DELETE)


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    record: Any
    reason: str


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What one protected unit can change, for the release to calibrate against.

    Each public key's difference stream changes by a vector of S_{D,k} (`interval_bound` D,
    `max_contributions` k), and one unit touches at most `keys_per_unit` keys. The release
    composes over those keys explicitly: each key's counter gets 1/keys_per_unit of the budget
    (epsilon / m under pure DP, rho / m under zCDP), which is valid for any m keys.
    """
    interval_bound: int
    max_contributions: int
    keys_per_unit: int
    unit: str
    restricted_to: Optional[str] = None  # TriangleCount: privacy only for bounded graphs

    def budget_share(self, epsilon=None, rho=None) -> dict:
        if rho is not None:
            return {"rho": rho / self.keys_per_unit}
        return {"epsilon": epsilon / self.keys_per_unit}


def canonical_edge(a, b) -> tuple:
    """An undirected edge with its endpoints in a fixed order, (a, b) == (b, a)."""
    try:
        return (a, b) if a <= b else (b, a)
    except TypeError:
        return tuple(sorted((a, b), key=lambda n: (type(n).__name__, repr(n))))


def _is_step(value, horizon: int) -> bool:
    return (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and 0 <= value < horizon)


def validate_update(record: Any, horizon: int, *, edge: bool) -> Tuple[Optional[tuple],
                                                                        Optional[DeadLetter]]:
    """(step, op, entity, key) or a DeadLetter.

    Records are tuples (step, op, item[, key]) for items and (step, op, (a, b)[, key]) for edges;
    an edge is stored with its endpoints sorted, so (a, b) and (b, a) are the same edge.
    """
    if not isinstance(record, (tuple, list)) or len(record) not in (3, 4):
        return None, DeadLetter(record, "record must be (step, op, entity) or "
                                        "(step, op, entity, key)")
    step, op, entity = record[0], record[1], record[2]
    key = record[3] if len(record) == 4 else None
    if not _is_step(step, horizon):
        return None, DeadLetter(record, f"step must be an integer in [0, {horizon}); got {step!r}")
    if op not in OPS:
        return None, DeadLetter(record, f"op must be '+' or '-'; got {op!r}")
    if edge:
        if not isinstance(entity, (tuple, list)) or len(entity) != 2:
            return None, DeadLetter(record, f"edge must be a pair (a, b); got {entity!r}")
        a, b = entity
        if a is None or b is None:
            return None, DeadLetter(record, "edge endpoint is missing")
        if a == b:
            return None, DeadLetter(record, f"self-loop ({a!r}, {b!r}) is not an edge")
        if not isinstance(a, Hashable) or not isinstance(b, Hashable):
            return None, DeadLetter(record, "edge endpoints must be hashable ids")
        entity = canonical_edge(a, b)
    else:
        if entity is None or entity == "":
            return None, DeadLetter(record, "item id is missing")
        if not isinstance(entity, Hashable):
            return None, DeadLetter(record,
                                    f"item id must be hashable; got {type(entity).__name__}")
    if not isinstance(key, Hashable):
        return None, DeadLetter(record, f"key must be hashable; got {type(key).__name__}")
    return (step, op, entity, key), None


def validate_event(record: Any, horizon: int, *, with_value: bool):
    """(step, unit, key, value) for counts/sums, or a DeadLetter."""
    size = 4 if with_value else 3
    if not isinstance(record, (tuple, list)) or len(record) != size:
        shape = "(step, unit, key, value)" if with_value else "(step, unit, key)"
        return None, DeadLetter(record, f"record must be {shape}")
    step, unit, key = record[0], record[1], record[2]
    value = record[3] if with_value else 1
    if not _is_step(step, horizon):
        return None, DeadLetter(record, f"step must be an integer in [0, {horizon}); got {step!r}")
    if unit is None or unit == "":
        return None, DeadLetter(record, "unit id is missing")
    if key is None:
        return None, DeadLetter(record, "key is missing")
    if not isinstance(unit, Hashable) or not isinstance(key, Hashable):
        return None, DeadLetter(record, "unit and key must be hashable")
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or value != value or value in (float("inf"), float("-inf"))):
        return None, DeadLetter(record, f"value must be a finite number; got {value!r}")
    return (step, unit, key, float(value) if with_value else 1), None
