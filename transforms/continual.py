"""The Beam plugin: events -> per-unit truncation -> per-(key, step) aggregation -> per-key
stateful release of a noisy running total with error bars, for every public key and step.

    counts = events | ContinualCount(steps=TimeSteps(origin, 3600, 24 * 30), public_keys=regions,
                                     rho=0.5, max_contributions=10, secret=SecretRef(env="DP"))
    counts.records | WriteRecordsToParquet("out/counts")
    counts.dead_letters | ...

Every transform returns a `ContinualResult` with `.records` (one dict per public key and step)
and `.dead_letters` (bad or out-of-horizon elements with a reason).

Bounded input: units are truncated after a GroupByKey, and the release DoFn fires one timer per
key at the horizon end that releases all T steps with the vectorised `release` (identical to
per-step release, bit for bit). Unbounded input: truncation runs in a stateful DoFn with
event-time timers at step ends, and the release DoFn releases step s when the watermark passes
the end of step s + `release_delay_steps` (default 1, so upstream timer output has arrived even
on runners whose timers hold no watermark).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import secrets
from typing import Any, Dict, List, Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.coders import BytesCoder, PickleCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (BagStateSpec, ReadModifyWriteStateSpec,
                                              TimerSpec, on_timer)
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from transforms.mechanisms import NAMES, ConstantNoiseSource, make
from transforms.mechanisms.base import NOISE_KINDS, state_from_bytes
from transforms.mechanisms import _validation as check
from transforms.mechanisms.choose import choose
from transforms.mechanisms.privacy import PrivacyBudget
from transforms.problems import (CountProblem, DegreeProblem, EntityProblem, Problem,
                                 TriangleProblem, run_unit)
from transforms.secret import SecretRef
from transforms.steps import TimeSteps
from transforms.streams import ContributionBounds, count_distinct
from transforms.streams.count import canonical

DEAD_LETTER = "dead_letter"
SEED, HALT = -1, -2  # release-input steps (real steps are >= 0)
HALT_VALUE = "halt"  # contribution value marking a fail-closed halt (never a number)
MICRO = 1e-6


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


def release_tag(config, secret_fingerprint: str = "") -> bytes:
    """16 bytes that bind a stored mechanism state to its release and its secret (state
    continued under another secret would re-draw published noise)."""
    return hashlib.sha256(b"dp-continual-release/state\x00" + config.release_binding
                          + secret_fingerprint.encode("ascii")).digest()[:16]


def _check_release_id(value) -> str:
    if not isinstance(value, str) or len(value) != 32 or any(
            c not in "0123456789abcdef" for c in value):
        check.fail("release_id", "32 lowercase hex digits (a 128-bit release nonce)", value)
    return value


@dataclasses.dataclass(frozen=True)
class ReleaseConfig:
    """Everything a worker needs to rebuild the per-key mechanism (picklable, no secret).

    The noise of the release is keyed by (secret, release_id, descriptor_digest, key, node):
    two releases never share noise, a retried bundle re-derives the same noise."""
    steps: TimeSteps
    mechanism: str
    params: Tuple[Tuple[str, Any], ...]
    key_privacy: Tuple[Tuple[str, float], ...]
    total_privacy: Tuple[Tuple[str, float], ...]
    max_contributions: int
    interval_bound: int
    keys_per_unit: int
    confidence: float
    noise: Any  # SecretRef, or "zero" (tests only)
    release_delay_steps: int
    release_id: str = "0" * 32
    descriptor_digest: str = "0" * 64
    noise_kind: str = "discrete"
    private: bool = True
    value_scale: float = 1.0   # records = scale x released grid units (ContinualSum's grid)
    diagnostics: bool = False
    integer_values: bool = True  # the mechanism releases exact integers
    secret_fingerprint: Optional[str] = None  # checked on the worker (scheduled releases)

    @property
    def release_binding(self) -> bytes:
        return bytes.fromhex(self.release_id) + bytes.fromhex(self.descriptor_digest)

    def build(self):
        source = ConstantNoiseSource(0.0) if self.noise == "zero" else \
            self.noise.noise_source(release=self.release_binding)
        return make(self.mechanism, self.steps.horizon, **dict(self.key_privacy),
                    max_contributions=self.max_contributions,
                    interval_bound=self.interval_bound, noise_source=source,
                    noise=self.noise_kind, **dict(self.params))


def release_parts(config: ReleaseConfig):
    """(mechanism, per-step std, CI half-widths, record template) for a release config."""
    mechanism = config.build()
    template = {
        "confidence": config.confidence, "mechanism": config.mechanism,
        "mechanism_params": json.dumps(dict(config.params), sort_keys=True),
        "epsilon": dict(config.total_privacy).get("epsilon"),
        "delta": dict(config.total_privacy).get("delta"),
        "rho": dict(config.total_privacy).get("rho"), "release_id": config.release_id,
        "private": config.private, "noise": mechanism.noise_name}
    return (mechanism, mechanism.noise_std(),
            mechanism.confidence_half_width(config.confidence), template)


def make_record(config: ReleaseConfig, template, std, half, key, step, value) -> dict:
    """One public record. With discrete noise the released value and its interval are exact
    integers (times the value grid of ContinualSum)."""
    steps = config.steps
    width, deviation = float(half[step]), float(std[step])
    if config.integer_values:
        value, width = int(value), int(width)
    low, high, scale = value - width, value + width, config.value_scale
    if scale != 1.0:
        value, low, high, deviation = value * scale, low * scale, high * scale, deviation * scale
    return {"key": key_text(key), "step": step, "window_start": steps.iso(steps.start(step)),
            "window_end": steps.iso(steps.end(step)), "value": value, "stddev": deviation,
            "ci_low": low, "ci_high": high, **template}


class _ReleaseFn(beam.DoFn):
    """Per public key: collects (step, difference) and releases noisy running totals."""

    PENDING = ReadModifyWriteStateSpec("pending", PickleCoder())
    COUNTER = ReadModifyWriteStateSpec("counter", BytesCoder())
    HALTED = ReadModifyWriteStateSpec("halted", PickleCoder())
    RELEASE = TimerSpec("release", TimeDomain.WATERMARK)

    def __init__(self, config: ReleaseConfig, bounded: bool):
        self.config = config
        self.bounded = bounded
        # Operator-only diagnostics: the count depends on private data, so it exists only when
        # the release is built with diagnostics=True.
        self.late = Metrics.counter("continual_release", "late_contributions") \
            if config.diagnostics else None

    def setup(self):
        self.mechanism, self.std, self.half, self.template = release_parts(self.config)
        fingerprint = "" if self.config.noise == "zero" else self.config.noise.fingerprint()
        self.tag = release_tag(self.config, fingerprint)
        expected = self.config.secret_fingerprint
        if expected is not None and fingerprint and fingerprint != expected:
            # worker and ledger must agree
            check.fail("secret", f"the secret this release started with (fingerprint "
                                 f"{expected[:12]}...) on the worker too", "another secret")

    def _read_state(self, counter):
        """The key's mechanism state, refused unless it belongs to this release (a restored
        or updated pipeline with another release id would re-draw published noise)."""
        data = counter.read()
        if data is None:
            return self.mechanism.init_state()
        if data[:len(self.tag)] != self.tag:
            check.fail("state", f"state of release {self.config.release_id} (restored state "
                                f"from another release would re-draw published noise)",
                       "state of another release")
        return state_from_bytes(data[len(self.tag):])

    def _write_state(self, counter, state):
        counter.write(self.tag + state.to_bytes())

    def _release_time(self, step):
        steps = self.config.steps
        if self.bounded:
            return Timestamp(micros=int(round(steps.stop * 1e6)))
        return Timestamp(micros=int(round(steps.end(step + self.config.release_delay_steps)
                                          * 1e6)))

    def process(self, element, pending=beam.DoFn.StateParam(PENDING),
                counter=beam.DoFn.StateParam(COUNTER), halted=beam.DoFn.StateParam(HALTED),
                timer=beam.DoFn.TimerParam(RELEASE)):
        key, (step, value) = element
        if step == SEED:
            if self.bounded or counter.read() is None:
                timer.set(self._release_time(0))
                if counter.read() is None:
                    self._write_state(counter, self.mechanism.init_state())
            return
        if step == HALT:
            current = halted.read()
            halted.write(min(value, current) if current is not None else value)
            return
        if not self.bounded:
            released = self._read_state(counter).steps
            if step < released:
                if self.late is not None:
                    self.late.inc()
                yield beam.pvalue.TaggedOutput(DEAD_LETTER, {
                    "record": repr((key, step, value)),
                    "reason": f"late: step {step} of key {key_text(key)!r} was already released"})
                return
        values = pending.read() or {}
        values[step] = add_exact(values.get(step, []), value)
        pending.write(values)

    @on_timer(RELEASE)
    def release(self, key=beam.DoFn.KeyParam, pending=beam.DoFn.StateParam(PENDING),
                counter=beam.DoFn.StateParam(COUNTER), halted=beam.DoFn.StateParam(HALTED),
                timer=beam.DoFn.TimerParam(RELEASE)):
        values = pending.read() or {}
        stop = halted.read()
        mechanism = self.mechanism.for_stream(noise_stream(key))
        state = self._read_state(counter)
        if self.bounded:
            x = np.zeros(self.config.steps.horizon)
            for step, partials in values.items():
                x[step] = math.fsum(partials)
            outputs, state = mechanism.advance(state, x)
            first = 0
            pending.clear()
        else:
            step = state.steps
            out, state = mechanism.step(state, math.fsum(values.pop(step, [])))
            outputs, first = [out], step
            pending.write(values)
            if step + 1 < self.config.steps.horizon and (stop is None or step + 1 < stop):
                timer.set(self._release_time(step + 1))
        self._write_state(counter, state)
        for offset, value in enumerate(outputs):
            step = first + offset
            if stop is not None and step >= stop:
                break
            end = self.config.steps.end(step)
            yield TimestampedValue(self._record(key, step, float(value)), end - MICRO)

    def _record(self, key, step, value):
        return make_record(self.config, self.template, self.std, self.half, key, step, value)


@beam.typehints.with_output_types(Tuple[Any, Any])
class _AssignStep(beam.DoFn):
    """Event timestamp -> step; bad or out-of-horizon elements -> dead letters."""

    def __init__(self, problem: Problem, steps: TimeSteps):
        self.problem = problem
        self.steps = steps

    def process(self, element, timestamp=beam.DoFn.TimestampParam):
        seconds = float(timestamp.micros) / 1e6 if hasattr(timestamp, "micros") else float(
            timestamp)
        step = self.steps.step_of(seconds)
        if step is None:
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, {
                "record": repr(element),
                "reason": f"event time {self.steps.iso(seconds)} is outside the horizon "
                          f"[{self.steps.iso(self.steps.origin)}, "
                          f"{self.steps.iso(self.steps.stop)})"})
            return
        parsed, reason = self.problem.parse(element)
        if parsed is None:
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, {"record": repr(element),
                                                         "reason": reason})
            return
        unit, payload = parsed
        yield unit, (step, int(round(seconds * 1e6)), payload)


def _sorted_payloads(items):
    """Payloads of one step in (event time, canonical payload) order."""
    return [payload for _, payload in sorted(((ts, p) for ts, p in items),
                                             key=lambda tp: (tp[0], canonical(tp[1])))]


def _advance_unit(problem: Problem, unit, state, by_step: Dict[int, list], steps):
    """Run one unit's machine over `steps` -> (state, [((key, step), value)], halt or None).

    halt is (step, violation message) at the first bound violation (TriangleCount)."""
    outputs = []
    for step in steps:
        state, contributions, violation = run_unit(problem, unit, state, step,
                                                   _sorted_payloads(by_step.get(step, ())))
        if violation is not None:
            return state, outputs, (step, violation)
        outputs.extend(((key, step), value) for key, value in contributions)
    return state, outputs, None


def _by_step(items) -> Dict[int, list]:
    grouped: Dict[int, list] = {}
    for step, ts, payload in items:
        grouped.setdefault(step, []).append((ts, payload))
    return grouped


def _halt_outputs(problem: Problem, unit, halt):
    step, violation = halt
    return [beam.pvalue.TaggedOutput(DEAD_LETTER, {"record": repr(unit), "reason": violation}),
            ((problem.key, step), HALT_VALUE)]


def _truncate_unit(problem: Problem, horizon: int, unit, items):
    """Bounded path: a unit's whole history at once (after GroupByKey)."""
    by_step = _by_step(items)
    steps = range(horizon) if problem.every_step else sorted(by_step)
    _, outputs, halt = _advance_unit(problem, unit, problem.init_state(), by_step, steps)
    yield from outputs
    if halt is not None:
        yield from _halt_outputs(problem, unit, halt)


