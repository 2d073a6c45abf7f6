"""Fake Beam state and timers for calling a stateful DoFn's methods directly: each cell
encodes on every write and decodes on every read with the DoFn's own coder (as Beam's state
does); `Cells.bind` passes a key's cells and timer by the method's parameter defaults."""
from __future__ import annotations

import inspect

import apache_beam as beam
from apache_beam.transforms.userstate import BagStateSpec

from transforms.settle import SETTLE_MICROS


class Value:
    def __init__(self, coder):
        self.coder, self.data = coder, None

    def read(self):
        return None if self.data is None else self.coder.decode(self.data)

    def write(self, value):
        self.data = self.coder.encode(value)

    def clear(self):
        self.data = None


class Bag:
    def __init__(self, coder):
        self.coder, self.data = coder, []

    def add(self, value):
        self.data.append(self.coder.encode(value))

    def read(self):
        return [self.coder.decode(d) for d in self.data]

    def clear(self):
        self.data = []


class Timer:
    def __init__(self):
        self.time = None

    def set(self, when):
        self.time = when

    def clear(self):
        self.time = None


class Cells:
    """One key's state cells and timer, bound to a DoFn method by its parameter defaults."""

    def __init__(self):
        self.cells, self.timer = {}, Timer()

    def bind(self, method, **given):
        kwargs = {}
        for name, param in inspect.signature(method).parameters.items():
            default = param.default
            spec = getattr(default, "state_spec", None)
            if spec is not None:
                kind = Bag if isinstance(spec, BagStateSpec) else Value
                kwargs[name] = self.cells.setdefault(spec.name, kind(spec.coder))
            elif getattr(default, "timer_spec", None) is not None:
                kwargs[name] = self.timer
            elif default is beam.DoFn.KeyParam:
                kwargs[name] = given["key"]
            elif default is beam.DoFn.TimestampParam and "fire" in given:
                kwargs[name] = given["fire"]
        return kwargs


def fired(method, cells: Cells, key) -> list:
    """A step timer's two firings (`transforms.settle`): the first, at its armed time, only
    re-arms it at its due time, 1 ms later; the second's output."""
    first = cells.timer.time
    assert list(method(**cells.bind(method, key=key, fire=first)) or []) == []
    assert cells.timer.time.micros == first.micros + SETTLE_MICROS
    return list(method(**cells.bind(method, key=key, fire=cells.timer.time)) or [])
