"""Kafka here (pipelines/kafka_local.py): a broker, Beam's expansion service, and Beam 2.77's
Kafka read on the 2.62.0 Flink job server; every produced record read once, at its
timestamp; the streaming job from a Kafka topic on Flink (`input.kind: kafka`), live, and
through a TaskManager's kill. Needs `python3 -m pipelines.engines fetch` (flink, kafka,
kafka-expansion)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from pipelines import engines
from tests.support import live as live_support

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


@pytest.mark.slow  # a broker, the expansion service and Flink: 31 s (the live tests read too)
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


# ----- the streaming job from Kafka on Flink (`input.kind: kafka`, pipelines.run) -------------
KEYS, SIZE = ["eu", "us", "apac"], 5.0
# Beam's Kafka read moves an idle partition's watermark to the wall clock: an event produced
# just before reaches the job behind it by its delivery time (about 1 s here under load)
LATENESS = 2.0
FIELDS = {"timestamp": "t", "unit": "user", "key": "region"}
LEAD = 45.0  # s: the job server, the expansion and Flink's start come before step 0


def _config(tmp_path, name: str, origin: float, horizon: int, source: dict) -> str:
    """configs/streaming/active_users.yaml with steps of 5 s from `origin`, a fixed seed and
    `source` as its input."""
    raw = yaml.safe_load(open(os.path.join(ROOT, "configs", "streaming", "active_users.yaml")))
    raw.update(input=source, public_keys=KEYS, secret={"seed": 11, "insecure": True},
               steps={"origin": origin, "size_seconds": SIZE, "horizon": horizon},
               bounds={"max_contributions": 4, "max_contributions_per_step": 2,
                       "max_keys_per_unit": 1},
               output={"path": str(tmp_path / name), "formats": ["jsonl"]})
    if source.get("kind") == "kafka":
        raw["steps"]["allowed_lateness_seconds"] = LATENESS
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _live(tmp_path, broker, horizon: int, beam_args=(), during=None):
    """The Kafka job of a config on Flink, fed live over `horizon` steps (3 keys; the first
    event's key is not public; one event of step 1 sent two steps late); `during(step
    folder)` is called while the job runs. -> (origin, events sent on time, stdout)."""
    from confluent_kafka import Producer
    broker.create_topic("events", partitions=2)
    origin = float(int(time.time()) + LEAD)
    config = _config(tmp_path, "live", origin, horizon, {
        "kind": "kafka", "bootstrap_servers": broker.bootstrap, "topic": "events",
        "format": "jsonl", "timestamp_format": "seconds", "fields": FIELDS})
    job = subprocess.Popen([sys.executable, "-m", "pipelines.run", "--config", config,
                            "--runner", "FlinkRunner", *beam_args], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    producer, sent, i, late_sent = Producer({"bootstrap.servers": broker.bootstrap}), [], 0, False
    steps = tmp_path / "live" / "active-users-live" / "steps"
    try:
        while time.time() < origin + SIZE * horizon and job.poll() is None:
            now = time.time()
            step = int((now - origin) // SIZE)
            if 0 <= step:
                row = {"user": f"u{i % 11}", "region": KEYS[i % 3], "t": now} if sent else \
                    {"user": "off-key", "region": "not-public", "t": now}
                producer.produce("events", value=json.dumps(row), timestamp=int(now * 1000))
                sent.append(row)
                if step >= 3 and not late_sent:  # step 1's event, 2+ steps after its end
                    late = {"user": "late-user", "region": "eu", "t": origin + SIZE + 0.5}
                    producer.produce("events", value=json.dumps(late),
                                     timestamp=int(now * 1000))
                    late_sent = True
            producer.poll(0)
            if during is not None:
                during(steps)
            i += 1
            time.sleep(0.1)
        assert producer.flush(30) == 0
        out, err = job.communicate(timeout=240)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err[-3000:]
    return origin, sent, out


def _check_against_batch(tmp_path, origin: float, horizon: int, sent: list,
                         restored: bool = False) -> list:
    """Each step published once, equal bit for bit to the batch job's records of the events
    sent on time (same seed); the late event and the off-key one are dead letters (written
    again when Flink `restored` the job from a checkpoint taken before it wrote them: at least
    once). -> the published records."""
    live = live_support.published_records(tmp_path / "live" / "active-users-live", horizon,
                                          KEYS)
    operator = tmp_path / "live" / "active-users-live-operator"
    summary = json.load(open(operator / "summary.json"))
    dead = {json.dumps(d, sort_keys=True) for d in live_support.dead_letters(operator)}
    assert sorted(json.loads(d)["code"] for d in dead) == ["late", "not_public_key"], dead
    assert summary["steps_published"] == horizon
    if not restored:
        assert summary["dead_letters"] == {"late": 1, "not_public_key": 1}, summary
    assert live == live_support.batch_records(  # bit for bit
        tmp_path, lambda source: _config(tmp_path, "batch", origin, horizon, source), sent,
        FIELDS)
    return live


@pytest.mark.slow  # a broker, Flink and a live stream of 5 steps: about 90 s
def test_a_kafka_stream_on_flink_publishes_each_step_once_and_equals_the_batch_run(tmp_path):
    from pipelines import kafka_local
    with kafka_local.KafkaBroker(folder=str(tmp_path / "kafka")) as broker:
        origin, sent, out = _live(tmp_path, broker, 5)
    assert "5 of 5 steps published" in out, out
    _check_against_batch(tmp_path, origin, 5, sent)


@pytest.mark.slow  # a broker, a Flink cluster, a kill and a restore: about 2 min
def test_a_taskmanager_killed_mid_stream_loses_and_duplicates_nothing(tmp_path):
    """The TaskManager of a standalone cluster is SIGKILLed once step 1 is published and a new
    one started: Flink restores the job from its last checkpoint (Kafka offsets included);
    every step is published once, equal to the batch job on the same events."""
    from pipelines import kafka_local
    killed = []

    def kill_once(steps):
        if not killed and (steps / "step-00000001.json").exists():
            cluster.kill_taskmanager()
            killed.append(time.time())
            cluster.start_taskmanager()

    with kafka_local.KafkaBroker(folder=str(tmp_path / "kafka")) as broker, \
            engines.FlinkCluster(slots=2, folder=str(tmp_path / "flink")) as cluster:
        origin, sent, out = _live(tmp_path, broker, 8, [
            f"--flink_master={cluster.master}", "--environment_type=LOOPBACK"], kill_once)
        restored = open(tmp_path / "flink" / "jobmanager.log").read()
    assert killed, out
    assert "Restoring job" in restored and "from Checkpoint" in restored
    assert "8 of 8 steps published" in out, out
    _check_against_batch(tmp_path, origin, 8, sent, restored=True)