@beam.typehints.with_output_types(Tuple[Any, Any])
class _TruncateStreaming(beam.DoFn):
    """Unbounded path: buffer a unit's updates until the watermark passes the step's end."""

    BUFFER = BagStateSpec("buffer", PickleCoder())
    UNIT = ReadModifyWriteStateSpec("unit", PickleCoder())
    NEXT = ReadModifyWriteStateSpec("next", PickleCoder())
    EARLIEST = ReadModifyWriteStateSpec("earliest", PickleCoder())  # earliest buffered step
    STEP_END = TimerSpec("step_end", TimeDomain.WATERMARK)

    def __init__(self, problem: Problem, steps: TimeSteps):
        self.problem = problem
        self.steps = steps

    def process(self, element, buffer=beam.DoFn.StateParam(BUFFER),
                next_step=beam.DoFn.StateParam(NEXT), earliest=beam.DoFn.StateParam(EARLIEST),
                timer=beam.DoFn.TimerParam(STEP_END)):
        unit, (step, ts, payload) = element
        done = next_step.read() or 0
        if step < done:
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, {
                "record": repr((unit, payload)),
                "reason": f"late: step {step} of this unit was already processed"})
            return
        buffer.add((step, ts, payload))
        current = earliest.read()
        if current is None or step < current:
            earliest.write(step)
            timer.set(Timestamp(micros=int(round(self.steps.end(step) * 1e6))))

    @on_timer(STEP_END)
    def flush(self, key=beam.DoFn.KeyParam, fire=beam.DoFn.TimestampParam,
              buffer=beam.DoFn.StateParam(BUFFER), unit_state=beam.DoFn.StateParam(UNIT),
              next_step=beam.DoFn.StateParam(NEXT), earliest=beam.DoFn.StateParam(EARLIEST),
              timer=beam.DoFn.TimerParam(STEP_END)):
        items = list(buffer.read())
        fired = float(fire.micros) / 1e6
        ready = [it for it in items if self.steps.end(it[0]) <= fired + MICRO]
        later = [it for it in items if self.steps.end(it[0]) > fired + MICRO]
        state = unit_state.read()
        state = self.problem.init_state() if state is None else state
        done = next_step.read() or 0
        by_step = _by_step(ready)
        last = max(by_step) if by_step else done - 1
        steps = range(done, last + 1) if self.problem.every_step else sorted(by_step)
        state, outputs, halt = _advance_unit(self.problem, key, state, by_step, steps)
        for (out_key, step), value in outputs:
            yield TimestampedValue(((out_key, step), value), self.steps.end(step) - MICRO)
        if halt is not None:
            dead, marker = _halt_outputs(self.problem, key, halt)
            yield dead
            yield TimestampedValue(marker, self.steps.end(halt[0]) - MICRO)
            buffer.clear()
            earliest.clear()
            next_step.write(self.steps.horizon)
            return
        unit_state.write(state)
        next_step.write(last + 1)
        buffer.clear()
        earliest.clear()
        for item in later:
            buffer.add(item)
        if later:
            first = min(s for s, _, _ in later)
            earliest.write(first)
            timer.set(Timestamp(micros=int(round(self.steps.end(first) * 1e6))))


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


