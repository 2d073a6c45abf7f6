"""Streaming state of a continual-counting mechanism, and the exact-totals limit.

Every mechanism keeps a `CounterState` (steps released, exact running total: 17 bytes, Andersson et
al. 2026
Sec. 5's L z needs no stored noise, see `base`); the discrete square root keeps a
`HistoryState` (its input history). With discrete noise the data is integer and its running
total is summed in float64, exact only below 2^53 (`EXACT_LIMIT`, `first_inexact`).
"""
from __future__ import annotations

import dataclasses
import struct
from typing import ClassVar, Optional, Tuple

import numpy as np

from transforms import validation as check

# Integers of at most this magnitude convert to float64 exactly (the scalar step's fast path).
EXACT_INTEGER = 1 << 53
# Exact totals: float64 adds integers exactly while the result stays below 2^53 in magnitude
# (rounding is monotone: a computed sum of integer floats below 2^53 IS the exact sum, one at
# or beyond it may not be). With discrete noise every value, running total and released value
# of a CounterState mechanism must stay below it (`first_inexact`).
EXACT_LIMIT = 1 << 53
EXACT_LIMIT_TEXT = "2^53"
EXACT_FLOAT = float(EXACT_LIMIT)
OVER_LIMIT = (f"integers whose running totals stay below {EXACT_LIMIT_TEXT} in magnitude with "
               f"discrete noise (float64 adds integers exactly only below it)")


def first_inexact(running_total: float, values: np.ndarray,
                  totals: Optional[np.ndarray] = None) -> Optional[int]:
    """The first index i at which the integer float64 `values`, summed from `running_total`
    into `totals` (the cumulative float64 sums, as `advance` computes them; computed so if not
    given), may no longer be exact: `values[i]` or `totals[i]` has magnitude >= 2^53 (0 when
    `running_total` has); None when every value and total is below it, hence exact (by
    induction: an exact total plus an exact value, computed below 2^53, is exact).
    Vectorised: no per-element Python work."""
    if values.shape[0] == 0:
        return None
    if not -EXACT_FLOAT < running_total < EXACT_FLOAT:
        return 0
    if totals is None:
        totals = np.cumsum(np.concatenate(([running_total], values)))[1:]
    if max(float(np.max(np.abs(values))), float(np.max(np.abs(totals)))) < EXACT_FLOAT:
        return None
    over = (np.abs(values) >= EXACT_FLOAT) | (np.abs(totals) >= EXACT_FLOAT)
    return int(np.argmax(over))


@dataclasses.dataclass(frozen=True)
class CounterState:
    """Streaming state: number of steps released and the exact running total of the input
    (a float64: with discrete noise an integer of magnitude < 2^53, `EXACT_LIMIT`, which is
    where float64 holds and adds integers exactly; `advance` refuses others)."""
    steps: int = 0
    running_total: float = 0.0

    _FORMAT: ClassVar[struct.Struct] = struct.Struct("<BQd")
    _VERSION: ClassVar[int] = 1

    def to_bytes(self) -> bytes:
        return self._FORMAT.pack(self._VERSION, self.steps, self.running_total)

    @classmethod
    def from_bytes(cls, data: bytes) -> "CounterState":
        if not isinstance(data, (bytes, bytearray)) or len(data) != cls._FORMAT.size:
            check.fail("state bytes", f"{cls._FORMAT.size} bytes from CounterState.to_bytes",
                       data)
        version, steps, total = cls._FORMAT.unpack(bytes(data))
        if version != cls._VERSION:
            check.fail("state version", f"{cls._VERSION}", version)
        return counter_state(steps, total) if cls is CounterState else cls(steps, total)


_new_instance = object.__new__


def counter_state(steps: int, running_total: float) -> CounterState:
    """CounterState(steps, running_total) for the scalar step: the instance dict filled
    directly, as the frozen dataclass's __init__ does through object.__setattr__ (half its
    cost; equal, hashed and serialised alike)."""
    state = _new_instance(CounterState)
    fields = state.__dict__
    fields["steps"] = steps
    fields["running_total"] = running_total
    return state


@dataclasses.dataclass(frozen=True)
class HistoryState:
    """Streaming state of a mechanism whose release needs the input history (the discrete
    square root): steps released, the integer inputs x and the rounded integer R x / g so far.
    O(T) per key, as `pipelines.plan` says."""
    steps: int = 0
    inputs: Tuple[int, ...] = ()
    rounded: Tuple[int, ...] = ()

    _HEADER: ClassVar[struct.Struct] = struct.Struct("<BQ")
    _VERSION: ClassVar[int] = 2

    def to_bytes(self) -> bytes:
        body = np.array(self.inputs + self.rounded, dtype="<i8").tobytes()
        return self._HEADER.pack(self._VERSION, self.steps) + body

    @classmethod
    def from_bytes(cls, data: bytes) -> "HistoryState":
        data = bytes(data)
        if len(data) < cls._HEADER.size or (len(data) - cls._HEADER.size) % 16:
            check.fail("state bytes", "bytes from HistoryState.to_bytes", data[:16])
        version, steps = cls._HEADER.unpack(data[:cls._HEADER.size])
        values = np.frombuffer(data[cls._HEADER.size:], dtype="<i8").tolist()
        if version != cls._VERSION or len(values) != 2 * steps:
            check.fail("state version", f"{cls._VERSION} with 2 x steps values", version)
        return cls(steps, tuple(values[:steps]), tuple(values[steps:]))


def state_from_bytes(data: bytes):
    """A mechanism state from its bytes (CounterState v1 or HistoryState v2)."""
    if isinstance(data, (bytes, bytearray)) and data[:1] == bytes([HistoryState._VERSION]):
        return HistoryState.from_bytes(data)
    return CounterState.from_bytes(data)
