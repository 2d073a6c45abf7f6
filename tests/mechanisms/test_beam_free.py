"""The numpy core must import and run without Apache Beam; its scalar streaming `step` (the
per-key-step cost of a Beam release) is a fast path that must stay `advance` on one value: the
same bits, the same state, the same fail-closed errors."""
import math
import re

import numpy as np
import pytest

from tests.support.beam_free import assert_runs_without_beam
from transforms.mechanisms import MECHANISMS, NAMES, ConstantNoiseSource, CounterState, make
from transforms.mechanisms import base

# every mechanism with each noise it supports (blt: float only; discrete sqrt: HistoryState)
CASES = [(name, noise) for name in NAMES for noise in ("discrete", "float")
         if not (name in ("blt", "hybrid") and noise == "discrete")]


def build(name, noise, horizon, **kwargs):
    privacy = {"rho": 0.5} if (name == "sqrt_toeplitz" and noise == "discrete") or \
        not MECHANISMS[name].pure_dp else {"epsilon": 1.0}
    return make(name, horizon, noise=noise, **privacy, **kwargs)


def test_mechanisms_import_no_apache_beam():
    assert_runs_without_beam("import transforms.mechanisms as m; "
                             "m.make('binary_tree', 8, epsilon=1.0, seed=1).release([1] * 8); "
                             "s = m.make('blt', 8, rho=0.5, noise='float', seed=1); "
                             "s.step(s.init_state(), 1)")


@pytest.mark.parametrize("name,noise", CASES)
def test_steps_from_a_resumed_state_equal_the_batch_release_bit_for_bit(name, noise):
    """Steps from a state resumed from its bytes deep into the horizon (a new object, nothing
    cached), interleaved with another stream, equal the batch release of the whole input."""
    horizon, middle = 3000, 2100
    x = np.random.default_rng(4).integers(-2, 5, horizon).astype(np.float64)
    expected = build(name, noise, horizon, secret=b"s", stream="k").release(x)
    mechanism = build(name, noise, horizon, secret=b"s")
    _, state = mechanism.for_stream("k").advance(mechanism.init_state(), x[:middle])
    fresh = build(name, noise, horizon, secret=b"s")
    key, other = fresh.for_stream("k"), fresh.for_stream("other")
    state = base.state_from_bytes(state.to_bytes())
    other_state, outs = other.init_state(), []
    for t in range(middle, horizon):
        value = [float(x[t]), int(x[t]), x[t]][t % 3]  # float, int and numpy float64 inputs
        out, state = key.step(state, value)
        assert type(out) is float
        outs.append(out)
        _, other_state = other.step(other_state, 1.0)
    assert np.array_equal(np.array(outs), expected[middle:])
    assert state == (CounterState(horizon, float(np.sum(x))) if isinstance(state, CounterState)
                     else state)


@pytest.mark.parametrize("value", [1, 3.0, np.float64(2.0), True, np.int64(4), np.float32(5.0),
                                   2 ** 53 + 1, -(2 ** 60), 7.0 + 2 ** -40])
@pytest.mark.parametrize("noise", ["discrete", "float"])
def test_step_is_advance_on_one_value_for_every_input_type(value, noise):
    """Values off the fast path (bool, numpy ints, float32, ints beyond 2^53) go through
    `advance`; every value gives what `advance` gives, bit for bit, or the same error."""
    mechanism = make("binary_tree", 100, epsilon=1.0, noise=noise, seed=3, stream=5)
    state = CounterState(41, 12.0)
    try:
        expected, expected_state = mechanism.advance(state, [value])
    except ValueError as error:
        with pytest.raises(ValueError, match="^" + re.escape(str(error)) + "$"):
            mechanism.step(state, value)
        return
    out, new_state = mechanism.step(state, value)
    assert type(out) is float and out == float(expected[0])
    assert math.copysign(1.0, out) == math.copysign(1.0, float(expected[0]))
    assert new_state == expected_state


@pytest.mark.parametrize("name,noise", [("binary_tree", "discrete"), ("blt", "float"),
                                        ("naive_composition", "float"),
                                        ("sqrt_toeplitz", "float")])
def test_step_fails_closed_with_the_messages_of_advance(name, noise):
    mechanism = build(name, noise, 3, seed=0)
    state = mechanism.advance(mechanism.init_state(), [1, 1, 1])[1]
    with pytest.raises(ValueError, match=r"^`steps released` must be <= horizon \(3\); got 4\.$"):
        mechanism.step(state, 1)
    start = mechanism.init_state()
    for bad in (float("nan"), float("inf"), -math.inf, np.float64("nan")):
        with pytest.raises(ValueError, match=r"^`values` must be finite numbers; got \["):
            mechanism.step(start, bad)
    # checks in advance's order: a non-finite value is refused before the horizon
    with pytest.raises(ValueError, match=r"^`values` must be finite numbers"):
        mechanism.step(state, float("nan"))
    with pytest.raises(ValueError, match=r"^`state` must be a CounterState; got "):
        mechanism.step((0, 0.0), 1.0)
    if noise == "discrete":
        with pytest.raises(ValueError, match=r"^`values` must be integers with discrete noise "
                                             r"\(use a value grid, or noise='float'\); got "
                                             r"'non-integers'\.$"):
            mechanism.step(start, 0.5)
    else:
        assert mechanism.step(start, 0.5)[1] == CounterState(1, 0.5)