class _Aggregate(beam.CombineFn):
    """Exact sum of contributions per (key, step); a halt marker wins (fail closed)."""

    def create_accumulator(self):
        return ([], False)

    def add_input(self, acc, value):
        if isinstance(value, str):
            return acc[0], True
        return add_exact(acc[0], value), acc[1]

    def merge_accumulators(self, accs):
        partials, halted = [], False
        for acc in accs:
            for value in acc[0]:
                partials = add_exact(partials, value)
            halted = halted or acc[1]
        return partials, halted

    def extract_output(self, acc):
        return math.fsum(acc[0]), acc[1]


@dataclasses.dataclass
class ContinualResult:
    records: Any
    dead_letters: Any


class _ContinualBase(beam.PTransform):
    """Shared construction, validation, display data and the release half of the pipeline."""

    def __init__(self, *, steps: TimeSteps, public_keys: Sequence, epsilon=None, rho=None,
                 delta=None, mechanism: str = "auto", mechanism_params: Optional[dict] = None,
                 confidence: float = 0.95, secret: Optional[SecretRef] = None,
                 seed: Optional[int] = None, insecure: bool = False, noise: str = "discrete",
                 release_id: Optional[str] = None, diagnostics: bool = False,
                 secret_fingerprint: Optional[str] = None,
                 zero_noise_for_tests: bool = False, release_delay_steps: int = 1,
                 label: Optional[str] = None):
        super().__init__(label)
        if not isinstance(steps, TimeSteps):
            check.fail("steps", "a TimeSteps(origin, size, horizon)", steps)
        self.steps = steps
        keys = list(public_keys) if public_keys is not None else []
        if not keys or any(isinstance(k, bool) or not isinstance(k, (str, int, tuple))
                           for k in keys):
            check.fail("public_keys", "a non-empty list of str, int or tuple keys", public_keys)
        if len(set(keys)) != len(keys):
            check.fail("public_keys", "free of duplicates", public_keys)
        texts = [key_text(k) for k in keys]
        if len(set(texts)) != len(texts):
            clash = sorted({t for t in texts if texts.count(t) > 1})
            check.fail("public_keys", "distinct when written as text (records carry the key "
                                      "as text)", clash)
        self.public_keys = keys
        self.budget = PrivacyBudget.resolve(epsilon=epsilon, rho=rho, delta=delta)
        check.one_of("mechanism", mechanism, ("auto",) + NAMES)
        self.mechanism_name = mechanism
        self.mechanism_params = dict(mechanism_params or {})
        self.confidence = check.open_unit_interval("confidence", confidence)
        noise_choices = [secret is not None, seed is not None, bool(zero_noise_for_tests)]
        if sum(noise_choices) != 1:
            check.fail("secret", "given, or else exactly one of `seed` or "
                                 "`zero_noise_for_tests`", secret)
        if secret is not None and not isinstance(secret, SecretRef):
            check.fail("secret", "a SecretRef (env, path, seed or literal)", secret)
        self.noise = "zero" if zero_noise_for_tests else (
            secret if secret is not None else SecretRef(seed=seed))
        self.insecure = check.boolean("insecure", insecure)
        if self.noise != "zero" and self.noise.public and not self.insecure:
            check.fail("secret", "a secret from `env` or `path` (a fixed `seed` is public: "
                                 "anyone who knows it can subtract the noise; pass "
                                 "insecure=True for demos and tests)", "seed")
        check.one_of("noise", noise, NOISE_KINDS)
        self.noise_kind = noise
        self.private = self.noise != "zero" and not self.noise.public
        self.diagnostics = check.boolean("diagnostics", diagnostics)
        if release_id is not None:
            _check_release_id(release_id)
        self._given_release_id = release_id
        self._secret_fingerprint = secret_fingerprint
        self._expanded = False
        self.release_delay_steps = check.integer_at_least("release_delay_steps",
                                                          release_delay_steps, 0)
        self.problem = self.make_problem()
        self.config = self._release_config()

    def make_problem(self) -> Problem:
        raise NotImplementedError

    def bounds(self) -> dict:
        """The transform's contribution bounds (part of the release descriptor)."""
        raise NotImplementedError

    @property
    def value_scale(self) -> float:
        return 1.0

    def _key_privacy(self) -> dict:
        """Each key's budget: the total split over the keys one unit can touch."""
        if self.budget.noise == "laplace":
            return self.problem.declaration.budget_share(epsilon=self.budget.epsilon)
        return self.problem.declaration.budget_share(rho=self.budget.rho)

    def _release_config(self) -> ReleaseConfig:
        declaration = self.problem.declaration
        key_privacy = self._key_privacy()
        name, params = self.mechanism_name, dict(self.mechanism_params)
        if name == "auto":
            best, _ = choose(self.steps.horizon, key_privacy, declaration.max_contributions,
                             declaration.interval_bound, noise=self.noise_kind)
            name, params = best.mechanism, dict(best.params)
        total = {k: v for k, v in self.budget.as_dict().items() if k != "noise"}
        resolved = make(name, self.steps.horizon, **key_privacy,  # validates parameters now
                        max_contributions=declaration.max_contributions,
                        interval_bound=declaration.interval_bound,
                        noise_source=ConstantNoiseSource(0.0), noise=self.noise_kind, **params)
        params = resolved.params()
        self.descriptor = {
            "format": 1, "transform": type(self).__name__, "mechanism": name, "params": params,
            "noise": resolved.noise_name, "budget": total, "key_budget": key_privacy,
            "horizon": self.steps.horizon, "origin": self.steps.origin,
            "step_seconds": self.steps.size, "bounds": self.bounds(),
            "declaration": {"interval_bound": declaration.interval_bound,
                            "max_contributions": declaration.max_contributions,
                            "keys_per_unit": declaration.keys_per_unit},
            "value_scale": self.value_scale, "public_keys": public_key_digest(self.public_keys)}
        digest = descriptor_digest(self.descriptor)
        if self._given_release_id is not None:
            self.release_id = self._given_release_id
        elif self.noise == "zero":
            self.release_id = "0" * 32
        elif self.noise.public:
            self.release_id = derived_release_id(self.noise.secret_bytes(), digest)
        else:
            self.release_id = secrets.token_hex(16)
        if self.noise != "zero" and self.noise.public:
            logging.getLogger(__name__).warning(
                "release %s uses a fixed seed (insecure=True): its noise can be regenerated "
                "and subtracted; records are marked private: false", self.release_id)
        return ReleaseConfig(self.steps, name, tuple(sorted(params.items())),
                             tuple(sorted(key_privacy.items())), tuple(sorted(total.items())),
                             declaration.max_contributions, declaration.interval_bound,
                             declaration.keys_per_unit, self.confidence, self.noise,
                             self.release_delay_steps, self.release_id, digest, self.noise_kind,
                             self.private, self.value_scale, self.diagnostics,
                             resolved.integer_release, self._secret_fingerprint)

    def display_data(self):
        data = {"mechanism": self.config.mechanism,
                "mechanism_params": json.dumps(dict(self.config.params), sort_keys=True),
                "horizon": self.steps.horizon, "step_seconds": self.steps.size,
                "origin": self.steps.iso(self.steps.origin), "public_keys": len(self.public_keys),
                "max_contributions": self.config.max_contributions,
                "interval_bound": self.config.interval_bound,
                "keys_per_unit": self.config.keys_per_unit, "confidence": self.confidence,
                "secret": "zero (tests only)" if self.noise == "zero" else self.noise.describe(),
                "noise": self.descriptor["noise"], "release_id": self.release_id,
                "private": self.private}
        data.update({k: v for k, v in dict(self.config.total_privacy).items()})
        return data

    def _claim(self):
        """One transform object is one release: applying it twice would release two inputs with
        the same noise (their difference would be exact)."""
        if self._expanded:
            check.fail("transform", "applied once (construct a new transform for each release; "
                                    f"release {self.release_id} was already applied)",
                       "a second application")
        self._expanded = True

    def expand(self, events):
        self._claim()
        bounded = events.is_bounded
        stepped = events | "AssignStep" >> beam.ParDo(
            _AssignStep(self.problem, self.steps)).with_outputs(DEAD_LETTER, main="events")
        if bounded:
            contributions = (
                stepped.events
                | "GroupByUnit" >> beam.GroupByKey()
                | "TruncatePerUnit" >> beam.FlatMap(
                    lambda kv, problem, horizon: _truncate_unit(problem, horizon, kv[0], kv[1]),
                    self.problem, self.steps.horizon).with_output_types(
                        Tuple[Any, Any]).with_outputs(DEAD_LETTER, main="contributions"))
        else:
            contributions = (
                stepped.events
                | "TruncatePerUnit" >> beam.ParDo(
                    _TruncateStreaming(self.problem, self.steps)).with_outputs(
                        DEAD_LETTER, main="contributions"))
        return self._release(events.pipeline, contributions.contributions,
                             [stepped[DEAD_LETTER], contributions[DEAD_LETTER]], bounded)

    def _release(self, pipeline, contributions, dead_letters, bounded):
        public = set(self.public_keys)
        dropped = Metrics.counter("continual_release", "dropped_non_public_keys") \
            if self.diagnostics else None  # a count that depends on private data

        def public_only(item):
            (key, step), value = item
            if key in public:
                yield key, (step, value)
            elif not isinstance(value, str) and value == 0:
                pass
            elif dropped is not None:
                dropped.inc()

        def as_release_input(item):
            (key, step), value = item
            if isinstance(value, str):
                yield key, (HALT, step)
            else:
                yield key, (step, value)

        steps = self.steps
        if bounded:  # pre-aggregate: one state write per (key, step) instead of per element
            contributions = (contributions
                             | "SumPerKeyAndStep" >> beam.CombinePerKey(_Aggregate())
                             | "ExactSums" >> beam.MapTuple(
                                 lambda key_step, acc: (key_step, HALT_VALUE if acc[1]
                                                        else acc[0])))
        per_step = (contributions
                    | "KeepPublicKeys" >> beam.FlatMap(public_only)
                    | "ToReleaseInput" >> beam.FlatMap(
                        lambda item: as_release_input(((item[0], item[1][0]), item[1][1]))
                    ).with_output_types(Tuple[Any, Any]))
        seeds = (pipeline
                 | "PublicKeys" >> beam.Create(self.public_keys, reshuffle=False)
                 | "SeedEveryKey" >> beam.Map(lambda key: TimestampedValue(
                     (key, (SEED, 0.0)), steps.origin)).with_output_types(Tuple[Any, Any]))
        released = ((per_step, seeds) | "WithSeeds" >> beam.Flatten()
                    | "Release" >> beam.ParDo(_ReleaseFn(self.config, bounded)).with_outputs(
                        DEAD_LETTER, main="records"))
        dead = (dead_letters + [released[DEAD_LETTER]]) | "DeadLetters" >> beam.Flatten()
        return ContinualResult(released.records, dead)


