"""Fuzzing the job runner: malformed records mixed into every bundled config's demo data, in
two of the three input formats per config (rotating, so every format meets four configs and
every config two formats). Every bad record becomes exactly one dead letter, the job exits 0
without a traceback, and the released records equal those of the good-only run (same insecure
seed). Seeded: the same 10,684 bad records every run (6 configs x 2 formats x 850 row-level
corruptions, plus 60 JSONL-line or CSV-line corruptions or 1 unreadable Parquet file per
format run).

Below, property-based fuzz of count, sum and count-distinct: hypothesis properties per record
(any JSON value, CSV text, Arrow column type or Python element in every role field), seeded
pipelines of over 10,000 bad records per entry point (JSON lines, CSV and Parquet jobs, elements
and `ArrowEvents` batches given to the transforms; `-m slow`: ten times more), and the issue's
reproducer (a JSON escape of a lone surrogate stopped every job)."""
from __future__ import annotations

import collections
import csv
import datetime
import decimal
import glob
import importlib.util
import io as _bytes_io
import itertools
import json
import math
import os
import random
import re
import typing

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines import arrow_batches
from pipelines import config as job_config
from pipelines import csv_input
from pipelines import io as job_io
from pipelines import run as job_run
from transforms import registry
from transforms.arrow_input import ArrowEvents, AssignBatchStepsFn, event_batch
from transforms.sinks import WriteRecordsToJsonLines
from transforms.assign import AssignStepsFn
from transforms.messages import KeyCoder, StepWindow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# every bundled config pipelines.run runs (active_users_unbounded, with no horizon, reads as
# active_users does and runs through pipelines.schedule: tests/pipelines/test_schedule.py)
CONFIGS = sorted(n for n in os.listdir(os.path.join(ROOT, "configs"))
                 if n.endswith(".yaml") and n != "active_users_unbounded.yaml")
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
    config["input"]["max_dead_letter_fraction"] = 1.0  # more bad rows than good (test_gate)
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


# =================================================================================================
# Property-based fuzz (hypothesis + seeded generators): arbitrary values in every role field of
# count, sum and count-distinct, through every entry point: JSON lines, CSV and Parquet jobs
# (`pipelines.run.build`: the job's own pipeline; Parquet rows take `TableToBatch`'s vectorised
# checks or, one by one, `ToElement`), timestamped elements given straight to the transforms,
# and Arrow batches (`ArrowEvents`). The properties: nothing raises; every bad record is exactly
# one dead letter with a reason, writable as JSON (never text that is not Unicode); the records of
# the good part equal those of a clean run of the good rows alone (same insecure seed: release id
# and noise come from seed + descriptor).
# =================================================================================================

ORIGIN = "2026-01-05T00:00:00Z"
ORIGIN_S = datetime.datetime(2026, 1, 5, tzinfo=datetime.timezone.utc).timestamp()
HORIZON = 12
STOP_S = ORIGIN_S + HORIZON * 3600
TRANSFORMS = ("count", "sum", "count_distinct")
FIELDS = {"count": {"timestamp": "ts", "unit": "user", "key": "region"},
          "sum": {"timestamp": "ts", "unit": "user", "key": "region", "value": "seconds"},
          "count_distinct": {"timestamp": "ts", "op": "op", "item": "item", "key": "region"}}
ROLES = {"count": ("unit", "key"), "sum": ("unit", "key", "value"),
         "count_distinct": ("op", "item", "key")}  # the element's fields, in order
BOUNDS = {"count": {"max_contributions": 3, "max_contributions_per_step": 2,
                    "max_keys_per_unit": 2},
          "sum": {"max_value": 10, "max_contributions": 20, "max_keys_per_unit": 2},
          "count_distinct": {"max_flips": 4, "max_keys_per_unit": 2}}
COLUMNS = ["row", "ts", "user", "region", "seconds", "op", "item", "note"]
KEYS = ["eu", "us", 'ap, "q"', "ü😀"]
UNITS = [f"u{i}" for i in range(40)] + [
    "ü-1", "😀", "a\nb", 'q"x', "x,y", "nul\x00z", " lead", "tab\tt", "cr\rx", "\u2028ls", "١٢٣",
    "7", "\ufeffbom", "\\ud800", "'"]
ITEMS = [f"i{i}" for i in range(25)] + ["ïtem", "it,em", 'i"q', "i\nj", "\r\n"]
VALUES = [k / 2 for k in range(-4, 30)]  # clamped to [0, max_value]; exact in float32
MARKER = re.compile(r"(good|bad)-(\d+)")
GOOD_ROWS, BAD_ROWS = 300, 3_400  # per transform: 3 x 3,400 = 10,200 bad records an entry point


def kind_of_role(role):
    return {"timestamp": "timestamp", "value": "value", "op": "op"}.get(role, "id")


def role_of_column(transform, column):
    return {c: r for r, c in FIELDS[transform].items()}.get(column)


def fuzz_config(transform, fmt="jsonl", path="unused", out="unused"):
    return {"job": f"fuzz-{transform.replace('_', '-')}", "transform": transform,
            "input": {"path": path, "format": fmt, "fields": FIELDS[transform],
                      # more bad rows than good: every one a dead letter (the gate: test_gate)
                      "max_dead_letter_fraction": 1.0},
            "steps": {"origin": ORIGIN, "size_seconds": 3600, "horizon": HORIZON},
            "privacy": {"rho": 0.5}, "bounds": BOUNDS[transform], "public_keys": KEYS,
            "secret": {"seed": 11, "insecure": True},
            "output": {"path": out, "formats": ["jsonl"]}}


JOBS = {t: job_config.validate(fuzz_config(t)) for t in TRANSFORMS}
PROBLEMS = {t: job_run.build_transform(JOBS[t]).problem for t in TRANSFORMS}
STEPS = JOBS["count"].steps.time_steps()
ANY_CODER = beam.coders.registry.get_coder(typing.Any)


def writable(value):
    """What a Beam stage may output: its coder encodes it (text that is not Unicode fails)."""
    ANY_CODER.encode(value)
    json.dumps(value, sort_keys=True, default=repr).encode("utf-8")
    return True


def is_unicode(value) -> bool:
    """The oracle for text: a JSON value whose every str encodes as UTF-8."""
    try:
        json.dumps(value, ensure_ascii=False, default=repr).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def iso(seconds, rng):
    """ISO-8601 text of `seconds` (whole milliseconds), in UTC (Z or +00:00) or at an offset."""
    minutes = rng.choice([0, 0, 60, -330, 345, -720])
    zone = datetime.timezone(datetime.timedelta(minutes=minutes))
    text = datetime.datetime.fromtimestamp(seconds, zone).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z") if rng.random() < 0.5 else text


