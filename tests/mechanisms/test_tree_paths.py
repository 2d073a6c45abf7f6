"""One rule, two paths: the noise of a tree's step t is `_step_nodes(t)` (`tree_plans`), and
the batch path (`_unit_noise`, vectorised `_combine`) and the scalar streaming path
(`_step_noise` -> `_unit_noise_one`, cached node plans) give the rule's float bit for bit:
exhaustively over small horizons with every arity and option, and by property tests."""
from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from transforms.mechanisms import ConstantNoiseSource, make

TREES = ([("binary_tree", {})] + [("kary_tree", {"k": k}) for k in (2, 3, 4, 5)]
         + [("kary_subtraction", {"k": k}) for k in (3, 4, 5, 6, 7, 8)]
         + [("smooth_binary", {})])
OPTIONS = [{"sparsify": s, "prune": p} for s in (True, False) for p in (True, False)]


def bits(value: float) -> bytes:
    return struct.pack("<d", value)


def rule_noise(mechanism, step: int) -> float:
    """The rule's value, read literally: per group from the top, its nodes' noise (times 0.0
    if pruned) added in order, then added to (or subtracted from) the total."""
    total = 0.0
    for negative, nodes in mechanism._step_nodes(step):
        picked = None
        for level, index, pruned in nodes:
            value = float(mechanism._draw(level, index, 1)[0])
            if pruned:
                value = value * 0.0
            picked = value if picked is None else picked + value
        total = total + (-picked if negative else picked)
    return total


def rule_counts(mechanism, step: int):
    """(+1 nodes, -1 nodes) of the rule at `step`, pruned nodes left out."""
    signs = [negative for negative, nodes in mechanism._step_nodes(step)
             for _, _, pruned in nodes if not pruned]
    return signs.count(False), signs.count(True)


@pytest.mark.parametrize("name,params", TREES)
def test_both_paths_are_the_rule_exhaustively(name, params):
    """Every step of horizons 1..48, 64, 100: batch and scalar (two streams stepping
    together, then one alone) equal the rule bit for bit; node_counts count its nodes."""
    for options in OPTIONS:
        for horizon in list(range(1, 49)) + [64, 100]:
            noise = "float" if horizon % 2 else "discrete"
            mechanism = make(name, horizon, epsilon=1.0, seed=horizon, noise=noise,
                             **params, **options)
            rule = [rule_noise(mechanism, t) for t in range(1, horizon + 1)]
            assert [bits(v) for v in mechanism._unit_noise(0, horizon)] == \
                [bits(v) for v in rule]
            counts = [sum(rule_counts(mechanism, t)) for t in range(1, horizon + 1)]
            assert mechanism.node_counts().tolist() == counts
            a, b = mechanism.for_stream("a"), mechanism.for_stream("b")
            together = [(a._step_noise(t), b._step_noise(t)) for t in range(horizon)]
            assert [bits(v) for v, _ in together] == [bits(rule_noise(a, t))
                                                      for t in range(1, horizon + 1)]
            lone = mechanism.for_stream("lone")
            assert [bits(lone._step_noise(t)) for t in range(horizon)] == \
                [bits(rule_noise(lone, t)) for t in range(1, horizon + 1)]


@pytest.mark.parametrize("name,params", TREES)
def test_the_rule_is_the_left_factor(name, params):
    """The rule's signed nodes are row t of the dense left factor L (checked against the
    papers' algorithms in test_trees): as many +1 and -1 entries, pruned nodes zero."""
    for prune in (False, True):
        for horizon in (1, 2, 7, 30, 81):
            mechanism = make(name, horizon, epsilon=1.0, seed=0, prune=prune, **params)
            left, _ = mechanism.dense_factors()
            for t in range(1, horizon + 1):
                row = left[t - 1]
                assert rule_counts(mechanism, t) == (int((row == 1).sum()),
                                                     int((row == -1).sum()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=st.sampled_from(TREES), options=st.sampled_from(OPTIONS),
       horizon=st.integers(1, 5000), data=st.data(),
       source=st.sampled_from([None, None, -0.0, -1.5]),
       noise=st.sampled_from(["float", "discrete"]))
def test_batch_slices_and_scalar_steps_are_the_rule(tree, options, horizon, data, source,
                                                    noise):
    """Any slice of the batch path, and any order of scalar steps over two streams (mostly
    the next step, also repeats and jumps), equal the rule bit for bit; constant sources
    keep signed zeros (float noise: a change of order would change the bits)."""
    name, params = tree
    extra = {"seed": horizon, "noise": noise} if source is None else {
        "noise_source": ConstantNoiseSource(source), "noise": "float"}
    mechanism = make(name, horizon, epsilon=1.0, **params, **options, **extra)
    start = data.draw(st.integers(0, horizon - 1))
    count = data.draw(st.integers(1, min(horizon - start, 300)))
    batch = mechanism._unit_noise(start, count)
    assert [bits(v) for v in batch] == [bits(rule_noise(mechanism, t))
                                        for t in range(start + 1, start + count + 1)]
    streams = [mechanism.for_stream(key) for key in ("x", 9)]
    step = data.draw(st.integers(0, horizon - 1))
    for _ in range(data.draw(st.integers(1, 60))):
        stream = data.draw(st.sampled_from(streams))
        move = data.draw(st.integers(0, 9))
        step = (step + 1 if move < 7 else step if move < 8
                else data.draw(st.integers(0, horizon - 1))) % horizon
        assert bits(stream._step_noise(step)) == bits(rule_noise(stream, step + 1))
