"""Input records, dead letters and the privacy declaration every difference stream carries.

Time steps are t = 0..T-1. An update inserts (`+`) or deletes (`-`) an item or an undirected edge
at a step. Malformed records are never raised mid-stream and never dropped silently: they come
back as DeadLetter(record, reason), the reason a `Reason`: its text with a stable code (`CODES`).
"""
from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Optional, Tuple

INSERT, DELETE = "+", "-"
OPS = (INSERT, DELETE)


# Stable dead-letter codes: summaries count by code, the reason's text gives the detail.
# INPUT_CODES are records that are not well-formed for this job (the garbage gate counts them).
CODES = {
    "unparseable": "a line or row that its format cannot read (JSON, CSV, Parquet)",
    "bad_text": "text that is not Unicode (a lone surrogate)",
    "missing_field": "a row without a mapped field",
    "bad_timestamp": "a time that is missing, unreadable or not finite",
    "bad_value": "a mapped field whose value has the wrong type or is not finite",
    "invalid_record": "an element of the wrong shape, an invalid id, op or edge",
    "outside_horizon": "an event time outside the release's steps",
    "bad_message": "a Pub/Sub message without a readable timestamp attribute, or a heartbeat "
                   "with data",
    "late": "an event of a step already processed or released (streaming)",
    "not_public_key": "a step total of a key not in public_keys (streaming)",
    "bound_violation": "a unit's update breaking a declared bound: the unit halts (fail closed)",
    "exact_totals": "a key whose exact total would reach 2^53: the key halts (fail closed)",
}
INPUT_CODES = frozenset(("unparseable", "bad_text", "missing_field", "bad_timestamp",
                         "bad_value", "invalid_record", "outside_horizon", "bad_message"))


class Reason(str):
    """A dead letter's reason: its text (the detail, a str as before) with its stable `code`.

    >>> reason = Reason("outside_horizon", "event time 2026-03-08T00:00:00Z is outside ...")
    >>> reason.code, reason.startswith("event time")
    ('outside_horizon', True)
    """

    def __new__(cls, code: str, detail: str):
        if code not in CODES:
            raise ValueError(f"`code` must be one of {sorted(CODES)}; got {code!r}.")
        text = super().__new__(cls, detail)
        text.code = code
        return text

    def __reduce__(self):
        return Reason, (self.code, str(self))


def _invalid(detail: str) -> Reason:
    return Reason("invalid_record", detail)


def _step_reason(step, horizon: int) -> Reason:
    """An integer step outside [0, T) is `outside_horizon`; any other step is invalid."""
    integer = isinstance(step, numbers.Integral) and not isinstance(step, bool)
    return Reason("outside_horizon" if integer else "invalid_record",
                  f"step must be an integer in [0, {horizon}); got {step!r}")


