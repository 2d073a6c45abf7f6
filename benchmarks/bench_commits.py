"""This checkout against another commit, case by case, interleaved (not run in CI).

    python3 benchmarks/bench_commits.py --base a09ed38 [--repeats 5]
                                        [--cases plan,batch_release,stream_release]

The base commit is checked out once into a git worktree (`/tmp/bench-<commit>`). Each repeat
runs every case once in each tree, alternating which goes first, each in a fresh Python process
(CPU time of the measured calls only, `time.process_time`). Prints per case the min and median
over the repeats for both trees and the candidate / base ratio of each: a redesign that keeps
the hot paths keeps the ratios near 1 (the machine's drift hits both trees alike).

Cases (what the release redesign touched):
- plan: constructing a release (ContinualCount with public keys, ContinualMean), us per release;
- batch_release: the bounded release DoFn (`bounded._ReleaseKeysFn.process`) called directly
  for 200 public keys x 100 steps of data, us per key-step;
- stream_release: the streaming release DoFn (`bench_streaming.release`: a step total and the
  release timer per key and step, fake Beam state with the DoFn's own coders), 50 keys x 100
  steps, binary tree, us per key-step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_COMMON = """
import json, sys, time, types, logging
logging.disable(logging.WARNING)
import numpy as np
from transforms import ContinualCount, ContinualMean, TimeSteps
STEPS = TimeSteps(1_700_000_000.0, 3600.0, 100)
"""

CASES = {
    "plan": _COMMON + """
keys = [f"k{i}" for i in range(100)]
start = time.process_time()
for _ in range(20):
    ContinualCount(steps=STEPS, public_keys=keys, epsilon=1.0, max_contributions=3, seed=1,
                   insecure=True)
    ContinualMean(steps=STEPS, public_keys=keys, epsilon=1.0, max_value=10.0, seed=1,
                  insecure=True)
print(json.dumps((time.process_time() - start) / 40 * 1e6))
""",
    "batch_release": _COMMON + """
from transforms.bounded import _ReleaseKeysFn
from transforms.messages import StepWindow
keys = [f"k{i}" for i in range(200)]
transform = ContinualCount(steps=STEPS, public_keys=keys, epsilon=1.0, seed=1, insecure=True,
                           mechanism="binary_tree")
rng = np.random.default_rng(3)
totals = {key: {s: float(v) for s, v in enumerate(rng.poisson(3, 100)) if v}
          for key in keys}
fn = _ReleaseKeysFn(transform.config, StepWindow.whole(STEPS))
fn.setup()
start = time.process_time()
for key in keys:
    for _ in fn.process((key, {"totals": [(totals[key], ())], "state": [], "seed": [None]})):
        pass
print(json.dumps((time.process_time() - start) / (len(keys) * 100) * 1e6))
""",
    "stream_release": _COMMON + """
sys.path.insert(0, "benchmarks")
from bench_streaming import release
found = release(types.SimpleNamespace(repeat=1), "binary_tree", 100, 50, warm=False)
print(json.dumps(found["release_us"]))
""",
}


def worktree(commit: str) -> str:
    resolved = subprocess.run(["git", "rev-parse", "--short", commit], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
    path = f"/tmp/bench-{resolved}"
    if not os.path.isdir(path):
        subprocess.run(["git", "worktree", "add", "--detach", path, resolved], cwd=ROOT,
                       check=True, capture_output=True)
    return path


def measure(tree: str, case: str) -> float:
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, "-c", CASES[case]], cwd=tree, env=env, check=True,
                         capture_output=True, text=True).stdout
    return float(json.loads(out.strip().splitlines()[-1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare with")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"`--cases` must name cases of {', '.join(CASES)}; got {unknown[0]}.")
    trees = {"base": worktree(args.base), "candidate": ROOT}
    times = {case: {"base": [], "candidate": []} for case in cases}
    for repeat in range(args.repeats):
        order = ("base", "candidate") if repeat % 2 == 0 else ("candidate", "base")
        for case in cases:
            for name in order:
                times[case][name].append(measure(trees[name], case))
    print(f"base {args.base} ({trees['base']}) vs this checkout, {args.repeats} repeats, "
          f"CPU us (min / median)")
    for case in cases:
        base, cand = times[case]["base"], times[case]["candidate"]
        print(f"{case:15s} base {min(base):9.1f} / {statistics.median(base):9.1f}   "
              f"candidate {min(cand):9.1f} / {statistics.median(cand):9.1f}   ratio "
              f"{min(cand) / min(base):.3f} / "
              f"{statistics.median(cand) / statistics.median(base):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
