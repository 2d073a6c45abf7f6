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
import functools
import glob
import json
import math
import os
import re
import tempfile
from typing import List, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from pipelines import config as job_config
from pipelines.csv_input import CsvFileToBatches, ParseCsvFile
from transforms import registry
from transforms.sinks import WriteRecordsToCsv, WriteRecordsToJsonLines, WriteRecordsToParquet
from transforms.messages import DEAD_LETTER, GLOBAL_WINDOWS, dead_letter, dead_letter_record
from transforms.streams.records import (BAD_TEXT, TEXT_CONDITION, Reason, is_id, is_text,
                                       label)
from transforms.validation import BadText, fail, message
from pipelines import gate, remote
from pipelines.arrow_batches import UNIT_ROLES, TableToBatch
from transforms.arrow_input import EventBatch

SINKS = {"parquet": WriteRecordsToParquet, "jsonl": WriteRecordsToJsonLines,
         "csv": WriteRecordsToCsv}


_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def parse_cell(name: str, kind: str, cell, timestamp_format: str = "iso"):
    """A cell -> its declared type, or a ValidationError "`name` must be ...; got cell.".
    Strict: booleans are not numbers, "1_000" and " 1" are not numbers, NaN and infinities are
    refused, timestamps lie in the years 1 to 9999. Text that is not Unicode (a lone surrogate,
    e.g. from the JSON escape "\\ud800") is refused whatever the type (a `BadText`): no coder or
    sink could carry it."""
    if isinstance(cell, str) and not is_text(cell):
        fail(name, TEXT_CONDITION, cell, BadText)
    if kind == "timestamp":
        low, high = job_config.TIME_RANGE
        try:
            seconds = parse_cell(name, "float", cell) if timestamp_format == "seconds" else \
                parse_cell(name, "float", cell) / 1000.0 if timestamp_format == "milliseconds" \
                else job_config.parse_time(name, cell)
        except OverflowError:  # an int beyond the floats
            seconds = math.inf
        if not low <= seconds <= high:
            hint = " (milliseconds? set input.timestamp_format: milliseconds)" if \
                timestamp_format != "milliseconds" and high < seconds <= high * 1000 else ""
            fail(name, "a time in the years 1 to 9999" + hint, cell)
        return seconds
    if kind == "float":
        number = float(cell) if isinstance(cell, str) and _FLOAT.fullmatch(cell) else cell
        if isinstance(number, bool) or not isinstance(number, (int, float)) or \
                not _finite(number):
            fail(name, "a finite number", cell)
        return float(number)
    if kind == "int":
        number = cell
        if isinstance(cell, str) and _INT.fullmatch(cell):
            digits = cell.lstrip("+-").lstrip("0")  # (int() refuses over 4,300 digits)
            if len(digits) <= 19:  # longer: beyond 2^63, refused below
                number = -int(digits or "0") if cell.startswith("-") else int(digits or "0")
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


def _finite(number) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an int beyond the floats
        return False


# Which person a unit id names must not depend on the file format: an id declared "id" (str or
# int) that is an integer is read as its decimal text, so "7" in CSV and 7 in JSON lines or an
# integer Parquet column are one unit. Bound to the release (`input_binding`): a release started
# under another rule is refused, since its saved unit states would not join the new ids.
UNIT_IDS = "unit-ids/1: an integer id declared `id` is its decimal text"


def canonical_unit(value):
    """A unit id declared `id` as the release keys it (see UNIT_IDS)."""
    return str(value) if type(value) is int else value


def input_binding(job: job_config.JobConfig) -> dict:
    """Everything about reading the input that decides what a unit or a key is: the format,
    the field map, every role's declared type (defaults resolved), the timestamp format and the
    id rule. Part of a release's ledger (`checkpoints.fingerprint`): changing it is refused."""
    source = job.input
    return {"format": source.format, "fields": dict(source.fields),
            "types": {role: source.type_of(role) for role in sorted(source.fields)},
            "timestamp_format": source.timestamp_format, "ids": UNIT_IDS}


