"""CPU cost of the unbounded path's DoFns, in isolation and end to end (not run in CI).

    python3 benchmarks/bench_streaming.py [--units 20000] [--events 100000] [--keys 200]
                                          [--steps 100] [--long-horizon 8760] [--long-keys 20]
                                          [--long-mechanisms binary_tree,smooth_binary]
                                          [--mechanisms a,b] [--interleaved binary_tree,...]
                                          [--repeat 3] [--only isolated,end_to_end]
                                          [--e2e-events 2000] [--e2e-keys 20] [--e2e-steps 20]

CPU time of this process (time.process_time), the best of `--repeat` passes, each pass
alternating with a floor measured the same way, so the ratios hold on a shared machine whose
speed drifts (1.7x between two sessions on the same machine). In isolation, the DoFn methods
of `transforms.streaming` are called directly with fake state and timer objects, made from the
DoFn's own state specs, that encode on write and decode on read with the DoFn's own coders
(as Beam's state does, so the coding cost is counted and the bytes are real); the fakes'
bookkeeping (finding a key's cells, clearing a fired timer) is outside the timed calls. The
runner's own cost per element and per timer firing comes on top: the end-to-end part measures
it on the local streaming runner.

Prints
- end to end: a TestStream through `ContinualCount` (binary tree) on the local streaming runner,
  against a floor pipeline on the same stream (buffer per bucket of units, release per key with a
  looping timer; no caps, no exact sums);
- truncation (`stream_truncation.TruncateStreamingFn`, per bucket of units): us per event of
  `process` (buffering) and of the step-end
  `flush` timer (the unit's machine, per event and per firing), against `FloorBufferFn`;
- release (`ReleaseStreamingFn`) for every mechanism: us per step total in `process`, us per
  key-step release (the `release` timer, i.e. timer firings per second of DoFn CPU), the same
  keys again on fresh state ("warm": without the first derivation of the noise blocks a key's
  steps read, 1024 nodes per block and tree level), the floor (`FloorReleaseFn`) and the bytes
  of Beam state per key (the sealed mechanism state, pending sums, halted); with
  `--interleaved`, those mechanisms again with all keys stepping together (as at a step end on
  a worker: the keys then share the mechanism's bounded noise-block cache);
- at `--long-horizon` steps: the square root mechanism for one key (its per-key state grows
  with t, and what that means for 1e5 keys), and `--long-mechanisms` with `--long-keys` keys
  stepping together through every step (the tree is deeper, and every block is derived once).
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
from apache_beam.transforms.timeutil import TimeDomain  # noqa: E402
from apache_beam.transforms.userstate import (BagStateSpec,  # noqa: E402
                                              ReadModifyWriteStateSpec, TimerSpec, on_timer)
from apache_beam.transforms.window import TimestampedValue  # noqa: E402
from apache_beam.utils.timestamp import Timestamp  # noqa: E402

from tests.support.fake_state import Bag, Value  # noqa: E402
from transforms import ContinualCount, SecretRef, TimeSteps  # noqa: E402
from transforms.mechanisms import NAMES  # noqa: E402
from transforms.messages import StepTotal  # noqa: E402
from transforms.stream_truncation import TruncateStreamingFn  # noqa: E402
from transforms.streaming import ReleaseStreamingFn  # noqa: E402
from transforms.streams.columns import bucket_of  # noqa: E402

ORIGIN = 1_700_000_000.0
HOUR = 3600.0


class FakeValue(Value):
    """ReadModifyWrite state: stored encoded, decoded on every read (Beam without a cache)."""

    def size(self):
        return 0 if self.data is None else len(self.data)


class FakeBag(Bag):
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


class FloorBufferFn(beam.DoFn):
    """The floor of streaming truncation, measured in the same run: buffer each event in a
    pickled bag and set the step-end timer (process), then read the bag and emit each event
    keyed by (key, step) with its step's timestamp (flush). No caps, no progress, no machine:
    what any buffer-until-the-step-ends DoFn pays on these fakes."""

    BUFFER = BagStateSpec("buffer", beam.coders.PickleCoder())
    STEP_END = TimerSpec("step_end", TimeDomain.WATERMARK)

    def __init__(self, steps):
        self.steps = steps

    def process(self, element, buffer=beam.DoFn.StateParam(BUFFER),
                timer=beam.DoFn.TimerParam(STEP_END)):
        buffer.add(element[1][1])  # (bucket, (unit, event)): the event
        timer.set(Timestamp.of(self.steps.end(element[1][1][0])))

    @on_timer(STEP_END)
    def flush(self, key=beam.DoFn.KeyParam, fire=beam.DoFn.TimestampParam,
              buffer=beam.DoFn.StateParam(BUFFER)):
        for step, _, (unit_key, value) in buffer.read():
            yield TimestampedValue(((unit_key, step), value), fire)
        buffer.clear()


class FloorReleaseFn(beam.DoFn):
    """The floor of a streaming release, measured in the same run: a per-key running sum in
    one pickled cell (process adds a step total), and a timer that advances it, adds one
    Laplace draw from a cached numpy block and emits a record dict (key, step, value)."""

    SUM = ReadModifyWriteStateSpec("sum", beam.coders.PickleCoder())
    RELEASE = TimerSpec("release", TimeDomain.WATERMARK)

    def __init__(self, steps):
        self.steps = steps
        self.noise = np.random.default_rng(3).laplace(size=1024).tolist()
        self.ends = [Timestamp.of(steps.end(s)).micros for s in range(steps.horizon)]

    def process(self, element, total=beam.DoFn.StateParam(SUM),
                timer=beam.DoFn.TimerParam(RELEASE)):
        key, message = element
        step, running, pending = total.read() or (0, 0.0, 0.0)
        if message is None:  # the seed
            timer.set(Timestamp.of(self.steps.end(0)))
        else:
            pending += message.value
        total.write((step, running, pending))

    @on_timer(RELEASE)
    def release(self, key=beam.DoFn.KeyParam, fire=beam.DoFn.TimestampParam,
                total=beam.DoFn.StateParam(SUM), timer=beam.DoFn.TimerParam(RELEASE)):
        step, running, pending = total.read()
        if self.ends[step] > fire.micros:  # not due (the release's check: cached micros)
            return
        running += pending
        total.write((step + 1, running, 0.0))
        if step + 1 < self.steps.horizon:
            timer.set(Timestamp.of(self.steps.end(step + 1)))
        yield TimestampedValue({"key": key, "step": step,
                                "value": running + self.noise[step % 1024]},
                               Timestamp.of(self.steps.end(step)))


def truncation_events(args, steps):
    rng = np.random.default_rng(1)
    unit_ids = rng.integers(0, args.units, args.events).tolist()
    key_ids = rng.integers(0, args.keys, args.events).tolist()
    micros = np.sort(rng.integers(int(ORIGIN * 1e6), int(steps.stop * 1e6),
                                  args.events)).tolist()
    return [(bucket_of(u), (u, (int((m / 1e6 - ORIGIN) // HOUR), m, (k, 1.0))))
            for u, k, m in zip(unit_ids, key_ids, micros)]


def truncation_pass(fn, steps, events):
    """One pass over `events`, (bucket, (unit, event)), on fresh state: (process s, flush s,
    firings, outputs, state bytes per bucket)."""
    states = {}

    def state_of(bucket):
        found = states.get(bucket)
        if found is None:
            cells = Cells()
            found = states[bucket] = (cells, cells.bind(fn.process),
                                      cells.bind(fn.flush, key=bucket))
        return found

    for bucket, _ in events:  # cells made and seeded outside the timed loops
        cells, process, _ = state_of(bucket)
        if isinstance(fn, TruncateStreamingFn) and not cells.cells:
            drain(fn.process((bucket, None), **process))
    process_s = flush_s = 0.0
    firings = outputs = 0
    # event time order, step by step: buffer a step's events, then fire the step-end timers
    by_step = {}
    for bucket, pair in events:
        by_step.setdefault(pair[1][0], []).append((bucket, pair))
    for step in range(steps.horizon):
        # the fakes' bookkeeping (finding a unit's cells, clearing its fired timer) is done
        # outside the timed loops: only the DoFn's calls are timed
        batch = [(element, state_of(element[0])[1]) for element in by_step.get(step, [])]
        start = time.process_time()
        for element, kwargs in batch:
            drain(fn.process(element, **kwargs))
        process_s += time.process_time() - start
        fire = Timestamp(micros=int(round(steps.end(step) * 1e6)))
        due = list(states.values())  # every bucket's timer visits every step end
        for cells, _, _ in due:
            cells.clear_timers()
        start = time.process_time()
        for _, _, flush in due:
            outputs += drain(fn.flush(fire=fire, **flush))
        flush_s += time.process_time() - start
        firings += len(due)
    bucket_bytes = float(np.mean([cells.size() for cells, _, _ in states.values()]))
    return process_s, flush_s, firings, outputs, bucket_bytes


def truncation(args):
    steps = TimeSteps(ORIGIN, HOUR, args.steps)
    transform = count_transform(steps, list(range(args.keys)), "binary_tree")
    fn = TruncateStreamingFn(transform.problem, steps, False)
    fn.setup()
    floor = FloorBufferFn(steps)
    events = truncation_events(args, steps)
    best = floor_best = None
    for _ in range(args.repeat):  # alternating, so both see the same machine
        found = truncation_pass(fn, steps, events)
        best = found if best is None else [min(a, b) for a, b in zip(best, found)]
        found = truncation_pass(floor, steps, events)
        floor_best = found if floor_best is None else [min(a, b)
                                                        for a, b in zip(floor_best, found)]
    process_s, flush_s, firings, outputs, bucket_bytes = best
    n = len(events)
    total = (process_s + flush_s) / n * 1e6
    floor_total = (floor_best[0] + floor_best[1]) / n * 1e6
    print(f"truncation (count, caps 2 keys x 2): {n} events, {len({p[0] for _, p in events})} "
          f"units in {len({b for b, _ in events})} buckets, {args.steps} steps; "
          f"best of {args.repeat} passes")
    print(f"  process (buffer an event)      {process_s / n * 1e6:7.1f} us/event "
          f"(floor {floor_best[0] / n * 1e6:.1f})")
    print(f"  step-end flush (the machine)   {flush_s / n * 1e6:7.1f} us/event, "
          f"{flush_s / firings * 1e6:7.1f} us/firing ({firings} firings, "
          f"{firings / flush_s:,.0f} firings/s of DoFn CPU; floor "
          f"{floor_best[1] / n * 1e6:.1f} us/event)")
    print(f"  total                          {total:7.1f} us/event = {total / floor_total:.2f}x "
          f"the floor ({floor_total:.1f} us/event: buffer, emit, no truncation); {outputs} "
          f"outputs; state {bucket_bytes:.0f} bytes per bucket after the horizon")


def release_pass(fn, keys, order, values, message):
    """Seed `keys` on fresh state, then for each (key, step) of `order` one step total and the
    release timer: (process s, release s, the release s of each call, state bytes per key)."""
    process_s = release_s = 0.0
    each = []
    cells = [Cells() for _ in range(keys)]
    bound = [(key, cells[key].bind(fn.process), cells[key].bind(fn.release, key=key))
             for key in range(keys)]
    for key, process, _ in bound:
        drain(fn.process((key, message(None)), **process))
    for key, step in order:
        _, process, fire = bound[key]
        element = (key, message(StepTotal(step, values[key][step])))
        start = time.process_time()
        drain(fn.process(element, **process))
        middle = time.process_time()
        drain(fn.release(**fire, fire=fire["timer"].time))
        end = time.process_time()
        process_s += middle - start
        release_s += end - middle
        each.append(end - middle)
    return process_s, release_s, each, float(np.mean([c.size() for c in cells]))


def release(args, mechanism, horizon, keys, sample_steps=None, interleaved=False,
            warm=True):
    """Per key: the seed, one StepTotal per (key, step) and the release timer at every step;
    best of `args.repeat` passes, each on a fresh DoFn (fresh noise caches), alternating with
    the floor (`FloorReleaseFn`).

    Keys one after the other (each through every step), then the same keys again on fresh
    state ("warm": the same work without the first derivation of the noise blocks a key's
    steps read, which a key pays once per block of 1024 nodes per tree level). With
    `interleaved`, all keys step together instead, as when the watermark passes a step end:
    a worker's keys then share the mechanism's bounded noise-block cache."""
    from transforms.messages import Seed
    steps = TimeSteps(ORIGIN, HOUR, horizon)
    transform = count_transform(steps, list(range(keys)), mechanism)
    rng = np.random.default_rng(2)
    values = [rng.poisson(3, horizon).astype(float).tolist() for _ in range(keys)]
    if interleaved:
        order = [(key, step) for step in range(horizon) for key in range(keys)]
    else:
        order = [(key, step) for key in range(keys) for step in range(horizon)]
    best = {}
    for _ in range(args.repeat):
        fn = ReleaseStreamingFn(transform.config, transform.public_keys)
        fn.setup()
        noise_name = fn.maker.mechanism.noise_name
        process_s, release_s, each, size = release_pass(
            fn, keys, order, values, lambda m: Seed() if m is None else m)
        found = {"process": process_s, "release": release_s, "size": size,
                 "last": float(np.mean(each[-sample_steps:])) if sample_steps else None}
        if warm and not interleaved:
            found["warm"] = release_pass(fn, keys, order, values,
                                         lambda m: Seed() if m is None else m)[1]
        floor = FloorReleaseFn(steps)
        found["floor"] = release_pass(floor, keys, order, values, lambda m: m)[1]
        best = found if not best else {
            name: None if value is None else min(value, best[name])
            for name, value in found.items()}
    releases = keys * horizon
    return {"process_us": best["process"] / releases * 1e6,
            "release_us": best["release"] / releases * 1e6,
            "warm_us": best["warm"] / releases * 1e6 if "warm" in best else None,
            "floor_us": best["floor"] / releases * 1e6,
            "firings_per_s": releases / best["release"], "bytes_per_key": best["size"],
            "noise": noise_name,
            "last_release_us": best["last"] * 1e6 if best["last"] is not None else None}


class Tally(beam.DoFn):
    """The end-to-end sink: counts what reaches it (in-process runner: one class counter)."""

    seen = 0

    def process(self, element):
        Tally.seen += 1


class _FloorEvent(beam.DoFn):
    """(unit, key) at time ts -> (bucket, (unit, (step, micros, (key, 1.0)))), as AssignSteps
    and the truncation's `ByBucket` key it."""

    def __init__(self, steps):
        self.steps = steps

    def process(self, element, timestamp=beam.DoFn.TimestampParam):
        step = self.steps.step_of(float(timestamp))
        yield bucket_of(element[0]), (element[0], (step, timestamp.micros, (element[1], 1.0)))


