"""Generate the demo event files (fixed seed: the bundled files are its default output).

    python3 -m pipelines.demo_data.generate [--out FOLDER] [--seed S] [--check]

- active_users.jsonl: page views {"ts", "user", "region", "seconds"} over 48 hours,
  2,000 users, 6 regions;
- carts.jsonl: cart updates {"ts", "op", "item", "store"} (items added and removed);
- graph.jsonl: friendship edge updates {"ts", "op", "a", "b"} on 60 people;
- signups.jsonl: already-differenced {"ts", "region", "delta"} for ContinualRelease;
- page_views.jsonl: page views {"ts", "user", "page"} over 48 hours, 6,000 users, pages from
  an open set (a few popular, a long tail nobody lists in advance: key selection).
Timestamps are ISO-8601 UTC, starting 2026-01-05T00:00:00Z.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import numpy as np

ORIGIN = datetime.datetime(2026, 1, 5, tzinfo=datetime.timezone.utc)
HOURS = 48
REGIONS = ["eu-west", "eu-north", "us-east", "us-west", "apac", "latam"]
STORES = ["berlin", "lisbon", "oslo", "toronto"]
HERE = os.path.dirname(os.path.abspath(__file__))


def iso(seconds: float) -> str:
    return (ORIGIN + datetime.timedelta(seconds=float(seconds))).isoformat().replace(
        "+00:00", "Z")


def active_users(rng):
    rows = []
    home = rng.integers(0, len(REGIONS), 2000)
    activity = rng.gamma(0.6, 1.0, 2000)
    for hour in range(HOURS):
        daily = 0.4 + 0.6 * np.sin(np.pi * ((hour % 24) - 6) / 24) ** 2
        for user in np.nonzero(rng.random(2000) < 0.05 * daily * activity)[0]:
            for _ in range(int(rng.integers(1, 4))):
                region = home[user] if rng.random() < 0.95 else rng.integers(len(REGIONS))
                rows.append({"ts": iso(hour * 3600 + rng.uniform(0, 3600)),
                             "user": f"user-{user:04d}", "region": REGIONS[region],
                             "seconds": round(float(rng.uniform(1, 300)), 1)})
    return rows


def carts(rng):
    rows, present = [], {}
    for hour in range(HOURS):
        for _ in range(int(rng.integers(20, 60))):
            item = f"sku-{int(rng.integers(0, 400)):03d}"
            store = STORES[int(rng.integers(len(STORES)))]
            op = "-" if present.get((item, store), 0) > 0 and rng.random() < 0.4 else "+"
            present[(item, store)] = present.get((item, store), 0) + (1 if op == "+" else -1)
            rows.append({"ts": iso(hour * 3600 + rng.uniform(0, 3600)), "op": op, "item": item,
                         "store": store})
    return rows


def graph(rng):
    rows, edges = [], set()
    for hour in range(HOURS):
        for _ in range(int(rng.integers(1, 6))):
            a, b = sorted(int(v) for v in rng.choice(60, 2, replace=False))
            op = "-" if (a, b) in edges and rng.random() < 0.3 else "+"
            if op == "+":
                edges.add((a, b))
            else:
                edges.discard((a, b))
            rows.append({"ts": iso(hour * 3600 + rng.uniform(0, 3600)), "op": op,
                         "a": f"p{a:02d}", "b": f"p{b:02d}"})
    return rows


def signups(rng):
    """Already-differenced data for ContinualRelease: net sign-ups per region and hour, where
    one person changes one region's series by at most +-1 in total (declared S_{1,1})."""
    rows = []
    for hour in range(HOURS):
        for region in REGIONS[:3]:
            delta = int(rng.integers(-1, 4))
            if delta:
                rows.append({"ts": iso(hour * 3600 + 1800), "region": region, "delta": delta})
    return rows


def page_views(rng):
    rows = []
    popular = 1.0 / np.arange(1, 26) ** 1.1  # 25 popular pages (Zipf), then a long tail
    popular /= popular.sum()
    for hour in range(HOURS):
        for user in np.nonzero(rng.random(6000) < 0.03)[0]:
            if rng.random() < 0.7:
                page = int(rng.choice(25, p=popular))
            else:
                page = int(rng.integers(25, 5000))
            rows.append({"ts": iso(hour * 3600 + rng.uniform(0, 3600)),
                         "user": f"user-{user:04d}", "page": f"/articles/{page:04d}"})
    return rows


GENERATORS = {"active_users": active_users, "carts": carts, "graph": graph,
              "signups": signups, "page_views": page_views}
SEED = 20260105


def generate(seed: int = SEED) -> dict:
    """name -> the JSON lines text of that demo file (sorted by time)."""
    rng = np.random.default_rng(seed)
    files = {}
    for name, make in GENERATORS.items():  # one generator, in this order: files are stable
        rows = sorted(make(rng), key=lambda r: r["ts"])
        files[name] = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
    return files


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.demo_data.generate",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=HERE,
                        help="folder to write the .jsonl files into (default: the bundled "
                             "demo_data folder of the package)")
    parser.add_argument("--seed", type=int, default=SEED,
                        help=f"random seed (default {SEED}: the bundled files)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the files in --out differ from what "
                             "the seed generates")
    args = parser.parse_args(argv)
    files = generate(args.seed)
    stale = []
    for name, text in files.items():
        path = os.path.join(args.out, f"{name}.jsonl")
        if args.check:
            try:
                with open(path, encoding="utf-8") as handle:
                    same = handle.read() == text
            except FileNotFoundError:
                same = False
            if not same:
                stale.append(path)
            continue
        os.makedirs(args.out, exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        print(f"{path}: {text.count(chr(10))} events")
    if args.check:
        print("up to date" if not stale else "differ from the generator: " + ", ".join(stale))
        return 1 if stale else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
