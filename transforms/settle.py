"""Watermark timers that act at their second firing, 1 ms after their due time.

A runner may hand a stateful DoFn a timer's firing before elements it received ahead of the
watermark that fired it: Beam's Python SDK queues a data-plane message's timers before its data
(`data_plane._GrpcDataChannel._read_inputs`, Beam 2.77), and a portable runner (Flink, Spark,
Dataflow Runner v2) sends both in one message. A DoFn that closed a step at that firing would
find those on-time elements late (seen on Flink: on-time events of the closing step, late by
the order of one message). So every step timer here is set at its due time and, at that first
firing, only re-armed `SETTLE_MICROS` later (`settle`); it acts at the second firing. That one
fires on a later watermark, in a later message: every element the runner sent before the first
firing's message has been processed by then. The delay is 1 ms because Beam's Java runners keep
timers in milliseconds (a re-arm 1 us on fired again at the due time, for ever, on Flink).
A runner that fires the re-armed timer as soon as its watermark passes it (Beam's local
runners, with no such reordering) only costs one firing more.

    >>> from transforms.steps import TimeSteps
    >>> steps = TimeSteps(origin=0.0, size=10.0, horizon=5)
    >>> due = lambda step: int(round((steps.end(step) + 2.0) * 1e6))  # step end + 2 s
    >>> is_due_time(due(3), due, steps, 2.0), is_due_time(due(3) + SETTLE_MICROS, due, steps, 2.0)
    (True, False)
"""
from __future__ import annotations

from typing import Callable

from apache_beam.utils.timestamp import Timestamp

SETTLE_MICROS = 1000  # 1 ms: the finest time a Java runner's timer keeps


def whole_ms(micros: int) -> int:
    """`micros` rounded up to a whole millisecond: a step timer's due time. The Fn API carries
    timer times in milliseconds (rounded down: Beam's InstantCoder), so a due time between two
    would fire before the step end it stands for, and again, for ever."""
    return -(-micros // 1000) * 1000


def is_due_time(fire: int, due: Callable[[int], int], steps, after_end_seconds: float) -> bool:
    """Whether `fire` (micros) is exactly `due(k)` for a step k: the first firing of a timer set
    at due(k), the end of step k + `after_end_seconds` in micros (the step nearest by
    arithmetic, or a neighbour, is checked)."""
    if steps.size * 1e6 <= 2 * SETTLE_MICROS:  # steps of 2 ms or less: no room to settle in
        return False
    near = round((fire / 1e6 - after_end_seconds - steps.origin) / steps.size) - 1
    return any(k >= 0 and due(k) == fire for k in (near - 1, near, near + 1))


def settle(timer, fire: int) -> None:
    """A first firing's only work: the timer again, `SETTLE_MICROS` after `fire`."""
    timer.set(Timestamp(micros=fire + SETTLE_MICROS))
