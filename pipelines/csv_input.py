"""CSV input: a file's physical lines -> rows (dicts by the header's names) or dead letters.

One worker reads a file from its start, record by record, so a quoted cell may hold line
breaks (a record is one or more lines); a stray quote never hides the records after it
(`csv_records`). `pipelines.io.read_rows` reads CSV through `ParseCsvFile` (a Beam element per
row); jobs read it through `CsvFileToBatches` (an Arrow table per chunk of rows, the mapped
cells parsed column by column: `pipelines.text_cells`).
"""
from __future__ import annotations

import csv
import re

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from pipelines import config as job_config
from pipelines.arrow_batches import TableToBatch
from transforms.messages import DEAD_LETTER, dead_letter, dead_letter_record
from transforms.streams.records import Reason


class ParseCsvFile(beam.DoFn):
    """A CSV file (its path) -> a row per record after the header record (a dict by the
    header's names) or a dead letter (`csv_records`). One worker reads the file from its start,
    record by record, so a quoted cell may hold line breaks (a record is one or more lines)."""

    def __init__(self, header, unit_of_row=None):
        self.header, self.unit_of_row = header, unit_of_row  # (row dict -> the gate's unit)

    def process(self, path: str):
        with FileSystems.open(path) as handle:
            yield from csv_records(iter(handle.readline, b""), self.header, self.unit_of_row)


class CsvFileToBatches(beam.DoFn):
    """A CSV file (its path) -> its records' dead letters (`csv_records`) and, per chunk of
    rows, one EventBatch (`arrow_batches.TableToBatch`) of the mapped columns as Arrow text: the
    same elements, times and dead letters as `ParseCsvFile` | `io.ToElement` (tested)."""

    def __init__(self, job: job_config.JobConfig, header, to_element, unit_of_row=None):
        self.job, self.header = job, header
        self.to_element, self.unit_of_row = to_element, unit_of_row

    def setup(self):
        self.batches = TableToBatch(self.job, self.to_element)
        self.batches.setup()
        names = set(self.job.input.fields.values())
        self.mapped = [name for name in self.header if name in names]

    def process(self, path: str):
        rows = []
        with FileSystems.open(path) as handle:
            for out in csv_records(iter(handle.readline, b""), self.header, self.unit_of_row):
                if isinstance(out, beam.pvalue.TaggedOutput):
                    yield out
                    continue
                rows.append(out)
                if len(rows) >= CSV_CHUNK:
                    yield from self._batch(rows)
                    rows = []
        if rows:
            yield from self._batch(rows)

    def _batch(self, rows):
        if not self.mapped:  # (a table of no column has no rows) each row's own dead letter
            return (out for row in rows for out in self.to_element.process(row))
        table = pa.table({name: pa.array([row[name] for row in rows], type=pa.string())
                          for name in self.mapped})
        return self.batches.process(table, rows)


CSV_CHUNK = 1 << 16  # rows parsed into one Arrow table
CSV_RECORD_BYTES = 1 << 20  # a longer CSV record is one dead letter (its lines read to its end)
_CSV_SPECIAL = re.compile(r'[",]')
_START, _UNQUOTED, _QUOTED, _QUOTE_IN_QUOTED = range(4)


def _quoted_after(text: str, quoted: bool) -> bool:
    """Whether a CSV record is inside a quoted cell after the physical line `text`, given whether
    it was before it: the csv module's rules (a quote opens a cell only at its start, "" in a
    quoted cell is a quote, other text after a closing quote joins the cell). Only quotes and
    commas change the state, so the scan jumps from one to the next."""
    if '"' not in text:
        return quoted
    state, position = (_QUOTED if quoted else _START), 0
    for match in _CSV_SPECIAL.finditer(text):
        at = match.start()
        if at > position and state in (_START, _QUOTE_IN_QUOTED):
            state = _UNQUOTED  # other characters first: an unquoted cell
        quote = text[at] == '"'
        if state == _START:
            state = _QUOTED if quote else _START
        elif state == _UNQUOTED:
            state = _UNQUOTED if quote else _START
        elif state == _QUOTED:
            state = _QUOTE_IN_QUOTED if quote else _QUOTED
        else:
            state = _QUOTED if quote else _START
        position = at + 1
    return state == _QUOTED


