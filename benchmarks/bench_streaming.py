"""CPU cost of the unbounded path's DoFns, measured in isolation (not run in CI, not a test).

    python3 benchmarks/bench_streaming.py [--units 20000] [--events 100000] [--keys 200]
                                          [--steps 100] [--long-horizon 8760]

CPU time of this process (time.process_time: robust on a shared machine). The DoFn methods
of `transforms.stages` are called directly with fake state and timer objects
that encode on write and decode on read with the DoFn's own coders (as Beam's state does, so
the coding cost is counted and the bytes are real). The runner's own cost per element and per
timer firing comes on top (BEAM_NOTES.md: ~7,000 timer firings/s on FnApiRunner with the state
cache disabled, ~400/s with it).

Prints
- truncation (`TruncateStreamingFn`): us per event of `process` (buffering) and of the step-end
  `flush` timer (the unit's machine, per event and per firing);
- release (`ReleaseStreamingFn`) for every mechanism: us per step total in `process`, us per
  key-step release (the `release` timer, i.e. timer firings per second of DoFn CPU), and the
  bytes of Beam state per key (the sealed mechanism state, pending sums, halted);
- the square root mechanism at `--long-horizon` steps: its per-key state grows with t, and
  what that means for 1e5 keys.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
from apache_beam.coders import BytesCoder, PickleCoder  # noqa: E402
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
    rng = np.random.default_rng(1)
    unit_ids = rng.integers(0, args.units, args.events).tolist()
    key_ids = rng.integers(0, args.keys, args.events).tolist()
    micros = np.sort(rng.integers(int(ORIGIN * 1e6), int(steps.stop * 1e6),
                                  args.events)).tolist()
    events = [(u, (int((m / 1e6 - ORIGIN) // HOUR), m, (k, 1.0)))
              for u, k, m in zip(unit_ids, key_ids, micros)]
    pickle = PickleCoder()
    states = {}

    def state_of(unit):
        found = states.get(unit)
        if found is None:
            found = states[unit] = {"buffer": FakeBag(pickle), "unit_state": FakeValue(pickle),
                                    "next_step": FakeValue(pickle),
                                    "earliest": FakeValue(pickle), "timer": FakeTimer()}
        return found

    process_s = flush_s = 0.0
    firings = outputs = 0
    # event time order, step by step: buffer a step's events, then fire the step-end timers
    by_step = {}
    for unit, event in events:
        by_step.setdefault(event[0], []).append((unit, event))
    for step in range(args.steps):
        batch = by_step.get(step, [])
        start = time.process_time()
        for element in batch:
            s = state_of(element[0])
            drain(fn.process(element, buffer=s["buffer"], next_step=s["next_step"],
                             earliest=s["earliest"], timer=s["timer"]))
        process_s += time.process_time() - start
        fire = Timestamp(micros=int(round(steps.end(step) * 1e6)))
        due = {unit for unit, _ in batch}
        start = time.process_time()
        for unit in due:
            s = state_of(unit)
            s["timer"].clear()
            outputs += drain(fn.flush(key=unit, fire=fire, buffer=s["buffer"],
                                      unit_state=s["unit_state"], next_step=s["next_step"],
                                      earliest=s["earliest"], timer=s["timer"]))
            firings += 1
        flush_s += time.process_time() - start
    n = len(events)
    unit_bytes = np.mean([sum(v.size() for k, v in s.items() if k != "timer")
                          for s in states.values()])
    print(f"truncation (count, caps 2 keys x 2): {n} events, {len(states)} units, "
          f"{args.steps} steps")
    print(f"  process (buffer an event)      {process_s / n * 1e6:7.1f} us/event")
    print(f"  step-end flush (the machine)   {flush_s / n * 1e6:7.1f} us/event, "
          f"{flush_s / firings * 1e6:7.1f} us/firing ({firings} firings, "
          f"{firings / flush_s:,.0f} firings/s of DoFn CPU)")
    print(f"  total                          {(process_s + flush_s) / n * 1e6:7.1f} us/event; "
          f"{outputs} outputs; state {unit_bytes:.0f} bytes per unit after the horizon")


def release(args, mechanism, horizon, keys, sample_steps=None):
    """Per key: the seed, one StepTotal per (key, step) and the release timer at every step."""
    steps = TimeSteps(ORIGIN, HOUR, horizon)
    transform = count_transform(steps, list(range(keys)), mechanism)
    fn = ReleaseStreamingFn(transform.config, transform.public_keys)
    fn.setup()
    pickle, raw = PickleCoder(), BytesCoder()
    from transforms.stages import Seed
    rng = np.random.default_rng(2)
    process_s = release_s = 0.0
    totals = releases = 0
    sizes = []
    last = []
    for key in range(keys):
        pending, counter, halted, timer = (FakeValue(pickle), FakeValue(raw),
                                           FakeValue(pickle), FakeTimer())
        drain(fn.process((key, Seed()), pending=pending, counter=counter, halted=halted,
                         timer=timer))
        values = rng.poisson(3, horizon).astype(float).tolist()
        for step in range(horizon):
            message = (key, StepTotal(step, values[step]))
            start = time.process_time()
            drain(fn.process(message, pending=pending, counter=counter, halted=halted,
                             timer=timer))
            middle = time.process_time()
            drain(fn.release(key=key, pending=pending, counter=counter, halted=halted,
                             timer=timer))
            end = time.process_time()
            process_s += middle - start
            release_s += end - middle
            if sample_steps and step >= horizon - sample_steps:
                last.append(end - middle)
            totals += 1
            releases += 1
        sizes.append(pending.size() + counter.size() + halted.size())
    return {"process_us": process_s / totals * 1e6, "release_us": release_s / releases * 1e6,
            "firings_per_s": releases / release_s, "bytes_per_key": float(np.mean(sizes)),
            "last_release_us": float(np.mean(last)) * 1e6 if last else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--long-horizon", type=int, default=8760)
    parser.add_argument("--mechanisms", default=",".join(NAMES))
    args = parser.parse_args()
    truncation(args)
    print(f"release per key ({args.keys} keys x {args.steps} steps, one step total per "
          f"key-step; targets <= 30 us per key-step release for the trees):")
    print(f"  {'mechanism':<20}{'process us/total':>17}{'release us/key-step':>21}"
          f"{'firings/s':>11}{'state B/key':>13}")
    for name in args.mechanisms.split(","):
        try:
            r = release(args, name, args.steps, args.keys)
        except Exception as error:  # a mechanism this horizon or budget does not fit
            print(f"  {name:<20}skipped ({type(error).__name__}: {error})")
            continue
        print(f"  {name:<20}{r['process_us']:17.1f}{r['release_us']:21.1f}"
              f"{r['firings_per_s']:11,.0f}{r['bytes_per_key']:13,.0f}")
    horizon = args.long_horizon
    for name in ("sqrt_toeplitz", "binary_tree"):
        try:
            r = release(args, name, horizon, 1, sample_steps=100)
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
