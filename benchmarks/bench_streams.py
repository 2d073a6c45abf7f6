"""Throughput and memory of the incremental difference-stream core (not run in CI).

    python3 benchmarks/bench_streams.py [--updates 1000000] [--items 100000]

Prints updates per second of the per-entity state machines (CountDistinct, DegreeCount) on
random streams, bytes per tracked entity (tracemalloc, state dictionaries included), and
TriangleCount's throughput and memory on random graphs of growing size.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from transforms.streams import (EdgeDegreeContribution, TriangleCounter, count_distinct,
                                count_distinct_streams, canonical_edge)


def per_entity_throughput(updates, items, horizon, rng):
    """The state machine alone, entity-major as a stateful DoFn runs it: all updates of one
    (item, step) together. Grouping is done before timing; memory is measured in a second,
    traced pass (tracemalloc slows the code it traces)."""
    machine = count_distinct(max_flips=4)
    item_ids = rng.integers(0, items, updates).tolist()
    steps = rng.integers(0, horizon, updates).tolist()
    ops = np.where(rng.random(updates) < 0.6, "+", "-").tolist()
    groups = {}
    for item, step, op in zip(item_ids, steps, ops):
        groups.setdefault((item, step), []).append(op)
    work = sorted(groups.items())

    def run():
        states = {}
        init = machine.init_state()
        for (item, _), step_ops in work:
            _, states[item], _ = machine.step(states.get(item, init), step_ops)
        return states

    start = time.perf_counter()
    states = run()
    elapsed = time.perf_counter() - start
    del states
    tracemalloc.start()
    states = run()
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return updates / elapsed, current / max(len(states), 1), len(states)


def driver_throughput(updates, items, horizon, rng):
    records = list(zip(rng.integers(0, horizon, updates).tolist(),
                       np.where(rng.random(updates) < 0.6, "+", "-").tolist(),
                       rng.integers(0, items, updates).tolist()))
    start = time.perf_counter()
    count_distinct_streams(records, horizon, max_flips=4)
    return updates / (time.perf_counter() - start)


def triangle_run(nodes, updates, horizon, rng):
    counter = TriangleCounter(max_degree=10 ** 6, max_contribution=10 ** 9)
    a = rng.integers(0, nodes, updates)
    b = rng.integers(0, nodes, updates)
    keep = a != b
    edges = [canonical_edge(int(x), int(y)) for x, y in zip(a[keep], b[keep])]
    ops = np.where(rng.random(len(edges)) < 0.7, "+", "-").tolist()
    per_step = np.array_split(np.arange(len(edges)), horizon)
    tracemalloc.start()
    start = time.perf_counter()
    for t, idx in enumerate(per_step):
        counter.step(t, [(ops[i], edges[i]) for i in idx])
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    present = sum(len(v) for v in counter.adjacency.values()) // 2
    return len(edges) / elapsed, peak, present


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--horizon", type=int, default=100)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rate, per_item, tracked = per_entity_throughput(args.updates, args.items, args.horizon, rng)
    print(f"CountDistinct state machine: {rate:,.0f} updates/s, {per_item:,.0f} bytes per "
          f"tracked item ({tracked:,} items)")
    print(f"CountDistinct batch driver (validation + grouping): "
          f"{driver_throughput(args.updates, args.items, args.horizon, rng):,.0f} updates/s")
    machine = EdgeDegreeContribution(4)
    start = time.perf_counter()
    state = machine.init_state()
    for _ in range(200_000):
        _, state, _ = machine.step(state, ["+"])
    print(f"DegreeCount edge state machine: {200_000 / (time.perf_counter() - start):,.0f} "
          f"steps/s")
    for nodes, updates in ((1_000, 20_000), (10_000, 200_000), (100_000, 1_000_000),
                           (1_000_000, 2_000_000)):
        rate, peak, present = triangle_run(nodes, updates, args.horizon, rng)
        print(f"TriangleCount {nodes:>7,} nodes, {updates:>9,} updates: {rate:>9,.0f} updates/s,"
              f" peak {peak / 2 ** 20:7.1f} MiB, {present:,} edges present "
              f"({peak / max(present, 1):,.0f} B/edge)")


if __name__ == "__main__":
    main()
