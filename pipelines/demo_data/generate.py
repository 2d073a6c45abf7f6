"""Generate the bundled demo event files (fixed seed; run from the repository root):

    python3 -m pipelines.demo_data.generate

- active_users.jsonl: page views {"ts", "user", "region", "seconds"} over 48 hours,
  2,000 users, 6 regions;
- carts.jsonl: cart updates {"ts", "op", "item", "store"} (items added and removed);
- graph.jsonl: friendship edge updates {"ts", "op", "a", "b"} on 60 people;
- signups.jsonl: already-differenced {"ts", "region", "delta"} for ContinualRelease.
Timestamps are ISO-8601 UTC, starting 2026-01-05T00:00:00Z.
"""
from __future__ import annotations

import datetime
import json
import os

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


def main():
    rng = np.random.default_rng(20260105)
    for name, rows in (("active_users", active_users(rng)), ("carts", carts(rng)),
                       ("graph", graph(rng)), ("signups", signups(rng))):
        rows.sort(key=lambda r: r["ts"])
        with open(os.path.join(HERE, f"{name}.jsonl"), "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, sort_keys=True) + "\n")
        print(f"{name}.jsonl: {len(rows)} events")


if __name__ == "__main__":
    main()