class ContinualCount(_ContinualBase):
    """Running count per public key; elements (unit, key) timestamped with event time.

    Each unit (user) contributes at most `max_contributions_per_step` events per step and
    `max_contributions` over the horizon to at most `max_keys_per_unit` keys."""

    def __init__(self, *, max_contributions: int = 1, max_contributions_per_step=None,
                 max_keys_per_unit: int = 1, **kwargs):
        self.contribution_bounds = ContributionBounds(max_contributions,
                                                      max_contributions_per_step,
                                                      max_keys_per_unit)
        super().__init__(**kwargs)

    def make_problem(self):
        return CountProblem(self.contribution_bounds)

    def bounds(self):
        return dataclasses.asdict(self.contribution_bounds)


class ContinualSum(_ContinualBase):
    """Running sum per public key; elements (unit, key, value); values clamped to
    [0, max_value], at most `max_contributions` value mass per unit over the horizon.

    With discrete noise (the default) values are rounded to the grid `value_resolution` g
    (default max_value / 100) after clamping; truncation, sensitivity and noise work in integer
    units of g, so the release is exact integers times g (see the README's privacy model)."""

    def __init__(self, *, max_value: float, max_contributions: int = 1,
                 max_contributions_per_step=None, max_keys_per_unit: int = 1,
                 value_resolution: Optional[float] = None, **kwargs):
        self.contribution_bounds = ContributionBounds(max_contributions,
                                                      max_contributions_per_step,
                                                      max_keys_per_unit, max_value=max_value)
        discrete = kwargs.get("noise", "discrete") == "discrete"
        if value_resolution is not None:
            check.positive_finite("value_resolution", value_resolution)
            if value_resolution > max_value:
                check.fail("value_resolution", f"<= max_value ({max_value})", value_resolution)
        elif discrete:
            value_resolution = max_value / 100.0
        self.value_resolution = value_resolution
        super().__init__(**kwargs)

    @property
    def value_scale(self):
        return self.value_resolution or 1.0

    def make_problem(self):
        bounds, g = self.contribution_bounds, self.value_resolution
        if g is None:
            return CountProblem(bounds, with_value=True)
        per_step = bounds.max_contributions_per_step
        units = ContributionBounds(
            max(1, math.floor(bounds.max_contributions / g)),
            None if per_step is None else max(1, math.floor(per_step / g)),
            bounds.max_keys_per_unit, max_value=float(math.floor(bounds.max_value / g)))
        return CountProblem(units, with_value=True, value_grid=g, max_value=bounds.max_value)

    def bounds(self):
        return {**dataclasses.asdict(self.contribution_bounds),
                "value_resolution": self.value_resolution}


