"""CPU cost of the unbounded path's DoFns, measured in isolation (not run in CI, not a test).

    python3 benchmarks/bench_streaming.py [--units 20000] [--events 100000] [--keys 200]
                                          [--steps 100] [--long-horizon 8760]
                                          [--mechanisms a,b] [--interleaved binary_tree,...]

CPU time of this process (time.process_time: robust on a shared machine). The DoFn methods
of `transforms.stages` are called directly with fake state and timer objects, made from the
DoFn's own state specs, that encode on write and decode on read with the DoFn's own coders
(as Beam's state does, so the coding cost is counted and the bytes are real); the fakes'
bookkeeping (finding a key's cells, clearing a fired timer) is outside the timed calls. The runner's own cost per element and per
timer firing comes on top (BEAM_NOTES.md: ~7,000 timer firings/s on FnApiRunner with the state
cache disabled, ~400/s with it).

Prints
- truncation (`TruncateStreamingFn`): us per event of `process` (buffering) and of the step-end
  `flush` timer (the unit's machine, per event and per firing);
- release (`ReleaseStreamingFn`) for every mechanism: us per step total in `process`, us per
  key-step release (the `release` timer, i.e. timer firings per second of DoFn CPU), the same
  keys again on fresh state ("warm": without the first derivation of the noise blocks a key's
  steps read, 1024 nodes per block and tree level), and the bytes of Beam state per key (the
  sealed mechanism state, pending sums, halted); with `--interleaved`, those mechanisms again
  with all keys stepping together (as at a step end on a worker: the keys then share the
  mechanism's bounded noise-block cache);
- the square root mechanism at `--long-horizon` steps: its per-key state grows with t, and
  what that means for 1e5 keys.
"""
from __future__ import annotations

import argparse
import inspect
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import apache_beam as beam  # noqa: E402
from apache_beam.transforms.userstate import BagStateSpec  # noqa: E402
from apache_beam.utils.timestamp import Timestamp  # noqa: E402

from transforms import ContinualCount, SecretRef, TimeSteps  # noqa: E402
from transforms.mechanisms import NAMES  # noqa: E402
from transforms.stages import (StepTotal, ReleaseStreamingFn,  # noqa: E402
                               TruncateStreamingFn)

ORIGIN = 1_700_000_000.0
HOUR = 3600.0


class FakeValue:
    """ReadModifyWrite state: stored encoded, decoded on every read (Beam without a cache)."""

    def __init__(self, coder):
        self.coder, self.data = coder, None

    def read(self):
        return None if self.data is None else self.coder.decode(self.data)

    def write(self, value):
        self.data = self.coder.encode(value)

    def clear(self):
        self.data = None

    def size(self):
        return 0 if self.data is None else len(self.data)


class FakeBag:
    def __init__(self, coder):
        self.coder, self.data = coder, []

    def add(self, value):
        self.data.append(self.coder.encode(value))

    def read(self):
        return [self.coder.decode(d) for d in self.data]

    def clear(self):
        self.data = []

    def size(self):
        return sum(len(d) for d in self.data)


class FakeTimer:
    def __init__(self):
        self.time = None
        self.sets = 0

    def set(self, when):
        self.time, self.sets = when, self.sets + 1

    def clear(self):
        self.time = None


def drain(generator):
    return sum(1 for _ in generator) if generator is not None else 0


class Cells:
    """One key's fake state cells and timers, made from the DoFn's own specs (the parameter
    defaults of its methods), so the benchmark follows whatever state layout the DoFn uses."""

    def __init__(self):
        self.cells, self.timers = {}, {}

    def bind(self, method, **given):
        """Keyword arguments for `method`: its state and timer parameters bound to this key's
        cells, its key / timestamp parameters to `given` ("key", "fire"; "fire" may be left
        out and passed at the call)."""
        kwargs = {}
        for name, param in inspect.signature(method).parameters.items():
            default = param.default
            spec = getattr(default, "state_spec", None)
            if spec is not None:
                cell = self.cells.get(spec.name)
                if cell is None:
                    kind = FakeBag if isinstance(spec, BagStateSpec) else FakeValue
                    cell = self.cells[spec.name] = kind(spec.coder)
                kwargs[name] = cell
            elif getattr(default, "timer_spec", None) is not None:
                kwargs[name] = self.timers.setdefault(default.timer_spec.name, FakeTimer())
            elif default is beam.DoFn.KeyParam:
                kwargs[name] = given["key"]
            elif default is beam.DoFn.TimestampParam and "fire" in given:
                kwargs[name] = given["fire"]
        return kwargs

    def clear_timers(self):
        for timer in self.timers.values():
            timer.clear()

    def size(self):
        return sum(cell.size() for cell in self.cells.values())


