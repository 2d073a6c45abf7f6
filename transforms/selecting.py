"""The streaming release of keys selected privately (no public keys; docs/selection.md).

    (key, StepTotal)                        the truncated step totals of `transforms.streaming`
    | ToBuckets                             -> (bucket, (key, step, value)), bucket = a hash of
                                               the key (data-independent), + one seed per bucket
    | ReleaseBuckets                        -> records of selected keys from their selection
                                               step on + dead letters (late totals, key types)

Why buckets. A public key is seeded at the origin: its release progress (the steps it has
released, after which its data is late) is the watermark's, whoever has data. A selected key
has no seed, so a per-key state would start with its first data, and whether another unit's late
data counted would depend on whether some unit had started the key: one unit could decide it
(an adversarial review showed one unit switching a key of 100 late units from published to
unpublished). Here the progress belongs to the bucket, seeded at the origin like a public key:
a step total is late iff its bucket released its step, the same with or without any unit. A key
of the bucket gets its state with its first on-time data; its stream's noise is the public-key
noise from step 0 (the steps before its data release noise only, never published), and each
release of due steps runs `key_state.advance`, the batch rule. So the records equal the
batch release's whenever no data is late.

Cost: one timer per bucket and step; a firing reads the bucket's key states (one cell) and its
pending totals (a bag) and advances every key with state: O(keys in the bucket) per step.
"""
from __future__ import annotations

import hashlib
import math
import time
from typing import Dict

import apache_beam as beam
import numpy as np
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (BagStateSpec, ReadModifyWriteStateSpec,
                                              TimerSpec, on_timer)
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from transforms.key_state import KeyState, advance, due_stop, other_key_type
from transforms.messages import (DEAD_LETTER, KEYED, MICRO, FastStateCoder, Seed, StageOutput,
                                 add_exact, dead_letter)
from transforms.release import RecordMaker, ReleaseConfig, key_text
from transforms.settle import armed, release_due, settled_first
from transforms.streams.records import Reason
from transforms.validation import fail

BUCKETS = 256  # release buckets of selected keys (each one timer per step)


def bucket_of(key, buckets: int = BUCKETS) -> int:
    """A key's bucket: a hash of its type-tagged text (`noise_stream`'s identity), stable
    across workers and runs (no Python `hash`)."""
    text = f"{type(key).__name__}:{key!r}".encode("utf-8")
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") % buckets


