"""CSV read as batches (`csv_input.CsvFileToBatches`) gives what the row path gives
(`ParseCsvFile` | `io.ToElement`): the same elements with the same event times and the same dead
letters; and `csv_records`' one-line shortcut (`_simple_row`) reads records as its csv reader
does."""
from __future__ import annotations

import csv
import io as bytes_io
import random

import apache_beam as beam
import pytest

from pipelines import csv_input
from pipelines import io
from tests.test_io_batches import same_job_both_ways, job, tally

HEADER = ["ts", "user", "region", "value"]


def _cell(rng, name, time_format):
    moment = 1767571200 + rng.randrange(-3600, 7 * 3600)
    good = {"ts": f"2026-01-05T{rng.randrange(24):02d}:{rng.randrange(60):02d}:00Z"
            if time_format == "iso" else rng.choice([str(moment), f"{moment}.25"]),
            "user": rng.choice(["u1", "u2", "7", "007"]),
            "region": rng.choice(["a", "b", "c", "d"]),
            "value": rng.choice(["1", "2.5", "0", "7", "+3", "1e0"])}[name]
    bad = rng.choice(["", " ", "x", "1.5.", "nan", "2026-13-01T00:00:00Z", "1e999", "-1",
                      "tab\there", "quote\"d", "line\nbreak", "comma,inside", "\x00", "é"])
    return good if rng.random() < 0.95 else bad


def _csv_file(rng, n, time_format):
    """A header and n records, written by the csv module (so quoting where a cell needs it),
    with raw bad lines mixed in: wrong column counts, blank lines, bad UTF-8, stray quotes,
    CRs, NULs, a cell over the csv module's field limit."""
    out = bytes_io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(HEADER)
    lines = [out.getvalue().encode()]
    for _ in range(n):
        roll = rng.random()
        if roll < 0.04:
            lines.append(rng.choice([b"\n", b"   \n", b"a,b\n", b"a,b,c,d,e\n", b"\xff,\xfe,x,1\n",
                                     b'"open,b,c,d\n', b"a\rb,c,d,1\n", b"a,b\x00,c,1\n",
                                     b'x,"y"z,c,1\n', b"u,v,w,1\r\n",
                                     b"u,v," + b"w" * 140_000 + b",1\n"]))  # (field limit)
            continue
        out = bytes_io.StringIO()
        csv.writer(out, lineterminator=rng.choice(["\n", "\r\n"])).writerow(
            [_cell(rng, name, time_format) for name in HEADER])
        lines.append(out.getvalue().encode())
    if rng.random() < 0.5:
        lines[-1] = lines[-1].rstrip(b"\r\n")  # no line break after the last record
    return b"".join(lines)


def _by_rows(job_spec, path):
    parse = csv_input.ParseCsvFile(HEADER)
    fn = io.ToElement(job_spec)
    return tally(out for row in parse.process(path)
                 for out in ([row] if isinstance(row, beam.pvalue.TaggedOutput)
                             else fn.process(row)))[:2]


def _by_batches(job_spec, path):
    fn = csv_input.CsvFileToBatches(job_spec, HEADER, io.ToElement(job_spec))
    fn.setup()
    return tally(fn.process(path))


@pytest.mark.parametrize("transform,time_format", [("count", "seconds"), ("count", "iso"),
                                                   ("sum", "iso"), ("sum", "milliseconds")])
@pytest.mark.parametrize("seed", range(3))
def test_csv_batches_equal_the_row_path(tmp_path, transform, time_format, seed, monkeypatch):
    """Every record of a fuzzed file, in chunks small enough that some hold only good rows: the
    same elements with the same times and the same dead letters as row by row, and most rows
    taken by the vectorised checks."""
    rng = random.Random(seed)
    path = tmp_path / "in.csv"
    path.write_bytes(_csv_file(rng, 600, time_format))
    fields = {"timestamp": "ts", "unit": "user", "key": "region"}
    bounds = {"max_contributions": 3}
    if transform == "sum":
        fields["value"] = "value"
        bounds["max_value"] = 5.0
    spec, _ = job(tmp_path, transform, fields, time_format, bounds=bounds,
                  keys=("a", "b", "c", "x"))
    monkeypatch.setattr(csv_input, "CSV_CHUNK", 7)
    elements, dead, fast = _by_batches(spec, str(path))
    assert (elements, dead) == _by_rows(spec, str(path))
    assert sum(elements.values()) > 300 and len(dead) > 20
    assert fast > 300  # the vectorised checks took the good rows


@pytest.mark.parametrize("seed", range(20))
def test_the_one_line_shortcut_reads_records_as_the_csv_reader(seed, monkeypatch):
    """`csv_records` with and without `_simple_row`: the same rows and dead letters, in order,
    on files of quoted cells over several lines, stray quotes and every bad line above."""
    rng = random.Random(1000 + seed)
    data = _csv_file(rng, 300, rng.choice(["iso", "seconds"]))
    if rng.random() < 0.5:  # a quoted cell left open swallows lines (read again on their own)
        at = rng.randrange(len(data))
        data = data[:at] + b'"' + data[at:]

    def records():
        lines = iter(bytes_io.BytesIO(data).readline, b"")
        return [getattr(out, "value", out) for out in csv_input.csv_records(lines, HEADER)]

    fast = records()
    monkeypatch.setattr(csv_input, "_simple_row", lambda line, header: None)
    assert fast == records()


def test_a_csv_job_gives_the_records_and_dead_letters_of_the_row_path(tmp_path, monkeypatch):
    """A whole job (pipelines.run) on a fuzzed CSV file, read batched and read row by row: the
    same records and the same dead letters."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "in.csv").write_bytes(_csv_file(random.Random(5), 500, "iso"))
    same_job_both_ways(tmp_path, monkeypatch, "*.csv", "csv", "iso")


def test_rows_of_a_header_without_the_mapped_columns_are_dead_letters_not_lost(tmp_path):
    """A header holding none of the mapped columns (the job's preflight refuses it; the DoFn
    alone must not lose rows): each row is the row path's dead letter."""
    path = tmp_path / "in.csv"
    path.write_bytes(b"a,b\n1,2\n3,4\n")
    spec, _ = job(tmp_path, "count", {"timestamp": "ts", "unit": "user", "key": "region"})
    fn = csv_input.CsvFileToBatches(spec, ["a", "b"], io.ToElement(spec))
    fn.setup()
    elements, dead, _ = tally(fn.process(str(path)))
    assert not elements and len(dead) == 2 and all("missing_field" in d for d in dead)