def lone_surrogate_text(rng):
    """Text with a lone surrogate: a JSON escape like \\ud800 decodes to it (never a pair)."""
    return rng.choice(["", "u", "é", "😀 "]) + chr(rng.randrange(0xD800, 0xE000)) + \
        rng.choice(["", "x", "1"])


NOTE_PIECES = ['"', ",", "\n", "\r\n", "\r", "\x00", "ü", "😀", " ", "text", "\u2028", "''",
               "\\", "\t", '""', "\x85", "\ufeff"]


def note_text(rng):
    return "".join(rng.choice(NOTE_PIECES) for _ in range(rng.randrange(0, 9)))


class RawJSON(str):
    """JSON text written as it is (json.dumps cannot write it: over 4,300 digits, too deep)."""


# ----- seeded generators: the same adversarial shapes as the hypothesis strategies below ------
def good_row(rng, number):
    seconds = ORIGIN_S + 1 + rng.randrange((HORIZON * 3600 - 2) * 1000) / 1000
    row = {"row": f"good-{number}", "ts": iso(seconds, rng), "user": rng.choice(UNITS),
           "region": rng.choice(KEYS + ["asia"]), "seconds": rng.choice(VALUES),
           "op": rng.choice("+-"), "item": rng.choice(ITEMS), "note": note_text(rng)}
    if rng.random() < 0.3:  # JSON lines only: nested values in a field no role maps
        row["extra"] = {"a": [1, 2.5, None, True, "😀", {"b": [[]]}], "c": 10 ** 40}
    return row


def out_of_horizon(rng):
    return rng.choice([ORIGIN_S - rng.uniform(1, 1e7), STOP_S + rng.uniform(1, 1e7)])


def bad_json_value(rng, kind):
    common = [None, True, False, [], [1, "a"], {"a": 1}, {"": None}, lone_surrogate_text(rng),
              lone_surrogate_text(rng), RawJSON("9" * 4400), RawJSON("[" * 60 + "]" * 60),
              RawJSON("[" * 5000 + "]" * 5000)]
    more = {
        "id": [0.5, -0.0, math.nan, math.inf, 1e300, "", RawJSON("1" + "0" * 1000),
               RawJSON("-" + "7" * 1001)],
        "timestamp": ["", "yesterday", "2026-01-05T03:00:00", "2026-13-45T00:00:00Z",
                      "99999-01-01T00:00:00Z", iso(out_of_horizon(rng), rng), math.nan,
                      math.inf, -math.inf, RawJSON("1" + "0" * 400), 1e308, -1e20,
                      out_of_horizon(rng), int(out_of_horizon(rng)), rng.uniform(0, 1e9)],
        "value": ["", "abc", "1_000", " 1", "0x10", "1,5", "nan", "inf", "-inf", "1e999",
                  "NaN", math.nan, math.inf, -math.inf, RawJSON("1" + "0" * 400), "½", "٣",
                  "1 "],
        "op": [1, 0, "", "x", "++", "insert", "+ ", " -", "\u2795", "＋", ["+"], {"op": "+"}],
    }[kind]
    return rng.choice(common + more)


def json_line(row) -> bytes:
    raw = {}
    cooked = {}
    for name, value in row.items():
        if isinstance(value, RawJSON):
            raw[f"@@{len(raw)}@@"] = str(value)
            cooked[name] = f"@@{len(raw) - 1}@@"
        else:
            cooked[name] = value
    text = json.dumps(cooked)
    for placeholder, value in raw.items():
        text = text.replace(json.dumps(placeholder), value)
    return text.encode("utf-8")


def bad_json_line(rng, row) -> bytes:
    """A line that is not a valid row whatever the config (its marker kept where possible)."""
    line = json_line(row)
    cut = rng.randrange(len('{"row": ' + json.dumps(row["row"])), len(line) - 1)
    choices = [
        lambda: line[:cut] + b"\xff\xfe" + line[cut:],                      # invalid UTF-8
        lambda: line[:cut],                                                  # truncated
        lambda: rng.choice([b"", b"   ", b"\t", b"\x00", b"\xef\xbb\xbf"]),   # blank, NUL, BOM
        lambda: rng.choice([b'["bad", 1]', b'"bad"', b"null", b"42", b"[]"]),  # not an object
        lambda: line[:-1] + b', "deep": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
        lambda: json_line({**row, "note": lone_surrogate_text(rng)}),        # unmapped field
        lambda: json_line({**row, "note": {"k": ["ok", [lone_surrogate_text(rng)]]}}),
        lambda: json_line({**row, lone_surrogate_text(rng): 1}),           # a field name
        lambda: json_line({**row, "note": RawJSON("8" * 4400)}),              # int > 4,300 digits
        lambda: line + b" " + line,                                          # two objects
        lambda: line + b"x",
        lambda: line[:1] + b"\xef\xbb\xbf" + line[1:],                       # a BOM inside
    ]
    return rng.choice(choices)()


def bad_csv_value(rng, kind):
    return rng.choice({
        "id": [""],
        "timestamp": ["", "yesterday", "2026-01-05T03:00:00", "2026-13-45T00:00:00Z", "nan",
                      "1e308", "NaN", "99999-01-01T00:00:00Z", iso(out_of_horizon(rng), rng),
                      "1767571200", " 2026-01-05T03:00:00Z"],
        "value": ["", "abc", "1_000", " 1", "0x10", "1,5", "nan", "inf", "-inf", "1e999", "½",
                  "٣", "1 "],
        "op": ["", "x", "++", "+ ", "insert", "\u2795"],
    }[kind])


def csv_line(values) -> bytes:
    out = _bytes_io.StringIO()
    csv.writer(out).writerow(values)
    return out.getvalue().encode("utf-8")


def bad_csv_line(rng, row) -> bytes:
    cells = [str(row[c]) for c in COLUMNS]
    choices = [
        lambda: csv_line(cells[:-1] + [cells[-1] + "@@X@@"]).replace(b"@@X@@", b"\xff\xfe"),
        lambda: csv_line(cells + ["one more"]),
        lambda: csv_line(cells[:rng.randrange(1, len(cells))]),
        lambda: rng.choice([b"\n", b"   \n", b"\t\n", b"\r\n"]),
        lambda: csv_line(cells).replace(b",", b",x\ry", 1),                 # a lone \r
        lambda: csv_line(cells[:-1] + ["x" * 140_000]),                      # > csv's field limit
    ]
    return rng.choice(choices)()


def corrupt_row(rng, transform, row, number, fmt):
    """`row` with one mapped cell made invalid for `fmt` (or the field left out)."""
    row = dict(row, row=f"bad-{number}")
    role = rng.choice(list(FIELDS[transform]))
    column = FIELDS[transform][role]
    if fmt == "jsonl" and rng.random() < 0.05:
        del row[column]
    elif fmt == "jsonl":
        row[column] = bad_json_value(rng, kind_of_role(role))
    else:
        row[column] = bad_csv_value(rng, kind_of_role(role))
    return row


