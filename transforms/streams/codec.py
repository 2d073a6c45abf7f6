"""A JSON codec for the per-unit and per-key states that checkpoints store (no pickle).

Checkpoints may live in a bucket that others can write; unpickling such a file runs whatever
code it names. This codec only rebuilds plain values (None, bool, int, float, str, tuples,
lists, dicts, sets, bytes) and the state classes listed in `STATE_CLASSES`; anything else is
refused with the project's error shape. One line per value: {"v": 1, "value": ...}.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from transforms import validation as check
from transforms.streams.count import UnitState
from transforms.streams.records import canonical
from transforms.streams.entity import EntityState
from transforms.streams.graph import EdgeState, TriangleCounter

FORMAT_VERSION = 1
STATE_CLASSES = {cls.__name__: cls for cls in (UnitState, EntityState, EdgeState,
                                               TriangleCounter)}


def _encode(value) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            check.fail("state value", "a finite number", value)
        return value
    if isinstance(value, bytes):
        return {"b": value.hex()}
    if isinstance(value, tuple):
        return {"t": [_encode(v) for v in value]}
    if isinstance(value, list):
        return {"l": [_encode(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        tag = "s" if isinstance(value, set) else "fs"
        return {tag: [_encode(v) for v in sorted(value, key=canonical)]}
    if isinstance(value, dict):
        return {"d": [[_encode(k), _encode(v)] for k, v in value.items()]}
    name = type(value).__name__
    if STATE_CLASSES.get(name) is type(value):
        fields = ({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
                  if dataclasses.is_dataclass(value) else vars(value))
        return {"c": name, "f": {k: _encode(v) for k, v in fields.items()}}
    check.fail("state value", "a plain value or one of " + ", ".join(STATE_CLASSES),
               type(value).__name__)


def _decode(data) -> Any:
    if data is None or isinstance(data, (bool, str, int, float)):
        return data
    if not isinstance(data, dict) or len(data) != 1 and "c" not in data:
        check.fail("state value", "a tagged JSON value", data)
    if "b" in data:
        return bytes.fromhex(data["b"])
    if "t" in data:
        return tuple(_decode(v) for v in data["t"])
    if "l" in data:
        return [_decode(v) for v in data["l"]]
    if "s" in data:
        return {_decode(v) for v in data["s"]}
    if "fs" in data:
        return frozenset(_decode(v) for v in data["fs"])
    if "d" in data:
        return {_decode(k): _decode(v) for k, v in data["d"]}
    if "c" in data:
        cls = STATE_CLASSES.get(data["c"])
        if cls is None:
            check.fail("state class", "one of " + ", ".join(STATE_CLASSES), data["c"])
        fields = {k: _decode(v) for k, v in data["f"].items()}
        if dataclasses.is_dataclass(cls):
            return cls(**fields)
        obj = cls.__new__(cls)
        obj.__dict__.update(fields)
        return obj
    check.fail("state value", "a tagged JSON value", data)


def dumps(value) -> str:
    """One JSON line (no newline)."""
    fast = _unit_pair(value)
    if fast is not None:
        return fast
    return json.dumps({"v": FORMAT_VERSION, "value": _encode(value)}, sort_keys=True,
                      separators=(",", ":"), allow_nan=False)


_text = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str


def _scalar(value):
    """JSON of an int or a str id as `json.dumps` writes it; None for anything else."""
    kind = type(value)
    if kind is str:
        return _text(value)
    if kind is int:
        return int.__repr__(value)
    return None


def _unit_pair(value):
    """`dumps` of a count's (unit, UnitState) pair with scalar ids, byte for byte, written
    directly (the census hashes one per unit; property-tested against the general path);
    None for any other value."""
    if type(value) is not tuple or len(value) != 2 or type(value[1]) is not UnitState:
        return None
    unit, state = value
    used, keys = state.used, state.keys
    head = _scalar(unit)
    if head is None or type(keys) is not tuple:
        return None
    if type(used) is int:
        total = int.__repr__(used)
    elif type(used) is float and math.isfinite(used):
        total = float.__repr__(used)
    else:
        return None
    parts = []
    for key in keys:
        text = _scalar(key)
        if text is None:
            return None
        parts.append(text)
    return (f'{{"v":{FORMAT_VERSION},"value":{{"t":[{head},{{"c":"UnitState","f":{{"keys":'
            f'{{"t":[{",".join(parts)}]}},"used":{total}}}}}]}}}}')


def loads(line: str):
    try:
        data = json.loads(line)
    except ValueError as error:
        check.fail("state line", "valid JSON", f"{error}")
    if not isinstance(data, dict) or data.get("v") != FORMAT_VERSION or "value" not in data:
        check.fail("state line", f'{{"v": {FORMAT_VERSION}, "value": ...}}', line[:80])
    return _decode(data["value"])
