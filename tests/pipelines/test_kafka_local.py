"""Kafka here (pipelines/kafka_local.py): a broker, Beam's expansion service, and Beam 2.77's
Kafka read on the 2.62.0 Flink job server; every produced record read once, at its
timestamp. Needs `python3 -m pipelines.engines fetch` (flink, kafka, kafka-expansion)."""
from __future__ import annotations

import json
import shutil
import time

import pytest

from pipelines import engines

pytestmark = pytest.mark.skipif(
    shutil.which("java") is None or not all(
        engines.installed(engines.BY_NAME[name]) for name in
        ("flink", "kafka", "kafka-expansion")),
    reason="the engines are not installed (python3 -m pipelines.engines fetch)")


class _Lines:
    """Appends each element to a file (the LOOPBACK workers are this process)."""

    def __init__(self, path):
        self.path = path

    def __call__(self, line):
        with open(self.path, "a") as handle:
            handle.write(line + "\n")


def _record(row, timestamp):
    return json.dumps({"value": json.loads(bytes(row.value).decode("utf-8")),
                       "partition": row.partition, "record_ms": row.timestamp,
                       "element_ms": timestamp.micros // 1000}, sort_keys=True)


def test_every_produced_record_is_read_once_at_its_timestamp_on_flink(tmp_path):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from confluent_kafka import Producer
    from pipelines import kafka_local
    base = (int(time.time()) - 3600) * 1000  # the broker refuses timestamps 1 h ahead
    sent = [{"user": f"u{i % 7}", "region": ["eu", "us"][i % 2], "i": i} for i in range(40)]
    with kafka_local.KafkaBroker(folder=str(tmp_path / "kafka")) as broker, \
            kafka_local.ExpansionService() as expansion:
        broker.create_topic("events", partitions=2)
        producer, failed = Producer({"bootstrap.servers": broker.bootstrap}), []
        for i, row in enumerate(sent):
            producer.produce("events", value=json.dumps(row), timestamp=base + 250 * i,
                             partition=i % 2,
                             on_delivery=lambda error, _: error and failed.append(error))
        assert producer.flush(30) == 0 and failed == []  # (a refused record is no error here)
        out = str(tmp_path / "read.jsonl")
        args, _ = engines.prepared(["--runner=FlinkRunner", "--streaming"])
        with engines.job_server(args) as args:
            with beam.Pipeline(options=PipelineOptions(args)) as pipeline:
                _ = (pipeline
                     | kafka_local.read(broker.bootstrap, ["events"], expansion.address,
                                        max_num_records=len(sent))
                     | beam.Map(lambda row, t=beam.DoFn.TimestampParam: _record(row, t))
                     | beam.Map(_Lines(out)))
    read = [json.loads(line) for line in open(out)]
    assert sorted(r["value"]["i"] for r in read) == list(range(len(sent)))
    for r in read:
        i = r["value"]["i"]
        assert r["value"] == sent[i] and r["partition"] == i % 2
        assert r["record_ms"] == r["element_ms"] == base + 250 * i
