"""Streaming cost of `step(state, x) -> (out, state)` per mechanism, against numpy's per-call
overhead measured in the same run.

    python3 benchmarks/bench_steps.py [--exponent 20] [--steps 2000] [--repeats 3]
        [--mechanisms blt binary_tree ...] [--clock wall|cpu] [--profile NAME]

Per mechanism and noise (default discrete, opt-in float; T = 2^exponent): microseconds per
step over the first `steps` steps from `init_state()`, and over `steps` steps from a state
resumed from its bytes at t = T / 2 (a fresh mechanism object, as in a new worker: whatever
the mechanism re-derives once on resume, e.g. the BLT buffers, is reported separately as
"resume ms"; the resumed per-step figure is the steady state after it). The first-2000 figure
includes the first step, whose one-off work (e.g. the square root's O(T) noise vector) is also
shown alone as "first ms". Also the bytes of the serialised state. Baseline: one
`rng.laplace()` scalar draw (numpy's per-call overhead), measured again next to each row
("draw us"), so the "x draw" columns are ratios that survive a loaded or slower machine.
Median of `repeats` runs, each on a fresh stream (no noise cached from an earlier run). The
per-key memory a mechanism keeps besides the state (BLT: d + 2 floats per stream) is in its
docstring, not measured here.

`--clock cpu` times with time.process_time (this process's CPU time) instead of
time.perf_counter: steadier on a machine shared with other jobs.

Targets (issues 14 and 15): blt <= 10 us per step; the trees' share of a <= 30 us per key-step
Beam release well below 30 us. `--profile NAME` prints a cProfile of NAME's resumed steps.
Not run in CI.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

import numpy as np

CLOCK = time.perf_counter  # --clock cpu: time.process_time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transforms.mechanisms import NAMES, CounterState, make  # noqa: E402
from transforms.mechanisms.base import state_from_bytes  # noqa: E402

PARAMS = {"kary_tree": {"k": 4}, "kary_subtraction": {"k": 19}}


def cases(names):
    for name in names:
        for noise in ("discrete", "float"):
            if name == "blt" and noise == "discrete":
                continue  # float noise only
            privacy = {"rho": 0.5} if name == "sqrt_toeplitz" and noise == "discrete" \
                else {"epsilon": 1.0}
            yield name, noise, privacy


def numpy_draw_us(calls: int = 50_000) -> float:
    """Microseconds per single `rng.laplace()` draw (numpy's per-call overhead)."""
    rng = np.random.default_rng(0)
    laplace = rng.laplace
    best = float("inf")
    for _ in range(3):
        start = CLOCK()
        for _ in range(calls):
            laplace()
        best = min(best, CLOCK() - start)
    return best / calls * 1e6


def run_steps(mechanism, state, values):
    """(us per step over all `values`, ms of the first step, final state)."""
    step = mechanism.step
    start = CLOCK()
    _, state = step(state, values[0])
    first = CLOCK()
    for value in values[1:]:
        _, state = step(state, value)
    end = CLOCK()
    return (end - start) / len(values) * 1e6, (first - start) * 1e3, state


def measure(name, noise, privacy, horizon, steps, repeats, values, build):
    mechanism = build(name, noise, privacy, horizon)
    fresh, first_ms, resumed, resume_ms = [], [], [], []
    state = None
    for r in range(repeats):
        streamer = mechanism.for_stream(f"fresh-{r}")
        per_step, first, state = run_steps(streamer, streamer.init_state(), values[:steps])
        fresh.append(per_step)
        first_ms.append(first)
        # resume at T/2 in a "new process": a new object, the state only from its bytes
        other = build(name, noise, privacy, horizon).for_stream(f"resumed-{r}")
        middle = horizon // 2
        data = CounterState(middle, float(np.sum(values[:middle]))).to_bytes() \
            if isinstance(state, CounterState) else None
        if data is None:  # history states (discrete sqrt): grow one the honest way
            _, history = other.advance(other.init_state(), values[:middle])
            data = history.to_bytes()
        start = CLOCK()
        resumed_state = state_from_bytes(data)
        _, resumed_state = other.step(resumed_state, values[middle])  # one-off re-derivation
        resume_ms.append((CLOCK() - start) * 1e3)
        per_step, _, _ = run_steps(other, resumed_state, values[middle + 1:middle + 1 + steps])
        resumed.append(per_step)
    median = statistics.median
    return (median(fresh), median(first_ms), median(resumed), median(resume_ms),
            len(state.to_bytes()))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--exponent", type=int, default=20)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mechanisms", nargs="+", choices=NAMES, default=list(NAMES))
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--profile", choices=NAMES, default=None)
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    horizon = 1 << args.exponent
    values = [float(v) for v in np.random.default_rng(0).integers(0, 3, horizon)]

    def build(name, noise, privacy, horizon):
        mechanism = make(name, horizon, seed=1, noise=noise, **privacy,
                         **PARAMS.get(name, {}))
        _ = mechanism.node_scale  # calibration, not part of a step
        return mechanism

    draw = numpy_draw_us()
    print(f"T = 2^{args.exponent}, {args.steps} steps, median of {args.repeats}, {args.clock} "
          f"clock; numpy rng.laplace() single draw: {draw:.3f} us")
    print(f"{'mechanism':<20}{'noise':<19}{'us/step':>9}{'x draw':>8}{'first ms':>9}"
          f"{'resumed':>9}{'x draw':>8}{'resume ms':>10}{'state B':>8}{'draw us':>8}")
    for name, noise, privacy in cases(args.mechanisms):
        if name == "sqrt_toeplitz" and noise == "discrete" and args.exponent > 16:
            # O(t) history state and O(t) work per step: 2000 steps at t = 2^19 take minutes
            print(f"{name:<20}{'discrete_gaussian':<19}(O(t) history state and work per step: "
                  f"run with --exponent 14)")
            continue
        fresh, first_ms, resumed, resume_ms, size = measure(
            name, noise, privacy, horizon, args.steps, args.repeats, values, build)
        label = ("discrete_" if noise == "discrete" else "") + \
            ("gaussian" if "rho" in privacy else "laplace")
        draw = numpy_draw_us()  # again next to the row: a shared machine's load drifts
        print(f"{name:<20}{label:<19}{fresh:>9.2f}{fresh / draw:>8.1f}{first_ms:>9.2f}"
              f"{resumed:>9.2f}{resumed / draw:>8.1f}{resume_ms:>10.1f}{size:>8}"
              f"{draw:>8.3f}", flush=True)
    if args.profile:
        name = args.profile
        noise = "float" if name == "blt" else "discrete"
        privacy = {"rho": 0.5} if name == "sqrt_toeplitz" else {"epsilon": 1.0}
        mechanism = build(name, noise, privacy, horizon).for_stream("profile")
        state = mechanism.init_state()
        if isinstance(state, CounterState):
            state = mechanism.step(CounterState(horizon // 2, 0.0), 1.0)[1]
        profile = cProfile.Profile()
        profile.enable()
        run_steps(mechanism, state, values[:args.steps])
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
