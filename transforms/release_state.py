"""The state of one key in the streaming release (`streaming.ReleaseStreamingFn`), as compact
bytes: the sealed mechanism state, the steps released, the halt step and the pending exact
step sums (`ReleaseStateCoder`).
"""
from __future__ import annotations

import struct
from typing import Dict

import apache_beam as beam


def _partials_struct(count: int) -> struct.Struct:
    """(step, count, count float64 partials) of one pending step (cached per count)."""
    found = _PARTIALS.get(count)
    if found is None:
        found = _PARTIALS[count] = struct.Struct("<II%dd" % count)
    return found


_PARTIALS: Dict[int, struct.Struct] = {}


class ReleaseStateCoder(beam.coders.Coder):
    """`ReleaseStreamingFn`'s state of one key, (sealed mechanism state or None, steps
    released, halt step or None, pending exact sums {step: [partials]}), as compact bytes:
    a header (steps released, halt step or -1, sealed length or -1, number of pending steps),
    the sealed bytes, then per pending step (step, number of partials, the partials as
    float64: exact, so the sums stay exact). Steps fit 31 bits (struct refuses others)."""

    _HEAD = struct.Struct("<IiiI")
    _ENTRY = struct.Struct("<II")
    # the common layouts in one struct call: a sealed CounterState (33 bytes) and one pending
    # step with one partial (or none)
    _ONE = struct.Struct("<IiiI33sIId")
    _NONE = struct.Struct("<IiiI33s")

    def encode(self, value) -> bytes:
        sealed, released, halted, pending = value
        if sealed is not None and len(sealed) == 33 and len(pending) <= 1:
            halt = -1 if halted is None else halted
            if not pending:
                return self._NONE.pack(released, halt, 33, 0, sealed)
            (step, partials), = pending.items()
            if len(partials) == 1:
                return self._ONE.pack(released, halt, 33, 1, sealed, step, 1, partials[0])
        head = self._HEAD.pack(released, -1 if halted is None else halted,
                               -1 if sealed is None else len(sealed), len(pending))
        if sealed is not None:
            head += sealed
        if not pending:
            return head
        parts = [head]
        for step, partials in pending.items():
            count = len(partials)
            parts.append(_partials_struct(count).pack(step, count, *partials))
        return b"".join(parts)

    def decode(self, encoded: bytes):
        if type(encoded) is not bytes:
            encoded = bytes(encoded)
        if len(encoded) == 65:  # = self._ONE.size
            released, halted, size, count, sealed, step, n, value = self._ONE.unpack(encoded)
            if size == 33 and count == 1 and n == 1:
                return sealed, released, None if halted < 0 else halted, {step: [value]}
        released, halted, size, count = self._HEAD.unpack_from(encoded)
        at = 16  # self._HEAD.size
        sealed = None
        if size >= 0:
            sealed, at = encoded[at:at + size], at + size
        pending = {}
        if count:
            entry = self._ENTRY.unpack_from
            for _ in range(count):
                step, n = entry(encoded, at)
                layout = _partials_struct(n)
                pending[step] = list(layout.unpack_from(encoded, at)[2:])
                at += layout.size
        return sealed, released, None if halted < 0 else halted, pending

    def is_deterministic(self) -> bool:
        return True
