"""A job config's `steps:` section: when steps start, how long they are, how many there are
(a horizon T, or `unbounded`), and the streaming release's timing."""
from __future__ import annotations

import dataclasses
import datetime

from transforms import validation as check
from transforms.steps import UNBOUNDED, TimeSteps
from transforms.validation import fail

TIME_RANGE = (-62135596800.0, 253402300799.0)  # years 1 .. 9999 (what timestamps can print)
MAX_HORIZON = 1 << 22


def parse_time(name, given) -> float:
    """ISO-8601 (with Z or an offset) or seconds since the epoch -> seconds."""
    if isinstance(given, datetime.datetime):
        if given.tzinfo is None:
            given = given.replace(tzinfo=datetime.timezone.utc)
        return given.timestamp()
    if isinstance(given, (int, float)) and not isinstance(given, bool):
        return float(given)
    if isinstance(given, str):
        try:
            parsed = datetime.datetime.fromisoformat(given.replace("Z", "+00:00"))
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed.timestamp()
    fail(name, "an ISO-8601 time with a timezone (e.g. 2026-01-05T00:00:00Z) or epoch seconds",
         given)


@dataclasses.dataclass(frozen=True)
class StepsSpec:
    origin: float                     # seconds since the epoch
    size_seconds: float
    horizon: int                      # with `unbounded`: the steps the release can reach
    # unbounded input only: step s is published when the watermark passes the end of step
    # s + release_delay_steps; an event counts until allowed_lateness_seconds after its step
    release_delay_steps: int = 1
    allowed_lateness_seconds: float = 0.0
    unbounded: bool = False           # `horizon: unbounded` (`transforms.steps.UNBOUNDED`)

    def time_steps(self) -> TimeSteps:
        return TimeSteps(self.origin, self.size_seconds, self.horizon, self.unbounded)

    @property
    def shown_horizon(self):
        """T, or 'unbounded' (as the config says it: `TimeSteps.shown_horizon`)."""
        return self.time_steps().shown_horizon


def steps_spec(steps: dict, streaming: bool) -> StepsSpec:
    """The `steps:` section (its keys already checked), validated; `streaming`: unbounded
    input (only it has a release delay and an allowed lateness)."""
    origin = parse_time("steps.origin", steps["origin"])
    if not TIME_RANGE[0] <= origin <= TIME_RANGE[1]:
        fail("steps.origin", "a time in the years 1 to 9999", steps["origin"])
    size = check.positive_finite("steps.size_seconds", steps["size_seconds"])
    if steps["horizon"] == UNBOUNDED:
        horizon = TimeSteps(origin, size, UNBOUNDED).horizon  # the steps it can reach
    else:
        horizon = steps["horizon"]
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            fail("steps.horizon", f"an integer >= 1, or {UNBOUNDED!r} (no horizon)", horizon)
        if horizon > MAX_HORIZON:  # per-key arrays of T values: memory and time stay bounded
            fail("steps.horizon", f"<= {MAX_HORIZON} (2^22 steps: each key holds T values), "
                                  f"or {UNBOUNDED!r}", horizon)
        if origin + size * horizon > TIME_RANGE[1]:
            fail("steps.size_seconds", "small enough that the last step ends before the year "
                                       "10000", steps["size_seconds"])
    timing = {}
    for name in ("release_delay_steps", "allowed_lateness_seconds"):
        if name in steps and not streaming:
            fail(f"steps.{name}", "absent for input.kind 'files' (a streaming setting)",
                 steps[name])
    if "release_delay_steps" in steps:
        timing["release_delay_steps"] = check.integer_at_least(
            "steps.release_delay_steps", steps["release_delay_steps"], 1)
    lateness = steps.get("allowed_lateness_seconds", 0)
    if isinstance(lateness, bool) or not isinstance(lateness, (int, float)) or not (
            0 <= lateness <= timing.get("release_delay_steps", 1) * size / 2):
        fail("steps.allowed_lateness_seconds", "a number of seconds in [0, release_delay_steps "
                                               "x size_seconds / 2] (a step's contributions "
                                               "reach its release before it is due)", lateness)
    timing["allowed_lateness_seconds"] = float(lateness)
    return StepsSpec(origin, size, horizon, **timing, unbounded=steps["horizon"] == UNBOUNDED)
