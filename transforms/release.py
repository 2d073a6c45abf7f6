"""One release: its identity, the per-key mechanism a worker rebuilds, and its public records.

The noise of a release is keyed by (secret, release_id, descriptor_digest, key, node): two
releases never share noise, a retried bundle or a resumed run re-derives the same noise. Imports
no Beam.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import secrets
from typing import Any, Optional, Protocol, Tuple

import numpy as np

from transforms import validation as check
from transforms.mechanisms import MECHANISMS, NAMES, increments, make
from transforms.mechanisms.base import (EXACT_LIMIT, EXACT_LIMIT_TEXT, NOISE_KINDS, CounterState,
                                        counter_state, first_inexact, state_from_bytes)
from transforms.mechanisms.noise import NOISE_DOMAIN_VERSION, NOISE_VERSIONS, NoiseSource
from transforms.steps import TimeSteps
from transforms.streams.records import Reason, is_id
from transforms.validation import fail
from transforms.mechanisms.noise import ConstantNoiseSource

# the key types a release selecting its keys may release (`ReleaseConfig.key_type`), each with
# the Python type its keys have: 5 and "5" would be two keys published under one name
KEY_TYPES = {"str": str, "int": int}


class NoiseSecret(Protocol):
    """What a release needs from its secret (a `SecretRef`, or a test double injected with
    `noise_source=`): resolved on the worker, never logged or written."""
    public: bool

    def noise_source(self, release: bytes = b"",
                     version: str = NOISE_DOMAIN_VERSION) -> NoiseSource: ...

    def fingerprint(self) -> str: ...

    def secret_bytes(self) -> bytes: ...

    def describe(self) -> str: ...


class NoNoise:
    """A release's noise set to zero: the exact truncated totals. Operator-only (the report's
    truth) and tests; never private (a transform given it needs insecure=True and marks its
    records private: false)."""
    public = True

    def noise_source(self, release: bytes = b"",
                     version: str = NOISE_DOMAIN_VERSION) -> NoiseSource:
        return ConstantNoiseSource(0.0)

    def fingerprint(self) -> str:
        return "0" * 64

    def secret_bytes(self) -> bytes:
        return b"no-noise"

    def describe(self) -> str:
        return "no noise (exact totals, not private)"


def key_text(key) -> str:
    """The key as written in records (str keys as they are, others by repr)."""
    return key if isinstance(key, str) else repr(key)


def noise_stream(key) -> str:
    """The noise stream of a public key: type-tagged, so 5 and "5" never share noise (shared
    noise would reveal the exact difference of their true values)."""
    return f"{type(key).__name__}:{key!r}"


def public_key_digest(keys) -> str:
    """SHA-256 of the typed public key list (part of the release descriptor)."""
    typed = [[type(k).__name__, key_text(k)] for k in keys]
    return hashlib.sha256(json.dumps(typed, sort_keys=True).encode("utf-8")).hexdigest()


def descriptor_digest(descriptor: dict) -> str:
    return hashlib.sha256(json.dumps(descriptor, sort_keys=True).encode("utf-8")).hexdigest()


def derived_release_id(secret: bytes, digest: str) -> str:
    """The release id of an insecure (seeded) release: reproducible from the seed."""
    return hashlib.sha256(b"dp-continual-release/release-id\x00" + secret
                          + bytes.fromhex(digest)).hexdigest()[:32]


def new_release_id(given: Optional[str], private: bool, secret, digest: str) -> str:
    """The id of a release with descriptor `digest`: `given` (a release continued), else one
    derived from the fixed seed and the descriptor (an insecure release: reproducible, and
    logged as insecure), else 128 fresh random bits."""
    if given is not None:
        release_id = given
    elif not private:
        release_id = derived_release_id(secret.secret_bytes(), digest)
    else:
        return secrets.token_hex(16)
    if not private:
        logging.getLogger(__name__).warning(
            "release %s uses a fixed seed (insecure=True): its noise can be regenerated "
            "and subtracted; records are marked private: false", release_id)
    return release_id


def check_release_id(release_id) -> str:
    if not isinstance(release_id, str) or len(release_id) != 32 or any(
            c not in "0123456789abcdef" for c in release_id):
        fail("release_id", "32 lowercase hex digits (a 128-bit release nonce)", release_id)
    return release_id


_SECRET_METHODS = ("noise_source", "fingerprint", "secret_bytes", "describe")


def check_secret(secret) -> None:
    """Refuse what is not a NoiseSecret (named by its type: the value may hold secret bytes)."""
    missing = [m for m in _SECRET_METHODS if not callable(getattr(secret, m, None))]
    if missing:
        fail("secret", "a NoiseSecret (a SecretRef, or a test double with the methods "
                       + ", ".join(_SECRET_METHODS) + ")",
             f"a {type(secret).__name__} without {', '.join(missing)}")


def check_lateness(lateness, delay_steps: int, step_seconds: float) -> None:
    """Unbounded input's allowed lateness: 0, or at most half the release delay (a step's
    contributions reach its release before it is due)."""
    if isinstance(lateness, bool) or not isinstance(lateness, (int, float)) or not (
            lateness == 0 or 0 < lateness <= delay_steps * step_seconds / 2):
        fail("allowed_lateness_seconds", f"0, or in (0, {delay_steps} x {step_seconds:g} / 2] "
                                         f"s (at most half the release delay: a step's "
                                         f"contributions reach its release before it is due)",
             lateness)


def _is_sha256_hex(text) -> bool:
    """A SHA-256 digest as `hexdigest()` writes it: 64 lowercase hex digits."""
    return isinstance(text, str) and len(text) == 64 and all(
        c in "0123456789abcdef" for c in text)


def _named_pairs(name: str, value) -> Tuple[Tuple[str, Any], ...]:
    """A dict frozen as `tuple(sorted(d.items()))`: (str, value) pairs, each name once, in
    increasing name order (the one spelling of a dict, so equal configurations compare equal)."""
    condition = "a tuple of (str, value) pairs sorted by name, each name once"
    if not isinstance(value, tuple) or not all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in value):
        fail(name, condition, value)
    names = [p[0] for p in value]
    if any(a >= b for a, b in zip(names, names[1:])):
        fail(name, condition, value)
    return value


@dataclasses.dataclass(frozen=True)
class ReleaseConfig:
    """Everything a worker needs to rebuild the per-key mechanism (picklable, no secret)."""
    steps: TimeSteps
    mechanism: str
    params: Tuple[Tuple[str, Any], ...]
    key_privacy: Tuple[Tuple[str, float], ...]
    total_privacy: Tuple[Tuple[str, float], ...]
    max_contributions: int
    interval_bound: int
    keys_per_unit: int
    confidence: float
    secret: Any  # a NoiseSecret
    release_delay_steps: int
    release_id: str
    descriptor_digest: str
    noise_kind: str = "discrete"
    private: bool = True
    value_scale: float = 1.0   # records = scale x released grid units (ContinualSum's grid)
    diagnostics: bool = False
    integer_values: bool = True  # the mechanism releases exact integers
    secret_fingerprint: Optional[str] = None  # checked on the worker (scheduled releases)
    # the seam's derivation (`noise.NOISE_VERSIONS`); no default version: a configuration
    # pickled by code before versions (a staged template run by newer workers) has none, and
    # `build` refuses it rather than derive another version's noise for its release
    noise_version: Optional[str] = None
    # unbounded input: how long after its step's end an event still counts (a unit's step is
    # processed then; later events are `late` dead letters); at most half the release delay,
    # so a step's contributions are in before it is released
    allowed_lateness_seconds: float = 0.0
    # `postprocess: nonnegative`: running totals and their intervals clamped at 0 (a count
    # cannot be negative; post-processing, and the truth stays inside a clamped interval)
    nonnegative: bool = False
    # keys selected privately (no public keys, `transforms.mechanisms.selection`): a key is
    # published from the first step its released running total reaches this threshold (in
    # release units); None: the release's keys are public
    selection_threshold: Optional[float] = None
    key_type: Optional[str] = None  # selecting: the one key type released ("str" or "int")

    def __post_init__(self):
        """Refuse a field of the wrong type or value (fail closed: a worker builds the release
        from these fields alone). Checks only, nothing resolved: the secret stays unresolved
        (its methods are only looked up) and no field is converted."""
        if not isinstance(self.steps, TimeSteps):
            fail("steps", "a TimeSteps(origin, size, horizon)", self.steps)
        check.one_of_str("mechanism", self.mechanism, NAMES)
        if self.steps.unbounded and not MECHANISMS[self.mechanism].horizon_free:
            fail("mechanism", "a horizon-free mechanism for steps with no horizon",
                 self.mechanism)
        _named_pairs("params", self.params)
        key_privacy = _named_pairs("key_privacy", self.key_privacy)
        if len(key_privacy) != 1 or key_privacy[0][0] not in ("epsilon", "rho") \
                or not check.is_positive_finite(key_privacy[0][1]):
            fail("key_privacy", "exactly one of (('epsilon', e),) or (('rho', r),), e or r a "
                                "positive finite number", key_privacy)
        _named_pairs("total_privacy", self.total_privacy)
        for name in ("max_contributions", "interval_bound", "keys_per_unit"):
            check.integer_at_least(name, getattr(self, name), 1)
        check.open_unit_interval("confidence", self.confidence)
        check_secret(self.secret)
        check.integer_at_least("release_delay_steps", self.release_delay_steps, 0)
        check_lateness(self.allowed_lateness_seconds, self.release_delay_steps, self.steps.size)
        check_release_id(self.release_id)
        if not _is_sha256_hex(self.descriptor_digest):
            fail("descriptor_digest", "64 lowercase hex digits (the release descriptor's "
                                      "SHA-256)", self.descriptor_digest)
        check.one_of_str("noise_kind", self.noise_kind, NOISE_KINDS)
        check.boolean("private", self.private)
        check.positive_finite("value_scale", self.value_scale)
        check.boolean("diagnostics", self.diagnostics)
        check.boolean("integer_values", self.integer_values)
        check.boolean("nonnegative", self.nonnegative)
        tau = self.selection_threshold
        if tau is not None and (isinstance(tau, bool) or not isinstance(tau, (int, float))
                                or math.isnan(tau) or tau == math.inf):
            fail("selection_threshold", "None, a finite number (release units) or -inf (every "
                                        "key from its first data: the operator's truth)", tau)
        if (self.key_type is None) != (tau is None) or self.key_type not in (None, *KEY_TYPES):
            fail("key_type", "'str' or 'int' with a selection threshold, else None",
                 self.key_type)
        if self.secret_fingerprint is not None and not _is_sha256_hex(self.secret_fingerprint):
            fail("secret_fingerprint", "None or 64 lowercase hex digits (a secret's "
                                       "`fingerprint()`)", self.secret_fingerprint)
        # None stays allowed here: `build` refuses it, with the reason (see the field)
        if self.noise_version is not None:
            check.one_of_str("noise_version", self.noise_version, NOISE_VERSIONS)

    @property
    def release_binding(self) -> bytes:
        return bytes.fromhex(self.release_id) + bytes.fromhex(self.descriptor_digest)

    def build(self, noise_source: Optional[NoiseSource] = None, horizon: Optional[int] = None):
        """The per-key mechanism, its noise from the release's secret (or `noise_source`:
        e.g. zero noise, for the mechanism's laws and errors without the secret); `horizon`:
        the steps it computes (no horizon: any up to the reach, the same outputs)."""
        if self.noise_version not in NOISE_VERSIONS:
            fail("noise_version", "one of " + ", ".join(map(repr, NOISE_VERSIONS)) + " (a "
                 "release configuration built by code before noise versions has none: build "
                 "the pipeline again with this code)", self.noise_version)
        return make(self.mechanism, horizon or self.steps.horizon, **dict(self.key_privacy),
                    max_contributions=self.max_contributions,
                    interval_bound=self.interval_bound,
                    noise_source=noise_source or self.secret.noise_source(
                        release=self.release_binding, version=self.noise_version),
                    noise=self.noise_kind, **dict(self.params))

    def checked_fingerprint(self) -> str:
        """The worker's secret fingerprint, checked against the one the release started
        with (a resumed release under another secret would re-draw published noise)."""
        fingerprint = self.secret.fingerprint()
        if self.secret_fingerprint is not None and fingerprint != self.secret_fingerprint:
            fail("secret", f"the secret this release started with (fingerprint "
                           f"{self.secret_fingerprint[:12]}...) on the worker too",
                 "another secret")
        return fingerprint


_LIMIT = float(EXACT_LIMIT)
_CACHED_KEYS = 1 << 16
_CACHED_STREAMS = 1 << 12  # per-key mechanism copies kept by `RecordMaker.streamer`
_FIRST_REACH = 1 << 10  # with no horizon: the steps a worker's mechanism computes at first
_COUNTER_FORMAT, _COUNTER_VERSION = CounterState._FORMAT, CounterState._VERSION
_SEALED_COUNTER = 16 + _COUNTER_FORMAT.size  # a sealed CounterState: 16-byte tag + 17 bytes


class RecordMaker:
    """The release's mechanism and its public records (built once per worker).

    Exact totals (`exact_totals`: discrete noise on a `CounterState` mechanism, whose data
    is integer and whose running total is a float64): a key's step totals, running total and
    released values stay integers of magnitude < 2^53 (`EXACT_LIMIT`), where float64 holds
    and adds them exactly. The first step at which one would reach it halts the key (no record
    for it or later, an "exact totals" dead letter): fail closed, as a bound violation does.
    The halt depends on the data (its guarantee holds among streams whose totals stay below
    2^53, as the triangle count's holds for bounded graphs), except the released-value check,
    which depends on the released value only (post-processing)."""

    def __init__(self, config: ReleaseConfig):
        self.config = config
        self._binding = (b"dp-continual-release/state\x00" + config.release_binding
                         + config.checked_fingerprint().encode("ascii"))
        self._tags, self._steps, self._isos = {}, {}, {}  # bounded (_CACHED_KEYS)
        self._streams = {}  # per key, bounded (_CACHED_STREAMS)
        self._released = {}  # key -> (step, its released value): `previous`, bounded
        self._built(config.steps.horizon if not config.steps.unbounded else
                    min(config.steps.horizon, _FIRST_REACH))
        total = dict(config.total_privacy)
        self.template = {
            "confidence": config.confidence, "mechanism": config.mechanism,
            "mechanism_params": json.dumps(dict(config.params), sort_keys=True),
            "epsilon": total.get("epsilon"), "delta": total.get("delta"),
            "rho": total.get("rho"), "release_id": config.release_id,
            "private": config.private, "noise": self.mechanism.noise_name}

    def _built(self, horizon: int) -> None:
        """The mechanism computing `horizon` steps, and its per-step laws (past the steps of
        an earlier build only: each step's laws come from one build, whichever way the steps
        were reached; their last bits can depend on the length they were computed at)."""
        before = getattr(self, "horizon", 0)
        self.horizon = horizon
        self.mechanism = mechanism = self.config.build(horizon=horizon)
        self.exact_totals = mechanism.discrete and isinstance(mechanism.init_state(),
                                                              CounterState)
        confidence = self.config.confidence
        laws = (mechanism.noise_std(), mechanism.confidence_half_width(confidence),
                # the step's own value (this release minus the last): its exact law
                np.sqrt(increments.increment_variance(mechanism)),
                increments.increment_half_width(mechanism, confidence))
        if before:
            laws = [np.concatenate((old[:before], new[before:])) for old, new in zip(
                (self.std, self.half, self.step_std, self.step_half), laws)]
        self.std, self.half, self.step_std, self.step_half = laws
        self._streams.clear()
        self._steps.clear()

    def reach(self, stop: int) -> None:
        """Makes steps up to `stop` (exclusive) computable. With no horizon the mechanism is
        built for the steps reached so far, doubled as the release goes on (a horizon-free
        mechanism's outputs, laws and states at step t are those of every horizon past t),
        so memory and set-up follow the steps released, not the reach of 2^20; every worker
        goes through the same lengths (1,024, 2,048, ...), so the records are the same."""
        while stop > self.horizon and self.config.steps.unbounded:
            self._built(min(self.config.steps.horizon, 2 * self.horizon))

    def for_key(self, key):
        return self.mechanism.for_stream(noise_stream(key))

    def _tag(self, key) -> bytes:
        """16 bytes binding a stored state to this release, its secret and its key (cached:
        a streaming release reads and writes a key's state at every step)."""
        tags = self._tags
        tag = tags.get(key)
        if tag is None:
            if len(tags) >= _CACHED_KEYS:
                tags.clear()
            tag = tags[key] = hashlib.sha256(
                self._binding + b"\x00" + noise_stream(key).encode("utf-8")).digest()[:16]
        return tag

    def seal(self, key, state) -> bytes:
        return self._tag(key) + state.to_bytes()

    @staticmethod
    def _sealed_counter(tag: bytes, data) -> Optional[Tuple[int, float]]:
        """(steps, running total) of a CounterState sealed under `tag`, or None for any other
        data: the tag check of `restore` and the length and version checks of
        `CounterState.from_bytes`, then its fields unpacked."""
        if type(data) is bytes and len(data) == _SEALED_COUNTER \
                and data[16] == _COUNTER_VERSION and data.startswith(tag):
            return _COUNTER_FORMAT.unpack_from(data, 16)[1:]
        return None

    def restore(self, key, data: bytes):
        """A stored state, refused unless this release, secret and key wrote it."""
        tag = self._tags.get(key) or self._tag(key)
        fields = self._sealed_counter(tag, data)
        if fields is not None:
            return counter_state(*fields)
        if bytes(data[:len(tag)]) != tag:
            fail("state", f"state of release {self.config.release_id} for key "
                          f"{key_text(key)!r} (a state of another release, secret or key would "
                          f"re-draw published noise)", "another state")
        return state_from_bytes(bytes(data[len(tag):]))

    def step_sealed(self, key, data: bytes, partials, at: int
                    ) -> Tuple[Optional[float], bytes]:
        """Release step `at` of `key` from its sealed state: (out, the new sealed state) of
        `streamer(key).step(restore(key, data), fsum(partials))` (`partials`: the step's exact
        partial sums, or None for none), refused unless the state is this key's and at step
        `at`, before the sum is taken. A sealed CounterState takes `step_counter` on the
        unpacked fields, without building state objects: the same checks, the same values
        and the same bytes.

        Exact totals (`exact_totals`): (None, `data` unchanged) when the step's sum (exact,
        rounded once by fsum), the running total or the released value would reach 2^53 in
        magnitude: the key halts at `at` (nothing is released, the state is not advanced;
        `limit_reason` says why). A non-finite sum is still refused by the step."""
        if at >= self.horizon:
            self.reach(at + 1)
        tag = self._tags.get(key) or self._tag(key)
        fields = self._sealed_counter(tag, data)
        state = None
        if fields is None or fields[0] != at:
            state = self.restore(key, data)
            if state.steps != at:
                raise RuntimeError(f"key {key_text(key)!r}: its sealed state is at step "
                                   f"{state.steps}, its release state at {at}")
        value = math.fsum(partials) if partials else 0.0
        stream = self.streamer(key)
        exact = self.exact_totals
        if exact:  # `first_inexact` on one step, inlined: an integer sum below 2^53 is exact
            total = fields[1] if state is None else getattr(state, "running_total", 0.0)
            if not (-_LIMIT < value < _LIMIT and -_LIMIT < total < _LIMIT
                    and -_LIMIT < total + value < _LIMIT) and value - value == 0.0:
                return None, data
        if state is None:
            found = stream.step_counter(fields[0], fields[1], value)
            if found is not None:
                if exact and not -_LIMIT < found[0] < _LIMIT:
                    return None, data
                return found[0], tag + _COUNTER_FORMAT.pack(_COUNTER_VERSION, fields[0] + 1,
                                                             found[1])
            state = counter_state(*fields)
        out, state = stream.step(state, value)
        if exact and not -_LIMIT < out < _LIMIT:
            return None, data
        return out, self.seal(key, state)

    def exact_halt(self, state, values: np.ndarray) -> Optional[int]:
        """Exact totals, vectorised (`exact_totals`; else None): the first offset of `values`
        (the next steps' totals of a key, from `state`) whose value or running total reaches
        2^53 in magnitude (`first_inexact`), or None."""
        if not self.exact_totals:
            return None
        return first_inexact(getattr(state, "running_total", 0.0), values)

    def exact_outputs(self, outputs: np.ndarray, count: int) -> Optional[int]:
        """Exact totals (`exact_totals`; else None): the first of the first `count` released
        values of magnitude >= 2^53 (total + noise: beyond it float64 may have rounded it), or
        None."""
        if not self.exact_totals or count <= 0:
            return None
        over = np.abs(np.asarray(outputs[:count], dtype=np.float64)) >= _LIMIT
        return int(np.argmax(over)) if over.any() else None

    @staticmethod
    def limit_reason(key, step: int) -> str:
        """The dead letter's reason of a key halted by the exact-totals limit."""
        return Reason("exact_totals", (
            f"exact totals: key {key_text(key)!r} halts at step {step}: its step total, "
            f"running total or released value would reach {EXACT_LIMIT_TEXT} in magnitude "
            f"(float64 adds integers exactly only below it); no record for this step or later"))

    def streamer(self, key):
        """`for_key(key)`, kept for the next call (bounded: a streaming release steps each key
        at every step; the copy only differs from the mechanism by its noise stream)."""
        streams = self._streams
        found = streams.get(key)
        if found is None:
            if len(streams) >= _CACHED_STREAMS:
                streams.clear()
            found = streams[key] = self.for_key(key)
        return found

    def last_output(self, key, sealed: bytes) -> float:
        """The value `key` released at the last step of its sealed state (0.0 before the
        first): `previous` of its next record, re-derived (`ContinualMechanism.last_output`)."""
        return self.streamer(key).last_output(self.restore(key, sealed))

    def previous(self, key, step: int, sealed: bytes) -> float:
        """`key`'s released value at step - 1 (0.0 at step 0): the one this worker released
        and kept (`released`), else re-derived from `sealed`, the state before `step`. A fast
        path of `last_output` (a streaming key's steps mostly fire on one worker, and the
        re-derivation is a step's noise again: O(t) for the discrete square root); the two
        are the same float (test_streaming: records equal batch, which derives it)."""
        if step == 0:
            return 0.0
        found = self._released.get(key)
        if found is not None and found[0] == step - 1:
            return found[1]
        return self.last_output(key, sealed)

    def released(self, key, step: int, value: float) -> None:
        """Keeps `key`'s released value of `step` for its next record (`previous`)."""
        kept = self._released
        if len(kept) >= _CACHED_STREAMS and key not in kept:
            kept.clear()
        kept[key] = (step, value)

    def record(self, key, step: int, value: float, previous: float) -> dict:
        """One public record: the running total `value` and the step's own value, `value` -
        `previous` (the key's release at step - 1, 0.0 at step 0), each with its exact stddev
        and interval. With discrete noise the released values and intervals are exact integers
        (times the value grid of ContinualSum): `int(value)` of a float64 integer, which the
        release keeps below 2^53 in magnitude (`exact_totals`)."""
        entry = self._steps.get(step)
        if entry is None:
            entry = self._step_entry(step)
        width, step_width, fields = entry
        if self.config.integer_values:
            value, previous = int(value), int(previous)
        scale = self.config.value_scale
        if scale != 1.0:  # the published values, times the value grid
            value, previous, width, step_width = (value * scale, previous * scale,
                                                  width * scale, step_width * scale)
        own = value - previous  # the difference of the two published (unclamped) values
        low, high = value - width, value + width
        own_low, own_high = own - step_width, own + step_width
        if self.config.nonnegative:  # the step's own value is left as released
            zero = 0 if type(value) is int else 0.0
            value, low, high = max(value, zero), max(low, zero), max(high, zero)
        record = fields.copy()  # the step's fields, in the record's key order
        record["key"] = key_text(key)
        record["value"] = value
        record["ci_low"] = low
        record["ci_high"] = high
        record["step_value"] = own
        record["step_ci_low"] = own_low
        record["step_ci_high"] = own_high
        return record

    def _iso(self, seconds: float) -> str:
        """`TimeSteps.iso`, cached (a step's start is the previous step's end: formatting a
        time costs more than a step's other public fields together)."""
        seconds = float(seconds)  # a numpy float's repr would differ beyond the year 9999
        isos = self._isos
        found = isos.get(seconds)
        if found is None:
            if len(isos) >= _CACHED_KEYS:
                isos.clear()
            found = isos[seconds] = self.config.steps.iso(seconds)
        return found

    def _step_entry(self, step: int):
        """(interval half width, the step's record with its key, value and interval left to
        fill: key, step, window start and end, value, stddev (times the value scale), ci_low,
        ci_high, then the release's fields), cached, bounded by _CACHED_KEYS steps."""
        self.reach(step + 1)
        config, steps = self.config, self.config.steps
        width, deviation = float(self.half[step]), float(self.std[step])
        step_width, step_deviation = float(self.step_half[step]), float(self.step_std[step])
        if config.integer_values:
            width, step_width = int(width), int(step_width)
        if config.value_scale != 1.0:
            deviation = deviation * config.value_scale
            step_deviation = step_deviation * config.value_scale
        if len(self._steps) >= _CACHED_KEYS:
            self._steps.clear()
        fields = {"key": None, "step": step, "window_start": self._iso(steps.start(step)),
                  "window_end": self._iso(steps.end(step)), "value": None,
                  "stddev": deviation, "ci_low": None, "ci_high": None,
                  "step_value": None, "step_stddev": step_deviation, "step_ci_low": None,
                  "step_ci_high": None, **self.template}
        entry = self._steps[step] = (width, step_width, fields)
        return entry


def checked_public_keys(public_keys) -> list:
    """The listed public keys: ids (the events' key rule), no duplicates, distinct as text."""
    keys = list(public_keys) if public_keys is not None else []
    if not keys or not all(is_id(k) for k in keys):  # the one id rule, as events' keys
        check.fail("public_keys", "a non-empty list of ids (non-empty str of Unicode text, "
                                  "int or tuple keys)", public_keys)
    if len(set(keys)) != len(keys):
        check.fail("public_keys", "free of duplicates", public_keys)
    texts = [key_text(k) for k in keys]
    if len(set(texts)) != len(texts):
        clash = sorted({t for t in texts if texts.count(t) > 1})
        check.fail("public_keys", "distinct when written as text (records carry the key "
                                  "as text)", clash)
    return keys
