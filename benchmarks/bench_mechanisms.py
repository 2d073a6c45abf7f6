"""Batch release and streaming cost of every mechanism, as ratios to numpy in the same run.

    python3 benchmarks/bench_mechanisms.py [--exponents 16 20 22] [--repeats 3]
        [--mechanisms smooth_binary ...]

Baseline: numpy's default generator drawing T continuous Laplace samples (no keyed hashing, no
tree). Every mechanism runs with its default discrete noise (discrete Laplace / discrete
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
          f"{'x numpy':>9}{'us/step':>9}")
    for exponent in args.exponents:
        horizon = 2 ** exponent
        x = rng.integers(0, 3, horizon).astype(np.float64)
        baseline = timed(lambda i: np.random.default_rng(i).laplace(size=horizon), args.repeats)
        print(f"{horizon:>9} {'numpy laplace':<20}{'':<18}{'':>9}{baseline:>9.4f}{1.0:>9.2f}")
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
            batch = timed(lambda i: mechanism.for_stream(f"b{i}").release(x), args.repeats)
            streamer = mechanism.for_stream("streaming")
            state = streamer.init_state()
            steps = min(args.streaming_steps, horizon)
            start = time.perf_counter()
            for value in x[:steps]:
                _, state = streamer.step(state, value)
            per_step = (time.perf_counter() - start) / steps * 1e6
            print(f"{horizon:>9} {name:<20}{mechanism.noise_name:<18}{setup:>9.3f}"
                  f"{batch:>9.4f}{batch / baseline:>9.2f}{per_step:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
