"""The Beam plugin against PipelineDP and the non-private floor, same data, same run.

    python3 benchmarks/bench_beam.py [--events 1000000] [--units 100000] [--keys 1000] [--steps 100]

Pipelines (FnApiRunner in-process, events generated inside the pipeline from a seed):
- floor: plain non-private count per (key, step) with CombinePerKey;
- pipeline_dp: PipelineDP's private Count, same caps, public partitions, ONE release;
- continual_count: ContinualCount, same caps, T releases for every key;
- distinct_floor: plain non-private distinct items per (key, step);
- continual_distinct: ContinualCountDistinct.
Prints seconds and ratios. Needs `pip install pipeline-dp` (not a project dependency).
"""
from __future__ import annotations

import argparse
import time

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import TimestampedValue

from transforms import ContinualCount, ContinualCountDistinct, SecretRef, TimeSteps

CHUNK = 10_000


def generate(chunk, args, steps, distinct=False):
    rng = np.random.default_rng(chunk)
    n = min(CHUNK, args.events - chunk * CHUNK)
    units = rng.integers(0, args.units, n)
    keys = rng.integers(0, args.keys, n)
    when = steps.origin + rng.uniform(0, steps.size * steps.horizon, n)
    ops = np.where(rng.random(n) < 0.7, "+", "-")
    for i in range(n):
        element = ((str(ops[i]), f"i{units[i]}", f"k{keys[i]}") if distinct
                   else (f"u{units[i]}", f"k{keys[i]}"))
        yield TimestampedValue(element, float(when[i]))


def source(pipeline, args, steps, distinct=False):
    chunks = -(-args.events // CHUNK)
    return (pipeline | "Chunks" >> beam.Create(list(range(chunks)))
            | "Generate" >> beam.FlatMap(generate, args, steps, distinct))


def timed(build):
    start = time.perf_counter()
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        build(pipeline)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--cap", type=int, default=10)
    args = parser.parse_args()
    steps = TimeSteps(1_700_000_000.0, 3600.0, args.steps)
    keys = [f"k{i}" for i in range(args.keys)]

    def floor(p):
        (source(p, args, steps)
         | beam.WithKeys(lambda e: None) | beam.Map(lambda kv: kv[1])
         | "KeyStep" >> beam.Map(lambda e, ts=beam.DoFn.TimestampParam: (
             (e[1], steps.step_of(float(ts))), 1))
         | beam.CombinePerKey(sum) | beam.Map(lambda kv: None))

    def pipeline_dp_count(p):
        import pipeline_dp
        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=1.0, total_delta=1e-6)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.BeamBackend())
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.LAPLACE, metrics=[pipeline_dp.Metrics.COUNT],
            max_partitions_contributed=1, max_contributions_per_partition=args.cap)
        extractors = pipeline_dp.DataExtractors(partition_extractor=lambda r: r[1],
                                                privacy_id_extractor=lambda r: r[0],
                                                value_extractor=lambda r: 0)
        result = engine.aggregate(source(p, args, steps), params, extractors,
                                  public_partitions=keys)
        accountant.compute_budgets()
        result | beam.Map(lambda r: None)

    def continual(p):
        result = source(p, args, steps) | ContinualCount(
            steps=steps, public_keys=keys, epsilon=1.0, max_contributions=args.cap,
            max_keys_per_unit=1, mechanism="kary_subtraction", mechanism_params={"k": 19},
            secret=SecretRef(seed=1), insecure=True)
        result.records | "Drain" >> beam.Map(lambda r: None)

    def distinct_floor(p):
        (source(p, args, steps, distinct=True)
         | "KeyStep" >> beam.Map(lambda e, ts=beam.DoFn.TimestampParam: (
             (e[2], steps.step_of(float(ts))), e[1]))
         | beam.Distinct() | beam.combiners.Count.PerKey() | beam.Map(lambda kv: None))

    def continual_distinct(p):
        result = source(p, args, steps, distinct=True) | ContinualCountDistinct(
            steps=steps, public_keys=keys, rho=0.5, max_flips=4, max_keys_per_unit=1,
            mechanism="sqrt_toeplitz", secret=SecretRef(seed=1), insecure=True)
        result.records | "Drain" >> beam.Map(lambda r: None)

    times = {}
    for name, build in (("floor", floor), ("pipeline_dp", pipeline_dp_count),
                        ("continual_count", continual), ("distinct_floor", distinct_floor),
                        ("continual_distinct", continual_distinct)):
        try:
            times[name] = timed(build)
        except ImportError as error:
            print(f"{name}: skipped ({error})")
            continue
        print(f"{name:<20}{times[name]:8.1f} s", flush=True)
    if "pipeline_dp" in times:
        ratio = times["continual_count"] / times["pipeline_dp"]
        print(f"continual_count / pipeline_dp Count: {ratio:.2f}x"
              f" (we release {args.steps} steps x {args.keys} keys; PipelineDP releases once)")
    print(f"continual_count / non-private floor: {times['continual_count'] / times['floor']:.2f}x")
    print(f"continual_distinct / non-private distinct: "
          f"{times['continual_distinct'] / times['distinct_floor']:.2f}x")


if __name__ == "__main__":
    main()