class ContinualCountDistinct(_ContinualBase):
    """Distinct present items per key; elements (op, item, key), op '+' / '-'; item-level
    privacy with flippancy bound `max_flips` (S_{1,k})."""

    def __init__(self, *, max_flips: int, max_keys_per_unit: int = 1, semantics="count",
                 **kwargs):
        self.machine = count_distinct(max_flips, semantics)
        self.max_flips, self.semantics = max_flips, semantics
        self.max_keys_per_unit = check.integer_at_least("max_keys_per_unit",
                                                        max_keys_per_unit, 1)
        super().__init__(**kwargs)

    def make_problem(self):
        return EntityProblem(self.machine, self.max_keys_per_unit)

    def bounds(self):
        return {"max_flips": self.max_flips, "max_keys_per_unit": self.max_keys_per_unit,
                "semantics": self.semantics}


class ContinualDegreeCount(_ContinualBase):
    """Degree of every public node; elements (op, (a, b)); edge-level privacy with degree
    contribution bound `max_updates`; each node's counter gets half the budget (Cor. 6.15)."""

    def __init__(self, *, max_updates: int, **kwargs):
        self.max_updates = check.integer_at_least("max_updates", max_updates, 1)
        super().__init__(**kwargs)

    def make_problem(self):
        return DegreeProblem(self.max_updates)

    def bounds(self):
        return {"max_updates": self.max_updates}