class ToElement(beam.DoFn):
    """A row (dict) -> the transform's element with its event time, or a dead letter."""

    def __init__(self, job: job_config.JobConfig):
        self.job = job

    def process(self, row):
        job = self.job
        code = "invalid_record"  # the code of the part being read when an error is raised
        try:
            if not isinstance(row, dict):
                raise ValueError("a row must be an object with named fields")
            values = {}
            for role, column in job.input.fields.items():
                if column not in row:
                    code = "missing_field"
                    raise ValueError(f"missing field {column!r}")
                kind = job.input.type_of(role)
                code = "bad_timestamp" if role == "timestamp" else "bad_value"
                values[role] = parse_cell(column, kind, row[column], job.input.timestamp_format)
                if kind == "id" and role in UNIT_ROLES:
                    values[role] = canonical_unit(values[role])
        except BadText as error:
            yield self._dead(row, Reason(BAD_TEXT, f"{BAD_TEXT}: {error}"))
        except (ValueError, TypeError, ArithmeticError, RecursionError) as error:
            yield self._dead(row, Reason(code, f"{error}"))
        else:
            seconds = values.pop("timestamp")
            # = TimestampedValue(element, seconds) in the global window, where every reader's
            # rows are: Beam would assign the window per element (a new GlobalWindow each)
            yield WindowedValue(registry.SPECS[job.transform].element(values),
                                Timestamp.of(seconds), GLOBAL_WINDOWS)


    def _dead(self, row, reason):
        """The row's dead letter, with its unit (`gate.unit_of`) when the unit's fields can
        be read: the input gate counts a malformed record as its unit's."""
        letter = dead_letter_record(row, reason)
        unit = row_unit(self.job, row)
        if unit is not None:
            letter["unit"] = unit
        return beam.pvalue.TaggedOutput(DEAD_LETTER, letter)


def row_unit(job: job_config.JobConfig, row):
    """The gate's unit of a row (`gate.unit_of`), or None when the row names none readably."""
    if not isinstance(row, dict):
        return None
    values = {}
    for role in gate.UNIT_ROLES.get(job.transform, ()):
        column = job.input.fields.get(role)
        if column is None or column not in row:
            return None
        try:
            value = parse_cell(column, job.input.type_of(role), row[column],
                               job.input.timestamp_format)
        except Exception:  # noqa: BLE001 (an unreadable unit: the line is nobody's)
            return None
        # as `ToElement` keys it (one rule: a well-formed and a malformed record of one unit
        # are one gate unit)
        values[role] = canonical_unit(value) if job.input.type_of(role) == "id" and \
            role in UNIT_ROLES else value
    return gate.unit_of(job.transform, values)


def read_elements(pipeline, job: job_config.JobConfig):
    """-> (`EventBatch`es, [dead-letter PCollections]): Arrow tables, no Beam element per row
    (`read_parquet_batches`, `read_jsonl_batches`, `read_csv_batches`), which every transform
    takes in place of timestamped elements, with the same result as `read_rows` | `ToElement`
    (one element per row; tested)."""
    check_bounded_options((), job)
    if job.input.format == "parquet":
        return read_parquet_batches(pipeline, job)
    if job.input.format == "jsonl":
        return read_jsonl_batches(pipeline, job)
    return read_csv_batches(pipeline, job)


def read_csv_batches(pipeline, job: job_config.JobConfig):
    """CSV -> (EventBatches, [dead letters]): what `read_rows` | `ToElement` give, without a
    Beam element per row (a file is read by one worker from its start; files in parallel)."""
    path, folder = job.input.path, job.input.config_folder
    return _file_batches(pipeline, job, "CsvFiles", CsvFileToBatches(
        job, csv_header(path, folder), ToElement(job), functools.partial(row_unit, job)))


def _file_batches(pipeline, job: job_config.JobConfig, label: str, to_batches: beam.DoFn):
    """The input's files, each read by `to_batches` (a path -> EventBatches and dead letters)
    -> (EventBatches, [dead letters])."""
    files = pipeline | label >> beam.Create(input_files(job.input.path,
                                                        job.input.config_folder))
    batches = files | "ToEventBatches" >> beam.ParDo(to_batches).with_outputs(
        DEAD_LETTER, main="batches")
    main = batches.batches
    main.element_type = EventBatch  # the transforms take it in place of elements
    return main, [batches[DEAD_LETTER]]


def unreadable_file(path: str, why) -> dict:
    """The one dead letter of a Parquet file that cannot be read: it stands for an unknown
    number of rows (weight None; the input gate refuses it unless told to accept anything)."""
    return dead_letter_record(path, Reason("unparseable", f"unreadable Parquet file: {why}"),
                              weight=None)


