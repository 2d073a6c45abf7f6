"""The per-key state machine (transforms/key_state.py): one rule, tested against itself.

A key released over all its steps at once (a batch run) equals the same key released in any
split of windows (scheduled runs, streaming firings), bit for bit: records, dead letters and
the sealed state; the streaming release's fast path on sealed bytes (`step_sealed`) gives the
same records; the due rule releases a step only once the watermark and the wall clock passed
its release time.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from transforms import ContinualCount, ContinualRelease, TimeSteps
from transforms.key_state import KeyState, advance, due_stop, restore_or_start
from transforms.release import RecordMaker

HORIZON = 24
STEPS = TimeSteps(1_700_000_000.0, 60.0, HORIZON)


def maker(selects=False, mechanism="binary_tree", noise="discrete", **kwargs):
    keys = {} if selects else {"public_keys": ["a", "b"]}
    if selects:
        transform = ContinualCount(steps=STEPS, epsilon=1.0, selection_delta=1e-6,
                                   mechanism=mechanism, seed=3,
                                   insecure=True, noise=noise, **kwargs)
    else:
        transform = ContinualRelease(steps=STEPS, epsilon=1.0, mechanism=mechanism, seed=3,
                                     insecure=True, noise=noise, **keys, **kwargs)
    return RecordMaker(transform.config)


def split_release(make, key, x, cuts, tau=None, data_from=None):
    """Every window between consecutive cuts, each from the state the one before sealed."""
    saved, published, dead = None, [], []
    bounds = [0, *cuts, len(x)]
    for first, stop in zip(bounds, bounds[1:]):
        window = x[first:stop]
        starts = data_from if data_from is not None and first <= data_from < stop else None
        out, reasons, saved = advance(make, key, saved, window, first, data_from=starts,
                                      tau=tau)
        published += out
        dead += reasons
    return published, dead, saved


@pytest.mark.parametrize("mechanism,noise", [("binary_tree", "discrete"),
                                             ("smooth_binary", "discrete"),
                                             ("sqrt_toeplitz", "float"), ("blt", "float")])
@pytest.mark.parametrize("seed", range(4))
def test_one_window_equals_any_split_bit_for_bit(mechanism, noise, seed):
    rng = random.Random(seed)
    make = maker(mechanism=mechanism, noise=noise)
    x = np.array([float(rng.randint(-3, 9)) for _ in range(HORIZON)])
    whole = split_release(make, "a", x, [])
    cuts = sorted(rng.sample(range(1, HORIZON), rng.randint(1, 8)))
    split = split_release(make, "a", x, cuts)
    assert [(s, v.hex(), p.hex()) for s, v, p in whole[0]] == \
        [(s, v.hex(), p.hex()) for s, v, p in split[0]]
    assert whole[2] == split[2] and len(whole[0]) == HORIZON
    one_by_one = split_release(make, "a", x, list(range(1, HORIZON)))
    assert one_by_one[2] == whole[2]


@pytest.mark.parametrize("seed", range(4))
def test_a_selected_key_starts_at_its_first_data_in_every_split(seed):
    rng = random.Random(seed)
    make = maker(selects=True, mechanism="binary_tree")
    start = rng.randint(0, HORIZON - 6)
    x = np.zeros(HORIZON)
    x[start:] = [float(rng.randint(0, 40)) for _ in range(HORIZON - start)]
    tau = make.config.selection_threshold
    whole = split_release(make, "k", x, [], tau, data_from=start)
    split = split_release(make, "k", x, sorted(rng.sample(range(1, HORIZON), 5)), tau,
                          data_from=start)
    assert whole == split
    assert whole[2].start == start and whole[2].selected is not None and whole[0]
    assert [step for step, _, _ in whole[0]] == list(range(whole[2].selected, HORIZON))


def test_the_streaming_fast_path_gives_the_rules_records():
    """`RecordMaker.step_sealed` (the streaming release of public keys, one step at a time on
    its sealed bytes) publishes what `advance` publishes."""
    rng = random.Random(11)
    make = maker(mechanism="smooth_binary")
    x = np.array([float(rng.randint(0, 5)) for _ in range(HORIZON)])
    published, _, state = split_release(make, "b", x, [])
    sealed = make.seal("b", make.mechanism.init_state())
    fast = []
    for step in range(HORIZON):
        out, sealed = make.step_sealed("b", sealed, [x[step]] if x[step] else None, step)
        fast.append((step, out))
    assert [(s, v) for s, v, _ in published] == fast
    assert sealed == state.sealed


def test_a_public_key_without_state_after_step_0_is_refused():
    make = maker()
    with pytest.raises(RuntimeError, match="no saved state for public key 'a'"):
        restore_or_start(make, "a", None, 3, may_start=False)
    saved = KeyState(make.seal("a", make.mechanism.init_state()))
    with pytest.raises(ValueError, match=r"^`key state` must be at step 2 \(key 'a' is at 0\)"):
        restore_or_start(make, "a", saved, 2, may_start=False)


def test_a_halt_stops_the_key_for_good():
    make = maker()
    x = np.ones(HORIZON)
    published, _, state = advance(make, "a", None, x[:10], 0, halt=4)
    assert [s for s, _, _ in published] == [0, 1, 2, 3] and state.halted == 4
    later, _, state = advance(make, "a", state, x[10:], 10)
    assert later == [] and state.halted == 4


def test_due_stop_needs_the_watermark_and_the_wall_clock():
    def release_micros(step):
        return (step + 2) * 1_000

    far = 10 ** 9
    assert due_stop(release_micros, 10, 0, fire=4_500, now=far) == (3, (False, 5_000))
    assert due_stop(release_micros, 10, 0, fire=far, now=3_000) == (2, (True, 4_000))  # clock
    assert due_stop(release_micros, 10, 3, fire=far, now=far) == (10, None)  # the horizon
    assert due_stop(release_micros, 10, 3, fire=far, now=far, halted=5) == (5, None)
    assert due_stop(release_micros, 10, 4, fire=4_500, now=far) == (4, (False, 6_000))
    assert due_stop(release_micros, 10, 10, fire=0, now=0) == (10, None)