def test_node_noise_of_a_step_is_the_noise_of_the_batch_read():
    """The streaming block cache returns what the source returns for any read, per stream and
    level; streams 1, "1" and b"1" are different streams."""
    mechanism = make("kary_tree", 1 << 14, epsilon=1.0, seed=2, k=3)
    for stream in (1, "1", b"1"):
        keyed = mechanism.for_stream(stream)
        for level, start, count in ((0, 0, 1), (0, 1023, 1), (0, 1022, 2), (2, 5000, 2),
                                    (0, 1023, 2), (1, 0, 4000)):
            direct = keyed.noise_source.discrete_noise(keyed.sampler, stream, level, start,
                                                       count)
            assert np.array_equal(keyed._draw(level, start, count), direct)
            assert keyed._draw_one(level, start) == direct[0]
    one, text = mechanism.for_stream(1)._draw(0, 0, 8), mechanism.for_stream("1")._draw(0, 0, 8)
    assert not np.array_equal(one, text)
    with pytest.raises(ValueError, match="`start` must be a node index >= 0"):
        mechanism._draw_one(0, -1)
    blocks = mechanism._cache["draw_blocks"][1]
    assert 0 < len(blocks) <= base._DRAW_CACHE_BLOCKS


def test_block_cache_is_bounded_and_follows_the_noise_source():
    """At most _DRAW_CACHE_NODES nodes: as many whole blocks as _DRAW_CACHE_BLOCKS, or 16x
    as many 64-node prefixes (a key's upper tree levels), oldest first out."""
    mechanism = make("naive_composition", 1 << 24, epsilon=1.0, noise="float", seed=2)
    for i in range(base._DRAW_CACHE_BLOCKS + 10):  # whole blocks (a read of a last node)
        mechanism._draw(0, (i + 1) * base.DRAW_BLOCK - 1, 1)
    _, blocks, held = mechanism._cache["draw_blocks"]
    assert len(blocks) == base._DRAW_CACHE_BLOCKS and held == [base._DRAW_CACHE_NODES]
    assert next(iter(blocks))[2:] == (0, 10)  # the first 10 went first
    for i in range(16 * base._DRAW_CACHE_BLOCKS + 10):  # 64-node prefixes of other blocks
        mechanism._draw(1, i * base.DRAW_BLOCK, 1)
    assert len(blocks) == 16 * base._DRAW_CACHE_BLOCKS
    assert held == [sum(values.shape[0] for values in blocks.values())]
    assert held[0] == base._DRAW_CACHE_NODES
    first = mechanism._draw(0, 0, 3)
    mechanism.noise_source = ConstantNoiseSource(0.25)  # another source: nothing stale is read
    assert np.array_equal(mechanism._draw(0, 0, 3), np.full(3, 0.25))
    assert not np.array_equal(first, np.full(3, 0.25))


def test_for_stream_copies_share_calibration_and_caches():
    mechanism = make("binary_tree", 64, epsilon=1.0, seed=2)
    other = mechanism.for_stream("k")
    assert type(other) is type(mechanism) and other.stream == "k" and mechanism.stream == b""
    assert other._cache is mechanism._cache and other.horizon == 64
    assert other.__dict__.keys() == mechanism.__dict__.keys()
    with pytest.raises(ValueError, match="`stream` must be a str, bytes or int key"):
        mechanism.for_stream(1.5)


@pytest.mark.parametrize("name,noise", [("binary_tree", "discrete"), ("sqrt_toeplitz", "discrete"),
                                        ("blt", "float")])
def test_refused_values_are_not_shown(name, noise):
    """A refusal never shows a finite value (private data): only the non-finite ones."""
    mechanism = make(name, 8, rho=0.5, noise=noise, seed=0)
    with pytest.raises(ValueError) as found:
        mechanism.release([123456789.0, 42.0, float("nan"), 0.0, 0.0, 0.0, 0.0, 0.0])
    assert "123456789" not in str(found.value) and "nan" in str(found.value)
    if noise == "discrete":
        with pytest.raises(ValueError) as found:
            mechanism.release([123456789.5] + [0.0] * 7)
        assert "123456789" not in str(found.value)
