"""One key's release of a window of steps: the rule the batch pipeline (`bounded`) and the
streaming release of privately selected keys (`selecting`) both run, so their records are
equal by construction. Its input is the key's exact step totals as an array and its mechanism
state; it touches no Beam state (the dead letter of a key of another type is a tagged output).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

from transforms.mechanisms.base import EXACT_LIMIT, counter_state
from transforms.mechanisms.selection import first_selected
from transforms.messages import dead_letter
from transforms.release import KEY_TYPES, RecordMaker, ReleaseConfig
from transforms.streams.records import Reason

EXACT_FLOAT = float(EXACT_LIMIT)  # exact totals (`RecordMaker.exact_totals`)




def other_key_type(key, config: ReleaseConfig):
    """A release selecting its keys releases one key type (5 and "5" would be published under
    one name): the dead letter of a key of another type (never released, whatever its data:
    an id rule), or None."""
    if type(key) is KEY_TYPES[config.key_type]:
        return None
    return dead_letter(key, Reason("invalid_record", f"key of type {type(key).__name__} "
                                                     f"{key!r} is not of the release's key "
                                                     f"type {config.key_type!r}: not released"))


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
    `state` (at step `first`): the one rule of both pipelines (`_ReleaseKeysFn`, and the
    streaming release of selected keys, `transforms.selecting`).

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