def code_of(reason) -> str:
    """The stable code of a reason; a plain text (an error's message) is `invalid_record`."""
    return getattr(reason, "code", "invalid_record")


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    record: Any
    reason: str

    @property
    def code(self) -> str:
        return code_of(self.reason)


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What one protected unit can change, for the release to calibrate against.

    Each public key's difference stream changes by a vector of S_{D,k} (`interval_bound` D,
    `max_contributions` k), and one unit touches at most `keys_per_unit` keys m.

    Two calibrations over the keys (`transforms.calibration.calibrate` takes the one with less
    noise for the mechanism at hand, never more than the split):
    - "split" (valid for any m keys): each key's counter gets 1/m of the budget (epsilon / m
      under pure DP, rho / m under zCDP) and is calibrated to its own S_{D,k} sensitivity S;
      the m releases compose.
    - "joint" (only with `joint_mass` M): when a unit's changes to ALL keys together have
      total l1 <= M (ContinualCount / ContinualSum: `max_contributions` is one cap over the
      horizon across keys), the concatenation of the keys' node vectors has sensitivity
      J <= M x (largest column l_p norm of R) (`sensitivity.joint_sensitivity`), so i.i.d. node
      noise calibrated to J at the FULL budget is private for all keys at once. A key's counter
      then runs with the budget whose S-calibrated noise equals that: epsilon min(1, S/J) or
      rho min(1, S/J)^2 (`joint_share`). For every linear mechanism S >= k x column norm = J on
      S_{k,k} (k e_t is in S_{k,k}), so a key gets the full budget: m times less Laplace scale
      and sqrt(m) times less Gaussian sigma than the split.
    Count-distinct, degree counts and declared releases bound each key separately (their
    budgets are per key): no `joint_mass`, always the split.
    """
    interval_bound: int
    max_contributions: int
    keys_per_unit: int
    unit: str
    restricted_to: Optional[str] = None  # TriangleCount: privacy only for bounded graphs
    joint_mass: Optional[float] = None   # total l1 of a unit's changes over all keys, if bounded

    def budget_share(self, epsilon=None, rho=None) -> dict:
        """The split: 1/keys_per_unit of the budget per key."""
        if rho is not None:
            return {"rho": rho / self.keys_per_unit}
        return {"epsilon": epsilon / self.keys_per_unit}

    def joint_share(self, ratio: float, epsilon=None, rho=None) -> dict:
        """The joint calibration's per-key budget: with the key mechanism's own sensitivity S
        and the joint sensitivity J, `ratio` = min(1, S / J); the key's noise, calibrated to S at
        this budget, is the noise calibrated to J at the full budget (or more)."""
        if self.joint_mass is None:
            raise ValueError("joint calibration needs a joint_mass (a cap across keys)")
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"ratio must be in (0, 1]; got {ratio!r}")
        if rho is not None:
            return {"rho": rho * ratio * ratio if ratio < 1.0 else rho}
        return {"epsilon": epsilon * ratio if ratio < 1.0 else epsilon}


def canonical(value) -> tuple:
    """A total order on heterogeneous keys that does not depend on hashing or the process."""
    return type(value).__name__, repr(value)


ID_INT_LIMIT = 10 ** 1000  # int ids have at most 1,000 digits (any int prints, hashes, encodes)
ID_DEPTH = 16  # tuple ids nest at most this deep ((graph, node) is 1)
BAD_TEXT = "bad_text"  # the code of a dead letter holding text that is not Unicode
TEXT_CONDITION = "valid Unicode text (no lone surrogates)"


def is_text(value: str) -> bool:
    """Whether a str is Unicode text: Unicode scalar values only, so that UTF-8 (and every coder
    and sink) can encode it. A lone surrogate (e.g. from the JSON escape "\\ud800") is not."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_id(candidate, _depth: int = 0) -> bool:
    """The one id rule for units, items, keys and edge endpoints: a non-empty str of Unicode
    text (`is_text`), an int (not a bool) of at most 1,000 digits, or a tuple of ids (e.g.
    (graph, node), nested at most `ID_DEPTH` deep)."""
    if isinstance(candidate, str):
        return candidate != "" and (candidate.isascii() or is_text(candidate))
    if isinstance(candidate, tuple):
        return 0 < len(candidate) and _depth < ID_DEPTH and all(
            is_id(part, _depth + 1) for part in candidate)
    return isinstance(candidate, int) and not isinstance(candidate, bool) and \
        -ID_INT_LIMIT < candidate < ID_INT_LIMIT


def plain_id(candidate):
    """An id (`is_id`) as its exact type: a str or int subclass (numpy's str_, an IntEnum) as
    the str or int it equals, a tuple's parts too, so that one unit or key is one value
    whatever type carried it (its hash bucket, its canonical order, its coder's bytes).

    >>> import enum
    >>> class Code(enum.IntEnum):
    ...     A = 7
    >>> plain_id((Code.A, "x")), type(plain_id(Code.A)).__name__
    ((7, 'x'), 'int')
    """
    kind = type(candidate)
    if kind is str or kind is int:
        return candidate
    if isinstance(candidate, str):
        return str.__str__(candidate)  # an exact str copy of a subclass (CPython's unicode_str)
    if isinstance(candidate, tuple):
        return tuple(plain_id(part) for part in candidate)
    return int.__int__(candidate)


