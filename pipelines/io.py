"""Reading a job's input and writing its outputs, shared by `pipelines.run` and
`pipelines.schedule`.

Rows (JSON lines, CSV or Parquet) become the transform's elements with their event time, the
input columns mapped by `input.fields` and the element shape taken from the transform's registry
row. Rows that cannot be read or mapped become dead letters with a reason. Parquet input is
read as Arrow tables and handed to the transform as `EventBatch`es (`read_parquet_batches`):
the same events and dead letters as row by row, without a Beam element per row.
"""
from __future__ import annotations

import csv
import json
import math
import os
import re
import tempfile

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import TimestampedValue

from pipelines import config as job_config
from transforms import registry
from transforms.sinks import WriteRecordsToCsv, WriteRecordsToJsonLines, WriteRecordsToParquet
from transforms.stages import DEAD_LETTER, dead_letter, dead_letter_record
from transforms.streams.records import is_id
from transforms.validation import fail

SINKS = {"parquet": WriteRecordsToParquet, "jsonl": WriteRecordsToJsonLines,
         "csv": WriteRecordsToCsv}


_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def parse_cell(name: str, kind: str, cell, timestamp_format: str = "iso"):
    """A cell -> its declared type, or a ValidationError "`name` must be ...; got cell.".
    Strict: booleans are not numbers, "1_000" and " 1" are not numbers, NaN and infinities are
    refused, timestamps lie in the years 1 to 9999."""
    if kind == "timestamp":
        seconds = parse_cell(name, "float", cell) if timestamp_format == "seconds" else \
            job_config.parse_time(name, cell)
        if not job_config.TIME_RANGE[0] <= seconds <= job_config.TIME_RANGE[1]:
            fail(name, "a time in the years 1 to 9999", cell)
        return seconds
    if kind == "float":
        number = float(cell) if isinstance(cell, str) and _FLOAT.fullmatch(cell) else cell
        if isinstance(number, bool) or not isinstance(number, (int, float)) or \
                not math.isfinite(number):
            fail(name, "a finite number", cell)
        return float(number)
    if kind == "int":
        number = int(cell) if isinstance(cell, str) and _INT.fullmatch(cell) else cell
        if isinstance(number, bool) or not isinstance(number, int) or abs(number) >= 2 ** 63:
            fail(name, "an integer", cell)
        return number
    if kind == "str":
        if not isinstance(cell, str) or cell == "":
            fail(name, "a non-empty string", cell)
        return cell
    if not is_id(cell) or isinstance(cell, tuple):  # "id": a non-empty str or an int
        fail(name, "a non-empty str or int", cell)
    return cell


class ToElement(beam.DoFn):
    """A row (dict) -> the transform's element with its event time, or a dead letter."""

    def __init__(self, job: job_config.JobConfig):
        self.job = job

    def process(self, row):
        job = self.job
        try:
            if not isinstance(row, dict):
                raise ValueError("a row must be an object with named fields")
            values = {}
            for role, column in job.input.fields.items():
                if column not in row:
                    raise ValueError(f"missing field {column!r}")
                values[role] = parse_cell(column, job.input.type_of(role), row[column],
                                          job.input.timestamp_format)
        except (ValueError, TypeError, OverflowError) as error:
            yield dead_letter(row, f"{error}")
        else:
            seconds = values.pop("timestamp")
            yield TimestampedValue(registry.SPECS[job.transform].element(values), seconds)


def read_elements(pipeline, job: job_config.JobConfig):
    """-> (elements with event times, [dead-letter PCollections]). Parquet input gives
    `EventBatch`es instead (`read_parquet_batches`: Arrow tables, no Beam element per row),
    which every transform takes in place of elements, with the same result."""
    if job.input.format == "parquet":
        return read_parquet_batches(pipeline, job)
    rows, dead = read_rows(pipeline, job)
    elements = rows | "ToElements" >> beam.ParDo(ToElement(job)).with_outputs(
        DEAD_LETTER, main="elements")
    return elements.elements, dead + [elements[DEAD_LETTER]]


