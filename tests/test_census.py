"""The census's per-unit digest is the one its docstring states, whatever path computes it."""
from __future__ import annotations

import hashlib
import hmac
import json

from transforms import ContinualCount, TimeSteps
from transforms import census as unit_census
from transforms.streams import codec
from transforms.streams.count import UnitState


def test_each_unit_adds_hmac_sha256_of_its_codec_line():
    release = ContinualCount(steps=TimeSteps(0.0, 60.0, 4), public_keys=["a"], epsilon=1.0,
                             seed=7, insecure=True)
    census = unit_census._Census(release.config, 3)
    census.setup()
    pairs = [("u1", UnitState(2, ("a",))), (5, UnitState(0.5, ("a", "b"))),
             (("t", 1), UnitState(1, ()))]
    key = unit_census._census_key(release.config, 3)
    for pair in pairs:
        line = json.dumps({"v": codec.FORMAT_VERSION, "value": codec._encode(pair)},
                          sort_keys=True, separators=(",", ":"), allow_nan=False)
        expected = hmac.new(key, line.encode("utf-8"), hashlib.sha256).digest()
        assert census._item(pair) == int.from_bytes(expected, "big")
    total = census.create_accumulator()
    for pair in pairs:
        total = census.add_input(total, pair)
    assert census.extract_output(total)[0] == 3