def shown(value, limit: int = 200) -> str:
    """A value's repr for a reason: at most `limit` characters, never raising (a repr that
    fails or recurses too deep shows the type)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 (any repr failure of a bad record: show its type)
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def label(text: str, limit: int = 24) -> str:
    """A name in a one-line message (a column, a key): as it is, or its repr when blanks or
    unprintable characters would hide what it is; at most `limit` characters (`shown`'s cut)."""
    plain = text if text and text.isprintable() and text.strip() == text else repr(text)
    return plain if len(plain) <= limit else plain[:limit - 3] + "..."


def not_id_reason(what: str, given) -> str:
    """Why `given` is not an id, as a dead-letter reason ("unit id", "key", "item id")."""
    if isinstance(given, str) and given and not is_text(given):
        return Reason(BAD_TEXT, f"{BAD_TEXT}: {what} must be {TEXT_CONDITION}; got "
                                f"{shown(given)}")
    if isinstance(given, int) and not isinstance(given, bool):
        return Reason("invalid_record", f"{what} must be a non-empty str or int of at most "
                                        f"1,000 digits")
    return Reason("invalid_record", f"{what} must be a non-empty str or int")


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
        return None, DeadLetter(record, _invalid("record must be (step, op, entity) or "
                                                  "(step, op, entity, key)"))
    step, op, entity = record[0], record[1], record[2]
    key = record[3] if len(record) == 4 else None
    if not _is_step(step, horizon):
        return None, DeadLetter(record, _step_reason(step, horizon))
    if op not in OPS:
        return None, DeadLetter(record, _invalid(f"op must be '+' or '-'; got {op!r}"))
    if edge:
        if not isinstance(entity, (tuple, list)) or len(entity) != 2:
            return None, DeadLetter(record, _invalid(f"edge must be a pair (a, b); got "
                                                      f"{entity!r}"))
        a, b = entity
        if not (is_id(a) and is_id(b)):
            return None, DeadLetter(record, _invalid("edge endpoints must be non-empty str or "
                                                      "int ids"))
        if a == b:
            return None, DeadLetter(record, _invalid(f"self-loop ({a!r}, {b!r}) is not an edge"))
        entity = canonical_edge(a, b)
    elif not is_id(entity):
        return None, DeadLetter(record, _invalid("item id must be a non-empty str or int"))
    if key is not None and not is_id(key):
        return None, DeadLetter(record, _invalid("key must be a non-empty str or int"))
    return (step, op, entity, key), None


def validate_event(record: Any, horizon: int, *, with_value: bool):
    """(step, unit, key, value) for counts/sums, or a DeadLetter."""
    size = 4 if with_value else 3
    if not isinstance(record, (tuple, list)) or len(record) != size:
        shape = "(step, unit, key, value)" if with_value else "(step, unit, key)"
        return None, DeadLetter(record, _invalid(f"record must be {shape}"))
    step, unit, key = record[0], record[1], record[2]
    value = record[3] if with_value else 1
    if not _is_step(step, horizon):
        return None, DeadLetter(record, _step_reason(step, horizon))
    if not is_id(unit):
        return None, DeadLetter(record, _invalid("unit id must be a non-empty str or int"))
    if not is_id(key):
        return None, DeadLetter(record, _invalid("key must be a non-empty str or int"))
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or value != value or value in (float("inf"), float("-inf"))):
        return None, DeadLetter(record, Reason("bad_value", f"value must be a finite number; got "
                                                            f"{value!r}"))
    return (step, unit, key, float(value) if with_value else 1), None