def read_parquet_batches(pipeline, job: job_config.JobConfig):
    """Parquet input as Arrow tables -> (EventBatches, [dead letters]): the rows that
    `read_rows` | `ToElement` give, with the same dead letters, without a Beam element per
    row."""
    good, bad = check_parquet_files(job.input.path, job.input.config_folder)
    tables = (pipeline | "ParquetFiles" >> beam.Create(good)
              | "ReadParquet" >> beam.io.ReadAllFromParquetBatched())
    batches = tables | "ToEventBatches" >> beam.ParDo(
        TableToBatch(job, ToElement(job))).with_outputs(
        DEAD_LETTER, main="batches")
    dead = pipeline | "UnreadableFiles" >> beam.Create(
        [unreadable_file(path, why) for path, why in bad])
    main = batches.batches
    main.element_type = EventBatch  # the transforms take it in place of elements
    return main, [dead, batches[DEAD_LETTER]]


def write_records(records, job: job_config.JobConfig, prefix: str) -> list:
    """-> the written file names of every configured format (PCollections)."""
    return [records | f"Write {fmt}" >> SINKS[fmt](prefix) for fmt in job.output.formats]


def released_columns(folder: str, kinds: dict, prefix: str = "records") -> dict:
    """{name: column} of every record written under `folder` (files `prefix`-*) for each name
    of `kinds` (public: the records are), read once from one format (the others hold the same
    records); CSV cells through the name's kind."""
    import pyarrow.parquet as pq
    names = list(kinds)
    for fmt in ("parquet", "jsonl", "csv"):
        paths = sorted(m.path for m in FileSystems.match(
            [os.path.join(folder, f"{prefix}-*.{fmt}")])[0].metadata_list)
        if not paths:
            continue
        columns = {name: [] for name in names}
        for path in paths:
            with FileSystems.open(path) as handle:
                data = handle.read()
            if fmt == "parquet":
                table = pq.read_table(pa_buffer(data), columns=names)
                for name in names:
                    columns[name] += table.column(name).to_pylist()
            elif fmt == "jsonl":
                for line in data.decode().splitlines():
                    if line.strip():
                        row = json.loads(line)
                        for name in names:
                            columns[name].append(row[name])
            else:
                for row in csv.DictReader(data.decode().splitlines()):
                    for name in names:
                        columns[name].append(kinds[name](row[name]))
        return columns
    return {name: [] for name in names}


def pa_buffer(data: bytes):
    import pyarrow as pa
    return pa.BufferReader(data)


def write_dead_letters(dead_letters, prefix: str):
    """Operator-only (NOT private: raw input records). -> the written file names."""
    return (dead_letters | "AllDeadLetters" >> beam.Flatten()
            | "WriteDeadLetters" >> WriteRecordsToJsonLines(prefix))


JSONL_CHUNK = 1 << 16  # lines parsed into one Arrow table


def text_lines(path: str, chunk: int = None):
    """A text file's records in chunks of at most `chunk`, as `ReadFromText` splits them: at
    b"\n" (a b"\r" before it is part of the separator), the last one without a separator
    kept, none after a final separator; compressed files by their extension."""
    lines, rest, chunk = [], b"", chunk or JSONL_CHUNK
    with FileSystems.open(path) as handle:  # (compression detected from the name)
        while True:
            block = handle.read(1 << 22)
            if not block:
                break
            parts = (rest + block).split(b"\n")
            rest = parts.pop()
            for line in parts:
                lines.append(line[:-1] if line.endswith(b"\r") else line)
                if len(lines) >= chunk:
                    yield lines
                    lines = []
    if rest:
        lines.append(rest)
    if lines:
        yield lines


def _column(values: list, kind: str):
    """An Arrow column of one mapped field's parsed JSON values, or None when their Python
    types are not one Arrow type holds as the row path reads them (then every row of the
    chunk takes the row path): ints, strs, or numbers (for numbers and times: an int as
    float(int))."""
    import pyarrow as pa
    kinds = {type(v) for v in values if v is not None}
    if kinds <= {int}:
        return pa.array(values, type=pa.int64())
    if kinds <= {str}:
        return pa.array(values, type=pa.string())
    if kinds <= {int, float} and kind in ("float", "timestamp"):
        return pa.array([float(v) if type(v) is int else v for v in values],
                        type=pa.float64())
    return None


