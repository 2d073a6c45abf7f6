"""What the pipelines' stages pass each other: ids and their coder, messages, dead letters.

Messages are typed (no in-band sentinels) and what crosses a shuffle is plain tuples and
dicts (a dataclass costs ~5x more to encode): an event is the tuple (step, micros, payload),
indexed by `STEP`, `MICROS`, `PAYLOAD`. Both pipelines (`transforms.bounded`,
`transforms.streaming`) and the shared stages (`transforms.stages`) import from here.
"""
from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import apache_beam as beam
from apache_beam.coders import FastPrimitivesCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp

from transforms.steps import TimeSteps
from transforms.streams import codec
from transforms.streams.records import code_of
from transforms.validation import fail

DEAD_LETTER = "dead_letter"
UNIT_STATES = "unit_states"
KEY_STATES = "key_states"
MICRO = 1e-6
METRICS = "continual_release"
GLOBAL = GlobalWindow()  # a singleton
GLOBAL_WINDOWS = (GLOBAL,)
END_OF_GLOBAL = GLOBAL.max_timestamp()


# ----- keys ------------------------------------------------------------------------------------
class Id:
    """Type hint for unit and key ids (a non-empty str, an int, or a tuple of them): their
    coder is `KeyCoder`, deterministic, as state and grouping keys must be."""


def tagged(key_id):
    """An id as type-tagged JSON-able data (`KeyCoder`'s encoding: 1 and "1" differ)."""
    if isinstance(key_id, tuple):
        return ["t", [tagged(part) for part in key_id]]
    if isinstance(key_id, int) and not isinstance(key_id, bool):
        return ["i", str(key_id)]
    if isinstance(key_id, str):
        return ["s", key_id]
    return ["r", repr(key_id)]  # not an id: never a state key here; kept distinguishable


def _untagged(data):
    tag, body = data
    if tag == "t":
        return tuple(_untagged(part) for part in body)
    if tag == "i":
        return int(body)
    if tag == "s":
        return body
    raise ValueError(f"`key` must be an id (str, int or a tuple of them); got {body}.")


class KeyCoder(beam.coders.Coder):
    """Type-tagged JSON of an id: the same id always has the same bytes (1, "1" and (1,)
    differ), on every worker and Python version."""

    def encode(self, value) -> bytes:
        kind = type(value)
        if kind is int:  # fast paths: the very bytes json.dumps writes
            return b'["i","%d"]' % value
        if kind is str and '"' not in value and "\\" not in value and value.isprintable():
            return ('["s","' + value + '"]').encode("utf-8")
        return json.dumps(tagged(value), separators=(",", ":"),
                          ensure_ascii=False).encode("utf-8")

    def decode(self, encoded: bytes):
        head = encoded[:6]
        if head == b'["i","':
            return int(encoded[6:-2])
        if head == b'["s","' and b"\\" not in encoded:
            return encoded[6:-2].decode("utf-8")
        return _untagged(json.loads(encoded.decode("utf-8")))

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self):
        return Id


beam.coders.registry.register_coder(Id, KeyCoder)
KEYED = Tuple[Id, Any]  # (unit or key id, message)


# ----- messages --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StepWindow:
    """The steps [first, stop) one run releases (one run of `pipelines.run`: all of them)."""
    first: int
    stop: int

    @classmethod
    def whole(cls, steps: TimeSteps) -> "StepWindow":
        return cls(0, steps.horizon)


class Event(NamedTuple):
    """An element's step, event time (microseconds) and parsed payload. `AssignSteps` emits
    it as the plain tuple (step, micros, payload): a tuple costs ~6x less to encode than a
    NamedTuple or dataclass in a shuffle; consumers index it (`STEP`, `MICROS`, `PAYLOAD`)."""
    step: int
    micros: int
    payload: Any


STEP, MICROS, PAYLOAD = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Delta:
    """One unit's change of a key's difference stream at a step, or `halt`: a bound violation
    at this step, from which nothing more of the key is released (fail closed)."""
    value: float = 0.0
    halt: bool = False


@dataclasses.dataclass(frozen=True)
class StepTotal:
    """A key's total change at a step (exact sum of its deltas), or a halt."""
    step: int
    value: float = 0.0
    halt: bool = False


@dataclasses.dataclass(frozen=True)
class Seed:
    """Starts a public key's release in streaming (every public key gets every step); a
    continued release's key starts from its sealed state after `released` steps."""
    sealed: Optional[bytes] = None
    released: int = 0
    halted: Optional[int] = None


class StageOutput(NamedTuple):
    """A stage's main output, its dead letters and (bounded input) its new states; a NamedTuple
    so that Beam registers the PCollections as the composite's outputs."""
    main: Any
    dead_letters: Any = None
    states: Any = None


class Released(NamedTuple):
    """A pipeline's outputs: records, dead letters (a list of PCollections), and (bounded)
    the new unit and key states."""
    records: Any
    dead_letters: list
    unit_states: Any = None
    key_states: Any = None


DEAD_LETTER_CHARS = 1024  # a dead letter keeps at most this much of the record's repr


