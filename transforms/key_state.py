"""One key's release, Beam-free: the per-key state machine every release DoFn runs.

- `KeyState`: what a key keeps between windows (its sealed mechanism state, its halt step and,
  selecting keys, its first step with data and its selection step).
- `advance`: restore-or-start, then `release_window` (the rule: exact-totals halts, key
  selection, what is published), then seal. The batch pipeline (`bounded`) and the streaming
  release of privately selected keys (`selecting`) both run it, so their records are equal by
  construction; the streaming release of public keys steps one key and step at a time on its
  sealed bytes (`RecordMaker.step_sealed`, a fast path tested bit for bit against it).
- `due_stop`: when a step is due on unbounded input (its release time passed by
  the watermark and by the wall clock) and what a release timer does next: the one rule of
  `streaming.ReleaseStreamingFn` and `selecting.ReleaseBucketFn`.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Tuple

import numpy as np

from transforms.mechanisms.base import EXACT_LIMIT, counter_state
from transforms.mechanisms.selection import first_selected
from transforms.release import KEY_TYPES, RecordMaker, ReleaseConfig
from transforms.release import key_text
from transforms.streams.records import Reason
from transforms.validation import fail

EXACT_FLOAT = float(EXACT_LIMIT)  # exact totals (`RecordMaker.exact_totals`)


class KeyState(NamedTuple):
    """A key's release state between windows: its sealed mechanism state (`RecordMaker.seal`:
    bound to the release, its secret and the key), its halt step and, selecting keys, its first
    step with data and its selection step (None: not yet)."""
    sealed: bytes
    halted: Optional[int] = None
    start: Optional[int] = None
    selected: Optional[int] = None

    def wire(self, selects: bool) -> tuple:
        """As checkpoints hold it: (sealed, halted); selecting (sealed, halted, start,
        selected)."""
        return tuple(self) if selects else (self.sealed, self.halted)


def restore_or_start(maker: RecordMaker, key, saved: Optional[KeyState], first: int,
                     may_start: bool):
    """The key's mechanism state at step `first`: restored from `saved` (refused unless sealed
    by this release for this key), else, where a key may start (`may_start`: a release from
    step 0, or a key selected privately, whose stream is the public-key stream from step 0),
    a new state advanced over `first` steps of no data (noise only, never published)."""
    if saved is not None:
        state = maker.restore(key, saved.sealed)
    elif may_start:
        state = maker.mechanism.init_state()
        if first:
            maker.reach(first)
            _, state = maker.for_key(key).advance(state, np.zeros(first))
    else:
        raise RuntimeError(f"no saved state for public key {key_text(key)!r}")
    if state.steps != first:
        fail("key state", f"at step {first} (key {key_text(key)!r} is at {state.steps})",
             state.steps)
    return state


def advance(maker: RecordMaker, key, saved: Optional[KeyState], x: np.ndarray, first: int,
            halt: Optional[int] = None, data_from: Optional[int] = None,
            tau: Optional[float] = None, may_start: bool = True) -> Tuple[list, list, KeyState]:
    """One key's release of steps first .. first + len(x) - 1 (x: its exact step totals, a
    halted step's not added): (published (step, value, previous), dead-letter reasons, its new
    KeyState). `halt`: the earliest step the truncation halted the key at in this window;
    `data_from`: its first step with data here (it starts a selected key's stream)."""
    state = restore_or_start(maker, key, saved, first, may_start)
    halted, start, selected = (None, None, None) if saved is None else saved[1:]
    if halt is not None:
        halted = halt if halted is None else min(halted, halt)
    if start is None:
        start = data_from
    run = release_window(maker, key, state, x, first, halted, start, selected, tau)
    return run.published, run.dead, KeyState(maker.seal(key, run.state), run.halted,
                                             run.start, run.selected)


def due_stop(release_micros: Callable[[int], int], horizon: int, released: int, fire: int,
             now: int, halted: Optional[int] = None) -> Tuple[int, Optional[Tuple[bool, int]]]:
    """The steps due at a release timer's firing, released .. stop - 1, and what the timer
    sets next: (stop, wake).

    A step is due when the watermark (`fire`, micros) passed its release time
    (`release_micros(step)`: the end of step + release_delay_steps) and the wall clock (`now`)
    did too: a drain moves the watermark to the end of time, which must not release the steps
    still to come (with no data) and seal the release early. Never the horizon or a halted
    key's halt step and after. `wake`: None when the key is done (the horizon or its halt);
    (True, t) when step `stop` is held by the wall clock (its release time t is behind the
    firing: an event-time timer would fire at once, so a processing-time timer re-checks it at
    t); else (False, t), the event-time timer of step `stop` (also after a firing with nothing
    due: the local runner repeats a firing, and the repeat clears the timer the first one
    set)."""
    due = min(fire, now)
    stop = released
    end = horizon if halted is None else min(horizon, halted)
    while stop < end:
        following = release_micros(stop)
        if following > due:
            return stop, (following <= fire, following)
        stop += 1
    return stop, None


def other_key_type(key, config: ReleaseConfig) -> Optional[Reason]:
    """A release selecting its keys releases one key type (5 and "5" would be published under
    one name): the reason a key of another type is never released, whatever its data (an id
    rule; the DoFns dead-letter it), or None."""
    if type(key) is KEY_TYPES[config.key_type]:
        return None
    return Reason("invalid_record", f"key of type {type(key).__name__} {key!r} is not of the "
                                    f"release's key type {config.key_type!r}: not released")


class KeyWindow(NamedTuple):
    """What `release_window` gives: the (step, value, previous) to publish, the key's new
    state and halt step, and, selecting keys, its first step with data and selection step;
    `dead`: the reasons of its exact-totals halts (dead letters)."""
    published: list
    state: Any
    halted: Optional[int]
    start: Optional[int]
    selected: Optional[int]
    dead: list


def release_window(maker: RecordMaker, key, state, x: np.ndarray, first: int,
                   halted: Optional[int] = None, start: Optional[int] = None,
                   selected: Optional[int] = None, tau: Optional[float] = None) -> KeyWindow:
    """One key's release of steps first .. first + len(x) - 1 (x: its exact step totals) from
    `state` (at step `first`): the rule `advance` runs for every release of a window.

    Exact totals (discrete noise): a step total, running total or released value reaching
    2^53 in magnitude halts the key at that step (`RecordMaker.exact_totals`). `tau` (keys
    selected privately): a key is published from the first step >= `start` (its first data)
    whose released value reaches tau (`selection.first_selected`), and every step after."""
    dead = []
    over = maker.exact_halt(state, x)  # exact totals: None unless a total reaches 2^53
    stop = first + x.shape[0]
    if over is not None:
        x = x.copy()
        x[over:] = 0.0  # not summed: the key's state keeps its exact total
        if halted is None or first + over < halted:
            halted = first + over
            dead.append(maker.limit_reason(key, halted))
        if over == 0 and not -EXACT_FLOAT < state.running_total < EXACT_FLOAT:  # (an old state's)
            state = counter_state(stop, state.running_total)  # the steps only
            x = x[:0]
    maker.reach(stop)
    stream = maker.for_key(key)
    before = state
    outputs, state = stream.advance(state, x) if x.shape[0] else ((), state)
    if maker.exact_totals:  # a released value reaching 2^53 halts the key too
        count = len(outputs) if halted is None else halted - first
        over = maker.exact_outputs(outputs, count)
        if over is not None:
            halted = first + over
            dead.append(maker.limit_reason(key, halted))
    if tau is not None and selected is None and start is not None:
        count = len(outputs) if halted is None else max(0, min(len(outputs), halted - first))
        found = first_selected(outputs[:count], tau, max(start - first, 0))
        selected = None if found is None else first + found
    published = []
    # the window's first published step, if any (a key selected before: the window's first)
    since = first if tau is None else None if selected is None else max(first, selected)
    if since is None or since >= first + len(outputs):
        return KeyWindow(published, state, halted, start, selected, dead)
    # the release at since - 1: derived from the state only when it is first - 1 (its noise
    # again; O(t) for the discrete square root), an unselected key's window derives nothing
    previous = (0.0 if since == 0 else stream.last_output(before) if since == first
                else float(outputs[since - first - 1]))
    for offset in range(since - first, len(outputs)):
        step = first + offset
        if halted is not None and step >= halted:
            break
        value = float(outputs[offset])
        published.append((step, value, previous))
        previous = value
    return KeyWindow(published, state, halted, start, selected, dead)