class ReleaseBucketFn(beam.DoFn):
    """Per bucket: its progress (steps released, seeded at the origin), its keys' states
    {key: (sealed state, first step with data, selection step, halt step)} and its pending
    step totals (key, step, exact partials); releases every due step of every key with state
    at each step's release time (the watermark past the end of step s + release_delay_steps,
    and never before the wall clock: as `streaming.ReleaseStreamingFn`)."""

    PROGRESS = ReadModifyWriteStateSpec("progress", FastStateCoder())
    KEYS = ReadModifyWriteStateSpec("keys", FastStateCoder())
    PENDING = BagStateSpec("pending", FastStateCoder())
    RELEASE = TimerSpec("release", TimeDomain.WATERMARK)
    RETRY = TimerSpec("retry", TimeDomain.REAL_TIME)

    def __init__(self, config: ReleaseConfig):
        self.config = config

    def setup(self):
        self.maker = RecordMaker(self.config)

    def _release_micros(self, step: int) -> int:
        return release_due(self.config.steps, step, self.config.release_delay_steps)

    def process(self, element, progress=beam.DoFn.StateParam(PROGRESS),
                pending=beam.DoFn.StateParam(PENDING), timer=beam.DoFn.TimerParam(RELEASE)):
        _, message = element
        if isinstance(message, Seed):  # the bucket's progress starts at the origin
            if progress.read() is None:
                progress.write(0)
                timer.set(Timestamp(micros=armed(self._release_micros(0), self.config.steps)))
            return
        key, step, value = message
        refused = other_key_type(key, self.config)
        if refused is not None:
            yield dead_letter(key, refused)
            return
        released = progress.read() or 0
        if step < released:  # the bucket released the step: late for every key alike
            yield dead_letter((key, step, value),
                              Reason("late", f"late: step {step} of key {key_text(key)!r} "
                                             f"was already released"))
            return
        pending.add((key, step, value))

    @on_timer(RELEASE)
    def release(self, fire=beam.DoFn.TimestampParam,
                progress=beam.DoFn.StateParam(PROGRESS), keys=beam.DoFn.StateParam(KEYS),
                pending=beam.DoFn.StateParam(PENDING), timer=beam.DoFn.TimerParam(RELEASE),
                retry=beam.DoFn.TimerParam(RETRY)):
        steps = self.config.steps
        if settled_first(timer, fire.micros, lambda s: armed(self._release_micros(s), steps),
                         steps, self.config.release_delay_steps * steps.size):
            return  # released at the second firing (`transforms.settle`)
        yield from self._release(fire.micros, progress, keys, pending, timer, retry)

    @on_timer(RETRY)
    def retry(self, progress=beam.DoFn.StateParam(PROGRESS), keys=beam.DoFn.StateParam(KEYS),
              pending=beam.DoFn.StateParam(PENDING), timer=beam.DoFn.TimerParam(RELEASE),
              retry=beam.DoFn.TimerParam(RETRY)):
        """A step held by the wall clock (see `streaming.ReleaseStreamingFn.retry`)."""
        held = progress.read() or 0
        if held >= self.config.steps.horizon:
            return
        release = self._release_micros(held)
        if int(time.time() * 1e6) < release:
            return
        yield from self._release(release, progress, keys, pending, timer, retry)

    def _release(self, fire: int, progress, keys, pending, timer, retry):
        """The steps due by `fire` (micros) and the wall clock (`key_state.due_stop`), then
        the next timer."""
        horizon, first = self.config.steps.horizon, progress.read() or 0
        stop, wake = due_stop(self._release_micros, horizon, first, fire,
                              int(time.time() * 1e6))
        if stop > first:
            yield from self._release_steps(first, stop, keys, pending)
            progress.write(stop)
        if wake is not None:
            held, at = wake
            (retry if held else timer).set(Timestamp(micros=at if held else armed(
                at, self.config.steps)))

    def _release_steps(self, first: int, stop: int, keys, pending):
        """Steps first .. stop - 1 of every key with state or pending totals in them."""
        sums: Dict = {}
        later = []
        for key, step, value in pending.read():
            if step < stop:
                by_step = sums.setdefault(key, {})
                found = by_step.get(step)
                by_step[step] = add_exact(found, value) if found else [value]
            else:
                later.append((key, step, value))
        pending.clear()
        for item in later:
            pending.add(item)
        states = dict(keys.read() or {})
        maker, tau, steps = self.maker, self.config.selection_threshold, self.config.steps
        for key in sorted(set(states) | set(sums), key=lambda k: (type(k).__name__, k)):
            by_step = sums.get(key, {})
            x = np.zeros(stop - first)
            for step, partials in by_step.items():  # exact, rounded once (as batch's sums)
                x[step - first] = math.fsum(partials)
            # a key's first data starts its stream from step 0, as a public key's
            saved = states.get(key)  # (sealed, start, selected, halted): the cell's layout
            published, dead, states[key] = advance(
                maker, key, None if saved is None else KeyState(
                    saved[0], saved[3], saved[1], saved[2]), x, first,
                data_from=min(by_step) if by_step else None, tau=tau)
            for reason in dead:
                yield dead_letter(key, reason)
            for step, value, previous in published:
                yield TimestampedValue(maker.record(key, step, value, previous),
                                       Timestamp.of(steps.end(step) - MICRO))
        keys.write({key: (s.sealed, s.start, s.selected, s.halted)
                    for key, s in states.items()})


class ReleaseSelected(beam.PTransform):
    """(key, StepTotal) -> records of the keys selected privately, from their selection step
    on, + dead letters (late totals, keys of another type): see the module docstring."""

    def __init__(self, config: ReleaseConfig, buckets: int = BUCKETS):
        super().__init__()
        self.config, self.buckets = config, buckets

    def expand(self, totals):
        buckets, origin = self.buckets, self.config.steps.origin
        seeds = (totals.pipeline | "Buckets" >> beam.Create(list(range(buckets)),
                                                              reshuffle=False)
                 | "SeedEveryBucket" >> beam.Map(
                     lambda b: TimestampedValue((b, Seed()), origin)).with_output_types(KEYED))

        def to_bucket(item):
            key, total = item
            if total.halt:  # counts, sums and distinct counts never halt a key
                fail("step total", "a value (no halt) for a release that selects its keys",
                     total)
            return bucket_of(key, buckets), (key, total.step, total.value)

        keyed = totals | "ToBuckets" >> beam.Map(to_bucket).with_output_types(KEYED)
        out = ((keyed, seeds) | "WithSeeds" >> beam.Flatten().with_output_types(KEYED)
               | "Release" >> beam.ParDo(ReleaseBucketFn(self.config)).with_outputs(
                   DEAD_LETTER, main="records"))
        return StageOutput(out.records, out[DEAD_LETTER])
