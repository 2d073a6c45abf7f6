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


def _general(value) -> str:
    """`codec.dumps` without its fast path."""
    import json
    return json.dumps({"v": codec.FORMAT_VERSION, "value": codec._encode(value)},
                      sort_keys=True, separators=(",", ":"), allow_nan=False)


@pytest.mark.parametrize("seed", range(5))
def test_a_count_units_pair_is_written_byte_for_byte_as_the_general_path(seed):
    """The fast path of (unit, UnitState) pairs (the census writes one per unit) against the
    general encoder: ids of every kind (text outside ASCII, quotes, big ints, bools and tuples,
    which take the general path), integer and fractional totals."""
    import random
    from transforms.streams.count import UnitState
    rng = random.Random(seed)
    texts = ["u", "é", "\u2603", 'a"b', "a\\b", "\n", "x" * 40, "𝔘"]

    def an_id():
        return rng.choice([rng.choice(texts) + str(rng.randint(0, 9)), rng.randint(-10, 10),
                           2 ** 70 + rng.randint(0, 5), True, (1, "a")])
    fast = 0
    for _ in range(400):
        used = rng.choice([rng.randint(0, 50), rng.random() * 10, 0.1 + 0.2, -0.0])
        pair = (an_id(), UnitState(used, tuple(an_id() for _ in range(rng.randint(0, 3)))))
        assert codec.dumps(pair) == _general(pair), pair
        assert codec.loads(codec.dumps(pair)) == pair
        fast += codec._unit_pair(pair) is not None
    assert fast > 50  # the fast path was taken
    with pytest.raises(ValueError):
        codec.dumps(("u", UnitState(float("nan"), ())))
