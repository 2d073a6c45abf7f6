"""Key states in step checkpoints (transforms/key_history.py): a growing history is written as
its step's own entry and rebuilt, byte for byte, by reading the steps in order."""
from __future__ import annotations

import random

import pytest

from transforms.key_history import ENTRY, Histories, compacted, digest
from transforms.mechanisms.state import CounterState, HistoryState


def sealed(tag: bytes, state) -> bytes:
    return tag + state.to_bytes()


@pytest.mark.parametrize("seed", range(20))
def test_random_releases_rebuild_every_keys_state_at_every_step(seed):
    """Keys with growing histories (signed values, up to +-2^40), some halting (their state
    frozen, written whole with their halt step), a counter key; a continuation may start at
    any step (a fresh `Histories` reading from step 0): the rebuilt states equal the states
    written, and a history that advanced by one step is never written whole."""
    rng = random.Random(seed)
    tags = {key: bytes([i]) * 16 for i, key in enumerate(("a", "b", 7, "c"))}
    truth = {key: HistoryState() for key in ("a", "b", 7)}
    halted = {}
    written = []
    for step in range(rng.randrange(1, 60)):
        states = []
        for key in ("a", "b", 7):
            if key not in halted and rng.random() < 0.03:
                halted[key] = step
            if key not in halted:
                old = truth[key]
                truth[key] = HistoryState(old.steps + 1,
                                          old.inputs + (rng.randint(-2 ** 40, 2 ** 40),),
                                          old.rounded + (rng.randint(-2 ** 40, 2 ** 40),))
            states.append((key, (sealed(tags[key], truth[key]), halted.get(key))))
        states.append(("c", (sealed(tags["c"], CounterState(step + 1, 3.5 * step)), None)))
        entries = compacted(states, step)
        for (key, value), (_, entry) in zip(states, entries):
            assert (entry[0] == ENTRY) == (key != "c" and key not in halted), (key, step)
        written.append((entries, dict(states)))
    for first in range(len(written)):
        histories = Histories()
        for step in range(first + 1):
            histories.add(step, written[step][0])
        assert histories.states() == written[first][1]


def test_a_step_entry_without_its_history_is_refused():
    tag = bytes(16)
    states = [sealed(tag, HistoryState(s + 1, tuple(range(s + 1)), tuple(range(s + 1))))
              for s in range(3)]
    entries = [compacted([("k", (states[s], None))], s) for s in range(3)]
    histories = Histories()
    histories.add(0, entries[0])
    with pytest.raises(ValueError, match=r"^`checkpoint` must be holding key 'k''s history "
                                         r"before step 2"):
        histories.add(2, entries[2])  # step 1 skipped
    other = Histories()
    other.add(0, compacted([("k", (bytes([9]) * 16 + states[0][16:], None))], 0))
    with pytest.raises(ValueError, match=r"^`checkpoint` must be holding key 'k''s history"):
        other.add(1, entries[1])  # another tag: another release's or key's history


def test_a_step_entry_is_the_same_at_every_step():
    """O(1) per key and step, however long the history (a whole one is 16 B per step)."""
    tag = bytes(16)
    for steps in (1, 100, 10_000):
        state = HistoryState(steps, (7,) * steps, (9,) * steps)
        assert compacted([("k", (sealed(tag, state), None))], steps - 1) == [
            ("k", (ENTRY, tag, 7, 9, digest(sealed(tag, state))))]
        # not its step: whole
        assert compacted([("k", (sealed(tag, state), None))], steps) == [
            ("k", (sealed(tag, state), None))]


def test_steps_written_from_two_histories_are_never_resumed_as_a_mix():
    """An execution checkpointed steps 0 and 1, another step 2 from its own history (another
    x at step 1): the rebuilt history is refused by the last entry's digest, not resumed."""
    tag = bytes(16)
    ours = [HistoryState(1, (5,), (50,)), HistoryState(2, (5, 1), (50, 11))]
    theirs = HistoryState(3, (5, 9, 3), (50, 99, 33))
    histories = Histories()
    for step, state in enumerate(ours):
        histories.add(step, compacted([("k", (sealed(tag, state), None))], step))
    histories.add(2, compacted([("k", (sealed(tag, theirs), None))], 2))
    with pytest.raises(ValueError, match=r"^`checkpoint` must be holding key 'k''s history as "
                                         r"its last step wrote it"):
        histories.states()
