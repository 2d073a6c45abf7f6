"""Key states in a streaming release's step checkpoints, with growing histories compacted.

A discrete square-root mechanism (`sqrt_toeplitz`, `log_sqrt_toeplitz`) keeps each key's input
history (`HistoryState`: 16 B per step), and every step's checkpoint holds every key's state
(`transforms.stream_checkpoint`): whole, the checkpoints of t steps would hold O(keys x t^2)
bytes (a release with no horizon never stops growing). A key whose sealed history advanced by
exactly the checkpoint's step is written as that step's own entry instead (its tag, x_t,
round(R x / g)_t and a digest of the whole sealed state); a continuation, which reads every
checkpoint from step 0 in order (each MAC'd), appends the entries to rebuild the same sealed
bytes, and refuses them unless they have the last entry's digest (a chain whose steps two
executions wrote from different histories is never resumed as a mix of them). Any other state (a counter, a
halted key, a history that did not advance by one step) is written whole, and starts its key's
history again.

    >>> from transforms.mechanisms.state import HistoryState
    >>> tag = bytes(16)
    >>> states = [(tag + HistoryState(s + 1, tuple(range(s + 1)), tuple(range(s + 1))).to_bytes())
    ...           for s in range(3)]
    >>> written = [compacted([("k", (states[s], None))], s) for s in range(3)]
    >>> written[2][0][1][:4] == ("history", tag, 2, 2)
    True
    >>> histories = Histories()
    >>> for step, entries in enumerate(written):
    ...     histories.add(step, entries)
    >>> histories.states() == {"k": (states[2], None)}
    True
"""
from __future__ import annotations

import hashlib
import struct
from array import array
from typing import Dict, List, Tuple

from transforms.mechanisms.state import HistoryState
from transforms.validation import fail

ENTRY = "history"  # a compacted key state: ("history", tag, x_t, rounded_t, digest)
TAG = 16  # a sealed state's release/secret/key tag (`RecordMaker.seal`)
_HEADER = HistoryState._HEADER
_VALUE = struct.Struct("<q")


def _step_entry(data: bytes, step: int):
    """(tag, x_step, rounded_step) of a sealed HistoryState that holds exactly steps 0 ..
    `step`, else None."""
    if len(data) < TAG + _HEADER.size or data[TAG] != HistoryState._VERSION:
        return None
    version, steps = _HEADER.unpack_from(data, TAG)
    if steps != step + 1 or len(data) != TAG + _HEADER.size + 16 * steps:
        return None
    body = TAG + _HEADER.size
    return (data[:TAG], _VALUE.unpack_from(data, body + 8 * step)[0],
            _VALUE.unpack_from(data, body + 8 * (steps + step))[0], digest(data))


def digest(data: bytes) -> bytes:
    """16 bytes of the whole sealed state's SHA-256."""
    return hashlib.sha256(data).digest()[:16]


def compacted(key_states: List[tuple], step: int) -> List[tuple]:
    """`key_states` ((key, (sealed, halted)) pairs after step `step`) as the step's checkpoint
    holds them: a history that advanced to exactly `step` as its step entry, the rest whole."""
    out = []
    for key, value in key_states:
        entry = None
        if len(value) == 2 and value[1] is None and isinstance(value[0], bytes):
            entry = _step_entry(value[0], step)
        out.append((key, value) if entry is None else (key, (ENTRY,) + entry))
    return out


class Histories:
    """The keys' whole states, rebuilt step by step from checkpoints read in step order."""

    def __init__(self):
        self._histories: Dict[object, Tuple[bytes, array, array]] = {}
        # key -> ("whole", its value) or ("history", the last entry's digest)
        self._last: Dict[object, tuple] = {}

    def add(self, step: int, entries: List[tuple]) -> None:
        """The entries of `step`'s checkpoint (a step entry is refused unless its key's
        history holds exactly the steps before `step`)."""
        self._last = {}
        for key, value in entries:
            if len(value) == 5 and value[0] == ENTRY:
                _, tag, x, rounded, last = value
                found = self._histories.get(key)
                if found is None and step == 0:  # its first step
                    found = self._histories[key] = (tag, array("q"), array("q"))
                if found is None or found[0] != tag or len(found[1]) != step:
                    fail("checkpoint", f"holding key {key!r}'s history before step {step}",
                         "a step entry without it")
                found[1].append(x)
                found[2].append(rounded)
                self._last[key] = (ENTRY, last)
                continue
            self._last[key] = ("whole", value)
            self._histories.pop(key, None)
            data = value[0] if isinstance(value[0], bytes) else b""
            if data[TAG:TAG + 1] == bytes([HistoryState._VERSION]):
                state = HistoryState.from_bytes(data[TAG:])
                self._histories[key] = (data[:TAG], array("q", state.inputs),
                                        array("q", state.rounded))

    def states(self) -> dict:
        """{key: its whole value} after the last step added."""
        whole = {}
        for key, (kind, value) in self._last.items():
            if kind == ENTRY:  # HistoryState.to_bytes, from the arrays (little-endian int64)
                tag, inputs, rounded = self._histories[key]
                data = tag + _HEADER.pack(HistoryState._VERSION, len(inputs)) + \
                    _little(inputs) + _little(rounded)
                if digest(data) != value:
                    fail("checkpoint", f"holding key {key!r}'s history as its last step wrote "
                                       f"it (its digest)", "steps written from another")
                value = (data, None)
            whole[key] = value
        return whole


def _little(values: array) -> bytes:
    if struct.pack("=q", 1) != struct.pack("<q", 1):  # (a big-endian machine)
        values = array("q", values)
        values.byteswap()
    return values.tobytes()
