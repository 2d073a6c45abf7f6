"""The streaming DoFns' fast paths (issue 14) give the reference results, bit for bit.

`ReleaseStreamingFn` (and `TruncateStreamingFn` where a test needs both) is called directly
with fake Beam state (`tests.support.fake_state`); the tree mechanisms' scalar step
(`_unit_noise_one`, by cached node plans and block views) is checked against the vectorised
`_unit_noise`.
"""
from __future__ import annotations

import dataclasses
import math
import random
import struct

import numpy as np
import pytest
from apache_beam.utils.timestamp import Timestamp

from transforms import ContinualCount, SecretRef, TimeSteps
from transforms.mechanisms import ConstantNoiseSource, make
from transforms.messages import DEAD_LETTER, Delta, Seed, StepTotal
from transforms.settle import SETTLE_MICROS
from tests.support.fake_state import Cells, Timer, fired
from transforms.stream_truncation import TruncateStreamingFn
from transforms.streaming import ReleaseStateCoder, ReleaseStreamingFn
from transforms.streams import ContributionBounds
from transforms.streams.units import CountProblem, advance_unit, steps_to_run

ORIGIN, SIZE, HORIZON = 1_700_000_000.0, 60.0, 9
STEPS = TimeSteps(ORIGIN, SIZE, HORIZON)


def test_fast_state_coder_is_fast_primitives_bit_for_bit():
    """The truncation state's coder writes FastPrimitivesCoder's bytes and reads back the
    same types (an int stays an int, -0.0 keeps its sign), and pickles (Beam ships it)."""
    import pickle
    from apache_beam.coders import FastPrimitivesCoder
    from transforms.messages import FastStateCoder
    coder, reference = FastStateCoder(), FastPrimitivesCoder()
    for value in [(0, None, None), (3, 5, (5, 1_700_000_000_123_456, ("a", 1.0))),
                  (2 ** 40, -1, (True, 1, 1.0, -0.0, b"x", "\u00e9", ("g", (1, 2)))),
                  (0.1, ()), [1, 2], {"k": [1.5]}]:
        encoded = coder.encode(value)
        assert encoded == reference.encode(value)
        decoded = coder.decode(encoded)
        assert decoded == value and repr(decoded) == repr(value)
    # what Beam's coder would pickle goes through the checkpoint codec instead (no pickle)
    assert coder.decode(coder.encode(frozenset({1}))) == frozenset({1})
    copy = pickle.loads(pickle.dumps(coder))
    assert copy == coder and copy.decode(coder.encode((1, "a"))) == (1, "a")


def test_release_state_coder_round_trips_exactly():
    coder = ReleaseStateCoder()
    sealed = bytes(range(33))
    # one layout whatever the path: header, sealed bytes, (step, count, partials) per step
    assert coder.encode((sealed, 5, None, {6: [1.5]})) == \
        struct.pack("<IiiI", 5, -1, 33, 1) + sealed + struct.pack("<IId", 6, 1, 1.5)
    assert coder.encode((sealed, 5, 2, {})) == struct.pack("<IiiI", 5, 2, 33, 0) + sealed
    for value in [(None, 0, None, {}), (b"x" * 33, 5, None, {6: [1.0]}),
                  (sealed, 3, 2, {}), (sealed, 3, None, {4: [1.0, 2.0]}),
                  (sealed, 3, None, {4: [1.0], 5: [-0.0]}), (b"x" * 17, 1, None, {2: [3.0]}),
                  (b"", 7, 3, {8: [0.1, 1e-17], 9: [-0.0], 12: [2.0 ** 60, -3.5, 1e-300]}),
                  (b"s" * 4000, 2 ** 31 - 1, 0, {})]:
        decoded = coder.decode(coder.encode(value))
        assert decoded == value
        for step, partials in value[3].items():
            assert [struct.pack("<d", v) for v in decoded[3][step]] == \
                   [struct.pack("<d", v) for v in partials]