def csv_records(lines, header, unit_of_row=None, with_header: bool = True):
    """A CSV file's physical lines (bytes, with their line ends) -> a row (dict by `header`) or
    a dead letter per record after the first (the header). A record is one or more lines (a
    quoted cell may hold line breaks); its dead letter holds its bytes. Invalid UTF-8, a blank
    record, a csv error or a column count other than the header's: one dead letter per record,
    never a crash. A record of several lines that fails (a quote opened and never closed, or
    closed lines later: a cell over 1 MiB) is one dead letter for its first line only, and the
    lines after it are read again as records of their own: one record's stray quote never
    hides the records after it. `unit_of_row` (a row dict -> the gate's unit or None) names the
    unit of a bad record from its first line's cells (`pipelines.gate`)."""
    pending = []  # lines read again after a failed record of several lines
    source = iter(lines)

    def next_line():
        return pending.pop() if pending else next(source, None)

    first = with_header
    raw, texts, size, quoted, undecodable = [], [], 0, False, None
    while True:
        line = next_line()
        if line is None and not raw:
            return
        simple = None if raw or first or line is None else _simple_row(line, header)
        if simple is not None:
            yield simple
            continue
        if line is not None:
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as error:
                undecodable = undecodable or error
                text = line.decode("utf-8", "surrogateescape")  # its quotes still count
            size += len(line)
            raw.append(line)
            texts.append(text)
            quoted = _quoted_after(text, quoted)
            if quoted and size <= CSV_RECORD_BYTES:
                continue  # a quoted cell goes on in the next line
        problem = None
        if quoted:
            problem = "a quoted cell is still open at the end of the file" if line is None \
                else "a quoted cell over 1 MiB (not closed?)"
        letter = None if first else _csv_record(raw, texts, size, undecodable, header, problem)
        failed = quoted or isinstance(letter, beam.pvalue.TaggedOutput)
        if len(raw) > 1 and failed and (first or _holds_records(raw[1:], header)):
            # a stray quote swallowed records: its first line alone; the others again
            if not first:
                yield _first_line_letter(raw[0], texts[0], header, unit_of_row)
            pending.extend(reversed(raw[1:]))
        elif letter is not None:
            yield letter
        first = False
        raw, texts, size, quoted, undecodable = [], [], 0, False, None


def _simple_row(line: bytes, header):
    """The row of a record that is one physical line with no quote, CR (but its line end) or
    NUL, UTF-8, not blank, of the header's column count, shorter than the csv module's field
    limit: what the loop below makes of it (its cells are the text between commas), without a
    csv reader per record; else None (the loop reads it)."""
    if b'"' in line or b"\x00" in line or len(line) > min(CSV_RECORD_BYTES,
                                                         csv.field_size_limit()):
        return None
    body = line[:-1] if line.endswith(b"\n") else line
    body = body[:-1] if body.endswith(b"\r") else body
    if b"\r" in body or body.count(b",") != len(header) - 1:
        return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return dict(zip(header, text.split(","))) if text.strip() else None


def _holds_records(lines, header) -> bool:
    """Whether the lines after a failed record's first line, read on their own, hold a
    well-formed record (then a stray quote swallowed them; else the record is one bad record
    whose cells span lines)."""
    return any(isinstance(out, dict)
               for out in csv_records(iter(lines), header, with_header=False))


def _first_line_letter(line: bytes, text: str, header, unit_of_row):
    """The dead letter of a failed record's first line, with its unit when its cells name one."""
    record = line.rstrip(b"\r\n")
    letter = dead_letter_record(record, Reason(
        "unparseable", "invalid CSV line: a quoted cell that does not close within its record "
                       "(the lines after it are read as records of their own)"))
    if unit_of_row is not None:
        try:
            cells = next(csv.reader([text.rstrip("\r\n")]))
        except (csv.Error, StopIteration):
            cells = []
        unit = unit_of_row(dict(zip(header, cells)))
        if unit is not None:
            letter["unit"] = unit
    return beam.pvalue.TaggedOutput(DEAD_LETTER, letter)


def _csv_record(raw, texts, size, undecodable, header, problem=None):
    values = None
    if problem is None and undecodable is not None:
        problem = undecodable
    elif problem is None and size > CSV_RECORD_BYTES:
        problem = f"a record of {size} bytes, over {CSV_RECORD_BYTES} (a quoted cell not closed?)"
    elif problem is None and not "".join(texts).strip():
        problem = "blank line"
    if problem is None:
        lines = iter(texts)
        try:
            values = next(csv.reader(lines))
            if next(lines, None) is not None:
                problem = "a record that ends before its last line"
        except csv.Error as error:
            problem = error
    if problem is None and len(values) != len(header):
        problem = f"{len(values)} columns, the header has {len(header)}"
    if problem is None:
        return dict(zip(header, values))
    record = b"".join(raw)
    record = record[:-2] if record.endswith(b"\r\n") else \
        record[:-1] if record.endswith(b"\n") else record
    return dead_letter(record, Reason("unparseable", f"invalid CSV line: {str(problem)[:200]}"))