def count_transform(steps, keys, mechanism):
    """rho = 0.5 (zCDP: every mechanism has a discrete release there but blt, which gets
    float noise)."""
    common = dict(steps=steps, public_keys=keys, rho=0.5, max_contributions=2,
                  max_keys_per_unit=2, mechanism=mechanism, secret=SecretRef(seed=1),
                  insecure=True)
    try:
        return ContinualCount(**common)
    except ValueError:
        return ContinualCount(noise="float", **common)


def truncation(args):
    steps = TimeSteps(ORIGIN, HOUR, args.steps)
    transform = count_transform(steps, list(range(args.keys)), "binary_tree")
    fn = TruncateStreamingFn(transform.problem, steps, False)
    fn.setup()
    rng = np.random.default_rng(1)
    unit_ids = rng.integers(0, args.units, args.events).tolist()
    key_ids = rng.integers(0, args.keys, args.events).tolist()
    micros = np.sort(rng.integers(int(ORIGIN * 1e6), int(steps.stop * 1e6),
                                  args.events)).tolist()
    events = [(u, (int((m / 1e6 - ORIGIN) // HOUR), m, (k, 1.0)))
              for u, k, m in zip(unit_ids, key_ids, micros)]
    states = {}

    def state_of(unit):
        found = states.get(unit)
        if found is None:
            cells = Cells()
            found = states[unit] = (cells, cells.bind(fn.process),
                                    cells.bind(fn.flush, key=unit))
        return found

    for unit in set(unit_ids):  # cells made outside the timed loops
        state_of(unit)
    process_s = flush_s = 0.0
    firings = outputs = 0
    # event time order, step by step: buffer a step's events, then fire the step-end timers
    by_step = {}
    for unit, event in events:
        by_step.setdefault(event[0], []).append((unit, event))
    for step in range(args.steps):
        # the fakes' bookkeeping (finding a unit's cells, clearing its fired timer) is done
        # outside the timed loops: only the DoFn's calls are timed
        batch = [(element, state_of(element[0])[1]) for element in by_step.get(step, [])]
        start = time.process_time()
        for element, kwargs in batch:
            drain(fn.process(element, **kwargs))
        process_s += time.process_time() - start
        fire = Timestamp(micros=int(round(steps.end(step) * 1e6)))
        due = [state_of(unit) for unit in {unit for unit, _ in by_step.get(step, [])}]
        for cells, _, _ in due:
            cells.clear_timers()
        start = time.process_time()
        for _, _, flush in due:
            outputs += drain(fn.flush(fire=fire, **flush))
        flush_s += time.process_time() - start
        firings += len(due)
    n = len(events)
    unit_bytes = np.mean([cells.size() for cells, _, _ in states.values()])
    print(f"truncation (count, caps 2 keys x 2): {n} events, {len(states)} units, "
          f"{args.steps} steps")
    print(f"  process (buffer an event)      {process_s / n * 1e6:7.1f} us/event")
    print(f"  step-end flush (the machine)   {flush_s / n * 1e6:7.1f} us/event, "
          f"{flush_s / firings * 1e6:7.1f} us/firing ({firings} firings, "
          f"{firings / flush_s:,.0f} firings/s of DoFn CPU)")
    print(f"  total                          {(process_s + flush_s) / n * 1e6:7.1f} us/event; "
          f"{outputs} outputs; state {unit_bytes:.0f} bytes per unit after the horizon")


def release(args, mechanism, horizon, keys, sample_steps=None, interleaved=False,
            warm=True):
    """Per key: the seed, one StepTotal per (key, step) and the release timer at every step.

    Keys one after the other (each through every step), then the same keys again on fresh
    state ("warm": the same work without the first derivation of the noise blocks a key's
    steps read, which a key pays once per block of 1024 nodes per tree level). With
    `interleaved`, all keys step together instead, as when the watermark passes a step end:
    a worker's keys then share the mechanism's bounded noise-block cache."""
    steps = TimeSteps(ORIGIN, HOUR, horizon)
    transform = count_transform(steps, list(range(keys)), mechanism)
    fn = ReleaseStreamingFn(transform.config, transform.public_keys)
    fn.setup()
    from transforms.stages import Seed
    rng = np.random.default_rng(2)
    values = [rng.poisson(3, horizon).astype(float).tolist() for _ in range(keys)]

    def run(order):
        """(process s, release s, releases, last-steps release s, state bytes per key)."""
        process_s = release_s = 0.0
        last = []
        cells = [Cells() for _ in range(keys)]
        bound = [(key, cells[key].bind(fn.process), cells[key].bind(fn.release, key=key))
                 for key in range(keys)]
        for key, process, _ in bound:
            drain(fn.process((key, Seed()), **process))
        for key, step in order:
            _, process, fire = bound[key]
            message = (key, StepTotal(step, values[key][step]))
            start = time.process_time()
            drain(fn.process(message, **process))
            middle = time.process_time()
            drain(fn.release(**fire))
            end = time.process_time()
            process_s += middle - start
            release_s += end - middle
            if sample_steps and step >= horizon - sample_steps:
                last.append(end - middle)
        return process_s, release_s, last, float(np.mean([c.size() for c in cells]))

    if interleaved:
        order = [(key, step) for step in range(horizon) for key in range(keys)]
        process_s, release_s, last, size = run(order)
        warm_s = None
    else:
        process_s, release_s, last, size = run([(key, step) for key in range(keys)
                                                for step in range(horizon)])
        warm_s = run([(key, step) for key in range(keys) for step in range(horizon)])[1] \
            if warm else None
    releases = keys * horizon
    return {"process_us": process_s / releases * 1e6, "release_us": release_s / releases * 1e6,
            "warm_us": None if warm_s is None else warm_s / releases * 1e6,
            "firings_per_s": releases / release_s, "bytes_per_key": size,
            "last_release_us": float(np.mean(last)) * 1e6 if last else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--long-horizon", type=int, default=8760)
    parser.add_argument("--mechanisms", default=",".join(NAMES))
    parser.add_argument("--interleaved", default="",
                        help="mechanisms to release again with all keys stepping together")
    args = parser.parse_args()
    truncation(args)
    print(f"release per key ({args.keys} keys x {args.steps} steps, one step total per "
          f"key-step; targets <= 30 us per key-step release for the trees):")
    print(f"  {'mechanism':<20}{'process us/total':>17}{'release us/key-step':>21}"
          f"{'warm':>7}{'firings/s':>11}{'state B/key':>13}")
    for name in args.mechanisms.split(","):
        try:
            r = release(args, name, args.steps, args.keys)
        except Exception as error:  # a mechanism this horizon or budget does not fit
            print(f"  {name:<20}skipped ({type(error).__name__}: {error})")
            continue
        print(f"  {name:<20}{r['process_us']:17.1f}{r['release_us']:21.1f}{r['warm_us']:7.1f}"
              f"{r['firings_per_s']:11,.0f}{r['bytes_per_key']:13,.0f}")
    if args.interleaved:
        print(f"release per key with all {args.keys} keys stepping together (a worker's keys "
              f"at a step end; noise blocks: {args.keys} keys x the tree's levels against "
              f"the mechanism's block cache):")
        for name in args.interleaved.split(","):
            r = release(args, name, args.steps, args.keys, interleaved=True)
            print(f"  {name:<20}{r['process_us']:17.1f}{r['release_us']:21.1f}")
    horizon = args.long_horizon
    for name in ("sqrt_toeplitz", "binary_tree"):
        try:
            r = release(args, name, horizon, 1, sample_steps=100, warm=False)
        except Exception as error:
            print(f"  {name} at T = {horizon}: skipped ({type(error).__name__}: {error})")
            continue
        total = r["bytes_per_key"] * 1e5
        print(f"{name} at T = {horizon}, one key through every step: state "
              f"{r['bytes_per_key']:,.0f} bytes per key at the end (x 1e5 keys = "
              f"{total / 2 ** 30:.2f} GiB of Beam state), release {r['release_us']:.1f} "
              f"us/key-step on average, {r['last_release_us']:.1f} us in the last 100 steps")


if __name__ == "__main__":
    main()
