"""Reading a job's input and writing its outputs, shared by `pipelines.run` and
`pipelines.schedule`.

Rows (JSON lines, CSV or Parquet) become the transform's elements with their event time, the
input columns mapped by `input.fields` and the element shape taken from the transform's registry
row. Rows that cannot be read or mapped become dead letters with a reason.
"""
from __future__ import annotations

import csv
import io
import json
import os

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import TimestampedValue

from pipelines import config as job_config
from transforms import registry
from transforms.sinks import WriteRecordsToCsv, WriteRecordsToJsonLines, WriteRecordsToParquet

DEAD = "dead_letter"
SINKS = {"parquet": WriteRecordsToParquet, "jsonl": WriteRecordsToJsonLines,
         "csv": WriteRecordsToCsv}


class ToElement(beam.DoFn):
    """A row (dict) -> the transform's element with its event time, or a dead letter."""

    def __init__(self, job: job_config.JobConfig):
        self.job = job

    def process(self, row):
        job, fields = self.job, self.job.input.fields
        try:
            values = {role: row[column] for role, column in fields.items()}
        except (KeyError, TypeError) as error:
            yield beam.pvalue.TaggedOutput(DEAD, {"record": repr(row)[:500],
                                                  "reason": f"missing field {error}"})
            return
        try:
            stamp = values.pop("timestamp")
            seconds = float(stamp) if job.input.timestamp_format == "seconds" else \
                job_config.parse_time("timestamp", stamp)
        except (ValueError, TypeError) as error:
            yield beam.pvalue.TaggedOutput(DEAD, {"record": repr(row)[:500],
                                                  "reason": str(error)})
            return
        spec = registry.SPECS[job.transform]
        for role in spec.numeric:
            values[role] = _number(values[role])
        yield TimestampedValue(spec.element(values), seconds)


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value  # the transform sends it to dead letters with a reason


def read_elements(pipeline, job: job_config.JobConfig):
    """-> (elements with event times, [dead-letter PCollections])."""
    rows = read_rows(pipeline, job)
    main_rows = rows if job.input.format == "parquet" else rows.rows
    elements = main_rows | "ToElements" >> beam.ParDo(ToElement(job)).with_outputs(
        DEAD, main="elements")
    dead = [elements[DEAD]] + ([] if job.input.format == "parquet" else [rows[DEAD]])
    return elements.elements, dead


def write_records(records, job: job_config.JobConfig, prefix: str) -> None:
    for fmt in job.output.formats:
        records | f"Write {fmt}" >> SINKS[fmt](prefix)


def write_dead_letters(dead_letters, prefix: str) -> None:
    """Operator-only (NOT private: raw input records)."""
    (dead_letters | "AllDeadLetters" >> beam.Flatten()
     | "WriteDeadLetters" >> WriteRecordsToJsonLines(prefix))


def read_rows(pipeline, job: job_config.JobConfig):
    if job.input.format == "parquet":
        return pipeline | "ReadParquet" >> beam.io.ReadFromParquet(job.input.path)
    lines = pipeline | "ReadText" >> beam.io.ReadFromText(
        job.input.path, skip_header_lines=1 if job.input.format == "csv" else 0)
    if job.input.format == "jsonl":
        return lines | "ParseJson" >> beam.ParDo(_ParseJson()).with_outputs(DEAD, main="rows")
    header = _csv_header(job.input.path)
    return lines | "ParseCsv" >> beam.ParDo(_ParseCsv(header)).with_outputs(DEAD, main="rows")


class _ParseJson(beam.DoFn):
    def process(self, line):
        try:
            row = json.loads(line)
        except ValueError as error:
            yield beam.pvalue.TaggedOutput(DEAD, {"record": line[:500],
                                                  "reason": f"invalid JSON: {error}"})
            return
        if isinstance(row, dict):
            yield row
        else:
            yield beam.pvalue.TaggedOutput(DEAD, {"record": line[:500],
                                                  "reason": "a JSON line must be an object"})


class _ParseCsv(beam.DoFn):
    def __init__(self, header):
        self.header = header

    def process(self, line):
        values = next(csv.reader(io.StringIO(line)))
        if len(values) != len(self.header):
            yield beam.pvalue.TaggedOutput(DEAD, {"record": line[:500], "reason":
                                                  f"{len(values)} columns, header has "
                                                  f"{len(self.header)}"})
            return
        yield dict(zip(self.header, values))


def _csv_header(pattern):
    match = FileSystems.match([pattern])[0].metadata_list
    if not match:
        job_config.fail("input.path", "matching at least one file", pattern)
    with FileSystems.open(match[0].path) as handle:
        first = handle.readline().decode("utf-8")
    return next(csv.reader(io.StringIO(first)))


