"""The Beam plugin against the plain Beam floor and PipelineDP, same Parquet input, same run.

    python3 benchmarks/bench_beam.py [--events 1000000] [--users 100000] [--keys 1000]
                                     [--steps 100] [--only count|distinct] [--scale 1e5,1e6]
                                     [--pipelines floor,continual_count,...]

A seeded generator writes the input to Parquet first (not timed): columns user, key, ts (int64,
event time in microseconds; `--users` users, `--keys` public keys, `--steps` hourly steps) and,
for the count-distinct variant, op ('+' / '-'), item, key, ts. Then, in ONE process
(FnApiRunner in-process), each pipeline reads that file (ReadFromParquet, one dict per row;
continual_count: ReadFromParquetBatched, one Arrow table per row group):
- floor: plain non-private count per (key, step): ((key, step), 1) | CombinePerKey(sum);
- pipeline_dp: PipelineDP's private Count, same caps, public partitions, ONE release (skipped
  when `pipeline_dp` is not importable);
- continual_count: ContinualCount, caps 2 keys x 2 contributions per user, T releases of every
  public key, through the BATCHED entry: ReadFromParquetBatched -> `ArrowEvents` (Arrow tables
  -> EventBatches, steps assigned with numpy; `transforms.arrow_input`) -> ContinualCount;
- continual_count_elements: the same ContinualCount through the ELEMENT entry: ReadFromParquet
  -> TimestampedValue((user, key), ts) per row -> ContinualCount (the same records);
- distinct_floor: plain non-private distinct items per (key, step);
- continual_distinct: ContinualCountDistinct (max_flips 4, 1 key per item).
Prints seconds and ratios against the floor measured in the same run. With `--scale` it runs
the series of sizes and prints the slope (seconds per 1e6 events) of every pipeline.
Benchmarks only: nothing here is a test.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import apache_beam as beam  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from apache_beam.transforms.window import TimestampedValue  # noqa: E402

from transforms import ContinualCount, ContinualCountDistinct, SecretRef, TimeSteps  # noqa: E402
from transforms.arrow_input import ArrowEvents  # noqa: E402

ORIGIN = 1_700_000_000.0
HOUR = 3600.0
MAX_KEYS, MAX_CONTRIBUTIONS = 2, 2  # per user: 2 keys x 2 contributions


def write_inputs(folder: str, events: int, users: int, keys: int, steps: int, seed: int = 1):
    """Seeded Parquet inputs (count and distinct); returns their paths."""
    rng = np.random.default_rng(seed)
    ts = (ORIGIN * 1e6 + rng.integers(0, int(steps * HOUR * 1e6), events)).astype(np.int64)
    count = pa.table({"user": rng.integers(0, users, events, dtype=np.int64),
                      "key": rng.integers(0, keys, events, dtype=np.int64), "ts": ts})
    ops = np.where(rng.random(events) < 0.7, "+", "-")
    distinct = pa.table({"op": pa.array(ops),
                         "item": rng.integers(0, users, events, dtype=np.int64),
                         "key": rng.integers(0, keys, events, dtype=np.int64),
                         "ts": np.sort(ts)})
    paths = os.path.join(folder, "count.parquet"), os.path.join(folder, "distinct.parquet")
    pq.write_table(count, paths[0], row_group_size=100_000)
    pq.write_table(distinct, paths[1], row_group_size=100_000)
    return paths


def timed(build):
    """(wall seconds, CPU seconds of this process): the in-process runner runs in this process,
    so CPU seconds hold up better than wall seconds when the machine is shared."""
    start, cpu = time.perf_counter(), time.process_time()
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        build(pipeline)
    return time.perf_counter() - start, time.process_time() - cpu


def pipelines(paths, args, steps, keys):
    count_path, distinct_path = paths
    origin_us, size_us = int(ORIGIN * 1e6), int(HOUR * 1e6)

    def count_events(p):
        return (p | "Read" >> beam.io.ReadFromParquet(count_path)
                | "Events" >> beam.Map(lambda r: TimestampedValue((r["user"], r["key"]),
                                                                  r["ts"] / 1e6)))

    def distinct_events(p):
        return (p | "Read" >> beam.io.ReadFromParquet(distinct_path)
                | "Events" >> beam.Map(lambda r: TimestampedValue(
                    (r["op"], r["item"], r["key"]), r["ts"] / 1e6)))

    def floor(p):
        (p | "Read" >> beam.io.ReadFromParquet(count_path)
         | "KeyStep" >> beam.Map(lambda r: ((r["key"], (r["ts"] - origin_us) // size_us), 1))
         | beam.CombinePerKey(sum) | beam.Map(lambda kv: None))

    def pipeline_dp_count(p):
        import pipeline_dp  # optional peer: skipped when not installed
        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=1.0, total_delta=1e-6)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.BeamBackend())
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.LAPLACE, metrics=[pipeline_dp.Metrics.COUNT],
            max_partitions_contributed=MAX_KEYS,
            max_contributions_per_partition=MAX_CONTRIBUTIONS)
        extractors = pipeline_dp.DataExtractors(partition_extractor=lambda r: r["key"],
                                                privacy_id_extractor=lambda r: r["user"],
                                                value_extractor=lambda r: 0)
        rows = p | "Read" >> beam.io.ReadFromParquet(count_path)
        result = engine.aggregate(rows, params, extractors, public_partitions=keys)
        accountant.compute_budgets()
        result | beam.Map(lambda r: None)

    def continual_count_elements(p):
        result = count_events(p) | ContinualCount(
            steps=steps, public_keys=keys, epsilon=1.0, max_contributions=MAX_CONTRIBUTIONS,
            max_keys_per_unit=MAX_KEYS, mechanism="kary_subtraction",
            mechanism_params={"k": 19}, secret=SecretRef(seed=1), insecure=True)
        result.records | "Drain" >> beam.Map(lambda r: None)

    def continual_count(p):  # the batched entry: no Beam element per event
        batches = (p | "Read" >> beam.io.ReadFromParquetBatched(count_path)
                   | "Events" >> ArrowEvents({"unit": "user", "key": "key"}, timestamp="ts",
                                             timestamp_unit="us"))
        result = batches | ContinualCount(
            steps=steps, public_keys=keys, epsilon=1.0, max_contributions=MAX_CONTRIBUTIONS,
            max_keys_per_unit=MAX_KEYS, mechanism="kary_subtraction",
            mechanism_params={"k": 19}, secret=SecretRef(seed=1), insecure=True)
        result.records | "Drain" >> beam.Map(lambda r: None)

    def distinct_floor(p):
        (p | "Read" >> beam.io.ReadFromParquet(distinct_path)
         | "KeyStep" >> beam.Map(lambda r: ((r["key"], (r["ts"] - origin_us) // size_us),
                                            r["item"]))
         | beam.Distinct() | beam.combiners.Count.PerKey() | beam.Map(lambda kv: None))

    def continual_distinct(p):
        result = distinct_events(p) | ContinualCountDistinct(
            steps=steps, public_keys=keys, rho=0.5, max_flips=4, max_keys_per_unit=1,
            mechanism="sqrt_toeplitz", secret=SecretRef(seed=1), insecure=True)
        result.records | "Drain" >> beam.Map(lambda r: None)

    count = [("floor", floor), ("pipeline_dp", pipeline_dp_count),
             ("continual_count", continual_count),
             ("continual_count_elements", continual_count_elements)]
    distinct = [("distinct_floor", distinct_floor), ("continual_distinct", continual_distinct)]
    chosen = {"count": count, "distinct": distinct, "all": count + distinct}[args.only]
    if args.pipelines:
        names = args.pipelines.split(",")
        chosen = [(name, build) for name, build in chosen if name in names]
    return chosen


RATIOS = (("continual_count", "floor"), ("pipeline_dp", "floor"),
          ("continual_count", "pipeline_dp"), ("continual_count_elements", "floor"),
          ("continual_count_elements", "pipeline_dp"), ("continual_distinct", "distinct_floor"))


def run_size(events: int, args) -> dict:
    steps = TimeSteps(ORIGIN, HOUR, args.steps)
    keys = list(range(args.keys))
    with tempfile.TemporaryDirectory(prefix="bench-beam-") as folder:
        paths = write_inputs(folder, events, args.users, args.keys, args.steps)
        times, cpus = {}, {}
        for name, build in pipelines(paths, args, steps, keys):
            try:
                times[name], cpus[name] = timed(build)
            except ImportError as error:
                print(f"  {name:<20} skipped ({error})", flush=True)
                continue
            print(f"  {name:<25}{times[name]:8.2f} s wall {cpus[name]:8.2f} s CPU "
                  f"{cpus[name] / events * 1e6:7.1f} us CPU/event", flush=True)
    for top, bottom in RATIOS:
        if top in times and bottom in times:
            print(f"  {top} / {bottom}: {times[top] / times[bottom]:.2f}x wall, "
                  f"{cpus[top] / cpus[bottom]:.2f}x CPU")
    return times, cpus


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=float, default=1e6)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--only", choices=("all", "count", "distinct"), default="all")
    parser.add_argument("--pipelines", default=None,
                        help="comma-separated pipeline names to run (default: all of --only)")
    parser.add_argument("--scale", default=None,
                        help="comma-separated event counts, e.g. 1e5,1e6[,4e6]: prints the slope")
    args = parser.parse_args()
    sizes = [int(float(s)) for s in args.scale.split(",")] if args.scale else [int(args.events)]
    print(f"users {args.users}, public keys {args.keys}, steps {args.steps}, caps "
          f"{MAX_KEYS} keys x {MAX_CONTRIBUTIONS} contributions; FnApiRunner in-process")
    series = {}
    for events in sizes:
        print(f"{events:.0e} events:", flush=True)
        series[events] = run_size(events, args)
    if len(sizes) > 1:
        print("slope (seconds per 1e6 events, least squares over the series; a line through "
              "the points means time linear in events):")
        xs = np.array(sizes, dtype=float) / 1e6
        slopes = {}
        for name in series[sizes[0]][0]:
            fits = []
            for which in (0, 1):
                ys = np.array([series[n][which].get(name, np.nan) for n in sizes])
                fits.append(np.polyfit(xs, ys, 1))
            slopes[name] = fits[1][0]
            print(f"  {name:<20}{fits[0][0]:8.2f} s wall, {fits[1][0]:8.2f} s CPU per 1e6 "
                  f"events (intercepts {fits[0][1]:.2f} s, {fits[1][1]:.2f} s)")
        for top, bottom in RATIOS:
            if top in slopes and bottom in slopes:
                print(f"  slope {top} / {bottom}: {slopes[top] / slopes[bottom]:.2f}x CPU")


if __name__ == "__main__":
    main()
