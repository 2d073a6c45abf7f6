"""Step timers armed 1 ms before their due time, acting at a second firing at it.

A runner may hand a stateful DoFn a timer's firing before elements it received ahead of the
watermark that fired it: Beam's Python SDK queues a data-plane message's timers before its data
(`data_plane._GrpcDataChannel._read_inputs`, Beam 2.77), and a portable runner (Flink, Spark,
Dataflow Runner v2) sends both in one message. A DoFn that closed a step at that firing would
find those on-time elements late (seen on Flink: on-time events of the closing step, late by
the order of one message). So a step timer is set `SETTLE_MICROS` before its due time
(`armed`); that first firing only re-arms it at the due time (`settle`), and the step closes at
the second firing. The second firing can only follow the SDK's handling of the first, so it
comes in a later message: every element the runner sent before the first firing's message has
been processed by then. A runner that fires the re-armed timer as soon as its watermark passes
it (Beam's local runners, with no such reordering) closes the step at the same watermark as
before, one firing later.

Times are whole milliseconds: the Fn API carries timer times in ms, rounded down (Beam's
InstantCoder), so a due time between two would come back before the step end it stands for
and close nothing, for ever; a re-arm 1 us on would fire again at the due time, for ever.

    >>> from transforms.steps import TimeSteps
    >>> steps = TimeSteps(origin=0.0, size=10.0, horizon=5)
    >>> due = lambda step: whole_ms(int(round((steps.end(step) + 2.0) * 1e6)))  # end + 2 s
    >>> armed_of = lambda step: armed(due(step), steps)
    >>> armed_of(3)  # 1 ms before the due time, 42 s
    41999000
    >>> [is_armed_time(t, armed_of, steps, 2.0) for t in (armed_of(3), due(3))]
    [True, False]
"""
from __future__ import annotations

from typing import Callable

from apache_beam.utils.timestamp import Timestamp

from transforms.messages import micros_of

SETTLE_MICROS = 1000  # 1 ms: the finest time a Java runner's timer keeps


def whole_ms(micros: int) -> int:
    """`micros` rounded up to a whole millisecond: a step's due time."""
    return -(-micros // 1000) * 1000


def step_end_due(steps, step: int, lateness_micros: int) -> int:
    """A unit's step-end timer's due time (micros, whole ms): step's end + the lateness."""
    return whole_ms(micros_of(steps.end(step)).micros + lateness_micros)


def release_due(steps, step: int, delay_steps: int) -> int:
    """A release timer's due time (micros, whole ms): the end of `step + delay_steps`."""
    return whole_ms(micros_of(steps.end(step + delay_steps)).micros)


def settles(steps) -> bool:
    """Whether step timers settle: steps longer than 2 ms (a shorter step could be due within
    the settling millisecond of the one before; its timers act at their one firing)."""
    return steps.size * 1e6 > 2 * SETTLE_MICROS


def armed(due: int, steps) -> int:
    """The time a step timer due at `due` (micros, whole ms) is set for."""
    return due - SETTLE_MICROS if settles(steps) else due


def is_armed_time(fire: int, armed_of: Callable[[int], int], steps,
                  after_end_seconds: float) -> bool:
    """Whether a firing at `fire` (micros) is a step timer's first: `fire` is exactly
    `armed_of(k)` for a step k, the armed time of a step due at its end + `after_end_seconds`
    (the step nearest by arithmetic and its neighbours are checked)."""
    if not settles(steps):
        return False
    near = round(((fire + SETTLE_MICROS) / 1e6 - after_end_seconds - steps.origin)
                 / steps.size) - 1
    return any(k >= 0 and armed_of(k) == fire for k in (near - 1, near, near + 1))


def settle(timer, fire: int) -> None:
    """A first firing's only work: the timer again, at the due time it was armed for."""
    timer.set(Timestamp(micros=fire + SETTLE_MICROS))


def settled_first(timer, fire: int, armed_of: Callable[[int], int], steps,
                  after_end_seconds: float) -> bool:
    """Whether a firing at `fire` (micros) was a step timer's first (`is_armed_time`); if so
    it has been settled (`settle`) and the caller acts on nothing."""
    if is_armed_time(fire, armed_of, steps, after_end_seconds):
        settle(timer, fire)
        return True
    return False