def test_a_total_seen_after_its_release_times_first_firing_is_released():
    """The same order at the release stage: a step total the runner sent before the watermark
    that fired the release timer, seen after that firing, is in the step's record (equal to one
    total of their sum, same noise); a total after the second firing is late."""
    records = []
    for parts in ([2.0, 3.0], [5.0]):
        fn, cells = _release_fn(), Cells()
        list(fn.process(("a", Seed()), **cells.bind(fn.process)) or [])
        assert not list(fn.process(("a", StepTotal(0, parts[0])), **cells.bind(fn.process))
                        or [])
        due = cells.timer.time
        assert list(fn.release(**cells.bind(fn.release, key="a", fire=due))) == []
        for part in parts[1:]:
            assert not list(fn.process(("a", StepTotal(0, part)), **cells.bind(fn.process))
                            or [])
        records.append([r.value for r in fn.release(**cells.bind(fn.release, key="a",
                                                                 fire=cells.timer.time))])
        late = list(fn.process(("a", StepTotal(0, 1.0)), **cells.bind(fn.process)))
        assert late[0].tag == DEAD_LETTER
    assert [r["step"] for r in records[0]] == [0] and records[0] == records[1]


def test_step_timers_are_due_at_whole_ms_so_a_runner_in_ms_fires_them_on_time():
    """The Fn API carries timer times in milliseconds, rounded down: a due time between two
    (an origin, size and lateness of fractions of a ms) would come back before its step's end
    and close nothing, for ever. Due times are whole ms, rounded up: the runner's firings,
    in ms, close each step and release it."""
    steps = TimeSteps(1_700_000_000.0004, 1 / 3, 9)
    problem = CountProblem(ContributionBounds(3, 2, 2))
    fn = TruncateStreamingFn(problem, steps, False, lateness_seconds=0.0107)
    fn.setup()
    cells = Cells()
    assert not list(fn.process((0, None), **cells.bind(fn.process)) or [])  # the seed
    for step in range(steps.horizon):
        at = int(round(steps.start(step) * 1e6)) + 1
        if step in (0, 4, 8):
            assert not list(fn.process((0, ("u", (step, at, ("a", 1.0)))),
                                       **cells.bind(fn.process)) or [])
        out = []
        for firing in (0, 1):  # armed 1 ms before the due time, then at it; in ms, as a
            at = cells.timer.time.micros  # runner hands them back
            assert at % 1000 == 0
            assert at + (1 - firing) * SETTLE_MICROS >= steps.end(step) * 1e6 + 10_700
            out = list(fn.flush(fire=Timestamp(micros=at // 1000 * 1000),
                                **cells.bind(fn.flush)))
        assert [item.value for item in out] == [(("a", step), Delta(1.0))] * (step in (0, 4, 8))
    transform = ContinualCount(steps=steps, public_keys=["a"], epsilon=1.0,
                               mechanism="binary_tree", secret=SecretRef(literal=b"perf"),
                               insecure=True, release_id="0123456789abcdef0123456789abcdef")
    release, cells = ReleaseStreamingFn(transform.config, transform.public_keys), Cells()
    release.setup()
    list(release.process(("a", Seed()), **cells.bind(release.process)) or [])
    for step in range(3):
        for _ in range(2):
            at = cells.timer.time.micros
            assert at % 1000 == 0
            out = list(release.release(**cells.bind(release.release, key="a",
                                                    fire=Timestamp(micros=at))))
        assert [r.value["step"] for r in out] == [step]


def _release_fn(mechanism="binary_tree"):
    transform = ContinualCount(steps=STEPS, public_keys=["a", "b"], epsilon=1.0,
                               mechanism=mechanism, secret=SecretRef(literal=b"perf"), insecure=True,
                               release_id="0123456789abcdef0123456789abcdef")
    fn = ReleaseStreamingFn(transform.config, transform.public_keys)
    fn.setup()
    return fn


def test_release_timer_refuses_a_swapped_key_state_and_late_totals_are_dead_letters():
    fn = _release_fn()
    a, b = Cells(), Cells()
    for key, cells in (("a", a), ("b", b)):
        assert not list(fn.process((key, Seed()), **cells.bind(fn.process)) or [])
        assert not list(fn.process((key, StepTotal(0, 2.0)), **cells.bind(fn.process)) or [])
        records = fired(fn.release, cells, key)
        assert [r.value["step"] for r in records] == [0]
    late = list(fn.process(("a", StepTotal(0, 1.0)), **a.bind(fn.process)))
    assert late[0].tag == DEAD_LETTER and "late: step 0 of key 'a'" in late[0].value["reason"]
    assert not list(fn.process(("zz", StepTotal(1, 1.0)), **a.bind(fn.process)) or [])
    # b's state under key a: refused (it would re-draw published noise)
    swapped = Cells()
    swapped.cells, swapped.timer.time = b.cells, b.timer.time
    with pytest.raises(ValueError, match=r"`state` must be state of release"):
        fired(fn.release, swapped, "a")
    # a state cell that hands out its one decoded object (a caching state backend): the
    # refused release leaves the step's pending sums in it
    assert not list(fn.process(("b", StepTotal(1, 5.0)), **b.bind(fn.process)) or [])
    cached = b.cells["release_state"].read()

    class Cached:
        def read(self):
            return cached

    with pytest.raises(ValueError, match=r"`state` must be state of release"):
        list(fn.release(key="a", fire=Timestamp(micros=b.timer.time.micros + SETTLE_MICROS),
                        state=Cached(), timer=Timer()))
    assert cached[3] == {1: [5.0]}


def test_release_records_equal_the_vectorised_release():
    """Streaming step by step (with pending totals of later steps and fractional-free counts)
    gives the batch `advance` values for every step."""
    fn = _release_fn("kary_subtraction")
    rng = np.random.default_rng(3)
    x = rng.integers(0, 4, HORIZON).astype(float)
    cells = Cells()
    list(fn.process(("a", Seed()), **cells.bind(fn.process)) or [])
    values = []
    for step in range(HORIZON):
        for part in (x[step] - 1.0, 1.0):
            list(fn.process(("a", StepTotal(step, float(part))), **cells.bind(fn.process))
                 or [])
        values.extend(r.value["value"] for r in fired(fn.release, cells, "a"))
    maker = fn.maker
    expected, _ = maker.for_key("a").advance(maker.mechanism.init_state(), x)
    assert values == [int(v) for v in expected]


TREES = [("binary_tree", {}), ("kary_tree", {"k": 3}), ("kary_subtraction", {"k": 4}),
         ("kary_subtraction", {"k": 5}), ("smooth_binary", {}),
         ("smooth_binary", {"prune": True})]


@pytest.mark.parametrize("name,params", TREES)
def test_tree_scalar_noise_is_the_batch_noise_bit_for_bit(name, params):
    """Node plans are cached per step and shared by streams stepping together; a stream
    stepping alone reads its nodes as it finds them: interleaved streams, and a stream alone,
    each get their own batch noise; signed zeros of a constant -0.0 source are kept too."""
    for horizon in (1, 5, 37, 300):
        for source in (None, ConstantNoiseSource(-0.0), ConstantNoiseSource(-1.5)):
            for noise, together in (("discrete", True), ("float", True), ("discrete", False),
                                    ("float", False)):
                extra = {"seed": horizon} if source is None else {"noise_source": source}
                mechanism = make(name, horizon, epsilon=1.0, noise=noise, **params, **extra)
                streams = [mechanism.for_stream(s) for s in (("a", 1, b"a") if together
                                                             else ("a",))]
                batch = [s._unit_noise(0, horizon) for s in streams]
                for step in range(1, horizon + 1):
                    for stream, reference in zip(streams, batch):
                        got = stream._step_noise(step - 1)
                        assert struct.pack("<d", got) == struct.pack("<d", reference[step - 1])
                if source is None and horizon > 1 and together:
                    assert not np.array_equal(batch[0], batch[1])


@pytest.mark.parametrize("plan_steps", [None, 3])
@pytest.mark.parametrize("name,params", TREES)
def test_reused_level_totals_follow_any_order_of_steps_streams_and_sources(name, params,
                                                                           plan_steps,
                                                                           monkeypatch):
    """A stream reuses its last step's running totals only at the next step, of the same
    stream and noise source: random walks of steps (mostly the next one; also repeats, jumps
    back and ahead), stream copies made from a stream mid-walk (they inherit its totals),
    copies of the same stream object, and a swapped noise source all get the batch noise of
    their own stream and source, bit for bit; so does a stream walking alone (its nodes read
    directly, its totals reused by digits) with swapped sources. With a plan cache of 3
    steps (cleared all the time), a stream's planned and direct steps alternate."""
    from transforms.mechanisms import trees
    if plan_steps is not None:
        monkeypatch.setattr(trees, "_NODE_PLAN_STEPS", plan_steps)
    rng = random.Random(f"{name}{params}")
    horizon = 300
    for noise, alone in (("discrete", False), ("float", False), ("discrete", True),
                         ("float", True)):
        mechanism = make(name, horizon, epsilon=1.0, noise=noise, seed=7, **params)
        other = make(name, horizon, epsilon=1.0, noise=noise, seed=8, **params)
        names = ["a", 1, b"a", "t2"]
        batch = {(key, source): mechanism.for_stream(key)._unit_noise(0, horizon)
                 for key in names for source in (1, 2)}
        for key in names:
            other_stream = other.for_stream(key)
            other_stream.noise_source = other.noise_source
            batch[(key, 2)] = other_stream._unit_noise(0, horizon)
        walkers = [[mechanism.for_stream(key), key, 1, rng.randrange(horizon)]
                   for key in (names[:1] if alone else names)]
        for _ in range(1500):
            walker = rng.choice(walkers)
            stream, key, source, step = walker
            move = rng.random()
            if alone and move < 0.08:  # one stream alone: its nodes read directly
                move = 0.5
            if move < 0.05:  # a copy of another stream, made from this one mid-walk
                key = rng.choice(names)
                walkers.append([stream.for_stream(key), key, source, step])
                continue
            if move < 0.08:  # a copy of this very stream object
                walkers.append([stream.for_stream(stream.stream), key, source, step])
                continue
            if move < 0.10:  # another noise source from now on
                source = 3 - source
                stream.noise_source = (other if source == 2 else mechanism).noise_source
                walker[2] = source
            step = (step + 1 if move < 0.85 else step if move < 0.9
                    else rng.randrange(horizon)) % horizon
            walker[3] = step
            got = stream._step_noise(step)
            expected = batch[(key, source)][step]
            assert struct.pack("<d", got) == struct.pack("<d", expected), (key, step)


@pytest.mark.parametrize("name,params", TREES)
def test_numpy_and_out_of_range_steps_stay_out_of_the_shared_plans(name, params):
    """A numpy step count (public `step` / `advance`) is released as a Python int one, and
    the per-step plans every stream shares keep Python ints: other streams' int steps still
    get the batch noise. A step outside 1..T is refused."""
    from transforms.mechanisms.base import CounterState
    horizon = 40
    for noise in ("discrete", "float"):
        mechanism = make(name, horizon, epsilon=1.0, noise=noise, seed=3, **params)
        x, b = mechanism.for_stream("x"), mechanism.for_stream("b")
        batch = b._unit_noise(0, horizon)
        for step in range(horizon):
            odd = x.step(CounterState(np.int64(step), 0.0), 1.0)[0]
            assert struct.pack("<d", odd) == struct.pack(
                "<d", x.step(CounterState(step, 0.0), 1.0)[0])
            got = b._step_noise(step)
            assert struct.pack("<d", got) == struct.pack("<d", batch[step])
        fields = [field for plan in mechanism._cache["node_plans"].values() if plan
                  for group in plan[1] for field in (group if plan[0] else [
                      value for node in group[1] for value in node[:3]])]
        assert fields and {type(field) for field in fields} == {int}
        for outside in (0, horizon + 1, horizon + 2):
            with pytest.raises(ValueError, match=rf"`step` must be in 1..{horizon}"):
                b._unit_noise_one(outside)


def test_record_window_times_do_not_depend_on_the_step_type():
    """Beyond the year 9999 a time is written as its float's repr: a numpy step's record
    does not change the next step's window (the formatted times are cached)."""
    from transforms.release import RecordMaker
    steps = TimeSteps(1e12, 60.0, 10)
    transform = ContinualCount(steps=steps, public_keys=["a"], epsilon=1.0,
                               mechanism="binary_tree", secret=SecretRef(literal=b"x" * 16), insecure=True,
                               release_id="0123456789abcdef0123456789abcdef")
    maker = RecordMaker(transform.config)
    maker.record("a", np.int64(4), 1.0, 0.0)
    record = maker.record("a", 5, 1.0, 0.0)
    assert record["window_start"] == steps.iso(steps.start(5)) == \
        "1000000000300.0 s since the epoch"


def test_tree_step_equals_advance_at_a_long_horizon():
    mechanism = make("binary_tree", 1 << 20, epsilon=1.0, seed=4).for_stream("k")
    state = mechanism.init_state()
    start = (1 << 19) - 3
    from transforms.mechanisms.base import CounterState
    state = CounterState(start, 10.0)
    x = [1.0, 0.0, 2.0, 5.0, 0.0, 1.0]
    expected, _ = mechanism.advance(state, x)
    got = []
    for value in x:
        out, state = mechanism.step(state, value)
        got.append(out)
    assert [struct.pack("<d", v) for v in got] == [struct.pack("<d", v) for v in expected]
    assert math.isfinite(got[0])


@pytest.mark.parametrize("seed", range(6))
def test_count_step_equals_advance_unit_one_step_at_a_time(seed):
    """`CountProblem.flat_step` (the streaming flush's machine on the plain-tuple state) over
    random steps of 0-3 payloads equals `advance_unit`, state and dropped counts too."""
    rng = random.Random(seed)
    for bounds, with_value in [(ContributionBounds(3, 2, 2), False),
                               (ContributionBounds(4, None, 1), False),
                               (ContributionBounds(5, 3, 2, max_value=2.5), True),
                               (ContributionBounds(6, 1, 3, max_value=1.0), True)]:
        problem = CountProblem(bounds, with_value=with_value)
        by_step = {}
        for step in range(HORIZON):
            payloads = []
            for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
                key = rng.choice(["a", "b", 3, ("g", 1)])
                value = rng.choice([1.0, 0.5, 2.4999, 3.7, -1.0, 1e-17]) if with_value else 1.0
                payloads.append((key, value))
            if payloads:
                by_step[step] = payloads
        reference = advance_unit(problem, "u", problem.init_state(), by_step,
                                 steps_to_run(problem, by_step, 0, HORIZON))
        flat, out, dropped = problem.flat_state(), [], {}
        for step in sorted(by_step):
            flat = problem.flat_step(flat, step, by_step[step], out, dropped)
        used, keys = flat
        assert out == reference.contributions
        assert [struct.pack("<d", v) for _, _, v in out] == \
               [struct.pack("<d", v) for _, _, v in reference.contributions]
        assert (used, tuple(keys)) == (reference.state.used, reference.state.keys)
        assert dropped == {k: v for k, v in reference.dropped.items() if v}


@pytest.mark.parametrize("name", ["binary_tree", "smooth_binary", "kary_subtraction",
                                  "sqrt_toeplitz", "blt"])
@pytest.mark.parametrize("noise", ["discrete", "float"])
def test_step_sealed_is_restore_step_seal_bit_for_bit(name, noise):
    """The release timer's one call (`RecordMaker.step_sealed`: unpacked fields through
    `step_counter`, no state objects) equals restore, step (of the partials' exact sum) and
    seal: the same released float and the same sealed bytes at every step, and the same error
    for a value the step refuses; a state at another step, or of another key, is refused
    before its partials are summed."""
    from transforms.release import RecordMaker
    if name == "blt" and noise == "discrete":
        pytest.skip("blt has float noise only")
    transform = ContinualCount(steps=STEPS, public_keys=["a", "b"], rho=0.5,
                               mechanism=name, noise=noise, secret=SecretRef(literal=b"p" * 16), insecure=True,
                               release_id="0123456789abcdef0123456789abcdef")
    fast, slow = RecordMaker(transform.config), RecordMaker(transform.config)
    partials = [[2.0], None, [3.0, 1e-30, -1e-30], [1.0], [-0.0], [], [7.0], [1.0], [4.0]]
    sealed = fast.seal("a", fast.mechanism.init_state())
    for step, parts in enumerate(partials):
        reference_out, reference = slow.streamer("a").step(
            slow.restore("a", sealed), math.fsum(parts) if parts else 0.0)
        out, sealed = fast.step_sealed("a", sealed, parts, step)
        assert struct.pack("<d", out) == struct.pack("<d", reference_out)
        assert sealed == slow.seal("a", reference)
    refused = [[math.nan], [math.inf]] + ([[0.25, 0.25]] if noise == "discrete" else [])
    start = fast.seal("a", fast.mechanism.init_state())
    for parts in refused:
        with pytest.raises(ValueError) as expected:
            slow.streamer("a").step(slow.restore("a", start), math.fsum(parts))
        with pytest.raises(ValueError) as got:
            fast.step_sealed("a", start, parts, 0)
        assert str(got.value) == str(expected.value)
    overflow = [1e308, 1e308]  # math.fsum raises on it: the state is refused first
    with pytest.raises(RuntimeError, match="its sealed state is at step 0, its release state "
                                           "at 1"):
        fast.step_sealed("a", start, overflow, 1)
    with pytest.raises(ValueError, match=r"`state` must be state of release"):
        fast.step_sealed("b", start, overflow, 0)


def test_a_release_timer_without_its_state_fails_closed():
    """A timer that outlives its key's state (lost, or an `--update` across state layouts)
    would release step 0 again with the same noise: the difference of the two records would be
    the exact total. It raises instead."""
    transform = ContinualCount(steps=STEPS, public_keys=["a"], epsilon=1.0,
                               mechanism="binary_tree", secret=SecretRef(literal=b"x" * 16), insecure=True,
                               release_id="0123456789abcdef0123456789abcdef")
    fn = ReleaseStreamingFn(transform.config, transform.public_keys)
    fn.setup()
    cells = Cells()
    list(fn.process(("a", Seed()), **cells.bind(fn.process)) or [])
    list(fn.process(("a", StepTotal(0, 37.0)), **cells.bind(fn.process)) or [])
    assert [r.value["step"] for r in fired(fn.release, cells, "a")] == [0]
    cells.cells["release_state"].clear()
    with pytest.raises(RuntimeError, match="without its sealed state"):
        fired(fn.release, cells, "a")


def test_shared_deltas_keep_the_value_its_type_and_the_sign_of_zero():
    from transforms.messages import delta_of
    for value in (1.0, 1.0, 0.5, -1.0, 2.5, 1, True, 0.0, -0.0, 0.0, -0.0):
        delta = delta_of(value)
        assert delta == Delta(value) and type(delta.value) is type(value)
        assert math.copysign(1.0, delta.value) == math.copysign(1.0, value)
        assert not delta.halt
    assert delta_of(1.0) is delta_of(1.0) and delta_of(0.0) is not delta_of(0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        delta_of(1.0).value = 2.0


def counting_source():
    """A keyed noise source class counting its derivation passes (`_prefixes` calls) in its
    class attribute `calls`."""
    from transforms.mechanisms.noise import KeyedNoiseSource

    class Counting(KeyedNoiseSource):
        calls = 0

        def _prefixes(self, distribution, stream, prefixes):
            Counting.calls += 1
            return super()._prefixes(distribution, stream, prefixes)

    return Counting


@pytest.mark.parametrize("name,params", TREES)
@pytest.mark.parametrize("noise", ["discrete", "float"])
def test_a_streams_first_steps_derive_its_next_steps_noise_in_one_call(name, params, noise):
    """Streams stepping from fresh caches (their steps interleaved, or one starting late)
    get the batch noise bit for bit, and a stream's first step derives the nodes of its
    next 1024 steps on every level in one source call: 1 call through T = 100, one per 1024
    steps at T = 3000."""
    from transforms.mechanisms.noise import KeyedNoiseSource
    Counting = counting_source()

    for horizon, most in ((100, 1), (3000, 3)):
        Counting.calls = 0
        mechanism = make(name, horizon, epsilon=1.0, noise=noise, **params,
                         noise_source=Counting(b"prefetch"))
        reference = make(name, horizon, epsilon=1.0, noise=noise, **params,
                         noise_source=KeyedNoiseSource(b"prefetch"))
        streams = [mechanism.for_stream(s) for s in ("a", 7)]
        batch = [reference.for_stream(s)._unit_noise(0, horizon) for s in ("a", 7)]
        late = horizon // 3  # stream 7 starts at a later step (a resumed key)
        for step in range(1, horizon + 1):
            for stream, expected, first in zip(streams, batch, (1, late)):
                if step >= first:
                    got = stream._step_noise(step - 1)
                    assert struct.pack("<d", got) == struct.pack("<d", expected[step - 1])
        per_stream = Counting.calls / 2
        assert 1 <= per_stream <= most, (horizon, Counting.calls)


def test_keys_stepping_together_keep_their_blocks_while_their_nodes_fit(monkeypatch):
    """The block cache is bounded in nodes, not blocks: a key's upper tree levels are short
    prefixes, so 24 keys x 7 levels (168 blocks, 512 nodes per key) fit in 16 whole blocks'
    worth of nodes and no key re-derives a block over its 100 steps (a bound of 16 blocks
    re-derived at every key-step). Beyond the bound the oldest blocks go and are derived
    again: still the batch noise, bit for bit."""
    from transforms.mechanisms import base
    from transforms.mechanisms.noise import KeyedNoiseSource
    Counting = counting_source()

    monkeypatch.setattr(base, "_DRAW_CACHE_NODES", 16 * base.DRAW_BLOCK)
    for keys, fits in ((24, True), (60, False)):
        Counting.calls = 0
        mechanism = make("binary_tree", 100, rho=0.5, noise_source=Counting(b"fit"))
        streams = [mechanism.for_stream(key) for key in range(keys)]
        for step in range(100):
            for stream in streams:
                stream._step_noise(step)
        _, blocks, held = mechanism._cache["draw_blocks"]
        assert held[0] == sum(v.shape[0] for v in blocks.values()) <= 16 * base.DRAW_BLOCK
        assert set(mechanism._node_views()) <= set(blocks)
        if fits:
            assert Counting.calls == keys
        else:
            assert Counting.calls > keys
            reference = make("binary_tree", 100, rho=0.5,
                             noise_source=KeyedNoiseSource(b"fit"))
            for key in (0, 29, 59):
                expected = reference.for_stream(key)._unit_noise(0, 100)
                got = [streams[key]._step_noise(step) for step in range(100)]
                assert [struct.pack("<d", v) for v in got] == \
                    [struct.pack("<d", v) for v in expected]


def test_state_cells_never_unpickle():
    """What is not a plain value (a triangle counter's state) goes through the checkpoint
    codec, and bytes holding a pickle are refused: no state cell unpickles."""
    from apache_beam.coders import FastPrimitivesCoder  # the pickling coder, to forge bytes
    from transforms.messages import FastStateCoder
    from transforms.streams.units import TriangleProblem
    coder = FastStateCoder()
    state = TriangleProblem(max_degree=3, max_contribution=4).init_state()
    assert type(coder.decode(coder.encode({"u": (1, state)}))["u"][1]) is type(state)
    forged = FastPrimitivesCoder().encode({"u": (1, Timer())})
    with pytest.raises(ValueError, match="no pickle"):
        coder.decode(forged)


def test_every_state_cell_of_the_products_dofns_has_a_coder_that_never_unpickles():
    """Every StateSpec of every DoFn in transforms/ and pipelines/ (a bucket's, a key's, a
    mean's held records) decodes with a coder that refuses or cannot hold a pickle."""
    import importlib  # (this test walks the product's modules)
    import pkgutil
    import transforms
    import pipelines
    from apache_beam.coders import StrUtf8Coder, VarIntCoder
    from apache_beam.transforms.userstate import StateSpec
    from transforms.messages import FastStateCoder
    from transforms.streaming import ReleaseStateCoder
    safe = (FastStateCoder, ReleaseStateCoder, StrUtf8Coder, VarIntCoder)
    specs = []
    for package in (transforms, pipelines):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            loaded = importlib.import_module(module.name)
            for value in vars(loaded).values():
                if isinstance(value, type) and value.__module__ == loaded.__name__:
                    specs += [(f"{value.__name__}.{name}", spec) for name, spec in
                              vars(value).items() if isinstance(spec, StateSpec)]
    assert len(specs) >= 10 and "JoinMeansFn.PENDING" in dict(specs)
    assert [name for name, spec in specs if not isinstance(spec.coder, safe)] == []