def end_to_end(args):
    """The whole streaming job on the local streaming runner (TestStream: Beam's
    BundleBasedDirectRunner, BEAM_NOTES.md), against a floor pipeline on the same stream in
    the same run: FloorBufferFn per bucket of units, then FloorReleaseFn per key with a looping
    timer (no caps, no exact sums, no public-key filter, no dead letters). CPU seconds of this
    process (the runner runs in it), best of `args.repeat`."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.testing.test_stream import TestStream
    from transforms.messages import StepTotal as Total
    steps = TimeSteps(ORIGIN, HOUR, args.e2e_steps)
    keys = list(range(args.e2e_keys))
    rng = np.random.default_rng(4)
    n = args.e2e_events
    units = rng.integers(0, max(1, n // 4), n).tolist()
    event_keys = rng.integers(0, len(keys), n).tolist()
    seconds = np.sort(rng.uniform(ORIGIN, steps.stop - 1.0, n)).tolist()
    by_step = {}
    for unit, key, ts in zip(units, event_keys, seconds):
        by_step.setdefault(steps.step_of(ts), []).append(
            TimestampedValue((f"u{unit}", key), ts))

    def stream():
        test_stream = TestStream()
        for step in range(steps.horizon):
            if by_step.get(step):
                test_stream = test_stream.add_elements(by_step[step])
            test_stream = test_stream.advance_watermark_to(steps.end(step))
        return test_stream.advance_watermark_to(steps.end(steps.horizon + 2)) \
            .advance_watermark_to_infinity()

    def project(pipeline):
        result = pipeline | stream() | count_transform(steps, keys, "binary_tree")
        result.records | "Records" >> beam.ParDo(Tally())
        result.dead_letters | "Dead" >> beam.ParDo(Tally())

    def floor(pipeline):
        totals = (pipeline | stream() | "Step" >> beam.ParDo(_FloorEvent(steps))
                  | "Buffer" >> beam.ParDo(FloorBufferFn(steps))
                  | "ByKey" >> beam.Map(lambda kv: (kv[0][0], Total(kv[0][1], kv[1]))))
        seeds = (pipeline | "Keys" >> beam.Create(keys)
                 | "Seed" >> beam.Map(lambda key: TimestampedValue((key, None), ORIGIN)))
        ((totals, seeds) | beam.Flatten() | "Release" >> beam.ParDo(FloorReleaseFn(steps))
         | "Records" >> beam.ParDo(Tally()))

    def timed(build):
        options = PipelineOptions()
        options.view_as(StandardOptions).streaming = True
        Tally.seen = 0
        start = time.process_time()
        with beam.Pipeline(options=options) as pipeline:
            build(pipeline)
        return time.process_time() - start, Tally.seen

    best = {}
    for _ in range(args.repeat):
        for name, build in (("project", project), ("floor", floor)):
            seconds_used, seen = timed(build)
            if name not in best or seconds_used < best[name][0]:
                best[name] = (seconds_used, seen)
    key_steps = len(keys) * steps.horizon
    ours, floor_s = best["project"][0], best["floor"][0]
    print(f"end to end on the local streaming runner (TestStream, {n} events, {len(keys)} keys "
          f"x {steps.horizon} steps, binary_tree; best of {args.repeat}):")
    print(f"  ContinualCount  {ours:6.2f} s ({best['project'][1]} records and dead letters): "
          f"{ours / n * 1e6:,.0f} us per event or {ours / key_steps * 1e6:,.0f} us per "
          f"key-step, all in")
    print(f"  floor           {floor_s:6.2f} s ({best['floor'][1]} records): ratio "
          f"{ours / floor_s:.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--long-horizon", type=int, default=8760)
    parser.add_argument("--long-keys", type=int, default=20,
                        help="keys stepping together through the long horizon (0: skip)")
    parser.add_argument("--long-mechanisms", default="binary_tree,smooth_binary")
    parser.add_argument("--mechanisms", default=",".join(NAMES))
    parser.add_argument("--repeat", type=int, default=3,
                        help="passes per measurement; the best (least CPU) is printed")
    parser.add_argument("--e2e-events", type=int, default=2000)
    parser.add_argument("--e2e-keys", type=int, default=20)
    parser.add_argument("--e2e-steps", type=int, default=20)
    parser.add_argument("--only", default="isolated,end_to_end",
                        help="which parts to run: isolated, end_to_end")
    parser.add_argument("--interleaved", default="",
                        help="mechanisms to release again with all keys stepping together")
    args = parser.parse_args()
    print(f"CPU seconds of this process, best of {args.repeat} passes; each measurement "
          f"alternates with its floor (a minimal DoFn doing the same state and timer calls) "
          f"so ratios hold on a noisy machine")
    parts = args.only.split(",")
    if "end_to_end" in parts:
        end_to_end(args)
    if "isolated" not in parts:
        return
    truncation(args)
    print(f"release per key ({args.keys} keys x {args.steps} steps, one step total per "
          f"key-step; targets <= 30 us per key-step release for the trees):")
    print(f"  {'mechanism':<20}{'process us/total':>17}{'release us/key-step':>21}"
          f"{'warm':>7}{'floor':>7}{'warm/floor':>11}{'firings/s':>11}{'state B/key':>13}")
    for name in args.mechanisms.split(","):
        try:
            r = release(args, name, args.steps, args.keys)
        except Exception as error:  # a mechanism this horizon or budget does not fit
            print(f"  {name:<20}skipped ({type(error).__name__}: {error})")
            continue
        print(f"  {name:<20}{r['process_us']:17.1f}{r['release_us']:21.1f}{r['warm_us']:7.1f}"
              f"{r['floor_us']:7.1f}{r['warm_us'] / r['floor_us']:10.2f}x"
              f"{r['firings_per_s']:11,.0f}{r['bytes_per_key']:13,.0f}")
    if args.interleaved:
        print(f"release per key with all {args.keys} keys stepping together (a worker's keys "
              f"at a step end; noise blocks: {args.keys} keys x the tree's levels against "
              f"the mechanism's block cache):")
        for name in args.interleaved.split(","):
            r = release(args, name, args.steps, args.keys, interleaved=True)
            print(f"  {name:<20}{r['process_us']:17.1f}{r['release_us']:21.1f}"
                  f"{'':7}{r['floor_us']:7.1f}")
    horizon = args.long_horizon
    try:
        r = release(args, "sqrt_toeplitz", horizon, 1, sample_steps=100, warm=False)
        total = r["bytes_per_key"] * 1e5
        print(f"sqrt_toeplitz ({r['noise']} noise) at T = {horizon}, one key through every "
              f"step: state "
              f"{r['bytes_per_key']:,.0f} bytes per key at the end (x 1e5 keys = "
              f"{total / 2 ** 30:.2f} GiB of Beam state), release {r['release_us']:.1f} "
              f"us/key-step on average, {r['last_release_us']:.1f} us in the last 100 steps")
    except Exception as error:  # over the state budget
        print(f"sqrt_toeplitz at T = {horizon}: skipped ({type(error).__name__}: {error})")
    for name in filter(None, args.long_mechanisms.split(",") if args.long_keys > 0 else []):
        r = release(args, name, horizon, args.long_keys, sample_steps=100 * args.long_keys,
                    interleaved=True)
        print(f"{name} ({r['noise']} noise) at T = {horizon}, {args.long_keys} keys stepping "
              f"together through "
              f"every step (cold: every noise block derived once): release "
              f"{r['release_us']:.1f} us/key-step on average (floor {r['floor_us']:.1f}), "
              f"{r['last_release_us']:.1f} us in the last 100 steps; state "
              f"{r['bytes_per_key']:,.0f} bytes per key")

if __name__ == "__main__":
    main()
