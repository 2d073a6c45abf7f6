"""DegreeCount and TriangleCount against from-scratch references and Thm 6.3/6.4/6.10/6.12."""
from __future__ import annotations

import numpy as np
import pytest

from tests.support.streams import (is_alternating, max_interval_sum, presence_by_step,
                                   random_edge_stream, triangles_from_scratch)
from tests.support.streams import neighbour_differences
from transforms.streams import (BoundViolation, EdgeDegreeContribution, EdgeState,
                                TriangleCounter, canonical_edge, degree_streams,
                                triangle_streams)


def canon(record):
    return canonical_edge(*record[2])


def reference_degrees(records, horizon):
    presence = presence_by_step(records, horizon, entity_of=canon)
    nodes = {n for edge in presence for n in edge}
    out = {}
    for node in nodes:
        degree = [sum(series[t] for edge, series in presence.items() if node in edge)
                  for t in range(horizon)]
        out[node] = np.diff(np.concatenate(([0], degree)))
    return out


def updates_per_edge(records):
    counts = {}
    for record in records:
        counts[canon(record)] = counts.get(canon(record), 0) + 1
    return counts


def test_degree_streams_equal_from_scratch_reference():
    rng = np.random.default_rng(10)
    for _ in range(1000):
        horizon = int(rng.integers(1, 8))
        records = random_edge_stream(rng, horizon)
        k = max(updates_per_edge(records).values(), default=1)
        result = degree_streams(records, horizon, max_updates=k)
        assert result.dropped.get("contribution bound", 0) == 0  # trunc(x) == x
        expected = reference_degrees(records, horizon)
        for node in set(expected) | set(result.streams):
            assert np.array_equal(result.stream(node), expected.get(node, np.zeros(horizon)))


def check_degree_theorem(machine_cls, seed, streams=1000):
    rng = np.random.default_rng(seed)
    for _ in range(streams):
        horizon, k = int(rng.integers(2, 8)), int(rng.integers(1, 4))
        records = random_edge_stream(rng, horizon, nodes=4, max_per_step=5)
        make = lambda recs: degree_streams(recs, horizon, k)  # noqa: E731
        for edge, diffs in neighbour_differences(records, horizon, make, entity_of=canon):
            changed = {node for node, diff in diffs.items() if diff.any()}
            if not changed <= set(edge):
                return False
            for diff in diffs.values():
                if not (is_alternating(diff) and np.abs(diff).sum() <= k):
                    return False
    return True


def test_degree_neighbours_change_only_two_nodes_each_in_s_1_k():
    assert check_degree_theorem(EdgeDegreeContribution, seed=11)
    assert degree_streams([], 3, 2).declaration.keys_per_unit == 2


def test_degree_negative_control_without_truncation(monkeypatch):
    def untruncated(self, state, ops):
        count = state.count + sum(1 if op == "+" else -1 for op in ops)
        new = EdgeState(count, state.updates + len(ops))
        return int(new.present) - int(state.present), new, 0
    monkeypatch.setattr(EdgeDegreeContribution, "step", untruncated)
    assert not check_degree_theorem(EdgeDegreeContribution, seed=12, streams=300)


def test_degree_truncation_keeps_the_first_k_updates():
    records = [(0, "+", (1, 2)), (1, "-", (1, 2)), (2, "+", (2, 1)), (3, "-", (1, 2))]
    result = degree_streams(records, 4, max_updates=3)
    assert result.stream(1).tolist() == [1, -1, 1, 0] and result.dropped["contribution bound"] == 1


def reference_triangles(records, horizon):
    presence = presence_by_step(records, horizon, entity_of=canon)
    counts = [triangles_from_scratch([e for e, s in presence.items() if s[t]])
              for t in range(horizon)]
    return np.diff(np.concatenate(([0], counts)))


def reference_edge_triangle_contribution(records, horizon):
    """Def. 6.11 from scratch: sum_t |tri_e(t) - tri_e(t-1)| per edge."""
    presence = presence_by_step(records, horizon, entity_of=canon)
    out = {}
    for edge in presence:
        series = []
        for t in range(horizon):
            present = {e for e, s in presence.items() if s[t]}
            a, b = edge
            series.append(sum(1 for c in {n for e in present for n in e}
                              if edge in present and canonical_edge(a, c) in present
                              and canonical_edge(b, c) in present))
        out[edge] = int(np.abs(np.diff(np.concatenate(([0], series)))).sum())
    return out


