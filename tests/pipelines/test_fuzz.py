"""Fuzzing the job runner: malformed records mixed into every bundled config's demo data, in
two of the three input formats per config (rotating, so every format meets four configs and
every config two formats). Every bad record becomes exactly one dead letter, the job exits 0
without a traceback, and the released records equal those of the good-only run (same insecure
seed). Seeded: the same 10,684 bad records every run (6 configs x 2 formats x 850 row-level
corruptions, plus 60 JSONL-line or CSV-line corruptions or 1 unreadable Parquet file per
format run)."""
from __future__ import annotations

import csv
import glob
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipelines import config as job_config
from pipelines import run as job_run
from transforms import registry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(n for n in os.listdir(os.path.join(ROOT, "configs")) if n.endswith(".yaml"))
ROW_LEVEL = 850
FORMAT_PAIRS = [("jsonl", "csv"), ("csv", "parquet"), ("parquet", "jsonl")]
LINE_LEVEL = 60

# Corruptions that stay invalid as text (CSV and Parquet cells are strings here).
BAD_TEXT = {
    "timestamp": ["", "nan", "yesterday", "2026-01-05T03:00:00", "1e308", "2026-13-45T00:00:00Z",
                  "99999-01-01T00:00:00Z", "2031-01-01T00:00:00Z"],  # the last: after horizon
    "id": [""],
    "op": ["x", "", "++", "insert"],
    "value": ["1_000", "nan", "inf", "abc", "", "0x10", " 1", "1,5"],
}
# JSON can also carry values of the wrong type.
BAD_JSON = {"timestamp": [None, True, [], {"t": 1}, 2 ** 70, float("nan")],
            "id": [None, True, 1.5, [1], {"a": 1}, False],
            "op": [None, 1, True, ["+"]],
            "value": [None, True, [1], {"v": 2}, float("nan")]}
BAD_LINES_JSON = [b"\xff\xfe{\"ts\": 1}", b"[" * 5000 + b"]" * 5000, b"   ", b"{", b"[1, 2]",
                  b"null", b"{\"ts\": \"2026-01-05T01:00:00Z\"", b"\"text\"", b"\x00", b"{}}"]
BAD_LINES_CSV = [b"\xff,\xfe,x", b"   ", b"only-one-column", b"\x00,\x00", b"a,b,c,d,e,f,g"]


def kind_of(transform, role):
    if role == "timestamp":
        return "timestamp"
    if role == "op":
        return "op"
    return "value" if role in registry.SPECS[transform].numeric else "id"


def good_rows(job):
    """The demo rows with every mapped cell as text (identical in all three formats)."""
    rows = [json.loads(line) for line in open(job.input.path)]
    columns = list(job.input.fields.values())
    return [{c: str(row[c]) for c in columns} for row in rows], columns


def bad_rows(rng, job, rows, with_json_types):
    """Each a good row with one mapped cell made invalid (or a self-loop for edges)."""
    fields = job.input.fields
    out = []
    for _ in range(ROW_LEVEL):
        row = dict(rows[int(rng.integers(len(rows)))])
        role = list(fields)[int(rng.integers(len(fields)))]
        kind = kind_of(job.transform, role)
        choices = list(BAD_TEXT[kind]) + (BAD_JSON[kind] if with_json_types else [])
        if kind == "value" and job.transform == "release":
            choices += ["2.5", "1e308"]  # not an integer; beyond 2^53
        if kind == "id" and job.transform in ("degree_count", "triangle_count") and \
                rng.random() < 0.3:
            row[fields["b"]] = row[fields["a"]]  # self-loop
        else:
            row[fields[role]] = choices[int(rng.integers(len(choices)))]
        out.append(row)
    return out


def write_input(folder, fmt, rows, columns, bad_lines=()):
    os.makedirs(folder, exist_ok=True)
    if fmt == "jsonl":
        with open(os.path.join(folder, "input.jsonl"), "wb") as handle:
            for row in rows:
                handle.write(json.dumps(row).encode("utf-8") + b"\n")
            for line in bad_lines:
                handle.write(line + b"\n")
        return os.path.join(folder, "input.jsonl")
    if fmt == "csv":
        with open(os.path.join(folder, "input.csv"), "w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out)
            writer.writerow(columns)
            writer.writerows([[row.get(c, "") for c in columns] for row in rows])
        with open(os.path.join(folder, "input.csv"), "ab") as handle:
            for line in bad_lines:
                handle.write(line + b"\n")
        return os.path.join(folder, "input.csv")
    table = pa.table({c: pa.array([row.get(c) for row in rows], pa.string()) for c in columns})
    pq.write_table(table, os.path.join(folder, "part-0.parquet"))
    if bad_lines:
        with open(os.path.join(folder, "part-1.parquet"), "wb") as handle:
            handle.write(b"PAR1 this is not a parquet file PAR1")
    return os.path.join(folder, "*.parquet")


def run_job(tmp_path, name, config_name, fmt, path):
    config = yaml.safe_load(open(os.path.join(ROOT, "configs", config_name)))
    config["input"]["path"], config["input"]["format"] = path, fmt
    config["output"] = {"path": str(tmp_path / name), "formats": ["jsonl"]}
    config["secret"] = {"seed": 7, "insecure": True}
    config_path = tmp_path / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    assert job_run.main(["--config", str(config_path)]) == 0
    job = job_config.load(str(config_path))
    records = sorted((json.loads(line) for f in glob.glob(os.path.join(
        job.public_path, "records-*.jsonl")) for line in open(f)),
        key=lambda r: (r["key"], r["step"]))
    dead = [json.loads(line) for f in glob.glob(os.path.join(job.operator_path,
                                                               "dead_letters-*"))
            for line in open(f)]
    return records, dead


@pytest.mark.parametrize("config_name", CONFIGS)
def test_malformed_records_become_one_dead_letter_each(tmp_path, config_name, capfd):
    job = job_config.load(os.path.join(ROOT, "configs", config_name))
    rows, columns = good_rows(job)
    rng = np.random.default_rng(sum(map(ord, config_name)))
    good_path = write_input(str(tmp_path / "good"), "jsonl", rows, columns)
    expected, good_dead = run_job(tmp_path, "good-out", config_name, "jsonl", good_path)
    assert expected and all(r["private"] is False for r in expected)
    total = 0
    formats = FORMAT_PAIRS[CONFIGS.index(config_name) % len(FORMAT_PAIRS)]
    for fmt in formats:
        bad = bad_rows(rng, job, rows, with_json_types=fmt == "jsonl")
        lines = {"jsonl": BAD_LINES_JSON, "csv": BAD_LINES_CSV, "parquet": ()}[fmt]
        line_bad = [lines[i % len(lines)] for i in range(LINE_LEVEL)] if lines else []
        mixed = rows + bad
        order = rng.permutation(len(mixed))
        path = write_input(str(tmp_path / fmt), fmt, [mixed[i] for i in order], columns,
                           line_bad or [b"garbage file"])
        records, dead = run_job(tmp_path, f"{fmt}-out", config_name, fmt, path)
        n_bad = len(bad) + (len(line_bad) if line_bad else 1)
        total += n_bad
        assert records == expected, fmt
        assert len(dead) - len(good_dead) == n_bad, (fmt, [d["reason"] for d in dead][:5])
        assert all(len(d["record"]) <= 1024 and d["reason"] for d in dead)
    assert "Traceback" not in capfd.readouterr().err
    assert total == 2 * ROW_LEVEL + sum(LINE_LEVEL if f != "parquet" else 1 for f in formats)
