"""End to end: records written by the sinks read back with pyarrow / json / csv."""
from __future__ import annotations

import csv
import datetime
import glob
import json

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_stream import TestStream as BeamTestStream
from apache_beam.transforms.window import TimestampedValue

from transforms import (ContinualCount, SecretRef, TimeSteps, WriteRecordsToCsv,
                        WriteRecordsToJsonLines, WriteRecordsToParquet)
from transforms.sinks import COLUMNS, RECORD_SCHEMA

STEPS = TimeSteps(1_700_000_000.0, 60.0, 5)
KEYS = ["a", "b", "c", "d"]


def count():
    return ContinualCount(steps=STEPS, public_keys=KEYS, epsilon=1.0, max_contributions=2,
                          secret=SecretRef(seed=9), insecure=True)


def events():
    return [(("u%d" % i, KEYS[i % 3]), STEPS.origin + 30.0 * i) for i in range(8)]


def test_batch_parquet_jsonl_csv_round_trip(tmp_path):
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        records = (pipeline | beam.Create(events())
                   | beam.Map(lambda e: TimestampedValue(*e)) | count()).records
        records | WriteRecordsToParquet(str(tmp_path / "out" / "records"))
        records | WriteRecordsToJsonLines(str(tmp_path / "out" / "records"))
        records | WriteRecordsToCsv(str(tmp_path / "out" / "records"))
    table = pq.read_table(glob.glob(str(tmp_path / "out" / "records*.parquet"))[0])
    assert table.schema.equals(RECORD_SCHEMA, check_metadata=False)
    assert table.num_rows == len(KEYS) * STEPS.horizon
    assert sorted(set(table.column("key").to_pylist())) == KEYS
    lines = [json.loads(line) for path in glob.glob(str(tmp_path / "out" / "records*.jsonl"))
             for line in open(path)]
    assert len(lines) == table.num_rows
    by_key_step = {(r["key"], r["step"]): r for r in lines}
    for row in table.to_pylist():
        line = by_key_step[(row["key"], row["step"])]
        assert line["value"] == row["value"]
        for name in ("window_start", "window_end"):  # typed in Parquet, ISO text in JSON
            assert row[name].tzinfo is not None
            assert row[name].timestamp() == STEPS.start(row["step"]) + (
                STEPS.size if name == "window_end" else 0)
            assert row[name] == datetime.datetime.fromisoformat(
                line[name].replace("Z", "+00:00"))
    assert str(table.schema.field("window_start").type) == "timestamp[us, tz=UTC]"
    rows = list(csv.DictReader(open(glob.glob(str(tmp_path / "out" / "records*.csv"))[0])))
    assert list(rows[0]) == COLUMNS and len(rows) == table.num_rows


def test_streaming_parquet_keeps_every_row(tmp_path):
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    stream = BeamTestStream().add_elements([TimestampedValue(*e) for e in events()])
    for step in range(STEPS.horizon + 2):
        stream = stream.advance_watermark_to(STEPS.end(step))
    stream = stream.advance_watermark_to_infinity()
    with beam.Pipeline(options=options) as pipeline:
        (pipeline | stream | count()).records | WriteRecordsToParquet(str(tmp_path / "s"))
    files = glob.glob(str(tmp_path / "s-*.parquet"))
    total = sum(pq.read_table(f).num_rows for f in files)
    assert total == len(KEYS) * STEPS.horizon


def test_bigquery_schema_matches_the_parquet_schema():
    from transforms.sinks import BIGQUERY_SCHEMA
    fields = dict(item.split(":") for item in BIGQUERY_SCHEMA.split(","))
    assert list(fields) == COLUMNS
    expected = {"timestamp[us, tz=UTC]": "TIMESTAMP", "int64": "INTEGER", "double": "FLOAT",
                "bool": "BOOLEAN", "string": "STRING"}
    for field in RECORD_SCHEMA:
        assert fields[field.name] == expected[str(field.type)]
