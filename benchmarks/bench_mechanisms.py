"""Batch release and streaming cost of every mechanism, as ratios to numpy in the same run.

    python3 benchmarks/bench_mechanisms.py [--exponents 16 20 22] [--repeats 3]
        [--mechanisms smooth_binary ...]

Baseline: numpy's default generator drawing T continuous Laplace samples (no keyed hashing, no
tree), timed next to each mechanism's batch release in every repeat (interleaved: baseline,
mechanism, mechanism, baseline, ...), so a ratio holds on a machine whose speed drifts; the
ratio is printed of the mins and of the medians. Every mechanism runs with its default discrete noise (discrete Laplace / discrete
Gaussian from exact tables) and with the opt-in float noise. Per mechanism, noise and T: set-up
time (calibration: the exact sparsified sensitivity is enumerated up
to T = 2^22), batch `release` time / baseline (median of repeats, a fresh stream each time so no
cached noise is reused), and streaming cost per step over 2000 steps. Not run in CI.
"""
from __future__ import annotations

import argparse
import os
import sys
import statistics
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from transforms.mechanisms import NAMES, make

PARAMS = {"kary_tree": {"k": 4}, "kary_subtraction": {"k": 19}}


def timed(fn, repeats):
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def batch_ratio(mechanism, x: np.ndarray, repeats: int):
    """(mechanism's batch release seconds, numpy Laplace's, ratio of mins, ratio of medians):
    the two timed alternately, a fresh stream each time (no cached noise reused)."""
    ours, numpy_s = [], []
    for i in range(repeats):
        for which in ((0, 1) if i % 2 == 0 else (1, 0)):
            start = time.perf_counter()
            if which == 0:
                mechanism.for_stream(f"b{i}").release(x)
            else:
                np.random.default_rng(i).laplace(size=x.shape[0])
            (ours if which == 0 else numpy_s).append(time.perf_counter() - start)
    return (min(ours), min(numpy_s), min(ours) / min(numpy_s),
            statistics.median(ours) / statistics.median(numpy_s))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--exponents", type=int, nargs="+", default=[16, 20, 22])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--streaming-steps", type=int, default=2000)
    parser.add_argument("--mechanisms", nargs="+", choices=NAMES, default=list(NAMES),
                        help="restrict the run to these mechanisms (default: all)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'T':>9} {'mechanism':<20}{'noise':<18}{'setup s':>9}{'batch s':>9}"
          f"{'numpy s':>9}{'x numpy':>15}{'us/step':>9}")
    for exponent in args.exponents:
        horizon = 2 ** exponent
        x = rng.integers(0, 3, horizon).astype(np.float64)
        for name, privacy, noise in [(n, p, k) for n in args.mechanisms
                                     for p in ({"epsilon": 1.0}, {"rho": 0.5})
                                     for k in ("discrete", "float")
                                     # the discrete square root is calibrated for zCDP only
                                     if not (n == "sqrt_toeplitz" and k == "discrete"
                                             and "epsilon" in p)
                                     and not (n == "blt" and k == "discrete")]:  # float only
            start = time.perf_counter()
            mechanism = make(name, horizon, seed=1, noise=noise, **privacy,
                             **PARAMS.get(name, {}))
            _ = mechanism.node_scale
            setup = time.perf_counter() - start
            batch, baseline, low, mid = batch_ratio(mechanism, x, args.repeats)
            streamer = mechanism.for_stream("streaming")
            state = streamer.init_state()
            steps = min(args.streaming_steps, horizon)
            start = time.perf_counter()
            for value in x[:steps]:
                _, state = streamer.step(state, value)
            per_step = (time.perf_counter() - start) / steps * 1e6
            print(f"{horizon:>9} {name:<20}{mechanism.noise_name:<18}{setup:>9.3f}"
                  f"{batch:>9.4f}{baseline:>9.4f}{low:>8.2f} / {mid:<4.2f}{per_step:>9.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