def bounds_of(records, horizon):
    presence = presence_by_step(records, horizon, entity_of=canon)
    degree = max([sum(s[t] for e, s in presence.items() if n in e)
                  for n in {n for e in presence for n in e} for t in range(horizon)] + [1])
    contribution = max(list(reference_edge_triangle_contribution(records, horizon).values())
                       + [1])
    return degree, contribution


def test_triangle_counts_and_contributions_equal_from_scratch_reference():
    rng = np.random.default_rng(13)
    for _ in range(600):
        horizon = int(rng.integers(1, 7))
        records = random_edge_stream(rng, horizon, nodes=5, max_per_step=6)
        result = triangle_streams(records, horizon, max_degree=10, max_contribution=10 ** 6)
        assert np.array_equal(result.stream(None), reference_triangles(records, horizon))
        counter = TriangleCounter(10, 10 ** 6)
        for t in range(horizon):
            counter.step(t, [(r[1], canon(r)) for r in records if r[0] == t])
        expected = {e: c for e, c in reference_edge_triangle_contribution(records,
                                                                          horizon).items() if c}
        assert {e: c for e, c in counter.contribution.items() if c} == expected


def test_triangle_neighbours_differ_within_s_d_k_under_the_bounds():
    """Thm 6.12: for x, y both within (D, k), d(x) - d(y) has interval sums <= D, l1 <= k."""
    rng = np.random.default_rng(14)
    checked = 0
    for _ in range(400):
        horizon = int(rng.integers(2, 7))
        records = random_edge_stream(rng, horizon, nodes=5, max_per_step=5)
        d, k = bounds_of(records, horizon)
        make = lambda recs: triangle_streams(recs, horizon, d, k)  # noqa: E731
        for _, diffs in neighbour_differences(records, horizon, make, entity_of=canon):
            for diff in diffs.values():
                assert max_interval_sum(diff) <= d and np.abs(diff).sum() <= k
                checked += bool(diff.any())
    assert checked > 100


def test_triangle_bound_violation_fails_closed_naming_bound_and_step():
    star = [(0, "+", (0, 1)), (0, "+", (0, 2)), (1, "+", (0, 3)), (2, "+", (1, 2))]
    with pytest.raises(BoundViolation, match=r"^`max_degree` must bound every node's degree; "
                                             r"got degree 3 at node 0 in step 1\.$"):
        triangle_streams(star, 3, max_degree=2, max_contribution=5)
    partial = triangle_streams(star, 3, max_degree=2, max_contribution=5, strict=False)
    assert partial.valid_steps == 1 and "step 1" in partial.violation
    assert partial.stream(None).tolist() == [0, 0, 0]
    counter = TriangleCounter(2, 5)
    counter.step(0, [("+", (0, 1)), ("+", (0, 2))])
    with pytest.raises(BoundViolation):
        counter.step(1, [("+", (0, 3))])
    with pytest.raises(BoundViolation, match="not released"):
        counter.step(2, [])
    triangle = [(0, "+", (0, 1)), (0, "+", (1, 2)), (0, "+", (0, 2)), (1, "-", (0, 2)),
                (2, "+", (0, 2))]
    with pytest.raises(BoundViolation, match=r"^`max_contribution` must bound every edge's "
                                             r"triangle contribution; got 3 for edge .* in "
                                             r"step 2\.$"):
        triangle_streams(triangle, 3, max_degree=5, max_contribution=2)


@pytest.mark.parametrize("record,reason", [
    ((0, "+", (1, 1)), "self-loop (1, 1) is not an edge"),
    ((0, "+", (1, None)), "edge endpoints must be non-empty str or int ids"),
    ((0, "+", 7), "edge must be a pair (a, b); got 7"),
    ((0, "x", (1, 2)), "op must be '+' or '-'; got 'x'"),
    ((9, "+", (1, 2)), "step must be an integer in [0, 2); got 9"),
])
def test_malformed_edges_become_dead_letters(record, reason):
    for result in (degree_streams([record], 2, 1), triangle_streams([record], 2, 2, 2)):
        assert [(d.record, d.reason) for d in result.dead_letters] == [(record, reason)]