class _JsonFileToBatches(beam.DoFn):
    """A JSON-lines file -> its lines' dead letters (`ParseJson`, the row path's rule) and,
    per chunk of lines, one EventBatch (`TableToBatch`) of its rows: the mapped fields as Arrow
    columns, vectorised where their types allow, every other row through `ToElement` as
    parsed (the same elements, times and dead letters as `read_rows` | `ToElement`)."""

    def __init__(self, job: job_config.JobConfig):
        self.job = job

    def setup(self):
        self.parse = ParseJson()
        self.batches = TableToBatch(self.job, ToElement(self.job))
        self.batches.setup()

    def process(self, path: str):
        import pyarrow as pa
        fields = self.job.input.fields
        for lines in text_lines(path):
            rows = []
            for line in lines:
                for out in self.parse.process(line):
                    if isinstance(out, beam.pvalue.TaggedOutput):
                        yield out
                    else:
                        rows.append(out)
            if not rows:
                continue
            columns = {}
            for role, name in fields.items():
                try:
                    column = _column([row.get(name) for row in rows],
                                     self.job.input.type_of(role))
                except (OverflowError, pa.ArrowException):
                    column = None
                if column is None:  # every row of the chunk by the row path
                    columns = {name: pa.nulls(len(rows)) for name in fields.values()}
                    break
                columns[name] = column
            yield from self.batches.process(pa.table(columns), rows)


def read_jsonl_batches(pipeline, job: job_config.JobConfig):
    """JSON lines -> (EventBatches, [dead letters]): what `read_rows` | `ToElement` give,
    without a Beam element per line (a file is read by one worker; files in parallel)."""
    return _file_batches(pipeline, job, "JsonFiles", _JsonFileToBatches(job))


def read_rows(pipeline, job: job_config.JobConfig):
    """-> (rows as dicts, [dead letters]). Text is read as bytes and decoded here, so a bad
    record (invalid UTF-8, text that is not Unicode, broken JSON or CSV, a blank line) is one
    dead letter, never a crash. JSON lines: one record per line (the lines of a file are read in
    parallel). CSV: the records of a file, read by one worker (files in parallel), so that a
    quoted cell may hold line breaks (RFC 4180): a record is one or more lines."""
    if job.input.format == "parquet":
        good, bad = check_parquet_files(job.input.path, job.input.config_folder)
        rows = (pipeline | "ParquetFiles" >> beam.Create(good)
                | "ReadParquet" >> beam.io.ReadAllFromParquet())
        dead = pipeline | "UnreadableFiles" >> beam.Create(
            [unreadable_file(path, why) for path, why in bad])
        return rows, [dead]
    if job.input.format == "jsonl":
        lines = pipeline | "ReadText" >> beam.io.ReadFromText(
            job.input.path, coder=beam.coders.BytesCoder())
        parsed = lines | "ParseJson" >> beam.ParDo(ParseJson()).with_outputs(
            DEAD_LETTER, main="rows")
    else:
        path, folder = job.input.path, job.input.config_folder
        files = pipeline | "CsvFiles" >> beam.Create(input_files(path, folder))
        parsed = files | "ParseCsv" >> beam.ParDo(ParseCsvFile(csv_header(path, folder),
                                                               functools.partial(row_unit, job))
                                                  ).with_outputs(DEAD_LETTER, main="rows")
    return parsed.rows, [parsed[DEAD_LETTER]]


def _decoded(line: bytes) -> str:
    text = line.decode("utf-8")  # raises UnicodeDecodeError (a ValueError)
    text = text[1:] if text.startswith("\ufeff") else text
    if not text.strip():
        raise ValueError("blank line")
    return text


def _not_text(row: dict):
    """(field, text) for the first str of a JSON row that is not Unicode text (`is_text`), at
    any depth, field names included; None when every str is text."""
    for name, value in row.items():
        if not is_text(name):
            return "field name", name
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                if not is_text(item):
                    return name, item
            elif isinstance(item, list):
                stack.extend(item)
            elif isinstance(item, dict):
                for inner, part in item.items():
                    if not is_text(inner):
                        return name, inner
                    stack.append(part)
    return None


LONG_BAD_LINE = 1 << 16  # bytes: a bad JSON line this long may hide records run together,
RUN_TOGETHER = re.compile(rb"\}\s*\{")  # as many as it has objects run together ("}{")


