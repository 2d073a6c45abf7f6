"""The watermark of Beam's local Pub/Sub reader, paced so that a step is released only after
every unit's contribution to it arrived.

A streaming release has two event-time deadlines per step s: the truncation stage's timer at
the end of s + the allowed lateness (each unit's contribution to s leaves the unit stage), and
the release stage's timer at the end of s + release_delay_steps (the step is released). On
Dataflow (and any portable runner) a timer holds its stage's output watermark, so s's
contributions reach the release stage before its watermark passes s's release time. Beam's
local runner (`runners/direct`: its timers hold no watermark, and its Pub/Sub reader reports
the wall clock as its watermark) gets this only while the watermark moves with the clock: a
watermark that jumps across both deadlines at once (a continuation catching up, a job that was
paused, a backlog read after a restart) fires both timers together, and s's contributions
arrive after s was released (`late` dead letters, although s was not yet published).

`Pacer` restores the order on the local runner: the reader's watermark crosses the deadlines
(every step end, and every step end + the lateness) one at a time, and a deadline only once
nothing behind it is in flight: no fired timer unfinished and no element older than it waiting
in any stage or in the reader's last pull (`in_flight_before`). A pipeline busy behind a
deadline for `slack` seconds without pause crosses it anyway (an overloaded job keeps
releasing; its late contributions are `late` dead letters, as before). The reader's own
watermark (the wall clock) is never exceeded.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, List, Optional

SLACK_SECONDS = 10.0


class Pacer:
    """The highest watermark the reader may report, crossing `points` (micros) in order.

    Args:
      points: the deadlines (micros since the epoch) the watermark crosses one at a time.
      slack: seconds after which a deadline is crossed although work behind it is in flight.
      clock: wall-clock seconds (injected by tests).

    >>> pacer = Pacer([10, 20], slack=5.0, clock=lambda: 0.0)
    >>> pacer.hold(100, lambda point: False)  # crosses 10, waits just below 20
    19
    >>> pacer.hold(100, lambda point: True)  # work older than 20 in flight: waits
    19
    >>> pacer.hold(100, lambda point: False), pacer.hold(100, lambda point: False)
    (100, 100)
    """

    def __init__(self, points: Iterable[int], slack: float = SLACK_SECONDS,
                 clock: Callable[[], float] = time.time):
        self.points: List[int] = sorted(set(int(p) for p in points))
        self.slack, self.clock = slack, clock
        self.next = 0  # the first deadline not yet crossed
        self.waiting_since: Optional[float] = None

    def hold(self, now: int, in_flight: Callable[[int], bool]) -> int:
        """-> the watermark (micros) for a reader bundle that would report `now`: at most one
        more deadline crossed per call, when `in_flight(deadline)` is false or the deadline
        waited `slack` seconds."""
        points = self.points
        if self.next < len(points) and points[self.next] <= now:
            clock = self.clock()
            if self.waiting_since is None:
                self.waiting_since = clock
            if clock - self.waiting_since >= self.slack or not in_flight(points[self.next]):
                self.next += 1
                self.waiting_since = None
        if self.next < len(points):
            return min(now, points[self.next] - 1)
        return now


def deadlines(steps, first: int, lateness_seconds: float, delay_steps: int) -> List[int]:
    """The release's event-time deadlines from step `first` (micros): each step's end + the
    allowed lateness (its contributions leave the unit stage) and each release time (the end
    of step s + delay_steps)."""
    lateness = int(round(lateness_seconds * 1e6))
    ends = [int(round(steps.end(s) * 1e6)) for s in range(first, steps.horizon + delay_steps)]
    flushes = [int(round(steps.end(s) * 1e6)) + lateness for s in range(first, steps.horizon)]
    return ends + flushes


def in_flight_before(evaluator, pulled, micros: int) -> bool:
    """Whether Beam's local runner has work behind `micros`: a message of the reader's pull
    `pulled` ((timestamp, message) pairs, not yet committed), an element older than it waiting
    in or being processed by another stage, or a fired timer not yet finished."""
    if any(stamp.micros < micros for stamp, _ in pulled):
        return True
    manager = evaluator._evaluation_context._watermark_manager
    reader = evaluator._applied_ptransform
    for transform, marks in list(manager._transform_to_watermarks.items()):
        if transform is reader:
            continue
        with marks._lock:
            if marks._fired_timers:
                return True
            for bundle in marks._pending:
                for value in bundle.get_elements_iterable():
                    if value.timestamp.micros < micros:
                        return True
    return False


# the pacer of this process's local streaming job (`pace`), or None
PACER: List[Optional[Pacer]] = [None]


def pace(pacer: Optional[Pacer]) -> None:
    """Paces the local reader's watermark with `pacer` (None: the reader's own, the clock)."""
    PACER[0] = pacer


def paced_hold(evaluator, pulled, hold):
    """The reader bundle's watermark hold (a Timestamp), paced when a pacer is set."""
    pacer = PACER[0]
    if pacer is None or hold is None:
        return hold
    from apache_beam.utils.timestamp import Timestamp
    return Timestamp(micros=pacer.hold(
        hold.micros, lambda micros: in_flight_before(evaluator, pulled, micros)))