def _fast_column(kind: str, column, timestamp_format: str):
    """(rows `parse_cell` accepts for sure, their values as `parse_cell` returns them) for a
    role's Arrow column, or None when the column's type is not one the vectorised checks
    cover (its rows then go through `ToElement` one by one). Timestamps: (mask, seconds)."""
    import numpy as np
    import pyarrow as pa
    from transforms.arrow_input import UNITS_PER_SECOND, id_mask, number_mask
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind_of = column.type
    integer = pa.types.is_integer(kind_of) and not pa.types.is_uint64(kind_of)
    string = pa.types.is_string(kind_of) or pa.types.is_large_string(kind_of)
    if kind in ("id", "int") and integer or kind in ("id", "str") and string:
        return id_mask(column), column  # ints / non-empty strings, not null
    if kind == "float" and (integer or pa.types.is_floating(kind_of)):
        mask = number_mask(column)
        if mask is None:
            return None
        values = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
        return mask, pa.array(values, type=pa.float64())  # float(cell), as parse_cell
    if kind != "timestamp":
        return None
    low, high = job_config.TIME_RANGE
    if pa.types.is_timestamp(kind_of) and timestamp_format == "iso" and \
            kind_of.unit in ("s", "ms", "us"):
        # parse_time: datetime.timestamp() = whole microseconds / 10**6, correctly rounded:
        # the same float as value / units_per_second while the microseconds are exact floats
        whole = column.cast(pa.int64())
        raw = np.asarray(whole.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        exact = np.abs(raw) < (2 ** 53) // {"s": 10 ** 6, "ms": 10 ** 3, "us": 1}[kind_of.unit]
        seconds = raw.astype(np.float64) / UNITS_PER_SECOND[kind_of.unit]
        return exact & id_mask(whole) & (seconds >= low) & (seconds <= high), seconds
    if integer or (pa.types.is_floating(kind_of) and not pa.types.is_float16(kind_of)):
        mask = number_mask(column)  # float(cell) (both formats), then the years 1 to 9999
        seconds = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
        with np.errstate(invalid="ignore"):
            return mask & (seconds >= low) & (seconds <= high), seconds
    return None


class _TableToBatch(beam.DoFn):
    """A Parquet table -> one EventBatch of the rows that pass `ToElement`'s checks
    (vectorised), plus, one by one through `ToElement` itself, every row the vectorised checks
    cannot vouch for: its dead letter (the same reason and record as row by row) or its
    element (in the batch's `extra`)."""

    def __init__(self, job: job_config.JobConfig):
        self.job = job

    def setup(self):
        self.to_element = ToElement(self.job)
        self.spec = registry.SPECS[self.job.transform]

    def process(self, table):
        import numpy as np
        import pyarrow as pa
        from transforms.arrow_input import EventBatch, beam_micros, flat_roles
        if not table.num_rows:
            return
        job = self.job
        names = set(table.column_names)
        ok = np.ones(table.num_rows, dtype=bool)
        values, seconds = {}, None
        for role, column in job.input.fields.items():
            kind = job.input.type_of(role)
            fast = None if column not in names or (role == "timestamp") != (
                kind == "timestamp") else _fast_column(kind, table.column(column),
                                                       job.input.timestamp_format)
            if fast is None:
                ok[:] = False
                break
            ok &= fast[0]
            if role == "timestamp":
                seconds = fast[1]
            else:
                values[role] = fast[1]
        extra = []
        if not ok.all():
            for row in _python_rows(table.filter(pa.array(~ok))):
                if isinstance(row, beam.pvalue.TaggedOutput):
                    yield row
                    continue
                for out in self.to_element.process(row):
                    if isinstance(out, beam.pvalue.TaggedOutput):
                        yield out
                    else:  # valid after all: the element and its Beam event time
                        extra.append((out.value, out.timestamp.micros))
        rows = np.flatnonzero(ok)
        roles = flat_roles(self.spec.shape)
        if len(rows):
            index = pa.array(rows, type=pa.int64())
            columns = {role: values[role].take(index) for role in roles}
            micros = beam_micros(seconds[rows])  # = TimestampedValue(element, seconds)
        else:
            columns, micros = {role: pa.array([]) for role in roles}, np.zeros(0, np.int64)
        if len(micros) or extra:
            yield EventBatch(self.spec.shape, columns, micros, extra)


def _python_rows(table):
    """The table's rows as dicts; a row Arrow cannot convert (a timestamp outside Python's
    years 1-9999) is a dead letter holding its cells as text, never a crash."""
    try:
        rows = table.to_pylist()
    except (ValueError, OverflowError, ArithmeticError):
        rows = None
    if rows is not None:
        yield from rows
        return
    for index in range(table.num_rows):
        row = table.slice(index, 1)
        try:
            yield row.to_pylist()[0]
        except (ValueError, OverflowError, ArithmeticError) as failure:
            cells = {name: str(row.column(name).cast("int64").to_pylist()[0])
                     if str(row.column(name).type).startswith(("timestamp", "date"))
                     else str(row.column(name).to_pylist()[0]) for name in row.column_names}
            yield dead_letter(cells, f"unreadable Parquet row: {str(failure)[:200]}")


def read_parquet_batches(pipeline, job: job_config.JobConfig):
    """Parquet input as Arrow tables -> (EventBatches, [dead letters]): the rows that
    `read_rows` | `ToElement` give, with the same dead letters, without a Beam element per
    row."""
    from transforms.arrow_input import EventBatch
    good, bad = check_parquet_files(job.input.path)
    tables = (pipeline | "ParquetFiles" >> beam.Create(good)
              | "ReadParquet" >> beam.io.ReadAllFromParquetBatched())
    batches = tables | "ToEventBatches" >> beam.ParDo(_TableToBatch(job)).with_outputs(
        DEAD_LETTER, main="batches")
    dead = pipeline | "UnreadableFiles" >> beam.Create(
        [dead_letter_record(path, f"unreadable Parquet file: {why}") for path, why in bad])
    main = batches.batches
    main.element_type = EventBatch  # the transforms take it in place of elements
    return main, [dead, batches[DEAD_LETTER]]


def write_records(records, job: job_config.JobConfig, prefix: str) -> list:
    """-> the written file names of every configured format (PCollections)."""
    return [records | f"Write {fmt}" >> SINKS[fmt](prefix) for fmt in job.output.formats]


def released_stddevs(folder: str) -> list:
    """The `stddev` of every record written under `folder` (public: data-independent), read
    from one format (the others hold the same records)."""
    import pyarrow.parquet as pq
    for fmt in ("parquet", "jsonl", "csv"):
        paths = sorted(m.path for m in FileSystems.match(
            [os.path.join(folder, f"records-*.{fmt}")])[0].metadata_list)
        if not paths:
            continue
        values = []
        for path in paths:
            with FileSystems.open(path) as handle:
                data = handle.read()
            if fmt == "parquet":
                values += pq.read_table(pa_buffer(data), columns=["stddev"]).column(
                    "stddev").to_pylist()
            elif fmt == "jsonl":
                values += [json.loads(line)["stddev"] for line in data.decode().splitlines()
                           if line.strip()]
            else:
                values += [float(row["stddev"]) for row in
                           csv.DictReader(data.decode().splitlines())]
        return values
    return []


def pa_buffer(data: bytes):
    import pyarrow as pa
    return pa.BufferReader(data)


def write_dead_letters(dead_letters, prefix: str):
    """Operator-only (NOT private: raw input records). -> the written file names."""
    return (dead_letters | "AllDeadLetters" >> beam.Flatten()
            | "WriteDeadLetters" >> WriteRecordsToJsonLines(prefix))


def read_rows(pipeline, job: job_config.JobConfig):
    """-> (rows as dicts, [dead letters]). Text is read as bytes and decoded here, so a bad
    line (invalid UTF-8, broken JSON or CSV, a blank line) is one dead letter, never a crash."""
    if job.input.format == "parquet":
        good, bad = check_parquet_files(job.input.path)
        rows = (pipeline | "ParquetFiles" >> beam.Create(good)
                | "ReadParquet" >> beam.io.ReadAllFromParquet())
        dead = pipeline | "UnreadableFiles" >> beam.Create(
            [dead_letter_record(path, f"unreadable Parquet file: {why}") for path, why in bad])
        return rows, [dead]
    lines = pipeline | "ReadText" >> beam.io.ReadFromText(
        job.input.path, skip_header_lines=1 if job.input.format == "csv" else 0,
        coder=beam.coders.BytesCoder())
    if job.input.format == "jsonl":
        parsed = lines | "ParseJson" >> beam.ParDo(_ParseJson()).with_outputs(
            DEAD_LETTER, main="rows")
    else:
        parsed = lines | "ParseCsv" >> beam.ParDo(_ParseCsv(csv_header(job.input.path))
                                                  ).with_outputs(DEAD_LETTER, main="rows")
    return parsed.rows, [parsed[DEAD_LETTER]]


def _decoded(line: bytes) -> str:
    text = line.decode("utf-8")  # raises UnicodeDecodeError (a ValueError)
    text = text[1:] if text.startswith("\ufeff") else text
    if not text.strip():
        raise ValueError("blank line")
    return text


class _ParseJson(beam.DoFn):
    def process(self, line: bytes):
        try:
            row = json.loads(_decoded(line))
            if not isinstance(row, dict):
                raise ValueError("a JSON line must be an object")
        except (ValueError, RecursionError) as error:
            yield dead_letter(line, f"invalid JSON line: {str(error)[:200]}")
        else:
            yield row


class _ParseCsv(beam.DoFn):
    def __init__(self, header):
        self.header = header

    def process(self, line: bytes):
        try:
            values = next(csv.reader([_decoded(line)]))
            if len(values) != len(self.header):
                raise ValueError(f"{len(values)} columns, the header has {len(self.header)}")
        except (ValueError, csv.Error) as error:
            yield dead_letter(line, f"invalid CSV line: {str(error)[:200]}")
        else:
            yield dict(zip(self.header, values))


def input_files(pattern: str):
    """The files the input path matches; a one-line error when none."""
    try:
        match = FileSystems.match([pattern])[0].metadata_list
    except Exception as error:  # noqa: BLE001 (a filesystem's own error: report it in one line)
        job_config.fail("input.path", "a readable path or glob", f"{pattern} ({error})")
    if not match:
        job_config.fail("input.path", "matching at least one file", pattern)
    return sorted(m.path for m in match)


def csv_header(pattern):
    first_file = input_files(pattern)[0]
    with FileSystems.open(first_file) as handle:
        first = handle.readline()
    try:
        header = next(csv.reader([first.decode("utf-8-sig")]), [])
    except (ValueError, csv.Error):
        header = []
    if not header or not all(header):
        job_config.fail("input.path", "CSV files that start with a header line", first_file)
    return header


def check_parquet_files(pattern):
    """(readable files, [(unreadable file, why)]); a one-line error if none is readable."""
    import pyarrow.parquet as pq
    good, bad = [], []
    for path in input_files(pattern):
        try:
            with FileSystems.open(path) as handle:
                pq.ParquetFile(handle).schema_arrow
            good.append(path)
        except Exception as error:  # noqa: BLE001 (any pyarrow failure: the file is unusable)
            bad.append((path, str(error)[:200]))
    if not good:
        job_config.fail("input.path", "at least one readable Parquet file", bad[0][0])
    return good, bad


def preflight(job: job_config.JobConfig, local_runner: bool) -> None:
    """Everything that can be checked before a pipeline starts, each failure a one-line error:
    the input matches readable files, the output folder is writable (local paths), and the
    configured secret resolves (local runners: remote workers resolve their own)."""
    if job.input.format == "csv":
        csv_header(job.input.path)
    elif job.input.format == "parquet":
        check_parquet_files(job.input.path)
    else:
        input_files(job.input.path)
    if "://" not in job.output.path:
        try:
            os.makedirs(job.output.path, exist_ok=True)
            probe = tempfile.NamedTemporaryFile(dir=job.output.path, prefix=".write-check-")
            probe.close()
        except OSError as error:
            job_config.fail("output.path", "a writable folder", f"{job.output.path} "
                                                                f"({error.strerror})")
    if job.secret.configured and local_runner:
        try:
            job.secret.ref().fingerprint()
        except OSError as error:
            job_config.fail("secret.path", "a readable file", f"{job.secret.path} ({error})")
