"""Run a continual-release job from a YAML config.

    python3 -m pipelines.run --config configs/active_users.yaml [any Beam pipeline option]

Reads events (JSON lines, CSV or Parquet, columns mapped by `input.fields`), runs the configured
transform, writes records (Parquet / JSON lines / CSV) and dead letters (JSON lines) under
`output.path/<job>/`, and prints where they are. Without --runner it uses the in-process
FnApiRunner (the default DirectRunner first tries to download Prism, which fails offline).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import TimestampedValue

from pipelines import config as job_config
from transforms import (ContinualCount, ContinualCountDistinct, ContinualDegreeCount,
                        ContinualRelease, ContinualSum, ContinualTriangleCount, SecretRef,
                        TimeSteps, WriteRecordsToCsv, WriteRecordsToJsonLines,
                        WriteRecordsToParquet)

TRANSFORMS = {"count": ContinualCount, "sum": ContinualSum,
              "count_distinct": ContinualCountDistinct, "degree_count": ContinualDegreeCount,
              "triangle_count": ContinualTriangleCount, "release": ContinualRelease}
DEAD = "dead_letter"


def build_transform(job: job_config.JobConfig, secret: SecretRef = None):
    if secret is None:
        if "stored" in job.secret:
            job_config.fail("secret.stored", "used with a state directory "
                                             "(python3 -m pipelines.schedule)", True)
        secret = SecretRef(**job.secret)
    kwargs = dict(steps=TimeSteps(job.origin, job.step_seconds, job.horizon),
                  mechanism=job.mechanism, mechanism_params=job.mechanism_params or None,
                  confidence=job.confidence, secret=secret, **job.privacy, **job.bounds)
    if job.transform != "triangle_count":
        kwargs["public_keys"] = job.public_keys
    return TRANSFORMS[job.transform](**kwargs)


class ToElement(beam.DoFn):
    """A row (dict) -> the transform's element with its event time, or a dead letter."""

    def __init__(self, job: job_config.JobConfig):
        self.job = job

    def process(self, row):
        job, fields = self.job, self.job.fields
        try:
            values = {role: row[column] for role, column in fields.items()}
        except (KeyError, TypeError) as error:
            yield beam.pvalue.TaggedOutput(DEAD, {"record": repr(row)[:500],
                                                  "reason": f"missing field {error}"})
            return
        try:
            stamp = values.pop("timestamp")
            seconds = float(stamp) if job.timestamp_format == "seconds" else \
                job_config.parse_time("timestamp", stamp)
        except (ValueError, TypeError) as error:
            yield beam.pvalue.TaggedOutput(DEAD, {"record": repr(row)[:500],
                                                  "reason": str(error)})
            return
        t = job.transform
        if t in ("count",):
            element = (values["unit"], values["key"])
        elif t == "sum":
            element = (values["unit"], values["key"], _number(values["value"]))
        elif t == "count_distinct":
            element = (values["op"], values["item"], values["key"])
        elif t in ("degree_count", "triangle_count"):
            element = (values["op"], (values["a"], values["b"]))
        else:
            element = (values["key"], _number(values["value"]))
        yield TimestampedValue(element, seconds)


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value  # the transform sends it to dead letters with a reason


def read_rows(pipeline, job: job_config.JobConfig):
    if job.input_format == "parquet":
        return pipeline | "ReadParquet" >> beam.io.ReadFromParquet(job.input_path)
    lines = pipeline | "ReadText" >> beam.io.ReadFromText(
        job.input_path, skip_header_lines=1 if job.input_format == "csv" else 0)
    if job.input_format == "jsonl":
        return lines | "ParseJson" >> beam.ParDo(_ParseJson()).with_outputs(DEAD, main="rows")
    header = _csv_header(job.input_path)
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


def build(pipeline, job: job_config.JobConfig, transform=None):
    rows = read_rows(pipeline, job)
    main_rows = rows if job.input_format == "parquet" else rows.rows
    elements = main_rows | "ToElements" >> beam.ParDo(ToElement(job)).with_outputs(
        DEAD, main="elements")
    result = elements.elements | job.transform >> (transform or build_transform(job))
    folder = os.path.join(job.output_path, job.job)
    sinks = {"parquet": WriteRecordsToParquet, "jsonl": WriteRecordsToJsonLines,
             "csv": WriteRecordsToCsv}
    for fmt in job.output_formats:
        result.records | f"Write {fmt}" >> sinks[fmt](os.path.join(folder, "records"))
    dead = [elements[DEAD], result.dead_letters]
    if job.input_format != "parquet":
        dead.append(rows[DEAD])
    (dead | "AllDeadLetters" >> beam.Flatten()
     | "WriteDeadLetters" >> WriteRecordsToJsonLines(os.path.join(folder, "dead_letters")))
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.run", description=__doc__)
    parser.add_argument("--config", required=True)
    args, beam_args = parser.parse_known_args(argv)
    try:
        job = job_config.load(args.config)
        transform = build_transform(job)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not any(a.startswith("--runner") for a in beam_args):
        beam_args = ["--runner=FnApiRunner", *beam_args]
    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        folder = build(pipeline, job, transform)
    info = transform.display_data()
    print(f"job {job.job}: {job.transform} with {info['mechanism']} "
          f"{info['mechanism_params']}, horizon {job.horizon} x {job.step_seconds:g} s, "
          f"{len(job.public_keys)} public key(s), privacy {job.privacy}")
    print(f"records:      {os.path.join(folder, 'records')}-*."
          f"{{{','.join(job.output_formats)}}}")
    print(f"dead letters: {os.path.join(folder, 'dead_letters')}-*.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
