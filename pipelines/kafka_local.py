"""Kafka on this machine for the engines' jobs and tests: a broker, Beam's expansion service
for the Kafka read, and that read as the job servers' Beam version (2.62.0) takes it.

Everything comes from `python3 -m pipelines.engines fetch` (Maven Central): the broker is
Kafka 4.4 in KRaft mode (no ZooKeeper), one node that is broker and controller, on free ports
of localhost; the expansion service is Beam's, with the Kafka I/O. Three things make Beam
2.77's `ReadFromKafka` run on the 2.62.0 Flink job server (found by running it):

- its payload names three fields 2.62.0 does not know (`dynamic_read_poll_interval_seconds`,
  `consumer_factory_fn_class`, `consumer_factory_fn_params`: "missing a setter" on expansion):
  `read` sends 2.62.0's schema;
- the read's Java part runs inside the job server (the EMBEDDED environment), whose class
  path has the Kafka I/O (`engines.KAFKA_IO`);
- the expansion service expands an unbounded read as Beam's classic source
  (`--experiments=use_deprecated_read`): the splittable read it builds otherwise polls the
  broker on Flink but hands nothing on, without an error.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import typing
import uuid
from typing import List, Optional

from pipelines import engines

BYTES = "org.apache.kafka.common.serialization.ByteArrayDeserializer"


def _libs(name: str) -> str:
    tool = engines.BY_NAME[name]
    if not engines.installed(tool):
        raise ValueError(f"`{name}` must be installed (python3 -m pipelines.engines fetch "
                         f"{name}); got none.")
    return os.path.join(tool.folder, "libs", "*")


class KafkaBroker:
    """A one-node Kafka (KRaft) on free ports of localhost, its data under `folder`, for the
    life of the `with` block. `bootstrap` is what consumers and producers connect to."""

    def __init__(self, folder: Optional[str] = None, start_seconds: float = 90.0):
        self.folder = folder or tempfile.mkdtemp(prefix="dp-kafka-")
        self.start_seconds = start_seconds
        self.port = self.controller = None
        self.processes: List[subprocess.Popen] = []

    @property
    def bootstrap(self) -> str:
        return f"localhost:{self.port}"

    def _java(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["java", "-cp", _libs("kafka"), *args], capture_output=True,
                              text=True, timeout=120)

    def __enter__(self) -> "KafkaBroker":
        libs = _libs("kafka")
        os.makedirs(self.folder, exist_ok=True)
        self.port, self.controller = engines.free_port(), engines.free_port()
        config = os.path.join(self.folder, "server.properties")
        with open(config, "w") as handle:
            handle.write("\n".join([
                "process.roles=broker,controller", "node.id=1",
                f"controller.quorum.voters=1@localhost:{self.controller}",
                f"listeners=PLAINTEXT://localhost:{self.port},"
                f"CONTROLLER://localhost:{self.controller}",
                f"advertised.listeners=PLAINTEXT://localhost:{self.port}",
                "controller.listener.names=CONTROLLER",
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                f"log.dirs={os.path.join(self.folder, 'data')}",
                "offsets.topic.replication.factor=1",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1", "group.initial.rebalance.delay.ms=0", ""]))
        formatted = self._java("kafka.tools.StorageTool", "format", "-t",
                               uuid.uuid4().hex[:22], "-c", config)
        if formatted.returncode != 0:
            raise ValueError(f"`Kafka storage` must format; got "
                             f"{(formatted.stderr or formatted.stdout).strip()[-150:]!r}.")
        log = os.path.join(self.folder, "broker.log")
        self.processes.append(subprocess.Popen(
            ["java", "-Xmx512m", "-cp", libs, "kafka.Kafka", config],
            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True))
        try:
            engines.wait_for_port(self.port, self.processes[-1], self.start_seconds, "Kafka broker",
                           log)
        except ValueError:
            self.__exit__(None, None, None)
            raise
        return self

    def create_topic(self, topic: str, partitions: int = 2) -> None:
        """The topic (a job reading it must find it: Beam's read fails on a missing one)."""
        done = self._java("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                          self.bootstrap, "--create", "--topic", topic, "--partitions",
                          str(partitions), "--replication-factor", "1")
        if done.returncode != 0:
            raise ValueError(f"`topic` must be created; got {done.stderr.strip()[-150:]!r}.")

    def __exit__(self, *exc) -> None:
        engines.stop(self.processes)
        self.processes = []


class ExpansionService:
    """Beam's expansion service with the Kafka I/O (`engines` tool `kafka-expansion`) on a
    free port, for the life of the `with` block; `address` is what `read` takes."""

    def __init__(self, start_seconds: float = 90.0):
        self.start_seconds = start_seconds
        self.port, self.process, self.folder = None, None, None

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    def __enter__(self) -> "ExpansionService":
        libs = _libs("kafka-expansion")
        self.port = engines.free_port()
        self.folder = tempfile.mkdtemp(prefix="dp-kafka-expansion-")
        log = os.path.join(self.folder, "expansion.log")
        self.process = subprocess.Popen(
            ["java", "-Xmx512m", "-cp", libs,
             "org.apache.beam.sdk.expansion.service.ExpansionService", str(self.port),
             "--defaultEnvironmentType=EMBEDDED", "--experiments=use_deprecated_read"],
            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            engines.wait_for_port(self.port, self.process, self.start_seconds,
                           "Kafka expansion service", log)
        except ValueError:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        engines.stop([self.process])
        if exc == (None, None, None) or not exc or exc[0] is None:
            shutil.rmtree(self.folder, ignore_errors=True)


def read(bootstrap: str, topics: List[str], expansion_service: str,
         max_num_records: Optional[int] = None, group_id: Optional[str] = None):
    """Beam's cross-language Kafka read with its record metadata (a Row: topic, partition,
    offset, timestamp (ms), key and value bytes), each element at its record's timestamp
    (`CreateTime`), in the payload schema of Beam 2.62.0's expansion service."""
    import numpy as np
    from apache_beam.io.kafka import ReadFromKafka
    from apache_beam.transforms.external import (ExternalTransform,
                                                 NamedTupleBasedPayloadBuilder)
    schema = typing.NamedTuple("ReadFromKafkaSchema", [
        ("consumer_config", typing.Mapping[str, str]), ("topics", typing.List[str]),
        ("key_deserializer", str), ("value_deserializer", str),
        ("start_read_time", typing.Optional[int]), ("max_num_records", typing.Optional[int]),
        ("max_read_time", typing.Optional[int]), ("commit_offset_in_finalize", bool),
        ("timestamp_policy", str), ("consumer_polling_timeout", typing.Optional[int]),
        ("redistribute", typing.Optional[bool]),
        ("redistribute_num_keys", typing.Optional[np.int32]),
        ("allow_duplicates", typing.Optional[bool])])
    config = {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}
    if group_id is not None:
        config["group.id"] = group_id
    return ExternalTransform(ReadFromKafka.URN_WITH_METADATA, NamedTupleBasedPayloadBuilder(
        schema(consumer_config=config, topics=list(topics), key_deserializer=BYTES,
               value_deserializer=BYTES, start_read_time=None,
               max_num_records=max_num_records, max_read_time=None,
               commit_offset_in_finalize=group_id is not None,
               timestamp_policy="CreateTime", consumer_polling_timeout=2, redistribute=False,
               redistribute_num_keys=np.int32(0), allow_duplicates=False)),
        expansion_service)


def as_message(row):
    """A Kafka record (`read`'s Row) -> the Pub/Sub message the streaming job reads
    (`stream.ParseMessage`): its value is the data, its Kafka timestamp the publish time
    (lateness and the watermark follow it, as Pub/Sub's publish time), topic/partition/offset
    its id; Kafka headers are not attributes."""
    import datetime
    from apache_beam.io.gcp.pubsub import PubsubMessage
    return PubsubMessage(
        bytes(row.value) if row.value is not None else b"", {},
        f"{row.topic}/{row.partition}/{row.offset}",
        datetime.datetime.fromtimestamp(row.timestamp / 1000.0, datetime.timezone.utc))


def read_messages(pipeline, bootstrap: str, topic: str, expansion_service: str,
                  group_id: str):
    """The topic's records as messages (`as_message`), from its earliest offset; offsets are
    committed to `group_id` as Flink checkpoints finalise (a restored job resumes from the
    offsets of its checkpoint)."""
    import apache_beam as beam
    return (pipeline | "ReadFromKafka" >> read(bootstrap, [topic], expansion_service,
                                               group_id=group_id)
            | "AsMessages" >> beam.Map(as_message))
