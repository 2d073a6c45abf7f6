"""The checkpoint state codec: every state class round-trips; nothing else is rebuilt."""
from __future__ import annotations

import json
import pickle

import pytest

from transforms.streams import codec
from transforms.streams.count import UnitState
from transforms.streams.entity import EntityState
from transforms.streams.graph import EdgeState, TriangleCounter


def test_states_round_trip():
    counter = TriangleCounter(3, 5)
    counter.step(0, [("+", ("a", "b")), ("+", ("b", "c")), ("+", ("a", "c"))])
    values = [UnitState(2.0, ("eu", 5)), EntityState(1, 1, 2), EdgeState(2, 3),
              ((), {"k": EntityState(0, 0, 1)}), (b"\x01\x02", None), {1, "a"},
              ("unit", (UnitState(1.0, ("x",)),))]
    for value in values:
        assert codec.loads(codec.dumps(value)) == value
    again = codec.loads(codec.dumps(counter))
    assert vars(again) == vars(counter) and again.triangles == 1


def test_unknown_classes_and_pickles_are_refused():
    class Evil:
        pass
    with pytest.raises(ValueError, match=r"^`state value` must be a plain value or one of"):
        codec.dumps(Evil())
    forged = json.dumps({"v": 1, "value": {"c": "os.system", "f": {}}})
    with pytest.raises(ValueError, match=r"^`state class` must be one of UnitState"):
        codec.loads(forged)
    with pytest.raises(ValueError, match=r"^`state line` must be valid JSON"):
        codec.loads(pickle.dumps(UnitState()).hex())
    with pytest.raises(ValueError, match=r'^`state line` must be \{"v": 1'):
        codec.loads(json.dumps({"v": 2, "value": 1}))