class ContinualTriangleCount(_ContinualBase):
    """Triangle count of one graph; elements (op, (a, b)). Private only for graph streams with
    maximum degree <= `max_degree` and triangle contribution <= `max_contribution`; the first
    violation halts the release (no record for that step or later) and goes to dead letters."""

    def __init__(self, *, max_degree: int, max_contribution: int, **kwargs):
        self.max_degree = check.integer_at_least("max_degree", max_degree, 1)
        self.max_contribution = check.integer_at_least("max_contribution", max_contribution, 1)
        kwargs.setdefault("public_keys", ["triangles"])
        super().__init__(**kwargs)

    def make_problem(self):
        return TriangleProblem(self.max_degree, self.max_contribution)

    def bounds(self):
        return {"max_degree": self.max_degree, "max_contribution": self.max_contribution}


class ContinualRelease(_ContinualBase):
    """Release already-computed difference values: elements (key, value) with event time; the
    caller declares that one protected unit changes each key's stream by a vector of S_{D,k}
    and touches at most `keys_per_unit` keys (no truncation is applied here)."""

    def __init__(self, *, max_contributions: int = 1, interval_bound: int = 1,
                 keys_per_unit: int = 1, **kwargs):
        from transforms.streams.records import Declaration
        self.declaration = Declaration(
            check.integer_at_least("interval_bound", interval_bound, 1),
            check.integer_at_least("max_contributions", max_contributions, 1),
            check.integer_at_least("keys_per_unit", keys_per_unit, 1), "declared")
        super().__init__(**kwargs)

    def bounds(self):
        return {"max_contributions": self.declaration.max_contributions,
                "interval_bound": self.declaration.interval_bound,
                "keys_per_unit": self.declaration.keys_per_unit}

    def make_problem(self):
        declaration = self.declaration
        integers = getattr(self, "noise_kind", "discrete") == "discrete"

        class Declared(Problem):
            name = "declared"

            def parse(self, element):
                if not isinstance(element, (tuple, list)) or len(element) != 2:
                    return None, "record must be (key, value)"
                key, value = element
                if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                        not math.isfinite(value):
                    return None, f"value must be a finite number; got {value!r}"
                if integers and value != math.floor(value):
                    return None, (f"value must be an integer with discrete noise (the declared "
                                  f"set S_(D,k) is integer); got {value!r}")
                return (key, (key, float(value))), None

            def init_state(self):
                return None  # declared values are released as given: no truncation state

            def step(self, state, step, payloads):
                keys = sorted({key for key, _ in payloads}, key=canonical)
                return state, [(k, math.fsum(v for key, v in payloads if key == k))
                               for k in keys], None

        problem = Declared()
        problem.declaration = declaration
        return problem

    def expand(self, events):
        self._claim()
        stepped = events | "AssignStep" >> beam.ParDo(
            _AssignStep(self.problem, self.steps)).with_outputs(DEAD_LETTER, main="events")
        contributions = stepped.events | "AsContributions" >> beam.Map(
            lambda item: ((item[0], item[1][0]), item[1][2][1])).with_output_types(
                Tuple[Any, Any])
        return self._release(events.pipeline, contributions, [stepped[DEAD_LETTER]],
                             events.is_bounded)
