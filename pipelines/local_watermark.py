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

`Pacer` restores the order on the local runner: the reader's watermark crosses a deadline
(a step end, or a step end + the lateness) only once nothing behind it is in flight: no
element older than it waiting in any stage or in the reader's last pull, no fired timer
unfinished, no timer set before it (`in_flight_before`). So the timers set at one deadline
fire, and their outputs arrive, before the next deadline's fire. A pipeline busy behind a
deadline for `slack` seconds without pause crosses it anyway (an overloaded job keeps
releasing; its late contributions are `late` dead letters, as before). The reader's own
watermark (the wall clock) is never exceeded.
"""
from __future__ import annotations

import heapq
import math
import time
from typing import Callable, Iterable, Iterator, List, Optional

from transforms.settle import SETTLE_MICROS, release_due, step_end_due

SLACK_SECONDS = 10.0
RECHECK_SECONDS = 0.05  # a blocked deadline's next check, at the soonest


class Pacer:
    """The highest watermark the reader may report, crossing `points` (micros) in order.

    A deadline q <= the reader's own watermark is crossed when nothing is in flight behind it
    (`blocked(q)` is false: no element older than q waiting, no fired timer unfinished, no
    timer set before q): all such deadlines up to the first blocked one at once, since crossing
    them fires nothing or only the timers set exactly at the last one. A deadline blocked for
    `slack` seconds is crossed alone.

    Args:
      points: the deadlines (micros since the epoch).
      slack: seconds after which a blocked deadline is crossed anyway.
      clock: wall-clock seconds (injected by tests).

    >>> pacer = Pacer([10, 20, 30], slack=5.0, clock=lambda: 0.0, every=0.0)
    >>> pacer.hold(100, lambda point: point == 20)  # work behind 20: just below it
    19
    >>> pacer.hold(100, lambda point: False)  # nothing behind any deadline: the reader's own
    100
    """

    def __init__(self, points: Iterable[int], slack: float = SLACK_SECONDS,
                 clock: Callable[[], float] = time.time, every: float = RECHECK_SECONDS):
        # a collection is sorted here; any other iterable is read lazily, in ascending order
        # (`deadlines`: a release with no horizon has 2^21 of them)
        self._points = iter(sorted(set(points)) if isinstance(points, (list, tuple, set))
                            else points)
        self.point: Optional[int] = None  # the first deadline not yet crossed (None: none)
        self._cross()
        self.slack, self.clock, self.every = slack, clock, every
        self.waiting_since: Optional[float] = None
        self.checked = -math.inf  # when a blocked deadline was last checked (clock)

    def _cross(self) -> None:
        """The next deadline after `point` (repeats skipped)."""
        last = self.point
        point = next(self._points, None)
        while point is not None and last is not None and point <= last:
            point = next(self._points, None)
        self.point = None if point is None else int(point)

    def hold(self, now: int, blocked: Callable[[int], bool]) -> int:
        """-> the watermark (micros) for a reader bundle that would report `now`. A blocked
        deadline is checked again `every` seconds at most (a check walks the runner's
        pending work and timers: checked at every pull of a busy job, it slows it down)."""
        if self.point is not None and self.point <= now:
            clock = self.clock()
            if clock - self.checked < self.every:
                pass  # checked a moment ago: still blocked
            elif not blocked(self.point):
                self._cross()
                while self.point is not None and self.point <= now and \
                        not blocked(self.point):
                    self._cross()
                self.waiting_since = None
                self.checked = -math.inf
            else:
                self.checked = clock
                if self.waiting_since is None:
                    self.waiting_since = clock
                if clock - self.waiting_since >= self.slack:
                    self._cross()
                    self.waiting_since = None
                    self.checked = -math.inf
        if self.point is not None:
            return min(now, self.point - 1)
        return now


def deadlines(steps, first: int, lateness_seconds: float, delay_steps: int) -> Iterator[int]:
    """The release's event-time deadlines from step `first` (micros, the timers' own due times in
    `transforms.settle`), in ascending order, computed as they are read: each step's end + the
    allowed lateness (its contributions leave the unit stage) and each release time (the end
    of step s + delay_steps)."""
    lateness = int(round(lateness_seconds * 1e6))
    ends = (release_due(steps, s, 0) for s in range(first, steps.horizon + delay_steps))
    flushes = (step_end_due(steps, s, lateness) for s in range(first, steps.horizon))
    return heapq.merge(ends, flushes)  # each ascending in s


def in_flight_before(evaluator, pulled, micros: int) -> bool:
    """Whether Beam's local runner has work behind `micros`: a message of the reader's pull
    `pulled` ((timestamp, message) pairs, not yet committed), an element older than it waiting
    in or being processed by another stage, a fired timer not yet finished, or an event-time
    timer set before it (not fired yet; not one armed for it, `transforms.settle`)."""
    if any(stamp.micros < micros for stamp, _ in pulled):
        return True
    from apache_beam.transforms.timeutil import TimeDomain
    manager = evaluator._evaluation_context._watermark_manager
    reader = evaluator._applied_ptransform
    stages = [marks for transform, marks in list(manager._transform_to_watermarks.items())
              if transform is not reader]
    for marks in stages:  # the cheap checks first: fired timers, waiting elements
        with marks._lock:
            if marks._fired_timers:
                return True
            for bundle in marks._pending:
                for value in bundle.get_elements_iterable():
                    if value.timestamp.micros < micros:
                        return True
    armed = micros - SETTLE_MICROS  # a step timer armed for this deadline acts only at it
    for marks in stages:  # then every key's timers
        with marks._lock:
            for state in list(marks._keyed_states.values()):
                for timers in list(state.timers.values()):
                    for (_, domain, _), stamp in list(timers.items()):
                        if domain == TimeDomain.WATERMARK and stamp.micros < micros and \
                                stamp.micros != armed:
                            return True
    return False


# the pacer of this process's local streaming job (`pace`), or None
PACER: List[Optional[Pacer]] = [None]


def pace(pacer: Optional[Pacer]) -> None:
    """Paces the local reader's watermark with `pacer` (None: the reader's own, the clock)."""
    PACER[0] = pacer


def paced_hold(evaluator, pulled, hold, drained: float = math.inf):
    """The reader bundle's watermark hold (a Timestamp), paced when a pacer is set: at most
    `drained` (seconds: the subscription is read up to it, `local_pubsub.Drained`), and
    crossing the release's deadlines in order (`Pacer`)."""
    pacer = PACER[0]
    if pacer is None or hold is None:
        return hold
    from apache_beam.utils.timestamp import MIN_TIMESTAMP, Timestamp
    now = hold.micros if drained >= hold.micros / 1e6 else \
        MIN_TIMESTAMP.micros if drained == -math.inf else int(math.floor(drained * 1e6))
    return Timestamp(micros=pacer.hold(
        now, lambda micros: in_flight_before(evaluator, pulled, micros)))
