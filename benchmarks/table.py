"""The performance table of issue #39, each row a ratio to its baseline measured in the same
run (interleaved and repeated; min and median), from one command (not run in CI).

    python3 benchmarks/table.py [--events 1e6] [--repeats 3] [--release-keys 1000]
                                [--release-steps 1000] [--exponent 20] [--skip beam,release]

Rows and goals:
- the batched entry (Parquet -> `ArrowEvents` -> ContinualCount) vs PipelineDP's one-shot
  Count (skipped when `pipeline_dp` is not importable): <= 0.2x;
- the batched entry vs the vectorised Arrow-batch Beam floor (`bench_beam.arrow_floor`):
  <= 2.5x;
- the element entry (one TimestampedValue per row) vs the plain CombinePerKey floor: <= 2.5x;
- the product's job (`pipelines.run.build`) on JSON lines vs the same events in Parquet:
  <= 1.5x;
- the streaming release per key-step (`bench_streaming.release`, binary tree, keys stepping
  together) vs its floor (`FloorReleaseFn`): <= 3x;
- batch release at T = 2^exponent vs numpy Laplace draws (`bench_mechanisms.batch_ratio`,
  discrete noise, rho 0.5): the trees <= 3x, the square root <= 10x, the smooth tree <= 5x.
The live streaming row (late events at a trickle) is `benchmarks/bench_pubsub.py` (it needs
the Pub/Sub emulator). Sizes default to the issue's (1e6 events, 1e3 keys x 1e3 steps,
T = 2^20): about an hour on a 2-core machine; pass smaller ones for a quick look.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import bench_beam  # noqa: E402
import bench_mechanisms  # noqa: E402
import bench_streaming  # noqa: E402
from transforms.mechanisms import make, toeplitz  # noqa: E402

ROWS = []  # (row, min ratio, median ratio, goal)


def row(name: str, low: float, mid: float, goal: float) -> None:
    ROWS.append((name, low, mid, goal))
    print(f"  -> {name}: {low:.2f}x / {mid:.2f}x (goal <= {goal:g}x)", flush=True)


def beam_rows(args) -> None:
    options = types.SimpleNamespace(
        repeats=args.repeats, only="all", users=int(args.events) // 10, keys=1000, steps=100,
        text_times="seconds",
        pipelines="floor,arrow_floor,pipeline_dp,continual_count,continual_count_elements,"
                  "job_parquet,job_jsonl")
    cpus = bench_beam.run_size(int(args.events), options, medians=True)
    for top, bottom, goal in (("continual_count", "pipeline_dp", 0.2),
                              ("continual_count", "arrow_floor", 2.5),
                              ("continual_count_elements", "floor", 2.5),
                              ("job_jsonl", "job_parquet", 1.5)):
        if top in cpus and bottom in cpus:
            row(f"{top} / {bottom}", min(cpus[top]) / min(cpus[bottom]),
                float(np.median(cpus[top]) / np.median(cpus[bottom])), goal)


def release_rows(args) -> None:
    ratios = []
    for _ in range(args.repeats):
        found = bench_streaming.release(types.SimpleNamespace(repeat=1), "binary_tree",
                                        args.release_steps, args.release_keys,
                                        interleaved=True, warm=False)
        ratios.append(found["release_us"] / found["floor_us"])
        print(f"  release {found['release_us']:.1f} us per key-step, floor "
              f"{found['floor_us']:.1f} us", flush=True)
    row("streaming release per key-step / its floor", min(ratios), float(np.median(ratios)),
        3.0)


def mechanism_rows(args) -> None:
    horizon = 2 ** args.exponent
    x = np.random.default_rng(0).integers(0, 3, horizon).astype(np.float64)
    for names, goal in ((("binary_tree", "kary_tree", "kary_subtraction"), 3.0),
                        (("sqrt_toeplitz",), 10.0), (("smooth_binary",), 5.0)):
        for name in names:
            mechanism = make(name, horizon, seed=1, rho=0.5,
                             **bench_mechanisms.PARAMS.get(name, {}))
            ours, numpy_s, low, mid = bench_mechanisms.batch_ratio(mechanism, x, args.repeats)
            print(f"  {name} at T = 2^{args.exponent}: {ours:.3f} s, numpy {numpy_s:.3f} s",
                  flush=True)
            row(f"{name} batch at T = 2^{args.exponent} / numpy Laplace", low, mid, goal)
    low, mid = fft_floor(x, args.repeats)
    print(f"  (context) sqrt_toeplitz's two convolutions alone (the release's rfft and irfft of "
          f"2T points, the exact data part's in 8 blocks) / numpy Laplace: {low:.2f}x / "
          f"{mid:.2f}x", flush=True)


def fft_floor(x: np.ndarray, repeats: int):
    """(min, median ratio): the square root's convolutions alone (`toeplitz.convolve`, the
    release's, and `toeplitz.block_convolution`, the exact data part's), timed alternately
    with numpy's Laplace draws of as many values, as `bench_mechanisms.batch_ratio` times a
    release."""
    n = x.shape[0]
    size = 1 << (2 * n - 1).bit_length()
    kernel, blocks = np.fft.rfft(x, size), toeplitz.block_spectra(x, n)
    ffts, numpy_s = [], []
    for i in range(repeats):
        for which in ((0, 1) if i % 2 == 0 else (1, 0)):
            start = time.perf_counter()
            if which == 0:
                toeplitz.block_convolution(blocks, x)
                toeplitz.convolve(kernel, x, size, n)
            else:
                np.random.default_rng(i).laplace(size=x.shape[0])
            (ffts if which == 0 else numpy_s).append(time.perf_counter() - start)
    return min(ffts) / min(numpy_s), float(np.median(ffts) / np.median(numpy_s))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=float, default=1e6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--release-keys", type=int, default=1000)
    parser.add_argument("--release-steps", type=int, default=1000)
    parser.add_argument("--exponent", type=int, default=20)
    parser.add_argument("--skip", default="", help="comma-separated: beam, release, mechanisms")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    for name, part in (("beam", beam_rows), ("release", release_rows),
                       ("mechanisms", mechanism_rows)):
        if name not in skip:
            print(f"{name}:", flush=True)
            part(args)
    print("\n| row | ratio (min / median) | goal | meets |\n|---|---|---|---|")
    for name, low, mid, goal in ROWS:
        print(f"| {name} | {low:.2f}x / {mid:.2f}x | <= {goal:g}x | "
              f"{'yes' if low <= goal else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
