"""Random streams and from-scratch references (the slow, obvious way)."""
from __future__ import annotations

import itertools

import numpy as np


def random_item_stream(rng, horizon, items=6, max_per_step=4, keys=(None,)):
    records = []
    for step in range(horizon):
        for _ in range(rng.integers(0, max_per_step + 1)):
            op = "+" if rng.random() < 0.6 else "-"
            records.append((step, op, f"i{rng.integers(items)}", keys[rng.integers(len(keys))]))
    return records


def random_edge_stream(rng, horizon, nodes=6, max_per_step=4):
    records = []
    for step in range(horizon):
        for _ in range(rng.integers(0, max_per_step + 1)):
            a, b = rng.choice(nodes, 2, replace=False)
            op = "+" if rng.random() < 0.65 else "-"
            records.append((step, op, (int(a), int(b))))
    return records


def presence_by_step(records, horizon, entity_of=lambda r: r[2]):
    """{entity: [present at end of step t]} recomputed from scratch for every t."""
    out = {}
    for entity in {entity_of(r) for r in records}:
        series = []
        for t in range(horizon):
            count = sum((1 if r[1] == "+" else -1) for r in records
                        if entity_of(r) == entity and r[0] <= t)
            series.append(count > 0)
        out[entity] = series
    return out


def flippancy(series):
    return sum(1 for before, after in zip([False] + series[:-1], series) if before != after)


def is_alternating(vector):
    nonzero = [v for v in vector if v != 0]
    return all(abs(v) == 1 for v in nonzero) and all(a == -b for a, b in zip(nonzero, nonzero[1:]))


def max_interval_sum(vector):
    sums = np.concatenate(([0], np.cumsum(vector)))
    return int(sums.max() - sums.min())


def triangles_from_scratch(edges_present):
    nodes = sorted({n for e in edges_present for n in e})
    adjacency = {n: set() for n in nodes}
    for a, b in edges_present:
        adjacency[a].add(b)
        adjacency[b].add(a)
    return sum(1 for a, b, c in itertools.combinations(nodes, 3)
               if b in adjacency[a] and c in adjacency[a] and c in adjacency[b])


def neighbour_differences(records, horizon, make_streams, entity_of=lambda r: r[2]):
    """d(x) - d(y) for every neighbour y of x (all updates of one entity removed), per key."""
    full = make_streams(records)
    for entity in {entity_of(r) for r in records}:
        neighbour = make_streams([r for r in records if entity_of(r) != entity])
        keys = set(full.streams) | set(neighbour.streams)
        yield entity, {key: full.stream(key) - neighbour.stream(key) for key in keys}