class ParseJson(beam.DoFn):
    """A JSON line (bytes) -> its object (a dict), or a dead letter."""

    def process(self, line: bytes):
        row = None
        try:
            text = _decoded(line)
            row = json.loads(text)
            if not isinstance(row, dict):
                raise ValueError("a JSON line must be an object")
        except (ValueError, RecursionError) as error:
            # a JSON array on one line (a JSON file, not JSON lines) stands for its items; a
            # bad line longer than any record (records run together, CR line ends) for an
            # unknown number (the input gate refuses it unless told to accept anything)
            items = len(row) if isinstance(row, list) else 1
            weight = max(items, 1, len(RUN_TOGETHER.findall(line)) + 1
                         if len(line) > LONG_BAD_LINE else 1)
            yield dead_letter(line, Reason("unparseable",
                                          f"invalid JSON line: {str(error)[:200]}"),
                              weight=weight)
            return
        # escapes such as "\\ud800" decode to lone surrogates: no UTF-8 encoding exists, so
        # no coder or sink could carry the row (the line's raw bytes are valid UTF-8 here)
        found = _not_text(row) if "\\u" in text else None
        if found is not None:
            detail = message(found[0], TEXT_CONDITION, found[1])
            yield dead_letter(line, Reason(BAD_TEXT, f"{BAD_TEXT}: {detail}"))
        else:
            yield row


def input_files(pattern: str, config_folder: Optional[str] = None):
    """The files the input path matches; a one-line error when none (for a relative path: the
    folder it was read from, and the path from here when the config's folder has it)."""
    try:
        match = FileSystems.match([pattern])[0].metadata_list
    except Exception as error:  # noqa: BLE001 (a filesystem's own error: report it in one line)
        job_config.fail("input.path", "a readable path or glob", f"{pattern} ({error})")
    if not match:
        where = ""
        if "://" not in pattern and not os.path.isabs(pattern):
            where = f" (a relative path is read from the current folder, {os.getcwd()})"
            beside = os.path.join(config_folder or "", pattern)
            if config_folder and "://" not in config_folder and glob.glob(beside):
                where = (f" from the current folder (the config's folder has it: give "
                         f"{os.path.relpath(beside)!r})")
        job_config.fail("input.path", "matching at least one file" + where, pattern)
    return sorted(m.path for m in match)


# the first bytes of files that are not text: gzip (read as text unless named .gz), Parquet,
# zip, bzip2, xz, zstd
BINARY_MAGIC = (b"\x1f\x8b", b"PAR1", b"PK\x03\x04", b"BZh", b"\xfd7zXZ", b"\x28\xb5\x2f\xfd")
COMPRESSED_SUFFIXES = (".gz", ".gzip", ".bz2", ".zst", ".zstd", ".deflate", ".lzma", ".xz",
                       ".snappy", ".zip")


def check_text_files(pattern, config_folder=None) -> None:
    """JSON lines and CSV inputs are text (or compressed by their name, which Beam reads
    through): a file that starts as binary data (compressed without its suffix, a Parquet
    file in a text glob) would be read as a few garbage lines that hide all its records, so
    it is a one-line error."""
    for path in input_files(pattern, config_folder):
        if path.lower().endswith(COMPRESSED_SUFFIXES):
            continue
        with FileSystems.open(path) as handle:
            head = handle.read(4096)
        if head.startswith(BINARY_MAGIC):  # (a NUL byte may be a record's: read as one)
            job_config.fail("input.path", "text files (JSON lines or CSV; a compressed file "
                                          "needs its suffix, e.g. .gz)", path)


def csv_header(pattern, config_folder=None):
    """The header every CSV file of `pattern` starts with (its files are read by the first
    one's header): a file without one, or with another, is a one-line error."""
    headers = {}
    for path in input_files(pattern, config_folder):
        with FileSystems.open(path) as handle:
            first = handle.readline()
        try:
            header = next(csv.reader([first.decode("utf-8-sig")]), [])
        except (ValueError, csv.Error):
            header = []
        if not header or not all(header):
            job_config.fail("input.path", "CSV files that start with a header line", path)
        headers.setdefault(tuple(header), path)
        if len(headers) > 1:
            job_config.fail("input.path", "CSV files with one header (their columns are read "
                                          "by the first file's names)", path)
    return list(next(iter(headers)))