def writable(text: str) -> str:
    """Text every coder and sink can encode: lone surrogates (text that is not Unicode, which
    UTF-8 cannot encode) become their backslash escapes (\\udc80); Unicode text is unchanged."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def dead_letter_record(record, reason: str, weight: Optional[int] = 1) -> dict:
    """{"record": its repr (at most 1 KiB), "size": the repr's full length, "code": the reason's
    stable code (`streams.records.CODES`), "reason": the detail (at most 1 KiB)}: always
    writable, whatever the record (a repr that fails or recurses too deep shows the record's
    type; text that is not Unicode is escaped). A dead letter that stands for more than one
    input record carries "weight": how many (a CSV record spanning lines, a JSON array on one
    line), or None when unknown (a file that cannot be read): the input gate counts them."""
    try:
        text = repr(record)
    except Exception as error:  # noqa: BLE001 (a bad record's own repr failing: no crash)
        text = f"<{type(record).__name__} whose repr fails: {type(error).__name__}>"
    text = writable(text)
    letter = {"record": text[:DEAD_LETTER_CHARS], "size": len(text), "code": code_of(reason),
              "reason": writable(str(reason))[:DEAD_LETTER_CHARS]}
    if weight != 1:
        letter["weight"] = weight
    return letter


def dead_letter(record, reason: str, weight: Optional[int] = 1) -> beam.pvalue.TaggedOutput:
    return beam.pvalue.TaggedOutput(DEAD_LETTER, dead_letter_record(record, reason, weight))


def micros_of(seconds: float) -> Timestamp:
    return Timestamp(micros=int(round(seconds * 1e6)))


def empty(pipeline, label):
    return pipeline | label >> beam.Create([])


# ----- exact sums ------------------------------------------------------------------------------
def add_exact(partials: List[float], value: float) -> List[float]:
    """Shewchuk's exact running sum: math.fsum(partials) is the correctly rounded total, so the
    result does not depend on the order contributions arrive in (batch = streaming)."""
    out = []
    for partial in partials:
        if abs(value) < abs(partial):
            value, partial = partial, value
        high = value + partial
        low = partial - (high - value)
        if low:
            out.append(low)
        value = high
    out.append(value)
    return out


_new_instance = object.__new__


_SHARED_DELTAS: Dict[float, Delta] = {}  # a nonzero float -> its Delta (bounded)


def delta_of(value: float) -> Delta:
    """Delta(value): the instance dict filled directly, as the frozen dataclass's __init__
    does through object.__setattr__ (equal, hashed and pickled alike). A Delta is immutable,
    so one instance per nonzero float value is shared (counts emit a few values over and
    over); zeros are not shared (0.0 == -0.0), nor other types (1 == 1.0)."""
    if type(value) is float:
        shared = _SHARED_DELTAS.get(value)
        if shared is not None:
            return shared
    delta = _new_instance(Delta)
    fields = delta.__dict__
    fields["value"] = value
    fields["halt"] = False
    if type(value) is float and value != 0.0 and len(_SHARED_DELTAS) < 1024:
        _SHARED_DELTAS[value] = delta
    return delta


class StateCodecCoder(beam.coders.Coder):
    """`FastStateCoder`'s coder for what is not a plain value: the checkpoint codec
    (`streams.codec`: plain values and its listed state classes), never pickle, so no state
    cell unpickles anything (bytes another coder wrote are refused)."""

    def encode(self, value) -> bytes:
        return codec.dumps(value).encode("utf-8")

    def decode(self, encoded):
        try:
            text = bytes(encoded).decode("utf-8")
        except UnicodeDecodeError:
            fail("state", "bytes this version's state coder wrote (no pickle)", "other bytes")
        return codec.loads(text)

    def is_deterministic(self) -> bool:
        return True


_FAST_PRIMITIVES = FastPrimitivesCoder(fallback_coder=StateCodecCoder()).get_impl()


class FastStateCoder(FastPrimitivesCoder):
    """Beam's FastPrimitivesCoder (tuples of ints, floats, str and bytes round-trip with their
    types; other objects go through `StateCodecCoder`, not pickle) with its compiled encode /
    decode as the methods themselves. The DirectRunner codes state through `Coder.encode` / `decode` at every
    access, where the base class adds two Python calls (~0.25 us of ~0.6); runners on the Fn
    API use the same compiled impl either way."""

    def __init__(self):
        super().__init__(fallback_coder=StateCodecCoder())

    encode = _FAST_PRIMITIVES.encode  # a compiled method: no binding, no Python frame
    decode = _FAST_PRIMITIVES.decode


def count_dropped(dropped: Dict[str, int]) -> None:
    """Operator-only metrics (they depend on private data): events a unit's machine dropped,
    by the bound that cut them (`truncated_by_max_contributions`, `..._per_step`,
    `truncated_by_max_keys_per_unit`, `truncated_by_contribution_bound` for flips/updates)."""
    for reason, count in dropped.items():
        Metrics.counter(METRICS, "truncated_by_" + reason.replace(" ", "_")).inc(count)


# operator-only per-key truncation metrics: a public key's input and kept amounts (events, or
# grid units of value), `<prefix><key>` (str keys as they are, others by repr)
KEY_INPUT, KEY_KEPT = "key_input:", "key_kept:"


def key_name(key) -> str:
    return key if isinstance(key, str) else repr(key)


def count_keys(given: Dict[Any, int], kept: Dict[Any, int]) -> None:
    """Operator-only metrics (private data): per public key, what entered truncation and what
    it kept, in the statistic's units (`Problem.exact_key_masses`)."""
    for key, amount in given.items():
        Metrics.counter(METRICS, KEY_INPUT + key_name(key)).inc(amount)
        if kept.get(key):
            Metrics.counter(METRICS, KEY_KEPT + key_name(key)).inc(kept[key])


def partials_struct(count: int) -> struct.Struct:
    """(step, count, count float64 partials) of one pending step: the layout the streaming
    release's state coder writes a key's exact step sum in (`add_exact`), cached per count."""
    found = _PARTIALS.get(count)
    if found is None:
        found = _PARTIALS[count] = struct.Struct("<II%dd" % count)
    return found


_PARTIALS: Dict[int, struct.Struct] = {}