def good_rows_of(transform, n_good):
    """A transform's good rows, the same for every entry point (one clean run serves all)."""
    rng = random.Random(f"{transform}-good")
    return [good_row(rng, n) for n in range(n_good)]


def fuzz_rows(transform, seed, n_good, n_bad, fmt):
    """(good rows, records to write in order: dict rows or raw lines, number of bad records)."""
    rng = random.Random(f"{transform}-{seed}-{fmt}")
    good = good_rows_of(transform, n_good)
    bad = []
    for number in range(n_bad):
        base = dict(rng.choice(good), row=f"bad-{number}")
        if rng.random() < 0.15:
            bad.append(bad_json_line(rng, base) if fmt == "jsonl" else bad_csv_line(rng, base))
        else:
            bad.append(corrupt_row(rng, transform, base, number, fmt))
    mixed = good + bad
    rng.shuffle(mixed)
    return good, mixed, len(bad)


def write_jsonl(path, records):
    with open(path, "wb") as handle:
        for record in records:
            handle.write((record if isinstance(record, bytes) else json_line(record)) + b"\n")


def write_csv(path, records, unterminated_end=False):
    with open(path, "wb") as handle:
        handle.write(csv_line(COLUMNS))
        for record in records:
            handle.write(record if isinstance(record, bytes) else
                         csv_line([str(record[c]) for c in COLUMNS]))
        if unterminated_end:  # a quoted cell never closed: the rest of the file is one record
            handle.write(b'bad-end,"2026-01-05T01:00:00Z,u1,eu,1,+,i1,never closed\nu2,eu\n')


# ----- Parquet and Arrow: columns of many types ----------------------------------------------
GOOD_TYPES = {  # column -> Arrow types whose cells (of a good row) parse to the same values
    "ts": ["iso", "timestamp_ms_utc", "timestamp_us_offset", "timestamp_ms_berlin"],
    "user": ["string", "large_string", "dictionary"],
    "item": ["string", "large_string", "dictionary"],
    "region": ["string", "large_string", "dictionary"],
    "seconds": ["float64", "float32", "float16", "string"],
    "op": ["string", "large_string", "dictionary"],
    "note": ["string", "large_string", "binary"],
    "row": ["string"],
}
TIMED_TYPES = ["timestamp_ms_utc", "timestamp_us_offset", "timestamp_ms_berlin"]
BAD_TYPES = {  # a role -> Arrow types none of whose cells is valid for it
    "id": ["float64", "decimal", "bool", "binary", "list", "struct", "null", "date32",
           "timestamp_us", "timestamp_s_year_10000"],
    "timestamp": ["bool", "decimal", "binary", "list", "struct", "date32", "time64", "duration",
                  "null", "epoch_outside", "timestamp_ns_odd", "timestamp_s_year_10000",
                  "bad_text"],
    "value": ["decimal", "bool", "binary", "list", "struct", "null", "date32", "bad_text"],
    "op": ["int8", "bool", "binary", "list", "null", "bad_text"],
}


BAD_NUMBERS = itertools.count(10 ** 6)  # markers of bad Parquet rows (unique in a run)
if importlib.util.find_spec("pandas") is not None:  # then Arrow gives pandas Timestamps for
    BAD_TYPES["timestamp"].remove("timestamp_ns_odd")  # nanoseconds: such a time is valid