def read_failure(error: Exception, job: job_config.JobConfig):
    """The one line of a Parquet file that failed while its rows were read (its schema read
    fine at preflight: a corrupt page), or None for any other error. The job wrote nothing
    public: it fails before its commit."""
    text = str(error)
    if job.input.format != "parquet" or "[while running 'ReadParquet" not in text:
        return None
    first = text.strip().splitlines()[-1] if text.strip() else type(error).__name__
    first = first.split(" [while running")[0][:200]
    return message("input.path", "Parquet files whose every page reads (nothing was published)",
                   f"{job.input.path}: {first}")


def check_parquet_files(pattern, config_folder=None):
    """(readable files, [(unreadable file, why)]); a one-line error if none is readable."""
    import pyarrow.parquet as pq
    good, bad = [], []
    for path in input_files(pattern, config_folder):
        try:
            with FileSystems.open(path) as handle:
                pq.ParquetFile(handle).schema_arrow
            good.append(path)
        except Exception as error:  # noqa: BLE001 (any pyarrow failure: the file is unusable)
            bad.append((path, str(error)[:200]))
    if not good:
        job_config.fail("input.path", "at least one readable Parquet file", bad[0][0])
    return good, bad


def parquet_columns(paths) -> List[str]:
    """The column names of the Parquet files (their schemas: no data), in first-seen order."""
    import pyarrow.parquet as pq
    names = {}
    for path in paths:
        with FileSystems.open(path) as handle:
            names.update(dict.fromkeys(pq.ParquetFile(handle).schema_arrow.names))
    return list(names)


def check_columns(job: job_config.JobConfig, columns) -> None:
    """Every configured field is a column of the input's schema (a CSV header, Parquet
    schemas: no person's data), else a one-line error before the job runs or spends
    anything (a misspelled field would make every record a dead letter)."""
    fields = job.input.fields
    if not any(column in columns for column in fields.values()):  # (its cells are not shown)
        role = next(iter(fields))
        job_config.fail(f"input.fields.{role}", "a column of the input (none of input.fields "
                                                "is: is the first line a header?)", fields[role])
    for role, column in fields.items():
        if column not in columns:
            job_config.fail(f"input.fields.{role}", f"a column of the input "
                                                    f"({_names(columns)})", column)


def _names(columns, most: int = 8) -> str:
    """Column names for a one-line message: at most `most`, each a `records.label`."""
    return ", ".join(label(name) for name in list(columns)[:most]) \
        + (", ..." if len(columns) > most else "")


def check_bounded_options(beam_args, job: job_config.JobConfig = None) -> None:
    """A batch driver's input is files, a bounded source: it runs as one batch release.
    `--streaming` with it would silently run as batch, and a subscription is read by the
    streaming job only; both refused."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    if job is not None and job.input.unbounded:
        fail("input.kind", "'files' for a batch or scheduled job (a Pub/Sub subscription or a "
                           "Kafka topic is read by the streaming job: python3 -m pipelines.run)",
             job.input.kind)
    if PipelineOptions(list(beam_args)).view_as(StandardOptions).streaming:
        fail("--streaming", "left out for file input (files are a bounded source: the job is "
                            "one batch release of them; a streaming job needs an unbounded "
                            "source, see docs/operations.md#streaming)", "--streaming")


def preflight(job: job_config.JobConfig, local_runner: bool, runner: str = None) -> None:
    """Everything that can be checked before a pipeline starts, each failure a one-line error:
    the input matches readable files, the output folder is writable (local paths), and the
    configured secret resolves (local runners: remote workers resolve their own); a remote
    `runner` first passes `remote.preflight`."""
    if not local_runner:
        remote.preflight(job, runner or "the remote runner")
    if job.input.unbounded:
        pass  # a subscription: checked before the job is charged (`remote.pubsub_reachable`)
    elif job.input.format == "parquet":
        good, _ = check_parquet_files(job.input.path, job.input.config_folder)
        check_columns(job, parquet_columns(good))
    else:
        check_text_files(job.input.path, job.input.config_folder)
        if job.input.format == "csv":
            check_columns(job, csv_header(job.input.path, job.input.config_folder))
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
    elif job.secret.configured:  # remote workers resolve it: a short one set here is refused
        job.secret.ref().check_early()
