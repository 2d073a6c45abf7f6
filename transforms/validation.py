"""The shared validators: every error, from a keyword argument to a YAML field, reads
"`name` must be <condition>; got <value>."."""
from __future__ import annotations

import math
import numbers


class ValidationError(ValueError):
    """A refused argument or config field (a ValueError with the project's one message shape)."""


class BadText(ValidationError):
    """Refused text that is not Unicode (a lone surrogate, which UTF-8 cannot encode): its dead
    letters' reasons start with `bad_text: `."""


def message(name: str, condition: str, value) -> str:
    return f"`{name}` must be {condition}; got {value!r}."


def fail(name: str, condition: str, value, error: type = ValidationError) -> None:
    raise error(message(name, condition, value))


POSITIVE_FINITE = "a positive finite number"
OPEN_UNIT_INTERVAL = "a number in (0, 1)"


def is_positive_finite(value) -> bool:
    return (not isinstance(value, bool) and isinstance(value, numbers.Real)
            and math.isfinite(value) and value > 0)


def is_in_open_unit_interval(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and 0 < value < 1


def positive_finite(name: str, value) -> float:
    if not is_positive_finite(value):
        fail(name, POSITIVE_FINITE, value)
    return float(value)


def finite_number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value):
        fail(name, "a finite number", value)
    return float(value)


def integer_at_least(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        fail(name, f"an integer >= {minimum}", value)
    return int(value)


def open_unit_interval(name: str, value) -> float:
    if not is_in_open_unit_interval(value):
        fail(name, OPEN_UNIT_INTERVAL, value)
    return float(value)


def one_of(name: str, value, allowed) -> None:
    if value not in allowed:
        fail(name, "one of " + ", ".join(repr(a) for a in allowed), value)


def one_of_str(name: str, text, allowed) -> str:
    """`one_of` for str fields: a value of another type is refused even when it compares
    equal."""
    if not isinstance(text, str) or text not in allowed:
        fail(name, "one of " + ", ".join(map(repr, allowed)), text)
    return text


def boolean(name: str, value) -> bool:
    if not isinstance(value, bool):
        fail(name, "True or False", value)
    return value
