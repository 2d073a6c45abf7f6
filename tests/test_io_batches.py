"""The job reader's Parquet path (`pipelines.io.read_parquet_batches`: Arrow tables ->
EventBatches, vectorised checks) gives what the row path (`read_rows` | `ToElement`) gives:
the same elements with the same event times, and the same dead letters (reason and record)
for every row the checks refuse, whatever the column types."""
from __future__ import annotations

import collections
import datetime
import glob
import json
import os
import random

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import arrow_batches
from pipelines import config as job_config
from pipelines import io
from pipelines import run as job_run

ORIGIN = datetime.datetime(2026, 1, 5, tzinfo=datetime.timezone.utc)
HOUR_US = 3_600_000_000


def job(tmp_path, transform, fields, timestamp_format="iso", types=None, bounds=None,
        keys=("a", "b", "c")):
    config = {
        "job": "t", "transform": transform,
        "input": {"path": str(tmp_path / "*.parquet"), "format": "parquet", "fields": fields,
                  "timestamp_format": timestamp_format, "max_dead_letter_fraction": 1.0,
                  **({"types": types} if types else {})},
        "steps": {"origin": "2026-01-05T00:00:00Z", "size_seconds": 3600, "horizon": 6},
        "privacy": {"epsilon": 1.0}, "bounds": bounds or {"max_contributions": 3},
        "public_keys": list(keys), "output": {"path": str(tmp_path / "out"),
                                               "formats": ["jsonl"]},
        "secret": {"seed": 7, "insecure": True}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    return job_config.load(str(path)), path


def tally(outputs):
    """(Counter of (element, micros), sorted dead letters, rows the vectorised checks took) of
    a reader's outputs: dead letters, timestamped elements or EventBatches."""
    elements, dead, fast = collections.Counter(), [], 0
    for out in outputs:
        if isinstance(out, beam.pvalue.TaggedOutput):
            dead.append(json.dumps(out.value, sort_keys=True))
        elif hasattr(out, "extra"):  # an EventBatch
            fast += len(out.micros)
            for element, micros in [*zip(out.elements(), out.micros.tolist()), *out.extra]:
                elements[repr((element, micros))] += 1
        else:
            elements[repr((out.value, out.timestamp.micros))] += 1
    return elements, sorted(dead), fast


def by_rows(job_spec, table):
    """(Counter of (element, micros), sorted dead letters) of the row path."""
    fn = io.ToElement(job_spec)
    return tally(out for row in table.to_pylist() for out in fn.process(row))[:2]


def by_batches(job_spec, table):
    fn = arrow_batches.TableToBatch(job_spec, io.ToElement(job_spec))
    fn.setup()
    return tally(fn.process(table))[:2]


def times(rng, n, kind):
    base = int(ORIGIN.timestamp() * 1e6)
    micros = [base + rng.choice([rng.randrange(-HOUR_US, 7 * HOUR_US), 0, HOUR_US])
              for _ in range(n)]
    if kind == "timestamp_us":
        return pa.array([None if rng.random() < 0.05 else m for m in micros],
                        type=pa.timestamp("us", tz="UTC"))
    if kind == "timestamp_ms_naive":
        return pa.array([m // 1000 for m in micros], type=pa.timestamp("ms"))
    if kind == "seconds_float":
        return pa.array([rng.choice([m / 1e6, m / 1e6, float("nan"), float("inf"), 1e300])
                         for m in micros])
    if kind == "seconds_int":
        return pa.array([m // 10 ** 6 for m in micros], type=pa.int64())
    if kind == "milliseconds_int":  # (and a few in seconds: wrong, dead letters both ways)
        return pa.array([m // 1000 if rng.random() < 0.9 else m // 10 ** 6 for m in micros],
                        type=pa.int64())
    if kind == "milliseconds_float":
        return pa.array([rng.choice([m / 1e3, m / 1e3, float("nan"), 1e300]) for m in micros])
    if kind == "iso_text":
        return pa.array([datetime.datetime.fromtimestamp(m / 1e6, datetime.timezone.utc)
                         .isoformat() if rng.random() < 0.9 else "not a time"
                         for m in micros])
    raise AssertionError(kind)


def ids(rng, n, strings):
    if strings:
        return pa.array([rng.choice(["a", "b", "c", "d", "", None]) for _ in range(n)])
    return pa.array([rng.choice([1, 2, 3, 2 ** 40, None]) for _ in range(n)], type=pa.int64())


TIME_KINDS = ["timestamp_us", "timestamp_ms_naive", "seconds_float", "seconds_int",
              "milliseconds_int", "milliseconds_float", "iso_text"]


@pytest.mark.parametrize("time_kind", TIME_KINDS)
@pytest.mark.parametrize("seed", range(4))
def test_count_batches_equal_rows(tmp_path, time_kind, seed):
    rng = random.Random(seed * 13 + len(time_kind))
    n = rng.randrange(1, 250)
    table = pa.table({"ts": times(rng, n, time_kind), "user": ids(rng, n, rng.random() < 0.5),
                      "region": ids(rng, n, strings=True)})
    fmt = "seconds" if time_kind.startswith("seconds") and rng.random() < 0.7 else \
        "milliseconds" if time_kind.startswith("milliseconds") and rng.random() < 0.8 else "iso"
    spec, _ = job(tmp_path, "count", {"timestamp": "ts", "unit": "user", "key": "region"},
                  fmt)
    assert by_batches(spec, table) == by_rows(spec, table)


@pytest.mark.parametrize("seed", range(4))
def test_sum_and_declared_types_batches_equal_rows(tmp_path, seed):
    """Numeric roles (ints and floats, NaN, infinities, nulls, booleans), declared id types
    and a missing column."""
    rng = random.Random(seed)
    n = 200
    values = [rng.choice([1.5, 2, -1.0, float("nan"), float("inf"), None, 0.1]) for _ in
              range(n)]
    table = pa.table({"ts": times(rng, n, "timestamp_us"), "user": ids(rng, n, False),
                      "region": ids(rng, n, True), "v": pa.array(values, type=pa.float64()),
                      "vi": pa.array([rng.choice([1, 5, None]) for _ in range(n)]),
                      "flag": pa.array([rng.random() < 0.5 for _ in range(n)])})
    for value, types in (("v", None), ("vi", None), ("vi", {"value": "int"}),
                         ("flag", None), ("missing", None)):
        spec, _ = job(tmp_path, "sum", {"timestamp": "ts", "unit": "user", "key": "region",
                                        "value": value},
                      types=types, bounds={"max_value": 3.0, "max_contributions": 4})
        assert by_batches(spec, table) == by_rows(spec, table), value
    spec, _ = job(tmp_path, "count", {"timestamp": "ts", "unit": "user", "key": "region"},
                  types={"unit": "str"})  # int users refused with the row path's reason
    assert by_batches(spec, table) == by_rows(spec, table)


def test_distinct_shape_batches_equal_rows(tmp_path):
    rng = random.Random(3)
    n = 150
    table = pa.table({"ts": times(rng, n, "seconds_int"),
                      "op": pa.array([rng.choice(["+", "-", "", None]) for _ in range(n)]),
                      "item": ids(rng, n, False), "region": ids(rng, n, True)})
    spec, _ = job(tmp_path, "count_distinct", {"timestamp": "ts", "op": "op", "item": "item",
                                               "key": "region"},
                  "seconds", bounds={"max_flips": 2})
    assert by_batches(spec, table) == by_rows(spec, table)


def _records(folder):
    return sorted(line for f in glob.glob(os.path.join(folder, "t", "records-*.jsonl"))
                  for line in open(f))


def _dead(folder):
    return sorted(json.dumps(json.loads(line), sort_keys=True) for f in glob.glob(
        os.path.join(folder, "t-operator", "dead_letters-*")) for line in open(f))


def _row_path(pipeline, job_spec):
    """The reader before the batched path: one Beam element per row (`read_rows` |
    `ToElement`)."""
    rows, dead = io.read_rows(pipeline, job_spec)
    elements = rows | "ToElements" >> beam.ParDo(io.ToElement(job_spec)).with_outputs(
        io.DEAD_LETTER, main="elements")
    return elements.elements, dead + [elements[io.DEAD_LETTER]]


def test_parquet_job_gives_the_records_and_dead_letters_of_the_row_path(tmp_path,
                                                                        monkeypatch):
    """A whole job (pipelines.run) on a Parquet file with bad rows, read batched and read row
    by row: the same records and the same dead letters."""
    rng = random.Random(11)
    n = 400
    table = pa.table({"ts": times(rng, n, "timestamp_us"), "user": ids(rng, n, False),
                      "region": ids(rng, n, True)})
    (tmp_path / "p").mkdir()
    pq.write_table(table, tmp_path / "p" / "part.parquet", row_group_size=128)
    same_job_both_ways(tmp_path, monkeypatch, "*.parquet", "parquet", "iso")


def same_job_both_ways(tmp_path, monkeypatch, pattern, fmt, time_format):
    """The count job on the files `tmp_path/p/pattern`, read batched and read row by row
    (`_row_path`): the same records and the same dead letters."""
    bounds = {"max_contributions": 3, "max_contributions_per_step": 2, "max_keys_per_unit": 2}
    out = {}
    for name in ("batched", "rows"):
        (tmp_path / name).mkdir()
        _, config = job(tmp_path / name, "count",
                        {"timestamp": "ts", "unit": "user", "key": "region"}, time_format,
                        bounds=bounds)
        raw = yaml.safe_load(config.read_text())
        raw["input"].update(path=str(tmp_path / "p" / pattern), format=fmt)
        config.write_text(yaml.safe_dump(raw))
        if name == "rows":
            monkeypatch.setattr(io, "read_elements", _row_path)
        assert job_run.main(["--config", str(config)]) == 0
        out[name] = _records(raw["output"]["path"]), _dead(raw["output"]["path"])
    assert len(out["rows"][0]) == 3 * 6 and out["rows"][1]
    assert out["batched"] == out["rows"]


def test_read_elements_gives_batches_for_parquet(tmp_path):
    from transforms.arrow_input import is_batched
    pq.write_table(pa.table({"ts": [1.0], "user": [1], "region": ["a"]}),
                   tmp_path / "x.parquet")
    spec, _ = job(tmp_path, "count", {"timestamp": "ts", "unit": "user", "key": "region"})
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as p:
        elements, dead = io.read_elements(p, spec)
        assert is_batched(elements) and len(dead) == 2


def test_a_timestamp_python_cannot_hold_is_a_dead_letter_not_a_crash(tmp_path):
    """A Parquet timestamp after the year 9999 (Arrow holds it, Python's datetime cannot): that
    row is one dead letter with its cells as text; the table's other rows are kept."""
    spec, _ = job(tmp_path, "count", {"timestamp": "ts", "unit": "user", "key": "key"})
    base = int(ORIGIN.timestamp() * 1e6)
    late = 253_402_300_800_000_000  # 10000-01-01T00:00:00Z in microseconds
    table = pa.table({"ts": pa.array([base, late, None], type=pa.timestamp("us", tz="UTC")),
                      "user": pa.array([1, 2, 3]), "key": pa.array(["a", "a", "a"])})
    with pytest.raises((ValueError, OverflowError)):
        table.to_pylist()  # what crashed the job before
    elements, dead = by_batches(spec, table)
    assert sum(elements.values()) == 1
    records = [json.loads(d) for d in dead]
    unreadable = [r for r in records if r["reason"].startswith("unreadable Parquet row")]
    assert len(unreadable) == 1 and str(late) in unreadable[0]["record"]
    assert len(records) == 2  # the null time too, with the row path's reason


# ----- JSON lines read as batches (`io.read_jsonl_batches`) --------------------------------------

def _json_value(rng, kind, iso, text_ids):
    """A JSON value of a field: mostly right (of one type per file, so that some chunks are all
    right), sometimes wrong in every way the row path sees."""
    base = int(ORIGIN.timestamp())
    moment = base + rng.randrange(-3600, 7 * 3600)
    good = {"ts": datetime.datetime.fromtimestamp(moment, datetime.timezone.utc).isoformat()
            if iso else rng.choice([moment, moment + 0.25]),
            "user": rng.choice(["u1", "u2", "u3"] if text_ids else [1, 2, 3, 2 ** 40]),
            "region": rng.choice(["a", "b", "c", "d"]),
            "value": rng.choice([1, 2.5, 0, 7])}[kind]
    bad = rng.choice([None, "", True, 1.5, [1], {"a": 1}, 2 ** 70, "not a time", -1e300, 3,
                      "u9"])
    return good if rng.random() < 0.97 else bad


def _json_lines(rng, n, fields, iso=False):
    lines, text_ids = [], rng.random() < 0.5
    for _ in range(n):
        roll = rng.random()
        if roll < 0.02:
            lines.append(rng.choice([b"", b"   ", b"{not json", b"[1, 2]", b"\xff\xfe",
                                     b'{"ts": "\\ud800"}', b"\xef\xbb\xbf{}", b"null"]))
            continue
        row = {name: _json_value(rng, name, iso, text_ids) for name in fields
               if rng.random() > 0.01}
        if rng.random() < 0.1:
            row["extra"] = rng.choice(["x", [1, {"y": None}], 3])
        line = json.dumps(row).encode()
        lines.append(line + (b"\r" if rng.random() < 0.05 else b""))
    return lines


def _by_json_rows(job_spec, lines):
    """The row path on lines: `ParseJson` then `ToElement`, one line at a time."""
    parse, fn = io.ParseJson(), io.ToElement(job_spec)
    return tally(out for line in lines for row in parse.process(line)
                 for out in ([row] if isinstance(row, beam.pvalue.TaggedOutput)
                             else fn.process(row)))[:2]


def _by_json_batches(job_spec, path):
    """(elements, dead letters, how many rows the vectorised checks took)."""
    fn = io._JsonFileToBatches(job_spec)  # noqa: SLF001 (the DoFn under test)
    fn.setup()
    return tally(fn.process(path))


@pytest.mark.parametrize("transform,fields,time_format", [
    ("count", {"timestamp": "ts", "unit": "user", "key": "region"}, "seconds"),
    ("count", {"timestamp": "ts", "unit": "user", "key": "region"}, "iso"),
    ("sum", {"timestamp": "ts", "unit": "user", "key": "region", "value": "value"}, "seconds"),
])
@pytest.mark.parametrize("seed", range(3))
def test_json_lines_batches_equal_the_row_path(tmp_path, transform, fields, time_format, seed,
                                               monkeypatch):
    """Every line of a fuzzed file (bad JSON, blank lines, BOMs, lone surrogates, CRLF, missing
    and null fields, bools, floats and huge ints for ids, nested values, extra fields), in
    chunks small enough that some chunks hold only good rows: the same elements with the same
    times and the same dead letters as the row path."""
    rng = random.Random(seed)
    lines = _json_lines(rng, 600, fields.values(), time_format == "iso")
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    bounds = {"max_contributions": 3} if transform == "count" else \
        {"max_contributions": 3, "max_value": 5.0}
    spec, _ = job(tmp_path, transform, fields, time_format, bounds=bounds)
    monkeypatch.setattr(io, "JSONL_CHUNK", 7)
    elements, dead, fast = _by_json_batches(spec, str(path))
    assert (elements, dead) == _by_json_rows(spec, [line[:-1] if line.endswith(b"\r")
                                                    else line for line in lines])
    assert sum(elements.values()) > 100 and dead
    assert fast > 10  # the vectorised checks took rows (ISO text too)


@pytest.mark.parametrize("content", [b"", b"\n", b'{"a": 1}', b'{"a": 1}\n\n{"a": 2}\r\n',
                                     b'\r\n\r\n', b'a\rb\nc', b'\xef\xbb\xbf{"a": 1}\n'])
def test_a_files_lines_are_read_text_s(tmp_path, content):
    """`io.text_lines` splits a file as Beam's ReadFromText does (CRLF, a lone CR, no final
    line break, blank lines), plain and gzip-compressed."""
    import gzip
    from apache_beam.testing.util import assert_that, equal_to
    for name, data in (("in.jsonl", content), ("in.jsonl.gz", gzip.compress(content))):
        path = tmp_path / name
        path.write_bytes(data)
        ours = [line for chunk in io.text_lines(str(path), chunk=2) for line in chunk]
        with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
            lines = pipeline | beam.io.ReadFromText(str(path), coder=beam.coders.BytesCoder())
            assert_that(lines, equal_to(ours))


def test_a_json_lines_job_gives_the_records_and_dead_letters_of_the_row_path(tmp_path,
                                                                           monkeypatch):
    """A whole job (pipelines.run) on a fuzzed JSON-lines file, read batched and read row by
    row: the same records and the same dead letters."""
    rng = random.Random(5)
    fields = {"timestamp": "ts", "unit": "user", "key": "region"}
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "in.jsonl").write_bytes(b"\n".join(_json_lines(rng, 500, fields.values())))
    same_job_both_ways(tmp_path, monkeypatch, "*.jsonl", "jsonl", "seconds")