def _when(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def arrow_column(kind, cells, rng, role_kind=None):
    """An Arrow array of `kind` from a column's cells (good rows' values, or None for a cell a
    bad row nulls); bad kinds ignore the cells and make values no role accepts."""
    n = len(cells)
    if kind == "iso":
        return pa.array(cells, pa.string())
    if kind in ("timestamp_ms_utc", "timestamp_us_offset", "timestamp_ms_berlin"):
        zone = {"timestamp_ms_utc": "UTC", "timestamp_us_offset": "+05:30",
                "timestamp_ms_berlin": "Europe/Berlin"}[kind]
        unit = "us" if kind == "timestamp_us_offset" else "ms"
        return pa.array([None if c is None else _when(c) for c in cells], pa.timestamp(unit, zone))
    if kind in ("string", "large_string") and role_kind is None:
        return pa.array([None if c is None else str(c) for c in cells],
                        pa.string() if kind == "string" else pa.large_string())
    if kind == "dictionary" and role_kind is None:
        return pa.array([None if c is None else str(c) for c in cells]).dictionary_encode()
    if kind in ("float64", "float32") and role_kind is None:
        return pa.array(cells, pa.float64() if kind == "float64" else pa.float32())
    if kind == "float16" and role_kind is None:  # (the halves of VALUES are exact)
        return pa.array([None if c is None else np.float16(c) for c in cells], pa.float16())
    if kind == "binary" and role_kind is None:
        return pa.array([None if c is None else str(c).encode() for c in cells], pa.binary())
    # bad kinds: every cell invalid for the role
    pick = lambda values: [rng.choice(values) for _ in range(n)]  # noqa: E731
    if kind == "float64":
        return pa.array(pick([0.5, 1.0, math.nan, None]), pa.float64())
    if kind == "decimal":
        return pa.array(pick([decimal.Decimal("2.50"), decimal.Decimal("-1.00"), None]),
                        pa.decimal128(10, 2))
    if kind == "bool":
        return pa.array(pick([True, False, None]), pa.bool_())
    if kind == "binary":
        return pa.array(pick([b"eu", b"+", b"\xff", None]), pa.binary())
    if kind == "list":
        return pa.array(pick([["eu"], [], None]), pa.list_(pa.string()))
    if kind == "struct":
        return pa.array(pick([{"a": "eu"}, {"a": None}, None]), pa.struct([("a", pa.string())]))
    if kind == "null":
        return pa.nulls(n)
    if kind == "date32":
        return pa.array(pick([datetime.date(2026, 1, 5), None]), pa.date32())
    if kind == "timestamp_us":
        return pa.array(pick([_when(ORIGIN), None]), pa.timestamp("us", "UTC"))
    if kind == "time64":
        return pa.array(pick([3_600_000_000, None]), pa.time64("us"))
    if kind == "duration":
        return pa.array(pick([3_600, None]), pa.duration("s"))
    if kind == "epoch_outside":
        return pa.array([int(out_of_horizon(rng)) for _ in range(n)], pa.int64())
    if kind == "timestamp_ns_odd":  # in the horizon, but not whole microseconds
        return pa.array([int(ORIGIN_S * 1e9) + 3_600_000_000_123 + i for i in range(n)],
                        pa.timestamp("ns", "UTC"))
    if kind == "timestamp_s_year_10000":
        return pa.array([253_402_300_800 + 86_400 * i for i in range(n)], pa.timestamp("s"))
    if kind == "float16":
        return pa.array(np.array(pick([0.5, 2.0, 7.5]), dtype=np.float16))
    if kind == "int8":
        return pa.array(pick([1, -1, 43, None]), pa.int8())
    if kind == "bad_text":
        return pa.array([bad_csv_value(rng, role_kind) or None for _ in range(n)])
    raise AssertionError(kind)


def good_table(rows, rng, timed_only=False, n_good=None, transform=None):
    """The rows as one Arrow table, each column of a type drawn from GOOD_TYPES (`timed_only`:
    times as Arrow timestamps and numbers as floats, what `ArrowEvents` takes). The rows after
    the first `n_good` get a mapped cell made invalid within the column's type (a null, an empty
    string, an unknown op, a non-finite number, a time outside the horizon) and a bad marker."""
    kinds = {}
    for column in COLUMNS:
        options = GOOD_TYPES[column]
        if timed_only and column == "ts":
            options = TIMED_TYPES
        if timed_only and column == "seconds":
            options = ["float64", "float32", "float16"]
        kinds[column] = rng.choice(options)
    cells = {c: [row[c] for row in rows] for c in COLUMNS}
    for index in range(len(rows) if n_good is None else n_good, len(rows)):
        cells["row"][index] = f"bad-{next(BAD_NUMBERS)}"
        role = rng.choice(list(FIELDS[transform]))
        column = FIELDS[transform][role]
        kind = kinds[column]
        options = [None]
        if kind in ("string", "large_string", "dictionary"):
            options += ["", "x"] if role == "op" else [""]
        if kind == "iso":
            options += ["", "yesterday", iso(out_of_horizon(rng), rng)]
        if kind in TIMED_TYPES:
            options += [iso(out_of_horizon(rng), rng)]
        if kind in ("float64", "float32", "float16"):
            options += [math.nan, math.inf, -math.inf]
        if kind == "string" and role == "value":
            options += ["abc", "nan", "1_000"]
        cells[column][index] = rng.choice(options)
    return pa.table({c: arrow_column(kinds[c], cells[c], rng) for c in COLUMNS})


def bad_only_table(rows, rng, transform, timed_only=False):
    """The rows with one mapped column of a type no role accepts: every row is bad."""
    table = good_table(rows, rng, timed_only, transform=transform)
    role = rng.choice(list(FIELDS[transform]))
    column = FIELDS[transform][role]
    kinds = [k for k in BAD_TYPES[kind_of_role(role)]
             if not (timed_only and k == "timestamp_ns_odd")]  # ArrowEvents: a valid time
    kind = rng.choice(kinds)
    if kind == "bad_text" and kind_of_role(role) == "id":
        kind = "null"
    bad = arrow_column(kind, [None] * table.num_rows, rng, kind_of_role(role))
    table = table.set_column(table.column_names.index(column), column, bad)
    markers = pa.array([f"bad-{next(BAD_NUMBERS)}" for _ in range(table.num_rows)])
    return table.set_column(0, "row", markers)


def write_parquet(folder, transform, seed, n_good, n_bad, timed_only=False):
    """Good rows spread over tables of varied column types, bad rows within them and in tables of
    refused types; Parquet files (one unreadable, one with a duplicated column) unless
    `timed_only` (`ArrowEvents`: a reader of the caller's). -> (good rows, bad records)."""
    rng = random.Random(f"{transform}-{seed}-parquet-{timed_only}")
    good = good_rows_of(transform, n_good)
    os.makedirs(folder, exist_ok=True)
    tables, n_bad_written = [], 0
    chunks = [good[i:i + 50] for i in range(0, len(good), 50)]
    per_chunk = max(1, n_bad // (2 * len(chunks)))
    if not timed_only:  # one chunk in a table with two columns `ts` and two `note`: the last
        twice = good_table(chunks.pop(), rng)  # of a name counts (as in JSON and CSV)
        tables.append(pa.table([pa.array(["x"] * twice.num_rows)] + twice.columns
                               + [pa.array(["again"] * twice.num_rows)],
                               names=["ts"] + twice.column_names + ["note"]))
    for chunk in chunks:  # good rows, plus copies turned bad within the column types
        copies = [dict(rng.choice(good)) for _ in range(per_chunk)]
        tables.append(good_table(chunk + copies, rng, timed_only, len(chunk), transform))
        n_bad_written += per_chunk
    while n_bad_written < n_bad:  # tables whose rows are all bad
        size = min(rng.randrange(20, 200), n_bad - n_bad_written)
        rows = [dict(rng.choice(good)) for _ in range(size)]
        table = bad_only_table(rows, rng, transform, timed_only)
        tables.append(table)
        n_bad_written += size
    for number, table in enumerate(tables):
        pq.write_table(table, os.path.join(folder, f"part-{number:04d}.parquet"))
    if not timed_only:
        with open(os.path.join(folder, "part-x-unreadable.parquet"), "wb") as handle:
            handle.write(b"PAR1 not a parquet file PAR1")
        n_bad_written += 1
    return good, n_bad_written


# ----- Python elements: what a caller may hand the transforms ---------------------------------
class BadRepr:
    """An object whose repr fails (a caller's own type)."""

    def __repr__(self):
        raise RuntimeError("no repr")


class Raw:
    """The fuzz's elements in Beam: pickled (they may hold text that is not Unicode, which Beam's
    default coder cannot encode, and objects of any type)."""


beam.coders.registry.register_coder(Raw, beam.coders.PickleCoder)


def nested_tuple(depth):
    value = "leaf"
    for _ in range(depth):
        value = (value,)
    return value


def bad_python_value(rng, kind):
    common = [None, True, False, [1], {"a": 1}, b"bytes", BadRepr(), np.array([1, 2]),
              lone_surrogate_text(rng), decimal.Decimal("1.5"), {1, 2}, complex(1, 2)]
    more = {
        "id": [0.5, math.nan, math.inf, "", 10 ** 1000, -(10 ** 5000), nested_tuple(40),
               ("a", None), (), ("a", ""), (lone_surrogate_text(rng),), np.int64(3),
               np.float64(1.0)],
        "value": [math.nan, math.inf, -math.inf, 10 ** 400, -(10 ** 5000), "2.5", "",
                  np.float16(2.5), np.array([1.0])],
        "op": [1, "", "x", "++", "+ ", "\u2795", ["+"], ("+",), np.array(["+", "-"]),
               np.str_("x")],
    }[kind]
    return rng.choice(common + more)


def good_elements(transform, rows):
    """The (element, seconds) `ToElement` makes of good rows (the job's own parsing)."""
    to_element = job_io.ToElement(JOBS[transform])
    out = []
    for row in rows:
        (element,) = list(to_element.process(row))
        assert not isinstance(element, beam.pvalue.TaggedOutput), element
        out.append((element.value, element.timestamp.micros / 1e6))
    return out


def bad_element(rng, transform, good):
    """A bad (element, seconds): a good one at a time outside the horizon, of another shape, or
    with one field that is no id, no op or no finite number."""
    element, seconds = rng.choice(good)
    choice = rng.random()
    if choice < 0.1:
        return element, rng.choice([out_of_horizon(rng), -9e12, 9e12, 0.0])
    if choice < 0.2:
        return rng.choice([None, "u1", b"u1", 42, 1.5, {"unit": "u1"}, (), element[:-1],
                           element + ("x",), [element], BadRepr(), np.array(element[:1]),
                           frozenset(element)]), seconds
    position = rng.randrange(len(element))
    kind = kind_of_role(ROLES[transform][position])
    element = list(element)
    element[position] = bad_python_value(rng, kind)
    return tuple(element) if rng.random() < 0.9 else element, seconds


def fuzz_elements(transform, seed, n_good, n_bad):
    rng = random.Random(f"{transform}-{seed}-elements")
    rows = good_rows_of(transform, n_good)
    good = good_elements(transform, rows)
    bad = [bad_element(rng, transform, good) for _ in range(n_bad)]
    mixed = good + bad
    rng.shuffle(mixed)
    return rows, mixed, len(bad)


# ----- hypothesis strategies: the same shapes, for the per-record properties -------------------
LONE = st.integers(0xD800, 0xDFFF).map(chr)
NOT_UNICODE = st.tuples(st.text(max_size=3), LONE, st.sampled_from(["", "x", "é"])).map("".join)
JSON_LEAVES = (st.none() | st.booleans() | st.integers() | st.integers(2 ** 64, 10 ** 999)
               | st.floats() | st.text() | NOT_UNICODE)
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                           max_leaves=8)
CONTAINERS = (st.none() | st.booleans() | st.lists(JSON_VALUES, max_size=2)
              | st.dictionaries(st.text(max_size=3), JSON_VALUES, max_size=2))
SAFE = 1.0  # seconds kept from the horizon's ends (a float there may round across them)
OUTSIDE = st.floats().filter(lambda x: not ORIGIN_S - SAFE <= x <= STOP_S + SAFE) | \
    st.integers().filter(lambda x: not ORIGIN_S - SAFE <= x <= STOP_S + SAFE)
INSIDE = st.floats(ORIGIN_S + SAFE, STOP_S - SAFE)
NOT_A_NUMBER_TEXT = st.text().map(lambda s: "x" + s)
BAD_JSON_ST = {  # certainly bad JSON values of a role kind
    "id": (CONTAINERS | st.floats() | st.just("") | NOT_UNICODE
           | st.integers(10 ** 1000, 10 ** 1100) | st.integers(-(10 ** 1100), -(10 ** 1000))),
    "timestamp": CONTAINERS | NOT_UNICODE | NOT_A_NUMBER_TEXT | OUTSIDE,
    "value": (CONTAINERS | NOT_UNICODE | NOT_A_NUMBER_TEXT | st.sampled_from(
        [math.nan, math.inf, -math.inf, "nan", "inf", "1e999", "1_000", " 1", "", "0x10"])
              | st.integers(2 ** 1024, 10 ** 400)),
    "op": (CONTAINERS | NOT_UNICODE | st.integers() | st.floats()
           | st.text().filter(lambda s: s not in ("+", "-"))),
}
GOOD_JSON_ST = {  # certainly good JSON values of a role kind
    "id": st.text(min_size=1) | st.integers(-(10 ** 999), 10 ** 999),
    "timestamp": (INSIDE | st.integers(int(ORIGIN_S) + 2, int(STOP_S) - 2)
                  | INSIDE.map(lambda x: datetime.datetime.fromtimestamp(
                      x, datetime.timezone.utc).isoformat())),
    "value": (st.floats(allow_nan=False, allow_infinity=False) | st.integers(-10 ** 300,
                                                                             10 ** 300)
              | st.floats(allow_nan=False, allow_infinity=False).map(repr)),
    "op": st.sampled_from(["+", "-"]),
}
PYTHON_BAD = {  # certainly bad Python values of a role kind (elements given to the transforms)
    "id": (BAD_JSON_ST["id"] | st.tuples() | st.tuples(st.text(min_size=1), st.none())
           | st.builds(nested_tuple, st.integers(17, 60)) | st.binary()
           | st.sampled_from([BadRepr(), np.int64(3), np.array([1, 2]), decimal.Decimal(1)])),
    "value": (CONTAINERS | NOT_UNICODE | st.text() | st.sampled_from(
        [math.nan, math.inf, -math.inf, np.float16(1.0), decimal.Decimal("1.5"), BadRepr()])
              | st.integers(2 ** 1024, 10 ** 400)),
    "op": BAD_JSON_ST["op"] | st.sampled_from([np.array(["+", "-"]), BadRepr(), ("+",)]),
}
PYTHON_GOOD = {
    "id": (st.text(min_size=1) | st.integers(-(10 ** 999), 10 ** 999)
           | st.tuples(st.text(min_size=1), st.integers())),
    "value": st.floats(allow_nan=False, allow_infinity=False) | st.integers(-10 ** 300,
                                                                            10 ** 300),
    "op": GOOD_JSON_ST["op"],
}


def fuzz_settings(examples):
    return settings(max_examples=examples, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


def assign(transform, element, micros):
    """`AssignSteps`'s per-element rule -> ([events], [dead letters]); both writable."""
    fn = AssignStepsFn(PROBLEMS[transform], STEPS, StepWindow.whole(STEPS))
    fn.start_bundle()
    events, dead = [], []
    for out in fn.process(element, Timestamp(micros=micros)):
        if isinstance(out, beam.pvalue.TaggedOutput):
            assert writable(out.value) and out.value["reason"]
            dead.append(out.value)
        else:
            unit, event = out
            KeyCoder().encode(unit)
            assert writable(event)
            events.append(out)
    return events, dead


def json_row_outcome(transform, line: bytes):
    """A JSON line through the job's reader, `ToElement` and `AssignSteps` -> (events, dead)."""
    events, dead = [], []
    for out in job_io.ParseJson().process(line):
        if isinstance(out, beam.pvalue.TaggedOutput):
            assert writable(out.value) and out.value["reason"]
            dead.append(out.value)
            continue
        assert writable(out)
        for element in job_io.ToElement(JOBS[transform]).process(out):
            if isinstance(element, beam.pvalue.TaggedOutput):
                assert writable(element.value) and element.value["reason"]
                dead.append(element.value)
                continue
            assert writable(element.value)
            more, more_dead = assign(transform, element.value, element.timestamp.micros)
            events += more
            dead += more_dead
    return events, dead


def check_json_row(data):
    transform = data.draw(st.sampled_from(TRANSFORMS), "transform")
    row, bad = {}, False
    for column in ["row", "ts", "user", "region", "seconds", "op", "item", "note"]:
        role = role_of_column(transform, column)
        if role is None:
            row[column] = data.draw(JSON_VALUES, column)
            bad |= not is_unicode(row[column])
        elif data.draw(st.integers(0, 9), "corrupt") == 0:
            bad = True
            if not data.draw(st.booleans(), "leave out"):
                row[column] = data.draw(BAD_JSON_ST[kind_of_role(role)], column)
        else:
            row[column] = data.draw(GOOD_JSON_ST[kind_of_role(role)], column)
    events, dead = json_row_outcome(transform, json.dumps(row).encode("utf-8"))
    assert (len(events), len(dead)) == ((0, 1) if bad else (1, 0)), (row, dead)


@fuzz_settings(300)
@given(st.data())
def test_any_json_row_is_one_event_or_one_dead_letter(data):
    check_json_row(data)


@pytest.mark.slow
@fuzz_settings(3000)
@given(st.data())
def test_any_json_row_is_one_event_or_one_dead_letter_slow(data):
    check_json_row(data)


def check_python_element(data):
    transform = data.draw(st.sampled_from(TRANSFORMS), "transform")
    roles = ROLES[transform]
    bad = data.draw(st.booleans(), "bad")
    if bad and data.draw(st.integers(0, 3), "shape") == 0:
        element = data.draw(JSON_VALUES.filter(lambda v: not (isinstance(v, list) and len(
            v) == len(roles))) | st.tuples(*[st.text()] * (len(roles) + 1))
                            | st.tuples(*[st.text()] * (len(roles) - 1))
                            | st.sampled_from([BadRepr(), np.array([1, 2]), b"u"]), "element")
    else:
        corrupt = data.draw(st.integers(0, len(roles) - 1), "role") if bad else -1
        element = tuple(data.draw((PYTHON_BAD if i == corrupt else PYTHON_GOOD)[
            kind_of_role(role)], role) for i, role in enumerate(roles))
    micros = int(data.draw(INSIDE, "time") * 1e6)
    if data.draw(st.integers(0, 9), "late") == 0:
        micros, bad = int(data.draw(OUTSIDE.filter(lambda x: abs(x) < 9e12), "outside")
                          * 1e6), True
    events, dead = assign(transform, element, micros)
    assert (len(events), len(dead)) == ((0, 1) if bad else (1, 0)), (element, dead)


@fuzz_settings(300)
@given(st.data())
def test_any_element_is_one_event_or_one_dead_letter(data):
    check_python_element(data)


@pytest.mark.slow
@fuzz_settings(3000)
@given(st.data())
def test_any_element_is_one_event_or_one_dead_letter_slow(data):
    check_python_element(data)


CSV_TEXT = st.text(st.characters(codec="utf-8") | st.sampled_from(
    ['"', ",", "\n", "\r", "\x00", "\ufeff", "\u2028", "\x85"]), max_size=12)
BAD_CSV_LINES = st.sampled_from([
    b"\xff,\xfe,x\n", b"a,b\n", b"a,b,c,d\n", b"\n", b"   \n", b"a\rb,c,d\n",
    b'"multi\nline",two\n', b"ok,\xc3,x\n", b'"a",b\n'])


def check_csv_records(data):
    rows = data.draw(st.lists(st.lists(CSV_TEXT, min_size=3, max_size=3), max_size=20), "rows")
    bad = data.draw(st.lists(st.tuples(st.integers(0, len(rows)), BAD_CSV_LINES), max_size=5))
    lines = [csv_line(["a", "b", "c"])] + [csv_line(row) for row in rows]
    for position, line in sorted(bad, reverse=True):
        lines.insert(position + 1, line)
    physical = iter(_bytes_io.BytesIO(b"".join(lines)).readline, b"")
    good, dead = [], []
    for out in csv_input.csv_records(physical, ["a", "b", "c"]):
        if isinstance(out, beam.pvalue.TaggedOutput):
            assert writable(out.value) and out.value["reason"].startswith("invalid CSV line: ")
            dead.append(out.value)
        else:
            good.append([out["a"], out["b"], out["c"]])
    assert good == rows  # every cell as written: quotes, line breaks, NUL
    assert len(dead) == len(bad)


@fuzz_settings(200)
@given(st.data())
def test_csv_records_are_read_as_written_and_bad_ones_are_one_dead_letter(data):
    check_csv_records(data)


@pytest.mark.slow
@fuzz_settings(2000)
@given(st.data())
def test_csv_records_are_read_as_written_and_bad_ones_are_one_dead_letter_slow(data):
    check_csv_records(data)


ARROW_KINDS = ["iso", "timestamp_ms_utc", "timestamp_us_offset", "timestamp_ms_berlin", "string",
               "large_string", "dictionary", "float64", "float32", "decimal", "bool", "binary",
               "list", "struct", "null", "date32", "timestamp_us", "time64", "duration",
               "epoch_outside", "timestamp_s_year_10000", "float16", "int8", "int64",
               "uint64", "bad_text"]


def arrow_cells(data, kind, n):
    """n cells for an Arrow column of `kind` (good-looking kinds get drawn values and nulls)."""
    if kind in ("int64", "uint64"):
        low, high = (-(2 ** 63), 2 ** 63 - 1) if kind == "int64" else (0, 2 ** 64 - 1)
        values = data.draw(st.lists(st.none() | st.integers(low, high) | st.integers(0, 3),
                                    min_size=n, max_size=n))
        return pa.array(values, pa.int64() if kind == "int64" else pa.uint64())
    rng = random.Random(data.draw(st.integers(0, 2 ** 32), "seed"))
    if kind in ("iso",) + tuple(TIMED_TYPES):
        cells = [None if rng.random() < 0.1 else iso(
            rng.choice([rng.uniform(ORIGIN_S, STOP_S), out_of_horizon(rng)]), rng)
                 for _ in range(n)]
        if kind == "iso":
            cells = [c if rng.random() < 0.8 else rng.choice(["", "x", "nan"]) for c in cells]
        return arrow_column(kind, cells, rng)
    if kind in ("string", "large_string", "dictionary"):
        cells = data.draw(st.lists(st.none() | st.text() | st.sampled_from(
            KEYS + ["+", "-", "2.5", "nan", "", "u1"]), min_size=n, max_size=n))
        return arrow_column(kind, cells, rng)
    if kind in ("float64", "float32"):
        cells = data.draw(st.lists(st.none() | st.floats(width=32 if kind == "float32" else 64)
                                   | st.sampled_from([ORIGIN_S + 60.0, 2.5]),
                                   min_size=n, max_size=n))
        return arrow_column(kind, cells, rng)
    return arrow_column(kind, [None] * n, rng, "value" if kind == "bad_text" else "id")


def arrow_table(data, timestamp_kinds=ARROW_KINDS):
    n = data.draw(st.integers(1, 12), "rows")
    columns = {}
    for column in ["ts", "user", "region", "seconds", "op", "item"]:
        kinds = timestamp_kinds if column == "ts" else ARROW_KINDS
        columns[column] = arrow_cells(data, data.draw(st.sampled_from(kinds), column), n)
    return pa.table(columns)


def check_parquet_table(data):
    """`TableToBatch` (vectorised checks, then `ToElement` per row) on a table of any column
    types: never raises, one event or one dead letter per row, the same as the row path."""
    table = arrow_table(data)
    transform = data.draw(st.sampled_from(TRANSFORMS), "transform")
    job = JOBS[transform]
    fn = arrow_batches.TableToBatch(job, job_io.ToElement(job))
    fn.setup()
    batched, batched_dead = collections.Counter(), []
    for out in fn.process(table):
        if isinstance(out, beam.pvalue.TaggedOutput):
            assert writable(out.value) and out.value["reason"]
            batched_dead.append(json.dumps(out.value, sort_keys=True))
            continue
        for element, micros in list(zip(out.elements(), out.micros.tolist())) + out.extra:
            assert writable(element)
            batched[repr((element, micros))] += 1
    rows, rows_dead = collections.Counter(), []
    to_element = job_io.ToElement(job)
    for row in arrow_batches.python_rows(table, set(job.input.fields.values())):
        outs = [row] if isinstance(row, beam.pvalue.TaggedOutput) else to_element.process(row)
        for out in outs:
            if isinstance(out, beam.pvalue.TaggedOutput):
                rows_dead.append(json.dumps(out.value, sort_keys=True))
            else:
                rows[repr((out.value, out.timestamp.micros))] += 1
    assert (batched, sorted(batched_dead)) == (rows, sorted(rows_dead))
    assert sum(batched.values()) + len(batched_dead) == table.num_rows


@fuzz_settings(200)
@given(st.data())
def test_any_parquet_table_gives_one_event_or_dead_letter_per_row(data):
    check_parquet_table(data)


@pytest.mark.slow
@fuzz_settings(2000)
@given(st.data())
def test_any_parquet_table_gives_one_event_or_dead_letter_per_row_slow(data):
    check_parquet_table(data)


def check_arrow_events(data):
    """`ArrowEvents` + the batched `AssignSteps` on a table of any column types: never raises,
    one event or one dead letter per row, all writable."""
    table = arrow_table(data)
    transform = data.draw(st.sampled_from(TRANSFORMS), "transform")
    fields = {role: FIELDS[transform][role] for role in ROLES[transform]}
    batch = event_batch(table, fields, "ts", data.draw(st.sampled_from(["s", "ms", "us", "ns"])))
    fn = AssignBatchStepsFn(PROBLEMS[transform], STEPS, StepWindow.whole(STEPS))
    fn.start_bundle()
    count = 0
    for out in list(fn.process(batch)) + list(fn.finish_bundle()):
        count += 1
        if isinstance(out, beam.pvalue.TaggedOutput):
            assert writable(out.value) and out.value["reason"]
        else:
            KeyCoder().encode(out[0])
            assert writable(out[1])
    assert count == table.num_rows


@fuzz_settings(200)
@given(st.data())
def test_any_arrow_table_gives_one_event_or_dead_letter_per_row(data):
    check_arrow_events(data)


@pytest.mark.slow
@fuzz_settings(2000)
@given(st.data())
def test_any_arrow_table_gives_one_event_or_dead_letter_per_row_slow(data):
    check_arrow_events(data)


# ----- whole pipelines: one Beam run per entry point, the three transforms side by side -------
class _Job(beam.PTransform):
    """A job's own pipeline (`pipelines.run.build`: read, transform, write records and dead
    letters) as one branch of a bigger pipeline."""

    def __init__(self, job, folder):
        super().__init__()
        self.job, self.folder = job, folder

    def expand(self, begin):
        return tuple(job_run.build(begin, self.job,
                                   public_folder=os.path.join(self.folder, "public"),
                                   operator_folder=os.path.join(self.folder, "operator")))


def _written(result, folder):
    return (result.records | "Records" >> WriteRecordsToJsonLines(
                os.path.join(folder, "public", "records")),
            result.dead_letters | "DeadLetters" >> WriteRecordsToJsonLines(
                os.path.join(folder, "operator", "dead_letters")))


class _Elements(beam.PTransform):
    """Timestamped elements given straight to the configured transform (the Python API)."""

    def __init__(self, job, folder, events):
        super().__init__()
        self.job, self.folder, self.events = job, folder, events

    def expand(self, begin):
        events = self.events
        stream = (begin | "Indices" >> beam.Create(list(range(len(events))))
                  | "Timestamped" >> beam.Map(
                      lambda i: TimestampedValue(events[i][0], events[i][1])
                  ).with_output_types(Raw))
        return _written(stream | "Transform" >> job_run.build_transform(self.job), self.folder)


class _ArrowBatches(beam.PTransform):
    """Parquet read by the caller (`ReadFromParquetBatched`) and given to the transform as
    `ArrowEvents` batches (the Python API's batched entry)."""

    def __init__(self, job, folder, pattern, transform):
        super().__init__()
        self.job, self.folder, self.pattern, self.transform = job, folder, pattern, transform

    def expand(self, begin):
        fields = {role: FIELDS[self.transform][role] for role in ROLES[self.transform]}
        batches = (begin | "Read" >> beam.io.ReadFromParquetBatched(self.pattern)
                   | "Events" >> ArrowEvents(fields, timestamp="ts", timestamp_unit="s"))
        return _written(batches | "Transform" >> job_run.build_transform(self.job), self.folder)


def load_job(tmp_path, transform, fmt, path, name):
    config = fuzz_config(transform, fmt, path, str(tmp_path / f"out-{name}"))
    config_path = tmp_path / f"{name}-{transform}.yaml"
    config_path.write_text(yaml.safe_dump(config, allow_unicode=True))
    return job_config.load(str(config_path))


def run_branches(branches):
    """Run {name: (PTransform, folder)} as one Beam pipeline -> {name: (records, dead)}."""
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    for name, (branch, _) in branches.items():
        _ = pipeline | name >> branch
    pipeline.run().wait_until_finish()
    out = {}
    for name, (_, folder) in branches.items():
        records = sorted((json.loads(line) for f in glob.glob(os.path.join(
            folder, "public", "records-*.jsonl")) for line in open(f, encoding="utf-8")),
            key=lambda r: (r["key"], r["step"]))
        dead = [json.loads(line) for f in glob.glob(os.path.join(
            folder, "operator", "dead_letters-*.jsonl")) for line in open(f, encoding="utf-8")]
        out[name] = records, dead
    return out


def clean_records(tmp_path, goods):
    """{transform: records} of a clean run (JSON lines) of each transform's good rows."""
    branches = {}
    for transform, rows in goods.items():
        folder = tmp_path / f"clean-{transform}"
        os.makedirs(folder, exist_ok=True)
        write_jsonl(str(folder / "good.jsonl"), rows)
        job = load_job(tmp_path, transform, "jsonl", str(folder / "good.jsonl"), "clean")
        branches[f"clean {transform}"] = (_Job(job, str(folder / "run")), str(folder / "run"))
    results = run_branches(branches)
    out = {}
    for transform in goods:
        records, dead = results[f"clean {transform}"]
        assert records and not dead, (transform, dead[:3])
        out[transform] = records
    return out


def check_run(records, dead, expected, n_bad, label):
    assert records == expected, label
    reasons = collections.Counter(d["reason"].split(";")[0].split(":")[0][:60] for d in dead)
    assert len(dead) == n_bad, (label, len(dead), n_bad, reasons.most_common(8))
    seen = collections.Counter()
    for letter in dead:
        assert letter["reason"] and len(letter["reason"]) <= 1024, letter
        assert len(letter["record"]) <= 1024 and letter["size"] >= len(letter["record"])
        for kind, number in set(MARKER.findall(letter["record"])):
            assert kind == "bad", (label, letter)  # a good record is never a dead letter
            seen[number] += 1
    assert not [n for n, c in seen.items() if c > 1], label  # one dead letter per bad record
    return reasons


CLEAN = {}  # n_good -> {transform: records of a clean run of its good rows}


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    """{transform: records} of one clean run of the good rows, shared by the entry points."""
    def records(n_good):
        if n_good not in CLEAN:
            folder = tmp_path_factory.mktemp(f"clean-{n_good}")
            CLEAN[n_good] = clean_records(folder, {t: good_rows_of(t, n_good)
                                                   for t in TRANSFORMS})
        return CLEAN[n_good]
    return records


def entry_point_fuzz(tmp_path, entry, n_good, n_bad, clean):
    """One Beam run of `entry` for the three transforms, each on n_good good and about n_bad
    bad records; -> the number of bad records given."""
    goods, branches, expected_bad = {}, {}, {}
    for transform in TRANSFORMS:
        folder = tmp_path / f"{entry}-{transform}"
        os.makedirs(folder, exist_ok=True)
        run_folder = str(folder / "run")
        if entry in ("jsonl", "csv"):
            good, mixed, bad = fuzz_rows(transform, 1, n_good, n_bad, entry)
            path = str(folder / f"input.{entry}")
            if entry == "jsonl":
                write_jsonl(path, mixed)
            else:
                write_csv(path, mixed, unterminated_end=True)
                bad += 1
            branch = _Job(load_job(tmp_path, transform, entry, path, entry), run_folder)
        elif entry == "parquet":
            good, bad = write_parquet(str(folder), transform, 1, n_good, n_bad)
            job = load_job(tmp_path, transform, "parquet", str(folder / "*.parquet"), entry)
            branch = _Job(job, run_folder)
        elif entry == "elements":
            good, events, bad = fuzz_elements(transform, 1, n_good, n_bad)
            branch = _Elements(JOBS_AT(tmp_path, transform), run_folder, events)
        else:  # arrow
            good, bad = write_parquet(str(folder), transform, 1, n_good, n_bad, timed_only=True)
            branch = _ArrowBatches(JOBS_AT(tmp_path, transform), run_folder,
                                   str(folder / "*.parquet"), transform)
        goods[transform], expected_bad[transform] = good, bad
        branches[f"{entry} {transform}"] = (branch, run_folder)
    results = run_branches(branches)
    expected = clean(n_good)
    for transform in TRANSFORMS:
        assert goods[transform] == good_rows_of(transform, n_good)
        records, dead = results[f"{entry} {transform}"]
        check_run(records, dead, expected[transform], expected_bad[transform],
                  f"{entry} {transform}")
    return sum(expected_bad.values())


def JOBS_AT(tmp_path, transform):  # noqa: N802 (a job whose output folder is unused)
    return load_job(tmp_path, transform, "jsonl", "unused.jsonl", "api")


ENTRY_POINTS = ["jsonl", "csv", "parquet", "elements", "arrow"]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_survives_10k_malformed_records(tmp_path, entry, clean_run):
    assert entry_point_fuzz(tmp_path, entry, GOOD_ROWS, BAD_ROWS, clean_run) >= 10_000


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_survives_100k_malformed_records(tmp_path, entry, clean_run):
    assert entry_point_fuzz(tmp_path, entry, 10 * GOOD_ROWS, 10 * BAD_ROWS,
                            clean_run) >= 100_000


# ----- the issue's reproducer, through the job's entry point (`python3 -m pipelines.run`) ------
ISSUE_LINES = {  # the issue's line, its lone surrogate (JSON escape \ud800) in a role field
    "count": (b'{"user": "\\ud800", "region": "eu", "ts": "2026-01-05T00:00:00Z"}', "user"),
    "sum": (b'{"user": "\\ud800", "region": "eu", "ts": "2026-01-05T00:00:00Z", "seconds": 3}',
            "user"),
    "count_distinct": (b'{"op": "+", "item": "\\ud800", "region": "eu", '
                       b'"ts": "2026-01-05T00:00:00Z"}', "item"),
}


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_a_lone_surrogate_is_one_dead_letter_not_a_crash(tmp_path, transform, clean_run, capfd):
    """Was: UnicodeEncodeError ('surrogates not allowed') stopped the job (all three)."""
    rows = good_rows_of(transform, GOOD_ROWS)
    line, field = ISSUE_LINES[transform]
    path = tmp_path / "input.jsonl"
    write_jsonl(str(path), rows[:150] + [line] + rows[150:])
    config_path = tmp_path / "job.yaml"
    config_path.write_text(yaml.safe_dump(fuzz_config(transform, "jsonl", str(path),
                                                      str(tmp_path / "out")),
                                          allow_unicode=True))
    assert job_run.main(["--config", str(config_path)]) == 0
    job = job_config.load(str(config_path))
    records = sorted((json.loads(line) for f in glob.glob(os.path.join(
        job.public_path, "records-*.jsonl")) for line in open(f, encoding="utf-8")),
        key=lambda r: (r["key"], r["step"]))
    dead = [json.loads(line) for f in glob.glob(os.path.join(job.operator_path,
                                                               "dead_letters-*"))
            for line in open(f, encoding="utf-8")]
    assert records == clean_run(GOOD_ROWS)[transform]
    assert [d["reason"] for d in dead] == [
        f"bad_text: `{field}` must be valid Unicode text (no lone surrogates); got '\\ud800'."]
    assert dead[0]["record"] == repr(line)
    assert "Traceback" not in capfd.readouterr().err
